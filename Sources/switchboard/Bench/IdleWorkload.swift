import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// `idle`: opens N connections, makes sure the server has each one (a PING answered), holds them, and
/// reports the server's resident memory per connection when its pid is given.
final class IdleWorkload {
    let loop: EventLoop
    let target: BenchTarget
    let count: Int
    private var connections: [any Transport] = []
    private var answered = 0
    private var started = 0

    init(loop: EventLoop, target: BenchTarget, count: Int) {
        self.loop = loop
        self.target = target
        self.count = count
    }


    func run(dialer: Dialer, hold: Double, serverPID: Int32?, completion: @escaping (BenchResult) -> Void) {
        let before = serverPID.flatMap(residentKiB)
        let begin = EventLoop.nanoseconds()
        func connectMore() {
            while started < count, started - answered < 256 {  // at most 256 handshakes under way
                started += 1
                let adapter = greeting(target, index: started)
                dialer.dial { [self] transport in
                    connections.append(transport)
                    var buffer = InboundBuffer()
                    var isReady = false
                    transport.start { [unowned self] event in
                        guard case .data(let bytes) = event else { abortBench("the server closed an idle connection") }
                        buffer.append(bytes)
                        guard !isReady, adapter.isReady(&buffer) else { return }
                        isReady = true
                        buffer.clear()
                        answered += 1
                        if answered == count { allOpen() } else { connectMore() }
                    }
                    var hello = adapter.handshake
                    transport.write(&hello)
                }
            }
        }
        func allOpen() {
            let openSeconds = Double(EventLoop.nanoseconds() - begin) / 1e9
            let timer = try? Timer(loop: loop)
            timer?.start(after: UInt64(hold * 1000)) { [self] in
                timer?.cancel()
                let after = serverPID.flatMap(residentKiB)
                var extra: [(String, ChannelValue)] = [("connections", .int(count)), ("open seconds", .float64(openSeconds))]
                var rate = 0.0
                if let before, let after {
                    rate = Double((after - before) * 1024) / Double(count)
                    extra += [("server RSS before KiB", .int(before)), ("server RSS after KiB", .int(after))]
                }
                for connection in connections { connection.closeNow() }
                completion(BenchResult(workload: "idle", parameters: "\(target.rawValue) \(count) connections", rate: rate,
                                       unit: serverPID == nil ? "bytes/connection (give --server-pid)" : "server bytes/connection",
                                       latency: nil, extra: extra))
            }
        }
        connectMore()
    }
}
