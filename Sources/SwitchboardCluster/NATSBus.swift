import Logging
import SwitchboardCodec
import SwitchboardTransport

/// A ``ClusterBus`` over one connection to a NATS server, on a libuv loop.
///
/// It connects to the listed servers in turn, with a backoff that doubles from `reconnectDelayMs` up to
/// `maxReconnectDelayMs` and starts again after a good connection. Each (re)connection reads `INFO`,
/// sends `CONNECT`, every subscription's `SUB`, then `PING`: the `PONG` marks it connected. An attempt
/// not connected within `connectTimeoutMs` (a server that accepts but never answers) fails, and the
/// next server is tried. A `PING` every `pingIntervalMs` that goes unanswered `maxPingsOut` times in a
/// row marks the connection dead; what was published after the last answered `PING` is counted as
/// possibly lost.
/// Requests use one wildcard inbox subscription; a request open when the connection goes completes
/// with `.disconnected`.
public final class NATSBus: ClusterBus {
    /// A server to connect to.
    public struct Server: Sendable, Equatable, CustomStringConvertible {
        public var host: String
        public var port: Int

        public init(host: String, port: Int) {
            self.host = host
            self.port = port
        }

        /// `nats://host:port`, `host:port` or `host` (port 4222); the host is a name, an IPv4 address or
        /// an IPv6 address in brackets (`nats://[::1]:4222`).
        public init?(url: String) {
            var rest = Substring(url)
            if rest.hasPrefix("nats://") { rest = rest.dropFirst("nats://".count) }
            let host: Substring, port: Substring?
            if rest.hasPrefix("["), let close = rest.firstIndex(of: "]") {
                host = rest[rest.index(after: rest.startIndex)..<close]
                let after = rest[rest.index(after: close)...]
                guard after.isEmpty || after.hasPrefix(":") else { return nil }
                port = after.isEmpty ? nil : after.dropFirst()
            } else {
                let parts = rest.split(separator: ":", omittingEmptySubsequences: false)
                guard parts.count <= 2 else { return nil }
                host = parts[0]
                port = parts.count == 2 ? parts[1] : nil
            }
            guard !host.isEmpty else { return nil }
            guard let port else { self.init(host: String(host), port: 4222); return }
            guard let number = Int(port), (1...65_535).contains(number) else { return nil }
            self.init(host: String(host), port: number)
        }

        public var description: String { host.contains(":") ? "nats://[\(host)]:\(port)" : "nats://\(host):\(port)" }
    }

    public struct Options: Sendable {
        public var servers: [Server]
        /// The connection's name, as the NATS server shows it.
        public var name: String
        public var reconnectDelayMs: UInt64 = 50
        public var maxReconnectDelayMs: UInt64 = 2000
        /// How long an attempt may take, from the TCP connect to the `PONG` that confirms it (nats.go's
        /// default is 2 s).
        public var connectTimeoutMs: UInt64 = 2000
        public var pingIntervalMs: UInt64 = 2000
        public var maxPingsOut = 2
        /// Bytes waiting to be written past which a publish is dropped (and counted).
        public var maxPendingBytes = 8 << 20
        /// Whether what this bus publishes also reaches its own subscriptions (NATS's `echo`).
        public var echo = true

        public init(servers: [Server], name: String) {
            self.servers = servers
            self.name = name
        }
    }

    public private(set) var counters = BusCounters()
    public var isConnected: Bool { phase == .connected }
    /// Called on the loop when the bus connects (true) or loses its connection (false).
    public var onConnectionChange: ((Bool) -> Void)?

    private let loop: EventLoop
    private let options: Options
    private let logger: Logger
    /// `handshaking`: waiting for INFO; `confirming`: CONNECT and the SUBs sent, waiting for the PONG.
    private enum Phase { case idle, connecting, handshaking, confirming, connected, closed }
    private var phase = Phase.idle
    private var transport: (any Transport)?
    /// Which connection attempt a transport's events belong to: a late event of an old one is ignored.
    private var generation = 0
    private var parser = NATSParser()
    /// The largest message the server takes, from its INFO (NATS's default until one arrives).
    public private(set) var maxPayload = NATSBus.defaultMaxPayload
    static let defaultMaxPayload = 1 << 20
    private var outbound: [UInt8] = []
    private var flusher: BeforeSleep?
    private let retryTimer: Timer
    private let connectTimer: Timer
    private let pingTimer: Timer
    private var pingsOut = 0
    /// `messagesOut` when each PING still unanswered was sent, oldest first: its PONG confirms that the
    /// server read every message before it.
    private var pingMarks: [Int] = []
    /// `messagesOut` as the last PONG confirmed it.
    private var confirmedOut = 0
    private var serverIndex = 0
    private var failedAttempts = 0
    private var hasConnected = false
    /// Whether the bus's failing to connect was logged as a warning since it last connected: the first
    /// failure after a connection (or at start) is, the retries after it are not.
    private var warnedOfFailure = false

