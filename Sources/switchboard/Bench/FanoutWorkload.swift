import Histogram
import SwitchboardTransport
import SwitchboardWire

/// `fanout`: N listeners, one publisher posting S-byte messages with at most D posts unacknowledged.
/// Every delivery is counted and checked for order and gaps; latency comes from a timestamp inside the
/// payload (bytes 0-7: sequence number, 8-15: send time, little-endian).
final class FanoutWorkload {
    let loop: EventLoop
    let target: BenchTarget
    let listenerCount: Int, size: Int, window: Int
    /// Whether every connection asks for a resumable session and acknowledges its stream (`--session`).
    let session: Bool
    /// Posts to make in all, when fixed (`--operations`): done once every listener has every one.
    let posts: Int?
    private var listeners: [Listener] = []
    private var publisher: Listener?
    private let clock: BenchClock
    private var histogram = makeHistogram()
    private var delivered = 0, totalDelivered = 0
    private var gaps = 0, reordered = 0, protocolErrors = 0
    private var nextSequence: UInt64 = 0
    private var unacknowledged = 0

    init(loop: EventLoop, target: BenchTarget, listeners: Int, size: Int, window: Int, session: Bool = false, posts: Int?) {
        self.loop = loop
        self.target = target
        listenerCount = listeners
        self.size = max(size, 16)
        self.window = window
        self.session = session
        self.posts = posts
        clock = BenchClock(loop: loop)
    }

    final class Listener {
        let adapter = Box()
        var transport: (any Transport)?
        var inbound = InboundBuffer()
        var outbound: [UInt8] = []
        var expected: UInt64?
        var isReady = false
        final class Box { var value: (any FanoutAdapter)? }
    }

    /// Listeners connect through `listenerDialers` in turn (the nodes of a cluster), the publisher through `dialer`.
    func run(dialer: Dialer, listenerDialers: [Dialer], warmup: Double, duration: Double, completion: @escaping (BenchResult) -> Void) {
        var ready = 0
        for index in 0..<listenerCount {
            let listener = Listener()
            listener.adapter.value = makeFanoutAdapter(target, session: session)
            listeners.append(listener)
            open(listener, dialer: listenerDialers[index % listenerDialers.count],
                 handshake: listener.adapter.value!.listenHandshake) { [unowned self] in
                ready += 1
                if ready == listenerCount { startPublisher(dialer: dialer, warmup: warmup, duration: duration, completion: completion) }
            } onData: { [unowned self] in receive(listener) }
        }
    }

    private func open(_ connection: Listener, dialer: Dialer, handshake: [UInt8],
                      onReady: @escaping () -> Void, onData: @escaping () -> Void) {
        dialer.dial { [self] transport in
            connection.transport = transport
            transport.start { [unowned self, unowned connection] event in
                guard case .data(let bytes) = event else {
                    if clock.phase != .done { abortBench("the server closed a connection") }
                    return
                }
                connection.inbound.append(bytes)
                if !connection.isReady {
                    guard connection.adapter.value!.isReady(&connection.inbound) else { return }
                    connection.isReady = true
                    onReady()
                }
                onData()
            }
            var bytes = handshake
            transport.write(&bytes)
        }
    }

    private func startPublisher(dialer: Dialer, warmup: Double, duration: Double, completion: @escaping (BenchResult) -> Void) {
        let publisher = Listener()
        publisher.adapter.value = makeFanoutAdapter(target, session: session)
        self.publisher = publisher
        open(publisher, dialer: dialer, handshake: publisher.adapter.value!.publisherHandshake) { [unowned self] in
            while unacknowledged < window, mayStillPost { post() }
            publisher.transport?.write(&publisher.outbound)
            clock.start(warmup: warmup, duration: duration, label: "fanout", count: { [unowned self] in totalDelivered },
                        onMeasure: { [unowned self] in delivered = 0; gaps = 0; reordered = 0; histogram.reset() },
                        onDone: { [unowned self] in finish(completion) })
        } onData: { [unowned self] in acknowledged() }
    }

