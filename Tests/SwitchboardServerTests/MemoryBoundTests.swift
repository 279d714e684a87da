import Testing
import SwitchboardCodec
import SwitchboardPlugins
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport
import SwitchboardWire

/// What one client can make the server keep in memory, past the frame and outbound limits: open
/// requests, credit before a listen, and the tables of the channels it holds.
@Suite struct MemoryBoundTests {
    private func stats(_ wire: RawConnection, id: UInt32) async throws -> ChannelValue {
        try await call(wire, id, "switchboard/stats", "get").get()
    }

    /// A holder of `sink/x` that never answers, then `body` with it and the port.
    private func withSink(plugins: Bool, _ body: (RawConnection, Int) async throws -> Void) async throws {
        try await withServer({ $0.maxOpenRequests = 3 }, setUp: { server in
            if plugins { server.load(RequestLog(settings: LiveSettings(PluginConfiguration(requestLog: .init())))) }
        }) { _, port in
            let holder = try RawConnection(port: port)
            try holder.send(Frame(.register, id: 1, channel: "sink/x", payload: Array(#"{"kind":"method","codec":"standard"}"#.utf8)))
            #expect(try await holder.frame().kind == .reply)
            try await body(holder, port)
        }
    }

    @Test("past the open-request cap a call is too_many_requests with its id, never reaching the holder, counted; an answer frees a place",
          arguments: [false, true])
    func openRequestCap(plugins: Bool) async throws {
        try await withSink(plugins: plugins) { holder, port in
            let caller = try RawConnection(port: port)
            for id: UInt32 in 1...4 { try caller.send(.call(id, "sink/x", "get")) }
            let refused = try await caller.frame()
            #expect(refused.kind == .error && refused.errorCode == "too_many_requests" && refused.id == 4)
            var forwarded: [Frame] = []
            for _ in 1...3 { forwarded.append(try await holder.frame()) }
            #expect(forwarded.allSatisfy { $0.kind == .message })
            try holder.send(Frame(.reply, id: forwarded[0].id, payload: nil))
            let answered = try await caller.frame()
            #expect(answered.kind == .reply && answered.id == 1)
            try caller.send(.call(5, "sink/x", "get"))  // a place again
            #expect(try await holder.frame().kind == .message)
            try caller.send(.call(6, "switchboard/echo", "echo", "x"))  // full: even a call answered at once
            #expect(try await caller.frame().errorCode == "too_many_requests")

            let text = try RawConnection(port: port)  // text mode: the error line carries the id
            for id in 1...3 { try text.send(line: #"{"id":\#(id),"call":"sink/x","method":"get"}"#) }
            try text.send(line: #"{"id":"four","call":"sink/x","method":"get"}"#)
            let line = try await text.line()
            #expect(line["id"] == "four" && line["error"]?["code"] == "too_many_requests", "\(line)")

            let other = try RawConnection(port: port)  // the cap is per connection
            let counts = try await stats(other, id: 1)
            #expect(counts["openRequestsRefused"]?.intValue == 3)
            #expect(httpGet("/metrics", port: port)?.body.contains("switchboard_open_requests_refused_total 3") == true)
        }
    }

    @Test("the default cap is 4,096 open requests per connection")
    func defaultOpenRequestCap() {
        #expect(ServerConfiguration().maxOpenRequests == 4096)
    }

    @Test("credit before listen is kept for names adding up to 64 KiB; past it a DEMAND is ignored and counted")
    func pendingCreditIsBoundedInBytes() async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            let filler = String(repeating: "f", count: 65_530)
            try wire.send(Frame(.demand, channel: filler, payload: [0, 0, 0, 1]))       // kept: 65,530 bytes of names
            try wire.send(Frame(.demand, channel: filler, payload: [0, 0, 0, 1]))       // the same name: no more bytes
            try wire.send(Frame(.demand, channel: "switchboard/ticker", payload: [0, 0, 0, 1]))  // past 64 KiB: ignored
            try wire.send(.call(1, "switchboard/ticker", "listen", .stringMap(["count": 3, "intervalMs": 0])))
            var events = 0
            while events < 4 {  // three events and the end, as without a DEMAND
                let frame = try await wire.frame()
                if frame.kind == .message, frame.channel == "switchboard/ticker" { events += 1 }
            }
            let text = try RawConnection(port: port)
            try text.send(line: #"{"id":1,"demand":"\#(String(repeating: "t", count: 70_000))","n":5}"#)
            #expect(try await text.line()["result"] == .null)
            let counts = try await stats(wire, id: 2)
            #expect(counts["demandsIgnored"]?.intValue == 2)
        }
    }

    /// The room (``Dictionary/capacity``) of every table that holds an entry per channel a client holds:
    /// on each loop, its registrations; then the claims, which the loops share. (A cluster node's link
    /// has its own: ClusterMemoryBoundTests.)
    private func channelTableRoom(_ server: Server) async -> [Int] {
        let perLoop = await withCheckedContinuation { (done: CheckedContinuation<[Int], Never>) in
            server.group.gather(from: 0, { core in core.directory.registrations.capacity }) { done.resume(returning: $0.map { $0 ?? 0 }) }
        }
        return perLoop + [server.group.claims.withLock { $0.capacity }]
    }

    @Test("the tables of held channels give their room back once a flood of channels is let go (Dictionary never shrinks by itself)")
    func channelTablesShrinkAfterMassRelease() async throws {
        let perHolder = 5_000
        try await withServer({ $0.loops = max(2, $0.loops); $0.maxRegistrationsPerConnection = perHolder }) { server, port in
            let loops = server.group.count
            let holders = try (0..<loops).map { _ in try RawConnection(port: port) }  // connections are dealt round the loops
            for (h, holder) in holders.enumerated() {
                var batch: [UInt8] = []
                for n in 0..<perHolder { batch += Frame(.register, id: 0, channel: "flood/\(h)/\(n)", payload: nil).bytes }
                try holder.send(batch)
                _ = try await holder.barrier()
            }
            let wire = try RawConnection(port: port)
            #expect(try await stats(wire, id: 1)["registrations"]?.intValue == loops * perHolder)
            let full = await channelTableRoom(server)
            #expect(full.allSatisfy { $0 >= perHolder }, "\(full)")

            for holder in holders { holder.reset() }
            var id: UInt32 = 2
            while try await stats(wire, id: id)["registrations"]?.intValue != 0 { id += 1 }
            let left = await channelTableRoom(server)
            #expect(left.allSatisfy { $0 <= shrinkableRoom }, "room left after every channel went: \(left), full: \(full)")
        }
    }

    @Test("a removal that shrinks the storage returns what it removed and keeps every entry left, in a dictionary and in a set")
    func shrinkingRemovalKeepsTheRest() {
        var table = Dictionary(uniqueKeysWithValues: (0..<40_000).map { ("name/\($0)", $0) })
        var names = Set(table.keys)
        let full = (table.capacity, names.capacity)
        var wrong = 0
        for n in 0..<39_990 {
            if table.removeValueShrinking(forKey: "name/\(n)") != n { wrong += 1 }
            if names.removeShrinking("name/\(n)") != "name/\(n)" { wrong += 1 }
        }
        #expect(wrong == 0 && table.removeValueShrinking(forKey: "name/0") == nil && names.removeShrinking("name/0") == nil)
        #expect(table == Dictionary(uniqueKeysWithValues: (39_990..<40_000).map { ("name/\($0)", $0) }) && names == Set(table.keys))
        #expect(table.capacity < shrinkableRoom && names.capacity < shrinkableRoom, "full: \(full)")
    }
}
