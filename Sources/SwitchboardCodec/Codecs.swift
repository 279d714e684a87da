/// Turns messages into payload bytes and back: Flutter's `MessageCodec<T>`.
///
/// A `nil` payload is the wire's NULL_PAYLOAD (a null message), which is not the same as an empty one.
/// Every codec can also convert to and from ``ChannelValue``, which is how text-mode clients and
/// the broker reach channels of any codec.
public protocol MessageCodec<Message>: Sendable {
    /// The Swift type of one message.
    associatedtype Message: Sendable
    /// Encodes a message; nil means a NULL_PAYLOAD.
    func encode(_ message: Message) throws(CodecError) -> [UInt8]?
    /// Decodes a payload; nil is a NULL_PAYLOAD.
    func decode(_ payload: [UInt8]?) throws(CodecError) -> Message
    /// The message as a generic value.
    func value(of message: Message) -> ChannelValue
    /// The message a generic value stands for, or an error when the codec cannot carry it.
    func message(from value: ChannelValue) throws(CodecError) -> Message
}

/// Encodes method calls and result envelopes: Flutter's `MethodCodec`.
public protocol MethodCodec: Sendable {
    /// Appends a success envelope to `buffer` (the default encodes, then copies).
    func encodeSuccessEnvelope(_ result: ChannelValue, appendingTo buffer: inout [UInt8]) throws(CodecError)
    /// Encodes a call (name and arguments).
    func encodeMethodCall(_ call: MethodCall) throws(CodecError) -> [UInt8]
    /// Decodes a call; a NULL_PAYLOAD is an error.
    func decodeMethodCall(_ payload: [UInt8]?) throws(CodecError) -> MethodCall
    /// Decodes a call from a slice of a larger buffer, such as a frame read in place (the default copies
    /// the slice into an array first).
    func decodeMethodCall(from payload: ArraySlice<UInt8>?) throws(CodecError) -> MethodCall
    /// Decodes a call as ``decodeMethodCall(from:)`` does, taking what it can from the previous call on
    /// the same connection (the default ignores `reuse`).
    func decodeMethodCall(from payload: ArraySlice<UInt8>?, reusing reuse: inout MethodCallReuse) throws(CodecError)
        -> MethodCall
    /// The method name of a call, read without decoding its arguments; nil if there is none (the default
    /// decodes the whole call).
    func methodName(in payload: ArraySlice<UInt8>?, reusing reuse: inout MethodCallReuse) -> String?
    /// Encodes a success envelope.
    func encodeSuccessEnvelope(_ result: ChannelValue) throws(CodecError) -> [UInt8]
    /// Encodes an error envelope.
    func encodeErrorEnvelope(_ error: ChannelError) throws(CodecError) -> [UInt8]
    /// Decodes an envelope into a success value or the error it carries.
    func decodeEnvelope(_ payload: [UInt8]?) throws(CodecError) -> Result<ChannelValue, ChannelError>
}

extension MethodCodec {
    public func encodeSuccessEnvelope(_ result: ChannelValue, appendingTo buffer: inout [UInt8]) throws(CodecError) {
        buffer.append(contentsOf: try encodeSuccessEnvelope(result))
    }

    public func decodeMethodCall(from payload: ArraySlice<UInt8>?) throws(CodecError) -> MethodCall {
        try decodeMethodCall(payload.map(Array.init))
    }

    public func decodeMethodCall(from payload: ArraySlice<UInt8>?, reusing reuse: inout MethodCallReuse)
        throws(CodecError) -> MethodCall
    {
        try decodeMethodCall(from: payload)
    }

    public func methodName(in payload: ArraySlice<UInt8>?, reusing reuse: inout MethodCallReuse) -> String? {
        try? decodeMethodCall(from: payload).method
    }
}

/// What one connection keeps from one method call to the next, so that decoding the next call
/// allocates less: the last method name (most connections call few methods) and the storage of the last
/// Uint8List argument, whose bytes the next one overwrites once nothing else holds them. A handler that
/// keeps an argument keeps its own copy: arrays are values, so the next call then gets fresh storage.
public struct MethodCallReuse: Sendable {
    /// The last method name decoded.
    var method = ""
    /// Storage for the next Uint8List argument.
    var bytes: [UInt8] = []
    /// Arguments larger than this get storage of their own, so that a connection keeps at most about
    /// twice this (arrays grow by doubling).
    static let largestKept = 64 * 1024
    /// Longer method names are not kept.
    static let longestMethodKept = 64

