import SwitchboardCluster
import SwitchboardCodec

/// The way from one loop to the other loops of this server (protocol/cluster.md, "The loops of one
/// server"): typed jobs on the loops' queues, with no bus between them. A request on a channel a client
/// of another loop holds goes to the loop the claims table names (``LoopGroup/holder(of:)``, which also
/// tells what the channel is, so that no request's kind is guessed); its answer, its CANCEL, a listen's
/// stream and a listener's leave go the same way, as they go between nodes (RemoteCalls.swift).
/// Broadcasts and a held channel's events go to each sibling loop with listeners on their channel.
/// Each loop runs its jobs in order, so an answer that starts a stream comes before the stream's
/// events. Nothing is lost between loops but what is counted: events wait for a loop in a bounded
/// count (``LoopGroup/siblingEventLimit``), calls, answers, cancels, leaves and the ends of holders'
/// streams are never dropped (the requests open on a loop are bounded where they are made, the ends by
/// the streams). Loop thread only.
final class SiblingLoops: Elsewhere {
    /// This loop's place, and its name as a caller or holder (`loop 2`).
    let index: Int
    let name: String
    /// Every loop's name, made once.
    let names: [String]
    /// The server's loops; released with the core.
    private let group: LoopGroup

    /// A call sent to another loop, waiting for its answer: the loop that has it (the one it was sent
    /// to, or the one that loop passed it on to), and whether its caller cancelled it.
    private struct Waiting {
        var loop: Int
        let completion: (ClusterLink.CallOutcome) -> Void
        var isCancelled = false
    }
    private var waiting: [UInt64: Waiting] = [:]
    private var nextCall: UInt64 = 0
    /// Calls from other loops that a holder here works on.
    private var served: [ClusterLink.CallKey: any ServedCall] = [:]
    /// This loop's listeners, by channel: its interest in the other loops' events.
    private var listenerCounts: [String: Int] = [:]
    /// Whether the server is stopping (calls that come get `going_away`), or this loop has stopped.
    private var isStopping = false, isClosed = false
    /// What crossed: calls and events sent to other loops and taken from them, events with no wire form,
    /// and events dropped because a loop had too many waiting.
    private(set) var callsOut = 0, callsIn = 0, eventsOut = 0, eventsIn = 0, eventsUnsent = 0, dropped = 0
    /// Calls from other loops refused `forbidden`: of a kind the caller's plugins refused (the channel changed on the way).
    var callsForbidden = 0
    var onCalls: ((_ channel: String, _ calls: [ClusterLink.IncomingCall]) -> Void)?
    var onServedAnswered: (() -> Void)?
    var onEvent: ((_ channel: String, _ envelope: [UInt8]?, _ frame: [UInt8], _ holderNode: String?) -> Void)?
    /// An event a sibling loop had no room for.
    var onDropped: (() -> Void)?
    /// Whether the call being handed to the server (``onCalls``) was passed on already.
    private var handingPassedOn = false

    init(index: Int, group: LoopGroup) {
        self.index = index
        names = (0..<group.count).map { "loop \($0)" }
        name = names[index]
        self.group = group
    }

    /// Whether `node` names a loop of this server (`loop <i>`), not another node (whose instance is hex
    /// digits, never an `l`).
    static func isLoop(_ node: String) -> Bool { node.utf8.first == UInt8(ascii: "l") }

    /// The `i` of `loop <i>`; the last one read is kept, since this runs for every call and answer
    /// between loops, which mostly name the same few loops.
    private func loop(named node: String) -> Int? {
        if let last = lastNamed, last.name == node { return last.loop }
        guard let loop = Self.loop(named: node) else { return nil }
        lastNamed = (node, loop)
        return loop
    }
    private var lastNamed: (name: String, loop: Int)?

    private static func loop(named node: String) -> Int? {
        var bytes = node.utf8.makeIterator()
        guard bytes.next() == UInt8(ascii: "l"), bytes.next() == UInt8(ascii: "o"), bytes.next() == UInt8(ascii: "o"),
              bytes.next() == UInt8(ascii: "p"), bytes.next() == UInt8(ascii: " ") else { return nil }
        var loop = 0, digits = 0
        while let byte = bytes.next() {
            guard (48...57).contains(byte), digits < 9 else { return nil }
            loop = loop * 10 + Int(byte - 48)
            digits += 1
        }
        return digits > 0 ? loop : nil
    }

    // MARK: Calls

