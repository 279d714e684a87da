import Synchronization
import Testing
import SwitchboardClient
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport
import SwitchboardWire

/// A producer that, on listen, sends `count` events after `delayMs`, then ends; "hold" sends nothing.
final class Countdown: EventProducer {
    let count: Int
    let listens = Mutex(0)
    let cancels = Mutex(0)
    init(count: Int) { self.count = count }
    func onListen(arguments: ChannelValue, sink: ProducerSink) async -> ChannelError? {
        listens.withLock { $0 += 1 }
        if arguments == "refuse" { return ChannelError(code: "refused", message: "not now") }
        guard arguments != "hold" else { return nil }
        let count = self.count
        Task {
            try await Task.sleep(for: .milliseconds(300))  // real time: every listener joins first, on nodes the producer cannot see
            for i in 0..<count { sink.success(.int(i)) }
            sink.endOfStream()
        }
        return nil
    }
    func onCancel(arguments: ChannelValue) async { cancels.withLock { $0 += 1 } }
}

func connect(_ server: Server) async throws -> Client {
    var config = ClientConfiguration(port: server.port)
    config.reconnect = nil
    config.requestTimeout = .seconds(10)
    return try await Client.connect(config)
}

/// The node's `cluster` stats, through `client`.
func clusterStats(_ client: Client) async throws -> ChannelValue {
    let stats: ChannelValue = try await SwitchboardClient.MethodChannel(name: "switchboard/stats", client: client).invokeMethod("get")
    return stats["cluster"] ?? .null
}

/// Calls a holder parks until the test lets them go.
final class Parked: Sendable {
    private let continuations = Mutex<[CheckedContinuation<Void, Never>]>([])
    func park() async { await withCheckedContinuation { continuation in continuations.withLock { $0.append(continuation) } } }
    var count: Int { continuations.withLock { $0.count } }
    func releaseAll() {
        for continuation in continuations.withLock({ parked in defer { parked = [] }; return parked }) { continuation.resume() }
    }
}

/// Registers the two channels of the broker tests on `holder`: `jobs/resize` (methods; "wait" parks
/// in `parked`) and `jobs/notes` (string messages).
func holdJobs(_ holder: Client, parked: Parked = Parked()) async throws {
    try await SwitchboardClient.MethodChannel(name: "jobs/resize", client: holder).setMethodCallHandler { call in
        switch call.method {
        case "resize": return ["width": .int((call.arguments["width"]?.intValue ?? 0) / 2)]
        case "fail": throw ChannelError(code: "too_big", message: "no", details: call.arguments)
        case "wait":
            await parked.park()
            return "waited"
        default: throw MissingImplementation(channel: "jobs/resize", method: call.method)
        }
    }
    try await BasicMessageChannel(name: "jobs/notes", codec: StringCodec(), client: holder).setMessageHandler { "got \($0 ?? "nil")" }
}

/// Whether calls from `connection`'s node reach the `jobs/resize` holder (its node's subscription has
/// reached nats-server), trying for up to ten seconds.
func reachesJobs(_ connection: RawConnection) async throws -> Bool {
    try await eventually {
        try connection.send(.call(1, "jobs/resize", "resize", ["width": 2]))
        return try await connection.nextNonPing().payload != nil
    }
}

/// One node on `nats`, with a client holding the event channel `feed` (fed by the returned `Feed`), once
/// the node has told the bus it holds it.
func feedOnOneNode(_ nats: NATSServerProcess) async throws -> (ClusterNodes, Feed, Client) {
    let nodes = try ClusterNodes(1, nats: nats)
    let producer = Feed()
    let holder = try await connect(nodes.servers[0])
    try await SwitchboardClient.EventChannel(name: "feed", client: holder).setStreamHandler(producer)
    #expect(try await eventually { try await clusterStats(holder)["channelsHeld"] == 1 })
    return (nodes, producer, holder)
}

/// Nodes on one nats-server, with a client of node 1 holding the jobs channels ("wait" parks in
/// `parked`).
struct JobsCluster {
    let nats: NATSServerProcess
    let nodes: ClusterNodes
    let holder: Client
    let parked = Parked()

    init(nodes count: Int, drainTimeoutMs: UInt64 = 300) async throws {
        nats = try NATSServerProcess()
        nodes = try ClusterNodes(count, drainTimeoutMs: drainTimeoutMs, nats: nats)
        holder = try await connect(nodes.servers[0])
        try await holdJobs(holder, parked: parked)
    }

    /// A raw connection to node 2, once node 2 reaches the holder.
    func rawOnNode2() async throws -> RawConnection {
        let raw = try RawConnection(port: nodes.servers[1].port)
        #expect(try await reachesJobs(raw))
        return raw
    }

    func stop() async {
        parked.releaseAll()
        await holder.close()
        await nodes.stop()
    }
}

