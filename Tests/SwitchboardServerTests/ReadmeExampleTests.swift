import Foundation
import Testing
import SwitchboardCodec
import SwitchboardPluginAPI
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// The README's server example: `Examples/ServerExample/main.swift`, shown whole in the README, built as
/// `server-example` and run here as a user runs it.
@Suite struct ReadmeExample {
    static let root = String(#filePath.dropLast("Tests/SwitchboardServerTests/ReadmeExampleTests.swift".count))

    @Test func readmeShowsTheExampleFile() throws {
        let readme = try String(contentsOfFile: Self.root + "README.md", encoding: .utf8)
        let example = try String(contentsOfFile: Self.root + "Examples/ServerExample/main.swift", encoding: .utf8)
        #expect(readme.contains("## A server in Swift\n\n```swift\n" + example + "```\n"))
    }

    /// The README and the guides in docs/: the pages whose Swift blocks and links are checked here.
    static func pages() throws -> [(path: String, text: String)] {
        let guides = try FileManager.default.contentsOfDirectory(atPath: root + "docs").filter { $0.hasSuffix(".md") }.sorted()
        return try (["README.md"] + guides.map { "docs/" + $0 }).map { ($0, try String(contentsOfFile: root + $0, encoding: .utf8)) }
    }

    /// Every Swift block in the README and in docs/ is a file, or a run of lines of one, that a test
    /// builds: the examples (run as programs), and the snippets that tests compile and run (compared
    /// line by line, indentation and imports aside).
    @Test func everySwiftBlockIsBuiltByATest() throws {
        let sources = try ["Examples/ServerExample/main.swift", "Examples/ClientExample/main.swift",
                           "Examples/BrokerExample/main.swift", "Tests/SwitchboardServerTests/ReadmeExampleTests.swift",
                           "Tests/SwitchboardServerCombineTests/CombineBridgeTests.swift",
                           "Tests/SwitchboardClientTests/ResumptionTests.swift"].map {
            Self.lines(try String(contentsOfFile: Self.root + $0, encoding: .utf8))
        }
        var count = 0
        for (path, text) in try Self.pages() {
            let blocks = text.components(separatedBy: "```swift\n").dropFirst().map { $0.components(separatedBy: "```")[0] }
            count += blocks.count
            for block in blocks {
                let wanted = Self.lines(block)
                let found = sources.contains { source in
                    source.indices.contains { start in source[start...].starts(with: wanted) }
                }
                #expect(found, "a Swift block of \(path) no test builds:\n\(block)")
            }
        }
        #expect(count >= 6)
    }

    /// Every relative link of the README and of docs/ leads to a file or folder of the repository, and a
    /// link to a heading of a Markdown page (`page.md#heading`) to a heading that page has.
    @Test func everyRelativeLinkLeadsSomewhere() throws {
        let link = #/\]\(([^)\s]+)\)/#
        for (path, text) in try Self.pages() {
            let folder = (path as NSString).deletingLastPathComponent
            for match in text.matches(of: link) {
                let target = String(match.1)
                if target.contains("://") || target.hasPrefix("mailto:") { continue }
                let parts = target.split(separator: "#", maxSplits: 1, omittingEmptySubsequences: false).map(String.init)
                let file = parts[0].isEmpty ? path : (folder as NSString).appendingPathComponent(parts[0])
                let resolved = (Self.root + file as NSString).standardizingPath
                #expect(FileManager.default.fileExists(atPath: resolved), "\(path) links to \(target), which does not exist")
                guard parts.count == 2, file.hasSuffix(".md"), let page = try? String(contentsOfFile: resolved, encoding: .utf8) else { continue }
                #expect(Self.anchors(page).contains(parts[1]), "\(path) links to \(target): no such heading there")
            }
        }
    }

    /// The anchors GitHub gives a page's headings: lower case, spaces as hyphens, other punctuation gone.
    private static func anchors(_ page: String) -> Set<String> {
        var inCode = false
        var anchors = Set<String>()
        for line in page.split(separator: "\n", omittingEmptySubsequences: false) {
            if line.hasPrefix("```") { inCode.toggle() }
            guard !inCode, line.hasPrefix("#") else { continue }
            let title = line.drop { $0 == "#" }.trimmingCharacters(in: .whitespaces).lowercased()
            anchors.insert(String(title.compactMap { $0 == " " ? "-" : ($0.isLetter || $0.isNumber || $0 == "-" || $0 == "_") ? $0 : nil }))
        }
        return anchors
    }

    /// The lines of `text` without their indentation, and without empty ones and imports (a file has
    /// those at its top, a snippet above its code).
    private static func lines(_ text: String) -> [Substring] {
        text.split(separator: "\n").map { $0.drop { $0 == " " } }.filter { !$0.isEmpty && !$0.hasPrefix("import ") }
    }

    /// The README and Package.swift state the Swift version that the manifest's tools version asks for.
    @Test func swiftVersionIsStated() throws {
        let manifest = try String(contentsOfFile: Self.root + "Package.swift", encoding: .utf8)
        let readme = try String(contentsOfFile: Self.root + "README.md", encoding: .utf8)
        let tools = try #require(manifest.split(separator: "\n").first?.split(separator: " ").last)  // swift-tools-version: 6.2
        #expect(manifest.contains("// Swift \(tools) or later"))
        #expect(readme.contains("Swift \(tools) or later"))
    }

    /// Top-level code whose `Task` runs on the main actor: its broadcasts reach a listener while the
    /// server runs, and SIGTERM ends the program with 0.
    @Test func exampleServesAndBroadcasts() async throws {
        let example = try ProgramRun(ProgramRun.builtExecutable("server-example"), ["0"])
        var port: Int?
        while port == nil, let line = try await example.line(from: .standardError) {  // swift-log writes there
            port = line.components(separatedBy: "listening on 127.0.0.1:").dropFirst().first.flatMap { Int($0) }
        }
        let wire = try RawConnection(port: try #require(port))
        try wire.send(.call(1, "math", "square", 12))
        #expect(try await wire.frame().envelope() == .success(144))
        try wire.send(.call(4, "math", "square", 4_294_967_296))
        guard case .failure(let tooLarge) = try await wire.frame().envelope() else { throw TestFailure("expected an error envelope") }
        #expect(tooLarge.code == "bad_arguments")  // 2^64 does not fit; before, the server trapped
        try wire.send(.call(2, "math", "cube", 3))
        #expect(try await wire.frame().payload == nil)
        try wire.send(.call(3, "sensors/temperature", "listen"))
        #expect(try await wire.frame().id == 3)
        #expect(try await wire.frame().envelope() == .success(21.5))
        var readings: [Double] = []
        while readings.count < 2 {
            guard case .float64(let reading) = try await wire.frame().envelope().get() else { throw TestFailure("expected a reading") }
            readings.append(reading)
        }
        #expect(readings[1] == readings[0] + 0.5)
        example.signal(SIGTERM)
        #expect(try await example.exitCode() == 0)
    }

    /// The testing guide's snippet (docs/testing.md), as written there.
    @Test func embeddedServerExample() throws {
        let embedded = try EmbeddedServer()          // the demo channels, served over in-memory transports
        let peer = embedded.connect()
        peer.send(try .call(1, "switchboard/echo", "echo", "hi"))
        embedded.run()
        let reply = try peer.frames()[0]             // REPLY id 1, a success envelope holding "hi"
        peer.peerWindow = 0                          // a peer that stops reading: the server holds back
        #expect(reply.kind == .reply && reply.id == 1)
        #expect(try reply.envelope() == .success("hi"))
    }
}

// the plugin guide begins
/// Orders are read-only today, and only the `support` user sees customers' e-mail addresses.
struct ReadOnlyOrders: Plugin {
    let name = "read-only-orders"
    var inbound: [any InboundProcessor] { [RefuseWrites()] }
    var outbound: [any OutboundProcessor] { [HideEmails()] }

    struct RefuseWrites: InboundProcessor {
        var scope: Scope<InboundKind> { Scope(channels: [ChannelPattern("orders/*")], kinds: [.call]) }
        func process(_ request: inout InboundRequest) throws -> InboundDecision {
            if request.method?.hasPrefix("get") == true { return .next }
            return .reject(Rejection(code: "read_only", message: "orders are read-only today"))
        }
    }

    struct HideEmails: OutboundProcessor {
        var scope: Scope<OutboundKind> { Scope(channels: [ChannelPattern("customers/*")], kinds: [.reply, .event]) }
        func applies(to connection: ConnectionContext, channel: String) -> Bool { connection.identity != "support" }
        func process(_ message: inout OutboundMessage) throws -> OutboundDecision {
            if case .value(.map(let fields)) = message.content {
                message.content = .value(.map(fields.filter { $0.key != "email" }))
            }
            return .pass
        }
    }
}
// the plugin guide ends

/// Identifies a client as `support` when its token says so (the guide's plugin reads identities).
struct TokenIsIdentity: Plugin {
    let name = "token-is-identity"
    func authenticate(_ hello: Hello, connection: ConnectionContext) -> Authentication { hello.token.map { .identity($0) } ?? .pass }
}

@Suite struct ReadmePluginExample {
    /// The plugin guide's source (docs/plugins-and-security.md), compared with the copy above.
    @Test func guideShowsThisPlugin() throws {
        let guide = try String(contentsOfFile: ReadmeExample.root + "docs/plugins-and-security.md", encoding: .utf8)
        let source = try String(contentsOfFile: #filePath, encoding: .utf8)
        let plugin = source.components(separatedBy: "// the plugin guide begins\n")[1].components(separatedBy: "// the plugin guide ends")[0]
        #expect(guide.contains("```swift\nimport SwitchboardPluginAPI\n\n" + plugin + "```\n"))
    }

    @Test func refusesWritesAndHidesEmails() throws {
        let embedded = try EmbeddedServer(plugins: [TokenIsIdentity(), ReadOnlyOrders()])
        MethodChannel(name: "orders/main", server: embedded.server).setMethodCallHandler { call, result in result.success(.string(call.method)) }
        MethodChannel(name: "customers/main", server: embedded.server).setMethodCallHandler { _, result in
            result.success(.stringMap(["name": "Ada", "email": "ada@example.com"]))
        }
        embedded.run()
        let clerk = embedded.connect(), support = embedded.connect()
        support.send(Frame(.hello, id: 9, payload: Array(#"{"token":"support"}"#.utf8)))
        for peer in [clerk, support] {
            peer.send(try .call(1, "orders/main", "getOrder"))
            peer.send(try .call(2, "orders/main", "cancelOrder"))
            peer.send(try .call(3, "customers/main", "get"))
        }
        embedded.run()
        let clerkFrames = try clerk.frames(), supportFrames = try support.frames().filter { $0.id != 9 }
        #expect(try clerkFrames[0].envelope().get() == "getOrder")
        #expect(clerkFrames[1].errorCode == "read_only")
        #expect(try clerkFrames[2].envelope().get() == .stringMap(["name": "Ada"]))
        #expect(supportFrames[1].errorCode == "read_only")
        #expect(try supportFrames[2].envelope().get() == .stringMap(["name": "Ada", "email": "ada@example.com"]))
    }
}
