import Testing
import SwitchboardCodec
@testable import SwitchboardWire  // `storage` and `readerIndex`: to see that a view shares the buffer

/// `FrameDecoder` against wire-v1 section 2: frames however the bytes arrive, the header errors that
/// close the connection, and the rejections that do not.
@Suite struct FrameDecoderTests {
    /// A call, a null reply, an event with an empty payload, a ping: channels, payloads and ids of every shape.
    static let stream: [Frame] = [
        Frame(.message, id: 1, channel: "switchboard/echo", payload: Array("a payload".utf8)),
        Frame(.reply, id: 1, payload: nil),
        Frame(.message, id: 0, channel: "événements", payload: []),
        Frame(.ping, id: 0xFFFF_FFFF, payload: [0, 255]),
        Frame(.message, id: 2, channel: "switchboard/echo", payload: nil),
    ]

    @Test("split in two at every byte offset, the stream decodes to the same frames")
    func everySplit() throws {
        let bytes = Self.stream.flatMap(\.bytes)
        for offset in 0...bytes.count {
            var decoder = FrameDecoder(maxFrame: 1 << 20)
            var buffer = InboundBuffer()
            buffer.append(Array(bytes[..<offset]))
            var decoded = try decodeAll(&decoder, &buffer)
            buffer.append(Array(bytes[offset...]))
            decoded += try decodeAll(&decoder, &buffer)
            #expect(decoded == Self.stream.map { .frame($0) }, "split at \(offset)")
            #expect(buffer.readableBytes == 0)
        }
    }

    @Test("fed one byte at a time, the stream decodes to the same frames")
    func byteByByte() throws {
        var decoder = FrameDecoder(maxFrame: 1 << 20)
        var buffer = InboundBuffer()
        var decoded: [FrameDecoder.Decoded] = []
        for byte in Self.stream.flatMap(\.bytes) {
            buffer.append([byte])
            decoded += try decodeAll(&decoder, &buffer)
        }
        #expect(decoded == Self.stream.map { .frame($0) })
    }