    private func finish(_ completion: (BenchResult) -> Void) {
        for connection in listeners + [publisher].compactMap({ $0 }) {
            var farewell = connection.adapter.value!.farewell
            connection.transport?.write(&farewell)
            connection.transport?.closeNow()
        }
        var errors: [(String, Int)] = []
        if gaps > 0 { errors.append(("gaps", gaps)) }
        if reordered > 0 { errors.append(("out of order", reordered)) }
        if protocolErrors > 0 { errors.append(("protocol errors", protocolErrors)) }
        if let posts, totalDelivered < posts * listenerCount { errors.append(("undelivered", posts * listenerCount - totalDelivered)) }
        completion(BenchResult(
            workload: "fanout", parameters: "\(target.rawValue) \(listenerCount) listeners × \(size) B, window \(window)"
                + (session ? " in sessions" : ""),
            rate: Double(delivered) / clock.seconds, unit: "deliveries/s", latency: histogram, errors: errors,
            extra: [("posts/s", .int(Int(Double(delivered) / clock.seconds / Double(listenerCount))))]))
    }

    private var mayStillPost: Bool { clock.phase != .done && nextSequence < posts ?? .max }

    private func post() {
        guard let publisher else { return }
        var payload = [UInt8](repeating: 0, count: size)
        let now = EventLoop.nanoseconds()
        for i in 0..<8 {
            payload[i] = UInt8(truncatingIfNeeded: nextSequence >> (8 * i))
            payload[8 + i] = UInt8(truncatingIfNeeded: now >> (8 * i))
        }
        nextSequence += 1
        unacknowledged += 1
        publisher.adapter.value!.appendPost(payload, to: &publisher.outbound)
    }

    private func acknowledged() {
        guard let publisher, publisher.isReady else { return }
        guard let count = publisher.adapter.value!.acknowledgements(&publisher.inbound) else {
            abortBench("unexpected answer to a post from \(target.rawValue)")
        }
        unacknowledged -= count
        publisher.adapter.value!.appendAcknowledgement(to: &publisher.outbound, now: EventLoop.nanoseconds())
        while unacknowledged < window, mayStillPost { post() }
        if !publisher.outbound.isEmpty { publisher.transport?.write(&publisher.outbound) }
    }

    private func receive(_ listener: Listener) {
        guard listener.isReady else { return }
        let now = EventLoop.nanoseconds()
        let measuring = clock.phase == .measuring
        // Counted in locals, stored once per read: the client measures the server, so it keeps its own
        // per-delivery cost (run-time exclusivity checks on these properties included) down.
        var expected = listener.expected
        var count = 0, gaps = 0, reordered = 0, malformed = 0
        let ok = listener.adapter.value!.deliveries(&listener.inbound) { payload in
            guard payload.count >= 16 else { malformed += 1; return }
            let (sequence, sentAt) = payload.withUnsafeBytes {
                (UInt64(littleEndian: $0.loadUnaligned(as: UInt64.self)),
                 UInt64(littleEndian: $0.loadUnaligned(fromByteOffset: 8, as: UInt64.self)))
            }
            if let expected {
                if sequence > expected { gaps += Int(sequence - expected) } else if sequence < expected { reordered += 1 }
            }
            expected = sequence + 1
            count += 1
            if measuring { _ = histogram.record((now &- sentAt) / 1000) }
        }
        listener.expected = expected
        listener.adapter.value!.appendAcknowledgement(to: &listener.outbound, now: now)
        if !listener.outbound.isEmpty { listener.transport?.write(&listener.outbound) }
        totalDelivered += count
        if measuring { delivered += count }
        self.gaps += gaps
        self.reordered += reordered
        protocolErrors += malformed
        if !ok { protocolErrors += 1 }
        if let posts, totalDelivered == posts * listenerCount { clock.finish() }
    }
}
