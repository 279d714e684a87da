#if canImport(Combine)
import Combine
#else
import OpenCombine
#endif
import Synchronization
import Testing
import SwitchboardClient
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting

/// A client's close racing its own calls, subscriptions and writes: everything ends, nothing hangs.
@Suite struct ClientShutdown {
    /// Calls from four tasks racing `close()`: every one of them finishes (a reply or a ClientError),
    /// none waits forever for a loop that has gone.
    @Test func callsRacingCloseAllFinish() async throws {
        let server = try startServer()
        for _ in 0..<25 {
            let client = try await connect(server)
            let echo = MethodChannel(name: "switchboard/echo", client: client)
            let finished = Tally(), answered = Tally()
            let callers = (0..<4).map { _ in
                Task.detached {
                    for n in 0..<50 { if (try? await echo.invokeMethod("echo", arguments: .int(n))) != nil { answered.add() } }
                    finished.add()
                }
            }
            _ = try await eventually { answered.value > 0 }  // calls are under way
            await client.close()
            #expect(try await eventually(5) { finished.value == 4 }, "a call hung after close()")
            if finished.value < 4 { break }
            for caller in callers { await caller.value }
        }
        await stop(server)
    }

    /// Subscribing to an event publisher of a closed client fails at once with `ClientError.closed`.
    @Test func publisherOfAClosedClientFails() async throws {
        let server = try startServer()
        let client = try await connect(server)
        await client.close()
        let completion = Cell<String>()
        let subscriber = AnySubscriber<ChannelValue, any Error>(
            receiveSubscription: { $0.request(.max(1)) },
            receiveValue: { _ in .none },
            receiveCompletion: { result in
                if case .failure(let error as ClientError) = result, error == .closed { completion.set("closed") } else {
                    completion.set("\(result)")
                }
            })
        EventChannel(name: "switchboard/ticker", client: client).publisher().receive(subscriber: subscriber)
        #expect(try await completion.wait(.seconds(2)) == "closed")
        await stop(server)
    }

    /// What a client wrote just before `close()` still reaches the server, however large: the loop
    /// stops only once the connection has closed gracefully.
    @Test func closeLetsTheLastWritesLeave() async throws {
        let server = try startServer()
        let listener = try await connect(server)
        let received = Cell<Int>()
        let stream = Task {
            for try await event in EventChannel(name: "switchboard/room", client: listener).receiveBroadcastStream() {
                if case .uint8List(let bytes) = event { received.set(bytes.count) }
            }
        }
        let poster = try await connect(server)
        #expect(try await eventually {  // the listen is in
            poster.post(channel: "switchboard/room.post", payload: [1])
            return received.current == 1
        })
        let big = [UInt8](repeating: 1, count: 15 << 20)
        poster.post(channel: "switchboard/room.post", payload: big)  // id 0: nothing waits for it
        await poster.close()
        #expect(try await eventually(5) { received.current == big.count })
        stream.cancel()
        await listener.close()
        await stop(server)
    }
}

/// A count shared across tasks.
final class Tally: Sendable {
    private let count = Atomic<Int>(0)
    func add() { count.add(1, ordering: .relaxed) }
    var value: Int { count.load(ordering: .relaxed) }
}

/// A client that held an event channel is freed once closed, although its producer's sink refers to it.
@Test func aClosedClientThatHeldAnEventChannelIsFreed() async throws {
    let server = try startServer()
    weak var weakClient: Client?
    do {
        let client = try await connect(server)
        weakClient = client
        try await EventChannel(name: "held/events", client: client).setStreamHandler(Counter(count: 1))
        await client.close()
    }
    _ = try await eventually { weakClient == nil }
    #expect(weakClient == nil)
    await stop(server)
}
