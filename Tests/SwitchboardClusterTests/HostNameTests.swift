import Logging
import Testing
import SwitchboardClient
import SwitchboardCluster
import SwitchboardCodec
import SwitchboardDemo
import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport

@Suite("Host names and IPv6: a server, a client and a cluster node each take `localhost` and `::1`", .serialized, .needsNATSServer)
struct HostNameTests {
    private func echo(host: String, port: Int) async throws -> ChannelValue {
        var config = ClientConfiguration(host: host, port: port)
        config.reconnect = nil
        let client = try await Client.connect(config)
        let answer: ChannelValue = try await SwitchboardClient.MethodChannel(name: "switchboard/echo", client: client)
            .invokeMethod("echo", arguments: .string(host))
        await client.close()
        return answer
    }

    @Test("a server listening on `localhost`, `::1` or `::` is reached by a client given `localhost`, `::1` or `[::1]`")
    func serverAndClient() async throws {
        for (listen, connect) in [("localhost", "localhost"), ("::1", "::1"), ("::1", "[::1]"), ("::", "localhost"), ("0.0.0.0", "localhost")] {
            var config = ServerConfiguration.forTests()
            config.host = listen
            let server = try Server(configuration: config)
            server.installDemoChannels()
            let port = try server.start()
            #expect(try await echo(host: connect, port: port) == .string(connect), "listening on \(listen), connecting to \(connect)")
            server.shutdown()
            await server.waitUntilStopped()
        }
    }

    @Test("a name that does not resolve, or a taken port, is an error that names it")
    func errorsNameTheAddress() async throws {
        var config = ServerConfiguration.forTests()
        config.host = "no-such-host.invalid"
        #expect { try Server(configuration: config).start() } throws: { "\($0)".contains("no-such-host.invalid") }
        var first = ServerConfiguration.forTests()
        first.host = "127.0.0.1"
        let server = try Server(configuration: first)
        let port = try server.start()
        var second = ServerConfiguration.forTests()
        second.port = port
        #expect { try Server(configuration: second).start() } throws: { "\($0)".contains("127.0.0.1:\(port)") && "\($0)".contains("EADDRINUSE") }
        server.shutdown()
        await server.waitUntilStopped()
        var client = ClientConfiguration(host: "no-such-host.invalid", port: 1)
        client.reconnect = nil
        await #expect(throws: (any Error).self) { try await Client.connect(client) }
    }

    @Test("a cluster node given nats://localhost:PORT joins the bus")
    func clusterByName() async throws {
        let nats = try NATSServerProcess()
        var config = ServerConfiguration.forTests()
        config.loops = 1
        config.cluster = ClusterSettings(servers: [try #require(NATSBus.Server(url: "nats://localhost:\(nats.port)"))], node: "named")
        let server = try Server(configuration: config)
        server.installDemoChannels()
        let port = try server.start()
        var clientConfig = ClientConfiguration(port: port)
        clientConfig.reconnect = nil
        let client = try await Client.connect(clientConfig)
        #expect(try await eventually { try await clusterStats(client)["connected"] == .bool(true) })
        await client.close()
        server.shutdown()
        await server.waitUntilStopped()
    }
}
