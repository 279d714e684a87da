import Logging
import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// Broadcasts and holders' events between nodes, and the interest that subscribes to them (protocol/cluster.md, "Broadcasts").
extension ClusterLink {
    // MARK: Broadcasts

    /// Whether the bus is connected: what is published now can reach the other nodes.
    package var isConnected: Bool { bus.isConnected }

    /// Sends a local event on `channel`, as its wire `frame`, to the other nodes: a broadcast, or
    /// (`fromHolder`) an event of a channel a client holds here, for the listeners other nodes have
    /// through this node. A nil frame (the event has no wire form) is counted as unsent.
    package func publish(on channel: String, frame: [UInt8]?, fromHolder: Bool = false) {
        guard let frame else { eventsUnsent += 1; return }  // no wire form: no listener got it either
        sendBatches()  // a listen's answer goes before the stream's first event
        let dropped = bus.counters.dropped
        // A number is used only by an event that left, so that what the
        // sender counts as unsent is never counted again as missed where it did not arrive.
        let number = (sentCounts[channel] ?? 0) &+ 1
        do {
            let subject = subject(.event, channel)
            var headers = fromHolder ? nodeHeaders : siblingHeaders
            headers.append(BusMessage.Header("Sb-Seq", "\(instance) \(number)"))
            try bus.publish(subject, headers: headers, payload: frame)
        } catch {
            eventsUnsent += 1
            return
        }
        guard bus.counters.dropped == dropped else { eventsUnsent += 1; return }
        eventsOut += 1
        noteSent(number, on: channel)
    }

    /// Events of a channel held here that a node's listeners missed because this node had forgotten
    /// them (the server found it had forgotten them): counted as unsent.
    package func countUnsent(_ events: Int) { eventsUnsent += events }

    /// `number` went out on `channel`: the next event there is `number + 1` (1 after the cache was emptied).
    func noteSent(_ number: UInt64, on channel: String) {
        if sentCounts[channel] != nil || makeRoom(channel.utf8.count + 64) { sentCounts[channel] = number }
    }

    /// Takes the number of an event from another node on `channel` (`Sb-Seq: <n> <number>`): a gap
    /// since the last one from that node counts its events as missed; a smaller number is a new start
    /// (that node's cache was emptied) and counts nothing. Only a node this one knows (``peers``) starts
    /// being numbered: what anyone else on the bus makes up is neither kept nor counted. (After a stall
    /// or an outage, which forget every peer until its next beacon, the numbers kept go on.)
    func noteNumber(_ mark: String, on channel: String) {
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
    package func listenerAdded(on channel: String) {
        listenerCounts[channel, default: 0] += 1
        guard listenerCounts[channel] == 1 else { return }
        subscriptions[channel] = try? bus.subscribe(subject(.event, channel), queue: nil) { [unowned self] message in
            received(message, on: channel)
        }
    }

    /// A local listener left `channel`; after the last one the node unsubscribes.
    package func listenerRemoved(from channel: String) {
        guard let count = listenerCounts[channel] else { return }
        if count > 1 { listenerCounts[channel] = count - 1; return }
        listenerCounts.removeValue(forKey: channel)
        for origin in Array(receivedNumbers.keys) {  // what is sent while nobody here listens is not missed
            receivedNumbers[origin]?.removeValue(forKey: channel)
            if receivedNumbers[origin]?.isEmpty == true { receivedNumbers.removeValue(forKey: origin) }
        }
        if let subscription = subscriptions.removeValue(forKey: channel) { bus.unsubscribe(subscription) }
    }

    /// An event the bus brought on `channel`: a broadcast, or (with `Sb-Node`) an event of a channel a
    /// client holds on that holder's node.
    func received(_ message: BusMessage, on channel: String) {
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
    static func eventFrame(_ bytes: [UInt8]) -> Frame? {
        var buffer = InboundBuffer()
        buffer.append(bytes)
        var decoder = FrameDecoder(maxFrame: UInt32(clamping: bytes.count))
        guard case .frame(let frame)? = try? decoder.next(from: &buffer), buffer.readableBytes == 0,
              frame.kind == .message, frame.id == 0 else { return nil }
        return frame
    }

    /// The envelope a broadcast's frame carries (a broadcast always has one).
    package static func eventEnvelope(in frame: [UInt8]) -> [UInt8]? { eventFrame(frame)?.payload }
}
