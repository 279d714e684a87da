import Synchronization
import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// A server extension, loaded at start-up with `Server.load(_:)`: ordered inbound processors that see
/// each request before it is routed, and ordered outbound processors that see each reply and event before
/// it is written. (A plugin that needs the server itself when it is loaded is a `ServerPlugin`, in
/// SwitchboardServer.)
///
/// Inbound processors run in load order (and, within a plugin, in array order); outbound ones in reverse
/// load order, so that the first plugin loaded is the outermost on both ways. Processors are shared by
/// every connection and may run on any loop thread at once: they are `Sendable`, and state of one
/// connection lives in the connection's context (``ConnectionContext/state(_:)``, ``ConnectionContext/keep(_:)``).
public protocol Plugin: Sendable {
    /// Names the plugin in stats and logs.
    var name: String { get }
    /// Sees requests on the way in, in order.
    var inbound: [any InboundProcessor] { get }
    /// Sees replies and events on the way out, in order.
    var outbound: [any OutboundProcessor] { get }
    /// Identifies a client from its HELLO: the first plugin that answers other than `.pass` decides.
    /// It may keep what it needs later in the connection's state (``ConnectionContext/keep(_:)``).
    func authenticate(_ hello: Hello, connection: ConnectionContext) -> Authentication
    /// Whether it now decides who clients are and what they may do (access control with rules in force).
    /// The server then leaves its own guarded powers to it: `GET /metrics` wants a user's token with the
    /// right to call `switchboard/stats` (wire-v1 section 8), judged by ``authenticate(_:connection:)``
    /// and the gates, and the introspection channels and ``BuiltInChannels/operatorMethods`` are as the
    /// rights say. With no such plugin, both serve clients on this machine only. False by default.
    var controlsAccess: Bool { get }
}

extension Plugin {
    public var inbound: [any InboundProcessor] { [] }
    public var outbound: [any OutboundProcessor] { [] }
    public func authenticate(_ hello: Hello, connection: ConnectionContext) -> Authentication { .pass }
    public var controlsAccess: Bool { false }
}

/// What a plugin must know of the server's own channels.
public enum BuiltInChannels {
    /// The methods of the built-in channels that are operators' powers: a right grants one only by
    /// naming it (`switchboard/connections#close`), never through a pattern or an absent right
    /// (protocol/plugins.md).
    public static let operatorMethods: [String: [String]] = ["switchboard/connections": ["close"]]
}

/// What a client said in HELLO, for ``Plugin/authenticate(_:connection:)``.
public struct Hello: Sendable {
    /// The `token`, if any.
    public let token: String?
    /// The `client` name, if any.
    public let client: String?
    /// The subject of the client's TLS certificate (RFC 2253, such as `CN=alice,O=Example`), when it
    /// presented one that the server verified (mutual TLS).
    public let certificateSubject: String?

    package init(token: String?, client: String?, certificateSubject: String?) {
        self.token = token
        self.client = client
        self.certificateSubject = certificateSubject
    }
}

/// A plugin's verdict on a HELLO.
public enum Authentication: Sendable {
    /// No opinion: the next plugin decides (a connection no plugin identifies is anonymous).
    case pass
    /// The client is this identity (seen by processors as ``ConnectionContext/identity``).
    case identity(String)
    /// The HELLO is refused with `unauthorized`, and the connection closes (wire-v1 section 2).
    case refuse
}

/// The connection a request came on or a reply goes to, as processors see it. Loop thread only.
///
/// What other modules read per request is behind getters: a public stored property they could reach
/// directly would be checked for exclusive access at run time on every read.
public final class ConnectionContext {
    /// How the client speaks.
    public enum Encoding: String, Sendable { case binary, text }

    /// The connection's serial number (the server's `ClientID.rawValue`).
    public let id: UInt64
    /// The peer's address (such as `127.0.0.1:50312`), or the in-memory transport's name.
    public let remoteAddress: String
    /// Binary frames or text lines (undecided connections send no requests).
    public package(set) var encoding = Encoding.binary
    /// The `client` name from HELLO.
    public package(set) var clientName: String?
    /// Who the client is, as a plugin's ``Plugin/authenticate(_:connection:)`` decided; nil when anonymous.
    public var identity: String? { authenticatedAs }
    /// Changes with every HELLO's verdict: per-connection state derived from ``identity`` can check
    /// this number instead of comparing names.
    public var helloCount: Int { hellos }
    /// The loop's clock in milliseconds, read once per loop turn: cheap, and the same for every
    /// request of a turn (a rate limiter's clock).
    public var now: UInt64 { eventLoop.now }

