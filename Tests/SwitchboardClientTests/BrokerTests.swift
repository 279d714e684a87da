import Synchronization
import Testing
import SwitchboardClient
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

typealias RemoteMethods = SwitchboardClient.MethodChannel
typealias RemoteEvents = SwitchboardClient.EventChannel
typealias RemoteMessages = SwitchboardClient.BasicMessageChannel

/// A producer that counts 0 … n-1 on listen, as fast as it can, then ends.
final class Counter: EventProducer {
    let count: Int
    /// What the producer waits for before its events: by default a tenth of a second of real time, for
    /// the other listeners to join the server's fan-out, which the producer cannot see.
    let start: @Sendable () async -> Void
    init(count: Int, start: @escaping @Sendable () async -> Void = { try? await Task.sleep(for: .milliseconds(100)) }) {
        self.count = count
        self.start = start
    }
    let listens = Mutex(0)
    let cancels = Mutex(0)
    func onListen(arguments: ChannelValue, sink: ProducerSink) async -> ChannelError? {
        listens.withLock { $0 += 1 }
        if arguments == "refuse" { return ChannelError(code: "refused") }
        guard arguments != "hold" else { return nil }
        Task {
            await start()
            for i in 0..<count { sink.success(.int(i)) }
            sink.endOfStream()
        }
        return nil
    }
    func onCancel(arguments: ChannelValue) async { cancels.withLock { $0 += 1 } }
}

@Suite struct Broker {
    @Test func callsMessagesErrorsAndNotImplementedAreRelayed() async throws {
        let server = try startServer()
        let holder = try await connect(server)
        let caller = try await connect(server)
        try await RemoteMethods(name: "jobs/resize", client: holder).setMethodCallHandler { call in
            switch call.method {
            case "resize": return ["width": .int((call.arguments["width"]?.intValue ?? 0) / 2)]
            case "fail": throw ChannelError(code: "too_big", message: "no", details: call.arguments)
            default: throw MissingImplementation(channel: "jobs/resize", method: call.method)
            }
        }
        try await RemoteMessages(name: "jobs/notes", codec: StringCodec(), client: holder).setMessageHandler { "got \($0 ?? "nil")" }
        let resize = RemoteMethods(name: "jobs/resize", client: caller)
        #expect(try await resize.invokeMethod("resize", arguments: ["width": 640]) == ["width": 320])
        await #expect(throws: ChannelError(code: "too_big", message: "no", details: 1)) { try await resize.invokeMethod("fail", arguments: 1) }
        await #expect(throws: MissingImplementation.self) { try await resize.invokeMethod("other") }
        #expect(try await RemoteMessages(name: "jobs/notes", codec: StringCodec(), client: caller).send("hi") == "got hi")
        // The holder can call its own channel through the server too.
        #expect(try await RemoteMethods(name: "jobs/resize", client: holder).invokeMethod("resize", arguments: ["width": 2]) == ["width": 1])

        let stats = try await RemoteMethods(name: "switchboard/stats", client: caller).invokeMethod("get")
        #expect(stats["registrations"] == 2)
        #expect((stats["forwardedRequests"]?.intValue ?? 0) >= 5)
        await caller.close()
        await holder.close()
        await stop(server)
    }

