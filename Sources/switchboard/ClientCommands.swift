import ArgumentParser
import SwitchboardClient
import SwitchboardCodec
import SwitchboardTransport

/// Exit codes shared by the client commands.
enum ClientExit {
    static let errorEnvelope = ExitCode(1)
    static let notImplemented = ExitCode(2)
    static let connectionFailed = ExitCode(3)
    /// Refused by the server (ERROR `forbidden` or `rate_limited`): the connection worked.
    static let refused = ExitCode(4)
    static let badArguments = ExitCode.validationFailure  // 64
}

/// `--host`, `--port`, `--token` (also from SWITCHBOARD_HOST, SWITCHBOARD_PORT, SWITCHBOARD_TOKEN), and TLS.
struct ConnectionOptions: ParsableArguments {
    @Option(help: "Server address (default: $SWITCHBOARD_HOST or 127.0.0.1).") var host: String?
    @Option(help: "Server port (default: $SWITCHBOARD_PORT or 7420).") var port: Int?
    @Option(help: "Token for HELLO (default: $SWITCHBOARD_TOKEN).") var token: String?
    @Option(help: "Seconds to wait for an answer.") var timeout = 30.0
    @Flag(help: "Connect with TLS (to the server's --tls-port, 7421 by default).") var tls = false
    @Option(help: "CA certificates (PEM) to trust with --tls (default: the system's).") var ca: String?
    @Option(help: "Client certificate (PEM) for mutual TLS.") var cert: String?
    @Option(help: "Client key (PEM) for mutual TLS (default: the --cert file).") var key: String?
    @Option(help: "The name the server's certificate must carry (default: the host).") var serverName: String?
    @Flag(help: "Speak through a WebSocket (ws://, or wss:// with --tls).") var ws = false

    func configuration() throws -> ClientConfiguration {
        if key != nil, cert == nil { throw ValidationError("--key goes with --cert") }
        let defaultPort = tls ? 7421 : 7420
        var config = ClientConfiguration(
            host: host ?? environment("SWITCHBOARD_HOST") ?? "127.0.0.1",
            port: port ?? environment("SWITCHBOARD_PORT").flatMap { Int($0) } ?? defaultPort,
            token: token ?? environment("SWITCHBOARD_TOKEN"))
        config.requestTimeout = .milliseconds(Int(timeout * 1000))
        config.reconnect = nil
        if tls || ca != nil || cert != nil {
            do { config.tls = try TLSContext.client(caFile: ca, certificateFile: cert, keyFile: key) } catch {
                printError("switchboard: \(error)\n")
                throw ClientExit.badArguments
            }
            config.serverName = serverName
        }
        config.webSocket = ws
        return config
    }

    func connect() async throws -> Client {
        let configuration = try configuration()
        do { return try await Client.connect(configuration) } catch {
            printError("switchboard: \(error)\n")
            throw ClientExit.connectionFailed
        }
    }
}

enum MethodCodecChoice: String, ExpressibleByArgument, CaseIterable {
    case standard, json
    var codec: any MethodCodec { self == .json ? JSONMethodCodec() : StandardMethodCodec() }
}

enum MessageCodecChoice: String, ExpressibleByArgument, CaseIterable { case standard, json, string, binary }

/// Parses a JSON argument, or fails with exit code 64.
func parseJSON(_ text: String, what: String) throws -> ChannelValue {
    do { return try JSONText.parse(Array(text.utf8)) } catch {
        throw ValidationError("\(what) is not valid JSON: \(error)")
    }
}

func printJSON(_ value: ChannelValue) {
    let text = (try? JSONText.serialize(value, options: .textMode)).map { String(decoding: $0, as: UTF8.self) }
    print(text ?? #"{"error":{"code":"unencodable","message":"the value has no JSON form"}}"#)
}

func errorJSON(_ error: ChannelError) -> ChannelValue {
    errorJSON(code: error.code, message: error.message, details: error.details)
}

func errorJSON(code: String, message: String?, details: ChannelValue) -> ChannelValue {
    .stringMap(["error": .stringMap(["code": .string(code), "message": message.map(ChannelValue.string) ?? .null, "details": details])])
}

/// The exit codes of `call`, `listen` and `send`, for their `--help`.
let clientExitCodes = """
    Exit codes: 0 success, 1 error envelope (printed as {"error":…}), 2 not implemented,
    3 connection failure, 4 refused by the server (forbidden, rate_limited: printed as
    {"error":{"code":…,"message":…,"details":…}}, details.retryAfterMs when rate limited),
    64 bad arguments.
    """

/// Connects, runs `body`, closes the client on every path, and turns failures into the documented
/// exit codes (the error envelope on stdout as JSON, other messages on stderr).
func withClient(_ connection: ConnectionOptions, _ body: (Client) async throws -> Void) async throws {
    let client = try await connection.connect()
    do {
        try await body(client)
        await client.close()
    } catch {
        await client.close()
        switch error {
        case let error as ChannelError:
            printJSON(errorJSON(error))
            throw ClientExit.errorEnvelope
        case let error as MissingImplementation:
            printError("switchboard: \(error.channel) does not implement \(error.method)\n")
            throw ClientExit.notImplemented
        case ClientError.refused(let code, let message, let details):
            printJSON(errorJSON(code: code, message: message, details: details))
            throw ClientExit.refused
        case let error as ClientError:
            printError("switchboard: \(error)\n")
            throw ClientExit.connectionFailed
        default:
            throw error
        }
    }
}

struct Call: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Call a method and print its result as JSON.",
        discussion: """
            Example:
              switchboard call switchboard/echo echo '{"hello":[1,2,3]}'
              {"hello":[1,2,3]}
            \(clientExitCodes)
            """)

    @OptionGroup var connection: ConnectionOptions
    @Argument(help: "The channel.") var channel: String
    @Argument(help: "The method.") var method: String
    @Argument(help: "Arguments as JSON (default null).") var arguments: String?
    @Option(help: "standard or json.") var codec: MethodCodecChoice = .standard

    func run() async throws {
        let args = try arguments.map { try parseJSON($0, what: "ARGS-JSON") } ?? .null
        try await withClient(connection) { client in
            let result = try await MethodChannel(name: channel, codec: codec.codec, client: client)
                .invokeMethod(method, arguments: args)
            printJSON(result)
        }
    }
}