    /// The object a processor keeps for this connection under its class (a rate limiter's buckets,
    /// say); it goes when the connection does.
    public func state<Value: AnyObject>(_ type: Value.Type) -> Value? {
        let id = ObjectIdentifier(type)
        let states = self.states
        for entry in states where entry.key == id { return entry.value as? Value }
        return nil
    }

    /// Keeps `value` for this connection under its class, replacing what was kept.
    public func keep<Value: AnyObject>(_ value: Value) {
        var states = self.states
        let id = ObjectIdentifier(Value.self)
        states.removeAll { $0.key == id }
        states.append((id, value))
        swap(&states, &self.states)
    }

    /// The name this client used for its stream on `channel`, when a stage renamed its `listen`.
    public func listenedName(of channel: String) -> String? { listenedNames[channel] }

    /// The channel a stage renamed this client's `listen` on `name` to, if one did: its DEMAND frames on
    /// `name` go there.
    package func channel(renamedFrom name: String) -> String? { channelRenames[name] }

    private let eventLoop: EventLoop
    private var authenticatedAs: String?
    private var hellos = 0
    /// Processors' state, one object per class: a short list rather than a dictionary (a connection
    /// holds the state of a few plugins, looked up per request), only ever read or swapped whole, so
    /// that no access to it spans a call and the compiler checks none of them at run time.
    private var states: [(key: ObjectIdentifier, value: AnyObject)] = []
    /// Event channels this client listens to by another name (a stage renamed its `listen`): its DEMAND
    /// frames on the old name go to the new one.
    private var channelRenames: [String: String] = [:]
    /// The same, from the channel's name to the name the client used.
    private var listenedNames: [String: String] = [:]

    package init(id: UInt64, remoteAddress: String, eventLoop: EventLoop) {
        self.id = id
        self.remoteAddress = remoteAddress
        self.eventLoop = eventLoop
    }

    /// Records a HELLO's verdict.
    package func authenticated(as identity: String?) {
        authenticatedAs = identity
        hellos &+= 1
    }

    /// Records a listen routed to `channel` (once every stage admitted it), named `original` by the
    /// client when a stage renamed it, nil when the client used the channel's own name.
    package func listened(to channel: String, as original: String?) {
        listenedNames[channel] = original
        if let original { channelRenames[original] = channel }
    }

    /// Lets go of every processor's state (when the connection closes: a state that refers back to the
    /// context, a kept ``Decider`` say, would otherwise keep both alive).
    package func dropStates() {
        var none: [(key: ObjectIdentifier, value: AnyObject)] = []
        swap(&none, &states)
    }
}

/// A request on its way in, before routing.
public struct InboundRequest {
    /// The payload as it came: frame bytes from a binary client, a value from a text client.
    public enum Payload {
        /// A binary frame's payload, in the channel's codec (a method call envelope, or a message).
        case bytes(ArraySlice<UInt8>?)
        /// A text client's arguments (calls, listens, cancels) or message (sends).
        case value(ChannelValue)
    }

    /// The requesting connection.
    public let connection: ConnectionContext
    /// The channel; a processor may rewrite it (later processors and the router see the new one).
    public var channel: String {
        didSet {
            isRenamed = true
            if originalChannel == nil { originalChannel = oldValue }
        }
    }
    /// What the request asks for, judged by what it does (a `listen` call on an event channel is a
    /// listen, however it was sent); judged again when a stage renames the channel or rewrites the payload.
    public package(set) var kind = InboundKind.call
    /// The method of a call, listen or cancel, read without decoding the arguments (nil for sends, and
    /// when the channel's codec is unknown or the payload is not a method call). A call's method is read
    /// from its payload when first asked for: a stage that does not ask costs nothing.
    public var method: String? {
        mutating get {
            if isMethodPending {
                isMethodPending = false
                guard case .bytes(let bytes) = payload else { return knownMethod }
                knownMethod = Self.methodName(in: bytes, codec: codec)
            }
            return knownMethod
        }
    }
    private static func methodName(in bytes: ArraySlice<UInt8>?, codec: SharedMethodCodec?) -> String? {
        var reuse = MethodCallReuse()
        return (codec?.codec ?? StandardMethodCodec()).methodName(in: bytes, reusing: &reuse)
    }

