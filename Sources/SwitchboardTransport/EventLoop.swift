import CLibUV
import Synchronization

#if canImport(Glibc)
import Glibc
#endif

/// One libuv loop and the thread that runs it. Everything but ``handle`` is loop-thread only.
public final class EventLoop {
    let loop: UnsafeMutablePointer<uv_loop_t>
    /// The thread-safe way in: ``LoopHandle/execute(_:)`` runs work on this loop.
    public let handle: LoopHandle
    /// One read buffer for every connection: libuv allocates and delivers one read at a time on this thread.
    let readBuffer: UnsafeMutableRawPointer
    static let readBufferSize = 64 * 1024
    private var wakeup: AsyncWakeup!

    /// Makes a loop; call ``run()`` on the thread that will own it.
    public init() throws(UVError) {
        signal(SIGPIPE, SIG_IGN)  // a write to a vanished peer must be an EPIPE error, not the end of the process
        loop = .allocate(capacity: 1)
        let rc = uv_loop_init(loop)
        guard rc == 0 else { loop.deallocate(); throw UVError(code: rc, operation: "uv_loop_init") }
        readBuffer = .allocate(byteCount: EventLoop.readBufferSize, alignment: 16)
        handle = LoopHandle()
        wakeup = try AsyncWakeup(loop: self, handle: handle)
        loop.pointee.data = Unmanaged.passUnretained(self).toOpaque()
    }

    /// Milliseconds of the loop's cached clock.
    public var now: UInt64 { uv_now(loop) }

    /// A monotonic clock in nanoseconds, for measuring latency.
    public static func nanoseconds() -> UInt64 { uv_hrtime() }

    /// Runs until ``stop()``, then closes every remaining handle and the loop itself.
    public func run() {
        handle.markLoopThread()
        for job in handle.takeJobs() { job() }  // what was set up before the loop ran comes before any I/O
        uv_run(loop, UV_RUN_DEFAULT)
        handle.shutDown()
        uv_walk(loop, { handle, _ in
            guard let handle, let data = handle.pointee.data else { return }
            Unmanaged<LoopResource>.fromOpaque(data).takeUnretainedValue().close()
        }, nil)
        uv_run(loop, UV_RUN_DEFAULT)  // lets every close callback run
        uv_loop_close(loop)
        loop.deallocate()
        readBuffer.deallocate()
    }

    /// Makes ``run()`` return after the current iteration.
    public func stop() { uv_stop(loop) }
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
    private let loopThread = Atomic<UInt>(0)
    private let running = Atomic<Bool>(false)

    init() {}

    /// Runs `job` on the loop thread. Returns false (and drops the job) once the loop has shut down.
    @discardableResult
    public func execute(_ job: @escaping @Sendable () -> Void) -> Bool {
        state.withLock { s in
            guard let address = s.wakeup, let wakeup = UnsafeMutablePointer<uv_async_t>(bitPattern: address) else {
                return false
            }
            s.jobs.append(job)
            if s.jobs.count == 1 { uv_async_send(wakeup) }  // coalesced: one wakeup drains them all
            return true
        }
    }

    /// Whether the caller is the loop's thread.
    public var isInLoopThread: Bool { loopThread.load(ordering: .relaxed) == UInt(pthread_self()) }

    /// Whether ``EventLoop/run()`` has begun; before that, the thread setting the loop up owns it.
    public var hasStarted: Bool { running.load(ordering: .acquiring) }

    func markLoopThread() {
        loopThread.store(UInt(pthread_self()), ordering: .relaxed)
        running.store(true, ordering: .releasing)
    }

    func attach(_ wakeup: UnsafeMutablePointer<uv_async_t>) {
        let address = UInt(bitPattern: wakeup)
        state.withLock { $0.wakeup = address }
    }

    func shutDown() { state.withLock { $0.wakeup = nil; $0.jobs = [] } }

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
            guard let owner = LoopResource.owner(UnsafeMutableRawPointer(async), as: AsyncWakeup.self) else { return }
            for job in owner.handleRef.takeJobs() { job() }
        }
        guard rc == 0 else { discard(); throw UVError(code: rc, operation: "uv_async_init") }
        adopt()
        uv_unref(self.handle)  // the loop runs until stopped, not until this handle goes
        handle.attach(async)
    }

    override func willClose() { handleRef.shutDown() }
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
/// builds) that the caller is the loop thread, or that the loop has not started yet (set-up, on the one
/// thread that builds it). The value itself never crosses threads while the loop runs.
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
        assert(loop.isInLoopThread || !loop.hasStarted, "loop-bound value touched off the loop thread")
        return storage
    }
}
