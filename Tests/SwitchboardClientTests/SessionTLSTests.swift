import Testing
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport
import SwitchboardWire

/// A TLS connection made of raw bytes above TLS, driven on the test's thread: frames out, bytes in.
final class RawTLSConnection {
    private let loop: EventLoop
    private var transport: (any Transport)?
    private var received: [UInt8] = []
    private(set) var isClosed = false

    init(port: Int) throws {
        loop = try EventLoop()
        let context = try TLSContext.client(caFile: TestCertificates.path("ca.pem"))
        var failure: String?
        TCPConnection.connect(loop: loop, host: "127.0.0.1", port: port) { [unowned self] result in
            guard case .success(let connection) = result,
                  let tls = try? TLSTransport(over: connection, context: context, serverName: "127.0.0.1", loop: loop) else {
                failure = "cannot connect"
                return
            }
            transport = tls
            tls.start { [unowned self] event in
                switch event {
                case .data(let bytes): received += bytes
                case .closed, .failed: isClosed = true
                case .drained: break
                }
            }
        }
        _ = waitUntil(5) { loop.runOnce(); return transport != nil || failure != nil }
        if let failure { throw TestFailure(failure) }
    }

    deinit {
        transport?.closeNow()
        loop.finishDriving()
    }

    /// Writes `bytes` (TLS holds them until its handshake is done).
    func send(_ bytes: [UInt8]) {
        var bytes = bytes
        transport?.write(&bytes)
        loop.runOnce()
    }

    /// The next `count` bytes from the server, or what came before it closed or 5 s passed.
    func read(_ count: Int) -> [UInt8] {
        _ = waitUntil(5) { loop.runOnce(); return received.count >= count || isClosed }
        let bytes = Array(received.prefix(count))
        received.removeFirst(bytes.count)
        return bytes
    }

    /// The next binary frame from the server.
    func frame() throws -> Frame {
        let head = read(4)
        guard head.count == 4 else { throw TestFailure("the connection ended") }
        let length = head.reduce(0) { $0 << 8 | Int($1) }
        var buffer = InboundBuffer()
        buffer.append(head + read(length))
        var decoder = FrameDecoder(maxFrame: 1 << 24)
        guard case .frame(let frame)? = try decoder.next(from: &buffer) else { throw TestFailure("the connection ended in a frame") }
        return frame
    }

    /// Upgrades the connection to a WebSocket; false if the server did not switch.
    func upgrade(port: Int) -> Bool {
        send(Array(("GET / HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").utf8))
        var head: [UInt8] = []
        while head.suffix(4) != [13, 10, 13, 10] {
            let byte = read(1)
            guard !byte.isEmpty else { return false }
            head += byte
        }
        return String(decoding: head, as: UTF8.self).hasPrefix("HTTP/1.1 101")
    }

    /// Sends `payload` as one masked binary WebSocket message (under 126 bytes).
    func sendMessage(_ payload: [UInt8]) {
        let mask: [UInt8] = [0x12, 0x34, 0x56, 0x78]
        send([0x82, 0x80 | UInt8(payload.count)] + mask + payload.enumerated().map { $0.element ^ mask[$0.offset % 4] })
    }

    /// The frames of the server's next WebSocket message.
    func messageFrames() throws -> [Frame] {
        let header = read(2)
        guard header.count == 2 else { throw TestFailure("the connection ended") }
        var length = Int(header[1] & 0x7F)
        if length == 126 { length = read(2).reduce(0) { $0 << 8 | Int($1) } }
        var buffer = InboundBuffer()
        buffer.append(read(length))
        var decoder = FrameDecoder(maxFrame: 1 << 24)
        var frames: [Frame] = []
        while case .frame(let frame)? = try decoder.next(from: &buffer) { frames.append(frame) }
        return frames
    }

    /// The next frame that is neither a PING nor a POSITION (which comes when the server's
    /// acknowledgement is due, after ackMs, whenever the test is slow).
    func nextSkippingPingsAndPositions() throws -> Frame {
        while true {
            let frame = try frame()
            if frame.kind != .ping, frame.kind != .position { return frame }
        }
    }
}

/// Sessions over TLS (protocol/resumption.md, "Resuming" and "Loops and nodes"), on one loop and on
/// four: on four, connections are dealt round, so each new connection lands on the loop after the last one's.
@Suite struct SessionTLSTests {
    static let loopCounts = Array(Set([1, 4, ServerConfiguration.testLoops])).sorted()

