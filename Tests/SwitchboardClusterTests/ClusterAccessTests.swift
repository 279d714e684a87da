import Testing
import Synchronization
import SwitchboardClient
import SwitchboardCodec
import SwitchboardPlugins
import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport
import SwitchboardWire

/// A count shared with handlers.
final class Counter: Sendable {
    private let count = Mutex(0)
    func increment() { count.withLock { $0 += 1 } }
    var value: Int { count.withLock { $0 } }
}

@Suite("Access rights across nodes", .serialized, .needsNATSServer)
struct ClusterAccessTests {
    /// viewer may call `orders/*` but not `orders/admin`, and send nothing; ops may register `orders/*`.
    static let rules = AccessRules(users: [
        .init(name: "viewer", tokenSha256: Digest.sha256Hex(Array("viewer-token".utf8)),
              allow: .init(call: ["orders/*"], send: []), deny: .init(call: ["orders/admin", "orders/j#delete"])),
        .init(name: "ops", tokenSha256: Digest.sha256Hex(Array("ops-token".utf8)), allow: .init(register: ["orders/*"])),
    ])

    private func user(_ token: String, port: Int) async throws -> RawConnection {
        let wire = try RawConnection(port: port)
        try wire.send(Frame(.hello, id: 1, payload: Array(#"{"version":1,"token":"\#(token)"}"#.utf8)))
        #expect(try await wire.frame().kind == .welcome)
        return wire
    }

    @Test("a request on a channel held on another node is refused as the holder's node tells its kind: a `cancel` call to a method channel, bytes to a message channel")
    func kindsAcrossNodes() async throws {
        let nats = try NATSServerProcess()
        let settings = LiveSettings(PluginConfiguration(access: Self.rules))
        let nodes = try ClusterNodes(2, nats: nats) { server in
            for plugin in PluginConfiguration.plugins(reading: settings) { server.load(plugin) }
        }
        var config = ClientConfiguration(port: nodes.servers[0].port)
        config.reconnect = nil
        config.token = "ops-token"
        let ops = try await Client.connect(config)
        let reached = Counter()
        for name in ["orders/admin", "orders/lookup"] {
            try await SwitchboardClient.MethodChannel(name: name, client: ops).setMethodCallHandler { call in
                reached.increment()
                return .string(call.method)
            }
        }
        try await SwitchboardClient.MethodChannel(name: "orders/j", codec: JSONMethodCodec(), client: ops).setMethodCallHandler { call in
            reached.increment()
            return .string(call.method)
        }
        try await BasicMessageChannel(name: "orders/notes", codec: BinaryCodec(), client: ops).setMessageHandler { bytes in
            reached.increment()
            return bytes
        }
        let viewer = try await user("viewer-token", port: nodes.servers[1].port)
        // A call viewer may make reaches the holder once node 1's subscriptions have reached nats-server.
        #expect(try await eventually {
            try viewer.send(.call(5, "orders/lookup", "find", ["order": 42]))
            return try await viewer.nextNonPing().payload != nil
        })
        #expect(try await eventually { reached.value == 1 })
        try viewer.send(.call(10, "orders/admin", "cancel", ["order": 42]))
        try viewer.send(Frame(.message, id: 11, channel: "orders/notes", payload: [1, 2, 3]))
        let answers = [try await viewer.nextNonPing(), try await viewer.nextNonPing()].sorted { $0.id < $1.id }
        #expect(answers.map(\.id) == [10, 11])
        #expect(answers.map(\.errorCode) == ["forbidden", "forbidden"])
        #expect(reached.value == 1)  // neither reached the holder
        // A method right on a channel held in the JSON codec on another node: the method is read as the
        // holder's node reads it.
        try viewer.send(Frame(.message, id: 12, channel: "orders/j", payload: Array(#"{"method":"delete","args":null}"#.utf8)))
        #expect(try await viewer.nextNonPing().errorCode == "forbidden")
        try viewer.send(Frame(.message, id: 13, channel: "orders/j", payload: Array(#"{"method":"find","args":null}"#.utf8)))
        #expect(try await viewer.nextNonPing().payload == Array(#"["find"]"#.utf8))
        #expect(reached.value == 2)
        let stats = try await clusterStats(ops)
        #expect(stats["callsForbidden"] == 2)
        await ops.close()
        await nodes.stop()
    }
}
