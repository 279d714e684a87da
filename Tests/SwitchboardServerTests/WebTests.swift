import Foundation
import Synchronization
import Testing
import SwitchboardCodec
import SwitchboardPlugins
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire
@testable import SwitchboardTransport

/// A WebSocket client made of raw bytes (RFC 6455): masked frames out, the server's frames in.
final class RawWebSocket {
    let socket: RawSocket
    /// The server's answer to the upgrade request.
    private(set) var handshake = ""

    /// Upgrades a connection to `port`, with `origin` if given, and `host` (by default `127.0.0.1:PORT`,
    /// as a browser sends it) as its `Host`.
    init?(port: Int, origin: String? = nil, host: String? = nil) {
        guard let socket = RawSocket(port: port) else { return nil }
        self.socket = socket
        socket.send("GET / HTTP/1.1\r\nHost: \(host ?? "127.0.0.1:\(port)")\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            + "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
            + (origin.map { "Origin: \($0)\r\n" } ?? "") + "\r\n")
        var head: [UInt8] = []
        while !head.ends(with: [13, 10, 13, 10]) {
            let byte = socket.read(exactly: 1)
            guard !byte.isEmpty else { return nil }
            head += byte
        }
        handshake = String(decoding: head, as: UTF8.self)
    }

    /// Sends one message (opcode 1 text, 2 binary, 8 close, 9 ping), masked as a client must.
    func send(opcode: UInt8, _ payload: [UInt8]) {
        var frame: [UInt8] = [0x80 | opcode]
        if payload.count < 126 {
            frame.append(0x80 | UInt8(payload.count))
        } else {
            frame += [0x80 | 126, UInt8(payload.count >> 8), UInt8(payload.count & 0xFF)]
        }
        let mask: [UInt8] = [0x12, 0x34, 0x56, 0x78]
        frame += mask
        frame += payload.enumerated().map { $0.element ^ mask[$0.offset % 4] }
        socket.send(frame)
    }

    /// The next frame from the server: opcode and payload; nil when the connection ends.
    func receive() -> (opcode: UInt8, payload: [UInt8])? {
        let header = socket.read(exactly: 2)
        guard header.count == 2 else { return nil }
        var length = Int(header[1] & 0x7F)
        if length == 126 {
            length = socket.read(exactly: 2).reduce(0) { $0 << 8 | Int($1) }
        } else if length == 127 {
            length = socket.read(exactly: 8).reduce(0) { $0 << 8 | Int($1) }
        }
        return (header[0] & 0x0F, socket.read(exactly: length))
    }

    /// The Switchboard frames in a message's payload (binary mode): none when there is no message.
    static func frames(_ message: (opcode: UInt8, payload: [UInt8])?) throws -> [Frame] {
        var buffer = InboundBuffer()
        buffer.append(message?.payload ?? [])
        var decoder = FrameDecoder(maxFrame: 1 << 20)
        var out: [Frame] = []
        while case .frame(let frame)? = try decoder.next(from: &buffer) { out.append(frame) }
        return out
    }

    /// The close code of a close frame's payload.
    static func closeCode(_ payload: [UInt8]) -> Int? {
        payload.count >= 2 ? Int(payload[0]) << 8 | Int(payload[1]) : nil
    }
}

extension Array where Element == UInt8 {
    func ends(with suffix: [UInt8]) -> Bool { count >= suffix.count && Array(self[(count - suffix.count)...]) == suffix }
}

/// An HTTP GET over a raw socket (from `host`, an address of this machine), with `headers`: the status
/// code and the body.
func httpGet(_ path: String, port: Int, from host: String = "127.0.0.1", headers: [String] = []) -> (status: Int, body: String)? {
    guard let socket = RawSocket(host: host, port: port) else { return nil }
    socket.send("GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\n" + headers.map { $0 + "\r\n" }.joined() + "\r\n")
    guard let reply = socket.readUntilClosed() else { return nil }
    let text = String(decoding: reply.bytes, as: UTF8.self)
    guard let status = text.split(separator: " ").dropFirst().first.flatMap({ Int($0) }),
          let bodyStart = text.range(of: "\r\n\r\n") else { return nil }
    return (status, String(text[bodyStart.upperBound...]))
}

