import Foundation
import Logging
import Synchronization
import Testing
import SwitchboardClient
import SwitchboardCodec
import SwitchboardDemo
import SwitchboardPluginAPI
import SwitchboardPlugins
import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport

/// Certificates made for this test run by `scripts/make-test-certs` (a CA, a server certificate for
/// 127.0.0.1, alice's and bob's client certificates, and mallory's from another CA); never committed.
enum TestCertificates {
    static let directory: String = {
        let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("switchboard-certs-\(getpid())").path
        let process = Process()
        process.executableURL = root.appendingPathComponent("scripts/make-test-certs")
        process.arguments = [directory]
        try? process.run()
        process.waitUntilExit()
        precondition(process.terminationStatus == 0, "scripts/make-test-certs failed")
        return directory
    }()

    static func path(_ name: String) -> String { "\(directory)/\(name)" }
    static let aliceSubject = "CN=alice,O=Switchboard Tests"
}

/// A server with TLS on a free port beside its plain one.
func startTLSServer(clientCA: Bool = false, handshakeTimeoutMs: UInt64 = 10_000, plugins: [any Plugin] = [],
                    configure: (inout ServerConfiguration) -> Void = { _ in }) throws -> Server {
    var config = ServerConfiguration.forTests()
    config.drainTimeoutMs = 300
    configure(&config)
    let context = try TLSContext.server(certificateFile: TestCertificates.path("server.pem"), keyFile: TestCertificates.path("server.key"),
                                        clientCAFile: clientCA ? TestCertificates.path("ca.pem") : nil)
    config.tls = TLSSettings(context: context, port: 0, handshakeTimeoutMs: handshakeTimeoutMs)
    var logger = Logger(label: "test")
    logger.logLevel = .critical
    let server = try Server(configuration: config, logger: logger)
    server.installDemoChannels()
    for plugin in plugins { server.load(plugin) }
    try server.start()
    return server
}

/// A client over TLS to `server`, presenting `certificate` (a name in the test directory) if given.
func connectTLS(_ server: Server, certificate: String? = nil) async throws -> Client {
    var config = ClientConfiguration(port: server.tlsPort)
    config.reconnect = nil
    config.requestTimeout = .seconds(5)
    config.tls = try TLSContext.client(caFile: TestCertificates.path("ca.pem"),
                                       certificateFile: certificate.map { TestCertificates.path("\($0).pem") },
                                       keyFile: certificate.map { TestCertificates.path("\($0).key") })
    return try await Client.connect(config)
}

/// Connects a plain TCP socket to `port`, sends `bytes`, and reads until the server closes.
func rawExchange(port: Int, send bytes: [UInt8]) -> (received: [UInt8], seconds: Double)? {
    guard let socket = RawSocket(port: port) else { return nil }
    if !bytes.isEmpty { socket.send(bytes) }
    return socket.readUntilClosed().map { ($0.bytes, $0.seconds) }
}

/// The server's close counts, read over the plain port.
func closeCounts(_ server: Server) async throws -> [String: Int] {
    let client = try await connect(server)
    let stats: ChannelValue = try await SwitchboardClient.MethodChannel(name: "switchboard/stats", client: client).invokeMethod("get")
    await client.close()
    var counts: [String: Int] = [:]
    for reason in ["tlsHandshakeFailed", "tlsHandshakeTimeout", "tlsError", "unauthorized"] {
        counts[reason] = stats["closes"]?[reason]?.intValue
    }
    return counts
}

