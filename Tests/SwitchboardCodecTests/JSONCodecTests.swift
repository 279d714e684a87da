import Testing
@testable import SwitchboardCodec

@Suite struct JSONCodecs {
    let message = JSONMessageCodec()
    let method = JSONMethodCodec()

    func utf8(_ s: String) -> [UInt8] { Array(s.utf8) }

    @Test("a method name is read from a call, after leading whitespace, and from nothing else")
    func methodNameOfACall() {
        var reuse = MethodCallReuse()
        #expect(method.methodName(in: utf8(#"{"method":"listen","args":1}"#)[...], reusing: &reuse) == "listen")
        #expect(method.methodName(in: utf8(" \t\r\n{\"method\":\"cancel\"}")[...], reusing: &reuse) == "cancel")
        for other in [#"["method","listen"]"#, #""listen""#, #"{"args":1}"#, "{", "", "\u{01}{\"method\":\"x\"}"] {
            #expect(method.methodName(in: utf8(other)[...], reusing: &reuse) == nil, "\(other)")
        }
        #expect(method.methodName(in: nil, reusing: &reuse) == nil)
    }

    @Test(arguments: [
        (ChannelValue.bool(true), "true"),
        (.int32(-7), "-7"),
        (.int64(98_742_923_489), "98742923489"),
        (.int64(9_223_372_036_854_775_807), "9223372036854775807"),
        (.int64(-9_223_372_036_854_775_808), "-9223372036854775808"),
        (.float64(3.14), "3.14"),
        (.float64(1.0), "1.0"),
        (.string("special chars >\u{263A}\u{1F602}<"), "\"special chars >\u{263A}\u{1F602}<\""),
        (.string("q\"\\\n\u{1}"), #""q\"\\\n\u0001""#),
        (.list([.null, true, false, -707, "", ["nested", []], .map([.init("a", "nested"), .init("b", .map([]))])]),
         #"[null,true,false,-707,"",["nested",[]],{"a":"nested","b":{}}]"#),
    ] as [(ChannelValue, String)])
    func messageVectors(value: ChannelValue, text: String) throws {
        #expect(try message.encode(value) == utf8(text))
        #expect(try message.decode(utf8(text)) == value)
    }

    @Test func nullMessageIsANullPayload() throws {
        #expect(try message.encode(.null) == nil)
        #expect(try message.decode(nil) == .null)
    }

    @Test func parsesEscapesAndWhitespace() throws {
        #expect(try JSONText.parse(utf8(#" { "a" : [ 1 , "\u00e9\ud83d\ude02\/" ] } "#))
            == .map([.init("a", [1, "\u{e9}\u{1F602}/"])]))
        #expect(try JSONText.parse(utf8("1e3")) == .float64(1000))
        #expect(try JSONText.parse(utf8("-0.5E-1")) == .float64(-0.05))
        #expect(try JSONText.parse(utf8("123456789012345678901234")) == .float64(1.2345678901234568e23))
    }

    @Test(arguments: ["", "{", "[1,]", "{\"a\"}", "01", "1.", "-", "tru", "\"\\x\"", "\"\u{1}\"", "\"\\ud800\"",
                      "[1] 2", "{'a':1}", "nul", "\"abc"])
    func rejectsInvalidJSON(text: String) {
        #expect(throws: CodecError.self) { try JSONText.parse(utf8(text)) }
    }

    @Test func rejectsInvalidUTF8AndDeepNesting() throws {
        #expect(throws: CodecError.self) { try JSONText.parse([0x22, 0xC3, 0x28, 0x22]) }
        let ok = String(repeating: "[", count: 1000) + String(repeating: "]", count: 1000)
        #expect(throws: Never.self) { try JSONText.parse(utf8(ok)) }
        let deep = String(repeating: "[", count: 1001) + String(repeating: "]", count: 1001)
        #expect(throws: CodecError.self) { try JSONText.parse(utf8(deep)) }
    }

    @Test func strictEncodingRefusesWhatJSONCannotHold() throws {
        #expect(throws: CodecError.self) { try message.encode(.float64(.nan)) }
        #expect(throws: CodecError.self) { try message.encode(.map([.init(1, 2)])) }
        #expect(try JSONText.serialize([.float64(.infinity), .float64(-.infinity), .float64(.nan)], options: .textMode)
            == utf8(#"["Infinity","-Infinity","NaN"]"#))
        #expect(try JSONText.serialize(.map([.init(1, 2), .init([true], 3)]), options: .textMode)
            == utf8(#"{"1":2,"[true]":3}"#))
        #expect(try JSONText.serialize(.uint8List([1, 255]), options: .textMode) == utf8("[1,255]"))
        #expect(try JSONText.serialize(.float32List([0.1]), options: .textMode) == utf8("[0.1]"))
    }

    @Test func methodCodec() throws {
        let call = MethodCall(method: "m", arguments: ["x": 1])
        #expect(try method.encodeMethodCall(call) == utf8(#"{"method":"m","args":{"x":1}}"#))
        #expect(try method.decodeMethodCall(utf8(#"{"args":null,"method":"m"}"#)) == MethodCall(method: "m"))
        #expect(try method.encodeSuccessEnvelope(1) == utf8("[1]"))
        #expect(try method.decodeEnvelope(utf8("[1]")) == .success(1))
        let error = ChannelError(code: "errorCode", message: "errorMessage", details: "errorDetails")
        #expect(try method.encodeErrorEnvelope(error) == utf8(#"["errorCode","errorMessage","errorDetails"]"#))
        #expect(try method.decodeEnvelope(utf8(#"["errorCode","errorMessage","errorDetails"]"#)) == .failure(error))
        var traced = error
        traced.stacktrace = "errorStacktrace"
        #expect(try method.decodeEnvelope(utf8(#"["errorCode","errorMessage","errorDetails","errorStacktrace"]"#))
            == .failure(traced))
        #expect(throws: CodecError.self) { try method.decodeEnvelope(utf8("[1,2]")) }
        #expect(throws: CodecError.self) { try method.decodeEnvelope(utf8("{}")) }
        #expect(throws: CodecError.self) { try method.decodeMethodCall(utf8(#"{"method":1}"#)) }
    }
}

@Suite struct StringAndBinaryCodecs {
    @Test func stringCodec() throws {
        let codec = StringCodec()
        #expect(try codec.encode(nil) == nil)
        #expect(try codec.encode("") == [])
        #expect(try codec.encode("h\u{263A}") == [0x68, 0xE2, 0x98, 0xBA])
        #expect(try codec.decode([0x68, 0xE2, 0x98, 0xBA]) == "h\u{263A}")
        #expect(try codec.decode(nil) == nil)
        #expect(throws: CodecError.self) { try codec.decode([0xFF]) }
    }

    @Test func binaryCodec() throws {
        let codec = BinaryCodec()
        #expect(try codec.decode(nil) == nil)
        #expect(try codec.decode([]) == [])
        #expect(try codec.message(from: [1, 255]) == [1, 255])
        #expect(try codec.message(from: "hi") == [0x68, 0x69])
        #expect(throws: CodecError.self) { try codec.message(from: [256]) }
    }

    /// Text mode writes a non-string key as its JSON text, one level deep only: nested, each level would
    /// escape the one inside again and double the text (found by fuzz-json-text: 73 bytes of Standard
    /// payload made a 25 MB line at depth 22).
    @Test func stringifiedKeysAreOneLevelDeep() throws {
        let oneLevel = ChannelValue.map([.init(.list([1, 2]), "v"), .init(.stringMap(["a": 1]), "w")])
        #expect(try JSONText.serialize(oneLevel, options: .textMode) == Array(#"{"[1,2]":"v","{\"a\":1}":"w"}"#.utf8))
        var nested = ChannelValue.string("\"")
        for _ in 0..<25 { nested = .map([.init(nested, .null)]) }
        #expect(throws: CodecError.self) { try JSONText.serialize(nested, options: .textMode) }
        let twoLevels = ChannelValue.map([.init(.map([.init(1, 2)]), "v")])
        #expect(throws: CodecError.self) { try JSONText.serialize(twoLevels, options: .textMode) }
    }
}
