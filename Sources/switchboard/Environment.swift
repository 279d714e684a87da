#if canImport(Glibc)
import Glibc
#endif

/// The value of an environment variable, if set and not empty.
func environment(_ name: String) -> String? {
    guard let raw = getenv(name) else { return nil }
    let value = String(cString: raw)
    return value.isEmpty ? nil : value
}
