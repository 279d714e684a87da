import Testing
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// A CANCEL of a call that its first loop passed on to another (SiblingLoops.swift).
@Suite("Cancels of calls passed on between loops")
struct CrossLoopCancelTests {
    @Test("a CANCEL that reached the first loop after it passed the call on is sent again to the loop that has the call: the holder is told and the caller answered once")
    func cancelThatCameBeforeTheCallWasPassedOn() async throws {
        try await whileTheChannelMoves { caller, second, gate in
            // The CANCEL goes to loop 1 too, behind the call, before loop 1 passes the call on.
            try caller.send(Frame(.cancel, id: 5, payload: nil))
            _ = try await caller.barrier()
            gate.release()
            let forwarded = try await second.nextNonPing()  // passed on by loop 1 to the new holder
            #expect(forwarded.kind == .message && forwarded.channel == "svc")
            let told = try await second.nextNonPing()
            #expect(told.kind == .cancel && told.id == forwarded.id, "\(told)")
            let answer = try await caller.nextNonPing()
            #expect(answer.id == 5 && answer.errorCode == "cancelled", "\(answer)")
        }
    }

    @Test("a call passed on to the loop the channel moved to can still be cancelled: the CANCEL reaches the holder that has it, and the caller is answered")
    func cancelOfCallPassedOnToAnotherLoop() async throws {
        try await whileTheChannelMoves { caller, second, gate in
            gate.release()
            let forwarded = try await second.nextNonPing()  // passed on by loop 1 to the new holder
            #expect(forwarded.kind == .message && forwarded.channel == "svc")
            try caller.send(Frame(.cancel, id: 5, payload: nil))
            // The caller is answered (cancelled), and the holder told.
            let answer = try await caller.nextNonPing()
            #expect(answer.id == 5 && answer.errorCode == "cancelled", "\(answer)")
            let told = try await second.nextNonPing()
            #expect(told.kind == .cancel && told.id == forwarded.id, "\(told)")
        }
    }

    /// Four loops: a client on loop 1 holds `svc` and lets it go while the call with id 5 from a client
    /// on loop 0 is on its way to loop 1; a client on loop 2 then takes `svc`. `body` runs with loop 1
    /// held by the gate, the call waiting there, and gets the caller, the new holder and the gate.
    private func whileTheChannelMoves(_ body: (RawConnection, RawConnection, LoopGate) async throws -> Void) async throws {
        let gate = LoopGate()
        try await withServer({ $0.loops = 4 }, setUp: { server in gate.install(on: server) }) { _, port in
            let caller = try RawConnection(port: port)  // loop 0
            let first = try RawConnection(port: port)  // loop 1
            let second = try RawConnection(port: port)  // loop 2
            try first.send(Frame(.register, id: 1, channel: "svc", payload: Array(#"{"kind":"method"}"#.utf8)))
            #expect(try await first.frame() == Frame(.reply, id: 1, payload: nil))
            // One read on loop 1: hold the loop, let svc go, hold the loop again.
            try first.send(try Frame.call(2, "test/block", "wait").bytes + Frame(.unregister, id: 3, channel: "svc", payload: nil).bytes
                           + Frame.call(4, "test/block", "wait").bytes)
            try await gate.waitForEntered(1)
            try caller.send(.call(5, "svc", "work"))  // to loop 1, which holds svc as far as loop 0 can tell
            _ = try await caller.barrier()
            gate.release()
            try await gate.waitForEntered(2)  // svc let go on loop 1, which is held again
            try second.send(Frame(.register, id: 1, channel: "svc", payload: Array(#"{"kind":"method"}"#.utf8)))
            #expect(try await second.frame() == Frame(.reply, id: 1, payload: nil))
            try await body(caller, second, gate)
        }
    }
}
