#if canImport(Glibc)
import Glibc
#endif
import SwitchboardCodec
import SwitchboardWire

/// A failed expectation about the server's bytes.
public struct TestFailure: Error, CustomStringConvertible {
    public let description: String
    /// Makes a failure.
    public init(_ description: String) { self.description = description }
}

/// A loopback socket that speaks raw bytes, for protocol tests. Reads are async and sleep briefly while
/// nothing is there (time-out 5 s), so a waiting test never blocks a thread of the shared task pool that
/// the server's own async handlers need.
public final class RawConnection {
    /// The socket.
    public let fd: Int32
    private var buffer: [UInt8] = []
    private let receiveTimeout: Duration

    /// Connects to `host:port` (an IPv4 address of this machine: loopback by default).
    public init(host: String = "127.0.0.1", port: Int, receiveTimeout: Int = 5) throws {
        self.receiveTimeout = Duration.seconds(receiveTimeout)
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)  // no child process inherits it
        guard fd >= 0 else { throw TestFailure("socket failed") }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = inet_addr(host)
        let socketFD = fd
        let rc = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(socketFD, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard rc == 0 else { close(fd); throw TestFailure("connect failed: \(errno)") }
        _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        var one: Int32 = 1
        setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    }

    deinit { close(fd) }

    /// Sends raw bytes.
    public func send(_ bytes: [UInt8]) throws {
        var offset = 0
        while offset < bytes.count {
            let n = bytes[offset...].withUnsafeBytes { Glibc.send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0, errno == EAGAIN {  // the server is not reading right now: wait for room
                var pfd = pollfd(fd: fd, events: Int16(POLLOUT), revents: 0)
                guard poll(&pfd, 1, 5000) > 0 else { throw TestFailure("send timed out") }
                continue
            }
            guard n > 0 else { throw TestFailure("send failed: \(errno)") }
            offset += n
        }
    }

    /// Sends bytes written as spaced hex.
    public func send(hex: String) throws { try send(Self.bytes(hex: hex)) }
    /// Sends a frame.
    public func send(_ frame: Frame) throws { try send(frame.bytes) }
    /// Sends a text-mode line.
    public func send(line: String) throws { try send(Array((line + "\n").utf8)) }

    /// Half-closes the sending side.
    public func finishSending() { shutdown(fd, Int32(SHUT_WR)) }

    /// Closes abruptly: the server gets a reset (RST, `SO_LINGER` 0), not an end of stream. The
    /// descriptor stays this object's (a fresh socket takes its number) until it goes.
    public func reset() {
        var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
        let spare = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard spare >= 0 else { return }
        dup2(spare, fd)  // closes the connected socket: with a linger of 0, that sends the RST
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        close(spare)
    }

    /// Reads at least `count` buffered bytes; nil on EOF.
    private func fill(_ count: Int) async throws -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65536)
        let deadline = ContinuousClock.now + receiveTimeout
        while buffer.count < count {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n == 0 { return false }
            if n < 0, errno == EAGAIN {
                guard ContinuousClock.now < deadline else { throw TestFailure("timed out waiting for the server") }
                try await Task.sleep(for: .milliseconds(1))
                continue
            }
            guard n > 0 else { throw TestFailure("recv failed: errno \(errno)") }
            buffer.append(contentsOf: chunk[0..<n])
        }
        return true
    }

    /// Everything the server sends until it closes the connection.
    public func bytesUntilClosed() async throws -> [UInt8] {
        while try await fill(buffer.count + 1) {}
        defer { buffer = [] }
        return buffer
    }

    /// The next frame; nil at EOF.
    public func readFrame() async throws -> Frame? {
        guard try await fill(4) else { return nil }
        let length = Int(buffer[0]) << 24 | Int(buffer[1]) << 16 | Int(buffer[2]) << 8 | Int(buffer[3])
        guard try await fill(4 + length) else { throw TestFailure("EOF inside a frame") }
        var inbound = InboundBuffer()
        inbound.append(Array(buffer[0..<(4 + length)]))
        buffer.removeFirst(4 + length)
        var decoder = FrameDecoder(maxFrame: 1 << 30)
        guard case .frame(let frame)? = try decoder.next(from: &inbound) else {
            throw TestFailure("server sent an invalid frame")
        }
        return frame
    }

    /// The next frame, which must exist.
    public func frame() async throws -> Frame {
        guard let frame = try await readFrame() else { throw TestFailure("connection closed, frame expected") }
        return frame
    }

    /// The next frame that is not a PING.
    public func nextNonPing() async throws -> Frame { try await next(skipping: [.ping]) }

    /// The next frame that is neither a PING nor a POSITION: on a session, the server's POSITION comes
    /// when its acknowledgement is due (after ackMs), which a slow test can reach between any two frames.
    public func nextSkippingPingsAndPositions() async throws -> Frame { try await next(skipping: [.ping, .position]) }

    private func next(skipping kinds: [Frame.Kind]) async throws -> Frame {
        while true {
            let f = try await frame()
            if !kinds.contains(f.kind) { return f }
        }
    }

    /// The next text line, parsed; nil at EOF.
    public func readLine() async throws -> ChannelValue? {
        while true {
            if let newline = buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = Array(buffer[..<newline])
                buffer.removeFirst(newline + 1)
                return try JSONText.parse(line)
            }
            guard try await fill(buffer.count + 1) else { return nil }
        }
    }

    /// The next text line, which must exist.
    public func line() async throws -> ChannelValue {
        guard let line = try await readLine() else { throw TestFailure("connection closed, line expected") }
        return line
    }

    /// True once the server has closed the connection (frames before the EOF are skipped).
    public func isClosedByServer() async throws -> Bool {
        while true {
            do { guard try await fill(buffer.count + 1) else { return true } } catch { return false }
            buffer.removeAll()
        }
    }

    /// PING/PONG round trip: returns every frame the server sent before the PONG.
    public func barrier(id: UInt32 = 0xBA55) async throws -> [Frame] {
        try send(Frame(.ping, id: id, payload: [1, 2]))
        var before: [Frame] = []
        while true {
            let f = try await frame()
            if f.kind == .pong, f.id == id { return before }
            before.append(f)
        }
    }

    /// Parses spaced hex.
    public static func bytes(hex: String) -> [UInt8] {
        let digits = hex.filter { !$0.isWhitespace }
        var out: [UInt8] = []
        var it = digits.makeIterator()
        while let hi = it.next(), let lo = it.next() { out.append(UInt8(String([hi, lo]), radix: 16)!) }
        return out
    }
}