@Suite("Broker routing across nodes", .serialized, .needsNATSServer)
struct ClusterBrokerTests {
    @Test("a channel held on node 1 is called and messaged from nodes 2 and 3, in binary and text mode, with the bytes one node gives")
    func callsAcrossNodes() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(3, nats: nats)
        let holder = try await connect(nodes.servers[0])
        try await holdJobs(holder)
        let caller = try await connect(nodes.servers[1])
        let resize = SwitchboardClient.MethodChannel(name: "jobs/resize", client: caller)
        // Until node 1's subscription reaches nats-server, node 2 finds no holder (a null reply).
        #expect(try await eventually { (try? await resize.invokeMethod("resize", arguments: ["width": 640])) == ["width": 320] })
        await #expect(throws: ChannelError(code: "too_big", message: "no", details: 1)) { try await resize.invokeMethod("fail", arguments: 1) }
        await #expect(throws: MissingImplementation.self) { try await resize.invokeMethod("other") }
        #expect(try await BasicMessageChannel(name: "jobs/notes", codec: StringCodec(), client: caller).send("hi") == "got hi")

        // Byte for byte what a caller on the holder's own node gets.
        let local = try RawConnection(port: nodes.servers[0].port), remote = try RawConnection(port: nodes.servers[2].port)
        for (id, method) in [(UInt32(1), "resize"), (2, "fail"), (3, "other")] {
            try local.send(.call(id, "jobs/resize", method, ["width": 10]))
            try remote.send(.call(id, "jobs/resize", method, ["width": 10]))
            let mine = try await local.nextNonPing(), theirs = try await remote.nextNonPing()
            #expect(theirs.bytes == mine.bytes, "\(method)")
        }
        try remote.send(Frame(.message, id: 4, channel: "jobs/notes", payload: Array("yo".utf8)))
        let note = try await remote.nextNonPing()
        #expect(note.kind == .reply && note.id == 4 && note.payload == Array("got yo".utf8))

