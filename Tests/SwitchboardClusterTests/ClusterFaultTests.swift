import Foundation
import Synchronization
import Testing
import SwitchboardClient
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// A Switchboard node in a process of its own (the `switchboard` executable built beside the tests),
/// for what a thread cannot do: `kill -9` and SIGSTOP.
final class NodeProcess {
    let process: ChildProcess
    let port: Int
    /// What the node has logged so far (read on a thread of its own, so that the node never blocks).
    private let logged = Logged()
    private final class Logged: Sendable { let text = Mutex("") }
    var log: String { logged.text.withLock { $0 } }

    /// A node of `loops` loops on `nats`, or (`cluster`) on the servers that `--cluster` value lists;
    /// ready once it listens and (`waitForBus`) its bus has connected.
    init(nats: NATSServerProcess?, node: String, loops: Int = 1, cluster: String? = nil, options: [String] = [],
         waitForBus: Bool = true) throws {
        let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
            .deletingLastPathComponent().appendingPathComponent("switchboard").path
        let servers = cluster ?? nats.map { "nats://127.0.0.1:\($0.port)" } ?? ""
        process = try ChildProcess(executable, ["serve", "--port", "0", "--log-level", "notice", "--loops", "\(loops)", "--cluster",
                                                servers, "--node", node] + options, capturingStandardError: true)
        guard let log = process.standardError else { throw TestFailure("no log") }
        let logged = self.logged
        Thread.detachNewThread {
            var chunk = [UInt8](repeating: 0, count: 4096)
            while true {
                let count = read(log, &chunk, chunk.count)
                guard count > 0 else { break }
                logged.text.withLock { $0 += String(decoding: chunk[..<count], as: UTF8.self) }
            }
            logged.text.withLock { $0 += "\n(exited)" }
        }
        var port: Int?
        let ready = waitUntil(30) {
            let text = logged.text.withLock { $0 }
            if port == nil, let range = text.range(of: #"listening on [0-9.]+:([0-9]+)"#, options: .regularExpression) {
                port = Int(text[range].split(separator: ":").last!)
            }
            return text.hasSuffix("(exited)") || (port != nil && (!waitForBus || text.contains("cluster bus connected")))
        }
        let text = logged.text.withLock { $0 }
        guard ready, !text.hasSuffix("(exited)"), let port else { throw TestFailure("\(executable): \(text)") }
        self.port = port
    }

    func signal(_ signal: Int32) { process.signal(signal) }
}

/// Reads frames until the stream's end on `channel`, with the events before it.
func eventsUntilEnd(_ connection: RawConnection) async throws -> [Frame] {
    var frames: [Frame] = []
    while true {
        let frame = try await connection.nextNonPing()
        frames.append(frame)
        if frame.kind == .message, frame.id == 0, frame.payload == nil { return frames }
    }
}

@Suite("Cluster faults", .serialized, .needsNATSServer)
struct ClusterFaultTests {
    @Test("kill -9 of the holder's node: callers elsewhere get handler_gone and listeners an error event then the end, within two seconds")
    func killedNode() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(1, nats: nats)
        let victim = try NodeProcess(nats: nats, node: "victim")
        var config = ClientConfiguration(port: victim.port)
        config.reconnect = nil
        let holder = try await Client.connect(config)
        let parked = Parked()
        try await holdJobs(holder, parked: parked)
        try await SwitchboardClient.EventChannel(name: "feed", client: holder).setStreamHandler(Countdown(count: 0))
        let caller = try RawConnection(port: nodes.servers[0].port)
        #expect(try await reachesJobs(caller))
        let listener = try RawConnection(port: nodes.servers[0].port)
        try listener.send(.call(1, "feed", "listen", "hold"))
        #expect(try await listener.nextNonPing().kind == .reply)
        try caller.send(.call(2, "jobs/resize", "wait"))
        #expect(try await eventually { parked.count == 1 })

