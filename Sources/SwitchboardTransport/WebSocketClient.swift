/// The client side of a WebSocket to a Switchboard port: sends the HTTP upgrade, checks the answer, then
/// carries the owner's binary frames or text lines one per message, as ``HTTPUpgradeTransport`` does on
/// the server's side. Writes made before the upgrade is answered wait for it.
public final class WebSocketClientTransport: Transport {
    private let inner: any Transport
    private let host: String, path: String
    private let key: String
    private var handler: ((TransportEvent) -> Void)?
    /// The server's answer to the upgrade, until it is complete.
    private var answer: [UInt8] = []
    private var session: WebSocketSession?
    private var cutter = MessageCutter()
    private var isFinished = false

    /// A WebSocket over `inner` (TCP, or TLS), to `path` on `host`.
    public init(over inner: any Transport, host: String, path: String = "/") {
        self.inner = inner
        self.host = host
        self.path = path
        key = Digest.base64((0..<16).map { _ in UInt8.random(in: 0...255) })
    }

    public var queuedBytes: Int { inner.queuedBytes + cutter.pendingCount }
    public var isOpen: Bool { !isFinished && inner.isOpen }
    public var remoteAddress: String { inner.remoteAddress }
    public var peerIdentity: String? { inner.peerIdentity }

    public func start(_ handler: @escaping (TransportEvent) -> Void) {
        self.handler = handler
        inner.start { event in self.handleInner(event) }  // the inner transport lets go when it closes
        var request = Array(("GET \(path) HTTP/1.1\r\nHost: \(host)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Key: \(key)\r\nSec-WebSocket-Version: 13\r\n\r\n").utf8)
        inner.write(&request)
    }

    public func write(_ bytes: inout [UInt8]) {
        cutter.append(bytes)
        bytes.removeAll(keepingCapacity: bytes.capacity <= 1 << 20)
        if let session { send(session) }
    }

    public func pauseReading() { inner.pauseReading() }
    public func resumeReading() { inner.resumeReading() }

    public func closeAfterWrites() {
        if let session, !isFinished {
            session.queueClose(1000, reason: "closing")
            flush(session)
        }
        inner.closeAfterWrites()
    }

    public func closeNow() {
        isFinished = true
        handler = nil
        inner.closeNow()
    }

    private func handleInner(_ event: TransportEvent) {
        guard !isFinished else { return }
        guard case .data(let bytes) = event else { return finish(event) }
        if let session { return receive(bytes, session) }
        answer += bytes
        guard let end = answer.firstRange(of: [13, 10, 13, 10]) else {
            if answer.count > 16 * 1024 { fail("the upgrade answer is too long") }
            return
        }
        let head = String(decoding: answer[..<end.lowerBound], as: UTF8.self)
        let rest = Array(answer[end.upperBound...])
        answer = []
        let accept = "Sec-WebSocket-Accept: \(Digest.webSocketAccept(key: key))".lowercased()
        guard head.hasPrefix("HTTP/1.1 101"), head.lowercased().split(separator: "\r\n").contains(where: { $0 == accept }) else {
            return fail("the server refused the upgrade: \(head.prefix { $0 != "\r" })")
        }
        let session = WebSocketSession(role: .client, maxMessage: 1 << 30)
        session.onMessage = { [unowned self] opcode, message in
            guard !isFinished else { return }
            handler?(.data(opcode == .text ? message + [10] : message))
        }
        self.session = session
        send(session)
        if !rest.isEmpty { receive(rest, session) }
    }

    private func receive(_ bytes: [UInt8], _ session: WebSocketSession) {
        let ok = session.receive(bytes)
        flush(session)
        guard !isFinished else { return }
        if !ok || session.closeReceived || session.closeCodeSent != 0 {
            let code = session.closeCodeReceived
            inner.closeAfterWrites()
            if ok, code == 1000 || code == 1001 { finish(.closed(nil)) } else { fail("closed with WebSocket code \(code)") }
        }
    }

    private func send(_ session: WebSocketSession) {
        for (opcode, message) in cutter.messages() { _ = session.queue(opcode, message) }
        flush(session)
    }

    private func flush(_ session: WebSocketSession) {
        var bytes = session.takeOutput()
        if !bytes.isEmpty { inner.write(&bytes) }
    }

    private func fail(_ message: String) { finish(.failed(TransportFailure(kind: .webSocketError, message: message))) }

    private func finish(_ event: TransportEvent) {
        guard !isFinished else { return }
        if case .drained = event { handler?(event); return }
        if case .data = event { handler?(event); return }
        isFinished = true
        let handler = self.handler
        self.handler = nil
        handler?(event)
    }
}

/// Cuts a connection's outgoing bytes into WebSocket messages: whole binary frames (by their length
/// field) or whole text lines (without the newline). The first bytes, or the first message received,
/// decide which.
struct MessageCutter {
    enum Framing { case undecided, binary, text }

    private(set) var framing = Framing.undecided
    private var carry: [UInt8] = []
    /// Bytes waiting for the rest of their frame or line.
    var pendingCount: Int { carry.count }

    /// The peer's first message decides, if nothing was written before.
    mutating func decide(by opcode: WebSocketSession.Opcode) {
        if framing == .undecided { framing = opcode == .text ? .text : .binary }
    }

    mutating func append(_ bytes: [UInt8]) { carry += bytes }

    /// Every whole message in what was appended, in order.
    mutating func messages() -> [(WebSocketSession.Opcode, [UInt8])] {
        if framing == .undecided, let first = carry.first { framing = first == UInt8(ascii: "{") ? .text : .binary }
        var out: [(WebSocketSession.Opcode, [UInt8])] = []
        var start = 0
        switch framing {
        case .undecided: return []
        case .binary:
            while carry.count - start >= 4 {
                let length = carry[start..<start + 4].reduce(0) { $0 << 8 | Int($1) }
                guard carry.count - start >= 4 + length else { break }
                out.append((.binary, Array(carry[start..<start + 4 + length])))
                start += 4 + length
            }
        case .text:
            while let newline = carry[start...].firstIndex(of: 10) {
                out.append((.text, Array(carry[start..<newline])))
                start = newline + 1
            }
        }
        carry.removeFirst(start)
        return out
    }
}
