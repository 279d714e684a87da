import SwitchboardCodec
import SwitchboardTransport

/// How a ``Client`` connects and behaves.
public struct ClientConfiguration: Sendable {
    /// Server address (IPv4).
    public var host = "127.0.0.1"
    /// Server port.
    public var port = 7420
    /// Token for HELLO, if the server requires one.
    public var token: String?
    /// Name sent in HELLO.
    public var clientName = "switchboard-swift"
    /// Default time limit of a call, and of a connection's handshake (HELLO to WELCOME); nil = none.
    public var requestTimeout: Duration? = .seconds(30)
    /// Reconnection after a lost connection; nil = stay disconnected.
    public var reconnect: ReconnectPolicy? = ReconnectPolicy()
    /// TLS to the server's TLS port: the CAs to trust, a certificate for mutual TLS; nil = plain TCP.
    public var tls: TLSContext?
    /// The name the server's certificate must carry (and SNI): a DNS name or an IP address; the host
    /// when nil.
    public var serverName: String?
    /// Speak through a WebSocket (the server's HTTP upgrade on the same port), as a browser must.
    public var webSocket = false
    /// Ask for a resumable session (protocol/resumption.md): across a lost connection, streams see no
    /// gap, calls in flight get their real answers and held channels keep their callers, while
    /// `reconnect` brings the connection back within the session's time to live. nil = plain wire-v1.
    /// ``Client/sessionEvents()`` tells what happened after each loss.
    public var session: SessionOptions?

    /// The defaults: 127.0.0.1:7420, 30 s calls, reconnecting.
    public init(host: String = "127.0.0.1", port: Int = 7420, token: String? = nil) {
        self.host = host
        self.port = port
        self.token = token
    }
}

/// Exponential backoff with jitter: attempt n waits a random time in [delay/2, delay],
/// delay = min(maximum, initial × 2ⁿ).
public struct ReconnectPolicy: Sendable {
    /// Delay before the first attempt.
    public var initialDelay: Duration = .milliseconds(100)
    /// Largest delay between attempts.
    public var maximumDelay: Duration = .seconds(5)

    /// The defaults: 100 ms doubling up to 5 s.
    public init(initialDelay: Duration = .milliseconds(100), maximumDelay: Duration = .seconds(5)) {
        self.initialDelay = initialDelay
        self.maximumDelay = maximumDelay
    }

    func delay(attempt: Int) -> Duration {
        var delay = initialDelay
        for _ in 0..<min(attempt, 30) where delay < maximumDelay { delay *= 2 }
        delay = min(delay, maximumDelay)
        return delay * Double.random(in: 0.5...1.0)
    }
}

/// Where the client's connection stands.
public enum ConnectionState: Equatable, Sendable {
    /// Opening the TCP connection or waiting for WELCOME.
    case connecting
    /// Ready.
    case connected
    /// Lost; reconnecting if the configuration allows.
    case disconnected(reason: String)
    /// Closed for good by ``Client/close()``.
    case closed
}

/// Why a request failed, when it is not the channel's own error envelope.
public enum ClientError: Error, Equatable, Sendable {
    /// The connection could not be opened.
    case connectionFailed(String)
    /// The connection dropped while the request was in flight (or before it could be sent).
    case connectionLost
    /// No answer within the time limit (a CANCEL was sent).
    case timedOut
    /// The server answered with an ERROR frame (other than a refusal).
    case server(code: String, message: String)
    /// The server refused the request (ERROR `forbidden` or `rate_limited`, ``refusalCodes``): the
    /// connection is fine, the request was not allowed. `details` is what the ERROR carried (null if
    /// nothing): `rate_limited` carries `retryAfterMs`, also read as ``retryAfter``.
    case refused(code: String, message: String, details: ChannelValue)
    /// The client was closed.
    case closed
    /// The answer could not be decoded.
    case badReply(String)
    /// The request was written on a session that could not be resumed and got no answer: the server
    /// may have run it (``SessionEvent/restarted(_:)`` lists it).
    case sessionLost
}

/// A method call answered "not implemented" (a null reply): Flutter's `MissingPluginException`.
public struct MissingImplementation: Error, Equatable, Sendable {
    /// The channel.
    public let channel: String
    /// The method.
    public let method: String

    /// Makes the error (handlers throw it to answer "not implemented").
    public init(channel: String, method: String) {
        self.channel = channel
        self.method = method
    }
}

extension ClientError {
    /// The ERROR codes that are refusals rather than failures: a plugin said no to this one request.
    public static let refusalCodes: Set<String> = ["forbidden", "rate_limited"]

    /// The error an ERROR frame's `code`, `message` and `details` stand for.
    init(code: String, message: String, details: ChannelValue) {
        self = Self.refusalCodes.contains(code)
            ? .refused(code: code, message: message, details: details)
            : .server(code: code, message: message)
    }

    /// How long to wait before sending a refused request again: a `rate_limited` refusal's
    /// `details.retryAfterMs`; nil for every other error.
    public var retryAfter: Duration? {
        guard case .refused(_, _, let details) = self, let ms = details["retryAfterMs"]?.intValue, ms >= 0 else { return nil }
        return .milliseconds(ms)
    }
}

extension ClientError: CustomStringConvertible {
    public var description: String {
        switch self {
        case .connectionFailed(let reason): "connection failed: \(reason)"
        case .connectionLost: "the connection was lost"
        case .timedOut: "no answer in time"
        case .server(let code, let message), .refused(let code, let message, _): "\(code): \(message)"
        case .closed: "the client is closed"
        case .badReply(let reason): "bad reply: \(reason)"
        case .sessionLost: "the session was lost before the answer came"
        }
    }
}
