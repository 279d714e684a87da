import Logging
import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// Liveness between nodes: beacons, the leases of calls, and the peers heard from (protocol/cluster.md, "Beacons").
extension ClusterLink {
    // MARK: Beacons

    /// Whether `text` can be a node's instance: what ``instance`` is made of, hex digits.
    static func isInstance<S: StringProtocol>(_ text: S) -> Bool {
        !text.isEmpty && text.utf8.count <= 16 && text.utf8.allSatisfy { (48...57).contains($0) || (97...102).contains($0) }
    }

    /// Starts watching `node`'s beacons (as if one had just come), once it answered or called: a node
    /// that dies before its first beacon is lost all the same.
    func notePeer(_ node: String) {
        guard Self.isInstance(node) else { return }
        if peers[node] == nil { peers[node] = Peer(lastSeen: loop.now) }
    }

    /// Sends this node's beacon, and ends what the silence of other nodes has let lapse.
    func tick() {
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
        for (key, call) in served { byCaller[key.caller, default: []].append((key.id, call.channelMark == "-" ? "" : String(call.channelMark))) }
        for (caller, ids) in byCaller.sorted(by: { $0.key < $1.key }) {
            let ids = ids.sorted { $0.id < $1.id }
            for chunk in stride(from: 0, to: ids.count, by: 2048) {
                let line = Array((caller + ids[chunk..<min(chunk + 2048, ids.count)].map { " \($0.id)\($0.codec)" }.joined() + "\n").utf8)
                if beacon.count + line.count > 64 << 10 {
                    try? bus.publish("switchboard.beacon", headers: beaconHeaders, payload: beacon)
                    beacon = first
                }
                beacon += line
            }
        }
        try? bus.publish("switchboard.beacon", headers: beaconHeaders, payload: beacon)

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
            call.completion(call.cancelledAt == nil ? .expired : .cancelled(mark: call.channelMark ?? channelMarks[call.channel]))
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
    func endServedCalls(of node: String) {
        for call in served.filter({ $0.key.caller == node }).sorted(by: { $0.key.id < $1.key.id }).map(\.value) {
            call.callerLost()
        }
    }

    /// Notes what a holder's node told of `channel`: its method codec's mark, or `-`.
    func learn(_ channel: String, isMarked mark: Character) {
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

    /// Whether a node whose server's process has `mark` is alive: its beacons come (a sibling loop of
    /// this one's server is such a node too).
    package func hears(process mark: String) -> Bool { peers.values.contains { $0.process == mark } }

    /// Another node's beacon: it is alive, and so are the calls it names for this node.
    func beacon(_ message: BusMessage) {
        let lines = String(decoding: message.payload, as: UTF8.self).split(separator: "\n")
        guard let first = lines.first else { return }
        let fields = first.split(separator: " ", maxSplits: 2)
        // Counts from another node are checked before any arithmetic: a sum or difference of them must not trap.
        guard fields.count >= 2, Self.isInstance(fields[0]), let heldCount = Int(fields[1]),
              (0...Int(UInt32.max)).contains(heldCount) else { return }
        let now = loop.now
        let node = String(fields[0])
        let process = message.header("Sb-Process").flatMap { Self.isInstance($0) ? $0 : nil }  // the same hex digits, at most 16
        peers[node] = Peer(lastSeen: now, name: fields.count > 2 ? String(fields[2]) : "", held: heldCount, process: process)
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
}