    @Test("several frames in one read come out one by one, in order, and nothing is left")
    func severalFramesInOneRead() throws {
        var decoder = FrameDecoder(maxFrame: 1 << 20)
        var buffer = InboundBuffer()
        buffer.append(Self.stream.flatMap(\.bytes))
        for frame in Self.stream { #expect(try decoder.next(from: &buffer) == .frame(frame)) }
        #expect(try decoder.next(from: &buffer) == nil)
        #expect(buffer.readableBytes == 0)
    }

    @Test("a stream of frames larger than the compaction threshold, read in odd chunks, decodes whole")
    func acrossCompaction() throws {
        let frames = (1...300).map { Frame(.message, id: UInt32($0), channel: "c\($0 % 3)", payload: Array(repeating: UInt8($0 % 251), count: 997)) }
        let bytes = frames.flatMap(\.bytes)
        var decoder = FrameDecoder(maxFrame: 1 << 20)
        var buffer = InboundBuffer()
        var decoded: [FrameDecoder.Decoded] = []
        var compacted = false
        for start in stride(from: 0, to: bytes.count, by: 7_001) {
            buffer.append(Array(bytes[start..<min(start + 7_001, bytes.count)]))
            let before = buffer.readerIndex
            decoded += try decodeAll(&decoder, &buffer)
            if buffer.readableBytes > 0, buffer.readerIndex < before { compacted = true }
        }
        #expect(compacted)  // else the test did not test what it says
        #expect(decoded.count == frames.count)
        let expected = frames.map { FrameDecoder.Decoded.frame($0) }
        #expect(decoded.indices.first { decoded[$0] != expected[$0] } == nil)  // not 300 frames in a failure
    }

    @Test("the smallest frame (length 8) and a frame of exactly maxFrame are accepted")
    func boundsAccepted() throws {
        var decoder = FrameDecoder(maxFrame: 100)
        var buffer = InboundBuffer()
        buffer.append(header(length: 8, type: 5, id: 7))
        #expect(try decoder.next(from: &buffer) == .frame(Frame(.ping, id: 7, payload: [])))
        let largest = Frame(.message, id: 1, channel: "c", payload: Array(repeating: 9, count: 100 - 8 - 1))
        buffer.append(largest.bytes)
        #expect(try decoder.next(from: &buffer) == .frame(largest))
    }

    @Test("a length below 8 is malformed_frame from its 4 bytes alone, and closes", arguments: 0...7 as ClosedRange<UInt32>)
    func lengthBelowMinimum(length: UInt32) {
        var decoder = FrameDecoder(maxFrame: 1 << 20)
        var buffer = InboundBuffer()
        buffer.append(bigEndian(length))
        #expect(throws: WireError.malformedFrame("length \(length) is less than 8")) { try decoder.next(from: &buffer) }
        #expect(WireError.malformedFrame("").code == "malformed_frame" && WireError.malformedFrame("").closesConnection)
    }

    @Test("a length above maxFrame is frame_too_large (with the length declared) from its 4 bytes alone, and closes; UInt32.max does not trap",
          arguments: [(100, 101), (16 << 20, 16 << 20 + 1), (1 << 30, UInt32.max), (16 << 20, UInt32.max), (0, 8)] as [(UInt32, UInt32)])
    func lengthAboveMaximum(maxFrame: UInt32, length: UInt32) {
        var decoder = FrameDecoder(maxFrame: maxFrame)
        var buffer = InboundBuffer()
        buffer.append(bigEndian(length))  // no body: it is never waited for
        #expect(throws: WireError.frameTooLarge(declared: length)) { try decoder.next(from: &buffer) }
        #expect(WireError.frameTooLarge(declared: length).code == "frame_too_large")
        #expect(WireError.frameTooLarge(declared: length).closesConnection)
    }

    @Test("with maxFrame at UInt32.max, a length of UInt32.max and the largest channel length wait for more bytes; no trap")
    func largestLengthAllowed() throws {
        var decoder = FrameDecoder(maxFrame: .max)
        var buffer = InboundBuffer()
        buffer.append(header(length: .max, type: 3, chanlen: 0xFFFF, id: 1) + [1, 2, 3])
        #expect(try decoder.next(from: &buffer) == nil)
        #expect(buffer.readableBytes == 15)
    }

    @Test("a channel length past the frame's end is malformed_frame as soon as the 8 bytes are in, without the body",
          arguments: [(8, 1), (12, 5), (8, 0xFFFF), (0xFFFF + 7, 0xFFFF)] as [(UInt32, UInt16)])
    func channelPastTheEnd(length: UInt32, chanlen: UInt16) {
        var decoder = FrameDecoder(maxFrame: 1 << 20)
        var buffer = InboundBuffer()
        buffer.append(Array(header(length: length, type: 3, chanlen: chanlen, id: 9)[..<8]))
        #expect(throws: WireError.malformedFrame("channel length \(chanlen) exceeds frame length \(length)")) {
            try decoder.next(from: &buffer)
        }
    }

    @Test("a channel name that fills the frame exactly is a frame with an empty payload")
    func channelFillsTheFrame() throws {
        var decoder = FrameDecoder(maxFrame: 1 << 20)
        var buffer = InboundBuffer()
        buffer.append(header(length: 8 + 3, type: 3, chanlen: 3, id: 4) + Array("abc".utf8))
        #expect(try decoder.next(from: &buffer) == .frame(Frame(.message, id: 4, channel: "abc", payload: [])))
    }

