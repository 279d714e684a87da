import Logging
import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// The subjects a link uses, made once per channel in a bounded cache, and the batches calls and answers go in (protocol/cluster.md, "On the bus", "Batches").
extension ClusterLink {
    /// `switchboard.<kind>.<digest>`: a digest of the name, since a name may hold anything a subject may not.
    func subject(_ kind: SubjectKind, _ channel: String) -> String {
        let key = SubjectKey(kind: kind, channel: channel)
        if let subject = subjects[key] { return subject }
        let subject = "switchboard.\(kind.rawValue).\(digest(channel))"
        if makeRoom(Self.cacheCost(channel, subject)) { subjects[key] = subject }
        return subject
    }

    /// The number after the last `.` of a subject (a batch's number in its reply subject).
    static func lastNumber(of subject: String) -> UInt64? {
        guard let dot = subject.utf8.lastIndex(of: 0x2E) else { return nil }
        return UInt64(subject[subject.utf8.index(after: dot)...])
    }

    func digest(_ channel: String) -> String {
        if let digest = digests[channel] { return digest }
        let digest = Digest.sha256Hex(Array(channel.utf8))
        if makeRoom(Self.cacheCost(channel, digest)) { digests[channel] = digest }
        return digest
    }

    /// What the cache counts for an entry: the name, the string made of it, and a dictionary slot's worth.
    static func cacheCost(_ channel: String, _ made: String) -> Int { channel.utf8.count + made.utf8.count + 64 }

    /// Drops what ``hold(_:)`` cached for `channel` (its digest, its call and cancel subjects): a channel
    /// let go is mostly gone for good, and the names of a flood of them would stay cached, scattered
    /// through the heap.
    func uncacheHeld(_ channel: String) {
        if let digest = digests.removeValueShrinking(forKey: channel) { cachedSubjectBytes -= Self.cacheCost(channel, digest) }
        for kind in [SubjectKind.call, .cancel] {
            if let subject = subjects.removeValueShrinking(forKey: SubjectKey(kind: kind, channel: channel)) {
                cachedSubjectBytes -= Self.cacheCost(channel, subject)
            }
        }
    }

    /// Whether an entry of `size` (``cacheCost(_:_:)``, or a name and 64 bytes) may be cached, emptying
    /// the cache (digests, subjects, event numbers) first if it would pass ``subjectCacheBytes``.
    func makeRoom(_ size: Int) -> Bool {
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

    // MARK: Batches

    /// The batch a record of `size` bytes for `key` goes in: the one open for it, or a new one (its
    /// subject made by `subject`) when there is none or the record would take it past ``batchRoom``.
    func batch(_ key: BatchKey, adding size: Int, subject: () -> String) -> Int {
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
    func sendBatches() {
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
    func send(_ batch: Batch) {
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
}
