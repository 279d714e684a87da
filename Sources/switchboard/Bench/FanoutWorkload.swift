import Histogram
import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// `fanout`: N listeners on `switchboard/room`, one publisher posting S-byte messages to
/// `switchboard/room.post` with at most D posts unanswered. Every delivery is counted and checked for
/// order and gaps; latency comes from a timestamp inside the payload.
final class FanoutWorkload {
    let loop: EventLoop
    let listenerCount: Int, size: Int, window: Int
    private var listeners: [Listener] = []
    private var publisher: TCPConnection?
    private var publisherInbound = InboundBuffer()
    private var publisherOutbound: [UInt8] = []
    private let clock: BenchClock
    private var histogram = makeHistogram()
    private var delivered = 0, totalDelivered = 0
    private var gaps = 0, reordered = 0, unexpected = 0
    private var nextSequence: UInt64 = 0
    private var unanswered = 0

    init(loop: EventLoop, listeners: Int, size: Int, window: Int) {
        self.loop = loop
        listenerCount = listeners
        self.size = max(size, 16)
        self.window = window
        clock = BenchClock(loop: loop)
    }

    final class Listener {
        let transport: TCPConnection
        var inbound = InboundBuffer()
        var expected: UInt64?
        var isListening = false
        init(transport: TCPConnection) { self.transport = transport }
    }

    func run(host: String, port: Int, warmup: Double, duration: Double, completion: @escaping (BenchResult) -> Void) {
        var listening = 0
        let listen = try! Frame.call(id: 1, channel: "switchboard/room", method: "listen")
        for _ in 0..<listenerCount {
            TCPConnection.connect(loop: loop, host: host, port: port) { [self] result in
                guard case .success(let transport) = result else { abortBench("cannot connect to \(host):\(port)") }
                let listener = Listener(transport: transport)
                listeners.append(listener)
                transport.start { [unowned self, unowned listener] event in
                    receive(event, listener) {
                        listening += 1
                        if listening == listenerCount { connectPublisher(host: host, port: port, warmup: warmup, duration: duration, completion: completion) }
                    }
                }
                var bytes = listen
                transport.write(&bytes)
            }
        }
    }

    private func connectPublisher(host: String, port: Int, warmup: Double, duration: Double,
                                  completion: @escaping (BenchResult) -> Void) {
        TCPConnection.connect(loop: loop, host: host, port: port) { [self] result in
            guard case .success(let transport) = result else { abortBench("cannot connect to \(host):\(port)") }
            publisher = transport
            transport.start { [unowned self] event in publisherEvent(event) }
            while unanswered < window { post() }
            transport.write(&publisherOutbound)
            clock.start(warmup: warmup, duration: duration, label: "fanout", count: { [unowned self] in totalDelivered },
                        onMeasure: { [unowned self] in delivered = 0; gaps = 0; reordered = 0; histogram.reset() },
                        onDone: { [unowned self] in
                for listener in listeners { listener.transport.closeNow() }
                publisher?.closeNow()
                var errors: [(String, Int)] = []
                if gaps > 0 { errors.append(("gaps", gaps)) }
                if reordered > 0 { errors.append(("out of order", reordered)) }
                if unexpected > 0 { errors.append(("unexpected frames", unexpected)) }
                completion(BenchResult(
                    workload: "fanout", parameters: "\(listenerCount) listeners × \(size) B, window \(window)",
                    rate: Double(delivered) / clock.seconds, unit: "deliveries/s", latency: histogram, errors: errors,
                    extra: [("posts/s", .int(Int(Double(delivered) / clock.seconds / Double(listenerCount))))]))
            })
        }
    }

    /// Appends one post: sequence number and send time, little-endian, padded to `size` bytes.
    private func post() {
        var payload = [UInt8](repeating: 0, count: size)
        let now = EventLoop.nanoseconds()
        for i in 0..<8 {
            payload[i] = UInt8(truncatingIfNeeded: nextSequence >> (8 * i))
            payload[8 + i] = UInt8(truncatingIfNeeded: now >> (8 * i))
        }
        nextSequence += 1
        unanswered += 1
        Frame.write(.message, id: UInt32(truncatingIfNeeded: nextSequence), channel: "switchboard/room.post",
                    payload: payload, to: &publisherOutbound)
    }

    private func publisherEvent(_ event: TCPEvent) {
        guard case .data(let bytes) = event else {
            if clock.phase != .done { abortBench("the server closed the publisher") }
            return
        }
        publisherInbound.append(bytes)
        _ = scanFrames(&publisherInbound) { _, frame in
            guard frame.type == Frame.Kind.reply.rawValue else { unexpected += 1; return }
            unanswered -= 1
            if clock.phase != .done { post() }
        }
        if !publisherOutbound.isEmpty { publisher?.transport(&publisherOutbound) }
    }

    private func receive(_ event: TCPEvent, _ listener: Listener, onListening: () -> Void) {
        guard case .data(let bytes) = event else {
            if clock.phase != .done { abortBench("the server closed a listener") }
            return
        }
        listener.inbound.append(bytes)
        let now = EventLoop.nanoseconds()
        var justListening = false
        _ = scanFrames(&listener.inbound) { buffer, frame in
            if frame.type == Frame.Kind.reply.rawValue, !listener.isListening {
                listener.isListening = true
                justListening = true
                return
            }
            // A success envelope holding a Uint8List: 00 08 size(1, 3 or 5 bytes) bytes…
            guard frame.type == Frame.Kind.message.rawValue, frame.payload.count >= 3 + 16,
                  buffer[frame.payload.lowerBound] == 0, buffer[frame.payload.lowerBound + 1] == 8 else {
                unexpected += 1
                return
            }
            var start = frame.payload.lowerBound + 3
            if buffer[frame.payload.lowerBound + 2] == 254 { start += 2 } else if buffer[frame.payload.lowerBound + 2] == 255 { start += 4 }
            var sequence: UInt64 = 0, sentAt: UInt64 = 0
            for i in 0..<8 {
                sequence |= UInt64(buffer[start + i]) << (8 * i)
                sentAt |= UInt64(buffer[start + 8 + i]) << (8 * i)
            }
            if let expected = listener.expected {
                if sequence > expected { gaps += Int(sequence - expected) } else if sequence < expected { reordered += 1 }
            }
            listener.expected = sequence + 1
            totalDelivered += 1
            if clock.phase == .measuring {
                delivered += 1
                _ = histogram.record((now &- sentAt) / 1000)
            }
        }
        if justListening { onListening() }
    }
}

extension TCPConnection {
    /// Writes and empties `bytes` (a spelling that reads well at call sites holding optionals).
    func transport(_ bytes: inout [UInt8]) { write(&bytes) }
}

extension Frame {
    /// A StandardMethodCodec call frame.
    static func call(id: UInt32, channel: String, method: String, arguments: ChannelValue = .null) throws -> [UInt8] {
        Frame(.message, id: id, channel: channel,
              payload: try StandardMethodCodec().encodeMethodCall(MethodCall(method: method, arguments: arguments))).bytes
    }
}
