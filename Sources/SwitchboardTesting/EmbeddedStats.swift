import SwitchboardCodec
import SwitchboardWire

extension InMemoryTransport {
    /// The `switchboard/stats` map, asked on this connection with `id`.
    package func stats(on server: EmbeddedServer, id: UInt32 = 0x5747) throws -> ChannelValue {
        send(try .call(id, "switchboard/stats", "get"))
        server.run()
        guard let reply = try frames().last(where: { $0.id == id }) else { throw TestFailure("no stats reply") }
        return try reply.envelope().get()
    }
}
