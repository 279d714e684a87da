import SwitchboardCodec

/// One binary frame of wire-v1 section 2.
public struct Frame: Equatable, Sendable {
    /// The frame type byte.
    public enum Kind: UInt8, Sendable, CaseIterable {
        case hello = 1, welcome, message, reply, ping, pong, error, goAway, register, unregister, cancel, demand
        /// A resumable session's acknowledgement, and its end (protocol/resumption.md): only on a
        /// connection with a session; anywhere else `bad_frame`, as wire-v1 answers an unknown type.
        case position, end

        /// Whether the type requires a channel name (true), forbids one (false), or takes either (nil).
        public var channelRule: Bool? {
            switch self {
            case .message, .register, .unregister, .demand: true
            case .error: nil
            default: false
            }
        }

        /// Types only the server may send.
        public var isServerOnly: Bool { self == .welcome || self == .error || self == .goAway }
    }

    /// The frame's type.
    public var kind: Kind
    /// The request id; 0 = none (no answer wanted).
    public var id: UInt32
    /// The channel name, empty for types that take none.
    public var channel: String
    /// The payload; nil is NULL_PAYLOAD, which is not the same as empty.
    public var payload: [UInt8]?

    /// Makes a frame.
    public init(_ kind: Kind, id: UInt32 = 0, channel: String = "", payload: [UInt8]?) {
        self.kind = kind
        self.id = id
        self.channel = channel
        self.payload = payload
    }

    /// Size of the fixed header, length field included.
    public static let headerSize = 12
    /// Flag bit 0: the payload is absent.
    public static let nullPayloadFlag: UInt8 = 1

    /// Appends the frame's bytes to `out`.
    public func write(to out: inout [UInt8]) {
        Frame.write(kind, id: id, channel: channel, payload: payload, to: &out)
    }

    /// The frame's bytes.
    public var bytes: [UInt8] {
        var out = [UInt8]()
        out.reserveCapacity(Frame.headerSize + channel.utf8.count + (payload?.count ?? 0))
        write(to: &out)
        return out
    }

    /// Appends a frame built from parts, without making a `Frame` first.
    public static func write(
        _ kind: Kind, id: UInt32, channel: String, payload: [UInt8]?, to out: inout [UInt8]
    ) {
        appendHeaderAndChannel(kind, id: id, channel: channel, payloadLength: payload?.count, to: &out)
        if let payload { out.append(copying: payload) }
    }

    /// ``write(_:id:channel:payload:to:)`` with a payload that is part of a larger buffer, such as a
    /// frame read in place: copied from there, with no array of its own.
    public static func write(
        _ kind: Kind, id: UInt32, channel: String, copying payload: ArraySlice<UInt8>?, to out: inout [UInt8]
    ) {
        appendHeaderAndChannel(kind, id: id, channel: channel, payloadLength: payload?.count, to: &out)
        if let bytes = payload?.span { out.append(copying: bytes) }  // `if let payload` would retain the slice
    }

    /// The header and the channel name of a frame whose payload follows (nil length: NULL_PAYLOAD).
    private static func appendHeaderAndChannel(
        _ kind: Kind, id: UInt32, channel: String, payloadLength: Int?, to out: inout [UInt8]
    ) {
        let channelLength = channel.utf8.count
        appendHeader(kind, id: id, channelLength: channelLength, payloadLength: payloadLength ?? 0,
                     flags: payloadLength == nil ? nullPayloadFlag : 0, to: &out)
        if channelLength > 0 { out.append(contentsOf: channel.utf8) }
    }

    /// Appends a header whose length is left open, for a payload written in place after it; returns
    /// where the frame starts, for ``finishFrame(startingAt:in:)``.
    public static func startFrame(_ kind: Kind, id: UInt32, channel: String = "", to out: inout [UInt8]) -> Int {
        let start = out.count
        let channelLength = channel.utf8.count
        appendHeader(kind, id: id, channelLength: channelLength, payloadLength: 0, flags: 0, to: &out)
        if channelLength > 0 { out.append(contentsOf: channel.utf8) }
        return start
    }

    /// The 12 header bytes written in place after one capacity check (no temporary array).
    private static func appendHeader(
        _ kind: Kind, id: UInt32, channelLength: Int, payloadLength: Int, flags: UInt8, to out: inout [UInt8]
    ) {
        let length = UInt32(8 + channelLength + payloadLength)
        out.append(addingCapacity: headerSize) { header in
            header.append(UInt8(truncatingIfNeeded: length >> 24))
            header.append(UInt8(truncatingIfNeeded: length >> 16))
            header.append(UInt8(truncatingIfNeeded: length >> 8))
            header.append(UInt8(truncatingIfNeeded: length))
            header.append(kind.rawValue)
            header.append(flags)
            header.append(UInt8(truncatingIfNeeded: channelLength >> 8))
            header.append(UInt8(truncatingIfNeeded: channelLength))
            header.append(UInt8(truncatingIfNeeded: id >> 24))
            header.append(UInt8(truncatingIfNeeded: id >> 16))
            header.append(UInt8(truncatingIfNeeded: id >> 8))
            header.append(UInt8(truncatingIfNeeded: id))
        }
    }

