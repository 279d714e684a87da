import Logging
import SwitchboardCluster
import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

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

    public init(servers: [NATSBus.Server], node: String) {
        self.servers = servers
        self.node = node
    }
}

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
final class ClusterLink {
    /// This node's name, as the stats show it.
    let node: String
    let bus: any ClusterBus
    /// This node's id on the bus: random, so that two nodes never share one (their names may); 15 hex
    /// digits at most, so that Swift keeps it inline.
    let instance = String(UInt64.random(in: 1..<(1 << 60)), radix: 16)
    static let beaconIntervalMs: UInt64 = 250
    static let leaseMs: UInt64 = 1500
    private let loop: EventLoop
    private let logger: Logger
    private let beaconTimer: Timer?
    /// Whether this link joins nodes (with liveness), not the loops of one server.
    private let joinsNodes: Bool
    /// When the last beacon went, and how often the loop stalled past a lease between two (a stopped
    /// or starved process: the other nodes took this one for gone, and NATS may have dropped its
    /// connection as a slow consumer).
    private var lastTick: UInt64 = 0
    private(set) var stalls = 0
    /// Whether the last beacon ran late and left the leases to this one.
    private var judgingDeferred = false

    // MARK: State: broadcasts

    /// Channels with local listeners: how many, and the subscription.
    private var listenerCounts: [String: Int] = [:]
    private var subscriptions: [String: BusSubscription] = [:]
    /// The digest of each channel name used on the bus, and the subjects made of it: made once, so that
    /// a broadcast or a call builds no string (and the bus's check of a repeated subject stays cheap).
    /// A client may route any number of names here (a send to a name nobody holds goes to the bus), so
    /// the cache is bounded: once its names and strings would pass ``subjectCacheBytes``, it is emptied
    /// and fills again with the names in use; a name larger than that is never kept.
    private var digests: [String: String] = [:]
    private var subjects: [SubjectKey: String] = [:]
    /// What each channel held elsewhere is, as the holders' answers and beacons last told: the mark of
    /// its method codec, or `-` for another kind (``channelMark(methodCodec:)``). It gives the form of the
    /// `cancelled` answer this node gives for a call whose holder's node never answered the cancel, even
    /// a call no beacon named. Bounded on its own (``channelMarkBytes``), not with the subjects: any
    /// client can empty that cache by calling names nobody holds, but only held channels fill this one.
    private var channelMarks: [String: Character] = [:]
    private var channelMarkBytes = 0
    static let channelMarkCacheBytes = 2 << 20
    private(set) var cachedSubjectBytes = 0
    static let subjectCacheBytes = 2 << 20
    private enum SubjectKind: String { case event, call, cancel }
    private struct SubjectKey: Hashable {
        let kind: SubjectKind
        let channel: String
    }
    /// Broadcasts sent to the bus, and remote ones handed to local listeners.
    private(set) var eventsOut = 0, eventsIn = 0
    /// Broadcasts that did not go out (a value with no wire form, a frame over NATS's max_payload, no
    /// bus connection, the bus's send queue full), and messages on an event subject that were not such
    /// a frame for that channel.
    private(set) var eventsUnsent = 0, eventsMalformed = 0
    /// Events this node sent on each channel, numbered (`Sb-Seq`), so that a node that listens sees a
    /// gap where the bus lost some: a dead connection's unflushed messages, which no sender can count.
    /// Only between nodes: the loops of one server lose nothing uncounted between them.
    /// Kept in the bounded cache of subjects; emptied with it, the numbers start again, which a
    /// receiver takes for a new start, not a gap.
    private var sentCounts: [String: UInt64] = [:]
    /// The last number received from each node that sent on a channel this node listens on, by sender
    /// and channel. A node that goes silent keeps its numbers: a bus outage makes every node seem gone,
    /// and what the bus lost then shows as a gap once they are back. At most ``numberedSenders``.
    private var receivedNumbers: [String: [String: UInt64]] = [:]
    static let numberedSenders = 1024
    /// Events from other nodes that never arrived: the gaps in their numbers.
    private(set) var eventsMissed = 0
    /// Where remote events go: the channel, the envelope (nil: the end of the stream), the whole
    /// frame, and the node that sent it when the event came from a holder (nil: a broadcast).
    var onEvent: ((_ channel: String, _ envelope: [UInt8]?, _ frame: [UInt8], _ holderNode: String?) -> Void)?

    // MARK: State: calls to other nodes

    /// A call this node sent to another node's holder, waiting for its answer.
    private struct OutgoingCall {
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
    private var outgoing: [UInt64: OutgoingCall] = [:]
    private var nextCall: UInt64 = 0
    private(set) var callsOut = 0, callsExpired = 0, callsNoResponders = 0
    /// Calls from other nodes refused here because their node refused the caller their kind.
    var callsForbidden = 0

    /// What a call's payload holds (the kind of its batch record).
    enum CallInput: UInt8 {
        /// A binary MESSAGE payload as it is (`b`); a MESSAGE without payload (`n`).
        case bytes = 0x62, empty = 0x6E
        /// A text-mode call (`{"method":…,"args":…}`, `c`) or send (`m`), as JSON.
        case call = 0x63, message = 0x6D
        /// One of the caller node's listeners left the stream (`l`): the cancel's arguments, as JSON.
        case leave = 0x6C
    }
    /// A call record's flag: the caller speaks text mode.
    static let textFlag: UInt8 = 1
    /// A call record's flags past ``textFlag``: the kinds (``InboundKind/bit`` of call, send and
    /// listen, shifted by one) the caller's node refused the caller, for a request whose kind only the
    /// holder's node can tell. That node answers `forbidden` if the request is one of them.
    static func flags(refusing kinds: UInt8) -> UInt8 { (kinds & 0b111) << 1 }
    /// The headers naming this node: `Sb-Caller` on its calls and cancels, `Sb-Node` on its answers and
    /// its holders' events.
    private let callerHeaders: [BusMessage.Header], nodeHeaders: [BusMessage.Header]
    /// On a loop of a server with several: the mark of its process on the broadcasts it publishes.
    private var siblingsMark: BusMessage.Header?
    /// The headers of a broadcast: the mark, if any.
    private var siblingHeaders: [BusMessage.Header] = []