    private struct Subscription {
        let subject: String
        let queue: String?
        let handler: (BusMessage) -> Void
    }
    private var subscriptions: [UInt64: Subscription] = [:]
    private var nextSid: UInt64 = 1

    private struct PendingRequest {
        let completion: (BusReply) -> Void
        let timer: Timer
    }
    private let inbox: String
    private var inboxSubscription: BusSubscription?
    private var requests: [UInt64: PendingRequest] = [:]
    private var nextRequest: UInt64 = 1

    /// A bus on `loop` (loop thread only); ``start()`` connects it.
    public init(loop: EventLoop, options: Options, logger: Logger) throws(UVError) {
        precondition(!options.servers.isEmpty, "NATSBus needs at least one server")
        self.loop = loop
        self.options = options
        var logger = logger
        logger[metadataKey: "bus"] = "nats"
        self.logger = logger
        retryTimer = try Timer(loop: loop)
        connectTimer = try Timer(loop: loop)
        pingTimer = try Timer(loop: loop)
        inbox = "_INBOX.\(UInt64.random(in: 1...UInt64.max)).\(EventLoop.nanoseconds())"
    }

    /// Connects, and keeps reconnecting until ``close()``.
    public func start() {
        guard phase == .idle else { return }
        if flusher == nil { flusher = try? BeforeSleep(loop: loop) { [weak self] in self?.flush() } }
        connect()
    }

    /// Disconnects for good: open requests complete with `.disconnected`, and every handler is let go
    /// (one that captures the bus would otherwise keep it alive).
    public func close() {
        phase = .closed
        retryTimer.cancel()
        connectTimer.cancel()
        pingTimer.cancel()
        flusher?.cancel()
        flusher = nil
        dropConnection()
        failRequests()
        subscriptions = [:]
        inboxSubscription = nil
        onConnectionChange = nil
    }

    // MARK: ClusterBus

    public func publish(_ subject: String, replyTo: String? = nil, headers: [BusMessage.Header] = [],
                        payload: [UInt8]) throws(BusError) {
        try check(subject, headers: headers, payload: payload)
        if let replyTo, !NATSCommand.isValidSubject(replyTo) { throw .invalidSubject(replyTo) }
        enqueue(subject, replyTo: replyTo, headers: headers, payload: payload)
    }

    public func subscribe(_ subject: String, queue: String? = nil, _ handler: @escaping (BusMessage) -> Void) throws(BusError) -> BusSubscription {
        guard NATSCommand.isValidSubject(subject) else { throw .invalidSubject(subject) }
        if let queue, !NATSCommand.isValidSubject(queue) { throw .invalidSubject(queue) }
        return subscribeChecked(subject, queue: queue, handler)
    }

    private func subscribeChecked(_ subject: String, queue: String?, _ handler: @escaping (BusMessage) -> Void) -> BusSubscription {
        let sid = nextSid
        nextSid += 1
        subscriptions[sid] = Subscription(subject: subject, queue: queue, handler: handler)
        if phase == .connected || phase == .confirming { outbound += NATSCommand.subscribe(subject, queue: queue, sid: sid) }
        return BusSubscription(id: sid)
    }

    public func unsubscribe(_ subscription: BusSubscription) {
        guard subscriptions.removeValue(forKey: subscription.id) != nil else { return }
        if phase == .connected || phase == .confirming { outbound += NATSCommand.unsubscribe(sid: subscription.id) }
    }

    public func request(_ subject: String, headers: [BusMessage.Header] = [], payload: [UInt8], timeoutMs: UInt64,
                        _ completion: @escaping (BusReply) -> Void) throws(BusError) {
        try check(subject, headers: headers, payload: payload)
        guard phase == .connected else { return completion(.disconnected) }
        if inboxSubscription == nil {
            inboxSubscription = subscribeChecked("\(inbox).*", queue: nil) { [weak self] message in self?.deliverReply(message) }
        }
        guard let timer = try? Timer(loop: loop) else { return completion(.disconnected) }
        let token = nextRequest
        nextRequest += 1
        requests[token] = PendingRequest(completion: completion, timer: timer)
        timer.start(after: timeoutMs) { [weak self] in self?.complete(token, .timedOut) }
        enqueue(subject, replyTo: "\(inbox).\(token)", headers: headers, payload: payload)
    }

