import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// What a request's caller is told: the REPLY payload, or why there is none.
typealias ReplyHandler = (Result<[UInt8]?, any Error>) -> Void

/// One active `listen` of this client; re-sent after a reconnect.
final class StreamListener {
    let channel: String
    let codec: any MethodCodec
    let arguments: ChannelValue
    /// Receives events and error events.
    let onEvent: (Result<ChannelValue, ChannelError>) -> Void
    /// Called once when the stream ends: nil for end of stream, else why it failed.
    let onEnd: ((any Error)?) -> Void
    /// Credit granted and not yet used, for paced (Combine) listeners; nil = push mode.
    var credit: UInt32?
    var isEnded = false

    init(channel: String, codec: any MethodCodec, arguments: ChannelValue, credit: UInt32?,
         onEvent: @escaping (Result<ChannelValue, ChannelError>) -> Void, onEnd: @escaping ((any Error)?) -> Void) {
        self.channel = channel
        self.codec = codec
        self.arguments = arguments
        self.credit = credit
        self.onEvent = onEvent
        self.onEnd = onEnd
    }

    func end(_ error: (any Error)?) {
        guard !isEnded else { return }
        isEnded = true
        onEnd(error)
    }
}

/// Answers the server's MESSAGE (id != 0) on one channel: gets the payload, returns the REPLY payload
/// (nil = null reply; a thrown error is answered with a null reply too).
typealias IncomingHandler = @Sendable ([UInt8]?) async throws -> [UInt8]?

/// A request of this client's that waits for its answer.
struct PendingRequest {
    let reply: ReplyHandler
    let deadline: UInt64?
    let channel: String
    /// The position just past its frame in the client's stream: written once the stream has sent it.
    var streamEnd: UInt64
}

/// A session the server granted (protocol/resumption.md): its token and the WELCOME's values, and how
/// much of the server's stream the client has received.
final class LiveSession {
    let token: String
    let ttlMs: UInt64
    let ackBytes: UInt64
    let ackMs: UInt64
    /// The client's received position: whole frames of the server's stream, handled.
    var received: UInt64 = 0
    /// The received position last told to the server (POSITION, or a resuming HELLO).
    var told: UInt64 = 0
    /// When the connection was lost (nanoseconds), while the session is parked.
    var lostAt: UInt64?
    /// A reconnect was tried after the time to live ran out: the next failure gives up.
    var triedPastTTL = false

    init?(_ granted: ChannelValue?) {
        guard let granted, let token = granted["token"]?.stringValue else { return nil }
        self.token = token
        ttlMs = UInt64(min(max(0, granted["ttlMs"]?.intValue ?? 0), 1 << 40))  // a day is 2^27 ms: no overflow in ns
        ackBytes = UInt64(max(1, granted["ackBytes"]?.intValue ?? 65536))
        ackMs = UInt64(max(1, granted["ackMs"]?.intValue ?? 1000))
    }
}

/// The loop-owned state of a ``Client``: one connection at a time, its requests, streams and handlers.
final class ClientCore {
    let config: ClientConfiguration
    let loop: EventLoop
    private let publishState: (ConnectionState) -> Void
    private let publishSession: (SessionEvent) -> Void
    private var transport: (any Transport)?
    private var inbound = InboundBuffer()
    private var decoder = FrameDecoder(maxFrame: 1 << 30)
    /// Frames outside the client's stream (HELLO, POSITION, END), written before it.
    private var outbound: [UInt8] = []
    /// The client's stream: every other frame.
    private var output: OutboundStream
    /// HELLO sent, its answer not read: the stream waits.
    private var awaitingWelcome = false
    /// The session, if the server granted one (kept while parked).
    private var session: LiveSession?
    /// The current connection's HELLO presented `session`'s token.
    private var resuming = false
    /// When each connection that ended after sending a resuming HELLO and before its answer stops
    /// explaining a `session_taken` (``EventLoop/nanoseconds()``): the server may still read such a HELLO,
    /// later, and take the session from this client's newer connection, but not for ever (protocol/resumption.md).
    private var unansweredResumes: [UInt64] = []
    /// How long a connection given up with its resuming HELLO unanswered may explain a `session_taken`.
    static let lateHelloWindow: UInt64 = 10_000_000_000
    /// What to tell the application once the new session after a failed resume is set up.
    private var restartReport: SessionRestart?
    private var ackTimer: Timer?
    private var ackTimerArmed = false
    /// Gives up a connection whose HELLO goes unanswered for the request timeout.
    private var handshakeTimer: Timer?
    private(set) var state = ConnectionState.connecting
    private var pending: [UInt32: PendingRequest] = [:]
    /// Ids in `pending` that are PINGs (answered by PONG, never cancelled on the wire).
    private var pings: Set<UInt32> = []
    private var streams: [String: StreamListener] = [:]
    var handlers: [String: IncomingHandler] = [:]
    /// Channels this client holds (REGISTER payloads), registered again after every reconnect.
    private var registrations: [String: [UInt8]?] = [:]
    private var incoming: [UInt32: Task<Void, Never>] = [:]
    private var connectWaiters: [(Result<Void, ClientError>) -> Void] = []
    private var hasConnected = false
    /// The server sent GOAWAY: the ends of stream it sends while stopping are not the producers' ends,
    /// so those streams are kept and listened to again after reconnecting.
    private var serverIsGoingAway = false
    private var isClosing = false
    private var attempt = 0
    private var internalID: UInt32 = 0x8000_0000
    private var beforeSleep: BeforeSleep?
    private var sweep: Timer?
    private var reconnectTimer: Timer?

