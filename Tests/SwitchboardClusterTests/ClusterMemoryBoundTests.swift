import Testing
import SwitchboardCodec
@testable import SwitchboardCluster
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport
import SwitchboardWire

/// What one client can make a cluster node's links keep in memory: the subjects of the names it
/// routes to the bus, and the tables of the channels it holds.
@Suite struct ClusterMemoryBoundTests {
    private func stats(_ wire: RawConnection, id: UInt32) async throws -> ChannelValue {
        try await call(wire, id, "switchboard/stats", "get").get()
    }

    /// Runs `part` on each loop of `server`.
    private func gather<Part: Sendable>(_ server: Server, _ part: @escaping @Sendable (ServerCore) -> Part) async -> [Part?] {
        await withCheckedContinuation { (done: CheckedContinuation<[Part?], Never>) in
            server.group.gather(from: 0, part) { done.resume(returning: $0) }
        }
    }

    @Test("the subjects the cluster link caches stay bounded however many names are routed to the bus")
    func clusterSubjectsAreBounded() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(1, loops: 4, nats: nats)
        let server = nodes.servers[0]
        let wire = try RawConnection(port: server.port)
        let name = String(repeating: "n", count: 4_000)
        var batch: [UInt8] = []
        for n in 0..<2_000 {
            batch += Frame(.message, id: 0, channel: "\(n)/\(name)", payload: [7, 1, 0x61, 0]).bytes
            if batch.count > 1 << 20 { try wire.send(batch); batch = [] }
        }
        try wire.send(batch)
        _ = try await wire.barrier()
        let cached = await gather(server) { $0.cluster?.cachedSubjectBytes ?? 0 }.map { $0 ?? 0 }
        #expect(cached.allSatisfy { $0 <= ClusterLink.subjectCacheBytes }, "\(cached)")
        #expect(cached.reduce(0, +) > 0)
        await nodes.stop()
    }

    @Test("the cluster link's tables of held channels give their room back once a flood of channels is let go, and it caches none of their names")
    func heldTablesShrinkAfterMassRelease() async throws {
        let perHolder = 5_000
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(1, loops: 2, nats: nats, configure: { $0.maxRegistrationsPerConnection = perHolder })
        let server = nodes.servers[0]
        let room: @Sendable (ServerCore) -> [Int] = { core in
            [core.cluster?.held.capacity ?? 0, core.cluster?.heldByDigest.capacity ?? 0, core.cluster?.cachedSubjectBytes ?? 0]
        }
        let holders = try (0..<2).map { _ in try RawConnection(port: server.port) }  // connections are dealt round the loops
        for (h, holder) in holders.enumerated() {
            var batch: [UInt8] = []
            for n in 0..<perHolder { batch += Frame(.register, id: 0, channel: "flood/\(h)/\(n)", payload: nil).bytes }
            try holder.send(batch)
            _ = try await holder.barrier()
        }
        let wire = try RawConnection(port: server.port)
        #expect(try await stats(wire, id: 1)["registrations"]?.intValue == 2 * perHolder)
        let full = await gather(server, room).map { $0 ?? [] }
        #expect(full.allSatisfy { $0.allSatisfy { $0 >= perHolder } }, "\(full)")

        for holder in holders { holder.reset() }
        var id: UInt32 = 2
        while try await stats(wire, id: id)["registrations"]?.intValue != 0 { id += 1 }
        let left = await gather(server, room).map { $0 ?? [] }
        #expect(left.allSatisfy { $0.dropLast().allSatisfy { $0 <= shrinkableRoom } }, "room left after every channel went: \(left), full: \(full)")
        #expect(left.allSatisfy { $0.last == 0 }, "names of channels let go still cached: \(left)")
        await nodes.stop()
    }
}
