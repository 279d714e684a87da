import Testing
@testable import SwitchboardServer

/// What a session keeps of its stream (protocol/resumption.md, "Streams and positions"): whatever the
/// sizes of the flushes (small ones copied into chunks, large ones kept as they are), every byte from
/// any kept position on comes back, in order, after any acknowledgement.
@Suite struct ReplayBufferTests {
    /// Flushes of every kind: small, large with a tight array, large with a loose one, and small again.
    static func flushes() -> [[UInt8]] {
        var loose: [UInt8] = []
        loose.reserveCapacity(40_000)
        loose.append(contentsOf: (0..<9_000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
        return [Array(repeating: 1, count: 100), (0..<5_000).map { UInt8(truncatingIfNeeded: $0) }, loose,
                Array(repeating: 2, count: 3_000), (0..<70_000).map { UInt8(truncatingIfNeeded: $0 &* 3) },
                Array(repeating: 3, count: 10)]
    }

    @Test func everyKeptByteComesBackAfterAnyAcknowledgement() {
        let stream = Self.flushes().flatMap { $0 }
        for acknowledged in [0, 1, 100, 5_099, 5_100, 14_100, 17_100, 87_099, stream.count] {
            var replay = ReplayBuffer()
            for flush in Self.flushes() { replay.append(flush, limit: 1 << 20) }
            #expect(replay.end == UInt64(stream.count))
            replay.release(upTo: UInt64(acknowledged))
            #expect(replay.count == stream.count - acknowledged)
            for position in [acknowledged, (acknowledged + stream.count) / 2, stream.count] {
                #expect(replay.bytes(from: UInt64(position)) == Array(stream[position...]))
            }
        }
    }

    @Test func aSharedFlushIsNotChangedByTheBufferItCameFrom() {
        var outbound = (0..<8_000).map { UInt8(truncatingIfNeeded: $0) }
        let sent = outbound
        var replay = ReplayBuffer()
        replay.append(outbound, limit: 1 << 20)
        outbound.removeAll(keepingCapacity: true)  // as the transport's write leaves it
        outbound.append(contentsOf: repeatElement(9, count: 8_000))
        #expect(replay.bytes(from: 0) == sent)
    }

    /// A large flush kept whole and acknowledged all but its last bytes is not held whole for them, and
    /// a parked session's first chunk lets go of what was acknowledged.
    @Test func whatIsAcknowledgedOfALargeFlushIsLetGo() {
        var replay = ReplayBuffer()
        replay.append(Array(repeating: 7, count: 1 << 20), limit: 2 << 20)
        replay.release(upTo: (1 << 20) - 100)
        #expect(replay.heldCapacity < 4096)
        #expect(replay.bytes(from: (1 << 20) - 100) == Array(repeating: 7, count: 100))
        var small = ReplayBuffer()
        small.append(Array(repeating: 1, count: 30_000), limit: 1 << 20)
        small.append(Array(repeating: 2, count: 3_000), limit: 1 << 20)
        small.release(upTo: 32_000)
        small.trimCapacity()
        #expect(small.heldCapacity < 4096)
        #expect(small.bytes(from: 32_000) == Array(repeating: 2, count: 1_000))
    }

    @Test func trimmingKeepsEveryByte() {
        let stream = Self.flushes().flatMap { $0 }
        var replay = ReplayBuffer()
        for flush in Self.flushes() { replay.append(flush, limit: 1 << 20) }
        replay.release(upTo: 50)
        replay.trimCapacity()
        replay.append([4, 5, 6], limit: 1 << 20)
        #expect(replay.bytes(from: 50) == Array(stream[50...]) + [4, 5, 6])
    }
}
