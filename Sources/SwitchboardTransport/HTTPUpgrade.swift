/// A port's first byte decides what a connection speaks (wire-v1 sections 1 and 8): HTTP begins with
/// `G` (a GET), text mode with `{`, anything else is a binary frame's length. This layer passes the first two through
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
        /// Browser origins allowed to open a WebSocket besides the server's own (`*` matches any run of
        /// characters, so `["*"]` allows every origin); nil: only the server's own, an `Origin` whose
        /// host and port are the request's `Host` (wire-v1 section 8). A request without an `Origin`
        /// header (not from a browser) is always allowed.
        public var allowedOrigins: [String]?
        /// Answers a plain HTTP request (called on the loop) by calling its second argument once, now or
        /// later, on the loop; nil: 404.
        public var respond: (HTTPRequestHead, @escaping (HTTPResponse?) -> Void) -> Void

        public init(maxFrame: Int, allowedOrigins: [String]? = nil,
                    respond: @escaping (HTTPRequestHead, @escaping (HTTPResponse?) -> Void) -> Void = { $1(nil) }) {
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

    /// Whether ``detach()`` can take this connection to another loop now: its bytes have shown they are
    /// not an HTTP request (a WebSocket's are messages now), it runs over TCP or TLS over TCP, and
    /// nothing waits to be written (which could not go along).
    public var canDetach: Bool {
        switch mode {
        case .passThrough, .webSocket: break
        case .sniffing, .http, .answered: return false
        }
        guard !isFinished, pendingCount == 0, framed.isEmpty else { return false }
        if let tls = inner as? TLSTransport { return tls.canDetach }
        return inner is TCPConnection && inner.queuedBytes == 0
    }

    /// Takes the connection off this loop, with the state of its layers (TLS, WebSocket), for
    /// ``init(adopting:loop:options:)`` on another. Nil when it cannot (``canDetach``). This transport is
    /// closed either way, and never touches what it gave away again.
    public func detach() throws(UVError) -> DetachedConnection? {
        guard canDetach else {
            closeNow()
            return nil
        }
        isFinished = true
        handler = nil
        var webSocket: DetachedConnection.WebSocket?
        if case .webSocket(let session) = mode {
            webSocket = .init(session: session, cutter: cutter, messageBytes: messageBytes, isMessageTooLarge: isMessageTooLarge,
                              isAddressedToThisMachine: isAddressedToThisMachine)
            mode = .answered  // this layer lets go of the session
        }
        if let tls = inner as? TLSTransport {
            guard let detached = try tls.detach() else { return nil }
            return DetachedConnection(socket: detached.socket, tls: detached.tls, webSocket: webSocket)
        }
        guard let tcp = inner as? TCPConnection else { return nil }
        return DetachedConnection(socket: try tcp.detach(), tls: nil, webSocket: webSocket)
    }

    /// Goes on, on `loop`, with a connection that ``detach()`` took off another loop.
    public convenience init(adopting connection: DetachedConnection, loop: EventLoop, options: Options) throws(UVError) {
        let tcp: TCPConnection
        do { tcp = try TCPConnection.adopt(connection.socket, loop: loop) } catch {  // the socket is closed
            connection.tls?.close()
            throw error
        }
        self.init(over: connection.tls.map { TLSTransport(adopting: $0, over: tcp, loop: loop) } ?? tcp, options: options)
        guard let webSocket = connection.webSocket else {
            mode = .passThrough
            return
        }
        cutter = webSocket.cutter
        messageBytes = webSocket.messageBytes
        isMessageTooLarge = webSocket.isMessageTooLarge
        isAddressedToThisMachine = webSocket.isAddressedToThisMachine
        listen(to: webSocket.session)
    }
    private var handler: ((TransportEvent) -> Void)?
    private var mode = Mode.sniffing
    /// Reading stopped by the owner (backpressure), and by this layer (pongs piling up).
    private var isPausedByOwner = false, isPausedForPongs = false
    /// The owner began a graceful close: what follows is its doing, not a failure.
    private var isClosingByOwner = false
    /// Messages read from the peer and not yet delivered (see ``receive(_:_:)``). Unchecked:
    /// appended to only by the session's handlers, inside `WebSocketSession.receive`, which is called
    /// holding no access to it.
    @exclusivity(unchecked) private var received: [UInt8] = []
    /// Server-to-client WebSocket frames, built here and handed down, its capacity kept write after write.
    private var framed: [UInt8] = []
    /// Bytes of the WebSocket message being received, and where it begins in `received`: a message over
    /// maxFrame is cut off there, however many fragments it came in (see ``collect(_:_:)``).
    @exclusivity(unchecked) private var messageBytes = 0
    @exclusivity(unchecked) private var messageStart = 0
    @exclusivity(unchecked) private var isMessageTooLarge = false
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
    /// The TCP connection below, while this transport passes bytes through to it unchanged: then all it
    /// has queued is that connection's (``queuedBytes``), which a transport over this one may read there.
    public var passThroughTCP: TCPConnection? {
        guard case .passThrough = mode else { return nil }
        return inner as? TCPConnection
    }
    /// The transport below's: a connection whose WebSocket closed still lingers in TCP until the owner's
    /// close (bounded by its sweep of closing connections).
    public var isOpen: Bool { inner.isOpen }
    public var remoteAddress: String { inner.remoteAddress }
    /// A loopback peer whose upgrade was addressed to this machine (``HTTPRequestHead/isAddressedToThisMachine``).
    public var isLoopbackPeer: Bool { inner.isLoopbackPeer && isAddressedToThisMachine }
    private var isAddressedToThisMachine = true
    public var scheme: String { isWebSocket ? (inner.scheme == "tls" ? "wss" : "ws") : inner.scheme }
    public var peerIdentity: String? { inner.peerIdentity }
    /// Whether the connection became a WebSocket.
    public var isWebSocket: Bool { if case .webSocket = mode { true } else { false } }
    /// A request head not finished yet, part of a WebSocket frame, or what the layers below hold.
    public var holdsPartialInput: Bool {
        switch mode {
        case .http: true
        case .webSocket(let session): session.isInsideFrame || inner.holdsPartialInput
        case .sniffing, .passThrough: inner.holdsPartialInput
        case .answered: false
        }
    }

    public func start(_ handler: @escaping (TransportEvent) -> Void) {
        self.handler = handler
        inner.start { event in self.handleInner(event) }  // the inner transport lets go when it closes
    }

    public func write(_ bytes: inout [UInt8]) {
        switch mode {
        case .sniffing, .passThrough: return inner.write(&bytes)
        case .webSocket(let session):
            guard session.closeCodeSent == 0 else { return bytes.removeAll(keepingCapacity: true) }  // the close went out
            flush(session)  // wslay's own frames (pongs) first: then nothing of its is half written
            cutter.frame(&bytes, into: &framed)
            guard !framed.isEmpty else { return }
            // Handed down from a local: a transport that reports its end from inside `write` lets the
            // owner write again, into `framed`, while this call still runs.
            var outgoing: [UInt8] = []
            swap(&outgoing, &framed)
            inner.write(&outgoing)
            if framed.isEmpty { swap(&outgoing, &framed) }  // keeps the capacity for the next write
        case .http, .answered:
            bytes.removeAll(keepingCapacity: true)
        }
    }

    public func pauseReading() {
        isPausedByOwner = true
        inner.pauseReading()
    }

    public func resumeReading() {
        isPausedByOwner = false
        if !isPausedForPongs { inner.resumeReading() }
    }

    public func closeAfterWrites() { closeAfterWrites(.normal) }

    public func closeAfterWrites(_ intent: CloseIntent) {
        isClosingByOwner = true
        if intent == .timeout, case .http = mode {
            return answer(HTTPResponse(status: 408, text: "the request head was not finished in time\n"))
        }
        if case .webSocket(let session) = mode, session.closeCodeSent == 0 {
            session.queueClose(intent.webSocketCode, reason: intent.webSocketReason)
            flush(session)
        }
        inner.closeAfterWrites()
    }

    public func closeNow(_ intent: CloseIntent) {
        if case .webSocket(let session) = mode, session.closeCodeSent == 0 {
            session.queueClose(intent.webSocketCode, reason: intent.webSocketReason)
            flush(session)
        }
        closeNow()
    }

    public func closeNow() {
        isFinished = true
        handler = nil
        inner.closeNow()
    }

    // MARK: Input

    private func handleInner(_ event: TransportEvent) {
        guard !isFinished else { return }
        if case .drained = event, isPausedForPongs {
            isPausedForPongs = false
            if !isPausedByOwner { inner.resumeReading() }
        }
        guard case .data(let bytes) = event else { return deliver(event) }
        switch mode {
        case .sniffing:
            // wire-v1 section 1: `G` (a GET) selects HTTP; `{` text mode, and any other byte binary
            // mode (a frame's length byte is below 0x40).
            guard bytes.first == UInt8(ascii: "G") else {
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
            } else if head.method != "GET" {
                answer(HTTPResponse(status: 404, text: "not found\n"))  // wire-v1: anything else is 404
            } else {
                mode = .answered  // what follows the request is not read
                options.respond(head) { [weak self] response in self?.answer(response ?? HTTPResponse(status: 404, text: "not found\n")) }
            }
        }
    }

    /// Writes `response` and closes; the owner hears the close when the peer has gone.
    private func answer(_ response: HTTPResponse) {
        mode = .answered
        guard inner.isOpen else { return }  // the peer left while the answer was being made
        var bytes = response.bytes
        inner.write(&bytes)
        inner.closeAfterWrites()
    }

    private func upgrade(_ head: HTTPRequestHead, rest: [UInt8]) {
        guard head.method == "GET", head.header("Sec-WebSocket-Version") == "13",
              let key = head.header("Sec-WebSocket-Key"), !key.isEmpty else {
            return answer(HTTPResponse(status: 400, text: "a WebSocket upgrade needs GET, Sec-WebSocket-Version: 13 and a key\n"))
        }
        isAddressedToThisMachine = head.isAddressedToThisMachine
        let session = WebSocketSession(maxMessage: options.maxFrame + 4)
        listen(to: session)
        var response = Array(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Accept: \(Digest.webSocketAccept(key: key))\r\n\r\n").utf8)
        inner.write(&response)
        if let origin = head.header("Origin"),
           !Self.allows(origin: origin, host: head.header("Host"), isTLS: inner.scheme == "tls", patterns: options.allowedOrigins) {
            session.queueClose(1008, reason: "origin not allowed")
            flush(session)
            return fail(.webSocketRefused, "origin \(origin) is not allowed")
        }
        if !rest.isEmpty { receive(rest, session) }
    }

    /// Reads the peer's messages through `session` from now on.
    private func listen(to session: WebSocketSession) {
        session.onData = { [unowned self] opcode, bytes in collect(opcode, bytes) }
        session.onMessageEnd = { [unowned self] opcode in
            messageBytes = 0
            if opcode == .text, !isMessageTooLarge { received.append(10) }
        }
        session.onFrame = { [unowned self] in handler?(.data([])) }  // traffic, for the heartbeat
        mode = .webSocket(session)
    }

    /// Reads `bytes`, then hands the owner every message they completed as one event (as one read
    /// does over TCP), after wslay has returned.
    private func receive(_ bytes: [UInt8], _ session: WebSocketSession) {
        let wasClosing = session.closeCodeSent != 0
        let ok = session.receive(bytes)
        flush(session)  // pongs, and wslay's close (a close counts as sent once written)
        // What wslay itself did on this input, before the owner hears anything (the owner may close too).
        let peerClosed = session.closeReceived
        let wslayClosed = wasClosing || peerClosed ? 0 : session.closeCodeSent  // 1002 a bad frame, 1009 too large
        if inner.queuedBytes > Self.pongLimit, !isPausedForPongs {
            // A peer that pings without reading: stop reading it until its pongs have gone out.
            isPausedForPongs = true
            inner.pauseReading()
        }
        if isMessageTooLarge, !wasClosing, wslayClosed == 0 {
            received.removeSubrange(min(messageStart, received.count)...)  // the messages before it are delivered
            session.queueClose(1009, reason: "message too large")
            flush(session)
        }
        if !received.isEmpty {
            var messages: [UInt8] = []
            swap(&messages, &received)
            messageStart = 0
            deliver(.data(messages))
        }
        guard !isFinished else { return }
        if wslayClosed == 1009 || isMessageTooLarge {
            fail(.webSocketError, "a WebSocket message over maxFrame (\(options.maxFrame) bytes)")
        } else if !ok || wslayClosed != 0 {
            fail(.webSocketError, "WebSocket protocol error (close code \(wslayClosed))")
        } else if peerClosed, !isClosingByOwner {
            inner.closeAfterWrites()  // the server closes TCP first (RFC 6455 section 7.1.1)
            deliver(.closed(nil))
        }
    }

    /// Pong bytes a peer may leave unread before the server stops reading its pings.
    static let pongLimit = 64 * 1024

    /// Message bytes from the peer, kept for ``receive(_:_:)`` to deliver; a text message's end adds its
    /// newline.
    private func collect(_ opcode: WebSocketSession.Opcode, _ bytes: UnsafeBufferPointer<UInt8>) {
        if messageBytes == 0 { messageStart = received.count }
        messageBytes += bytes.count
        guard !isMessageTooLarge, messageBytes <= options.maxFrame + 4 else { isMessageTooLarge = true; return }
        if received.isEmpty, let first = bytes.first { cutter.decide(byFirstByte: first) }
        if opcode == .text {
            // One text-mode line per message: a newline in it can only be JSON whitespace.
            received.append(contentsOf: bytes.lazy.map { $0 == 10 || $0 == 13 ? 32 : $0 })
        } else {
            received.append(contentsOf: bytes)
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

    /// Whether a browser page at `origin` may open a WebSocket: one from the server's own origin (the
    /// host and port of `host`, the request's `Host`, any case, a missing port being the scheme's
    /// default) always, any other when one of `patterns` matches it.
    static func allows(origin: String, host: String?, isTLS: Bool, patterns: [String]?) -> Bool {
        if let host, let page = Authority(origin: origin), page == Authority(host, defaultPort: isTLS ? 443 : 80) { return true }
        return patterns?.contains { matches(origin, pattern: $0) } ?? false
    }

    /// A host and port, as an `Origin` or a `Host` header names them.
    struct Authority: Equatable {
        let host: Substring
        let port: Int?

        /// `scheme://host[:port]`; the port defaults to the scheme's (80 for http and ws, 443 for https
        /// and wss). nil for anything else (`null`, a path).
        init?(origin: String) {
            guard let separator = origin.firstRange(of: "://") else { return nil }
            let defaultPort: Int? = switch origin[..<separator.lowerBound].lowercased() {
            case "http", "ws": 80
            case "https", "wss": 443
            default: nil
            }
            self.init(origin[separator.upperBound...], defaultPort: defaultPort)
        }

        /// `host[:port]` (`[v6]:port` for IPv6), lowercased; nil if the port is not a number.
        init?(_ text: some StringProtocol, defaultPort: Int?) {
            let text = Substring(text.lowercased())
            var hostEnd = text.endIndex
            if text.hasPrefix("[") {
                guard let close = text.firstIndex(of: "]") else { return nil }
                hostEnd = text.index(after: close)
            } else if let colon = text.firstIndex(of: ":") {
                hostEnd = colon
            }
            let rest = text[hostEnd...]
            guard !text[..<hostEnd].isEmpty, !text[..<hostEnd].contains("/") else { return nil }
            if rest.isEmpty || rest == ":" {
                port = defaultPort
            } else {
                guard rest.first == ":", let number = Int(rest.dropFirst()), (0...65535).contains(number) else { return nil }
                port = number
            }
            host = text[..<hostEnd]
        }
    }

    /// Whether `origin` matches `pattern`, where `*` matches any run of characters. Greedy with one
    /// backtrack point: linear in practice, never exponential, whatever the header holds.
    static func matches(_ origin: String, pattern: String) -> Bool {
        let text = Array(origin.utf8), pattern = Array(pattern.utf8)
        var t = 0, p = 0, starAt = -1, resumeAt = 0
        while t < text.count {
            if p < pattern.count, pattern[p] == UInt8(ascii: "*") {
                starAt = p
                resumeAt = t
                p += 1
            } else if p < pattern.count, pattern[p] == text[t] {
                p += 1
                t += 1
            } else if starAt >= 0 {
                p = starAt + 1
                resumeAt += 1
                t = resumeAt
            } else {
                return false
            }
        }
        while p < pattern.count, pattern[p] == UInt8(ascii: "*") { p += 1 }
        return p == pattern.count
    }
}

/// A connection's socket and the state of its layers between two loops
/// (``HTTPUpgradeTransport/detach()``), which whoever holds it adopts on a loop
/// (``HTTPUpgradeTransport/init(adopting:loop:options:)``) or closes (``close()``), once.
///
/// `@unchecked Sendable` for its WebSocket session, a class that is not: the layer that detached it let
/// go of it (and the session calls back into nothing but the handlers the adopting layer sets), so the
/// loop that adopts it is the only thread that uses it from then on; the hop to that loop (a job through
/// its mutex-guarded queue) orders this loop's last use before that loop's first. ``DetachedTLS`` and
/// ``DetachedSocket`` prove their own.
public struct DetachedConnection: @unchecked Sendable {
    let socket: DetachedSocket
    let tls: DetachedTLS?
    let webSocket: WebSocket?

    /// A WebSocket's state: its wslay session (with any frame it is in the middle of), how this side
    /// frames what it writes, and the message being received.
    struct WebSocket {
        let session: WebSocketSession
        let cutter: MessageCutter
        let messageBytes: Int
        let isMessageTooLarge: Bool
        let isAddressedToThisMachine: Bool
    }

    /// Closes the socket and frees the state (no loop took it).
    public func close() {
        socket.close()
        tls?.close()
    }
}

/// Why the owner closes a connection, for transports that can say so to the peer (WebSocket close codes).
public enum CloseIntent: Sendable {
    case normal, goingAway, policy, tooLarge, protocolError
    /// A deadline passed (wire.md, "Limits"): an HTTP request head gets 408, a WebSocket 1008.
    case timeout

    var webSocketCode: UInt16 {
        switch self {
        case .normal: 1000
        case .goingAway: 1001
        case .protocolError: 1002
        case .policy, .timeout: 1008
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
        case .timeout: "timed out"
        }
    }
}