        // Text mode on node 3: the holder's node decodes the reply in the channel's codec.
        let text = try RawConnection(port: nodes.servers[2].port)
        try text.send(Array(#"{"id":1,"call":"jobs/resize","method":"resize","args":{"width":8}}"#.utf8) + [10])
        #expect(try await text.line() == ["id": 1, "result": ["width": 4]])
        try text.send(Array(#"{"id":2,"call":"jobs/resize","method":"fail","args":"x"}"#.utf8) + [10])
        #expect(try await text.line() == ["id": 2, "error": ["code": "too_big", "message": "no", "details": "x"]])
        try text.send(Array(#"{"id":3,"send":"jobs/notes","message":"hey"}"#.utf8) + [10])
        #expect(try await text.line() == ["id": 3, "reply": "got hey"])

        // No holder anywhere: the null reply of one node, from NATS's no-responders.
        try remote.send(.call(5, "jobs/nobody", "x"))
        let none = try await remote.nextNonPing()
        #expect(none.kind == .reply && none.id == 5 && none.payload == nil)
        #expect(try await clusterStats(caller)["callsOut"]!.intValue! >= 4)
        try text.send(Array(#"{"id":9,"call":"switchboard/stats","method":"get"}"#.utf8) + [10])
        let node3 = try await text.line()["result"]?["cluster"]
        #expect(node3?["callsNoHolder"] == 1 && node3?["callsOut"] == 8, "\(String(describing: node3))")
        // The same counters on node 3's /metrics.
        let scrape = try #require(RawSocket(port: nodes.servers[2].port))
        scrape.send("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        let metrics = String(decoding: try #require(scrape.readUntilClosed()).bytes, as: UTF8.self)
        #expect(metrics.contains("switchboard_cluster_calls_out_total 8") && metrics.contains("switchboard_cluster_calls_no_holder_total 1")
                    && metrics.contains("switchboard_cluster_connected 1"), "\(metrics.suffix(600))")
        #expect(try await clusterStats(holder)["callsIn"]!.intValue! >= 4)

        await holder.close()
        await caller.close()
        await nodes.stop()
    }

    @Test("calls that arrive together travel to the holder's node in one bus message, each with its own answer")
    func callsTravelInBatches() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(2, nats: nats)
        let holder = try await connect(nodes.servers[0])
        try await holdJobs(holder)
        let raw = try RawConnection(port: nodes.servers[1].port), observer = try await connect(nodes.servers[1])
        #expect(try await eventually {
            try raw.send(Frame(.message, id: 1, channel: "jobs/notes", payload: Array("x".utf8)))
            return try await raw.nextNonPing().payload != nil
        })
        let before = try await clusterStats(holder), callerBefore = try await clusterStats(observer)
        // 100 messages in one write: one read on node 2, so one batch (a few, if the read is split).
        try raw.send((UInt32(2)...101).flatMap { Frame(.message, id: $0, channel: "jobs/notes", payload: Array("\($0)".utf8)).bytes })
        var answers: [UInt32: [UInt8]] = [:]
        for _ in 0..<100 {
            let reply = try await raw.nextNonPing()
            answers[reply.id] = reply.payload
        }
        #expect(answers.count == 100 && (2...101).allSatisfy { answers[$0] == Array("got \($0)".utf8) })
        let after = try await clusterStats(holder), callerAfter = try await clusterStats(observer)
        func delta(_ key: String, _ from: ChannelValue, _ to: ChannelValue) -> Int { to[key]!.intValue! - from[key]!.intValue! }
        #expect(delta("callsIn", before, after) == 100)
        // Bus messages in also count the other node's beacons, four a second.
        #expect(delta("busMessagesIn", before, after) <= 10, "100 calls came in \(delta("busMessagesIn", before, after)) bus messages")
        #expect(delta("busMessagesIn", callerBefore, callerAfter) <= 10,
                "100 answers came in \(delta("busMessagesIn", callerBefore, callerAfter)) bus messages")
        await observer.close()
        await holder.close()
        await nodes.stop()
    }

    @Test("a CANCEL on node 2 reaches the holder on node 1; the holder leaving answers node 2's open calls with handler_gone")
    func cancelAndHandlerGone() async throws {
        let cluster = try await JobsCluster(nodes: 2)
        let parked = cluster.parked
        let raw = try await cluster.rawOnNode2()
        try raw.send(.call(2, "jobs/resize", "wait"))
        #expect(try await eventually { parked.count == 1 })
        try raw.send(Frame(.cancel, id: 2, payload: nil))
        let cancelled = try await raw.nextNonPing()
        #expect(cancelled.id == 2)
        // The holder's node relayed the CANCEL: the holder's client gave up on the call.
        #expect(try await eventually { try await clusterStats(cluster.holder)["callsServing"] == 0 })

        try raw.send(.call(3, "jobs/resize", "wait"))
        #expect(try await eventually { parked.count == 2 })
        await cluster.holder.close()
        let gone = try await raw.nextNonPing()
        #expect(gone.id == 3 && gone.errorCode == "handler_gone")
        await cluster.stop()
    }

    @Test("a CALL and its CANCEL in one write: the cancel follows its call to the holder's node")
    func callAndCancelInOneWrite() async throws {
        let cluster = try await JobsCluster(nodes: 2)
        let raw = try await cluster.rawOnNode2()
        try raw.send(try Frame.call(2, "jobs/resize", "wait").bytes + Frame(.cancel, id: 2, payload: nil).bytes)
        #expect(try await raw.nextNonPing().id == 2)
        // Had the cancel passed its call, the holder's node would still be serving it, parked.
        #expect(try await eventually(3) { try await clusterStats(cluster.holder)["callsServing"] == 0 })
        cluster.parked.releaseAll()
        await cluster.stop()
    }

    @Test("calls in one batch to a channel nobody holds each get the null reply")
    func batchToNobody() async throws {
        let cluster = try await JobsCluster(nodes: 2)
        let raw = try await cluster.rawOnNode2()
        try raw.send((UInt32(10)...14).flatMap { (try? Frame.call($0, "jobs/nobody", "x").bytes) ?? [] })
        var answered: Set<UInt32> = []
        for _ in 0..<5 {
            let none = try await raw.nextNonPing()
            #expect(none.kind == .reply && none.payload == nil)
            answered.insert(none.id)
        }
        #expect(answered == Set(10...14))
        await cluster.stop()
    }

    @Test("listeners on nodes 2 and 3 of an event channel held on node 1 get its events in order and the end; the holder hears one listen and one cancel")
    func eventsAcrossNodes() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(3, nats: nats)
        let holder = try await connect(nodes.servers[0])
        let producer = Countdown(count: 50)
        try await SwitchboardClient.EventChannel(name: "feed", client: holder).setStreamHandler(producer)
        let probe = try RawConnection(port: nodes.servers[1].port)
        #expect(try await eventually {  // node 1's holding reaches nats-server
            try probe.send(.call(1, "feed", "listen", "hold"))
            let answer = try await probe.nextNonPing()
            return answer.kind == .reply && answer.payload != nil
        })
        try probe.send(.call(2, "feed", "cancel"))
        _ = try await probe.nextNonPing()
        #expect(try await eventually { producer.cancels.withLock { $0 } == 1 })

        let listeners = [try RawConnection(port: nodes.servers[1].port), try RawConnection(port: nodes.servers[2].port),
                         try RawConnection(port: nodes.servers[2].port)]
        for listener in listeners { try listener.send(.call(7, "feed", "listen")) }
        let codec = StandardMethodCodec()
        let nullSuccess = try codec.encodeSuccessEnvelope(.null)
        for (index, listener) in listeners.enumerated() {
            let answer = try await listener.nextNonPing()
            #expect(answer.kind == .reply && answer.id == 7 && answer.payload == nullSuccess, "listener \(index)")
            var values: [ChannelValue] = []
            while true {
                let event = try await listener.nextNonPing()
                guard let payload = event.payload else { break }  // the end of the stream
                values.append(try #require(try? codec.decodeEnvelope(payload).get()))
            }
            #expect(values == (0..<50).map { .int($0) }, "listener \(index)")
        }
        #expect(producer.listens.withLock { $0 } == 2, "the probe's listen, then one for the three listeners")

        // Streams that never end: two listeners, then both leave; the holder hears one cancel.
        let a = try RawConnection(port: nodes.servers[1].port), b = try RawConnection(port: nodes.servers[2].port)
        try a.send(.call(1, "feed", "listen", "hold"))
        _ = try await a.nextNonPing()
        try b.send(.call(1, "feed", "listen", "hold"))
        _ = try await b.nextNonPing()
        #expect(producer.listens.withLock { $0 } == 3)
        try a.send(.call(2, "feed", "cancel"))
        #expect(try await a.nextNonPing().id == 2)
        try await Task.sleep(for: .milliseconds(200))  // real time: a second cancel that must not come has nothing to await
        #expect(producer.cancels.withLock { $0 } == 1, "b still listens")
        try b.send(.call(2, "feed", "cancel"))
        #expect(try await b.nextNonPing().id == 2)
        #expect(try await eventually { producer.cancels.withLock { $0 } == 2 })

        // A refused listen is refused on every node alike.
        try a.send(.call(3, "feed", "listen", "refuse"))
        let refused = try await a.nextNonPing()
        let refusal = try codec.encodeErrorEnvelope(ChannelError(code: "refused", message: "not now"))
        #expect(refused.payload == refusal)

        // The holder leaves: a listener on another node gets handler_gone, then the end.
        try a.send(.call(4, "feed", "listen", "hold"))
        _ = try await a.nextNonPing()
        await holder.close()
        let gone = try await a.nextNonPing()
        let goneEvent = try codec.decodeEnvelope(gone.payload)
        #expect(goneEvent == .failure(ChannelError(code: "handler_gone", message: WireError.handlerGone.message)))
        let end = try await a.nextNonPing()
        #expect(end.kind == .message && end.payload == nil)
        await nodes.stop()
    }
}

@Suite("Several holders across nodes", .serialized, .needsNATSServer)
struct ClusterHoldersTests {
    @Test("holders of one channel on two nodes form a queue group: a third node's calls are shared, a holder's own node keeps its calls; channel_taken holds within a node")
    func queueGroup() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(3, nats: nats)
        let first = try await connect(nodes.servers[0]), second = try await connect(nodes.servers[1])
        try await SwitchboardClient.MethodChannel(name: "who", client: first).setMethodCallHandler { _ in "node1" }
        try await SwitchboardClient.MethodChannel(name: "who", client: second).setMethodCallHandler { _ in "node2" }
        let rival = try await connect(nodes.servers[0])
        await #expect(throws: ClientError.server(code: "channel_taken", message: "the channel already has a handler")) {
            try await SwitchboardClient.MethodChannel(name: "who", client: rival).setMethodCallHandler { _ in "rival" }
        }
        let caller = try await connect(nodes.servers[2])
        let who = SwitchboardClient.MethodChannel(name: "who", client: caller)
        var answers: [String: Int] = [:]
        #expect(try await eventually {  // both subscriptions reach nats-server, then calls go to both
            for _ in 0..<20 {
                if let answer: ChannelValue = try? await who.invokeMethod("x"), let name = answer.stringValue { answers[name, default: 0] += 1 }
            }
            return answers["node1", default: 0] > 0 && answers["node2", default: 0] > 0
        }, "\(answers)")
        let local = SwitchboardClient.MethodChannel(name: "who", client: rival)
        for _ in 0..<10 { #expect(try await local.invokeMethod("x") == "node1") }
        for client in [first, second, rival, caller] { await client.close() }
        await nodes.stop()
    }
}