    public func reply(to request: BusMessage, headers: [BusMessage.Header] = [], payload: [UInt8]) throws(BusError) {
        guard let replyTo = request.replyTo else { return }
        try check(replyTo, headers: headers, payload: payload)
        enqueue(replyTo, replyTo: nil, headers: headers, payload: payload)
    }

    /// Refuses what the NATS protocol cannot carry as it is (see ``BusError``). The last subject and
    /// header list that passed are remembered: a caller that sends the same ones again (the same
    /// strings and array, compared by identity first) is not checked byte by byte again.
    private func check(_ subject: String, headers: [BusMessage.Header], payload: [UInt8]) throws(BusError) {
        if subject != lastValidSubject {
            guard NATSCommand.isValidSubject(subject) else { throw .invalidSubject(subject) }
            lastValidSubject = subject
        }
        var size = payload.count
        if !headers.isEmpty {
            if headers != lastValidHeaders.list {
                for header in headers where !NATSCommand.isValidHeader(header) { throw .invalidHeader(header.name) }
                lastValidHeaders = (headers, NATSCommand.headerBlockSize(headers))
            }
            size += lastValidHeaders.size
        }
        guard size <= maxPayload else { throw .tooLarge(size, limit: maxPayload) }
    }
    private var lastValidSubject: String?
    private var lastValidHeaders: (list: [BusMessage.Header], size: Int) = ([], 0)

    // MARK: Connection

    private func connect() {
        guard phase != .closed else { return }
        phase = .connecting
        generation += 1
        let attempt = generation
        let server = options.servers[serverIndex % options.servers.count]
        connectTimer.start(after: options.connectTimeoutMs) { [weak self] in
            guard let self, attempt == self.generation else { return }
            self.attemptFailed("no answer within \(self.options.connectTimeoutMs) ms")
        }
        TCPConnection.connect(loop: loop, host: server.host, port: server.port) { [weak self] result in
            guard let self, attempt == self.generation, self.phase == .connecting else {
                if case .success(let connection) = result { connection.closeNow() }
                return
            }
            switch result {
            case .failure(let error):
                self.attemptFailed("\(error)")
            case .success(let connection):
                self.phase = .handshaking
                self.transport = connection
                self.parser = NATSParser()
                connection.start { [weak self] event in self?.handle(event, of: attempt) }
            }
        }
    }

    private func handle(_ event: TransportEvent, of attempt: Int) {
        guard attempt == generation else { return }
        switch event {
        case .data(let bytes):
            parser.feed(bytes)
            do {
                while let operation = try parser.next() {
                    process(operation)
                    guard attempt == generation else { return }  // the operation ended the connection
                }
            } catch {
                logger.warning("protocol error from the NATS server: \(error)")
                lost()
            }
        case .closed(let error):
            logger.debug("NATS connection closed\(error.map { ": \($0)" } ?? "")")
            lost()
        case .failed(let failure):
            logger.warning("NATS connection failed: \(failure)")
            lost()
        case .drained:
            break
        }
    }

    private func process(_ operation: NATSInbound) {
        switch operation {
        case .info(let json):
            guard phase == .handshaking else { return }  // a later INFO (cluster changes) needs nothing
            // Never more than a bus (this one or a peer) takes in: a message published here comes back to the buses.
            let serverLimit = (try? JSONText.parse(Array(json.utf8)))?["max_payload"]?.intValue ?? NATSBus.defaultMaxPayload
            maxPayload = min(serverLimit, parser.maxPayload)
            outbound += NATSCommand.connect(name: options.name, echo: options.echo)
            for (sid, subscription) in subscriptions.sorted(by: { $0.key < $1.key }) {
                outbound += NATSCommand.subscribe(subscription.subject, queue: subscription.queue, sid: sid)
            }
            sendPing()
            phase = .confirming
            flush()
        case .pong:
            pingsOut = 0
            if !pingMarks.isEmpty { confirmedOut = pingMarks.removeFirst() }
            if phase == .confirming { didConnect() }
        case .ping:
            outbound += NATSCommand.pong
        case .ok:
            break
        case .error(let text):
            counters.serverErrors += 1
            if text.lowercased().contains("slow consumer") { counters.slowConsumer += 1 }
            logger.warning("NATS server error: \(text)")
        case .message(let sid, let message):
            guard let subscription = subscriptions[sid] else { return }  // unsubscribed meanwhile
            counters.messagesIn += 1
            counters.bytesIn += message.payload.count
            subscription.handler(message)
        }
    }