    func call(_ channel: String, node: String?, input: ClusterLink.CallInput, fromText: Bool, refusing refusedKinds: UInt8,
              payload: ArraySlice<UInt8>, completion: ((ClusterLink.CallOutcome) -> Void)?) -> UInt64? {
        let target = if let node { loop(named: node) } else { group.holder(of: channel)?.loop }
        guard !isClosed, let target, target != index, group.cores.indices.contains(target) else {
            completion?(.noHolder)
            return nil
        }
        var id: UInt64?
        if let completion {
            nextCall += 1
            id = nextCall
            waiting[nextCall] = Waiting(loop: target, completion: completion)
        }
        let call = ClusterLink.IncomingCall(caller: name, id: id, input: input, isText: fromText, refusedKinds: refusedKinds,
                                            payload: Array(payload)[...])  // copied out of the caller's inbound buffer
        let core = group.cores[target]
        guard core.loop.execute({ core.value.siblings?.incoming(call, on: channel) }) else {
            if let id { waiting.removeValue(forKey: id)?.completion(goingAway(from: target)) }  // that loop has stopped
            return nil
        }
        callsOut += 1
        return id
    }

    func cancelCall(_ id: UInt64) {
        guard waiting[id] != nil else { return }
        waiting[id]?.isCancelled = true
        sendCancel(id)
    }

    /// Sends the CANCEL of call `id` to the loop that has it.
    private func sendCancel(_ id: UInt64) {
        guard let call = waiting[id] else { return }
        let core = group.cores[call.loop]
        let key = ClusterLink.CallKey(caller: name, id: id)
        if !core.loop.execute({ core.value.siblings?.cancelled(key) }) {
            waiting.removeValue(forKey: id)?.completion(goingAway(from: call.loop))
        }
    }

    /// A call from another loop on `channel`.
    private func incoming(_ call: ClusterLink.IncomingCall, on channel: String, passedOn: Bool = false) {
        guard !isStopping, !isClosed else { return answer(call.key, with: .error(.goingAway)) }
        if !passedOn { callsIn += 1 }  // counted once, where it first came
        handingPassedOn = passedOn
        onCalls?(channel, [call])
        handingPassedOn = false
    }

    /// No client here holds `channel`: if one of yet another loop does (it moved on the way), the call
    /// is passed on there, once, and its caller's loop told where it went; else it gets the null reply.
    func notHeld(_ call: ClusterLink.IncomingCall, on channel: String) {
        if !handingPassedOn, let holder = group.holder(of: channel), holder.loop != index {
            let next = group.cores[holder.loop]
            if next.loop.execute({ next.value.siblings?.incoming(call, on: channel, passedOn: true) }) {
                return tellCaller(of: call.key, passedOnTo: holder.loop)
            }
        }
        answer(call.key, with: .notImplemented)
    }

    /// Tells the caller's loop that its call `key` went on to `loop`, after the call was sent there, so
    /// that its CANCEL follows it. A loop runs its jobs in the order they were queued (one queue per
    /// loop, whoever queued them), hence no race: a CANCEL the caller's loop sends once told reaches
    /// `loop` after the call; one it sent before reached this loop after the call was passed on, found
    /// nothing here, and is sent again when the caller's loop is told (``passedOn(_:to:)``). An answer
    /// that comes before the telling has ended the call there, and the telling finds nothing.
    private func tellCaller(of key: ClusterLink.CallKey?, passedOnTo loop: Int) {
        guard let key, let caller = self.loop(named: key.caller), group.cores.indices.contains(caller) else { return }
        let core = group.cores[caller]
        _ = core.loop.execute { core.value.siblings?.passedOn(key.id, to: loop) }  // a stopped loop waits for no answer
    }

    /// Call `id`, sent from here, was passed on to `loop`.
    private func passedOn(_ id: UInt64, to loop: Int) {
        guard waiting[id] != nil else { return }  // answered already
        waiting[id]?.loop = loop
        if waiting[id]?.isCancelled == true { sendCancel(id) }  // the cancel sent before did not find it
    }

    private func cancelled(_ key: ClusterLink.CallKey) {
        served[key]?.cancel()  // nothing if answered meanwhile
    }

    func serve(_ key: ClusterLink.CallKey?, by call: any ServedCall) {
        guard let key else { return }
        served[key] = call
    }