@Suite("What other nodes send", .serialized, .needsNATSServer)
struct ClusterInputTests {
    @Test("a message on an event subject that is not one whole event frame of that channel is counted and dropped; an end needs a holder's node")
    func malformedEvents() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(1, nats: nats)
        let member = try await RoomMember(nodes.servers[0])
        member.listen()
        #expect(try await eventually { try await member.cluster()["channelsListened"] == 1 })
        let subject = "switchboard.event." + Digest.sha256Hex(Array("switchboard/room".utf8))
        func event(_ value: Int) throws -> [UInt8] {
            var frame: [UInt8] = []
            Frame(.message, id: 0, channel: "switchboard/room", payload: try StandardMethodCodec().encodeSuccessEnvelope(.int(value))).write(to: &frame)
            return frame
        }
        func publish(_ payloads: [[UInt8]]) -> [UInt8] {
            payloads.flatMap { Array("PUB \(subject) \($0.count)\r\n".utf8) + $0 + Array("\r\n".utf8) }
        }
        let bus = try #require(RawSocket(port: nats.port))
        bus.send(Array("CONNECT {\"verbose\":false}\r\n".utf8))
        #expect(try await eventually(every: .milliseconds(50)) {  // until the node's subscription has reached nats-server
            if member.events.contains(.int(7)) { return true }
            bus.send(publish([try event(7)]))
            return false
        })
        let before = member.events.count
        var end: [UInt8] = [], other: [UInt8] = []
        Frame(.message, id: 0, channel: "switchboard/room", payload: nil).write(to: &end)
        Frame(.message, id: 0, channel: "elsewhere", payload: [0]).write(to: &other)
        let good = try event(8)
        bus.send(publish([Array("garbage".utf8), end, other, Array(good.dropLast()), good]))
        #expect(try await eventually { member.events.last == .int(8) })
        let stats = try await member.cluster()
        #expect(stats["eventsMalformed"] == 4 && stats["eventsIn"] == .int(before + 1), "\(stats)")
        await member.client.close()
        await nodes.stop()
    }
}

