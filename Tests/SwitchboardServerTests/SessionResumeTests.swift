import Logging
import Synchronization
import Testing
import SwitchboardCodec
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport
import SwitchboardWire

/// Parking a session whose connection is lost, resuming it on the same loop, and the reasons a session
/// cannot be resumed (protocol/resumption.md, "Resuming", "A parked session", "When a session cannot be resumed").
@Suite struct SessionResumeTests {
    /// A client of a session, as the test plays it: what it has read of the server's stream.
    struct Client {
        let peer: InMemoryTransport
        let token: String
        /// The bytes of the server's stream read so far (the client's received position).
        var received: UInt64
    }

    /// A connection with a new session.
    static func newSession(_ embedded: EmbeddedServer) throws -> Client {
        let peer = embedded.connect()
        peer.send(Frame(.hello, id: 1, payload: Array(#"{"version":1,"session":{}}"#.utf8)))
        embedded.run()
        let payload = try #require(try peer.frames().first?.payload)
        let session = try #require(try JSONText.parse(payload)["session"])
        return Client(peer: peer, token: try #require(session["token"]?.stringValue), received: 0)
    }

    /// A holder of `channels` (REGISTER frames from id 2) in a new session whose connection is then
    /// lost: parked, having read the answers to its REGISTERs.
    static func parkedHolder(_ embedded: EmbeddedServer, of channels: [(name: String, kind: String?)]) throws -> Client {
        var holder = try newSession(embedded)
        for (index, channel) in channels.enumerated() {
            let declaration = channel.kind.map { Array(#"{"kind":"\#($0)"}"#.utf8) }
            holder.peer.send(Frame(.register, id: UInt32(index + 2), channel: channel.name, payload: declaration))
        }
        embedded.run()
        holder.received = stream(try holder.peer.frames()).bytes
        holder.peer.peerCloses()
        embedded.run()
        return holder
    }

    /// `resumed` answers the forwarded request in `frames` on `channel` with a success envelope of `value`.
    static func answer(_ frames: [Frame], on channel: String, over resumed: InMemoryTransport, with value: ChannelValue) throws {
        let forwarded = try #require(frames.first { $0.kind == .message && $0.channel == channel })
        resumed.send(Frame(.reply, id: forwarded.id, payload: try StandardMethodCodec().encodeSuccessEnvelope(value)))
    }

    static func resumingHello(_ token: String, position: UInt64, id: UInt32 = 1) -> Frame {
        Frame(.hello, id: id, payload: Array(#"{"version":1,"session":{"token":"\#(token)","position":\#(position)}}"#.utf8))
    }

    /// A new connection that resumes `client`'s session; its answer (WELCOME or ERROR) and what follows it.
    static func resume(_ embedded: EmbeddedServer, _ client: Client, position: UInt64? = nil) throws -> (InMemoryTransport, [Frame]) {
        let peer = embedded.connect()
        peer.send(resumingHello(client.token, position: position ?? client.received))
        embedded.run()
        return (peer, try peer.frames())
    }

    /// The frames of the server's stream in `frames` (not POSITION, END or the handshake), and their bytes.
    static func stream(_ frames: [Frame]) -> (frames: [Frame], bytes: UInt64) {
        let kept = frames.filter { $0.kind != .position && $0.kind != .end && $0.kind != .welcome }
        return (kept, UInt64(kept.map(\.bytes.count).reduce(0, +)))
    }

    static func reason(_ refusal: Frame?) throws -> String? {
        guard let refusal, refusal.errorCode == "cannot_resume" else { return nil }
        return try JSONText.parse(refusal.payload ?? [])["details"]?["reason"]?.stringValue
    }

    static func welcomeSession(_ frame: Frame?) throws -> ChannelValue? {
        guard let frame, frame.kind == .welcome else { return nil }
        return try JSONText.parse(frame.payload ?? [])["session"]
    }

    /// An event channel "numbers" that a test broadcasts on.
    static func numbers(_ embedded: EmbeddedServer) -> EventChannel {
        let channel = EventChannel(name: "numbers", server: embedded.server)
        channel.setStreamHandler(StreamHandlerClosures(onListen: { _, _ in nil }))
        embedded.run()
        return channel
    }

    static func events(_ frames: [Frame]) throws -> [ChannelValue] {
        try frames.filter { $0.kind == .message && $0.channel == "numbers" }.map { try $0.envelope().get() }
    }

    // MARK: Parking and resuming

    /// Events made while the connection was lost, and those the client missed before, arrive once, in
    /// order, after the WELCOME, and the stream goes on.
    @Test func resumeReplaysExactlyWhatTheClientMissed() throws {
        let embedded = try EmbeddedServer()
        let numbers = Self.numbers(embedded)
        var client = try Self.newSession(embedded)
        client.peer.send(try .call(2, "numbers", "listen"))
        embedded.run()
        client.received += Self.stream(try client.peer.frames()).bytes
        numbers.broadcast(1)
        embedded.run()
        let first = Self.stream(try client.peer.frames())
        #expect(try Self.events(first.frames) == [1])
        client.received += first.bytes
        numbers.broadcast(2)
        embedded.run()
        _ = try client.peer.frames()  // written, but lost with the connection: the client never read it
        client.peer.peerCloses(error: UVError(code: -104, operation: "read"))
        embedded.run()
        numbers.broadcast(3)
        numbers.broadcast(4)
        embedded.run()

        let (resumed, frames) = try Self.resume(embedded, client)
        let session = try #require(try Self.welcomeSession(frames.first))
        #expect(session["resumed"] == true && session["token"]?.stringValue == client.token)
        let listen = try Frame.call(2, "numbers", "listen")
        #expect(session["position"] == .int(listen.bytes.count))
        #expect(try Self.events(frames) == [2, 3, 4])
        numbers.broadcast(5)
        embedded.run()
        #expect(try Self.events(try resumed.frames()) == [5])
    }

    /// A holder whose connection is lost keeps its channel: a caller waits, and the request reaches the
    /// holder when it resumes; its REPLY reaches the caller.
    @Test func parkedHolderKeepsItsCallers() throws {
        let embedded = try EmbeddedServer(demoChannels: false)
        let holder = try Self.parkedHolder(embedded, of: [("held", nil)])
        let caller = embedded.connect()
        caller.send(try .call(7, "held", "work"))
        embedded.run()
        #expect(try caller.frames().isEmpty)  // waits: no handler_gone

        let (resumed, frames) = try Self.resume(embedded, holder)
        try Self.answer(frames, on: "held", over: resumed, with: "done")
        embedded.run()
        #expect(try caller.frames().first?.envelope() == .success("done"))
    }

    /// A caller cannot end a parked holder's session: a request the session has no room to keep is
    /// answered `handler_busy` to its caller, and the holder resumes and gets the next one.
    @Test func requestTooLargeForAParkedHolderIsAnsweredToItsCaller() throws {
        var config = ServerConfiguration()
        config.sessionBytes = 2048
        let embedded = try EmbeddedServer(configuration: config, demoChannels: false)
        let holder = try Self.parkedHolder(embedded, of: [("held", nil)])
        let caller = embedded.connect()
        caller.send(try .call(7, "held", "work", .string(String(repeating: "w", count: 4000))))
        embedded.run()
        #expect(try caller.frames().map(\.errorCode) == ["handler_busy"])
        caller.send(try .call(8, "held", "work"))
        embedded.run()
        let (resumed, frames) = try Self.resume(embedded, holder)
        #expect(try Self.welcomeSession(frames.first)?["resumed"] == true)
        try Self.answer(frames, on: "held", over: resumed, with: "done")
        embedded.run()
        #expect(try caller.frames().first?.envelope() == .success("done"))
    }

    /// Nor can a fire-and-forget MESSAGE (id 0) or a relayed CANCEL end it: one that does not fit is not
    /// sent, and counted; and a listen the holder's session has no room for is refused `handler_busy`.
    @Test func framesOthersSendCannotOverflowAParkedHolder() throws {
        var config = ServerConfiguration()
        config.sessionBytes = 2048
        let embedded = try EmbeddedServer(configuration: config, demoChannels: false)
        let holder = try Self.parkedHolder(embedded, of: [("held", nil), ("feed", "event")])
        let caller = embedded.connect()
        caller.send(Frame(.message, id: 0, channel: "held", payload: [UInt8](repeating: 1, count: 4000)))
        // A request that leaves 5 bytes of room: its CANCEL (12 bytes) cannot follow it.
        let body = 2048 - 5 - Int(holder.received) - Frame.headerSize - "held".utf8.count
        caller.send(Frame(.message, id: 7, channel: "held", payload: [UInt8](repeating: 2, count: body)))
        caller.send(Frame(.cancel, id: 7, payload: nil))
        caller.send(try .call(8, "feed", "listen"))
        embedded.run()
        let answers = try caller.frames()
        #expect(answers.first?.errorCode == "cancelled")
        guard case .failure(let refusal)? = try answers.last?.envelope() else { throw ChannelError(code: "test", message: "listen not refused") }
        #expect(refusal.code == "handler_busy")
        #expect(embedded.server.core.value.sessions.droppedCounts == ["message": 1, "cancel": 1])
        let (_, frames) = try Self.resume(embedded, holder)
        #expect(try Self.welcomeSession(frames.first)?["resumed"] == true)
        #expect(frames.filter { $0.channel == "held" }.map(\.id) == [1])  // the request, without its CANCEL
    }

    /// A call whose answer is made while the connection is lost gets it on resuming.
    @Test func answerMadeWhileParkedIsReplayed() throws {
        let embedded = try EmbeddedServer(demoChannels: false)
        let holder = embedded.connect()
        holder.send(Frame(.register, id: 1, channel: "slow", payload: nil))
        embedded.run()
        _ = try holder.frames()
        let client = try Self.newSession(embedded)
        client.peer.send(try .call(5, "slow", "work"))
        embedded.run()
        let forwarded = try #require(try holder.frames().first)
        client.peer.peerCloses(error: UVError(code: -104, operation: "read"))
        embedded.run()
        holder.send(Frame(.reply, id: forwarded.id, payload: try StandardMethodCodec().encodeSuccessEnvelope("late")))
        embedded.run()
        let (_, frames) = try Self.resume(embedded, client)
        #expect(try Self.welcomeSession(frames.first)?["resumed"] == true)
        #expect(try frames.dropFirst().map { try $0.envelope() } == [.success("late")])
    }

    /// What the client wrote after its resuming HELLO, in the same read, is its stream from the WELCOME's position.
    @Test func inputAfterTheResumingHelloIsHandled() throws {
        let embedded = try EmbeddedServer()
        let client = try Self.newSession(embedded)
        client.peer.peerCloses()
        embedded.run()
        let peer = embedded.connect()
        peer.send(Self.resumingHello(client.token, position: 0) .bytes + Frame(.ping, id: 9, payload: nil).bytes)
        embedded.run()
        #expect(try peer.frames().map(\.kind) == [.welcome, .pong])
    }

    /// A connection the heartbeat finds dead parks its session: the PINGs sent meanwhile are in the
    /// stream, and come again on resuming.
    @Test func heartbeatTimeoutParks() throws {
        var config = ServerConfiguration()
        config.heartbeatMs = 1000
        let embedded = try EmbeddedServer(configuration: config)
        let client = try Self.newSession(embedded)
        embedded.advanceTime(byMs: 2500)
        let lost = try client.peer.frames()
        #expect(lost.map(\.kind) == [.ping] && (client.peer.isClosed || client.peer.isClosingGracefully))
        let (_, frames) = try Self.resume(embedded, client)
        #expect(try Self.welcomeSession(frames.first)?["resumed"] == true)
        #expect(frames.dropFirst().map(\.kind) == [.ping])
    }

    /// A frame left unfinished parks the session: its ERROR `timeout` goes to the lost connection but is
    /// not in the stream, and the unfinished frame is not received.
    @Test func unfinishedFrameParksWithoutItsErrorInTheStream() throws {
        var config = ServerConfiguration()
        config.frameTimeoutMs = 1000
        let embedded = try EmbeddedServer(configuration: config)
        let client = try Self.newSession(embedded)
        client.peer.send(Frame(.ping, id: 2, payload: nil).bytes + Array(Frame(.ping, id: 3, payload: nil).bytes.prefix(5)))
        embedded.run()
        embedded.advanceTime(byMs: 2500)
        let lost = try client.peer.frames().filter { $0.kind != .position }  // one came after ackMs
        #expect(lost.map(\.kind) == [.pong, .error] && lost.last?.errorCode == "timeout")
        let (_, frames) = try Self.resume(embedded, client)
        let session = try #require(try Self.welcomeSession(frames.first))
        #expect(session["resumed"] == true && session["position"] == 12)  // the whole PING, not the half one
        #expect(frames.dropFirst().map(\.kind) == [.pong])
    }

    // MARK: Ending

    @Test func parkedSessionExpiresAndItsCallersGetHandlerGone() throws {
        var config = ServerConfiguration()
        config.sessionTTLMs = 5000
        let embedded = try EmbeddedServer(configuration: config, demoChannels: false)
        let holder = try Self.parkedHolder(embedded, of: [("held", nil)])
        let caller = embedded.connect()
        caller.send(try .call(7, "held", "work"))
        embedded.advanceTime(byMs: 4000)
        #expect(try caller.frames().isEmpty)
        embedded.advanceTime(byMs: 1500)
        #expect(try caller.frames().map(\.errorCode) == ["handler_gone"])
        let (peer, frames) = try Self.resume(embedded, holder)
        #expect(try Self.reason(frames.first) == "expired")
        #expect(embedded.server.core.value.tallies.closes[CloseReason.sessionEnded.rawValue] == 1)
        // cannot_resume leaves the connection open for a new session.
        peer.send(Frame(.hello, id: 2, payload: Array(#"{"session":{}}"#.utf8)))
        embedded.run()
        #expect(try Self.welcomeSession(try peer.frames().first)?["resumed"] == false)
    }

    @Test func endedByTheClientCannotBeResumed() throws {
        let embedded = try EmbeddedServer()
        let client = try Self.newSession(embedded)
        client.peer.send(Frame(.end, payload: nil))
        embedded.run()
        let (_, frames) = try Self.resume(embedded, client)
        #expect(try Self.reason(frames.first) == "ended")
    }

    /// A session lost with more than --session-bytes of output for its client ends `overflowed`.
    @Test func outputPastSessionBytesWhileParkedEndsTheSession() throws {
        var config = ServerConfiguration()
        config.sessionBytes = 2048
        let embedded = try EmbeddedServer(configuration: config)
        let numbers = Self.numbers(embedded)
        var client = try Self.newSession(embedded)
        client.peer.send(try .call(2, "numbers", "listen"))
        embedded.run()
        client.received += Self.stream(try client.peer.frames()).bytes
        client.peer.peerCloses()
        embedded.run()
        for _ in 0..<8 { numbers.broadcast(ChannelValue.string(String(repeating: "n", count: 400))) }
        embedded.run()
        let (_, frames) = try Self.resume(embedded, client)
        #expect(try Self.reason(frames.first) == "overflowed")
    }

    /// A keep-latest channel keeps only its latest event for a parked session, as for a listener that
    /// lags: a fast producer does not end the session.
    @Test func keepLatestKeepsOnlyTheLatestEventWhileParked() throws {
        var config = ServerConfiguration()
        config.sessionBytes = 2048
        let embedded = try EmbeddedServer(configuration: config)
        let latest = EventChannel(name: "numbers", overflow: .keepLatest, server: embedded.server)
        latest.setStreamHandler(StreamHandlerClosures(onListen: { _, _ in nil }))
        embedded.run()
        var client = try Self.newSession(embedded)
        client.peer.send(try .call(2, "numbers", "listen"))
        embedded.run()
        client.received += Self.stream(try client.peer.frames()).bytes
        client.peer.peerCloses()
        embedded.run()
        for n in 0..<40 {
            latest.broadcast(ChannelValue.map([.init("n", .int(n)), .init("pad", .string(String(repeating: "p", count: 100)))]))
            embedded.run()
        }
        let (resumed, frames) = try Self.resume(embedded, client)
        #expect(try Self.welcomeSession(frames.first)?["resumed"] == true)
        #expect(try Self.events(frames).map { $0["n"] } == [39])
        latest.broadcast(ChannelValue.map([.init("n", .int(40))]))
        embedded.run()
        #expect(try Self.events(try resumed.frames()).map { $0["n"] } == [40])
    }

    @Test func oldestParkedSessionIsEvicted() throws {
        var config = ServerConfiguration()
        config.maxParkedSessions = 1
        let embedded = try EmbeddedServer(configuration: config)
        let first = try Self.newSession(embedded), second = try Self.newSession(embedded)
        first.peer.peerCloses()
        embedded.run()
        second.peer.peerCloses()
        embedded.run()
        #expect(try Self.reason(try Self.resume(embedded, first).1.first) == "evicted")
        #expect(try Self.welcomeSession(try Self.resume(embedded, second).1.first)?["resumed"] == true)
    }

    /// Making room ends a session of whoever parks the most: an address that parks many ends its own
    /// oldest, not another address's older one.
    @Test func evictionEndsASessionOfWhoeverParksTheMost() throws {
        var config = ServerConfiguration()
        config.maxParkedSessions = 3
        let embedded = try EmbeddedServer(configuration: config)
        func session(from address: String) throws -> Client {
            let peer = embedded.connect(name: address)
            peer.send(Frame(.hello, id: 1, payload: Array(#"{"version":1,"session":{}}"#.utf8)))
            embedded.run()
            let payload = try #require(try peer.frames().first?.payload)
            return Client(peer: peer, token: try #require(try JSONText.parse(payload)["session"]?["token"]?.stringValue), received: 0)
        }
        let stranger = try session(from: "192.0.2.1"), flooder = try (0..<4).map { _ in try session(from: "198.51.100.7") }
        for client in [stranger] + flooder {
            client.peer.peerCloses()
            embedded.run()
        }
        #expect(try Self.welcomeSession(try Self.resume(embedded, stranger).1.first)?["resumed"] == true)
        #expect(try flooder.prefix(2).map { try Self.reason(try Self.resume(embedded, $0).1.first) } == ["evicted", "evicted"])
    }

    /// --max-parked-sessions is shared out among the loops: each parks its share.
    @Test func eachLoopParksItsShare() throws {
        var config = ServerConfiguration()
        config.maxParkedSessions = 10
        config.loops = 4
        #expect(try ServerCore(config: config, logger: Logger(label: "test"), loops: 4, quota: ConnectionQuota(config)).sessions.limit == 2)
    }

    /// A position outside what the server kept is refused, and the session is left as it was.
    @Test func positionOutsideWhatIsKeptIsRefused() throws {
        let embedded = try EmbeddedServer()
        let client = try Self.newSession(embedded)
        client.peer.send(Frame(.ping, id: 2, payload: nil))
        embedded.run()
        client.peer.peerCloses()
        embedded.run()
        #expect(try Self.reason(try Self.resume(embedded, client, position: 13).1.first) == "position")
        #expect(try Self.reason(try Self.resume(embedded, client, position: (1 << 53) - 1).1.first) == "position")
        let (_, frames) = try Self.resume(embedded, client, position: 0)
        #expect(try Self.welcomeSession(frames.first)?["resumed"] == true)
        #expect(frames.dropFirst().map(\.kind) == [.pong])  // the PONG it missed
    }

    @Test func unreadableUnknownAndForeignTokensAreRefused() throws {
        let embedded = try EmbeddedServer()
        let other = try EmbeddedServer()
        let foreign = try Self.newSession(other)
        let mine = try Self.newSession(embedded)
        var forged = Array(mine.token)
        forged[42] = forged[42] == "A" ? "E" : "A"  // another secret
        for (token, reason) in [("nonsense", "unknown"), (String(forged), "unknown"), (foreign.token, "restarted"),
                                (String(repeating: "A", count: 100_000), "unknown")] {
            let (_, frames) = try Self.resume(embedded, Client(peer: mine.peer, token: token, received: 0))
            #expect(try Self.reason(frames.first) == reason, "\(token)")
        }
    }

    /// Refusals are logged at most once a second, by reason and address, never with the token.
    @Test func refusalsAreLoggedOnceASecondWithoutTheToken() throws {
        let output = LoggedLines()
        let embedded = try EmbeddedServer(logger: Logger(label: "test") { StreamLogHandler(label: $0, stream: output, metadataProvider: nil) })
        let token = String(repeating: "Q", count: 43)
        for _ in 0..<5 { _ = try Self.resume(embedded, Client(peer: embedded.connect(), token: token, received: 0)) }
        #expect(output.lines.filter { $0.contains("refusing to resume") }.count == 1)
        embedded.advanceTime(byMs: 1000)
        _ = try Self.resume(embedded, Client(peer: embedded.connect(), token: token, received: 0))
        #expect(output.lines.filter { $0.contains("refusing to resume") }.count == 2)
        #expect(!output.lines.contains { $0.contains(token) })
    }

    /// One try per connection: a second resuming HELLO after `cannot_resume` is `bad_hello`, then the close.
    @Test func secondResumeOnAConnectionIsBadHello() throws {
        let embedded = try EmbeddedServer()
        let peer = embedded.connect()
        peer.send(Self.resumingHello("nonsense", position: 0, id: 1))
        peer.send(Self.resumingHello("nonsense", position: 0, id: 3))
        embedded.run()
        let frames = try peer.frames()
        #expect(frames.map(\.kind) == [.error, .error])
        #expect(frames.last?.errorCode == "bad_hello" && frames.last?.id == 3)
        #expect(peer.isClosed || peer.isClosingGracefully)
    }

    /// The try after a `cannot_resume` is the frame right after it: a HELLO asking for a new session then
    /// gets one, its `cannot_resume` first; after any other frame, `session` is ignored, and what the
    /// connection did meanwhile (a channel held, a call) stays its own, answered.
    @Test func onlyTheFrameAfterCannotResumeMayAskForASession() throws {
        let embedded = try EmbeddedServer(demoChannels: true)
        let peer = embedded.connect()
        peer.send(Self.resumingHello("nonsense", position: 0, id: 1))
        peer.send(Frame(.hello, id: 2, payload: Array(#"{"session":{}}"#.utf8)))
        embedded.run()
        let granted = try peer.frames()
        #expect(granted.map(\.kind) == [.error, .welcome])
        #expect(try Self.welcomeSession(granted.last)?["token"] != nil)

        let other = embedded.connect()
        other.send(Self.resumingHello("nonsense", position: 0, id: 1))
        other.send(Frame(.register, id: 2, channel: "squat", payload: nil))
        other.send(try .call(3, "switchboard/echo", "echo", "x"))
        other.send(Frame(.hello, id: 4, payload: Array(#"{"session":{}}"#.utf8)))
        embedded.run()
        let frames = try other.frames()
        #expect(frames.map(\.kind) == [.error, .reply, .reply, .welcome])
        #expect(try Self.welcomeSession(frames.last) == nil)
        other.peerCloses()
        embedded.run()
        let next = embedded.connect()
        next.send(Frame(.register, id: 1, channel: "squat", payload: nil))  // the channel went with its connection
        embedded.run()
        #expect(try next.frames().map(\.kind) == [.reply])
    }

    // MARK: Takeover

    /// A resuming HELLO for a session another connection carries takes it over: that connection gets
    /// `session_taken` and is closed; the stream goes on on the new one.
    @Test func resumeTakesTheSessionOver() throws {
        let embedded = try EmbeddedServer()
        let numbers = Self.numbers(embedded)
        var client = try Self.newSession(embedded)
        client.peer.send(try .call(2, "numbers", "listen"))
        embedded.run()
        client.received += Self.stream(try client.peer.frames()).bytes
        numbers.broadcast(1)
        embedded.run()
        let (resumed, frames) = try Self.resume(embedded, client)
        #expect(try Self.welcomeSession(frames.first)?["resumed"] == true)
        #expect(try Self.events(frames) == [1])
        let old = try client.peer.frames()  // event 1, written before the takeover, then the ERROR
        #expect(old.compactMap(\.errorCode) == ["session_taken"] && old.last?.errorCode == "session_taken")
        #expect(client.peer.isClosed || client.peer.isClosingGracefully)
        numbers.broadcast(2)
        embedded.run()
        #expect(try Self.events(try resumed.frames()) == [2])
    }

    /// A draining server ends every parked session.
    @Test func drainEndsParkedSessions() throws {
        let embedded = try EmbeddedServer(demoChannels: false)
        let client = try Self.newSession(embedded)
        client.peer.peerCloses()
        embedded.run()
        let holder = embedded.connect(), caller = embedded.connect()
        holder.send(Frame(.register, id: 1, channel: "held", payload: nil))
        embedded.run()
        caller.send(try .call(1, "held", "wait"))  // keeps the server draining
        embedded.run()
        embedded.server.shutdown()
        embedded.run()
        let frames = try Self.resume(embedded, client).1
        #expect(frames.first?.kind == .goAway)
        #expect(try Self.reason(frames.first { $0.kind == .error }) == "ended")
        #expect(embedded.server.core.value.sessions.parked.isEmpty)
    }
}

/// What a ``StreamLogHandler`` writes, kept.
final class LoggedLines: TextOutputStream, Sendable {
    private let text = Mutex("")
    func write(_ string: String) { text.withLock { $0 += string } }
    var lines: [Substring] { text.withLock { $0 }.split(separator: "\n") }
}
