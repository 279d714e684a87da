#if canImport(Combine)
import Combine
#else
import OpenCombine
#endif
import Logging
import Synchronization
import Testing
import SwitchboardClient
import SwitchboardCodec
import SwitchboardDemo
import SwitchboardPluginAPI
import SwitchboardPlugins
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// A live server for the resumption tests: the demo channels, `numbers` (an event channel the test
/// broadcasts on; its listens are counted), `burst` (sends ``burst`` numbered events on each listen),
/// `count` (answers its argument, an integer or a list that
/// begins with one, and counts each call by it)
/// and `never` (never answers).
final class ResumptionServer: Sendable {
    let server: Server
    let numbers: SwitchboardServer.EventChannel
    let listens = Tally()
    private let sinks = Locked<[EventSink]>([])
    /// Calls to `never` received.
    let waiting = Tally()
    let handled = Locked<[Int: Int]>([:])

    init(_ configure: (inout ServerConfiguration) -> Void = { _ in }, plugins: [any Plugin] = []) throws {
        var config = ServerConfiguration.forTests()
        config.drainTimeoutMs = 300
        configure(&config)
        var logger = Logger(label: "test")
        logger.logLevel = .error
        server = try Server(configuration: config, logger: logger)
        for plugin in plugins { server.load(plugin) }
        server.installDemoChannels()
        numbers = SwitchboardServer.EventChannel(name: "numbers", queueLimit: 1 << 20, server: server)
        let listens = self.listens, handled = self.handled, sinks = self.sinks
        numbers.setStreamHandler(StreamHandlerClosures(onListen: { _, sink in
            listens.add()
            sinks.withLock { $0.append(sink) }
            return nil
        }))
        SwitchboardServer.EventChannel(name: "burst", queueLimit: 1 << 20, server: server)
            .setStreamHandler(StreamHandlerClosures(onListen: { _, sink in
                for n in 0..<Self.burst { sink.success(.int(n)) }
                return nil
            }))
        SwitchboardServer.MethodChannel(name: "count", server: server).setMethodCallHandler { call in
            let n = call.arguments.intValue ?? call.arguments.listValue?.first?.intValue ?? -1
            handled.withLock { $0[n, default: 0] += 1 }
            return .int(n)
        }
        let waiting = self.waiting
        SwitchboardServer.MethodChannel(name: "never", server: server).setMethodCallHandler { _, _ in waiting.add() }
        try server.start()
    }

    var port: Int { server.port }

    /// Events `burst` sends each listener at once.
    static let burst = 5000

    /// Ends every stream of `numbers`.
    func endStreams() {
        for sink in sinks.withLock({ $0 }) { sink.endOfStream() }
    }

    func stop() async {
        server.shutdown()
        await server.waitUntilStopped()
    }
}

/// A client that asks for a resumable session and reconnects at once (1 to 20 ms).
func resumableClient(port: Int, token: String? = nil, bound: Int = 1 << 20, timeout: Duration = .seconds(20)) async throws -> Client {
    var config = ClientConfiguration(port: port, token: token)
    config.requestTimeout = timeout
    config.session = SessionOptions(maxUnacknowledgedBytes: bound)
    config.reconnect = ReconnectPolicy(initialDelay: .milliseconds(1), maximumDelay: .milliseconds(20))
    return try await Client.connect(config)
}

/// A value behind a lock, shared by reference.
final class Locked<Value: Sendable>: Sendable {
    private let value: Mutex<Value>
    init(_ value: Value) { self.value = Mutex(value) }
    func withLock<R: Sendable>(_ body: (inout Value) -> R) -> R { value.withLock { body(&$0) } }
}

/// What a client reported about its session, through the async sequence and the Combine publisher alike.
final class SessionLog: Subscriber, Sendable {
    typealias Input = SessionEvent
    typealias Failure = Never
    private let fromSequence = Locked<[SessionEvent]>([])
    private let fromPublisher = Locked<[SessionEvent]>([])

    init(_ client: Client) {
        let events = client.sessionEvents()
        let fromSequence = self.fromSequence
        Task { for await event in events { fromSequence.withLock { $0.append(event) } } }
        client.sessionEventPublisher.subscribe(self)
    }

    func receive(subscription: any Subscription) { subscription.request(.unlimited) }
    func receive(_ input: SessionEvent) -> Subscribers.Demand {
        fromPublisher.withLock { $0.append(input) }
        return .none
    }
    func receive(completion: Subscribers.Completion<Never>) {}