extension RawConnection {
    /// Reads events of `channel` until end of stream; returns the values (error events as ChannelError).
    public func events(on channel: String, limit: Int = 10_000) async throws -> [Result<ChannelValue, ChannelError>] {
        var out: [Result<ChannelValue, ChannelError>] = []
        while out.count <= limit {
            let f = try await frame()
            guard f.kind == .message, f.channel == channel, f.id == 0 else { throw TestFailure("unexpected \(f)") }
            guard f.payload != nil else { return out }
            out.append(try f.envelope())
        }
        throw TestFailure("stream did not end")
    }

    /// Sends a DEMAND for `n` more events on `channel`.
    public func demand(_ n: UInt32, on channel: String) throws {
        var payload: [UInt8] = []
        Frame.appendBigEndian(n, to: &payload)
        try send(Frame(.demand, channel: channel, payload: payload))
    }
}

extension Frame {
    /// The `code` of an ERROR frame's JSON payload.
    public var errorCode: String? {
        guard kind == .error, let payload, let body = try? JSONText.parse(payload) else { return nil }
        return body["code"]?.stringValue
    }

    /// A StandardMethodCodec (or `codec`) call frame.
    public static func call(_ id: UInt32, _ channel: String, _ method: String, _ args: ChannelValue = .null,
                     codec: any MethodCodec = StandardMethodCodec()) throws -> Frame {
        Frame(.message, id: id, channel: channel, payload: try codec.encodeMethodCall(MethodCall(method: method, arguments: args)))
    }

    /// The payload decoded as an envelope.
    public func envelope(_ codec: any MethodCodec = StandardMethodCodec()) throws -> Result<ChannelValue, ChannelError> {
        try codec.decodeEnvelope(payload)
    }
}

