/// JSON text <-> ``ChannelValue``, without Foundation.
///
/// Parsing yields `.map` with string keys in document order, `.list`, `.string`, `.bool`, `.null`,
/// integers as `.int32` when they fit and `.int64` otherwise (all digits kept), and `.float64` for
/// numbers with a fraction or exponent (or integers beyond 64 bits).
public enum JSONText {
    /// How values that JSON has no form for are written.
    public struct Options: Sendable {
        /// Write NaN and the infinities as the strings "NaN", "Infinity", "-Infinity" instead of failing.
        public var nonFiniteAsStrings: Bool
        /// Write a non-string map key as a string holding the key's JSON text instead of failing. Only
        /// one level deep: a key whose own JSON would need a stringified key is an error, since each
        /// level escapes the one inside it again and the text would double per level.
        public var stringifyKeys: Bool

        /// Flutter's JSON codecs: such values are errors.
        public static let strict = Options(nonFiniteAsStrings: false, stringifyKeys: false)
        /// Switchboard's text mode (documented in protocol/text-mode.md).
        public static let textMode = Options(nonFiniteAsStrings: true, stringifyKeys: true)
    }

    /// Parses one JSON document; whitespace may surround it, anything else after it is an error.
    public static func parse(_ bytes: ArraySlice<UInt8>) throws(CodecError) -> ChannelValue {
        var parser = Parser(bytes: bytes)
        parser.skipWhitespace()
        let value = try parser.parseValue(depth: 0)
        parser.skipWhitespace()
        guard parser.index == bytes.endIndex else { throw parser.error("unexpected data after the JSON value") }
        return value
    }

    /// Parses one JSON document from a byte array.
    public static func parse(_ bytes: [UInt8]) throws(CodecError) -> ChannelValue { try parse(bytes[...]) }

    /// Writes `value` as compact JSON text (UTF-8).
    public static func serialize(_ value: ChannelValue, options: Options = .strict) throws(CodecError) -> [UInt8] {
        var out = [UInt8]()
        out.reserveCapacity(64)
        try write(value, to: &out, options: options)
        return out
    }

    /// Appends `value` as compact JSON text to `out`.
    public static func write(_ value: ChannelValue, to out: inout [UInt8], options: Options) throws(CodecError) {
        var writer = Writer(out: out, options: options)
        out = []
        defer { out = writer.out }
        try writer.write(value, depth: 0)
    }
}

// MARK: - Writing

extension JSONText {
    struct Writer {
        var out: [UInt8]
        let options: Options

        mutating func write(_ value: ChannelValue, depth: Int) throws(CodecError) {
            switch value {
            case .null: out.append(contentsOf: "null".utf8)
            case .bool(let b): out.append(contentsOf: (b ? "true" : "false").utf8)
            case .int32(let v): out.append(contentsOf: String(v).utf8)
            case .int64(let v): out.append(contentsOf: String(v).utf8)
            case .float64(let v): try writeDouble(v)
            case .string(let s): writeString(s)
            case .uint8List(let a): writeArray(a) { $0.out.append(contentsOf: String($1).utf8) }
            case .int32List(let a): writeArray(a) { $0.out.append(contentsOf: String($1).utf8) }
            case .int64List(let a): writeArray(a) { $0.out.append(contentsOf: String($1).utf8) }
            case .float32List(let a):
                out.append(UInt8(ascii: "["))
                for (i, v) in a.enumerated() {
                    if i > 0 { out.append(UInt8(ascii: ",")) }
                    if v.isFinite { out.append(contentsOf: v.description.utf8) } else { try writeDouble(Double(v)) }
                }
                out.append(UInt8(ascii: "]"))
            case .float64List(let a):
                out.append(UInt8(ascii: "["))
                for (i, v) in a.enumerated() {
                    if i > 0 { out.append(UInt8(ascii: ",")) }
                    try writeDouble(v)
                }
                out.append(UInt8(ascii: "]"))
            case .list(let elements):
                guard depth < maxNestingDepth else { throw CodecError(offset: 0, "nesting deeper than \(maxNestingDepth) levels") }
                out.append(UInt8(ascii: "["))
                for (i, element) in elements.enumerated() {
                    if i > 0 { out.append(UInt8(ascii: ",")) }
                    try write(element, depth: depth + 1)
                }
                out.append(UInt8(ascii: "]"))
            case .map(let entries):
                guard depth < maxNestingDepth else { throw CodecError(offset: 0, "nesting deeper than \(maxNestingDepth) levels") }
                out.append(UInt8(ascii: "{"))
                for (i, entry) in entries.enumerated() {
                    if i > 0 { out.append(UInt8(ascii: ",")) }
                    if case .string(let key) = entry.key {
                        writeString(key)
                    } else if options.stringifyKeys {
                        var keyOptions = options
                        keyOptions.stringifyKeys = false
                        var keyWriter = Writer(out: [], options: keyOptions)
                        try keyWriter.write(entry.key, depth: depth + 1)
                        writeString(String(decoding: keyWriter.out, as: UTF8.self))
                    } else {
                        throw CodecError(offset: 0, "JSON map keys must be strings")
                    }
                    out.append(UInt8(ascii: ":"))
                    try write(entry.value, depth: depth + 1)
                }
                out.append(UInt8(ascii: "}"))
            case .custom(let c):
                throw CodecError(offset: 0, "custom type \(type(of: c).typeByte) has no JSON form")
            }
        }