    var events: [SessionEvent] { fromSequence.withLock { $0 } }
    var published: [SessionEvent] { fromPublisher.withLock { $0 } }

    /// Waits until a report other than `resumed` arrives, and returns it.
    func firstNotResumed() async throws -> SessionEvent? {
        _ = try await eventually(5) { events.contains { $0 != .resumed } }
        return events.first { $0 != .resumed }
    }
}

/// The events a stream collected, in order.
final class Collected: Sendable {
    private let values = Mutex<[Int]>([])
    func add(_ value: Int) { values.withLock { $0.append(value) } }
    var all: [Int] { values.withLock { $0 } }
}

/// Resumable sessions from the Swift client (protocol/resumption.md), through a proxy that cuts
/// connections at random byte offsets (seeded: the seed is in every failure's message).
@Suite struct ResumptionTests {
    /// Numbered events broadcast while the connection is cut again and again arrive once each, in order,
    /// and the stream is listened to once: every loss was resumed.
    @Test func numberedEventsArriveGapFreeWithoutDuplicatesThroughCuts() async throws {
        let server = try ResumptionServer()
        let proxy = try CuttingProxy(to: server.port, cuts: 25, budget: 64...3000)
        let client = try await resumableClient(port: proxy.port)
        let log = SessionLog(client)
        let received = Collected()
        let listening = Task {
            for try await value in SwitchboardClient.EventChannel(name: "numbers", client: client).receiveBroadcastStream() {
                received.add(value.intValue ?? -1)
            }
        }
        #expect(try await eventually { server.listens.value == 1 }, "seed \(proxy.seed)")
        let total = 3000
        for batch in stride(from: 0, to: total, by: 100) {
            for n in batch..<batch + 100 { server.numbers.broadcast(.int(n)) }
            // A call through the cut connections paces the broadcasts over them.
            _ = try await MethodChannel(name: "count", client: client).invokeMethod("count", arguments: .int(batch))
        }
        #expect(try await eventually { received.all.count >= total }, "seed \(proxy.seed)")
        #expect(received.all == Array(0..<total), "seed \(proxy.seed)")
        #expect(proxy.cuts > 0 && server.listens.value == 1, "seed \(proxy.seed)")
        #expect(!log.events.isEmpty && log.events.allSatisfy { $0 == .resumed }, "seed \(proxy.seed): \(log.events)")
        listening.cancel()
        await client.close()
        proxy.stop()
        await server.stop()
    }

    /// A consumer of `receiveBroadcastStream` that falls behind misses nothing: the stream asks for
    /// events as it consumes them (DEMAND credit), so the server holds them back instead of the client
    /// dropping the oldest.
    @Test func slowConsumerOfTheAsyncStreamMissesNothing() async throws {
        let server = try ResumptionServer()
        let client = try await resumableClient(port: server.port)
        var events = SwitchboardClient.EventChannel(name: "burst", client: client).receiveBroadcastStream().makeAsyncIterator()
        try await client.ping()  // its PONG follows all the events the server sends before more credit
        var received: [Int] = []
        while received.last != ResumptionServer.burst - 1, let value = try await events.next() { received.append(value.intValue ?? -1) }
        #expect(received == Array(0..<ResumptionServer.burst))
        await client.close()
        await server.stop()
    }

    /// A paced stream (the Combine publisher: DEMAND credit) goes on across cuts with its credit: every
    /// event arrives once, in order, and the session events come through the publisher too.
    @Test func pacedPublisherKeepsItsCreditAcrossCuts() async throws {
        let server = try ResumptionServer()
        let proxy = try CuttingProxy(to: server.port, cuts: 15, budget: 64...2000)
        let client = try await resumableClient(port: proxy.port)
        let log = SessionLog(client)
        let received = Collected()
        let subscriber = PacedSubscriber(received)
        SwitchboardClient.EventChannel(name: "numbers", client: client).publisher().subscribe(subscriber)
        #expect(try await eventually { server.listens.value == 1 }, "seed \(proxy.seed)")
        let total = 1500
        for batch in stride(from: 0, to: total, by: 100) {
            for n in batch..<batch + 100 { server.numbers.broadcast(.int(n)) }
            _ = try await MethodChannel(name: "count", client: client).invokeMethod("count", arguments: .int(batch))
        }
        #expect(try await eventually { received.all.count >= total }, "seed \(proxy.seed)")
        #expect(received.all == Array(0..<total), "seed \(proxy.seed)")
        #expect(try await eventually { log.published == log.events }, "seed \(proxy.seed)")
        #expect(!log.published.isEmpty && log.published.allSatisfy { $0 == .resumed }, "seed \(proxy.seed)")
        subscriber.cancel()
        await client.close()
        proxy.stop()
        await server.stop()
    }

