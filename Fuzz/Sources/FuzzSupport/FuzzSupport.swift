/// The fuzz input as bytes, with a few bytes taken off the front to steer the target.
public struct FuzzInput {
    /// The bytes not taken yet.
    public private(set) var rest: [UInt8]

    /// Copies libFuzzer's input.
    public init(_ start: UnsafeRawPointer, _ count: Int) {
        rest = Array(UnsafeRawBufferPointer(start: start, count: count))
    }

    /// Takes the first byte (0 once the input is used up).
    public mutating func takeByte() -> UInt8 {
        rest.isEmpty ? 0 : rest.removeFirst()
    }
}

/// How to split `total` bytes into the chunks a socket might deliver: one chunk for seed 0, otherwise
/// sizes drawn from 0...seed by a small xorshift generator seeded with `seed` (empty chunks included).
public func chunkSizes(total: Int, seed: UInt8) -> [Int] {
    guard seed != 0 else { return total == 0 ? [] : [total] }
    var state = UInt32(seed) &* 0x9E37_79B9
    var sizes: [Int] = []
    var left = total
    while left > 0 {
        state ^= state << 13
        state ^= state >> 17
        state ^= state << 5
        let size = min(left, Int(state % (UInt32(seed) + 1)))
        sizes.append(size)
        left -= size
    }
    return sizes
}

/// The bytes of `stream` cut into chunks of the given sizes.
public func chunks(of stream: [UInt8], sizes: [Int]) -> [[UInt8]] {
    var offset = 0
    return sizes.map { size in
        defer { offset += size }
        return Array(stream[offset..<offset + size])
    }
}

/// Stops the run with `message` when an invariant does not hold; libFuzzer saves the input as a crash.
public func check(_ condition: Bool, _ message: @autoclosure () -> String, file: StaticString = #fileID, line: UInt = #line) {
    if !condition { fatalError("invariant broken: \(message())", file: file, line: line) }
}

/// Bytes as spaced hex, for failure messages.
public func hex(_ bytes: some Sequence<UInt8>) -> String {
    bytes.map { ($0 < 16 ? "0" : "") + String($0, radix: 16) }.joined(separator: " ")
}
