import Foundation  // PluginConfiguration.parse takes Data
import FuzzSupport
import SwitchboardCodec
import SwitchboardPluginAPI
import SwitchboardPlugins
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

// Input: one options byte, then requests until the bytes run out. Each request is one byte choosing the
// mode (bit 7: text, else binary) and what to call (the rest: an entry of `targets`), then a
// ChannelValue built from the bytes that follow (`FuzzInput.value(depth:)`: ints at Int64's edges,
// floats, strings, typed lists, lists and maps nested up to 6 deep, whose keys are mostly the argument
// names the built-in channels read), used as the arguments, the message, the DEMAND credit or, for
// the last target, a method name and arguments.
//   options bit 0: the plugins of `pluginConfiguration` are loaded (aliases, access control that
//                  refuses anonymous clients some channels, rate limits that run out);
//   options bit 1: the binary peer says HELLO with the token of the user with every right.
//
// A fresh server with the demo and introspection channels (cap of 3 registrations per connection, 32 KiB
// outbound limit)
// gets each request over an in-memory transport, runs two loop turns and reads what came back. Every
// request with an id gets exactly one answer, at once (the built-in channels answer synchronously on
// one loop, and a refusal is an answer too); a connection the fuzzer closed through
// `switchboard/connections` `close` is replaced by a new one. At the end, a new connection's PING is
// answered: the server is alive. A trap anywhere is a crash, which libFuzzer saves.

let pluginConfiguration = """
    {
      "aliases": {"fuzz/old": "switchboard/echo"},
      "access": {
        "users": [{"name": "op", "tokenSha256": "e3b98a4da31a127d4bde6e43033f66ba274cab0eb7eb1c70ec41402bf6273dd8",
                   "allow": {"call": ["*"], "listen": ["*"], "send": ["*"], "register": ["*"]}}],
        "anonymous": {
          "allow": {"call": ["switchboard/*", "fuzz/*"], "listen": ["switchboard/ticker"],
                    "send": ["switchboard/message*", "switchboard/room.post"], "register": ["fuzz/held/*"]},
          "deny": {"call": ["switchboard/echo.json"]}
        }
      },
      "rateLimits": [
        {"channels": ["switchboard/stats", "switchboard/channels", "switchboard/connections"], "perConnection": {"rate": 50, "burst": 4}},
        {"channels": ["*"], "perConnection": {"rate": 1000, "burst": 30}}
      ],
      "requestLog": {"sampleOneIn": 1, "level": "trace"}
    }
    """

/// What a request does: a method call, a listen or cancel, a message, a DEMAND or a REGISTER.
enum Verb { case call(String), listen, cancel, send, demand, register, anyMethod }

/// The codec a binary request's payload is made with.
enum Encoding { case standardMethod, jsonMethod, standardMessage, string, binary }

let targets: [(channel: String, verb: Verb, encoding: Encoding)] = [
    ("switchboard/echo", .call("echo"), .standardMethod),
    ("switchboard/echo", .call("fail"), .standardMethod),
    ("switchboard/echo.json", .call("echo"), .jsonMethod),
    ("switchboard/message", .send, .standardMessage),
    ("switchboard/message.string", .send, .string),
    ("switchboard/message.binary", .send, .binary),
    ("switchboard/ticker", .listen, .standardMethod),
    ("switchboard/ticker", .cancel, .standardMethod),
    ("switchboard/ticker", .demand, .standardMethod),
    ("switchboard/room", .listen, .standardMethod),
    ("switchboard/room", .cancel, .standardMethod),
    ("switchboard/room.post", .send, .binary),
    ("switchboard/stats", .call("get"), .standardMethod),
    ("switchboard/channels", .call("list"), .standardMethod),
    ("switchboard/connections", .call("list"), .standardMethod),
    ("switchboard/connections", .call("close"), .standardMethod),
    ("fuzz/held/", .register, .standardMethod),
    ("fuzz/old", .call("echo"), .standardMethod),
    ("switchboard/stats", .anyMethod, .standardMethod),
    ("switchboard/channels", .anyMethod, .standardMethod),
    ("switchboard/connections", .anyMethod, .standardMethod),
    ("switchboard/echo.json", .anyMethod, .jsonMethod),
]

/// Argument names the built-in channels read, and other strings worth having as map keys and methods.
let knownStrings = [
    "offset", "limit", "count", "intervalMs", "id", "list", "close", "get", "echo", "fail", "listen", "cancel", "",
    "switchboard/echo", "version", "token", "n",
]

