#if canImport(Combine)
import Combine
#else
import OpenCombine
#endif
import Synchronization
import Testing
import SwitchboardCodec
import SwitchboardServer
import SwitchboardServerCombine
import SwitchboardTesting
import SwitchboardWire

/// A callback API, as a driver or an SDK offers one: readings arrive on the sensor's own thread.
final class FakeSensor: Sendable {
    private let callback = Mutex<(@Sendable (Double) -> Void)?>(nil)
    func onReading(_ body: @escaping @Sendable (Double) -> Void) { callback.withLock { $0 = body } }
    func fire(_ reading: Double) { callback.withLock { $0 }?(reading) }
}

/// The usual wrapping of a callback API: a `PassthroughSubject` fed by the callback.
final class SensorFeed: @unchecked Sendable {
    // @unchecked: `subject` is a PassthroughSubject, whose `send` and subscription methods serialize
    // themselves with its own lock (Combine's and OpenCombine's alike); it is the only stored property.
    let subject = PassthroughSubject<ChannelValue, any Error>()

    init(_ sensor: FakeSensor) {
        sensor.onReading { [self] reading in subject.send(.float64(reading)) }
    }

    /// The feed as the bridge sees it: buffered (a subject keeps nothing for a subscriber without
    /// demand), with every request and value recorded.
    func publisher(recording record: DemandRecord) -> some Publisher<ChannelValue, any Error> {
        subject.buffer(size: 10_000, prefetch: .keepFull, whenFull: .dropNewest)
            .handleEvents(receiveOutput: { _ in record.delivered() }, receiveCancel: { record.cancelled() },
                          receiveRequest: { record.requested($0) })
    }
}

/// What a bridge asked its publisher for, and when it cancelled.
final class DemandRecord: Sendable {
    private struct State {
        var requested = 0
        var delivered = 0
        var maxOutstanding = 0
        var cancels = 0
    }
    private let state = Mutex(State())

    func requested(_ demand: Subscribers.Demand) {
        state.withLock { s in
            s.requested += demand.max ?? 1_000_000_000
            s.maxOutstanding = max(s.maxOutstanding, s.requested - s.delivered)
        }
    }
    func delivered() { state.withLock { $0.delivered += 1 } }
    func cancelled() { state.withLock { $0.cancels += 1 } }

    var requested: Int { state.withLock { $0.requested } }
    var maxOutstanding: Int { state.withLock { $0.maxOutstanding } }
    var cancels: Int { state.withLock { $0.cancels } }
}

extension InMemoryTransport {
    /// The envelopes (nil: end of stream) of the events on `channel` read so far.
    func events(on channel: String) throws -> [Result<ChannelValue, ChannelError>?] {
        try frames().filter { $0.kind == .message && $0.channel == channel && $0.id == 0 }
            .map { $0.payload == nil ? nil : try $0.envelope() }
    }

    func demand(_ n: UInt32, on channel: String) {
        var payload: [UInt8] = []
        Frame.appendBigEndian(n, to: &payload)
        send(Frame(.demand, channel: channel, payload: payload))
    }

    /// Listens on `channel` and checks the listen reply.
    func listen(on channel: String, in server: EmbeddedServer) throws {
        send(try .call(1, channel, "listen"))
        server.run()
        #expect(try frames().map(\.kind) == [.reply])
    }
}

@Suite struct CombineBridge {
    // MARK: Broadcasting from a publisher

    /// A sensor firing 1000 readings at once into a channel whose producer queue holds 4: the bridge
    /// asks for no more than the queue has room for, so every reading arrives, in order, none dropped.
    @Test func broadcastIsPacedByTheProducerQueue() throws {
        let embedded = try EmbeddedServer()
        let sensor = FakeSensor(), feed = SensorFeed(sensor), record = DemandRecord()
        EventChannel(name: "sensor", queueLimit: 4, server: embedded.server)
            .setStreamHandler(broadcasting: feed.publisher(recording: record))
        embedded.run()
        let listener = embedded.connect()
        try listener.listen(on: "sensor", in: embedded)

        #expect(finishesOnAnotherThread { for n in 0..<1000 { sensor.fire(Double(n)) } })
        var events: [Result<ChannelValue, ChannelError>?] = []
        #expect(embedded.run(until: { events += (try? listener.events(on: "sensor")) ?? []; return events.count >= 1000 }))
        #expect(events == (0..<1000).map { .success(.float64(Double($0))) })
        #expect(record.maxOutstanding <= 4)
        #expect(try listener.stats(on: embedded)["eventsDropped"] == [:])
    }