    /// Calls in flight when connections are cut each get exactly one answer, their own, and the server
    /// ran each exactly once. The calls' 120 KB make the server acknowledge them (POSITION) meanwhile.
    @Test func callsInFlightAtACutGetExactlyOneRealAnswer() async throws {
        let server = try ResumptionServer()
        let proxy = try CuttingProxy(to: server.port, cuts: 20, budget: 64...16000)
        let client = try await resumableClient(port: proxy.port)
        let log = SessionLog(client)
        let calls = 400
        let padding = ChannelValue.string(String(repeating: "p", count: 300))
        let answers = try await withThrowingTaskGroup(of: (Int, ChannelValue).self) { group in
            for n in 0..<calls {
                group.addTask { (n, try await MethodChannel(name: "count", client: client).invokeMethod("count", arguments: [.int(n), padding])) }
            }
            var answers: [Int: ChannelValue] = [:]
            for try await (n, answer) in group { answers[n] = answer }
            return answers
        }
        #expect(answers.count == calls && answers.allSatisfy { $0.value.intValue == $0.key }, "seed \(proxy.seed)")
        #expect(server.handled.withLock { $0 } == Dictionary(uniqueKeysWithValues: (0..<calls).map { ($0, 1) }), "seed \(proxy.seed)")
        #expect(proxy.cuts > 0 && log.events.allSatisfy { $0 == .resumed }, "seed \(proxy.seed): \(log.events)")
        await client.close()
        proxy.stop()
        await server.stop()
    }

    /// A client that sends more than its bound goes on only as the server's POSITIONs free its buffer,
    /// and resumes after them: a POSITION is not in the server's stream.
    @Test func acknowledgementsFreeTheBufferAndAreNotInTheStream() async throws {
        let server = try ResumptionServer()
        let proxy = try CuttingProxy(to: server.port, cuts: 3, budget: 150_000...200_000)
        let client = try await resumableClient(port: proxy.port, bound: 96 * 1024)
        let log = SessionLog(client)
        let calls = 400
        let padding = ChannelValue.string(String(repeating: "p", count: 1000))
        let answered = try await withThrowingTaskGroup(of: Int?.self) { group in
            for n in 0..<calls {
                group.addTask { try await MethodChannel(name: "count", client: client).invokeMethod("count", arguments: [.int(n), padding]).intValue }
            }
            var answered = 0
            for try await answer in group where answer != nil { answered += 1 }
            return answered
        }
        #expect(answered == calls, "seed \(proxy.seed)")
        #expect(server.handled.withLock { $0 } == Dictionary(uniqueKeysWithValues: (0..<calls).map { ($0, 1) }), "seed \(proxy.seed)")
        #expect(proxy.cuts > 0 && log.events.allSatisfy { $0 == .resumed }, "seed \(proxy.seed): \(log.events)")
        await client.close()
        proxy.stop()
        await server.stop()
    }

    /// The client acknowledges what it received (POSITION, here after `ackMs`), and the server forgets
    /// what it kept for it.
    @Test func clientAcknowledgesWhatItReceived() async throws {
        let server = try ResumptionServer()
        let reader = try await connect(server.server)
        let client = try await resumableClient(port: server.port)
        let (received, listening) = try await listenToNumbers(client, server, listens: 1)
        for n in 0..<100 { server.numbers.broadcast(.int(n)) }
        #expect(try await eventually { received.all.count == 100 })
        #expect(try await stats(reader)["sessions"]?["bufferedBytes"]?.intValue ?? 0 > 0)
        #expect(try await eventually { try await stats(reader)["sessions"]?["bufferedBytes"] == 0 })
        listening.cancel()
        await client.close()
        await reader.close()
        await server.stop()
    }

    /// A client that closes ends its session (END): the server parks nothing for it.
    @Test func closingEndsTheSession() async throws {
        let server = try ResumptionServer()
        let reader = try await connect(server.server)
        let client = try await resumableClient(port: server.port)
        #expect(try await MethodChannel(name: "count", client: client).invokeMethod("count", arguments: 1).intValue == 1)
        await client.close()
        #expect(try await eventually { try await stats(reader)["sessions"]?["ended"]?["end"] == 1 })
        #expect(try await stats(reader)["sessions"]?["parked"] == 0)
        await reader.close()
        await server.stop()
    }