    /// Makes an empty one.
    public init() {}
}

// MARK: - Standard

/// Flutter's `StandardMessageCodec`: the binary format of type bytes 0-14, plus registered custom types.
public struct StandardMessageCodec: MessageCodec {
    /// Custom types this codec can decode (any ``StandardCustomValue`` can be encoded).
    public let customTypes: [any StandardCustomValue.Type]

    /// Makes a codec that also reads the given custom types.
    public init(customTypes: [any StandardCustomValue.Type] = []) {
        precondition(customTypes.allSatisfy { $0.typeByte >= 128 }, "custom type bytes must be 128 or more")
        self.customTypes = customTypes
    }

    /// Encodes a value; a null message is the single byte 00 (never a NULL_PAYLOAD).
    public func encode(_ message: ChannelValue) throws(CodecError) -> [UInt8]? {
        var writer = StandardWriter()
        try writer.writeValue(message)
        return writer.bytes
    }

    /// Decodes one value; a NULL_PAYLOAD or empty payload is null; leftover bytes are an error.
    public func decode(_ payload: [UInt8]?) throws(CodecError) -> ChannelValue {
        guard let payload, !payload.isEmpty else { return .null }
        var reader = StandardReader(payload[...], customTypes: customTypes)
        let value = try reader.readValue()
        try reader.expectEnd("value")
        return value
    }

    public func value(of message: ChannelValue) -> ChannelValue { message }
    public func message(from value: ChannelValue) throws(CodecError) -> ChannelValue { value }
}

/// Flutter's `StandardMethodCodec`: calls as name + arguments, envelopes led by 0 (success) or 1 (error).
public struct StandardMethodCodec: MethodCodec {
    /// The codec of the values inside calls and envelopes.
    public let messageCodec: StandardMessageCodec

    /// Makes a method codec over `messageCodec`.
    public init(_ messageCodec: StandardMessageCodec = StandardMessageCodec()) {
        self.messageCodec = messageCodec
    }

    private func reader(_ payload: ArraySlice<UInt8>?, _ what: String) throws(CodecError) -> StandardReader {
        guard let payload else { throw CodecError(offset: 0, "null payload where a \(what) was expected") }
        return StandardReader(payload, customTypes: messageCodec.customTypes)
    }

    public func encodeMethodCall(_ call: MethodCall) throws(CodecError) -> [UInt8] {
        var writer = StandardWriter()
        try writer.writeValue(.string(call.method))
        try writer.writeValue(call.arguments)
        return writer.bytes
    }

    public func decodeMethodCall(_ payload: [UInt8]?) throws(CodecError) -> MethodCall {
        try decodeMethodCall(from: payload?[...])
    }

    /// Decodes in place: offsets and alignment count from the slice's start.
    public func decodeMethodCall(from payload: ArraySlice<UInt8>?) throws(CodecError) -> MethodCall {
        var reuse = MethodCallReuse()
        return try decodeMethodCall(from: payload, reusing: &reuse)
    }

    public func methodName(in payload: ArraySlice<UInt8>?, reusing reuse: inout MethodCallReuse) -> String? {
        guard let payload else { return nil }
        return StandardFastPath.methodName(payload, reusing: &reuse)
    }

    public func decodeMethodCall(from payload: ArraySlice<UInt8>?, reusing reuse: inout MethodCallReuse)
        throws(CodecError) -> MethodCall
    {
        if let call = StandardFastPath.decodeMethodCall(payload, reusing: &reuse) { return call }
        // A method name is a string (type 7), as Flutter writes it. A legacy large int (type 5) reads as
        // text too, but is no method name: taking it for one would let a call name a method that
        // ``methodName(in:reusing:)``, which access control asks, does not see.
        guard payload?.first == StandardType.string else { throw CodecError(offset: 0, "method name is not a string") }
        var reader = try reader(payload, "method call")
        guard case .string(let method) = try reader.readValue() else {
            throw CodecError(offset: 0, "method name is not a string")
        }
        let arguments = try reader.readValue()
        try reader.expectEnd("method call")
        return MethodCall(method: method, arguments: arguments)
    }

