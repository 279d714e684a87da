// Encode/decode throughput of the Flutter codecs, with a plain memcpy of the same bytes as the
// baseline measured in the same run (quote ratios, not absolute numbers: the machine is shared).
import SwitchboardCodec

#if canImport(Glibc)
import Glibc
#endif

/// Keeps results alive so the optimizer cannot drop the work.
nonisolated(unsafe) var sink = 0

func row(_ name: String, _ rate: Double, _ note: String = "") {
    print(name.padding(44) + " " + String(Int(rate)).leftPadding(12) + " ops/s" + note)
}

extension String {
    func padding(_ n: Int) -> String { count >= n ? self : self + String(repeating: " ", count: n - count) }
    func leftPadding(_ n: Int) -> String { count >= n ? self : String(repeating: " ", count: n - count) + self }
}

/// The best rate (operations per second) of 5 rounds of at least 0.3 s each.
func rate(_ body: () throws -> Int) rethrows -> Double {
    var best = 0.0
    for _ in 0..<5 {
        var ops = 0
        let clock = ContinuousClock()
        let start = clock.now
        var elapsed = Duration.zero
        repeat {
            for _ in 0..<8 { sink &+= try body() }
            ops += 8
            elapsed = clock.now - start
        } while elapsed < .milliseconds(300)
        best = max(best, Double(ops) / (Double(elapsed.components.attoseconds) * 1e-18 + Double(elapsed.components.seconds)))
    }
    return best
}

func megabytes(_ opsPerSecond: Double, _ bytes: Int) -> String {
    let mbps = opsPerSecond * Double(bytes) / 1e6
    return "   " + String(Int(mbps)) + " MB/s"
}

let standard = StandardMessageCodec()
let method = StandardMethodCodec()

// 1. A typical method call: a 5-entry map of strings, ints and doubles.
let typicalCall = MethodCall(method: "updateLocation", arguments: [
    "device": "pixel-7", "latitude": 52.5200066, "longitude": 13.404954, "accuracy": 12, "timestamp": .int64(1_763_772_000_123),
])
let typicalBytes = try method.encodeMethodCall(typicalCall)
row("StandardMethodCodec.encode/5-entry-map", try rate { try method.encodeMethodCall(typicalCall).count })
row("StandardMethodCodec.decode/5-entry-map", try rate { try method.decodeMethodCall(typicalBytes).method.utf8.count })

// 2. A 1 MiB Uint8List, against a plain memcpy of the same bytes into a fresh array.
let mebibyte = (0..<(1 << 20)).map { UInt8(truncatingIfNeeded: $0 &* 31) }
let bigValue = ChannelValue.uint8List(mebibyte)
let bigBytes = try standard.encode(bigValue)!
let memcpyRate = rate {
    let copy = [UInt8](unsafeUninitializedCapacity: mebibyte.count) { buffer, count in
        _ = mebibyte.withUnsafeBytes { source in
            memcpy(buffer.baseAddress!, source.baseAddress!, source.count)
        }
        count = mebibyte.count
    }
    return copy.count
}
let encodeBig = try rate { try standard.encode(bigValue)!.count }
let decodeBig = try rate {
    guard case .uint8List(let bytes) = try standard.decode(bigBytes) else { return 0 }
    return bytes.count
}
row("memcpy/1MiB (baseline)", memcpyRate, megabytes(memcpyRate, 1 << 20))
row("StandardMessageCodec.encode/1MiB-Uint8List", encodeBig,
    megabytes(encodeBig, 1 << 20) + "  = " + String(Int(encodeBig / memcpyRate * 100)) + "% of memcpy")
row("StandardMessageCodec.decode/1MiB-Uint8List", decodeBig,
    megabytes(decodeBig, 1 << 20) + "  = " + String(Int(decodeBig / memcpyRate * 100)) + "% of memcpy")

// 3. A 10,000-element list of mixed values.
let mixed = ChannelValue.list((0..<10_000).map { i -> ChannelValue in
    switch i % 5 {
    case 0: .int(i)
    case 1: .float64(Double(i) * 0.5)
    case 2: .string("item-\(i)")
    case 3: .bool(i % 2 == 0)
    default: .null
    }
})
let mixedBytes = try standard.encode(mixed)!
let encodeMixed = try rate { try standard.encode(mixed)!.count }
let decodeMixed = try rate { try standard.decode(mixedBytes).listValue?.count ?? 0 }
row("StandardMessageCodec.encode/10k-mixed-list", encodeMixed, megabytes(encodeMixed, mixedBytes.count))
row("StandardMessageCodec.decode/10k-mixed-list", decodeMixed, megabytes(decodeMixed, mixedBytes.count))
print("(sink \(sink % 10))")
