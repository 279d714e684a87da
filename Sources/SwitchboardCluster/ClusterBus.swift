/// The message bus between Switchboard nodes: subjects, publish and subscribe, queue groups, and
/// reply subjects with NATS's no-responders status. ``NATSBus`` is the one a node uses; tests may
/// give a ``ClusterLink`` another.
///
/// Loop thread only: every method is called, and every handler runs, on the bus's loop.
/// Delivery is at most once, as in NATS core: what is published while the bus is disconnected is
/// dropped and counted in ``counters``. What can never be sent (a subject with a space, a header with
/// a line break, a message over the server's limit) is refused with ``BusError`` before anything goes
/// out, so that no name a client chose can smuggle a command onto the bus.
public protocol ClusterBus: AnyObject {
    /// Starts delivering (and, for a bus with a connection, connecting).
    func start()
    /// Stops for good: every handler is let go.
    func close()
    /// Sends `payload` (and `headers`) to every subscriber of `subject`, or to one per queue group; with
    /// `replyTo`, answers go to that subject (and so does NATS's no-responders status, 503).
    func publish(_ subject: String, replyTo: String?, headers: [BusMessage.Header], payload: [UInt8]) throws(BusError)
    /// Delivers every message on `subject` (NATS wildcards `*` and `>` allowed) to `handler`; members of
    /// one `queue` group share the messages, each to one of them. Kept across reconnects.
    func subscribe(_ subject: String, queue: String?, _ handler: @escaping (BusMessage) -> Void) throws(BusError) -> BusSubscription
    /// Stops a subscription.
    func unsubscribe(_ subscription: BusSubscription)
    /// Writes what was published so far now, rather than before the loop sleeps.
    func flush()
    /// The largest message the bus carries, headers included.
    var maxPayload: Int { get }
    /// Whether the bus is connected now.
    var isConnected: Bool { get }
    /// What went through the bus so far.
    var counters: BusCounters { get }
}

/// Why the bus refused to send something: nothing was sent.
public enum BusError: Error, Equatable, Sendable {
    /// Not a subject (or queue group) the bus can carry: empty, an empty token, whitespace or a control
    /// character.
    case invalidSubject(String)
    /// A header name that is not an HTTP token, or a value with a control character (a line break).
    case invalidHeader(String)
    /// Larger than the server's `max_payload` (headers included).
    case tooLarge(Int, limit: Int)
}

/// A subscription, to pass to ``ClusterBus/unsubscribe(_:)``.
public struct BusSubscription: Hashable, Sendable {
    let id: UInt64
}

/// The outcome of ``NATSBus/request(_:headers:payload:timeoutMs:_:)``.
public enum BusReply: Sendable, Equatable {
    case reply(BusMessage)
    /// Nobody subscribes to the subject (NATS answers this at once).
    case noResponders
    /// No reply within the time allowed.
    case timedOut
    /// The bus lost its connection (or was closed) before a reply came.
    case disconnected
}

/// A bus's counters, for stats.
public struct BusCounters: Sendable, Equatable {
    /// Messages published, and their payload bytes.
    public var messagesOut = 0, bytesOut = 0
    /// Messages delivered to subscriptions, and their payload bytes.
    public var messagesIn = 0, bytesIn = 0
    /// Messages not published because the bus was disconnected or its send queue was full.
    public var dropped = 0
    /// Connections made after the first.
    public var reconnects = 0
    /// Connection attempts that failed: refused, ended, or not confirmed within the connect timeout.
    public var connectFailures = 0
    /// Messages published on a connection that was then lost, after the last `PONG` that confirmed
    /// the server had read what came before it: they may never have reached it.
    public var possiblyLost = 0
    /// `-ERR` lines from the server (slow consumer, permissions, …), and how many said slow consumer.
    public var serverErrors = 0, slowConsumer = 0

    public init() {}
}

extension ClusterBus {
    /// Publishes without a reply subject.
    public func publish(_ subject: String, headers: [BusMessage.Header] = [], payload: [UInt8]) throws(BusError) {
        try publish(subject, replyTo: nil, headers: headers, payload: payload)
    }
}
