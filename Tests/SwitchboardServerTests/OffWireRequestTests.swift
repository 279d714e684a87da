import Testing
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// Requests whose answers go nowhere (a request a duplicate id took off the wire, a listen with id 0)
/// but that wait on a holder: they count against the open-request limit until they are finished, and
/// go with their connection (wire.md, "Open requests").
@Suite("Requests off the wire are open requests")
struct OffWireRequestTests {
    @Test("calls a duplicate id took off the wire count against the open-request limit until the holder answers, and their connection's close sends the holder a CANCEL for each (one loop, and four with caller and holder on different loops)",
          arguments: [1, 4])
    func displacedCallsStayBoundedAndAreCancelled(loops: Int) async throws {
        try await withServer({ $0.loops = loops; $0.maxOpenRequests = 8 }) { _, port in
            let holder = try RawConnection(port: port), attacker = try RawConnection(port: port)  // loops 0 and 1
            try holder.send(Frame(.register, id: 1, channel: "svc", payload: Array(#"{"kind":"method"}"#.utf8)))
            #expect(try await holder.frame() == Frame(.reply, id: 1, payload: nil))
            var burst: [UInt8] = []
            for _ in 0..<50 { burst += try Frame.call(7, "svc", "work").bytes + Frame.call(7, "svc", "work").bytes }
            try attacker.send(burst)
            let answers = try await attacker.barrier()
            // Eight calls went on (each answered by the duplicate_id of the next), the rest were refused.
            #expect(answers.filter { $0.errorCode == "duplicate_id" }.count == 8)
            #expect(answers.filter { $0.errorCode == "too_many_requests" }.count == 84)
            var forwarded: Set<UInt32> = []
            for _ in 0..<8 {
                let request = try await holder.nextNonPing()
                #expect(request.kind == .message && request.channel == "svc")
                forwarded.insert(request.id)
            }
            // One answer frees a place: the next call goes on, its answer goes nowhere.
            let first = forwarded.min()!
            try holder.send(Frame(.reply, id: first, payload: try StandardMethodCodec().encodeSuccessEnvelope(1)))
            forwarded.remove(first)
            var id: UInt32 = 10
            #expect(try await eventually {  // once the answer reached the attacker's loop
                id += 1
                try attacker.send(.call(id, "svc", "work"))
                return try await attacker.barrier().isEmpty  // not refused: it went to the holder
            })
            let next = try await holder.nextNonPing()
            #expect(next.kind == .message && next.channel == "svc")
            attacker.reset()
            var cancelled: Set<UInt32> = []
            for _ in 0..<8 {
                let cancel = try await holder.nextNonPing()
                #expect(cancel.kind == .cancel)
                cancelled.insert(cancel.id)
            }
            #expect(cancelled == forwarded.union([next.id]))
        }
    }

    @Test("listens with id 0 that wait for the holder's answer to the first listen count against the open-request limit, and are dropped, counted, past it (one loop, and four with listener and holder on different loops)",
          arguments: [1, 4])
    func detachedListensCountAsOpenRequests(loops: Int) async throws {
        try await withServer({ $0.loops = loops; $0.maxOpenRequests = 8 }) { _, port in
            let holder = try RawConnection(port: port), listener = try RawConnection(port: port)  // loops 0 and 1
            try holder.send(Frame(.register, id: 1, channel: "ev", payload: Array(#"{"kind":"event"}"#.utf8)))
            #expect(try await holder.frame() == Frame(.reply, id: 1, payload: nil))
            var burst: [UInt8] = []
            for _ in 0..<20 { burst += try Frame.call(0, "ev", "listen").bytes }
            try listener.send(burst)
            let listen = try await holder.nextNonPing()  // the first, which the holder leaves unanswered
            #expect(listen.kind == .message && listen.channel == "ev")
            #expect(try await listener.barrier().isEmpty)  // nobody waits for an ERROR
            // Eight wait (on this loop, or on the holder's), the listener's open requests: a call is refused.
            try listener.send(.call(2, "switchboard/stats", "get"))
            let refused = try await listener.nextNonPing()
            #expect(refused.id == 2 && refused.errorCode == "too_many_requests")
            // The holder's answer starts the stream: the waiting listens are finished, and places free.
            try holder.send(Frame(.reply, id: listen.id, payload: try StandardMethodCodec().encodeSuccessEnvelope(.null)))
            var stats: ChannelValue = .null, attempt: UInt32 = 2
            #expect(try await eventually {  // once the answers reached the listener's loop
                attempt += 1
                try listener.send(.call(attempt, "switchboard/stats", "get"))
                let answer = try await listener.nextNonPing()
                guard answer.kind == .reply, case .success(let got) = try answer.envelope() else { return false }
                stats = got
                return true
            })
            #expect((stats["openRequestsRefused"]?.intValue ?? 0) >= 13, "\(stats)")
        }
    }

    @Test("listens that wait for the holder's answer to the first listen leave the waiting list with their connection: the answer attaches no stream to a client that left (with an id, and with id 0)",
          arguments: [UInt32(5), 0])
    func waitingListensGoWithTheirConnection(id: UInt32) async throws {
        try await withServer({ $0.loops = 1 }) { _, port in
            let holder = try RawConnection(port: port), leaver = try RawConnection(port: port), observer = try RawConnection(port: port)
            try holder.send(Frame(.register, id: 1, channel: "ev", payload: Array(#"{"kind":"event"}"#.utf8)))
            #expect(try await holder.frame() == Frame(.reply, id: 1, payload: nil))
            try leaver.send(.call(id, "ev", "listen"))
            let listen = try await holder.nextNonPing()  // left unanswered while the leaver goes
            #expect(listen.kind == .message && listen.channel == "ev")
            leaver.reset()
            #expect(try await eventually {
                guard case .success(let stats) = try await call(observer, 2, "switchboard/stats", "get") else { return false }
                return stats["connections"]?.intValue == 2
            })
            try holder.send(Frame(.reply, id: listen.id, payload: try StandardMethodCodec().encodeSuccessEnvelope(.null)))
            _ = try await holder.barrier()
            let rows = try #require(try await call(observer, 3, "switchboard/channels", "list").get()["channels"]?.listValue)
            let row = try #require(rows.first { $0["name"] == "ev" })
            #expect(row["listeners"]?.intValue == 0, "\(row)")
        }
    }
}
