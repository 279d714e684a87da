#if canImport(Glibc)
import Glibc
#endif
import Synchronization
import SwitchboardTransport

/// Checks `condition` until it holds (true) or `seconds` have passed (false), every 5 ms unless
/// `every` says otherwise: for what another thread, the kernel or another process does, which no clock
/// of the test's can hurry. Time a server takes on purpose is a test's to move instead
/// (``EmbeddedServer/advanceTime(byMs:)``).
public func eventually(_ seconds: Double = 10, every interval: Duration = .milliseconds(5),
                       _ condition: () async throws -> Bool) async throws -> Bool {
    let deadline = ContinuousClock.now + .milliseconds(Int64(seconds * 1000))
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try await Task.sleep(for: interval)
    }
    return try await condition()
}

/// Runs `body` on a thread of its own and waits for it, up to 10 s: false if it did not finish. An
/// embedded server's loop belongs to the (synchronous) test's thread, and an async test may hop threads,
/// so producer threads are real ones.
public func finishesOnAnotherThread(_ body: @escaping @Sendable () -> Void) -> Bool {
    let done = Atomic<Bool>(false)
    startThread {
        body()
        done.store(true, ordering: .releasing)
    }
    return waitUntil { done.load(ordering: .acquiring) }
}

/// ``eventually(_:every:_:)`` for synchronous code: blocks the calling thread between checks.
public func waitUntil(_ seconds: Double = 10, _ condition: () throws -> Bool) rethrows -> Bool {
    let deadline = ContinuousClock.now + .milliseconds(Int64(seconds * 1000))
    while ContinuousClock.now < deadline {
        if try condition() { return true }
        usleep(1000)
    }
    return try condition()
}

/// Returns once the calling task is cancelled (at once if it already is): for a handler that never
/// answers by itself.
public func untilCancelled() async {
    let waiter = Mutex<(continuation: CheckedContinuation<Void, Never>?, isCancelled: Bool)>((nil, false))
    await withTaskCancellationHandler {
        await withCheckedContinuation { continuation in
            let cancelled = waiter.withLock { state in
                if !state.isCancelled { state.continuation = continuation }
                return state.isCancelled
            }
            if cancelled { continuation.resume() }
        }
    } onCancel: {
        let continuation = waiter.withLock { state in
            state.isCancelled = true
            defer { state.continuation = nil }
            return state.continuation
        }
        continuation?.resume()
    }
}
