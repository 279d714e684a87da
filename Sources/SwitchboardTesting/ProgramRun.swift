#if canImport(Glibc)
import Glibc
#endif

/// An executable of this package (`switchboard`, an example) run as a user runs it: a process of its
/// own, its standard output and error read through pipes, its exit status checked. Started with
/// `posix_spawn`, not Foundation's `Process` (on Linux its `run()` can crash reading `/proc/self/fd`,
/// swift-corelibs-foundation #5472). The child gets no descriptor of this process but its pipes.
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
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        var out: [Int32] = [-1, -1], err: [Int32] = [-1, -1]
        guard pipe(&out) == 0, pipe(&err) == 0 else { throw TestFailure("pipe failed: \(errno)") }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, out[1], 1)
        posix_spawn_file_actions_adddup2(&actions, err[1], 2)
        // The child closes every other descriptor, those of programs other tests start meanwhile too:
        // one held open by a stray child would keep a pipe from ever reaching its end.
        guard Self.addCloseFrom(&actions, 3) == 0 else { throw TestFailure("posix_spawn_file_actions_addclosefrom_np is missing") }
        let argv: [UnsafeMutablePointer<CChar>?] = ([path] + arguments).map { strdup($0) } + [nil]
        var inherited: [String] = []
        var entry = environ
        while let variable = entry.pointee {
            let text = String(cString: variable)
            if environment[String(text.prefix { $0 != "=" })] == nil { inherited.append(text) }
            entry += 1
        }
        let envp: [UnsafeMutablePointer<CChar>?] = (inherited + environment.map { "\($0.key)=\($0.value)" }).map { strdup($0) } + [nil]
        defer { for pointer in argv + envp { free(pointer) } }
        // As from a shell: no signal blocked, every signal at its default. The spawning thread is one of
        // Swift's cooperative pool, which blocks SIGINT and SIGTERM: inherited, they would never reach
        // the program's handlers, and a SIGTERM would wait forever.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t(), all = sigset_t()
        sigemptyset(&none)
        sigfillset(&all)
        posix_spawnattr_setsigmask(&attributes, &none)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, path, &actions, &attributes, argv, envp)
        close(out[1])
        close(err[1])
        guard rc == 0 else {
            close(out[0])
            close(err[0])
            throw TestFailure("cannot start \(path): \(String(cString: strerror(rc)))")
        }
        for fd in [out[0], err[0]] {
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
        }
        self.pid = pid
        pipes = [out[0], err[0]]
    }

    /// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34 on), which Swift's Glibc module does not
    /// declare.
    private static let addCloseFrom: @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32 = {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else {
            return { _, _ in -1 }
        }
        return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
    }()

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
