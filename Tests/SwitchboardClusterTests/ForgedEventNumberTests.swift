import Testing
import SwitchboardClient
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport
import SwitchboardWire

extension ClusterInputTests {
    /// A peer on the bus that is no node (it never sent a beacon) numbers its events `Sb-Seq: f00d 1`,
    /// then `f00d 18446744073709551615`. Each message with a new made-up sender adds an entry to the
    /// listening node's table of numbers, and each jump adds 2^32 to `eventsMissed`: 2^31 such messages
    /// make the counter (or the loops' sum in stats, sooner) trap. A sender the node does not know as a
    /// node of the cluster is not counted, nor kept.
    @Test("Sb-Seq numbers from a sender that is no node of the cluster count no missed events")
    func forgedEventNumbers() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(1, nats: nats)
        let member = try await RoomMember(nodes.servers[0])
        member.listen()
        #expect(try await eventually { try await member.cluster()["channelsListened"] == 1 })
        let subject = "switchboard.event." + Digest.sha256Hex(Array("switchboard/room".utf8))
        func event(_ value: Int, numbered seq: String) throws -> [UInt8] {
            var frame: [UInt8] = []
            Frame(.message, id: 0, channel: "switchboard/room", payload: try StandardMethodCodec().encodeSuccessEnvelope(.int(value))).write(to: &frame)
            let headers = Array("NATS/1.0\r\nSb-Seq: \(seq)\r\n\r\n".utf8)
            return Array("HPUB \(subject) \(headers.count) \(headers.count + frame.count)\r\n".utf8) + headers + frame + [13, 10]
        }
        let bus = try #require(RawSocket(port: nats.port))
        bus.send("CONNECT {\"verbose\":false,\"headers\":true}\r\n")
        #expect(try await eventually {  // until the node's subscription has reached nats-server
            bus.send(try event(7, numbered: "f00d 1"))
            try await Task.sleep(for: .milliseconds(50))
            return member.events.contains(.int(7))
        })
        bus.send(try event(8, numbered: "f00d \(UInt64.max)"))
        #expect(try await eventually { member.events.last == .int(8) })
        let stats = try await member.cluster()
        #expect(stats["eventsMissed"] == 0, "one forged message: \(stats["eventsMissed"] ?? .null) events missed")
        await member.client.close()
        await nodes.stop()
    }
}