    /// The method, once read (or as a text client sent it).
    package var knownMethod: String?
    /// On a channel held on another node, whose kind only that node can tell: the kinds (as
    /// ``InboundKind/bit``) the request could be, ``kind`` the one its method names; 0 when the kind is known.
    package var possibleKinds: UInt8 = 0
    /// Of ``possibleKinds`` (or ``kindsOnArrival``), those a gate refused: the holder's loop or node
    /// refuses the request if it is one there.
    package var refusedKinds: UInt8 = 0
    /// On a channel held on another loop, whose holder may declare it again (or another holder take it)
    /// before the request arrives: the kinds, besides ``kind``, that the request could be there. The
    /// gates judge these too, and their refusals join ``refusedKinds``; 0 on any other channel.
    package var kindsOnArrival: UInt8 = 0
    /// A binary method call whose method has not been read yet.
    package var isMethodPending = false
    /// The payload; a processor may rewrite it.
    public var payload: Payload {
        didSet {
            isPayloadChanged = true
            if isMethodPending, case .bytes(let bytes) = oldValue {  // the call's method, before it is gone
                isMethodPending = false
                knownMethod = Self.methodName(in: bytes, codec: codec)
            }
        }
    }
    /// Whether a request id waits for an answer (false for a MESSAGE with id 0).
    public let expectsAnswer: Bool
    /// A text-mode request (whose method, if any, came with it).
    package let isText: Bool
    /// The channel's method codec, for decoding arguments and encoding a direct answer.
    package var codec: SharedMethodCodec?
    /// The message channel's encoder, for a direct answer to a binary send.
    package var encodeMessage: (@Sendable (ChannelValue) throws(CodecError) -> [UInt8]?)?
    /// Set when a stage rewrote the payload or renamed the channel: what the request is may have changed.
    package var isPayloadChanged = false, isRenamed = false
    /// When it arrived (``EventLoop/nanoseconds()``), while some outbound stage sees answers (for their
    /// `RequestTrace`); 0 otherwise.
    package var receivedAt: UInt64 = 0
    /// The channel the client named, if a stage renamed it.
    package var originalChannel: String?

    package init(connection: ConnectionContext, channel: String, method: String?, payload: Payload, expectsAnswer: Bool, isText: Bool) {
        self.connection = connection
        self.channel = channel
        knownMethod = method
        self.payload = payload
        self.expectsAnswer = expectsAnswer
        self.isText = isText
    }

    /// The arguments of a call, listen or cancel, or the message of a send, decoded on demand with the
    /// channel's codec (a message channel's bytes are returned as a Uint8List). Throws if they do not
    /// decode; nil if the codec is unknown.
    public func decodedValue() throws(CodecError) -> ChannelValue? {
        switch payload {
        case .value(let value): return value
        case .bytes(let bytes):
            guard let codec, kind != .message else { return bytes.map { .uint8List(Array($0)) } ?? .null }
            return try codec.codec.decodeMethodCall(from: bytes).arguments
        }
    }
}

/// Why a request is refused: an ERROR with this code, message and details (an error line in text mode).
public struct Rejection: Error, Sendable, Equatable {
    package let error: WireError

    /// A refusal with a code of the plugin's own. One that the protocol gives a meaning a refusal must
    /// not have (an ERROR after which the server closes, or one a resumable session's client leaves out
    /// of its stream: ``reservedCodes``) is sent as `plugin_error`, its message naming the code.
    public init(code: String, message: String, details: ChannelValue? = nil) {
        error = Self.reservedCodes.contains(code)
            ? .plugin(code: "plugin_error", message: "\(code): \(message)", details: details)
            : .plugin(code: code, message: message, details: details)
    }

    /// Codes a plugin's refusal cannot carry (wire.md's closing errors, and resumption.md's).
    public static let reservedCodes: Set<String> = ["malformed_frame", "frame_too_large", "unauthorized", "bad_hello",
                                                    "unsupported_version", "slow_consumer", "timeout", "cannot_resume",
                                                    "session_taken"]

    /// `forbidden` (wire-v1's code for access control).
    public static func forbidden(_ message: String) -> Rejection { Rejection(error: .forbidden(message)) }

    /// `rate_limited`, with `retryAfterMs` in the details.
    public static func rateLimited(retryAfterMs: Int) -> Rejection { Rejection(error: .rateLimited(retryAfterMs: retryAfterMs)) }

    private init(error: WireError) { self.error = error }

    /// The code sent.
    public var code: String { error.code }
}

