#if canImport(Combine)
import Combine
#else
import OpenCombine
#endif
import Logging
import Synchronization
import Testing
import SwitchboardClient
import SwitchboardCodec
import SwitchboardDemo
import SwitchboardServer
import SwitchboardTesting

/// A server on an ephemeral port with the demo channels plus `extra` set-up.
func startServer(port: Int = 0, _ extra: (Server) -> Void = { _ in }) throws -> Server {
    var config = ServerConfiguration.forTests()
    config.port = port
    config.drainTimeoutMs = 300
    var logger = Logger(label: "test")
    logger.logLevel = .warning
    let server = try Server(configuration: config, logger: logger)
    server.installDemoChannels()
    extra(server)
    try server.start()
    return server
}

func stop(_ server: Server) async {
    server.shutdown()
    await server.waitUntilStopped()
}

func connect(_ server: Server, timeout: Duration = .seconds(5), reconnect: ReconnectPolicy? = nil) async throws -> Client {
    var config = ClientConfiguration(port: server.port)
    config.requestTimeout = timeout
    config.reconnect = reconnect
    return try await Client.connect(config)
}

/// A value filled in on another thread.
final class Cell<T: Sendable>: Sendable {
    private let value = Mutex<T?>(nil)
    func set(_ v: T) { value.withLock { $0 = v } }
    var current: T? { value.withLock { $0 } }
    func wait(_ limit: Duration = .seconds(5)) async throws -> T {
        guard try await eventually(Double(limit / .milliseconds(1)) / 1000, { current != nil }), let v = current else {
            throw ClientError.timedOut
        }
        return v
    }
}

struct Point: Codable, Equatable { var x: Int; var y: Int }

/// Holds a Combine subscription for the test body; subscriptions are safe to call from any thread.
final class SubscriptionHolder: @unchecked Sendable {  // `value` only read and written under `lock`
    private let lock = Mutex(())
    private var value: (any Subscription)?
    func set(_ s: any Subscription) { lock.withLock { _ in value = s } }
    var current: (any Subscription)? { lock.withLock { _ in value } }
}

