import CLibUV
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// One libuv loop and the thread that runs it. Everything but ``handle`` is loop-thread only.
///
/// Making the first loop sets SIGPIPE to ignored for the whole process (once): libuv writes with
/// `write(2)`, and on Linux only that turns a write to a vanished peer into an `EPIPE` error instead of
/// the end of the process. Redis, NATS and nginx do the same.
public final class EventLoop {
    @usableFromInline let loop: UnsafeMutablePointer<uv_loop_t>
    /// The thread-safe way in: ``LoopHandle/execute(_:)`` runs work on this loop.
    public let handle: LoopHandle
    /// One read buffer for every connection: libuv allocates and delivers one read at a time on this thread.
    let readBuffer: UnsafeMutableRawPointer
    static let readBufferSize = 64 * 1024
    private var wakeup: AsyncWakeup!
    /// Set once the loop and its memory are gone (after ``run()``, or in `deinit` for a loop never run).
    private var isTornDown = false
    /// Whether libuv is running the loop on its thread now (see ``runLibUV(_:)``).
    private var isInsideLibUV = false
    /// Where ``now`` reads the time: libuv's cached clock (`uv_loop_t.time`, the field `uv_now` returns),
    /// or a ``ManualClock``'s. Two loads and no branch: cheaper than calling `uv_now`, and the same for
    /// either clock.
    @usableFromInline let clockSource: UnsafeMutablePointer<UnsafeMutablePointer<UInt64>>
    /// The clock a test moves, once ``useManualClock()`` made one; nil on every loop that serves for real.
    private(set) var manualClock: ManualClock?

    private static let ignoreSIGPIPE: Void = { signal(SIGPIPE, SIG_IGN) }()

    /// Makes a loop; call ``run()`` on the thread that will own it.
    public init() throws(UVError) {
        Self.ignoreSIGPIPE
        loop = .allocate(capacity: 1)
        let rc = uv_loop_init(loop)
        guard rc == 0 else { loop.deallocate(); throw UVError(code: rc, operation: "uv_loop_init") }
        readBuffer = .allocate(byteCount: EventLoop.readBufferSize, alignment: 16)
        clockSource = .allocate(capacity: 1)
        clockSource.initialize(to: (UnsafeMutableRawPointer(loop) + MemoryLayout<uv_loop_t>.offset(of: \.time)!)
            .assumingMemoryBound(to: UInt64.self))
        handle = LoopHandle()
        wakeup = try AsyncWakeup(loop: self, handle: handle)
        loop.pointee.data = Unmanaged.passUnretained(self).toOpaque()
    }

    /// A loop that never ran (its owner failed to start, say to bind a port) still holds file
    /// descriptors and handles: they go here.
    deinit {
        if !isTornDown { tearDown() }
        clockSource.deallocate()
    }

    /// Milliseconds of the loop's cached clock (or of its manual clock). Inlinable: rate limits read it
    /// per request.
    @inlinable public var now: UInt64 { clockSource.pointee.pointee }

    /// Makes this loop keep its own time, which stands still until ``advanceTime(byMs:turn:)`` moves
    /// it, and keep its ``Timer``s in a list of its own that fires by that time (as swift-nio's
    /// `EmbeddedEventLoop` does): for loops driven by ``runOnce()`` in tests about time. The clock
    /// starts at the current ``now``. Call it before the loop runs and before making any timer.
    package func useManualClock() throws(UVError) {
        precondition(!handle.hasStarted && manualClock == nil, "EventLoop.useManualClock: the loop has begun")
        // libuv runs a turn only while some handle keeps the loop alive, which the server's started
        // timers did: this one does it now (it is due long after any test).
        try Timer(loop: self).start(after: UInt64.max / 2) {}
        let clock = ManualClock(startingAt: now)
        manualClock = clock
        clockSource.pointee = clock.time
    }

    /// Moves the manual clock (``useManualClock()``) on by `milliseconds`. On the way it stops at each
    /// time a timer is due, in order, and calls `turn` there, which must run the loop once
    /// (``runOnce()`` fires the timers due); at the end it calls `turn` once more.
    package func advanceTime(byMs milliseconds: UInt64, turn: () -> Void) {
        guard let clock = manualClock else { preconditionFailure("EventLoop.advanceTime: the loop has no manual clock") }
        let target = clock.time.pointee + milliseconds
        while let due = clock.nextDue, due <= target {
            clock.time.pointee = max(clock.time.pointee, due)
            turn()
        }
        clock.time.pointee = target
        turn()
    }

