#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Logging
import Synchronization
import Testing
import SwitchboardCodec
import SwitchboardDemo
import SwitchboardPluginAPI
@testable import SwitchboardPlugins
import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport
import SwitchboardWire

/// Log records, for the request log's tests.
final class CapturedLog: Sendable {
    struct Record: Sendable {
        let level: Logger.Level
        let message: String
        let metadata: [String: String]
    }

    private let records = Mutex<[Record]>([])
    var all: [Record] { records.withLock { $0 } }

    var logger: Logger {
        Logger(label: "test.requests") { _ in Handler(log: self) }
    }

    struct Handler: LogHandler {
        let log: CapturedLog
        var metadata: Logger.Metadata = [:]
        var logLevel: Logger.Level = .trace
        subscript(metadataKey key: String) -> Logger.Metadata.Value? {
            get { metadata[key] }
            set { metadata[key] = newValue }
        }
        func log(event: LogEvent) {
            let fields = (event.metadata ?? [:]).mapValues { "\($0)" }
            log.records.withLock { $0.append(Record(level: event.level, message: "\(event.message)", metadata: fields)) }
        }
    }
}

@Suite("Plugins: access control, rate limits, request log, aliases, configuration")
struct BuiltInPluginsTests {
    @Test("anonymous connections get the anonymous rights: forbidden calls, listens and REGISTERs, connection open")
    func anonymousRights() throws {
        let settings = LiveSettings(PluginConfiguration(access: accessRules()))
        let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: settings))
        let peer = embedded.connect()
        peer.send(try .call(1, "switchboard/echo", "echo", "ok"))
        peer.send(try .call(2, "switchboard/stats", "get"))
        peer.send(try .call(3, "switchboard/room", "listen"))
        peer.send(Frame(.register, id: 4, channel: "held/a", payload: nil))
        peer.send(Frame(.message, id: 5, channel: "switchboard/message", payload: try StandardMessageCodec().encode(1)))
        peer.send(Frame(.ping, id: 6, payload: nil))
        embedded.run()
        let frames = try peer.frames()
        #expect(frames.map(\.id) == [1, 2, 3, 4, 5, 6])
        #expect(try frames[0].envelope().get() == "ok")
        #expect(frames[1...4].map(\.errorCode) == ["forbidden", "forbidden", "forbidden", "forbidden"])
        #expect(frames[5].kind == .pong)
        let message = try JSONText.parse(try #require(frames[2].payload))["message"]
        #expect(message == "anonymous connections may not listen on switchboard/room")
        let operator_ = embedded.connect()  // bob may call anything
        operator_.send(hello(token: "bob-token", id: 99))
        let stats = try operator_.stats(on: embedded)
        #expect(stats["plugins"]?["access"]?["rejected"]?["forbidden"] == 4)
    }

    @Test("a user's token identifies it; deny wins over allow; a wrong token is unauthorized")
    func userRights() throws {
        let settings = LiveSettings(PluginConfiguration(access: accessRules()))
        let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: settings))
        let alice = embedded.connect()
        alice.send(hello(token: "alice-token"))
        alice.send(try .call(2, "switchboard/echo", "echo", 1))
        alice.send(try .call(3, "switchboard/stats", "get"))  // allowed by switchboard/*, denied by name
        alice.send(try .call(4, "switchboard/room", "listen"))
        alice.send(try .call(5, "switchboard/ticker", "listen"))
        alice.send(Frame(.register, id: 6, channel: "held/a", payload: nil))
        alice.send(Frame(.register, id: 7, channel: "other", payload: nil))
        embedded.run()
        let frames = try alice.frames()
        #expect(frames.map(\.kind) == [.welcome, .reply, .error, .reply, .error, .reply, .error])
        #expect(frames.compactMap(\.errorCode) == ["forbidden", "forbidden", "forbidden"])
        let bob = embedded.connect()  // no allow lists: everything; its hash was written in capitals
        bob.send(hello(token: "bob-token"))
        bob.send(try .call(2, "switchboard/stats", "get"))
        embedded.run()
        #expect(try bob.frames().map(\.kind) == [.welcome, .reply])
        let stranger = embedded.connect()
        stranger.send(hello(token: "guess"))
        embedded.run()
        #expect(try stranger.frames().map(\.errorCode) == ["unauthorized"])
        #expect(stranger.isClosingGracefully || stranger.isClosed)
    }

    @Test("a listen is judged by what it does: text mode's call of `listen` is a listen")
    func textModeListenIsJudgedAsListen() throws {
        let settings = LiveSettings(PluginConfiguration(access: accessRules()))
        let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: settings))
        let peer = embedded.connect()
        peer.send(line: #"{"id":1,"listen":"switchboard/room"}"#)
        peer.send(line: #"{"id":2,"call":"switchboard/room","method":"listen"}"#)
        peer.send(line: #"{"id":3,"send":"switchboard/message","message":1}"#)
        peer.send(line: #"{"id":4,"call":"switchboard/echo","method":"echo","args":"fine"}"#)
        embedded.run()
        let lines = try peer.lines()
        #expect(lines.map { $0["error"]?["code"] } == ["forbidden", "forbidden", "forbidden", nil])
        #expect(lines[3] == .stringMap(["id": 4, "result": "fine"]))
    }

    @Test("a reload changes the rights of a live connection from its next request")
    func reloadChangesLiveRights() throws {
        let settings = LiveSettings(PluginConfiguration(access: accessRules()))
        let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: settings))
        let peer = embedded.connect()
        peer.send(try .call(1, "switchboard/stats", "get"))
        embedded.run()
        #expect(try peer.frames().map(\.errorCode) == ["forbidden"])
        var widened = accessRules()
        widened.anonymous = .init(allow: .init(call: ["*"]))
        settings.replace(with: PluginConfiguration(access: widened))
        peer.send(try .call(2, "switchboard/stats", "get"))
        peer.send(try .call(3, "switchboard/echo", "echo"))
        embedded.run()
        #expect(try peer.frames().map(\.kind) == [.reply, .reply])
    }

    @Test("a file that fails to parse at reload keeps the old settings")
    func badReloadKeepsOld() throws {
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("sb-reload-\(getpid()).json").path
        defer { unlink(path) }
        let good = #"{"aliases": {"a": "b"}}"#
        try Data(good.utf8).write(to: URL(fileURLWithPath: path))
        let settings = LiveSettings(try PluginConfiguration.load(path: path))
        let log = CapturedLog()
        try Data(#"{"aliases": {"a" "c"}}"#.utf8).write(to: URL(fileURLWithPath: path))
        #expect(settings.reload(path: path, logger: log.logger) == false)
        #expect(settings.current.aliases == ["a": "b"])
        #expect(log.all.last?.message.contains("line 1, column 18") == true, "\(log.all.last?.message ?? "")")
        try Data(#"{"aliases": {"a": "c"}}"#.utf8).write(to: URL(fileURLWithPath: path))
        #expect(settings.reload(path: path, logger: log.logger))
        #expect(settings.current.aliases == ["a": "c"])
    }

    @Test("configuration errors name the line or the key")
    func configurationErrors() {
        func error(_ text: String) -> String? {
            do { _ = try PluginConfiguration.parse(Data(text.utf8)); return nil } catch { return error.description }
        }
        #expect(error("{\n  \"aliases\": {\"a\": \"b\"\n}") == "line 3, column 2: not valid JSON (expected ',' or '}')")
        #expect(error(#"{"access": {"users": [{"name": "x", "tokenSha256": "ab", "alow": {}}]}}"#)
            == "at access.users[0].alow: unknown key (known: allow, certificateSubject, deny, name, tokenSha256)")
        #expect(error(#"{"access": {"users": [{"name": "x", "tokenSha256": "ab"}]}}"#)
            == "access.users[0] (x): tokenSha256 must be 64 hexadecimal digits")
        #expect(error(#"{"rateLimits": [{"channels": ["*"], "kinds": ["calls"], "perConnection": {"rate": 1, "burst": 1}}]}"#)?
            .hasPrefix("at rateLimits[0].kinds:") == true)
        #expect(error(#"{"rateLimits": [{"channels": ["*"]}]}"#) == "rateLimits[0]: needs perConnection or perUser")
        #expect(error(#"{"requestLog": {"sampleOneIn": "many"}}"#) == "at requestLog.sampleOneIn: expected Int")
        #expect(error(#"{"access": {"anonymus": {}}}"#) == "at access.anonymus: unknown key (known: anonymous, users)")
        #expect(error(#"{"access": {"anonymous": {"allow": {}, "deny": {}, "grant": {}}}}"#)?.hasPrefix("at access.anonymous.grant:") == true)
        #expect(error(#"{"rateLimits": [{"channels": ["*"], "perUser": {"rate": 1, "burst": 1, "per": 2}}]}"#)?
            .hasPrefix("at rateLimits[0].perUser.per:") == true)
        #expect(error(#"{"aliases": {"a": "b"}, "access": {}, "rateLimits": [], "requestLog": {}}"#) == nil)
    }

    @Test("rate limits: a burst, then the rate, measured over a window; retryAfterMs in the details")
    func rateLimitOverAWindow() throws {
        let rules = [RateLimitRule(channels: ["switchboard/echo"], perConnection: .init(rate: 100, burst: 10))]
        let settings = LiveSettings(PluginConfiguration(rateLimits: rules))
        let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: settings))
        let peer = embedded.connect()
        for id in UInt32(1)...15 { peer.send(try .call(id, "switchboard/echo", "echo")) }
        peer.send(try .call(16, "switchboard/stats", "get"))  // another channel: not limited
        embedded.run()
        let burst = try peer.frames()
        #expect(burst.prefix(10).allSatisfy { $0.kind == .reply })
        #expect(burst[10..<15].allSatisfy { $0.errorCode == "rate_limited" })
        #expect(burst[15].kind == .reply)
        let details = try JSONText.parse(try #require(burst[10].payload))["details"]
        let retry = try #require(details?["retryAfterMs"]?.intValue)
        #expect((1...10).contains(retry))

        // A steady stream over 400 ms: rate × time gets through.
        var accepted = 0, refused = 0, id: UInt32 = 100
        for _ in 0..<200 {
            for _ in 0..<4 {  // offered faster than the rate
                id += 1
                peer.send(try .call(id, "switchboard/echo", "echo"))
            }
            embedded.run(turns: 1)
            for frame in try peer.frames() { if frame.kind == .reply { accepted += 1 } else { refused += 1 } }
            embedded.advanceTime(byMs: 2)
        }
        // The burst was spent: what the rate refills, and no more (the last 2 ms refill unasked).
        #expect(refused > 0)
        #expect((39...40).contains(accepted), "accepted \(accepted) in 400 ms")
    }

    @Test("anonymous connections from one address share a bucket, on every loop: reconnecting does not refill it; users and other addresses have their own")
    func anonymousBucketPerAddress() async throws {
        let address = try #require(RawSocket.nonLoopbackAddress, "this machine has no address but loopback")
        let rules = [RateLimitRule(channels: ["switchboard/echo"], perConnection: .init(rate: 0.001, burst: 5))]
        let plugins = PluginConfiguration.plugins(reading: LiveSettings(PluginConfiguration(access: accessRules(), rateLimits: rules)))
        try await withServer({ $0.host = "0.0.0.0" }, setUp: { server in for plugin in plugins { server.load(plugin) } }) { _, port in
            /// The replies (not refusals) to five calls on a new connection from `host`, after `hello` if given.
            func admitted(from host: String = "127.0.0.1", hello: Frame? = nil) async throws -> Int {
                let connection = try RawConnection(host: host, port: port)
                if let hello {
                    try connection.send(hello)
                    _ = try await connection.frame()
                }
                for id in UInt32(1)...5 { try connection.send(try .call(id, "switchboard/echo", "echo")) }
                var replies = 0
                for _ in 1...5 where try await connection.frame().kind == .reply { replies += 1 }
                return replies
            }
            var reconnecting: [Int] = []
            for _ in 1...5 { reconnecting.append(try await admitted()) }  // dealt round the loops
            #expect(reconnecting == [5, 0, 0, 0, 0])
            #expect(try await admitted(hello: hello(token: "bob-token")) == 5)  // a user: its own bucket
            #expect(try await admitted(from: address) == 5)
            #expect(try await admitted(from: address) == 0)
        }
    }

    @Test("anonymous buckets per address are bounded: refilled ones go first, then others, a quarter at a time; a reload drops them")
    func addressBucketsAreBounded() {
        let buckets = RateLimiter.AddressBuckets(capacity: 8), limit = RateLimitRule.Limit(rate: 1, burst: 1)
        func bucket(_ host: Int, now: UInt64, generation: Int = 0) -> RateLimiter.SharedBucket {
            buckets.bucket(host: "10.0.0.\(host)", rule: 0, limit: limit, generation: generation, now: now)
        }
        for host in 0..<8 { #expect(bucket(host, now: 0).wait(limit, now: 0, taking: true) == 0) }
        #expect(bucket(3, now: 0) === bucket(3, now: 0) && buckets.count == 8)
        _ = bucket(8, now: 0)  // full, none refilled: two arbitrary ones go
        #expect(buckets.count == 7)
        _ = bucket(9, now: 0)
        _ = bucket(10, now: 5000)  // every spent bucket has refilled by now: all go
        #expect(buckets.count == 1)
        _ = bucket(11, now: 5000, generation: 1)
        #expect(buckets.count == 1)
        #expect(hostOfAddress( "192.0.2.7:5000") == "192.0.2.7" && hostOfAddress( "[fd00::2]:80") == "fd00::2")
        #expect(hostOfAddress( "memory") == "memory")
    }

    @Test("a per-user bucket is shared by the user's connections; anonymous ones have their own")
    func perUserBucket() throws {
        let rules = [RateLimitRule(channels: ["*"], kinds: ["call"], perUser: .init(rate: 0.001, burst: 3))]
        var access = accessRules()
        access.anonymous = .init()
        let settings = LiveSettings(PluginConfiguration(access: access, rateLimits: rules))
        let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: settings))
        let first = embedded.connect(), second = embedded.connect(), anonymous = embedded.connect()
        for peer in [first, second] { peer.send(hello(token: "bob-token", id: 99)) }
        first.send(try .call(1, "switchboard/echo", "echo"))
        first.send(try .call(2, "switchboard/echo", "echo"))
        second.send(try .call(1, "switchboard/echo", "echo"))
        second.send(try .call(2, "switchboard/echo", "echo"))
        for id in UInt32(1)...5 { anonymous.send(try .call(id, "switchboard/echo", "echo")) }
        embedded.run()
        let answers = try (first.frames() + second.frames()).filter { $0.id != 99 }
        #expect(answers.filter { $0.kind == .reply }.count == 3)
        #expect(answers.compactMap(\.errorCode) == ["rate_limited"])
        let anonymousAnswers = try anonymous.frames()
        #expect(anonymousAnswers.count == 5 && anonymousAnswers.allSatisfy { $0.kind == .reply })
    }

    @Test("the request log: sampled lines, slow requests always, refusals included")
    func requestLog() throws {
        let log = CapturedLog()
        let settings = LiveSettings(PluginConfiguration(access: accessRules(), requestLog: .init(sampleOneIn: 2, slowMs: 20)))
        let embedded = try EmbeddedServer(plugins: [AccessControl(settings: settings), RequestLog(settings: settings, logger: log.logger)])
        MethodChannel(name: "slow", server: embedded.server).setMethodCallHandler { call, result in
            startThread {
                usleep(30_000)  // real time: the request log times a request by the real clock (EventLoop.nanoseconds), past slowMs
                result.success(call.arguments)
            }
        }
        embedded.run()
        let peer = embedded.connect()
        for id in UInt32(1)...4 { peer.send(try .call(id, "switchboard/echo", "echo")) }
        embedded.run()
        #expect(log.all.count == 2)
        #expect(log.all.first?.metadata["channel"] == "switchboard/echo")
        #expect(log.all.first?.metadata["method"] == "echo")
        #expect(log.all.first?.metadata["outcome"] == "success")
        #expect(log.all.first?.metadata["user"] == "-")
        #expect(log.all.first?.level == .notice)
        peer.send(hello(token: "bob-token", id: 9))
        peer.send(try .call(10, "slow", "wait", "x"))
        #expect(embedded.run { ((try? peer.frames()) ?? []).contains { $0.id == 10 } })
        let slow = try #require(log.all.last)
        #expect(slow.message == "slow request")
        #expect(slow.level == .warning)
        #expect(slow.metadata["user"] == "bob")
        #expect(Int(slow.metadata["durationUs"] ?? "") ?? 0 >= 20_000)
        let before = log.all.count
        let anonymous = embedded.connect()
        anonymous.send(try .call(1, "switchboard/stats", "get"))
        anonymous.send(try .call(2, "switchboard/stats", "get"))
        embedded.run()
        #expect(log.all.count == before + 1)
        #expect(log.all.last?.metadata["outcome"] == "error:forbidden")
    }

    /// Fails every request on `fail/*`, naming its channel in the error.
    struct Thrower: Plugin, InboundProcessor {
        struct Failure: Error, CustomStringConvertible { let description: String }
        let name = "thrower"
        var inbound: [any InboundProcessor] { [self] }
        var scope: Scope<InboundKind> { Scope(channels: [ChannelPattern("fail/*")]) }
        func process(_ request: inout InboundRequest) throws -> InboundDecision {
            throw Failure(description: "cannot handle \(request.channel)")
        }
    }

    /// What a ``StreamLogHandler`` writes, kept.
    final class LogText: TextOutputStream, Sendable {
        private let text = Mutex("")
        func write(_ string: String) { text.withLock { $0 += string } }
        var lines: [Substring] { text.withLock { $0 }.split(separator: "\n") }
    }

    @Test("log lines cannot be forged: control characters a client sends are escaped, in the request log and the server's warnings")
    func logValuesAreEscaped() async throws {
        let output = LogText()
        // As `switchboard serve` makes its handlers, writing here rather than to standard error.
        let logger = Logger(label: "test") { EscapingLogHandler(StreamLogHandler(label: $0, stream: output, metadataProvider: nil)) }
        let settings = LiveSettings(PluginConfiguration(access: accessRules(), requestLog: .init()))
        let server = try Server(configuration: .forTests(), logger: logger)
        server.installDemoChannels()
        for plugin: any Plugin in [Thrower(), AccessControl(settings: settings), RequestLog(settings: settings, logger: logger)] {
            server.load(plugin)
        }
        let port = try server.start()
        let client = try RawConnection(port: port)
        try client.send(try .call(1, "x\n2026-11-27T05:00:00+0000 critical switchboard: forged", "get"))
        try client.send(try .call(2, "fail/\r\n\u{1B}[2J\u{85}\u{2028}\\n", "get\u{7}"))
        #expect(try await client.frame().errorCode == "forbidden")
        #expect(try await client.frame().errorCode == "plugin_error")
        server.shutdown()
        await server.waitUntilStopped()
        let lines = output.lines
        #expect(lines.allSatisfy { $0.firstMatch(of: #/^\d{4}-\d\d-\d\dT\S+ (notice|warning) test: /#) != nil }, "\(lines)")
        let control = lines.filter { $0.unicodeScalars.contains { $0.value < 0x20 || (0x7F...0x9F).contains($0.value) || $0 == "\u{2028}" } }
        #expect(control.isEmpty, "\(control)")
        #expect(lines.contains { $0.contains(#"channel="x\n2026-11-27T05:00:00+0000 critical switchboard: forged" "#) }, "\(lines)")
        #expect(lines.contains { $0.contains(#"[SwitchboardServer] plugin thrower failed: cannot handle fail/\r\n\u{1B}[2J\u{85}\u{2028}\\n"#) },
                "\(lines)")
        #expect(lines.contains { $0.contains(#"method=get\u{7} "#) }, "\(lines)")
    }

    @Test("log values with a space, = or \" are quoted: a method cannot add key=value fields to a request-log line")
    func logValuesAreQuoted() async throws {
        let output = LogText()
        let logger = Logger(label: "test") { EscapingLogHandler(StreamLogHandler(label: $0, stream: output, metadataProvider: nil)) }
        let settings = LiveSettings(PluginConfiguration(requestLog: .init()))
        let server = try Server(configuration: .forTests(), logger: logger)
        server.installDemoChannels()
        server.load(RequestLog(settings: settings, logger: logger))
        let port = try server.start()
        let client = try RawConnection(port: port)
        try client.send(try .call(1, "switchboard/echo", "echo durationUs=5 outcome=success user=ops", "x"))
        try client.send(try .call(2, #"say "hi"=1"#, "get"))
        _ = try await client.frame()
        _ = try await client.frame()
        server.shutdown()
        await server.waitUntilStopped()
        let lines = output.lines.filter { $0.contains("channel=") }
        #expect(lines.count == 2, "\(lines)")
        // A reader that takes a quoted value as one sees each field once.
        let unquoted = lines.map { $0.replacing(#/"(?:[^"\\]|\\.)*"/#, with: "…") }
        #expect(unquoted.allSatisfy { $0.matches(of: #/ user=/#).count == 1 && $0.matches(of: #/ outcome=/#).count == 1 }, "\(lines)")
        #expect(lines.contains { $0.contains(#"method="echo durationUs=5 outcome=success user=ops" "#) }, "\(lines)")
        #expect(lines.contains { $0.contains(#"channel="say \"hi\"=1" "#) }, "\(lines)")
    }

    @Test("aliases: old names reach the new channels, events go out under the old name, DEMAND follows")
    func aliases() throws {
        let settings = LiveSettings(PluginConfiguration(aliases: ["old/echo": "switchboard/echo", "old/ticker": "switchboard/ticker"]))
        let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: settings))
        let old = embedded.connect(), new = embedded.connect()
        old.send(try .call(1, "old/echo", "echo", "via old"))
        old.send(Frame(.demand, channel: "old/ticker", payload: [0, 0, 0, 1]))  // credit before the listen
        old.send(try .call(2, "old/ticker", "listen", .stringMap(["count": 3, "intervalMs": 0])))
        new.send(try .call(2, "switchboard/ticker", "listen", .stringMap(["count": 2, "intervalMs": 0])))
        embedded.run(turns: 10)
        let oldFrames = try old.frames()
        #expect(try oldFrames[0].envelope().get() == "via old")
        let oldEvents = oldFrames.filter { $0.kind == .message }
        #expect(oldEvents.map(\.channel) == ["old/ticker"])  // one credit: one event
        old.send(Frame(.demand, channel: "old/ticker", payload: [0, 0, 0, 5]))
        embedded.run(turns: 10)
        let more = try old.frames().filter { $0.kind == .message }
        #expect(more.map(\.channel) == ["old/ticker", "old/ticker", "old/ticker"])  // two events, then the end
        #expect(more.last?.payload == nil)
        #expect(try new.frames().filter { $0.kind == .message }.map(\.channel) == Array(repeating: "switchboard/ticker", count: 3))
    }
}

@Suite("Plugins: gates")
struct GateTests {
    /// Access control with a rule for each route a gate judges alone: calls, sends, a held channel.
    func server() throws -> EmbeddedServer {
        let rules = AccessRules(users: [.init(name: "ops", tokenSha256: sha("ops"))], anonymous: .init(
            allow: .init(call: ["switchboard/echo", "held/method"], listen: ["*"], send: ["switchboard/message"], register: ["held/*"]),
            deny: .init(call: ["held/method"])))
        let settings = LiveSettings(PluginConfiguration(access: rules))
        return try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: settings))
    }

    @Test("calls and sends judged by the gates alone: refusals with their ids, id 0 refused silently but counted")
    func gatedCallsAndSends() throws {
        let embedded = try server()
        let holder = embedded.connect(), peer = embedded.connect()
        holder.send(Frame(.register, id: 1, channel: "held/method", payload: Array(#"{"kind":"method"}"#.utf8)))
        holder.send(Frame(.register, id: 2, channel: "held/message", payload: Array(#"{"kind":"message","codec":"string"}"#.utf8)))
        embedded.run()
        #expect(try holder.frames().map(\.kind) == [.reply, .reply])
        let message = try StandardMessageCodec().encode("x")
        peer.send(try .call(1, "switchboard/echo", "echo", 1))  // allowed call
        peer.send(Frame(.message, id: 2, channel: "switchboard/message", payload: message))  // allowed send
        peer.send(Frame(.message, id: 3, channel: "switchboard/message.json", payload: message))  // send not allowed
        peer.send(try .call(4, "held/method", "x"))  // denied call to a held channel
        peer.send(Frame(.message, id: 5, channel: "held/message", payload: Array("hi".utf8)))  // send not allowed
        peer.send(Frame(.message, id: 0, channel: "switchboard/message.json", payload: message))  // id 0: silent
        peer.send(try .call(6, "switchboard/stats", "get"))  // call not allowed
        embedded.run()
        let frames = try peer.frames()
        #expect(frames.map(\.id) == [1, 2, 3, 4, 5, 6])
        #expect(frames.map(\.errorCode) == [nil, nil, "forbidden", "forbidden", "forbidden", "forbidden"])
        #expect(try holder.frames().isEmpty)  // nothing reached the holder
        let operator_ = embedded.connect()
        operator_.send(hello(token: "ops", id: 99))
        #expect(try operator_.stats(on: embedded)["plugins"]?["access"]?["rejected"]?["forbidden"] == 5)  // id 0's too
    }
    /// A gate that counts its judgments: echo is metered (two calls per meter), stats refused, the rest
    /// admitted.
    struct CountingGate: InboundGate {
        final class Counts: Sendable {
            let judged = Atomic<Int>(0)
        }
        /// Two calls per connection, kept in the connection's state as a gate must (the same meter
        /// however often it is judged).
        final class Quota: GateMeter {
            var left = 2
            func admit(now: UInt64) -> Rejection? {
                left -= 1
                return left >= 0 ? nil : Rejection(code: "quota", message: "no calls left")
            }
        }
        let counts: Counts
        let epoch: VerdictEpoch?

        func judge(_ connection: ConnectionContext, channel: String, kind: InboundKind) -> GateVerdict {
            counts.judged.add(1, ordering: .relaxed)
            switch channel {
            case "switchboard/echo":
                let quota = connection.state(Quota.self) ?? Quota()
                connection.keep(quota)
                return .meter(quota)
            case "switchboard/stats": return .refuse(.forbidden("no stats"))
            default: return .admit
            }
        }
    }

    struct CountingPlugin: Plugin {
        let name = "counting"
        let gate: CountingGate
        var inbound: [any InboundProcessor] { [gate] }
    }

    @Test("a gate is judged once per channel and kind; its meter per request; a reload or a HELLO judges again")
    func verdictsKept() throws {
        let counts = CountingGate.Counts(), epoch = VerdictEpoch()
        let embedded = try EmbeddedServer(plugins: [CountingPlugin(gate: CountingGate(counts: counts, epoch: epoch))])
        let client = embedded.connect()
        func calls(_ channel: String, _ ids: ClosedRange<UInt32>) throws -> [String?] {
            for id in ids { client.send(try .call(id, channel, "echo", 1)) }
            embedded.run()
            return try client.frames().map(\.errorCode)
        }
        #expect(try calls("switchboard/echo", 1...3) == [nil, nil, "quota"])  // one meter for all three
        #expect(counts.judged.load(ordering: .relaxed) == 1)
        #expect(try calls("switchboard/stats", 4...5) == ["forbidden", "forbidden"])
        #expect(counts.judged.load(ordering: .relaxed) == 2)
        #expect(try calls("switchboard/echo", 6...7) == ["quota", "quota"])  // judged again: the same meter
        #expect(counts.judged.load(ordering: .relaxed) == 3)
        epoch.advance()  // a reload
        #expect(try calls("switchboard/echo", 8...8) == ["quota"])
        #expect(counts.judged.load(ordering: .relaxed) == 4)
        client.send(Frame(.hello, id: 10, payload: Array(#"{"version":1}"#.utf8)))
        embedded.run()
        _ = try client.frames()
        #expect(try calls("switchboard/echo", 11...11) == ["quota"])
        #expect(counts.judged.load(ordering: .relaxed) == 5)
        let text = embedded.connect()  // text mode takes the whole pipeline: judged per request
        for id in 1...3 { text.send(line: #"{"id":\#(id),"call":"switchboard/echo","method":"echo","args":1}"#) }
        embedded.run()
        #expect(try text.lines().map { $0["error"]?["code"]?.stringValue } == [nil, nil, "quota"])
        #expect(counts.judged.load(ordering: .relaxed) == 8)
    }

    @Test("a rate limit's bucket outlives a new HELLO and other channels; only a reload refills it")
    func bucketsOutliveReJudging() throws {
        let settings = LiveSettings(PluginConfiguration(rateLimits: [
            RateLimitRule(channels: ["switchboard/echo"], perConnection: .init(rate: 0.001, burst: 3)),
        ]))
        let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: settings))
        let client = embedded.connect()
        var id: UInt32 = 0
        func call(_ channel: String) throws -> String? {
            id += 1
            client.send(try .call(id, channel, "echo", 1))
            embedded.run()
            return try client.frames().last?.errorCode
        }
        #expect(try call("switchboard/echo") == nil)
        #expect(try call("switchboard/stats") == nil)  // another channel, no rule: judged again
        #expect(try call("switchboard/echo") == nil)
        client.send(Frame(.hello, id: 99, payload: Array(#"{"version":1}"#.utf8)))
        embedded.run()
        _ = try client.frames()
        #expect(try call("switchboard/echo") == nil)  // the third token, after the HELLO
        #expect(try call("switchboard/echo") == "rate_limited")
        settings.replace(with: settings.current)  // a reload: new buckets
        #expect(try call("switchboard/echo") == nil)
    }
}

@Suite("Plugins: access control corners")
struct AccessCornerTests {
    @Test("a call on a held event channel is a call, not a listen")
    func callOnHeldEventChannel() throws {
        let rules = AccessRules(anonymous: .init(allow: .init(call: [], listen: ["held/*"], send: [], register: ["held/*"])))
        let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: LiveSettings(PluginConfiguration(access: rules))))
        let holder = embedded.connect(), peer = embedded.connect()
        holder.send(Frame(.register, id: 1, channel: "held/events", payload: Array(#"{"kind":"event"}"#.utf8)))
        embedded.run()
        _ = try holder.frames()
        peer.send(try .call(2, "held/events", "reboot"))
        embedded.run()
        #expect(try peer.frames().map(\.errorCode) == ["forbidden"])
        #expect(try holder.frames().isEmpty)  // the call never reached the holder
    }

    @Test("a reload that changes a user's token revokes the rights of connections that used the old one")
    func tokenRotation() throws {
        let settings = LiveSettings(PluginConfiguration(access: accessRules()))
        let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: settings))
        let bob = embedded.connect()
        bob.send(hello(token: "bob-token"))
        bob.send(try .call(2, "switchboard/echo", "echo"))
        embedded.run()
        #expect(try bob.frames().map(\.kind) == [.welcome, .reply])
        var rotated = accessRules()
        rotated.users?[1].tokenSha256 = sha("bob-new-token")
        settings.replace(with: PluginConfiguration(access: rotated))
        bob.send(try .call(3, "switchboard/echo", "echo"))
        bob.send(hello(token: "bob-new-token", id: 4))
        bob.send(try .call(5, "switchboard/echo", "echo"))
        embedded.run()
        let frames = try bob.frames()
        #expect(frames.map(\.errorCode) == ["forbidden", nil, nil])
        #expect(frames.map(\.kind) == [.error, .welcome, .reply])
    }
}
