import SwitchboardTransport

/// A session's token (protocol/resumption.md, "The token"): 32 bytes, as 43 characters of base64url
/// without padding. The first 16 name the session and are not secret: the server process's mark
/// (8 bytes), the loop (2) and the session's number on that loop (6). The last 16 are the secret,
/// from the operating system's CSPRNG. Never logged: logs name a session by its number.
struct SessionToken {
    /// The mark of the server process that made it (``LoopGroup/processMark``).
    let process: UInt64
    /// The loop that made it.
    let loop: UInt16
    /// Its number among the sessions of that loop (48 bits).
    let number: UInt64
    /// 128 bits from `SystemRandomNumberGenerator` (`getrandom` on Linux).
    let secret: [UInt8]

    static let byteCount = 32, secretCount = 16
    /// The longest token text a client may present that this server reads at all.
    static let maxTextLength = 256

    /// A new token, with a fresh secret, for session `number` of `loop`.
    init(process: UInt64, loop: UInt16, number: UInt64) {
        self.process = process
        self.loop = loop
        self.number = number & 0xFFFF_FFFF_FFFF
        var random = SystemRandomNumberGenerator()
        let high = random.next() as UInt64, low = random.next() as UInt64
        secret = Self.bigEndian(high, count: 8) + Self.bigEndian(low, count: 8)
    }

    /// The token a client presented; nil for text this server cannot read (any client input).
    init?(text: String) {
        guard text.utf8.count <= Self.maxTextLength, let bytes = Self.bytes(base64URL: text), bytes.count == Self.byteCount else {
            return nil
        }
        process = Self.readBigEndian(bytes[0..<8])
        loop = UInt16(truncatingIfNeeded: Self.readBigEndian(bytes[8..<10]))
        number = Self.readBigEndian(bytes[10..<16])
        secret = Array(bytes[16...])
    }

    /// Its 43 characters.
    var text: String {
        Self.base64URL(Self.bigEndian(process, count: 8) + Self.bigEndian(UInt64(loop), count: 2) + Self.bigEndian(number, count: 6) + secret)
    }

    /// Whether `other` is this token: the same name, and the same secret, compared in constant time.
    func matches(_ other: SessionToken) -> Bool {
        let sameSecret = Digest.constantTimeEquals(secret, other.secret)
        return sameSecret && process == other.process && loop == other.loop && number == other.number
    }

    // MARK: Bytes

    private static func bigEndian(_ value: UInt64, count: Int) -> [UInt8] {
        (0..<count).map { UInt8(truncatingIfNeeded: value >> (8 * UInt64(count - 1 - $0))) }
    }

    private static func readBigEndian(_ bytes: ArraySlice<UInt8>) -> UInt64 {
        bytes.reduce(0) { $0 << 8 | UInt64($1) }
    }

    // MARK: base64url (RFC 4648 section 5, no padding)

    static let base64URLAlphabet = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_".utf8)

    /// `bytes` in base64url without padding.
    static func base64URL(_ bytes: [UInt8]) -> String {
        var out: [UInt8] = []
        out.reserveCapacity((bytes.count * 4 + 2) / 3)
        var index = 0
        while index < bytes.count {
            let count = min(3, bytes.count - index)
            var group: UInt32 = 0
            for offset in 0..<3 { group = group << 8 | UInt32(offset < count ? bytes[index + offset] : 0) }
            for digit in 0...count { out.append(base64URLAlphabet[Int(group >> UInt32(18 - 6 * digit) & 63)]) }
            index += count
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// The bytes of base64url text without padding; nil if it is not that (a character outside the
    /// alphabet, a length no encoding has, or bits set past the last byte).
    static func bytes(base64URL text: String) -> [UInt8]? {
        let digits = Array(text.utf8)
        guard digits.count % 4 != 1 else { return nil }
        var out: [UInt8] = []
        out.reserveCapacity(digits.count * 3 / 4)
        var group: UInt32 = 0, bits = 0
        for digit in digits {
            guard let value = sextet(digit) else { return nil }
            group = group << 6 | UInt32(value)
            bits += 6
            if bits >= 8 {
                bits -= 8
                out.append(UInt8(truncatingIfNeeded: group >> UInt32(bits)))
                group &= (1 << UInt32(bits)) - 1
            }
        }
        return group == 0 ? out : nil
    }

    private static func sextet(_ digit: UInt8) -> UInt8? {
        switch digit {
        case UInt8(ascii: "A")...UInt8(ascii: "Z"): digit - UInt8(ascii: "A")
        case UInt8(ascii: "a")...UInt8(ascii: "z"): digit - UInt8(ascii: "a") + 26
        case UInt8(ascii: "0")...UInt8(ascii: "9"): digit - UInt8(ascii: "0") + 52
        case UInt8(ascii: "-"): 62
        case UInt8(ascii: "_"): 63
        default: nil
        }
    }
}
