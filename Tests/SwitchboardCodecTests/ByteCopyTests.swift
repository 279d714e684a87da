import Testing
import SwitchboardCodec

@Suite struct ByteCopy {
    @Test func appendsAWholeArrayAfterWhatIsThere() {
        var out: [UInt8] = [9]
        out.append(copying: [1, 2, 3])
        out.append(copying: [])
        #expect(out == [9, 1, 2, 3])
    }

    /// A slice keeps its parent's indices: the copy must start at its first element, not at index 0.
    @Test func appendsASliceFromItsOwnStart() {
        let frame: [UInt8] = Array(0..<200)
        var out: [UInt8] = []
        out.append(copying: frame[150..<160])
        out.append(copying: frame[0..<0])
        #expect(out == Array(150..<160))
    }

    /// The source is borrowed, never changed, and the copy does not share its storage.
    @Test func leavesTheSourceAlone() {
        let source: [UInt8] = [4, 5, 6]
        var out: [UInt8] = []
        out.append(copying: source)
        out[0] = 0
        #expect(source == [4, 5, 6])
        #expect(out == [0, 5, 6])
    }
}
