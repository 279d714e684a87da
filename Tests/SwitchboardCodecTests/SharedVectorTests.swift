import Foundation
import Testing
import SwitchboardCodec

/// The byte vectors in `protocol/vectors/standard-codec.json`, which the JavaScript client's tests
/// read too: both codecs must agree with Flutter's on every one of them.
@Suite struct SharedStandardCodecVectors {
    let vectors = SharedVectors.load()
    let messages = StandardMessageCodec()
    let methods = StandardMethodCodec()

    @Test func messagesEncodeAndDecode() throws {
        let cases = try #require(vectors["messages"] as? [[String: Any]])
        #expect(cases.count >= 30)
        for vector in cases {
            let name = vector["name"] as? String ?? "?"
            let value = try SharedVectors.value(vector["value"])
            let bytes = try SharedVectors.bytes(vector["hex"])
            #expect(try messages.encode(value) == bytes, "\(name)")
            #expect(try messages.decode(bytes) == value, "\(name)")
        }
    }

    @Test func decodeOnlyMessages() throws {
        for vector in try #require(vectors["decodeOnly"] as? [[String: Any]]) {
            #expect(try messages.decode(SharedVectors.bytes(vector["hex"])) == SharedVectors.value(vector["value"]))
        }
    }

    @Test func malformedMessagesAreErrors() throws {
        for vector in try #require(vectors["malformedMessages"] as? [[String: Any]]) {
            let bytes = try SharedVectors.bytes(vector["hex"])
            #expect(throws: CodecError.self, "\(vector["name"] ?? "?")") { try messages.decode(bytes) }
        }
    }

    @Test func methodCalls() throws {
        for vector in try #require(vectors["methodCalls"] as? [[String: Any]]) {
            let call = MethodCall(method: try #require(vector["method"] as? String),
                                  arguments: try SharedVectors.value(vector["arguments"]))
            let bytes = try SharedVectors.bytes(vector["hex"])
            #expect(try methods.encodeMethodCall(call) == bytes, "\(vector["name"] ?? "?")")
            #expect(try methods.decodeMethodCall(bytes) == call, "\(vector["name"] ?? "?")")
        }
        for vector in try #require(vectors["malformedMethodCalls"] as? [[String: Any]]) {
            let bytes = try SharedVectors.bytes(vector["hex"])
            #expect(throws: CodecError.self, "\(vector["name"] ?? "?")") { try methods.decodeMethodCall(bytes) }
        }
    }

    @Test func envelopes() throws {
        for vector in try #require(vectors["envelopes"] as? [[String: Any]]) {
            let name = vector["name"] as? String ?? "?"
            let bytes = try SharedVectors.bytes(vector["hex"])
            let expected: Result<ChannelValue, ChannelError>
            if let success = vector["success"] {
                expected = .success(try SharedVectors.value(success))
            } else {
                let error = try #require(vector["error"] as? [String: Any])
                expected = .failure(ChannelError(code: try #require(error["code"] as? String),
                                                 message: error["message"] as? String,
                                                 details: try SharedVectors.value(error["details"]),
                                                 stacktrace: error["stacktrace"] as? String))
            }
            #expect(try methods.decodeEnvelope(bytes) == expected, "\(name)")
            guard vector["encodes"] as? Bool == true else { continue }
            switch expected {
            case .success(let value): #expect(try methods.encodeSuccessEnvelope(value) == bytes, "\(name)")
            case .failure(let error): #expect(try methods.encodeErrorEnvelope(error) == bytes, "\(name)")
            }
        }
        for vector in try #require(vectors["malformedEnvelopes"] as? [[String: Any]]) {
            let bytes = try SharedVectors.bytes(vector["hex"])
            #expect(throws: CodecError.self, "\(vector["name"] ?? "?")") { try methods.decodeEnvelope(bytes) }
        }
    }
}

/// Reads the shared vector file and its tagged values.
enum SharedVectors {
    struct Malformed: Error { let what: String }

    static func load() -> [String: Any] {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent()
            .appendingPathComponent("../../protocol/vectors/standard-codec.json")
        guard let data = try? Data(contentsOf: url),
              let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any] else { return [:] }
        return object
    }

    /// Spaced hex, where a token `zeros:N` stands for N zero bytes.
    static func bytes(_ field: Any?) throws -> [UInt8] {
        guard let text = field as? String else { throw Malformed(what: "hex") }
        var out: [UInt8] = []
        for token in text.split(separator: " ") {
            if token.hasPrefix("zeros:"), let count = Int(token.dropFirst(6)) {
                out += [UInt8](repeating: 0, count: count)
                continue
            }
            out += hex(String(token))
        }
        return out
    }

    /// A tagged value: a one-key object naming the ChannelValue case.
    static func value(_ field: Any?) throws -> ChannelValue {
        guard let object = field as? [String: Any], object.count == 1, let (tag, body) = object.first else {
            throw Malformed(what: "tagged value \(String(describing: field))")
        }
        func numbers() throws -> [NSNumber] {
            guard let list = body as? [NSNumber] else { throw Malformed(what: tag) }
            return list
        }
        func int64(_ text: Any) throws -> Int64 {
            guard let text = text as? String, let value = Int64(text) else { throw Malformed(what: "int64") }
            return value
        }
        switch tag {
        case "null": return .null
        case "bool": return .bool(try (body as? Bool).orThrow(tag))
        case "int32": return .int32(try (body as? NSNumber).orThrow(tag).int32Value)
        case "int64": return .int64(try int64(body))
        case "float64": return .float64(try (body as? NSNumber).orThrow(tag).doubleValue)
        case "float64Bits":
            return .float64(Double(bitPattern: try UInt64((body as? String).orThrow(tag), radix: 16).orThrow(tag)))
        case "string": return .string(try (body as? String).orThrow(tag))
        case "uint8List":
            if let text = body as? String, text.hasPrefix("zeros:"), let count = Int(text.dropFirst(6)) {
                return .uint8List([UInt8](repeating: 0, count: count))
            }
            return .uint8List(try numbers().map(\.uint8Value))
        case "int32List": return .int32List(try numbers().map(\.int32Value))
        case "int64List": return .int64List(try (body as? [Any]).orThrow(tag).map(int64))
        case "float32List": return .float32List(try numbers().map(\.floatValue))
        case "float64List": return .float64List(try numbers().map(\.doubleValue))
        case "list": return .list(try (body as? [Any]).orThrow(tag).map(value))
        case "map":
            return .map(try (body as? [[Any]]).orThrow(tag).map { pair in
                guard pair.count == 2 else { throw Malformed(what: "map entry") }
                return ChannelValue.MapEntry(try value(pair[0]), try value(pair[1]))
            })
        default: throw Malformed(what: "tag \(tag)")
        }
    }
}

extension Optional {
    func orThrow(_ what: String) throws -> Wrapped {
        guard let self else { throw SharedVectors.Malformed(what: what) }
        return self
    }
}
