import ArgumentParser
import SwitchboardCodec
import SwitchboardTransport

struct Bench: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Measure a running server (Switchboard, Redis or NATS): rpc, relay, fanout, idle or handshakes.",
        discussion: """
            Examples:
              switchboard bench rpc -c 50 -d 16 -s 32 --duration 5
              switchboard bench fanout -n 100 -s 64 -d 64
              switchboard bench idle -n 1000 --server-pid $(pgrep -f 'switchboard serve')
              switchboard bench rpc --target redis --port 6379
              switchboard bench relay -c 50 -d 16     (caller → server → holder → server → caller)
              switchboard bench rpc --tls --ca ca.pem --port 7421     (Redis too: --target redis)
              switchboard bench fanout --ws                           (WebSocket, Switchboard only)
              switchboard bench handshakes -c 8 --tls --ca ca.pem --port 7421
              switchboard bench rpc --session        (each connection in a resumable session, acknowledged)
            relay on NATS is request/reply through a responder connection (the same two hops).
            Run with a release build; quote results as ratios measured side by side in one run.
            """
    )

    enum Workload: String, ExpressibleByArgument, CaseIterable { case rpc, relay, fanout, idle, handshakes }

    @Argument(help: "rpc, relay, fanout, idle or handshakes.") var workload: Workload
    @Option(help: "switchboard, redis or nats.") var target: BenchTarget = .switchboard
    @Option(help: "Server address.") var host = "127.0.0.1"
    @Option(help: "Server port.") var port = 7420
    @Option(help: "fanout: a port for listeners (repeatable; default: --port): they are spread over these in turn, the publisher stays on --port (the nodes of a cluster).")
    var listenPort: [Int] = []
    @Option(help: "relay: the port of the holder (NATS: the responder), default --port: another node of a cluster.")
    var holderPort: Int?
    @Option(name: [.customShort("c"), .long], help: "rpc: connections; handshakes: connections opened at a time.")
    var connections = 50
    @Option(name: [.customShort("d"), .long], help: "rpc: requests in flight per connection; fanout: posts unanswered.")
    var depth = 16
    @Option(name: [.customShort("s"), .long], help: "Payload bytes.") var size = 32
    @Option(name: [.customShort("n"), .long], help: "fanout: listeners; idle: connections.") var count = 100
    @Option(help: "Seconds measured.") var duration = 5.0
    @Option(help: "Seconds of warm-up before measuring.") var warmup = 1.0
    @Option(help: """
        rpc and relay: stop after this many calls, fanout: after this many posts (all delivered), instead of \
        after --duration; measured from the start, with no warm-up. For instruction counts.
        """)
    var operations: Int?
    @Option(help: "idle: pid of the server, to read its resident memory.") var serverPID: Int32?
    @Flag(help: "Print the result as JSON.") var json = false
    @Flag(help: "Connect with TLS (switchboard and redis; NATS negotiates TLS after INFO, which the bench does not).")
    var tls = false
    @Option(help: "CA certificates (PEM) to trust with --tls (default: the system's).") var ca: String?
    @Option(help: "The name the server's certificate must carry (default: the host).") var serverName: String?
    @Flag(help: "Speak through a WebSocket (switchboard only).") var ws = false
    @Flag(help: """
        rpc and fanout on Switchboard: every connection asks for a resumable session and acknowledges what it \
        receives with POSITION as protocol/resumption.md says (never cut: what resumability costs).
        """)
    var session = false

    func validate() throws {
        guard connections > 0, depth > 0, count > 0, size >= 0, duration > 0, warmup >= 0, operations ?? 1 > 0 else {
            throw ValidationError("counts and durations must be positive")
        }
        if tls, target == .nats { throw ValidationError("--tls: NATS negotiates TLS after INFO, which the bench does not do") }
        if ws, target != .switchboard { throw ValidationError("--ws is for Switchboard") }
        if !listenPort.isEmpty, workload != .fanout { throw ValidationError("--listen-port is for fanout") }
        if holderPort != nil, workload != .relay { throw ValidationError("--holder-port is for relay") }
        if session, target != .switchboard || ![.rpc, .fanout].contains(workload) {
            throw ValidationError("--session is for rpc and fanout on Switchboard")
        }
    }

    func run() throws {
        MallocTuning.keepLargeBlocks()  // the client moves the same large buffers as the server
        let loop = try EventLoop()
        let dialer = Dialer(loop: loop, host: host, port: port, tls: try tls ? TLSContext.client(caFile: ca) : nil,
                            serverName: serverName, webSocket: ws)
        var outcome: BenchResult?
        let done: (BenchResult) -> Void = { result in
            outcome = result
            loop.stop()
        }
        // The workloads live until the loop stops.
        var workloads: [AnyObject] = []
        // A fixed number of operations is measured whole: no warm-up, and 10 minutes at most (a run cut
        // short reports what is missing as an error).
        let (warmup, duration) = operations == nil ? (warmup, duration) : (0, 600)
        switch workload {
        case .rpc, .relay:
            let rpc = RPCWorkload(loop: loop, target: target, connections: connections, depth: depth, size: size,
                                  relay: workload == .relay || target == .nats, session: session, limit: operations)
            workloads.append(rpc)
            try rpc.run(dialer: dialer, responderDialer: holderPort.map(dialer.to(port:)) ?? dialer, warmup: warmup,
                        duration: duration, completion: done)
        case .fanout:
            let fanout = FanoutWorkload(loop: loop, target: target, listeners: count, size: size, window: depth,
                                        session: session, posts: operations)
            workloads.append(fanout)
            fanout.run(dialer: dialer, listenerDialers: listenPort.isEmpty ? [dialer] : listenPort.map(dialer.to(port:)),
                       warmup: warmup, duration: duration, completion: done)
        case .idle:
            let idle = IdleWorkload(loop: loop, target: target, count: count)
            workloads.append(idle)
            idle.run(dialer: dialer, hold: duration, serverPID: serverPID, completion: done)
        case .handshakes:
            let handshakes = HandshakeWorkload(loop: loop, target: target, concurrency: connections)
            workloads.append(handshakes)
            handshakes.run(dialer: dialer, warmup: warmup, duration: duration, completion: done)
        }
        loop.run()
        withExtendedLifetime(workloads) {}
        guard let result = outcome else { throw ExitCode(3) }
        if json {
            print(String(decoding: try JSONText.serialize(result.value, options: .textMode), as: UTF8.self))
        } else {
            result.printTable()
        }
    }
}

extension BenchTarget: ExpressibleByArgument {}
