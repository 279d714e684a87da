import Histogram
import SwitchboardTransport
import SwitchboardWire

/// `rpc` (and `relay`): C connections, each keeping D requests of S bytes in flight, against any target.
/// A responder connection (NATS) or holder (Switchboard relay) answers requests inside the tool.
final class RPCWorkload {
    let loop: EventLoop
    let target: BenchTarget, connections: Int, depth: Int, size: Int, relay: Bool
    /// Whether each caller asks for a resumable session and acknowledges its stream (`--session`).
    let session: Bool
    /// Calls to make in all, when fixed (`--operations`).
    let limit: Int?
    private var sent = 0
    private var clients: [Client] = []
    private let clock: BenchClock
    private var histogram = makeHistogram()
    private var completed = 0, totalCompleted = 0, errors = 0
    private var responder: Responder?
    /// Holds the callers back while a holder on another node is made known.
    private var delay: Timer?

    init(loop: EventLoop, target: BenchTarget, connections: Int, depth: Int, size: Int, relay: Bool, session: Bool = false,
         limit: Int?) {
        self.loop = loop
        self.target = target
        self.connections = connections
        self.depth = depth
        self.size = size
        self.relay = relay
        self.session = session
        self.limit = limit
        clock = BenchClock(loop: loop)
    }

    final class Client {
        let adapter: any RPCAdapter
        var transport: (any Transport)?
        var inbound = InboundBuffer()
        var outbound: [UInt8] = []
        /// Send times of the requests in flight, oldest first (a ring of `depth` entries).
        var sentAt: [UInt64]
        var head = 0, inFlight = 0
        var isReady = false
        init(adapter: any RPCAdapter, depth: Int) {
            self.adapter = adapter
            sentAt = Array(repeating: 0, count: depth)
        }
    }

    /// The in-tool answering side of two-hop request/reply.
    final class Responder {
        let transport: any Transport
        var inbound = InboundBuffer()
        var outbound: [UInt8] = []
        let respond: (inout InboundBuffer, inout [UInt8]) -> Bool
        init(transport: any Transport, respond: @escaping (inout InboundBuffer, inout [UInt8]) -> Bool) {
            self.transport = transport
            self.respond = respond
        }
    }

    /// Runs with the callers on `dialer`'s server and the responder or holder on `responderDialer`'s
    /// (another node of a cluster, if it differs: the callers then start half a second after the
    /// holder is in place, so that its subscription has reached the other nodes).
    func run(dialer: Dialer, responderDialer: Dialer, warmup: Double, duration: Double,
             completion: @escaping (BenchResult) -> Void) throws {
        self.scheme = dialer.scheme
        let start = { [self] in connectClients(dialer: dialer, warmup: warmup, duration: duration, completion: completion) }
        let startAfterResponder = responderDialer.port == dialer.port ? start : { [self] in
            guard let timer = try? Timer(loop: loop) else { abortBench("cannot start a timer") }
            delay = timer
            timer.start(after: 500, start)
        }
        switch (target, relay) {
        case (.nats, _):
            let nats = NATSResponder()
            connectResponder(dialer: responderDialer, handshake: nats.handshake, respond: nats.respond, then: startAfterResponder)
        case (.switchboard, true):
            let holder = SwitchboardHolder(channel: "bench/relay")
            connectResponder(dialer: responderDialer, handshake: holder.handshake, respond: holder.respond, then: startAfterResponder)
        case (.redis, true):
            abortBench("relay has no Redis equivalent")
        default:
            start()
        }
    }

    private func connectResponder(dialer: Dialer, handshake: [UInt8],
                                  respond: @escaping (inout InboundBuffer, inout [UInt8]) -> Bool, then: @escaping () -> Void) {
        dialer.dial { [self] transport in
            let responder = Responder(transport: transport, respond: respond)
            self.responder = responder
            var started = false
            transport.start { [unowned self, unowned responder] event in
                guard case .data(let bytes) = event else {
                    if clock.phase != .done { abortBench("the server closed the responder") }
                    return
                }
                responder.inbound.append(bytes)
                let ready = responder.respond(&responder.inbound, &responder.outbound)
                if !responder.outbound.isEmpty { responder.transport.write(&responder.outbound) }
                if ready, !started { started = true; then() }
            }
            var hello = handshake
            transport.write(&hello)
        }
    }

