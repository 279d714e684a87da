import Testing
import SwitchboardCodec
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// A caller whose connection is reset (`SO_LINGER` 0) is gone at once, unlike one that half-closes:
/// wire.md says the requests of a peer that goes away are cancelled and their handlers told.
@Suite("A caller that resets its connection") struct CallerResetTests {
    @Test("its forwarded requests are cancelled: the holder gets a CANCEL for each, and no call stays open (binary and text callers; one loop, and four with caller and holder on different loops)",
          arguments: [1, 4])
    func resetCancelsForwardedRequests(loops: Int) async throws {
        try await withServer({ $0.loops = loops }) { _, port in
            // With four loops: the holder on loop 0, the callers on loops 1 and 2, the watcher on 3.
            let holder = try RawConnection(port: port), caller = try RawConnection(port: port)
            let textCaller = try RawConnection(port: port), watcher = try RawConnection(port: port)
            try holder.send(Frame(.register, id: 1, channel: "held/m", payload: Array(#"{"kind":"method","codec":"json"}"#.utf8)))
            #expect(try await holder.nextNonPing() == Frame(.reply, id: 1, payload: nil))
            try caller.send(.call(7, "held/m", "wait", codec: JSONMethodCodec()))
            try caller.send(.call(8, "held/m", "wait", codec: JSONMethodCodec()))
            try textCaller.send(line: #"{"id":1,"call":"held/m","method":"wait"}"#)
            var forwarded: Set<UInt32> = []
            for _ in 0..<3 {
                let request = try await holder.nextNonPing()
                #expect(request.kind == .message && request.channel == "held/m")
                forwarded.insert(request.id)
            }
            caller.reset()
            textCaller.reset()
            // Bound: one CANCEL per forwarded request, each within the holder's read time-out (5 s).
            var cancelled: [UInt32] = []
            for _ in 0..<3 {
                let cancel = try await holder.nextNonPing()
                #expect(cancel.kind == .cancel)
                cancelled.append(cancel.id)
            }
            #expect(Set(cancelled) == forwarded && cancelled.count == 3)
            var stats: ChannelValue = .null, attempt: UInt32 = 100
            _ = try await eventually {  // the callers' loops hear their calls' ends after the holder's loop
                attempt += 1
                try watcher.send(.call(attempt, "switchboard/stats", "get"))
                stats = try await watcher.nextNonPing().envelope().get()
                return stats["repliesPending"] == 0 && (loops == 1 || (stats["crossLoop"]?["callsPending"] == 0
                                                                       && stats["crossLoop"]?["callsServing"] == 0))
            }
            #expect(stats["repliesPending"] == 0, "\(stats)")
            if loops > 1 {
                #expect(stats["crossLoop"]?["callsPending"] == 0 && stats["crossLoop"]?["callsServing"] == 0, "\(stats)")
            }
            // The holder's late answers go nowhere, and the holder's connection goes on.
            for id in forwarded { try holder.send(Frame(.reply, id: id, payload: Array(#"["late"]"#.utf8))) }
            #expect(try await holder.barrier().isEmpty)
        }
    }
}
