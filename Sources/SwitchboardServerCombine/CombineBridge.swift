#if canImport(Combine)
import Combine
#else
import OpenCombine
#endif
import Synchronization
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTransport

// Combine (OpenCombine on Linux) in, channels out: publishers feed event channels and answer method calls,
// with Combine demand tied to the server's own flow control, so that a fast publisher is paced, never
// dropped unseen. Publishers may emit on any thread; everything reaches a stream through the thread-safe
// entry points (the channel's producer queue, `EventSink`, `MethodResult`).
//
// A module of its own, so that the server does not depend on OpenCombine (on Apple platforms Combine
// comes with the system). Pacing needs what the server keeps from its users: the channel's producer
// queue, its length, the loop's job order and the moment a handler is replaced. The server shows these
// to this module alone, through package access (SwitchboardServer's ProducerPacing.swift).
//
// A publisher's failure becomes an error event and then ends the stream: a failed publisher sends nothing
// more, and a listener left waiting on a stream that can never go on would never learn so.

extension EventChannel {
    /// Makes `publisher` the channel's source: every listener is accepted, and each value is broadcast to
    /// all of them (see ``broadcast(_:)``). Demand is paced by the channel's producer queue: the bridge
    /// asks for ``queueLimit`` values up front and for one more each time a value has reached the loop,
    /// so the queue never overflows on its account. When the publisher finishes, every listener's stream
    /// ends (and a later listener's ends at once); a failure is first broadcast as an error event.
    /// The subscription is cancelled when the handler is removed or replaced, or the server stops.
    ///
    /// ```swift
    /// let readings = PassthroughSubject<ChannelValue, Never>()
    /// sensor.onReading = { readings.send(.float64($0)) }
    /// EventChannel(name: "sensor", server: server).setStreamHandler(broadcasting: readings.buffer(size: 64, prefetch: .keepFull, whenFull: .dropOldest))
    /// ```
    public func setStreamHandler<P: Publisher>(broadcasting publisher: P) where P.Output == ChannelValue {
        let handler = PublisherBroadcast()
        setStreamHandler(handler)
        publisher.subscribe(BroadcastSubscriber<P.Failure>(channel: self, state: handler.state))
    }
}

extension MethodChannel {
    /// Sets a handler that answers with a publisher's first value (a `Future`, typically). A failure is
    /// answered as the async handler's errors are (``ChannelError`` an error envelope,
    /// ``MethodNotImplemented`` not implemented, any other error code `error`); a publisher that finishes
    /// without a value answers the error code `error`. A CANCEL from the caller cancels the subscription.
    public func setMethodCallHandler<P: Publisher>(_ handler: @escaping @Sendable (MethodCall) -> P) where P.Output == ChannelValue {
        let answering = PublisherMethodHandler(handler)
        setMethodCallHandler { call, result in answering.answer(call, result) }
    }
}

/// A ``StreamHandler`` that gives each listener a publisher of its own, made from the listen arguments
/// (a thrown error refuses the listen, a ``ChannelError`` as it is). The publisher is paced by that
/// listener's demand: it is asked for one value at a time, and only while the listener is ready (see
/// ``EventSink/isReady``), so its values never wait in the stream's queue and are never dropped. The
/// listener's CANCEL, a new listen or its disconnecting cancels the subscription, as does removing the
/// handler. Completion ends the listener's stream; a failure sends an error event first.
///
/// ```swift
/// channel.setStreamHandler(PublisherStreamHandler { arguments in (1...(arguments.intValue ?? 3)).publisher.map(ChannelValue.int) })
/// ```
public struct PublisherStreamHandler<P: Publisher>: StreamHandler, RemovalObserving where P.Output == ChannelValue {
    private let makePublisher: @Sendable (ChannelValue) throws -> P
    private let listeners = ListenerLinks()

    /// Makes a handler that subscribes to `makePublisher(arguments)` for each listener.
    public init(_ makePublisher: @escaping @Sendable (ChannelValue) throws -> P) {
        self.makePublisher = makePublisher
    }

    public func onListen(arguments: ChannelValue, sink: EventSink) -> ChannelError? {
        let publisher: P
        do { publisher = try makePublisher(arguments) } catch { return channelError(for: error) }
        let link = ListenerLink(sink: sink, listeners: listeners)
        listeners.add(link)
        publisher.subscribe(ListenerSubscriber<P.Failure>(link: link))
        return nil
    }

    public func onCancel(arguments: ChannelValue, sink: EventSink) {
        listeners.remove(sink)?.cancel()
    }

    package func handlerWasRemoved() { listeners.cancelAll() }
}

// MARK: - Subscriptions

/// A subscription, to be requested from and cancelled on any thread.
private struct SendableSubscription: @unchecked Sendable {
    // @unchecked: Combine's contract makes `request(_:)` and `cancel()` callable from any thread (every
    // subscription, OpenCombine's included, serializes them itself), and these are the only two uses.
    let subscription: any Subscription
}

