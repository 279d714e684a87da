import Foundation
#if canImport(Glibc)
import Glibc
#endif
import SwitchboardTesting

/// A child process (``StartedProgram``) for nats-server and `switchboard` nodes, waited for and stopped
/// synchronously.
final class ChildProcess {
    let pid: pid_t
    /// The read end of the child's standard error, when it was asked for (its standard output, and
    /// otherwise its standard error, go to /dev/null).
    let standardError: Int32?
    private var exited = false

    init(_ path: String, _ arguments: [String], capturingStandardError: Bool = false) throws {
        let started = try StartedProgram(path, arguments, standardOutput: .discarded,
                                         standardError: capturingStandardError ? .pipe : .discarded)
        pid = started.pid
        standardError = started.standardError
    }

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
