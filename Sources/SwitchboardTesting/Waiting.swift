#if canImport(Glibc)
import Glibc
#endif

/// Checks `condition` every 5 ms until it holds (true) or `seconds` have passed (false): for what
/// another thread, the kernel or another process does, which no clock of the test's can hurry. Time a
/// server takes on purpose is a test's to move instead (``EmbeddedServer/advanceTime(byMs:)``).
public func eventually(_ seconds: Double = 10, _ condition: () async throws -> Bool) async throws -> Bool {
    let deadline = ContinuousClock.now + .milliseconds(Int64(seconds * 1000))
    while ContinuousClock.now < deadline {
        if try await condition() { return true }
        try await Task.sleep(for: .milliseconds(5))
    }
    return try await condition()
}

/// ``eventually(_:_:)`` for synchronous code: blocks the calling thread between checks.
public func waitUntil(_ seconds: Double = 10, _ condition: () throws -> Bool) rethrows -> Bool {
    let deadline = ContinuousClock.now + .milliseconds(Int64(seconds * 1000))
    while ContinuousClock.now < deadline {
        if try condition() { return true }
        usleep(1000)
    }
    return try condition()
}
