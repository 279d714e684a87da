import Testing
import SwitchboardCodec
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// Sessions in a cluster (protocol/resumption.md, "Loops and nodes"): a session lives on the node that
/// made it; a token of another live node is refused `other_node`, one of a process no node hears from
/// `restarted`.
@Suite("Sessions in a cluster", .serialized, .needsNATSServer)
struct SessionClusterTests {
    static let loopCounts = Array(Set([1, 4, ServerConfiguration.testLoops])).sorted()

    /// The reason a resuming HELLO with `token`, on a new connection to `port`, is refused for.
    static func refusal(of token: String, port: Int) async throws -> String? {
        let connection = try RawConnection(port: port)
        try connection.send(Frame(.hello, id: 1, payload: Array(#"{"session":{"token":"\#(token)","position":0}}"#.utf8)))
        let answer = try await connection.frame()
        return try JSONText.parse(answer.payload ?? [])["details"]?["reason"]?.stringValue
    }

    @Test(arguments: loopCounts)
    func tokenOfAnotherNodeIsOtherNodeWhileItLives(loops: Int) async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(2, loops: loops, nats: nats)
        let holder = try RawConnection(port: nodes.servers[0].port)
        try holder.send(Frame(.hello, id: 1, payload: Array(#"{"session":{}}"#.utf8)))
        let token = try #require(try JSONText.parse(try await holder.frame().payload ?? [])["session"]?["token"]?.stringValue)
        // Once node 2 has heard node 1's beacon (four a second).
        #expect(try await eventually { try await Self.refusal(of: token, port: nodes.servers[1].port) == "other_node" })
        let stranger = SessionToken(process: UInt64.random(in: 1..<(1 << 60)), loop: 0, number: 1).text
        #expect(try await Self.refusal(of: stranger, port: nodes.servers[1].port) == "restarted")
        nodes.servers[0].shutdown()
        await nodes.servers[0].waitUntilStopped()
        // Once node 2 has given node 1 up (no beacon for a lease).
        #expect(try await eventually { try await Self.refusal(of: token, port: nodes.servers[1].port) == "restarted" })
        await nodes.stop()
    }
}