/// A producer whose events the test sends, through the sink of the last listen; "end" ends at once.
final class Feed: EventProducer {
    let sink = Mutex<ProducerSink?>(nil)
    let listens = Mutex(0)
    let cancels = Mutex(0)
    func onListen(arguments: ChannelValue, sink: ProducerSink) async -> ChannelError? {
        listens.withLock { $0 += 1 }
        self.sink.withLock { $0 = sink }
        if arguments == "end" { sink.endOfStream() }
        return nil
    }
    func onCancel(arguments: ChannelValue) async { cancels.withLock { $0 += 1 } }
    func send(_ value: ChannelValue) { sink.withLock { $0 }?.success(value) }
}

extension ClusterInputTests {
    @Test("a batch of calls that names no node or is not whole records is counted and dropped; a whole one is served")
    func malformedBatches() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(2, nats: nats)
        let holder = try await connect(nodes.servers[0])
        try await holdJobs(holder)
        let caller = try await connect(nodes.servers[1])  // once it is answered, nats-server has the holder's subscription
        let notes = BasicMessageChannel(name: "jobs/notes", codec: StringCodec(), client: caller)
        #expect(try await eventually { (try? await notes.send("x")) == "got x" })
        let before = try await clusterStats(holder)
        let bus = try #require(RawSocket(port: nats.port, timeout: 0.2))
        bus.send("CONNECT {\"verbose\":false,\"headers\":true,\"no_responders\":true}\r\nSUB switchboard.answers.fa4e 1\r\n")
        // The fake node's beacon, so that the holder's node does not take it for gone (and end its calls)
        // while a loaded machine keeps the holder from answering.
        let beacon = "fa4e 0 fake\nL\n"
        func beat() { bus.send("PUB switchboard.beacon \(beacon.utf8.count)\r\n\(beacon)\r\n") }
        beat()
        let subject = "switchboard.call." + Digest.sha256Hex(Array("jobs/notes".utf8))
        func hpub(caller: String, _ batch: [UInt8]) -> [UInt8] {
            let headers = Array("NATS/1.0\r\nSb-Caller: \(caller)\r\n\r\n".utf8)
            return Array("HPUB \(subject) switchboard.reply.fa4e.1 \(headers.count) \(headers.count + batch.count)\r\n".utf8) + headers + batch + [13, 10]
        }
        let note = Array("hi".utf8)
        let whole = [0, 0, 0, 0, 0, 0, 0, 7, UInt8(ascii: "b"), 0, 0, 0, 0, UInt8(note.count)] + note
        let unknown = [0, 0, 0, 0, 0, 0, 0, 8, UInt8(ascii: "?"), 0, 0, 0, 0, 0]
        // Cut short, a length past the end, and a caller that is not a node's instance; then a whole
        // batch of two, whose second record is of a kind nobody knows.
        bus.send(hpub(caller: "fa4e", Array(whole.prefix(10))) + hpub(caller: "fa4e", Array(whole.dropLast()))
                 + hpub(caller: "not-hex", whole) + hpub(caller: "fa4e", whole + unknown))
        var received = ""
        let deadline = ContinuousClock.now + .seconds(10)
        while !(received.contains("got hi") && received.contains("bad_request")), ContinuousClock.now < deadline {
            beat()
            received += String(decoding: bus.read(), as: UTF8.self)  // nothing within 0.2 s: read again
        }
        #expect(received.contains("HMSG switchboard.answers.fa4e 1 ") && received.contains("got hi") && received.contains("bad_request"),
                "\(received)")
        let stats = try await clusterStats(holder)
        #expect(stats["batchesMalformed"] == 3 && stats["callsIn"] == .int(before["callsIn"]!.intValue! + 2), "\(stats)")
        await caller.close()
        await holder.close()
        await nodes.stop()
    }

    @Test("a node whose beacons report fewer listeners than counted (its leave was lost) has its count put right, and the holder hears cancel")
    func lostLeaveIsReconciled() async throws {
        let nats = try NATSServerProcess()
        let (nodes, producer, holder) = try await feedOnOneNode(nats)
        // A node of our own making, on a raw NATS connection: it listens once, then never sends its leave.
        let fake = try #require(RawSocket(port: nats.port))
        let subject = "switchboard.call." + Digest.sha256Hex(Array("feed".utf8))
        let headers = Array("NATS/1.0\r\nSb-Caller: fa4e\r\n\r\n".utf8)
        let call = Array(#"{"method":"listen","args":"hold"}"#.utf8)
        fake.send("CONNECT {\"verbose\":false,\"headers\":true,\"no_responders\":true}\r\nSUB switchboard.answers.fa4e 1\r\n")
        var id: UInt8 = 0
        _ = try await eventually(5, every: .milliseconds(200)) {  // until the holder's subscription is in place
            guard producer.listens.withLock({ $0 }) == 0 else { return true }
            id += 1
            // A batch of one record (protocol/cluster.md): id, kind `c` (a call as JSON), flags, length, payload.
            let batch = [0, 0, 0, 0, 0, 0, 0, id, UInt8(ascii: "c"), 0, 0, 0, 0, UInt8(call.count)] + call
            fake.send(Array("HPUB \(subject) switchboard.reply.fa4e.\(id) \(headers.count) \(headers.count + batch.count)\r\n".utf8)
                      + headers + batch + [13, 10])
            return false
        }
        #expect(producer.listens.withLock { $0 } == 1)
        let beacon = "fa4e 0 fake\nL\n"  // alive, with no listener anywhere
        _ = try await eventually(3, every: .milliseconds(250)) {  // beacons spaced as a node spaces them
            guard producer.cancels.withLock({ $0 }) == 0 else { return true }
            fake.send("PUB switchboard.beacon \(beacon.utf8.count)\r\n\(beacon)\r\n")
            return false
        }
        #expect(producer.cancels.withLock { $0 } == 1, "two beacons without the listener cancel the holder's stream")
        #expect(try await clusterStats(holder)["nodesLost"] == 0, "the fake node stayed alive throughout")
        await holder.close()
        await nodes.stop()
    }
}

