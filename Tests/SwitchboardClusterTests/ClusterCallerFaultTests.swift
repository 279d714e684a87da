import Foundation
import Synchronization
import Testing
import SwitchboardClient
import SwitchboardCluster
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport
import SwitchboardWire

/// A holder of `slow` whose "wait" calls wait until cancelled (counted) and whose "probe" answers at
/// once (counted).
final class SlowHolder: Sendable {
    let client: Client
    private let counts = Counts()
    private final class Counts: Sendable {
        let started = Mutex(0), cancelled = Mutex(0), probes = Mutex(0)
    }
    var started: Int { counts.started.withLock { $0 } }
    var cancelled: Int { counts.cancelled.withLock { $0 } }
    var probes: Int { counts.probes.withLock { $0 } }

    convenience init(_ server: Server) async throws { try await self.init(port: server.port) }

    init(port: Int) async throws {
        var config = ClientConfiguration(port: port)
        config.reconnect = nil
        config.requestTimeout = .seconds(10)
        client = try await Client.connect(config)
        let counts = self.counts
        try await SwitchboardClient.MethodChannel(name: "slow", client: client).setMethodCallHandler { call in
            guard call.method == "wait" else {
                counts.probes.withLock { $0 += 1 }
                return "probed"
            }
            counts.started.withLock { $0 += 1 }
            await untilCancelled()
            counts.cancelled.withLock { $0 += 1 }
            throw CancellationError()
        }
    }

    /// A raw connection to `server`, once calls from there reach this holder.
    func reachedFrom(_ server: Server) async throws -> RawConnection { try await reachedFrom(port: server.port) }
    func reachedFrom(_ node: NodeProcess) async throws -> RawConnection { try await reachedFrom(port: node.port) }