    /// How a call to another node ended.
    enum CallOutcome {
        case reply(RemoteReply)
        /// Nobody on any node holds the channel (NATS's no-responders), or the bus is disconnected.
        case noHolder
        /// The node working on it stopped naming it in its beacons, or went silent.
        case expired
        /// Its caller cancelled it, and no answer came within a lease of the cancel: the `cancelled`
        /// answer is in the error envelope of the channel's method codec, when one is known.
        case cancelled(methodCodec: (any MethodCodec)?)
    }

    // MARK: State: batches

    /// The calls and answers made since the batches last went out, in the order their batches were
    /// opened: calls in a batch for each subject, answers in a batch for each calling node. They go out
    /// at the end of the loop turn (``flush()``), or before the link sends anything else, so that a
    /// CANCEL never passes its call nor an event the answer that started its stream. A batch that
    /// would grow past ``batchRoom`` is left as it is, and a new one opened behind it.
    private var batches: [Batch] = []
    /// The batch each key adds to, and the one used last (most calls of a turn go to one channel).
    private var openBatches: [BatchKey: Int] = [:]
    private var lastBatch: Int?
    private enum BatchKey: Hashable {
        /// Calls on `channel` to its holders' queue group, or (`node`) to one node.
        case calls(channel: String, node: String?)
        /// Answers to calls of node `caller`.
        case answers(caller: String)
    }
    private struct Batch {
        let key: BatchKey
        let subject: String
        var records: [UInt8] = []
        /// The calls in it that want an answer.
        var ids: [UInt64] = []
    }
    /// The calls of each batch sent with a reply subject, for NATS's no-responders status (503) on it,
    /// until none of them is open (swept when the table doubles).
    private var batchCalls: [UInt64: [UInt64]] = [:]
    private var nextBatch: UInt64 = 0
    private var batchSweepAt = 64
    /// Batches of calls or answers that named no node or were not whole records: dropped, so their
    /// callers' calls lapse.
    private(set) var batchesMalformed = 0
    private var isClosed = false
    /// The records past which a new batch is opened (a record larger alone goes alone), unless the bus
    /// carries less.
    static let batchLimit = 64 << 10
    /// Room kept for a batch's header block (`Sb-Caller` or `Sb-Node` takes 40 bytes at most).
    private static let headerRoom = 64
    /// The records past which a new batch is opened: ``batchLimit``, or less if the bus carries less.
    private var batchRoom: Int { min(Self.batchLimit, recordRoom) }
    /// The largest payload a record can carry: what the bus carries, and what its 4-byte length says.
    private var recordRoom: Int { min(bus.maxPayload - Self.headerRoom, Int(UInt32.max)) - BatchRecord.headerSize }

    // MARK: State: calls from other nodes

    /// A call from another node's client to a channel held here: one record of a batch.
    struct IncomingCall {
        /// The calling node's instance.
        let caller: String
        /// The caller's id for it; nil when it wants no answer.
        let id: UInt64?
        /// What the payload holds; nil for a kind this node does not know.
        let input: CallInput?
        let isText: Bool
        /// The kinds (``InboundKind/bit``) the caller's node refused this request, were it one of them.
        let refusedKinds: UInt8
        /// A slice of the batch: copied by whatever keeps it.
        let payload: ArraySlice<UInt8>

        /// Where its answer goes; nil when it wants none.
        var key: CallKey? { id.map { CallKey(caller: caller, id: $0) } }
    }
    /// A call from another node, as its answer names it: the calling node's instance and its id.
    struct CallKey: Hashable {
        let caller: String
        let id: UInt64
    }
    /// Calls from other nodes being worked on here, named in every beacon until answered.
    private var served: [CallKey: PendingRequest] = [:]
    private(set) var callsIn = 0
    /// Channels held here: their subscriptions (calls, while calls are taken; cancels), and the name
    /// of each digest.
    private(set) var held: [String: (calls: BusSubscription?, cancels: BusSubscription?)] = [:]
    private(set) var heldByDigest: [String: String] = [:]
    /// Where calls from other nodes go, and who hears that one of them was answered (the drain of a
    /// shutdown waits for them as for its own clients' requests).
    var onCalls: ((_ channel: String, _ calls: [IncomingCall]) -> Void)?
    var onServedAnswered: (() -> Void)?
    /// Calls from other nodes being worked on here.
    var servingCount: Int { served.count }

    // MARK: State: other nodes

    private struct Peer {
        var lastSeen: UInt64
        var name = ""
        var held = 0
    }
    private var peers: [String: Peer] = [:]
    /// A node whose beacons stopped (it was seen, by beacon or answer, then nothing for ``leaseMs``).
    var onPeerLost: ((String) -> Void)?
    /// This node's listeners of channels held elsewhere, for its beacons: the holder's node, the
    /// channel, and how many.
    var listenersToReport: (() -> [(holderNode: String, channel: String, count: Int)])?
    /// Another node's beacon told how many listeners it has on each channel held here (channels it has
    /// none on are missing).
    var onListenerReport: ((_ node: String, _ counts: [String: Int]) -> Void)?
    private(set) var peersLost = 0

