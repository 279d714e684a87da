/// Encodes any `Encodable` into a ``ChannelValue``: structs become string-keyed maps in declaration order,
/// arrays become lists (`[UInt8]` becomes a Uint8List), integers follow Flutter (int32 when they fit).
public struct ChannelValueEncoder {
    /// Makes an encoder.
    public init() {}

    /// Encodes `value`.
    public func encode(_ value: some Encodable) throws -> ChannelValue {
        if let bytes = value as? [UInt8] { return .uint8List(bytes) }
        if let direct = value as? ChannelValue { return direct }
        let node = EncodingNode()
        try value.encode(to: NodeEncoder(node: node, codingPath: []))
        return node.value
    }
}

/// Decodes any `Decodable` from a ``ChannelValue``; the inverse of ``ChannelValueEncoder``.
public struct ChannelValueDecoder {
    /// Makes a decoder.
    public init() {}

    /// Decodes a `T` from `value`.
    public func decode<T: Decodable>(_ type: T.Type, from value: ChannelValue) throws -> T {
        try ValueDecoder(value: value, codingPath: []).decode(T.self)
    }
}

// MARK: - Encoding

/// A value under construction; containers keep references so nested containers can fill in later.
private final class EncodingNode {
    enum Content { case value(ChannelValue), list([EncodingNode]), map([(String, EncodingNode)]) }
    var content: Content = .value(.null)

    var value: ChannelValue {
        switch content {
        case .value(let v): v
        case .list(let nodes): .list(nodes.map(\.value))
        case .map(let pairs): .map(pairs.map { .init(.string($0.0), $0.1.value) })
        }
    }

    func appendToList() -> EncodingNode {
        let child = EncodingNode()
        if case .list(var nodes) = content { nodes.append(child); content = .list(nodes) } else { content = .list([child]) }
        return child
    }

    func child(forKey key: String) -> EncodingNode {
        var pairs: [(String, EncodingNode)] = []
        if case .map(let existing) = content { pairs = existing }
        if let found = pairs.first(where: { $0.0 == key }) { return found.1 }
        let child = EncodingNode()
        pairs.append((key, child))
        content = .map(pairs)
        return child
    }
}

private func encodedInteger<T: BinaryInteger>(_ v: T, _ path: [any CodingKey]) throws -> ChannelValue {
    if let small = Int32(exactly: v) { return .int32(small) }
    if let big = Int64(exactly: v) { return .int64(big) }
    throw EncodingError.invalidValue(v, .init(codingPath: path, debugDescription: "integer does not fit in 64 bits"))
}

private func encodeLeaf<T: Encodable>(_ value: T, into node: EncodingNode, path: [any CodingKey]) throws {
    switch value {
    case let v as Bool: node.content = .value(.bool(v))
    case let v as String: node.content = .value(.string(v))
    case let v as Double: node.content = .value(.float64(v))
    case let v as Float: node.content = .value(.float64(Double(v)))
    case let v as Int: node.content = .value(try encodedInteger(v, path))
    case let v as Int8: node.content = .value(try encodedInteger(v, path))
    case let v as Int16: node.content = .value(try encodedInteger(v, path))
    case let v as Int32: node.content = .value(.int32(v))
    case let v as Int64: node.content = .value(.int64(v))
    case let v as UInt: node.content = .value(try encodedInteger(v, path))
    case let v as UInt8: node.content = .value(try encodedInteger(v, path))
    case let v as UInt16: node.content = .value(try encodedInteger(v, path))
    case let v as UInt32: node.content = .value(try encodedInteger(v, path))
    case let v as UInt64: node.content = .value(try encodedInteger(v, path))
    case let v as [UInt8]: node.content = .value(.uint8List(v))
    case let v as ChannelValue: node.content = .value(v)
    default: try value.encode(to: NodeEncoder(node: node, codingPath: path))
    }
}

private struct NodeEncoder: Encoder {
    let node: EncodingNode
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        if case .map = node.content {} else { node.content = .map([]) }
        return KeyedEncodingContainer(KeyedContainer(node: node, codingPath: codingPath))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        if case .list = node.content {} else { node.content = .list([]) }
        return UnkeyedContainer(node: node, codingPath: codingPath)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer { SingleContainer(node: node, codingPath: codingPath) }

