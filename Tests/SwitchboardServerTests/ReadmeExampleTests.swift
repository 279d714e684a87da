import Testing
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// The README's server example, kept compiling and working.
@Suite struct ReadmeExample {
    /// The README's code, with the port made ephemeral and `run` replaced by `start`.
    func makeServer() throws -> Server {
        var configuration = ServerConfiguration()
        configuration.port = 0
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