        mutating func writeArray<T>(_ elements: [T], _ element: (inout Writer, T) -> Void) {
            out.append(UInt8(ascii: "["))
            for (i, v) in elements.enumerated() {
                if i > 0 { out.append(UInt8(ascii: ",")) }
                element(&self, v)
            }
            out.append(UInt8(ascii: "]"))
        }

        mutating func writeDouble(_ v: Double) throws(CodecError) {
            if v.isFinite {
                out.append(contentsOf: v.description.utf8)
            } else if options.nonFiniteAsStrings {
                writeString(v.isNaN ? "NaN" : (v < 0 ? "-Infinity" : "Infinity"))
            } else {
                throw CodecError(offset: 0, "\(v) has no JSON form")
            }
        }

        mutating func writeString(_ s: String) {
            out.append(UInt8(ascii: "\""))
            for byte in s.utf8 {
                switch byte {
                case UInt8(ascii: "\""): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\"")])
                case UInt8(ascii: "\\"): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\\")])
                case UInt8(ascii: "\n"): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
                case UInt8(ascii: "\r"): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
                case UInt8(ascii: "\t"): out.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
                case 0..<0x20:
                    let hex = Array("0123456789abcdef".utf8)
                    out.append(contentsOf: "\\u00".utf8)
                    out.append(hex[Int(byte >> 4)])
                    out.append(hex[Int(byte & 0xF)])
                default: out.append(byte)
                }
            }
            out.append(UInt8(ascii: "\""))
        }
    }
}

// MARK: - Parsing

extension JSONText {
    struct Parser {
        let bytes: ArraySlice<UInt8>
        var index: Int

        init(bytes: ArraySlice<UInt8>) {
            self.bytes = bytes
            self.index = bytes.startIndex
        }

        func error(_ reason: String) -> CodecError { CodecError(offset: index - bytes.startIndex, reason) }

        var peek: UInt8? { index < bytes.endIndex ? bytes[index] : nil }

        mutating func skipWhitespace() {
            while let b = peek, b == 0x20 || b == 0x09 || b == 0x0A || b == 0x0D { index += 1 }
        }

        mutating func expect(_ literal: String, _ value: ChannelValue) throws(CodecError) -> ChannelValue {
            for byte in literal.utf8 {
                guard peek == byte else { throw error("invalid literal") }
                index += 1
            }
            return value
        }

        mutating func parseValue(depth: Int) throws(CodecError) -> ChannelValue {
            guard let b = peek else { throw error("unexpected end of JSON") }
            switch b {
            case UInt8(ascii: "{"):
                guard depth < maxNestingDepth else { throw error("nesting deeper than \(maxNestingDepth) levels") }
                index += 1
                var entries = [ChannelValue.MapEntry]()
                skipWhitespace()
                if peek == UInt8(ascii: "}") { index += 1; return .map(entries) }
                while true {
                    skipWhitespace()
                    guard peek == UInt8(ascii: "\"") else { throw error("expected a string key") }
                    let key = try parseString()
                    skipWhitespace()
                    guard peek == UInt8(ascii: ":") else { throw error("expected ':'") }
                    index += 1
                    skipWhitespace()
                    entries.append(.init(.string(key), try parseValue(depth: depth + 1)))
                    skipWhitespace()
                    switch peek {
                    case UInt8(ascii: ","): index += 1
                    case UInt8(ascii: "}"): index += 1; return .map(entries)
                    default: throw error("expected ',' or '}'")
                    }
                }
            case UInt8(ascii: "["):
                guard depth < maxNestingDepth else { throw error("nesting deeper than \(maxNestingDepth) levels") }
                index += 1
                var elements = [ChannelValue]()
                skipWhitespace()
                if peek == UInt8(ascii: "]") { index += 1; return .list(elements) }
                while true {
                    skipWhitespace()
                    elements.append(try parseValue(depth: depth + 1))
                    skipWhitespace()
                    switch peek {
                    case UInt8(ascii: ","): index += 1
                    case UInt8(ascii: "]"): index += 1; return .list(elements)
                    default: throw error("expected ',' or ']'")
                    }
                }
            case UInt8(ascii: "\""): return .string(try parseString())
            case UInt8(ascii: "t"): return try expect("true", .bool(true))
            case UInt8(ascii: "f"): return try expect("false", .bool(false))
            case UInt8(ascii: "n"): return try expect("null", .null)
            case UInt8(ascii: "-"), UInt8(ascii: "0")...UInt8(ascii: "9"): return try parseNumber()
            default: throw error("unexpected character")
            }
        }

