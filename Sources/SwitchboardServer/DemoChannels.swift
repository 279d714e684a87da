import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

extension Server {
    /// Installs the built-in demo channels of `protocol/demo-channels.md`.
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

        EventChannel(name: "switchboard/ticker", server: self).setStreamHandler(Ticker(loops: group.cores.map(\.loop)))

        let room = EventChannel(name: "switchboard/room", server: self)
        room.setStreamHandler(StreamHandlerClosures(onListen: { _, _ in nil }))
        BasicMessageChannel(name: "switchboard/room.post", codec: BinaryCodec(), server: self)
            .setMessageHandler { bytes, reply in
                guard let bytes else { return reply.fail(.badPayload("a room post needs a payload")) }
                room.broadcast(.uint8List(bytes))  // on the loop: queued for every listener before the reply
                reply.reply(nil)
            }

        MethodChannel(name: "switchboard/stats", server: self).setMethodCallHandler { [group] call, result in
            guard call.method == "get" else { return result.notImplemented() }
            group.gather(from: group.cores.currentIndex, { $0.statsValue }) { parts in
                result.success(LoopGroup.sum(parts.compactMap { $0 }))
            }
        }
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
        weak var table: Box?

        init(sink: EventSink, count: Int?, intervalMs: UInt64, table: Box) {
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
            if table?.byClient[sink.client] === self { table?.byClient.removeValue(forKey: sink.client) }
        }
    }

    /// Each loop's runs.
    private let tables: [LoopBound<Box>]
    final class Box { var byClient: [ClientID: Run] = [:] }

    init(loops: [LoopHandle]) { tables = loops.map { LoopBound(Box(), loop: $0) } }

    /// The runs of the calling loop's listeners.
    private var runs: LoopBound<Box> { tables.first { $0.loop.isInLoopThread } ?? tables[0] }

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
        runs.value.byClient[sink.client]?.stop()
        let run = Run(sink: sink, count: count, intervalMs: UInt64(interval), table: runs.value)
        runs.value.byClient[sink.client] = run
        run.start(loop: sink.eventLoop)
        return nil
    }

    func onCancel(arguments: ChannelValue, sink: EventSink) {
        guard let run = runs.value.byClient[sink.client], run.sink === sink else { return }
        run.stop()
    }
}
