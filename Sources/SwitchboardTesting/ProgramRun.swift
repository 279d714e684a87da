#if canImport(Glibc)
import Glibc
#endif

/// An executable of this package (`switchboard`, an example) run as a user runs it: a process of its
/// own (``StartedProgram``), its standard output and error read through pipes, its exit status checked.
public final class ProgramRun {
    /// The process id.
    public let pid: pid_t
    private let pipes: [Int32]  // the read ends of standard output and standard error
    private var buffers: [[UInt8]] = [[], []]
    private var status: Int32?

    /// The stream a line is read from.
    public enum Stream: Int { case standardOutput = 0, standardError = 1 }

    /// The path of `name` built beside the running test bundle (`.build/debug/NAME`).
    public static func builtExecutable(_ name: String) -> String {
        var path = [CChar](repeating: 0, count: 4096)
        let count = readlink("/proc/self/exe", &path, path.count - 1)
        let exe = count > 0 ? String(decoding: path[0..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self) : ""
        return String(exe[..<(exe.lastIndex(of: "/") ?? exe.startIndex)]) + "/" + name
    }

    /// Starts `path` with `arguments`, and `environment` added to this process's.
    public init(_ path: String, _ arguments: [String], environment: [String: String] = [:]) throws {
        let started = try StartedProgram(path, arguments, environment: environment, standardOutput: .pipe, standardError: .pipe)
        pid = started.pid
        pipes = [started.standardOutput!, started.standardError!]
        for fd in pipes {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        }
    }

    /// Reads what `stream` has; false at its end.
    private func fill(_ stream: Stream, until deadline: ContinuousClock.Instant) async throws -> Bool {
        var chunk = [UInt8](repeating: 0, count: 16384)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(pipes[stream.rawValue], $0.baseAddress, $0.count) }
            if n > 0 {
                buffers[stream.rawValue].append(contentsOf: chunk[0..<n])
                return true
            }
            if n == 0 { return false }
            guard errno == EAGAIN || errno == EINTR else { throw TestFailure("read failed: errno \(errno)") }
            guard ContinuousClock.now < deadline else { throw TestFailure("timed out waiting for the program's output") }
            try await Task.sleep(for: .milliseconds(2))  // a pipe, not a loop: poll it
        }
    }

    /// The next line of `stream` (without its newline); nil at its end.
    public func line(from stream: Stream = .standardOutput, timeout: Duration = .seconds(60)) async throws -> String? {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let newline = buffers[stream.rawValue].firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: buffers[stream.rawValue][..<newline], as: UTF8.self)
                buffers[stream.rawValue].removeFirst(newline + 1)
                return line
            }
            guard try await fill(stream, until: deadline) else {
                defer { buffers[stream.rawValue] = [] }
                return buffers[stream.rawValue].isEmpty ? nil : String(decoding: buffers[stream.rawValue], as: UTF8.self)
            }
        }
    }

    /// Everything left on `stream` until the program closes it.
    public func remainder(of stream: Stream = .standardOutput, timeout: Duration = .seconds(60)) async throws -> String {
        let deadline = ContinuousClock.now + timeout
        while try await fill(stream, until: deadline) {}
        defer { buffers[stream.rawValue] = [] }
        return String(decoding: buffers[stream.rawValue], as: UTF8.self)
    }

    /// Its exit code once it has exited (128 + the signal if a signal ended it). One that has not exited
    /// within `timeout` is killed, and that is an error.
    public func exitCode(timeout: Duration = .seconds(60)) async throws -> Int32 {
        if let status { return status }
        let deadline = ContinuousClock.now + timeout
        var raw: Int32 = 0
        while true {
            let waited = waitpid(pid, &raw, WNOHANG)
            if waited == pid { break }
            guard waited == 0 || errno == EINTR else { throw TestFailure("waitpid failed: errno \(errno)") }
            guard ContinuousClock.now < deadline else {
                kill(pid, SIGKILL)
                throw TestFailure("the program did not exit within \(timeout)")
            }
            try await Task.sleep(for: .milliseconds(2))  // a child's exit cannot be awaited: poll it
        }
        let code = raw & 0x7f == 0 ? (raw >> 8) & 0xff : 128 + (raw & 0x7f)
        status = code
        return code
    }

    /// Sends `signal`.
    public func signal(_ signal: Int32) { if status == nil { kill(pid, signal) } }

    deinit {
        if status == nil {
            kill(pid, SIGKILL)
            var raw: Int32 = 0
            while waitpid(pid, &raw, 0) < 0, errno == EINTR {}
        }
        for fd in pipes { close(fd) }
    }
}