/// A direct answer from a processor, in place of the channel's.
public enum DirectAnswer: Sendable {
    /// A method call's result (or a message's reply value).
    case success(ChannelValue)
    /// An error envelope.
    case failure(ChannelError)
    /// A not-implemented answer (a null reply).
    case notImplemented
}

/// What an inbound processor decides.
public enum InboundDecision: Sendable {
    /// On to the next processor, then the channel (with whatever the processor rewrote).
    case next
    /// Refused: the requester gets an ERROR; the connection stays open.
    case reject(Rejection)
    /// Answered here: the channel never sees the request.
    case answer(DirectAnswer)
    /// Decided later: `body` runs at once with a ``Decider`` that any thread may call, once. Meanwhile
    /// the request is open (a CANCEL, a disconnect or shutdown answer it as any open request).
    case later(@Sendable (Decider) -> Void)
}

/// Decides a request whose processor chose ``InboundDecision/later(_:)``. Any thread; the first call
/// counts. A plugin that lets go of every copy without deciding gets its request answered with ERROR
/// `plugin_error`: every request gets an answer.
public struct Decider: Sendable {
    private let token: DecisionToken

    package init(token: DecisionToken) { self.token = token }

    /// Gives the decision (`.later` again is treated as a plugin failure).
    public func callAsFunction(_ decision: InboundDecision) { token.decide(decision) }
}

/// Takes a deferred request's decision to its loop, once; or, if the plugin drops it undecided, says so.
package final class DecisionToken: Sendable {
    /// Hands the decision (nil: dropped undecided) to the waiting request, on its loop.
    private let resume: @Sendable (InboundDecision?) -> Void
    private let isDecided = Atomic<Bool>(false)

    package init(resume: @escaping @Sendable (InboundDecision?) -> Void) { self.resume = resume }

    func decide(_ decision: InboundDecision) {
        guard !isDecided.exchange(true, ordering: .acquiringAndReleasing) else { return }
        resume(decision)
    }

    deinit {
        guard !isDecided.load(ordering: .acquiring) else { return }
        resume(nil)
    }
}

/// Sees requests before they are routed.
public protocol InboundProcessor: Sendable {
    /// The traffic it sees (all of it by default).
    var scope: Scope<InboundKind> { get }
    /// Decides one request; may rewrite its channel or payload. A thrown error refuses the request
    /// with an ERROR `plugin_error` and is counted.
    func process(_ request: inout InboundRequest) throws -> InboundDecision
}

extension InboundProcessor {
    public var scope: Scope<InboundKind> { Scope() }
}

/// An inbound processor whose verdict depends only on the connection's identity, the channel, the kind
/// and settings whose changes its ``epoch`` marks: it admits or refuses, and never rewrites, answers or
/// waits. Access control and rate limits are gates.
///
/// When every inbound stage is a gate and no outbound stage sees replies or errors, a binary call or
/// send is judged without building an ``InboundRequest``, and the verdicts on the connection's last
/// channel and kind are kept until a HELLO, a new channel or kind, or an advance of the epoch: a
/// repeated request asks only the meters. Other requests are judged afresh each time. So:
/// - what must be decided per request (taking a token from a bucket) is the ``GateMeter`` a verdict
///   names, and a meter's state must outlive the verdict: keep it in the connection's state
///   (``ConnectionContext/keep(_:)``) and hand out the same meter when judged again, or a client could
///   reset it by switching channels;
/// - ``epoch`` must be the same object every time (the pipeline reads it once, at load);
/// - the meters of gates loaded before a refusing gate have already counted the request: load rate
///   limits after access control (as `PluginConfiguration.plugins(reading:)` does).
///
/// The pipeline never calls `process`.
public protocol InboundGate: InboundProcessor {
    /// Advances whenever something the verdicts depend on changes, other than the identity; nil when
    /// nothing does.
    var epoch: VerdictEpoch? { get }
    /// The verdict on `kind` requests to `channel` from `connection`.
    func judge(_ connection: ConnectionContext, channel: String, kind: InboundKind) -> GateVerdict
}

extension InboundGate {
    public var epoch: VerdictEpoch? { nil }

    public func process(_ request: inout InboundRequest) throws -> InboundDecision {
        judge(request.connection, channel: request.channel, kind: request.kind)
            .admit(now: request.connection.now, method: request.method).map { .reject($0) } ?? .next
    }
}

