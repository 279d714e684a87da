import Foundation
import Testing
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// The README's server example, kept compiling and working.
@Suite struct ReadmeExample {
    /// The README's code, with the port made ephemeral and `run` replaced by `start`.
    func makeServer() throws -> Server {
        let configuration = ServerConfiguration.forTests()
        // README begins
        let server = try Server(configuration: configuration)

        MethodChannel(name: "math", server: server).setMethodCallHandler { call in
            guard call.method == "square", let n = call.arguments.intValue else { throw MethodNotImplemented() }
            return .int(n * n)
        }

        let temperature = EventChannel(name: "sensors/temperature", server: server)
        temperature.setStreamHandler(StreamHandlerClosures(onListen: { _, sink in
            sink.success(21.5)  // the current value first; broadcasts follow
            return nil
        }))
        Task {
            for reading in stride(from: 22.0, through: 25.0, by: 0.5) {
                try await Task.sleep(for: .milliseconds(100))
                temperature.broadcast(.float64(reading))  // encoded once for every listener
            }
        }
        // README ends
        return server
    }

    @Test func exampleServes() async throws {
        let server = try makeServer()
        let port = try server.start()
        let wire = try RawConnection(port: port)
        try wire.send(.call(1, "math", "square", 12))
        #expect(try await wire.frame().envelope() == .success(144))
        try wire.send(.call(2, "math", "cube", 3))
        #expect(try await wire.frame().payload == nil)
        try wire.send(.call(3, "sensors/temperature", "listen"))
        #expect(try await wire.frame().id == 3)
        #expect(try await wire.frame().envelope() == .success(21.5))
        // The broadcasts started with the server: which reading comes first depends on timing.
        guard case .float64(let reading) = try await wire.frame().envelope().get() else { throw TestFailure("expected a reading") }
        #expect((22.0...25.0).contains(reading))
        server.shutdown()
        await server.waitUntilStopped()
    }

    /// The README's "Testing" snippet, as written there.
    @Test func embeddedServerExample() throws {
        let embedded = try EmbeddedServer()          // the demo channels, served over in-memory transports
        let peer = embedded.connect()
        peer.send(try .call(1, "switchboard/echo", "echo", "hi"))
        embedded.run()
        let reply = try peer.frames()[0]             // REPLY id 1, a success envelope holding "hi"
        peer.peerWindow = 0                          // a peer that stops reading: the server holds back
        #expect(reply.kind == .reply && reply.id == 1)
        #expect(try reply.envelope() == .success("hi"))
    }
}

// README plugin begins
/// Orders are read-only today, and only the `support` user sees customers' e-mail addresses.
struct ReadOnlyOrders: Plugin {
    let name = "read-only-orders"
    var inbound: [any InboundProcessor] { [RefuseWrites()] }
    var outbound: [any OutboundProcessor] { [HideEmails()] }

    struct RefuseWrites: InboundProcessor {
        var scope: Scope<InboundKind> { Scope(channels: [ChannelPattern("orders/*")], kinds: [.call]) }
        func process(_ request: inout InboundRequest) throws -> InboundDecision {
            if request.method?.hasPrefix("get") == true { return .next }
            return .reject(Rejection(code: "read_only", message: "orders are read-only today"))
        }
    }

    struct HideEmails: OutboundProcessor {
        var scope: Scope<OutboundKind> { Scope(channels: [ChannelPattern("customers/*")], kinds: [.reply, .event]) }
        func applies(to connection: ConnectionContext, channel: String) -> Bool { connection.identity != "support" }
        func process(_ message: inout OutboundMessage) throws -> OutboundDecision {
            if case .value(.map(let fields)) = message.content {
                message.content = .value(.map(fields.filter { $0.key != "email" }))
            }
            return .pass
        }
    }
}
// README plugin ends

/// Identifies a client as `support` when its token says so (the README's plugin reads identities).
struct TokenIsIdentity: Plugin {
    let name = "token-is-identity"
    func authenticate(_ hello: Hello, connection: ConnectionContext) -> Authentication { hello.token.map { .identity($0) } ?? .pass }
}

@Suite struct ReadmePluginExample {
    /// The README's plugin source, compared with the copy above.
    @Test func readmeShowsThisPlugin() throws {
        let readme = try String(contentsOfFile: #filePath.replacingOccurrences(of: "Tests/SwitchboardServerTests/ReadmeExampleTests.swift", with: "README.md"), encoding: .utf8)
        let source = try String(contentsOfFile: #filePath, encoding: .utf8)
        let plugin = source.components(separatedBy: "// README plugin begins\n")[1].components(separatedBy: "// README plugin ends")[0]
        #expect(readme.contains("import SwitchboardServer\n\n" + plugin))
    }

    @Test func refusesWritesAndHidesEmails() throws {
        let embedded = try EmbeddedServer(plugins: [TokenIsIdentity(), ReadOnlyOrders()])
        MethodChannel(name: "orders/main", server: embedded.server).setMethodCallHandler { call, result in result.success(.string(call.method)) }
        MethodChannel(name: "customers/main", server: embedded.server).setMethodCallHandler { _, result in
            result.success(.stringMap(["name": "Ada", "email": "ada@example.com"]))
        }
        embedded.run()
        let clerk = embedded.connect(), support = embedded.connect()
        support.send(Frame(.hello, id: 9, payload: Array(#"{"token":"support"}"#.utf8)))
        for peer in [clerk, support] {
            peer.send(try .call(1, "orders/main", "getOrder"))
            peer.send(try .call(2, "orders/main", "cancelOrder"))
            peer.send(try .call(3, "customers/main", "get"))
        }
        embedded.run()
        let clerkFrames = try clerk.frames(), supportFrames = try support.frames().filter { $0.id != 9 }
        #expect(try clerkFrames[0].envelope().get() == "getOrder")
        #expect(clerkFrames[1].errorCode == "read_only")
        #expect(try clerkFrames[2].envelope().get() == .stringMap(["name": "Ada"]))
        #expect(supportFrames[1].errorCode == "read_only")
        #expect(try supportFrames[2].envelope().get() == .stringMap(["name": "Ada", "email": "ada@example.com"]))
    }
}
