/// Why a payload could not be decoded (or a value encoded), and where.
public struct CodecError: Error, Equatable, Sendable, CustomStringConvertible {
    /// Byte offset in the payload where decoding failed (0 for encoding errors).
    public var offset: Int
    /// What was wrong, in words.
    public var reason: String

    /// Makes an error at `offset`.
    public init(offset: Int, _ reason: String) {
        self.offset = offset
        self.reason = reason
    }

    public var description: String { "\(reason) at offset \(offset)" }
}

/// How deeply lists and maps may nest, in every codec and in text mode (wire-v1 section 4).
public let maxNestingDepth = 1000
