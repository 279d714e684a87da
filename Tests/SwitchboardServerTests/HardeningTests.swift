#if canImport(Glibc)
import Glibc
#endif
import Testing
import SwitchboardCodec
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport
import SwitchboardWire

/// The defects of the hardening review, each driven through the in-memory transport where it can be
/// (deterministic, no sockets), through real sockets where the defect lives in the socket layer.
@Suite struct Hardening {
    // MARK: Backpressure

    /// A client that sends many large calls and never reads: the server stops reading once its
    /// pending output reaches the outbound limit, so what it holds stays near the limit instead of
    /// growing with everything the client sends; reading resumes as the client reads.
    @Test func inputPausesWhileOutputIsOverTheLimit() throws {
        var config = ServerConfiguration()
        config.outboundLimit = 64 * 1024
        config.slowConsumerGraceMs = 60_000
        let embedded = try EmbeddedServer(configuration: config)
        let peer = embedded.connect()
        peer.peerWindow = 0  // reads nothing: every byte written stays queued
        let argument = ChannelValue.uint8List([UInt8](repeating: 7, count: 16 * 1024))
        for id in 1...400 { peer.send(try .call(UInt32(id), "switchboard/echo", "echo", argument)) }
        embedded.run()
        #expect(peer.isReadingPaused)
        let held = peer.unreadCount
        #expect(held >= config.outboundLimit && held < config.outboundLimit + 2 * 17 * 1024)

        var answered = Set<UInt32>()
        peer.peerWindow = .max
        #expect(embedded.run(until: {
            for frame in (try? peer.frames()) ?? [] where frame.kind == .reply { answered.insert(frame.id) }
            return answered.count == 400
        }))
        #expect(!peer.isReadingPaused)
    }

    /// Requests a handler has not answered count too: at `maxOpenRequests` the server stops reading,
    /// and resumes as answers go out.
    @Test func inputPausesAtTheOpenRequestLimit() throws {
        var config = ServerConfiguration()
        config.maxOpenRequests = 8
        let embedded = try EmbeddedServer(configuration: config)
        let results = Handoff<[MethodResult]>()
        results.put([])
        MethodChannel(name: "held", server: embedded.server).setMethodCallHandler { _, result in
            results.put((results.value ?? []) + [result])  // loop thread only: no race
        }
        embedded.run()
        let peer = embedded.connect()
        for id in 1...20 { peer.send(try .call(UInt32(id), "held", "wait")) }
        embedded.run()
        #expect(results.value?.count == 8)
        #expect(peer.isReadingPaused)
        for result in results.value ?? [] { result.success(.null) }
        embedded.run(turns: 4)
        #expect(results.value?.count == 16)
        #expect(try peer.frames().filter { $0.kind == .reply }.count == 8)
    }

    // MARK: Producer threads

    /// Broadcasts from a thread faster than the loop wait in a queue bounded by the channel's queue
    /// length, under its overflow policy; the drops are counted.
    @Test func broadcastsFromAnotherThreadAreBoundedAndCounted() throws {
        let embedded = try EmbeddedServer()
        let channel = EventChannel(name: "fast", overflow: .dropOldest, queueLimit: 16, server: embedded.server)
        channel.setStreamHandler(StreamHandlerClosures(onListen: { _, _ in nil }))
        embedded.run()
        let listener = embedded.connect()
        listener.send(try .call(1, "fast", "listen"))
        embedded.run()
        #expect(try listener.frames().map(\.kind) == [.reply])

        onAnotherThread { for n in 0..<1000 { channel.broadcast(.int(n)) } }
        embedded.run()
        let events = try listener.frames().map { try $0.envelope().get() }
        #expect(events == (984..<1000).map { .int($0) })  // the newest 16
        let stats = try listener.stats(on: embedded)
        #expect(stats["eventsDropped"]?["producerQueueFull"] == 984)
    }

    /// The same bound applies to one listener's sink used from another thread.
    @Test func sinkEventsFromAnotherThreadAreBoundedAndCounted() throws {
        let embedded = try EmbeddedServer()
        let sinks = Handoff<EventSink>()
        EventChannel(name: "own", overflow: .dropNewest, queueLimit: 4, server: embedded.server)
            .setStreamHandler(StreamHandlerClosures(onListen: { _, sink in sinks.put(sink); return nil }))
        embedded.run()
        let listener = embedded.connect()
        listener.send(try .call(1, "own", "listen"))
        embedded.run()
        _ = try listener.frames()
        let sink = try #require(sinks.value)
        onAnotherThread { for n in 0..<100 { sink.success(.int(n)) } }
        embedded.run()
        #expect(try listener.frames().map { try $0.envelope().get() } == [0, 1, 2, 3])
        #expect(try listener.stats(on: embedded)["eventsDropped"]?["producerQueueFull"] == 96)
    }

    // MARK: Lifetimes

    /// A server that ran and stopped frees its core and loop, although its handlers capture it.
    @Test func aStoppedServerIsFreed() async throws {
        weak var core: ServerCore?
        weak var loop: EventLoop?
        do {
            var config = ServerConfiguration()
            config.port = 0
            let server = try Server(configuration: config)
            server.installDemoChannels()
            let channel = MethodChannel(name: "self", server: server)
            channel.setMethodCallHandler { _, result in  // captures the channel, so the server
                result.success(.string(channel.name))
            }
            core = server.core.value
            loop = server.core.value.eventLoop
            let port = try server.start()
            let wire = try RawConnection(port: port)
            try wire.send(.call(1, "self", "x"))
            #expect(try await wire.frame().kind == .reply)
            try wire.send(.call(2, "switchboard/ticker", "listen", .stringMap(["intervalMs": 10])))
            #expect(try await wire.frame().kind == .reply)
            server.shutdown()
            await server.waitUntilStopped()
        }
        #expect(core == nil)
        #expect(loop == nil)
    }

    /// A server that could not start (its port is taken) gives back every file descriptor.
    @Test func failedStartsLeakNoFileDescriptors() throws {
        var config = ServerConfiguration()
        config.port = 0
        let holder = try Server(configuration: config)
        config.port = try holder.start()
        defer { holder.shutdown() }
        func openDescriptors() -> Int {
            (0..<4096).filter { fcntl(Int32($0), F_GETFD) != -1 }.count
        }
        _ = try? Server(configuration: config).run()  // warm up whatever is made once per process
        let before = openDescriptors()
        for _ in 0..<20 {
            let server = try Server(configuration: config)
            server.installDemoChannels()
            #expect(throws: UVError.self) { try server.run() }
        }
        #expect(openDescriptors() == before)
    }

    /// Once a loop has finished, no thread is its thread, although thread ids get reused.
    @Test func aFinishedLoopHasNoThread() async throws {
        let eventLoop = try EventLoop()
        let handle = eventLoop.handle, loop = LoopBound(eventLoop, loop: handle)
        let done = AtomicCounter()
        startThread {
            loop.value.run()
            done.increment()
        }
        handle.execute { loop.value.stop() }
        while done.value == 0 { try await Task.sleep(for: .milliseconds(5)) }
        let claims = AtomicCounter()
        for _ in 0..<20 {
            let checked = AtomicCounter()
            startThread {
                if handle.isInLoopThread { claims.increment() }
                checked.increment()
            }
            while checked.value == 0 { try await Task.sleep(for: .milliseconds(1)) }
        }
        #expect(claims.value == 0)
        #expect(!handle.execute {})
    }

    /// Every job `execute` accepted runs, even when it races the loop's stop: `true` means it runs.
    @Test func everyAcceptedJobRuns() async throws {
        for _ in 0..<50 {
            let eventLoop = try EventLoop()
            let handle = eventLoop.handle, loop = LoopBound(eventLoop, loop: handle)
            let accepted = AtomicCounter(), ran = AtomicCounter(), finished = AtomicCounter()
            startThread {
                loop.value.run()
                finished.increment()
            }
            let posters = (0..<4).map { _ in
                Task.detached {
                    for _ in 0..<2000 {
                        if handle.execute({ ran.increment() }) { accepted.increment() } else { break }
                    }
                }
            }
            try await Task.sleep(for: .microseconds(200))
            handle.execute { loop.value.stop() }
            for poster in posters { await poster.value }
            while finished.value == 0 { try await Task.sleep(for: .milliseconds(1)) }
            #expect(ran.value == accepted.value)
        }
    }

    // MARK: Shutdown

    /// The drain ends as soon as the last in-flight request is answered, even while other output
    /// keeps the loop kicking every turn (the kick once replaced the drain's callback).
    @Test func drainEndsWhenTheLastRequestIsAnsweredDespiteBusyOutput() throws {
        var config = ServerConfiguration()
        config.drainTimeoutMs = 60_000
        let embedded = try EmbeddedServer(configuration: config)
        let held = Handoff<MethodResult>()
        MethodChannel(name: "held", server: embedded.server).setMethodCallHandler { _, result in held.put(result) }
        // A producer that emits whenever its listener is ready: output every flush round, so the
        // flush always leaves work and kicks the loop.
        final class Eager: StreamHandler {
            func onListen(arguments: ChannelValue, sink: EventSink) -> ChannelError? {
                func emit() {
                    sink.success(.int(1))
                    sink.onReady(emit)
                }
                sink.onReady(emit)
                return nil
            }
            func onCancel(arguments: ChannelValue, sink: EventSink) {}
        }
        EventChannel(name: "eager", server: embedded.server).setStreamHandler(Eager())
        embedded.run()
        let peer = embedded.connect()
        peer.send(try .call(1, "eager", "listen"))
        peer.send(try .call(2, "held", "wait"))
        embedded.run()
        embedded.server.shutdown()
        embedded.run()
        #expect(embedded.server.core.value.phase == .draining)
        try #require(held.value).success(.null)
        #expect(embedded.run(until: { embedded.server.core.value.phase == .stopped || embedded.server.core.value.phase == .closing },
                             timeoutMs: 2000))
    }

    /// On shutdown, a request forwarded to a holder that never answers gets `going_away`, whatever the
    /// order in which the server closes the two connections.
    @Test func forwardedRequestsGetGoingAwayOnShutdown() throws {
        for _ in 0..<20 {
            var config = ServerConfiguration()
            config.drainTimeoutMs = 0
            let embedded = try EmbeddedServer(configuration: config, demoChannels: false)
            let holder = embedded.connect(name: "holder")
            let requester = embedded.connect(name: "requester")
            holder.send(Frame(.register, id: 1, channel: "held", payload: nil))
            embedded.run()
            #expect(try holder.frames().map(\.kind) == [.reply])
            requester.send(try .call(9, "held", "never"))
            embedded.run()
            embedded.server.shutdown()
            embedded.run(turns: 4)
            let answer = try requester.frames().first { $0.id == 9 }
            #expect(answer?.errorCode == "going_away")
        }
    }

    // MARK: Protocol corners

    /// REGISTER with id 0 registers without an answer (id 0: none wanted).
    @Test func registerWithIdZeroIsNotAnswered() throws {
        let embedded = try EmbeddedServer(demoChannels: false)
        let holder = embedded.connect()
        holder.send(Frame(.register, id: 0, channel: "quiet", payload: nil))
        holder.send(Frame(.ping, id: 3, payload: nil))
        embedded.run()
        #expect(try holder.frames().map(\.kind) == [.pong])
        let caller = embedded.connect()
        caller.send(try .call(4, "quiet", "hi"))
        embedded.run()
        #expect(try holder.frames().map(\.kind) == [.message])  // forwarded: it is registered
    }

    /// A text-mode `hello` with an `id` gets it back in `welcome`; a refused request made before
    /// `hello` gets its id back in the error line.
    @Test func textModeEchoesIdsOnHelloAndRefusals() throws {
        var config = ServerConfiguration()
        config.token = "secret"
        let embedded = try EmbeddedServer(configuration: config)
        let early = embedded.connect()
        early.send(line: #"{"id":9,"call":"switchboard/echo","method":"echo"}"#)
        embedded.run()
        let refusal = try #require(try early.lines().first)
        #expect(refusal["id"] == 9 && refusal["error"]?["code"] == "unauthorized")

        let polite = embedded.connect()
        polite.send(line: #"{"id":"h","hello":{"version":1,"token":"secret"}}"#)
        embedded.run()
        let welcome = try #require(try polite.lines().first)
        #expect(welcome["id"] == "h" && welcome["welcome"]?["version"] == 1)
    }

    /// A peer that half-closes with requests open keeps its connection until the drain timeout, then
    /// the handlers are told (as by CANCEL) and the connection closes.
    @Test func aGonePeersOpenRequestsAreCancelledAfterTheDrainTimeout() throws {
        var config = ServerConfiguration()
        config.drainTimeoutMs = 50
        let embedded = try EmbeddedServer(configuration: config)
        let cancelled = AtomicCounter()
        MethodChannel(name: "held", server: embedded.server).setMethodCallHandler { _, result in
            result.onCancel { cancelled.increment() }
        }
        embedded.run()
        let peer = embedded.connect()
        peer.send(try .call(1, "held", "wait"))
        embedded.run()
        peer.peerCloses()
        embedded.run()
        #expect(!peer.isClosed)
        #expect(embedded.run(until: { peer.isClosed }, timeoutMs: 2000))
        #expect(cancelled.value == 1)
    }
}
