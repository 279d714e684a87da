import CLibUV

/// Owns the memory of one libuv handle (the base of every transport handle type).
///
/// Lifetime rule (libuv's): the handle's `data` holds a +1 retain on its owner from init until the close
/// callback, and only the close callback frees the handle's memory. Subclasses call `adopt()` right after
/// a successful `uv_*_init`; if init fails they call `discard()` instead (no close callback will run).
public class LoopResource {
    let raw: UnsafeMutableRawPointer
    private(set) var isClosing = false

    /// Memory for a handle of `type`, zeroed.
    init(type: uv_handle_type) {
        let size = uv_handle_size(type)
        raw = .allocate(byteCount: size, alignment: 16)
        raw.initializeMemory(as: UInt8.self, repeating: 0, count: size)
    }

    var handle: UnsafeMutablePointer<uv_handle_t> { raw.assumingMemoryBound(to: uv_handle_t.self) }

    /// Hands libuv a +1 on `self`, released by the close callback.
    func adopt() { handle.pointee.data = Unmanaged.passRetained(self).toOpaque() }

    /// Frees memory for a handle whose init failed: nothing was registered with the loop.
    func discard() { raw.deallocate() }

    /// Called once, just before `uv_close`; subclasses drop their callbacks here.
    func willClose() {}

    /// Closes the handle; its memory and the +1 on `self` go in the close callback. Idempotent.
    func close() {
        guard !isClosing else { return }
        isClosing = true
        willClose()
        uv_close(handle) { handle in
            guard let handle, let data = handle.pointee.data else { return }
            let owner = Unmanaged<LoopResource>.fromOpaque(data).takeRetainedValue()
            handle.pointee.data = nil
            owner.raw.deallocate()
        }
    }

    /// Runs `body` with the owner of a handle, from one of the handle's callbacks, lent without a retain
    /// (holding it cost a retain and a release per callback: per read, and per loop turn). Sound: libuv's
    /// +1 keeps the owner alive until the close callback, which libuv runs in its close phase, after the
    /// callback that closed the handle has returned; and only the owner, of type `T`, installs the
    /// handle's callbacks and its `data`.
    static func withOwner<T: LoopResource>(_ handle: UnsafeMutableRawPointer?, as: T.Type, _ body: (T) -> Void) {
        guard let handle, let data = handle.assumingMemoryBound(to: uv_handle_t.self).pointee.data else { return }
        assert(Unmanaged<LoopResource>.fromOpaque(data).takeUnretainedValue() is T, "a handle's callback named another owner type")
        Unmanaged<T>.fromOpaque(data)._withUnsafeGuaranteedRef(body)
    }
}

/// A one-shot or repeating timer on the loop (kept by the loop's manual clock if it has one, see
/// ``EventLoop/useManualClock()``).
public final class Timer: LoopResource {
    private var callback: (() -> Void)?
    private let manualClock: ManualClock?

    /// Makes a stopped timer.
    public init(loop: EventLoop) throws(UVError) {
        manualClock = loop.manualClock
        super.init(type: UV_TIMER)
        let rc = uv_timer_init(loop.loop, raw.assumingMemoryBound(to: uv_timer_t.self))
        guard rc == 0 else { discard(); throw UVError(code: rc, operation: "uv_timer_init") }
        adopt()
    }

    /// Runs `body` after `milliseconds`, then every `repeatMilliseconds` if that is not 0.
    public func start(after milliseconds: UInt64, repeat repeatMilliseconds: UInt64 = 0, _ body: @escaping () -> Void) {
        guard !isClosing else { return }
        callback = body
        if let manualClock { return manualClock.schedule(self, after: milliseconds, repeat: repeatMilliseconds) }
        uv_timer_start(raw.assumingMemoryBound(to: uv_timer_t.self), { timer in
            LoopResource.withOwner(UnsafeMutableRawPointer(timer), as: Timer.self) { $0.callback?() }
        }, milliseconds, repeatMilliseconds)
    }

    /// Stops the timer; it can be started again.
    public func stop() {
        guard !isClosing else { return }
        if let manualClock { return manualClock.unschedule(self) }
        uv_timer_stop(raw.assumingMemoryBound(to: uv_timer_t.self))
    }

    /// Stops and releases the timer.
    public func cancel() { close() }

    /// Runs the callback, as libuv does when the timer is due (for a manual clock).
    func fire() { callback?() }

    override func willClose() {
        callback = nil
        manualClock?.unschedule(self)
    }
}

/// Runs a callback once per loop iteration, just before the loop blocks for I/O (Redis's `beforeSleep`).
public final class BeforeSleep: LoopResource {
    private var callback: (() -> Void)?

    /// Starts calling `body` every iteration.
    public init(loop: EventLoop, _ body: @escaping () -> Void) throws(UVError) {
        super.init(type: UV_PREPARE)
        let prepare = raw.assumingMemoryBound(to: uv_prepare_t.self)
        let rc = uv_prepare_init(loop.loop, prepare)
        guard rc == 0 else { discard(); throw UVError(code: rc, operation: "uv_prepare_init") }
        adopt()
        callback = body
        uv_prepare_start(prepare) { prepare in
            LoopResource.withOwner(UnsafeMutableRawPointer(prepare), as: BeforeSleep.self) { $0.callback?() }
        }
        uv_unref(handle)  // never keeps the loop alive by itself
    }

    /// Stops calling back, for good.
    public func cancel() { close() }

    override func willClose() { callback = nil }
}

/// Calls back on the loop when the process receives a signal.
public final class SignalWatcher: LoopResource {
    private var callback: (() -> Void)?

    /// Watches `signal` (such as SIGINT).
    public init(loop: EventLoop, signal: Int32, _ body: @escaping () -> Void) throws(UVError) {
        super.init(type: UV_SIGNAL)
        let watcher = raw.assumingMemoryBound(to: uv_signal_t.self)
        let rc = uv_signal_init(loop.loop, watcher)
        guard rc == 0 else { discard(); throw UVError(code: rc, operation: "uv_signal_init") }
        adopt()
        callback = body
        let started = uv_signal_start(watcher, { watcher, _ in
            LoopResource.withOwner(UnsafeMutableRawPointer(watcher), as: SignalWatcher.self) { $0.callback?() }
        }, signal)
        if started < 0 { close(); throw UVError(code: started, operation: "uv_signal_start") }
        uv_unref(handle)
    }

    override func willClose() { callback = nil }
}
