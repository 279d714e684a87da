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
    public var isLoopbackPeer: Bool { inner.isLoopbackPeer }
    public var scheme: String { inner.scheme == "tls" ? "wss" : "ws" }
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
        self.session = session
        send(session)
        if !rest.isEmpty { receive(rest, session) }
    }

    /// Reads `bytes`, then delivers every message they completed as one event, after wslay returned.
    private func receive(_ bytes: [UInt8], _ session: WebSocketSession) {
        let wasClosing = session.closeCodeSent != 0
        let ok = session.receive(bytes)
        flush(session)
        let wslayClosed = wasClosing || session.closeReceived ? 0 : session.closeCodeSent
        let messages = session.takeReceived()
        if !messages.isEmpty { finish(.data(messages)) }
        guard !isFinished else { return }
        if !ok || wslayClosed != 0 {
            fail("WebSocket protocol error (close code \(wslayClosed))")
        } else if session.closeReceived {
            let code = session.closeCodeReceived
            inner.closeAfterWrites()
            if code == 1000 || code == 1001 { finish(.closed(nil)) } else { fail("the server closed with WebSocket code \(code)") }
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

    /// The first byte the peer sent decides, if nothing was written before: by the rule that decides
    /// the connection's mode (`{` is text mode), so that the two always agree.
    mutating func decide(byFirstByte first: UInt8) {
        if framing == .undecided { framing = first == UInt8(ascii: "{") ? .text : .binary }
    }

    mutating func append(_ bytes: [UInt8]) { carry += bytes }

    /// Frames what the owner wrote as a server sends it (unmasked, unfragmented: a 2-to-10-byte header
    /// before each whole frame or line), appending to `out` and emptying `bytes`. Done here rather than
    /// through wslay's queue, which copies every message twice: data frames from a server need no
    /// masking; wslay still reads the peer's frames and writes the control frames.
    mutating func frame(_ bytes: inout [UInt8], into out: inout [UInt8]) {
        if carry.isEmpty {
            swap(&carry, &bytes)
        } else {
            carry += bytes
        }
        bytes.removeAll(keepingCapacity: true)
        if framing == .undecided, let first = carry.first { framing = first == UInt8(ascii: "{") ? .text : .binary }
        var start = 0
        switch framing {
        case .undecided: return
        case .binary:
            start = Self.frameBinary(carry, into: &out)
        case .text:
            out.reserveCapacity(out.count + carry.count + carry.count / 8 + 16)  // headers of 2 bytes per line and more
            while let newline = carry[start...].firstIndex(of: 10) {
                Self.appendHeader(opcode: 1, length: newline - start, to: &out)
                out.append(contentsOf: carry[start..<newline])
                start = newline + 1
            }
        }
        if start == carry.count {
            carry.removeAll(keepingCapacity: true)
            swap(&carry, &bytes)  // the owner gets its buffer back, capacity and all
        } else {
            carry.removeFirst(start)
        }
    }

    /// Frames every whole binary frame at the start of `carry` into `out`; returns the bytes used. One
    /// pass, headers and copies through pointers, into memory left uninitialized until written (the
    /// fan-out path: one frame per event per listener, where appending byte by byte, or zero-filling
    /// first, cost more than the rest of a delivery). A wire-v1 frame has at least 4 bytes and gets at
    /// most a 2-byte header below 126 bytes (4 bytes up to 64 KiB, 10 beyond), so the framed bytes are
    /// at most half as many again as the frames.
    private static func frameBinary(_ carry: [UInt8], into out: inout [UInt8]) -> Int {
        // Nothing to frame while the first frame is incomplete (a large one written in parts): no allocation.
        guard carry.count >= 4,
              carry.count >= 4 + (Int(carry[0]) << 24 | Int(carry[1]) << 16 | Int(carry[2]) << 8 | Int(carry[3])) else { return 0 }
        var used = 0
        let framed = carry.withUnsafeBufferPointer { source in
            [UInt8](unsafeUninitializedCapacity: source.count + source.count / 2) { target, initialized in
                var to = 0
                while source.count - used >= 4 {
                    let length = 4 + (Int(source[used]) << 24 | Int(source[used + 1]) << 16 | Int(source[used + 2]) << 8 | Int(source[used + 3]))
                    guard source.count - used >= length else { break }
                    to += writeHeader(opcode: 2, length: length, at: target.baseAddress! + to)
                    (target.baseAddress! + to).initialize(from: source.baseAddress! + used, count: length)
                    to += length
                    used += length
                }
                initialized = to
            }
        }
        if out.isEmpty { out = framed } else { out += framed }
        return used
    }

    private static func headerSize(_ length: Int) -> Int { length < 126 ? 2 : length <= 0xFFFF ? 4 : 10 }

    /// Writes a final, unmasked frame's header at `target`; returns its size.
    @inline(__always)
    private static func writeHeader(opcode: UInt8, length: Int, at target: UnsafeMutablePointer<UInt8>) -> Int {
        target[0] = 0x80 | opcode
        if length < 126 {
            target[1] = UInt8(length)
            return 2
        }
        if length <= 0xFFFF {
            target[1] = 126
            target[2] = UInt8(length >> 8)
            target[3] = UInt8(length & 0xFF)
            return 4
        }
        target[1] = 127
        for index in 0..<8 { target[2 + index] = UInt8((length >> (56 - 8 * index)) & 0xFF) }
        return 10
    }

    /// A final, unmasked frame's header (RFC 6455 section 5.2).
    private static func appendHeader(opcode: UInt8, length: Int, to out: inout [UInt8]) {
        out.append(0x80 | opcode)
        if length < 126 {
            out.append(UInt8(length))
        } else if length <= 0xFFFF {
            out.append(126)
            out.append(UInt8(length >> 8))
            out.append(UInt8(length & 0xFF))
        } else {
            out.append(127)
            for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8((length >> shift) & 0xFF)) }
        }
    }

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