    private func reachedFrom(port: Int) async throws -> RawConnection {
        let raw = try RawConnection(port: port)
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

extension ClusterCallerFaultTests {
    @Test("kill -9 of the caller's node mid-call: the holder hears a cancel for each of its open calls once the node is gone, and callsServing goes back to 0")
    func killedCallerNode() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(1, nats: nats)
        let holder = try await SlowHolder(nodes.servers[0])
        let callerNode = try NodeProcess(nats: nats, node: "doomed")
        let caller = try await holder.reachedFrom(callerNode)
        for id in 2...6 { try caller.send(.call(UInt32(id), "slow", "wait")) }
        #expect(try await eventually { holder.started == 5 })
        callerNode.signal(SIGKILL)
        let killedAt = ContinuousClock.now
        #expect(try await eventually { holder.cancelled == 5 })
        // Bound: the caller's node is gone after a lease (1.5 s) and a beacon tick; 5 s on a loaded machine.
        #expect(ContinuousClock.now - killedAt < .seconds(5))
        #expect(try await eventually { try await clusterStats(holder.client)["callsServing"] == 0 })
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

extension ClusterCallerFaultTests {
    @Test("the caller's node is stopped (SIGSTOP) past the lease while its 50 calls are answered: once resumed, every call gets the holder's answer, once (one loop, and two)",
          arguments: [1, 2])
    func stalledCallerNode(loops: Int) async throws {
        let cluster = try await JobsCluster(nodes: 1)
        let callerNode = try NodeProcess(nats: cluster.nats, node: "stalled", loops: loops)
        var callers: [RawConnection] = []
        for _ in 0..<5 {  // dealt round the node's loops
            let caller = try RawConnection(port: callerNode.port, receiveTimeout: 15)
            #expect(try await reachesJobs(caller))
            for id in 2...11 { try caller.send(.call(UInt32(id), "jobs/resize", "wait")) }
            callers.append(caller)
        }
        #expect(try await eventually { cluster.parked.count == 50 })
        callerNode.signal(SIGSTOP)
        cluster.parked.releaseAll()
        #expect(try await eventually { try await clusterStats(cluster.holder)["callsServing"] == 0 }, "the 50 answers went out")
        // The holder's node takes the stopped node for gone: it has been stopped for longer than the lease.
        #expect(try await eventually { try await clusterStats(cluster.holder)["nodesLost"]?.intValue ?? 0 >= 1 })
        try await Task.sleep(for: .milliseconds(500))  // real time: the caller's node stays stopped (SIGSTOP) past its lease
        callerNode.signal(SIGCONT)
        let resumedAt = ContinuousClock.now
        // Bound: each call's one answer, the holder's, within 15 s of SIGCONT (the callers' read time-out).
        for caller in callers {
            var answered: [UInt32: ChannelValue] = [:]
            while answered.count < 10 {
                let frame = try await caller.nextNonPing()
                #expect(answered[frame.id] == nil, "one answer per call")
                answered[frame.id] = (try? frame.envelope().get()) ?? .string(frame.errorCode ?? "\(frame)")
            }
            #expect(answered == Dictionary(uniqueKeysWithValues: (2...11).map { (UInt32($0), ChannelValue.string("waited")) }))
            #expect(try await caller.barrier().isEmpty, "no second answer")
        }
        #expect(ContinuousClock.now - resumedAt < .seconds(15))
        await cluster.stop()
    }
}

@Suite("Hung NATS servers", .serialized, .needsNATSServer)
struct HungNATSServerTests {
    @Test("--cluster S1,S2 with S1 stopped (it accepts, never answers): the node connects to S2 within the 2 s connect timeout, and counts the failed attempt")
    func hungFirstServer() async throws {
        let hung = try NATSServerProcess(), fine = try NATSServerProcess()
        hung.signal(SIGSTOP)
        let startedAt = ContinuousClock.now
        let node = try NodeProcess(nats: nil, node: "failover", cluster: "nats://127.0.0.1:\(hung.port),nats://127.0.0.1:\(fine.port)")
        let elapsed = ContinuousClock.now - startedAt
        // Bound: the connect timeout (2 s by default), a 50 ms backoff and a process start, on a loaded machine.
        #expect(elapsed < .seconds(8), "connected after \(elapsed)")
        let stats = try await clusterStats(try RawConnection(port: node.port))
        #expect(stats["connected"] == true && stats["busConnectFailures"]?.intValue ?? 0 >= 1, "\(stats)")
        #expect(node.log.contains("warning"), "a failed attempt is a warning: \(node.log)")
    }

    @Test("a node whose only server hangs retries, counting each failed attempt, warns once, and connects once the server resumes")
    func onlyServerHangs() async throws {
        let hung = try NATSServerProcess()
        hung.signal(SIGSTOP)
        let node = try NodeProcess(nats: hung, node: "patient", options: ["--cluster-connect-timeout", "300"], waitForBus: false)
        let stats = try RawConnection(port: node.port)
        var cluster: ChannelValue = .null
        #expect(try await eventually(20) {
            cluster = try await clusterStats(stats)
            return cluster["busConnectFailures"]?.intValue ?? 0 >= 3
        }, "\(cluster)")
        #expect(cluster["connected"] == false)
        let warnings = node.log.split(separator: "\n").filter { $0.contains("warning") && $0.contains("cannot connect") }
        #expect(warnings.count == 1, "once per state change, not once per retry: \(node.log)")
        hung.signal(SIGCONT)
        // Bound: the backoff reaches 2 s at most, then one attempt.
        #expect(try await eventually(10) { try await clusterStats(stats)["connected"] == true })
        #expect(node.log.contains("cluster bus connected"))
    }
}

@Suite("Cancel answers across nodes", .serialized, .needsNATSServer)
struct ClusterCancelFormTests {
    /// Node 1 (a process of its own, to be stopped) with a client holding the jobs channels, and node 2
    /// (in this process) with a raw caller that reaches them.
    private struct StoppableHolder {
        let nats: NATSServerProcess
        let holderNode: NodeProcess
        let callerNode: ClusterNodes
        let holder: Client
        let parked = Parked()

        init() async throws {
            nats = try NATSServerProcess()
            holderNode = try NodeProcess(nats: nats, node: "holder")
            var config = ClientConfiguration(port: holderNode.port)
            config.reconnect = nil
            holder = try await Client.connect(config)
            try await holdJobs(holder, parked: parked)
            callerNode = try ClusterNodes(1, nats: nats)
        }