    @Test func takenAndNotRegistered() async throws {
        let server = try startServer()
        let first = try await connect(server)
        let second = try await connect(server)
        try await RemoteMethods(name: "mine", client: first).setMethodCallHandler { _ in 1 }
        await #expect(throws: ClientError.server(code: "channel_taken", message: "the channel already has a handler")) {
            try await RemoteMethods(name: "mine", client: second).setMethodCallHandler { _ in 2 }
        }
        await #expect(throws: ClientError.self) {  // the server's own channels are taken too
            try await RemoteMethods(name: "switchboard/echo", client: second).setMethodCallHandler { _ in 2 }
        }
        let raw = try RawConnection(port: server.port)
        try raw.send(Frame(.unregister, id: 5, channel: "mine", payload: nil))
        let error = try await raw.frame()
        #expect(error.errorCode == "not_registered" && error.id == 5)
        try raw.send(Frame(.register, id: 6, channel: "x", payload: Array(#"{"kind":"method","codec":"binary"}"#.utf8)))
        #expect(try await raw.frame().errorCode == "bad_payload")
        // Unregistering gives the name back: new calls get a null reply.
        try await RemoteMethods(name: "mine", client: first).setMethodCallHandler(nil)
        await #expect(throws: MissingImplementation.self) { try await RemoteMethods(name: "mine", client: second).invokeMethod("x") }
        try await RemoteMethods(name: "mine", client: second).setMethodCallHandler { _ in 2 }
        await first.close()
        await second.close()
        await stop(server)
    }

    /// A holder that lets its channel go (and stays connected) leaves no caller waiting: every request
    /// forwarded on the channel and not answered is answered `handler_gone`, and a late REPLY is ignored.
    @Test func unregisteringAnswersForwardedRequestsWithHandlerGone() async throws {
        let server = try startServer()
        let holder = try RawConnection(port: server.port)
        try holder.send(Frame(.register, id: 1, channel: "slow", payload: nil))
        try holder.send(Frame(.register, id: 2, channel: "other", payload: nil))
        #expect(try await holder.frame().id == 1)
        #expect(try await holder.frame().id == 2)
        let caller = try RawConnection(port: server.port)
        for id in 1...3 as ClosedRange<UInt32> { try caller.send(Frame(.message, id: id, channel: "slow", payload: [UInt8(id)])) }
        try caller.send(Frame(.message, id: 4, channel: "other", payload: [4]))
        var forwarded: [String: [UInt32]] = [:]
        for _ in 0..<4 {
            let frame = try await holder.frame()
            forwarded[frame.channel, default: []].append(frame.id)
        }
        try holder.send(Frame(.unregister, id: 3, channel: "slow", payload: nil))
        #expect(try await holder.frame() == Frame(.reply, id: 3, payload: nil))
        for id in 1...3 as ClosedRange<UInt32> {
            let answer = try await caller.frame()
            #expect(answer.id == id && answer.errorCode == "handler_gone")
        }
        // The request on the channel still held goes on; a late answer on the released one is ignored.
        try holder.send(Frame(.reply, id: try #require(forwarded["slow"]?.first), payload: [9]))
        try holder.send(Frame(.reply, id: try #require(forwarded["other"]?.first), payload: [44]))
        #expect(try await caller.frame() == Frame(.reply, id: 4, payload: [44]))
        #expect(try await caller.barrier().isEmpty)
        await stop(server)
    }

    @Test func holderCrashAnswersEveryPendingRequestWithHandlerGone() async throws {
        let server = try startServer()
        let holder = try RawConnection(port: server.port)
        try holder.send(Frame(.register, id: 1, channel: "slow", payload: nil))
        #expect(try await holder.frame() == Frame(.reply, id: 1, payload: nil))
        let callers = try (0..<3).map { _ in try RawConnection(port: server.port) }
        for (i, caller) in callers.enumerated() {
            for id in 1...5 as ClosedRange<UInt32> { try caller.send(Frame(.message, id: id, channel: "slow", payload: [UInt8(i)])) }
        }
        var forwardedIDs = Set<UInt32>()
        for _ in 0..<15 {
            let forwarded = try await holder.frame()
            #expect(forwarded.kind == .message && forwarded.channel == "slow" && forwarded.id != 0)
            forwardedIDs.insert(forwarded.id)
        }
        #expect(forwardedIDs.count == 15)  // the server's own id space, never the callers' ids
        // The holder answers one request, then crashes.
        try holder.send(Frame(.reply, id: forwardedIDs.min()!, payload: [42]))
        holder.finishSending()
        var answers: [String] = []
        for caller in callers {
            for _ in 1...5 {
                let answer = try await caller.frame()
                answers.append(answer.kind == .reply ? "reply" : answer.errorCode ?? "?")
            }
            #expect(try await caller.barrier().isEmpty)  // exactly one answer each
        }
        #expect(answers.filter { $0 == "reply" }.count == 1)
        #expect(answers.filter { $0 == "handler_gone" }.count == 14)
        try callers[0].send(Frame(.message, id: 9, channel: "slow", payload: nil))
        #expect(try await callers[0].frame() == Frame(.reply, id: 9, payload: nil))  // no handler any more
        await stop(server)
    }

    @Test func cancelIsRelayedToTheHolder() async throws {
        let server = try startServer()
        let holder = try RawConnection(port: server.port)
        try holder.send(Frame(.register, id: 1, channel: "wait", payload: Array(#"{"kind":"method","codec":"standard"}"#.utf8)))
        _ = try await holder.frame()
        let caller = try RawConnection(port: server.port)
        try caller.send(.call(77, "wait", "x"))
        let forwarded = try await holder.frame()
        try caller.send(Frame(.cancel, id: 77, payload: nil))
        let relayed = try await holder.frame()
        #expect(relayed == Frame(.cancel, id: forwarded.id, payload: nil))
        guard case .failure(let error) = try await caller.frame().envelope() else { throw TestFailure("expected an error envelope") }
        #expect(error.code == "cancelled")
        try holder.send(Frame(.reply, id: forwarded.id, payload: try StandardMethodCodec().encodeSuccessEnvelope(1)))  // too late
        #expect(try await caller.barrier().isEmpty)
        await stop(server)
    }

    @Test func aHundredListenersOnAClientHeldEventChannel() async throws {
        let server = try startServer()
        let holder = try await connect(server)
        // The events begin once every listener is in (on four loops under a sanitizer, a tenth of a
        // second was not always enough, and a late listen started a second stream).
        let (everyoneIn, letThemGo) = AsyncStream<Void>.makeStream()
        let producer = Counter(count: 500) { for await _ in everyoneIn { break } }
        try await RemoteEvents(name: "sensors/imu", client: holder).setStreamHandler(producer)
        var listeners: [RawConnection] = []
        for _ in 0..<100 {
            let listener = try RawConnection(port: server.port)
            try listener.send(.call(1, "sensors/imu", "listen"))
            listeners.append(listener)
        }
        let text = try RawConnection(port: server.port)
        try text.send(line: #"{"id":1,"listen":"sensors/imu"}"#)
        for listener in listeners {
            let reply = try await listener.frame()
            #expect(reply.id == 1)
            #expect(try reply.envelope() == .success(nil))
        }
        #expect(try await text.line() == ["id": 1, "result": nil])
        letThemGo.yield()
        for listener in listeners {
            for i in 0..<500 { #expect(try await listener.frame().envelope() == .success(.int(i))) }
            #expect(try await listener.frame().payload == nil)  // end of stream
        }
        for i in 0..<500 { #expect(try await text.line() == ["event": "sensors/imu", "data": .int(i)]) }
        #expect(try await text.line() == ["event": "sensors/imu", "end": true])
        #expect(producer.listens.withLock { $0 } == 1)  // only the first listen reached the holder
        await holder.close()
        await stop(server)
    }

    @Test func lastCancelReachesTheProducerAndHolderLossEndsStreams() async throws {
        let server = try startServer()
        let holder = try await connect(server)
        let producer = Counter(count: 0)
        try await RemoteEvents(name: "feed", client: holder).setStreamHandler(producer)
        let a = try RawConnection(port: server.port), b = try RawConnection(port: server.port)
        try a.send(.call(1, "feed", "listen", "hold"))
        try b.send(.call(1, "feed", "listen", "hold"))
        _ = try await a.frame()
        _ = try await b.frame()
        try a.send(.call(2, "feed", "cancel"))
        _ = try await a.frame()
        try await Task.sleep(for: .milliseconds(50))  // real time: a cancel that must not come has nothing to await
        #expect(producer.cancels.withLock { $0 } == 0)  // b still listens
        await holder.close()  // the holder leaves: b's stream ends with handler_gone
        guard case .failure(let gone) = try await b.frame().envelope() else { throw TestFailure("expected an error event") }
        #expect(gone.code == "handler_gone")
        #expect(try await b.frame().payload == nil)
        await stop(server)
    }

    @Test func textClientsCallClientHeldChannels() async throws {
        let server = try startServer()
        let holder = try await connect(server)
        try await RemoteMethods(name: "jobs/add", client: holder).setMethodCallHandler { call in
            .int((call.arguments.listValue ?? []).compactMap(\.intValue).reduce(0, +))
        }
        try await RemoteMessages(name: "jobs/bytes", codec: BinaryCodec(), client: holder).setMessageHandler { bytes in
            bytes.map { Array($0.reversed()) }
        }
        let raw = try RawConnection(port: server.port)
        try raw.send(Frame(.register, id: 1, channel: "opaque", payload: nil))
        _ = try await raw.frame()
        let text = try RawConnection(port: server.port)
        try text.send(line: #"{"id":1,"call":"jobs/add","method":"sum","args":[1,2,3]}"#)
        #expect(try await text.line() == ["id": 1, "result": 6])
        try text.send(line: #"{"id":2,"send":"jobs/bytes","message":[1,2,3]}"#)
        #expect(try await text.line() == ["id": 2, "reply": [3, 2, 1]])
        try text.send(line: #"{"id":3,"call":"opaque","method":"x"}"#)
        #expect(try await text.line()["error"]?["code"] == "bad_request")  // no declared codec
        await holder.close()
        await stop(server)
    }

    @Test func handlersAreRegisteredAgainAfterReconnect() async throws {
        var server = try startServer()
        let port = server.port
        let holder = try await connect(server, reconnect: ReconnectPolicy(initialDelay: .milliseconds(20), maximumDelay: .milliseconds(50)))
        try await RemoteMethods(name: "jobs/ping", client: holder).setMethodCallHandler { _ in "pong" }
        await stop(server)
        server = try startServer(port: port)
        _ = try await eventually { holder.state == .connected }
        let caller = try await connect(server)
        var answer: ChannelValue = .null
        _ = try await eventually {  // the REGISTER goes out right after WELCOME
            answer = (try? await RemoteMethods(name: "jobs/ping", client: caller).invokeMethod("x")) ?? .null
            return answer != .null
        }
        #expect(answer == "pong")
        await caller.close()
        await holder.close()
        await stop(server)
    }

    @Test func relaySoakLosesAndDuplicatesNothing() async throws {
        let server = try startServer()
        let holder = try RawConnection(port: server.port, receiveTimeout: 30)
        try holder.send(Frame(.register, id: 1, channel: "soak", payload: nil))
        _ = try await holder.frame()
        let caller = try RawConnection(port: server.port, receiveTimeout: 30)
        let total = 100_000, window = 1000
        var sent = 0, answered = 0
        var seen = [Bool](repeating: false, count: total + 1)
        func sendBatch() throws {
            var batch: [UInt8] = []
            while sent < total, sent - answered < window {
                sent += 1
                var payload: [UInt8] = []
                Frame.appendBigEndian(UInt32(sent), to: &payload)
                Frame.write(.message, id: UInt32(sent), channel: "soak", payload: payload, to: &batch)
            }
            try caller.send(batch)
        }
        try sendBatch()
        while answered < total {
            // The holder echoes whatever arrived; then the caller checks its answers.
            var replies: [UInt8] = []
            for _ in 0..<(sent - answered) {
                let request = try await holder.frame()
                Frame.write(.reply, id: request.id, channel: "", payload: request.payload, to: &replies)
            }
            try holder.send(replies)
            for _ in 0..<(sent - answered) {
                let reply = try await caller.frame()
                let echoed = reply.payload.map { $0.reduce(UInt32(0)) { $0 << 8 | UInt32($1) } }
                #expect(reply.kind == .reply && echoed == reply.id)
                #expect(!seen[Int(reply.id)], "duplicate answer \(reply.id)")
                seen[Int(reply.id)] = true
            }
            answered = sent
            try sendBatch()
        }
        #expect(seen.dropFirst().allSatisfy { $0 })
        #expect(try await caller.barrier().isEmpty)
        await stop(server)
    }
}

/// Examples/BrokerExample as a user runs it.
@Suite struct BrokerExampleProgram {
    /// Someone else holds greeter/hello: one line saying so, and an exit code, not a crash.
    @Test func channelTakenIsOneLineAndAnExitCode() async throws {
        let server = try startServer()
        let holder = try await connect(server)
        try await RemoteMethods(name: "greeter/hello", client: holder).setMethodCallHandler { _ in 1 }
        let example = try ProgramRun(ProgramRun.builtExecutable("broker-example"), ["--port", "\(server.port)"])
        #expect(try await example.remainder(of: .standardError)
            == "broker-example: channel_taken: the channel already has a handler (is another broker-example running?)\n")
        #expect(try await example.exitCode() == 1)
        await holder.close()
        await stop(server)
    }

    @Test func noServerIsOneLineAndAnExitCode() async throws {
        let example = try ProgramRun(ProgramRun.builtExecutable("broker-example"), ["--port", "1"])
        let message = try await example.remainder(of: .standardError)
        #expect(message.hasPrefix("broker-example: connection failed") && message.split(separator: "\n").count == 1, "\(message)")
        #expect(try await example.exitCode() == 3)
    }
}
