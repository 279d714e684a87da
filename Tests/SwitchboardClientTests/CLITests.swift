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
}
