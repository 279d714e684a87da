import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// `idle`: opens N connections, makes sure the server has each one (a PING answered), holds them, and
/// reports the server's resident memory per connection when its pid is given.
final class IdleWorkload {
    let loop: EventLoop
    let target: BenchTarget
    let count: Int
    private var connections: [TCPConnection] = []
    private var answered = 0
    private var started = 0

    init(loop: EventLoop, target: BenchTarget, count: Int) {
        self.loop = loop
        self.target = target
        self.count = count
    }

    /// A handshake that proves the server has set the connection up (a PING answered, or HELLO/CONNECT).
    private func adapter(_ index: Int) -> any RPCAdapter {
        switch target {
        case .switchboard: (try? SwitchboardRPC(size: 0, relayChannel: nil))!
        case .redis: RedisRPC(size: 0)
        case .nats: NATSRPC(size: 0, inbox: "_INBOX.idle.\(index)")
        }
    }

    func run(host: String, port: Int, hold: Double, serverPID: Int32?, completion: @escaping (BenchResult) -> Void) {
        let before = serverPID.flatMap(residentKiB)
        let begin = EventLoop.nanoseconds()
        func connectMore() {
            while started < count, started - answered < 256 {  // at most 256 handshakes under way
                started += 1
                let adapter = adapter(started)
                TCPConnection.connect(loop: loop, host: host, port: port) { [self] result in
                    guard case .success(let transport) = result else { abortBench("cannot connect (\(started) opened): \(result)") }
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
