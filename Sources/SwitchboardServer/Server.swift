import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif
import SwitchboardPluginAPI
import SwitchboardTransport

/// A Switchboard server: libuv loops (one by default, ``ServerConfiguration/loops``) serving binary and
/// text-mode clients on one port.
///
/// Create it, attach channels (``MethodChannel``, ``EventChannel``, ``BasicMessageChannel``), then
/// `try await` ``run(handlingSignals:)``, or ``start()`` it and go on.
public final class Server: Sendable {
    /// The settings it was made with.
    public let configuration: ServerConfiguration
    /// Its loops (``ServerConfiguration/loops``).
    let group: LoopGroup
    /// Loop 0's core: the one a driven server has, and the one that accepts connections.
    var core: LoopBound<ServerCore> { group.cores[0] }
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
        precondition(configuration.loops >= 1, "a server runs at least one loop")
        // As documented (and as `serve --max-frame` checks): a frame forwarded to a holder adds its channel
        // name (up to 64 KiB) to a payload of up to this, and its length must still fit the header's 32 bits.
        precondition(configuration.maxFrame <= 1 << 30, "maxFrame is at most 1 GiB")
        self.configuration = configuration
        var cores: [ServerCore] = []
        let quota = ConnectionQuota(configuration)
        for index in 0..<configuration.loops {
            var logger = logger
            if configuration.loops > 1 { logger[metadataKey: "loop"] = "\(index)" }
            cores.append(try ServerCore(config: configuration, logger: logger, index: index, loops: configuration.loops, quota: quota))
        }
        group = LoopGroup(cores: cores, metrics: configuration.metrics)
        for core in cores { core.group = group }
    }

    /// A server that never ran still holds its loops' handles and file descriptors, and set-up jobs
    /// that capture its cores: both go here. (One that ran released everything when it stopped.)
    deinit {
        for bound in group.cores where !bound.loop.hasStarted {
            let core = bound.value
            core.eventLoop.finishDriving(beforeClosing: core.releaseAll)
        }
    }

    /// The port it listens on, once running (useful with port 0).
    public var port: Int { boundPort.load(ordering: .acquiring) }
    /// The TLS port it listens on, once running; 0 without TLS.
    public var tlsPort: Int { boundTLSPort.load(ordering: .acquiring) }

    /// Runs `body` with each loop's core on its loop thread (queued until the loop runs).
    func onEveryLoop(_ body: @escaping @Sendable (ServerCore) -> Void) {
        for core in group.cores { core.onLoop(body) }
    }

    /// Loads `plugin` (see ``Plugin``): its stages join the pipeline after those loaded before, then, if it
    /// is a ``ServerPlugin``, its ``ServerPlugin/didLoad(into:)`` runs. Before the server runs only: the
    /// pipeline is fixed while it serves. Every loop runs the same stages.
    public func load(_ plugin: any Plugin) {
        precondition(!core.loop.hasStarted, "plugins are loaded before the server runs")
        for core in group.cores { core.value.pipeline.load(plugin) }
        (plugin as? any ServerPlugin)?.didLoad(into: self)
    }

    /// Runs `body` on loop 0's thread each time the process receives `signal` (such as SIGHUP), from
    /// when the loop starts.
    public func onSignal(_ signal: Int32, _ body: @escaping @Sendable () -> Void) {
        core.onLoop { $0.watch(signal, body) }
    }

    /// Binds and serves until shut down, every loop on a thread of its own; returns after a graceful stop
    /// of every loop. The calling task only waits, so the caller's actor stays free: from top-level code
    /// (the main actor) the `Task { … }`s started before it keep running. Cancelling the calling task
    /// begins a graceful shutdown, as ``shutdown()`` does.
    public func run(handlingSignals: Bool = false) async throws(UVError) {
        try bindAll()
        if handlingSignals { try core.value.handleSignals() }
        logListening()
        for core in group.cores { runOnThread(core) }
        await withTaskCancellationHandler { await waitUntilStopped() } onCancel: { shutdown() }
    }

    /// Binds and serves until shut down, loop 0 on the calling thread and every other loop on a thread
    /// of its own; returns after a graceful stop of every loop.
    ///
    /// It holds the calling thread all that time: called on the main thread, it holds the main actor too,
    /// and no `Task { … }` of top-level code ever runs. It is for programs that keep loop 0 on the main
    /// thread on purpose (`switchboard serve`, which valgrind follows there); everyone else awaits
    /// ``run(handlingSignals:)``. The compiler refuses it in async code.
    @available(*, noasync, message: "it holds the thread, and the main actor with it: use try await run(handlingSignals:)")
    public func runOnCurrentThread(handlingSignals: Bool = false) throws(UVError) {
        try bindAll()
        let core = self.core.value
        if handlingSignals { try core.handleSignals() }
        logListening()
        for sibling in group.cores.dropFirst() { runOnThread(sibling) }
        core.eventLoop.run(beforeClosing: core.releaseAll)
        group.loopStopped()
        while group.stoppedLoops < group.count { usleep(1000) }  // the others stopped first (loop 0 waited for them)
        markStopped()
    }

    private func logListening() {
        let core = self.core.value
        core.logger.notice("listening on \(configuration.host):\(port)\(configuration.loops > 1 ? " with \(configuration.loops) loops" : "")")
        if let tlsPort = core.tlsPort { core.logger.notice("listening for TLS on \(configuration.host):\(tlsPort)") }
    }

    /// Runs `body` on loop 0's thread once the server listens, when ``port`` and ``tlsPort`` are known
    /// (which matters with port 0); soon after, on that thread, if it already listens.
    public func whenListening(_ body: @escaping @Sendable () -> Void) {
        core.onLoop { _ in body() }
    }

    /// Binds, then serves on new threads (one per loop); returns the bound port.
    @discardableResult
    public func start() throws(UVError) -> Int {
        try bindAll()
        for core in group.cores { runOnThread(core) }
        return port
    }

    /// Binds loop 0's listeners and readies every loop.
    private func bindAll() throws(UVError) {
        let port = try core.value.bind()
        for sibling in group.cores.dropFirst() { try sibling.value.startServing() }
        boundPort.store(port, ordering: .releasing)
        boundTLSPort.store(core.value.tlsPort ?? 0, ordering: .releasing)
    }

    private func runOnThread(_ core: LoopBound<ServerCore>) {
        let group = self.group
        startThread { [self] in
            let owned = core.value
            owned.eventLoop.run(beforeClosing: owned.releaseAll)
            if group.loopStopped() == group.count { markStopped() }
        }
    }

    // MARK: Driven by the caller

    /// Starts serving without a listener, with the loop driven by the calling thread through
    /// ``runOnce()``: for connections over in-memory transports (tests, fuzzers) and for embedders
    /// that bring their own transports to ``accept(_:)``. End with ``finishDriven()``. One loop only.
    public func startDriven() throws(UVError) { try startDriven(manualClock: false) }

    /// ``startDriven()``; with `manualClock`, the server's time stands still until
    /// ``advanceTime(byMs:turn:)`` moves it (for SwitchboardTesting's `EmbeddedServer`).
    package func startDriven(manualClock: Bool) throws(UVError) {
        precondition(group.count == 1, "a driven server runs one loop")
        if manualClock { try core.value.eventLoop.useManualClock() }
        try core.value.startPerTurnWork()
    }

    /// Moves a manual clock (``startDriven(manualClock:)``) on, firing the timers due on the way in
    /// order: see ``EventLoop/advanceTime(byMs:turn:)``.
    package func advanceTime(byMs milliseconds: UInt64, turn: () -> Void) {
        core.value.eventLoop.advanceTime(byMs: milliseconds, turn: turn)
    }

    /// Runs what is ready now (jobs from other threads, due timers, the per-turn flush) without
    /// blocking. The calling thread owns the loop from the first call on.
    public func runOnce() {
        core.value.eventLoop.runOnce()
    }

    /// Serves a connection over `transport` on loop 0 (never dealt round), as if its listener had accepted
    /// it. Loop 0's thread only.
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

    /// Begins a graceful shutdown (wire-v1 section 7c) of every loop. Callable from any thread.
    public func shutdown() {
        onEveryLoop { $0.beginShutdown() }
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

/// A plugin that needs the server it is loaded into: to attach channels of its own, say. The plugin API
/// (SwitchboardPluginAPI) cannot name the server, which sits above it; this refinement can.
public protocol ServerPlugin: Plugin {
    /// Runs once, on the loading thread, when ``Server/load(_:)`` loads the plugin.
    func didLoad(into server: Server)
}
