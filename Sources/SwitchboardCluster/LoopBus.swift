import Synchronization
import SwitchboardTransport

/// The bus between the loops of one server: one ``LoopBus`` per loop, all made by one hub. What a loop
/// publishes reaches the subscriptions of the other loops as jobs on their loops: no socket, no copy
/// of the payload, no parsing.
///
/// It behaves as NATS core with `echo` off (so that a link made for NATS runs on it unchanged): a loop
/// never hears its own publishes; a queue group's members share the messages; a request nobody else
/// subscribes to gets the no-responders status (503) at once. Unlike NATS it loses nothing in flight
/// but what `mayDrop` allows: a request whose subscription (or loop) went before it arrived is answered
/// with the same 503.
public final class LoopBusHub: Sendable {
    /// Messages one loop may have waiting, past which a publish to it that `mayDrop` allows is dropped
    /// and counted. Requests (messages with a reply subject) are never dropped, nor is anything else
    /// `mayDrop` refuses.
    public let inboxLimit: Int
    private let mayDrop: @Sendable (BusMessage) -> Bool
    private let inboxes: [Inbox]
    let table = Mutex(Table())

    struct Subscriber: Sendable {
        let loop: Int
        let id: UInt64
        let queue: String?
    }

    struct Table: ~Copyable {
        var exact: [String: [Subscriber]] = [:]
        /// Subscriptions to `<prefix>.*` (a reply inbox), by prefix: a subject's is found without a scan.
        var prefixed: [Substring: [Subscriber]] = [:]
        /// Other subscriptions with a wildcard, rare: matched token by token.
        var patterns: [(pattern: String, subscriber: Subscriber)] = []
        /// Turns through a queue group's members.
        var turn = 0
    }

    /// A hub for the loops behind `loops`, in order: loop `i` gets ``bus(_:loop:)`` `i`.
    public init(loops: [LoopHandle], inboxLimit: Int = 1 << 16, mayDrop: @escaping @Sendable (BusMessage) -> Bool = { _ in true }) {
        inboxes = loops.map(Inbox.init)
        self.inboxLimit = inboxLimit
        self.mayDrop = mayDrop
    }

    /// Whether `message` may be dropped when its loop has too much waiting.
    func isDroppable(_ message: BusMessage) -> Bool { message.replyTo == nil && mayDrop(message) }

    /// Loop `index`'s bus; loop thread only from then on.
    public func bus(_ index: Int, loop: EventLoop) -> LoopBus {
        let bus = LoopBus(hub: self, index: index)
        inboxes[index].attach(LoopBound(LoopBus.Weak(bus), loop: loop.handle))
        return bus
    }

    /// The subscriptions `subject` reaches from loop `from` (one per queue group).
    func route(_ subject: String, from: Int) -> [Subscriber] {
        table.withLock { table in
            var found = table.exact[subject] ?? []
            if !table.prefixed.isEmpty, let dot = subject.utf8.lastIndex(of: UInt8(ascii: ".")), let more = table.prefixed[subject[..<dot]] {
                found += more
            }
            for (pattern, subscriber) in table.patterns where Self.matches(subject, pattern: pattern) { found.append(subscriber) }
            found.removeAll { $0.loop == from }
            guard found.contains(where: { $0.queue != nil }) else { return found }
            var chosen = found.filter { $0.queue == nil }
            var groups: [String: [Subscriber]] = [:]
            for subscriber in found { if let queue = subscriber.queue { groups[queue, default: []].append(subscriber) } }
            table.turn &+= 1
            for queue in groups.keys.sorted() {
                guard let members = groups[queue] else { continue }
                chosen.append(members[table.turn % members.count])
            }
            return chosen
        }
    }

    /// The subscriptions `subject` reaches on any loop, the publisher's included: where NATS's own
    /// status messages (no responders) go.
    func routeStatus(_ subject: String) -> [Subscriber] { route(subject, from: -1) }

    func add(_ subject: String, _ subscriber: Subscriber) {
        table.withLock { table in
            let prefix = subject.hasSuffix(".*") ? subject.dropLast(2) : nil
            if let prefix, !prefix.utf8.contains(where: Self.isWildcard) {
                table.prefixed[prefix, default: []].append(subscriber)
            } else if subject.utf8.contains(where: Self.isWildcard) {
                table.patterns.append((subject, subscriber))
            } else {
                table.exact[subject, default: []].append(subscriber)
            }
        }
    }