        victim.signal(SIGKILL)
        let killedAt = ContinuousClock.now
        let gone = try await caller.nextNonPing()
        #expect(gone.id == 2 && gone.errorCode == "handler_gone")
        let frames = try await eventsUntilEnd(listener)
        let elapsed = ContinuousClock.now - killedAt
        // A lease of 1.5 s and beacons every 250 ms: 2 s, and a late tick on a loaded machine.
        #expect(elapsed < .seconds(3), "took \(elapsed)")
        #expect(frames.count == 2)
        let error = try StandardMethodCodec().decodeEnvelope(frames.first?.payload)
        #expect(error == .failure(ChannelError(code: "handler_gone", message: WireError.handlerGone.message)))
        // The channel is gone with its node: a new call finds no holder (NATS's no-responders).
        try caller.send(.call(3, "jobs/resize", "resize"))
        let none = try await caller.nextNonPing()
        #expect(none.kind == .reply && none.id == 3 && none.payload == nil)
        parked.releaseAll()
        await holder.close()
        await nodes.stop()
    }

    @Test("kill -9 of a listener's node: the holder's node forgets its listeners, and the holder hears its cancel within two seconds")
    func killedListenerNode() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(1, nats: nats)
        let holder = try await connect(nodes.servers[0])
        let producer = Countdown(count: 0)
        try await SwitchboardClient.EventChannel(name: "feed", client: holder).setStreamHandler(producer)
        let victim = try NodeProcess(nats: nats, node: "victim")
        let listener = try RawConnection(port: victim.port)
        #expect(try await eventually {
            try listener.send(.call(1, "feed", "listen", "hold"))
            let answer = try await listener.nextNonPing()
            return answer.kind == .reply && answer.payload != nil
        })
        #expect(producer.listens.withLock { $0 } == 1)
        victim.signal(SIGKILL)
        let killedAt = ContinuousClock.now
        #expect(try await eventually(4) { producer.cancels.withLock { $0 } == 1 })
        #expect(ContinuousClock.now - killedAt < .seconds(3.5))  // 2 s, and late ticks on a loaded machine
        #expect(try await clusterStats(holder)["nodesLost"] == 1)
        await holder.close()
        await nodes.stop()
    }

    @Test("a node stopped with SIGSTOP: the others go on, NATS drops it as a slow consumer, and once resumed it counts the stall, reconnects and gets the room again")
    func stoppedNode() async throws {
        let monitor = NATSServerProcess.freePort()
        let nats = try NATSServerProcess(configuration: "write_deadline: \"500ms\"\nmax_pending: 2MB\nhttp: \"127.0.0.1:\(monitor)\"\n")
        let nodes = try ClusterNodes(2, nats: nats)
        let victim = try NodeProcess(nats: nats, node: "victim")
        let stalled = try RawConnection(port: victim.port), fine = try RawConnection(port: nodes.servers[1].port)
        for listener in [stalled, fine] {
            try listener.send(.call(1, "switchboard/room", "listen"))
            #expect(try await listener.nextNonPing().kind == .reply)
        }
        let poster = try RawConnection(port: nodes.servers[0].port)
        func post(_ id: UInt32, _ byte: UInt8, size: Int = 1) throws {
            try poster.send(Frame(.message, id: id, channel: "switchboard/room.post", payload: [UInt8](repeating: byte, count: size)))
        }
        var id: UInt32 = 0
        #expect(try await eventually(every: .milliseconds(50)) {  // both subscriptions reach nats-server
            if id > 0, try await [stalled, fine].asyncAllSatisfy({ try await !$0.barrier().isEmpty }) { return true }
            id += 1
            try post(id, 0)
            _ = try await poster.nextNonPing()
            return false
        })

        let watcher = try await connect(nodes.servers[0])
        #expect(try await eventually { try await clusterStats(watcher)["nodes"] == 2 })  // the victim's beacons arrive
        victim.signal(SIGSTOP)
        for _ in 0..<300 {  // 9 MB: more than the stopped node's socket and NATS's max_pending hold
            id += 1
            try post(id, 1, size: 30_000)
        }
        var answered = 0, delivered = 0
        let deadline = ContinuousClock.now + .seconds(30)
        while answered < 300 || delivered < 300, ContinuousClock.now < deadline {  // the running node gets every post meanwhile
            for frame in try await poster.barrier() where frame.kind == .reply { answered += 1 }
            for frame in try await fine.barrier() where frame.payload?.count ?? 0 > 30_000 { delivered += 1 }
        }
        #expect(answered == 300 && delivered == 300)
        try await Task.sleep(for: .seconds(2))  // real time: the node stays stopped past NATS's write deadline and the cluster's lease
        victim.signal(SIGCONT)

        let stats = try RawConnection(port: victim.port)
        var cluster: ChannelValue = .null
        #expect(try await eventually {
            try stats.send(.call(1, "switchboard/stats", "get"))
            let reply = try await stats.nextNonPing()
            cluster = try StandardMethodCodec().decodeEnvelope(reply.payload).get()["cluster"] ?? .null
            return cluster["busReconnects"]?.intValue ?? 0 >= 1 && cluster["connected"] == true
        }, "\(cluster)")
        #expect(cluster["stalls"]!.intValue! >= 1, "\(cluster)")
        // nats-server's own count: it closed the stopped node's connection as a slow consumer.
        let varz = try #require(RawSocket(port: monitor))
        varz.send("GET /varz HTTP/1.0\r\n\r\n")
        let page = String(decoding: try #require(varz.readUntilClosed()).bytes, as: UTF8.self)
        #expect(page.contains(#""slow_consumers": 1"#), "\(page.suffix(300))")
        // The room reaches the resumed node again.
        _ = try await stalled.barrier()
        #expect(try await eventually {
            id += 1
            try post(id, 2)
            return try await stalled.barrier().contains { $0.payload?.count ?? 0 > 0 && $0.payload!.last == 2 }
        })
        let publisher = try await clusterStats(watcher)
        #expect(publisher["nodesLost"]!.intValue! >= 1, "the running nodes saw the stopped one go silent: \(publisher)")
        await watcher.close()
        await nodes.stop()
    }

    @Test("two nats-servers joined by a route, with a node on each: broadcasts, calls and no-responders cross the route")
    func routedServers() async throws {
        let routeA = NATSServerProcess.freePort(), routeB = NATSServerProcess.freePort()
        func cluster(_ listen: Int, _ other: Int) -> String {
            "cluster { name: switchboard, listen: 127.0.0.1:\(listen), routes: [nats-route://127.0.0.1:\(other)] }\n"
        }
        let first = try NATSServerProcess(configuration: cluster(routeA, routeB))
        let second = try NATSServerProcess(configuration: cluster(routeB, routeA))
        let nodes = try ClusterNodes(2, nats: first, second)
        let holder = try await connect(nodes.servers[0])
        try await holdJobs(holder)
        let caller = try await connect(nodes.servers[1])
        let resize = SwitchboardClient.MethodChannel(name: "jobs/resize", client: caller)
        #expect(try await eventually { (try? await resize.invokeMethod("resize", arguments: ["width": 6])) == ["width": 3] })
        let member = try await RoomMember(nodes.servers[1])
        member.listen()
        let poster = try await RoomMember(nodes.servers[0])
        #expect(try await eventually { try await poster.post(9); return member.events.contains(.uint8List([9])) })
        await #expect(throws: MissingImplementation.self) {
            try await SwitchboardClient.MethodChannel(name: "jobs/none", client: caller).invokeMethod("x")
        }
        for client in [holder, caller, member.client, poster.client] { await client.close() }
        await nodes.stop()
    }
}

extension Array {
    func asyncAllSatisfy(_ predicate: (Element) async throws -> Bool) async rethrows -> Bool {
        for element in self where try await !predicate(element) { return false }
        return true
    }
}