    /// Fills in the length of a frame begun with ``startFrame(_:id:channel:to:)`` once its payload is written.
    public static func finishFrame(startingAt start: Int, in out: inout [UInt8]) {
        let length = UInt32(out.count - start - 4)
        var bytes = out.mutableSpan  // one uniqueness check for the four stores
        bytes[start] = UInt8(truncatingIfNeeded: length >> 24)
        bytes[start + 1] = UInt8(truncatingIfNeeded: length >> 16)
        bytes[start + 2] = UInt8(truncatingIfNeeded: length >> 8)
        bytes[start + 3] = UInt8(truncatingIfNeeded: length)
    }

    /// Appends a u32 in network byte order.
    public static func appendBigEndian(_ value: UInt32, to out: inout [UInt8]) {
        out.append(UInt8(truncatingIfNeeded: value >> 24))
        out.append(UInt8(truncatingIfNeeded: value >> 16))
        out.append(UInt8(truncatingIfNeeded: value >> 8))
        out.append(UInt8(truncatingIfNeeded: value))
    }
}

/// A protocol violation and the ERROR code wire-v1 names for it.
public enum WireError: Error, Equatable, Sendable {
    case malformedFrame(String)
    case frameTooLarge(declared: UInt32)
    case badFrame(String)
    case badChannel(String)
    case badPayload(String)
    case duplicateId
    case unauthorized
    case badHello(String)
    case unsupportedVersion
    case badRequest(String)
    case goingAway
    case slowConsumer
    /// The connection missed a deadline: its first frame, line or HTTP head, or the end of one it began.
    case timeout(String)
    case cancelled
    case handlerGone
    /// The channel's holder is away (its session parked) or slow to acknowledge, and what its session may
    /// keep has no room for the request: the request was not forwarded (protocol/resumption.md).
    case handlerBusy
    case channelTaken
    case notRegistered
    /// A REGISTER past the connection's cap on the channels it holds.
    case tooManyRegistrations
    /// A request past the connection's cap on open requests.
    case tooManyRequests
    /// A loaded plugin refused the request (access control).
    case forbidden(String)
    /// The request is over a plugin's rate limit; it may be sent again after `retryAfterMs`.
    case rateLimited(retryAfterMs: Int)
    /// A plugin's own refusal, or a plugin that failed: any code, with optional details. Boxed, so that
    /// the enum (which frame decoding returns per frame) stays as cheap to copy as its other cases.
    indirect case plugin(code: String, message: String, details: ChannelValue?)

    /// The `code` of the ERROR frame, as named in wire-v1.
    public var code: String {
        switch self {
        case .malformedFrame: "malformed_frame"
        case .frameTooLarge: "frame_too_large"
        case .badFrame: "bad_frame"
        case .badChannel: "bad_channel"
        case .badPayload: "bad_payload"
        case .duplicateId: "duplicate_id"
        case .unauthorized: "unauthorized"
        case .badHello: "bad_hello"
        case .unsupportedVersion: "unsupported_version"
        case .badRequest: "bad_request"
        case .goingAway: "going_away"
        case .slowConsumer: "slow_consumer"
        case .timeout: "timeout"
        case .cancelled: "cancelled"
        case .handlerGone: "handler_gone"
        case .handlerBusy: "handler_busy"
        case .channelTaken: "channel_taken"
        case .notRegistered: "not_registered"
        case .tooManyRegistrations: "too_many_registrations"
        case .tooManyRequests: "too_many_requests"
        case .forbidden: "forbidden"
        case .rateLimited: "rate_limited"
        case .plugin(let code, _, _): code
        }
    }

    /// A human-readable message for the ERROR payload.
    public var message: String {
        switch self {
        case .malformedFrame(let m), .badFrame(let m), .badChannel(let m), .badPayload(let m), .badHello(let m),
             .badRequest(let m), .timeout(let m):
            m
        case .frameTooLarge(let declared): "frame of \(declared) bytes exceeds the server's maxFrame"
        case .duplicateId: "a request with this id is still pending"
        case .unauthorized: "a valid token is required"
        case .unsupportedVersion: "only protocol version 1 is supported"
        case .goingAway: "the server is shutting down"
        case .slowConsumer: "the connection did not read its output in time"
        case .cancelled: "the request was cancelled"
        case .handlerGone: "the channel's handler went away"
        case .handlerBusy: "the channel's handler cannot take the request now: its session has no room for it"
        case .channelTaken: "the channel already has a handler"
        case .notRegistered: "this connection does not hold the channel"
        case .tooManyRegistrations: "this connection holds as many channels as it may"
        case .tooManyRequests: "this connection has as many open requests as it may"
        case .forbidden(let m), .plugin(_, let m, _): m
        case .rateLimited(let ms): "over the rate limit: retry after \(ms) ms"
        }
    }

    /// The `details` of the ERROR payload, if any.
    public var details: ChannelValue? {
        switch self {
        case .rateLimited(let ms): .stringMap(["retryAfterMs": .int(ms)])
        case .plugin(_, _, let details): details
        default: nil
        }
    }

    /// The ERROR frame's payload: `{"code":"…","message":"…"}`, with `"details"` when there are any.
    public var payload: [UInt8] {
        var fields: [ChannelValue.MapEntry] = [.init("code", .string(code)), .init("message", .string(message))]
        if let details { fields.append(.init("details", details)) }
        return (try? JSONText.serialize(.map(fields))) ?? (try? JSONText.serialize(.stringMap(["code": .string(code)]))) ?? []
    }

    /// Whether the server closes the connection after sending this error.
    public var closesConnection: Bool {
        switch self {
        case .malformedFrame, .frameTooLarge, .unauthorized, .badHello, .unsupportedVersion, .slowConsumer, .timeout: true
        default: false
        }
    }
}
