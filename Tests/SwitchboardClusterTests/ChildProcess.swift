import Foundation
#if canImport(Glibc)
import Glibc
#endif
import SwitchboardTesting

/// A child process started with `posix_spawn`, for nats-server and `switchboard` nodes. Not Foundation's
/// `Process`: on Linux its `run()` (Swift 6.3.1) can crash reading `/proc/self/fd`, more often the more
/// descriptors are open (swift-corelibs-foundation #5472); a test process with several loops per server
/// has many. The child gets no descriptor of this process but its standard output and error.
final class ChildProcess {
    let pid: pid_t
    /// The read end of the child's standard error, when it was asked for (its standard output, and
    /// otherwise its standard error, go to /dev/null).
    let standardError: Int32?
    private var exited = false

    init(_ path: String, _ arguments: [String], capturingStandardError: Bool = false) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        var ends: [Int32] = [-1, -1]
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        if capturingStandardError {
            guard pipe(&ends) == 0 else { throw TestFailure("pipe failed: \(errno)") }
            posix_spawn_file_actions_adddup2(&actions, ends[1], 2)
        } else {
            posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0)
        }
        guard Self.addCloseFrom(&actions, 3) == 0 else { throw TestFailure("posix_spawn_file_actions_addclosefrom_np is missing") }
        let argv: [UnsafeMutablePointer<CChar>?] = ([path] + arguments).map { strdup($0) } + [nil]
        defer { for argument in argv { free(argument) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, path, &actions, nil, argv, environ)
        if capturingStandardError { close(ends[1]) }
        guard rc == 0 else {
            if capturingStandardError { close(ends[0]) }
            throw TestFailure("cannot start \(path): \(String(cString: strerror(rc)))")
        }
        self.pid = pid
        standardError = capturingStandardError ? ends[0] : nil
    }

    /// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34 on), which Swift's Glibc module does not
    /// declare: the child closes every descriptor from 3 on.
    private static let addCloseFrom: @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32 = {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else {
            return { _, _ in -1 }
        }
        return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
    }()

    func signal(_ signal: Int32) { kill(pid, signal) }

    /// Waits for the child to exit (at once if it has).
    func waitUntilExit() {
        guard !exited else { return }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0, errno == EINTR {}
        exited = true
    }

    /// Stops the child (SIGTERM, or `signal`) and waits for it.
    func stop(_ signal: Int32 = SIGTERM) {
        guard !exited else { return }
        self.signal(signal)
        waitUntilExit()
    }

    deinit {
        stop(SIGKILL)
        if let standardError { close(standardError) }
    }
}