        /// Waits until the caller's node has read beacons the holder's node sent after its holder got
        /// the calls: they name the calls it works on, and how a cancel of each is answered.
        func beaconsRead() async throws {
            let watcher = try RawConnection(port: callerNode.servers[0].port)
            let before = try await clusterStats(watcher)["busMessagesIn"]?.intValue ?? 0
            #expect(try await eventually { try await clusterStats(watcher)["busMessagesIn"]?.intValue ?? 0 >= before + 3 })
        }

        func stop() async {
            holderNode.signal(SIGCONT)
            parked.releaseAll()
            await holder.close()
            await callerNode.stop()
        }
    }

    @Test("a CANCEL whose holder's node is stopped gets, after the lease, the answer a live node gives: a REPLY with the method channel's error envelope")
    func cancelWithHolderNodeStopped() async throws {
        let cluster = try await StoppableHolder()
        let caller = try RawConnection(port: cluster.callerNode.servers[0].port, receiveTimeout: 10)
        #expect(try await reachesJobs(caller))
        // Through the live node: the holder's node answers the cancel.
        try caller.send(.call(2, "jobs/resize", "wait"))
        #expect(try await eventually { cluster.parked.count == 1 })
        try caller.send(Frame(.cancel, id: 2, payload: nil))
        let live = try await caller.nextNonPing()
        #expect(live.kind == .reply && live.id == 2, "\(live)")

        try caller.send(.call(3, "jobs/resize", "wait"))
        #expect(try await eventually { cluster.parked.count == 2 })
        try await cluster.beaconsRead()
        cluster.holderNode.signal(SIGSTOP)
        try caller.send(Frame(.cancel, id: 3, payload: nil))
        let cancelledAt = ContinuousClock.now
        let fallback = try await caller.nextNonPing()
        // Bound: the lease (1.5 s) after the CANCEL, and the next beacon tick: under 5 s on a loaded machine.
        #expect(ContinuousClock.now - cancelledAt < .seconds(5))
        #expect(fallback.kind == .reply && fallback.id == 3 && fallback.payload == live.payload, "\(fallback) vs \(live)")
        #expect(try await caller.barrier().isEmpty, "one answer")
        await cluster.stop()
    }

    /// The holder's answers tell the channel's kind (its codec), and the caller's node keeps it apart
    /// from its cache of subjects, which any client can empty by calling names nobody holds.
    @Test("a call no beacon named, cancelled while its holder's node is stopped, gets the method channel's error envelope all the same: the holder's earlier answers told the channel's codec (and the cache of subjects emptied meanwhile does not forget it)",
          arguments: [false, true])
    func cancelOfAnUnnamedCall(emptyingTheCache: Bool) async throws {
        let cluster = try await StoppableHolder()
        let caller = try RawConnection(port: cluster.callerNode.servers[0].port, receiveTimeout: 10)
        #expect(try await reachesJobs(caller))  // answered by the holder: its answer tells a method channel
        if emptyingTheCache {  // calls to 40 channels nobody holds, with 60,000-byte names (about 120 KB each against 2 MiB)
            var flood: [UInt8] = []
            for n in 0..<40 { flood += try Frame.call(UInt32(100 + n), String(repeating: "f", count: 60_000) + "\(n)", "x").bytes }
            try caller.send(flood)
            var answered = 0
            while answered < 40 { if try await caller.nextNonPing().id >= 100 { answered += 1 } }
        }
        // The holder's node is stopped before the call is sent, so no beacon ever names it.
        cluster.holderNode.signal(SIGSTOP)
        try caller.send(.call(2, "jobs/resize", "wait"))
        try caller.send(Frame(.cancel, id: 2, payload: nil))
        let answer = try await caller.nextNonPing()
        #expect(answer.kind == .reply && answer.id == 2, "\(answer)")
        guard case .failure(let error)? = try? StandardMethodCodec().decodeEnvelope(answer.payload ?? []) else {
            Issue.record("not an error envelope: \(answer)")
            return await cluster.stop()
        }
        #expect(error.code == "cancelled")
        #expect(try await caller.barrier().isEmpty, "one answer")
        await cluster.stop()
    }

