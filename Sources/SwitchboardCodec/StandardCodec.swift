/// A user-defined type carried inside standard messages under its own type byte (128...255),
/// the Swift counterpart of extending Flutter's `StandardMessageCodec` with `writeValue`/`readValueOfType`.
///
/// ```swift
/// struct Point: StandardCustomValue {
///     static let typeByte: UInt8 = 128
///     var x, y: Double
///     func write(to writer: inout StandardWriter) throws(CodecError) {
///         try writer.writeValue(.float64(x)); try writer.writeValue(.float64(y))
///     }
///     static func read(from reader: inout StandardReader) throws(CodecError) -> Point {
///         Point(x: try reader.readDouble(), y: try reader.readDouble())
///     }
/// }
/// let codec = StandardMessageCodec(customTypes: [Point.self])
/// ```
public protocol StandardCustomValue: Sendable, Equatable {
    /// The type byte written before the value; must be 128 or more.
    static var typeByte: UInt8 { get }
    /// Writes the value's body (the type byte is already written).
    func write(to writer: inout StandardWriter) throws(CodecError)
    /// Reads the value's body (the type byte is already read).
    static func read(from reader: inout StandardReader) throws(CodecError) -> Self
}

extension StandardCustomValue {
    /// Equality across existentials: same type and equal values.
    public func isEqual(to other: any StandardCustomValue) -> Bool {
        guard let other = other as? Self else { return false }
        return self == other
    }
}

/// Type bytes of the standard codec (Flutter's `StandardMessageCodec` constants).
enum StandardType {
    static let null: UInt8 = 0, `true`: UInt8 = 1, `false`: UInt8 = 2, int32: UInt8 = 3, int64: UInt8 = 4
    static let largeInt: UInt8 = 5, float64: UInt8 = 6, string: UInt8 = 7, uint8List: UInt8 = 8
    static let int32List: UInt8 = 9, int64List: UInt8 = 10, float64List: UInt8 = 11, list: UInt8 = 12
    static let map: UInt8 = 13, float32List: UInt8 = 14
}

/// Appends standard-codec bytes to a buffer; what custom types use to write their fields.
public struct StandardWriter {
    /// The bytes written so far. Alignment is counted from `origin`, the first byte of this payload.
    public fileprivate(set) var bytes: [UInt8]
    private let origin: Int
    private var depth = 0

    /// Starts an empty buffer.
    public init(capacity: Int = 64) {
        bytes = []
        bytes.reserveCapacity(capacity)
        origin = 0
    }

    /// Continues `buffer` (taking it over; give it back with ``finish(into:)``): the payload written
    /// starts at its current end, which is where alignment is counted from.
    public init(appendingTo buffer: inout [UInt8]) {
        bytes = []
        swap(&bytes, &buffer)
        origin = bytes.count
    }

    /// Hands the bytes back to the buffer given to ``init(appendingTo:)``.
    public mutating func finish(into buffer: inout [UInt8]) {
        swap(&bytes, &buffer)
    }

    /// Appends one raw byte.
    public mutating func writeByte(_ byte: UInt8) { bytes.append(byte) }

    /// Appends raw bytes.
    public mutating func writeBytes(_ raw: some Collection<UInt8>) { bytes.append(contentsOf: raw) }

    /// Writes a size: one byte below 254, else 254 + u16 or 255 + u32 (little-endian).
    public mutating func writeSize(_ size: Int) throws(CodecError) {
        if size < 254 {
            bytes.append(UInt8(size))
        } else if size <= 0xFFFF {
            bytes.append(254)
            writeLittleEndian(UInt64(size), byteCount: 2)
        } else if size <= 0xFFFF_FFFF {
            bytes.append(255)
            writeLittleEndian(UInt64(size), byteCount: 4)
        } else {
            throw CodecError(offset: 0, "size \(size) does not fit in 32 bits")
        }
    }

    /// Pads with zero bytes until the length is a multiple of `alignment`.
    public mutating func writeAlignment(_ alignment: Int) {
        let remainder = (bytes.count - origin) % alignment
        if remainder != 0 { bytes.append(contentsOf: repeatElement(0, count: alignment - remainder)) }
    }

    /// Writes an integer's low `byteCount` bytes, little-endian.
    mutating func writeLittleEndian(_ value: UInt64, byteCount: Int) {
        var v = value
        for _ in 0..<byteCount {
            bytes.append(UInt8(truncatingIfNeeded: v))
            v >>= 8
        }
    }

