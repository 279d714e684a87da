#if canImport(Glibc)
import Glibc
#endif
import Synchronization
import Testing
import SwitchboardCodec
import SwitchboardPluginAPI
import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport
import SwitchboardWire

/// A plugin made of closures, for tests.
struct TestPlugin: Plugin {
    let name: String
    var inbound: [any InboundProcessor] = []
    var outbound: [any OutboundProcessor] = []
}

struct InboundClosure: InboundProcessor {
    var scope = Scope<InboundKind>()
    let body: @Sendable (inout InboundRequest) throws -> InboundDecision
    func process(_ request: inout InboundRequest) throws -> InboundDecision { try body(&request) }
}

struct OutboundClosure: OutboundProcessor {
    var scope = Scope<OutboundKind>()
    var appliesTo: @Sendable (ConnectionContext, String) -> Bool = { _, _ in true }
    let body: @Sendable (inout OutboundMessage) throws -> OutboundDecision
    func applies(to connection: ConnectionContext, channel: String) -> Bool { appliesTo(connection, channel) }
    func process(_ message: inout OutboundMessage) throws -> OutboundDecision { try body(&message) }
}

/// A list of strings shared with processors.
final class Journal: Sendable {
    private let entries = Mutex<[String]>([])
    func add(_ entry: String) { entries.withLock { $0.append(entry) } }
    var all: [String] { entries.withLock { $0 } }
}

/// Deciders handed out by a deferring processor, kept for the test to call from another thread.
final class DeciderBox: Sendable {
    private let deciders = Mutex<[Decider]>([])
    func put(_ decider: Decider) { deciders.withLock { $0.append(decider) } }
    var first: Decider? { deciders.withLock { $0.first } }
    var all: [Decider] { deciders.withLock { $0 } }
    var count: Int { deciders.withLock { $0.count } }
}

/// One processor that takes every decision, by method name: `deny`, `short`, `later`, `boom`, and
/// `shout` (rewrites the argument); anything else goes on.
func decidingPlugin(deciders: DeciderBox) -> TestPlugin {
    TestPlugin(name: "decider", inbound: [InboundClosure(scope: Scope(channels: [ChannelPattern("switchboard/echo"), ChannelPattern("counted")])) { request in
        switch request.method {
        case "deny":
            return .reject(Rejection(code: "nope", message: "not today", details: .stringMap(["why": "test"])))
        case "short": return .answer(.success("short-circuited"))
        case "later": return .later { deciders.put($0) }
        case "boom": throw ChannelError(code: "exploded")
        case "shout":
            let argument = try request.decodedValue()?.stringValue ?? ""
            request.payload = .bytes(try StandardMethodCodec().encodeMethodCall(MethodCall(method: "echo", arguments: .string(argument.uppercased())))[...])
            return .next
        default: return .next
        }
    }])
}

@Suite("Plugins: the pipeline")
struct PluginPipelineTests {
    /// A refusal cannot carry a code the protocol gives another meaning (a closing ERROR, which a
    /// session's client would leave out of its stream): it goes as `plugin_error`, naming the code.
    @Test func refusalWithAReservedCodeIsAPluginError() {
        for code in ["timeout", "unauthorized", "cannot_resume", "session_taken"] {
            let rejection = Rejection(code: code, message: "no")
            #expect(rejection.code == "plugin_error" && rejection.error.message == "\(code): no", "\(code)")
        }
        #expect(Rejection(code: "quota", message: "no").code == "quota")
    }

