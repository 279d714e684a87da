/// Parses spaced hex ("06 00 ff") into bytes, for readable vectors.
func hex(_ text: String) -> [UInt8] {
    let digits = text.filter { !$0.isWhitespace }
    precondition(digits.count % 2 == 0)
    var out: [UInt8] = []
    var it = digits.makeIterator()
    while let hi = it.next(), let lo = it.next() { out.append(UInt8(String([hi, lo]), radix: 16)!) }
    return out
}