    init(config: ClientConfiguration, loop: EventLoop, publishState: @escaping (ConnectionState) -> Void,
         publishSession: @escaping (SessionEvent) -> Void) {
        self.config = config
        self.loop = loop
        self.publishState = publishState
        self.publishSession = publishSession
        output = OutboundStream(bound: config.session?.maxUnacknowledgedBytes ?? .max)
    }

    private func setState(_ new: ConnectionState) {
        guard state != new else { return }
        state = new
        publishState(new)
    }

    // MARK: Connecting

    func start(_ completion: @escaping (Result<Void, ClientError>) -> Void) {
        connectWaiters.append(completion)
        beforeSleep = try? BeforeSleep(loop: loop) { [unowned self] in flush() }
        sweep = try? Timer(loop: loop)
        sweep?.start(after: 10, repeat: 10) { [unowned self] in expireRequests() }
        ackTimer = try? Timer(loop: loop)
        handshakeTimer = try? Timer(loop: loop)
        connect()
    }

    private func connect() {
        setState(.connecting)
        TCPConnection.connect(loop: loop, host: config.host, port: config.port) { [unowned self] result in
            switch result {
            case .failure(let error): connectionEnded("cannot connect to \(config.host):\(config.port): \(error)")
            case .success(let connection):
                guard !isClosing else { return connection.closeNow() }
                let layers = ClientLayers(tls: config.tls, serverName: config.serverName ?? config.host, webSocket: config.webSocket)
                let transport: any Transport
                do { transport = try layers.wrap(connection, loop: loop) } catch {
                    connection.closeNow()
                    return connectionEnded("cannot start TLS: \(error)")
                }
                self.transport = transport
                serverIsGoingAway = false
                inbound.clear()
                transport.start { [unowned self] event in handle(event) }
                awaitingWelcome = true
                if let limit = config.requestTimeout {
                    handshakeTimer?.start(after: UInt64(min(max(0, limit / .milliseconds(1)), 1e12))) { [unowned self] in
                        guard awaitingWelcome, let transport = self.transport else { return }
                        transport.closeNow()
                        connectionEnded("no WELCOME within \(limit)")
                    }
                }
                resuming = session != nil
                if let session { session.told = session.received }
                writeControl(.hello, id: nextInternalID(), payload: helloPayload())
            }
        }
    }

    /// The HELLO: with the session's token and received position when resuming, asking for a new
    /// session when the configuration wants one.
    private func helloPayload(newSession: Bool = false) -> [UInt8]? {
        var hello: [ChannelValue.MapEntry] = [.init("version", 1), .init("client", .string(config.clientName))]
        if let token = config.token { hello.append(.init("token", .string(token))) }
        if let session, !newSession {
            hello.append(.init("session", .stringMap(["token": .string(session.token), "position": .int64(Int64(session.received))])))
        } else if config.session != nil {
            hello.append(.init("session", .map([])))
        }
        return try? JSONText.serialize(.map(hello))
    }