@Suite("HTTP and WebSocket on the server's port")
struct WebTests {
    @Test("healthz 200 while serving, 503 while draining; 404; a malformed request gets 400 and a close; POST is binary")
    func httpEndpoints() async throws {
        let held = Mutex<[MethodResult]>([])
        // The drain lasts until the test answers the held call (or its caller goes), not for a time: a loaded
        // suite can hold this test's thread up past any drain timeout, which ends the drain and closes the port
        // before the 503 is asked for.
        try await withServer({ $0.drainTimeoutMs = 60_000 }, setUp: { server in
            MethodChannel(name: "test/hang", server: server).setMethodCallHandler { _, result in held.withLock { $0.append(result) } }
        }) { server, port in
            let health = try #require(httpGet("/healthz", port: port))
            #expect(health.status == 200 && health.body.contains(#""status":"serving""#))
            #expect(httpGet("/nope", port: port)?.status == 404)
            let garbage = try #require(RawSocket(port: port))
            garbage.send("GARBAGE \u{1}\r\n\r\n")
            let answer = garbage.readUntilClosed()?.bytes ?? []
            #expect(String(decoding: answer, as: UTF8.self).hasPrefix("HTTP/1.1 400 "))
            // Only `G` selects HTTP (wire-v1 section 1): "POST" is a binary frame's length, far too large.
            let post = try #require(RawSocket(port: port))
            post.send("POST / HTTP/1.1\r\nHost: x\r\n\r\n")
            let refusal = String(decoding: post.readUntilClosed()?.bytes ?? [], as: UTF8.self)
            #expect(refusal.contains("frame_too_large") && !refusal.contains("HTTP/1.1"))
            let caller = try #require(RawSocket(port: port))
            caller.send(try Frame.call(1, "test/hang", "wait").bytes)
            #expect(try await eventually { !held.withLock { $0.isEmpty } })
            server.shutdown()
            var draining: (status: Int, body: String)?
            #expect(try await eventually {  // once the loop has begun the drain
                draining = httpGet("/healthz", port: port)
                return draining?.status == 503
            })
            #expect(draining?.body.contains(#""status":"draining""#) == true)
            // The caller stays connected until now: its close would cancel the call and end the drain.
            withExtendedLifetime(caller) { held.withLock { $0.first?.success(.null) } }
        }
    }

    @Test("metrics: every counter in Prometheus text, per-channel counters past the channel limit summed as other")
    func metrics() async throws {
        try await withServer({ $0.metrics = .prometheus(channelLimit: 3) }) { _, port in
            let caller = try #require(RawSocket(port: port))
            for id: UInt32 in 1...3 { caller.send(try Frame.call(id, "switchboard/echo", "echo", .int(Int(id))).bytes) }
            _ = caller.read(exactly: 3 * 18)  // three replies: a 12-byte header and a 6-byte envelope each
            let text = try #require(httpGet("/metrics", port: port)).body
            let samples = Dictionary(text.split(separator: "\n").filter { !$0.hasPrefix("#") }.compactMap { line -> (String, Double)? in
                guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { return nil }
                return (String(line[..<space]), value)
            }, uniquingKeysWith: { first, _ in first })
            #expect(samples["switchboard_frames_in_total"] == 3)
            #expect(samples["switchboard_connections"] == 2)  // the caller and this request
            let channelLabels = samples.keys.filter { $0.hasPrefix("switchboard_channel_requests_total{") }
            #expect(channelLabels.count == 4)  // three channels of their own, and other
            #expect(samples[#"switchboard_channel_requests_total{channel="other"}"#] != nil)
            let echo = samples[#"switchboard_channel_requests_total{channel="switchboard/echo"}"#]
            #expect(echo == 3 || samples[#"switchboard_channel_requests_total{channel="other"}"#] ?? 0 >= 3)
        }
    }

    @Test("/metrics: every family has a # HELP line before its # TYPE (promtool check metrics wants one)")
    func metricsHaveHelp() async throws {
        try await withServer { _, port in
            let caller = try #require(RawSocket(port: port))
            caller.send(try Frame.call(1, "switchboard/echo", "echo", .int(1)).bytes)
            _ = caller.read(exactly: 18)
            let lines = try #require(httpGet("/metrics", port: port)).body.split(separator: "\n")
            let types = lines.indices.filter { lines[$0].hasPrefix("# TYPE ") }
            #expect(types.count >= 15)
            for index in types {
                let family = lines[index].split(separator: " ")[2]
                #expect(index > 0 && lines[index - 1].hasPrefix("# HELP \(family) "), "\(family) has no HELP")
            }
        }
    }

    @Test("/metrics with --token wants that token as a bearer: 401 without it; /healthz and the console page stay open")
    func metricsWithToken() async throws {
        try await withServer({ $0.token = "s3cret" }) { _, port in
            for headers in [[], ["Authorization: Bearer wrong"], ["Authorization: Basic s3cret"], ["Authorization: Bearer"]] {
                let refused = try #require(httpGet("/metrics", port: port, headers: headers))
                #expect(refused.status == 401 && !refused.body.contains("switchboard_"), "\(headers)")
            }
            let metrics = try #require(httpGet("/metrics", port: port, headers: ["authorization: bearer  s3cret"]))
            #expect(metrics.status == 200 && metrics.body.contains("switchboard_connections"))
            #expect(httpGet("/healthz", port: port)?.status == 200)
            #expect(httpGet("/", port: port)?.status == 200)
        }
    }

    @Test("/metrics with access control: 401 without a known token, 403 for a user without switchboard/stats, 200 with it")
    func metricsWithAccessControl() async throws {
        let plugins = PluginConfiguration.plugins(reading: LiveSettings(PluginConfiguration(access: accessRules())))
        try await withServer(setUp: { server in for plugin in plugins { server.load(plugin) } }) { _, port in
            let holder = try RawConnection(port: port)
            try holder.send(hello(token: "bob-token"))
            try holder.send(Frame(.register, id: 2, channel: "payroll/alice@example.com", payload: nil))
            _ = try await holder.frame()
            #expect(try await holder.frame().kind == .reply)
            for (headers, status) in [([], 401), (["Authorization: Bearer nobody-token"], 401), (["Authorization: Bearer alice-token"], 403)] {
                let refused = try #require(httpGet("/metrics", port: port, headers: headers))
                #expect(refused.status == status && !refused.body.contains("payroll"), "\(headers)")
            }
            let metrics = try #require(httpGet("/metrics", port: port, headers: ["Authorization: Bearer bob-token"]))
            #expect(metrics.status == 200 && metrics.body.contains("payroll/alice@example.com"))
            #expect(httpGet("/healthz", port: port)?.status == 200)
        }
    }

    @Test("/metrics with no token and no access control: loopback clients only; another address gets 403")
    func metricsUnconfigured() async throws {
        let address = try #require(RawSocket.nonLoopbackAddress, "this machine has no address but loopback")
        try await withServer({ $0.host = "0.0.0.0" }) { _, port in
            let remote = try #require(httpGet("/metrics", port: port, from: address))
            #expect(remote.status == 403 && !remote.body.contains("switchboard_"))
            #expect(httpGet("/healthz", port: port, from: address)?.status == 200)
            #expect(httpGet("/metrics", port: port)?.status == 200)
        }
    }

    @Test("a page that made its own name resolve to 127.0.0.1 (DNS rebinding) is not a loopback client: no /metrics, no introspection")
    func dnsRebinding() async throws {
        try await withServer { _, port in
            let rebound = try #require(RawSocket(port: port))
            rebound.send("GET /metrics HTTP/1.1\r\nHost: attacker.example:\(port)\r\n\r\n")
            let answer = String(decoding: rebound.readUntilClosed()?.bytes ?? [], as: UTF8.self)
            #expect(answer.hasPrefix("HTTP/1.1 403 "))
            let socket = try #require(RawWebSocket(port: port, origin: "http://attacker.example:\(port)", host: "attacker.example:\(port)"))
            socket.send(opcode: 1, Array(#"{"id":1,"call":"switchboard/connections","method":"list"}"#.utf8))
            let line = try #require(socket.receive())
            #expect(try JSONText.parse(line.payload)["error"]?["code"] == "forbidden")
            let local = try #require(RawWebSocket(port: port, origin: "http://localhost:\(port)", host: "localhost:\(port)"))
            local.send(opcode: 1, Array(#"{"id":1,"call":"switchboard/connections","method":"list"}"#.utf8))
            #expect(try JSONText.parse(try #require(local.receive()).payload)["result"]?["total"] != nil)
        }
    }

    @Test("/metrics honours rights that name methods: a user denied switchboard/stats#get is refused")
    func metricsAndMethodRights() async throws {
        let rules = AccessRules(users: [
            .init(name: "lister", tokenSha256: sha("list-token"), allow: .init(call: ["switchboard/*#list"])),
            .init(name: "nostats", tokenSha256: sha("nostats-token"), deny: .init(call: ["switchboard/stats#get"])),
            .init(name: "reader", tokenSha256: sha("reader-token"), allow: .init(call: ["switchboard/stats#get"])),
        ])
        let plugins = PluginConfiguration.plugins(reading: LiveSettings(PluginConfiguration(access: rules)))
        try await withServer(setUp: { server in for plugin in plugins { server.load(plugin) } }) { _, port in
            for (token, status) in [("list-token", 403), ("nostats-token", 403), ("reader-token", 200)] {
                #expect(httpGet("/metrics", port: port, headers: ["Authorization: Bearer \(token)"])?.status == status, "\(token)")
            }
        }
    }

    @Test("loopback peers, as /metrics tells them apart; bearer tokens")
    func loopbackAndBearer() {
        for address in ["127.0.0.1:5000", "127.9.8.7:1", "[::1]:5000", "[::FFFF:127.0.0.1]:80"] {
            #expect(isLoopbackAddress(address), "\(address)")
        }
        for address in ["192.0.2.2:5000", "[::2]:5000", "[fd00::1]:1", "127.0.0.1.evil:1", "1270.0.0.1:1", "memory", "unknown"] {
            #expect(!isLoopbackAddress(address), "\(address)")
        }
        var head = HTTPRequestHead()
        head.headers = [("Authorization", "BEARER   t0k")]
        #expect(ServerCore.bearerToken(head) == "t0k")
        head.headers = [("Authorization", "Bearer ")]
        #expect(ServerCore.bearerToken(head) == nil)
    }

    @Test("metrics: a channel that goes takes its series with it")
    func metricsForgetGoneChannels() async throws {
        try await withServer({ $0.metrics = .prometheus(channelLimit: 100) }) { _, port in
            let holder = try RawConnection(port: port)
            try holder.send(Frame(.register, id: 1, channel: "app/gone", payload: nil))
            _ = try await holder.frame()
            let series = #"switchboard_channel_requests_total{channel="app/gone"}"#
            #expect(try #require(httpGet("/metrics", port: port)).body.contains(series))
            try holder.send(Frame(.unregister, id: 2, channel: "app/gone", payload: nil))
            _ = try await holder.frame()
            let after = try #require(httpGet("/metrics", port: port)).body
            #expect(!after.contains(series) && after.contains(#"switchboard_channel_requests_total{channel="switchboard/echo"}"#))
        }
    }

    @Test("WebSocket: one binary frame per binary message, one text line per text message, the accept key, a clean close")
    func webSocketFraming() async throws {
        try await withServer { _, port in
            let binary = try #require(RawWebSocket(port: port))
            #expect(binary.handshake.hasPrefix("HTTP/1.1 101 "))
            #expect(binary.handshake.contains("Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n"))  // RFC 6455's example
            binary.send(opcode: 2, try Frame.call(7, "switchboard/echo", "echo", "hi").bytes + [])
            let reply = try #require(binary.receive())
            #expect(reply.opcode == 2)
            var buffer = InboundBuffer()
            buffer.append(reply.payload)
            var decoder = FrameDecoder(maxFrame: 1 << 20)
            guard case .frame(let frame)? = try decoder.next(from: &buffer) else { Issue.record("no frame"); return }
            #expect(frame.id == 7 && buffer.readableBytes == 0)  // exactly one frame in the message
            #expect(try frame.envelope() == .success("hi"))
            binary.send(opcode: 8, [0x03, 0xE8])  // close, 1000
            let close = try #require(binary.receive())
            #expect(close.opcode == 8 && RawWebSocket.closeCode(close.payload) == 1000)

            let text = try #require(RawWebSocket(port: port))
            text.send(opcode: 1, Array(#"{"id":1,"call":"switchboard/echo","method":"echo","args":[1,"two"]}"#.utf8))
            text.send(opcode: 9, Array("ping".utf8))
            let line = try #require(text.receive())
            #expect(line.opcode == 1 && String(decoding: line.payload, as: UTF8.self) == #"{"id":1,"result":[1,"two"]}"#)
            let pong = try #require(text.receive())
            #expect(pong.opcode == 10 && pong.payload == Array("ping".utf8))
        }
    }

    @Test("WebSocket close codes: 1009 over maxFrame, 1008 for a refused origin, GOAWAY then 1001 on shutdown")
    func webSocketCloseCodes() async throws {
        try await withServer({ $0.maxFrame = 256; $0.webSocketOrigins = ["https://*.good.example"] }) { server, port in
            let big = try #require(RawWebSocket(port: port))
            big.send(opcode: 2, [UInt8](repeating: 0, count: 1000))
            var close = try #require(big.receive())
            #expect(close.opcode == 8 && RawWebSocket.closeCode(close.payload) == 1009)

            let evil = try #require(RawWebSocket(port: port, origin: "https://evil.example"))
            close = try #require(evil.receive())
            #expect(close.opcode == 8 && RawWebSocket.closeCode(close.payload) == 1008)
            let good = try #require(RawWebSocket(port: port, origin: "https://app.good.example"))
            good.send(opcode: 2, try Frame.call(1, "switchboard/echo", "echo", 1).bytes)
            #expect(good.receive()?.opcode == 2)

            server.shutdown()
            let goAway = try #require(good.receive())
            var buffer = InboundBuffer()
            buffer.append(goAway.payload)
            var decoder = FrameDecoder(maxFrame: 1 << 20)
            guard case .frame(let frame)? = try decoder.next(from: &buffer) else { Issue.record("no GOAWAY"); return }
            #expect(goAway.opcode == 2 && frame.kind == .goAway)
            close = try #require(good.receive())
            #expect(close.opcode == 8 && RawWebSocket.closeCode(close.payload) == 1001)
        }
    }
}

extension WebTests {
    @Test("WebSocket origins: by default only an Origin matching the Host (any case, default ports); no Origin is let in; * lets every origin in")
    func webSocketOriginsByDefault() async throws {
        try await withServer { _, port in
            for origin in ["https://evil.example", "http://127.0.0.1:\(port + 1)", "null", "http://127.0.0.1", "http://127.0.0.1:\(port)/x"] {
                let socket = try #require(RawWebSocket(port: port, origin: origin))
                #expect(socket.handshake.hasPrefix("HTTP/1.1 101 "))
                let close = try #require(socket.receive(), "\(origin)")
                #expect(close.opcode == 8 && RawWebSocket.closeCode(close.payload) == 1008, "\(origin)")
            }
            let allowed: [(origin: String?, host: String?)] = [
                (nil, nil), ("http://127.0.0.1:\(port)", nil), ("HTTP://127.0.0.1:\(port)", "127.0.0.1:\(port)"),
                ("http://LocalHost:\(port)", "localhost:\(port)"), ("http://example.com", "Example.com"),
                ("http://example.com", "example.com:80"), ("ws://[::1]:\(port)", "[::1]:\(port)"),
            ]
            for (origin, host) in allowed {
                let socket = try #require(RawWebSocket(port: port, origin: origin, host: host))
                socket.send(opcode: 1, Array(#"{"id":1,"call":"switchboard/echo","method":"echo","args":1}"#.utf8))
                let line = try #require(socket.receive(), "\(origin ?? "none") from \(host ?? "-")")
                #expect(line.opcode == 1 && String(decoding: line.payload, as: UTF8.self) == #"{"id":1,"result":1}"#)
            }
            #expect(try await closeCount("webSocketRefused", port: port) == 5)
        }
        try await withServer({ $0.webSocketOrigins = ["*"] }) { _, port in
            let socket = try #require(RawWebSocket(port: port, origin: "https://evil.example"))
            socket.send(opcode: 2, try Frame.call(1, "switchboard/echo", "echo", 1).bytes)
            #expect(socket.receive()?.opcode == 2)
        }
    }

    @Test("WebSocket origins: with --ws-origin patterns, the server's own origin is still let in")
    func webSocketOwnOriginWithPatterns() async throws {
        try await withServer({ $0.webSocketOrigins = ["https://*.good.example"] }) { _, port in
            let own = try #require(RawWebSocket(port: port, origin: "http://127.0.0.1:\(port)"))
            own.send(opcode: 2, try Frame.call(1, "switchboard/echo", "echo", 1).bytes)
            #expect(own.receive()?.opcode == 2)
        }
    }

    /// How many connections `switchboard/stats` says closed for `reason`.
    func closeCount(_ reason: String, port: Int) async throws -> Int? {
        let client = try RawConnection(port: port)
        try client.send(try Frame.call(1, "switchboard/stats", "get"))
        let stats = try await client.frame().envelope()
        guard case .success(let value) = stats else { return nil }
        return value["closes"]?[reason]?.intValue
    }
}

@Suite("WebSocket layer corners")
struct WebCornerTests {
    @Test("origin patterns: * matches any run; a long hostile origin against many stars is answered at once")
    func originPatterns() {
        #expect(HTTPUpgradeTransport.matches("https://app.good.example", pattern: "https://*.good.example"))
        #expect(!HTTPUpgradeTransport.matches("https://good.example.evil", pattern: "https://*.good.example"))
        #expect(HTTPUpgradeTransport.matches("anything", pattern: "*"))
        #expect(!HTTPUpgradeTransport.matches("https://a.b", pattern: "https://a.b.c"))
        let start = Date()
        #expect(!HTTPUpgradeTransport.matches(String(repeating: "a", count: 20_000), pattern: "*a*a*a*a*a*a*a*b"))
        #expect(Date().timeIntervalSince(start) < 2)
    }

    @Test("a client's close frame is answered, then the server closes TCP; data after it is not sent")
    func peerClose() async throws {
        try await withServer { _, port in
            let socket = try #require(RawWebSocket(port: port))
            socket.send(opcode: 8, [0x03, 0xE8])
            let close = try #require(socket.receive())
            #expect(close.opcode == 8 && RawWebSocket.closeCode(close.payload) == 1000)
            #expect(socket.socket.readUntilClosed() != nil)  // the server closed TCP
        }
    }
}
