import Logging
import Synchronization
import SwitchboardPluginAPI

/// The `requestLog` section.
public struct RequestLogSettings: Codable, Sendable, Equatable {
    /// Log one request in this many (1: all of them); slow requests are always logged.
    public var sampleOneIn: Int?
    /// Requests that take at least this many milliseconds are always logged, at `warning`.
    public var slowMs: Double?
    /// The level of sampled lines: trace … critical (default `notice`).
    public var level: String?

    public init(sampleOneIn: Int? = nil, slowMs: Double? = nil, level: String? = nil) {
        self.sampleOneIn = sampleOneIn
        self.slowMs = slowMs
        self.level = level
    }

    private enum CodingKeys: String, CodingKey, CaseIterable { case sampleOneIn, slowMs, level }
    public init(from decoder: any Decoder) throws {
        let c = try decoder.strictContainer(keyedBy: CodingKeys.self)
        sampleOneIn = try c.decodeIfPresent(Int.self, forKey: .sampleOneIn)
        slowMs = try c.decodeIfPresent(Double.self, forKey: .slowMs)
        level = try c.decodeIfPresent(String.self, forKey: .level)
    }
}

/// The request log: one swift-log line per answered request (its connection, user, channel, method,
/// outcome and duration in µs), for one request in `sampleOneIn`, and for every request slower than
/// `slowMs`. It sees every answer, the refusals of the plugins loaded before it included.
public struct RequestLog: Plugin {
    public let name = "requestLog"
    let settings: LiveSettings
    let logger: Logger

    public init(settings: LiveSettings, logger: Logger = Logger(label: "switchboard.requests")) {
        self.settings = settings
        self.logger = logger
    }

    public var outbound: [any OutboundProcessor] { [Writer(settings: settings, logger: logger, counter: Counter())] }

    /// Counts answers for sampling, across loops.
    final class Counter: Sendable {
        let value = Atomic<Int>(0)
    }

    /// The settings of one generation.
    struct Snapshot: Sendable {
        let sampleOneIn: Int
        let slow: Duration?
        let level: Logger.Level

        init(_ settings: RequestLogSettings?) {
            sampleOneIn = max(1, settings?.sampleOneIn ?? 1)
            // Clamped to ± a year: microseconds beyond Int64 would trap on the first request.
            slow = settings?.slowMs.map { .microseconds($0.isNaN ? 0 : Int64(min(max($0 * 1000, -31_536_000_000_000), 31_536_000_000_000))) }
            level = settings?.level.flatMap(Logger.Level.init(rawValue:)) ?? .notice
        }
    }

    struct Writer: OutboundProcessor {
        let settings: LiveSettings
        let logger: Logger
        let counter: Counter
        let snapshot = GenerationCache<Snapshot>()

        var scope: Scope<OutboundKind> { Scope(kinds: [.reply, .error]) }

        func process(_ message: inout OutboundMessage) throws -> OutboundDecision {
            let current = snapshot.value(settings) { Snapshot($0.requestLog) }
            let elapsed = message.elapsed ?? .zero
            let isSlow = current.slow.map { elapsed >= $0 } ?? false
            let isSampled = counter.value.add(1, ordering: .relaxed).newValue % current.sampleOneIn == 0
            guard isSlow || isSampled else { return .pass }
            let outcome: String = switch message.content {
            case .error(let error): "error:\(error.code)"
            case .notImplemented: "notImplemented"
            default: "success"
            }
            let micros = elapsed.components.seconds * 1_000_000 + elapsed.components.attoseconds / 1_000_000_000_000
            logger.log(level: isSlow ? max(current.level, .warning) : current.level, isSlow ? "slow request" : "request", metadata: [
                "connection": "\(message.connection.id)",
                "user": "\(message.connection.identity ?? "-")",
                "channel": "\(message.channel)",
                "method": "\(message.method ?? "-")",
                "outcome": "\(outcome)",
                "durationUs": "\(micros)",
            ])
            return .pass
        }

    }
}