/// A gate's verdict on a connection, channel and kind.
public enum GateVerdict {
    /// Every such request may pass.
    case admit
    /// Every such request is refused.
    case refuse(Rejection)
    /// The meter decides each such request.
    case meter(any GateMeter)
    /// The method called decides each such request (rights that name methods, such as
    /// `switchboard/connections#close`): nil lets it through. The method is nil when it could not be read.
    case byMethod(@Sendable (String?) -> Rejection?)

    /// One request's fate: nil lets it through. `method` is read only for a verdict by method.
    package func admit(now: UInt64, method: @autoclosure () -> String?) -> Rejection? {
        switch self {
        case .admit: nil
        case .refuse(let rejection): rejection
        case .meter(let meter): meter.admit(now: now)
        case .byMethod(let verdict): verdict(method())
        }
    }
}

/// Decides each request on a channel a gate admitted: one connection's token bucket, say. It belongs to
/// its connection's loop.
public protocol GateMeter: AnyObject {
    /// nil lets the request through; else it is refused. `now` is the loop's clock in milliseconds.
    func admit(now: UInt64) -> Rejection?
}

/// A number that advances whenever a gate's settings change (a reload), so that the verdicts kept for
/// every connection are judged again. Gates that share settings share one.
public final class VerdictEpoch: Sendable {
    @usableFromInline let counter = Atomic<Int>(0)
    /// Epochs that advance with this one (the pipeline's, which stands for all of its gates').
    private let followers = Mutex<[VerdictEpoch]>([])

    public init() {}

    /// The current value. Inlinable: the server reads it for every request to a held channel, where a
    /// call into this module would cost a retain and a release of the epoch (measured on relayed calls).
    @inlinable public var value: Int { counter.load(ordering: .acquiring) }

    /// Marks every kept verdict stale.
    public func advance() {
        counter.add(1, ordering: .releasing)
        for follower in followers.withLock({ $0 }) { follower.advance() }
    }

    /// Makes `follower` advance whenever this epoch does.
    package func lead(_ follower: VerdictEpoch) {
        followers.withLock { $0.append(follower) }
    }
}

/// A reply or event on its way out to one connection.
public struct OutboundMessage {
    /// What it carries, decoded.
    public enum Content: Sendable, Equatable {
        case value(ChannelValue)
        case error(ChannelError)
        case notImplemented
        case end
        /// Bytes with no decoded form here (a message reply, an event of a held channel with no codec).
        case bytes([UInt8]?)
    }

    /// The destination connection.
    public let connection: ConnectionContext
    /// The channel (for a reply, the channel the request was routed to). A processor may rename an
    /// event's channel for this connection (replies carry no channel name).
    public var channel: String { didSet { isChanged = true } }
    public let kind: OutboundKind
    /// For replies: the method of the call, if it was one.
    public let method: String?
    /// For replies: the time from the request's arrival until now.
    public let elapsed: Duration?
    /// The content; a processor may change it (the change reaches this connection only).
    public var content: Content { didSet { isChanged = true } }
    /// Whether a processor changed the channel or the content: unchanged events keep their shared encoding.
    package private(set) var isChanged = false

    package init(connection: ConnectionContext, channel: String, kind: OutboundKind, method: String?,
         elapsed: Duration?, content: Content) {
        self.connection = connection
        self.channel = channel
        self.kind = kind
        self.method = method
        self.elapsed = elapsed
        self.content = content
    }
}

/// What an outbound processor decides.
public enum OutboundDecision: Sendable {
    /// Write it (as the processor left it).
    case pass
    /// Do not write it: counted as `eventsDropped.plugin` (an answer dropped this way becomes an ERROR
    /// `plugin_error`, since every request gets one answer).
    case drop
}

/// Sees replies and events on their way out, per destination connection.
///
/// Which events a processor sees is decided when a stream starts, from ``scope`` and
/// ``applies(to:channel:)``: streams that no processor applies to deliver the one shared encoding of each
/// event, at no cost per event.
public protocol OutboundProcessor: Sendable {
    /// The traffic it sees (all of it by default).
    var scope: Scope<OutboundKind> { get }
    /// Whether it sees `connection`'s traffic on `channel` at all: asked once per stream and per request.
    func applies(to connection: ConnectionContext, channel: String) -> Bool
    /// Passes, changes or drops one reply or event. A thrown error drops it (see ``OutboundDecision/drop``).
    func process(_ message: inout OutboundMessage) throws -> OutboundDecision
}

extension OutboundProcessor {
    public var scope: Scope<OutboundKind> { Scope() }
    public func applies(to connection: ConnectionContext, channel: String) -> Bool { true }
}