    public func encodeSuccessEnvelope(_ result: ChannelValue) throws(CodecError) -> [UInt8] {
        var bytes: [UInt8] = []
        try encodeSuccessEnvelope(result, appendingTo: &bytes)
        return bytes
    }

    /// Writes the envelope straight into `buffer`, aligned from its first byte (no intermediate array).
    public func encodeSuccessEnvelope(_ result: ChannelValue, appendingTo buffer: inout [UInt8]) throws(CodecError) {
        var writer = StandardWriter(appendingTo: &buffer)
        defer { writer.finish(into: &buffer) }
        writer.writeByte(0)
        try writer.writeValue(result)
    }

    public func encodeErrorEnvelope(_ error: ChannelError) throws(CodecError) -> [UInt8] {
        var writer = StandardWriter()
        writer.writeByte(1)
        try writer.writeValue(.string(error.code))
        try writer.writeValue(error.message.map(ChannelValue.string) ?? .null)
        try writer.writeValue(error.details)
        if let stacktrace = error.stacktrace { try writer.writeValue(.string(stacktrace)) }
        return writer.bytes
    }

    public func decodeEnvelope(_ payload: [UInt8]?) throws(CodecError) -> Result<ChannelValue, ChannelError> {
        var reader = try reader(payload?[...], "envelope")
        switch try reader.readByte() {
        case 0:
            let value = try reader.readValue()
            try reader.expectEnd("envelope")
            return .success(value)
        case 1:
            guard case .string(let code) = try reader.readValue() else {
                throw reader.error("error envelope code is not a string")
            }
            let message: String?
            switch try reader.readValue() {
            case .null: message = nil
            case .string(let s): message = s
            default: throw reader.error("error envelope message is not a string or null")
            }
            let details = try reader.readValue()
            var stacktrace: String?
            if reader.remaining > 0 {
                switch try reader.readValue() {
                case .null: stacktrace = nil
                case .string(let s): stacktrace = s
                default: throw reader.error("error envelope stack trace is not a string or null")
                }
            }
            try reader.expectEnd("envelope")
            return .failure(ChannelError(code: code, message: message, details: details, stacktrace: stacktrace))
        case let other:
            throw CodecError(offset: 0, "envelope starts with \(other), not 0 or 1")
        }
    }
}

// MARK: - String and binary

/// Flutter's `StringCodec`: a message is UTF-8 text; a null message is a NULL_PAYLOAD.
public struct StringCodec: MessageCodec {
    /// Makes the codec.
    public init() {}

    public func encode(_ message: String?) throws(CodecError) -> [UInt8]? { message.map { Array($0.utf8) } }

    public func decode(_ payload: [UInt8]?) throws(CodecError) -> String? {
        guard let payload else { return nil }
        guard let s = decodeUTF8(payload[...]) else {
            throw CodecError(offset: 0, "invalid UTF-8 in string message")
        }
        return s
    }

    public func value(of message: String?) -> ChannelValue { message.map(ChannelValue.string) ?? .null }

    public func message(from value: ChannelValue) throws(CodecError) -> String? {
        switch value {
        case .null: return nil
        case .string(let s): return s
        default: throw CodecError(offset: 0, "a string channel carries only strings")
        }
    }
}

/// Flutter's `BinaryCodec`: the payload is the message; a null message is a NULL_PAYLOAD.
public struct BinaryCodec: MessageCodec {
    /// Makes the codec.
    public init() {}

    public func encode(_ message: [UInt8]?) throws(CodecError) -> [UInt8]? { message }
    public func decode(_ payload: [UInt8]?) throws(CodecError) -> [UInt8]? { payload }
    public func value(of message: [UInt8]?) -> ChannelValue { message.map(ChannelValue.uint8List) ?? .null }

    /// Accepts bytes, a list of ints 0-255, or a string (its UTF-8 bytes).
    public func message(from value: ChannelValue) throws(CodecError) -> [UInt8]? {
        switch value {
        case .null: return nil
        case .uint8List(let bytes): return bytes
        case .string(let s): return Array(s.utf8)
        case .list(let elements):
            var out = [UInt8]()
            out.reserveCapacity(elements.count)
            for element in elements {
                guard let n = element.intValue, let byte = UInt8(exactly: n) else {
                    throw CodecError(offset: 0, "a binary message is a list of numbers 0-255")
                }
                out.append(byte)
            }
            return out
        default: throw CodecError(offset: 0, "a binary channel carries only bytes")
        }
    }
}