/// Sends `request` over TLS to `port`, presenting `certificate` (a name in the test directory) if given,
/// and returns what comes back once `isEnough` says so, or the server closes, or 10 s have passed.
func tlsExchange(port: Int, certificate: String? = nil, send request: [UInt8],
                 until isEnough: ([UInt8]) -> Bool = { _ in false }) throws -> [UInt8] {
    let loop = try EventLoop()
    defer { loop.finishDriving() }
    let context = try TLSContext.client(caFile: TestCertificates.path("ca.pem"),
                                        certificateFile: certificate.map { TestCertificates.path("\($0).pem") },
                                        keyFile: certificate.map { TestCertificates.path("\($0).key") })
    var received: [UInt8] = [], isClosed = false, transport: (any Transport)?
    TCPConnection.connect(loop: loop, host: "127.0.0.1", port: port) { result in
        guard case .success(let connection) = result,
              let tls = try? TLSTransport(over: connection, context: context, serverName: "127.0.0.1", loop: loop) else {
            isClosed = true
            return
        }
        transport = tls
        tls.start { event in
            switch event {
            case .data(let bytes): received += bytes
            case .closed, .failed: isClosed = true
            case .drained: break
            }
        }
        var bytes = request
        tls.write(&bytes)
    }
    _ = waitUntil {
        loop.runOnce()
        return isClosed || isEnough(received)
    }
    transport?.closeNow()
    return received
}