    /// A monotonic clock in nanoseconds, for measuring latency.
    public static func nanoseconds() -> UInt64 { uv_hrtime() }

    /// Runs until ``stop()``, then runs every job still accepted, then `beforeClosing` (the owner's last
    /// word on the loop thread, with the loop still alive: release what holds handles), closes every
    /// remaining handle and the loop itself. The calling thread owns the loop until this returns.
    public func run(beforeClosing: () -> Void = {}) {
        precondition(!isTornDown, "EventLoop.run: the loop has been torn down")
        precondition(manualClock == nil, "EventLoop.run: a loop with a manual clock is driven by runOnce()")
        handle.markLoopThread()
        for job in handle.takeJobs() { job() }  // what was set up before the loop ran comes before any I/O
        runLibUV(UV_RUN_DEFAULT)
        tearDown(beforeClosing: beforeClosing)
        handle.markFinished()
    }

    /// Runs what is ready now without blocking (timers due, I/O ready, jobs, the per-turn callbacks),
    /// on the calling thread, which owns the loop from the first call on: for callers that drive the
    /// loop themselves, such as tests with in-memory transports. End with ``finishDriving()``.
    public func runOnce() {
        precondition(!isTornDown, "EventLoop.runOnce: the loop has been torn down")
        if !handle.hasStarted { handle.markLoopThread() }
        for job in handle.takeJobs() { job() }
        manualClock?.fireDueTimers()
        runLibUV(UV_RUN_NOWAIT)
    }

    /// Runs libuv's loop. Never from inside one of its callbacks: a nested run would call close callbacks
    /// early, freeing a handle's owner that the outer callback holds lent (``LoopResource/withOwner(_:as:_:)``).
    private func runLibUV(_ mode: uv_run_mode) {
        precondition(!isInsideLibUV, "EventLoop: the loop was run again from inside one of its own callbacks")
        isInsideLibUV = true
        defer { isInsideLibUV = false }
        uv_run(loop, mode)
    }

    /// Ends a loop driven by ``runOnce()`` (or one that never ran): runs the jobs still accepted, then
    /// `beforeClosing`, then closes everything, as ``run(beforeClosing:)`` does.
    public func finishDriving(beforeClosing: () -> Void = {}) {
        guard !isTornDown else { return }
        tearDown(beforeClosing: beforeClosing)
        handle.markFinished()
    }

    /// Makes ``run()`` return after the current iteration.
    public func stop() { uv_stop(loop) }

    /// Closes the door to new jobs, runs the ones already accepted (``LoopHandle/execute(_:)`` promised
    /// they would run), closes every handle, lets their close callbacks run, and frees the loop.
    private func tearDown(beforeClosing: () -> Void = {}) {
        precondition(!isInsideLibUV, "EventLoop: the loop was ended from inside one of its own callbacks")
        isTornDown = true
        for job in handle.shutDown() { job() }
        beforeClosing()
        manualClock?.forgetTimers()
        var rc: Int32 = 0
        for _ in 0..<16 {
            uv_walk(loop, { handle, _ in
                guard let handle, let data = handle.pointee.data else { return }
                Unmanaged<LoopResource>.fromOpaque(data).takeUnretainedValue().close()
            }, nil)
            runLibUV(UV_RUN_DEFAULT)  // lets every close callback (and cancelled request callback) run
            rc = uv_loop_close(loop)
            if rc != UV_EBUSY.rawValue { break }
        }
        readBuffer.deallocate()
        // Still busy: some request never finished. Its callback may yet touch the loop, so the loop's
        // memory is kept (a bounded, one-off leak) rather than freed under it.
        guard rc == 0 else {
            let message = "switchboard: \(UVError(code: rc, operation: "uv_loop_close")); loop memory kept\n"
            _ = message.withCString { write(2, $0, strlen($0)) }
            return
        }
        loop.deallocate()
    }
}

/// The time and the timers of a loop whose clock the caller moves (``EventLoop/useManualClock()``).
/// Timers fire in the order libuv fires them: by due time, then by the order they were started.
final class ManualClock {
    /// Milliseconds; ``EventLoop/now`` reads it.
    let time: UnsafeMutablePointer<UInt64>
    private struct Entry {
        let due: UInt64
        let started: UInt64
        let interval: UInt64
        let timer: Timer
    }
    private var entries: [Entry] = []
    /// How many timers have been started (the `started` of the latest).
    private var starts: UInt64 = 0

