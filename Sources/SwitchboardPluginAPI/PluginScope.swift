// What a plugin's processors see: channel patterns, the kinds of requests and of answers and events, and
// scopes made of both. The plugin API itself is in Plugin.swift.

/// A channel name pattern: an exact name, `prefix/*` (every name that starts with `prefix/`), or `*`.
public struct ChannelPattern: Hashable, Sendable, CustomStringConvertible {
    private enum Form: Hashable { case any, prefix(String), exact(String) }
    private let form: Form

    /// Parses `text`: `*`, a name ending in `/*`, or an exact name.
    public init(_ text: String) {
        if text == "*" {
            form = .any
        } else if text.hasSuffix("/*") {
            form = .prefix(String(text.dropLast()))
        } else {
            form = .exact(text)
        }
    }

    /// Matches every channel.
    public static let any = ChannelPattern("*")

    /// Whether `channel` matches.
    public func matches(_ channel: String) -> Bool {
        switch form {
        case .any: true
        case .prefix(let prefix): channel.hasPrefix(prefix)
        case .exact(let name): channel == name
        }
    }

    public var description: String {
        switch form {
        case .any: "*"
        case .prefix(let prefix): prefix + "*"
        case .exact(let name): name
        }
    }
}

/// What a request asks for, as inbound processors see it.
public enum InboundKind: String, Sendable, CaseIterable {
    /// A method call (to a method channel, or to a held channel declared a method channel or undeclared).
    case call
    /// A message to a message channel.
    case message
    /// `listen` on an event channel.
    case listen
    /// `cancel` on an event channel.
    case cancel
    /// REGISTER: the client asks to hold the channel.
    case register
}

/// What goes out, as outbound processors see it.
public enum OutboundKind: String, Sendable, CaseIterable {
    /// A successful answer: a method call's result, a message's reply or a not-implemented answer.
    case reply
    /// A failed answer: an error envelope or an ERROR frame.
    case error
    /// An event: data or an error event.
    case event
    /// An event stream's end.
    case endOfStream
}

/// A kind a ``Scope`` can select: each has a bit of its own.
public protocol ScopedKind: Hashable, Sendable, CaseIterable {
    var bit: UInt8 { get }
}

extension InboundKind: ScopedKind {
    public var bit: UInt8 {
        switch self {
        case .call: 1
        case .message: 2
        case .listen: 4
        case .cancel: 8
        case .register: 16
        }
    }
}

extension OutboundKind: ScopedKind {
    public var bit: UInt8 {
        switch self {
        case .reply: 1
        case .error: 2
        case .event: 4
        case .endOfStream: 8
        }
    }
}

/// Which traffic a processor sees: channels matching any of `channels`, of one of `kinds`.
public struct Scope<Kind: ScopedKind>: Sendable {
    /// The channel patterns; the processor sees a channel that matches any.
    public let channels: [ChannelPattern]
    /// The kinds it sees.
    public let kinds: Set<Kind>
    package let mask: UInt8
    package let isEveryChannel: Bool

    /// Every channel and kind unless narrowed.
    public init(channels: [ChannelPattern] = [.any], kinds: Set<Kind> = Set(Kind.allCases)) {
        self.channels = channels
        self.kinds = kinds
        mask = kinds.reduce(0) { $0 | $1.bit }
        isEveryChannel = channels.contains(.any)
    }

    /// Whether traffic of `kind` on `channel` is in scope.
    public func contains(_ channel: String, _ kind: Kind) -> Bool {
        mask & kind.bit != 0 && (isEveryChannel || channels.contains { $0.matches(channel) })
    }

    /// Whether it sees any of `kinds`, on some channel.
    public func seesAny(of kinds: Set<Kind>) -> Bool { mask & kinds.reduce(0) { $0 | $1.bit } != 0 }
}