@Suite struct ClientAPI {
    @Test func invokeMethodOutcomes() async throws {
        let server = try startServer()
        let client = try await connect(server)
        let echo = MethodChannel(name: "switchboard/echo", client: client)
        #expect(try await echo.invokeMethod("echo", arguments: ["a": [1, 2.5]]) == ["a": [1, 2.5]])
        await #expect(throws: ChannelError(code: "demo_error", message: "requested failure", details: 7)) {
            try await echo.invokeMethod("fail", arguments: 7)
        }
        await #expect(throws: MissingImplementation(channel: "switchboard/echo", method: "nope")) {
            try await echo.invokeMethod("nope")
        }
        let typed: Point = try await echo.invokeMethod("echo", arguments: Point(x: 1, y: -2))
        #expect(typed == Point(x: 1, y: -2))
        let json = MethodChannel(name: "switchboard/echo.json", codec: JSONMethodCodec(), client: client)
        #expect(try await json.invokeMethod("echo", arguments: [true, nil]) == [true, nil])
        let strings = BasicMessageChannel(name: "switchboard/message.string", codec: StringCodec(), client: client)
        #expect(try await strings.send("héllo") == "héllo")
        try await client.ping()
        await client.close()
        #expect(client.state == .closed)
        await #expect(throws: ClientError.closed) { try await echo.invokeMethod("echo") }
        await stop(server)
    }

    @Test func eventStreams() async throws {
        let server = try startServer { server in
            EventChannel(name: "failing", server: server).setStreamHandler(StreamHandlerClosures(onListen: { _, sink in
                sink.success(1)
                sink.error(ChannelError(code: "boom"))
                return nil
            }))
        }
        let client = try await connect(server)
        var ticks: [ChannelValue] = []
        for try await tick in EventChannel(name: "switchboard/ticker", client: client)
            .receiveBroadcastStream(arguments: ["count": 3, "intervalMs": 1]) {
            ticks.append(tick)
        }
        #expect(ticks == [0, 1, 2])
        var seen: [ChannelValue] = []
        await #expect(throws: ChannelError(code: "boom")) {
            for try await value in EventChannel(name: "failing", client: client).receiveBroadcastStream() { seen.append(value) }
        }
        #expect(seen == [1])
        await #expect(throws: ChannelError.self) {
            for try await _ in EventChannel(name: "switchboard/ticker", client: client).receiveBroadcastStream(arguments: ["count": -1]) {}
        }
        await client.close()
        await stop(server)
    }

    @Test func cancellingTheIteratingTaskSendsCancel() async throws {
        let cancelled = Cell<ChannelValue>()
        let server = try startServer { server in
            EventChannel(name: "watched", server: server).setStreamHandler(StreamHandlerClosures(
                onListen: { _, sink in sink.success("hello"); return nil },
                onCancel: { arguments, _ in cancelled.set(arguments) }))
        }
        let client = try await connect(server)
        let first = Cell<ChannelValue>()
        let task = Task {
            for try await value in EventChannel(name: "watched", client: client).receiveBroadcastStream(arguments: "args") {
                first.set(value)
            }
        }
        #expect(try await first.wait() == "hello")
        task.cancel()
        #expect(try await cancelled.wait() == "args")
        await client.close()
        await stop(server)
    }

    @Test func taskCancellationAndTimeoutSendCancelAndFailAtOnce() async throws {
        let cancellations = Cell<Int>(), handled = Tally()
        let count = Mutex(0)
        let server = try startServer { server in
            MethodChannel(name: "slow", server: server).setMethodCallHandler { _ in
                handled.add()
                await untilCancelled()
                let n = count.withLock { $0 += 1; return $0 }
                cancellations.set(n)
                return nil
            }
        }
        let client = try await connect(server, timeout: .seconds(30))
        let slow = MethodChannel(name: "slow", client: client)
        let clock = ContinuousClock()
        let started = clock.now
        await #expect(throws: ClientError.timedOut) { try await slow.invokeMethod("x", timeout: .milliseconds(100)) }
        #expect(clock.now - started < .seconds(10))  // at once: the handler never answers (bounded by 10 s for a loaded machine)
        let call = Task { try await slow.invokeMethod("y") }
        #expect(try await eventually { handled.value == 2 })  // the call has reached the handler
        call.cancel()
        await #expect(throws: CancellationError.self) { try await call.value }
        #expect(try await eventually { cancellations.current == 2 })  // the server's handler saw both CANCELs
        let stillWorks: ChannelValue = try await SwitchboardClient.MethodChannel(name: "switchboard/echo", client: client)
            .invokeMethod("echo", arguments: 1)
        #expect(stillWorks == 1)
        await client.close()
        await stop(server)
    }

    @Test func serverCallsTheClientsHandlers() async throws {
        let caller = Cell<ClientID>()
        let server = try startServer { server in
            MethodChannel(name: "hello", server: server).setMethodCallHandler { _, result in
                caller.set(result.client)
                result.success(nil)
            }
        }
        let client = try await connect(server)
        try await MethodChannel(name: "client/math", client: client).setMethodCallHandler { call in
            switch call.method {
            case "double": return .int((call.arguments.intValue ?? 0) * 2)
            case "fail": throw ChannelError(code: "nope", message: "no")
            default: throw MissingImplementation(channel: "client/math", method: call.method)
            }
        }
        try await BasicMessageChannel(name: "client/upper", codec: StringCodec(), client: client).setMessageHandler { text in
            text?.uppercased()
        }
        try await MethodChannel(name: "hello", client: client).invokeMethod("hi")
        let id = try await caller.wait()
        let reverse = SwitchboardServer.MethodChannel(name: "client/math", server: server)
        let doubled = Cell<Result<ChannelValue, InvokeError>>()
        reverse.invokeMethod("double", arguments: 21, on: id) { doubled.set($0) }
        #expect(try await doubled.wait() == .success(42))
        let failed = Cell<Result<ChannelValue, InvokeError>>()
        reverse.invokeMethod("fail", on: id) { failed.set($0) }
        #expect(try await failed.wait() == .failure(.error(ChannelError(code: "nope", message: "no"))))
        let missing = Cell<Result<ChannelValue, InvokeError>>()
        reverse.invokeMethod("other", on: id) { missing.set($0) }
        #expect(try await missing.wait() == .failure(.notImplemented))
        let upper = Cell<Result<String?, InvokeError>>()
        SwitchboardServer.BasicMessageChannel(name: "client/upper", codec: StringCodec(), server: server)
            .send("shout", to: id) { upper.set($0) }
        #expect(try await upper.wait() == .success("SHOUT"))
        await client.close()
        await stop(server)
    }

    @Test func combineSubscriberDemandPacesTheServer() async throws {
        let server = try startServer()
        let client = try await connect(server)
        let received = Mutex<[ChannelValue]>([])
        let subscription = SubscriptionHolder()
        let subscriber = AnySubscriber<ChannelValue, any Error>(
            receiveSubscription: { s in subscription.set(s); s.request(.max(3)) },
            receiveValue: { value in received.withLock { $0.append(value) }; return .none },
            receiveCompletion: { _ in })
        EventChannel(name: "switchboard/ticker", client: client)
            .publisher(arguments: ["intervalMs": 0, "count": 1000]).receive(subscriber: subscriber)
        #expect(try await eventually { received.withLock { $0.count } == 3 })
        try await Task.sleep(for: .milliseconds(300))  // real time: a server and client on their own loops; what must not come has nothing to await
        #expect(received.withLock { $0 } == [0, 1, 2])  // the ticker waits for credit instead of running ahead
        subscription.current?.request(.max(2))
        #expect(try await eventually { received.withLock { $0.count } >= 5 })
        #expect(received.withLock { $0 } == [0, 1, 2, 3, 4])
        let stats = try await MethodChannel(name: "switchboard/stats", client: client).invokeMethod("get")
        #expect(stats["eventsDropped"] == [:])
        subscription.current?.cancel()
        await client.close()
        await stop(server)
    }

    @Test func reconnectRelistensAndFailsCallsInFlight() async throws {
        let hung = Tally()
        var server = try startServer { server in
            MethodChannel(name: "hang", server: server).setMethodCallHandler { _, _ in hung.add() }
        }
        let port = server.port
        let client = try await connect(server, reconnect: ReconnectPolicy(initialDelay: .milliseconds(20), maximumDelay: .milliseconds(100)))
        let states = Mutex<[ConnectionState]>([])
        let watcher = Task { for await state in client.stateUpdates() { states.withLock { $0.append(state) } } }
        let events = Mutex<[ChannelValue]>([])
        let stream = Task {
            for try await event in EventChannel(name: "switchboard/room", client: client).receiveBroadcastStream() {
                events.withLock { $0.append(event) }
            }
        }
        let post = BasicMessageChannel(name: "switchboard/room.post", codec: BinaryCodec(), client: client)
        #expect(try await eventually {  // the listen is in
            _ = try await post.send([1])
            return !events.withLock { $0.isEmpty }
        })
        let hanging = Task { try await MethodChannel(name: "hang", client: client).invokeMethod("x") }
        #expect(try await eventually { hung.value > 0 })
        await stop(server)
        let failure = await hanging.result
        #expect(throws: (any Error).self) { try failure.get() }  // going_away from the drain, or connectionLost
        server = try startServer(port: port)
        #expect(try await eventually { client.state == .connected })
        #expect(try await eventually {  // the listen goes out again after WELCOME
            _ = try await post.send([2])
            return events.withLock { $0.contains(.uint8List([2])) }
        })
        let seen = events.withLock { $0 }  // the first post and the last, each perhaps more than once
        #expect(seen.first == .uint8List([1]) && seen.last == .uint8List([2]))
        #expect(seen.allSatisfy { $0 == .uint8List([1]) || $0 == .uint8List([2]) })
        #expect(states.withLock { $0 }.contains { if case .disconnected = $0 { true } else { false } })
        stream.cancel()
        await client.close()
        watcher.cancel()
        await stop(server)
    }

    @Test func connectFailsCleanly() async throws {
        await #expect(throws: ClientError.self) { try await Client.connect(ClientConfiguration(port: 1)) }
        var config = ServerConfiguration.forTests()
        config.token = "secret"
        let server = try Server(configuration: config)
        try server.start()
        await #expect(throws: ClientError.self) { try await Client.connect(ClientConfiguration(port: server.port, token: "wrong")) }
        let good = try await Client.connect(ClientConfiguration(port: server.port, token: "secret"))
        #expect(good.state == .connected)
        await good.close()
        await stop(server)
    }
}
