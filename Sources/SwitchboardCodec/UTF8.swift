/// Validates and decodes UTF-8, refusing (never repairing) invalid input.
///
/// ASCII, the common case for channel names, method names and keys, takes a specialized fast path:
/// the standard library's `String(validating:as:)` is generic and, unspecialized, costs two runtime
/// type-metadata lookups per call on a hot path.
public func decodeUTF8(_ bytes: ArraySlice<UInt8>) -> String? {
    var isASCII = true
    for byte in bytes where byte >= 0x80 {
        isASCII = false
        break
    }
    if isASCII { return String(decoding: bytes, as: UTF8.self) }
    return String(validating: bytes, as: UTF8.self)
}
