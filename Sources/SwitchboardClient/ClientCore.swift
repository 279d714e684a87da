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

/// The loop-owned state of a ``Client``: one connection at a time, its requests, streams and handlers.
final class ClientCore {
    let config: ClientConfiguration
    let loop: EventLoop
    private let publishState: (ConnectionState) -> Void
    private var transport: (any Transport)?
    private var inbound = InboundBuffer()
    private var decoder = FrameDecoder(maxFrame: 1 << 30)
    private var outbound: [UInt8] = []
    private(set) var state = ConnectionState.connecting
    private var pending: [UInt32: (reply: ReplyHandler, deadline: UInt64?)] = [:]
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

    init(config: ClientConfiguration, loop: EventLoop, publishState: @escaping (ConnectionState) -> Void) {
        self.config = config
        self.loop = loop
        self.publishState = publishState
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
                var hello: [ChannelValue.MapEntry] = [.init("version", 1), .init("client", .string(config.clientName))]
                if let token = config.token { hello.append(.init("token", .string(token))) }
                write(.hello, id: nextInternalID(), payload: try? JSONText.serialize(.map(hello)))
            }
        }
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
    }

    // MARK: Holding channels (broker routing)

    /// Sends REGISTER (or UNREGISTER with a nil declaration's `remove`) and reports the server's answer.
    func register(_ channel: String, declaration: [UInt8]?, remove: Bool, reply: @escaping ReplyHandler) {
        if remove { registrations.removeValue(forKey: channel) } else { registrations[channel] = declaration }
        guard state == .connected else {
            return reply(remove ? .success(nil) : .failure(isClosing ? ClientError.closed : ClientError.connectionLost))
        }
        let id = nextInternalID()
        pending[id] = ({ [unowned self] result in
            if case .failure = result, !remove { registrations.removeValue(forKey: channel) }
            reply(result)
        }, nil)
        write(remove ? .unregister : .register, id: id, channel: channel, payload: remove ? nil : declaration)
    }

    /// The connection is gone (or never came): fail what waits on it, then reconnect if allowed. When
    /// the client is closing, the loop stops too, unless `stopsLoop` is false (a graceful close whose
    /// last bytes are still leaving: the transport's `.closed` stops it).
    private func connectionEnded(_ reason: String, permanent: Bool = false, stopsLoop: Bool = true) {
        transport = nil
        outbound.removeAll()
        let failed = pending
        pending = [:]
        pings = []
        for (_, entry) in failed { entry.reply(.failure(isClosing ? ClientError.closed : ClientError.connectionLost)) }
        for task in incoming.values { task.cancel() }
        incoming = [:]
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
        guard state == .connected else {
            return reply(.failure(isClosing ? ClientError.closed : ClientError.connectionLost))
        }
        let deadline = timeout.map { EventLoop.nanoseconds() + UInt64($0 / .nanoseconds(1)) }
        pending[id] = (reply, deadline)
        write(.message, id: id, channel: channel, payload: payload)
    }

    /// Sends a PING with `id`; its PONG completes `reply`.
    func ping(id: UInt32, timeout: Duration?, reply: @escaping ReplyHandler) {
        guard state == .connected else {
            return reply(.failure(isClosing ? ClientError.closed : ClientError.connectionLost))
        }
        pending[id] = (reply, timeout.map { EventLoop.nanoseconds() + UInt64($0 / .nanoseconds(1)) })
        pings.insert(id)
        write(.ping, id: id, payload: nil)
    }

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
        guard state == .connected else { return }
        write(.message, id: 0, channel: channel, payload: payload)
    }

    // MARK: Streams

    func listen(_ listener: StreamListener) {
        streams[listener.channel]?.end(nil)  // one stream per channel and connection, as on the server
        streams[listener.channel] = listener
        if state == .connected { sendListen(listener) }
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
            case .failure(let error as ClientError) where error == .connectionLost: break  // listened again on reconnect
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
        guard state == .connected,
              let payload = try? listener.codec.encodeMethodCall(MethodCall(method: "cancel", arguments: listener.arguments))
        else { return }
        request(id: nextInternalID(), channel: listener.channel, payload: payload, timeout: config.requestTimeout) { _ in }
    }

    /// Grants credit to the listener's stream (DEMAND).
    func addCredit(_ n: UInt32, to listener: StreamListener) {
        guard streams[listener.channel] === listener else { return }
        listener.credit = n == .max ? nil : (listener.credit ?? 0) &+ n
        if state == .connected { sendDemand(n, channel: listener.channel) }
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
                let decoded: FrameDecoder.Decoded?
                do { decoded = try decoder.next(from: &inbound) } catch {
                    transport?.closeNow()
                    return connectionEnded("the server sent a malformed frame")
                }
                guard let decoded, transport != nil else { return }
                if case .frame(let frame) = decoded { handleFrame(frame) }
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

    private func handleFrame(_ frame: Frame) {
        switch frame.kind {
        case .welcome: didConnect()
        case .reply: pending.removeValue(forKey: frame.id)?.reply(.success(frame.payload))
        case .error:
            let body = frame.payload.flatMap { try? JSONText.parse($0) } ?? .null
            let error = ClientError(code: body["code"]?.stringValue ?? "error", message: body["message"]?.stringValue ?? "",
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
        case .hello, .register, .unregister, .demand, .position, .end: break  // never asks for a session (yet)
        }
    }

    /// The server calls one of this client's channels: run its handler, send exactly one REPLY.
    private func answerIncoming(_ frame: Frame) {
        guard let handler = handlers[frame.channel] else { return write(.reply, id: frame.id, payload: nil) }
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

    private func write(_ kind: Frame.Kind, id: UInt32 = 0, channel: String = "", payload: [UInt8]?) {
        guard transport != nil else { return }
        Frame.write(kind, id: id, channel: channel, payload: payload, to: &outbound)
    }

    private func flush() {
        guard let transport, !outbound.isEmpty else { return }
        var bytes: [UInt8] = []
        swap(&bytes, &outbound)  // a failed write reports back synchronously and clears `outbound`
        transport.write(&bytes)
    }
}
