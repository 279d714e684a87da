/// Bytes received but not parsed yet: a growable array plus a reader index, compacted rarely.
public struct InboundBuffer: Sendable {
    private(set) var storage: [UInt8] = []
    private(set) var readerIndex = 0

    /// Makes an empty buffer.
    public init() {}

    /// Bytes not consumed yet.
    public var readableBytes: Int { storage.count - readerIndex }

    /// Adds received bytes; adopts the array without copying when nothing is buffered.
    public mutating func append(_ bytes: [UInt8]) {
        if readableBytes == 0 {
            storage = bytes
            readerIndex = 0
        } else {
            storage.append(contentsOf: bytes)
        }
    }

    /// The unread bytes.
    public var readable: ArraySlice<UInt8> { storage[readerIndex...] }

    /// The byte `offset` bytes past the reader index.
    public func byte(at offset: Int) -> UInt8 { storage[readerIndex + offset] }

    /// Marks `count` bytes consumed; compacts only when the dead prefix is large and at least half the buffer.
    /// Once everything is consumed the storage is let go, not kept for later: the next bytes are adopted
    /// whole, and the storage is usually still shared with the read that brought it (keeping its capacity
    /// would allocate a copy).
    public mutating func consume(_ count: Int) {
        precondition(count <= readableBytes, "consumed more than was readable")
        readerIndex += count
        if readerIndex == storage.count {
            storage = []
            readerIndex = 0
        } else if readerIndex >= 64 * 1024, readerIndex * 2 >= storage.count {
            storage.removeFirst(readerIndex)
            readerIndex = 0
        }
    }

    /// Drops everything buffered.
    public mutating func clear() {
        storage = []
        readerIndex = 0
    }
}
