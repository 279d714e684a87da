/// The records that calls and answers travel in between nodes (protocol/cluster.md, "Batches"): the
/// calls a node makes to one subject in one loop turn go in one bus message, and so do the answers a
/// node sends to one calling node in one turn. Each record is
///
///     id (8 bytes, big-endian) · kind (1 byte) · flags (1 byte) · length (4 bytes, big-endian) · payload
///
/// A call's `id` is its caller's (0: it wants no answer), `kind` its ``ClusterLink/CallInput`` and flag
/// 1 a text-mode caller. An answer's `id` is the call's, `kind` the server's answer kind, flag 1 an
/// envelope in the JSON method codec (else the standard one) and flag 2 the start of a stream.
struct BatchRecord {
    let id: UInt64
    let kind: UInt8
    let flags: UInt8
    let payload: ArraySlice<UInt8>

    static let headerSize = 14

    /// Appends a record to `batch`.
    static func append(id: UInt64, kind: UInt8, flags: UInt8, payload: some Collection<UInt8>, to batch: inout [UInt8]) {
        appendBigEndian(id, bytes: 8, to: &batch)
        batch.append(kind)
        batch.append(flags)
        appendBigEndian(UInt64(payload.count), bytes: 4, to: &batch)
        batch += payload
    }

    /// The records of a batch, in order; nil if the bytes are not whole records (nothing of such a
    /// batch is taken).
    static func records(in batch: [UInt8]) -> [BatchRecord]? {
        var records: [BatchRecord] = []
        var at = 0
        while at < batch.count {
            guard batch.count - at >= headerSize else { return nil }
            let id = bigEndian(batch, at, 8)
            let length = Int(bigEndian(batch, at + 10, 4))
            let start = at + headerSize
            guard batch.count - start >= length else { return nil }
            records.append(BatchRecord(id: id, kind: batch[at + 8], flags: batch[at + 9], payload: batch[start..<(start + length)]))
            at = start + length
        }
        return records
    }

    static func appendBigEndian(_ value: UInt64, bytes count: Int, to batch: inout [UInt8]) {
        for shift in stride(from: (count - 1) * 8, through: 0, by: -8) { batch.append(UInt8(truncatingIfNeeded: value >> UInt64(shift))) }
    }

    static func bigEndian(_ bytes: [UInt8], _ at: Int, _ count: Int) -> UInt64 {
        var value: UInt64 = 0
        for index in at..<(at + count) { value = value << 8 | UInt64(bytes[index]) }
        return value
    }
}
