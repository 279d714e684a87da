import Testing
import SwitchboardWire

/// `Frame`'s encoding against wire-v1 section 2 and protocol/wire.md's example.
@Suite struct FrameTests {
    /// Each kind with the channels its rule allows, and a null, an empty and a non-empty payload.
    static let everyShape: [Frame] = Frame.Kind.allCases.flatMap { kind -> [Frame] in
        let channels: [String] = switch kind.channelRule {
        case true?: ["switchboard/échos"]
        case false?: [""]
        case nil: ["", "x"]
        }
        return channels.flatMap { channel in
            [nil, [], [0, 1, 0xFE, 0xFF]].map { Frame(kind, id: 0x0102_0304, channel: channel, payload: $0) }
        }
    }

    @Test("every kind, with and without a channel and a payload, decodes to the frame it was encoded from")
    func roundTrips() throws {
        #expect(Self.everyShape.count == Frame.Kind.allCases.count * 3 + 3)
        for frame in Self.everyShape {
            var decoder = FrameDecoder(maxFrame: 1 << 20)
            var buffer = InboundBuffer()
            buffer.append(frame.bytes)
            #expect(try decoder.next(from: &buffer) == .frame(frame), "\(frame)")
            #expect(buffer.readableBytes == 0)
        }
    }

    @Test("a channel name of 65,535 bytes, the largest chanlen, is written in both length bytes and round trips")
    func longestChannel() throws {
        let frame = Frame(.register, id: 2, channel: String(repeating: "n", count: 0xFFFF), payload: [1])
        let bytes = frame.bytes
        #expect(bytes[6] == 0xFF && bytes[7] == 0xFF)
        var decoder = FrameDecoder(maxFrame: 1 << 20)
        var buffer = InboundBuffer()
        buffer.append(bytes)
        #expect(try decoder.next(from: &buffer) == .frame(frame))
    }

    @Test("the bytes of protocol/wire.md's example: echo(\"hi\") on switchboard/echo with id 1, and its reply")
    func documentedExample() {
        let call = Frame(.message, id: 1, channel: "switchboard/echo", payload: [0x07, 0x04] + Array("echo".utf8) + [0x07, 0x02] + Array("hi".utf8))
        #expect(call.bytes == [0x00, 0x00, 0x00, 0x22, 0x03, 0x00, 0x00, 0x10, 0x00, 0x00, 0x00, 0x01]
            + Array("switchboard/echo".utf8) + [0x07, 0x04, 0x65, 0x63, 0x68, 0x6F, 0x07, 0x02, 0x68, 0x69])
        let reply = Frame(.reply, id: 1, payload: [0x00, 0x07, 0x02, 0x68, 0x69])
        #expect(reply.bytes == [0x00, 0x00, 0x00, 0x0D, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x07, 0x02, 0x68, 0x69])
    }

    @Test("NULL_PAYLOAD is flag bit 0 and no bytes; an empty payload is neither")
    func nullIsNotEmpty() {
        let null = Frame(.reply, id: 1, payload: nil).bytes, empty = Frame(.reply, id: 1, payload: []).bytes
        #expect(null.count == Frame.headerSize && null[5] == Frame.nullPayloadFlag)
        #expect(empty.count == Frame.headerSize && empty[5] == 0)
    }

    @Test("a frame begun with startFrame, its payload written in place and finished, has the bytes of write")
    func writtenInPlace() {
        for frame in Self.everyShape where frame.payload != nil {
            var out: [UInt8] = [0xAA]  // something before it, as in an outbound buffer
            let start = Frame.startFrame(frame.kind, id: frame.id, channel: frame.channel, to: &out)
            out += frame.payload ?? []
            Frame.finishFrame(startingAt: start, in: &out)
            #expect(out == [0xAA] + frame.bytes, "\(frame)")
        }
    }

    @Test("each kind's type byte and channel rule are wire-v1's table")
    func kindTable() {
        #expect(Frame.Kind.allCases.map(\.rawValue) == Array(1...14))  // 13, 14: POSITION, END (protocol/resumption.md)
        #expect(Frame.Kind.allCases.filter { $0.channelRule == true } == [.message, .register, .unregister, .demand])
        #expect(Frame.Kind.allCases.filter { $0.channelRule == nil } == [.error])
        #expect(Frame.Kind.allCases.filter(\.isServerOnly) == [.welcome, .error, .goAway])
    }
}
