#if canImport(Glibc)
import Glibc
#endif
import Logging
import SwitchboardDemo
import SwitchboardPluginAPI
import SwitchboardServer
import SwitchboardTransport

/// A real server whose loop the test drives, with connections over ``InMemoryTransport``s: no
/// sockets, no threads, the same bytes in the same order every run. Use it from one thread.
///
/// Its clock stands still: the server's time (a connection's `now`, deadlines,
/// heartbeats, housekeeping, every timer) moves only by ``advanceTime(byMs:)``, as with swift-nio's
/// `EmbeddedEventLoop`. Tests about time need no sleeps.
///
/// ```swift
/// let embedded = try EmbeddedServer()
/// let peer = embedded.connect()
/// peer.send(Frame(.ping, id: 7, payload: nil))
/// embedded.run()
/// let pong = try peer.frames()  // [Frame(.pong, id: 7, payload: nil)]
/// ```
public final class EmbeddedServer {
    /// The server; attach channels to it as usual.
    public let server: Server
    private var transports: [InMemoryTransport] = []
    private var isFinished = false

    /// Makes a server (with the demo and introspection channels unless `demoChannels` is false, and
    /// `plugins` loaded in order) driven by ``run(turns:)``, logging to `logger`.
    public init(configuration: ServerConfiguration = ServerConfiguration(), demoChannels: Bool = true,
                plugins: [any Plugin] = [], logger: Logger = Logger(label: "switchboard")) throws {
        server = try Server(configuration: configuration, logger: logger)
        if demoChannels {
            server.installDemoChannels()
            server.installIntrospectionChannels()
        }
        for plugin in plugins { server.load(plugin) }
        try server.startDriven(manualClock: true)
        server.runOnce()  // the channels are set
    }

    deinit { finish() }

    /// A new connection; the test is its peer. `layer` puts a transport between the two (TLS, HTTP and
    /// WebSocket), as the server's listeners do.
    public func connect(name: String = "memory", through layer: (InMemoryTransport) -> any Transport = { $0 }) -> InMemoryTransport {
        let transport = InMemoryTransport(name: name)
        transports.append(transport)
        server.accept(layer(transport))
        return transport
    }

    /// Runs loop turns: input that waited for resumed reading is delivered, jobs from other threads
    /// run, and every connection's output is flushed to its transport.
    public func run(turns: Int = 2) {
        precondition(!isFinished, "EmbeddedServer.run after finish()")
        for _ in 0..<turns {
            transports.removeAll { $0.isClosed }
            for transport in transports { transport.deliverWaitingInput() }
            server.runOnce()
        }
    }

    /// Moves the server's clock on by `milliseconds`, firing the timers due on the way in order (with a
    /// loop turn at each time one is due), then runs ``run(turns:)``'s default turns at the new time.
    public func advanceTime(byMs milliseconds: UInt64) {
        precondition(!isFinished, "EmbeddedServer.advanceTime after finish()")
        server.advanceTime(byMs: milliseconds) { run(turns: 1) }
        run()
    }

    /// Runs turns until `condition` holds (true) or `timeoutMs` passes (false): for answers that come
    /// from other threads, such as async handlers.
    public func run(until condition: () -> Bool, timeoutMs: UInt64 = 5000) -> Bool {
        let deadline = EventLoop.nanoseconds() + timeoutMs * 1_000_000
        while !condition() {
            guard EventLoop.nanoseconds() < deadline else { return false }
            run(turns: 1)
            usleep(100)  // the answer comes from another thread: don't spin
        }
        return true
    }

    /// Closes every connection and the loop. Also done when the value goes away.
    public func finish() {
        guard !isFinished else { return }
        isFinished = true
        server.finishDriven()
        transports = []
    }
}
