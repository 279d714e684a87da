/// A resumable session's settings (``ClientConfiguration/session``).
public struct SessionOptions: Sendable {
    /// Bytes the client keeps of what it wrote and the server has not acknowledged; past them it holds
    /// new frames back (never drops one) until the server's acknowledgements make room.
    public var maxUnacknowledgedBytes: Int

    /// The default keeps up to 1 MiB.
    public init(maxUnacknowledgedBytes: Int = 1 << 20) {
        self.maxUnacknowledgedBytes = max(1, maxUnacknowledgedBytes)
    }
}

/// What happened to a client's session after its connection was lost, or when the server ended it.
public enum SessionEvent: Equatable, Sendable {
    /// The session went on where it was: nothing was lost.
    case resumed
    /// The session could not be resumed; the client made a new one, registered its channels and
    /// listened to its streams again.
    case restarted(SessionRestart)
    /// The server ended the session (`reason`, e.g. `overflowed`) and the connection goes on without
    /// one; `streams` (the channels listened to then) may have missed events. The client asks for a new
    /// session on its next connection.
    case ended(reason: String, streams: [String])
}

/// What a session that could not be resumed may have lost (protocol/resumption.md, "What the client
/// does then").
public struct SessionRestart: Equatable, Sendable {
    /// Why: the server's `cannot_resume` reason (`unknown`, `expired`, `evicted`, `overflowed`, `ended`,
    /// `position`, `restarted`, `other_node`), or the client's own: `unsupported` (the server granted no
    /// session), `position` (the server's position was outside what the client kept), `expired` (no
    /// connection within the time to live), `taken` (a connection not of this client's presented the
    /// token; after one of its own connections was cut before its resume was answered, the client first
    /// resumes once more, as the server may have read that connection's HELLO late).
    public let reason: String
    /// Channels listened to: each may have missed events between the last one received and the
    /// answer to the new `listen`.
    public let streams: [String]
    /// Channels this client held, registered again.
    public let channels: [String]
    /// The channel of each request that failed with ``ClientError/sessionLost`` (empty for a ping), in
    /// no order.
    public let failedRequests: [String]

    /// Makes a report (the client makes them; tests compare them).
    public init(reason: String, streams: [String], channels: [String], failedRequests: [String]) {
        self.reason = reason
        self.streams = streams
        self.channels = channels
        self.failedRequests = failedRequests
    }
}