    @Test("a remote caller that half-closes and outlives the drain timeout gets the cancel answer a caller on the holder's node gets")
    func drainTimeoutCancelOfRemoteCaller() async throws {
        let cluster = try await JobsCluster(nodes: 2)
        let local = try RawConnection(port: cluster.nodes.servers[0].port), remote = try await cluster.rawOnNode2()
        for connection in [local, remote] { try connection.send(.call(2, "jobs/resize", "wait")) }
        #expect(try await eventually { cluster.parked.count == 2 })
        for connection in [local, remote] { connection.finishSending() }
        // Bound: the drain timeout of the test nodes (300 ms) and a round trip, within the 5 s read time-out.
        let mine = try await local.nextNonPing(), theirs = try await remote.nextNonPing()
        #expect(mine.kind == .reply && theirs.bytes == mine.bytes, "\(mine) \(theirs)")
        await cluster.stop()
    }
}

@Suite("A stopped nats-server", .serialized, .needsNATSServer)
struct StoppedNATSServerTests {
    @Test("broadcasts published into a dead connection are counted as possibly lost, and the node notices the dead connection within 3 s by default")
    func broadcastsIntoADeadConnection() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(2, nats: nats)
        let members = try await [RoomMember(nodes.servers[0]), RoomMember(nodes.servers[1])]
        for member in members { #expect(try await eventually { try await member.cluster()["connected"] == true }) }
        members[1].listen()
        #expect(try await eventually { try await members[0].post(0); return !members[1].events.isEmpty })
        nats.signal(SIGSTOP)
        let stoppedAt = ContinuousClock.now
        for _ in 0..<50 { try await members[0].post(1) }
        #expect(try await eventually { try await members[0].cluster()["connected"] == false })
        // Bound: pings every second, two unanswered, and the next ping's tick: 3 s, 5 s on a loaded machine.
        let noticed = ContinuousClock.now - stoppedAt
        #expect(noticed < .seconds(5), "noticed after \(noticed)")
        let stats = try await members[0].cluster()
        #expect(stats["busPossiblyLost"]?.intValue ?? 0 >= 50, "the 50 posts (and beacons) since the last PONG: \(stats)")
        nats.signal(SIGCONT)
        for member in members { await member.client.close() }
        await nodes.stop()
    }
}

@Suite("Events the bus lost", .serialized, .needsNATSServer)
struct MissedEventsTests {
    /// A node with a listener on the room, and another node as the bus shows it: its beacons, and its
    /// events on the room's subject with the numbers the test gives them.
    private final class NumberedSender {
        let nats: NATSServerProcess
        let nodes: ClusterNodes
        let listener: RawConnection, watcher: RawConnection
        let harness: BusHarness
        let other: NATSBus
        private let subject = "switchboard.event." + Digest.sha256Hex(Array("switchboard/room".utf8))
        private var heard = 0

        init() async throws {
            let nats = try NATSServerProcess(), nodes = try ClusterNodes(1, nats: nats)
            let listener = try RawConnection(port: nodes.servers[0].port), watcher = try RawConnection(port: nodes.servers[0].port)
            try listener.send(.call(1, "switchboard/room", "listen"))
            #expect(try await listener.frame().kind == .reply)
            #expect(try await eventually { try await clusterStats(watcher)["channelsListened"] == 1 })
            let harness = try BusHarness()
            let other = try harness.bus("other", servers: [NATSBus.Server(host: "127.0.0.1", port: nats.port)])
            #expect(harness.run { other.isConnected })
            (self.nats, self.nodes, self.listener, self.watcher, self.harness, self.other) = (nats, nodes, listener, watcher, harness, other)
        }

        /// Its beacon: numbers count only from a node the listening node knows (the bus keeps one
        /// connection's order, so a beacon goes before the events after it).
        func beacon() throws { try other.publish("switchboard.beacon", headers: [], payload: Array("abc123 0 other\nL\n".utf8)) }

        func send(_ numbers: Int...) throws {
            for number in numbers {
                let event = Frame(.message, id: 0, channel: "switchboard/room",
                                  payload: try StandardMethodCodec().encodeSuccessEnvelope(.uint8List([UInt8(truncatingIfNeeded: number)])))
                try other.publish(subject, headers: [.init("Sb-Seq", "abc123 \(number)")], payload: event.bytes)
            }
            harness.run(forMs: 100)  // the harness's loop turns only when it is run: it writes them out here
        }