    /// WELCOME: the session resumed, or a new connection (with a new session or none) is ready.
    private func welcomed(_ payload: [UInt8]?) {
        guard awaitingWelcome else { return }  // a later WELCOME is in the stream and means nothing new
        awaitingWelcome = false
        handshakeTimer?.stop()
        let granted = payload.flatMap { try? JSONText.parse($0) }?["session"]
        if let parked = session, resuming {
            resuming = false
            guard granted?["token"]?.stringValue == parked.token, case .bool(true)? = granted?["resumed"] else {
                fallBack("unsupported")
                return adopt(granted)
            }
            guard let position = granted?["position"]?.intValue, position >= 0, output.resume(from: UInt64(position)) else {
                fallBack("position")
                transport?.closeNow()
                return connectionEnded("the server resumed from a position the client does not have")
            }
            parked.lostAt = nil
            parked.triedPastTTL = false
            attempt = 0
            setState(.connected)
            return publishSession(.resumed)
        }
        adopt(granted)
    }

    /// Starts the connection's new session (when granted) and sets the connection up.
    private func adopt(_ granted: ChannelValue?) {
        session = config.session == nil ? nil : LiveSession(granted)
        didConnect()
    }

    private func didConnect() {
        attempt = 0
        hasConnected = true
        setState(.connected)
        let waiters = connectWaiters
        connectWaiters = []
        for waiter in waiters { waiter(.success(())) }
        for (channel, declaration) in registrations {
            write(.register, id: nextInternalID(), channel: channel, payload: declaration)
        }
        for listener in streams.values { sendListen(listener) }
        if let report = restartReport {
            restartReport = nil
            publishSession(.restarted(report))
        }
    }

    /// The session cannot go on (protocol/resumption.md, "What the client does then"): requests written
    /// on it fail with `session_lost`, those never written go on the next session, requests forwarded
    /// to this client are forgotten, and the application is told once the next session is set up.
    private func fallBack(_ reason: String) {
        guard session != nil else { return }
        session = nil
        resuming = false
        unansweredResumes = []
        stopAckTimer()
        var failed: [String] = []
        for (id, entry) in pending where entry.streamEnd <= output.sent {
            pending.removeValue(forKey: id)
            pings.remove(id)
            if id < 0x8000_0000 { failed.append(entry.channel) }
            entry.reply(.failure(ClientError.sessionLost))
        }
        for task in incoming.values { task.cancel() }
        incoming = [:]
        carryUnsentRequests()
        restartReport = SessionRestart(reason: reason, streams: streams.keys.sorted(), channels: registrations.keys.sorted(),
                                       failedRequests: failed)
    }

    /// Starts a fresh stream holding only the application's requests (and posts) never written, once
    /// the requests written are answered or failed. Everything else in it is made again for the next
    /// connection (listens, registrations) or belonged to the old one: the client's own requests among
    /// it fail as with a lost connection (a listen is made again; a REGISTER's caller is told).
    private func carryUnsentRequests() {
        let unsent = output.unsentFrames()
        output = OutboundStream(bound: output.bound)
        for frame in unsent {
            let isRequest = (frame.kind == .message || frame.kind == .ping) && frame.id < 0x8000_0000 && pending[frame.id] != nil
            guard isRequest || (frame.kind == .message && frame.id == 0) else { continue }
            let end = output.append(frame.kind, id: frame.id, channel: frame.channel, payload: frame.payload)
            if frame.id != 0 { pending[frame.id]?.streamEnd = end }
        }
        let dropped = pending.filter { $0.key >= 0x8000_0000 }
        for id in dropped.keys { pending.removeValue(forKey: id) }
        for entry in dropped.values { entry.reply(.failure(ClientError.connectionLost)) }
    }

    // MARK: Holding channels (broker routing)

    /// Sends REGISTER (or UNREGISTER with a nil declaration's `remove`) and reports the server's answer.
    func register(_ channel: String, declaration: [UInt8]?, remove: Bool, reply: @escaping ReplyHandler) {
        if remove { registrations.removeValue(forKey: channel) } else { registrations[channel] = declaration }
        guard state == .connected else {
            return reply(remove ? .success(nil) : .failure(isClosing ? ClientError.closed : ClientError.connectionLost))
        }
        let id = nextInternalID()
        let end = write(remove ? .unregister : .register, id: id, channel: channel, payload: remove ? nil : declaration)
        pending[id] = PendingRequest(reply: { [unowned self] result in
            if case .failure = result, !remove { registrations.removeValue(forKey: channel) }
            reply(result)
        }, deadline: nil, channel: channel, streamEnd: end)
    }

