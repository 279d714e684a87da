import SwitchboardCluster
import SwitchboardCodec
import SwitchboardTransport

/// Everything a ``Server`` can be told at start-up. Times are in milliseconds.
public struct ServerConfiguration: Sendable {
    /// Address to listen on.
    public var host = "127.0.0.1"
    /// Port to listen on; 0 picks a free one.
    public var port = 7420
    /// Largest frame (or text line) accepted, in bytes; at most 1 GiB.
    public var maxFrame: UInt32 = 16 << 20
    /// Bytes the server may hold queued for one connection before events wait and the slow-consumer clock starts.
    public var outboundLimit = 8 << 20
    /// How long a connection may stay over ``outboundLimit`` before it is closed as a slow consumer.
    public var slowConsumerGraceMs: UInt64 = 5000
    /// Interval of server PINGs to binary connections; 0 = no heartbeat.
    public var heartbeatMs: UInt64 = 0
    /// A token clients must present in HELLO; nil = none required.
    public var token: String?
    /// How long shutdown waits for in-flight requests; also how long a client that closed its sending
    /// side waits for answers before its open requests are cancelled.
    public var drainTimeoutMs: UInt64 = 5000
    /// Default per-listener queue length of event channels; also the bound on events a producer thread
    /// may have in flight to the loop per channel (``EventChannel/broadcast(_:)``) or per listener
    /// (``EventSink``).
    public var eventQueueLimit = 1024
    /// Channels one connection may hold by REGISTER at once; past it, REGISTER gets `too_many_registrations`.
    public var maxRegistrationsPerConnection = 1000
    /// Requests one connection may have open (sent and not yet answered) at once; past it, a request
    /// gets `too_many_requests`. At least 1.
    public var maxOpenRequests = 4096
    /// TLS on a port of its own, beside the plain port; nil = none.
    public var tls: TLSSettings?
    /// Serve `GET /healthz` and `GET /metrics` on the ports (wire-v1 section 8); WebSocket upgrades are
    /// served either way.
    public var httpEndpoints = true
    /// Browser origins allowed to open a WebSocket besides the server's own (`*` matches any run of
    /// characters; `["*"]`: any); nil = only an `Origin` that matches the request's `Host`.
    public var webSocketOrigins: [String]?
    /// Where the counters go, and what `GET /metrics` serves: a Prometheus registry of the server's own.
    public var metrics = MetricsSettings.prometheus()
    /// Other nodes to share broadcasts with, over NATS (protocol/cluster.md); nil = a node on its own.
    public var cluster: ClusterSettings?
    /// Event loops, each a thread of its own serving a share of the connections (docs/scaling-and-cluster.md).
    /// Handlers run on the loop of the connection that called them, so with more than one loop the same
    /// handler may run on several threads at once. In a cluster, each loop is a node of its own. At least
    /// 1; a driven server (``Server/startDriven()``, `EmbeddedServer`) runs exactly 1.
    public var loops = 1
    /// How long a new connection has to complete its first frame, line or HTTP request head (a TLS
    /// handshake included); 0 = no limit. Only the first is timed: a client may then stay idle.
    public var firstFrameTimeoutMs: UInt64 = 10_000
    /// How long a frame, line or HTTP request head (or a TLS record or WebSocket frame carrying one)
    /// may stay unfinished once it has begun, unless 64 KiB more of it arrive within that time (a large
    /// frame on a slow link goes on); 0 = no limit.
    public var frameTimeoutMs: UInt64 = 10_000
    /// Connections served at once, over every port and loop; more are closed as soon as they are
    /// accepted (counted in `closes.overConnectionLimit`). Lowered at start to the descriptor limit
    /// less 64 (a quarter of a smaller limit), as Redis lowers `maxclients`.
    public var maxConnections = 10_000
    /// Connections served at once from one remote address (counted in `closes.overAddressLimit`);
    /// loopback addresses are exempt unless ``capsLoopback`` is set.
    public var maxConnectionsPerAddress = 256
    /// Whether ``maxConnectionsPerAddress`` applies to loopback addresses too. Off by default: behind a
    /// reverse proxy on the same host every client comes from loopback.
    public var capsLoopback = false
    /// How long a resumable session stays parked once its connection is lost (protocol/resumption.md);
    /// 0 = no session is granted.
    public var sessionTTLMs: UInt64 = 60_000
    /// Bytes a session may keep for its client: what was sent and not acknowledged, and what was made while parked.
    public var sessionBytes = 1 << 20
    /// Sessions parked at once, each loop parking its share (and ended sessions whose reason is remembered).
    public var maxParkedSessions = 1000

    /// The defaults of wire-v1.
    public init() {}

    /// The defaults of ``init()``, made once for the default arguments below.
    @usableFromInline static let defaults = ServerConfiguration()

