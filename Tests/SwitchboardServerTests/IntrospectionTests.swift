import Synchronization
import Testing
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// `switchboard/channels`, `switchboard/connections` and the console page (protocol/demo-channels.md).
@Suite struct IntrospectionTests {
    @Test("channels list: kind, codec, holder, listeners and counters of every channel, sorted by name")
    func channelsList() async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            for id: UInt32 in 1...3 { _ = try await call(wire, id, "switchboard/echo", "echo", .int(Int(id))) }
            try wire.send(.call(4, "switchboard/ticker", "listen", .stringMap(["intervalMs": 60_000])))
            _ = try await wire.frame()
            let holder = try RawConnection(port: port)
            try holder.send(Frame(.register, id: 1, channel: "app/held", payload: Array(#"{"kind":"event","codec":"json"}"#.utf8)))
            _ = try await holder.frame()

            let rows = try #require(try await call(wire, 5, "switchboard/channels", "list").get()["channels"]?.listValue)
            let names = rows.compactMap { $0["name"]?.stringValue }
            #expect(names == names.sorted() && names.contains("switchboard/message.binary"))
            let byName = Dictionary(uniqueKeysWithValues: rows.map { ($0["name"]?.stringValue ?? "", $0) })
            let echo = try #require(byName["switchboard/echo"])
            #expect(echo["kind"] == "method" && echo["codec"] == "standard" && echo["held"] == false)
            #expect(echo["requests"]?.intValue == 3)
            #expect(byName["switchboard/echo.json"]?["codec"] == "json")
            #expect(byName["switchboard/message.string"]?["codec"] == "string")
            #expect(byName["switchboard/room.post"]?["kind"] == "message")
            let ticker = try #require(byName["switchboard/ticker"])
            #expect(ticker["kind"] == "event" && ticker["listeners"]?.intValue == 1)
            let held = try #require(byName["app/held"])
            #expect(held["held"] == true && held["kind"] == "event" && held["codec"] == "json")
        }
    }

    @Test("connections list: transport, mode, client, traffic, open requests, listens with credit; paging")
    func connectionsList() async throws {
        let held = Mutex<[MethodResult]>([])
        try await withServer({ $0.drainTimeoutMs = 100 }, setUp: { server in
            MethodChannel(name: "test/hang", server: server).setMethodCallHandler { _, result in held.withLock { $0.append(result) } }
        }) { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(Frame(.hello, id: 1, payload: Array(#"{"client":"inspector"}"#.utf8)))
            _ = try await wire.frame()
            try wire.send(.call(9, "test/hang", "wait"))
            try wire.send(Frame(.demand, id: 0, channel: "switchboard/ticker", payload: [0, 0, 0, 2]))
            try wire.send(.call(2, "switchboard/ticker", "listen", .stringMap(["intervalMs": 60_000])))
            _ = try await wire.frame()
            let text = try RawConnection(port: port)
            try text.send(line: #"{"id":1,"call":"switchboard/echo","method":"echo","args":1}"#)
            _ = try await text.line()
            let web = try #require(RawWebSocket(port: port))

            let page = try await call(wire, 3, "switchboard/connections", "list").get()
            #expect(page["total"]?.intValue == 3)
            let rows = try #require(page["connections"]?.listValue)
            #expect(rows.compactMap { $0["id"]?.intValue } == rows.compactMap { $0["id"]?.intValue }.sorted())
            let me = try #require(rows.first { $0["client"] == "inspector" })
            #expect(me["transport"] == "tcp" && me["mode"] == "binary")
            #expect(me["remote"]?.stringValue?.hasPrefix("127.0.0.1:") == true)
            #expect(me["identity"] == .null)
            #expect((me["bytesIn"]?.intValue ?? 0) > 40 && (me["bytesOut"]?.intValue ?? 0) > 20)
            #expect(me["openRequests"]?.intValue == 1)  // the call to test/hang
            #expect(me["listens"] == .list([.stringMap(["channel": "switchboard/ticker", "credit": 2])]))
            #expect(rows.contains { $0["mode"] == "text" && $0["transport"] == "tcp" })
            #expect(rows.contains { $0["transport"] == "ws" && $0["mode"] == "undecided" })
            _ = web

            let second = try await call(wire, 4, "switchboard/connections", "list", .stringMap(["offset": 1, "limit": 1])).get()
            #expect(second["total"]?.intValue == 3)
            #expect(second["connections"]?.listValue?.map { $0["id"] } == [rows[1]["id"]])
            let bad = try await call(wire, 5, "switchboard/connections", "list", .stringMap(["limit": 0]))
            #expect(bad.failure?.code == "bad_arguments")
        }
    }

    @Test("connections list: an offset or limit at Int64's edge is a page, past the end an empty one, in binary and text mode")
    func connectionsListAtIntEdges() async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            let page = try await call(wire, 1, "switchboard/connections", "list",
                                      .stringMap(["offset": .int(Int.max), "limit": 1])).get()
            #expect(page["total"]?.intValue == 1 && page["connections"] == .list([]))
            let last = try await call(wire, 2, "switchboard/connections", "list",
                                      .stringMap(["offset": .int(Int.max - 999), "limit": 1000])).get()
            #expect(last["connections"] == .list([]))

            let text = try RawConnection(port: port)
            try text.send(line: #"{"id":1,"call":"switchboard/connections","method":"list","args":{"offset":9223372036854775807,"limit":1}}"#)
            let answer = try await text.line()
            #expect(answer["result"]?["connections"] == .list([]) && answer["result"]?["total"]?.intValue == 2)
            try text.send(line: #"{"id":2,"call":"switchboard/connections","method":"list","args":{"offset":-9223372036854775808}}"#)
            #expect(try await text.line()["error"]?["code"] == "bad_arguments")
            #expect(try await call(wire, 3, "switchboard/echo", "echo", 7).get() == 7)  // still serving
        }
    }

    @Test("connections close: the connection is closed and counted; an unknown id is not_found")
    func operatorClose() async throws {
        try await withServer { _, port in
            let op = try RawConnection(port: port)
            let victim = try RawConnection(port: port)
            try victim.send(Frame(.hello, id: 1, payload: Array(#"{"client":"victim"}"#.utf8)))
            _ = try await victim.frame()
            let rows = try #require(try await call(op, 1, "switchboard/connections", "list").get()["connections"]?.listValue)
            let id = try #require(rows.first { $0["client"] == "victim" }?["id"])
            #expect(try await call(op, 2, "switchboard/connections", "close", id).get() == .null)
            #expect(try await victim.isClosedByServer())
            let missing = try await call(op, 3, "switchboard/connections", "close", 999_999)
            #expect(missing.failure?.code == "not_found")
            let stats = try await call(op, 4, "switchboard/stats", "get").get()
            #expect(stats["closes"]?["closedByOperator"]?.intValue == 1)
        }
    }

    @Test("stats: requests and events totals keep counting after a channel goes")
    func totals() async throws {
        try await withServer { _, port in
            let holder = try RawConnection(port: port)
            try holder.send(Frame(.register, id: 1, channel: "app/gone", payload: nil))
            _ = try await holder.frame()
            let caller = try RawConnection(port: port)
            let before = try await call(caller, 1, "switchboard/stats", "get").get()["requests"]?.intValue ?? -1
            try caller.send(.call(2, "app/gone", "x"))
            let forwarded = try await holder.frame()
            try holder.send(Frame(.reply, id: forwarded.id, payload: [0, 0]))
            _ = try await caller.frame()
            try holder.send(Frame(.unregister, id: 2, channel: "app/gone", payload: nil))
            _ = try await holder.frame()
            let after = try await call(caller, 3, "switchboard/stats", "get").get()["requests"]?.intValue ?? -1
            #expect(after == before + 2)  // the stats call itself and the call to the channel now gone
        }
    }

    @Test("GET / serves the console page with the JavaScript client inlined; --http off is 404")
    func consolePage() async throws {
        try await withServer { _, port in
            let page = try #require(httpGet("/", port: port))
            #expect(page.status == 200)
            #expect(page.body.hasPrefix("<!DOCTYPE html>") || page.body.hasPrefix("<!doctype html>"))
            #expect(!page.body.contains("'../js/client.js'") && page.body.contains("data:text/javascript;charset=utf-8,"))
            #expect(page.body.contains("%27.%2Fcodec.js%27") == false)  // the codec is inlined in the client too
            #expect(httpGet("/?server=ws://elsewhere/", port: port)?.status == 200)
            #expect(httpGet("/index.html", port: port)?.status == 404)
        }
        try await withServer({ $0.httpEndpoints = false }) { _, port in
            #expect(httpGet("/", port: port)?.status == 404)
        }
    }
}

extension Result {
    var failure: Failure? { if case .failure(let error) = self { error } else { nil } }
}
