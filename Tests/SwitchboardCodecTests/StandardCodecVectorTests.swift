import Testing
@testable import SwitchboardCodec

@Suite struct StandardMessageCodecVectors {
    let codec = StandardMessageCodec()

    @Test func nullPayloadAndEmptyPayloadDecodeAsNull() throws {
        #expect(try codec.decode(nil) == .null)
        #expect(try codec.decode([]) == .null)
        #expect(try codec.encode(.null) == [0])
    }

    @Test func reencodingPreservesNaNPayloadsAndIntWidths() throws {
        // A NaN with a payload, -0.0, an int64 holding a small value, map order z before a.
        let bytes = hex("0c 04 06 0000000000 010000000000f87f 06 00000000000000 0000000000000080 04 0500000000000000"
            + " 0d 02 07 01 7a 00 07 01 61 00")
        #expect(try codec.encode(codec.decode(bytes)) == bytes)
    }

    @Test func flutterCompositeMessageRoundTrips() throws {
        let message: ChannelValue = .list([
            .null, true, false, -707, .int64(-7_000_000_007), -3.14, "", "hello",
            .uint8List([0xBA, 0x5E, 0xBA, 0x11]), .int32List([Int32.min, 0, Int32.max]), .null,
            .int64List([Int64.min, 0, Int64.max]), .null,
            .float64List([-.infinity, -.greatestFiniteMagnitude, -.leastNonzeroMagnitude, -0.0, 0.0,
                          .leastNonzeroMagnitude, .greatestFiniteMagnitude, .infinity, .nan]),
            ["nested", []], .map([.init("a", "nested"), .init(.null, .map([]))]), "world",
        ])
        let encoded = try codec.encode(message)
        #expect(try codec.decode(encoded) == message)
        #expect(try codec.encode(codec.decode(encoded)) == encoded)
    }
}

@Suite struct StandardMethodCodecVectors {
    let codec = StandardMethodCodec()

    @Test func aNullPayloadIsNotACall() {
        #expect(throws: CodecError.self) { try codec.decodeMethodCall(nil) }
    }
}

@Suite struct HostileStandardInput {
    let codec = StandardMessageCodec()

    @Test func declaredSizeErrorNamesTheOffset() {
        do {
            _ = try codec.decode(hex("0c 02 01 08 ff ffffffff"))
            Issue.record("expected an error")
        } catch {
            #expect(error.offset == 9)
            #expect(error.reason.contains("remain"))
        }
    }

    @Test func nestingLimit() throws {
        let ok: [UInt8] = Array([[UInt8]](repeating: [0x0c, 1], count: 999).joined()) + [0x0c, 0]  // 1000 levels
        #expect(throws: Never.self) { try codec.decode(ok) }
        let deep: [UInt8] = Array([[UInt8]](repeating: [0x0c, 1], count: 1000).joined()) + [0x0c, 0]  // 1001 levels
        #expect(throws: CodecError.self) { try codec.decode(deep) }
        let endless: [UInt8] = Array([[UInt8]](repeating: [0x0c, 1], count: 200_000).joined())  // would overflow the stack
        #expect(throws: CodecError.self) { try codec.decode(endless) }
        var value: ChannelValue = .null
        for _ in 0..<1001 { value = .list([value]) }
        #expect(throws: CodecError.self) { try codec.encode(value) }
    }

    @Test func everyTruncationOfAValidMessageFails() throws {
        let message: ChannelValue = ["k": [1, 2.5, "s", .uint8List([1, 2, 3]), .float64List([1, 2])], "n": .null]
        let bytes = try codec.encode(message)!
        for cut in 1..<bytes.count {
            #expect(throws: CodecError.self) { try codec.decode(Array(bytes.prefix(cut))) }
        }
    }
}