    func remove(_ subject: String, loop: Int, id: UInt64) {
        table.withLock { table in
            table.patterns.removeAll { $0.subscriber.loop == loop && $0.subscriber.id == id }
            if subject.hasSuffix(".*"), var subscribers = table.prefixed[subject.dropLast(2)] {
                subscribers.removeAll { $0.loop == loop && $0.id == id }
                table.prefixed[subject.dropLast(2)] = subscribers.isEmpty ? nil : subscribers
            }
            guard var subscribers = table.exact[subject] else { return }
            subscribers.removeAll { $0.loop == loop && $0.id == id }
            if subscribers.isEmpty { table.exact.removeValueShrinking(forKey: subject) } else { table.exact[subject] = subscribers }
        }
    }

    /// Drops every subscription of loop `index` and stops delivering to it; the requests still waiting
    /// for it get no-responders.
    func detach(_ index: Int) {
        table.withLock { table in
            table.patterns.removeAll { $0.subscriber.loop == index }
            for (prefix, subscribers) in table.prefixed where subscribers.contains(where: { $0.loop == index }) {
                let left = subscribers.filter { $0.loop != index }
                table.prefixed[prefix] = left.isEmpty ? nil : left
            }
            for (subject, subscribers) in table.exact where subscribers.contains(where: { $0.loop == index }) {
                let left = subscribers.filter { $0.loop != index }
                table.exact[subject] = left.isEmpty ? nil : left
            }
        }
        for delivery in inboxes[index].detach() {
            guard let replyTo = delivery.message.replyTo else { continue }
            for target in routeStatus(replyTo) {
                _ = deliver(BusMessage(subject: replyTo, status: 503, payload: []), to: target.loop, subscription: target.id, bounded: false)
            }
        }
    }

    /// Queues `message` for subscription `id` of loop `loop`; false when dropped (`bounded` and the
    /// inbox full, or the loop gone).
    func deliver(_ message: BusMessage, to loop: Int, subscription id: UInt64, bounded: Bool) -> Bool {
        inboxes[loop].add(LoopBus.Delivery(subscription: id, message: message), limit: bounded ? inboxLimit : nil)
    }

    private static func isWildcard(_ byte: UInt8) -> Bool { byte == UInt8(ascii: "*") || byte == UInt8(ascii: ">") }

    /// NATS's subject matching: `*` matches one token, a final `>` one or more.
    static func matches(_ subject: String, pattern: String) -> Bool {
        var s = subject.utf8[...], p = pattern.utf8[...]
        let dot = UInt8(ascii: ".")
        while true {
            let pToken = p.prefix { $0 != dot }, sToken = s.prefix { $0 != dot }
            if pToken.elementsEqual(">".utf8) { return !sToken.isEmpty }
            guard !sToken.isEmpty || !s.isEmpty, pToken.elementsEqual("*".utf8) || pToken.elementsEqual(sToken) else { return false }
            p = p.dropFirst(pToken.count)
            s = s.dropFirst(sToken.count)
            if p.isEmpty || s.isEmpty { return p.isEmpty && s.isEmpty }
            p = p.dropFirst()
            s = s.dropFirst()
        }
    }

    /// One loop's waiting messages, drained by one job per batch.
    final class Inbox: Sendable {
        private let loop: LoopHandle
        private struct State {
            var waiting: [LoopBus.Delivery] = []
            var bus: LoopBound<LoopBus.Weak>?
        }
        private let state = Mutex(State())

        init(loop: LoopHandle) { self.loop = loop }

        func attach(_ bus: LoopBound<LoopBus.Weak>) { state.withLock { $0.bus = bus } }
        /// Stops taking messages; returns those that were waiting.
        func detach() -> [LoopBus.Delivery] {
            state.withLock { s in
                defer { s = State() }
                return s.waiting
            }
        }

        func add(_ delivery: LoopBus.Delivery, limit: Int?) -> Bool {
            let (accepted, first) = state.withLock { s -> (Bool, Bool) in
                guard s.bus != nil else { return (false, false) }
                if let limit, s.waiting.count >= limit { return (false, false) }
                s.waiting.append(delivery)
                return (true, s.waiting.count == 1)
            }
            if first, !loop.execute({ [self] in drain() }) { return false }
            return accepted
        }

