import Testing
import SwitchboardCodec
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// A session's streams, positions, POSITION and END on a connection (protocol/resumption.md,
/// "Streams and positions").
@Suite struct SessionStreamTests {
    /// A connection with a new session, its WELCOME read.
    static func sessionPeer(_ embedded: EmbeddedServer) throws -> InMemoryTransport {
        let peer = embedded.connect()
        peer.send(Frame(.hello, id: 1, payload: Array(#"{"version":1,"session":{}}"#.utf8)))
        embedded.run()
        let welcome = try #require(try peer.frames().first)
        #expect(try JSONText.parse(welcome.payload!)["session"] != nil)
        return peer
    }

    static func position(_ value: UInt64) -> Frame {
        Frame(.position, payload: (0..<8).map { UInt8(truncatingIfNeeded: value >> (56 - 8 * UInt64($0))) })
    }

    static func value(of position: Frame) -> UInt64? {
        guard position.kind == .position, let payload = position.payload, payload.count == 8 else { return nil }
        return payload.reduce(0) { $0 << 8 | UInt64($1) }
    }

    /// The bytes of the server's stream in `frames`: all but POSITION and END.
    static func streamBytes(_ frames: [Frame]) -> UInt64 {
        UInt64(frames.filter { $0.kind != .position && $0.kind != .end }.map(\.bytes.count).reduce(0, +))
    }

    /// The server's sent position counts every frame after the WELCOME and nothing else: the client
    /// may acknowledge exactly that much, and one byte more is `bad_frame` (the connection stays).
    @Test func clientAcknowledgesUpToTheSentPosition() throws {
        let embedded = try EmbeddedServer()
        let peer = try Self.sessionPeer(embedded)
        peer.send(Frame(.ping, id: 2, payload: [1, 2, 3]))
        embedded.run()
        var sent = Self.streamBytes(try peer.frames())
        #expect(sent == 15)
        peer.send(Self.position(sent + 1))
        peer.send(Self.position(.max))  // no arithmetic on it can trap
        embedded.run()
        let refused = try peer.frames()
        #expect(refused.map(\.errorCode) == ["bad_frame", "bad_frame"])
        sent += Self.streamBytes(refused)  // an ERROR that does not close is in the stream
        peer.send(Self.position(sent))
        peer.send(Self.position(3))  // lower than the last: ignored
        peer.send(Frame(.ping, id: 3, payload: nil))
        embedded.run()
        #expect(try peer.frames().map(\.kind) == [.pong])
    }

    @Test func positionPayloadMustBeEightBytes() throws {
        let embedded = try EmbeddedServer()
        let peer = try Self.sessionPeer(embedded)
        peer.send(Frame(.position, id: 4, payload: [0, 0, 0, 0]))
        peer.send(Frame(.position, id: 5, payload: nil))
        peer.send(Frame(.ping, id: 6, payload: nil))
        embedded.run()
        let frames = try peer.frames()
        #expect(frames.map(\.errorCode) == ["bad_frame", "bad_frame", nil] && frames.map(\.id) == [4, 5, 6])
    }

    /// Once the client's stream since the last POSITION reaches ackBytes (65,536), a POSITION names the
    /// server's received position: every byte after the HELLO, not the client's POSITIONs.
    @Test func serverAcknowledgesEveryAckBytes() throws {
        let embedded = try EmbeddedServer()
        let peer = try Self.sessionPeer(embedded)
        peer.send(Self.position(0))  // not in the client's stream
        var stream: UInt64 = 0
        for id in 1...64 {
            let call = try Frame.call(UInt32(id), "switchboard/echo", "echo", .string(String(repeating: "x", count: 1000)))
            stream += UInt64(call.bytes.count)
            peer.send(call)
            if stream >= 65_536 { break }
        }
        embedded.run()
        let positions = try peer.frames().compactMap(Self.value)
        #expect(positions == [stream])
    }

    /// A slow stream is acknowledged ackMs (1,000 ms) after its first unacknowledged byte, and never
    /// for nothing new.
    @Test func serverAcknowledgesAfterAckMs() throws {
        let embedded = try EmbeddedServer()
        let peer = try Self.sessionPeer(embedded)
        peer.send(Frame(.ping, id: 2, payload: nil))
        embedded.run()
        #expect(try peer.frames().map(\.kind) == [.pong])
        embedded.advanceTime(byMs: 800)
        #expect(try peer.frames().isEmpty)
        embedded.advanceTime(byMs: 400)
        #expect(try peer.frames().compactMap(Self.value) == [12])
        embedded.advanceTime(byMs: 3000)
        #expect(try peer.frames().isEmpty)
    }

    /// A later HELLO is in the client's stream like any frame (12 bytes, then the PING's 12).
    @Test func laterHelloIsInTheStream() throws {
        let embedded = try EmbeddedServer()
        let peer = try Self.sessionPeer(embedded)
        peer.send(Frame(.hello, id: 2, payload: nil))
        peer.send(Frame(.ping, id: 3, payload: nil))
        embedded.run()
        #expect(try peer.frames().map(\.kind) == [.welcome, .pong])
        embedded.advanceTime(byMs: 1200)
        #expect(try peer.frames().compactMap(Self.value) == [24])
    }

    /// END from the client ends the session: the connection goes on as plain wire-v1, nothing is
    /// acknowledged any more, and POSITION and END that cross it are ignored.
    @Test func clientEndsItsSession() throws {
        let embedded = try EmbeddedServer()
        let peer = try Self.sessionPeer(embedded)
        peer.send(Frame(.end, id: 2, payload: [1]))  // a client's END has no payload
        embedded.run()
        #expect(try peer.frames().map(\.errorCode) == ["bad_frame"])
        peer.send(Frame(.end, payload: nil))
        peer.send(Self.position(0))
        peer.send(Frame(.end, payload: []))
        peer.send(Frame(.ping, id: 3, payload: nil))
        embedded.run()
        #expect(try peer.frames().map(\.kind) == [.pong])
        embedded.advanceTime(byMs: 2000)
        #expect(try peer.frames().isEmpty)
    }

    /// What the client leaves unacknowledged past --session-bytes (far below the outbound limit) ends
    /// the session: END `overflowed`, and the connection goes on.
    @Test func unacknowledgedOutputPastSessionBytesEndsTheSession() throws {
        var config = ServerConfiguration()
        config.sessionBytes = 4096
        let embedded = try EmbeddedServer(configuration: config)
        let peer = try Self.sessionPeer(embedded)
        let big = String(repeating: "y", count: 3000)
        peer.send(try .call(2, "switchboard/echo", "echo", .string(big)))
        embedded.run()
        let first = try peer.frames().filter { $0.kind != .position }  // the client's 3,000 bytes pass ackBytes (2,048)
        #expect(first.map(\.kind) == [.reply])
        peer.send(try .call(3, "switchboard/echo", "echo", .string(big)))
        embedded.run()
        let second = try peer.frames().filter { $0.kind != .position }
        #expect(second.map(\.kind) == [.reply, .end])
        let reason = try second.last.flatMap { try JSONText.parse($0.payload ?? [])["reason"] }
        #expect(reason == "overflowed")
        peer.send(Frame(.ping, id: 4, payload: nil))
        embedded.run()
        #expect(try peer.frames().map(\.kind) == [.pong])
        embedded.advanceTime(byMs: 2000)
        #expect(try peer.frames().isEmpty)  // no POSITION after END
    }

    /// An event the stream had credit for, dropped because the client does not read fast enough, ends
    /// the session (END `overflowed`): the client would otherwise miss it without knowing.
    @Test func droppedEventWithCreditEndsTheSession() throws {
        var config = ServerConfiguration()
        config.outboundLimit = 4096
        let embedded = try EmbeddedServer(configuration: config)
        let numbers = EventChannel(name: "numbers", queueLimit: 1, server: embedded.server)
        numbers.setStreamHandler(StreamHandlerClosures(onListen: { _, _ in nil }))
        embedded.run()
        let peer = try Self.sessionPeer(embedded)
        peer.send(try .call(2, "numbers", "listen"))
        embedded.run()
        var sent = Self.streamBytes(try peer.frames())
        peer.peerWindow = 0  // reads nothing from now on
        let event = ChannelValue.string(String(repeating: "e", count: 1000))
        for _ in 0..<3 { numbers.broadcast(event) }
        embedded.run()
        sent += UInt64(peer.unreadCount)
        peer.send(Self.position(sent))  // acknowledged (not read): nothing kept, so only the drop can end it
        embedded.run()
        for _ in 0..<3 { numbers.broadcast(event) }
        embedded.run()
        peer.peerWindow = .max
        let ends = try peer.frames().filter { $0.kind == .end }
        #expect(ends.count == 1)
        #expect(try ends.first.flatMap { try JSONText.parse($0.payload ?? [])["reason"] } == "overflowed")
    }

    /// Events waiting for credit that a cancel drops were never asked for: the session goes on.
    @Test func cancellingAPacedStreamKeepsTheSession() throws {
        let embedded = try EmbeddedServer()
        let numbers = EventChannel(name: "numbers", server: embedded.server)
        numbers.setStreamHandler(StreamHandlerClosures(onListen: { _, _ in nil }))
        embedded.run()
        let peer = try Self.sessionPeer(embedded)
        peer.send(Frame(.demand, channel: "numbers", payload: [0, 0, 0, 1]))
        peer.send(try .call(2, "numbers", "listen"))
        embedded.run()
        for n in 0..<3 { numbers.broadcast(ChannelValue.int(n)) }
        embedded.run()
        peer.send(try .call(3, "numbers", "cancel"))
        embedded.run()
        #expect(!(try peer.frames().contains { $0.kind == .end }))
        #expect(embedded.server.core.value.sessions.live.count == 1)
    }

    /// Acknowledged output is forgotten, so a client that acknowledges keeps its session however much it reads.
    @Test func acknowledgedOutputIsForgotten() throws {
        var config = ServerConfiguration()
        config.outboundLimit = 4096
        let embedded = try EmbeddedServer(configuration: config)
        let peer = try Self.sessionPeer(embedded)
        var sent: UInt64 = 0
        for id in 2...10 {
            peer.send(try .call(UInt32(id), "switchboard/echo", "echo", .string(String(repeating: "z", count: 3000))))
            embedded.run()
            let frames = try peer.frames()
            #expect(!frames.contains { $0.kind == .end })
            sent += Self.streamBytes(frames)
            peer.send(Self.position(sent))
        }
    }
}
