#if canImport(Combine)
import Combine
#else
import OpenCombine
#endif
#if canImport(Glibc)
import Glibc
#endif
import Synchronization
import SwitchboardCodec
import SwitchboardTransport

extension EventChannel {
    /// The channel's events as a Combine publisher (OpenCombine on Linux) that honours demand end to end:
    /// what the subscriber requests is sent to the server as DEMAND credit, so a slow subscriber paces
    /// the producer instead of filling a buffer. Cancelling the subscription sends `cancel`.
    public func publisher(arguments: ChannelValue = .null) -> EventPublisher {
        EventPublisher(channel: self, arguments: arguments)
    }
}

/// A publisher of one event channel's events; see ``EventChannel/publisher(arguments:)``.
public struct EventPublisher: Publisher, Sendable {
    public typealias Output = ChannelValue
    public typealias Failure = any Error

    let channel: EventChannel
    let arguments: ChannelValue

    public func receive<S: Subscriber>(subscriber: S) where S.Input == ChannelValue, S.Failure == any Error {
        let subscription = EventSubscription(channel: channel, arguments: arguments, subscriber: AnySubscriber(subscriber))
        subscriber.receive(subscription: subscription)
    }
}

/// Bridges Combine demand to DEMAND frames. Every method hops onto the client's loop, which serializes
/// all deliveries to the subscriber.
private final class EventSubscription: Subscription, @unchecked Sendable {
    // @unchecked: `state` is only touched on the client's loop thread (every entry point hops there
    // through `onLoop`), and `subscriber` is only called from there, with one exception: once the loop
    // has finished (its tear-down done, so nothing runs there any more), the first caller to win
    // `failedAfterStop` fails it.
    private let core: LoopBound<ClientCore>
    private let channel: EventChannel
    private let arguments: ChannelValue
    private var subscriber: AnySubscriber<ChannelValue, any Error>?
    private var listener: StreamListener?
    /// Events that arrived beyond the subscriber's demand (small and bounded: the server honours credit).
    private var buffer: [ChannelValue] = []
    private var demand = Subscribers.Demand.none
    private static var bufferLimit: Int { 16 }
    /// Set by the one caller that fails the subscriber because the client's loop has stopped.
    private let failedAfterStop = Atomic<Bool>(false)

    init(channel: EventChannel, arguments: ChannelValue, subscriber: AnySubscriber<ChannelValue, any Error>) {
        core = channel.client.core
        self.channel = channel
        self.arguments = arguments
        self.subscriber = subscriber
    }

    /// Runs `body` on the client's loop; false if the loop has stopped (the client is closed).
    @discardableResult
    private func onLoop(_ body: @escaping @Sendable (EventSubscription) -> Void) -> Bool {
        core.loop.execute { body(self) }
    }

    func request(_ newDemand: Subscribers.Demand) {
        guard !onLoop({ $0.add(newDemand) }) else { return }
        // The client is closed: nothing will ever come. Fail the subscriber once, here, after the loop's
        // tear-down (which still runs jobs accepted earlier, possibly for this subscription) is over.
        guard !failedAfterStop.exchange(true, ordering: .acquiringAndReleasing) else { return }
        while core.loop.isRunning, !core.loop.isInLoopThread { sched_yield() }
        guard let subscriber else { return }
        self.subscriber = nil
        subscriber.receive(completion: .failure(ClientError.closed))
    }

    func cancel() {
        onLoop { subscription in
            subscription.subscriber = nil
            if let listener = subscription.listener { subscription.core.value.stopListening(listener) }
            subscription.listener = nil
        }
    }

    private func add(_ newDemand: Subscribers.Demand) {
        guard subscriber != nil, newDemand > .none else { return }
        demand += newDemand
        drainBuffer()
        let credit = newDemand == .unlimited ? UInt32.max : UInt32(clamping: newDemand.max ?? Int(UInt32.max))
        if let listener {
            core.value.addCredit(credit, to: listener)
            return
        }
        let listener = StreamListener(
            channel: channel.name, codec: channel.codec, arguments: arguments, credit: credit == .max ? nil : credit,
            onEvent: { [weak self] event in self?.receive(event) },
            onEnd: { [weak self] error in self?.finish(error) })
        self.listener = listener
        core.value.listen(listener)  // with a DEMAND of `credit` first, unless unlimited
    }

    private func receive(_ event: Result<ChannelValue, ChannelError>) {
        guard let subscriber else { return }
        switch event {
        case .failure(let error):
            finish(error)
        case .success(let value):
            guard demand > .none else {
                if buffer.count == Self.bufferLimit { buffer.removeFirst() }
                buffer.append(value)
                return
            }
            demand -= 1
            let more = subscriber.receive(value)
            if more > .none { add(more) }
        }
    }

    private func drainBuffer() {
        while demand > .none, !buffer.isEmpty, let subscriber {
            demand -= 1
            let more = subscriber.receive(buffer.removeFirst())
            demand += more
        }
    }

    private func finish(_ error: (any Error)?) {
        guard let subscriber else { return }
        self.subscriber = nil
        if let listener { core.value.stopListening(listener) }
        listener = nil
        subscriber.receive(completion: error.map { .failure($0) } ?? .finished)
    }
}
