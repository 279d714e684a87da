import Testing
@testable import SwitchboardTransport

/// The client side of ``WebSocketSession``: plain data frames are read without wslay, everything else by
/// wslay, and the two must agree however the bytes are cut.
@Suite("WebSocket client session")
struct WebSocketSessionTests {
    /// A server's frame (unmasked): `first` is FIN, reserved bits and opcode.
    static func frame(_ first: UInt8, _ payload: [UInt8]) -> [UInt8] {
        var bytes = [first]
        switch payload.count {
        case ..<126: bytes.append(UInt8(payload.count))
        case ...0xFFFF: bytes += [126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
        default: bytes.append(127); bytes += (0..<8).reversed().map { UInt8(truncatingIfNeeded: payload.count >> ($0 * 8)) }
        }
        return bytes + payload
    }

    /// Feeds `stream` in pieces of `piece` bytes; returns what the session read (binary messages as
    /// they are, text messages each followed by a newline) and the session.
    static func read(_ stream: [UInt8], piece: Int) -> (messages: [UInt8], session: WebSocketSession, ok: Bool) {
        let session = WebSocketSession(role: .client, maxMessage: 1 << 20)
        var messages: [UInt8] = []
        var ok = true
        var start = 0
        while start < stream.count, ok {
            ok = session.receive(Array(stream[start..<min(stream.count, start + piece)]))
            messages += session.takeReceived()
            start += piece
        }
        return (messages, session, ok)
    }

    @Test("plain frames, a ping, a fragmented message, frames of every length size, then a close: the same messages at any cut")
    func framesCutAnywhere() {
        let large = [UInt8](repeating: 7, count: 70_000), medium = [UInt8](repeating: 9, count: 200)
        let beforeClose = Self.frame(0x82, Array("abc".utf8)) + Self.frame(0x81, Array("hi".utf8)) + Self.frame(0x89, [1])
            + Self.frame(0x01, Array("he".utf8)) + Self.frame(0x80, Array("llo".utf8)) + Self.frame(0x82, large)
            + Self.frame(0x82, medium) + Self.frame(0x82, [])
        let stream = beforeClose + Self.frame(0x88, [0x03, 0xE8]) + Self.frame(0x82, Array("after the close".utf8))
        let expected = Array("abchi\nhello\n".utf8) + large + medium
        for piece in [1, 2, 3, 5, 64, 4096, 65_536, stream.count] {
            let (messages, session, ok) = Self.read(stream, piece: piece)
            #expect(ok)
            let same = messages == expected  // (compared apart: a failure prints sizes, not 70,000 bytes)
            #expect(same, "piece \(piece): \(messages.count) bytes read, \(messages.prefix(16)) first")
            #expect(session.closeReceived && session.closeCodeReceived == 1000)
            let (_, open, _) = Self.read(beforeClose, piece: piece)
            #expect(open.takeOutput().first == 0x8A, "the ping is answered, piece \(piece)")
        }
    }

    @Test("what a server must not send is refused as wslay refuses it: a masked frame, reserved bits, a continuation out of place, a new message inside a fragmented one, bad UTF-8, a length in too many bytes")
    func refusals() {
        for bad in [[0x82, 0x81, 1, 2, 3, 4, 5] as [UInt8], Self.frame(0xC2, [1]), Self.frame(0x80, [1]),
                    Self.frame(0x02, [7]) + Self.frame(0x82, [8]), Self.frame(0x81, [0xFF]), [0x82, 126, 0, 2, 9, 9]] {
            let (messages, session, ok) = Self.read(Self.frame(0x82, [1]) + bad + Self.frame(0x82, [2]), piece: 1 << 20)
            #expect(messages == [1] || messages == [1, 7], "\(bad): \(messages)")
            _ = session.takeOutput()  // wslay queued its close: sent, it is the session's close code
            #expect(!ok || [1002, 1007].contains(session.closeCodeSent), "\(bad): closed \(session.closeCodeSent)")
        }
    }
}
