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
