import ArgumentParser
import Dispatch
import Logging
import SwitchboardCluster
import SwitchboardDemo
import SwitchboardPlugins
import SwitchboardServer
import SwitchboardTransport
#if canImport(Glibc)
import Glibc
#endif

@main
struct Switchboard: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "switchboard",
        abstract: "Flutter platform channels over TCP.",
        version: versionText,
        subcommands: [Serve.self, Call.self, Listen.self, Send.self, Ping.self, Top.self, Bench.self]
    )

    /// Runs a synchronous command (`serve`) on the main thread as a plain program; only the client
    /// commands, which are async, start Dispatch's main queue. (Swift's async `main` ends the main
    /// thread inside `dispatch_main`, which valgrind cannot follow: `scripts/bench-instructions` runs
    /// the server under callgrind.)
    static func main() {
        let parsed: any ParsableCommand
        do { parsed = try parseAsRoot() } catch { exit(withError: error) }
        if var command = parsed as? any AsyncParsableCommand {
            Task.detached {
                do { try await command.run() } catch { exit(withError: error) }
                exit()
            }
            dispatchMain()
        }
        var command = parsed
        do { try command.run() } catch { exit(withError: error) }
    }
}

/// What `switchboard --version` prints: the name WELCOME and stats give, the commit built (`unknown`
/// outside a clone or a `git archive` tarball), and the libraries this process runs with.
let versionText = """
    \(switchboardServerName) (commit \(buildCommit))
    libuv \(LinkedLibraries.libuv)
    \(LinkedLibraries.openSSL)
    """

