/// A value carried by Flutter's StandardMessageCodec: everything a platform channel can send.
///
/// Maps keep their entry order (and are stored as ordered entries, not a dictionary) and `int32`
/// stays distinct from `int64`, so decoding and re-encoding a message reproduces its bytes exactly.
/// Doubles compare by bit pattern, so a NaN equals itself and `0.0` differs from `-0.0`.
public enum ChannelValue: Sendable {
    case null
    case bool(Bool)
    case int32(Int32)
    case int64(Int64)
    case float64(Double)
    case string(String)
    case uint8List([UInt8])
    case int32List([Int32])
    case int64List([Int64])
    case float32List([Float])
    case float64List([Double])
    case list([ChannelValue])
    case map([MapEntry])
    /// A value of a user-defined type (type byte >= 128), see ``StandardCustomValue``.
    case custom(any StandardCustomValue)

    /// One key/value pair of a ``ChannelValue/map(_:)``.
    public struct MapEntry: Sendable, Equatable {
        public var key: ChannelValue
        public var value: ChannelValue
        /// Makes an entry.
        public init(_ key: ChannelValue, _ value: ChannelValue) {
            self.key = key
            self.value = value
        }
    }

    /// An integer as Flutter's encoders write it: `int32` when it fits, `int64` otherwise.
    public static func int(_ value: Int) -> ChannelValue {
        if let small = Int32(exactly: value) { return .int32(small) }
        return .int64(Int64(value))
    }

    /// A map built from string keys, in the given order.
    public static func stringMap(_ pairs: KeyValuePairs<String, ChannelValue>) -> ChannelValue {
        .map(pairs.map { MapEntry(.string($0.key), $0.value) })
    }
}

// MARK: - Accessors

extension ChannelValue {
    /// True for `.null`.
    public var isNull: Bool { if case .null = self { true } else { false } }

    /// The integer held by an `int32` or `int64`, else nil.
    public var intValue: Int? {
        switch self {
        case .int32(let v): Int(v)
        case .int64(let v): Int(exactly: v)
        default: nil
        }
    }

    /// The string held by a `.string`, else nil.
    public var stringValue: String? { if case .string(let s) = self { s } else { nil } }

    /// The elements of a `.list`, else nil.
    public var listValue: [ChannelValue]? { if case .list(let l) = self { l } else { nil } }

    /// Looks a key up in a `.map` (first matching entry); nil for a missing key or a non-map.
    public subscript(key: ChannelValue) -> ChannelValue? {
        guard case .map(let entries) = self else { return nil }
        return entries.first(where: { $0.key == key })?.value
    }

    /// Looks a string key up in a `.map`.
    public subscript(key: String) -> ChannelValue? { self[.string(key)] }
}

// MARK: - Equality

extension ChannelValue: Equatable {
    public static func == (lhs: ChannelValue, rhs: ChannelValue) -> Bool {
        switch (lhs, rhs) {
        case (.null, .null): true
        case (.bool(let a), .bool(let b)): a == b
        case (.int32(let a), .int32(let b)): a == b
        case (.int64(let a), .int64(let b)): a == b
        case (.float64(let a), .float64(let b)): a.bitPattern == b.bitPattern
        case (.string(let a), .string(let b)): a == b
        case (.uint8List(let a), .uint8List(let b)): a == b
        case (.int32List(let a), .int32List(let b)): a == b
        case (.int64List(let a), .int64List(let b)): a == b
        case (.float32List(let a), .float32List(let b)): a.map(\.bitPattern) == b.map(\.bitPattern)
        case (.float64List(let a), .float64List(let b)): a.map(\.bitPattern) == b.map(\.bitPattern)
        case (.list(let a), .list(let b)): a == b
        case (.map(let a), .map(let b)): a == b
        case (.custom(let a), .custom(let b)): a.isEqual(to: b)
        default: false
        }
    }
}

// MARK: - Literals

extension ChannelValue: ExpressibleByNilLiteral, ExpressibleByBooleanLiteral, ExpressibleByIntegerLiteral,
    ExpressibleByFloatLiteral, ExpressibleByStringLiteral, ExpressibleByArrayLiteral,
    ExpressibleByDictionaryLiteral
{
    public init(nilLiteral: ()) { self = .null }
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(integerLiteral value: Int) { self = .int(value) }
    public init(floatLiteral value: Double) { self = .float64(value) }
    public init(stringLiteral value: String) { self = .string(value) }
    public init(arrayLiteral elements: ChannelValue...) { self = .list(elements) }
    public init(dictionaryLiteral elements: (ChannelValue, ChannelValue)...) {
        self = .map(elements.map { MapEntry($0.0, $0.1) })
    }
}

extension ChannelValue: CustomStringConvertible {
    /// A compact JSON-like rendering, for logs and test failures.
    public var description: String {
        switch self {
        case .custom(let c): "custom(\(type(of: c).typeByte))"
        default: (try? JSONText.serialize(self, options: .textMode)).map { String(decoding: $0, as: UTF8.self) } ?? "?"
        }
    }
}