/// A WebSocket upgrade request for `port`, from a page at `origin`.
func webSocketUpgrade(port: Int, origin: String) -> [UInt8] {
    Array(("GET / HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nOrigin: \(origin)\r\n"
        + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").utf8)
}

/// A masked client text message (payload under 126 bytes).
func webSocketText(_ text: String) -> [UInt8] {
    let payload = Array(text.utf8), mask: [UInt8] = [1, 2, 3, 4]
    return [0x81, 0x80 | UInt8(payload.count)] + mask + payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
}

/// The server's WebSocket messages after the upgrade answer in `bytes`, as far as they are complete:
/// opcode and payload (each under 126 bytes).
func webSocketMessages(_ bytes: [UInt8]) -> [(opcode: UInt8, payload: [UInt8])] {
    guard var start = bytes.firstRange(of: [13, 10, 13, 10])?.upperBound else { return [] }
    var messages: [(opcode: UInt8, payload: [UInt8])] = []
    while bytes.count >= start + 2 {
        let length = Int(bytes[start + 1] & 0x7F)
        guard length < 126, bytes.count >= start + 2 + length else { break }
        messages.append((bytes[start] & 0x0F, Array(bytes[(start + 2)..<(start + 2 + length)])))
        start += 2 + length
    }
    return messages
}

/// The first of ``webSocketMessages(_:)``.
func firstWebSocketMessage(_ bytes: [UInt8]) -> (opcode: UInt8, payload: [UInt8])? { webSocketMessages(bytes).first }

/// `switchboard/echo` on `client`.
func echo(_ client: Client) -> SwitchboardClient.MethodChannel { SwitchboardClient.MethodChannel(name: "switchboard/echo", client: client) }

@Suite("TLS")
struct TLSTests {
    @Test("calls over TLS; a plain-text client and a stalled handshake are closed, logged and counted; others go on")
    func tlsPort() async throws {
        let server = try startTLSServer(handshakeTimeoutMs: 300)
        let client = try await connectTLS(server)
        #expect(try await echo(client).invokeMethod("echo", arguments: "over TLS") == "over TLS")
        let plain = rawExchange(port: server.tlsPort, send: Array(#"{"id":1,"call":"switchboard/echo","method":"echo"}"#.utf8) + [10])
        #expect(plain?.received.first != UInt8(ascii: "{"))  // closed, never answered in plain text
        let stalled = try #require(rawExchange(port: server.tlsPort, send: []))
        #expect(stalled.received.isEmpty && stalled.seconds >= 0.25 && stalled.seconds < 3)
        #expect(try await echo(client).invokeMethod("echo", arguments: 2) == 2)  // untouched
        let counts = try await closeCounts(server)
        #expect(counts["tlsHandshakeFailed"] == 1 && counts["tlsHandshakeTimeout"] == 1)
        await client.close()
        await stop(server)
    }

    @Test("mutual TLS: a certificate the server trusts is the identity access control knows; none or a rogue one is refused")
    func mutualTLS() async throws {
        let rules = AccessRules(users: [.init(name: "alice", certificateSubject: TestCertificates.aliceSubject,
                                              allow: .init(call: ["switchboard/*"]))],
                                anonymous: .init(allow: .init(call: ["switchboard/stats"], listen: [], send: [], register: [])))
        let plugins = PluginConfiguration.plugins(reading: LiveSettings(PluginConfiguration(access: rules)))
        let server = try startTLSServer(clientCA: true, plugins: plugins)
        let alice = try await connectTLS(server, certificate: "alice")
        #expect(try await echo(alice).invokeMethod("echo", arguments: "alice") == "alice")
        for certificate in [nil, "mallory"] {
            do {
                let client = try await connectTLS(server, certificate: certificate)
                let _: ChannelValue = try await echo(client).invokeMethod("echo")
                Issue.record("\(certificate ?? "no certificate") was let in")
            } catch {}
        }
        let anonymous = try await connect(server)  // the plain port: no certificate, no rights
        await #expect(throws: (any Error).self) { try await echo(anonymous).invokeMethod("echo") }
        #expect(try await closeCounts(server)["tlsHandshakeFailed"] == 2)
        await alice.close()
        await anonymous.close()
        await stop(server)
    }

    @Test("mutual TLS with access control: a trusted certificate no user names gets ERROR unauthorized, then the close: binary, text, WebSocket")
    func unnamedCertificateIsRefused() async throws {
        let rules = AccessRules(users: [.init(name: "alice", certificateSubject: TestCertificates.aliceSubject)],
                                anonymous: .init(allow: .init(call: ["switchboard/echo", "switchboard/stats"])))
        let server = try startTLSServer(clientCA: true, plugins: PluginConfiguration.plugins(reading: LiveSettings(PluginConfiguration(access: rules))))
        do {
            let bob = try await connectTLS(server, certificate: "bob")
            let _: ChannelValue = try await echo(bob).invokeMethod("echo")
            Issue.record("a certificate no user names was served")
        } catch {
            #expect("\(error)".contains("unauthorized"), "\(error)")
        }
        let line = Array(#"{"id":7,"call":"switchboard/echo","method":"echo","args":1}"#.utf8) + [10]
        let text = String(decoding: try tlsExchange(port: server.tlsPort, certificate: "bob", send: line) { $0.contains(10) }, as: UTF8.self)
        #expect(text.hasPrefix(#"{"error":{"code":"unauthorized""#), "\(text)")  // refused at its first bytes: no id yet
        let upgrade = Array(("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").utf8)
        let overWebSocket = try tlsExchange(port: server.tlsPort, certificate: "bob",
                                            send: upgrade + webSocketText(#"{"id":7,"call":"switchboard/echo","method":"echo"}"#)) { _ in false }
        let messages = webSocketMessages(overWebSocket)
        #expect(messages.count == 2 && messages[0].opcode == 1
                    && String(decoding: messages[0].payload, as: UTF8.self).hasPrefix(#"{"error":{"code":"unauthorized""#))
        #expect(messages.last?.opcode == 8 && messages.last?.payload.prefix(2) == [0x03, 0xF0])  // then the close, 1008
        let alice = try await connectTLS(server, certificate: "alice")
        #expect(try await echo(alice).invokeMethod("echo", arguments: "alice") == "alice")
        #expect(try await closeCounts(server)["unauthorized"] == 3)
        await alice.close()
        await stop(server)
    }

    /// Records the identity every request comes with.
    struct IdentityProbe: Plugin, InboundGate {
        final class Seen: Sendable { let identities = Mutex<[String?]>([]) }
        let name = "probe"
        let seen = Seen()
        var inbound: [any InboundProcessor] { [self] }
        func judge(_ connection: ConnectionContext, channel: String, kind: InboundKind) -> GateVerdict {
            seen.identities.withLock { $0.append(connection.identity) }
            return .admit
        }
    }

    /// Refuses every certificate, whatever the HELLO says.
    struct CertificateBouncer: Plugin {
        let name = "bouncer"
        func authenticate(_ hello: Hello, connection: ConnectionContext) -> Authentication {
            hello.certificateSubject == nil ? .pass : .refuse
        }
    }

    @Test("a certificate the plugins refuse gets ERROR unauthorized, then the close, not a silent close")
    func refusedCertificateIsTold() async throws {
        let server = try startTLSServer(clientCA: true, plugins: [CertificateBouncer()])
        do {
            let alice = try await connectTLS(server, certificate: "alice")
            let _: ChannelValue = try await echo(alice).invokeMethod("echo")
            Issue.record("a refused certificate was let in")
        } catch {
            #expect("\(error)".contains("unauthorized"), "\(error)")
        }
        let closes = try await closeCounts(server)
        #expect(closes["unauthorized"] == 1, "\(closes)")
        await stop(server)
    }

    @Test("without an access plugin, a verified certificate's subject is the connection's identity from its first request")
    func certificateIdentity() async throws {
        let probe = IdentityProbe()
        let server = try startTLSServer(clientCA: true, plugins: [probe])
        let alice = try await connectTLS(server, certificate: "alice")
        let _: ChannelValue = try await echo(alice).invokeMethod("echo")
        #expect(probe.seen.identities.withLock { $0 }.last == TestCertificates.aliceSubject)
        await alice.close()
        await stop(server)
    }

    @Test("a TLS client with no server name is refused when made, and the half-made transport frees its SSL once")
    func clientNeedsAServerName() throws {
        let loop = try EventLoop()
        let context = try TLSContext.client(caFile: TestCertificates.path("ca.pem"))
        for name in [nil, ""] as [String?] {
            #expect(throws: TLSError.self) { _ = try TLSTransport(over: InMemoryTransport(), context: context, serverName: name, loop: loop) }
        }
    }

    @Test("wss: an upgrade from another origin with a trusted client certificate is refused (1008); from the server's own it is served")
    func webSocketOriginOverTLS() async throws {
        let rules = AccessRules(users: [.init(name: "alice", certificateSubject: TestCertificates.aliceSubject,
                                              allow: .init(call: ["switchboard/*"]))])
        let server = try startTLSServer(clientCA: true, plugins: PluginConfiguration.plugins(reading: LiveSettings(PluginConfiguration(access: rules))))
        let port = server.tlsPort
        let evil = try tlsExchange(port: port, certificate: "alice", send: webSocketUpgrade(port: port, origin: "https://evil.example")) {
            firstWebSocketMessage($0) != nil
        }
        let close = try #require(firstWebSocketMessage(evil), "\(String(decoding: evil, as: UTF8.self))")
        #expect(close.opcode == 8 && close.payload.prefix(2) == [0x03, 0xF0])  // 1008
        let call = webSocketText(#"{"id":1,"call":"switchboard/echo","method":"echo","args":"alice"}"#)
        for origin in ["https://127.0.0.1:\(port)", "wss://127.0.0.1:\(port)"] {
            let own = try tlsExchange(port: port, certificate: "alice", send: webSocketUpgrade(port: port, origin: origin) + call) {
                firstWebSocketMessage($0) != nil
            }
            let reply = try #require(firstWebSocketMessage(own))
            #expect(reply.opcode == 1 && String(decoding: reply.payload, as: UTF8.self) == #"{"id":1,"result":"alice"}"#)
        }
        await stop(server)
    }

    @Test("the Swift client over ws:// and wss://: a small call, a 200 KiB call (frames past 64 KiB), a stream to its end")
    func clientOverWebSocket() async throws {
        let server = try startTLSServer()
        for secure in [false, true] {
            var config = ClientConfiguration(port: secure ? server.tlsPort : server.port)
            config.reconnect = nil
            config.requestTimeout = .seconds(5)
            config.webSocket = true
            if secure { config.tls = try TLSContext.client(caFile: TestCertificates.path("ca.pem")) }
            let client = try await Client.connect(config)
            #expect(try await echo(client).invokeMethod("echo", arguments: "over WebSocket") == "over WebSocket")
            let big = ChannelValue.uint8List((0..<200_000).map { UInt8(truncatingIfNeeded: $0 &* 7) })
            let back: ChannelValue = try await echo(client).invokeMethod("echo", arguments: big)
            #expect(back == big, "secure: \(secure)")
            var ticks: [ChannelValue] = []
            for try await tick in EventChannel(name: "switchboard/ticker", client: client)
                .receiveBroadcastStream(arguments: ["count": 5, "intervalMs": 0]) { ticks.append(tick) }
            #expect(ticks == [0, 1, 2, 3, 4])
            await client.close()
        }
        await stop(server)
    }
}
