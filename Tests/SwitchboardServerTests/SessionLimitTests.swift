import Testing
import SwitchboardCodec
import SwitchboardPlugins
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// Parked sessions under the connection caps, and the counts of sessions in stats
/// (protocol/resumption.md, "Limits" and "Settings, stats and metrics").
@Suite struct SessionLimitTests {
    /// A parked session holds its connection's place under --max-connections until it resumes, when the
    /// resuming connection's place is its own and the old one is given back.
    @Test func parkedSessionCountsUnderTheConnectionCap() async throws {
        try await withServer({ $0.maxConnections = 2 }) { _, port in
            var first: RawConnection? = try RawConnection(port: port)
            try first?.send(Frame(.hello, id: 1, payload: Array(#"{"session":{}}"#.utf8)))
            let welcome = try #require(try await first?.frame())
            let token = try #require(try JSONText.parse(welcome.payload ?? [])["session"]?["token"]?.stringValue)
            first = nil  // lost: the session parks, and keeps its place
            let resumer = try RawConnection(port: port)  // accepted before the next: the listener takes them in order
            let refused = try #require(RawSocket(port: port))
            #expect(refused.readUntilClosed()?.bytes == [])
            try resumer.send(Frame(.hello, id: 2, payload: Array(#"{"session":{"token":"\#(token)","position":0}}"#.utf8)))
            let resumed = try await resumer.frame()
            #expect(try JSONText.parse(resumed.payload ?? [])["session"]?["resumed"] == true)
            let admitted = try RawConnection(port: port)  // the parked place was given back
            #expect(try await admitted.barrier().isEmpty)
            try admitted.send(.call(9, "switchboard/stats", "get"))
            let stats = try await admitted.frame().envelope().get()
            #expect(stats["closes"]?["overConnectionLimit"] == 1)
            #expect(stats["sessions"]?["made"] == 1 && stats["sessions"]?["resumed"] == 1)
            #expect(stats["sessions"]?["live"] == 1 && stats["sessions"]?["parked"] == 0)
        }
    }

    /// An address at its cap may still open a connection to resume one of its parked sessions (one past
    /// the cap per parked session); such a connection that does anything else is closed unheard, one
    /// admitted within the cap meanwhile is not, and the cap holds again once the session resumed.
    @Test func addressAtItsCapStillResumesItsSession() async throws {
        try await withServer({ $0.maxConnectionsPerAddress = 3; $0.capsLoopback = true }) { _, port in
            let reader = try RawConnection(port: port)
            func stats() async throws -> ChannelValue {
                try reader.send(.call(9, "switchboard/stats", "get"))
                return try await reader.nextNonPing().envelope().get()
            }
            var first: RawConnection? = try RawConnection(port: port)
            try first?.send(Frame(.hello, id: 1, payload: Array(#"{"session":{}}"#.utf8)))
            let welcome = try #require(try await first?.frame())
            let token = try #require(try JSONText.parse(welcome.payload ?? [])["session"]?["token"]?.stringValue)
            first = nil  // lost: the session parks, and keeps its place (two of three)
            while try await stats()["sessions"]?["parked"] != 1 { try await Task.sleep(for: .milliseconds(10)) }
            let neighbour = try RawConnection(port: port)  // within the cap: three of three
            var intruder = RawSocket(port: port)  // past the cap by the parked session's margin, to resume only
            while try await stats()["connections"] != 3 { try await Task.sleep(for: .milliseconds(10)) }
            try neighbour.send(Frame(.hello, id: 1, payload: Array(#"{"version":1}"#.utf8)))
            #expect(try await neighbour.frame().kind == .welcome)  // not taken for the one past the cap
            intruder?.send(Frame(.hello, id: 1, payload: Array(#"{"version":1}"#.utf8)).bytes)
            #expect(intruder?.readUntilClosed()?.bytes == [])
            intruder = nil
            var resumed: Frame?, resumer: RawConnection?
            for _ in 0..<200 where resumed == nil {  // the intruder's place is given back once its socket closed
                resumer = try RawConnection(port: port)
                try resumer?.send(Frame(.hello, id: 2, payload: Array(#"{"session":{"token":"\#(token)","position":0}}"#.utf8)))
                resumed = try? await resumer?.frame()
                if resumed == nil { try await Task.sleep(for: .milliseconds(10)) }
            }
            #expect(try JSONText.parse(try #require(resumed).payload ?? [])["session"]?["resumed"] == true)
            let refused = try #require(RawSocket(port: port))  // three of three again: nothing parked to resume
            #expect(refused.readUntilClosed()?.bytes == [])
            #expect(try await stats()["closes"]?["overAddressLimit"].flatMap(\.intValue).map { $0 >= 2 } == true)
            #expect(resumer != nil)  // the session's connection, open to the end
        }
    }

    /// A server with access control (alice and bob), and alice's connection in a new session, with its token.
    static func aliceInASession() throws -> (EmbeddedServer, InMemoryTransport, String) {
        let plugins = PluginConfiguration.plugins(reading: LiveSettings(PluginConfiguration(access: accessRules())))
        let embedded = try EmbeddedServer(plugins: plugins)
        let alice = embedded.connect()
        alice.send(Frame(.hello, id: 1, payload: Array(#"{"token":"alice-token","session":{}}"#.utf8)))
        embedded.run()
        let welcome = try #require(try alice.frames().first?.payload)
        return (embedded, alice, try #require(try JSONText.parse(welcome)["session"]?["token"]?.stringValue))
    }

    /// A token is good only with the identity that made it: another user's HELLO with it is answered
    /// as for an unknown token (counted as `identity`), and the session is not touched.
    @Test func tokenOfAnotherUserIsRefused() throws {
        let (embedded, alice, token) = try Self.aliceInASession()
        alice.peerCloses()
        embedded.run()
        for credentials in [#""token":"bob-token","#, ""] {
            let other = embedded.connect()
            other.send(Frame(.hello, id: 1, payload: Array(#"{\#(credentials)"session":{"token":"\#(token)","position":0}}"#.utf8)))
            embedded.run()
            let refusal = try #require(try other.frames().first)
            #expect(try JSONText.parse(refusal.payload ?? [])["details"]?["reason"] == "unknown", "\(credentials)")
        }
        let again = embedded.connect()
        again.send(Frame(.hello, id: 1, payload: Array(#"{"token":"alice-token","session":{"token":"\#(token)","position":0}}"#.utf8)))
        embedded.run()
        #expect(try JSONText.parse(try again.frames().first?.payload ?? [])["session"]?["resumed"] == true)
        #expect(embedded.server.core.value.sessions.refusedCounts == ["identity": 2])  // alice's user may not read stats
    }

    /// A later HELLO on a session's connection may not name another identity: `bad_hello`, the close,
    /// and the session ends (it would otherwise pass to the other user).
    @Test func laterHelloOfAnotherIdentityEndsTheSession() throws {
        let (embedded, alice, token) = try Self.aliceInASession()
        alice.send(Frame(.hello, id: 2, payload: Array(#"{"token":"alice-token"}"#.utf8)))
        embedded.run()
        #expect(try alice.frames().map(\.kind) == [.welcome])  // the same identity: answered as any HELLO
        alice.send(Frame(.hello, id: 3, payload: Array(#"{"token":"bob-token"}"#.utf8)))
        embedded.run()
        #expect(try alice.frames().map(\.errorCode) == ["bad_hello"])
        alice.peerCloses()
        embedded.run()
        for (credentials, reason) in [(#""token":"alice-token","#, "ended"), (#""token":"bob-token","#, "unknown")] {
            let again = embedded.connect()
            again.send(Frame(.hello, id: 1, payload: Array(#"{\#(credentials)"session":{"token":"\#(token)","position":0}}"#.utf8)))
            embedded.run()
            let refusal = try #require(try again.frames().first)
            #expect(try JSONText.parse(refusal.payload ?? [])["details"]?["reason"]?.stringValue == reason, "\(credentials)")
        }
    }

    /// A session made over WebSocket resumes over plain TCP, live: its channel's caller waited, and
    /// gets the answer the holder gives after resuming.
    @Test func sessionMadeOverWebSocketResumesOverTCP() async throws {
        try await withServer { _, port in  // on several loops, the resuming TCP socket moves to the session's
            var ws: RawWebSocket? = try #require(RawWebSocket(port: port))
            ws?.send(opcode: 2, Frame(.hello, id: 1, payload: Array(#"{"session":{}}"#.utf8)).bytes)
            let welcome = try #require(try RawWebSocket.frames(ws?.receive()).first)
            let token = try #require(try JSONText.parse(welcome.payload ?? [])["session"]?["token"]?.stringValue)
            ws?.send(opcode: 2, Frame(.register, id: 2, channel: "held", payload: nil).bytes)
            let registered = try RawWebSocket.frames(ws?.receive())
            #expect(registered.map(\.kind) == [.reply])
            ws = nil  // lost
            let caller = try RawConnection(port: port)
            try caller.send(.call(7, "held", "work"))
            let resumer = try RawConnection(port: port)
            let position = registered.map(\.bytes.count).reduce(0, +)
            try resumer.send(Frame(.hello, id: 3, payload: Array(#"{"session":{"token":"\#(token)","position":\#(position)}}"#.utf8)))
            let resumed = try await resumer.frame()
            #expect(try JSONText.parse(resumed.payload ?? [])["session"]?["resumed"] == true)
            let forwarded = try await resumer.nextSkippingPingsAndPositions()
            #expect(forwarded.kind == .message && forwarded.channel == "held")
            try resumer.send(Frame(.reply, id: forwarded.id, payload: try StandardMethodCodec().encodeSuccessEnvelope("done")))
            #expect(try await caller.frame().envelope() == .success("done"))
        }
    }

    /// A resume that lands on another loop than the session's (loop 0 deals connections round) moves
    /// there with its socket and resumes as on the session's own loop.
    @Test func resumeOnAnotherLoopMovesThere() async throws {
        try await withServer({ $0.loops = 4 }) { _, port in
            var holder: RawConnection? = try RawConnection(port: port)  // on loop i
            try holder?.send(Frame(.hello, id: 1, payload: Array(#"{"session":{}}"#.utf8)))
            let welcome = try #require(try await holder?.frame())
            let token = try #require(try JSONText.parse(welcome.payload ?? [])["session"]?["token"]?.stringValue)
            try holder?.send(Frame(.register, id: 2, channel: "moved", payload: nil))
            let registered = try #require(try await holder?.frame())
            holder = nil  // lost
            let resumer = try RawConnection(port: port)  // on loop i + 1
            try resumer.send(Frame(.hello, id: 3, payload: Array(#"{"session":{"token":"\#(token)","position":\#(registered.bytes.count)}}"#.utf8))
                             .bytes + Frame(.ping, id: 4, payload: nil).bytes)
            let resumed = try await resumer.frame()
            #expect(try JSONText.parse(resumed.payload ?? [])["session"]?["resumed"] == true)
            #expect(try await resumer.nextSkippingPingsAndPositions().kind == .pong)  // what followed the HELLO came along
            let caller = try RawConnection(port: port)  // on loop i + 2
            try caller.send(.call(7, "moved", "work"))
            let forwarded = try await resumer.nextSkippingPingsAndPositions()
            #expect(forwarded.kind == .message && forwarded.channel == "moved")
            try resumer.send(Frame(.reply, id: forwarded.id, payload: try StandardMethodCodec().encodeSuccessEnvelope("done")))
            #expect(try await caller.frame().envelope() == .success("done"))
        }
    }

    @Test func statsCountSessions() throws {
        let embedded = try EmbeddedServer()
        let a = try SessionResumeTests.newSession(embedded)
        let b = try SessionResumeTests.newSession(embedded)
        let c = try SessionResumeTests.newSession(embedded)
        a.peer.peerCloses()
        embedded.run()
        _ = try SessionResumeTests.resume(embedded, b)  // taken over from its live connection
        c.peer.send(Frame(.end, payload: nil))
        embedded.run()
        _ = try SessionResumeTests.resume(embedded, c)  // ended: refused
        _ = try SessionResumeTests.resume(embedded, SessionResumeTests.Client(peer: c.peer, token: "x", received: 0))
        let reader = embedded.connect()
        reader.send(try .call(9, "switchboard/stats", "get"))
        embedded.run()
        let sessions = try #require(try reader.frames().first?.envelope().get()["sessions"])
        #expect(sessions["made"] == 3 && sessions["resumed"] == 1 && sessions["taken"] == 1)
        #expect(sessions["live"] == 1 && sessions["parked"] == 1)
        #expect(sessions["ended"]?["end"] == 1)
        #expect(sessions["refused"]?["ended"] == 1 && sessions["refused"]?["unknown"] == 1)
        #expect(sessions["bufferedBytes"]?.intValue.map { $0 >= 0 } == true)
    }
}
