import Testing
@testable import SwitchboardCodec

@Suite struct StandardMessageCodecVectors {
    let codec = StandardMessageCodec()

    @Test(arguments: [
        (ChannelValue.null, "00"),
        (.bool(true), "01"),
        (.bool(false), "02"),
        (.int32(-7), "03 f9ffffff"),
        (.int32(Int32.max), "03 ffffff7f"),
        (.int64(98_742_923_489), "04 e17089fd16000000"),
        (.int64(-1), "04 ffffffffffffffff"),
        (.float64(1.0), "06 00000000000000 000000000000f03f"),
        (.string(""), "07 00"),
        (.string("hello"), "07 05 68656c6c6f"),
        (.string("\u{263A}"), "07 03 e298ba"),
        (.uint8List([0xBA, 0x5E, 0xBA, 0x11]), "08 04 ba5eba11"),
        (.int32List([-1, 2]), "09 02 0000 ffffffff 02000000"),
        (.int64List([1]), "0a 01 000000000000 0100000000000000"),
        (.float32List([1.0]), "0e 01 0000 0000803f"),
        (.float64List([1.0]), "0b 01 000000000000 000000000000f03f"),
        (.list([.string("nested"), .list([])]), "0c 02 07 06 6e6573746564 0c 00"),
        (.map([.init(.string("a"), .int32(1)), .init(.null, .map([]))]), "0d 02 07 01 61 03 01000000 00 0d 00"),
        // A double inside a list aligns from the start of the whole message.
        (.list([.float64(1.0)]), "0c 01 06 0000000000 000000000000f03f"),
        (.list([.null, .float64(1.0)]), "0c 02 00 06 00000000 000000000000f03f"),
    ] as [(ChannelValue, String)])
    func encodesAndDecodes(value: ChannelValue, bytes: String) throws {
        #expect(try codec.encode(value) == hex(bytes))
        #expect(try codec.decode(hex(bytes)) == value)
    }

    @Test(arguments: [253, 254, 0xFFFF, 0x10000])
    func sizeBoundaries(size: Int) throws {
        let header: [UInt8] = switch size {
        case 253: [8, 253]
        case 254: [8, 254, 254, 0]
        case 0xFFFF: [8, 254, 0xFF, 0xFF]
        default: [8, 255, 0, 0, 1, 0]
        }
        let encoded = try codec.encode(.uint8List([UInt8](repeating: 0, count: size)))!
        #expect(Array(encoded.prefix(header.count)) == header)
        #expect(encoded.count == header.count + size)
        #expect(try codec.decode(encoded) == .uint8List([UInt8](repeating: 0, count: size)))
    }

    @Test func nullPayloadAndEmptyPayloadDecodeAsNull() throws {
        #expect(try codec.decode(nil) == .null)
        #expect(try codec.decode([]) == .null)
        #expect(try codec.encode(.null) == [0])
    }

    @Test func legacyLargeIntDecodesAsDigits() throws {
        #expect(try codec.decode(hex("05 03 313233")) == .string("123"))
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

    @Test func methodCall() throws {
        let bytes = hex("07 04 65636f68 07 02 6869")  // "echo", "hi"
        let call = MethodCall(method: "ecoh", arguments: "hi")
        #expect(try codec.encodeMethodCall(call) == bytes)
        #expect(try codec.decodeMethodCall(bytes) == call)
    }

    @Test func successEnvelopeAlignsFromItsLeadingByte() throws {
        // 00, type 06, then padding to offset 8 counted from the envelope's first byte.
        let bytes = hex("00 06 000000000000 000000000000f03f")
        #expect(try codec.encodeSuccessEnvelope(1.0) == bytes)
        #expect(try codec.decodeEnvelope(bytes) == .success(1.0))
    }

    @Test func errorEnvelopes() throws {
        let three = hex("01 07 01 63 07 01 6d 00")
        let error = ChannelError(code: "c", message: "m")
        #expect(try codec.encodeErrorEnvelope(error) == three)
        #expect(try codec.decodeEnvelope(three) == .failure(error))
        // Without a message: null.
        #expect(try codec.decodeEnvelope(hex("01 07 01 63 00 00")) == .failure(ChannelError(code: "c")))
        // Four fields: stack trace string, or null.
        let traced = ChannelError(code: "c", message: "m", stacktrace: "s")
        #expect(try codec.encodeErrorEnvelope(traced) == three + hex("07 01 73"))
        #expect(try codec.decodeEnvelope(three + hex("07 01 73")) == .failure(traced))
        #expect(try codec.decodeEnvelope(three + hex("00")) == .failure(error))
    }

    @Test(arguments: [
        "02 00",               // envelope byte neither 0 nor 1
        "00 00 00",            // leftover after success value
        "01 03 01000000 00 00",  // code not a string
        "01 07 01 63 03 01000000 00",  // message not a string
        "01 07 01 63 00 00 03 01000000",  // stack trace not a string
        "01 07 01 63 00 00 00 00",  // bytes after the stack trace
        "",                    // empty
    ])
    func rejectsBadEnvelopes(bytes: String) {
        #expect(throws: CodecError.self) { try codec.decodeEnvelope(hex(bytes)) }
    }

    @Test func rejectsBadCalls() {
        #expect(throws: CodecError.self) { try codec.decodeMethodCall(nil) }
        #expect(throws: CodecError.self) { try codec.decodeMethodCall(hex("03 01000000 00")) }
        #expect(throws: CodecError.self) { try codec.decodeMethodCall(hex("07 01 61 00 00")) }
        #expect(throws: CodecError.self) { try codec.decodeMethodCall(hex("07 01 61")) }
    }
}

@Suite struct HostileStandardInput {
    let codec = StandardMessageCodec()

    @Test(arguments: [
        ("08 ff ffffffff 00", "4 GiB Uint8List in 7 bytes"),
        ("07 ff ffffffff", "4 GiB string"),
        ("0c ff ffffffff 00", "4 billion list elements"),
        ("0d fe ffff 00 00", "65535 map entries"),
        ("0b ff ffffff0f 000000 00", "float64 list beyond payload"),
        ("09 05 0000 01000000", "Int32List short"),
        ("0e 02 0000 00000000", "Float32List short"),
        ("0a 01 000000000000 01", "Int64List short"),
        ("03 0100", "truncated int32"),
        ("04 01", "truncated int64"),
        ("06 00", "truncated double"),
        ("07 02 c328", "invalid UTF-8"),
        ("07 01 80", "lone continuation byte"),
        ("0f", "unknown type 15"),
        ("80", "unregistered custom type"),
        ("00 00", "trailing byte"),
        ("fe", "size marker as type"),
        ("07 fe 01", "truncated size"),
    ])
    func malformedIsAnErrorNotACrash(bytes: String, why: String) {
        #expect(throws: CodecError.self, "\(why)") { try codec.decode(hex(bytes)) }
    }

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