    /// Writes a complete value: its type byte and body.
    public mutating func writeValue(_ value: ChannelValue) throws(CodecError) {
        switch value {
        case .null: bytes.append(StandardType.null)
        case .bool(let b): bytes.append(b ? StandardType.true : StandardType.false)
        case .int32(let v):
            bytes.append(StandardType.int32)
            writeLittleEndian(UInt64(UInt32(bitPattern: v)), byteCount: 4)
        case .int64(let v):
            bytes.append(StandardType.int64)
            writeLittleEndian(UInt64(bitPattern: v), byteCount: 8)
        case .float64(let v):
            bytes.append(StandardType.float64)
            writeAlignment(8)
            writeLittleEndian(v.bitPattern, byteCount: 8)
        case .string(let s):
            bytes.append(StandardType.string)
            try writeSize(s.utf8.count)
            bytes.append(contentsOf: s.utf8)
        case .uint8List(let data):
            bytes.append(StandardType.uint8List)
            try writeSize(data.count)
            bytes.append(contentsOf: data)
        case .int32List(let data):
            bytes.append(StandardType.int32List)
            try writeSize(data.count)
            writeAlignment(4)
            for v in data { writeLittleEndian(UInt64(UInt32(bitPattern: v)), byteCount: 4) }
        case .int64List(let data):
            bytes.append(StandardType.int64List)
            try writeSize(data.count)
            writeAlignment(8)
            for v in data { writeLittleEndian(UInt64(bitPattern: v), byteCount: 8) }
        case .float32List(let data):
            bytes.append(StandardType.float32List)
            try writeSize(data.count)
            writeAlignment(4)
            for v in data { writeLittleEndian(UInt64(v.bitPattern), byteCount: 4) }
        case .float64List(let data):
            bytes.append(StandardType.float64List)
            try writeSize(data.count)
            writeAlignment(8)
            for v in data { writeLittleEndian(v.bitPattern, byteCount: 8) }
        case .list(let elements):
            try enterNesting()
            bytes.append(StandardType.list)
            try writeSize(elements.count)
            for element in elements { try writeValue(element) }
            depth -= 1
        case .map(let entries):
            try enterNesting()
            bytes.append(StandardType.map)
            try writeSize(entries.count)
            for entry in entries {
                try writeValue(entry.key)
                try writeValue(entry.value)
            }
            depth -= 1
        case .custom(let custom):
            bytes.append(type(of: custom).typeByte)
            try custom.write(to: &self)
        }
    }

    private mutating func enterNesting() throws(CodecError) {
        depth += 1
        if depth > maxNestingDepth {
            throw CodecError(offset: bytes.count, "nesting deeper than \(maxNestingDepth) levels")
        }
    }
}

/// Reads standard-codec bytes with bounds checks before every read and allocation;
/// what custom types use to read their fields.
public struct StandardReader {
    private let bytes: ArraySlice<UInt8>
    private var index: Int
    private var depth = 0
    private let customTypes: [any StandardCustomValue.Type]

    init(_ bytes: ArraySlice<UInt8>, customTypes: [any StandardCustomValue.Type]) {
        self.bytes = bytes
        self.index = bytes.startIndex
        self.customTypes = customTypes
    }

    /// Offset of the next byte from the start of the payload.
    public var offset: Int { index - bytes.startIndex }
    /// Bytes not read yet.
    public var remaining: Int { bytes.endIndex - index }

    func error(_ reason: String) -> CodecError { CodecError(offset: offset, reason) }

    /// Reads one raw byte.
    public mutating func readByte() throws(CodecError) -> UInt8 {
        guard index < bytes.endIndex else { throw error("unexpected end of payload") }
        defer { index += 1 }
        return bytes[index]
    }

    /// Reads `count` raw bytes.
    public mutating func readBytes(_ count: Int) throws(CodecError) -> ArraySlice<UInt8> {
        guard count >= 0, count <= remaining else { throw error("needs \(count) bytes, \(remaining) remain") }
        defer { index += count }
        return bytes[index..<index + count]
    }

    /// Reads a little-endian integer of `byteCount` bytes.
    mutating func readLittleEndian(_ byteCount: Int) throws(CodecError) -> UInt64 {
        guard byteCount <= remaining else { throw error("needs \(byteCount) bytes, \(remaining) remain") }
        var v: UInt64 = 0
        for i in 0..<byteCount { v |= UInt64(bytes[index + i]) << (8 * i) }
        index += byteCount
        return v
    }

    /// Reads a size (1, 3 or 5 bytes).
    public mutating func readSize() throws(CodecError) -> Int {
        let first = try readByte()
        switch first {
        case ..<254: return Int(first)
        case 254: return Int(try readLittleEndian(2))
        default: return Int(try readLittleEndian(4))
        }
    }

