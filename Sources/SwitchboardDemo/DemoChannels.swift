import Synchronization
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTransport
import SwitchboardWire

// The demo channels of protocol/demo-channels.md, which the CLI serves unless `--no-demo`, and which the
// tests, the console and the benchmarks call: built on the server's public API alone, as an embedder's
// channels are.

extension Server {
    /// Installs the built-in demo channels of `protocol/demo-channels.md`, `switchboard/stats` included.
    public func installDemoChannels() {
        let echo: @Sendable (MethodCall, MethodResult) -> Void = { call, result in
            switch call.method {
            case "echo": result.success(call.arguments)
            case "fail": result.error(ChannelError(code: "demo_error", message: "requested failure", details: call.arguments))
            default: result.notImplemented()
            }
        }
        MethodChannel(name: "switchboard/echo", server: self).setMethodCallHandler(echo)
        MethodChannel(name: "switchboard/echo.json", codec: JSONMethodCodec(), server: self).setMethodCallHandler(echo)

        BasicMessageChannel(name: "switchboard/message", codec: StandardMessageCodec(), server: self)
            .setMessageHandler { message, reply in reply.reply(message) }
        BasicMessageChannel(name: "switchboard/message.string", codec: StringCodec(), server: self)
            .setMessageHandler { message, reply in reply.reply(message) }
        BasicMessageChannel(name: "switchboard/message.binary", codec: BinaryCodec(), server: self)
            .setMessageHandler { message, reply in reply.reply(message) }

        EventChannel(name: "switchboard/ticker", server: self).setStreamHandler(Ticker())

        let room = EventChannel(name: "switchboard/room", server: self)
        room.setStreamHandler(StreamHandlerClosures(onListen: { _, _ in nil }))
        BasicMessageChannel(name: "switchboard/room.post", codec: BinaryCodec(), server: self)
            .setMessageHandler { bytes, reply in
                guard let bytes else { return reply.fail(.badPayload("a room post needs a payload")) }
                room.broadcast(.uint8List(bytes))  // on the loop: queued for every listener before the reply
                reply.reply(nil)
            }

        installStatsChannel()
    }
}

/// `switchboard/ticker`: counts 0 … n-1 every m ms, then ends. Demand-aware: it emits only when the sink is
/// ready (credit left, nothing queued, connection under its outbound limit) and otherwise waits, so it
/// pauses instead of dropping.
struct Ticker: StreamHandler {
    /// One listener's ticking; loop thread only.
    final class Run {
        let sink: EventSink
        let count: Int?
        let intervalMs: UInt64
        var next = 0
        var timer: Timer?
        weak var table: Table?

        init(sink: EventSink, count: Int?, intervalMs: UInt64, table: Table) {
            self.sink = sink
            self.count = count
            self.intervalMs = intervalMs
            self.table = table
        }

        var isFinished: Bool { count.map { next >= $0 } ?? false }

        func start(loop: EventLoop) {
            timer = try? Timer(loop: loop)
            schedule(after: intervalMs)
        }

        private func schedule(after delay: UInt64) {
            timer?.start(after: delay) { [weak self] in self?.tick() }
        }

        /// Emits what it may now; waits for readiness when the sink is not ready.
        private func tick() {
            guard sink.isActive else { return stop() }
            var emitted = 0
            while !isFinished, sink.isReady, intervalMs > 0 ? emitted < 1 : emitted < 1024 {
                sink.success(.int(next))
                next += 1
                emitted += 1
            }
            if isFinished {
                sink.endOfStream()
                return stop()
            }
            if sink.isReady {
                // At least 1 ms: libuv runs a timer re-armed at 0 from its own callback again in the same
                // loop turn, so an interval of 0 would hold the loop until the outbound limit was full.
                schedule(after: max(intervalMs, 1))
            } else {
                sink.onReady { [weak self] in self?.tick() }
            }
        }

        /// Stops ticking and leaves the table (if it is still this client's current run).
        func stop() {
            timer?.cancel()
            timer = nil
            table?.remove(self)
        }
    }

    /// Each listening client's current run, for every loop. A client's run is only touched on that
    /// client's loop thread; the lock guards the table, which the loops share.
    final class Table: Sendable {
        private let byClient = Mutex<[ClientID: LoopBound<Run>]>([:])

        /// The client's current run (loop thread of the client).
        func run(of client: ClientID) -> Run? { byClient.withLock { $0[client] }?.value }

        /// Makes `run` its client's current run (loop thread of the client).
        func put(_ run: Run, loop: LoopHandle) {
            let bound = LoopBound(run, loop: loop)
            byClient.withLock { $0[run.sink.client] = bound }
        }

        /// Removes `run`, if it is still its client's current one (loop thread of the client).
        func remove(_ run: Run) {
            guard self.run(of: run.sink.client) === run else { return }
            byClient.withLock { _ = $0.removeValue(forKey: run.sink.client) }
        }
    }

    private let runs = Table()

    func onListen(arguments: ChannelValue, sink: EventSink) -> ChannelError? {
        var count: Int?
        var interval = 1000
        switch arguments {
        case .null: break
        case .map:
            for (key, target) in [("count", 0), ("intervalMs", 1)] {
                guard let value = arguments[key], !value.isNull else { continue }
                guard let n = value.intValue, n >= 0 else {
                    return ChannelError(code: "bad_arguments", message: "\(key) must be a non-negative integer")
                }
                if target == 0 { count = n } else { interval = n }
            }
        default:
            return ChannelError(code: "bad_arguments", message: "arguments must be a map or null")
        }
        runs.run(of: sink.client)?.stop()
        let run = Run(sink: sink, count: count, intervalMs: UInt64(interval), table: runs)
        runs.put(run, loop: sink.eventLoop.handle)
        run.start(loop: sink.eventLoop)
        return nil
    }

    func onCancel(arguments: ChannelValue, sink: EventSink) {
        guard let run = runs.run(of: sink.client), run.sink === sink else { return }
        run.stop()
    }
}