    private func didConnect() {
        phase = .connected
        connectTimer.stop()
        failedAttempts = 0
        warnedOfFailure = false
        if hasConnected { counters.reconnects += 1 }
        hasConnected = true
        logger.info("connected to \(options.servers[serverIndex % options.servers.count])")
        pingTimer.start(after: options.pingIntervalMs, repeat: options.pingIntervalMs) { [weak self] in self?.ping() }
        onConnectionChange?(true)
    }

    private func ping() {
        guard phase == .connected else { return }
        guard pingsOut < options.maxPingsOut else {
            logger.info("NATS server did not answer \(pingsOut) pings: reconnecting")
            return lost()
        }
        pingsOut += 1
        sendPing()
    }

    private func sendPing() {
        pingMarks.append(counters.messagesOut)
        outbound += NATSCommand.ping
    }

    /// The connection failed or ended: requests fail, and the next server is tried after a delay.
    private func lost() {
        guard phase == .connected else { return attemptFailed("the connection ended") }
        counters.possiblyLost += counters.messagesOut - confirmedOut
        dropConnection()
        failRequests()
        warnedOfFailure = true  // the owner hears, and says so once
        onConnectionChange?(false)
        guard phase != .closed else { return }
        serverIndex += 1
        scheduleReconnect()
    }

    /// An attempt that did not get as far as connected (refused, ended, or timed out): counted and
    /// logged, and the next server is tried after a delay. Only the first failure since the bus was
    /// last connected is a warning.
    private func attemptFailed(_ reason: String) {
        guard phase != .closed else { return }
        let server = options.servers[serverIndex % options.servers.count]
        counters.connectFailures += 1
        if warnedOfFailure {
            logger.info("cannot connect to \(server): \(reason)")
        } else {
            warnedOfFailure = true
            logger.warning("the cluster bus cannot connect to \(server): \(reason); trying the listed servers in turn")
        }
        dropConnection()
        serverIndex += 1
        scheduleReconnect()
    }

    private func dropConnection() {
        generation += 1
        connectTimer.stop()
        pingTimer.stop()
        pingsOut = 0
        pingMarks.removeAll()
        confirmedOut = counters.messagesOut
        outbound.removeAll()
        transport?.closeNow()
        transport = nil
        if phase != .closed { phase = .idle }
    }

    private func scheduleReconnect() {
        guard phase != .closed else { return }
        phase = .idle
        let delay = min(options.maxReconnectDelayMs, options.reconnectDelayMs << min(failedAttempts, 16))
        failedAttempts += 1
        retryTimer.start(after: delay) { [weak self] in self?.connect() }
    }

    // MARK: Messages

    private func enqueue(_ subject: String, replyTo: String?, headers: [BusMessage.Header], payload: [UInt8]) {
        guard phase == .connected, let transport,
              transport.queuedBytes + outbound.count + payload.count <= options.maxPendingBytes else {
            counters.dropped += 1
            return
        }
        NATSCommand.publish(subject, replyTo: replyTo, headers: headers, payload: payload, into: &outbound)
        counters.messagesOut += 1
        counters.bytesOut += payload.count
    }

    /// Writes what was queued this loop turn, in one write.
    public func flush() {
        guard !outbound.isEmpty, let transport, transport.isOpen else { return }
        transport.write(&outbound)
    }

    private func deliverReply(_ message: BusMessage) {
        guard let token = message.subject.split(separator: ".").last.flatMap({ UInt64($0) }) else { return }
        complete(token, message.status == 503 ? .noResponders : .reply(message))
    }

    private func complete(_ token: UInt64, _ reply: BusReply) {
        guard let request = requests.removeValue(forKey: token) else { return }
        request.timer.cancel()
        request.completion(reply)
    }

    private func failRequests() {
        let open = requests
        requests = [:]
        for (_, request) in open.sorted(by: { $0.key < $1.key }) {
            request.timer.cancel()
            request.completion(.disconnected)
        }
    }
}
