import Logging
import Synchronization
import SwitchboardTransport

/// A Switchboard server: one libuv loop serving binary and text-mode clients on one port.
///
/// Create it, attach channels (``MethodChannel``, ``EventChannel``, ``BasicMessageChannel``), then
/// ``run(handlingSignals:)`` on the current thread or ``start()`` on a thread of its own.
public final class Server: Sendable {
    /// The settings it was made with.
    public let configuration: ServerConfiguration
    let core: LoopBound<ServerCore>
    private let state = Mutex(RunState())
    private let boundPort = Atomic<Int>(0)
    private let boundTLSPort = Atomic<Int>(0)

    private struct RunState {
        var isStopped = false
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    /// Makes a server; nothing listens until it runs.
    public init(configuration: ServerConfiguration = ServerConfiguration(),
                logger: Logger = Logger(label: "switchboard")) throws(UVError) {
        self.configuration = configuration
        let core = try ServerCore(config: configuration, logger: logger)
        self.core = LoopBound(core, loop: core.handle)
    }

    /// A server that never ran still holds its loop's handles and file descriptors, and set-up jobs
    /// that capture its core: both go here. (One that ran released everything when it stopped.)
    deinit {
        guard !core.loop.hasStarted else { return }
        let core = self.core.value
        core.eventLoop.finishDriving(beforeClosing: core.releaseAll)
    }

    /// The port it listens on, once running (useful with port 0).
    public var port: Int { boundPort.load(ordering: .acquiring) }
    /// The TLS port it listens on, once running; 0 without TLS.
    public var tlsPort: Int { boundTLSPort.load(ordering: .acquiring) }

    /// Runs `body` with the loop-owned core on the loop thread (queued until the loop runs).
    func onLoop(_ body: @escaping @Sendable (ServerCore) -> Void) { core.onLoop(body) }

    /// Loads `plugin` (see ``Plugin``): its stages join the pipeline after those loaded before, then its
    /// ``Plugin/didLoad(into:)`` runs. Before the server runs only: the pipeline is fixed while it serves.
    public func load(_ plugin: any Plugin) {
        precondition(!core.loop.hasStarted, "plugins are loaded before the server runs")
        core.value.pipeline.load(plugin)
        plugin.didLoad(into: self)
    }

    /// Runs `body` on the loop thread each time the process receives `signal` (such as SIGHUP), from
    /// when the loop starts.
    public func onSignal(_ signal: Int32, _ body: @escaping @Sendable () -> Void) {
        onLoop { $0.watch(signal, body) }
    }

    /// Binds and serves on the calling thread until shut down; returns after a graceful stop.
    public func run(handlingSignals: Bool = false) throws(UVError) {
        let core = self.core.value
        boundPort.store(try core.bind(), ordering: .releasing)
        boundTLSPort.store(core.tlsPort ?? 0, ordering: .releasing)
        if handlingSignals { try core.handleSignals() }
        core.logger.notice("listening on \(configuration.host):\(port)")
        if let tlsPort = core.tlsPort { core.logger.notice("listening for TLS on \(configuration.host):\(tlsPort)") }
        core.eventLoop.run(beforeClosing: core.releaseAll)
        markStopped()
    }

    /// Binds, then serves on a new thread; returns the bound port.
    @discardableResult
    public func start() throws(UVError) -> Int {
        let port = try core.value.bind()
        boundPort.store(port, ordering: .releasing)
        boundTLSPort.store(core.value.tlsPort ?? 0, ordering: .releasing)
        let core = self.core
        startThread { [self] in
            let owned = core.value
            owned.eventLoop.run(beforeClosing: owned.releaseAll)
            markStopped()
        }
        return port
    }

    // MARK: Driven by the caller

    /// Starts serving without a listener, with the loop driven by the calling thread through
    /// ``runOnce()``: for connections over in-memory transports (tests, fuzzers) and for embedders
    /// that bring their own transports to ``accept(_:)``. End with ``finishDriven()``.
    public func startDriven() throws(UVError) {
        try core.value.startPerTurnWork()
    }

    /// Runs what is ready now (jobs from other threads, due timers, the per-turn flush) without
    /// blocking. The calling thread owns the loop from the first call on.
    public func runOnce() {
        core.value.eventLoop.runOnce()
    }

    /// Serves a connection over `transport`, as if the listener had accepted it. Loop thread only.
    public func accept(_ transport: any Transport) {
        precondition(core.loop.isInLoopThread || !core.loop.hasStarted, "Server.accept is for the loop thread")
        core.value.accept(transport)
    }

    /// Stops a server driven by ``runOnce()`` at once: closes every connection and the loop.
    public func finishDriven() {
        let core = self.core.value
        core.eventLoop.finishDriving(beforeClosing: core.releaseAll)  // after the queued jobs, which may set channels
        markStopped()
    }

    /// Begins a graceful shutdown (wire-v1 section 7c). Callable from any thread.
    public func shutdown() {
        onLoop { $0.beginShutdown() }
    }

    /// Waits until the server has stopped.
    public func waitUntilStopped() async {
        await withCheckedContinuation { continuation in
            let resumeNow = state.withLock { s in
                if s.isStopped { return true }
                s.waiters.append(continuation)
                return false
            }
            if resumeNow { continuation.resume() }
        }
    }

    private func markStopped() {
        let waiters = state.withLock { s in
            s.isStopped = true
            defer { s.waiters = [] }
            return s.waiters
        }
        for waiter in waiters { waiter.resume() }
    }
}
