import Synchronization
import Testing
import SwitchboardCodec
import SwitchboardDemo
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

@Suite struct LimitsAndLifecycle {
    @Test func slowConsumerIsClosedAfterGraceAndCounted() async throws {
        try await withServer({
            $0.outboundLimit = 64 * 1024
            $0.slowConsumerGraceMs = 300
        }) { _, port in
            let slow = try RawConnection(port: port)
            try slow.send(.call(1, "switchboard/room", "listen"))
            #expect(try await slow.frame().id == 1)
            // Never reads again. A fast poster fills the slow listener's socket and outbound queue.
            let poster = try RawConnection(port: port)
            let chunk = [UInt8](repeating: 0xAB, count: 16 * 1024)
            for i in 1...400 as ClosedRange<UInt32> {
                try poster.send(Frame(.message, id: i, channel: "switchboard/room.post", payload: chunk))
                _ = try await poster.frame()  // replies are never dropped or held back
            }
            let observer = try RawConnection(port: port)
            var stats: ChannelValue = .null, id: UInt32 = 0
            _ = try await eventually {  // the grace (300 ms) passes
                id += 1
                try observer.send(.call(id, "switchboard/stats", "get"))
                stats = try await observer.frame().envelope().get()
                return stats["slowConsumersClosed"] == 1
            }
            #expect(stats["slowConsumersClosed"] == 1)
            #expect((stats["eventsDropped"]?["outboundLimit"]?.intValue ?? 0) > 0)  // nothing lost silently
            #expect(try await slow.isClosedByServer())
            #expect(stats["connections"] == 2)  // poster and observer untouched
        }
    }

    @Test func tickerPausesInsteadOfDropping() throws {
        var config = ServerConfiguration()
        config.outboundLimit = 16 * 1024
        config.slowConsumerGraceMs = 60_000
        let embedded = try EmbeddedServer(configuration: config)
        let peer = embedded.connect()
        peer.peerWindow = 0  // not reading
        peer.send(try .call(1, "switchboard/ticker", "listen", .stringMap(["intervalMs": 0, "count": 200_000])))
        embedded.advanceTime(byMs: 300)  // three hundred of the ticker's turns: it must wait, not drop
        #expect(!peer.isClosed)
        peer.peerWindow = .max
        var next = 0, ended = false, replies: [UInt32] = []
        for _ in 0..<2000 where !ended {
            embedded.advanceTime(byMs: 1)
            for f in try peer.frames() {
                guard f.kind == .message else { replies.append(f.id); continue }
                guard f.payload != nil else { ended = true; break }
                #expect(try f.envelope() == .success(.int(next)))
                next += 1
            }
        }
        #expect(replies == [1] && ended && next == 200_000)
        #expect(try peer.stats(on: embedded)["eventsDropped"] == [:])
    }

    @Test func heartbeatPingsAndClosesSilentConnections() async throws {
        // Intervals of 1 s: the lively client below must be scheduled within two of them, even while the
        // whole suite runs in parallel on two cores.
        try await withServer({ $0.heartbeatMs = 1000 }) { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(Frame(.hello, id: 1, payload: nil))
            let welcome = try JSONText.parse(try await wire.frame().payload!)
            #expect(welcome["heartbeatMs"] == 1000)
            let ping = try await wire.frame()
            #expect(ping.kind == .ping)
            // Stay silent: closed after two intervals without input.
            #expect(try await wire.isClosedByServer())

            let lively = try RawConnection(port: port)
            try lively.send(Frame(.hello, id: 1, payload: nil))  // binary mode: PINGs come once it is chosen
            for _ in 0..<4 {  // the WELCOME, then three intervals: a silent connection would be closed after two
                let f = try await lively.frame()
                if f.kind == .ping { try lively.send(Frame(.pong, id: f.id, payload: f.payload)) }
            }
            try lively.send(.call(9, "switchboard/echo", "echo", "alive"))
            #expect(try await lively.nextNonPing().envelope() == .success("alive"))
        }
    }