    @Test("every inbound decision, in binary mode: go on, rewrite, reject, answer, fail, decide later")
    func binaryDecisions() throws {
        let deciders = DeciderBox()
        let embedded = try EmbeddedServer(plugins: [decidingPlugin(deciders: deciders)])
        let peer = embedded.connect()
        peer.send(try .call(1, "switchboard/echo", "echo", "plain"))
        peer.send(try .call(2, "switchboard/echo", "shout", "quiet"))
        peer.send(try .call(3, "switchboard/echo", "deny"))
        peer.send(try .call(4, "switchboard/echo", "short"))
        peer.send(try .call(5, "switchboard/echo", "boom"))
        peer.send(try .call(6, "switchboard/echo", "later"))
        embedded.run()
        let frames = try peer.frames()
        #expect(frames.map(\.id) == [1, 2, 3, 4, 5])
        #expect(try frames[0].envelope().get() == "plain")
        #expect(try frames[1].envelope().get() == "QUIET")
        #expect(frames[2].errorCode == "nope")
        let denial = try JSONText.parse(try #require(frames[2].payload))
        #expect(denial["details"] == .stringMap(["why": "test"]))
        #expect(try frames[3].envelope().get() == "short-circuited")
        #expect(frames[4].errorCode == "plugin_error")
        // Deferred: still open (a duplicate id is refused), answered once decided from another thread.
        peer.send(try .call(6, "switchboard/echo", "echo"))
        embedded.run()
        #expect(try peer.frames().map(\.errorCode) == ["duplicate_id"])
        let decider = try #require(deciders.first)
        onAnotherThread { decider(.next) }
        embedded.run(turns: 4)
        #expect(try peer.frames().isEmpty)  // the duplicate's ERROR was id 6's one answer
        let stats = try peer.stats(on: embedded)
        #expect(stats["plugins"]?["decider"]?["rejected"]?["nope"] == 1)
        #expect(stats["plugins"]?["decider"]?["failed"] == 1)
    }

    @Test("decisions made later from another thread answer their requests, each once")
    func deferredFromAnotherThread() throws {
        let deciders = DeciderBox()
        let embedded = try EmbeddedServer(plugins: [decidingPlugin(deciders: deciders)])
        let peer = embedded.connect()
        for id in UInt32(1)...3 { peer.send(try .call(id, "switchboard/echo", "later", .int(Int(id)))) }
        embedded.run()
        #expect(try peer.frames().isEmpty)
        let all = deciders.all
        #expect(all.count == 3)
        onAnotherThread {
            all[2](.next)  // on to the channel: echo has no method "later"
            all[0](.reject(.forbidden("decided later")))
            all[0](.next)  // a second decision is ignored
            all[1](.answer(.success(.int(22))))
        }
        var frames: [Frame] = []
        #expect(embedded.run { frames += (try? peer.frames()) ?? []; return frames.count >= 3 })
        embedded.run(turns: 4)
        frames += try peer.frames()
        #expect(frames.count == 3)
        let byID = Dictionary(uniqueKeysWithValues: frames.map { ($0.id, $0) })
        #expect(byID[3]?.kind == .reply && byID[3]?.payload == nil)  // not implemented
        #expect(byID[1]?.errorCode == "forbidden")
        #expect(try byID[2]?.envelope().get() == .int(22))
        #expect(try peer.stats(on: embedded)["repliesPending"] == 0)
    }

    @Test("every inbound decision, in text mode")
    func textDecisions() throws {
        let deciders = DeciderBox()
        let embedded = try EmbeddedServer(plugins: [decidingPlugin(deciders: deciders)])
        let peer = embedded.connect()
        peer.send(line: #"{"id":1,"call":"switchboard/echo","method":"echo","args":"plain"}"#)
        peer.send(line: #"{"id":2,"call":"switchboard/echo","method":"deny"}"#)
        peer.send(line: #"{"id":3,"call":"switchboard/echo","method":"short"}"#)
        peer.send(line: #"{"id":4,"call":"switchboard/echo","method":"boom"}"#)
        peer.send(line: #"{"id":5,"call":"switchboard/echo","method":"later","args":"late"}"#)
        embedded.run()
        let lines = try peer.lines()
        #expect(lines.count == 4)
        #expect(lines[0] == .stringMap(["id": 1, "result": "plain"]))
        #expect(lines[1] == .stringMap(["id": 2, "error": .stringMap(["code": "nope", "message": "not today",
                                                                       "details": .stringMap(["why": "test"])])]))
        #expect(lines[2] == .stringMap(["id": 3, "result": "short-circuited"]))
        #expect(lines[3]["error"]?["code"] == "plugin_error")
        let decider = try #require(deciders.first)
        onAnotherThread { decider(.answer(.failure(ChannelError(code: "late_no")))) }
        #expect(embedded.run { (try? peer.lines())?.first.map { $0 == .stringMap(["id": 5, "error": .stringMap([
            "code": "late_no", "message": .null, "details": .null])]) } ?? false })
    }

    @Test("a cancelled or disconnected deferred request ignores its late decision")
    func deferredThenCancelled() throws {
        let deciders = DeciderBox()
        let embedded = try EmbeddedServer(plugins: [decidingPlugin(deciders: deciders)])
        let peer = embedded.connect()
        peer.send(try .call(7, "switchboard/echo", "later"))
        embedded.run()
        peer.send(Frame(.cancel, id: 7, payload: nil))
        embedded.run()
        let cancelled = try peer.frames()
        #expect(cancelled.count == 1)
        guard case .failure(let error) = try #require(cancelled.first).envelope() else { throw TestFailure("not an error envelope") }
        #expect(error.code == "cancelled")
        let decider = try #require(deciders.first)
        onAnotherThread { decider(.answer(.success("too late"))) }
        embedded.run(turns: 4)
        #expect(try peer.frames().isEmpty)
        let calls = AtomicCounter()
        MethodChannel(name: "counted", server: embedded.server).setMethodCallHandler { _, result in
            calls.increment()
            result.success(.null)
        }
        let leaving = embedded.connect()
        leaving.send(try .call(8, "counted", "later"))
        embedded.run()
        leaving.peerCloses(error: UVError(code: -104, operation: "read"))  // a reset: gone at once
        embedded.run()
        let late = try #require(deciders.all.last)
        #expect(deciders.count == 2)
        onAnotherThread { late(.next) }
        embedded.run(turns: 4)
        #expect(calls.value == 0)  // the request died with its connection: no handler runs
        #expect(try peer.stats(on: embedded)["repliesPending"] == 0)
    }

    @Test("inbound stages run in load order, outbound ones in reverse; scopes choose what each sees")
    func orderAndScope() throws {
        let journal = Journal()
        func plugin(_ name: String, scope: Scope<InboundKind> = Scope()) -> TestPlugin {
            TestPlugin(name: name,
                       inbound: [InboundClosure(scope: scope) { request in journal.add("in \(name) \(request.kind.rawValue) \(request.channel)"); return .next }],
                       outbound: [OutboundClosure(scope: Scope(kinds: [.reply])) { _ in journal.add("out \(name)"); return .pass }])
        }
        let embedded = try EmbeddedServer(plugins: [
            plugin("a"),
            plugin("b", scope: Scope(channels: [ChannelPattern("switchboard/*")], kinds: [.listen])),
            plugin("c", scope: Scope(channels: [ChannelPattern("other")])),
        ])
        let peer = embedded.connect()
        peer.send(try .call(1, "switchboard/echo", "echo"))
        embedded.run()
        #expect(journal.all == ["in a call switchboard/echo", "out c", "out b", "out a"])
        peer.send(try .call(2, "switchboard/ticker", "listen", .stringMap(["count": 0])))
        embedded.run()
        #expect(journal.all.suffix(5) == ["in a listen switchboard/ticker", "in b listen switchboard/ticker", "out c", "out b", "out a"])
    }

    @Test("redacting events for one listener leaves the others the shared encoding, checked once per listen")
    func redactionForOneListener() throws {
        let processed = AtomicCounter(), asked = AtomicCounter()
        let redact = TestPlugin(name: "redact", outbound: [OutboundClosure(
            scope: Scope(channels: [ChannelPattern("switchboard/room")], kinds: [.event]),
            appliesTo: { connection, _ in asked.increment(); return connection.clientName == "guest" }
        ) { message in
            processed.increment()
            message.content = .value("[redacted]")
            return .pass
        }])
        let embedded = try EmbeddedServer(plugins: [redact])
        let guest = embedded.connect(), member = embedded.connect(), poster = embedded.connect()
        guest.send(Frame(.hello, id: 1, payload: Array(#"{"client":"guest"}"#.utf8)))
        for peer in [guest, member] { peer.send(try .call(2, "switchboard/room", "listen")) }
        embedded.run()
        _ = try guest.frames(); _ = try member.frames()
        for n in 0..<3 { poster.send(Frame(.message, id: UInt32(10 + n), channel: "switchboard/room.post", payload: [UInt8(n)])) }
        embedded.run()
        let guestEvents = try guest.frames(), memberEvents = try member.frames()
        #expect(try guestEvents.map { try $0.envelope().get() } == ["[redacted]", "[redacted]", "[redacted]"])
        #expect(try memberEvents.map { try $0.envelope().get() } == [.uint8List([0]), .uint8List([1]), .uint8List([2])])
        #expect(processed.value == 3)  // the member's events never went through the processor
        #expect(asked.value == 2)  // once per listen, not per event
    }

    @Test("an outbound stage can drop events (counted) and rename an event's channel")
    func dropAndRename() throws {
        let plugin = TestPlugin(name: "filter", outbound: [OutboundClosure(scope: Scope(kinds: [.event, .endOfStream])) { message in
            if case .value(.int32(let n)) = message.content, n % 2 == 1 { return .drop }
            message.channel = "renamed/ticker"
            return .pass
        }])
        let embedded = try EmbeddedServer(plugins: [plugin])
        let peer = embedded.connect()
        peer.send(try .call(1, "switchboard/ticker", "listen", .stringMap(["count": 4, "intervalMs": 0])))
        embedded.run(turns: 20)
        let frames = try peer.frames()
        let events = frames.filter { $0.kind == .message }
        #expect(events.map(\.channel) == ["renamed/ticker", "renamed/ticker", "renamed/ticker"])
        #expect(try events.prefix(2).map { try $0.envelope().get() } == [.int32(0), .int32(2)])
        #expect(events.last?.payload == nil)  // the end, which is never dropped
        #expect(try peer.stats(on: embedded)["eventsDropped"]?["plugin"] == 2)
    }

    @Test("streams on channels no event stage covers take none: their events cost nothing more")
    func noEventStagesWhereNoneApply() throws {
        let asked = AtomicCounter(), processed = AtomicCounter()
        let plugin = TestPlugin(name: "ticker-only", outbound: [OutboundClosure(
            scope: Scope(channels: [ChannelPattern("switchboard/ticker")], kinds: [.event]),
            appliesTo: { _, _ in asked.increment(); return true }
        ) { _ in processed.increment(); return .pass }])
        let embedded = try EmbeddedServer(plugins: [plugin])
        let peer = embedded.connect(), poster = embedded.connect()
        peer.send(try .call(1, "switchboard/room", "listen"))
        embedded.run()
        poster.send(Frame(.message, id: 0, channel: "switchboard/room.post", payload: [9]))
        embedded.run()
        #expect(try peer.frames().count == 2)  // the listen's reply and the event
        #expect(asked.value == 0 && processed.value == 0)
        peer.send(try .call(2, "switchboard/ticker", "listen", .stringMap(["count": 2, "intervalMs": 0])))
        embedded.run(turns: 10)
        #expect(asked.value == 1)  // once, at listen time
        #expect(processed.value == 2)  // each event; the end is out of its scope
    }

    @Test("a deferred request: a half-closed peer closes once it is decided; id 0 and REGISTER defer too")
    func deferredBookkeeping() throws {
        let deciders = DeciderBox()
        let plugin = TestPlugin(name: "later", inbound: [InboundClosure(scope: Scope(channels: [ChannelPattern("held/*"), ChannelPattern("switchboard/echo")])) { request in
            request.method == "now" ? .next : .later { deciders.put($0) }
        }])
        let embedded = try EmbeddedServer(plugins: [plugin])
        let peer = embedded.connect()
        peer.send(try .call(1, "switchboard/echo", "echo", "x"))
        peer.peerCloses()  // a half-close: its request is still answered
        embedded.run()
        let decider = try #require(deciders.first)
        onAnotherThread { decider(.next) }
        #expect(embedded.run { peer.isClosingGracefully || peer.isClosed })
        #expect(try peer.frames().map(\.id) == [1])

        let holder = embedded.connect()
        holder.send(Frame(.register, id: 5, channel: "held/a", payload: nil))
        holder.send(Frame(.register, id: 6, channel: "held/b", payload: nil))
        holder.send(Frame(.message, id: 0, channel: "switchboard/echo", payload: try StandardMethodCodec().encodeMethodCall(MethodCall(method: "echo", arguments: .null))))
        embedded.run()
        let (register5, register6, fireAndForget) = (deciders.all[1], deciders.all[2], deciders.all[3])
        onAnotherThread {
            register5(.next)
            register6(.reject(.forbidden("not b")))
            fireAndForget(.answer(.success(1)))  // id 0: answered nowhere, and no failure
        }
        var frames: [Frame] = []
        #expect(embedded.run { frames += (try? holder.frames()) ?? []; return frames.count >= 2 })
        #expect(frames.map(\.kind) == [.reply, .error])
        #expect(frames.map(\.id) == [5, 6])
        let stats = try embedded.connect().stats(on: embedded)
        #expect(stats["registrations"] == 1)
        #expect(stats["plugins"]?["later"]?["failed"] == 0)
    }

    @Test("a decider dropped undecided answers its request with plugin_error")
    func droppedDecider() throws {
        let plugin = TestPlugin(name: "forgetful", inbound: [InboundClosure(scope: Scope(channels: [ChannelPattern("switchboard/echo")])) { _ in
            .later { decider in startThread { _ = decider } }  // kept a moment on another thread, then dropped
        }])
        let embedded = try EmbeddedServer(plugins: [plugin])
        let peer = embedded.connect()
        peer.send(try .call(1, "switchboard/echo", "echo"))
        var frames: [Frame] = []
        #expect(embedded.run { frames += (try? peer.frames()) ?? []; return !frames.isEmpty })
        #expect(frames.map(\.errorCode) == ["plugin_error"])
        #expect(try peer.stats(on: embedded)["plugins"]?["forgetful"]?["failed"] == 1)
    }

    @Test("a stage that rewrites a payload changes what later stages judge")
    func rewriteIsJudgedAfresh() throws {
        let journal = Journal()
        let rewriter = TestPlugin(name: "rewriter", inbound: [InboundClosure { request in
            if request.method == "cancel" {
                request.payload = .bytes(try StandardMethodCodec().encodeMethodCall(MethodCall(method: "listen", arguments: .null))[...])
            }
            return .next
        }])
        let judge = TestPlugin(name: "judge", inbound: [InboundClosure { request in
            journal.add("\(request.kind.rawValue) \(request.method ?? "-")")
            return request.kind == .listen ? .reject(.forbidden("no listening")) : .next
        }])
        let embedded = try EmbeddedServer(plugins: [rewriter, judge])
        let peer = embedded.connect()
        peer.send(try .call(1, "switchboard/room", "cancel"))
        embedded.run()
        #expect(journal.all == ["listen listen"])
        #expect(try peer.frames().map(\.errorCode) == ["forbidden"])
    }

    @Test("with plugins loaded, a text-mode call on a message channel is still refused as without")
    func textCallOnMessageChannel() throws {
        let plugin = TestPlugin(name: "pass", inbound: [InboundClosure { _ in .next }])
        let embedded = try EmbeddedServer(plugins: [plugin])
        let peer = embedded.connect()
        peer.send(line: #"{"id":1,"call":"switchboard/message","method":"x","args":5}"#)
        peer.send(line: #"{"id":2,"listen":"switchboard/message"}"#)
        peer.send(line: #"{"id":3,"send":"switchboard/message","message":5}"#)
        embedded.run()
        let lines = try peer.lines()
        #expect(lines.map { $0["error"]?["code"] } == ["bad_request", "bad_request", nil])
        #expect(lines[2] == .stringMap(["id": 3, "reply": 5]))
    }

    /// A plugin that needs the server when it is loaded: it attaches a channel of its own.
    struct Greeter: ServerPlugin {
        let name = "greeter"
        func didLoad(into server: Server) {
            MethodChannel(name: "greeter", server: server).setMethodCallHandler { _, result in result.success("hello") }
        }
    }

    @Test("a ServerPlugin's didLoad runs when the server loads it, with that server")
    func serverPluginDidLoad() throws {
        let embedded = try EmbeddedServer(plugins: [Greeter()])
        let peer = embedded.connect()
        peer.send(try .call(1, "greeter", "greet"))
        embedded.run()
        let frames = try peer.frames()
        #expect(frames.map(\.id) == [1])
        #expect(try frames.first?.envelope().get() == "hello")
    }
}