    /// Skips padding up to a multiple of `alignment` from the start of the payload.
    public mutating func readAlignment(_ alignment: Int) throws(CodecError) {
        let remainder = offset % alignment
        if remainder != 0 { _ = try readBytes(alignment - remainder) }
    }

    /// Reads a float64 value written with ``StandardWriter/writeValue(_:)`` (type byte included).
    public mutating func readDouble() throws(CodecError) -> Double {
        guard case .float64(let d) = try readValue() else { throw error("expected a float64") }
        return d
    }

    /// Reads a count of elements of `width` bytes each, refusing counts the payload cannot hold.
    private mutating func readCount(width: Int) throws(CodecError) -> Int {
        let count = try readSize()
        guard count <= remaining / width else {
            throw error("declared \(count) elements of \(width) bytes, only \(remaining) bytes remain")
        }
        return count
    }

    private mutating func readUTF8(_ count: Int) throws(CodecError) -> String {
        let start = offset
        let raw = try readBytes(count)
        guard let s = decodeUTF8(raw) else {
            throw CodecError(offset: start, "invalid UTF-8 in string")
        }
        return s
    }

    /// Reads a complete value: its type byte and body.
    public mutating func readValue() throws(CodecError) -> ChannelValue {
        let type = try readByte()
        switch type {
        case StandardType.null: return .null
        case StandardType.true: return .bool(true)
        case StandardType.false: return .bool(false)
        case StandardType.int32: return .int32(Int32(truncatingIfNeeded: try readLittleEndian(4)))
        case StandardType.int64: return .int64(Int64(bitPattern: try readLittleEndian(8)))
        case StandardType.largeInt: return .string(try readUTF8(try readCount(width: 1)))
        case StandardType.float64:
            try readAlignment(8)
            return .float64(Double(bitPattern: try readLittleEndian(8)))
        case StandardType.string: return .string(try readUTF8(try readCount(width: 1)))
        case StandardType.uint8List: return .uint8List(Array(try readBytes(try readCount(width: 1))))
        case StandardType.int32List:
            let count = try readSize()
            try readAlignment(4)
            guard count <= remaining / 4 else { throw error("Int32List of \(count) exceeds payload") }
            var out = [Int32]()
            out.reserveCapacity(count)
            for _ in 0..<count { out.append(Int32(truncatingIfNeeded: try readLittleEndian(4))) }
            return .int32List(out)
        case StandardType.int64List:
            let count = try readSize()
            try readAlignment(8)
            guard count <= remaining / 8 else { throw error("Int64List of \(count) exceeds payload") }
            var out = [Int64]()
            out.reserveCapacity(count)
            for _ in 0..<count { out.append(Int64(bitPattern: try readLittleEndian(8))) }
            return .int64List(out)
        case StandardType.float32List:
            let count = try readSize()
            try readAlignment(4)
            guard count <= remaining / 4 else { throw error("Float32List of \(count) exceeds payload") }
            var out = [Float]()
            out.reserveCapacity(count)
            for _ in 0..<count { out.append(Float(bitPattern: UInt32(try readLittleEndian(4)))) }
            return .float32List(out)
        case StandardType.float64List:
            let count = try readSize()
            try readAlignment(8)
            guard count <= remaining / 8 else { throw error("Float64List of \(count) exceeds payload") }
            var out = [Double]()
            out.reserveCapacity(count)
            for _ in 0..<count { out.append(Double(bitPattern: try readLittleEndian(8))) }
            return .float64List(out)
        case StandardType.list:
            let count = try readCount(width: 1)
            try enterNesting()
            var out = [ChannelValue]()
            out.reserveCapacity(count)
            for _ in 0..<count { out.append(try readValue()) }
            depth -= 1
            return .list(out)
        case StandardType.map:
            let count = try readCount(width: 2)
            try enterNesting()
            var out = [ChannelValue.MapEntry]()
            out.reserveCapacity(count)
            for _ in 0..<count {
                let key = try readValue()
                out.append(.init(key, try readValue()))
            }
            depth -= 1
            return .map(out)
        default:
            guard let custom = customTypes.first(where: { $0.typeByte == type }) else {
                throw CodecError(offset: offset - 1, "unknown type byte \(type)")
            }
            return .custom(try custom.read(from: &self))
        }
    }

    private mutating func enterNesting() throws(CodecError) {
        depth += 1
        if depth > maxNestingDepth { throw error("nesting deeper than \(maxNestingDepth) levels") }
    }

    /// Throws unless every byte has been read.
    mutating func expectEnd(_ what: String) throws(CodecError) {
        if remaining != 0 { throw error("\(remaining) bytes left over after the \(what)") }
    }
}