    func answer(_ key: ClusterLink.CallKey?, kind: UInt8, flags: UInt8, payload: [UInt8]) {
        guard let key, let loop = loop(named: key.caller), group.cores.indices.contains(loop) else { return }
        if served.removeValue(forKey: key) != nil { onServedAnswered?() }
        let reply = ClusterReply(node: name, kind: kind, flags: flags, payload: payload[...])
        let core = group.cores[loop]
        core.loop.execute { core.value.siblings?.answered(key.id, reply) }
    }

    private func answered(_ id: UInt64, _ reply: ClusterReply) {
        waiting.removeValue(forKey: id)?.completion(.reply(reply))
    }

    /// The answer of a loop that has stopped (the server is stopping).
    private func goingAway(from loop: Int) -> ClusterLink.CallOutcome {
        let (kind, _, payload) = RemoteAnswer.encode(.error(.goingAway))
        return .reply(ClusterReply(node: "loop \(loop)", kind: kind.rawValue, flags: 0, payload: payload[...]))
    }

    /// No bus between loops: an answer of any size crosses.
    var recordRoom: Int { .max }
    var servingCount: Int { served.count }
    /// The loops drain together: a sibling's call made just before it heard of the shutdown is served.
    var servesWhileDraining: Bool { true }

    // MARK: Events

    func publish(on channel: String, frame: [UInt8]?, fromHolder: Bool) {
        publish(on: channel, frame: frame, fromHolder: fromHolder, ending: false)
    }

    /// ``publish(on:frame:fromHolder:)``; `ending`: a holder's event that ends its stream (its end, or
    /// the `handler_gone` before it), which, like any end of a stream, waits past the limit: a listener
    /// must hear that its stream ended, and ends are bounded by the streams, not by a producer.
    func publish(on channel: String, frame: [UInt8]?, fromHolder: Bool, ending: Bool) {
        guard let frame else { eventsUnsent += 1; return }  // no wire form: no listener got it either
        let loops = group.loopsListening(to: channel, besides: index)
        guard !loops.isEmpty else { return }
        let envelope = ClusterLink.eventEnvelope(in: frame)  // nil: a holder's end of the stream
        guard envelope != nil || fromHolder else { return }
        let holder = fromHolder ? name : nil
        let mayBeDropped = !ending && envelope != nil
        eventsOut += 1
        for loop in loops {
            let count = group.siblingEventsWaiting[loop]
            guard count.value.add(1, ordering: .relaxed).newValue <= LoopGroup.siblingEventLimit || !mayBeDropped else {
                count.value.subtract(1, ordering: .relaxed)
                dropped += 1
                onDropped?()
                continue
            }
            let core = group.cores[loop]
            let queued = core.loop.execute {
                count.value.subtract(1, ordering: .relaxed)
                core.value.siblings?.received(channel, envelope: envelope, frame: frame, holder: holder)
            }
            if !queued { count.value.subtract(1, ordering: .relaxed) }  // that loop has stopped
        }
    }

    private func received(_ channel: String, envelope: [UInt8]?, frame: [UInt8], holder: String?) {
        guard !isClosed else { return }
        eventsIn += 1
        onEvent?(channel, envelope, frame, holder)
    }

    func listenerAdded(on channel: String) {
        listenerCounts[channel, default: 0] += 1
        if listenerCounts[channel] == 1 { group.listen(to: channel, loop: index) }
    }

    func listenerRemoved(from channel: String) {
        guard let count = listenerCounts[channel] else { return }
        if count > 1 { listenerCounts[channel] = count - 1; return }
        listenerCounts.removeValueShrinking(forKey: channel)
        group.stopListening(to: channel, loop: index)
    }

    // MARK: Stopping

    func stopServing() {
        isStopping = true
        for call in served.values { call.stop() }
    }

    func close() {
        isClosed = true
        waiting = [:]
        served = [:]
        onCalls = nil
        onServedAnswered = nil
        onEvent = nil
        onDropped = nil
    }

    /// For `switchboard/stats`: what crossed between the loops (``LoopGroup/sum(_:)`` adds up the loops').
    var statsValue: ChannelValue {
        .stringMap([
            "eventsOut": .int(eventsOut), "eventsIn": .int(eventsIn), "eventsUnsent": .int(eventsUnsent),
            "callsOut": .int(callsOut), "callsIn": .int(callsIn), "callsForbidden": .int(callsForbidden),
            "callsPending": .int(waiting.count), "callsServing": .int(served.count),
            "dropped": .int(dropped),
        ])
    }
}