    init(startingAt now: UInt64) {
        time = .allocate(capacity: 1)
        time.initialize(to: now)
    }

    deinit { time.deallocate() }

    /// Starts (or restarts) `timer`: due `milliseconds` from now, then every `interval` if that is not 0.
    func schedule(_ timer: Timer, after milliseconds: UInt64, repeat interval: UInt64) {
        unschedule(timer)
        starts += 1
        entries.append(Entry(due: time.pointee + milliseconds, started: starts, interval: interval, timer: timer))
    }

    func unschedule(_ timer: Timer) { entries.removeAll { $0.timer === timer } }

    /// When the next timer is due, if any is started.
    var nextDue: UInt64? { entries.map(\.due).min() }

    /// Fires, in order, the timers due by now that were started before this call; a repeating one is
    /// started again first (as `uv_timer_again` does), so it fires next time, not in this pass.
    func fireDueTimers() {
        let startedBefore = starts
        while let index = nextIndex(dueBy: time.pointee, startedBy: startedBefore) {
            let entry = entries.remove(at: index)
            if entry.interval > 0 { schedule(entry.timer, after: entry.interval, repeat: entry.interval) }
            entry.timer.fire()
        }
    }

    private func nextIndex(dueBy now: UInt64, startedBy last: UInt64) -> Int? {
        var best: Int?
        for (index, entry) in entries.enumerated() where entry.due <= now && entry.started <= last {
            if let b = best, (entries[b].due, entries[b].started) <= (entry.due, entry.started) { continue }
            best = index
        }
        return best
    }

    /// Drops every timer (they hold their callbacks): the loop is closing.
    func forgetTimers() { entries = [] }
}

/// The thread-safe door into a loop: a Mutex-guarded job list plus a `uv_async_t` whose callback drains it.
///
/// The async handle's pointer lives inside the Mutex and is cleared before the handle closes, so a
/// send can never race the close; that is also what makes this class `Sendable` without `@unchecked`.
public final class LoopHandle: Sendable {
    private struct State {
        /// The `uv_async_t`'s address (a plain integer keeps `State` Sendable); nil once it is closing.
        var wakeup: UInt?
        var jobs: [@Sendable () -> Void] = []
    }
    private let state = Mutex(State())
    /// Jobs accepted so far: each job's number in the order they run (see ``enqueue(_:)``).
    private let accepted = Atomic<UInt64>(0)
    /// The owning thread's id while the loop is running, 0 before and after: a thread created later
    /// may get the same `pthread_t`, so a finished loop's id must not linger.
    @usableFromInline let loopThread = Atomic<UInt>(0)
    private let started = Atomic<Bool>(false)
    private let finished = Atomic<Bool>(false)

    init() {}

    /// Runs `job` on the loop thread (or, for a loop that never ran, on the thread that tears it down).
    /// True means it will run, before the loop is torn down; false (the job dropped) means the loop has
    /// shut down.
    @discardableResult
    public func execute(_ job: @escaping @Sendable () -> Void) -> Bool { enqueue(job) != nil }

    /// ``execute(_:)`` that returns the job's number: jobs run in the order of their numbers, and
    /// ``acceptedJobs`` tells whether any job was accepted after it. Nil if the loop has shut down.
    public func enqueue(_ job: @escaping @Sendable () -> Void) -> UInt64? {
        state.withLock { s in
            guard let address = s.wakeup, let wakeup = UnsafeMutablePointer<uv_async_t>(bitPattern: address) else {
                return nil
            }
            s.jobs.append(job)
            if s.jobs.count == 1 { uv_async_send(wakeup) }  // coalesced: one wakeup drains them all
            return accepted.add(1, ordering: .relaxed).newValue
        }
    }

    /// How many jobs have been accepted so far (the number of the latest).
    public var acceptedJobs: UInt64 { accepted.load(ordering: .relaxed) }

    /// Whether the caller is the loop's thread. Inlinable: answering a call asks it, and called out of
    /// line it made the caller retain the handle around the call.
    @inlinable public var isInLoopThread: Bool { loopThread.load(ordering: .relaxed) == UInt(pthread_self()) }

