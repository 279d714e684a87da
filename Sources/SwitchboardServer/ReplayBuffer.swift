import SwitchboardCodec

/// The part of a session's stream the server has sent and the client has not acknowledged
/// (protocol/resumption.md, "Streams and positions"): the bytes from ``start`` to ``end``, kept in
/// chunks as they were flushed, so that an acknowledgement frees whole chunks by offset, with no
/// index of frames and no copy of what stays.
struct ReplayBuffer {
    /// The stream position of the oldest byte kept.
    private(set) var start: UInt64 = 0
    /// The bytes kept, oldest first; the first chunk's bytes before ``firstOffset`` are acknowledged.
    private var chunks: [[UInt8]] = []
    private var firstOffset = 0
    /// The bytes kept.
    private(set) var count = 0

    /// A flush smaller than this joins the last chunk rather than making one of its own.
    static let chunkSize = 64 * 1024

    /// The stream position after the last byte kept: the server's sent position.
    var end: UInt64 { start + UInt64(count) }

    /// Keeps `bytes`, sent after everything kept so far.
    mutating func append(_ bytes: [UInt8]) {
        guard !bytes.isEmpty else { return }
        count += bytes.count
        if let last = chunks.indices.last, chunks[last].count + bytes.count <= Self.chunkSize {
            chunks[last].append(copying: bytes)
        } else {
            chunks.append(bytes)
        }
    }

    /// Forgets the bytes before `position` (acknowledged by the client); `position` lies from
    /// ``start`` to ``end``.
    mutating func release(upTo position: UInt64) {
        precondition(position >= start && position <= end, "a release outside what is kept")
        var drop = Int(position - start)
        start = position
        count -= drop
        while drop > 0, let first = chunks.first {
            let left = first.count - firstOffset
            if drop < left {
                firstOffset += drop
                return
            }
            drop -= left
            chunks.removeFirst()
            firstOffset = 0
        }
        if chunks.isEmpty { firstOffset = 0 }
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

    /// Forgets everything, keeping the positions.
    mutating func removeAll() {
        start = end
        chunks = []
        firstOffset = 0
        count = 0
    }
}
