import FuzzSupport
import SwitchboardCodec

// Input: bytes read two ways.
//
// 1. As JSON text (`JSONText.parse`, what text mode does with every line). A parsed value serializes in
//    text mode to one line (no raw newline) that parses back to the same value, with non-finite numbers
//    (from literals like 1e999) turned into the strings "NaN", "Infinity", "-Infinity"; serializing again
//    gives the same text, so parse -> serialize -> parse is stable. Strict serialization (Flutter's JSON
//    codecs) agrees with text mode whenever it succeeds. The value also reaches a standard channel intact.
// 2. As a StandardMessageCodec payload, which yields any channel value (typed lists, int64, non-string
//    keys, NaN bits): text mode must write it as JSON that parses to what protocol/text-mode.md says
//    (Float32 values print shorter than the doubles they parse to, so only that value is then stable),
//    except a value with a non-string key that itself holds a non-string key, which has no JSON form
//    (keys are stringified one level deep) and must be refused, quickly.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let bytes = FuzzInput(start, count).rest
    if let value = try? JSONText.parse(bytes) {
        check((try? JSONText.parse(([0x20, 0x5B] + bytes)[2...])) == value, "parsing from a slice differs")
        parsedJSON(value)
    }
    if let value = try? StandardMessageCodec().decode(bytes) {
        if hasNestedStringifiedKey(value) {
            check((try? JSONText.serialize(value, options: .textMode)) == nil, "\(value) has no JSON form but was written")
        } else {
            parsedJSON(throughTextMode(value).parsed)
        }
    }
    return 0
}

/// Checks a value that came from JSON text.
func parsedJSON(_ value: ChannelValue) {
    let (text, parsed) = throughTextMode(value)
    check((try? JSONText.serialize(parsed, options: .textMode)) == text, "\(hex(text)) is not stable")
    if let strict = try? JSONText.serialize(value) {
        check(strict == text, "strict \(hex(strict)) != text mode \(hex(text))")
    }
    let standard = StandardMessageCodec()
    check((try? standard.decode(standard.encode(value))) == value, "\(value) does not survive the standard codec")
}

/// Writes a value in text mode and parses it back: one line of valid JSON holding `afterText(value)`.
func throughTextMode(_ value: ChannelValue) -> (text: [UInt8], parsed: ChannelValue) {
    guard let text = try? JSONText.serialize(value, options: .textMode) else {
        fatalError("invariant broken: text mode cannot write \(value)")
    }
    check(!text.contains(UInt8(ascii: "\n")) && !text.contains(UInt8(ascii: "\r")), "raw line break in \(hex(text))")
    guard let parsed = try? JSONText.parse(text) else {
        fatalError("invariant broken: text mode wrote invalid JSON \(hex(text)) for \(value)")
    }
    let expected = afterText(value)
    check(parsed == expected, "\(value) came back from text as \(parsed), expected \(expected)")
    return (text, parsed)
}

/// What a channel value becomes once written in text mode and parsed back (protocol/text-mode.md):
/// integers as int32 when they fit, typed lists as lists of numbers, NaN and the infinities as strings,
/// non-string map keys as their JSON text.
func afterText(_ value: ChannelValue) -> ChannelValue {
    switch value {
    case .int64(let v): .int(Int(v))
    case .float64(let v): number(v)
    case .uint8List(let a): .list(a.map { .int32(Int32($0)) })
    case .int32List(let a): .list(a.map(ChannelValue.int32))
    case .int64List(let a): .list(a.map { .int(Int($0)) })
    case .float32List(let a): .list(a.map { $0.isFinite ? .float64(Double($0.description)!) : number(Double($0)) })
    case .float64List(let a): .list(a.map(number))
    case .list(let elements): .list(elements.map(afterText))
    case .map(let entries): .map(entries.map { .init(.string(keyText($0.key)), afterText($0.value)) })
    default: value  // null, bool, int32, string (custom types need registering, so never decoded here)
    }
}

func number(_ v: Double) -> ChannelValue {
    if v.isNaN { return "NaN" }
    if v.isInfinite { return v < 0 ? "-Infinity" : "Infinity" }
    return .float64(v)
}

func keyText(_ key: ChannelValue) -> String {
    if case .string(let s) = key { return s }
    return String(decoding: (try? JSONText.serialize(key, options: .textMode)) ?? [], as: UTF8.self)
}

/// Whether `value` has a non-string map key that itself holds a non-string map key, at any depth.
func hasNestedStringifiedKey(_ value: ChannelValue) -> Bool {
    mapEntries(in: value).contains { entry in
        !isString(entry.key) && mapEntries(in: entry.key).contains { !isString($0.key) }
    }
}

/// Every map entry in `value`, those inside keys included. Iterative: values nest up to 1,000 deep,
/// too deep for recursion on an instrumented stack.
func mapEntries(in value: ChannelValue) -> [ChannelValue.MapEntry] {
    var entries: [ChannelValue.MapEntry] = []
    var pending = [value]
    while let next = pending.popLast() {
        switch next {
        case .list(let elements): pending += elements
        case .map(let found):
            entries += found
            for entry in found { pending += [entry.key, entry.value] }
        default: break
        }
    }
    return entries
}

func isString(_ value: ChannelValue) -> Bool { if case .string = value { true } else { false } }
