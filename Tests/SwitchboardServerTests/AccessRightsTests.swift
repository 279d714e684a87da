#if canImport(Glibc)
import Glibc
#endif
import Testing
import SwitchboardCodec
import SwitchboardPlugins
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// The rights of protocol/plugins.md ("Security model") where they are easiest to get wrong: a request
/// whose channel is held on another loop, methods that only a grant naming them allows, REGISTER, and
/// what a reload takes away.
@Suite("Access rights: kinds across loops, methods, registrations, reloads")
struct AccessRightsTests {
    /// viewer may call `orders/*` but not `orders/admin`, and send nothing; ops may do anything.
    static let ordersRules = AccessRules(users: [
        .init(name: "viewer", tokenSha256: sha("viewer-token"),
              allow: .init(call: ["orders/*"], send: []), deny: .init(call: ["orders/admin"])),
        .init(name: "ops", tokenSha256: sha("ops-token"), allow: .init(register: ["orders/*"])),
    ])

    /// Connects and says HELLO with `token`.
    private func user(_ token: String, port: Int) async throws -> RawConnection {
        let wire = try RawConnection(port: port)
        try wire.send(hello(token: token))
        #expect(try await wire.frame().kind == .welcome)
        return wire
    }

    @Test("a request on a channel held on another loop is judged by the kind the holder's channel gives it, as on the holder's loop")
    func kindsAcrossLoops() async throws {
        let settings = LiveSettings(PluginConfiguration(access: Self.ordersRules))
        try await withServer({ $0.loops = 4 }, setUp: { server in
            for plugin in PluginConfiguration.plugins(reading: settings) { server.load(plugin) }
        }) { _, port in
            // Connections are dealt round four loops: ops on loop 0, viewers on loops 1 (another) and 0 (the same) in turn.
            let ops = try await user("ops-token", port: port)
            let otherLoop = try await user("viewer-token", port: port)
            for _ in 0..<2 { _ = try RawConnection(port: port) }
            let sameLoop = try await user("viewer-token", port: port)
            try ops.send(Frame(.register, id: 2, channel: "orders/admin", payload: Array(#"{"kind":"method"}"#.utf8)))
            try ops.send(Frame(.register, id: 3, channel: "orders/notes",
                               payload: Array(#"{"kind":"message","codec":"binary"}"#.utf8)))
            #expect(try await ops.frame() == Frame(.reply, id: 2, payload: nil))
            #expect(try await ops.frame() == Frame(.reply, id: 3, payload: nil))
            for viewer in [sameLoop, otherLoop] {
                // A method named `cancel` on a method channel is a call, and viewer may not call orders/admin.
                try viewer.send(.call(10, "orders/admin", "cancel", ["order": 42]))
                // Raw bytes to a message channel are a send, and viewer may send nothing.
                try viewer.send(Frame(.message, id: 11, channel: "orders/notes", payload: [1, 2, 3]))
                let answers = [try await viewer.frame(), try await viewer.frame()]
                #expect(answers.map(\.id) == [10, 11])
                #expect(answers.map(\.errorCode) == ["forbidden", "forbidden"])
            }
            // The same in text mode, from another loop: `cancel` called on a method channel is a call.
            for _ in 0..<3 { _ = try RawConnection(port: port) }
            let text = try RawConnection(port: port)  // the tenth connection: loop 1
            try text.send(line: #"{"hello":{"version":1,"token":"viewer-token"}}"#)
            #expect(try await text.line()["welcome"] != nil)
            try text.send(line: #"{"id":12,"call":"orders/admin","method":"cancel","args":{"order":42}}"#)
            #expect(try await text.line()["error"]?["code"] == "forbidden")
            #expect(try await ops.barrier().isEmpty)  // nothing reached the holder
        }
    }
}

@Suite("Access rights: REGISTER needs a grant")
struct RegisterGrantTests {
    @Test("a user with rules but no `register` under allow may not REGISTER; one with no rules at all may, and so may one granted it")
    func registerNeedsAGrant() throws {
        let rules = AccessRules(users: [
            .init(name: "reader", tokenSha256: sha("reader-token"), allow: .init(call: ["orders/*"], listen: ["orders/*"])),
            .init(name: "auditor", tokenSha256: sha("auditor-token"), deny: .init(call: ["orders/admin"])),
            .init(name: "service", tokenSha256: sha("service-token"), allow: .init(register: ["orders/*"])),
            .init(name: "root", tokenSha256: sha("root-token")),
        ], anonymous: .init(allow: .init(call: ["*"])))
        let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: LiveSettings(PluginConfiguration(access: rules))))
        for (token, expected) in [("reader-token", "forbidden"), ("auditor-token", "forbidden"), (nil, "forbidden"),
                                  ("service-token", nil), ("root-token", nil)] as [(String?, String?)] {
            let peer = embedded.connect()
            if let token { peer.send(hello(token: token)) }
            peer.send(Frame(.register, id: 7, channel: "orders/lookup-\(token ?? "anonymous")", payload: nil))
            embedded.run()
            let answer = try #require(try peer.frames().last)
            #expect(answer.id == 7 && answer.errorCode == expected, "\(token ?? "anonymous")")
        }
    }
}

@Suite("Access rights: methods, and the introspection channels by default")
struct MethodRightsTests {
    static let rules = AccessRules(users: [
        // protocol/plugins.md's example user: every switchboard/* channel, which lists but never closes.
        .init(name: "app", tokenSha256: sha("app-token"), allow: .init(call: ["switchboard/*"])),
        .init(name: "root", tokenSha256: sha("root-token")),
        .init(name: "operator", tokenSha256: sha("operator-token"), allow: .init(call: ["*", "switchboard/connections#close"])),
        .init(name: "auditor", tokenSha256: sha("auditor-token"), deny: .init(call: ["switchboard/connections#list"])),
        .init(name: "finder", tokenSha256: sha("finder-token"), allow: .init(call: ["switchboard/echo#echo"])),
    ])

    /// The error code each call gets (nil: an answer), from a client that said HELLO with `token`.
    private func codes(_ embedded: EmbeddedServer, token: String?, loopback: Bool = true,
                       _ calls: [(String, String, ChannelValue)]) throws -> [String?] {
        let peer = embedded.connect()
        peer.isLoopbackPeer = loopback
        if let token { peer.send(hello(token: token, id: 100)) }
        for (index, (channel, method, arguments)) in calls.enumerated() {
            peer.send(try .call(UInt32(index + 1), channel, method, arguments))
        }
        embedded.run()
        return try peer.frames().filter { $0.id != 100 }.map(\.errorCode)
    }

    @Test("a right that names a channel or a pattern never grants `close`; only a grant naming the method does; methods can be allowed and denied by name")
    func methodRights() throws {
        let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: LiveSettings(PluginConfiguration(access: Self.rules))))
        let victim = embedded.connect()
        embedded.run()
        let list: (String, String, ChannelValue) = ("switchboard/connections", "list", .null)
        let close: (String, String, ChannelValue) = ("switchboard/connections", "close", .int(999))  // no such connection
        #expect(try codes(embedded, token: "app-token", [list, close]) == [nil, "forbidden"])
        #expect(try codes(embedded, token: "root-token", [list, close]) == [nil, "forbidden"])
        #expect(try codes(embedded, token: "operator-token", [list, close]) == [nil, nil])  // close answers not_found in its envelope
        #expect(try codes(embedded, token: "auditor-token", [list, close, ("switchboard/channels", "list", .null)]) == ["forbidden", "forbidden", nil])
        #expect(try codes(embedded, token: "finder-token", [("switchboard/echo", "echo", 1), ("switchboard/echo", "fail", 1)]) == [nil, "forbidden"])
        // The victim is still there: nobody but the operator could have closed it.
        #expect(!victim.isClosed && !victim.isClosingGracefully)
        // Text mode is judged the same.
        let text = embedded.connect()
        text.send(line: #"{"hello":{"version":1,"token":"app-token"}}"#)
        text.send(line: #"{"id":1,"call":"switchboard/connections","method":"close","args":1}"#)
        embedded.run()
        let lines = try text.lines()
        #expect(lines.last?["error"]?["code"] == "forbidden")
        #expect(lines.last?["error"]?["message"] == "user app may not call switchboard/connections#close")
    }

    @Test("over sockets, on one loop or several: `close` from a user granted switchboard/* is forbidden, from the operator it closes a connection of any loop")
    func closeOverSockets() async throws {
        let settings = LiveSettings(PluginConfiguration(access: Self.rules))
        try await withServer(setUp: { server in
            for plugin in PluginConfiguration.plugins(reading: settings) { server.load(plugin) }
        }) { _, port in
            let app = try RawConnection(port: port), victim = try RawConnection(port: port), op = try RawConnection(port: port)
            try app.send(hello(token: "app-token"))
            try op.send(hello(token: "operator-token"))
            try victim.send(hello(token: "root-token"))
            for wire in [app, op, victim] { #expect(try await wire.frame().kind == .welcome) }
            try app.send(.call(2, "switchboard/connections", "close", 2))
            #expect(try await app.frame().errorCode == "forbidden")
            #expect(try await victim.barrier().isEmpty)  // still served
            try op.send(.call(2, "switchboard/connections", "close", 2))
            #expect(try await op.frame().envelope() == .success(.null))
            #expect(try await victim.isClosedByServer())
        }
    }

    @Test("with no access control, the introspection channels serve clients on this machine only")
    func introspectionFromLoopbackOnly() throws {
        let embedded = try EmbeddedServer()
        let victim = embedded.connect()
        embedded.run()
        let calls: [(String, String, ChannelValue)] = [("switchboard/connections", "list", .null), ("switchboard/channels", "list", .null),
                                                        ("switchboard/connections", "close", .int(Int(1))), ("switchboard/stats", "get", .null)]
        #expect(try codes(embedded, token: nil, loopback: false, calls) == ["forbidden", "forbidden", "forbidden", nil])
        #expect(!victim.isClosed && !victim.isClosingGracefully)
        #expect(try codes(embedded, token: nil, loopback: true, Array(calls[0...1])) == [nil, nil])
        let stranger = embedded.connect()
        stranger.isLoopbackPeer = false
        stranger.send(line: #"{"id":1,"call":"switchboard/connections","method":"close","args":1}"#)
        embedded.run()
        #expect(try stranger.lines().last?["error"]?["code"] == "forbidden")
    }
}

@Suite("Access rights: what a reload takes away")
struct ReloadRevocationTests {
    static func rules(withApp: Bool) -> AccessRules {
        var users: [AccessRules.User] = [.init(name: "bob", tokenSha256: sha("bob-token"), allow: .init(call: ["app/*"]))]
        if withApp {
            users.append(.init(name: "app", tokenSha256: sha("app-token"),
                               allow: .init(call: [], listen: ["switchboard/room"], register: ["app/*"])))
        }
        return AccessRules(users: users)
    }

    @Test("a user removed by a reload loses the channels it holds (open requests answered handler_gone, later ones no holder) and its streams end with forbidden, on any loop")
    func reloadRevokes() async throws {
        let settings = LiveSettings(PluginConfiguration(access: Self.rules(withApp: true)))
        try await withServer({ $0.loops = 4 }, setUp: { server in
            for plugin in PluginConfiguration.plugins(reading: settings) { server.load(plugin) }
        }) { _, port in
            let app = try RawConnection(port: port), bob = try RawConnection(port: port)  // loops 0 and 1
            let sameLoopCaller = try (0..<4).map { _ in try RawConnection(port: port) }[3]  // loop 0
            for wire in [app, bob, sameLoopCaller] {
                try wire.send(hello(token: wire === app ? "app-token" : "bob-token"))
                #expect(try await wire.frame().kind == .welcome)
            }
            try app.send(Frame(.register, id: 2, channel: "app/svc", payload: Array(#"{"kind":"method"}"#.utf8)))
            #expect(try await app.frame() == Frame(.reply, id: 2, payload: nil))
            try app.send(.call(3, "switchboard/room", "listen"))
            #expect(try await app.frame().id == 3)
            for caller in [bob, sameLoopCaller] {
                try caller.send(.call(5, "app/svc", "work"))
                #expect(try await app.frame().kind == .message)  // forwarded, and left open
            }

            settings.replace(with: PluginConfiguration(access: Self.rules(withApp: false)))

            for caller in [bob, sameLoopCaller] {
                #expect(try await caller.frame() == Frame(.error, id: 5, payload: WireError.handlerGone.payload))
            }
            var told: [Frame] = []
            for _ in 0..<3 { told.append(try await app.nextNonPing()) }
            #expect(told.contains { $0.kind == .error && $0.id == 0 && $0.errorCode == "forbidden" })  // the channel is gone
            let room = told.filter { $0.kind == .message && $0.channel == "switchboard/room" }
            #expect(room.count == 2)
            guard case .failure(let error)? = try room.first?.envelope() else { throw TestFailure("no error event: \(room)") }
            #expect(error.code == "forbidden")  // an error event
            #expect(room.last?.payload == nil)  // then the end
            for caller in [bob, sameLoopCaller] {
                try caller.send(.call(6, "app/svc", "work"))
                #expect(try await caller.frame() == Frame(.reply, id: 6, payload: nil))  // no holder any more
            }
            #expect(try await app.barrier().isEmpty)  // and nothing more reached app
        }
    }
}

/// Ways around the rights that an attacker's review found: each must be refused as the plain request is.
@Suite("Access rights: a method named in another form")
struct MethodFormTests {
    /// A Standard method call whose method name is written as a legacy large int (type 5), which reads
    /// as text but is no method name.
    static func largeIntMethodCall(_ method: String, _ argument: [UInt8]) -> [UInt8] {
        [5, UInt8(method.utf8.count)] + Array(method.utf8) + argument
    }

    @Test("a method name written as type 5 is no method name: not a close, not a listen, however the gate reads it")
    func largeIntMethodName() throws {
        let rules = AccessRules(users: [
            .init(name: "app", tokenSha256: sha("app-token"), allow: .init(call: ["switchboard/*"], listen: [])),
        ])
        let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: LiveSettings(PluginConfiguration(access: rules))))
        let victim = embedded.connect()
        embedded.run()
        let app = embedded.connect()
        app.send(hello(token: "app-token"))
        app.send(Frame(.message, id: 2, channel: "switchboard/connections", payload: Self.largeIntMethodCall("close", [3, 1, 0, 0, 0])))
        app.send(Frame(.message, id: 3, channel: "switchboard/ticker", payload: Self.largeIntMethodCall("listen", [0])))
        embedded.run()
        let answers = try app.frames().filter { $0.id != 1 }
        #expect(answers.map(\.id) == [2, 3])
        #expect(answers.allSatisfy { $0.kind == .error })  // refused, or not a call at all: never served
        #expect(!victim.isClosed && !victim.isClosingGracefully)
        #expect(try app.frames().isEmpty)  // no ticker event
        #expect(throws: CodecError.self) { try StandardMethodCodec().decodeMethodCall(Self.largeIntMethodCall("close", [0])) }
    }

    @Test("a JSON call that names two methods is refused, not judged by one and run as the other")
    func jsonCallWithTwoMethods() throws {
        let rules = AccessRules(users: [
            .init(name: "viewer", tokenSha256: sha("viewer-token"), allow: .init(call: ["orders/*"]), deny: .init(call: ["orders/j#delete"])),
            .init(name: "ops", tokenSha256: sha("ops-token"), allow: .init(register: ["orders/*"])),
        ])
        let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: LiveSettings(PluginConfiguration(access: rules))))
        let ops = embedded.connect(), viewer = embedded.connect()
        ops.send(hello(token: "ops-token"))
        ops.send(Frame(.register, id: 2, channel: "orders/j", payload: Array(#"{"kind":"method","codec":"json"}"#.utf8)))
        viewer.send(hello(token: "viewer-token"))
        viewer.send(Frame(.message, id: 2, channel: "orders/j", payload: Array(#"{"method":"find","args":null,"method":"delete"}"#.utf8)))
        viewer.send(Frame(.message, id: 3, channel: "orders/j", payload: Array(#"{"method":"delete","args":null}"#.utf8)))
        embedded.run()
        #expect(try viewer.frames().filter { $0.id != 1 }.map(\.errorCode) == ["forbidden", "forbidden"])
        #expect(try ops.frames().allSatisfy { $0.kind != .message })  // nothing reached the holder
        #expect(throws: CodecError.self) { try JSONMethodCodec().decodeMethodCall(Array(#"{"method":"a","method":"b"}"#.utf8)) }
    }
}
