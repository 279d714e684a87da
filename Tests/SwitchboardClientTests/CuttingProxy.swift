#if canImport(Glibc)
import Glibc
#endif
import Synchronization
import SwitchboardTesting
import SwitchboardTransport
import SwitchboardWire

/// A TCP proxy on loopback between clients and a server that cuts connections: each of the first `cuts`
/// connections is cut (both sides shut down, as a tunnel or a Wi-Fi hand-over would) once a
/// random number of bytes from `budget` has passed through it, either way (the first connection
/// not before 512 bytes: a client's `connect` fails unless its handshake completes). Random numbers come from
/// `seed`, which tests print on failure. Blocking sockets, two threads per connection: a test helper.
final class CuttingProxy: Sendable {
    /// The port clients connect to.
    let port: Int
    /// The seed of the cut offsets.
    let seed: UInt64
    private let listener: Int32
    private let shared: Mutex<Shared>

    private struct Shared {
        var random: SeededRandom
        var target: Int
        var cutsLeft: Int
        var budget: ClosedRange<Int>
        var pairs: [Pair] = []
        var cuts = 0
        /// While set, no byte goes to the server (new connections wait before their HELLO arrives).
        var stallsToServer = false
        /// While set, no byte goes to clients.
        var stallsToClient = false
        /// While set, new connections are closed at once (as when the network is gone).
        var refuses = false
        /// While set, new connections hold what they read from their client until ``release(_:)``.
        var holdsNew = false
        /// Bytes that went to the server, over all connections.
        var toServer = 0
        /// The first bytes each connection got from the server (its WELCOME), in order of connection.
        var firstFromServer: [[UInt8]] = []
    }

    /// One proxied connection.
    private final class Pair: Sendable {
        let client: Int32
        let server: Int32
        let index: Int
        /// Bytes after which it is cut; nil = never.
        let budget: Int?
        let passed = Atomic<Int>(0)
        let pumpsDone = Atomic<Int>(0)
        let isCut = Atomic<Bool>(false)
        /// Bytes from the client wait in the proxy while set.
        let holds: Atomic<Bool>
        /// Bytes read from the client.
        let fromClient = Atomic<Int>(0)

        init(client: Int32, server: Int32, index: Int, budget: Int?, holds: Bool) {
            self.client = client
            self.server = server
            self.index = index
            self.budget = budget
            self.holds = Atomic(holds)
        }

        func cut() {
            guard !isCut.exchange(true, ordering: .acquiringAndReleasing) else { return }
            shutdown(client, Int32(SHUT_RDWR))
            shutdown(server, Int32(SHUT_RDWR))
        }

        /// A pump has finished: the last one closes both sockets.
        func pumpFinished() {
            cut()
            guard pumpsDone.add(1, ordering: .acquiringAndReleasing).newValue == 2 else { return }
            close(client)
            close(server)
        }
    }

    /// Listens on a free port and forwards to `target`; the first `cuts` connections are cut after a
    /// random count of bytes in `budget`.
    init(to target: Int, seed: UInt64 = UInt64.random(in: 0...UInt64.max), cuts: Int = 0, budget: ClosedRange<Int> = 1...4096) throws {
        self.seed = seed
        (listener, port) = try listenOnLoopback()
        let listener = self.listener
        shared = Mutex(Shared(random: SeededRandom(seed: seed), target: target, cutsLeft: cuts, budget: budget))
        startThread { [self] in acceptLoop(listener) }
    }

    /// Connections cut so far (by budget or ``cutAll()``).
    var cuts: Int { shared.withLock { $0.cuts } }
    /// Bytes that went to the server so far.
    var bytesToServer: Int { shared.withLock { $0.toServer } }
    /// The first bytes each connection got from the server, in order of connection.
    var firstBytesFromServer: [[UInt8]] { shared.withLock { $0.firstFromServer } }

    /// Sends new connections to another port.
    func retarget(to port: Int) { shared.withLock { $0.target = port } }
    /// Holds every byte bound for the server back (true) or lets them go (false).
    func stallToServer(_ stalls: Bool) { shared.withLock { $0.stallsToServer = stalls } }
    /// Holds every byte bound for the clients back (true) or lets them go (false).
    func stallToClient(_ stalls: Bool) { shared.withLock { $0.stallsToClient = stalls } }

    /// Makes new connections hold what their client sends (true) until ``release(_:)``, or not (false).
    func holdNew(_ holds: Bool) { shared.withLock { $0.holdsNew = holds } }

    /// Bytes connection `index` (in order of connection, from 0) has read from its client.
    func bytesFromClient(_ index: Int) -> Int { pair(index)?.fromClient.load(ordering: .acquiring) ?? 0 }

    /// Closes connection `index` toward its client only: the client sees it end, while what it sent and
    /// the proxy holds still reaches the server on ``release(_:)`` (a packet late out of a tunnel).
    func hangUpClient(_ index: Int) {
        if let pair = pair(index) { shutdown(pair.client, Int32(SHUT_RDWR)) }
    }

    /// Lets connection `index` forward what it holds, and all that follows.
    func release(_ index: Int) { pair(index)?.holds.store(false, ordering: .releasing) }

    private func pair(_ index: Int) -> Pair? { shared.withLock { s in s.pairs.first { $0.index == index } } }

    /// Closes new connections at once (true), or proxies them again (false).
    func refuseNew(_ refuses: Bool) { shared.withLock { $0.refuses = refuses } }

    /// Cuts every open connection now.
    func cutAll() {
        let pairs = shared.withLock { s in
            defer { s.pairs.removeAll { $0.isCut.load(ordering: .acquiring) } }
            return s.pairs
        }
        for pair in pairs where !pair.isCut.load(ordering: .acquiring) {
            shared.withLock { $0.cuts += 1 }
            pair.cut()
        }
    }

