import Histogram
import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

#if canImport(Glibc)
import Glibc
#endif

/// One frame found in a read buffer, by offsets into `InboundBuffer.readable`; nothing is copied.
struct ScannedFrame {
    let type: UInt8
    let flags: UInt8
    let id: UInt32
    /// Payload bounds, as indices of the slice handed to the body.
    let payload: Range<Int>
    /// The whole frame's bytes, length field included.
    let size: Int
    var isNull: Bool { flags & 1 != 0 }
}

/// Calls `body` for every complete frame in `buffer`, then consumes them. Returns false on a malformed stream.
func scanFrames(_ buffer: inout InboundBuffer, _ body: (ArraySlice<UInt8>, ScannedFrame) -> Void) -> Bool {
    var consumed = 0
    let bytes = buffer.readable
    var i = bytes.startIndex
    while bytes.endIndex - i >= 12 {
        let length = Int(bytes[i]) << 24 | Int(bytes[i + 1]) << 16 | Int(bytes[i + 2]) << 8 | Int(bytes[i + 3])
        guard length >= 8 else { return false }
        guard bytes.endIndex - i >= 4 + length else { break }
        let channelLength = Int(bytes[i + 6]) << 8 | Int(bytes[i + 7])
        let id = UInt32(bytes[i + 8]) << 24 | UInt32(bytes[i + 9]) << 16 | UInt32(bytes[i + 10]) << 8 | UInt32(bytes[i + 11])
        let payloadStart = i + 12 + channelLength
        body(bytes, ScannedFrame(type: bytes[i + 4], flags: bytes[i + 5], id: id, payload: payloadStart..<(i + 4 + length), size: 4 + length))
        i += 4 + length
        consumed += 4 + length
    }
    buffer.consume(consumed)
    return true
}

/// Latency percentiles and a rate, as printed in a table or as JSON.
struct BenchResult {
    var workload: String
    var parameters: String
    var rate: Double
    var unit: String
    var latency: Histogram<UInt64>?
    var errors: [(String, Int)] = []
    var extra: [(String, ChannelValue)] = []

    var value: ChannelValue {
        var entries: [ChannelValue.MapEntry] = [
            .init("workload", .string(workload)), .init("parameters", .string(parameters)),
            .init("rate", .float64(rate.rounded())), .init("unit", .string(unit)),
        ]
        if let latency {
            entries.append(.init("latencyMicros", .stringMap([
                "p50": .int(Int(latency.valueAtPercentile(50))), "p90": .int(Int(latency.valueAtPercentile(90))),
                "p99": .int(Int(latency.valueAtPercentile(99))), "p99.9": .int(Int(latency.valueAtPercentile(99.9))),
                "max": .int(Int(latency.max)), "samples": .int(Int(latency.totalCount)),
            ])))
        }
        entries.append(.init("errors", .map(errors.map { .init(.string($0.0), .int($0.1)) })))
        entries += extra.map { .init(.string($0.0), $0.1) }
        return .map(entries)
    }

    func printTable() {
        print("\(workload) \(parameters)")
        print("  \(unit):".padded(22) + (unit.hasPrefix("calls") || unit.hasPrefix("deliveries") ? format(rate) : String(Int(rate))))
        if let latency, latency.totalCount > 0 {
            print("  latency (µs):".padded(22)
                + "p50 \(latency.valueAtPercentile(50))  p90 \(latency.valueAtPercentile(90))  "
                + "p99 \(latency.valueAtPercentile(99))  p99.9 \(latency.valueAtPercentile(99.9))  max \(latency.max)")
        }
        for (key, value) in extra { print("  \(key):".padded(22) + "\(value)") }
        print("  errors:".padded(22) + (errors.isEmpty ? "none" : errors.map { "\($0.0) \($0.1)" }.joined(separator: ", ")))
    }
}

func makeHistogram() -> Histogram<UInt64> { Histogram(highestTrackableValue: 60_000_000, numberOfSignificantValueDigits: .three) }

func format(_ rate: Double) -> String {
    if rate >= 1e6 { return String(Int(rate / 1e4) / 100) + "." + String(Int(rate / 1e4) % 100).leftPadded(2, "0") + " M" }
    if rate >= 1e3 { return String(Int(rate / 1e3)) + " k" }
    return String(Int(rate))
}

