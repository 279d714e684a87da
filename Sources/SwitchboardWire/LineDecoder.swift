/// Splits text-mode input into lines (`\n`, with an optional `\r` before it).
///
/// A line longer than `maxLine` is reported once as `.tooLong` as soon as the limit is passed, and the
/// rest of it is discarded as it arrives, never buffered.
public struct LineDecoder: Sendable {
    /// The longest line accepted, in bytes, without its ending.
    public let maxLine: Int
    private var scanned = 0
    private var skipping = false

    /// Whether a line over the limit is being skipped: the client is in the middle of a line.
    public var isSkippingLine: Bool { skipping }

    /// Makes a decoder.
    public init(maxLine: Int) { self.maxLine = maxLine }

    /// One unit of text-mode input.
    public enum Decoded: Equatable, Sendable {
        /// A line without its ending (possibly blank).
        case line(ArraySlice<UInt8>)
        /// A line over the limit; its bytes are being skipped.
        case tooLong
    }

    /// The next line in `buffer`, or nil when more bytes are needed.
    public mutating func next(from buffer: inout InboundBuffer) -> Decoded? {
        while true {
            let bytes = buffer.readable
            let searchStart = bytes.startIndex + scanned
            guard let newline = bytes[searchStart...].firstIndex(of: UInt8(ascii: "\n")) else {
                if skipping {
                    buffer.consume(bytes.count)
                    scanned = 0
                    return nil
                }
                scanned = bytes.count
                if bytes.count > maxLine + 1 {  // +1: a '\r' may still precede the '\n'
                    skipping = true
                    buffer.consume(bytes.count)
                    scanned = 0
                    return .tooLong
                }
                return nil
            }
            let lineLength = newline - bytes.startIndex
            scanned = 0
            if skipping {
                skipping = false
                buffer.consume(lineLength + 1)
                continue
            }
            var end = newline
            if end > bytes.startIndex, bytes[end - 1] == UInt8(ascii: "\r") { end -= 1 }
            let line = bytes[bytes.startIndex..<end]
            buffer.consume(lineLength + 1)
            if line.count > maxLine { return .tooLong }
            return .line(line)
        }
    }
}