struct Listen: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Listen to an event channel: one JSON line per event until the stream ends.",
        discussion: """
            Example:
              switchboard listen switchboard/ticker '{"count":3,"intervalMs":100}'
              0
              1
              2
            An error event is printed as {"error":{…}} and ends the command with exit code 1.
            \(clientExitCodes)
            """)

    @OptionGroup var connection: ConnectionOptions
    @Argument(help: "The channel.") var channel: String
    @Argument(help: "Listen arguments as JSON (default null).") var arguments: String?
    @Option(help: "Stop after this many events.") var count: Int?
    @Option(help: "standard or json.") var codec: MethodCodecChoice = .standard

    func validate() throws {
        if let count, count <= 0 { throw ValidationError("--count must be positive") }
    }

    func run() async throws {
        let args = try arguments.map { try parseJSON($0, what: "ARGS-JSON") } ?? .null
        try await withClient(connection) { client in
            var received = 0
            for try await event in EventChannel(name: channel, codec: codec.codec, client: client)
                .receiveBroadcastStream(arguments: args) {
                printJSON(event)
                received += 1
                if let count, received >= count { break }
            }
        }
    }
}

struct Send: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Send a message and print the reply as JSON.",
        discussion: """
            Examples:
              switchboard send switchboard/message '{"a":1}'
              switchboard send switchboard/message.string 'plain text' --codec string
              switchboard send switchboard/room.post 'hello room' --codec binary
            With --codec binary, MESSAGE is a JSON array of bytes, or else its text's UTF-8 bytes.
            \(clientExitCodes)
            """)

    @OptionGroup var connection: ConnectionOptions
    @Argument(help: "The channel.") var channel: String
    @Argument(help: "The message: JSON for standard and json; text for string and binary.") var message: String
    @Option(help: "standard, json, string or binary.") var codec: MessageCodecChoice = .standard

    func run() async throws {
        try await withClient(connection) { client in
            switch codec {
            case .standard:
                let value = try parseJSON(message, what: "MESSAGE")
                printJSON(try await BasicMessageChannel(name: channel, codec: StandardMessageCodec(), client: client).send(value))
            case .json:
                let value = try parseJSON(message, what: "MESSAGE")
                printJSON(try await BasicMessageChannel(name: channel, codec: JSONMessageCodec(), client: client).send(value))
            case .string:
                let reply = try await BasicMessageChannel(name: channel, codec: StringCodec(), client: client).send(message)
                printJSON(reply.map(ChannelValue.string) ?? .null)
            case .binary:
                let bytes = (try? JSONText.parse(Array(message.utf8))).flatMap { try? BinaryCodec().message(from: $0) } ?? Array(message.utf8)
                let reply = try await BasicMessageChannel(name: channel, codec: BinaryCodec(), client: client).send(bytes)
                printJSON(reply.map(ChannelValue.uint8List) ?? .null)
            }
        }
    }
}

struct Ping: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Measure round trips to the server (one JSON line per ping).",
        discussion: """
            Example:
              switchboard ping --count 2
              {"seq":1,"rttMs":0.081}
              {"seq":2,"rttMs":0.054}
            """)

    @OptionGroup var connection: ConnectionOptions
    @Option(help: "How many pings.") var count = 4
    @Option(help: "Seconds between pings.") var interval = 0.2

    func run() async throws {
        try await withClient(connection) { client in
            for seq in 1...max(1, count) {
                let start = EventLoop.nanoseconds()
                _ = try await client.ping()
                let micros = (EventLoop.nanoseconds() - start) / 1000
                print(#"{"seq":\#(seq),"rttMs":\#(Double(micros) / 1000)}"#)
                if seq < count { try await Task.sleep(for: .milliseconds(Int(interval * 1000))) }
            }
        }
    }
}
