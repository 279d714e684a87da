import COpenSSL

/// Digests from OpenSSL's libcrypto (the TLS library Switchboard builds on).
public enum Digest {
    /// The SHA-256 of `bytes`, as 64 lowercase hexadecimal digits.
    public static func sha256Hex(_ bytes: [UInt8]) -> String {
        let hex = Array("0123456789abcdef".utf8)
        return String(decoding: digest(bytes, EVP_sha256(), size: 32).flatMap { [hex[Int($0 >> 4)], hex[Int($0 & 15)]] },
                      as: UTF8.self)
    }

    /// Whether `given` equals `secret`, in a time that tells nothing of where they differ: their SHA-256
    /// digests are compared whole, without an early exit (for tokens; a length or a prefix that
    /// matches is not revealed either).
    public static func constantTimeEquals(_ given: String, _ secret: String) -> Bool {
        constantTimeEquals(digest(Array(given.utf8), EVP_sha256(), size: 32), digest(Array(secret.utf8), EVP_sha256(), size: 32))
    }

    /// Whether `given` equals `secret`, two byte strings of a length that is no secret (a session
    /// token's secret half), in a time that tells nothing of where they differ: no early exit.
    public static func constantTimeEquals(_ given: [UInt8], _ secret: [UInt8]) -> Bool {
        guard given.count == secret.count else { return false }
        var difference: UInt8 = 0
        for index in secret.indices { difference |= given[index] ^ secret[index] }
        return difference == 0
    }

    /// `Sec-WebSocket-Accept` for a `Sec-WebSocket-Key` (RFC 6455 section 4.2.2): the base64 of the
    /// SHA-1 of the key and the protocol's GUID.
    public static func webSocketAccept(key: String) -> String {
        base64(digest(Array((key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").utf8), EVP_sha1(), size: 20))
    }

    private static func digest(_ bytes: [UInt8], _ algorithm: OpaquePointer?, size: Int) -> [UInt8] {
        var digest = [UInt8](repeating: 0, count: size)
        var length: UInt32 = 0
        let ok = bytes.withUnsafeBytes { input in
            digest.withUnsafeMutableBufferPointer { output in
                EVP_Digest(input.baseAddress, input.count, output.baseAddress, &length, algorithm, nil)
            }
        }
        precondition(ok == 1 && Int(length) == size, "OpenSSL's digest failed")
        return digest
    }

    /// `bytes` in base64 (RFC 4648, with padding).
    static func base64(_ bytes: [UInt8]) -> String {
        var encoded = [UInt8](repeating: 0, count: 4 * ((bytes.count + 2) / 3) + 1)  // and a NUL
        let count = encoded.withUnsafeMutableBufferPointer { output in
            bytes.withUnsafeBufferPointer { EVP_EncodeBlock(output.baseAddress, $0.baseAddress, Int32($0.count)) }
        }
        return String(decoding: encoded.prefix(Int(count)), as: UTF8.self)
    }
}
