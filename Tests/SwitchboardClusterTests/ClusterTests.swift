import Logging
import Synchronization
import Testing
import SwitchboardClient
import SwitchboardCluster
import SwitchboardCodec
import SwitchboardDemo
import SwitchboardServer
import SwitchboardTesting

/// Switchboard nodes joined by one nats-server, each serving on a thread of its own.
final class ClusterNodes {
    let servers: [Server]

    /// `count` nodes of `loops` loops each, node i attached to `nats[i % nats.count]`, draining for
    /// `drainTimeoutMs` when stopped; `setUp` runs on each before it starts (to load plugins, say), and
    /// `configure` changes each node's configuration first.
    init(_ count: Int, loops: Int = 1, drainTimeoutMs: UInt64 = 300, nats: NATSServerProcess...,
         setUp: (Server) -> Void = { _ in }, configure: (inout ServerConfiguration) -> Void = { _ in }) throws {
        servers = try (1...count).map { index in
            var config = ServerConfiguration()
            config.port = 0
            config.loops = loops
            config.drainTimeoutMs = drainTimeoutMs
            let port = nats[(index - 1) % nats.count].port
            config.cluster = ClusterSettings(servers: [NATSBus.Server(host: "127.0.0.1", port: port)], node: "node\(index)")
            configure(&config)
            var logger = Logger(label: "node\(index)")
            logger.logLevel = .critical
            let server = try Server(configuration: config, logger: logger)
            server.installDemoChannels()
            setUp(server)
            try server.start()
            return server
        }
    }

    func stop() async {
        for server in servers { server.shutdown() }
        for server in servers { await server.waitUntilStopped() }
    }
}

/// Values collected by one task and read by another.
final class Collected: Sendable {
    private let values = Mutex<[ChannelValue]>([])
    func append(_ value: ChannelValue) { values.withLock { $0.append(value) } }
    var all: [ChannelValue] { values.withLock { $0 } }
}

/// A client of one node, with what its room listener received.
final class RoomMember: Sendable {
    let client: Client
    let received = Collected()
    private let listening = Mutex<Task<Void, any Error>?>(nil)

    init(_ server: Server) async throws {
        var config = ClientConfiguration(port: server.port)
        config.reconnect = nil
        config.requestTimeout = .seconds(5)
        client = try await Client.connect(config)
    }

    func listen() {
        let client = self.client, received = self.received
        let task = Task {
            for try await event in EventChannel(name: "switchboard/room", client: client).receiveBroadcastStream() {
                received.append(event)
            }
        }
        listening.withLock { $0 = task }
    }

    func stopListening() { listening.withLock { $0?.cancel() } }

    func post(_ byte: UInt8) async throws {
        _ = try await BasicMessageChannel(name: "switchboard/room.post", codec: BinaryCodec(), client: client).send([byte])
    }

    /// The node's `cluster` stats.
    func cluster() async throws -> ChannelValue {
        let stats: ChannelValue = try await MethodChannel(name: "switchboard/stats", client: client).invokeMethod("get")
        return stats["cluster"] ?? .null
    }

    var events: [ChannelValue] { received.all }
}

@Suite("A cluster of nodes over nats-server", .serialized, .needsNATSServer)
struct ClusterTests {
    @Test("a room post on one node reaches the room's listeners on every node once, in order; a node with no listener carries none of it")
    func roomAcrossNodes() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(3, nats: nats)
        let members = try await [RoomMember(nodes.servers[0]), RoomMember(nodes.servers[1]), RoomMember(nodes.servers[2])]
        for member in members { #expect(try await eventually { try await member.cluster()["connected"] == true }) }
        members[0].listen()
        members[1].listen()
        // Warm-up: zeros until both listens are in place (node 2's subscription reaching nats-server).
        var warmUps = 0
        #expect(try await eventually {
            try await members[0].post(0)
            warmUps += 1
            return !members[0].events.isEmpty && !members[1].events.isEmpty
        })
        for byte in 1...100 { try await members[0].post(UInt8(byte)) }
        let posts = (1...100).map { ChannelValue.uint8List([UInt8($0)]) }
        let zero = ChannelValue.uint8List([0])
        #expect(try await eventually { members[1].events.last == posts.last && members[0].events.last == posts.last })
        #expect(members[1].events.filter { $0 != zero } == posts, "node 2: in order, each once")
        #expect(members[0].events.filter { $0 != zero } == posts, "node 1's own listener: each once (no echo from the bus)")
        #expect(members[0].events.count <= warmUps + 100 && members[1].events.count <= warmUps + 100)
        let quiet = try await members[2].cluster()
        #expect(quiet["eventsIn"] == 0 && quiet["channelsListened"] == 0, "\(quiet)")
        let sender = try await members[0].cluster()
        #expect(sender["eventsOut"]?.intValue == warmUps + 100, "\(sender)")

        // Interest follows listeners: node 3 gets the room once it listens, and nothing after it stops.
        members[2].listen()
        #expect(try await eventually { try await members[1].post(200); return members[2].events.contains(.uint8List([200])) })
        members[2].stopListening()
        #expect(try await eventually { try await members[2].cluster()["channelsListened"] == 0 })
        try await Task.sleep(for: .milliseconds(200))  // real time: the UNSUB reaches nats-server, which says nothing back
        let before = try await members[2].cluster()["eventsIn"]
        for _ in 0..<10 { try await members[1].post(201) }
        #expect(try await eventually { members[0].events.filter { $0 == .uint8List([201]) }.count == 10 })
        #expect(try await members[2].cluster()["eventsIn"] == before)

        for member in members { await member.client.close() }
        await nodes.stop()
    }

    @Test("nats-server restarts: local posts go on, posts meanwhile are dropped and counted, then the nodes resubscribe and heal")
    func busRestart() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(2, nats: nats)
        let members = try await [RoomMember(nodes.servers[0]), RoomMember(nodes.servers[1])]
        for member in members { #expect(try await eventually { try await member.cluster()["connected"] == true }) }
        for member in members { member.listen() }
        #expect(try await eventually { try await members[0].post(0); return !members[1].events.isEmpty })

        nats.stop()
        #expect(try await eventually { try await members[0].cluster()["connected"] == false })
        try await members[0].post(7)
        #expect(try await eventually { members[0].events.last == .uint8List([7]) }, "local listeners go on")
        #expect(try await members[0].cluster()["busDropped"]?.intValue ?? 0 >= 1)
        #expect(try await members[0].cluster()["eventsUnsent"]?.intValue ?? 0 >= 1, "not counted as sent")

        try nats.start()
        for member in members { #expect(try await eventually { try await member.cluster()["connected"] == true }) }
        #expect(try await eventually { try await members[0].post(8); return members[1].events.last == .uint8List([8]) })
        #expect(try await members[0].cluster()["busReconnects"]?.intValue ?? 0 >= 1)
        #expect(!members[1].events.contains(.uint8List([7])), "at most once: the post made during the outage is lost")

        for member in members { await member.client.close() }
        await nodes.stop()
    }
}