    static func token(_ frame: Frame) throws -> String {
        try #require(try JSONText.parse(frame.payload ?? [])["session"]?["token"]?.stringValue)
    }

    /// A holder's session made over TLS resumes over TLS on whichever loop the new connection lands: what
    /// follows the HELLO is read there, and its caller, who waited, gets the answer given after resuming.
    @Test(arguments: loopCounts)
    func sessionResumesOverTLS(loops: Int) async throws {
        let server = try startTLSServer { $0.loops = loops }
        var holder: RawTLSConnection? = try RawTLSConnection(port: server.tlsPort)
        holder?.send(Frame(.hello, id: 1, payload: Array(#"{"session":{}}"#.utf8)).bytes)
        let token = try Self.token(try #require(try holder?.frame()))
        holder?.send(Frame(.register, id: 2, channel: "held.tls", payload: nil).bytes)
        let registered = try #require(try holder?.frame())
        holder = nil  // lost
        let caller = try RawConnection(port: server.port)
        try caller.send(.call(7, "held.tls", "work"))
        let resumer = try RawTLSConnection(port: server.tlsPort)
        resumer.send(Frame(.hello, id: 3, payload: Array(#"{"session":{"token":"\#(token)","position":\#(registered.bytes.count)}}"#.utf8)).bytes
                     + Frame(.ping, id: 4, payload: nil).bytes)
        let welcome = try resumer.frame()
        #expect(try JSONText.parse(welcome.payload ?? [])["session"]?["resumed"] == true, "\(welcome)")
        let received = [try resumer.nextSkippingPingsAndPositions(), try resumer.nextSkippingPingsAndPositions()]
        #expect(Set(received.map(\.kind.rawValue)) == [Frame.Kind.pong.rawValue, Frame.Kind.message.rawValue])
        let forwarded = try #require(received.first { $0.kind == .message })
        #expect(forwarded.channel == "held.tls")
        resumer.send(Frame(.reply, id: forwarded.id, payload: try StandardMethodCodec().encodeSuccessEnvelope("done")).bytes)
        #expect(try await caller.frame().envelope() == .success("done"))
        server.shutdown()
        await server.waitUntilStopped()
    }

    /// The same over a WebSocket over TLS: its WebSocket state moves along with its TLS state.
    @Test(arguments: loopCounts)
    func sessionResumesOverSecureWebSocket(loops: Int) async throws {
        let server = try startTLSServer { $0.loops = loops }
        var holder: RawTLSConnection? = try RawTLSConnection(port: server.tlsPort)
        #expect(holder?.upgrade(port: server.tlsPort) == true)
        holder?.sendMessage(Frame(.hello, id: 1, payload: Array(#"{"session":{}}"#.utf8)).bytes)
        let token = try Self.token(try #require(try holder?.messageFrames().first))
        holder?.sendMessage(Frame(.register, id: 2, channel: "held.wss", payload: nil).bytes)
        let registered = try #require(try holder?.messageFrames().first)
        holder = nil  // lost
        let caller = try RawConnection(port: server.port)
        try caller.send(.call(7, "held.wss", "work"))
        let resumer = try RawTLSConnection(port: server.tlsPort)
        #expect(resumer.upgrade(port: server.tlsPort))
        resumer.sendMessage(Frame(.hello, id: 3, payload: Array(#"{"session":{"token":"\#(token)","position":\#(registered.bytes.count)}}"#.utf8)).bytes)
        resumer.sendMessage(Frame(.ping, id: 4, payload: nil).bytes)
        let welcome = try #require(try resumer.messageFrames().first)
        #expect(try JSONText.parse(welcome.payload ?? [])["session"]?["resumed"] == true, "\(welcome)")
        var received: [Frame] = []
        while received.count < 2 { received += try resumer.messageFrames() }
        #expect(Set(received.map(\.kind.rawValue)) == [Frame.Kind.pong.rawValue, Frame.Kind.message.rawValue])
        let forwarded = try #require(received.first { $0.kind == .message })
        resumer.sendMessage(Frame(.reply, id: forwarded.id, payload: try StandardMethodCodec().encodeSuccessEnvelope("done")).bytes)
        #expect(try await caller.frame().envelope() == .success("done"))
        server.shutdown()
        await server.waitUntilStopped()
    }
}