    /// Whether ``EventLoop/run()`` (or ``EventLoop/runOnce()``) has begun; before that, the thread
    /// setting the loop up owns it.
    public var hasStarted: Bool { started.load(ordering: .acquiring) }

    /// Whether the loop has begun and not finished: only then does one thread own what it owns.
    public var isRunning: Bool { hasStarted && !finished.load(ordering: .acquiring) }

    func markLoopThread() {
        loopThread.store(UInt(pthread_self()), ordering: .relaxed)
        started.store(true, ordering: .releasing)
    }

    /// The loop is gone: no thread is its thread any more.
    func markFinished() {
        loopThread.store(0, ordering: .relaxed)
        finished.store(true, ordering: .releasing)
    }

    func attach(_ wakeup: UnsafeMutablePointer<uv_async_t>) {
        let address = UInt(bitPattern: wakeup)
        state.withLock { $0.wakeup = address }
    }

    /// Closes the door: from now on ``execute(_:)`` returns false. Returns the jobs already accepted,
    /// which the caller must run.
    func shutDown() -> [@Sendable () -> Void] {
        state.withLock { s in
            s.wakeup = nil
            defer { s.jobs = [] }
            return s.jobs
        }
    }

    func takeJobs() -> [@Sendable () -> Void] {
        state.withLock { s in
            defer { s.jobs = [] }
            return s.jobs
        }
    }
}

/// The `uv_async_t` behind a ``LoopHandle``.
final class AsyncWakeup: LoopResource {
    private let handleRef: LoopHandle

    init(loop: EventLoop, handle: LoopHandle) throws(UVError) {
        handleRef = handle
        super.init(type: UV_ASYNC)
        let async = raw.assumingMemoryBound(to: uv_async_t.self)
        let rc = uv_async_init(loop.loop, async) { async in
            LoopResource.withOwner(UnsafeMutableRawPointer(async), as: AsyncWakeup.self) { owner in
                for job in owner.handleRef.takeJobs() { job() }
            }
        }
        guard rc == 0 else { discard(); throw UVError(code: rc, operation: "uv_async_init") }
        adopt()
        uv_unref(self.handle)  // the loop runs until stopped, not until this handle goes
        handle.attach(async)
    }

    /// The tear-down closes the door (and runs the jobs) before closing this handle; should anything
    /// close it earlier, the jobs still run rather than vanish.
    override func willClose() {
        for job in handleRef.shutDown() { job() }
    }
}

/// Starts a thread running `body`, for callers that want a loop off the main thread.
public func startThread(_ body: @escaping @Sendable () -> Void) {
    final class Box { let body: @Sendable () -> Void; init(_ body: @escaping @Sendable () -> Void) { self.body = body } }
    var thread = pthread_t()
    let box = Unmanaged.passRetained(Box(body)).toOpaque()
    let rc = pthread_create(&thread, nil, { arg in
        Unmanaged<Box>.fromOpaque(arg!).takeRetainedValue().body()
        return nil
    }, box)
    precondition(rc == 0, "pthread_create failed: \(rc)")
    pthread_detach(thread)
}

/// A value that only the loop's thread may touch, carried inside a `Sendable` object.
///
/// `@unchecked Sendable` is sound because every access goes through ``value``, which checks (in debug
/// builds) that the caller is the loop thread, or that the loop is not running: before it starts (set-up,
/// on the one thread that builds it) or after it has finished (tear-down, on the thread that ran it).
/// The value itself never crosses threads while the loop runs.
public struct LoopBound<Value>: @unchecked Sendable {
    private let storage: Value
    /// The loop that owns the value.
    public let loop: LoopHandle

    /// Wraps `value` for `loop`.
    public init(_ value: Value, loop: LoopHandle) {
        storage = value
        self.loop = loop
    }

    /// The value; loop thread only.
    public var value: Value {
        assert(loop.isInLoopThread || !loop.isRunning, "loop-bound value touched off the loop thread")
        return storage
    }

    /// The value, moved out of the wrapper (no retain where ``value`` would copy it); loop thread only.
    /// Public, not package: a package method is not inlined into another module, and this one must be,
    /// or the move costs a call and a retain (measured: 2 atomics and 140 instructions per rpc call).
    public consuming func take() -> Value {
        assert(loop.isInLoopThread || !loop.isRunning, "loop-bound value touched off the loop thread")
        return storage
    }
}