extension String {
    func padded(_ n: Int) -> String { count >= n ? self : self + String(repeating: " ", count: n - count) }
    func leftPadded(_ n: Int, _ fill: Character = " ") -> String {
        count >= n ? self : String(repeating: fill, count: n - count) + self
    }
}

/// The measuring window: warm-up, then measurement, then done; with a live progress line on a terminal.
final class BenchClock {
    enum Phase { case connecting, warmup, measuring, done }
    private(set) var phase = Phase.connecting
    private let loop: EventLoop
    private var timer: Timer?
    private var progress: Timer?
    private(set) var measureStart: UInt64 = 0
    private(set) var measureEnd: UInt64 = 0
    private var onDone: (() -> Void)?

    init(loop: EventLoop) { self.loop = loop }

    /// Starts warm-up now; calls `onMeasure` when measuring starts and `onDone` at the end.
    func start(warmup: Double, duration: Double, label: String, count: @escaping () -> Int,
               onMeasure: @escaping () -> Void, onDone: @escaping () -> Void) {
        phase = .warmup
        self.onDone = onDone
        let timer = try? Timer(loop: loop)
        self.timer = timer
        timer?.start(after: UInt64(warmup * 1000)) { [self] in
            phase = .measuring
            measureStart = EventLoop.nanoseconds()
            onMeasure()
            timer?.start(after: UInt64(duration * 1000)) { [self] in finish() }
        }
        if isatty(2) != 0 {
            let progress = try? Timer(loop: loop)
            self.progress = progress
            var last = 0
            progress?.start(after: 1000, repeat: 1000) { [self] in
                let now = count()
                printError("\r\u{1B}[K[\(label)] \(phase == .warmup ? "warming up" : "measuring")  \(format(Double(now - last)))/s")
                last = now
            }
        }
    }

    /// Ends the measurement now (at the end of the duration, or once a fixed number of operations is done).
    func finish() {
        guard phase != .done else { return }
        phase = .done
        measureEnd = EventLoop.nanoseconds()
        timer?.cancel()
        progress?.cancel()
        if isatty(2) != 0 { printError("\r\u{1B}[K") }
        onDone?()
    }

    var seconds: Double { Double(measureEnd - measureStart) / 1e9 }
}

/// Resident memory of a process in KiB, from /proc; nil if unreadable.
func residentKiB(pid: Int32) -> Int? {
    guard let file = fopen("/proc/\(pid)/status", "r") else { return nil }
    defer { fclose(file) }
    var line = [CChar](repeating: 0, count: 256)
    while fgets(&line, 256, file) != nil {
        let text = String(decoding: line.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
        if text.hasPrefix("VmRSS:") {
            return Int(text.dropFirst(6).filter { $0.isNumber })
        }
    }
    return nil
}

/// How the bench reaches a server: TCP, inside TLS with `--tls`, in WebSocket messages with `--ws`.
struct Dialer {
    let loop: EventLoop
    let host: String, port: Int
    let tls: TLSContext?
    let serverName: String?
    let webSocket: Bool

    /// Opens a connection (its TLS handshake and WebSocket upgrade go on as it is used); aborts the
    /// bench if it cannot.
    func dial(_ completion: @escaping (any Transport) -> Void) {
        TCPConnection.connect(loop: loop, host: host, port: port) { [self] result in
            guard case .success(let tcp) = result else { abortBench("cannot connect to \(host):\(port): \(result)") }
            do { completion(try layers.wrap(tcp, loop: loop)) } catch {
                abortBench("cannot start TLS: \(error)")
            }
        }
    }

    private var layers: ClientLayers { ClientLayers(tls: tls, serverName: serverName ?? host, webSocket: webSocket) }

    /// The same, to another port (another node of a cluster).
    func to(port: Int) -> Dialer { Dialer(loop: loop, host: host, port: port, tls: tls, serverName: serverName, webSocket: webSocket) }

    /// How it connects, for the parameters line: tcp, tls, ws or wss.
    var scheme: String { layers.scheme }
}

/// Ends the process with a message when a workload cannot go on.
func abortBench(_ message: String) -> Never {
    printError("bench: \(message)\n")
    exit(3)
}