    /// The connection is gone (or never came): fail what waits on it, then reconnect if allowed. When
    /// the client is closing, the loop stops too, unless `stopsLoop` is false (a graceful close whose
    /// last bytes are still leaving: the transport's `.closed` stops it).
    private func connectionEnded(_ reason: String, permanent: Bool = false, stopsLoop: Bool = true) {
        transport = nil
        outbound.removeAll()
        if resuming { unansweredResumes.append(EventLoop.nanoseconds() + Self.lateHelloWindow) }
        resuming = false
        awaitingWelcome = false
        handshakeTimer?.stop()
        stopAckTimer()
        if let parked = session, !isClosing, !permanent, hasConnected, config.reconnect != nil {
            park(parked)
        } else {
            session = nil
            // Without a session, what was written is lost with the connection; requests never written
            // wait for the next one when the client reconnects.
            let keepsUnsent = !isClosing && !permanent && hasConnected && config.reconnect != nil
            let failed = pending.filter { !keepsUnsent || $0.value.streamEnd <= output.sent }
            for id in failed.keys {
                pending.removeValue(forKey: id)
                pings.remove(id)
            }
            for (_, entry) in failed { entry.reply(.failure(isClosing ? ClientError.closed : ClientError.connectionLost)) }
            for task in incoming.values { task.cancel() }
            incoming = [:]
            carryUnsentRequests()
        }
        if isClosing {
            for listener in streams.values { listener.end(nil) }
            streams = [:]
            handlers = [:]  // they may capture the client (a producer's sink does): let it go
            registrations = [:]
            setState(.closed)
            if stopsLoop { loop.stop() }
            return
        }
        if !hasConnected || permanent || config.reconnect == nil {
            let waiters = connectWaiters
            connectWaiters = []
            for waiter in waiters { waiter(.failure(.connectionFailed(reason))) }
            if !hasConnected || permanent {
                for listener in streams.values { listener.end(ClientError.connectionFailed(reason)) }
                streams = [:]
                isClosing = true
                setState(.closed)
                return loop.stop()
            }
        }
        setState(.disconnected(reason: reason))
        reconnect()
    }

    /// The session's connection is lost: keep everything, and give up once no connection came within
    /// the time to live and one more try.
    private func park(_ parked: LiveSession) {
        let now = EventLoop.nanoseconds()
        let lostAt = parked.lostAt ?? now
        parked.lostAt = lostAt
        guard now - lostAt > parked.ttlMs * 1_000_000 else { return }
        if parked.triedPastTTL { fallBack("expired") } else { parked.triedPastTTL = true }
    }

    private func reconnect() {
        guard let policy = config.reconnect else { return }
        let delay = policy.delay(attempt: attempt)
        attempt += 1
        let timer = reconnectTimer ?? (try? Timer(loop: loop))
        reconnectTimer = timer
        timer?.start(after: UInt64(delay / .milliseconds(1))) { [unowned self] in
            if !isClosing { connect() }
        }
    }

    func close() {
        guard !isClosing else { return }
        isClosing = true
        reconnectTimer?.stop()
        guard let transport else { return connectionEnded("closed") }
        if session != nil, !awaitingWelcome { writeControl(.end, payload: nil) }  // ends the session on purpose
        session = nil
        // The last writes (a CANCEL, say) leave before the loop stops: the transport reports `.closed`
        // once the server has closed its side too, or the linger timer gives up after a second.
        flush()
        transport.closeAfterWrites()
        let linger = reconnectTimer ?? (try? Timer(loop: loop))
        reconnectTimer = linger
        linger?.start(after: 1000) { [unowned self] in
            transport.closeNow()
            loop.stop()
        }
        connectionEnded("closed", stopsLoop: linger == nil)
    }

    // MARK: Requests

    private func nextInternalID() -> UInt32 {
        internalID = internalID == UInt32.max ? 0x8000_0000 : internalID + 1
        return internalID
    }