    /// A holder cut while it works on a forwarded request answers after resuming, and the caller gets
    /// that answer; a request forwarded while it is away reaches it once it is back.
    @Test func holderCutMidRequestAnswersAfterResuming() async throws {
        let server = try ResumptionServer()
        let proxy = try CuttingProxy(to: server.port)
        let holder = try await resumableClient(port: proxy.port)
        let log = SessionLog(holder)
        let started = Collected(), gate = Cell<Bool>()
        try await MethodChannel(name: "held/work", client: holder).setMethodCallHandler { call in
            started.add(call.arguments.intValue ?? -1)
            _ = try await gate.wait(.seconds(10))
            return .string("done \(call.arguments.intValue ?? -1)")
        }
        let caller = try await connect(server.server)
        let work = MethodChannel(name: "held/work", client: caller)
        let first = Task { try await work.invokeMethod("work", arguments: 1) }
        #expect(try await eventually { started.all == [1] })
        proxy.stallToServer(true)  // the holder stays away: its reconnects wait before their HELLO
        proxy.cutAll()
        gate.set(true)  // it answers while its connection is lost
        let second = Task { try await work.invokeMethod("work", arguments: 2) }
        #expect(try await eventually { holder.state != .connected })
        proxy.stallToServer(false)
        #expect(try await first.value == "done 1")
        #expect(try await second.value == "done 2")
        #expect(started.all == [1, 2])
        #expect(try await eventually { log.events == [.resumed] })
        await caller.close()
        await holder.close()
        proxy.stop()
        await server.stop()
    }

    /// A session that expired while the client was away: the server answers `cannot_resume` `expired`,
    /// and the client falls back: the call it had written fails with `session_lost`, it makes a new
    /// session, holds its channel and listens again, and reports what may be lost.
    @Test func expiredSessionFallsBackAndReports() async throws {
        // The server remembers why a session ended for one time to live: time enough for the HELLO.
        let server = try ResumptionServer { $0.sessionTTLMs = 1000 }
        let reader = try await connect(server.server)
        let proxy = try CuttingProxy(to: server.port)
        let client = try await resumableClient(port: proxy.port)
        let log = SessionLog(client)
        let (received, listening) = try await listenToNumbers(client, server, listens: 1)
        try await MethodChannel(name: "held/x", client: client).setMethodCallHandler { _ in "x" }
        let lost = Task { try await MethodChannel(name: "never", client: client).invokeMethod("wait") }
        #expect(try await eventually { server.waiting.value == 1 })
        proxy.stallToServer(true)
        proxy.cutAll()
        #expect(try await eventually { try await stats(reader)["sessions"]?["ended"]?["expired"] == 1 })
        proxy.stallToServer(false)  // the client's resuming HELLO arrives after the session expired
        await #expect(throws: ClientError.sessionLost) { try await lost.value }
        let report = try await log.firstNotResumed()
        #expect(report == .restarted(SessionRestart(reason: "expired", streams: ["numbers"], channels: ["held/x"], failedRequests: ["never"])))
        try await expectWorksAgain(client, server, received, listens: 2)
        listening.cancel()
        await client.close()
        await reader.close()
        proxy.stop()
        await server.stop()
    }

    /// No connection within the time to live and one more try: the client gives up by itself (reason
    /// `expired`, its own), fails the call it had written, and starts a new session once it can connect.
    @Test func clientGivesUpAfterTheTimeToLive() async throws {
        let server = try ResumptionServer { $0.sessionTTLMs = 100 }
        let proxy = try CuttingProxy(to: server.port)
        let client = try await resumableClient(port: proxy.port)
        let log = SessionLog(client)
        let (received, listening) = try await listenToNumbers(client, server, listens: 1)
        let lost = Task { try await MethodChannel(name: "never", client: client).invokeMethod("wait") }
        #expect(try await eventually { server.waiting.value == 1 })
        proxy.refuseNew(true)
        proxy.cutAll()
        await #expect(throws: ClientError.sessionLost) { try await lost.value }
        proxy.refuseNew(false)
        let report = try await log.firstNotResumed()
        #expect(report == .restarted(SessionRestart(reason: "expired", streams: ["numbers"], channels: [], failedRequests: ["never"])))
        try await expectWorksAgain(client, server, received, listens: 2)
        listening.cancel()
        await client.close()
        proxy.stop()
        await server.stop()
    }