        mutating func digits() -> Int {
            let start = index
            while let b = peek, b >= UInt8(ascii: "0"), b <= UInt8(ascii: "9") { index += 1 }
            return index - start
        }

        mutating func parseNumber() throws(CodecError) -> ChannelValue {
            let start = index
            let negative = peek == UInt8(ascii: "-")
            if negative { index += 1 }
            let intStart = index
            let intDigits = digits()
            guard intDigits > 0 else { throw error("invalid number") }
            if intDigits > 1, bytes[intStart] == UInt8(ascii: "0") { throw error("leading zero in number") }
            var isInteger = true
            if peek == UInt8(ascii: ".") {
                index += 1
                guard digits() > 0 else { throw error("invalid number") }
                isInteger = false
            }
            if peek == UInt8(ascii: "e") || peek == UInt8(ascii: "E") {
                index += 1
                if peek == UInt8(ascii: "+") || peek == UInt8(ascii: "-") { index += 1 }
                guard digits() > 0 else { throw error("invalid number") }
                isInteger = false
            }
            if isInteger {
                var value: Int64 = 0
                var overflow = false
                for i in intStart..<index {
                    let digit = Int64(bytes[i] - UInt8(ascii: "0"))
                    let (m, o1) = value.multipliedReportingOverflow(by: 10)
                    let (s, o2) = negative ? m.subtractingReportingOverflow(digit) : m.addingReportingOverflow(digit)
                    if o1 || o2 { overflow = true; break }
                    value = s
                }
                if !overflow { return Int32(exactly: value).map(ChannelValue.int32) ?? .int64(value) }
            }
            let text = String(decoding: bytes[start..<index], as: UTF8.self)
            guard let d = Double(text) else { throw error("invalid number") }
            return .float64(d)
        }

        mutating func parseHex4() throws(CodecError) -> UInt32 {
            var v: UInt32 = 0
            for _ in 0..<4 {
                guard let b = peek else { throw error("truncated \\u escape") }
                let digit: UInt8
                switch b {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = b - UInt8(ascii: "0")
                case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = b - UInt8(ascii: "a") + 10
                case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = b - UInt8(ascii: "A") + 10
                default: throw error("invalid \\u escape")
                }
                v = v << 4 | UInt32(digit)
                index += 1
            }
            return v
        }

        /// Parses a string starting at its opening quote. Raw bytes must be valid UTF-8.
        mutating func parseString() throws(CodecError) -> String {
            index += 1
            let start = index
            while let b = peek, b != UInt8(ascii: "\""), b != UInt8(ascii: "\\") {
                guard b >= 0x20 else { throw error("control character in string") }
                index += 1
            }
            guard let stop = peek else { throw error("unterminated string") }
            if stop == UInt8(ascii: "\"") {  // fast path: no escapes
                guard let s = decodeUTF8(bytes[start..<index]) else {
                    throw CodecError(offset: start - bytes.startIndex, "invalid UTF-8 in string")
                }
                index += 1
                return s
            }
            var buffer = Array(bytes[start..<index])
            while true {
                guard let b = peek else { throw error("unterminated string") }
                index += 1
                switch b {
                case UInt8(ascii: "\""):
                    guard let s = decodeUTF8(buffer[...]) else {
                        throw CodecError(offset: start - bytes.startIndex, "invalid UTF-8 in string")
                    }
                    return s
                case UInt8(ascii: "\\"):
                    guard let e = peek else { throw error("unterminated string") }
                    index += 1
                    switch e {
                    case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): buffer.append(e)
                    case UInt8(ascii: "b"): buffer.append(0x08)
                    case UInt8(ascii: "f"): buffer.append(0x0C)
                    case UInt8(ascii: "n"): buffer.append(0x0A)
                    case UInt8(ascii: "r"): buffer.append(0x0D)
                    case UInt8(ascii: "t"): buffer.append(0x09)
                    case UInt8(ascii: "u"):
                        var scalar = try parseHex4()
                        if (0xD800..<0xDC00).contains(scalar) {
                            guard peek == UInt8(ascii: "\\") else { throw error("lone surrogate in \\u escape") }
                            index += 1
                            guard peek == UInt8(ascii: "u") else { throw error("lone surrogate in \\u escape") }
                            index += 1
                            let low = try parseHex4()
                            guard (0xDC00..<0xE000).contains(low) else { throw error("invalid surrogate pair") }
                            scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                        }
                        guard let u = Unicode.Scalar(scalar) else { throw error("lone surrogate in \\u escape") }
                        buffer.append(contentsOf: String(Character(u)).utf8)
                    default: throw error("invalid escape")
                    }
                default:
                    guard b >= 0x20 else { throw error("control character in string") }
                    buffer.append(b)
                }
            }
        }
    }
}