let edgeInts: [Int64] = [
    0, 1, -1, 2, 100, 999, 1000, 1001, Int64(Int32.max), Int64(Int32.min), Int64(Int32.max) + 1, 1 << 32, 0xFFFF_FFFF,
    Int64.max, Int64.min, Int64.max - 999, Int64.max - 1000, Int64.min + 1, -1000,
]
let edgeDoubles: [Double] = [
    0, -0.0, 1, 1.5, -1, .nan, .infinity, -.infinity, 1e300, -1e300, 5e-324, 9.223372036854775807e18, -9.3e18, 1000, 0.5,
]

extension FuzzInput {
    mutating func take(_ count: Int) -> [UInt8] { (0..<count).map { _ in takeByte() } }
    mutating func takeUInt64(_ count: Int) -> UInt64 { take(count).reduce(0) { $0 << 8 | UInt64($1) } }

    /// A value built from the next bytes; lists and maps only while `depth` > 0.
    mutating func value(depth: Int) -> ChannelValue {
        let tag = takeByte()
        switch tag % 16 {
        case 0: return .null
        case 1: return .bool(tag & 16 != 0)
        case 2: return .int32(Int32(truncatingIfNeeded: takeUInt64(4)))
        case 3: return .int64(Int64(bitPattern: takeUInt64(8)))
        case 4:
            let n = edgeInts[Int(takeByte()) % edgeInts.count]
            return Int32(exactly: n).map(ChannelValue.int32) ?? .int64(n)
        case 5: return .float64(edgeDoubles[Int(takeByte()) % edgeDoubles.count])
        case 6: return .float64(Double(bitPattern: takeUInt64(8)))
        case 7: return .string(knownStrings[Int(takeByte()) % knownStrings.count])
        case 8: return .string(String(decoding: take(Int(takeByte() % 32)), as: UTF8.self))
        case 9: return .uint8List(take(Int(takeByte() % 32)))
        case 10: return .int32List((0..<Int(takeByte() % 8)).map { _ in Int32(truncatingIfNeeded: takeUInt64(4)) })
        case 11: return .int64List((0..<Int(takeByte() % 8)).map { _ in edgeInts[Int(takeByte()) % edgeInts.count] })
        case 12: return .float64List((0..<Int(takeByte() % 8)).map { _ in edgeDoubles[Int(takeByte()) % edgeDoubles.count] })
        case 13:
            guard depth > 0 else { return .null }
            return .list((0..<Int(takeByte() % 6)).map { _ in value(depth: depth - 1) })
        default:
            guard depth > 0 else { return .null }
            return .map((0..<Int(takeByte() % 6)).map { _ in
                let keyTag = takeByte()
                let key: ChannelValue = keyTag < 200 ? .string(knownStrings[Int(keyTag) % knownStrings.count]) : value(depth: depth - 1)
                return ChannelValue.MapEntry(key, value(depth: depth - 1))
            })
        }
    }
}

/// The bytes of one request, or nil when its value has no form in the request's encoding.
func request(id: UInt32, text: Bool, channel: String, verb: Verb, encoding: Encoding, value: ChannelValue,
             method: String) -> [UInt8]? {
    if text {
        var fields: [ChannelValue.MapEntry] = [.init("id", .int(Int(id)))]
        switch verb {
        case .call(let name): fields += [.init("call", .string(channel)), .init("method", .string(name)), .init("args", value)]
        case .anyMethod: fields += [.init("call", .string(channel)), .init("method", .string(method)), .init("args", value)]
        case .listen: fields += [.init("listen", .string(channel)), .init("args", value)]
        case .cancel: fields += [.init("cancel", .string(channel)), .init("args", value)]
        case .send: fields += [.init("send", .string(channel)), .init("message", value)]
        case .demand: fields += [.init("demand", .string(channel)), .init("n", value)]
        case .register: return nil  // binary only
        }
        guard let line = try? JSONText.serialize(.map(fields), options: .textMode) else { return nil }
        return line + [UInt8(ascii: "\n")]
    }
    let payload: [UInt8]?
    switch (verb, encoding) {
    case (.demand, _):
        let credit = UInt32(truncatingIfNeeded: value.intValue ?? 0)
        return Frame(.demand, id: 0, channel: channel, payload: (0..<4).map { UInt8(truncatingIfNeeded: credit >> (24 - 8 * $0)) }).bytes
    case (.register, _):
        return Frame(.register, id: id, channel: channel + (value.stringValue ?? ""), payload: nil).bytes
    case (.send, .standardMessage): payload = try? StandardMessageCodec().encode(value)
    case (.send, .string): payload = value.stringValue.map { Array($0.utf8) } ?? (value.isNull ? nil : [0xFF])
    case (.send, _): payload = if case .uint8List(let bytes) = value { bytes } else { value.isNull ? nil : [] }
    default:
        let name = switch verb {
        case .call(let name): name
        case .listen: "listen"
        case .cancel: "cancel"
        default: method
        }
        let codec: any MethodCodec = encoding == .jsonMethod ? JSONMethodCodec() : StandardMethodCodec()
        guard let call = try? codec.encodeMethodCall(MethodCall(method: name, arguments: value)) else { return nil }
        payload = call
    }
    return Frame(.message, id: id, channel: channel, payload: payload).bytes
}

