import Logging
import SwitchboardCodec
import SwitchboardDemo
import SwitchboardServer

/// Runs `body` against a live server on an ephemeral port, then shuts it down and waits for it.
package func withServer(
    _ configure: (inout ServerConfiguration) -> Void = { _ in },
    setUp: (Server) -> Void = { _ in },
    _ body: (Server, Int) async throws -> Void
) async throws {
    var config = ServerConfiguration.forTests()
    configure(&config)
    var logger = Logger(label: "test")
    logger.logLevel = .warning
    let server = try Server(configuration: config, logger: logger)
    server.installDemoChannels()
    server.installIntrospectionChannels()
    setUp(server)
    let port = try server.start()
    do {
        try await body(server, port)
    } catch {
        server.shutdown()
        await server.waitUntilStopped()
        throw error
    }
    server.shutdown()
    await server.waitUntilStopped()
}

/// A method call's result on `wire`, whose answer is read past any other frame.
package func call(_ wire: RawConnection, _ id: UInt32, _ channel: String, _ method: String,
          _ arguments: ChannelValue = .null) async throws -> Result<ChannelValue, ChannelError> {
    try wire.send(.call(id, channel, method, arguments))
    while true {
        let frame = try await wire.frame()
        if frame.id == id { return try frame.envelope() }
    }
}