    /// Sends a MESSAGE with `id` (from the client's id space, below 0x80000000) and calls `reply` once.
    func request(id: UInt32, channel: String, payload: [UInt8]?, timeout: Duration?, reply: @escaping ReplyHandler) {
        guard canSend else {
            return reply(.failure(isClosing ? ClientError.closed : ClientError.connectionLost))
        }
        let deadline = timeout.map { EventLoop.nanoseconds() + UInt64($0 / .nanoseconds(1)) }
        let end = write(.message, id: id, channel: channel, payload: payload)
        pending[id] = PendingRequest(reply: reply, deadline: deadline, channel: channel, streamEnd: end)
    }

    /// Sends a PING with `id`; its PONG completes `reply`.
    func ping(id: UInt32, timeout: Duration?, reply: @escaping ReplyHandler) {
        guard canSend else {
            return reply(.failure(isClosing ? ClientError.closed : ClientError.connectionLost))
        }
        let end = write(.ping, id: id, payload: nil)
        pending[id] = PendingRequest(reply: reply, deadline: timeout.map { EventLoop.nanoseconds() + UInt64($0 / .nanoseconds(1)) },
                                     channel: "", streamEnd: end)
        pings.insert(id)
    }

    /// Connected, or with a session that keeps what is sent until its connection is back.
    private var canSend: Bool { state == .connected || session != nil }

    /// The caller gave up: CANCEL the request (a ping needs none) and fail it now.
    func cancel(id: UInt32, with error: any Error = CancellationError()) {
        guard let entry = pending.removeValue(forKey: id) else { return }
        if pings.remove(id) == nil { write(.cancel, id: id, payload: nil) }
        entry.reply(.failure(error))
    }

    private func expireRequests() {
        let now = EventLoop.nanoseconds()
        for (id, entry) in pending where (entry.deadline ?? .max) <= now { cancel(id: id, with: ClientError.timedOut) }
    }

    /// Sends a MESSAGE nobody answers (id 0).
    func post(channel: String, payload: [UInt8]?) {
        guard canSend else { return }
        write(.message, id: 0, channel: channel, payload: payload)
    }

    // MARK: Streams

    func listen(_ listener: StreamListener) {
        streams[listener.channel]?.end(nil)  // one stream per channel and connection, as on the server
        streams[listener.channel] = listener
        if canSend { sendListen(listener) }
    }

    private func sendListen(_ listener: StreamListener) {
        if let credit = listener.credit, credit > 0 { sendDemand(credit, channel: listener.channel) }
        let payload: [UInt8]
        do { payload = try listener.codec.encodeMethodCall(MethodCall(method: "listen", arguments: listener.arguments)) } catch {
            return endStream(listener, error)
        }
        request(id: nextInternalID(), channel: listener.channel, payload: payload, timeout: config.requestTimeout) { [unowned self] result in
            switch result {
            case .success(nil): endStream(listener, MissingImplementation(channel: listener.channel, method: "listen"))
            case .success(let bytes?):
                do {
                    if case .failure(let refusal) = try listener.codec.decodeEnvelope(bytes) { endStream(listener, refusal) }
                } catch { endStream(listener, ClientError.badReply("\(error)")) }
            case .failure(let error as ClientError) where error == .connectionLost || error == .sessionLost:
                break  // listened again on reconnect
            case .failure(let error): endStream(listener, error)
            }
        }
    }

    private func endStream(_ listener: StreamListener, _ error: (any Error)?) {
        if streams[listener.channel] === listener { streams.removeValue(forKey: listener.channel) }
        listener.end(error)
    }

    /// The listener is done with its stream: tell the server (if the stream is still the channel's).
    func stopListening(_ listener: StreamListener) {
        guard streams[listener.channel] === listener else { return }
        streams.removeValue(forKey: listener.channel)
        listener.end(nil)
        guard canSend,
              let payload = try? listener.codec.encodeMethodCall(MethodCall(method: "cancel", arguments: listener.arguments))
        else { return }
        request(id: nextInternalID(), channel: listener.channel, payload: payload, timeout: config.requestTimeout) { _ in }
    }

    /// Grants credit to the listener's stream (DEMAND).
    func addCredit(_ n: UInt32, to listener: StreamListener) {
        guard streams[listener.channel] === listener else { return }
        listener.credit = n == .max ? nil : (listener.credit ?? 0) &+ n
        if canSend { sendDemand(n, channel: listener.channel) }
    }

