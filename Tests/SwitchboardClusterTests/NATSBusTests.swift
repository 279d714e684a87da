#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Logging
import Testing
import SwitchboardCluster
import SwitchboardTesting
import SwitchboardTransport

/// A nats-server on a free loopback port, for as long as the value lives.
final class NATSServerProcess {
    /// The nats-server binary, if installed (`scripts/setup` installs Debian's).
    static let path = ["/usr/bin/nats-server", "/usr/sbin/nats-server", "/usr/local/bin/nats-server"]
        .first { FileManager.default.isExecutableFile(atPath: $0) }

    let port: Int
    /// A configuration file's text (such as `max_payload: 2048`), if any.
    let configuration: String?
    private var process: ChildProcess?

    init(port: Int? = nil, configuration: String? = nil) throws {
        self.port = port ?? Self.freePort()
        self.configuration = configuration
        try start()
    }

    func start() throws {
        var arguments = ["-a", "127.0.0.1", "-p", "\(port)"]
        if let configuration {
            let file = FileManager.default.temporaryDirectory.appendingPathComponent("nats-\(port).conf")
            try configuration.write(to: file, atomically: true, encoding: .utf8)
            arguments += ["-c", file.path]
        }
        process = try ChildProcess(try #require(Self.path), arguments)
        _ = waitUntil(2) { Self.accepts(port) }
    }

    func stop() {
        process?.signal(SIGCONT)  // a stopped server would never hear the SIGTERM
        process?.stop()
        process = nil
    }

    /// Sends `signal` to the server (SIGSTOP: it still accepts connections, but answers nothing).
    func signal(_ signal: Int32) { process?.signal(signal) }

    deinit { stop() }

    static func freePort() -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) } }
        _ = withUnsafeMutablePointer(to: &address) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) } }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    static func accepts(_ port: Int) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0 }
        }
    }
}

extension Trait where Self == ConditionTrait {
    /// Runs a suite only where nats-server is installed; elsewhere it is skipped, and says so loudly.
    static var needsNATSServer: Self {
        .enabled(if: NATSServerProcess.path != nil, "NATS SERVER NOT INSTALLED: the cluster is NOT tested (scripts/setup installs it)")
    }
}

/// One loop, driven by the test's thread, with buses on it.
final class BusHarness {
    let loop: EventLoop
    private var buses: [NATSBus] = []

    init() throws { loop = try EventLoop() }

    func bus(_ name: String, servers: [NATSBus.Server]) throws -> NATSBus {
        var options = NATSBus.Options(servers: servers, name: name)
        options.pingIntervalMs = 200
        let bus = try NATSBus(loop: loop, options: options, logger: Logger(label: "test"))
        bus.start()
        buses.append(bus)
        return bus
    }

    /// Runs the loop until `condition` holds; false after `timeoutMs`.
    @discardableResult
    func run(until condition: () -> Bool, timeoutMs: Int = 5000) -> Bool {
        waitUntil(Double(timeoutMs) / 1000) {
            if condition() { return true }
            loop.runOnce()
            return condition()
        }
    }

    func run(forMs ms: Int) {
        let deadline = Date().addingTimeInterval(Double(ms) / 1000)
        while Date() < deadline { loop.runOnce(); usleep(500) }  // real time: the loop talks to nats-server, whose clock is its own
    }

    deinit {
        for bus in buses { bus.close() }
        loop.finishDriving()
    }
}

@Suite("NATS bus against nats-server", .needsNATSServer)
struct NATSBusTests {
    @Test("publish and subscribe, queue groups, unsubscribe")
    func pubSub() throws {
        let server = try NATSServerProcess()
        let harness = try BusHarness()
        let endpoint = NATSBus.Server(host: "127.0.0.1", port: server.port)
        let a = try harness.bus("a", servers: [endpoint]), b = try harness.bus("b", servers: [endpoint])
        var seen: [String] = [], queued: [String: Int] = [:]
        let all = try b.subscribe("room.*", queue: nil) { seen.append(String(decoding: $0.payload, as: UTF8.self)) }
        _ = try a.subscribe("work", queue: "q") { _ in queued["a", default: 0] += 1 }
        _ = try b.subscribe("work", queue: "q") { _ in queued["b", default: 0] += 1 }
        #expect(harness.run { a.isConnected && b.isConnected })
        harness.run(forMs: 50)  // both buses' SUBs have reached the server (each PONG confirmed its own)
        for i in 0..<5 { try a.publish("room.\(i)", headers: [], payload: Array("m\(i)".utf8)) }
        for _ in 0..<40 { try a.publish("work", headers: [], payload: []) }
        #expect(harness.run { seen.count == 5 && queued.values.reduce(0, +) == 40 })
        #expect(seen == ["m0", "m1", "m2", "m3", "m4"])  // in order per publisher
        b.unsubscribe(all)
        try a.publish("room.9", headers: [], payload: [])
        harness.run(forMs: 100)
        #expect(seen.count == 5)
        #expect(a.counters.messagesOut == 46 && b.counters.messagesIn >= 5)
    }