    /// A node of a NATS cluster: the whole server, or (`loop`) one of its loops, whose broadcasts are
    /// marked with `process` (the same on every loop of the server) for the sibling loops to pass over:
    /// they had them in-process (``ServerCore/shareWithSiblingLoops(_:)``), whatever the bus's state.
    convenience init(settings: ClusterSettings, loop index: Int?, process: String, eventLoop loop: EventLoop, logger: Logger) throws(UVError) {
        var options = NATSBus.Options(servers: settings.servers, name: "switchboard \(settings.node)" + (index.map { " loop \($0)" } ?? ""))
        options.echo = false  // a node's own broadcasts have reached its listeners already
        options.connectTimeoutMs = settings.connectTimeoutMs
        options.pingIntervalMs = settings.pingIntervalMs
        var logger = logger
        logger[metadataKey: "node"] = "\(settings.node)"
        let bus = try NATSBus(loop: loop, options: options, logger: logger)
        bus.onConnectionChange = { connected in
            if connected { logger.notice("cluster bus connected") } else { logger.warning("cluster bus lost its connection") }
        }
        try self.init(bus: bus, node: settings.node, liveness: true, loop: loop, logger: logger)
        if index != nil {
            siblingsMark = .init("Sb-Process", process)
            siblingHeaders = [.init("Sb-Process", process)]
        }
    }

    /// A link over `bus`. Without `liveness` (the loops of one server, which stop together and lose
    /// nothing between them) no beacon goes out and no call or node lapses.
    init(bus: any ClusterBus, node: String, liveness: Bool, loop: EventLoop, logger: Logger) throws(UVError) {
        self.node = node
        self.bus = bus
        self.loop = loop
        self.logger = logger
        beaconTimer = liveness ? try Timer(loop: loop) : nil
        joinsNodes = liveness
        callerHeaders = [.init("Sb-Caller", instance)]
        nodeHeaders = [.init("Sb-Node", instance)]
        // Subjects are checked here once: these are made of hex digits and fixed words.
        _ = try? bus.subscribe("switchboard.answers.\(instance)", queue: nil) { [unowned self] message in answered(message) }
        _ = try? bus.subscribe("switchboard.reply.\(instance).*", queue: nil) { [unowned self] message in unheard(message) }
        _ = try? bus.subscribe("switchboard.node.\(instance).call.*", queue: nil) { [unowned self] message in
            guard let digest = message.subject.split(separator: ".").last else { return }
            incoming(message, on: heldByDigest[String(digest)])  // no longer held here: no handler, at once
        }
        if liveness { _ = try? bus.subscribe("switchboard.beacon", queue: nil) { [unowned self] message in beacon(message) } }
    }

    /// The bus and the timer call back into this link: they never outlive it (a link that was never
    /// closed stops its timer here).
    deinit { beaconTimer?.cancel() }

    func start() {
        bus.start()
        lastTick = loop.now
        beaconTimer?.start(after: Self.beaconIntervalMs, repeat: Self.beaconIntervalMs) { [unowned self] in tick() }
    }

    /// Sends the batches made this turn and writes what the bus holds: the server calls it at the end
    /// of every loop turn, after its connections' writes (which may let more requests in).
    func flush() {
        sendBatches()
        bus.flush()
    }

