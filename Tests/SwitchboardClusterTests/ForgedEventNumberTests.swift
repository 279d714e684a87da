import Testing
import SwitchboardClient
import SwitchboardCluster
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
        #expect(try await eventually(every: .milliseconds(50)) {  // until the node's subscription has reached nats-server
            if member.events.contains(.int(7)) { return true }
            bus.send(try event(7, numbered: "f00d 1"))
            return false
        })
        bus.send(try event(8, numbered: "f00d \(UInt64.max)"))
        #expect(try await eventually { member.events.last == .int(8) })
        let stats = try await member.cluster()
        #expect(stats["eventsMissed"] == 0, "one forged message: \(stats["eventsMissed"] ?? .null) events missed")
        await member.client.close()
        await nodes.stop()
    }

    /// A node that stalled past the lease takes every other node for gone and forgets their listeners
    /// of its holders' channels, while those nodes may have kept their streams, or even listened again
    /// just before. Their beacons still report the listeners: the holder's node counts them again, so
    /// that their streams do not wait for events that never come (the chaos run's held feed, stuck for
    /// 37 s after its holder's node was stopped).
    @Test("a node whose beacons report listeners on a channel held here that this node does not count gets the holder's events again")
    func reportedListenersAreCountedAgain() async throws {
        let nats = try NATSServerProcess()
        let (nodes, producer, holder) = try await feedOnOneNode(nats)
        let local = try RawConnection(port: nodes.servers[0].port)  // the holder's stream goes on for it
        try local.send(.call(1, "feed", "listen"))
        #expect(try await local.nextNonPing().kind == .reply)
        let harness = try BusHarness()
        let other = try harness.bus("other", servers: [NATSBus.Server(host: "127.0.0.1", port: nats.port)])
        var holderInstance: String?, received = 0
        _ = try other.subscribe("switchboard.beacon", queue: nil) { message in
            holderInstance = holderInstance ?? String(decoding: message.payload, as: UTF8.self).split(separator: " ").first.map(String.init)
        }
        let digest = Digest.sha256Hex(Array("feed".utf8))
        _ = try other.subscribe("switchboard.event.\(digest)", queue: nil) { _ in received += 1 }
        #expect(harness.run { holderInstance != nil })
        producer.send(1)
        harness.run(forMs: 200)
        #expect(received == 0, "no other node counted as listening: nothing goes to the bus")
        for _ in 0..<3 {  // the other node's beacons: one listener on feed, through the holder's node
            try other.publish("switchboard.beacon", headers: [], payload: Array("abc123 0 other\nL \(holderInstance ?? "") \(digest) 1\nL\n".utf8))
            harness.run(forMs: 250)
        }
        producer.send(2)
        #expect(harness.run { received >= 1 }, "before, the holder's node never sent that node another event")
        await holder.close()
        await nodes.stop()
    }
}
