import COpenSSL

/// Digests from OpenSSL's libcrypto (the TLS library Switchboard builds on).
public enum Digest {
    /// The SHA-256 of `bytes`, as 64 lowercase hexadecimal digits.
    public static func sha256Hex(_ bytes: [UInt8]) -> String {
        var digest = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let ok = bytes.withUnsafeBytes { input in
            digest.withUnsafeMutableBufferPointer { output in
                EVP_Digest(input.baseAddress, input.count, output.baseAddress, &length, EVP_sha256(), nil)
            }
        }
        precondition(ok == 1 && length == 32, "OpenSSL's SHA-256 failed")
        let hex = Array("0123456789abcdef".utf8)
        return String(decoding: digest.flatMap { [hex[Int($0 >> 4)], hex[Int($0 & 15)]] }, as: UTF8.self)
    }
}