    /// Stops for good: nothing more goes out or comes in, and no completion runs (the server answers
    /// what is open as it shuts down).
    func close() {
        if bus.isConnected { flush() }  // the last turn's answers (a shutdown's going_away), as far as they can still go
        isClosed = true
        beaconTimer?.cancel()
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

    // MARK: Broadcasts

    /// Whether the bus is connected: what is published now can reach the other nodes.
    var isConnected: Bool { bus.isConnected }
    /// Broadcasts that a sibling loop had no room for (its listeners missed them).
    var loopEventsDropped = 0

    /// Sends a local event to the other nodes: a broadcast, or (`fromHolder`) an event of a channel a
    /// client holds here, for the listeners other nodes have through this node.
    func publish(_ event: OutboundEvent, fromHolder: Bool = false) {
        guard let frame = event.binaryFrame else { eventsUnsent += 1; return }  // no wire form: no listener got it either
        sendBatches()  // a listen's answer goes before the stream's first event
        let dropped = bus.counters.dropped
        // Numbered only between nodes; a number is used only by an event that left, so that what the
        // sender counts as unsent is never counted again as missed where it did not arrive.
        let number = joinsNodes ? (sentCounts[event.channel] ?? 0) &+ 1 : nil
        do {
            let subject = subject(.event, event.channel)
            var headers = fromHolder ? nodeHeaders : siblingHeaders
            if let number { headers.append(BusMessage.Header("Sb-Seq", "\(instance) \(number)")) }
            try bus.publish(subject, headers: headers, payload: frame)
        } catch {
            eventsUnsent += 1
            return
        }
        guard bus.counters.dropped == dropped else { eventsUnsent += 1; return }
        eventsOut += 1
        if let number { noteSent(number, on: event.channel) }
    }

    /// Events of a channel held here that a node's listeners missed because this node had forgotten
    /// them (``ServerCore/reconcileListeners(of:_:)``): counted as unsent.
    func countUnsent(_ events: Int) { eventsUnsent += events }

    /// `number` went out on `channel`: the next event there is `number + 1` (1 after the cache was emptied).
    private func noteSent(_ number: UInt64, on channel: String) {
        if sentCounts[channel] != nil || makeRoom(channel.utf8.count + 64) { sentCounts[channel] = number }
    }

    /// Takes the number of an event from another node on `channel` (`Sb-Seq: <n> <number>`): a gap
    /// since the last one from that node counts its events as missed; a smaller number is a new start
    /// (that node's cache was emptied) and counts nothing. Only a node this one knows (``peers``) starts
    /// being numbered: what anyone else on the bus makes up is neither kept nor counted. (After a stall
    /// or an outage, which forget every peer until its next beacon, the numbers kept go on.)
    private func noteNumber(_ mark: String, on channel: String) {
        let words = mark.split(separator: " ")
        guard words.count == 2, let number = UInt64(words[1]) else { return }
        let origin = String(words[0])
        let known = receivedNumbers[origin]?[channel]
        guard known != nil || peers[origin] != nil else { return }
        if let last = known, number > last {
            eventsMissed = min(eventsMissed + Int(min(number - last - 1, 1 << 32)), Self.missedCeiling)
        }
        if known == nil, receivedNumbers[origin] == nil, receivedNumbers.count >= Self.numberedSenders {
            receivedNumbers = [:]  // nodes long gone (each restart is a new instance): start again
        }
        receivedNumbers[origin, default: [:]][channel] = number
    }

    /// The most ``eventsMissed`` counts: far below `Int.max`, so that neither a gap a node makes up
    /// nor the sum of every loop's count in stats and metrics can trap.
    static let missedCeiling = 1 << 48

    /// Interest: a local listener joined `channel`; the first one subscribes to it.
    func listenerAdded(on channel: String) {
        listenerCounts[channel, default: 0] += 1
        guard listenerCounts[channel] == 1 else { return }
        subscriptions[channel] = try? bus.subscribe(subject(.event, channel), queue: nil) { [unowned self] message in
            received(message, on: channel)
        }
    }

    /// A local listener left `channel`; after the last one the node unsubscribes.
    func listenerRemoved(from channel: String) {
        guard let count = listenerCounts[channel] else { return }
        if count > 1 { listenerCounts[channel] = count - 1; return }
        listenerCounts.removeValue(forKey: channel)
        for origin in Array(receivedNumbers.keys) {  // what is sent while nobody here listens is not missed
            receivedNumbers[origin]?.removeValue(forKey: channel)
            if receivedNumbers[origin]?.isEmpty == true { receivedNumbers.removeValue(forKey: origin) }
        }
        if let subscription = subscriptions.removeValue(forKey: channel) { bus.unsubscribe(subscription) }
    }

    /// `switchboard.<kind>.<digest>`: a digest of the name, since a name may hold anything a subject may not.
    private func subject(_ kind: SubjectKind, _ channel: String) -> String {
        let key = SubjectKey(kind: kind, channel: channel)
        if let subject = subjects[key] { return subject }
        let subject = "switchboard.\(kind.rawValue).\(digest(channel))"
        if makeRoom(Self.cacheCost(channel, subject)) { subjects[key] = subject }
        return subject
    }

    /// The number after the last `.` of a subject (a batch's number in its reply subject).
    private static func lastNumber(of subject: String) -> UInt64? {
        guard let dot = subject.utf8.lastIndex(of: 0x2E) else { return nil }
        return UInt64(subject[subject.utf8.index(after: dot)...])
    }

    private func digest(_ channel: String) -> String {
        if let digest = digests[channel] { return digest }
        let digest = Digest.sha256Hex(Array(channel.utf8))
        if makeRoom(Self.cacheCost(channel, digest)) { digests[channel] = digest }
        return digest
    }

    /// What the cache counts for an entry: the name, the string made of it, and a dictionary slot's worth.
    private static func cacheCost(_ channel: String, _ made: String) -> Int { channel.utf8.count + made.utf8.count + 64 }

    /// Drops what ``hold(_:)`` cached for `channel` (its digest, its call and cancel subjects): a channel
    /// let go is mostly gone for good, and the names of a flood of them would stay cached, scattered
    /// through the heap.
    private func uncacheHeld(_ channel: String) {
        if let digest = digests.removeValueShrinking(forKey: channel) { cachedSubjectBytes -= Self.cacheCost(channel, digest) }
        for kind in [SubjectKind.call, .cancel] {
            if let subject = subjects.removeValueShrinking(forKey: SubjectKey(kind: kind, channel: channel)) {
                cachedSubjectBytes -= Self.cacheCost(channel, subject)
            }
        }
    }

    /// Whether an entry of `size` (``cacheCost(_:_:)``, or a name and 64 bytes) may be cached, emptying
    /// the cache (digests, subjects, event numbers) first if it would pass ``subjectCacheBytes``.
    private func makeRoom(_ size: Int) -> Bool {
        guard size <= Self.subjectCacheBytes else { return false }
        if cachedSubjectBytes + size > Self.subjectCacheBytes {
            digests = [:]
            subjects = [:]
            sentCounts = [:]
            cachedSubjectBytes = 0
        }
        cachedSubjectBytes += size
        return true
    }

    /// Takes a remote event only as one whole MESSAGE frame with id 0 on `channel`, read by the same
    /// decoder as a connection's frames: with a payload, or without one (the end of the stream) from a
    /// holder's node.
    private func received(_ message: BusMessage, on channel: String) {
        let bytes = message.payload
        if let mark = siblingsMark, message.header(mark.name) == mark.value { return }  // a sibling loop's broadcast, had already
        let holderNode = message.header("Sb-Node")
        guard let frame = Self.eventFrame(bytes), frame.channel == channel, frame.payload != nil || holderNode != nil else {
            eventsMalformed += 1
            return
        }
        eventsIn += 1
        if let mark = message.header("Sb-Seq") { noteNumber(mark, on: channel) }
        onEvent?(channel, frame.payload, bytes, holderNode)
    }

    /// `bytes` as one whole MESSAGE frame with id 0, or nil.
    private static func eventFrame(_ bytes: [UInt8]) -> Frame? {
        var buffer = InboundBuffer()
        buffer.append(bytes)
        var decoder = FrameDecoder(maxFrame: UInt32(clamping: bytes.count))
        guard case .frame(let frame)? = try? decoder.next(from: &buffer), buffer.readableBytes == 0,
              frame.kind == .message, frame.id == 0 else { return nil }
        return frame
    }

    /// The envelope a broadcast's frame carries (a broadcast always has one).
    static func eventEnvelope(in frame: [UInt8]) -> [UInt8]? { eventFrame(frame)?.payload }

    // MARK: Calls to other nodes

    /// Sends a call on `channel` to the holders' queue group, or to one node's holder (`node`); with
    /// a `completion`, its one outcome comes back to it. Returns the call's id (nil: wants no answer).
    @discardableResult
    func call(_ channel: String, node: String? = nil, input: CallInput, fromText: Bool = false, refusing refusedKinds: UInt8 = 0,
              payload: ArraySlice<UInt8>, completion: ((CallOutcome) -> Void)?) -> UInt64? {
        guard !isClosed else {
            completion?(.noHolder)
            return nil
        }
        var id: UInt64 = 0  // none wanted
        if let completion {
            // Not connected, or larger than the bus carries: no node could be asked.
            guard bus.isConnected, payload.count <= recordRoom else {
                completion(.noHolder)
                return nil
            }
            nextCall += 1
            id = nextCall
            callsOut += 1
            outgoing[id] = OutgoingCall(channel: channel, completion: completion, renewedAt: loop.now, channelMark: channelMarks[channel])
        }
        let index = batch(.calls(channel: channel, node: node), adding: payload.count) {
            node.map { "switchboard.node.\($0).call.\(digest(channel))" } ?? subject(.call, channel)
        }
        let flags = (fromText ? Self.textFlag : 0) | Self.flags(refusing: refusedKinds)
        BatchRecord.append(id: id, kind: input.rawValue, flags: flags, payload: payload, to: &batches[index].records)
        guard id != 0 else { return nil }
        batches[index].ids.append(id)
        return id
    }

    /// The batch a record of `size` bytes for `key` goes in: the one open for it, or a new one (its
    /// subject made by `subject`) when there is none or the record would take it past ``batchRoom``.
    private func batch(_ key: BatchKey, adding size: Int, subject: () -> String) -> Int {
        let open = lastBatch.flatMap { batches[$0].key == key ? $0 : nil } ?? openBatches[key]
        if let open, batches[open].records.isEmpty || batches[open].records.count + BatchRecord.headerSize + size <= batchRoom {
            lastBatch = open
            return open
        }
        let index = batches.count
        batches.append(Batch(key: key, subject: open.map { batches[$0].subject } ?? subject()))
        openBatches[key] = index
        lastBatch = index
        return index
    }

    /// Sends the batches made so far, in the order they were opened. What their sending makes (the
    /// completions of calls no node could be asked may call again) goes too.
    private func sendBatches() {
        while !batches.isEmpty {
            let ready = batches
            batches = []
            openBatches = [:]
            lastBatch = nil
            for batch in ready { send(batch) }
        }
    }

    /// Publishes a batch: answers to their node; calls with a reply subject of the batch's own when one
    /// of them wants an answer, where NATS answers no-responders if no node holds the channel.
    private func send(_ batch: Batch) {
        guard case .calls = batch.key else {
            try? bus.publish(batch.subject, headers: nodeHeaders, payload: batch.records)
            return
        }
        guard !batch.ids.isEmpty else {
            try? bus.publish(batch.subject, headers: callerHeaders, payload: batch.records)
            return
        }
        nextBatch += 1
        batchCalls[nextBatch] = batch.ids
        if batchCalls.count >= batchSweepAt {
            batchCalls = batchCalls.filter { $0.value.contains { outgoing[$0] != nil } }
            batchSweepAt = max(64, batchCalls.count * 2)
        }
        // Refused, or the connection went since the calls were made: no node could be asked.
        guard bus.isConnected else { return noHolder(batch: nextBatch) }
        do {
            try bus.publish(batch.subject, replyTo: "switchboard.reply.\(instance).\(nextBatch)", headers: callerHeaders,
                            payload: batch.records)
        } catch {
            noHolder(batch: nextBatch)
        }
    }

    /// The caller cancelled call `id`: every holder of its channel hears, and the one working on it
    /// answers it (or the lease ends it).
    func cancelCall(_ id: UInt64) {
        guard let call = outgoing[id], call.cancelledAt == nil else { return }
        outgoing[id]?.cancelledAt = loop.now
        sendBatches()  // the call goes before its cancel
        try? bus.publish(subject(.cancel, call.channel), headers: callerHeaders, payload: Array(String(id).utf8))
    }

    /// A batch of answers from a holder's node.
    private func answered(_ message: BusMessage) {
        guard let node = message.header("Sb-Node"), Self.isInstance(node), let records = BatchRecord.records(in: message.payload) else {
            batchesMalformed += 1
            return
        }
        notePeer(node)
        for record in records {
            guard let call = outgoing.removeValue(forKey: record.id) else { continue }  // cancelled or expired meanwhile
            if let mark = RemoteReply.mark(flags: record.flags) { learn(call.channel, isMarked: mark) }
            call.completion(.reply(RemoteReply(node: node, kind: record.kind, flags: record.flags, payload: record.payload)))
        }
    }

    /// A status on a batch's reply subject: 503, nobody holds the channel.
    private func unheard(_ message: BusMessage) {
        guard message.status == 503, let batch = Self.lastNumber(of: message.subject) else { return }
        noHolder(batch: batch)
    }

    private func noHolder(batch: UInt64) {
        for id in batchCalls.removeValue(forKey: batch) ?? [] {
            guard let call = outgoing.removeValue(forKey: id) else { continue }
            callsNoResponders += 1
            call.completion(.noHolder)
        }
    }

    // MARK: Calls from other nodes

    /// A client here holds `channel`: calls from other nodes may come to it (each batch to one of the
    /// nodes that hold it: a NATS queue group), and so may their cancels.
    func hold(_ channel: String) {
        guard held[channel] == nil else { return }
        heldByDigest[digest(channel)] = channel
        let calls = try? bus.subscribe(subject(.call, channel), queue: "holders") { [unowned self] message in
            incoming(message, on: channel)
        }
        let cancels = try? bus.subscribe(subject(.cancel, channel), queue: nil) { [unowned self] message in
            cancelled(message)
        }
        held[channel] = (calls, cancels)
    }

    /// New calls from other nodes come here no more (the server is draining); the calls being served
    /// can still be cancelled.
    func stopTakingCalls() {
        for channel in held.keys.sorted() {
            if let calls = held[channel]?.calls { bus.unsubscribe(calls) }
            held[channel]?.calls = nil
        }
    }

    /// Answers what other nodes' clients wait for here with `going_away` (the server is stopping); the
    /// bus stays up until ``close()``, to carry the answers.
    func stopServing() {
        for channel in held.keys.sorted() { letGo(channel) }
        for request in served.values { request.answer(.error(.goingAway)) }
    }

    /// The holder of `channel` let it go.
    func letGo(_ channel: String) {
        guard let subscriptions = held.removeValueShrinking(forKey: channel) else { return }
        heldByDigest.removeValueShrinking(forKey: digest(channel))
        uncacheHeld(channel)
        for subscription in [subscriptions.calls, subscriptions.cancels] { subscription.map(bus.unsubscribe) }
    }

    /// A batch of calls from another node, on `channel` (nil: a channel no longer held here, whose
    /// calls get "no handler" at once). A batch that is not whole records is dropped: its calls lapse.
    private func incoming(_ message: BusMessage, on channel: String?) {
        guard let caller = message.header("Sb-Caller"), Self.isInstance(caller), let records = BatchRecord.records(in: message.payload) else {
            batchesMalformed += 1
            return
        }
        notePeer(caller)
        let calls = records.map {
            IncomingCall(caller: caller, id: $0.id == 0 ? nil : $0.id, input: CallInput(rawValue: $0.kind),
                         isText: $0.flags & Self.textFlag != 0, refusedKinds: $0.flags >> 1 & 0b111, payload: $0.payload)
        }
        guard let channel else {
            for call in calls { answer(call.key, with: .notImplemented) }
            return
        }
        callsIn += calls.count
        onCalls?(channel, calls)
    }

    /// Keeps `request` (serving the call `key` names) in the beacons until it is answered, and
    /// reachable by a cancel.
    func serve(_ key: CallKey?, by request: PendingRequest) {
        guard let key, !request.isAnswered else { return }
        served[key] = request
    }

    /// Sends the answer to the call `key` names (nil: it wants none) and stops naming it in beacons;
    /// `startsStream` marks the success of an event channel's listen, which starts the caller node's
    /// stream; `kindFlag` tells the caller's node what the channel is (``RemoteReply/kindFlag(methodCodec:)``).
    func answer(_ key: CallKey?, with answer: Answer, startsStream: Bool = false, kindFlag: UInt8 = 0) {
        guard let key, !isClosed else { return }
        if served.removeValue(forKey: key) != nil { onServedAnswered?() }
        var (kind, isJSON, payload) = RemoteAnswer.encode(answer)
        if payload.count > recordRoom {  // what cannot cross is said, not lost
            (kind, isJSON, payload) = RemoteAnswer.encode(.error(.badPayload("the answer (\(payload.count) bytes) is larger than the cluster bus carries")))
        }
        let flags = (isJSON ? RemoteReply.jsonFlag : 0) | (startsStream && kind == .success ? RemoteReply.streamFlag : 0) | kindFlag
        let index = batch(.answers(caller: key.caller), adding: payload.count) { "switchboard.answers.\(key.caller)" }
        BatchRecord.append(id: key.id, kind: kind.rawValue, flags: flags, payload: payload, to: &batches[index].records)
    }

    /// What a bus between loops may drop when the loop it goes to has too much waiting: broadcasts and
    /// holders' events, as NATS core may. Calls, answers, cancels and leaves are never dropped: without
    /// beacons, nothing would make up for them.
    static func mayDrop(_ message: BusMessage) -> Bool {
        message.subject.hasPrefix("switchboard.event.")
    }

    private func cancelled(_ message: BusMessage) {
        guard let caller = message.header("Sb-Caller"), let id = UInt64(String(decoding: message.payload, as: UTF8.self)),
              let request = served[CallKey(caller: caller, id: id)] else { return }  // answered meanwhile
        request.notifyCancel()
        request.answer(request.cancelAnswer)
    }

    // MARK: Beacons

    /// Whether `text` can be a node's instance: what ``instance`` is made of, hex digits.
    private static func isInstance<S: StringProtocol>(_ text: S) -> Bool {
        !text.isEmpty && text.utf8.count <= 16 && text.utf8.allSatisfy { (48...57).contains($0) || (97...102).contains($0) }
    }

    /// Starts watching `node`'s beacons (as if one had just come), once it answered or called: a node
    /// that dies before its first beacon is lost all the same.
    func notePeer(_ node: String) {
        guard Self.isInstance(node) else { return }
        if peers[node] == nil { peers[node] = Peer(lastSeen: loop.now) }
    }

    /// Sends this node's beacon, and ends what the silence of other nodes has let lapse.
    private func tick() {
        // "<instance> <channels held> <name>"; then "L <holder> <digest> <count>" for each channel held
        // elsewhere that this node has listeners on, and a lone "L" after them; then a line per calling
        // node: "<instance> <id> <id> …". Split into beacons of at most 64 KiB, each with the first line
        // (the listeners all in the first), far below any max_payload.
        let first = Array("\(instance) \(held.count) \(node)\n".utf8)
        var beacon = first
        for listening in (listenersToReport?() ?? []).sorted(by: { ($0.holderNode, $0.channel) < ($1.holderNode, $1.channel) }) {
            beacon += "L \(listening.holderNode) \(digest(listening.channel)) \(listening.count)\n".utf8
        }
        beacon += "L\n".utf8
        var byCaller: [String: [(id: UInt64, codec: String)]] = [:]
        for (key, request) in served { byCaller[key.caller, default: []].append((key.id, Self.codecMark(request.methodCodec?.codec))) }
        for (caller, ids) in byCaller.sorted(by: { $0.key < $1.key }) {
            let ids = ids.sorted { $0.id < $1.id }
            for chunk in stride(from: 0, to: ids.count, by: 2048) {
                let line = Array((caller + ids[chunk..<min(chunk + 2048, ids.count)].map { " \($0.id)\($0.codec)" }.joined() + "\n").utf8)
                if beacon.count + line.count > 64 << 10 {
                    try? bus.publish("switchboard.beacon", headers: [], payload: beacon)
                    beacon = first
                }
                beacon += line
            }
        }
        try? bus.publish("switchboard.beacon", headers: [], payload: beacon)

        let now = loop.now
        let late = now - lastTick > 2 * Self.beaconIntervalMs
        if now - lastTick > Self.leaseMs {
            // The other nodes took this one for gone and forgot its listeners: it does the same with
            // theirs, whatever beacons it reads next, so that both sides agree.
            stalls += 1
            logger.warning("this node stalled for \(now - lastTick) ms: the other nodes took it for gone, and NATS may have dropped it as a slow consumer")
            for node in peers.keys.sorted() {
                peersLost += 1
                endServedCalls(of: node)
                onPeerLost?(node)
            }
            peers = [:]
        }
        lastTick = now
        // A loop that ran late (stopped, starved) has not read yet what came on the bus meanwhile: the
        // answers and beacons that end or renew its calls, and other nodes' beacons. Its timer runs before
        // it reads its sockets, so the leases are judged at the next beacon, once it has.
        if late, !judgingDeferred {
            judgingDeferred = true
            return
        }
        judgingDeferred = false
        let lapsedCalls = outgoing.filter { now - ($0.value.cancelledAt ?? $0.value.renewedAt) > Self.leaseMs }.keys.sorted()
        for id in lapsedCalls {
            guard let call = outgoing.removeValue(forKey: id) else { continue }
            callsExpired += 1
            call.completion(call.cancelledAt == nil ? .expired : .cancelled(methodCodec: (call.channelMark ?? channelMarks[call.channel]).flatMap(Self.methodCodec(marked:))))
        }
        let lost = peers.filter { now - $0.value.lastSeen > Self.leaseMs }.keys.sorted()
        for node in lost {
            peers.removeValue(forKey: node)
            peersLost += 1
            endServedCalls(of: node)
            onPeerLost?(node)
        }
    }

    /// `node` went silent: nobody waits there for the calls it made here any more (its calls lapsed
    /// there too, if it is only stalled). Each is answered `handler_gone`, which a stalled node reads
    /// when it wakes, and cancelled: its holder hears CANCEL, as for a caller that went away.
    private func endServedCalls(of node: String) {
        for request in served.filter({ $0.key.caller == node }).sorted(by: { $0.key.id < $1.key.id }).map(\.value) {
            let hook = request.onCancel
            request.answer(.error(.handlerGone))
            hook.run()
        }
    }

    /// What a channel whose method codec is `codec` (nil: not a method channel) is, as one mark: `s`
    /// the standard method codec, `j` the JSON one, `-` any other channel. Beacons put it after a
    /// call's id (but `-`), and answer records carry it as a flag (``RemoteReply/kindFlag(mark:)``).
    static func channelMark(methodCodec codec: (any MethodCodec)?) -> Character {
        switch codec {
        case is StandardMethodCodec: "s"
        case is JSONMethodCodec: "j"
        default: "-"
        }
    }

    /// How a beacon marks a call, after its id: nothing for a channel that is not a method channel.
    private static func codecMark(_ codec: (any MethodCodec)?) -> String {
        let mark = channelMark(methodCodec: codec)
        return mark == "-" ? "" : String(mark)
    }

    private static func methodCodec(marked mark: Character) -> (any MethodCodec)? {
        switch mark {
        case "s": StandardMethodCodec()
        case "j": JSONMethodCodec()
        default: nil
        }
    }

    /// Notes what a holder's node told of `channel`: its method codec's mark, or `-`.
    private func learn(_ channel: String, isMarked mark: Character) {
        if let known = channelMarks[channel] {
            if known != mark { channelMarks[channel] = mark }
            return
        }
        let cost = channel.utf8.count + 64
        guard cost <= Self.channelMarkCacheBytes else { return }
        if channelMarkBytes + cost > Self.channelMarkCacheBytes { (channelMarks, channelMarkBytes) = ([:], 0) }
        channelMarks[channel] = mark
        channelMarkBytes += cost
    }

    /// Another node's beacon: it is alive, and so are the calls it names for this node.
    private func beacon(_ message: BusMessage) {
        let lines = String(decoding: message.payload, as: UTF8.self).split(separator: "\n")
        guard let first = lines.first else { return }
        let fields = first.split(separator: " ", maxSplits: 2)
        // Counts from another node are checked before any arithmetic: a sum or difference of them must not trap.
        guard fields.count >= 2, Self.isInstance(fields[0]), let heldCount = Int(fields[1]),
              (0...Int(UInt32.max)).contains(heldCount) else { return }
        let now = loop.now
        let node = String(fields[0])
        peers[node] = Peer(lastSeen: now, name: fields.count > 2 ? String(fields[2]) : "", held: heldCount)
        var listeners: [String: Int]?  // set by the listener section, which only a beacon's first part has
        for line in lines.dropFirst() {
            let words = line.split(separator: " ")
            if words.first == "L" {
                if listeners == nil { listeners = [:] }
                guard words.count == 4, words[1] == instance, let channel = heldByDigest[String(words[2])] else { continue }
                guard let count = Int(words[3]), count >= 0 else { return }  // a malformed beacon reports nothing
                listeners?[channel] = count
                continue
            }
            guard words.first.map(String.init) == instance else { continue }
            for word in words.dropFirst() {
                let mark = word.last.flatMap { $0.isLetter ? $0 : nil }
                guard let id = UInt64(mark == nil ? word : word.dropLast()), let call = outgoing[id] else { continue }
                outgoing[id]?.renewedAt = now
                outgoing[id]?.channelMark = mark ?? "-"
                learn(call.channel, isMarked: mark ?? "-")
            }
        }
        if let listeners { onListenerReport?(node, listeners) }
    }

    // MARK: Stats

    /// For `/metrics`: the totals (counters), then the values of now (gauges), as `switchboard/stats`
    /// has them.
    var metrics: (totals: [(String, Int)], gauges: [(String, Int)]) {
        let bus = self.bus.counters
        let totals = [
            ("events_out", eventsOut), ("events_in", eventsIn), ("events_unsent", eventsUnsent), ("events_malformed", eventsMalformed),
            ("events_missed", eventsMissed),
            ("batches_malformed", batchesMalformed),
            ("calls_out", callsOut), ("calls_in", callsIn), ("calls_no_holder", callsNoResponders), ("calls_expired", callsExpired),
            ("calls_forbidden", callsForbidden),
            ("nodes_lost", peersLost), ("stalls", stalls),
            ("bus_messages_out", bus.messagesOut), ("bus_messages_in", bus.messagesIn), ("bus_bytes_out", bus.bytesOut),
            ("bus_bytes_in", bus.bytesIn), ("bus_dropped", bus.dropped), ("bus_reconnects", bus.reconnects),
            ("bus_connect_failures", bus.connectFailures), ("bus_possibly_lost", bus.possiblyLost),
            ("loop_events_dropped", loopEventsDropped),
            ("bus_server_errors", bus.serverErrors), ("bus_slow_consumer", bus.slowConsumer),
        ]
        let gauges = [
            ("connected", self.bus.isConnected ? 1 : 0), ("nodes", peers.count), ("remote_holders", peers.values.reduce(0) { $0 + $1.held }),
            ("channels_listened", subscriptions.count), ("channels_held", held.count),
            ("calls_pending", outgoing.count), ("calls_serving", served.count),
        ]
        return (totals.map { ("switchboard_cluster_\($0.0)_total", $0.1) }, gauges.map { ("switchboard_cluster_\($0.0)", $0.1) })
    }

    /// For `switchboard/stats`, between the loops of one server: what crossed, and what was dropped
    /// because a loop had too much waiting.
    /// The calls that went by the loops' own typed path are added in.
    func loopStatsValue(callsOut typedOut: Int, callsIn typedIn: Int, callsPending typedPending: Int, callsServing typedServing: Int) -> ChannelValue {
        .stringMap([
            "eventsOut": .int(eventsOut), "eventsIn": .int(eventsIn), "eventsUnsent": .int(eventsUnsent),
            "callsOut": .int(callsOut + typedOut), "callsIn": .int(callsIn + typedIn),
            "callsPending": .int(outgoing.count + typedPending), "callsServing": .int(served.count + typedServing),
            "messagesOut": .int(bus.counters.messagesOut), "messagesIn": .int(bus.counters.messagesIn),
            "dropped": .int(bus.counters.dropped),
        ])
    }

    /// For `switchboard/stats`.
    var statsValue: ChannelValue {
        let bus = self.bus.counters
        return .stringMap([
            "node": .string(node), "connected": .bool(self.bus.isConnected),
            "eventsOut": .int(eventsOut), "eventsIn": .int(eventsIn),
            "eventsUnsent": .int(eventsUnsent), "eventsMalformed": .int(eventsMalformed),
            "eventsMissed": .int(eventsMissed),
            "batchesMalformed": .int(batchesMalformed),
            "channelsListened": .int(subscriptions.count),
            "channelsHeld": .int(held.count),
            "nodes": .int(peers.count), "nodesLost": .int(peersLost),
            "remoteHolders": .int(peers.values.reduce(0) { $0 + $1.held }),
            "callsOut": .int(callsOut), "callsIn": .int(callsIn),
            "callsPending": .int(outgoing.count), "callsServing": .int(served.count),
            "callsNoHolder": .int(callsNoResponders), "callsExpired": .int(callsExpired),
            "callsForbidden": .int(callsForbidden),
            "busMessagesOut": .int(bus.messagesOut), "busMessagesIn": .int(bus.messagesIn),
            "busBytesOut": .int(bus.bytesOut), "busBytesIn": .int(bus.bytesIn),
            "busDropped": .int(bus.dropped), "busReconnects": .int(bus.reconnects),
            "busConnectFailures": .int(bus.connectFailures), "busPossiblyLost": .int(bus.possiblyLost),
            "loopEventsDropped": .int(loopEventsDropped),
            "busServerErrors": .int(bus.serverErrors), "busSlowConsumer": .int(bus.slowConsumer),
            "stalls": .int(stalls),
        ])
    }
}
