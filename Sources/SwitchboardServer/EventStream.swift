import SwitchboardCodec
import SwitchboardPluginAPI
import SwitchboardWire

/// What one event carries.
enum EventContent: Sendable {
    case data(ChannelValue)
    case error(ChannelError)
    case end
    /// An envelope already encoded by a client holding the channel (forwarded as is to binary listeners).
    case encoded([UInt8])
}

/// One event, encoded at most once per wire encoding however many listeners share it.
final class OutboundEvent {
    let channel: String
    let content: EventContent
    /// nil for a client-held channel with no declared codec: such events have no text form.
    let codec: (any MethodCodec)?
    /// The whole MESSAGE frame (id 0); nil if the codec cannot encode the value. Made up front (most
    /// listeners are binary) and a constant, so that fan-out reads it without any check.
    let binaryFrame: [UInt8]?
    private var text: [UInt8]??

    /// Whether this is an end of stream. Stored: matching `content` per listener would copy its payload.
    let isEnd: Bool

    init(channel: String, content: EventContent, codec: (any MethodCodec)?) {
        self.channel = channel
        self.content = content
        self.codec = codec
        let isEnd = if case .end = content { true } else { false }
        self.isEnd = isEnd
        binaryFrame = Self.frame(channel: channel, content: content, codec: codec, isEnd: isEnd)
    }

    /// An event that arrived whole from another node: `frame` is its MESSAGE frame, `envelope` the
    /// payload (nil: the end of the stream).
    init(channel: String, envelope: [UInt8]?, frame: [UInt8], codec: (any MethodCodec)?) {
        self.channel = channel
        content = envelope.map(EventContent.encoded) ?? .end
        self.codec = codec
        isEnd = envelope == nil
        binaryFrame = frame
    }

    private static func frame(channel: String, content: EventContent, codec: (any MethodCodec)?, isEnd: Bool) -> [UInt8]? {
        var payload: [UInt8]?
        switch content {
        case .data(let value): payload = try? codec?.encodeSuccessEnvelope(value)
        case .error(let error): payload = try? codec?.encodeErrorEnvelope(error)
        case .end: payload = nil
        case .encoded(let envelope): payload = envelope
        }
        guard payload != nil || isEnd else { return nil }
        var out = [UInt8]()
        Frame.write(.message, id: 0, channel: channel, payload: payload, to: &out)
        return out
    }

    /// The text-mode line, newline included; nil if the value has no JSON form.
    var textLine: [UInt8]? {
        if let text { return text }
        var fields: [ChannelValue.MapEntry] = [.init("event", .string(channel))]
        switch content {
        case .data(let value): fields.append(.init("data", value))
        case .error(let error): fields.append(.init("error", TextMode.errorObject(error)))
        case .end: fields.append(.init("end", true))
        case .encoded(let envelope):
            switch try? codec?.decodeEnvelope(envelope) {
            case .success(let value)?: fields.append(.init("data", value))
            case .failure(let error)?: fields.append(.init("error", TextMode.errorObject(error)))
            case nil:
                text = .some(nil)
                return nil
            }
        }
        var line = try? JSONText.serialize(.map(fields), options: .textMode)
        line?.append(UInt8(ascii: "\n"))
        text = .some(line)
        return line
    }
}

/// Credit granted by DEMAND (wire-v1 section 7a).
enum Credit: Equatable {
    case unbounded
    case counted(UInt32)

    static let maxCounted: UInt32 = 0xFFFF_FFFE

    /// Adds a DEMAND of `n` (0xFFFFFFFF = unbounded); a DEMAND after unbounded starts counting again.
    func adding(_ n: UInt32) -> Credit {
        if n == 0xFFFF_FFFF { return .unbounded }
        switch self {
        case .unbounded: return .counted(min(n, Credit.maxCounted))
        case .counted(let c): return .counted(c > Credit.maxCounted - n ? Credit.maxCounted : c + n)
        }
    }
}

