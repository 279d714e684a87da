/// A method invocation on a method channel: Flutter's `MethodCall`.
public struct MethodCall: Equatable, Sendable {
    /// The method's name.
    public var method: String
    /// The arguments, `.null` when there are none.
    public var arguments: ChannelValue

    /// Makes a call.
    public init(method: String, arguments: ChannelValue = .null) {
        self.method = method
        self.arguments = arguments
    }
}

/// An error result of a method call or an error event: Flutter's `PlatformException` fields.
public struct ChannelError: Error, Equatable, Sendable {
    /// A machine-readable code such as `demo_error`.
    public var code: String
    /// A human-readable message, optional.
    public var message: String?
    /// Any extra value.
    public var details: ChannelValue
    /// A stack trace, sent only when present (as a 4th envelope field).
    public var stacktrace: String?

    /// Makes an error.
    public init(code: String, message: String? = nil, details: ChannelValue = .null, stacktrace: String? = nil) {
        self.code = code
        self.message = message
        self.details = details
        self.stacktrace = stacktrace
    }
}
