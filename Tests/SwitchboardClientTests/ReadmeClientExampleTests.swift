import Testing
import SwitchboardClient
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting

@Suite struct ReadmeClientExamples {
    static let root = String(#filePath.dropLast("Tests/SwitchboardClientTests/ReadmeClientExampleTests.swift".count))

    /// The README shows `Examples/ClientExample/main.swift` whole.
    @Test func readmeShowsTheExample() throws {
        let readme = try String(contentsOfFile: Self.root + "README.md", encoding: .utf8)
        let example = try String(contentsOfFile: Self.root + "Examples/ClientExample/main.swift", encoding: .utf8)
        #expect(readme.contains("## A client in Swift\n\n```swift\n" + example + "```\n"))
    }

    /// The client example, built as `client-example` (it imports only SwitchboardClient), run as a user runs it.
    @Test func clientExampleRuns() async throws {
        let server = try startServer()
        let example = try ProgramRun(ProgramRun.builtExecutable("client-example"), ["\(server.port)"])
        #expect(try await example.remainder() == "{\"hello\":[1,2,3]}\n0\n1\n2\n")
        #expect(try await example.exitCode() == 0)
        await stop(server)
    }

    /// Without a server it says so in one line and exits 1 (before, a crash with a backtrace).
    @Test func clientExampleWithoutAServer() async throws {
        let example = try ProgramRun(ProgramRun.builtExecutable("client-example"), ["1"])
        let output = try await example.remainder()
        #expect(output.hasPrefix("client-example: ") && output.hasSuffix("(is scripts/serve running on port 1?)\n"), "\(output)")
        #expect(try await example.exitCode() == 1)
    }
}