/// One listener's stream on one event channel. Loop thread only.
///
/// Events go straight to the connection while the stream is live, has credit, has nothing queued and the
/// connection is under its outbound limit; otherwise they wait in a bounded queue under the channel's
/// overflow policy, and every drop is counted. End of stream needs no credit but waits its turn.
final class EventStream {
    /// Strong: the connection drops its streams when they end or it closes.
    let connection: Connection
    let entry: EventEntry
    let arguments: ChannelValue
    var credit: Credit
    /// Waiting events with their encoded sizes (counted in the connection's `waitingEventBytes`).
    private var queue: [(event: OutboundEvent, size: Int)] = []
    private var queueHead = 0
    /// Events in `queue` past `queueHead`, kept apart so that the fast path never touches the queue.
    private var queuedCount = 0
    /// True until the listen reply has gone out: events wait, so the reply always comes first. Also
    /// while the connection's session is parked, for a keep-latest channel (``holdWhileParked()``).
    private var isStarting = true
    private(set) var isActive = true
    var readyCallback: (() -> Void)? {
        didSet { if readyCallback != nil { connection.hasWaitingStreams = true } }
    }
    var sink: EventSink!
    /// What its sink refers to weakly, rather than to the stream itself: an object that is ever referred
    /// to weakly takes Swift's slow reference-counting path (through a side table) on every retain and
    /// release from then on, and a broadcast retains each stream it delivers to.
    let anchor = Anchor()
    /// Where this stream sits in its channel's ``Listeners``.
    var listenerIndex = -1
    /// Counted in the node's interest in other nodes' broadcasts on its channel (``ClusterLink``).
    var countsForCluster = false
    /// The plugins' outbound stages that see this stream's events, chosen when it started; nil (the
    /// common case) for none, so that its events cost nothing more.
    let outboundStages: [Pipeline.Stage<any OutboundProcessor, OutboundKind>]?

    init(connection: Connection, entry: EventEntry, arguments: ChannelValue, credit: Credit,
         outboundStages: [Pipeline.Stage<any OutboundProcessor, OutboundKind>]?) {
        self.connection = connection
        self.entry = entry
        self.arguments = arguments
        self.credit = credit
        self.outboundStages = outboundStages
        anchor.stream = self
    }

    /// Runs before the stream's properties go: a sink used from their deinits (a ready callback's
    /// captures, say) finds no stream rather than one being torn down.
    deinit { anchor.stream = nil }

    /// Owned by its stream alone, so it goes when the stream goes, and a weak reference to it ends then.
    final class Anchor {
        /// The stream, until it begins to go.
        unowned var stream: EventStream?
    }

    private var hasCredit: Bool { if case .counted(0) = credit { false } else { true } }

    var isReady: Bool {
        isActive && !isStarting && queuedCount == 0 && hasCredit && !connection.isOverOutboundLimit
    }

    /// The credit as a producer sees it: nil in push mode.
    var outstandingCredit: UInt32? { if case .counted(let c) = credit { c } else { nil } }

    /// An event from this stream's own sink.
    func emit(_ content: EventContent) {
        guard isActive else { return }
        entry.counts.events += 1
        deliver(OutboundEvent(channel: entry.name, content: content, codec: entry.codec))
    }

    /// Sends or queues `event` (which may be shared with other listeners).
    func deliver(_ event: OutboundEvent) {
        guard isActive else { return }
        if let outboundStages {
            guard let filtered = filter(event, through: outboundStages) else { return }
            return deliverUnfiltered(filtered)
        }
        deliverUnfiltered(event)
    }

    private func deliverUnfiltered(_ event: OutboundEvent) {
        if queuedCount == 0, !isStarting, event.isEnd || (hasCredit && !connection.isOverOutboundLimit) {
            write(event)
            return
        }
        enqueue(event)
    }

    /// Queues `event` if it fits both the channel's queue length and the connection's outbound limit
    /// (counting what already waits in its streams); otherwise applies the overflow policy.
    private func enqueue(_ event: OutboundEvent) {
        guard let size = connection.encodedSize(of: event) else { return connection.core.countDrop("unencodable") }
        if event.isEnd { return append(event, size: size) }
        let reason = !hasCredit ? "noCredit" : connection.isOverOutboundLimit ? "outboundLimit" : "queueFull"
        func fits() -> Bool {
            queuedCount < entry.queueLimit
                && connection.pendingBytes + connection.waitingEventBytes + size <= connection.core.config.outboundLimit
        }
        switch entry.overflow {
        case .dropNewest:
            break
        case .dropOldest:
            while !fits(), queuedCount > 0 { dropHead(reason) }
        case .keepLatest:
            while queuedCount > 0 { dropHead(reason) }
        }
        if fits() { append(event, size: size) } else { dropped(reason) }
    }

    /// Counts a drop; one the stream had credit for, dropped for want of room (not a stream stopped by a
    /// cancel or shutdown), ends its connection's session, if any (protocol/resumption.md: keep-latest
    /// promises no more than the latest event).
    private func dropped(_ reason: String) {
        connection.core.countDrop(reason)
        let lacksRoom = reason == "outboundLimit" || reason == "queueFull"
        if lacksRoom, entry.overflow != .keepLatest, connection.session != nil { connection.endSession(.overflowed) }
    }