@Suite("Broker routing across nodes: edge cases", .serialized, .needsNATSServer)
struct ClusterBrokerEdgeTests {
    /// Three nodes; a client of node 1 holds `name` with `producer`; returns once node 2 reaches it.
    static func feedOnNode1(_ nodes: ClusterNodes, _ producer: Feed, name: String = "feed") async throws -> Client {
        let holder = try await connect(nodes.servers[0])
        try await SwitchboardClient.EventChannel(name: name, client: holder).setStreamHandler(producer)
        let probe = try RawConnection(port: nodes.servers[1].port)
        #expect(try await eventually {
            try probe.send(.call(1, name, "x"))  // not a listen: no stream, only the reach
            _ = try await probe.nextNonPing()
            return try await clusterStats(holder)["callsIn"] != 0
        })
        return holder
    }

    @Test("methods named listen and cancel on a held method channel are calls like any other across nodes")
    func listenAndCancelAsMethods() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(2, nats: nats)
        let holder = try await connect(nodes.servers[0])
        try await SwitchboardClient.MethodChannel(name: "verbs", client: holder).setMethodCallHandler { call in .string("did \(call.method)") }
        let caller = try await connect(nodes.servers[1])
        let verbs = SwitchboardClient.MethodChannel(name: "verbs", client: caller)
        #expect(try await eventually { (try? await verbs.invokeMethod("x")) == "did x" })
        #expect(try await verbs.invokeMethod("listen") == "did listen")
        #expect(try await verbs.invokeMethod("cancel") == "did cancel")
        let text = try RawConnection(port: nodes.servers[1].port)
        try text.send(Array(#"{"id":1,"listen":"verbs"}"#.utf8) + [10])
        #expect(try await text.line() == ["id": 1, "result": "did listen"])
        for client in [holder, caller] { await client.close() }
        await nodes.stop()
    }

    @Test("a CANCEL across nodes gets the answer a caller on the holder's node gets")
    func cancelAnswerAsOnOneNode() async throws {
        let cluster = try await JobsCluster(nodes: 2)
        let local = try RawConnection(port: cluster.nodes.servers[0].port), remote = try await cluster.rawOnNode2()
        for connection in [local, remote] {
            try connection.send(.call(2, "jobs/resize", "wait"))
        }
        #expect(try await eventually { cluster.parked.count == 2 })
        for connection in [local, remote] { try connection.send(Frame(.cancel, id: 2, payload: nil)) }
        let mine = try await local.nextNonPing(), theirs = try await remote.nextNonPing()
        #expect(mine.kind == .reply && theirs.bytes == mine.bytes, "\(mine) \(theirs)")
        await cluster.stop()
    }

    @Test("a listen with id 0, a listen again on the same connection, and a stream the holder ends before answering")
    func listenShapes() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(2, nats: nats)
        let producer = Feed()
        let holder = try await Self.feedOnNode1(nodes, producer)
        let codec = StandardMethodCodec()

        // id 0: nobody gets the answer, but the stream runs, and its end is the holder's cancel.
        let quiet = try RawConnection(port: nodes.servers[1].port)
        try quiet.send(.call(0, "feed", "listen", "hold"))
        #expect(try await eventually { producer.listens.withLock { $0 } == 1 })
        try await Task.sleep(for: .milliseconds(100))  // real time: the holder's answer reaches node 2, where nobody reads it
        producer.send(1)
        let first = try await quiet.nextNonPing()
        #expect(try codec.decodeEnvelope(first.payload) == .success(1))

        // Listening again replaces the stream, and events keep coming.
        try quiet.send(.call(5, "feed", "listen", "hold"))
        let again = try await quiet.nextNonPing()
        #expect(again.kind == .reply && again.id == 5)
        producer.send(2)
        let second = try await quiet.nextNonPing()
        #expect(try codec.decodeEnvelope(second.payload) == .success(2))
        try quiet.send(.call(6, "feed", "cancel"))
        #expect(try await quiet.nextNonPing().id == 6)
        #expect(try await eventually { producer.cancels.withLock { $0 } == 1 })

        // The holder ends the stream inside onListen: the listener gets its answer, then the end.
        let ended = try RawConnection(port: nodes.servers[1].port)
        try ended.send(.call(7, "feed", "listen", "end"))
        let answer = try await ended.nextNonPing()
        #expect(answer.kind == .reply && answer.id == 7)
        let end = try await ended.nextNonPing()
        #expect(end.kind == .message && end.payload == nil)
        await holder.close()
        await nodes.stop()
    }

    @Test("the holder's node shuts down: calls from other nodes get going_away at once, not handler_gone after the lease")
    func holderNodeShutsDown() async throws {
        let cluster = try await JobsCluster(nodes: 2)
        let remote = try await cluster.rawOnNode2()
        try remote.send(.call(2, "jobs/resize", "wait"))
        #expect(try await eventually { cluster.parked.count == 1 })
        let started = ContinuousClock.now
        cluster.nodes.servers[0].shutdown()
        let answer = try await remote.nextNonPing()
        #expect(answer.id == 2 && answer.errorCode == "going_away")
        #expect(ContinuousClock.now - started < .seconds(1))
        await cluster.stop()
    }
}

