import Logging
import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// Calls between nodes: sent to the holders' queue group and answered back, or taken from other nodes and served here (protocol/cluster.md, "Channels held by clients").
extension ClusterLink {
    // MARK: Calls to other nodes

    /// Sends a call on `channel` to the holders' queue group, or to one node's holder (`node`); with
    /// a `completion`, its one outcome comes back to it. Returns the call's id (nil: wants no answer).
    @discardableResult
    package func call(_ channel: String, node: String? = nil, input: CallInput, fromText: Bool = false, refusing refusedKinds: UInt8 = 0,
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

    /// The caller cancelled call `id`: every holder of its channel hears, and the one working on it
    /// answers it (or the lease ends it).
    package func cancelCall(_ id: UInt64) {
        guard let call = outgoing[id], call.cancelledAt == nil else { return }
        outgoing[id]?.cancelledAt = loop.now
        sendBatches()  // the call goes before its cancel
        try? bus.publish(subject(.cancel, call.channel), headers: callerHeaders, payload: Array(String(id).utf8))
    }

    /// A batch of answers from a holder's node.
    func answered(_ message: BusMessage) {
        guard let node = message.header("Sb-Node"), Self.isInstance(node), let records = BatchRecord.records(in: message.payload) else {
            batchesMalformed += 1
            return
        }
        notePeer(node)
        for record in records {
            guard let call = outgoing.removeValue(forKey: record.id) else { continue }  // cancelled or expired meanwhile
            if let mark = ClusterReply.mark(flags: record.flags) { learn(call.channel, isMarked: mark) }
            call.completion(.reply(ClusterReply(node: node, kind: record.kind, flags: record.flags, payload: record.payload)))
        }
    }

    /// A status on a batch's reply subject: 503, nobody holds the channel.
    func unheard(_ message: BusMessage) {
        guard message.status == 503, let batch = Self.lastNumber(of: message.subject) else { return }
        noHolder(batch: batch)
    }

    func noHolder(batch: UInt64) {
        for id in batchCalls.removeValue(forKey: batch) ?? [] {
            guard let call = outgoing.removeValue(forKey: id) else { continue }
            callsNoResponders += 1
            call.completion(.noHolder)
        }
    }

    // MARK: Calls from other nodes

    /// A client here holds `channel`: calls from other nodes may come to it (each batch to one of the
    /// nodes that hold it: a NATS queue group), and so may their cancels.
    package func hold(_ channel: String) {
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
    package func stopTakingCalls() {
        for channel in held.keys.sorted() {
            if let calls = held[channel]?.calls { bus.unsubscribe(calls) }
            held[channel]?.calls = nil
        }
    }

    /// Answers what other nodes' clients wait for here with `going_away` (the server is stopping); the
    /// bus stays up until ``close()``, to carry the answers.
    package func stopServing() {
        for channel in held.keys.sorted() { letGo(channel) }
        for call in served.values { call.stop() }
    }

    /// The holder of `channel` let it go.
    package func letGo(_ channel: String) {
        guard let subscriptions = held.removeValueShrinking(forKey: channel) else { return }
        heldByDigest.removeValueShrinking(forKey: digest(channel))
        uncacheHeld(channel)
        for subscription in [subscriptions.calls, subscriptions.cancels] { subscription.map(bus.unsubscribe) }
    }

    /// A batch of calls from another node, on `channel` (nil: a channel no longer held here, whose
    /// calls get "no handler" at once). A batch that is not whole records is dropped: its calls lapse.
    func incoming(_ message: BusMessage, on channel: String?) {
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
            for call in calls { answer(call.key, kind: ClusterReply.nullKind, flags: 0, payload: []) }
            return
        }
        callsIn += calls.count
        onCalls?(channel, calls)
    }

    /// Keeps `call` (serving the call `key` names, not answered yet) in the beacons until it is
    /// answered, and reachable by a cancel.
    package func serve(_ key: CallKey?, by call: any ServedCall) {
        guard let key else { return }
        served[key] = call
    }

    /// Sends the answer to the call `key` names (nil: it wants none), as a record of `kind`, `flags`
    /// and `payload` (``ClusterReply``; at most ``recordRoom`` bytes), and stops naming it in beacons.
    package func answer(_ key: CallKey?, kind: UInt8, flags: UInt8, payload: [UInt8]) {
        guard let key, !isClosed else { return }
        if served.removeValue(forKey: key) != nil { onServedAnswered?() }
        let index = batch(.answers(caller: key.caller), adding: payload.count) { "switchboard.answers.\(key.caller)" }
        BatchRecord.append(id: key.id, kind: kind, flags: flags, payload: payload, to: &batches[index].records)
    }

    func cancelled(_ message: BusMessage) {
        guard let caller = message.header("Sb-Caller"), let id = UInt64(String(decoding: message.payload, as: UTF8.self)),
              let call = served[CallKey(caller: caller, id: id)] else { return }  // answered meanwhile
        call.cancel()
    }
}

/// A call from another node being worked on here, as the link needs it: the server's request behind
/// it, kept until it is answered (``ClusterLink/answer(_:kind:flags:payload:)``).
package protocol ServedCall: AnyObject {
    /// What its channel is, for the beacons: `s` a method channel in the standard method codec, `j`
    /// in the JSON one, `-` any other channel.
    var channelMark: Character { get }
    /// Its caller cancelled it: it is answered as the node's own client's CANCEL would be.
    func cancel()
    /// Its caller's node went silent: it is answered `handler_gone`, and its holder hears CANCEL.
    func callerLost()
    /// The server is stopping: it is answered `going_away`.
    func stop()
}

/// An answer from another node's holder: its node, and the answer as its batch record carries it
/// (the server reads the record's kind and payload).
package struct ClusterReply: Sendable {
    /// The holder's node (its instance).
    package let node: String
    /// The answer's kind, as a byte.
    package let kind: UInt8
    package let flags: UInt8
    /// A slice of the batch: copied by whatever keeps it.
    package let payload: ArraySlice<UInt8>

    package init(node: String, kind: UInt8, flags: UInt8, payload: ArraySlice<UInt8>) {
        self.node = node
        self.kind = kind
        self.flags = flags
        self.payload = payload
    }

    /// Flags: the envelope is in the JSON method codec (else the standard one); the answer starts the
    /// caller node's stream (the success of a listen on an event channel).
    package static let jsonFlag: UInt8 = 1, streamFlag: UInt8 = 2
    /// The kind of a null reply (`z`, no payload): what a call gets that reaches a node no longer
    /// holding its channel.
    package static let nullKind: UInt8 = 0x7A
    /// Flags: what the holder's node knows the channel to be, from its holder's registration: a method
    /// channel in the standard or the JSON method codec, or another kind (none: not told).
    package static let standardMethodFlag: UInt8 = 4, jsonMethodFlag: UInt8 = 8, otherKindFlag: UInt8 = 16

    /// The flag telling a channel's kind, from its mark (``ServedCall/channelMark``).
    package static func kindFlag(mark: Character) -> UInt8 {
        switch mark {
        case "s": standardMethodFlag
        case "j": jsonMethodFlag
        default: otherKindFlag
        }
    }

    /// The mark a record's flags tell, if they tell one.
    static func mark(flags: UInt8) -> Character? {
        if flags & standardMethodFlag != 0 { return "s" }
        if flags & jsonMethodFlag != 0 { return "j" }
        return flags & otherKindFlag != 0 ? "-" : nil
    }

    package var startsStream: Bool { flags & Self.streamFlag != 0 }
}