    private func sendDemand(_ n: UInt32, channel: String) {
        var payload: [UInt8] = []
        Frame.appendBigEndian(n, to: &payload)
        write(.demand, channel: channel, payload: payload)
    }

    // MARK: Input

    private func handle(_ event: TransportEvent) {
        switch event {
        case .data(let bytes):
            inbound.append(bytes)
            while true {
                let peeked: FrameDecoder.Peeked?
                do { peeked = try decoder.peek(inbound) } catch {
                    transport?.closeNow()
                    return connectionEnded("the server sent a malformed frame")
                }
                guard let peeked, transport != nil else { return }
                let frame: Frame? = if case .frame(let view, _) = peeked { view.frame } else { nil }
                inbound.consume(peeked.length)
                let counted = awaitingWelcome ? nil : session
                let inStream = counted != nil && (frame.map(Self.isInStream) ?? true)
                if let frame { handleFrame(frame) }
                if inStream, let counted, counted === session { didReceive(UInt64(peeked.length), counted) }
            }
        case .closed(let error):
            transport?.closeNow()
            connectionEnded(error.map { "connection lost: \($0)" } ?? "the server closed the connection")
        case .failed(let failure):
            transport?.closeNow()
            connectionEnded(failure.message)
        case .drained: break
        }
    }

    /// The ERROR codes after which the server closes the connection: not in the session's stream.
    private static let closingErrorCodes: Set<String> = [
        "malformed_frame", "frame_too_large", "unauthorized", "bad_hello", "unsupported_version", "slow_consumer", "timeout",
        "session_taken",
    ]

    /// Whether a frame from the server is in its stream (protocol/resumption.md, "Streams and positions").
    private static func isInStream(_ frame: Frame) -> Bool {
        switch frame.kind {
        case .hello, .welcome, .position, .end: return false
        case .error:
            let code = frame.payload.flatMap { try? JSONText.parse($0) }?["code"]?.stringValue ?? ""
            return code != "cannot_resume" && !closingErrorCodes.contains(code)
        default: return true
        }
    }

    /// A frame of the server's stream was handled: count it, and acknowledge per the WELCOME's values.
    private func didReceive(_ bytes: UInt64, _ session: LiveSession) {
        session.received += bytes
        if session.received - session.told >= session.ackBytes { return sendPosition(session) }
        guard !ackTimerArmed, let ackTimer else { return }
        ackTimerArmed = true
        ackTimer.start(after: session.ackMs) { [unowned self] in
            ackTimerArmed = false
            if let session = self.session, transport != nil, !awaitingWelcome, session.received > session.told { sendPosition(session) }
        }
    }

    private func sendPosition(_ session: LiveSession) {
        stopAckTimer()
        session.told = session.received
        var payload: [UInt8] = []
        Frame.appendBigEndian(UInt32(truncatingIfNeeded: session.received >> 32), to: &payload)
        Frame.appendBigEndian(UInt32(truncatingIfNeeded: session.received), to: &payload)
        writeControl(.position, payload: payload)
    }

    private func stopAckTimer() {
        ackTimerArmed = false
        ackTimer?.stop()
    }

