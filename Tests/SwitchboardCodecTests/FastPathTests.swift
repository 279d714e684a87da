import PropertyBased
import SwitchboardTesting
import Testing
@testable import SwitchboardCodec

/// The general reader's answer for a method-call payload: the call, or nil where it throws.
private func generalDecode(_ payload: [UInt8]) -> MethodCall? {
    var reader = StandardReader(payload[...], customTypes: [])
    guard case .string(let method)? = try? reader.readValue(), let arguments = try? reader.readValue(),
          (try? reader.expectEnd("method call")) != nil
    else { return nil }
    return MethodCall(method: method, arguments: arguments)
}

@Suite struct StandardFastPathTests {
    /// Every call it takes, the general reader decodes to the same value; it may pass on any payload
    /// (the general reader then decides) but never accept one the general reader refuses.
    @Test func agreesWithTheGeneralReaderOnCallsAndOnMutatedBytes() async {
        await propertyCheck(count: 500, input: Gen.uint64()) { seed throws in
            var rng = SeededRandom(seed: seed)
            let arguments = randomValue(&rng)
            let method = Bool.random(using: &rng) ? "echo" : String(repeating: "m", count: Int.random(in: 0...300, using: &rng))
            var payload = try StandardMethodCodec().encodeMethodCall(MethodCall(method: method, arguments: arguments))
            var reuse = MethodCallReuse()
            #expect(StandardFastPath.decodeMethodCall(payload[...], reusing: &reuse).map { $0 == generalDecode(payload) } ?? true)
            // Flip, drop or add a byte: whatever the fast path then accepts, the general reader must agree.
            let position = Int.random(in: 0...payload.count, using: &rng)
            switch Int.random(in: 0..<3, using: &rng) {
            case 0 where position < payload.count: payload[position] ^= UInt8.random(in: 1...255, using: &rng)
            case 1 where position < payload.count: payload.remove(at: position)
            default: payload.insert(UInt8.random(in: 0...255, using: &rng), at: position)
            }
            if let fast = StandardFastPath.decodeMethodCall(payload[...], reusing: &reuse) {
                #expect(fast == generalDecode(payload), "fast path accepted \(payload) as \(fast)")
            }
        }
    }

    @Test func takesTheCommonShapes() throws {
        let codec = StandardMethodCodec()
        let common: [ChannelValue] = [.null, true, false, .int32(-7), .int64(1 << 40), .float64(-0.5), "héllo",
                                      .uint8List([1, 2, 3]), .uint8List(Array(repeating: 9, count: 70_000)), .string("")]
        for arguments in common {
            let payload = try codec.encodeMethodCall(MethodCall(method: "m", arguments: arguments))
            var reuse = MethodCallReuse()
            #expect(StandardFastPath.decodeMethodCall(payload[...], reusing: &reuse) == MethodCall(method: "m", arguments: arguments))
        }
    }

    /// A kept argument is the caller's own: the next call's bytes never show through it, though the next
    /// call reuses the storage once nothing holds it.
    @Test func aKeptArgumentKeepsItsBytes() throws {
        let codec = StandardMethodCodec()
        var reuse = MethodCallReuse()
        let first = try codec.decodeMethodCall(from: codec.encodeMethodCall(MethodCall(method: "put", arguments: .uint8List([1, 2, 3])))[...],
                                               reusing: &reuse)
        let second = try codec.decodeMethodCall(from: codec.encodeMethodCall(MethodCall(method: "get", arguments: .uint8List([7, 8])))[...],
                                                reusing: &reuse)
        #expect(first == MethodCall(method: "put", arguments: .uint8List([1, 2, 3])))
        #expect(second == MethodCall(method: "get", arguments: .uint8List([7, 8])))
    }

    @Test func reusesStorageAndTheMethodNameWhenNothingHoldsThem() throws {
        let codec = StandardMethodCodec()
        var reuse = MethodCallReuse()
        let payload = try codec.encodeMethodCall(MethodCall(method: "a method name over fifteen bytes", arguments: .uint8List([1, 2, 3])))
        _ = try codec.decodeMethodCall(from: payload[...], reusing: &reuse)
        let storage = reuse.bytes.capacity
        let call = try codec.decodeMethodCall(from: payload[...], reusing: &reuse)
        guard case .uint8List(let bytes) = call.arguments else { Issue.record("not a Uint8List"); return }
        #expect(bytes == [1, 2, 3] && reuse.bytes.capacity == storage)
        #expect(call.method == "a method name over fifteen bytes" && reuse.method == call.method)
        // A kept small argument does not hold storage the size of an earlier large one.
        let big = try codec.encodeMethodCall(MethodCall(method: "m", arguments: .uint8List(Array(repeating: 2, count: 60_000))))
        _ = try codec.decodeMethodCall(from: big[...], reusing: &reuse)
        let small = try codec.encodeMethodCall(MethodCall(method: "m", arguments: .uint8List([4, 5])))
        let kept = try codec.decodeMethodCall(from: small[...], reusing: &reuse)
        guard case .uint8List(let keptBytes) = kept.arguments else { Issue.record("not a Uint8List"); return }
        #expect(keptBytes == [4, 5] && keptBytes.capacity < 1024)
        // Long method names are not kept.
        let longName = String(repeating: "n", count: MethodCallReuse.longestMethodKept + 1)
        let named = try codec.decodeMethodCall(from: codec.encodeMethodCall(MethodCall(method: longName))[...], reusing: &reuse)
        #expect(named.method == longName && reuse.method != longName)
        // Larger than a connection keeps: storage of its own, and the kept storage stays small.
        let large = try codec.encodeMethodCall(MethodCall(method: "m", arguments: .uint8List(Array(repeating: 1, count: MethodCallReuse.largestKept + 1))))
        _ = try codec.decodeMethodCall(from: large[...], reusing: &reuse)
        #expect(reuse.bytes.capacity < MethodCallReuse.largestKept)
    }
}
