import Testing
import SwitchboardCodec
import SwitchboardPlugins
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport
import SwitchboardWire

/// What one client can make the server keep in memory, past the frame and outbound limits: open
/// requests, credit before a listen, and the cluster's subjects of the names it routes.
@Suite struct MemoryBoundTests {
    private func stats(_ wire: RawConnection, id: UInt32) async throws -> ChannelValue {
        try wire.send(.call(id, "switchboard/stats", "get"))
        while true {
            let frame = try await wire.frame()
            if frame.id == id, frame.kind == .reply { return try frame.envelope().get() }
        }
    }

    @Test("credit before listen is kept for names adding up to 64 KiB; past it a DEMAND is ignored and counted")
    func pendingCreditIsBoundedInBytes() async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            let filler = String(repeating: "f", count: 65_530)
            try wire.send(Frame(.demand, channel: filler, payload: [0, 0, 0, 1]))       // kept: 65,530 bytes of names
            try wire.send(Frame(.demand, channel: filler, payload: [0, 0, 0, 1]))       // the same name: no more bytes
            try wire.send(Frame(.demand, channel: "switchboard/ticker", payload: [0, 0, 0, 1]))  // past 64 KiB: ignored
            try wire.send(.call(1, "switchboard/ticker", "listen", .stringMap(["count": 3, "intervalMs": 0])))
            var events = 0
            while events < 4 {  // three events and the end, as without a DEMAND
                let frame = try await wire.frame()
                if frame.kind == .message, frame.channel == "switchboard/ticker" { events += 1 }
            }
            let text = try RawConnection(port: port)
            try text.send(line: #"{"id":1,"demand":"\#(String(repeating: "t", count: 70_000))","n":5}"#)
            #expect(try await text.line()["result"] == .null)
            let counts = try await stats(wire, id: 2)
            #expect(counts["demandsIgnored"]?.intValue == 2)
        }
    }

    @Test("the subjects the cluster link caches stay bounded however many names are routed to the bus")
    func clusterSubjectsAreBounded() async throws {
        var config = ServerConfiguration.forTests()
        config.loops = 4
        try await withServer({ $0 = config }) { server, port in
            let wire = try RawConnection(port: port)
            let name = String(repeating: "n", count: 4_000)
            var batch: [UInt8] = []
            for n in 0..<2_000 {
                batch += Frame(.message, id: 0, channel: "\(n)/\(name)", payload: [7, 1, 0x61, 0]).bytes
                if batch.count > 1 << 20 { try wire.send(batch); batch = [] }
            }
            try wire.send(batch)
            _ = try await wire.barrier()
            let cached = await withCheckedContinuation { (done: CheckedContinuation<[Int], Never>) in
                server.group.gather(from: 0, { $0.cluster?.cachedSubjectBytes ?? 0 }) { done.resume(returning: $0.map { $0 ?? 0 }) }
            }
            #expect(cached.allSatisfy { $0 <= ClusterLink.subjectCacheBytes }, "\(cached)")
            #expect(cached.reduce(0, +) > 0)
        }
    }
}
