#if canImport(Glibc)
import Glibc
#endif
import Testing
import SwitchboardClient
import SwitchboardServer
import SwitchboardTesting

/// The `switchboard` executable as a user or a test script runs it.
@Suite struct CLI {
    static let binary = ProgramRun.builtExecutable("switchboard")

    /// `--version`: the server name that WELCOME and stats report, the commit, and the libraries linked.
    @Test func versionAgreesWithWelcomeAndStats() async throws {
        let cli = try ProgramRun(Self.binary, ["--version"])
        let lines = try await cli.remainder().split(separator: "\n").map(String.init)
        #expect(try await cli.exitCode() == 0)
        try #require(lines.count == 3, "\(lines)")
        let first = lines[0].split(separator: " ").map(String.init)  // switchboard/0.1.0 (commit abc…)
        try #require(first.count == 3 && first[1] == "(commit" && first[2].hasSuffix(")"), "\(lines[0])")
        let commit = first[2].dropLast()
        let hash = commit.hasSuffix("-modified") ? commit.dropLast("-modified".count) : commit
        #expect(commit == "unknown" || (hash.count == 12 && hash.allSatisfy(\.isHexDigit)), "commit \(commit)")
        #expect(lines[1].hasPrefix("libuv 1."))
        #expect(lines[2].hasPrefix("OpenSSL "))
        let server = try startServer()
        let wire = try RawConnection(port: server.port)
        try wire.send(line: #"{"id":1,"hello":{}}"#)
        #expect(try await wire.line()["welcome"]?["server"] == .string(first[0]))
        try wire.send(line: #"{"id":2,"call":"switchboard/stats","method":"get"}"#)
        #expect(try await wire.line()["result"]?["server"] == .string(first[0]))
        await stop(server)
    }

    /// `serve --port 0`: the documented "listening on" line on stdout and the port file name the port.
    @Test func servesOnAFreePortAndSaysWhich() async throws {
        let portFile = "/tmp/switchboard-port-\(getpid())"
        defer { unlink(portFile) }
        let server = try ProgramRun(Self.binary, ["serve", "--port", "0", "--port-file", portFile, "--loops", "1",
                                                  "--log-level", "error"])
        let line = try #require(try await server.line())
        let port = try #require(line.split(separator: "switchboard: listening on 127.0.0.1:").first.flatMap { Int($0) }, "\(line)")
        #expect(try readFile(portFile) == "\(port)\n")
        let wire = try RawConnection(port: port)
        try wire.send(line: #"{"id":1,"ping":true}"#)
        #expect(try await wire.line() == ["id": 1, "pong": true])
        server.signal(SIGTERM)
        #expect(try await server.exitCode() == 0)
        #expect(access(portFile, F_OK) != 0, "the port file outlived the server")
    }

    /// Without `--loops`: one loop per core, and one on a machine of two cores or fewer (where a second
    /// loop measured slower: benchmarks/ANALYSIS.md). `switchboard/stats` counts the loops.
    @Test func theDefaultLoopCountFollowsTheCores() async throws {
        let server = try ProgramRun(Self.binary, ["serve", "--port", "0", "--log-level", "error"])
        let line = try #require(try await server.line())
        let port = try #require(line.split(separator: "switchboard: listening on 127.0.0.1:").first.flatMap { Int($0) }, "\(line)")
        let wire = try RawConnection(port: port)
        try wire.send(line: #"{"id":1,"call":"switchboard/stats","method":"get"}"#)
        let stats = try #require(try await wire.line()["result"])
        let cores = Int(sysconf(Int32(_SC_NPROCESSORS_ONLN)))
        let expected = cores <= 2 ? 1 : min(256, cores)
        #expect((stats["loops"]?.intValue ?? 1) == expected, "\(cores) cores")
        server.signal(SIGTERM)
        #expect(try await server.exitCode() == 0)
    }

    /// A server that cannot listen leaves no port file, nor the file it writes it under.
    @Test func aServerThatCannotListenLeavesNoFiles() async throws {
        let directory = "/tmp/switchboard-port-dir-\(getpid())"
        mkdir(directory, 0o755)
        defer { rmdir(directory) }
        let holder = try startServer()
        let server = try ProgramRun(Self.binary, ["serve", "--port", "\(holder.port)", "--port-file", directory + "/port"])
        #expect(try await server.remainder(of: .standardError).contains("\(holder.port)"))
        #expect(try await server.exitCode() != 0)
        #expect(rmdir(directory) == 0, "files were left in \(directory)")
        await stop(holder)
    }

    /// A port file that cannot be written stops the server before it listens: a script waiting for it
    /// would otherwise wait forever.
    @Test func unwritablePortFileIsAnError() async throws {
        let server = try ProgramRun(Self.binary, ["serve", "--port", "0", "--port-file", "/nonexistent/dir/port"])
        #expect(try await server.remainder(of: .standardError).contains("/nonexistent/dir/port"))
        #expect(try await server.exitCode() == 73)  // EX_CANTCREAT
    }

    /// A directory in place of the port file is found before anything listens (rename would fail only
    /// once the server listened), and nothing is left beside it.
    @Test func aDirectoryAsPortFileIsAnError() async throws {
        let directory = "/tmp/switchboard-port-is-dir-\(getpid())"
        mkdir(directory, 0o755)
        defer { rmdir(directory) }
        let server = try ProgramRun(Self.binary, ["serve", "--port", "0", "--port-file", directory])
        #expect(try await server.remainder() == "", "it listened first")
        #expect(try await server.exitCode() == 73)  // EX_CANTCREAT
        #expect(access(directory + ".\(server.pid).tmp", F_OK) != 0, "the file it writes first was left")
    }

    /// Another user of a shared directory such as /tmp plants a symlink where serve once wrote its port
    /// file before the rename (PATH.PID.tmp, a name anyone can work out): serve must not write (or
    /// truncate) the file it points at.
    @Test func portFileWriteFollowsNoSymlink() async throws {
        let directory = "/tmp/switchboard-symlink-\(getpid())"
        mkdir(directory, 0o777)
        let victim = directory + "/victim", portFile = directory + "/port"
        let file = try #require(fopen(victim, "w"))
        fputs("precious\n", file)
        fclose(file)
        defer {
            for name in [victim, portFile] { unlink(name) }
            rmdir(directory)
        }
        // The shell's pid is the server's (exec keeps it), so the symlink is in place before serve starts.
        let server = try ProgramRun("/bin/sh", ["-c", "ln -s \(victim) \(portFile).$$.tmp && exec \"$0\" serve --port 0 --port-file \(portFile) --loops 1 --log-level error", Self.binary])
        _ = try await server.line()  // listening, or gone
        #expect(try readFile(victim) == "precious\n", "serve wrote through the symlink planted at \(portFile).PID.tmp")
        server.signal(SIGTERM)
        _ = try await server.exitCode()
        unlink("\(portFile).\(server.pid).tmp")
    }

    @Test func serveHelpDocumentsThePortFileAndTheListeningLine() async throws {
        let cli = try ProgramRun(Self.binary, ["serve", "--help"])
        let help = try await cli.remainder()
        #expect(help.contains("--port-file"))
        #expect(help.contains("listening on HOST:PORT"))
    }

    /// A time to live a JSON reader cannot hold exactly is refused at start, not trapped on at the first session.
    @Test func sessionTTLPastJSONIntegersIsRefused() async throws {
        let server = try ProgramRun(Self.binary, ["serve", "--port", "0", "--session-ttl", "18446744073709551615"])
        #expect(try await server.remainder(of: .standardError).contains("--session-ttl"))
        #expect(try await server.exitCode() != 0)
    }

    @Test func serveHelpDocumentsTheSessionSettings() async throws {
        let cli = try ProgramRun(Self.binary, ["serve", "--help"])
        let help = try await cli.remainder()
        for option in ["--session-ttl", "--session-bytes", "--max-parked-sessions"] { #expect(help.contains(option), "\(option)") }
    }
}

/// The whole text of the file at `path`.
func readFile(_ path: String) throws -> String {
    guard let file = fopen(path, "r") else { throw TestFailure("cannot open \(path)") }
    defer { fclose(file) }
    var bytes: [UInt8] = []
    var chunk = [UInt8](repeating: 0, count: 4096)
    while case let count = fread(&chunk, 1, chunk.count, file), count > 0 { bytes += chunk[..<count] }
    return String(decoding: bytes, as: UTF8.self)
}