    @Test func gracefulShutdownDrainsThenEndsStreams() async throws {
        var config = ServerConfiguration.forTests()
        config.drainTimeoutMs = 60_000  // the drain ends when the test releases the slow call, not by time
        let server = try Server(configuration: config)
        server.installDemoChannels()
        let started = AtomicCounter(), released = AtomicCounter()
        MethodChannel(name: "slow", server: server).setMethodCallHandler { call in
            started.increment()
            _ = try await eventually { released.value > 0 }
            return call.arguments
        }
        let port = try server.start()
        let wire = try RawConnection(port: port)
        try wire.send(.call(1, "switchboard/room", "listen"))
        #expect(try await wire.frame().id == 1)
        let text = try RawConnection(port: port)
        try text.send(line: #"{"id":1,"listen":"switchboard/ticker","args":{"intervalMs":100000}}"#)
        #expect(try await text.line() == ["id": 1, "result": nil])
        try wire.send(.call(2, "slow", "x", "in flight"))
        #expect(try await eventually { started.value > 0 })
        server.shutdown()
        let goAway = try await wire.frame()
        #expect(goAway.kind == .goAway)
        #expect(try JSONText.parse(goAway.payload!)["reason"] != nil)
        try wire.send(.call(3, "switchboard/echo", "echo"))
        let refused = try await wire.frame()
        #expect(refused.errorCode == "going_away" && refused.id == 3)
        released.increment()
        let reply = try await wire.frame()
        #expect(reply.id == 2)
        #expect(try reply.envelope() == .success("in flight"))
        let end = try await wire.frame()
        #expect(end.kind == .message && end.channel == "switchboard/room" && end.payload == nil)
        #expect(try await wire.isClosedByServer())
        #expect(try await text.line()["goaway"] != nil)
        #expect(try await text.line() == ["event": "switchboard/ticker", "end": true])
        #expect(try await text.isClosedByServer())
        await server.waitUntilStopped()
    }

    @Test func drainTimeoutAnswersTheRestWithGoingAway() async throws {
        var config = ServerConfiguration.forTests()
        config.drainTimeoutMs = 100
        let server = try Server(configuration: config)
        let started = AtomicCounter()
        MethodChannel(name: "stuck", server: server).setMethodCallHandler { _, _ in started.increment() }  // never answers
        let port = try server.start()
        let wire = try RawConnection(port: port)
        try wire.send(.call(7, "stuck", "x"))
        #expect(try await eventually { started.value > 0 })
        server.shutdown()
        #expect(try await wire.frame().kind == .goAway)
        let answer = try await wire.frame()
        #expect(answer.errorCode == "going_away" && answer.id == 7)
        #expect(try await wire.isClosedByServer())
        await server.waitUntilStopped()
    }

    @Test("a connection silent when the drain began, or made during it, gets GOAWAY once it picks a mode")
    func goAwayWhenTheModeIsChosen() async throws {
        // The drain lasts until the test answers the stuck call, not for a time: a loaded machine can hold
        // this test up past any drain timeout, which closes the ports before the late connection is made.
        var config = ServerConfiguration.forTests()
        config.drainTimeoutMs = 60_000
        let server = try Server(configuration: config)
        server.installDemoChannels()
        let stuck = Mutex<[MethodResult]>([])
        MethodChannel(name: "stuck", server: server).setMethodCallHandler { _, result in stuck.withLock { $0.append(result) } }
        let port = try server.start()
        let busy = try RawConnection(port: port)
        try busy.send(.call(1, "stuck", "x"))
        let silent = try RawConnection(port: port)
        #expect(try await eventually {  // the call is in, and both connections are the server's (and /healthz's own)
            guard !stuck.withLock(\.isEmpty), let health = httpGet("/healthz", port: port) else { return false }
            return try JSONText.parse(Array(health.body.utf8))["connections"] == 3
        })
        server.shutdown()
        #expect(try await busy.frame().kind == .goAway)
        let late = try RawConnection(port: port)  // the ports stay open while draining
        try silent.send(.call(2, "switchboard/echo", "echo"))
        #expect(try await silent.frame().kind == .goAway)
        let refused = try await silent.frame()
        #expect(refused.errorCode == "going_away" && refused.id == 2)
        try late.send(line: #"{"id":3,"call":"switchboard/echo","method":"echo"}"#)
        #expect(try await late.line()["goaway"] != nil)
        #expect(try await late.line()["error"]?["code"] == "going_away")
        stuck.withLock { $0.forEach { $0.success(.null) } }  // the drain is over
        await server.waitUntilStopped()
    }

    @Test func twoHundredConnectionsTimesAHundredCalls() async throws {
        try await withServer { _, port in
            var connections: [RawConnection] = []
            for _ in 0..<200 { connections.append(try RawConnection(port: port, receiveTimeout: 20)) }
            for (c, wire) in connections.enumerated() {
                var batch: [UInt8] = []
                for i in 1...100 as ClosedRange<UInt32> {
                    batch += try Frame.call(i, "switchboard/echo", "echo", .int(c * 1000 + Int(i))).bytes
                }
                try wire.send(batch)
            }
            for (c, wire) in connections.enumerated() {
                var seen = Set<UInt32>()
                for _ in 1...100 {
                    let reply = try await wire.frame()
                    #expect(reply.kind == .reply)
                    #expect(try reply.envelope() == .success(.int(c * 1000 + Int(reply.id))))
                    #expect(seen.insert(reply.id).inserted, "duplicate reply")
                }
                #expect(seen.count == 100)
                #expect(try await wire.barrier().isEmpty)
            }
        }
    }
}