        /// Whether the listener has heard `count` events in all.
        func heard(_ count: Int) async throws -> Bool {
            try await eventually {
                heard += try await listener.barrier().filter { $0.channel == "switchboard/room" }.count
                return heard == count
            }
        }

        func eventsMissed() async throws -> ChannelValue? { try await clusterStats(watcher)["eventsMissed"] }
    }

    @Test("a listening node counts the gaps in another node's event numbers as eventsMissed; a smaller number is a new start and counts nothing")
    func gapsAreCounted() async throws {
        let bus = try await NumberedSender()
        try bus.beacon()
        try bus.send(1, 2, 5, 1)
        #expect(try await bus.heard(4))
        // Before: no such counter, and the two events the numbers say were lost went unseen.
        #expect(try await bus.eventsMissed() == 2)
        await bus.nodes.stop()
    }

    @Test("a sender that seemed gone for a while (a bus outage makes every node seem so) keeps its numbers: what was lost meanwhile is counted once it is back")
    func numbersOutliveASilence() async throws {
        let bus = try await NumberedSender()
        try bus.beacon()
        try bus.send(1)
        // No beacon for longer than the lease: the listening node takes it for gone.
        #expect(try await eventually { try await clusterStats(bus.watcher)["nodesLost"] == 1 })
        try bus.beacon()
        try bus.send(4)  // 2 and 3 were lost meanwhile
        #expect(try await bus.heard(2))
        // Before, its numbers went with it, and 4 was taken for a new start.
        #expect(try await bus.eventsMissed() == 2)
        await bus.nodes.stop()
    }

    @Test("an event its sender could not send (over max_payload) is counted there as unsent, and not again as missed where it did not arrive")
    func unsentIsNotMissed() async throws {
        let nats = try NATSServerProcess(configuration: "max_payload: 2048\n")
        let nodes = try ClusterNodes(2, nats: nats)
        let listener = try RawConnection(port: nodes.servers[1].port)
        let poster = try RawConnection(port: nodes.servers[0].port)
        try listener.send(.call(1, "switchboard/room", "listen"))
        #expect(try await listener.frame().kind == .reply)
        #expect(try await eventually {
            try poster.send(Frame(.message, id: 2, channel: "switchboard/room.post", payload: [0]))
            return try await listener.barrier().contains { $0.channel == "switchboard/room" }
        })
        let unsentBefore = try await clusterStats(poster)["eventsUnsent"]?.intValue ?? 0
        for (id, byte, size) in [(3, 2, 1), (4, 9, 4000), (5, 3, 1)] as [(UInt32, UInt8, Int)] {
            try poster.send(Frame(.message, id: id, channel: "switchboard/room.post", payload: Array(repeating: byte, count: size)))
        }
        let expected = try [2, 3].map { (byte: UInt8) in
            Frame(.message, id: 0, channel: "switchboard/room", payload: try StandardMethodCodec().encodeSuccessEnvelope(.uint8List([byte])))
        }
        var heard: [Frame] = []
        #expect(try await eventually {
            heard += try await listener.barrier().filter { expected.contains($0) }
            return heard == expected
        }, "\(heard)")
        let sent = try await clusterStats(poster)
        #expect(sent["eventsUnsent"]?.intValue == unsentBefore + 1, "\(sent)")
        #expect(try await clusterStats(listener)["eventsMissed"] == 0, "the unsent one was numbered")
        await nodes.stop()
    }

    @Test("a listening node that stalled past the lease (it forgets every node until its next beacon) takes the events it reads before that beacon for arrived, not missed")
    func numbersOutliveAStall() async throws {
        let nats = try NATSServerProcess()
        let node = try NodeProcess(nats: nats, node: "listener")
        let listener = try RawConnection(port: node.port)
        let watcher = try RawConnection(port: node.port)
        try listener.send(.call(1, "switchboard/room", "listen"))
        #expect(try await listener.frame().kind == .reply)
        #expect(try await eventually { try await clusterStats(watcher)["channelsListened"] == 1 })
        let harness = try BusHarness()
        let other = try harness.bus("other", servers: [NATSBus.Server(host: "127.0.0.1", port: nats.port)])
        #expect(harness.run { other.isConnected })
        let subject = "switchboard.event." + Digest.sha256Hex(Array("switchboard/room".utf8))
        let beacon = Array("abc123 0 other\nL\n".utf8)
        func event(_ number: Int) throws {
            let frame = Frame(.message, id: 0, channel: "switchboard/room",
                              payload: try StandardMethodCodec().encodeSuccessEnvelope(.uint8List([UInt8(number)])))
            try other.publish(subject, headers: [.init("Sb-Seq", "abc123 \(number)")], payload: frame.bytes)
        }
        try other.publish("switchboard.beacon", headers: [], payload: beacon)
        try event(1)
        #expect(harness.run { other.counters.messagesOut == 2 })
        harness.run(forMs: 100)
        #expect(try await eventually { try await clusterStats(watcher)["eventsIn"] == 1 })
        // The node stalls past the lease (1.5 s); once it has noticed, events 2 to 5 come before the
        // other node's next beacon, then 6.
        node.signal(SIGSTOP)
        harness.run(forMs: 2000)
        node.signal(SIGCONT)
        #expect(try await eventually { try await clusterStats(watcher)["stalls"] == 1 })
        for number in 2...5 { try event(number) }
        harness.run(forMs: 100)
        try other.publish("switchboard.beacon", headers: [], payload: beacon)
        try event(6)
        harness.run(forMs: 100)
        #expect(try await eventually { try await clusterStats(watcher)["eventsIn"] == 6 })
        let stats = try await clusterStats(watcher)
        #expect(stats["stalls"] == 1 && stats["eventsMissed"] == 0, "\(stats)")
        node.signal(SIGKILL)
    }
}