struct Serve: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the server (with the demo channels unless --no-demo).",
        discussion: """
            Example:
              switchboard serve --port 7420 --heartbeat 10000
              printf '{"id":1,"call":"switchboard/echo","method":"echo","args":"hi"}\\n' | nc -q1 127.0.0.1 7420
            SIGINT or SIGTERM drains gracefully (GOAWAY, in-flight replies, end of streams) and exits 0.
            With --config, SIGHUP reloads the file (a file that does not parse keeps the old settings);
            a bad file at start-up exits 78 (EX_CONFIG) with a message naming the line or key.
            Once it listens it prints "switchboard: listening on HOST:PORT" on stdout (then, with TLS,
            "switchboard: listening for TLS on HOST:PORT"), whatever the log level: with --port 0, read
            the port there or from --port-file.
            """
    )

    @Option(help: "Address or host name to listen on (0.0.0.0 or :: for every interface).") var host = "127.0.0.1"
    @Option(help: "Port to listen on (0 = any free port: the \"listening on HOST:PORT\" line on stdout names it).") var port = 7420
    @Option(help: "Once listening, write the port (and the TLS port on a second line) to this file, removed on exit; a file that cannot be written exits 73 (EX_CANTCREAT).")
    var portFile: String?
    @Option(help: "Largest frame or text line in bytes (at most 1 GiB).") var maxFrame: UInt32 = 16 << 20
    @Option(help: "Bytes queued per connection before events wait, reading pauses and the slow-consumer clock starts.")
    var outboundLimit = 8 << 20
    @Option(help: "Milliseconds a connection may stay over the outbound limit before it is closed.")
    var slowConsumerGrace: UInt64 = 5000
    @Option(help: "Heartbeat interval in milliseconds (0 = none).") var heartbeat: UInt64 = 0
    @Option(help: "Token clients must send in HELLO (default: $SWITCHBOARD_TOKEN).") var token: String?
    @Option(help: "Milliseconds to wait for in-flight requests on shutdown.") var drainTimeout: UInt64 = 5000
    @Flag(help: "Do not install the demo channels.") var noDemo = false
    @Flag(help: "Do not install switchboard/channels and switchboard/connections (what the console and top show).")
    var noIntrospection = false
    @Option(help: "trace, debug, info, notice, warning, error or critical.") var logLevel: Logger.Level = .notice
    @Option(help: "Plugin configuration (JSON: aliases, access, rateLimits, requestLog; see protocol/plugins.md).")
    var config: String?
    @Option(help: "TLS certificate chain (PEM): serve TLS on --tls-port as well.") var tlsCert: String?
    @Option(help: "TLS private key (PEM).") var tlsKey: String?
    @Option(help: "CA certificates (PEM): require client certificates signed by them (mutual TLS).") var tlsCa: String?
    @Option(help: "Port for TLS (0 = any free port).") var tlsPort = 7421
    @Option(help: "Milliseconds a client has to finish the TLS handshake.") var tlsHandshakeTimeout: UInt64 = 10_000
    @Option(help: "on: serve GET /, /healthz and /metrics on the ports (/metrics to loopback clients only, or with --token or access control to Authorization: Bearer TOKEN); off: 404 (WebSocket upgrades are served either way).")
    var http: Switch = .on
    @Option(help: "A browser origin allowed to open a WebSocket besides the page's own (repeatable; * matches any run of characters, so '*' allows any; default: only an Origin that matches the request's Host).")
    var wsOrigin: [String] = []
    @Option(help: "Channels with a label of their own in /metrics; the rest are summed as \"other\".")
    var metricsChannels = 100
    @Option(help: "Channels one connection may hold by REGISTER at once (0 = none).") var maxRegistrations = 1000
    @Option(help: "Requests one connection may have open (sent, not yet answered) at once; past it, too_many_requests.")
    var maxOpenRequests = 4096
    @Option(help: "NATS servers (nats://HOST:PORT, comma-separated): share broadcasts with the other nodes on them.")
    var cluster: String?
    @Option(help: "This node's name in the cluster (default: the host name and process id).") var node: String?
    @Option(help: "Milliseconds a node has to connect to a NATS server, handshake included, before it tries the next.")
    var clusterConnectTimeout: UInt64 = 2000
    @Option(help: "Milliseconds between a node's pings to its NATS server; two unanswered in a row mark the connection dead.")
    var clusterPingInterval: UInt64 = 1000
    @Option(help: "Event loops, one thread each: 1 … 256 (default: one per core, and one on a machine of two cores or fewer).") var loops: Int?
    @Option(help: "Milliseconds a new connection has to complete its first frame, line or HTTP head (0 = no limit).")
    var firstFrameTimeout: UInt64 = 10_000
    @Option(help: "Milliseconds a frame, line, HTTP head, TLS record or WebSocket frame may stay unfinished, unless 64 KiB more of it arrive (0 = no limit).")
    var frameTimeout: UInt64 = 10_000
    @Option(help: "Connections served at once; more are closed when accepted (lowered to the descriptor limit less 64, or a quarter of a smaller one).")
    var maxConnections = 10_000
    @Option(help: "Connections served at once from one remote address (loopback is exempt unless --cap-loopback).")
    var maxConnectionsPerAddress = 256
    @Flag(help: "Apply --max-connections-per-address to loopback too (off: a reverse proxy on this host would hit it).")
    var capLoopback = false
    @Option(help: "Milliseconds a resumable session stays parked once its connection is lost (0 = grant no sessions; protocol/resumption.md).")
    var sessionTtl: UInt64 = 60_000
    @Option(help: "Bytes a session may keep for its client: sent and not acknowledged, and made while parked.")
    var sessionBytes = 1 << 20
    @Option(help: "Sessions parked at once, each loop parking its share (and ended sessions whose reason is remembered).")
    var maxParkedSessions = 1000

    /// The servers `--cluster` lists; nil if one is not a NATS address.
    private var clusterServers: [NATSBus.Server]? {
        cluster.map { list in list.split(separator: ",").compactMap { NATSBus.Server(url: String($0)) } }
    }

    func validate() throws {
        guard maxFrame >= 16, maxFrame <= 1 << 30 else { throw ValidationError("--max-frame must be 16 … 1073741824") }
        guard (0...65535).contains(port) else { throw ValidationError("--port must be 0 … 65535") }
        guard outboundLimit > 0 else { throw ValidationError("--outbound-limit must be positive") }
        guard maxConnections > 0, maxConnectionsPerAddress > 0 else {
            throw ValidationError("--max-connections and --max-connections-per-address must be positive")
        }
        guard (tlsCert == nil) == (tlsKey == nil) else { throw ValidationError("--tls-cert and --tls-key go together") }
        guard tlsCa == nil || tlsCert != nil else { throw ValidationError("--tls-ca needs --tls-cert and --tls-key") }
        guard (0...65535).contains(tlsPort) else { throw ValidationError("--tls-port must be 0 … 65535") }
        if let cluster, clusterServers?.count != cluster.split(separator: ",").count || cluster.isEmpty {
            throw ValidationError("--cluster takes nats://HOST:PORT addresses, comma-separated")
        }
        guard node == nil || cluster != nil else { throw ValidationError("--node needs --cluster") }
        guard clusterConnectTimeout > 0, clusterPingInterval > 0 else {
            throw ValidationError("--cluster-connect-timeout and --cluster-ping-interval must be positive")
        }
        guard maxRegistrations >= 0 else { throw ValidationError("--max-registrations must be 0 or more") }
        guard maxOpenRequests > 0 else { throw ValidationError("--max-open-requests must be positive") }
        guard sessionBytes > 0, maxParkedSessions > 0 else { throw ValidationError("--session-bytes and --max-parked-sessions must be positive") }
        guard sessionTtl < 1 << 53 else { throw ValidationError("--session-ttl must be below 2^53 ms (exact in any JSON reader)") }
        if let loops { guard (1...256).contains(loops) else { throw ValidationError("--loops must be 1 … 256") } }
    }

    func run() throws {
        MallocTuning.keepLargeBlocks()
        let level = logLevel
        LoggingSystem.bootstrap { label in
            var handler = EscapingLogHandler(StreamLogHandler.standardError(label: label))  // no client can forge a line
            handler.logLevel = level
            return handler
        }
        var config = ServerConfiguration()
        config.host = host
        config.port = port
        config.maxFrame = maxFrame
        config.outboundLimit = outboundLimit
        config.slowConsumerGraceMs = slowConsumerGrace
        config.heartbeatMs = heartbeat
        config.token = token ?? environment("SWITCHBOARD_TOKEN")
        config.drainTimeoutMs = drainTimeout
        config.firstFrameTimeoutMs = firstFrameTimeout
        config.frameTimeoutMs = frameTimeout
        config.maxConnections = maxConnections
        config.maxConnectionsPerAddress = maxConnectionsPerAddress
        config.capsLoopback = capLoopback
        config.sessionTTLMs = sessionTtl
        config.sessionBytes = sessionBytes
        config.maxParkedSessions = maxParkedSessions
        config.httpEndpoints = http == .on
        config.webSocketOrigins = wsOrigin.isEmpty ? nil : wsOrigin
        config.metrics = .prometheus(channelLimit: metricsChannels)
        config.maxRegistrationsPerConnection = maxRegistrations
        config.maxOpenRequests = maxOpenRequests
        config.loops = loops ?? defaultLoopCount(cores: Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
        if let servers = clusterServers {
            var settings = ClusterSettings(servers: servers, node: node ?? "\(hostName())-\(getpid())")
            settings.connectTimeoutMs = clusterConnectTimeout
            settings.pingIntervalMs = clusterPingInterval
            config.cluster = settings
        }
        if let tlsCert, let tlsKey {
            do {
                let context = try TLSContext.server(certificateFile: tlsCert, keyFile: tlsKey, clientCAFile: tlsCa)
                config.tls = TLSSettings(context: context, port: tlsPort, handshakeTimeoutMs: tlsHandshakeTimeout)
            } catch {
                printError("switchboard: \(error)\n")
                throw ExitCode(78)  // EX_CONFIG
            }
        }
        let announcement = try ListeningAnnouncement(host: host, portFile: portFile)
        defer { announcement.withdraw() }
        let server = try Server(configuration: config)
        if !noDemo { server.installDemoChannels() }
        if !noIntrospection { server.installIntrospectionChannels() }
        if let path = self.config { try loadPlugins(from: path, into: server) }
        server.whenListening { announcement.announce(server) }
        try server.runOnCurrentThread(handlingSignals: true)
        try announcement.check()
    }

    /// Loads the plugins the file asks for, and reloads it on SIGHUP (off the loop: it reads a file).
    private func loadPlugins(from path: String, into server: Server) throws {
        let configuration: PluginConfiguration
        do { configuration = try PluginConfiguration.load(path: path) } catch {
            printError("switchboard: invalid configuration: \(error.description)\n")
            throw ExitCode(78)  // EX_CONFIG, sysexits(3)
        }
        let settings = LiveSettings(configuration)
        for plugin in PluginConfiguration.plugins(reading: settings) { server.load(plugin) }
        let logger = Logger(label: "switchboard")
        server.onSignal(SIGHUP) {
            startThread { settings.reload(path: path, logger: logger) }
        }
    }
}

extension Logger.Level: @retroactive ExpressibleByArgument {}

/// `on` or `off`.
enum Switch: String, ExpressibleByArgument, CaseIterable { case on, off }

/// The loops `serve` runs without `--loops`: one per core, but one on a machine of two cores or fewer,
/// where a second loop competes with the kernel's network work and the clients for the other core and
/// costs more server CPU per call than it brings (benchmarks/ANALYSIS.md, "One loop per core").
func defaultLoopCount(cores: Int) -> Int { cores <= 2 ? 1 : min(256, cores) }

/// This machine's name, for a node's default name.
private func hostName() -> String {
    var name = [CChar](repeating: 0, count: 256)
    guard gethostname(&name, name.count - 1) == 0 else { return "node" }
    return String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