    private func append(_ event: OutboundEvent, size: Int) {
        queue.append((event, size))
        queuedCount += 1
        connection.waitingEventBytes += size
        connection.hasWaitingStreams = true
    }

    private func dropHead(_ reason: String) {
        let (event, size) = queue[queueHead]
        queueHead += 1
        queuedCount -= 1
        connection.waitingEventBytes -= size
        if !event.isEnd { dropped(reason) }
        compact()
    }

    private func takeHead() -> OutboundEvent {
        let (event, size) = queue[queueHead]
        queueHead += 1
        queuedCount -= 1
        connection.waitingEventBytes -= size
        return event
    }

    private func compact() {
        if queueHead > 64, queueHead * 2 > queue.count {
            queue.removeFirst(queueHead)
            queueHead = 0
        }
    }

    private func write(_ event: OutboundEvent) {
        if event.isEnd {
            connection.writeEvent(event)
            connection.endStream(self, notifyHandler: false)
            return
        }
        guard connection.writeEvent(event) else { return }
        if case .counted(let c) = credit { credit = .counted(c - 1) }
    }

    /// The listen reply went out: from now on events flow.
    func activate() {
        isStarting = false
        pump()
    }

    /// A keep-latest stream of a parked session keeps only its latest event until the session resumes
    /// (``activate()``), as for a listener that lags (protocol/resumption.md).
    func holdWhileParked() {
        if entry.overflow == .keepLatest { isStarting = true }
    }

    /// Sends what waits, as far as credit and the outbound limit allow; tells a waiting producer when ready.
    func pump() {
        while isActive, !isStarting, queuedCount > 0 {
            let event = queue[queueHead].event
            guard event.isEnd || (hasCredit && !connection.isOverOutboundLimit) else { break }
            write(takeHead())
        }
        if queuedCount == 0 { queue.removeAll(keepingCapacity: true); queueHead = 0 } else { compact() }
        if isReady, let callback = readyCallback {
            readyCallback = nil
            callback()
        }
        if isActive, queuedCount > 0 || readyCallback != nil { connection.hasWaitingStreams = true }
    }

    /// Adds credit from a DEMAND.
    func addCredit(_ n: UInt32) {
        credit = credit.adding(n)
        pump()
    }

    /// Stops the stream: queued events are dropped (and counted) and nothing more is sent.
    func stop(dropReason: String) {
        guard isActive else { return }
        isActive = false
        readyCallback = nil
        while queuedCount > 0 { dropHead(dropReason) }
        queue = []
        queueHead = 0
    }

    /// For shutdown: sends what credit allows, drops the rest, then sends end of stream.
    func finishForShutdown() {
        isStarting = false
        while isActive, queuedCount > 0, !queue[queueHead].event.isEnd, hasCredit { write(takeHead()) }
        guard isActive else { return }
        stop(dropReason: "shutdown")
        let end = OutboundEvent(channel: entry.name, content: .end, codec: entry.codec)
        connection.writeEvent(outboundStages.flatMap { filter(end, through: $0) } ?? end)
    }
}

/// The streams listening on one event channel, in an array for fast fan-out; each stream knows its index,
/// so removal is a swap with the last.
struct Listeners {
    private(set) var all: [EventStream] = []

    var isEmpty: Bool { all.isEmpty }

    /// Delivers `event` to every listener there is when it is called: a delivery that ends a stream
    /// (which removes it) changes neither the order nor who gets it.
    ///
    /// Each stream is lent to its delivery unretained, where a `for in` loop retained and released it
    /// per delivery (two atomic operations of fan-out's cost). Sound: every caller reads `self` out of
    /// a channel entry (a class), which copies it, and that copy's array holds every stream strongly
    /// until the loop is over; a delivery that ends a stream removes it from the entry's list, which
    /// then copies its storage rather than change this one. (Were the list ever borrowed in place
    /// instead, that removal would trap as an exclusivity violation, not free a stream.)
    func deliver(_ event: OutboundEvent) {
        let streams = all.span
        for index in streams.indices {
            unsafe Unmanaged.passUnretained(streams[index])._withUnsafeGuaranteedRef { $0.deliver(event) }
        }
    }

    mutating func add(_ stream: EventStream) {
        stream.listenerIndex = all.count
        all.append(stream)
    }

    mutating func remove(_ stream: EventStream) {
        let index = stream.listenerIndex
        guard index >= 0, index < all.count, all[index] === stream else { return }
        let last = all.removeLast()
        if last !== stream {
            all[index] = last
            last.listenerIndex = index
        }
        stream.listenerIndex = -1
    }
}