        private func drain() {
            let (waiting, bus) = state.withLock { s in
                defer { s.waiting = [] }
                return (s.waiting, s.bus)
            }
            guard let bus = bus?.value.bus else { return }
            for delivery in waiting { bus.receive(delivery) }
        }
    }
}

/// One loop's end of a ``LoopBusHub``. Loop thread only.
public final class LoopBus: ClusterBus {
    struct Delivery: Sendable {
        let subscription: UInt64
        let message: BusMessage
    }
    final class Weak {
        weak var bus: LoopBus?
        init(_ bus: LoopBus) { self.bus = bus }
    }

    private let hub: LoopBusHub
    private let index: Int
    private(set) var subscriptions: [UInt64: (subject: String, handler: (BusMessage) -> Void)] = [:]
    private var nextID: UInt64 = 0
    private var isClosed = false
    public private(set) var counters = BusCounters()
    public var isConnected: Bool { !isClosed }
    /// No limit but memory's: a message is handed over, not written.
    public let maxPayload = Int.max

    init(hub: LoopBusHub, index: Int) {
        self.hub = hub
        self.index = index
    }

    public func start() {}

    /// Nothing waits: a message is handed to its loops as it is published.
    public func flush() {}

    /// Leaves the hub: nothing more arrives.
    public func close() {
        guard !isClosed else { return }
        isClosed = true
        hub.detach(index)
        subscriptions = [:]
    }

    public func publish(_ subject: String, replyTo: String?, headers: [BusMessage.Header], payload: [UInt8]) throws(BusError) {
        try send(BusMessage(subject: subject, replyTo: replyTo, headers: headers, payload: payload))
    }

    private func send(_ message: BusMessage) throws(BusError) {
        guard Self.isSubject(message.subject), message.replyTo.map(Self.isSubject) ?? true else {
            throw .invalidSubject(message.replyTo.map { "\(message.subject) \($0)" } ?? message.subject)
        }
        guard !isClosed else { counters.dropped += 1; return }
        counters.messagesOut += 1
        counters.bytesOut += message.payload.count
        let targets = hub.route(message.subject, from: index)
        if targets.isEmpty, let replyTo = message.replyTo {
            noResponders(replyTo)
            return
        }
        let bounded = hub.isDroppable(message)
        for target in targets where !hub.deliver(message, to: target.loop, subscription: target.id, bounded: bounded) {
            counters.dropped += 1
            if let replyTo = message.replyTo { noResponders(replyTo) }  // a loop shutting down: nobody will answer
        }
    }

    /// NATS's answer to a request nobody subscribes to: a message with status 503 on its reply subject.
    private func noResponders(_ replyTo: String) {
        let status = BusMessage(subject: replyTo, status: 503, payload: [])
        for target in hub.routeStatus(replyTo) {
            _ = hub.deliver(status, to: target.loop, subscription: target.id, bounded: false)
        }
    }

    public func subscribe(_ subject: String, queue: String?, _ handler: @escaping (BusMessage) -> Void) throws(BusError) -> BusSubscription {
        guard Self.isSubject(subject), queue.map(Self.isSubject) ?? true else { throw .invalidSubject(subject) }
        nextID += 1
        subscriptions[nextID] = (subject, handler)
        if !isClosed { hub.add(subject, .init(loop: index, id: nextID, queue: queue)) }
        return BusSubscription(id: nextID)
    }

    public func unsubscribe(_ subscription: BusSubscription) {
        guard let removed = subscriptions.removeValueShrinking(forKey: subscription.id) else { return }
        hub.remove(removed.subject, loop: index, id: subscription.id)
    }

    /// A message for one of this loop's subscriptions. One whose subscription went meanwhile is dropped,
    /// but a request among them is answered with no-responders, so that its requester never waits.
    func receive(_ delivery: Delivery) {
        guard let subscription = subscriptions[delivery.subscription] else {
            if let replyTo = delivery.message.replyTo { noResponders(replyTo) }
            return
        }
        counters.messagesIn += 1
        counters.bytesIn += delivery.message.payload.count
        subscription.handler(delivery.message)
    }

    /// A subject NATS would take: dot-separated tokens, none empty, no whitespace or control character.
    private static func isSubject(_ subject: String) -> Bool {
        var previous = UInt8(ascii: ".")
        for byte in subject.utf8 {
            if byte <= 0x20 || byte == 0x7F || (byte == UInt8(ascii: ".") && previous == byte) { return false }
            previous = byte
        }
        return previous != UInt8(ascii: ".")
    }
}