    /// Any settings by name, the others at their defaults (those of ``init()``, made once, which each
    /// default argument reads; the metrics get a registry of their own): `ServerConfiguration(port: 0, loops: 4)`.
    public init(host: String = Self.defaults.host, port: Int = Self.defaults.port, maxFrame: UInt32 = Self.defaults.maxFrame,
                outboundLimit: Int = Self.defaults.outboundLimit, slowConsumerGraceMs: UInt64 = Self.defaults.slowConsumerGraceMs,
                heartbeatMs: UInt64 = Self.defaults.heartbeatMs, token: String? = nil, drainTimeoutMs: UInt64 = Self.defaults.drainTimeoutMs,
                eventQueueLimit: Int = Self.defaults.eventQueueLimit,
                maxRegistrationsPerConnection: Int = Self.defaults.maxRegistrationsPerConnection,
                maxOpenRequests: Int = Self.defaults.maxOpenRequests, tls: TLSSettings? = nil, httpEndpoints: Bool = Self.defaults.httpEndpoints,
                webSocketOrigins: [String]? = nil, metrics: MetricsSettings = .prometheus(), cluster: ClusterSettings? = nil,
                loops: Int = Self.defaults.loops, firstFrameTimeoutMs: UInt64 = Self.defaults.firstFrameTimeoutMs,
                frameTimeoutMs: UInt64 = Self.defaults.frameTimeoutMs, maxConnections: Int = Self.defaults.maxConnections,
                maxConnectionsPerAddress: Int = Self.defaults.maxConnectionsPerAddress, capsLoopback: Bool = Self.defaults.capsLoopback,
                sessionTTLMs: UInt64 = Self.defaults.sessionTTLMs, sessionBytes: Int = Self.defaults.sessionBytes,
                maxParkedSessions: Int = Self.defaults.maxParkedSessions) {
        self.host = host
        self.port = port
        self.maxFrame = maxFrame
        self.outboundLimit = outboundLimit
        self.slowConsumerGraceMs = slowConsumerGraceMs
        self.heartbeatMs = heartbeatMs
        self.token = token
        self.drainTimeoutMs = drainTimeoutMs
        self.eventQueueLimit = eventQueueLimit
        self.maxRegistrationsPerConnection = maxRegistrationsPerConnection
        self.maxOpenRequests = maxOpenRequests
        self.tls = tls
        self.httpEndpoints = httpEndpoints
        self.webSocketOrigins = webSocketOrigins
        self.metrics = metrics
        self.cluster = cluster
        self.loops = loops
        self.firstFrameTimeoutMs = firstFrameTimeoutMs
        self.frameTimeoutMs = frameTimeoutMs
        self.maxConnections = maxConnections
        self.maxConnectionsPerAddress = maxConnectionsPerAddress
        self.capsLoopback = capsLoopback
        self.sessionTTLMs = sessionTTLMs
        self.sessionBytes = sessionBytes
        self.maxParkedSessions = maxParkedSessions
    }
}

/// The server's TLS port (wire-v1 section 8): the same connections as on the plain port, inside TLS.
public struct TLSSettings: Sendable {
    /// The certificate, key and (for mutual TLS) client CAs.
    public var context: TLSContext
    /// Port to listen on; 0 picks a free one.
    public var port: Int
    /// How long a client has to finish the handshake.
    public var handshakeTimeoutMs: UInt64

    public init(context: TLSContext, port: Int = 7421, handshakeTimeoutMs: UInt64 = 10_000) {
        self.context = context
        self.port = port
        self.handshakeTimeoutMs = handshakeTimeoutMs
    }
}

/// Identifies one connected client for server-initiated calls and messages.
public struct ClientID: Hashable, Sendable, CustomStringConvertible {
    /// The connection's serial number.
    public let rawValue: UInt64
    init(_ rawValue: UInt64) { self.rawValue = rawValue }
    public var description: String { "client#\(rawValue)" }
}

/// What happens to an event that must wait while its listener's queue is full.
public enum OverflowPolicy: Sendable {
    /// Drop the oldest waiting event (the default).
    case dropOldest
    /// Drop the new event.
    case dropNewest
    /// Keep only the newest event: a new one replaces whatever waits.
    case keepLatest
}

/// Why a server-initiated call or message got no value back.
public enum InvokeError: Error, Equatable, Sendable {
    /// The client answered with an error envelope.
    case error(ChannelError)
    /// The client has no handler for the channel or method (a null reply).
    case notImplemented
    /// The client disconnected (or was never connected) before answering.
    case disconnected
    /// The client's session (protocol/resumption.md) has no room to keep the request: the client is away
    /// or has not acknowledged what it was sent. The request was not sent.
    case noRoom
    /// The reply's bytes could not be decoded, or the message could not be encoded.
    case codec(CodecError)
    /// Text-mode clients cannot be called by the server.
    case textClient
}

/// Joins a ``Server`` to other Switchboard nodes over NATS (protocol/cluster.md).
public struct ClusterSettings: Sendable {
    /// The NATS servers to connect to, tried in turn.
    public var servers: [NATSBus.Server]
    /// This node's name, as NATS and the stats show it.
    public var node: String
    /// How long a connection attempt may take before the next server is tried: a server that accepts
    /// but never answers (a stopped process) must not hold the node.
    public var connectTimeoutMs: UInt64 = 2000
    /// How often the node pings its NATS server: two pings unanswered in a row mark the connection dead.
    public var pingIntervalMs: UInt64 = 1000

    /// Joins the cluster through `servers` (tried in turn) as `node`, with the default timeouts.
    public init(servers: [NATSBus.Server], node: String) {
        self.servers = servers
        self.node = node
    }
}
