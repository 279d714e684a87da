import FuzzSupport
import SwitchboardCodec

// Input: a payload, given as is to every decoder of the standard and JSON codecs.
//
// Whenever a decoder accepts it, encoding the result and decoding that again must give an equal value,
// and the re-encoding is canonical: encoding the re-decoded value gives the same bytes (wire-v1 promises
// exact round trips: map order, int32 vs int64, NaN bits). A canonical encoding is never longer than
// the payload it came from (the payload may only add padding bytes, long size forms or type 5).
// Decoding from a slice inside a larger buffer, and encoding after existing bytes, count offsets and
// alignment from the payload's own start, so they must agree with the plain forms; so must decoding
// with what the previous input left (`MethodCallReuse`).

let standard = StandardMessageCodec()
let standardMethod = StandardMethodCodec()
let json = JSONMessageCodec()
let jsonMethod = JSONMethodCodec()

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    let payload = FuzzInput(start, count).rest
    standardMessage(payload)
    standardMethodCall(payload)
    standardEnvelope(payload)
    jsonCodecs(payload)
    return 0
}

func standardMessage(_ payload: [UInt8]) {
    guard let value = try? standard.decode(payload) else { return }
    let bytes = mustSucceed("encode \(value)") { try standard.encode(value) }
    guard let bytes else { return check(false, "a standard value encoded to a NULL_PAYLOAD") }
    check(payload.isEmpty || bytes.count <= payload.count, "re-encoding \(hex(bytes)) is longer than \(hex(payload))")
    let again = mustSucceed("decode \(hex(bytes))") { try standard.decode(bytes) }
    check(again == value, "\(value) re-decoded as \(again)")
    check((try? standard.encode(again)) == bytes, "\(hex(bytes)) does not re-encode to itself")
}

/// Carried from input to input, as a connection carries it from call to call: what one call leaves
/// must never show in the next one's result.
nonisolated(unsafe) var reuse = MethodCallReuse()  // libFuzzer calls the target from one thread

func standardMethodCall(_ payload: [UInt8]) {
    let call = try? standardMethod.decodeMethodCall(payload)
    let inPlace = try? standardMethod.decodeMethodCall(from: ([0xEE, 0xEE, 0xEE] + payload)[3...])
    check(call == inPlace, "decodeMethodCall gives \(String(describing: call)), from a slice \(String(describing: inPlace))")
    let reusing = try? standardMethod.decodeMethodCall(from: payload[...], reusing: &reuse)
    check(call == reusing, "decodeMethodCall gives \(String(describing: call)), reusing \(String(describing: reusing))")
    guard let call else { return }
    let bytes = mustSucceed("encode \(call)") { try standardMethod.encodeMethodCall(call) }
    check(bytes.count <= payload.count, "re-encoding \(hex(bytes)) is longer than \(hex(payload))")
    let again = mustSucceed("decode \(hex(bytes))") { try standardMethod.decodeMethodCall(bytes) }
    check(again == call, "\(call) re-decoded as \(again)")
    check((try? standardMethod.encodeMethodCall(again)) == bytes, "\(hex(bytes)) does not re-encode to itself")
}

func standardEnvelope(_ payload: [UInt8]) {
    guard let envelope = try? standardMethod.decodeEnvelope(payload) else { return }
    let bytes = mustSucceed("encode \(envelope)") { try encode(envelope) }
    check(bytes.count <= payload.count, "re-encoding \(hex(bytes)) is longer than \(hex(payload))")
    let again = mustSucceed("decode \(hex(bytes))") { try standardMethod.decodeEnvelope(bytes) }
    check(again == envelope, "\(envelope) re-decoded as \(again)")
    check((try? encode(again)) == bytes, "\(hex(bytes)) does not re-encode to itself")
    if case .success(let value) = envelope {
        var appended: [UInt8] = [0xEE, 0xEE, 0xEE]
        try? standardMethod.encodeSuccessEnvelope(value, appendingTo: &appended)
        check(appended == [0xEE, 0xEE, 0xEE] + bytes, "appended envelope \(hex(appended)) != \(hex(bytes))")
    }
}

func encode(_ envelope: Result<ChannelValue, ChannelError>) throws(CodecError) -> [UInt8] {
    switch envelope {
    case .success(let value): try standardMethod.encodeSuccessEnvelope(value)
    case .failure(let error): try standardMethod.encodeErrorEnvelope(error)
    }
}

/// JSON payloads: whatever decodes re-encodes (unless it holds a number too large for a finite double,
/// which JSON cannot write back) to text that decodes to the same thing and re-encodes to itself.
func jsonCodecs(_ payload: [UInt8]) {
    if let value = try? json.decode(payload), let text = try? json.encode(value) {
        let again = mustSucceed("decode \(hex(text))") { try json.decode(text) }
        check(again == value, "JSON \(value) re-decoded as \(again)")
        check((try? json.encode(again)) == text, "JSON \(hex(text)) does not re-encode to itself")
    }
    if let call = try? jsonMethod.decodeMethodCall(payload), let text = try? jsonMethod.encodeMethodCall(call) {
        let again = mustSucceed("decode \(hex(text))") { try jsonMethod.decodeMethodCall(text) }
        check(again == call, "JSON \(call) re-decoded as \(again)")
        check((try? jsonMethod.encodeMethodCall(again)) == text, "JSON \(hex(text)) does not re-encode to itself")
    }
    if let envelope = try? jsonMethod.decodeEnvelope(payload) {
        let text: [UInt8]?
        switch envelope {
        case .success(let value): text = try? jsonMethod.encodeSuccessEnvelope(value)
        case .failure(let error): text = try? jsonMethod.encodeErrorEnvelope(error)
        }
        if let text {
            let again = mustSucceed("decode \(hex(text))") { try jsonMethod.decodeEnvelope(text) }
            check(again == envelope, "JSON \(envelope) re-decoded as \(again)")
        }
    }
}

/// The result of a step that must not fail once the payload was accepted.
func mustSucceed<T>(_ what: @autoclosure () -> String, _ body: () throws -> T) -> T {
    do {
        return try body()
    } catch {
        fatalError("invariant broken: \(what()) failed: \(error)")
    }
}