    private func handleFrame(_ frame: Frame) {
        switch frame.kind {
        case .welcome: welcomed(frame.payload)
        case .reply: pending.removeValue(forKey: frame.id)?.reply(.success(frame.payload))
        case .error:
            let body = frame.payload.flatMap { try? JSONText.parse($0) } ?? .null
            let code = body["code"]?.stringValue ?? "error"
            if code == "cannot_resume", resuming {
                // The connection stays, as if no HELLO had come: ask it for a new session.
                fallBack(body["details"]?["reason"]?.stringValue ?? "unknown")
                return writeControl(.hello, id: nextInternalID(), payload: helloPayload(newSession: true))
            }
            if code == "session_taken", frame.id == 0, session != nil {
                transport?.closeNow()
                let now = EventLoop.nanoseconds()
                unansweredResumes.removeAll { $0 <= now }
                guard !unansweredResumes.isEmpty else {
                    // No connection of this client's could have taken it: someone else has its token.
                    fallBack("taken")
                    return connectionEnded("the session was taken over by another connection")
                }
                // Most likely one of this client's own earlier connections, whose HELLO the server read
                // late: that connection is gone, so the session is parked again. Resume it once more.
                unansweredResumes.removeFirst()
                return connectionEnded("the session moved to an earlier connection of this client")
            }
            let error = ClientError(code: code, message: body["message"]?.stringValue ?? "",
                                    details: body["details"] ?? .null)
            if let entry = pending.removeValue(forKey: frame.id) {
                entry.reply(.failure(error))
            } else if state == .connecting {  // refused at HELLO: retrying cannot help
                transport?.closeNow()
                connectionEnded("\(error)", permanent: true)
            }
        case .message where frame.id == 0:
            guard let listener = streams[frame.channel] else { return }
            guard let payload = frame.payload else {
                if serverIsGoingAway, config.reconnect != nil { return }  // resumed after reconnecting
                return endStream(listener, nil)
            }
            if let credit = listener.credit, credit > 0 { listener.credit = credit - 1 }
            do { listener.onEvent(try listener.codec.decodeEnvelope(payload)) } catch {
                listener.onEvent(.failure(ChannelError(code: "bad_event", message: "\(error)")))
            }
        case .message: answerIncoming(frame)
        case .cancel: incoming[frame.id]?.cancel()
        case .ping: write(.pong, id: frame.id, payload: frame.payload)
        case .pong:
            if pings.remove(frame.id) != nil { pending.removeValue(forKey: frame.id)?.reply(.success(nil)) }
        case .goAway: serverIsGoingAway = true
        case .position:
            guard session != nil, let payload = frame.payload, payload.count == 8 else { return }
            output.acknowledge(payload.reduce(0) { $0 << 8 | UInt64($1) })
        case .end:
            guard session != nil else { return }
            session = nil
            unansweredResumes = []  // a late HELLO names the ended session's token
            stopAckTimer()
            output.acknowledgeWritten()
            let reason = frame.payload.flatMap { try? JSONText.parse($0) }?["reason"]?.stringValue ?? "ended"
            publishSession(.ended(reason: reason, streams: streams.keys.sorted()))
        case .hello, .register, .unregister, .demand: break
        }
    }

    /// The server calls one of this client's channels: run its handler, send exactly one REPLY.
    private func answerIncoming(_ frame: Frame) {
        guard let handler = handlers[frame.channel] else {
            write(.reply, id: frame.id, payload: nil)
            return
        }
        let id = frame.id, payload = frame.payload, handle = loop.handle
        let core = LoopBound(self, loop: handle)
        incoming[id] = Task {
            let outcome: Result<[UInt8]?, any Error>
            do { outcome = .success(try await handler(payload)) } catch { outcome = .failure(error) }
            handle.execute {
                let core = core.value
                guard core.incoming.removeValue(forKey: id) != nil else { return }  // connection gone meanwhile
                // Clients never send ERROR frames: handlers turn failures into error envelopes; anything
                // else they throw becomes a null reply.
                core.write(.reply, id: id, payload: (try? outcome.get()) ?? nil)
            }
        }
    }

    // MARK: Output

    /// Adds a frame to the client's stream (kept while a session's connection is away, else dropped
    /// without a connection) and returns the position just past it.
    @discardableResult
    private func write(_ kind: Frame.Kind, id: UInt32 = 0, channel: String = "", payload: [UInt8]?) -> UInt64 {
        guard transport != nil || session != nil else { return output.end }
        return output.append(kind, id: id, channel: channel, payload: payload)
    }

    /// Writes a frame outside the stream (HELLO, POSITION, END).
    private func writeControl(_ kind: Frame.Kind, id: UInt32 = 0, payload: [UInt8]?) {
        guard transport != nil else { return }
        Frame.write(kind, id: id, channel: "", payload: payload, to: &outbound)
    }

    private func flush() {
        guard let transport else { return }
        var bytes: [UInt8] = []
        swap(&bytes, &outbound)  // a failed write reports back synchronously and clears `outbound`
        while !awaitingWelcome, let next = output.nextWrite() {
            bytes.append(contentsOf: next)
            guard session == nil else { break }  // a session's bound holds the rest back
            output.acknowledgeWritten()
        }
        guard !bytes.isEmpty else { return }
        transport.write(&bytes)
    }
}