    @Test("what NATS cannot carry is refused before it is sent: bad subjects, queues, headers, a message over INFO's max_payload")
    func refusals() throws {
        let server = try NATSServerProcess(configuration: "max_payload: 2048\n")
        let harness = try BusHarness()
        let bus = try harness.bus("a", servers: [NATSBus.Server(host: "127.0.0.1", port: server.port)])
        #expect(harness.run { bus.isConnected })
        #expect(bus.maxPayload == 2048)
        var seen: [BusMessage] = []
        _ = try bus.subscribe(">", queue: nil) { seen.append($0) }
        harness.run(forMs: 50)
        for subject in ["a b", "a\r\nPUB x 1", "", "a..b", ".a", "a.", "tab\there"] {
            #expect(throws: BusError.invalidSubject(subject)) { try bus.publish(subject, headers: [], payload: []) }
            #expect(throws: BusError.invalidSubject(subject)) { try bus.subscribe(subject, queue: nil) { _ in } }
        }
        #expect(throws: BusError.invalidSubject("q w")) { try bus.subscribe("ok", queue: "q w") { _ in } }
        #expect(throws: BusError.invalidHeader("Bad Name")) { try bus.publish("ok", headers: [.init("Bad Name", "v")], payload: []) }
        #expect(throws: BusError.invalidHeader("X")) { try bus.publish("ok", headers: [.init("X", "v\r\nPUB y 0")], payload: []) }
        #expect(throws: BusError.tooLarge(2049, limit: 2048)) { try bus.publish("ok", headers: [], payload: [UInt8](repeating: 0, count: 2049)) }
        #expect(throws: BusError.tooLarge(2060, limit: 2048)) {
            try bus.request("ok", headers: [.init("H", "")], payload: [UInt8](repeating: 0, count: 2043), timeoutMs: 100) { _ in }
        }
        try bus.publish("ok", headers: [.init("X-Fine", "tab\tand spaces")], payload: [UInt8](repeating: 1, count: 2048 - 12 - 24))  // exactly the limit
        #expect(harness.run { seen.count == 1 })
        harness.run(forMs: 50)
        #expect(seen.map(\.subject) == ["ok"] && bus.isConnected && bus.counters.serverErrors == 0 && bus.counters.reconnects == 0)
    }

    @Test("a server that takes more than a bus reads in is held to what the bus reads (8 MiB)")
    func maxPayloadIsTheSmallerLimit() throws {
        let server = try NATSServerProcess(configuration: "max_payload: 16777216\n")
        let harness = try BusHarness()
        let bus = try harness.bus("a", servers: [NATSBus.Server(host: "127.0.0.1", port: server.port)])
        #expect(harness.run { bus.isConnected })
        #expect(bus.maxPayload == 8 << 20)
        #expect(throws: BusError.tooLarge((8 << 20) + 1, limit: 8 << 20)) {
            try bus.publish("ok", headers: [], payload: [UInt8](repeating: 0, count: (8 << 20) + 1))
        }
    }

    @Test("request and reply; no responders answered fast; a timeout")
    func requestReply() throws {
        let server = try NATSServerProcess()
        let harness = try BusHarness()
        let endpoint = NATSBus.Server(host: "127.0.0.1", port: server.port)
        let caller = try harness.bus("caller", servers: [endpoint]), holder = try harness.bus("holder", servers: [endpoint])
        _ = try holder.subscribe("svc.upper", queue: "holders") { request in
            try? holder.reply(to: request, headers: [.init("Node", "holder")], payload: Array(String(decoding: request.payload, as: UTF8.self).uppercased().utf8))
        }
        _ = try holder.subscribe("svc.silent", queue: nil) { _ in }
        #expect(harness.run { caller.isConnected && holder.isConnected })
        harness.run(forMs: 50)
        var replies: [BusReply] = []
        try caller.request("svc.upper", headers: [], payload: Array("hi".utf8), timeoutMs: 2000) { replies.append($0) }
        let start = Date()
        try caller.request("svc.nobody", headers: [], payload: [], timeoutMs: 2000) { replies.append($0) }
        #expect(harness.run { replies.count == 2 })
        #expect(Date().timeIntervalSince(start) < 1)  // no responders comes back at once, not at the timeout
        guard case .reply(let reply)? = replies.first(where: { if case .reply = $0 { true } else { false } }) else {
            Issue.record("no reply: \(replies)"); return
        }
        #expect(reply.payload == Array("HI".utf8) && reply.header("Node") == "holder")
        #expect(replies.contains(.noResponders))
        try caller.request("svc.silent", headers: [], payload: [], timeoutMs: 100) { replies.append($0) }
        #expect(harness.run { replies.count == 3 })
        #expect(replies.last == .timedOut)
    }

    @Test("a nats-server restart: open requests fail, publishes meanwhile are dropped and counted, the bus reconnects and resubscribes")
    func restart() throws {
        let server = try NATSServerProcess()
        let harness = try BusHarness()
        let endpoint = NATSBus.Server(host: "127.0.0.1", port: server.port)
        let a = try harness.bus("a", servers: [endpoint]), b = try harness.bus("b", servers: [endpoint])
        var seen: [String] = []
        _ = try b.subscribe("news", queue: nil) { seen.append(String(decoding: $0.payload, as: UTF8.self)) }
        _ = try b.subscribe("svc.hang", queue: nil) { _ in }
        var changes: [Bool] = []
        a.onConnectionChange = { changes.append($0) }
        #expect(harness.run { a.isConnected && b.isConnected })
        harness.run(forMs: 50)
        var outcome: BusReply?
        try a.request("svc.hang", headers: [], payload: [], timeoutMs: 10_000) { outcome = $0 }
        harness.run(forMs: 50)
        server.stop()
        #expect(harness.run { !a.isConnected && !b.isConnected })
        #expect(outcome == .disconnected)
        try a.publish("news", headers: [], payload: Array("lost".utf8))
        #expect(a.counters.dropped == 1)
        try server.start()
        #expect(harness.run { a.isConnected && b.isConnected })
        harness.run(forMs: 50)
        try a.publish("news", headers: [], payload: Array("after".utf8))
        #expect(harness.run { seen == ["after"] })
        #expect(a.counters.reconnects == 1 && b.counters.reconnects == 1)
        #expect(changes == [true, false, true])
    }

    @Test("a stopped nats-server: the bus notices within two unanswered pings and counts what it published since the last PONG as possibly lost")
    func possiblyLost() throws {
        let server = try NATSServerProcess()
        let harness = try BusHarness()
        let bus = try harness.bus("a", servers: [NATSBus.Server(host: "127.0.0.1", port: server.port)])
        #expect(harness.run { bus.isConnected })
        server.signal(SIGSTOP)
        defer { server.signal(SIGCONT) }
        for _ in 0..<10 { try bus.publish("news", headers: [], payload: Array("into the void".utf8)) }
        let stoppedAt = Date()
        // Bound: pings every 200 ms here, two unanswered: under a second, two on a loaded machine.
        #expect(harness.run(until: { !bus.isConnected }, timeoutMs: 5000))
        #expect(Date().timeIntervalSince(stoppedAt) < 2)
        #expect(bus.counters.possiblyLost == 10 && bus.counters.messagesOut == 10 && bus.counters.dropped == 0)
    }

    @Test("several servers: a bus whose first server is down connects to the next")
    func failover() throws {
        let server = try NATSServerProcess()
        let harness = try BusHarness()
        let down = NATSBus.Server(host: "127.0.0.1", port: NATSServerProcess.freePort())
        let bus = try harness.bus("a", servers: [down, NATSBus.Server(host: "127.0.0.1", port: server.port)])
        #expect(harness.run { bus.isConnected })
    }
}
