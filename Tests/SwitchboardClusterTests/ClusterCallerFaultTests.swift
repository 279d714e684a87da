import Foundation
import Synchronization
import Testing
import SwitchboardClient
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// A holder of `slow` whose "wait" calls sleep until cancelled (counted) and whose "probe" answers at once.
final class SlowHolder: Sendable {
    let client: Client
    private let counts = Counts()
    private final class Counts: Sendable {
        let started = Mutex(0), cancelled = Mutex(0)
    }
    var started: Int { counts.started.withLock { $0 } }
    var cancelled: Int { counts.cancelled.withLock { $0 } }

    init(_ server: Server) async throws {
        client = try await connect(server)
        let counts = self.counts
        try await SwitchboardClient.MethodChannel(name: "slow", client: client).setMethodCallHandler { call in
            guard call.method == "wait" else { return "probed" }
            counts.started.withLock { $0 += 1 }
            do {
                try await Task.sleep(for: .seconds(120))
            } catch {
                counts.cancelled.withLock { $0 += 1 }
                throw error
            }
            return "late"
        }
    }

    /// A raw connection to `server`, once calls from there reach this holder.
    func reachedFrom(_ server: Server) async throws -> RawConnection {
        let raw = try RawConnection(port: server.port)
        #expect(try await eventually {
            try raw.send(.call(1, "slow", "probe"))
            return try await raw.nextNonPing().payload != nil
        })
        return raw
    }
}

/// The `cluster` stats of a node, through a raw connection to it.
func clusterStats(_ connection: RawConnection) async throws -> ChannelValue {
    try connection.send(.call(0x5747, "switchboard/stats", "get"))
    while true {
        let frame = try await connection.nextNonPing()
        if frame.id == 0x5747 { return try frame.envelope().get()["cluster"] ?? .null }
    }
}

@Suite("Callers' faults across nodes", .serialized, .needsNATSServer)
struct ClusterCallerFaultTests {
    @Test("a caller on node 2 resets its connection: the holder on node 1 hears a cancel for each open call, and callsPending and callsServing go back to 0 (one loop per node, and two)",
          arguments: [1, 2])
    func callerReset(loops: Int) async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(2, loops: loops, nats: nats)
        let holder = try await SlowHolder(nodes.servers[0])
        let caller = try await holder.reachedFrom(nodes.servers[1])
        for id in 2...6 { try caller.send(.call(UInt32(id), "slow", "wait")) }
        #expect(try await eventually { holder.started == 5 })
        caller.reset()
        // Bound: every call cancelled at its holder within 10 s of the reset (at once, in fact), once.
        #expect(try await eventually { holder.cancelled == 5 })
        let watchers = try nodes.servers.map { try RawConnection(port: $0.port) }
        var stats: [ChannelValue] = []
        #expect(try await eventually {
            stats = try await watchers.asyncMap { try await clusterStats($0) }
            return stats[0]["callsServing"] == 0 && stats[1]["callsPending"] == 0
        }, "\(stats)")
        #expect(holder.cancelled == 5)
        await holder.client.close()
        await nodes.stop()
    }
}

extension Array {
    func asyncMap<T>(_ transform: (Element) async throws -> T) async rethrows -> [T] {
        var results: [T] = []
        for element in self { results.append(try await transform(element)) }
        return results
    }
}
