import SwitchboardCodec

/// The part of a session's stream the server has sent and the client has not acknowledged
/// (protocol/resumption.md, "Streams and positions"): the bytes from ``start`` to ``end``, kept in
/// chunks as they were flushed, so that an acknowledgement frees whole chunks by offset, with no
/// index of frames and no copy of what stays. A large flush is kept without a copy: its chunk shares
/// the flushed array, and the transport's write leaves the connection a fresh buffer of the same
/// capacity (an array it does not own alone is emptied into a new one).
struct ReplayBuffer {
    /// The stream position of the oldest byte kept.
    private(set) var start: UInt64 = 0
    /// The bytes kept, oldest first; the first chunk's bytes before ``firstOffset`` are acknowledged.
    private var chunks: [[UInt8]] = []
    private var firstOffset = 0
    /// The bytes kept.
    private(set) var count = 0

    /// Small flushes are copied into chunks of up to this many bytes.
    static let chunkSize = 64 * 1024
    /// A flush of at least this many bytes is a chunk of its own, sharing the flushed array, unless
    /// that array's capacity is over twice its count (no shared array holds more than twice what it keeps).
    static let sharedFlushSize = 4 * 1024

    /// The stream position after the last byte kept: the server's sent position.
    var end: UInt64 { start + UInt64(count) }

    /// Keeps `bytes`, sent after everything kept so far. A chunk begun for small flushes reserves
    /// ``chunkSize`` bytes, or `limit` (the most its session may keep) if that is less, so that it
    /// never grows by copying.
    mutating func append(_ bytes: consuming [UInt8], limit: Int) {
        guard !bytes.isEmpty else { return }
        count += bytes.count
        if bytes.count >= Self.sharedFlushSize, bytes.capacity <= 2 * bytes.count {
            chunks.append(bytes)
        } else if let last = chunks.indices.last, chunks[last].count + bytes.count <= Self.chunkSize {
            chunks[last].append(copying: bytes)
        } else {
            var chunk: [UInt8] = []
            chunk.reserveCapacity(max(bytes.count, min(Self.chunkSize, limit)))
            chunk.append(copying: bytes)
            chunks.append(chunk)
        }
    }

    /// Forgets the bytes before `position` (acknowledged by the client); `position` lies from
    /// ``start`` to ``end``.
    mutating func release(upTo position: UInt64) {
        precondition(position >= start && position <= end, "a release outside what is kept")
        var drop = Int(position - start)
        start = position
        count -= drop
        var freed = 0  // whole chunks acknowledged, removed at once
        while drop > 0, freed < chunks.count {
            let left = chunks[freed].count - firstOffset
            if drop < left {
                firstOffset += drop
                compactFirst(from: freed, largerThan: Self.chunkSize)
                break
            }
            drop -= left
            freed += 1
            firstOffset = 0
        }
        chunks.removeFirst(freed)
        if chunks.isEmpty { firstOffset = 0 }
    }

    /// Copies what is left of the chunk at `index` (which becomes the first) into an array of its size,
    /// when that is under half the array it is in, and the array holds more than `largerThan` bytes: a
    /// large flush kept whole is not held for its last unacknowledged bytes. (Acknowledgements leave
    /// chunks of at most ``chunkSize`` alone: the hot path's, of which a session has few.)
    private mutating func compactFirst(from index: Int, largerThan: Int) {
        let chunk = chunks[index]
        guard chunk.capacity > largerThan, 2 * (chunk.count - firstOffset) < chunk.capacity else { return }
        var rest: [UInt8] = []
        rest.reserveCapacity(chunk.count - firstOffset)
        rest.append(contentsOf: chunk[firstOffset...])
        chunks[index] = rest
        firstOffset = 0
    }

    /// The bytes kept from `position` on, for a resume; `position` lies from ``start`` to ``end``.
    func bytes(from position: UInt64) -> [UInt8] {
        precondition(position >= start && position <= end, "a replay outside what is kept")
        var skip = Int(position - start) + firstOffset
        var out: [UInt8] = []
        out.reserveCapacity(Int(end - position))
        for chunk in chunks {
            if skip >= chunk.count {
                skip -= chunk.count
                continue
            }
            out.append(contentsOf: chunk[skip...])
            skip = 0
        }
        return out
    }

    /// Lets go of the room the last chunk reserved and does not use, and of what the first holds that is
    /// acknowledged (a parked session's may wait long).
    mutating func trimCapacity() {
        if !chunks.isEmpty { compactFirst(from: 0, largerThan: 0) }
        guard let last = chunks.indices.last, chunks[last].capacity > 2 * chunks[last].count else { return }
        var chunk: [UInt8] = []
        chunk.reserveCapacity(chunks[last].count)
        chunk.append(copying: chunks[last])
        chunks[last] = chunk
    }

    /// The bytes its arrays hold, used or not: about twice ``count`` at most, besides one chunk of
    /// ``chunkSize`` at either end.
    var heldCapacity: Int { chunks.reduce(0) { $0 + $1.capacity } }

    /// Forgets everything, keeping the positions.
    mutating func removeAll() {
        start = end
        chunks = []
        firstOffset = 0
        count = 0
    }
}