/// One connection of the fuzzer's and the answers it got, by id.
final class Peer {
    let transport: InMemoryTransport
    let isText: Bool
    var answers: [UInt32: Int] = [:]

    init(_ embedded: EmbeddedServer, text: Bool, hello: Bool) {
        transport = embedded.connect(name: text ? "text" : "binary")
        isText = text
        if hello, !text { transport.send(Frame(.hello, id: 0xFFFF_FFFF, payload: Array(#"{"token":"t"}"#.utf8))) }
    }

    var isGone: Bool { transport.isClosed || transport.isClosingGracefully }

    /// Reads what came, counting the answers by id (events and errors without an id are not answers).
    func read() {
        if isText {
            guard let lines = try? transport.lines() else { return check(false, "a text answer that is not JSON") }
            for line in lines {
                guard let id = line["id"]?.intValue, line["event"] == nil else { continue }
                check(["result", "error", "notImplemented", "reply", "pong"].contains { line[.string($0)] != nil }, "a line with an id that is no answer: \(line)")
                answers[UInt32(truncatingIfNeeded: id), default: 0] += 1
            }
        } else {
            guard let frames = try? transport.frames() else { return check(false, "binary output that is not whole frames") }
            for frame in frames where frame.id != 0 && [.reply, .error, .welcome, .pong].contains(frame.kind) {
                answers[frame.id, default: 0] += 1
            }
        }
    }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    var input = FuzzInput(start, count)
    let options = input.takeByte()
    var configuration = ServerConfiguration()
    configuration.maxFrame = 64 * 1024
    configuration.outboundLimit = 32 * 1024  // an endless ticker fills at most this per loop turn
    configuration.maxRegistrationsPerConnection = 3
    var plugins: [any Plugin] = []
    if options & 1 != 0 {
        guard let parsed = try? PluginConfiguration.parse(Data(pluginConfiguration.utf8)) else { fatalError("the plugin configuration does not parse") }
        plugins = PluginConfiguration.plugins(reading: LiveSettings(parsed))
    }
    guard let embedded = try? EmbeddedServer(configuration: configuration, plugins: plugins) else { fatalError("no server") }
    var binary = Peer(embedded, text: false, hello: options & 2 != 0)
    var text = Peer(embedded, text: true, hello: false)
    embedded.run()
    binary.read()

    var id: UInt32 = 0
    while !input.rest.isEmpty, id < 200 {
        let choice = input.takeByte()
        let target = targets[Int(choice & 0x7F) % targets.count]
        let method = input.value(depth: 0).stringValue ?? "m"
        let value = input.value(depth: 6)
        let isText = choice & 0x80 != 0
        if isText, text.isGone { text = Peer(embedded, text: true, hello: false) }
        if !isText, binary.isGone { binary = Peer(embedded, text: false, hello: options & 2 != 0) }
        let peer = isText ? text : binary
        id += 1
        guard let bytes = request(id: id, text: isText, channel: target.channel, verb: target.verb, encoding: target.encoding,
                                  value: value, method: method) else { continue }
        peer.transport.send(bytes)
        embedded.run()
        binary.read()
        text.read()
        let wantsAnswer: Bool = if case .demand = target.verb { isText } else { true }
        let got = peer.answers[id] ?? 0
        check(got == (wantsAnswer ? 1 : 0), "request \(id) to \(target.channel) (\(target.verb), \(isText ? "text" : "binary")) got \(got) answers")
    }
    // Nothing more arrives for any of them, and the server still answers a PING.
    embedded.run(turns: 4)
    for peer in [binary, text] {
        peer.read()
        check(peer.answers.values.allSatisfy { $0 == 1 }, "a request answered more than once: \(peer.answers)")
    }
    let probe = embedded.connect(name: "probe")
    probe.send(Frame(.ping, id: 77, payload: [1, 2, 3]))
    embedded.run()
    let pong = (try? probe.frames()) ?? []
    check(pong.contains { $0.kind == .pong && $0.id == 77 && $0.payload == [1, 2, 3] }, "no PONG: the server does not answer")
    embedded.finish()
    return 0
}
