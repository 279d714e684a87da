import SwitchboardCodec

/// Incremental binary-frame parser: feed it bytes as they arrive and take frames out.
///
/// Header fields are checked as soon as their bytes are in: an oversized length is refused after
/// 4 bytes without buffering the body, and an impossible length or channel length after 8.
public struct FrameDecoder: Sendable {
    /// The largest `length` accepted.
    public let maxFrame: UInt32
    /// The last channel name seen, reused while the next frame names the same channel: a connection
    /// mostly talks on one channel, and a name over 15 bytes costs an allocation and a UTF-8 check.
    private var lastChannel: (bytes: [UInt8], name: String) = ([], "")

    /// Makes a decoder.
    public init(maxFrame: UInt32) { self.maxFrame = maxFrame }

    /// The outcome of parsing one frame.
    public enum Decoded: Equatable, Sendable {
        /// A valid frame.
        case frame(Frame)
        /// A complete frame that breaks a non-fatal rule: answer ERROR with `id`, keep the connection.
        case rejected(WireError, id: UInt32)
    }

    /// A frame read in place: its payload is a slice of the buffer, valid until the frame is consumed.
    public struct View: Sendable {
        /// The frame's type.
        public let kind: Frame.Kind
        /// The request id.
        public let id: UInt32
        /// The channel name, empty for types that take none.
        public let channel: String
        /// The payload as a slice of the buffer; nil is NULL_PAYLOAD.
        public let payload: ArraySlice<UInt8>?

        /// The frame with a payload of its own.
        public var frame: Frame { Frame(kind, id: id, channel: channel, payload: payload.map(Array.init)) }
    }

    /// The outcome of parsing one frame in place, with the frame's length in the buffer.
    public enum Peeked: Sendable {
        /// A valid frame.
        case frame(View, length: Int)
        /// A complete frame that breaks a non-fatal rule: answer ERROR with `id`, keep the connection.
        case rejected(WireError, id: UInt32, length: Int)

        /// The bytes the frame takes in the buffer, to consume once it is handled.
        public var length: Int {
            switch self {
            case .frame(_, let length), .rejected(_, _, let length): length
            }
        }
    }

    /// Parses the next frame from `buffer`; nil means more bytes are needed.
    /// - Throws: `WireError.malformedFrame` or `.frameTooLarge`, after which the connection must close.
    public mutating func next(from buffer: inout InboundBuffer) throws(WireError) -> Decoded? {
        guard let peeked = try peek(buffer) else { return nil }
        defer { buffer.consume(peeked.length) }
        switch peeked {
        case .frame(let view, _): return .frame(view.frame)
        case .rejected(let error, let id, _): return .rejected(error, id: id)
        }
    }

    /// Parses the next frame without copying its payload or consuming it; nil means more bytes are
    /// needed. The caller consumes `length` bytes once it is done with the view (consuming while the
    /// payload slice is still held would copy the buffer).
    /// - Throws: `WireError.malformedFrame` or `.frameTooLarge`, after which the connection must close.
    public mutating func peek(_ buffer: InboundBuffer) throws(WireError) -> Peeked? {
        // Read through a span: bounds-checked like the array, without retaining its storage per access.
        let bytes = buffer.storage.span
        let start = buffer.readerIndex
        let available = bytes.count - start
        guard available >= 4 else { return nil }
        let length = Self.readU32(bytes, start)
        guard length <= maxFrame else { throw .frameTooLarge(declared: length) }
        guard length >= 8 else { throw .malformedFrame("length \(length) is less than 8") }
        guard available >= 8 else { return nil }
        let channelLength = Int(bytes[start + 6]) << 8 | Int(bytes[start + 7])
        guard channelLength <= Int(length) - 8 else {
            throw .malformedFrame("channel length \(channelLength) exceeds frame length \(length)")
        }
        let total = 4 + Int(length)
        guard available >= total else { return nil }
        return peekFrame(buffer, total: total, channelLength: channelLength)
    }

    private mutating func peekFrame(_ buffer: InboundBuffer, total: Int, channelLength: Int) -> Peeked {
        let bytes = buffer.storage.span
        let start = buffer.readerIndex
        let typeByte = bytes[start + 4]
        let flags = bytes[start + 5]
        let id = Self.readU32(bytes, start + 8)
        let channelStart = start + Frame.headerSize
        let payloadStart = channelStart + channelLength
        let payloadEnd = start + total
        func reject(_ error: WireError) -> Peeked { .rejected(error, id: id, length: total) }

        guard let kind = Frame.Kind(rawValue: typeByte) else {
            return reject(.badFrame("unknown frame type \(typeByte)"))
        }
        guard flags & ~Frame.nullPayloadFlag == 0 else {
            return reject(.badFrame("reserved flag bits set"))
        }
        let isNull = flags & Frame.nullPayloadFlag != 0
        if isNull, payloadEnd > payloadStart {
            return reject(.badFrame("NULL_PAYLOAD with a payload"))
        }
        switch kind.channelRule {
        case true?:
            if channelLength == 0 { return reject(.badChannel("this frame type needs a channel name")) }
        case false?:
            if channelLength > 0 { return reject(.badFrame("this frame type takes no channel name")) }
        case nil: break
        }
        var channel = ""
        if channelLength > 0 {
            if Self.equal(bytes, channelStart..<payloadStart, lastChannel.bytes.span) {
                channel = lastChannel.name
            } else {
                let raw = buffer.storage[channelStart..<payloadStart]
                guard let name = decodeUTF8(raw) else {
                    return reject(.badChannel("channel name is not valid UTF-8"))
                }
                channel = name
                lastChannel = (Array(raw), name)
            }
        }
        let payload = isNull ? nil : buffer.storage[payloadStart..<payloadEnd]
        return .frame(View(kind: kind, id: id, channel: channel, payload: payload), length: total)
    }

    /// Whether `bytes[range]` holds exactly `other`.
    private static func equal(_ bytes: Span<UInt8>, _ range: Range<Int>, _ other: Span<UInt8>) -> Bool {
        let part = bytes.extracting(range)
        guard part.count == other.count else { return false }
        var difference: UInt8 = 0  // no early exit: a branch-free loop the compiler can vectorise
        for i in part.indices { difference |= part[i] ^ other[i] }
        return difference == 0
    }

    private static func readU32(_ bytes: Span<UInt8>, _ offset: Int) -> UInt32 {
        UInt32(bytes[offset]) << 24 | UInt32(bytes[offset + 1]) << 16 | UInt32(bytes[offset + 2]) << 8
            | UInt32(bytes[offset + 3])
    }
}