/// One subscription's life, shared by the subscriber and whoever may cancel it: the subscription until
/// it ends, and whether it ended by cancel or completion.
final class SubscriptionLink: Sendable {
    private struct State {
        var subscription: SendableSubscription?
        var isCancelled = false
        var isComplete = false
    }
    private let state = Mutex(State())

    /// Keeps `subscription`, or cancels it at once if the link was cancelled first; false then.
    func attach(_ subscription: any Subscription) -> Bool {
        let box = SendableSubscription(subscription: subscription)
        let isCancelled = state.withLock { s in
            if !s.isCancelled { s.subscription = box }
            return s.isCancelled
        }
        if isCancelled { box.subscription.cancel() }
        return !isCancelled
    }

    /// Asks for `count` more values, unless the link has ended.
    func request(_ count: Int) {
        guard count > 0, let box = state.withLock({ $0.subscription }) else { return }
        box.subscription.request(.max(count))
    }

    /// Cancels the subscription (once; after completion there is nothing to cancel).
    func cancel() {
        let box = state.withLock { s -> SendableSubscription? in
            s.isCancelled = true
            defer { s.subscription = nil }
            return s.subscription
        }
        box?.subscription.cancel()
    }

    /// Marks the publisher complete; false if the link was cancelled before (the completion goes nowhere).
    func complete() -> Bool {
        state.withLock { s in
            s.subscription = nil  // the publisher has let go of its subscriber: nothing to cancel
            guard !s.isCancelled, !s.isComplete else { return false }
            s.isComplete = true
            return true
        }
    }

    /// Whether values may still be forwarded.
    var isLive: Bool { state.withLock { !$0.isCancelled && !$0.isComplete } }
    /// Whether the publisher completed.
    var isComplete: Bool { state.withLock { $0.isComplete } }
    /// Whether the link was cancelled.
    var isCancelled: Bool { state.withLock { $0.isCancelled } }
}

/// The error event for a publisher's failure, as an async handler's errors are answered.
private func channelError(for error: any Error) -> ChannelError {
    (error as? ChannelError) ?? ChannelError(code: "error", message: "\(error)")
}

// MARK: - Broadcast

/// The handler of a channel fed by one publisher. Removing or replacing it cancels the subscription;
/// so does its `deinit`, when the server stops and the loops' channel tables let go of it. That breaks
/// the one cycle: subscription → subscriber → channel → cores → tables → this handler.
private final class PublisherBroadcast: StreamHandler, RemovalObserving {
    let state = SubscriptionLink()

    deinit { state.cancel() }

    package func handlerWasRemoved() { state.cancel() }

    func onListen(arguments: ChannelValue, sink: EventSink) -> ChannelError? {
        if state.isComplete { sink.endOfStream() }  // the stream is over; it goes out after the listen reply
        return nil
    }

    func onCancel(arguments: ChannelValue, sink: EventSink) {}
}

/// Feeds a publisher's values to the channel's listeners at the pace of its producer queue. Invariant:
/// values asked for and not yet arrived, plus this bridge's values waiting in the queue, never exceed its
/// length. Each value's hop onto loop 0 is followed by a job that asks for one more (the loop runs jobs
/// in order), so a value is replaced only once it has left the queue.
private final class BroadcastSubscriber<Failure: Error>: Subscriber, Sendable {
    typealias Input = ChannelValue
    let channel: EventChannel
    let state: SubscriptionLink

    init(channel: EventChannel, state: SubscriptionLink) {
        self.channel = channel
        self.state = state
    }

    func receive(subscription: any Subscription) {
        guard state.attach(subscription) else { return }
        state.request(channel.producerQueueLimit)
    }

    func receive(_ input: ChannelValue) -> Subscribers.Demand {
        guard state.isLive else { return .none }
        channel.enqueueBroadcast(input)
        let state = self.state
        return channel.afterQueuedBroadcasts { state.request(1) } ? .none : cancelled()  // false: the server has stopped
    }

    /// Ends every listener's stream, after an error event for a failure, behind the values before (see
    /// ``EventChannel/endStreams(after:unless:)``), unless the handler was removed meanwhile.
    func receive(completion: Subscribers.Completion<Failure>) {
        guard state.complete() else { return }
        let failure: ChannelError? = if case .failure(let error) = completion { channelError(for: error) } else { nil }
        let state = self.state
        channel.endStreams(after: failure) { state.isCancelled }
    }

    private func cancelled() -> Subscribers.Demand {
        state.cancel()
        return .none
    }
}

// MARK: - Per listener

/// The per-listener links of one ``PublisherStreamHandler``, by sink. Cancelled all together when the
/// handler is removed or goes (every loop's table and stream let go of it).
final class ListenerLinks: Sendable {
    private let links = Mutex<[ObjectIdentifier: ListenerLink]>([:])

    func add(_ link: ListenerLink) { links.withLock { $0[ObjectIdentifier(link.sink)] = link } }

    /// Removes and returns `sink`'s link. The link holds its sink, so the identifier is not reused meanwhile.
    func remove(_ sink: EventSink) -> ListenerLink? { links.withLock { $0.removeValue(forKey: ObjectIdentifier(sink)) } }

