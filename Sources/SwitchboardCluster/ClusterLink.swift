import Logging
import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// A node's end of the cluster (protocol/cluster.md). Loop thread only.
///
/// - Broadcasts: an event goes to the bus once, as the very wire frame local listeners get, on its
///   channel's subject; the node subscribes to a channel's subject while it has listeners on it.
/// - Calls to channels held on other nodes: a request goes to the holders' queue group, its answer
///   comes back to this node's answers subject, and a CANCEL follows it to every holder. Calls and
///   answers travel in batches: those made in one loop turn for one subject share one bus message.
/// - Liveness: every node sends a beacon four times a second, naming the calls it is working on for
///   each other node. A call no beacon has named for ``leaseMs`` is over (`handler_gone`), and so is a
///   node no beacon came from for as long (a `kill -9`, a stopped process, a lost bus connection).
///
/// It works on bytes and ids; the server's adapter (SwitchboardServer's ClusterAdapter.swift and
/// Elsewhere.swift) maps its requests, answers and events. Here: the state and its lifecycle; the
/// jobs are in ClusterSubjects.swift (subjects and batches), ClusterCalls.swift, ClusterEvents.swift,
/// ClusterBeacons.swift (beacons, leases, peers) and ClusterStats.swift.
package final class ClusterLink {
    /// This node's name, as the stats show it.
    package let node: String
    let bus: any ClusterBus
    /// This node's id on the bus: random, so that two nodes never share one (their names may); 15 hex
    /// digits at most, so that Swift keeps it inline.
    let instance = String(UInt64.random(in: 1..<(1 << 60)), radix: 16)
    static let beaconIntervalMs: UInt64 = 250
    static let leaseMs: UInt64 = 1500
    let loop: EventLoop
    let logger: Logger
    let beaconTimer: Timer
    /// When the last beacon went, and how often the loop stalled past a lease between two (a stopped
    /// or starved process: the other nodes took this one for gone, and NATS may have dropped its
    /// connection as a slow consumer).
    var lastTick: UInt64 = 0
    var stalls = 0
    /// Whether the last beacon ran late and left the leases to this one.
    var judgingDeferred = false

    // MARK: State: broadcasts

    /// Channels with local listeners: how many, and the subscription.
    var listenerCounts: [String: Int] = [:]
    var subscriptions: [String: BusSubscription] = [:]
    /// The digest of each channel name used on the bus, and the subjects made of it: made once, so that
    /// a broadcast or a call builds no string (and the bus's check of a repeated subject stays cheap).
    /// A client may route any number of names here (a send to a name nobody holds goes to the bus), so
    /// the cache is bounded: once its names and strings would pass ``subjectCacheBytes``, it is emptied
    /// and fills again with the names in use; a name larger than that is never kept.
    var digests: [String: String] = [:]
    var subjects: [SubjectKey: String] = [:]
    /// What each channel held elsewhere is, as the holders' answers and beacons last told: the mark of
    /// its method codec, or `-` for another kind (``channelMark(methodCodec:)``). It gives the form of the
    /// `cancelled` answer this node gives for a call whose holder's node never answered the cancel, even
    /// a call no beacon named. Bounded on its own (``channelMarkBytes``), not with the subjects: any
    /// client can empty that cache by calling names nobody holds, but only held channels fill this one.
    var channelMarks: [String: Character] = [:]
    var channelMarkBytes = 0
    static let channelMarkCacheBytes = 2 << 20
    var cachedSubjectBytes = 0
    static let subjectCacheBytes = 2 << 20
    enum SubjectKind: String { case event, call, cancel }
    struct SubjectKey: Hashable {
        let kind: SubjectKind
        let channel: String
    }
    /// Broadcasts sent to the bus, and remote ones handed to local listeners.
    var eventsOut = 0, eventsIn = 0
    /// Broadcasts that did not go out (a value with no wire form, a frame over NATS's max_payload, no
    /// bus connection, the bus's send queue full), and messages on an event subject that were not such
    /// a frame for that channel.
    var eventsUnsent = 0, eventsMalformed = 0
    /// Events this node sent on each channel, numbered (`Sb-Seq`), so that a node that listens sees a
    /// gap where the bus lost some: a dead connection's unflushed messages, which no sender can count.
    /// Kept in the bounded cache of subjects; emptied with it, the numbers start again, which a
    /// receiver takes for a new start, not a gap.
    var sentCounts: [String: UInt64] = [:]
    /// The last number received from each node that sent on a channel this node listens on, by sender
    /// and channel. A node that goes silent keeps its numbers: a bus outage makes every node seem gone,
    /// and what the bus lost then shows as a gap once they are back. At most ``numberedSenders``.
    var receivedNumbers: [String: [String: UInt64]] = [:]
    static let numberedSenders = 1024
    /// Events from other nodes that never arrived: the gaps in their numbers.
    var eventsMissed = 0
    /// Broadcasts that a sibling loop had no room for (its listeners missed them).
    package var loopEventsDropped = 0
    /// Where remote events go: the channel, the envelope (nil: the end of the stream), the whole
    /// frame, and the node that sent it when the event came from a holder (nil: a broadcast).
    package var onEvent: ((_ channel: String, _ envelope: [UInt8]?, _ frame: [UInt8], _ holderNode: String?) -> Void)?

    // MARK: State: calls to other nodes

    /// A call this node sent to another node's holder, waiting for its answer.
    struct OutgoingCall {
        let channel: String
        let completion: (CallOutcome) -> Void
        /// When it was sent, or last named in the beacon of the node working on it.
        var renewedAt: UInt64
        /// When its caller cancelled it: from then on beacons renew it no more, so that a cancel the
        /// holder's node never heard still ends it within a lease.
        var cancelledAt: UInt64?
        /// What its channel is (``channelMarks``), as known when it was sent or told since: the form of
        /// the `cancelled` answer this node gives if the holder's node does not answer the cancel.
        var channelMark: Character?
    }
    var outgoing: [UInt64: OutgoingCall] = [:]
    var nextCall: UInt64 = 0
    var callsOut = 0, callsExpired = 0, callsNoResponders = 0
    /// Calls from other nodes refused here because their node refused the caller their kind.
    package var callsForbidden = 0

    /// What a call's payload holds (the kind of its batch record).
    package enum CallInput: UInt8, Sendable {
        /// A binary MESSAGE payload as it is (`b`); a MESSAGE without payload (`n`).
        case bytes = 0x62, empty = 0x6E
        /// A text-mode call (`{"method":…,"args":…}`, `c`) or send (`m`), as JSON.
        case call = 0x63, message = 0x6D
        /// One of the caller node's listeners left the stream (`l`): the cancel's arguments, as JSON.
        case leave = 0x6C
    }
    /// A call record's flag: the caller speaks text mode.
    package static let textFlag: UInt8 = 1
    /// A call record's flags past ``textFlag``: the kinds (the server's bits of call, send and
    /// listen, shifted by one) the caller's node refused the caller, for a request whose kind only the
    /// holder's node can tell. That node answers `forbidden` if the request is one of them.
    package static func flags(refusing kinds: UInt8) -> UInt8 { (kinds & 0b111) << 1 }
    /// The headers naming this node: `Sb-Caller` on its calls and cancels, `Sb-Node` on its answers and
    /// its holders' events.
    let callerHeaders: [BusMessage.Header], nodeHeaders: [BusMessage.Header]
    /// On a loop of a server with several: the mark of its process on the broadcasts it publishes.
    var siblingsMark: BusMessage.Header?
    /// The headers of a broadcast: the mark, if any.
    var siblingHeaders: [BusMessage.Header] = []
    /// The headers of this node's beacons: the mark of its server's process, which a session token
    /// names, so that the other nodes can tell a token of a live node from one of a process that is gone.
    package var beaconHeaders: [BusMessage.Header] = []

    /// How a call to another node ended.
    package enum CallOutcome {
        case reply(ClusterReply)
        /// Nobody on any node holds the channel (NATS's no-responders), or the bus is disconnected.
        case noHolder
        /// The node working on it stopped naming it in its beacons, or went silent.
        case expired
        /// Its caller cancelled it, and no answer came within a lease of the cancel: the `cancelled`
        /// answer is in the error envelope of the method codec its channel's mark names
        /// (``ServedCall/channelMark``), when one is known.
        case cancelled(mark: Character?)
    }

    // MARK: State: batches

    /// The calls and answers made since the batches last went out, in the order their batches were
    /// opened: calls in a batch for each subject, answers in a batch for each calling node. They go out
    /// at the end of the loop turn (``flush()``), or before the link sends anything else, so that a
    /// CANCEL never passes its call nor an event the answer that started its stream. A batch that
    /// would grow past ``batchRoom`` is left as it is, and a new one opened behind it.
    var batches: [Batch] = []
    /// The batch each key adds to, and the one used last (most calls of a turn go to one channel).
    var openBatches: [BatchKey: Int] = [:]
    var lastBatch: Int?
    enum BatchKey: Hashable {
        /// Calls on `channel` to its holders' queue group, or (`node`) to one node.
        case calls(channel: String, node: String?)
        /// Answers to calls of node `caller`.
        case answers(caller: String)
    }
    struct Batch {
        let key: BatchKey
        let subject: String
        var records: [UInt8] = []
        /// The calls in it that want an answer.
        var ids: [UInt64] = []
    }
    /// The calls of each batch sent with a reply subject, for NATS's no-responders status (503) on it,
    /// until none of them is open (swept when the table doubles).
    var batchCalls: [UInt64: [UInt64]] = [:]
    var nextBatch: UInt64 = 0
    var batchSweepAt = 64
    /// Batches of calls or answers that named no node or were not whole records: dropped, so their
    /// callers' calls lapse.
    var batchesMalformed = 0
    var isClosed = false
    /// The records past which a new batch is opened (a record larger alone goes alone), unless the bus
    /// carries less.
    static let batchLimit = 64 << 10
    /// Room kept for a batch's header block (`Sb-Caller` or `Sb-Node` takes 40 bytes at most).
    static let headerRoom = 64
    /// The records past which a new batch is opened: ``batchLimit``, or less if the bus carries less.
    var batchRoom: Int { min(Self.batchLimit, recordRoom) }
    /// The largest payload a record can carry: what the bus carries, and what its 4-byte length says.
    package var recordRoom: Int { min(bus.maxPayload - Self.headerRoom, Int(UInt32.max)) - BatchRecord.headerSize }

    // MARK: State: calls from other nodes

    /// A call from another node's client to a channel held here: one record of a batch.
    package struct IncomingCall: Sendable {
        /// The calling node's instance.
        package let caller: String
        /// The caller's id for it; nil when it wants no answer.
        package let id: UInt64?
        /// What the payload holds; nil for a kind this node does not know.
        package let input: CallInput?
        package let isText: Bool
        /// The kinds (the server's bits) the caller's node refused this request, were it one of them.
        package let refusedKinds: UInt8
        /// A slice of the batch: copied by whatever keeps it.
        package let payload: ArraySlice<UInt8>

        /// Where its answer goes; nil when it wants none.
        package var key: CallKey? { id.map { CallKey(caller: caller, id: $0) } }

        package init(caller: String, id: UInt64?, input: CallInput?, isText: Bool, refusedKinds: UInt8, payload: ArraySlice<UInt8>) {
            self.caller = caller
            self.id = id
            self.input = input
            self.isText = isText
            self.refusedKinds = refusedKinds
            self.payload = payload
        }
    }
    /// A call from another node, as its answer names it: the calling node's instance and its id.
    package struct CallKey: Hashable, Sendable {
        package let caller: String
        package let id: UInt64

        package init(caller: String, id: UInt64) {
            self.caller = caller
            self.id = id
        }
    }
    /// Calls from other nodes being worked on here, named in every beacon until answered.
    var served: [CallKey: any ServedCall] = [:]
    var callsIn = 0
    /// Channels held here: their subscriptions (calls, while calls are taken; cancels), and the name
    /// of each digest.
    var held: [String: (calls: BusSubscription?, cancels: BusSubscription?)] = [:]
    var heldByDigest: [String: String] = [:]
    /// Where calls from other nodes go, and who hears that one of them was answered (the drain of a
    /// shutdown waits for them as for its own clients' requests).
    package var onCalls: ((_ channel: String, _ calls: [IncomingCall]) -> Void)?
    package var onServedAnswered: (() -> Void)?
    /// Calls from other nodes being worked on here.
    package var servingCount: Int { served.count }

    // MARK: State: other nodes

    struct Peer {
        var lastSeen: UInt64
        var name = ""
        var held = 0
        /// The mark of its server's process, as its beacons tell it (``beaconHeaders``).
        var process: String?
    }
    var peers: [String: Peer] = [:]
    /// A node whose beacons stopped (it was seen, by beacon or answer, then nothing for ``leaseMs``).
    package var onPeerLost: ((String) -> Void)?
    /// This node's listeners of channels held elsewhere, for its beacons: the holder's node, the
    /// channel, and how many.
    package var listenersToReport: (() -> [(holderNode: String, channel: String, count: Int)])?
    /// Another node's beacon told how many listeners it has on each channel held here (channels it has
    /// none on are missing).
    package var onListenerReport: ((_ node: String, _ counts: [String: Int]) -> Void)?
    var peersLost = 0

    /// A node of a NATS cluster, over a NATS connection made with `options` (echo off: a node's own
    /// broadcasts have reached its listeners already). On a loop of a server with several, its
    /// broadcasts are marked with `process` (the same on every loop of the server) for the sibling
    /// loops to pass over: they had them in-process, whatever the bus's state.
    package convenience init(options: NATSBus.Options, node: String, process: String?, eventLoop loop: EventLoop,
                             logger: Logger) throws(UVError) {
        var options = options
        options.echo = false
        var logger = logger
        logger[metadataKey: "node"] = "\(node)"
        let bus = try NATSBus(loop: loop, options: options, logger: logger)
        bus.onConnectionChange = { connected in
            if connected { logger.notice("cluster bus connected") } else { logger.warning("cluster bus lost its connection") }
        }
        try self.init(bus: bus, node: node, loop: loop, logger: logger)
        if let process {
            siblingsMark = .init("Sb-Process", process)
            siblingHeaders = [.init("Sb-Process", process)]
        }
    }

    /// A link over `bus`.
    package init(bus: any ClusterBus, node: String, loop: EventLoop, logger: Logger) throws(UVError) {
        self.node = node
        self.bus = bus
        self.loop = loop
        self.logger = logger
        beaconTimer = try Timer(loop: loop)
        callerHeaders = [.init("Sb-Caller", instance)]
        nodeHeaders = [.init("Sb-Node", instance)]
        // Subjects are checked here once: these are made of hex digits and fixed words.
        _ = try? bus.subscribe("switchboard.answers.\(instance)", queue: nil) { [unowned self] message in answered(message) }
        _ = try? bus.subscribe("switchboard.reply.\(instance).*", queue: nil) { [unowned self] message in unheard(message) }
        _ = try? bus.subscribe("switchboard.node.\(instance).call.*", queue: nil) { [unowned self] message in
            guard let digest = message.subject.split(separator: ".").last else { return }
            incoming(message, on: heldByDigest[String(digest)])  // no longer held here: no handler, at once
        }
        _ = try? bus.subscribe("switchboard.beacon", queue: nil) { [unowned self] message in beacon(message) }
    }

    /// The bus and the timer call back into this link: they never outlive it (a link that was never
    /// closed stops its timer here).
    deinit { beaconTimer.cancel() }

    package func start() {
        bus.start()
        lastTick = loop.now
        beaconTimer.start(after: Self.beaconIntervalMs, repeat: Self.beaconIntervalMs) { [unowned self] in tick() }
    }

    /// Sends the batches made this turn and writes what the bus holds: the server calls it at the end
    /// of every loop turn, after its connections' writes (which may let more requests in).
    package func flush() {
        sendBatches()
        bus.flush()
    }

    /// Stops for good: nothing more goes out or comes in, and no completion runs (the server answers
    /// what is open as it shuts down).
    package func close() {
        if bus.isConnected { flush() }  // the last turn's answers (a shutdown's going_away), as far as they can still go
        isClosed = true
        beaconTimer.cancel()
        batches = []
        openBatches = [:]
        lastBatch = nil
        batchCalls = [:]
        bus.close()
        subscriptions = [:]
        receivedNumbers = [:]
        listenerCounts = [:]
        outgoing = [:]
        served = [:]
        held = [:]
        onEvent = nil
        onCalls = nil
        onPeerLost = nil
        onServedAnswered = nil
        listenersToReport = nil
        onListenerReport = nil
    }

}
