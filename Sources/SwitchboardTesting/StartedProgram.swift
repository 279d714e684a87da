#if canImport(Glibc)
import Glibc
#endif

/// A program started as a shell starts one: no signal blocked, every signal at its default, standard
/// input from /dev/null, and no descriptor of this process but the pipes asked for. Started with
/// `posix_spawn`, not Foundation's `Process` (on Linux its `run()` can crash reading `/proc/self/fd`,
/// more often the more descriptors are open: swift-corelibs-foundation #5472).
public struct StartedProgram {
    /// Where the program's standard output or error goes.
    public enum Output: Sendable {
        /// Into a pipe whose read end this process gets.
        case pipe
        /// To /dev/null.
        case discarded
    }

    /// The process id.
    public let pid: pid_t
    /// The read end of its standard output's pipe, if it was asked for.
    public let standardOutput: Int32?
    /// The read end of its standard error's pipe, if it was asked for.
    public let standardError: Int32?

    /// Starts `path` with `arguments`, and `environment` added to this process's.
    public init(_ path: String, _ arguments: [String], environment: [String: String] = [:],
                standardOutput: Output, standardError: Output) throws {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        var readEnds: [Int32?] = []
        var writeEnds: [Int32] = []
        for (descriptor, output) in [(Int32(1), standardOutput), (2, standardError)] {
            guard output == .pipe else {
                posix_spawn_file_actions_addopen(&actions, descriptor, "/dev/null", O_WRONLY, 0)
                readEnds.append(nil)
                continue
            }
            var ends: [Int32] = [-1, -1]
            guard pipe(&ends) == 0 else {
                for fd in readEnds.compactMap({ $0 }) + writeEnds { close(fd) }
                throw TestFailure("pipe failed: errno \(errno)")
            }
            posix_spawn_file_actions_adddup2(&actions, ends[1], descriptor)
            readEnds.append(ends[0])
            writeEnds.append(ends[1])
        }
        defer { for fd in writeEnds { close(fd) } }
        // The child closes every other descriptor, those of programs other tests start meanwhile too:
        // one held open by a stray child would keep a pipe from ever reaching its end.
        guard Self.addCloseFrom(&actions, 3) == 0 else { throw TestFailure("posix_spawn_file_actions_addclosefrom_np is missing") }
        // The spawning thread is one of Swift's cooperative pool, which blocks SIGINT and SIGTERM:
        // inherited, they would never reach the program's handlers, and a SIGTERM would wait for ever.
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var none = sigset_t(), all = sigset_t()
        sigemptyset(&none)
        sigfillset(&all)
        posix_spawnattr_setsigmask(&attributes, &none)
        posix_spawnattr_setsigdefault(&attributes, &all)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
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
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, path, &actions, &attributes, argv, envp)
        guard rc == 0 else {
            for fd in readEnds.compactMap({ $0 }) { close(fd) }
            throw TestFailure("cannot start \(path): \(String(cString: strerror(rc)))")
        }
        self.pid = pid
        self.standardOutput = readEnds[0]
        self.standardError = readEnds[1]
    }

    /// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34 on), which Swift's Glibc module does not
    /// declare.
    private static let addCloseFrom: @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32 = {
        guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else {
            return { _, _ in -1 }
        }
        return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
    }()
}