    func cancelAll() {
        for link in links.withLock({ links in defer { links = [:] }; return links.values }) { link.cancel() }
    }

    deinit { cancelAll() }
}

/// One listener's subscription and its pacing. `inFlight` (the value asked for that has not reached the
/// stream yet: 0 or 1) is only touched on the sink's loop thread; the lock just makes the class Sendable.
final class ListenerLink: Sendable {
    let sink: EventSink
    private let subscription = SubscriptionLink()
    private let inFlight = Mutex(0)
    /// Weak: the handler's table owns its links, not the other way round.
    private weak let listeners: ListenerLinks?

    init(sink: EventSink, listeners: ListenerLinks) {
        self.sink = sink
        self.listeners = listeners
    }

    var loop: LoopHandle { sink.loop }

    func attach(_ subscription: any Subscription) {
        guard self.subscription.attach(subscription) else { return }
        onLoop { $0.subscription.request($0.demand()) }
    }

    /// Loop thread only: how many more values to ask for now: one, when the listener is ready (see
    /// ``EventSink/isReady``: live, credit left, nothing waiting, under the outbound limit) and none is
    /// on its way; so a value always goes straight out, never waits, and is never dropped. Not ready:
    /// none, and the sink calls back once it is.
    func demand() -> Int {
        guard sink.isActive else { cancel(); return 0 }
        guard sink.isReady else {
            sink.onReady { [self] in request(demand()) }
            return 0
        }
        return inFlight.withLock { count in
            guard count == 0 else { return 0 }
            count = 1
            return 1
        }
    }

    /// Asks the publisher for `count` more values.
    func request(_ count: Int) { subscription.request(count) }

    /// A value has reached the stream (loop thread).
    func arrived() { inFlight.withLock { $0 -= 1 } }

    var isLive: Bool { subscription.isLive }

    /// Marks the publisher complete and forgets the link; false if it was cancelled first.
    func complete() -> Bool {
        _ = listeners?.remove(sink)
        return subscription.complete()
    }

    func cancel() { subscription.cancel() }

    /// Runs `body` on the sink's loop thread: at once when there, else queued; cancels if the loop stopped.
    func onLoop(_ body: @escaping @Sendable (ListenerLink) -> Void) {
        if loop.isInLoopThread { return body(self) }
        if !loop.execute({ [self] in body(self) }) { cancel() }
    }
}

/// Forwards a publisher's values to one listener's sink as that listener's demand allows.
private final class ListenerSubscriber<Failure: Error>: Subscriber, Sendable {
    typealias Input = ChannelValue
    let link: ListenerLink

    init(link: ListenerLink) { self.link = link }

    func receive(subscription: any Subscription) { link.attach(subscription) }

    func receive(_ input: ChannelValue) -> Subscribers.Demand {
        guard link.isLive else { return .none }
        link.sink.success(input)
        if link.loop.isInLoopThread {  // emitted already: answer with the demand rather than re-enter
            link.arrived()
            return .max(link.demand())
        }
        // After the sink's hop onto the loop (jobs run in order), so the value is in its stream by then.
        link.onLoop { link in
            link.arrived()
            link.request(link.demand())
        }
        return .none
    }

    func receive(completion: Subscribers.Completion<Failure>) {
        guard link.complete() else { return }
        if case .failure(let error) = completion { link.sink.error(channelError(for: error)) }
        link.sink.endOfStream()
    }
}

// MARK: - Method answers

/// A method handler's publishers, each answering one call. A class rather than a closure, so that the
/// `@Sendable` handler captures an instance, not the publisher's metatype.
private final class PublisherMethodHandler<P: Publisher>: Sendable where P.Output == ChannelValue {
    let makePublisher: @Sendable (MethodCall) -> P

    init(_ makePublisher: @escaping @Sendable (MethodCall) -> P) { self.makePublisher = makePublisher }

    func answer(_ call: MethodCall, _ result: MethodResult) {
        let answer = FirstValueAnswer<P.Failure>(result: result)
        result.onCancel { answer.link.cancel() }
        makePublisher(call).subscribe(answer)
    }
}

/// Answers one method call with a publisher's first value.
private final class FirstValueAnswer<Failure: Error>: Subscriber, Sendable {
    typealias Input = ChannelValue
    let result: MethodResult
    let link = SubscriptionLink()

    init(result: MethodResult) { self.result = result }

    func receive(subscription: any Subscription) {
        guard link.attach(subscription) else { return }
        link.request(1)
    }

    func receive(_ input: ChannelValue) -> Subscribers.Demand {
        guard link.isLive else { return .none }
        link.cancel()  // the first value is the answer; nothing more is wanted
        result.success(input)
        return .none
    }

    func receive(completion: Subscribers.Completion<Failure>) {
        guard link.complete() else { return }  // answered (the link was cancelled then) or cancelled by the caller
        switch completion {
        case .failure(let error) where error is MethodNotImplemented: result.notImplemented()
        case .failure(let error): result.error(channelError(for: error))
        case .finished: result.error(ChannelError(code: "error", message: "the publisher finished without a value"))
        }
    }
}