    @Test("a frame that breaks a non-fatal rule is rejected with its id and the code wire-v1 names, and the next frame decodes",
          arguments: [
              (header(length: 8, type: 0, id: 3), "bad_frame"),  // unknown type
              (header(length: 8, type: 15, id: 3), "bad_frame"),  // the first type after POSITION and END (13, 14)
              (header(length: 8, type: 5, flags: 2, id: 3), "bad_frame"),  // a reserved flag bit
              (header(length: 9, type: 4, flags: 1, id: 3) + [0], "bad_frame"),  // NULL_PAYLOAD with a payload
              (header(length: 9, type: 4, chanlen: 1, id: 3) + [0x61], "bad_frame"),  // a channel on REPLY
              (header(length: 8, type: 3, id: 3), "bad_channel"),  // MESSAGE without a channel
              (header(length: 8, type: 9, id: 3), "bad_channel"),  // REGISTER without a channel
              (header(length: 10, type: 3, chanlen: 2, id: 3) + [0xC3, 0x28], "bad_channel"),  // not UTF-8
          ] as [([UInt8], String)])
    func rejected(bytes: [UInt8], code: String) throws {
        var decoder = FrameDecoder(maxFrame: 1 << 20)
        var buffer = InboundBuffer()
        let next = Frame(.pong, id: 5, payload: nil)
        buffer.append(bytes + next.bytes)
        guard case .rejected(let error, let id)? = try decoder.next(from: &buffer) else {
            Issue.record("not rejected")
            return
        }
        #expect(error.code == code && id == 3 && !error.closesConnection)
        #expect(try decoder.next(from: &buffer) == .frame(next))
    }

    @Test("the channel name kept from one frame to the next is never handed to a frame naming another")
    func channelNameCache() throws {
        let names = ["a/channel/of/some/length/1", "a/channel/of/some/length/1", "a/channel/of/some/length/2", "b", "a/channel/of/some/length/2"]
        let frames = names.enumerated().map { Frame(.message, id: UInt32($0.offset), channel: $0.element, payload: nil) }
        var decoder = FrameDecoder(maxFrame: 1 << 20)
        var buffer = InboundBuffer()
        buffer.append(frames.flatMap(\.bytes))
        #expect(try decodeAll(&decoder, &buffer) == frames.map { .frame($0) })
    }

    @Test("a view's payload is a slice of the buffer's own bytes, not a copy, and consuming it reaches the next frame")
    func viewDoesNotCopy() throws {
        var decoder = FrameDecoder(maxFrame: 1 << 20)
        var buffer = InboundBuffer()
        let first = Frame(.message, id: 1, channel: "ch", payload: Array(repeating: 7, count: 1000))
        buffer.append(first.bytes + Frame(.ping, id: 2, payload: nil).bytes)
        guard case .frame(let view, let length)? = try decoder.peek(buffer), let payload = view.payload else {
            Issue.record("no frame")
            return
        }
        let payloadStart = buffer.readerIndex + Frame.headerSize + 2
        let viewAddress = payload.withUnsafeBufferPointer { $0.baseAddress }
        let bufferAddress = buffer.storage.withUnsafeBufferPointer { $0.baseAddress.map { $0 + payloadStart } }
        #expect(viewAddress != nil && viewAddress == bufferAddress)
        #expect(view.frame == first && length == first.bytes.count)
        buffer.consume(length)
        guard case .frame(let second, _)? = try decoder.peek(buffer) else {
            Issue.record("no second frame")
            return
        }
        #expect(second.kind == .ping && second.id == 2 && second.payload == nil)
    }
}

/// Every frame `decoder` can take from `buffer` now.
func decodeAll(_ decoder: inout FrameDecoder, _ buffer: inout InboundBuffer) throws(WireError) -> [FrameDecoder.Decoded] {
    var out: [FrameDecoder.Decoded] = []
    while let decoded = try decoder.next(from: &buffer) { out.append(decoded) }
    return out
}

/// The 12 header bytes of wire-v1 section 2, with any values, right or wrong.
func header(length: UInt32, type: UInt8, flags: UInt8 = 0, chanlen: UInt16 = 0, id: UInt32) -> [UInt8] {
    bigEndian(length) + [type, flags, UInt8(chanlen >> 8), UInt8(chanlen & 0xFF)] + bigEndian(id)
}

/// A u32 in network byte order.
func bigEndian(_ value: UInt32) -> [UInt8] {
    var out: [UInt8] = []
    Frame.appendBigEndian(value, to: &out)
    return out
}
