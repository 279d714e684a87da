import Testing
import SwitchboardCodec
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// Asking for a resumable session in HELLO, and what the WELCOME grants (protocol/resumption.md,
/// "Asking for a session" and "The token").
@Suite struct SessionNegotiationTests {
    static func hello(_ json: String, id: UInt32 = 1) -> Frame { Frame(.hello, id: id, payload: Array(json.utf8)) }

    /// The `session` object of the first WELCOME `peer` got, nil if it had none.
    static func grantedSession(_ peer: InMemoryTransport) throws -> ChannelValue? {
        let welcome = try #require(try peer.frames().first)
        #expect(welcome.kind == .welcome)
        return try JSONText.parse(try #require(welcome.payload))["session"]
    }

    @Test func newSessionIsGrantedWithTokenAndSettings() throws {
        let embedded = try EmbeddedServer()
        let peer = embedded.connect()
        peer.send(Self.hello(#"{"version":1,"client":"phone","session":{}}"#, id: 3))
        embedded.run()
        let session = try #require(try Self.grantedSession(peer))
        let token = try #require(session["token"]?.stringValue)
        #expect(token.utf8.count == 43)
        #expect(token.utf8.allSatisfy { SessionToken.base64URLAlphabet.contains($0) })
        #expect(session["resumed"] == false && session["position"] == 0)
        #expect(session["ttlMs"] == 60_000 && session["ackBytes"] == 65_536 && session["ackMs"] == 1000)
    }

    /// With --session-bytes below twice 64 KiB, ackBytes is half of it: a client acknowledging as told
    /// never leaves more unacknowledged than its session may keep.
    @Test func ackBytesIsAtMostHalfOfWhatASessionMayKeep() throws {
        var config = ServerConfiguration()
        config.sessionBytes = 4096
        let embedded = try EmbeddedServer(configuration: config)
        let peer = embedded.connect()
        peer.send(Self.hello(#"{"session":{}}"#))
        embedded.run()
        #expect(try Self.grantedSession(peer)?["ackBytes"] == 2048)
    }

    @Test func helloWithoutSessionGetsNone() throws {
        let embedded = try EmbeddedServer()
        let peer = embedded.connect()
        peer.send(Self.hello(#"{"version":1}"#))
        embedded.run()
        #expect(try Self.grantedSession(peer) == nil)
    }

    /// A server with --session-ttl 0 answers as one without sessions: a plain WELCOME, to a HELLO asking
    /// for a new session and to one resuming (whose client then falls back, `unsupported`).
    @Test(arguments: [#"{"session":{}}"#, #"{"session":{"token":"Oh-cLn1LCmEAAAAAAAAAKjI2latvuJYBTs6eqM_GNx4","position":0}}"#])
    func zeroTimeToLiveGrantsNone(hello: String) throws {
        var config = ServerConfiguration()
        config.sessionTTLMs = 0
        let embedded = try EmbeddedServer(configuration: config)
        let peer = embedded.connect()
        peer.send(Self.hello(hello))
        embedded.run()
        let frames = try peer.frames()
        #expect(frames.map(\.kind) == [.welcome])
        #expect(try frames.first.flatMap { try JSONText.parse($0.payload ?? [])["session"] } == nil)
    }

    @Test func textModeGrantsNone() throws {
        let embedded = try EmbeddedServer()
        let peer = embedded.connect()
        peer.send(line: #"{"id":1,"hello":{"version":1,"session":{}}}"#)
        embedded.run()
        let welcome = try #require(try peer.lines().first?["welcome"])
        #expect(welcome["session"] == nil && welcome["version"] == 1)
    }

    /// `session` counts only in the connection's first frame.
    @Test func sessionAfterTheFirstFrameIsIgnored() throws {
        let embedded = try EmbeddedServer()
        let peer = embedded.connect()
        peer.send(Frame(.ping, id: 1, payload: nil))
        peer.send(Self.hello(#"{"session":{}}"#, id: 2))
        embedded.run()
        let frames = try peer.frames()
        #expect(frames.map(\.kind) == [.pong, .welcome])
        #expect(try JSONText.parse(frames[1].payload!)["session"] == nil)

        let second = embedded.connect()
        second.send(Self.hello(#"{"version":1}"#, id: 1))
        second.send(Self.hello(#"{"session":{"token":5}}"#, id: 2))  // not counted, so not even checked
        embedded.run()
        let welcomes = try second.frames()
        #expect(welcomes.map(\.kind) == [.welcome, .welcome])
        #expect(try JSONText.parse(welcomes[1].payload!)["session"] == nil)
    }

    @Test(arguments: [
        #"{"session":1}"#,
        #"{"session":[]}"#,
        #"{"session":{"token":5,"position":0}}"#,
        #"{"session":{"token":"abc"}}"#,
        #"{"session":{"token":"abc","position":-1}}"#,
        #"{"session":{"token":"abc","position":9007199254740992}}"#,
        #"{"session":{"token":"abc","position":1.5}}"#,
        #"{"session":{"token":"abc","position":"3"}}"#,
        #"{"session":{"token":"abc","position":1e300}}"#,
    ])
    func malformedSessionIsBadHello(json: String) throws {
        let embedded = try EmbeddedServer()
        let peer = embedded.connect()
        peer.send(Self.hello(json, id: 7))
        embedded.run()
        let frames = try peer.frames()
        #expect(frames.map(\.errorCode) == ["bad_hello"] && frames.first?.id == 7)
        #expect(peer.isClosed || peer.isClosingGracefully)
    }

    /// Keys inside `session` the server does not know are ignored, and so is `position` without `token`.
    @Test func unknownKeysAndPositionWithoutTokenAreIgnored() throws {
        let embedded = try EmbeddedServer()
        let peer = embedded.connect()
        peer.send(Self.hello(#"{"session":{"future":true,"position":"whatever"}}"#))
        embedded.run()
        #expect(try Self.grantedSession(peer)?["resumed"] == false)
    }

    @Test func eachSessionHasItsOwnToken() throws {
        let embedded = try EmbeddedServer()
        var tokens: Set<String> = []
        for _ in 0..<8 {
            let peer = embedded.connect()
            peer.send(Self.hello(#"{"session":{}}"#))
            embedded.run()
            tokens.insert(try #require(try Self.grantedSession(peer)?["token"]?.stringValue))
        }
        #expect(tokens.count == 8)
    }

    /// A draining server grants no new session.
    @Test func drainingServerGrantsNone() throws {
        let embedded = try EmbeddedServer(demoChannels: false)
        let holder = embedded.connect(), caller = embedded.connect()
        holder.send(Frame(.register, id: 1, channel: "held", payload: nil))
        embedded.run()
        caller.send(try .call(1, "held", "wait"))  // open until the drain ends: the server stays draining
        embedded.run()
        embedded.server.shutdown()
        embedded.run()
        #expect(embedded.server.core.value.phase == .draining)
        let late = embedded.connect()
        late.send(Self.hello(#"{"session":{}}"#))
        embedded.run()
        let frames = try late.frames()
        let welcome = try #require(frames.first { $0.kind == .welcome })
        #expect(try JSONText.parse(welcome.payload!)["session"] == nil)
    }

    // MARK: The token

    @Test func base64URLFollowsRFC4648() throws {
        let vectors: [(String, String)] = [("", ""), ("f", "Zg"), ("fo", "Zm8"), ("foo", "Zm9v"), ("foob", "Zm9vYg"),
                                           ("fooba", "Zm9vYmE"), ("foobar", "Zm9vYmFy")]
        for (plain, encoded) in vectors {
            #expect(SessionToken.base64URL(Array(plain.utf8)) == encoded)
            #expect(SessionToken.bytes(base64URL: encoded) == Array(plain.utf8))
        }
        #expect(SessionToken.base64URL([0xfb, 0xff]) == "-_8")
        #expect(SessionToken.bytes(base64URL: "-_8") == [0xfb, 0xff])
        for bad in ["Zm9v=", "Z", "Zm+v", "Zm/v", "Zm9\u{e9}", "Zh"] { #expect(SessionToken.bytes(base64URL: bad) == nil, "\(bad)") }
    }

    @Test func tokenNamesItsSessionAndKeepsItsSecret() throws {
        let token = SessionToken(process: 0x0123_4567_89ab_cdef, loop: 3, number: 42)
        let text = token.text
        let read = try #require(SessionToken(text: text))
        #expect(read.process == 0x0123_4567_89ab_cdef && read.loop == 3 && read.number == 42)
        #expect(read.matches(token) && token.matches(read))
        let other = SessionToken(process: 0x0123_4567_89ab_cdef, loop: 3, number: 42)
        #expect(!other.matches(token))  // same name, another secret
        #expect(SessionToken(text: String(text.dropLast())) == nil)
        #expect(SessionToken(text: String(repeating: "A", count: 300)) == nil)
    }
}
