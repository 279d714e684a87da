import Foundation
import Testing
import SwitchboardCodec
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport
import SwitchboardWire

/// A server whose deadlines are short (300 ms), so that a test sees them pass in well under a second.
private func withShortDeadlines(_ configure: @escaping (inout ServerConfiguration) -> Void = { _ in },
                                _ body: (Server, Int) async throws -> Void) async throws {
    try await withServer({
        $0.firstFrameTimeoutMs = 300
        $0.frameTimeoutMs = 300
        $0.heartbeatMs = 60_000  // the heartbeat exempts text connections: it must not be what closes them
        configure(&$0)
    }, body)
}

/// ``withShortDeadlines``' settings, for an embedded server.
private func shortDeadlines() -> ServerConfiguration {
    var config = ServerConfiguration()
    config.firstFrameTimeoutMs = 300
    config.frameTimeoutMs = 300
    config.heartbeatMs = 60_000
    return config
}

/// The server's close counts by reason, over a connection of its own.
private func closes(port: Int) async throws -> [String: Int] {
    let wire = try RawConnection(port: port)
    try wire.send(.call(0x5747, "switchboard/stats", "get"))
    let stats = try await wire.frame().envelope().get()
    var counts: [String: Int] = [:]
    guard case .map(let entries)? = stats["closes"] else { return [:] }
    for entry in entries {
        if let reason = entry.key.stringValue, let count = entry.value.intValue { counts[reason] = count }
    }
    return counts
}

