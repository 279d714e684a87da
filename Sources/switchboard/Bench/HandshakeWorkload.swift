import Histogram
import SwitchboardTransport
import SwitchboardWire

/// `handshakes`: C connections at a time, each opened (with `--tls`, its TLS handshake; with `--ws`, its
/// upgrade), greeted as the target expects (HELLO and WELCOME, or PING and PONG) and closed, over and
/// over. Reports new connections per second and the time each took.
final class HandshakeWorkload {
    let loop: EventLoop
    let target: BenchTarget, concurrency: Int
    private let clock: BenchClock
    private var histogram = makeHistogram()
    private var completed = 0, totalCompleted = 0

    init(loop: EventLoop, target: BenchTarget, concurrency: Int) {
        self.loop = loop
        self.target = target
        self.concurrency = concurrency
        clock = BenchClock(loop: loop)
    }

    func run(dialer: Dialer, warmup: Double, duration: Double, completion: @escaping (BenchResult) -> Void) {
        clock.start(warmup: warmup, duration: duration, label: "handshakes", count: { [unowned self] in totalCompleted },
                    onMeasure: { [unowned self] in completed = 0; histogram.reset() },
                    onDone: { [unowned self] in
            completion(BenchResult(workload: "handshakes", parameters: "\(target.rawValue) ×\(concurrency) over \(dialer.scheme)",
                                   rate: Double(completed) / clock.seconds, unit: "connections/s", latency: histogram, errors: []))
        })
        for index in 0..<concurrency { next(dialer, index: index) }
    }

    /// One connection: open, greet, close, then the next.
    private func next(_ dialer: Dialer, index: Int) {
        guard clock.phase != .done else { return }
        let began = EventLoop.nanoseconds()
        let greeting = greeting(target, index: index)
        dialer.dial { [self] transport in
            var buffer = InboundBuffer()
            transport.start { [unowned self] event in
                if case .drained = event { return }
                guard case .data(let bytes) = event else {
                    if clock.phase != .done { abortBench("the server closed a connection before greeting it: \(event)") }
                    return
                }
                buffer.append(bytes)
                guard greeting.isReady(&buffer) else { return }
                transport.closeNow()
                totalCompleted += 1
                if clock.phase == .measuring {
                    completed += 1
                    _ = histogram.record((EventLoop.nanoseconds() - began) / 1000)
                }
                next(dialer, index: index)
            }
            var hello = greeting.handshake
            transport.write(&hello)
        }
    }
}
