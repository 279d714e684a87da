import Testing
import SwitchboardServer
import SwitchboardTransport

@Suite struct ServerConfigurationByName {
    /// Every setting can be given to the initializer by name. A stored setting added without a parameter
    /// fails here: it would keep its default.
    @Test func everySettingCanBeGivenByName() throws {
        let given = ServerConfiguration(
            host: "::1", port: 1, maxFrame: 2, outboundLimit: 3, slowConsumerGraceMs: 4, heartbeatMs: 5, token: "t",
            drainTimeoutMs: 6, eventQueueLimit: 7, maxRegistrationsPerConnection: 8, maxOpenRequests: 9,
            tls: TLSSettings(context: try TLSContext.client(), port: 10), httpEndpoints: false, webSocketOrigins: ["*"],
            metrics: .prometheus(channelLimit: 11), cluster: ClusterSettings(servers: [], node: "n"), loops: 12,
            firstFrameTimeoutMs: 13, frameTimeoutMs: 14, maxConnections: 15, maxConnectionsPerAddress: 16, capsLoopback: true,
            sessionTTLMs: 17, sessionBytes: 18, maxParkedSessions: 19)
        let defaults = Mirror(reflecting: ServerConfiguration()).children.map { "\($0.value)" }
        for (index, setting) in Mirror(reflecting: given).children.enumerated() {
            #expect("\(setting.value)" != defaults[index], "\(setting.label ?? "?") cannot be given by name")
        }
    }

    /// What is not given keeps the default of ``ServerConfiguration/init()``.
    @Test func theRestKeepTheirDefaults() {
        let given = ServerConfiguration(port: 0, loops: 4)
        var expected = ServerConfiguration()
        expected.port = 0
        expected.loops = 4
        #expect("\(given)" == "\(expected)")
    }
}