@Suite("A stopped member of a queue group", .serialized, .needsNATSServer)
struct StoppedQueueMemberTests {
    @Test("calls a stopped holder's node was given get handler_gone after the lease, never a second answer, and may still run once it resumes; the live holder answers the rest")
    func stoppedMember() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(2, nats: nats)  // the live holder's node, and the caller's
        let stoppedNode = try NodeProcess(nats: nats, node: "stopped")
        let live = try await SlowHolder(nodes.servers[0]), stopped = try await SlowHolder(port: stoppedNode.port)
        let caller = try RawConnection(port: nodes.servers[1].port, receiveTimeout: 10)
        var id: UInt32 = 0
        #expect(try await eventually {  // both holders' subscriptions have reached nats-server
            id += 1
            try caller.send(.call(id, "slow", "probe"))
            _ = try await caller.nextNonPing()
            return live.probes > 0 && stopped.probes > 0
        })
        stoppedNode.signal(SIGSTOP)
        let before = stopped.probes
        var sentAt: [UInt32: ContinuousClock.Instant] = [:]
        for _ in 0..<20 {  // in separate loop turns, so in separate batches, each to either holder
            id += 1
            try caller.send(.call(id, "slow", "probe"))
            sentAt[id] = .now
            try await Task.sleep(for: .milliseconds(30))  // real time: calls in separate turns of the caller's node
        }
        var answers: [UInt32: String] = [:]
        while answers.count < 20 {
            let frame = try await caller.nextNonPing()
            guard let sent = sentAt[frame.id] else { continue }  // a late answer to a warm-up probe
            #expect(answers[frame.id] == nil, "one answer per call")
            answers[frame.id] = frame.errorCode ?? ((try? frame.envelope().get())?.stringValue ?? "\(frame)")
            // Bound: the lease (1.5 s) and a beacon tick, under 5 s on a loaded machine.
            #expect(ContinuousClock.now - sent < .seconds(5))
        }
        let gone = answers.values.filter { $0 == "handler_gone" }.count
        #expect(answers.values.allSatisfy { $0 == "probed" || $0 == "handler_gone" }, "\(answers)")
        #expect(gone > 0 && gone < 20, "NATS gives the stopped member its share: \(answers)")
        stoppedNode.signal(SIGCONT)
        // The stopped holder's node reads the calls it was given and serves them: handler_gone does not
        // say the work did not run. Their answers go nowhere.
        #expect(try await eventually { stopped.probes - before == gone })
        #expect(try await caller.barrier().isEmpty, "no second answer")
        for holder in [live, stopped] { await holder.client.close() }
        await nodes.stop()
    }
}
