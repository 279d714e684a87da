import PropertyBased
import SwitchboardTesting
import Testing
@testable import SwitchboardCodec

/// Builds an arbitrary value, with bit-exact doubles (NaN payloads included) and nested containers.
func randomValue(_ rng: inout SeededRandom, depth: Int = 0, jsonSafe: Bool = false) -> ChannelValue {
    let kinds = jsonSafe ? 8 : 14
    switch Int.random(in: 0..<(depth > 3 ? 7 : kinds), using: &rng) {
    case 0: return .null
    case 1: return .bool(Bool.random(using: &rng))
    case 2: return .int32(Int32.random(in: .min ... .max, using: &rng))
    case 3: return jsonSafe ? .int64(Int64.random(in: 1 << 40 ... .max, using: &rng))
                            : .int64(Int64.random(in: .min ... .max, using: &rng))
    case 4: return .float64(jsonSafe ? Double.random(in: -1e9...1e9, using: &rng) : Double(bitPattern: rng.next()))
    case 5:
        let scalars = (0..<Int.random(in: 0..<20, using: &rng)).compactMap { _ in
            Unicode.Scalar(UInt32.random(in: 0...0x10FFFF, using: &rng))
        }
        return .string(String(String.UnicodeScalarView(scalars)))
    case 6: return .string(String(repeating: "x", count: Int.random(in: 250...300, using: &rng)))
    case 7:
        let entries = (0..<Int.random(in: 0..<5, using: &rng)).map { i in
            ChannelValue.MapEntry(jsonSafe ? .string("k\(i)") : randomValue(&rng, depth: depth + 1),
                                  randomValue(&rng, depth: depth + 1, jsonSafe: jsonSafe))
        }
        return .map(entries)
    case 8: return .list((0..<Int.random(in: 0..<6, using: &rng)).map { _ in randomValue(&rng, depth: depth + 1) })
    case 9: return .uint8List((0..<Int.random(in: 0..<300, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) })
    case 10: return .int32List((0..<Int.random(in: 0..<9, using: &rng)).map { _ in Int32.random(in: .min ... .max, using: &rng) })
    case 11: return .int64List((0..<Int.random(in: 0..<9, using: &rng)).map { _ in Int64.random(in: .min ... .max, using: &rng) })
    case 12: return .float32List((0..<Int.random(in: 0..<9, using: &rng)).map { _ in Float(bitPattern: UInt32.random(in: 0 ... .max, using: &rng)) })
    default: return .float64List((0..<Int.random(in: 0..<9, using: &rng)).map { _ in Double(bitPattern: rng.next()) })
    }
}

@Suite struct RoundTripProperties {
    @Test func standardCodecRoundTripsEveryValueBitExactly() async {
        await propertyCheck(count: 300, input: Gen.uint64()) { seed throws in
            var rng = SeededRandom(seed: seed)
            let value = randomValue(&rng)
            let codec = StandardMessageCodec()
            let bytes = try codec.encode(value)
            #expect(try codec.decode(bytes) == value)
            #expect(try codec.encode(codec.decode(bytes)) == bytes)
        }
    }

    @Test func standardMethodCodecRoundTripsEnvelopes() async {
        await propertyCheck(count: 200, input: Gen.uint64()) { seed throws in
            var rng = SeededRandom(seed: seed)
            let value = randomValue(&rng)
            let codec = StandardMethodCodec()
            #expect(try codec.decodeEnvelope(codec.encodeSuccessEnvelope(value)) == .success(value))
            let error = ChannelError(code: "e", message: nil, details: value, stacktrace: seed % 2 == 0 ? nil : "t")
            #expect(try codec.decodeEnvelope(codec.encodeErrorEnvelope(error)) == .failure(error))
            let call = MethodCall(method: "m\(seed)", arguments: value)
            #expect(try codec.decodeMethodCall(codec.encodeMethodCall(call)) == call)
        }
    }

    @Test func methodCallsDecodeInPlaceAtAnyOffset() async {
        await propertyCheck(count: 200, input: Gen.uint64()) { seed throws in
            var rng = SeededRandom(seed: seed)
            let call = MethodCall(method: "m", arguments: randomValue(&rng))
            let bytes = try StandardMethodCodec().encodeMethodCall(call)
            // Alignment padding counts from the payload's start, not the enclosing buffer's.
            let before = Int(seed % 13), after = Int(seed / 13 % 5)
            let buffer = [UInt8](repeating: 0xEE, count: before) + bytes + [UInt8](repeating: 0xEE, count: after)
            let slice = buffer[before..<(before + bytes.count)]
            #expect(try StandardMethodCodec().decodeMethodCall(from: slice) == call)
            #expect(try JSONMethodCodec().decodeMethodCall(from: JSONMethodCodec().encodeMethodCall(.init(method: "m", arguments: .int(Int(seed % 100))))[...])
                == MethodCall(method: "m", arguments: .int(Int(seed % 100))))
        }
    }

    @Test func jsonRoundTripsJSONShapedValues() async {
        await propertyCheck(count: 300, input: Gen.uint64()) { seed throws in
            var rng = SeededRandom(seed: seed)
            let value = randomValue(&rng, jsonSafe: true)
            let codec = JSONMessageCodec()
            guard !value.isNull else { return }
            let bytes = try codec.encode(value)
            let back = try codec.decode(bytes)
            #expect(try codec.encode(back) == bytes)
        }
    }

    @Test func randomBytesNeverCrashTheDecoders() async {
        await propertyCheck(count: 2000, input: Gen.uint64()) { seed throws in
            var rng = SeededRandom(seed: seed)
            let bytes = (0..<Int.random(in: 0..<40, using: &rng)).map { _ in UInt8.random(in: 0...255, using: &rng) }
            _ = try? StandardMessageCodec().decode(bytes)
            _ = try? StandardMethodCodec().decodeEnvelope(bytes)
            _ = try? StandardMethodCodec().decodeMethodCall(bytes)
            _ = try? JSONText.parse(bytes)
            #expect(Bool(true))
        }
    }
}
