/// A port's first bytes decide what a connection speaks (wire-v1 section 8): binary frames begin with a
/// length, text mode with `{`, HTTP with a method name. This layer passes the first two through
/// untouched. An HTTP request it answers itself (health, metrics: whatever `respond` says, 404 when
/// nothing), then closes; a WebSocket upgrade it accepts, and from then on it carries exactly one
/// binary frame per binary message and one text-mode line per text message (without the newline), so
/// that the connection above sees the same byte stream as over TCP.
public final class HTTPUpgradeTransport: Transport {
    /// What the server does with HTTP.
    public struct Options {
        /// The server's maxFrame: a larger WebSocket message (a frame with its 4-byte length field, or
        /// a line) closes with 1009.
        public var maxFrame: Int
        /// Browser origins allowed to open a WebSocket (`*` matches any run of characters); nil: any.
        /// A request without an `Origin` header (not from a browser) is always allowed.
        public var allowedOrigins: [String]?
        /// Answers a plain HTTP request (called on the loop); nil: 404.
        public var respond: (HTTPRequestHead) -> HTTPResponse?

        public init(maxFrame: Int, allowedOrigins: [String]? = nil, respond: @escaping (HTTPRequestHead) -> HTTPResponse? = { _ in nil }) {
            self.maxFrame = maxFrame
            self.allowedOrigins = allowedOrigins
            self.respond = respond
        }
    }

    private enum Mode {
        case sniffing
        case passThrough
        case http(HTTPRequestParser)
        case webSocket(WebSocketSession)
        /// An HTTP answer is on its way out; input is ignored.
        case answered
    }


    private let inner: any Transport
    private let options: Options
    private var handler: ((TransportEvent) -> Void)?
    private var mode = Mode.sniffing
    /// Cuts what the owner writes into messages, once a WebSocket.
    private var cutter = MessageCutter() { didSet { pendingCount = cutter.pendingCount } }
    /// `cutter.pendingCount`, read per request by the owner's outbound check. Unchecked: a plain integer
    /// set only by `cutter`'s observer, on the loop thread, by code that calls nothing out meanwhile.
    @exclusivity(unchecked) private var pendingCount = 0
    private var isFinished = false

    public init(over inner: any Transport, options: Options) {
        self.inner = inner
        self.options = options
    }

    public var queuedBytes: Int { inner.queuedBytes + pendingCount }
    public var isOpen: Bool { !isFinished && inner.isOpen }
    public var remoteAddress: String { inner.remoteAddress }
    public var peerIdentity: String? { inner.peerIdentity }
    /// Whether the connection became a WebSocket.
    public var isWebSocket: Bool { if case .webSocket = mode { true } else { false } }

    public func start(_ handler: @escaping (TransportEvent) -> Void) {
        self.handler = handler
        inner.start { event in self.handleInner(event) }  // the inner transport lets go when it closes
    }

    public func write(_ bytes: inout [UInt8]) {
        switch mode {
        case .sniffing, .passThrough: return inner.write(&bytes)
        case .webSocket(let session):
            cutter.append(bytes)
            bytes.removeAll(keepingCapacity: bytes.capacity <= 1 << 20)
            for (opcode, message) in cutter.messages() { _ = session.queue(opcode, message) }
            flush(session)
        case .http, .answered:
            bytes.removeAll(keepingCapacity: true)
        }
    }

    public func pauseReading() { inner.pauseReading() }
    public func resumeReading() { inner.resumeReading() }

    public func closeAfterWrites() { closeAfterWrites(.normal) }

    public func closeAfterWrites(_ intent: CloseIntent) {
        if case .webSocket(let session) = mode, !isFinished {
            session.queueClose(intent.webSocketCode, reason: intent.webSocketReason)
            flush(session)
        }
        inner.closeAfterWrites()
    }

    public func closeNow() {
        isFinished = true
        handler = nil
        inner.closeNow()
    }

    // MARK: Input