    struct KeyedContainer<Key: CodingKey>: KeyedEncodingContainerProtocol {
        let node: EncodingNode
        let codingPath: [any CodingKey]

        mutating func encodeNil(forKey key: Key) throws { node.child(forKey: key.stringValue).content = .value(.null) }
        mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
            try encodeLeaf(value, into: node.child(forKey: key.stringValue), path: codingPath + [key])
        }
        mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key)
            -> KeyedEncodingContainer<NestedKey>
        {
            NodeEncoder(node: node.child(forKey: key.stringValue), codingPath: codingPath + [key]).container(keyedBy: keyType)
        }
        mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
            NodeEncoder(node: node.child(forKey: key.stringValue), codingPath: codingPath + [key]).unkeyedContainer()
        }
        mutating func superEncoder() -> any Encoder { NodeEncoder(node: node.child(forKey: "super"), codingPath: codingPath) }
        mutating func superEncoder(forKey key: Key) -> any Encoder {
            NodeEncoder(node: node.child(forKey: key.stringValue), codingPath: codingPath + [key])
        }
    }

    struct UnkeyedContainer: UnkeyedEncodingContainer {
        let node: EncodingNode
        let codingPath: [any CodingKey]
        var count: Int { if case .list(let n) = node.content { n.count } else { 0 } }

        mutating func encodeNil() throws { node.appendToList().content = .value(.null) }
        mutating func encode<T: Encodable>(_ value: T) throws {
            try encodeLeaf(value, into: node.appendToList(), path: codingPath)
        }
        mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
            NodeEncoder(node: node.appendToList(), codingPath: codingPath).container(keyedBy: keyType)
        }
        mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
            NodeEncoder(node: node.appendToList(), codingPath: codingPath).unkeyedContainer()
        }
        mutating func superEncoder() -> any Encoder { NodeEncoder(node: node.appendToList(), codingPath: codingPath) }
    }

    struct SingleContainer: SingleValueEncodingContainer {
        let node: EncodingNode
        let codingPath: [any CodingKey]
        mutating func encodeNil() throws { node.content = .value(.null) }
        mutating func encode<T: Encodable>(_ value: T) throws { try encodeLeaf(value, into: node, path: codingPath) }
    }
}

// MARK: - Decoding

private struct IndexKey: CodingKey {
    var stringValue: String { String(intValue!) }
    var intValue: Int?
    init(_ index: Int) { intValue = index }
    init?(stringValue: String) { return nil }
    init?(intValue: Int) { self.intValue = intValue }
}

private struct ValueDecoder: Decoder {
    let value: ChannelValue
    let codingPath: [any CodingKey]
    var userInfo: [CodingUserInfoKey: Any] { [:] }

    func mismatch(_ expected: String) -> DecodingError {
        .typeMismatch(Any.self, .init(codingPath: codingPath, debugDescription: "expected \(expected), found \(value)"))
    }

    func integer<T: FixedWidthInteger>(_ type: T.Type) throws -> T {
        switch value {
        case .int32(let v): if let r = T(exactly: v) { return r }
        case .int64(let v): if let r = T(exactly: v) { return r }
        default: throw mismatch("an integer")
        }
        throw DecodingError.dataCorrupted(.init(codingPath: codingPath, debugDescription: "\(value) does not fit in \(T.self)"))
    }

    func decode<T: Decodable>(_ type: T.Type) throws -> T {
        switch type {
        case is Bool.Type: guard case .bool(let b) = value else { throw mismatch("a bool") }; return b as! T
        case is String.Type: guard case .string(let s) = value else { throw mismatch("a string") }; return s as! T
        case is Double.Type, is Float.Type:
            let d: Double
            switch value {
            case .float64(let v): d = v
            case .int32(let v): d = Double(v)
            case .int64(let v): d = Double(v)
            default: throw mismatch("a number")
            }
            return (type is Float.Type ? Float(d) as Any : d as Any) as! T
        case is Int.Type: return try integer(Int.self) as! T
        case is Int8.Type: return try integer(Int8.self) as! T
        case is Int16.Type: return try integer(Int16.self) as! T
        case is Int32.Type: return try integer(Int32.self) as! T
        case is Int64.Type: return try integer(Int64.self) as! T
        case is UInt.Type: return try integer(UInt.self) as! T
        case is UInt8.Type: return try integer(UInt8.self) as! T
        case is UInt16.Type: return try integer(UInt16.self) as! T
        case is UInt32.Type: return try integer(UInt32.self) as! T
        case is UInt64.Type: return try integer(UInt64.self) as! T
        case is ChannelValue.Type: return value as! T
        case is [UInt8].Type:
            if case .uint8List(let bytes) = value { return bytes as! T }
            return try T(from: self)
        default: return try T(from: self)
        }
    }

