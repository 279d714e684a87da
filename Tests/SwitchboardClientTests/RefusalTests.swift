import Testing
import SwitchboardClient
import SwitchboardPluginAPI
import SwitchboardServer
import SwitchboardTesting

/// Refuses every call on `limited/*` as over the rate limit, and every call on `secret/*` as forbidden.
struct Refuser: Plugin {
    let name = "refuser"
    var inbound: [any InboundProcessor] { [Refuse()] }

    struct Refuse: InboundProcessor {
        var scope: Scope<InboundKind> { Scope(channels: [ChannelPattern("limited/*"), ChannelPattern("secret/*")]) }
        func process(_ request: inout InboundRequest) throws -> InboundDecision {
            request.channel.hasPrefix("limited/") ? .reject(.rateLimited(retryAfterMs: 1500)) : .reject(.forbidden("no secrets"))
        }
    }
}

/// Refusals are told apart from broken connections: the CLI's exit code and JSON, the Swift client's
/// typed refusal.
@Suite struct Refusals {
    @Test(arguments: [
        (["call", "limited/x", "go"], #"{"error":{"code":"rate_limited","message":"over the rate limit: retry after 1500 ms","details":{"retryAfterMs":1500}}}"#),
        (["send", "secret/x", "1"], #"{"error":{"code":"forbidden","message":"no secrets","details":null}}"#),
        (["listen", "secret/x"], #"{"error":{"code":"forbidden","message":"no secrets","details":null}}"#),
    ])
    func cliExitsFourWithTheRefusalAsJSON(arguments: [String], output: String) async throws {
        let server = try startServer { $0.load(Refuser()) }
        let cli = try ProgramRun(ProgramRun.builtExecutable("switchboard"), arguments + ["--port", "\(server.port)"])
        #expect(try await cli.remainder() == output + "\n")
        #expect(try await cli.exitCode() == 4)
        await stop(server)
    }

    @Test func cliHelpNamesTheRefusalExitCode() async throws {
        for command in ["call", "listen", "send"] {
            let cli = try ProgramRun(ProgramRun.builtExecutable("switchboard"), [command, "--help"])
            #expect(try await cli.remainder().contains("4 refused by the server"), "\(command) --help")
            #expect(try await cli.exitCode() == 0)
        }
    }
}

/// The Swift client tells a refusal from a failure, and keeps what the refusal carried.
@Suite struct SwiftClientRefusals {
    @Test func aRefusalCarriesItsCodeAndDetails() async throws {
        let server = try startServer { $0.load(Refuser()) }
        let client = try await connect(server)
        let refusal = await #expect(throws: ClientError.self) {
            try await MethodChannel(name: "limited/x", client: client).invokeMethod("go")
        }
        #expect(refusal == .refused(code: "rate_limited", message: "over the rate limit: retry after 1500 ms",
                                    details: ["retryAfterMs": 1500]))
        #expect(refusal?.retryAfter == .milliseconds(1500))
        await #expect(throws: ClientError.refused(code: "forbidden", message: "no secrets", details: .null)) {
            try await EventChannel(name: "secret/x", client: client).receiveBroadcastStream().first { _ in true }
        }
        #expect(try await MethodChannel(name: "switchboard/echo", client: client).invokeMethod("echo", arguments: 1) == 1)
        await client.close()
        await stop(server)
    }
}