    private func makeAdapter(index: Int) throws -> any RPCAdapter {
        switch target {
        case .switchboard: try SwitchboardRPC(size: size, relayChannel: relay ? "bench/relay" : nil, session: session)
        case .redis: RedisRPC(size: size)
        case .nats: NATSRPC(size: size, inbox: "_INBOX.bench.\(index)")
        }
    }

    private func connectClients(dialer: Dialer, warmup: Double, duration: Double, completion: @escaping (BenchResult) -> Void) {
        var waiting = connections
        for index in 0..<connections {
            let client = Client(adapter: try! makeAdapter(index: index), depth: depth)
            clients.append(client)
            dialer.dial { [self] transport in
                client.transport = transport
                transport.start { [unowned self, unowned client] event in
                    handle(event, client) {
                        waiting -= 1
                        if waiting == 0 { startLoad(warmup: warmup, duration: duration, completion: completion) }
                    }
                }
                var hello = client.adapter.handshake
                transport.write(&hello)
            }
        }
    }

    private var scheme = "tcp"
    private var parameters: String {
        "\(target.rawValue) \(connections)×\(depth)×\(size) B" + (scheme == "tcp" ? "" : " over \(scheme)") + (session ? " in sessions" : "")
    }

    private func startLoad(warmup: Double, duration: Double, completion: @escaping (BenchResult) -> Void) {
        for client in clients {
            while client.inFlight < depth, mayStillSend { send(client) }
            client.transport?.write(&client.outbound)
        }
        clock.start(warmup: warmup, duration: duration, label: relay ? "relay" : "rpc", count: { [unowned self] in totalCompleted },
                    onMeasure: { [unowned self] in completed = 0; errors = 0; histogram.reset() },
                    onDone: { [unowned self] in
            for client in clients {
                var farewell = client.adapter.farewell
                client.transport?.write(&farewell)
                client.transport?.closeNow()
            }
            responder?.transport.closeNow()
            completion(BenchResult(
                workload: relay ? "relay" : "rpc", parameters: parameters, rate: Double(completed) / clock.seconds,
                unit: "calls/s", latency: histogram,
                errors: (errors > 0 ? [("protocol errors", errors)] : []) + unanswered))
        })
    }

    /// Calls of a fixed-size run still unanswered when the time ran out.
    private var unanswered: [(String, Int)] {
        guard let limit, totalCompleted < limit else { return [] }
        return [("unanswered", limit - totalCompleted)]
    }

    private var mayStillSend: Bool { clock.phase != .done && sent < limit ?? .max }

    private func send(_ client: Client) {
        sent += 1
        client.adapter.appendRequest(to: &client.outbound)
        client.sentAt[(client.head + client.inFlight) % depth] = EventLoop.nanoseconds()
        client.inFlight += 1
    }

    private func handle(_ event: TransportEvent, _ client: Client, onReady: () -> Void) {
        guard case .data(let bytes) = event else {
            if clock.phase != .done { abortBench("the server closed a connection") }
            return
        }
        client.inbound.append(bytes)
        if !client.isReady {
            guard client.adapter.isReady(&client.inbound) else { return }
            client.isReady = true
            return onReady()
        }
        guard let replies = client.adapter.takeReplies(&client.inbound) else {
            errors += 1
            abortBench("unexpected reply from \(target.rawValue)")
        }
        let now = EventLoop.nanoseconds()
        for _ in 0..<replies {
            let sentAt = client.sentAt[client.head]
            client.head = (client.head + 1) % depth
            client.inFlight -= 1
            totalCompleted += 1
            if clock.phase == .measuring {
                completed += 1
                _ = histogram.record((now - sentAt) / 1000)
            }
            if mayStillSend { send(client) }
        }
        client.adapter.appendAcknowledgement(to: &client.outbound, now: now)
        if totalCompleted == limit { clock.finish() }
        if !client.outbound.isEmpty { client.transport?.write(&client.outbound) }
    }
}
