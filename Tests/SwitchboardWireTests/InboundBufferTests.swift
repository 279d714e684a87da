import Testing
@testable import SwitchboardWire  // `readerIndex`: to see that compaction happened

/// `InboundBuffer`: what is appended is read back in order, whatever is consumed and compacted between.
@Suite struct InboundBufferTests {
    @Test("compaction drops only the consumed bytes: the unread ones stay, in order, and appends go after them")
    func compactionKeepsUnreadBytes() {
        var buffer = InboundBuffer()
        let first = (0..<100_000).map { UInt8(truncatingIfNeeded: $0 &* 7) }
        buffer.append(first)
        buffer.consume(70_000)  // past 64 KiB and more than half: compacts
        #expect(buffer.readerIndex == 0)
        #expect(Array(buffer.readable) == Array(first[70_000...]))
        #expect(buffer.byte(at: 0) == first[70_000] && buffer.byte(at: 29_999) == first[99_999])
        buffer.append([1, 2, 3])
        #expect(Array(buffer.readable) == Array(first[70_000...]) + [1, 2, 3])
    }

    @Test("below the threshold the consumed prefix stays and the reader index moves")
    func noCompactionBelowThreshold() {
        var buffer = InboundBuffer()
        let bytes = (0..<1000).map { UInt8(truncatingIfNeeded: $0) }
        buffer.append(bytes)
        buffer.consume(600)
        #expect(buffer.readerIndex == 600 && buffer.readableBytes == 400)
        #expect(Array(buffer.readable) == Array(bytes[600...]))
    }

    @Test("consuming everything lets the storage go; the next bytes are read from the start")
    func consumeEverything() {
        var buffer = InboundBuffer()
        buffer.append([1, 2, 3])
        buffer.consume(3)
        #expect(buffer.readableBytes == 0 && buffer.storage.capacity == 0)
        buffer.append([4, 5])
        #expect(Array(buffer.readable) == [4, 5] && buffer.byte(at: 1) == 5)
        buffer.clear()
        #expect(buffer.readableBytes == 0)
    }
}