    /// The elements of any list-shaped value, typed lists included.
    var elements: [ChannelValue]? {
        switch value {
        case .list(let l): l
        case .uint8List(let a): a.map { .int32(Int32($0)) }
        case .int32List(let a): a.map(ChannelValue.int32)
        case .int64List(let a): a.map(ChannelValue.int64)
        case .float32List(let a): a.map { .float64(Double($0)) }
        case .float64List(let a): a.map(ChannelValue.float64)
        default: nil
        }
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard case .map(let entries) = value else { throw mismatch("a map") }
        var byKey: [String: ChannelValue] = [:]
        for entry in entries { if case .string(let k) = entry.key, byKey[k] == nil { byKey[k] = entry.value } }
        return KeyedDecodingContainer(KeyedContainer(entries: byKey, codingPath: codingPath))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard let elements else { throw mismatch("a list") }
        return UnkeyedContainer(elements: elements, codingPath: codingPath)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer { SingleContainer(decoder: self) }

    struct KeyedContainer<Key: CodingKey>: KeyedDecodingContainerProtocol {
        let entries: [String: ChannelValue]
        let codingPath: [any CodingKey]
        var allKeys: [Key] { entries.keys.compactMap { Key(stringValue: $0) } }

        func contains(_ key: Key) -> Bool { entries[key.stringValue] != nil }
        func decodeNil(forKey key: Key) throws -> Bool { entries[key.stringValue]?.isNull ?? true }
        func child(_ key: Key) throws -> ValueDecoder {
            guard let v = entries[key.stringValue] else {
                throw DecodingError.keyNotFound(key, .init(codingPath: codingPath, debugDescription: "no value for \(key.stringValue)"))
            }
            return ValueDecoder(value: v, codingPath: codingPath + [key])
        }
        func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T { try child(key).decode(T.self) }
        func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws
            -> KeyedDecodingContainer<NestedKey>
        { try child(key).container(keyedBy: type) }
        func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
            try child(key).unkeyedContainer()
        }
        func superDecoder() throws -> any Decoder {
            ValueDecoder(value: entries["super"] ?? .null, codingPath: codingPath)
        }
        func superDecoder(forKey key: Key) throws -> any Decoder { try child(key) }
    }

    struct UnkeyedContainer: UnkeyedDecodingContainer {
        let elements: [ChannelValue]
        let codingPath: [any CodingKey]
        var currentIndex = 0
        var count: Int? { elements.count }
        var isAtEnd: Bool { currentIndex >= elements.count }

        mutating func next() throws -> ValueDecoder {
            guard !isAtEnd else {
                throw DecodingError.valueNotFound(Any.self, .init(codingPath: codingPath, debugDescription: "list is exhausted"))
            }
            defer { currentIndex += 1 }
            return ValueDecoder(value: elements[currentIndex], codingPath: codingPath + [IndexKey(currentIndex)])
        }
        mutating func decodeNil() throws -> Bool {
            guard !isAtEnd, elements[currentIndex].isNull else { return false }
            currentIndex += 1
            return true
        }
        mutating func decode<T: Decodable>(_ type: T.Type) throws -> T { try next().decode(T.self) }
        mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws
            -> KeyedDecodingContainer<NestedKey>
        { try next().container(keyedBy: type) }
        mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer { try next().unkeyedContainer() }
        mutating func superDecoder() throws -> any Decoder { try next() }
    }

    struct SingleContainer: SingleValueDecodingContainer {
        let decoder: ValueDecoder
        var codingPath: [any CodingKey] { decoder.codingPath }
        func decodeNil() -> Bool { decoder.value.isNull }
        func decode<T: Decodable>(_ type: T.Type) throws -> T { try decoder.decode(T.self) }
    }
}