    /// A resuming HELLO answered by a WELCOME without `session` (a server without the extension): the
    /// client falls back with reason `unsupported` on that connection and goes on without a session.
    @Test func welcomeWithoutSessionFallsBackAsUnsupported() async throws {
        let server = try ResumptionServer()
        let old = try ScriptedServer(answer: [Frame(.welcome, id: 1, payload: Array(#"{"version":1,"server":"old"}"#.utf8))])
        let proxy = try CuttingProxy(to: server.port)
        let client = try await resumableClient(port: proxy.port)
        let log = SessionLog(client)
        let (_, listening) = try await listenToNumbers(client, server, listens: 1)
        proxy.retarget(to: old.port)
        proxy.cutAll()
        let report = try await log.firstNotResumed()
        #expect(report == .restarted(SessionRestart(reason: "unsupported", streams: ["numbers"], channels: [], failedRequests: [])))
        #expect(client.state == .connected)
        listening.cancel()
        await client.close()
        proxy.stop()
        old.stop()
        await server.stop()
    }

    /// protocol/resumption.md: a server started with `--session-ttl 0` answers as a server without
    /// sessions, with a WELCOME without `session`, which a resuming client reads as `unsupported`.
    @Test func serverWithoutSessionsAnswersAResumeWithAPlainWelcome() async throws {
        let first = try ResumptionServer(), second = try ResumptionServer { $0.sessionTTLMs = 0 }
        let proxy = try CuttingProxy(to: first.port)
        let client = try await resumableClient(port: proxy.port)
        let log = SessionLog(client)
        #expect(try await MethodChannel(name: "count", client: client).invokeMethod("count", arguments: 1).intValue == 1)
        proxy.retarget(to: second.port)
        proxy.cutAll()
        guard case .restarted(let restart)? = try await log.firstNotResumed() else { Issue.record("no restart"); return }
        #expect(restart.reason == "unsupported")
        await client.close()
        proxy.stop()
        await first.stop()
        await second.stop()
    }

    /// The server ends the session (END): the client reports `ended` with the reason and its streams,
    /// and the connection goes on.
    @Test func serverEndIsReportedAsEnded() async throws {
        let welcome = #"{"version":1,"session":{"token":"t","resumed":false,"position":0,"ttlMs":60000,"ackBytes":65536,"ackMs":1000}}"#
        let server = try ScriptedServer(answer: [Frame(.welcome, id: 1, payload: Array(welcome.utf8))],
                                        then: [Frame(.end, payload: Array(#"{"reason":"overflowed"}"#.utf8))])
        let client = try await resumableClient(port: server.port)
        let log = SessionLog(client)
        client.post(channel: "anything", payload: nil)  // the server ends the session once this arrives
        #expect(try await eventually { log.events == [.ended(reason: "overflowed", streams: [])] })
        #expect(try await eventually { log.published == log.events })
        #expect(client.state == .connected)
        await client.close()
        server.stop()
    }

    /// A token this server does not have (the connection lands on another server): `cannot_resume`,
    /// and the client falls back on the same connection and reports it.
    @Test func unknownTokenFallsBackAndReports() async throws {
        let first = try ResumptionServer(), second = try ResumptionServer()
        let proxy = try CuttingProxy(to: first.port)
        let client = try await resumableClient(port: proxy.port)
        let log = SessionLog(client)
        let (received, listening) = try await listenToNumbers(client, first, listens: 1)
        let lost = Task { try await MethodChannel(name: "never", client: client).invokeMethod("wait") }
        #expect(try await eventually { first.waiting.value == 1 })
        proxy.retarget(to: second.port)
        proxy.cutAll()
        await #expect(throws: ClientError.sessionLost) { try await lost.value }
        let report = try #require(try await log.firstNotResumed())
        guard case .restarted(let restart) = report else { Issue.record("\(report)"); return }
        #expect(["unknown", "restarted"].contains(restart.reason), "\(restart.reason)")
        #expect(restart.streams == ["numbers"] && restart.failedRequests == ["never"] && restart.channels.isEmpty)
        try await expectWorksAgain(client, second, received, listens: 1)
        listening.cancel()
        await client.close()
        proxy.stop()
        await first.stop()
        await second.stop()
    }

    /// A connection of the client's own that was cut before its resuming HELLO was answered, whose HELLO
    /// reaches the server late (after the next connection resumed), takes the session over: the client
    /// resumes again rather than give its session up as `taken`, and its call gets its real answer.
    @Test func lateResumingHelloOfTheClientsOwnIsNotATheft() async throws {
        let server = try ResumptionServer()
        let proxy = try CuttingProxy(to: server.port)
        let client = try await resumableClient(port: proxy.port)
        let log = SessionLog(client)
        proxy.holdNew(true)
        proxy.cutAll()
        #expect(try await eventually { proxy.bytesFromClient(1) > 0 })  // connection 1's resuming HELLO, held
        proxy.holdNew(false)
        proxy.hangUpClient(1)
        #expect(try await eventually { log.events == [.resumed] })  // on connection 2
        let call = Task { try await MethodChannel(name: "count", client: client).invokeMethod("count", arguments: 5) }
        #expect(try await eventually { server.handled.withLock { $0[5] } == 1 })
        proxy.release(1)  // the late HELLO takes the session from connection 2
        #expect(try await call.value.intValue == 5)
        #expect(try await eventually { log.events == [.resumed, .resumed] }, "\(log.events)")
        await client.close()
        proxy.stop()
        await server.stop()
    }

    /// A resuming connection whose HELLO is never answered (the network died right after the connect)
    /// is given up after the request timeout, and the next connection resumes.
    @Test func unansweredHelloIsGivenUpAndTheNextConnectionResumes() async throws {
        let server = try ResumptionServer()
        let proxy = try CuttingProxy(to: server.port)
        let client = try await resumableClient(port: proxy.port, timeout: .milliseconds(300))
        let log = SessionLog(client)
        proxy.holdNew(true)
        proxy.cutAll()
        #expect(try await eventually { proxy.bytesFromClient(1) > 0 })  // connection 1's HELLO, held for good
        proxy.holdNew(false)
        #expect(try await eventually { log.events == [.resumed] })
        // The call waits as long as calls of the other tests: the 300 ms is for HELLOs, and a loaded machine
        // (a CI run, tests in parallel) took longer than that to answer it.
        let answer = try await MethodChannel(name: "count", client: client).invokeMethod("count", arguments: 3, timeout: .seconds(20))
        #expect(answer.intValue == 3)
        await client.close()
        proxy.stop()
        await server.stop()
    }

    /// A stolen token (read off the wire) is refused to another user and to an anonymous connection,
    /// leaving the session as it was; presented with the owner's credentials it takes the session over,
    /// and the owner's client reports `taken`.
    @Test func tokenOfAnotherUserIsRefused() async throws {
        let access = PluginConfiguration.plugins(reading: LiveSettings(PluginConfiguration(access: accessRules())))
        let server = try ResumptionServer(plugins: access)
        let proxy = try CuttingProxy(to: server.port)
        let client = try await resumableClient(port: proxy.port, token: "alice-token")
        let log = SessionLog(client)
        let echo = MethodChannel(name: "switchboard/echo", client: client)
        #expect(try await echo.invokeMethod("echo", arguments: 1).intValue == 1)
        #expect(try await eventually { (try? sniffedSession(proxy))?.frames ?? 0 >= 2 })  // the WELCOME and the answer
        let (token, position, _) = try sniffedSession(proxy)
        for credentials in [#""token":"bob-token","#, ""] {
            let thief = try #require(RawSocket(port: server.port))
            thief.send(Frame(.hello, id: 1, payload: Array(#"{"version":1,\#(credentials)"session":{"token":"\#(token)","position":\#(position)}}"#.utf8)).bytes)
            let answer = try #require(try readFrame(thief))
            let reason = try JSONText.parse(answer.payload ?? [])["details"]?["reason"]?.stringValue
            #expect(answer.errorCode == "cannot_resume" && reason == "unknown", "\(credentials)")
        }
        #expect(try await echo.invokeMethod("echo", arguments: 2).intValue == 2)
        #expect(log.events.isEmpty)
        // The position now: the client may have acknowledged past the one above meanwhile (its timer
        // acknowledges within ackMs; a loaded machine took that long), and the server keeps nothing before it.
        let now = try sniffedSession(proxy).position
        let owner = try #require(RawSocket(port: server.port))
        owner.send(Frame(.hello, id: 1, payload: Array(#"{"version":1,"token":"alice-token","session":{"token":"\#(token)","position":\#(now)}}"#.utf8)).bytes)
        let welcome = try #require(try readFrame(owner))
        #expect(try JSONText.parse(welcome.payload ?? [])["session"]?["resumed"] == .bool(true))
        let report = try await log.firstNotResumed()
        #expect(report == .restarted(SessionRestart(reason: "taken", streams: [], channels: [], failedRequests: [])))
        #expect(try await echo.invokeMethod("echo", arguments: 3).intValue == 3)  // on a new session
        await client.close()
        proxy.stop()
        await server.stop()
    }

    /// A fast producer whose writes the server does not acknowledge (its POSITIONs are held back) sends
    /// no more than the bound past what was acknowledged, holds the rest back, and drops nothing: once
    /// acknowledgements flow, every call is answered and the server ran each once.
    @Test func bufferBoundHoldsUnderAFastProducer() async throws {
        let server = try ResumptionServer()
        let proxy = try CuttingProxy(to: server.port)
        let bound = 8192
        let client = try await resumableClient(port: proxy.port, bound: bound)
        let afterHandshake = proxy.bytesToServer
        proxy.stallToClient(true)  // neither answers nor POSITIONs reach the client
        let calls = 600
        let answers = Task {
            try await withThrowingTaskGroup(of: Int?.self) { group in
                for n in 0..<calls {
                    group.addTask { try await MethodChannel(name: "count", client: client).invokeMethod("count", arguments: .int(n)).intValue }
                }
                var answered = 0
                for try await answer in group where answer != nil { answered += 1 }
                return answered
            }
        }
        // Each call is one frame of about 30 bytes: the bound lets about 270 go, then holds the rest.
        #expect(try await eventually { server.handled.withLock { $0.count } >= bound / 40 })
        #expect(try await eventually { proxy.bytesToServer - afterHandshake > bound - 64 })
        #expect(proxy.bytesToServer - afterHandshake <= bound)
        #expect(server.handled.withLock { $0.count } < calls)
        proxy.stallToClient(false)
        #expect(try await answers.value == calls)
        #expect(server.handled.withLock { $0 } == Dictionary(uniqueKeysWithValues: (0..<calls).map { ($0, 1) }))
        await client.close()
        proxy.stop()
        await server.stop()
    }

    /// A fast producer while the client is away cannot grow its session past `--session-bytes`: the
    /// server ends it (`overflowed`), and the client, told so when it comes back, falls back and says
    /// which stream may have missed events.
    @Test func sessionBoundHoldsUnderAFastProducerWhileParked() async throws {
        let server = try ResumptionServer { $0.sessionBytes = 32 * 1024 }
        let reader = try await connect(server.server)
        let proxy = try CuttingProxy(to: server.port)
        let client = try await resumableClient(port: proxy.port)
        let log = SessionLog(client)
        let (received, listening) = try await listenToNumbers(client, server, listens: 1)
        proxy.stallToServer(true)
        proxy.cutAll()
        // The stream's credit (EventStream.window, 1,024) lets about 110 KB of these into the session.
        let event = ChannelValue.string(String(repeating: "x", count: 100))
        for _ in 0..<2000 { server.numbers.broadcast(event) }
        #expect(try await eventually { try await stats(reader)["sessions"]?["ended"]?["overflowed"] == 1 })
        #expect(try await stats(reader)["sessions"]?["bufferedBytes"]?.intValue ?? .max <= 32 * 1024)
        proxy.stallToServer(false)
        let report = try await log.firstNotResumed()
        #expect(report == .restarted(SessionRestart(reason: "overflowed", streams: ["numbers"], channels: [], failedRequests: [])))
        try await expectWorksAgain(client, server, received, listens: 2)
        listening.cancel()
        await client.close()
        await reader.close()
        proxy.stop()
        await server.stop()
    }

    /// docs/clients.md's example, run: the stream goes on across a session that could not be resumed,
    /// and the report names it.
    @Test func documentedExampleRuns() async throws {
        let first = try ResumptionServer(), second = try ResumptionServer()
        let proxy = try CuttingProxy(to: first.port)
        let (host, port) = ("127.0.0.1", proxy.port)
        let refreshed = Locked<[String]>([]), shown = Collected()
        @Sendable func refresh(_ channel: String) async { refreshed.withLock { $0.append(channel) } }
        @Sendable func show(_ number: ChannelValue) { shown.add(number.intValue ?? -1) }
        let script = Task { () async throws in
            #expect(try await eventually { first.listens.value == 1 })
            first.numbers.broadcast(1)
            #expect(try await eventually { shown.all == [1] })
            proxy.retarget(to: second.port)  // the server "restarted"
            proxy.cutAll()
            #expect(try await eventually { second.listens.value == 1 })
            second.numbers.broadcast(2)
            #expect(try await eventually { shown.all == [1, 2] })
            second.endStreams()
        }

        var configuration = ClientConfiguration(host: host, port: port, token: "app-secret")
        configuration.session = SessionOptions()
        let client = try await Client.connect(configuration)
        Task {
            for await event in client.sessionEvents() {
                if case .restarted(let restart) = event {
                    // Events of these streams may be missing: fetch what changed meanwhile.
                    for channel in restart.streams { await refresh(channel) }
                }
            }
        }
        for try await number in EventChannel(name: "numbers", client: client).receiveBroadcastStream() {
            show(number)  // no gap while the session resumes
        }

        try await script.value
        #expect(try await eventually { refreshed.withLock { $0 } == ["numbers"] })
        await client.close()
        proxy.stop()
        await first.stop()
        await second.stop()
    }

    // MARK: Helpers

    /// Listens to `numbers` and waits until the server has `listens` listens.
    private func listenToNumbers(_ client: Client, _ server: ResumptionServer, listens: Int) async throws -> (Collected, Task<Void, any Error>) {
        let received = Collected()
        let listening = Task {
            for try await value in SwitchboardClient.EventChannel(name: "numbers", client: client).receiveBroadcastStream() {
                received.add(value.intValue ?? -1)
            }
        }
        #expect(try await eventually { server.listens.value == listens })
        return (received, listening)
    }

    /// After a restart, the stream is listened to again and calls work.
    private func expectWorksAgain(_ client: Client, _ server: ResumptionServer, _ received: Collected, listens: Int) async throws {
        #expect(try await eventually { server.listens.value == listens })
        server.numbers.broadcast(42)
        #expect(try await eventually { received.all.last == 42 })
        #expect(try await MethodChannel(name: "count", client: client).invokeMethod("count", arguments: 7).intValue == 7)
    }

    /// The server's `switchboard/stats`, read by `reader` (a plain client of the server's own).
    private func stats(_ reader: Client) async throws -> ChannelValue {
        try await MethodChannel(name: "switchboard/stats", client: reader).invokeMethod("get")
    }

    /// The session token of the proxy's first connection, from its WELCOME, and the position of a client
    /// that received everything the server sent on it.
    private func sniffedSession(_ proxy: CuttingProxy) throws -> (token: String, position: UInt64, frames: Int) {
        var buffer = InboundBuffer()
        buffer.append(try #require(proxy.firstBytesFromServer.first))
        var decoder = FrameDecoder(maxFrame: 1 << 24)
        guard case .frame(let welcome)? = try decoder.next(from: &buffer) else { throw ClientError.badReply("no WELCOME") }
        let token = try #require(try JSONText.parse(welcome.payload ?? [])["session"]?["token"]?.stringValue)
        var position: UInt64 = 0, frames = 1
        while case .frame(let frame)? = try decoder.next(from: &buffer) {
            frames += 1
            if frame.kind != .position { position += UInt64(frame.bytes.count) }
        }
        return (token, position, frames)
    }

    private func readFrame(_ socket: RawSocket) throws -> Frame? {
        var buffer = InboundBuffer()
        var decoder = FrameDecoder(maxFrame: 1 << 24)
        while true {
            if case .frame(let frame)? = try decoder.next(from: &buffer) { return frame }
            let bytes = socket.read()
            if bytes.isEmpty { return nil }
            buffer.append(bytes)
        }
    }
}

/// Requests one event at a time, after the first 16: a paced (DEMAND) stream.
final class PacedSubscriber: Subscriber, Sendable {
    typealias Input = ChannelValue
    typealias Failure = any Error
    private let received: Collected
    private let subscription = SubscriptionHolder()

    init(_ received: Collected) { self.received = received }

    func receive(subscription: any Subscription) {
        self.subscription.set(subscription)
        subscription.request(.max(16))
    }

    func receive(_ input: ChannelValue) -> Subscribers.Demand {
        received.add(input.intValue ?? -1)
        return .max(1)
    }

    func receive(completion: Subscribers.Completion<any Error>) {}

    func cancel() { subscription.current?.cancel() }
}