@Suite("Broker routing across nodes: cancels and concurrency", .serialized, .needsNATSServer)
struct ClusterBrokerCancelTests {
    @Test("a CANCEL while the holder's node drains still reaches the holder and gets the cancel's answer, not going_away")
    func cancelWhileDraining() async throws {
        let cluster = try await JobsCluster(nodes: 2, drainTimeoutMs: 5000)  // long enough for the CANCEL on a loaded machine
        let remote = try await cluster.rawOnNode2()
        try remote.send(.call(2, "jobs/resize", "wait"))
        #expect(try await eventually { cluster.parked.count == 1 })
        cluster.nodes.servers[0].shutdown()  // drains: the call is still being served
        try await Task.sleep(for: .milliseconds(50))  // real time: node 1's drain begins on its own loop thread
        try remote.send(Frame(.cancel, id: 2, payload: nil))
        let answer = try await remote.nextNonPing()
        let cancelled = try StandardMethodCodec().encodeErrorEnvelope(ChannelError(code: "cancelled", message: "the caller cancelled"))
        #expect(answer.kind == .reply && answer.id == 2 && answer.payload == cancelled, "\(answer) \(answer.payload.map { String(decoding: $0, as: UTF8.self) } ?? "")")
        await cluster.stop()
    }

    @Test("a cancel of a stream whose holder ended it, with the end still queued behind events without credit, ends it here")
    func cancelOfRetiredStream() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(2, nats: nats)
        let producer = Feed()
        let holder = try await ClusterBrokerEdgeTests.feedOnNode1(nodes, producer)
        let listener = try RawConnection(port: nodes.servers[1].port)
        try listener.send(Frame(.demand, channel: "feed", payload: [0, 0, 0, 1]))  // room for one event
        try listener.send(.call(1, "feed", "listen", "hold"))
        #expect(try await listener.nextNonPing().kind == .reply)
        for value in 1...3 { producer.send(.int(value)) }
        producer.sink.withLock { $0 }?.endOfStream()
        let first = try await listener.nextNonPing()
        #expect(try StandardMethodCodec().decodeEnvelope(first.payload) == .success(1))
        #expect(try await eventually { try await clusterStats(holder)["eventsOut"] == 4 })
        let watcher = try RawConnection(port: nodes.servers[1].port)
        #expect(try await eventually { try await clusterStats(watcher)["eventsIn"] == 4 })  // the end has reached node 2 and waits in the queue
        try listener.send(.call(2, "feed", "cancel"))
        let answer = try await listener.nextNonPing()
        let success = try StandardMethodCodec().encodeSuccessEnvelope(.null)
        #expect(answer.kind == .reply && answer.id == 2 && answer.payload == success)
        await holder.close()
        await nodes.stop()
    }

    @Test("a call or an answer larger than NATS's max_payload: the caller gets the null reply or bad_payload, never silence")
    func overTheBusLimit() async throws {
        let nats = try NATSServerProcess(configuration: "max_payload: 4096\n")
        let nodes = try ClusterNodes(2, nats: nats)
        let holder = try await connect(nodes.servers[0])
        try await SwitchboardClient.MethodChannel(name: "big", client: holder).setMethodCallHandler { call in
            guard let count = call.arguments.intValue else { return .string(String(repeating: "a", count: 1000)) }
            return .string(String(repeating: "x", count: count))
        }
        let big = SwitchboardClient.MethodChannel(name: "big", client: try await connect(nodes.servers[1]))
        #expect(try await eventually { (try? await big.invokeMethod("size", arguments: 10)) == .string(String(repeating: "x", count: 10)) })
        let raw = try RawConnection(port: nodes.servers[1].port)
        try raw.send(.call(1, "big", "size", .int(5000)))
        let tooLarge = try await raw.nextNonPing()
        #expect(tooLarge.kind == .error && tooLarge.id == 1)
        #expect(String(decoding: tooLarge.payload ?? [], as: UTF8.self).contains("bad_payload"))
        try raw.send(.call(2, "big", "size", .string(String(repeating: "y", count: 5000))))
        let unsent = try await raw.nextNonPing()
        #expect(unsent.kind == .reply && unsent.id == 2 && unsent.payload == nil, "a call no node could be asked: no handler")
        // 40 calls of 1 KiB in one write, and their 1 KB answers: batches both ways are cut to fit
        // max_payload, and every call gets its answer.
        let padding = String(repeating: "p", count: 1024)
        try raw.send((UInt32(3)...42).flatMap { (try? Frame.call($0, "big", "size", .list([.int(Int($0)), .string(padding)])).bytes) ?? [] })
        let ok = try StandardMethodCodec().encodeSuccessEnvelope(.string(String(repeating: "a", count: 1000)))
        var sizes: Set<UInt32> = []
        for _ in 3...42 {
            let answer = try await raw.nextNonPing()
            #expect(answer.kind == .reply && answer.payload == ok, "\(answer)")
            sizes.insert(answer.id)
        }
        #expect(sizes == Set(3...42))
        await holder.close()
        await nodes.stop()
    }

    @Test("a holder's answer to a listen and its first event, in one write, reach a listener on another node in that order")
    func listenAnswerBeforeFirstEvent() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(2, nats: nats)
        let holder = try RawConnection(port: nodes.servers[0].port), listener = try RawConnection(port: nodes.servers[1].port)
        try holder.send(Frame(.register, id: 1, channel: "held/e", payload: Array(#"{"kind":"event"}"#.utf8)))
        #expect(try await holder.frame().kind == .reply)
        let codec = StandardMethodCodec()
        var id: UInt32 = 1
        #expect(try await eventually {  // until node 2 reaches the holder: a plain call, answered
            id += 1
            try listener.send(.call(id, "held/e", "x"))
            for call in try await holder.barrier() where call.kind == .message { try holder.send(Frame(.reply, id: call.id, payload: [0])) }
            return try await listener.barrier().contains { $0.kind == .reply && $0.payload == [0] }
        })
        try await Task.sleep(for: .milliseconds(100))  // real time: late answers to earlier probes, however many come
        _ = try await holder.barrier()
        _ = try await listener.barrier()
        try listener.send(.call(50, "held/e", "listen"))
        let listen = try await holder.nextNonPing()
        #expect(try codec.decodeMethodCall(listen.payload).method == "listen")
        var both: [UInt8] = []
        Frame(.reply, id: listen.id, payload: try codec.encodeSuccessEnvelope(.null)).write(to: &both)
        Frame(.message, id: 0, channel: "held/e", payload: try codec.encodeSuccessEnvelope("first")).write(to: &both)
        try holder.send(both)
        #expect(try await listener.nextNonPing() == Frame(.reply, id: 50, payload: try codec.encodeSuccessEnvelope(.null)))
        #expect(try await listener.nextNonPing() == Frame(.message, id: 0, channel: "held/e", payload: try codec.encodeSuccessEnvelope("first")))
        await nodes.stop()
    }

    @Test("listens on a method channel held elsewhere go out together, not one after another")
    func concurrentListensOnAMethodChannel() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(2, nats: nats)
        let holder = try await connect(nodes.servers[0])
        let parked = Parked()
        try await SwitchboardClient.MethodChannel(name: "verbs", client: holder).setMethodCallHandler { call in
            if call.method == "listen" { await parked.park() }
            return .string("did \(call.method)")
        }
        let raw = try RawConnection(port: nodes.servers[1].port)
        #expect(try await eventually {
            try raw.send(.call(1, "verbs", "x"))
            return try await raw.nextNonPing().payload != nil
        })
        for id in UInt32(2)...4 { try raw.send(.call(id, "verbs", "listen")) }
        #expect(try await eventually { parked.count == 3 }, "all three listens reached the holder")
        parked.releaseAll()
        var answered: Set<UInt32> = []
        for _ in 0..<3 { answered.insert(try await raw.nextNonPing().id) }
        #expect(answered == [2, 3, 4])
        await holder.close()
        await nodes.stop()
    }
}