    /// Finished: every listener's stream ends, and a later listener's ends right after its reply.
    @Test func finishedPublisherEndsEveryStream() throws {
        let embedded = try EmbeddedServer()
        let feed = SensorFeed(FakeSensor())
        EventChannel(name: "sensor", server: embedded.server).setStreamHandler(broadcasting: feed.subject)
        embedded.run()
        let listener = embedded.connect()
        try listener.listen(on: "sensor", in: embedded)
        #expect(finishesOnAnotherThread {
            feed.subject.send(1.5)
            feed.subject.send(completion: .finished)
        })
        embedded.run()
        #expect(try listener.events(on: "sensor") == [.success(1.5), nil])

        let late = embedded.connect()
        late.send(try .call(1, "sensor", "listen"))
        embedded.run()
        let frames = try late.frames()
        #expect(frames.map(\.kind) == [.reply, .message])
        #expect(frames.last?.payload == nil)
    }

    /// A failure is an error event for every listener, and then the end of their streams.
    @Test func failedPublisherSendsAnErrorEventAndEnds() throws {
        let embedded = try EmbeddedServer()
        let feed = SensorFeed(FakeSensor())
        EventChannel(name: "sensor", server: embedded.server).setStreamHandler(broadcasting: feed.subject)
        embedded.run()
        let listener = embedded.connect()
        try listener.listen(on: "sensor", in: embedded)
        #expect(finishesOnAnotherThread { feed.subject.send(completion: .failure(ChannelError(code: "sensor_off", message: "unplugged"))) })
        embedded.run()
        #expect(try listener.events(on: "sensor") == [.failure(ChannelError(code: "sensor_off", message: "unplugged")), nil])
    }

    /// Removing or replacing the handler cancels the subscription, even while a listener (paused,
    /// its end of stream waiting) still holds the old handler.
    @Test(arguments: [false, true])
    func removingTheHandlerCancelsTheSubscription(replace: Bool) throws {
        let embedded = try EmbeddedServer()
        let sensor = FakeSensor(), feed = SensorFeed(sensor), record = DemandRecord()
        let channel = EventChannel(name: "sensor", server: embedded.server)
        channel.setStreamHandler(broadcasting: feed.publisher(recording: record))
        embedded.run()
        let listener = embedded.connect()
        listener.demand(1, on: "sensor")
        try listener.listen(on: "sensor", in: embedded)
        #expect(finishesOnAnotherThread { for n in 0..<2 { sensor.fire(Double(n)) } })
        embedded.run()
        #expect(try listener.events(on: "sensor") == [.success(0.0)])  // the second waits for credit
        #expect(record.cancels == 0)
        if replace {
            channel.setStreamHandler(StreamHandlerClosures(onListen: { _, _ in nil }))
        } else {
            channel.setStreamHandler(nil)
        }
        embedded.run()
        #expect(record.cancels == 1)
    }

    /// Stopping the server cancels the subscription.
    @Test func stoppingTheServerCancelsTheSubscription() throws {
        let embedded = try EmbeddedServer()
        let feed = SensorFeed(FakeSensor()), record = DemandRecord()
        EventChannel(name: "sensor", server: embedded.server).setStreamHandler(broadcasting: feed.publisher(recording: record))
        embedded.run()
        #expect(record.cancels == 0)
        embedded.finish()
        #expect(record.cancels == 1)
    }

    /// On live loops (all of them with SWITCHBOARD_TEST_LOOPS): listeners on every loop get the
    /// readings and the end, and stopping the server cancels the subscription.
    @Test func broadcastReachesListenersOnEveryLoop() async throws {
        let sensor = FakeSensor(), feed = SensorFeed(sensor), record = DemandRecord()
        try await withServer(setUp: { server in
            EventChannel(name: "sensor", queueLimit: 8, server: server).setStreamHandler(broadcasting: feed.publisher(recording: record))
        }) { server, port in
            var wires: [RawConnection] = []
            for _ in 0..<4 {
                let wire = try RawConnection(port: port)
                try wire.send(.call(1, "sensor", "listen"))
                #expect(try await wire.frame().kind == .reply)
                wires.append(wire)
            }
            #expect(finishesOnAnotherThread {
                for n in 0..<200 { sensor.fire(Double(n)) }
                feed.subject.send(completion: .finished)
            })
            for wire in wires {
                #expect(try await wire.events(on: "sensor") == (0..<200).map { .success(.float64(Double($0))) })
            }
            #expect(record.maxOutstanding <= 8)
            #expect(record.cancels == 0)
        }
        #expect(record.cancels == 0)  // it finished: nothing left to cancel
    }

    @Test func stoppingALiveServerCancelsTheSubscription() async throws {
        let feed = SensorFeed(FakeSensor()), record = DemandRecord()
        try await withServer(setUp: { server in
            EventChannel(name: "sensor", server: server).setStreamHandler(broadcasting: feed.publisher(recording: record))
        }) { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(.call(1, "sensor", "listen"))
            #expect(try await wire.frame().kind == .reply)
            #expect(record.cancels == 0)
        }
        #expect(record.cancels == 1)
    }

    // MARK: A publisher per listener

    /// A paused listener (DEMAND 3, then 5) gets exactly what it asked for; its publisher is never asked
    /// for more than that, and nothing is dropped. Its CANCEL cancels the subscription.
    @Test func listenerPublisherIsPacedByDemandAndCancelledByCancel() throws {
        let embedded = try EmbeddedServer()
        let sensor = FakeSensor(), feed = SensorFeed(sensor), record = DemandRecord()
        EventChannel(name: "sensor", server: embedded.server)
            .setStreamHandler(PublisherStreamHandler { _ in feed.publisher(recording: record) })
        embedded.run()
        let listener = embedded.connect()
        listener.demand(3, on: "sensor")
        try listener.listen(on: "sensor", in: embedded)

        #expect(finishesOnAnotherThread { for n in 0..<1000 { sensor.fire(Double(n)) } })
        embedded.run()
        #expect(try listener.events(on: "sensor") == (0..<3).map { .success(.float64(Double($0))) })
        #expect(record.requested == 3)

        listener.demand(5, on: "sensor")
        embedded.run()
        #expect(try listener.events(on: "sensor") == (3..<8).map { .success(.float64(Double($0))) })
        #expect(record.requested == 8)
        #expect(try listener.stats(on: embedded)["eventsDropped"] == [:])

        #expect(record.cancels == 0)
        listener.send(try .call(2, "sensor", "cancel"))
        embedded.run()
        #expect(record.cancels == 1)
    }

    /// In push mode a listener whose connection is over its outbound limit is not ready: its publisher
    /// waits rather than filling the stream's queue.
    @Test func listenerPublisherWaitsForASlowConnection() throws {
        var config = ServerConfiguration()
        config.outboundLimit = 64 * 1024
        config.slowConsumerGraceMs = 60_000
        let embedded = try EmbeddedServer(configuration: config)
        let sensor = FakeSensor(), feed = SensorFeed(sensor), record = DemandRecord()
        EventChannel(name: "sensor", server: embedded.server)
            .setStreamHandler(PublisherStreamHandler { _ in feed.publisher(recording: record).map { _ in .uint8List([UInt8](repeating: 1, count: 1024)) } })
        embedded.run()
        let listener = embedded.connect()
        try listener.listen(on: "sensor", in: embedded)
        listener.peerWindow = 0
        #expect(finishesOnAnotherThread { for n in 0..<1000 { sensor.fire(Double(n)) } })
        embedded.run(turns: 20)
        #expect(record.requested < 1000)  // paced: not everything was asked for
        listener.peerWindow = .max
        var count = 0
        #expect(embedded.run(until: { count += (try? listener.events(on: "sensor").count) ?? 0; return count >= 1000 }))
        #expect(count == 1000)
        #expect(try listener.stats(on: embedded)["eventsDropped"] == [:])
    }

    /// On live loops (all of them with SWITCHBOARD_TEST_LOOPS): four listeners, each with its own
    /// publisher of the same sensor, get what their DEMAND allows and no more; CANCEL cancels each.
    @Test func listenerPublishersOnEveryLoop() async throws {
        let sensor = FakeSensor(), feed = SensorFeed(sensor), record = DemandRecord()
        try await withServer(setUp: { server in
            EventChannel(name: "sensor", server: server).setStreamHandler(PublisherStreamHandler { _ in feed.publisher(recording: record) })
        }) { _, port in
            var wires: [RawConnection] = []
            for _ in 0..<4 {
                let wire = try RawConnection(port: port)
                try wire.demand(2, on: "sensor")
                try wire.send(.call(1, "sensor", "listen"))
                #expect(try await wire.frame().kind == .reply)
                wires.append(wire)
            }
            #expect(finishesOnAnotherThread { for n in 0..<100 { sensor.fire(Double(n)) } })
            for wire in wires {
                #expect(try await [wire.frame(), wire.frame()].map { try $0.envelope() } == [.success(0.0), .success(1.0)])
                #expect(try await wire.barrier().isEmpty)
            }
            #expect(record.requested == 8)
            for wire in wires {
                try wire.demand(3, on: "sensor")
                #expect(try await [wire.frame(), wire.frame(), wire.frame()].map { try $0.envelope() } == [2.0, 3.0, 4.0].map { .success($0) })
                try wire.send(.call(2, "sensor", "cancel"))
                #expect(try await wire.frame().id == 2)
            }
            #expect(record.requested == 20)
            #expect(record.cancels == 4)
        }
    }

    /// Disconnecting cancels the listener's subscription.
    @Test func disconnectingCancelsTheListenersPublisher() throws {
        let embedded = try EmbeddedServer()
        let feed = SensorFeed(FakeSensor()), record = DemandRecord()
        EventChannel(name: "sensor", server: embedded.server)
            .setStreamHandler(PublisherStreamHandler { _ in feed.publisher(recording: record) })
        embedded.run()
        let listener = embedded.connect()
        try listener.listen(on: "sensor", in: embedded)
        listener.peerCloses()
        embedded.run()
        #expect(record.cancels == 1)
    }

    /// Completion ends the listener's stream; a failure sends an error event first. A thrown
    /// ChannelError refuses the listen.
    @Test func listenerPublisherCompletionAndFailure() throws {
        let embedded = try EmbeddedServer()
        let feed = SensorFeed(FakeSensor())
        EventChannel(name: "sensor", server: embedded.server).setStreamHandler(PublisherStreamHandler { arguments in
            guard arguments != "refuse" else { throw ChannelError(code: "refused", message: "no") }
            return feed.subject
        })
        embedded.run()
        let first = embedded.connect(), second = embedded.connect()
        try first.listen(on: "sensor", in: embedded)
        try second.listen(on: "sensor", in: embedded)
        #expect(finishesOnAnotherThread {
            feed.subject.send(2.5)
            feed.subject.send(completion: .failure(ChannelError(code: "sensor_off", message: "unplugged")))
        })
        embedded.run()
        for listener in [first, second] {
            #expect(try listener.events(on: "sensor") == [.success(2.5), .failure(ChannelError(code: "sensor_off", message: "unplugged")), nil])
        }

        let refused = embedded.connect()
        refused.send(try .call(1, "sensor", "listen", "refuse"))
        embedded.run()
        #expect(try refused.frames().first?.envelope() == .failure(ChannelError(code: "refused", message: "no")))
    }

    @Test func listenerPublisherFinishedEndsTheStream() throws {
        let embedded = try EmbeddedServer()
        EventChannel(name: "sensor", server: embedded.server)
            .setStreamHandler(PublisherStreamHandler { _ in [ChannelValue.int(1), .int(2)].publisher })
        embedded.run()
        let listener = embedded.connect()
        listener.send(try .call(1, "sensor", "listen"))
        embedded.run()
        let frames = try listener.frames()
        #expect(frames.first?.kind == .reply)
        #expect(try frames.dropFirst().map { $0.payload == nil ? nil : try $0.envelope() } == [.success(1), .success(2), nil])
    }

    // MARK: Answering with a Future

    @Test func futureAnswersTheCall() throws {
        let embedded = try EmbeddedServer()
        MethodChannel(name: "future", server: embedded.server).setMethodCallHandler { call in
            Future<ChannelValue, any Error> { promise in
                switch call.method {
                case "square": promise(.success(.int((call.arguments.intValue ?? 0) * (call.arguments.intValue ?? 0))))
                case "fail": promise(.failure(ChannelError(code: "bad_input", message: "no")))
                default: promise(.failure(MethodNotImplemented()))
                }
            }
        }
        embedded.run()
        let caller = embedded.connect()
        caller.send(try .call(1, "future", "square", 12))
        caller.send(try .call(2, "future", "fail"))
        caller.send(try .call(3, "future", "other"))
        embedded.run()
        let replies = try caller.frames()
        #expect(replies.map(\.id) == [1, 2, 3])
        #expect(try replies[0].envelope() == .success(144))
        #expect(try replies[1].envelope() == .failure(ChannelError(code: "bad_input", message: "no")))
        #expect(replies[2].payload == nil)  // not implemented
    }

    /// A publisher answered later, from the sensor's thread; a CANCEL first cancels the subscription.
    @Test func laterAnswerAndCancel() throws {
        let embedded = try EmbeddedServer()
        let sensor = FakeSensor(), feed = SensorFeed(sensor), record = DemandRecord()
        MethodChannel(name: "read", server: embedded.server).setMethodCallHandler { _ in feed.publisher(recording: record) }
        embedded.run()
        let caller = embedded.connect()
        caller.send(try .call(1, "read", "next"))
        embedded.run()
        #expect(try caller.frames().isEmpty)
        #expect(finishesOnAnotherThread { sensor.fire(7) })
        embedded.run()
        #expect(try caller.frames().map { try $0.envelope() } == [.success(7.0)])
        #expect(record.requested == 1)

        caller.send(try .call(2, "read", "next"))
        embedded.run()
        caller.send(Frame(.cancel, id: 2, payload: nil))
        embedded.run()
        #expect(try caller.frames().first?.envelope() == .failure(ChannelError(code: "cancelled", message: "the caller cancelled")))
        #expect(record.cancels == 2)  // the first after its value, the second by the CANCEL
        #expect(finishesOnAnotherThread { sensor.fire(8) })
        embedded.run()
        #expect(try caller.frames().isEmpty)
    }

    // MARK: The example in docs/embedding.md

    @Test func readmeExample() throws {
        let embedded = try EmbeddedServer()
        let server = embedded.server
        // docs/embedding.md begins
        let readings = PassthroughSubject<ChannelValue, Never>()  // the callback calls readings.send(.float64(celsius))
        EventChannel(name: "sensors/outside", server: server)     // every listener; asks only for what the queue has room for
            .setStreamHandler(broadcasting: readings.buffer(size: 64, prefetch: .keepFull, whenFull: .dropOldest))
        EventChannel(name: "sensors/samples", server: server)     // a publisher per listener, paced by its DEMAND
            .setStreamHandler(PublisherStreamHandler { arguments in (1...(arguments.intValue ?? 3)).publisher.map(ChannelValue.int) })
        MethodChannel(name: "dice", server: server).setMethodCallHandler { _ in
            Future<ChannelValue, Never> { promise in promise(.success(.int(Int.random(in: 1...6)))) }
        }
        // docs/embedding.md ends
        embedded.run()
        let client = embedded.connect()
        try client.listen(on: "sensors/outside", in: embedded)
        readings.send(21.5)
        readings.send(completion: .finished)
        embedded.run()
        #expect(try client.events(on: "sensors/outside") == [.success(21.5), nil])

        client.send(try .call(2, "sensors/samples", "listen", 2))
        client.send(try .call(3, "dice", "roll"))
        embedded.run()
        let frames = try client.frames()
        #expect(try frames.filter { $0.id == 0 }.map { $0.payload == nil ? nil : try $0.envelope() } == [.success(1), .success(2), nil])
        let roll = try #require(try frames.first { $0.id == 3 }?.envelope().get().intValue)
        #expect((1...6).contains(roll))
    }
}
