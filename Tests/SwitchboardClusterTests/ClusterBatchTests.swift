import Testing
@testable import SwitchboardCluster

/// The records calls and answers cross the bus in (protocol/cluster.md, "Batches").
@Suite("Cluster batches") struct ClusterBatchTests {
    @Test("records read back as written, in order; bytes that are not whole records are refused")
    func recordsRoundTrip() throws {
        var batch: [UInt8] = []
        BatchRecord.append(id: 1, kind: UInt8(ascii: "b"), flags: 1, payload: [9, 8, 7], to: &batch)
        BatchRecord.append(id: 0x0102_0304_0506_0708, kind: UInt8(ascii: "n"), flags: 0, payload: [], to: &batch)
        BatchRecord.append(id: 3, kind: UInt8(ascii: "c"), flags: 2, payload: Array(repeating: 5, count: 300), to: &batch)
        #expect(Array(batch.prefix(14)) == [0, 0, 0, 0, 0, 0, 0, 1, UInt8(ascii: "b"), 1, 0, 0, 0, 3])
        let records = try #require(BatchRecord.records(in: batch))
        #expect(records.map(\.id) == [1, 0x0102_0304_0506_0708, 3])
        #expect(records.map(\.kind) == [UInt8(ascii: "b"), UInt8(ascii: "n"), UInt8(ascii: "c")])
        #expect(records.map(\.flags) == [1, 0, 2])
        #expect(records.map { Array($0.payload) } == [[9, 8, 7], [], Array(repeating: 5, count: 300)])
        #expect(BatchRecord.records(in: [])?.isEmpty == true)
        for cut in 1..<batch.count where ![17, 31].contains(cut) {  // ends of whole records are fine
            #expect(BatchRecord.records(in: Array(batch.prefix(cut))) == nil, "cut at \(cut)")
        }
    }
}
