#if canImport(Glibc)
import Glibc
#endif

/// The value of an environment variable, if set and not empty.
func environment(_ name: String) -> String? {
    guard let raw = getenv(name) else { return nil }
    let value = String(cString: raw)
    return value.isEmpty ? nil : value
}

/// Writes `text` to standard error, unbuffered.
func printError(_ text: String) {
    _ = writeAll(text, to: 2)
}

/// Writes all of `text` to `descriptor`, unbuffered (no stdio buffer holds it back from a pipe); false
/// if it could not.
@discardableResult
func writeAll(_ text: String, to descriptor: Int32) -> Bool {
    let bytes = Array(text.utf8)
    var offset = 0
    while offset < bytes.count {
        let n = bytes[offset...].withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        if n < 0, errno == EINTR { continue }
        guard n > 0 else { return false }
        offset += n
    }
    return true
}
