import Histogram
import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// `rpc`: C connections, each keeping D echo calls of an S-byte Uint8List in flight.
final class RPCWorkload {
    let loop: EventLoop
    let connections: Int, depth: Int, size: Int
    private var clients: [Client] = []
    private let clock: BenchClock
    private var histogram = makeHistogram()
    private var completed = 0
    private var totalCompleted = 0
    private var errors: [String: Int] = [:]
    /// The request frame, with its id (bytes 8-11) patched per call.
    private let template: [UInt8]
    private let expectedReplyPayload: Int

    init(loop: EventLoop, connections: Int, depth: Int, size: Int) throws {
        self.loop = loop
        self.connections = connections
        self.depth = depth
        self.size = size
        clock = BenchClock(loop: loop)
        let argument = ChannelValue.uint8List([UInt8](repeating: 0x5A, count: size))
        var frame: [UInt8] = []
        Frame.write(.message, id: 0, channel: "switchboard/echo",
                    payload: try StandardMethodCodec().encodeMethodCall(MethodCall(method: "echo", arguments: argument)),
                    to: &frame)
        template = frame
        expectedReplyPayload = try StandardMethodCodec().encodeSuccessEnvelope(argument).count
    }

    final class Client {
        let transport: TCPConnection
        var inbound = InboundBuffer()
        var outbound: [UInt8] = []
        var sentAt: [UInt64]
        var nextRound: [UInt32]
        init(transport: TCPConnection, depth: Int) {
            self.transport = transport
            sentAt = Array(repeating: 0, count: depth)
            nextRound = Array(repeating: 0, count: depth)
        }
    }

    func run(host: String, port: Int, warmup: Double, duration: Double, completion: @escaping (BenchResult) -> Void) {
        var pending = connections
        for _ in 0..<connections {
            TCPConnection.connect(loop: loop, host: host, port: port) { [self] result in
                guard case .success(let transport) = result else { abortBench("cannot connect to \(host):\(port)") }
                let client = Client(transport: transport, depth: depth)
                clients.append(client)
                transport.start { [unowned self, unowned client] event in handle(event, client) }
                pending -= 1
                if pending == 0 { startLoad(warmup: warmup, duration: duration, completion: completion) }
            }
        }
    }

    private func startLoad(warmup: Double, duration: Double, completion: @escaping (BenchResult) -> Void) {
        for client in clients {
            for slot in 0..<depth { send(slot, on: client) }
            client.transport.write(&client.outbound)
        }
        clock.start(warmup: warmup, duration: duration, label: "rpc", count: { [unowned self] in totalCompleted },
                    onMeasure: { [unowned self] in completed = 0; histogram.reset(); errors = [:] },
                    onDone: { [unowned self] in
            for client in clients { client.transport.closeNow() }
            completion(BenchResult(
                workload: "rpc", parameters: "\(connections)×\(depth)×\(size) B", rate: Double(completed) / clock.seconds,
                unit: "calls/s", latency: histogram, errors: errors.sorted { $0.key < $1.key }))
        })
    }

    private func send(_ slot: Int, on client: Client) {
        let id = client.nextRound[slot] &* UInt32(depth) &+ UInt32(slot) &+ 1
        client.nextRound[slot] &+= 1
        let start = client.outbound.count
        client.outbound.append(contentsOf: template)
        client.outbound[start + 8] = UInt8(truncatingIfNeeded: id >> 24)
        client.outbound[start + 9] = UInt8(truncatingIfNeeded: id >> 16)
        client.outbound[start + 10] = UInt8(truncatingIfNeeded: id >> 8)
        client.outbound[start + 11] = UInt8(truncatingIfNeeded: id)
        client.sentAt[slot] = EventLoop.nanoseconds()
    }

    private func handle(_ event: TCPEvent, _ client: Client) {
        guard case .data(let bytes) = event else {
            if clock.phase != .done { abortBench("the server closed a connection") }
            return
        }
        client.inbound.append(bytes)
        let now = EventLoop.nanoseconds()
        let ok = scanFrames(&client.inbound) { _, frame in
            guard frame.type == Frame.Kind.reply.rawValue, frame.payload.count == expectedReplyPayload else {
                errors["unexpected frame", default: 0] += 1
                return
            }
            let slot = Int((frame.id &- 1) % UInt32(depth))
            totalCompleted += 1
            if clock.phase == .measuring {
                completed += 1
                _ = histogram.record((now - client.sentAt[slot]) / 1000)
            }
            if clock.phase != .done { send(slot, on: client) }
        }
        if !ok { abortBench("malformed frame from the server") }
        if !client.outbound.isEmpty { client.transport.write(&client.outbound) }
    }
}