    /// Stops accepting and cuts every connection.
    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        cutAll()
    }

    deinit { close(listener) }

    private func acceptLoop(_ listener: Int32) {
        while true {
            let client = accept(listener, nil, nil)
            guard client >= 0 else {
                if errno == EINTR || errno == ECONNABORTED { continue }
                return
            }
            guard !shared.withLock({ $0.refuses }) else {
                close(client)
                continue
            }
            let (target, budget, index, holds) = shared.withLock { s -> (Int, Int?, Int, Bool) in
                var budget: Int?
                if s.cutsLeft > 0 {
                    s.cutsLeft -= 1
                    budget = Int.random(in: s.budget, using: &s.random)
                    if s.firstFromServer.isEmpty { budget = max(512, budget ?? 0) }
                }
                s.firstFromServer.append([])
                return (s.target, budget, s.firstFromServer.count - 1, s.holdsNew)
            }
            let server = Self.connect(to: target)
            guard server >= 0 else {
                close(client)
                continue
            }
            let pair = Pair(client: client, server: server, index: index, budget: budget, holds: holds)
            shared.withLock { s in
                s.pairs.removeAll { $0.isCut.load(ordering: .acquiring) }
                s.pairs.append(pair)
            }
            startThread { [self] in pump(pair, toServer: true) }
            startThread { [self] in pump(pair, toServer: false) }
        }
    }

    private static func connect(to port: Int) -> Int32 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = UInt16(port).bigEndian
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        }
        guard connected == 0 else {
            close(fd)
            return -1
        }
        return fd
    }

    /// Forwards one direction of `pair` until either side closes or the pair is cut.
    private func pump(_ pair: Pair, toServer: Bool) {
        defer { pair.pumpFinished() }
        let from = toServer ? pair.client : pair.server, to = toServer ? pair.server : pair.client
        var buffer = [UInt8](repeating: 0, count: 65536)
        while !pair.isCut.load(ordering: .acquiring) {
            while shared.withLock({ toServer ? $0.stallsToServer : $0.stallsToClient }), !pair.isCut.load(ordering: .acquiring) {
                usleep(500)  // a helper thread waiting for the test to release it
            }
            let count = buffer.withUnsafeMutableBytes { recv(from, $0.baseAddress, $0.count, 0) }
            guard count > 0 else { return }
            if toServer {
                pair.fromClient.add(count, ordering: .releasing)
                while pair.holds.load(ordering: .acquiring), !pair.isCut.load(ordering: .acquiring) { usleep(500) }
            }
            var forward = count
            var cutsHere = false
            if let budget = pair.budget {
                let before = pair.passed.add(count, ordering: .relaxed).oldValue
                if before + count >= budget {
                    forward = max(0, budget - before)
                    cutsHere = true
                }
            }
            shared.withLock { s in
                if toServer { s.toServer += forward }
                if !toServer, s.firstFromServer[pair.index].count < 4096 { s.firstFromServer[pair.index] += buffer[0..<forward] }
                if cutsHere, !pair.isCut.load(ordering: .acquiring) { s.cuts += 1 }
            }
            var sent = 0
            while sent < forward {
                let n = buffer.withUnsafeBytes { send(to, $0.baseAddress! + sent, forward - sent, Int32(MSG_NOSIGNAL)) }
                guard n > 0 else { return }
                sent += n
            }
            if cutsHere { return pair.cut() }
        }
    }
}


/// A listening socket on 127.0.0.1 and a free port.
func listenOnLoopback() throws -> (Int32, Int) {
    let listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { pointer in
            bind(listener, pointer, length) == 0 && listen(listener, 128) == 0 && getsockname(listener, pointer, &length) == 0
        }
    }
    guard bound else {
        close(listener)
        throw CannotListen()
    }
    return (listener, Int(UInt16(bigEndian: address.sin_port)))
}

struct CannotListen: Error {}

/// A server that plays one script on every connection: once the HELLO has arrived it writes `answer`,
/// after the client's next frame `then`, and then reads until the client closes. For answers no real
/// server gives (a WELCOME without `session` to a resuming HELLO, as a wire-v1 server would) or not on
/// demand (END).
final class ScriptedServer: Sendable {
    let port: Int
    private let listener: Int32

    init(answer: [Frame], then: [Frame] = []) throws {
        (listener, port) = try listenOnLoopback()
        let listener = self.listener
        let script = [answer, then].map { $0.flatMap(\.bytes) }
        startThread {
            while true {
                let client = accept(listener, nil, nil)
                guard client >= 0 else { return }
                startThread {
                    defer { close(client) }
                    var input: [UInt8] = []
                    for bytes in script {
                        guard Self.readFrame(client, &input) else { return }
                        _ = bytes.withUnsafeBytes { send(client, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                    }
                    while Self.readFrame(client, &input) {}
                }
            }
        }
    }

    /// Reads one whole frame from `client` into `input` and drops it; false once the client closed.
    private static func readFrame(_ client: Int32, _ input: inout [UInt8]) -> Bool {
        var chunk = [UInt8](repeating: 0, count: 65536)
        while input.count < 4 || input.count < 4 + Int(input[0..<4].reduce(0) { $0 << 8 | UInt32($1) }) {
            let n = chunk.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { return false }
            input += chunk[0..<n]
        }
        input.removeFirst(4 + Int(input[0..<4].reduce(0) { $0 << 8 | UInt32($1) }))
        return true
    }

    func stop() { shutdown(listener, Int32(SHUT_RDWR)) }

    deinit { close(listener) }
}
