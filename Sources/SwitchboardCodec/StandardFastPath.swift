/// The shapes almost every method call has, read straight from the bytes through a span: a method
/// name, then one argument that is null, a bool, an int32, an int64, a float64, a string or a Uint8List.
/// No reader, no intermediate values: the general ``StandardReader`` costs several times as much for
/// these. Anything else (and anything malformed) returns nil, and the general reader decides, with its
/// exact errors, so both paths accept exactly the same bytes.
enum StandardFastPath {
    /// The call in `payload`; nil if it is none of these shapes (or there is no payload). Takes the
    /// optional itself: unwrapped by the caller, the slice was copied (a retain and a release per call).
    static func decodeMethodCall(_ payload: ArraySlice<UInt8>?, reusing reuse: inout MethodCallReuse) -> MethodCall? {
        guard let bytes = payload?.span else { return nil }
        var index = 0
        guard let method = readMethod(bytes, &index, reusing: &reuse) else { return nil }
        let type = bytes[index]
        index += 1
        let arguments: ChannelValue
        switch type {
        case StandardType.null: arguments = .null
        case StandardType.true: arguments = .bool(true)
        case StandardType.false: arguments = .bool(false)
        case StandardType.int32:
            guard bytes.count - index == 4 else { return nil }
            arguments = .int32(Int32(truncatingIfNeeded: readLittleEndian(bytes, index, 4)))
            index += 4
        case StandardType.int64:
            guard bytes.count - index == 8 else { return nil }
            arguments = .int64(Int64(bitPattern: readLittleEndian(bytes, index, 8)))
            index += 8
        case StandardType.float64:
            index += (8 - index % 8) % 8  // aligned from the payload's first byte
            guard bytes.count - index == 8 else { return nil }
            arguments = .float64(Double(bitPattern: readLittleEndian(bytes, index, 8)))
            index += 8
        case StandardType.string, StandardType.uint8List:
            guard let count = readSize(bytes, &index), count == bytes.count - index else { return nil }
            if type == StandardType.uint8List {
                arguments = .uint8List(copy(bytes.extracting(index..<index + count), reusing: &reuse.bytes))
            } else {
                guard let string = decodeUTF8(bytes, index..<index + count) else { return nil }
                arguments = .string(string)
            }
            index += count
        default: return nil
        }
        guard index == bytes.count else { return nil }
        return MethodCall(method: method, arguments: arguments)
    }

    /// The method name that starts a call (followed by at least one more byte), without reading on.
    static func methodName(_ payload: ArraySlice<UInt8>, reusing reuse: inout MethodCallReuse) -> String? {
        var index = 0
        return readMethod(payload.span, &index, reusing: &reuse)
    }

    /// Reads the method name at the start of `bytes`, reusing the last one when the bytes match; leaves
    /// `index` just past it.
    @inline(__always)
    private static func readMethod(_ bytes: Span<UInt8>, _ index: inout Int, reusing reuse: inout MethodCallReuse) -> String? {
        guard bytes.count >= 2, bytes[0] == StandardType.string else { return nil }
        index = 1
        guard let nameLength = readSize(bytes, &index), nameLength <= bytes.count - index - 1 else { return nil }
        let nameBytes = index..<index + nameLength
        let method: String
        if equal(bytes, nameBytes, reuse.method.utf8.span) {
            method = reuse.method
        } else {
            guard let name = decodeUTF8(bytes, nameBytes) else { return nil }
            method = name
            if nameLength <= MethodCallReuse.longestMethodKept { reuse.method = name }
        }
        index += nameLength
        return method
    }

    /// `bytes` in the storage of `spare` when nothing else holds it (no allocation), else in new storage.
    private static func copy(_ bytes: Span<UInt8>, reusing spare: inout [UInt8]) -> [UInt8] {
        guard bytes.count <= MethodCallReuse.largestKept else {
            var own: [UInt8] = []
            own.append(copying: bytes)
            return own
        }
        // Storage much larger than this argument is let go: while handlers keep their arguments, each
        // would otherwise get (and keep) a copy of that size.
        spare.removeAll(keepingCapacity: spare.capacity <= 2 * bytes.count + 256)
        spare.append(copying: bytes)
        return spare
    }

    /// Whether `bytes[range]` holds exactly `other`.
    private static func equal(_ bytes: Span<UInt8>, _ range: Range<Int>, _ other: Span<UInt8>) -> Bool {
        let part = bytes.extracting(range)
        guard part.count == other.count else { return false }
        var difference: UInt8 = 0
        for i in part.indices { difference |= part[i] ^ other[i] }
        return difference == 0
    }

    /// A size (1, 3 or 5 bytes); nil if the bytes end first.
    @inline(__always)
    private static func readSize(_ bytes: Span<UInt8>, _ index: inout Int) -> Int? {
        guard index < bytes.count else { return nil }
        let first = bytes[index]
        if first < 254 {
            index += 1
            return Int(first)
        }
        let width = first == 254 ? 2 : 4
        guard bytes.count - index - 1 >= width else { return nil }
        defer { index += 1 + width }
        return Int(readLittleEndian(bytes, index + 1, width))
    }

    private static func readLittleEndian(_ bytes: Span<UInt8>, _ index: Int, _ width: Int) -> UInt64 {
        var value: UInt64 = 0
        for i in 0..<width { value |= UInt64(bytes[index + i]) << (8 * i) }
        return value
    }

    /// The string in `bytes[range]`, validated as UTF-8.
    private static func decodeUTF8(_ bytes: Span<UInt8>, _ range: Range<Int>) -> String? {
        guard let text = try? UTF8Span(validating: bytes.extracting(range)) else { return nil }
        return String(copying: text)
    }
}
