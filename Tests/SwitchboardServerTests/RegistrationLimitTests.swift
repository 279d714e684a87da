import Testing
import SwitchboardCodec
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// What one client can make the server hold by REGISTER (issue 27, finding 7): the per-connection cap,
/// `switchboard/channels` in pages, and `/metrics` whose work does not grow with the channels held.
@Suite struct RegistrationLimitTests {
    private func register(_ wire: RawConnection, _ id: UInt32, _ name: String) async throws -> Frame {
        try wire.send(Frame(.register, id: id, channel: name, payload: nil))
        return try await wire.frame()
    }

    @Test("REGISTER past the per-connection cap is too_many_registrations, counted; re-registering or giving one back frees none or one")
    func capPerConnection() async throws {
        try await withServer({ $0.maxRegistrationsPerConnection = 3 }) { _, port in
            let holder = try RawConnection(port: port)
            for id: UInt32 in 1...3 { #expect(try await register(holder, id, "app/\(id)").kind == .reply) }
            let refused = try await register(holder, 4, "app/4")
            #expect(refused.kind == .error && refused.errorCode == "too_many_registrations" && refused.id == 4)
            #expect(try await register(holder, 5, "app/1").kind == .reply)  // the same name again: still 3
            try holder.send(Frame(.register, id: 0, channel: "app/5", payload: nil))  // id 0: the refusal is still sent
            let silent = try await holder.frame()
            #expect(silent.errorCode == "too_many_registrations" && silent.id == 0)
            try holder.send(Frame(.unregister, id: 6, channel: "app/2", payload: nil))
            #expect(try await holder.frame().kind == .reply)
            #expect(try await register(holder, 7, "app/4").kind == .reply)

            let other = try RawConnection(port: port)  // the cap is per connection
            for id: UInt32 in 1...3 { #expect(try await register(other, id, "other/\(id)").kind == .reply) }
            let stats = try await call(other, 4, "switchboard/stats", "get").get()
            #expect(stats["registrationsRefused"]?.intValue == 2 && stats["registrations"]?.intValue == 6)
            #expect(httpGet("/metrics", port: port)?.body.contains("switchboard_registrations_refused_total 2") == true)
        }
    }

    @Test("the default cap is 1,000 registrations per connection")
    func defaultCap() async throws {
        #expect(ServerConfiguration().maxRegistrationsPerConnection == 1000)
        try await withServer { _, port in
            let holder = try RawConnection(port: port)
            for id: UInt32 in 1...1000 { try holder.send(Frame(.register, id: 0, channel: "flood/\(id)", payload: nil)) }
            let refused = try await register(holder, 1, "flood/1001")
            #expect(refused.errorCode == "too_many_registrations" && refused.id == 1)
        }
    }

    @Test("channels list is paged like connections: total, offset, limit; null is the first 100; bad pages are bad_arguments")
    func channelsArePaged() async throws {
        try await withServer { _, port in
            let holders = try (0..<2).map { _ in try RawConnection(port: port) }
            for n in 0..<150 { try holders[n % 2].send(Frame(.register, id: 0, channel: "held/\(1000 + n)", payload: nil)) }
            let wire = try RawConnection(port: port)
            // The registrations with id 0 are unanswered: wait until the last of each holder is in.
            for (i, holder) in holders.enumerated() { #expect(try await register(holder, 1, "held/last\(i)").kind == .reply) }

            let first = try await call(wire, 1, "switchboard/channels", "list").get()
            let total = try #require(first["total"]?.intValue)
            let rows = try #require(first["channels"]?.listValue)
            #expect(total > 152 && rows.count == 100)
            var names = rows.compactMap { $0["name"]?.stringValue }
            #expect(names == names.sorted() && Set(names).count == 100)
            var offset = 100
            while offset < total {
                let page = try await call(wire, UInt32(offset), "switchboard/channels", "list",
                                          .stringMap(["offset": .int(offset), "limit": 37])).get()
                #expect(page["total"]?.intValue == total)
                names += page["channels"]?.listValue?.compactMap { $0["name"]?.stringValue } ?? []
                offset += 37
            }
            #expect(names.count == total && names == names.sorted() && Set(names).count == total)
            #expect(names.contains("switchboard/echo") && names.contains("held/1149") && names.contains("held/last1"))
            let past = try await call(wire, 2, "switchboard/channels", "list", .stringMap(["offset": .int(Int.max), "limit": 1000])).get()
            #expect(past["channels"] == .list([]) && past["total"]?.intValue == total)
            for bad: ChannelValue in [.stringMap(["limit": 0]), .stringMap(["limit": 1001]), .stringMap(["offset": -1]), "x"] {
                #expect(try await call(wire, 3, "switchboard/channels", "list", bad).failure?.code == "bad_arguments")
            }
        }
    }

    @Test("/metrics: the channels held past --metrics-channels are summed under other, whatever their number")
    func metricsSumTheRestAsOther() async throws {
        try await withServer({ $0.metrics = .prometheus(channelLimit: 5) }) { _, port in
            let holders = try (0..<4).map { _ in try RawConnection(port: port) }
            for n in 0..<400 { try holders[n % 4].send(Frame(.register, id: 0, channel: "many/\(n)", payload: nil)) }
            for (i, holder) in holders.enumerated() { #expect(try await register(holder, 1, "many/last\(i)").kind == .reply) }
            let caller = try RawConnection(port: port)
            try caller.send(.call(1, "many/399", "x"))
            let forwarded = try await holders[3].frame()
            try holders[3].send(Frame(.reply, id: forwarded.id, payload: nil))
            _ = try await caller.frame()

            let body = try #require(httpGet("/metrics", port: port)?.body)
            let series = body.split(separator: "\n").filter { $0.hasPrefix("switchboard_channel_requests_total{") }
            #expect(series.count <= 6)
            #expect(series.contains { $0.hasPrefix(#"switchboard_channel_requests_total{channel="other"} 1"#) })
        }
    }

    @Test("a loop's metrics snapshot carries at most --metrics-channels held channels: its work does not grow with them")
    func metricsSnapshotIsBounded() throws {
        var config = ServerConfiguration()
        config.metrics = .prometheus(channelLimit: 5)
        let embedded = try EmbeddedServer(configuration: config)
        let holders = (0..<4).map { _ in embedded.connect() }
        for n in 0..<400 { holders[n % 4].send(Frame(.register, id: 0, channel: "many/\(n)", payload: nil)) }
        holders[3].send(try .call(1, "switchboard/echo", "echo"))
        embedded.run()
        let core = embedded.server.core.value
        #expect(core.directory.registrations.count == 400)
        let snapshot = core.metricsSnapshot
        #expect(snapshot.channels.keys.filter { $0.hasPrefix("many/") }.count <= 5)
    }
}
