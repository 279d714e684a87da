#if canImport(Glibc)
import Glibc
#endif
import Synchronization
import Testing
import SwitchboardTransport
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// A count shared with handlers on other threads.
final class AtomicCounter: Sendable {
    private let count = Atomic<Int>(0)
    func increment() { count.add(1, ordering: .relaxed) }
    var value: Int { count.load(ordering: .relaxed) }
}

/// A value handed from a handler to the test.
final class Handoff<Value: Sendable>: Sendable {
    private let box = Mutex<Value?>(nil)
    func put(_ value: Value) { box.withLock { $0 = value } }
    var value: Value? { box.withLock { $0 } }
}

/// Runs `body` on a thread of its own and waits for it (see ``finishesOnAnotherThread(_:)``).
func onAnotherThread(_ body: @escaping @Sendable () -> Void) {
    if !finishesOnAnotherThread(body) { Issue.record("the thread did not finish") }
}

extension EmbeddedServer {
    /// A listener on a new event channel "own" whose handler hands out its sink: the listener's
    /// connection (its listen reply read) and the sink.
    func listenToOwnSink(overflow: OverflowPolicy, queueLimit: Int) throws -> (InMemoryTransport, EventSink) {
        let sinks = Handoff<EventSink>()
        EventChannel(name: "own", overflow: overflow, queueLimit: queueLimit, server: server)
            .setStreamHandler(StreamHandlerClosures(onListen: { _, sink in sinks.put(sink); return nil }))
        run()
        let listener = connect()
        listener.send(try .call(1, "own", "listen"))
        run()
        _ = try listener.frames()
        return (listener, try #require(sinks.value))
    }

    /// A peer that reads nothing and has sent 60 echo calls in one read: with a small outbound limit,
    /// the server has paused reading it.
    func pausedPeer() throws -> InMemoryTransport {
        let peer = connect()
        peer.peerWindow = 0
        var burst: [UInt8] = []
        for id in 1...60 { burst += try Frame.call(UInt32(id), "switchboard/echo", "echo", .string(String(repeating: "x", count: 64))).bytes }
        peer.send(burst)
        run()
        return peer
    }
}