    private func handleInner(_ event: TransportEvent) {
        guard !isFinished else { return }
        guard case .data(let bytes) = event else { return deliver(event) }
        switch mode {
        case .sniffing:
            guard let first = bytes.first, (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(first) else {
                mode = .passThrough
                return deliver(event)
            }
            let parser = HTTPRequestParser()
            mode = .http(parser)
            readRequest(bytes, parser)
        case .passThrough: deliver(event)
        case .http(let parser): readRequest(bytes, parser)
        case .webSocket(let session): receive(bytes, session)
        case .answered: break
        }
    }

    private func readRequest(_ bytes: [UInt8], _ parser: HTTPRequestParser) {
        switch parser.feed(bytes) {
        case .needMore: break
        case .malformed: answer(HTTPResponse(status: 400, text: "malformed HTTP request\n"))
        case .tooLarge: answer(HTTPResponse(status: 431, text: "request head too large\n"))
        case .complete(let head, let rest):
            if head.isUpgrade, head.header("Upgrade")?.lowercased() == "websocket" {
                upgrade(head, rest: rest)
            } else if head.method != "GET" && head.method != "HEAD" {
                answer(HTTPResponse(status: 405, text: "only GET\n"))
            } else {
                answer(options.respond(head) ?? HTTPResponse(status: 404, text: "not found\n"))
            }
        }
    }

    /// Writes `response` and closes; the owner hears the close when the peer has gone.
    private func answer(_ response: HTTPResponse) {
        mode = .answered
        var bytes = response.bytes
        inner.write(&bytes)
        inner.closeAfterWrites()
    }

    private func upgrade(_ head: HTTPRequestHead, rest: [UInt8]) {
        guard head.method == "GET", head.header("Sec-WebSocket-Version") == "13",
              let key = head.header("Sec-WebSocket-Key"), !key.isEmpty else {
            return answer(HTTPResponse(status: 400, text: "a WebSocket upgrade needs GET, Sec-WebSocket-Version: 13 and a key\n"))
        }
        let session = WebSocketSession(maxMessage: options.maxFrame + 4)
        session.onMessage = { [unowned self] opcode, message in deliverMessage(opcode, message) }
        session.onFrame = { [unowned self] in handler?(.data([])) }  // traffic, for the heartbeat
        mode = .webSocket(session)
        var response = Array(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Accept: \(Digest.webSocketAccept(key: key))\r\n\r\n").utf8)
        inner.write(&response)
        if let origin = head.header("Origin"), let allowed = options.allowedOrigins,
           !allowed.contains(where: { Self.matches(origin, pattern: $0) }) {
            session.queueClose(1008, reason: "origin not allowed")
            flush(session)
            return fail(.webSocketRefused, "origin \(origin) is not allowed")
        }
        if !rest.isEmpty { receive(rest, session) }
    }

    private func receive(_ bytes: [UInt8], _ session: WebSocketSession) {
        let ok = session.receive(bytes)
        flush(session)  // pongs, and wslay's own close (1002 for a bad frame, 1009 for a message too large)
        guard !isFinished else { return }
        if session.closeCodeSent == 1009 {
            fail(.webSocketError, "a WebSocket message over maxFrame (\(options.maxFrame) bytes)")
        } else if !ok || session.closeCodeSent != 0 && !session.closeReceived {
            fail(.webSocketError, "WebSocket protocol error (close code \(session.closeCodeSent))")
        } else if session.closeReceived {
            inner.closeAfterWrites()
            deliver(.closed(nil))
        }
    }

    private func deliverMessage(_ opcode: WebSocketSession.Opcode, _ message: [UInt8]) {
        guard !isFinished else { return }
        cutter.decide(by: opcode)
        if opcode == .text {
            // One text-mode line per message: a newline in it can only be JSON whitespace.
            deliver(.data(message.map { $0 == 10 || $0 == 13 ? 32 : $0 } + [10]))
        } else {
            deliver(.data(message))
        }
    }

    // MARK: Output

    private func flush(_ session: WebSocketSession) {
        var bytes = session.takeOutput()
        if !bytes.isEmpty { inner.write(&bytes) }
    }

    private func fail(_ kind: TransportFailure.Kind, _ message: String) {
        deliver(.failed(TransportFailure(kind: kind, message: message)))
        isFinished = true
        handler = nil
    }

    private func deliver(_ event: TransportEvent) {
        guard !isFinished else { return }
        switch event {
        case .closed, .failed:
            isFinished = true
            let handler = self.handler
            self.handler = nil
            handler?(event)
        case .data, .drained:
            handler?(event)
        }
    }

    /// Whether `origin` matches `pattern`, where `*` matches any run of characters.
    static func matches(_ origin: String, pattern: String) -> Bool {
        glob(Array(origin.utf8)[...], Array(pattern.utf8)[...])
    }

    private static func glob(_ text: ArraySlice<UInt8>, _ pattern: ArraySlice<UInt8>) -> Bool {
        guard let first = pattern.first else { return text.isEmpty }
        if first == UInt8(ascii: "*") {
            let rest = pattern.dropFirst()
            return text.indices.contains { glob(text[$0...], rest) } || glob(text[text.endIndex...], rest)
        }
        return text.first == first && glob(text.dropFirst(), pattern.dropFirst())
    }
}

/// Why the owner closes a connection, for transports that can say so to the peer (WebSocket close codes).
public enum CloseIntent: Sendable {
    case normal, goingAway, policy, tooLarge, protocolError

    var webSocketCode: UInt16 {
        switch self {
        case .normal: 1000
        case .goingAway: 1001
        case .protocolError: 1002
        case .policy: 1008
        case .tooLarge: 1009
        }
    }

    var webSocketReason: String {
        switch self {
        case .normal: "closing"
        case .goingAway: "server shutting down"
        case .protocolError: "protocol error"
        case .policy: "refused"
        case .tooLarge: "message too large"
        }
    }
}