private let hello = Frame(.hello, id: 1, payload: Array(#"{"version":1}"#.utf8))

/// A masked client WebSocket frame (RFC 6455), FIN and opcode in `first`.
private func maskedFrame(_ first: UInt8, _ payload: [UInt8]) -> [UInt8] {
    var frame: [UInt8] = [first]
    frame += payload.count < 126 ? [0x80 | UInt8(payload.count)] : [0x80 | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
    let mask: [UInt8] = [1, 2, 3, 4]
    return frame + mask + payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
}

/// Bytes read until the server closes: what it sent, or nil if it kept the connection open for the
/// socket's whole read timeout.
private func untilClosed(_ socket: RawSocket) -> [UInt8]? { socket.readUntilClosed()?.bytes }

@Suite("Deadlines for slow starts and unfinished frames")
struct DeadlineTests {
    @Test("a connection that sends nothing is closed after the first-frame timeout, with nothing written, and counted")
    func silentConnection() async throws {
        try await withShortDeadlines { _, port in
            let silent = try #require(RawSocket(port: port))
            #expect(untilClosed(silent) == [])
            #expect(try await closes(port: port)["firstFrameTimeout"] == 1)
            let metrics = try #require(httpGet("/metrics", port: port))
            #expect(metrics.body.contains(#"switchboard_closes_total{reason="firstFrameTimeout"} 1"#))
        }
    }

    @Test("text mode: `{` and nothing more gets an error line `timeout`, then the close, heartbeat or not")
    func textSlowStart() async throws {
        try await withShortDeadlines { _, port in
            let socket = try #require(RawSocket(port: port))
            socket.send("{")
            let said = String(decoding: try #require(untilClosed(socket)), as: UTF8.self)
            #expect(said.hasPrefix(#"{"error":{"code":"timeout","message":"no complete frame or line within 300 ms"}}"#), "\(said)")
            #expect(try await closes(port: port)["firstFrameTimeout"] == 1)
        }
    }

    @Test("text mode: a line begun after others and never finished gets `timeout`, counted as frameTimeout")
    func textUnfinishedLine() async throws {
        try await withShortDeadlines { _, port in
            let socket = try #require(RawSocket(port: port))
            socket.send(#"{"id":1,"ping":true}"# + "\n")
            #expect(String(decoding: socket.read(), as: UTF8.self) == #"{"id":1,"pong":true}"# + "\n")
            socket.send(#"{"id":2,"call":"switchboard/echo","#)
            let said = String(decoding: try #require(untilClosed(socket)), as: UTF8.self)
            #expect(said == #"{"error":{"code":"timeout","message":"a frame or line was not finished within 300 ms"}}"# + "\n")
            #expect(try await closes(port: port)["frameTimeout"] == 1)
        }
    }

    @Test("binary: a frame begun after HELLO and never finished gets ERROR timeout (id 0), then the close")
    func binaryUnfinishedFrame() async throws {
        try await withShortDeadlines { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(hello)
            #expect(try await wire.frame().kind == .welcome)
            try wire.send(Array(try Frame.call(2, "switchboard/echo", "echo", 1).bytes.prefix(7)))
            let error = try await wire.frame()
            #expect(error.kind == .error && error.id == 0)
            #expect(String(decoding: error.payload ?? [], as: UTF8.self).contains(#""code":"timeout""#))
            #expect(try await wire.isClosedByServer())
            #expect(try await closes(port: port)["frameTimeout"] == 1)
        }
    }

    @Test("a client idle after its first frame (binary, text) is not closed: only the first frame and unfinished ones are timed")
    func idleAfterFirstFrameStaysOpen() throws {
        let embedded = try EmbeddedServer(configuration: shortDeadlines())
        let binary = embedded.connect()
        binary.send(hello)
        let text = embedded.connect()
        text.send(line: #"{"id":1,"ping":true}"#)
        embedded.run()
        #expect(try binary.frames().map(\.kind) == [.welcome])
        #expect(try text.lines() == [["id": 1, "pong": true]])
        embedded.advanceTime(byMs: 1200)  // four deadlines' worth of silence
        #expect(!binary.isClosed && !text.isClosed)
        #expect(try binary.frames().isEmpty)
        text.send(line: #"{"id":2,"ping":true}"#)
        embedded.run()
        #expect(try text.lines() == [["id": 2, "pong": true]])
        let closes = try binary.stats(on: embedded)["closes"]
        #expect(closes?["firstFrameTimeout"] == nil && closes?["frameTimeout"] == nil)
    }

    @Test("a frame that keeps arriving (64 KiB per deadline) is not cut off, however long it takes")
    func largeFrameOnASlowLink() throws {
        var config = shortDeadlines()
        config.frameTimeoutMs = 2000
        let embedded = try EmbeddedServer(configuration: config)
        let peer = embedded.connect()
        peer.send(hello)
        embedded.run()
        #expect(try peer.frames().map(\.kind) == [.welcome])
        // 200 KB every 100 ms: 4 s, two deadlines, in all.
        let bytes = try Frame.call(2, "switchboard/echo", "echo", .uint8List([UInt8](repeating: 7, count: 8_000_000))).bytes
        for start in stride(from: 0, to: bytes.count, by: 200_000) {
            peer.send(Array(bytes[start..<min(start + 200_000, bytes.count)]))
            embedded.advanceTime(byMs: 100)
        }
        let reply = try #require(try peer.frames().first)
        #expect(reply.kind == .reply && reply.id == 2)
    }

    @Test("HTTP: half a request head gets 408, then the close; counted as firstFrameTimeout")
    func halfHTTPHead() async throws {
        try await withShortDeadlines { _, port in
            let socket = try #require(RawSocket(port: port))
            socket.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            let said = String(decoding: try #require(untilClosed(socket)), as: UTF8.self)
            #expect(said.hasPrefix("HTTP/1.1 408 Request Timeout\r\n"), "\(said)")
            #expect(try await closes(port: port)["firstFrameTimeout"] == 1)
        }
    }

    @Test(arguments: [40 * 1024, 60 * 1024])
    func requestHeadOver16KiBInOneReadGets431(size: Int) async throws {
        try await withServer { _, port in
            let socket = try #require(RawSocket(port: port))
            socket.send("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + String(repeating: "a", count: size) + "\r\n\r\n")
            let said = String(decoding: try #require(untilClosed(socket)), as: UTF8.self)
            #expect(said.hasPrefix("HTTP/1.1 431 "), "\(said.prefix(40))")
        }
    }

    @Test("WebSocket: a frame begun after the first message and never finished gets ERROR timeout, then 1008")
    func webSocketUnfinishedFrame() async throws {
        try await withShortDeadlines { _, port in
            let ws = try #require(RawWebSocket(port: port))
            ws.send(opcode: 2, hello.bytes)
            #expect(ws.receive()?.opcode == 2)  // WELCOME
            ws.socket.send([0x82])  // the first byte of a frame header
            let error = try #require(ws.receive())
            #expect(error.opcode == 2 && String(decoding: error.payload, as: UTF8.self).contains(#""code":"timeout""#))
            let close = try #require(ws.receive())
            #expect(close.opcode == 8 && RawWebSocket.closeCode(close.payload) == 1008)
            #expect(try await closes(port: port)["frameTimeout"] == 1)
        }
    }

    @Test("WebSocket: an upgrade with no message after it is closed with 1008 at the first-frame timeout")
    func webSocketSilentAfterUpgrade() async throws {
        try await withShortDeadlines { _, port in
            let ws = try #require(RawWebSocket(port: port))
            let close = try #require(ws.receive())
            #expect(close.opcode == 8 && RawWebSocket.closeCode(close.payload) == 1008)
            #expect(try await closes(port: port)["firstFrameTimeout"] == 1)
        }
    }

    @Test("WebSocket: a fragmented message over maxFrame closes with 1009, like an unfragmented one")
    func fragmentedMessageOverMaxFrame() async throws {
        try await withServer({ $0.maxFrame = 256 }) { _, port in
            let ws = try #require(RawWebSocket(port: port))
            ws.send(opcode: 1, Array(#"{"id":1,"ping":true}"#.utf8))
            #expect(ws.receive()?.opcode == 1)
            // One text message of 420 bytes in two fragments of 210: each under maxFrame, the message over it.
            ws.socket.send(maskedFrame(0x01, Array((#"{"id":2,"call":"switchboard/echo","method":"echo","args":""# + String(repeating: "a", count: 160)).utf8)))
            ws.socket.send(maskedFrame(0x80, Array((String(repeating: "a", count: 208) + #""}"#).utf8)))
            let close = try #require(ws.receive())
            #expect(close.opcode == 8 && RawWebSocket.closeCode(close.payload) == 1009, "\(close.opcode) \(String(decoding: close.payload, as: UTF8.self))")
        }
    }
}

@Suite("Caps on connections")
struct ConnectionCapTests {
    @Test("over maxConnections, a new connection is closed at once and counted as overConnectionLimit")
    func totalCap() async throws {
        try await withServer({ $0.maxConnections = 3 }) { _, port in
            let held = try (0..<2).map { _ in try RawConnection(port: port) }
            for wire in held { #expect(try await wire.barrier().isEmpty) }
            let reader = try RawConnection(port: port)
            #expect(try await reader.barrier().isEmpty)
            let refused = try #require(RawSocket(port: port))
            #expect(untilClosed(refused) == [])
            try reader.send(.call(9, "switchboard/stats", "get"))
            let stats = try await reader.frame().envelope().get()
            #expect(stats["closes"]?["overConnectionLimit"]?.intValue == 1 && stats["connections"] == 3)
        }
    }

    @Test("over maxConnectionsPerAddress, refused and counted as overAddressLimit; a slot that frees is taken again")
    func perAddressCap() async throws {
        try await withServer({ $0.maxConnectionsPerAddress = 2; $0.capsLoopback = true }) { _, port in
            var held = try (0..<2).map { _ in try RawConnection(port: port) }
            for wire in held { #expect(try await wire.barrier().isEmpty) }
            let refused = try #require(RawSocket(port: port))
            #expect(untilClosed(refused) == [])
            held.removeFirst()  // closed: its slot frees once the server has seen it go
            var admitted: RawConnection?
            _ = try await eventually {
                let wire = try RawConnection(port: port, receiveTimeout: 1)
                if (try? await wire.barrier()) != nil { admitted = wire }
                return admitted != nil
            }
            let reader = try #require(admitted)
            try reader.send(.call(9, "switchboard/stats", "get"))
            let stats = try await reader.frame().envelope().get()
            #expect((stats["closes"]?["overAddressLimit"]?.intValue ?? 0) >= 1)
        }
    }

    @Test("a transport's address is counted by its host, the port aside; IPv4, IPv6 and IPv4-mapped loopback are loopback")
    func hostsAndLoopback() {
        #expect(hostOfAddress( "203.0.113.9:5100") == "203.0.113.9")
        #expect(hostOfAddress( "[2001:db8::1]:443") == "2001:db8::1")
        #expect(["127.0.0.1", "127.3.4.5", "::1", "::ffff:127.0.0.1"].allSatisfy { isLoopbackAddress($0) })
        #expect(!["10.0.0.1", "2001:db8::1", "::ffff:10.0.0.1", "1.127.0.0"].contains { isLoopbackAddress($0) })
    }

    @Test("loopback is exempt from the per-address cap by default")
    func loopbackExempt() async throws {
        try await withServer({ $0.maxConnectionsPerAddress = 1 }) { _, port in
            let wires = try (0..<3).map { _ in try RawConnection(port: port) }
            for wire in wires { #expect(try await wire.barrier().isEmpty) }
        }
    }
}
