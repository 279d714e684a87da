import Testing
import SwitchboardClient
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport

extension ClusterInputTests {
    @Test("beacons whose counts are at Int's edges (held channels, listeners) are dropped: stats still answer and the counts stand")
    func beaconCountsAtIntEdges() async throws {
        let nats = try NATSServerProcess()
        let (nodes, producer, holder) = try await feedOnOneNode(nats)
        // A node of our own making: it reads the holder node's beacon (for its instance), then listens once.
        let fake = try #require(RawSocket(port: nats.port))
        fake.send("CONNECT {\"verbose\":false,\"headers\":true,\"no_responders\":true}\r\nSUB switchboard.beacon 1\r\nSUB switchboard.answers.fa4e 2\r\n")
        var heard = ""
        func beaconLine() -> Substring? {  // the first line of a beacon's payload: "<instance> <held> <name>"
            let lines = heard.split(separator: "\r\n", omittingEmptySubsequences: false)
            // HMSG: the header block (its process mark, Sb-Process) ends with an empty line before the payload.
            guard let msg = lines.firstIndex(where: { $0.hasPrefix("HMSG switchboard.beacon 1 ") }),
                  let end = lines[msg...].firstIndex(of: ""), end + 2 < lines.count else { return nil }
            return lines[end + 1]
        }
        while beaconLine() == nil {
            let more = fake.read()
            try #require(!more.isEmpty, "no beacon from the holder's node")
            heard += String(decoding: more, as: UTF8.self)
        }
        let instance = try #require(beaconLine()?.split(separator: " ").first.map(String.init))
        let digest = Digest.sha256Hex(Array("feed".utf8))
        let headers = Array("NATS/1.0\r\nSb-Caller: fa4e\r\n\r\n".utf8)
        let call = Array(#"{"method":"listen","args":"hold"}"#.utf8)
        var id: UInt8 = 0
        _ = try await eventually(5, every: .milliseconds(200)) {  // until the holder's subscription is in place
            guard producer.listens.withLock({ $0 }) == 0 else { return true }
            id += 1
            let batch = [0, 0, 0, 0, 0, 0, 0, id, UInt8(ascii: "c"), 0, 0, 0, 0, UInt8(call.count)] + call
            fake.send(Array("HPUB switchboard.call.\(digest) switchboard.reply.fa4e.\(id) \(headers.count) \(headers.count + batch.count)\r\n".utf8)
                      + headers + batch + [13, 10])
            return false
        }
        #expect(producer.listens.withLock { $0 } == 1)

        let beacons = [
            "fa4e 0 fake\nL \(instance) \(digest) -9223372036854775808\nL\n",  // fewer listeners than counted, by Int.min
            "fa4f 9223372036854775807 other\nL\n", "fa50 9223372036854775807 another\nL\n",  // held channels that add up past Int.max
        ]
        for _ in 0..<3 {
            for beacon in beacons { fake.send("PUB switchboard.beacon \(beacon.utf8.count)\r\n\(beacon)\r\n") }
            try await Task.sleep(for: .milliseconds(250))  // real time: beacons a node hears over nats-server, spaced as a node spaces them
        }
        let stats = try await clusterStats(holder)
        #expect(stats["remoteHolders"] == 0 && producer.cancels.withLock { $0 } == 0, "\(stats)")
        await holder.close()
        await nodes.stop()
    }
}