// MARK: - JSON codecs

/// Flutter's `JSONMessageCodec`: a message is UTF-8 JSON text; a null message is a NULL_PAYLOAD.
public struct JSONMessageCodec: MessageCodec {
    /// Makes the codec.
    public init() {}

    public func encode(_ message: ChannelValue) throws(CodecError) -> [UInt8]? {
        if message.isNull { return nil }
        return try JSONText.serialize(message)
    }

    public func decode(_ payload: [UInt8]?) throws(CodecError) -> ChannelValue {
        guard let payload else { return .null }
        return try JSONText.parse(payload)
    }

    public func value(of message: ChannelValue) -> ChannelValue { message }
    public func message(from value: ChannelValue) throws(CodecError) -> ChannelValue { value }
}

/// Flutter's `JSONMethodCodec`: calls are `{"method":..,"args":..}`, envelopes `[result]` or
/// `[code, message, details]` (a 4th element carries a stack trace).
public struct JSONMethodCodec: MethodCodec {
    /// Makes the codec.
    public init() {}

    public func encodeMethodCall(_ call: MethodCall) throws(CodecError) -> [UInt8] {
        try JSONText.serialize(.stringMap(["method": .string(call.method), "args": call.arguments]))
    }

    public func decodeMethodCall(_ payload: [UInt8]?) throws(CodecError) -> MethodCall {
        guard let payload else { throw CodecError(offset: 0, "null payload where a method call was expected") }
        let value = try JSONText.parse(payload)
        // One `method` and at most one `args`: decoders differ on which of two keys wins, so a call that
        // names two methods could be judged by one and run as the other.
        guard case .map(let entries) = value, case .string(let method)? = value["method"],
              entries.count(where: { $0.key == "method" }) == 1, entries.count(where: { $0.key == "args" }) <= 1 else {
            throw CodecError(offset: 0, "invalid method call: \(value)")
        }
        return MethodCall(method: method, arguments: value["args"] ?? .null)
    }

    /// The method of `payload` as a call, or nil if it is none: one that does not open with `{` (after
    /// whitespace) is not parsed.
    public func methodName(in payload: ArraySlice<UInt8>?, reusing reuse: inout MethodCallReuse) -> String? {
        let isSpace = { (byte: UInt8) in byte == 0x20 || byte == 0x09 || byte == 0x0A || byte == 0x0D }
        guard let payload, payload.first(where: { !isSpace($0) }) == UInt8(ascii: "{") else { return nil }
        return try? decodeMethodCall(from: payload).method
    }

    public func encodeSuccessEnvelope(_ result: ChannelValue) throws(CodecError) -> [UInt8] {
        try JSONText.serialize(.list([result]))
    }

    public func encodeErrorEnvelope(_ error: ChannelError) throws(CodecError) -> [UInt8] {
        var fields: [ChannelValue] = [.string(error.code), error.message.map(ChannelValue.string) ?? .null, error.details]
        if let stacktrace = error.stacktrace { fields.append(.string(stacktrace)) }
        return try JSONText.serialize(.list(fields))
    }

    public func decodeEnvelope(_ payload: [UInt8]?) throws(CodecError) -> Result<ChannelValue, ChannelError> {
        guard let payload else { throw CodecError(offset: 0, "null payload where an envelope was expected") }
        guard case .list(let fields) = try JSONText.parse(payload) else {
            throw CodecError(offset: 0, "envelope is not a JSON array")
        }
        if fields.count == 1 { return .success(fields[0]) }
        guard fields.count == 3 || fields.count == 4, case .string(let code) = fields[0] else {
            throw CodecError(offset: 0, "invalid envelope")
        }
        func optionalString(_ v: ChannelValue) throws(CodecError) -> String? {
            switch v {
            case .null: return nil
            case .string(let s): return s
            default: throw CodecError(offset: 0, "invalid envelope")
            }
        }
        return .failure(ChannelError(
            code: code, message: try optionalString(fields[1]), details: fields[2],
            stacktrace: fields.count == 4 ? try optionalString(fields[3]) : nil))
    }
}
