import Synchronization
import SwitchboardCodec
import SwitchboardTransport

/// The loops of one server and what they share (docs/scaling-and-cluster.md). Each loop is a ``ServerCore``
/// with its own connections; loop 0 accepts and hands connections round. What crosses between loops
/// (calls, answers, cancels, streams, broadcasts) goes as typed jobs, through each core's
/// ``SiblingLoops``. The tables here are the only state the loops share.
final class LoopGroup: Sendable {
    /// Each loop's core; a core's index is its place here.
    let cores: [LoopBound<ServerCore>]
    /// Which loop holds each client-held channel (one loop at most, so that `channel_taken` holds
    /// server-wide), and what its holder declared it to be.
    let claims = Mutex<[String: Claim]>([:])

    /// A client-held channel's loop, and the kind and codec its holder declared: every loop judges a
    /// request on it by what it is there (protocol/plugins.md).
    struct Claim: Sendable {
        let loop: Int
        let kind: Registration.Kind?
        let codec: DeclaredCodec?

        var isEvent: Bool { kind == .event }
    }
    /// Loops whose loop has stopped, and loops whose drain is over.
    private let stopped = Atomic<Int>(0)
    private let drained = Atomic<Int>(0)
    /// The one reporter of the server's counters: it reports the sum over the loops.
    private let metricsReporter: Mutex<Reporting>
    /// The loops with listeners on each channel: where broadcasts and a held channel's events go.
    private let interest = Mutex<[String: Set<Int>]>([:])
    /// For each loop, the events (broadcasts, held channels' events) its siblings sent that wait to run
    /// there: at most ``siblingEventLimit``; one more is dropped and counted.
    let siblingEventsWaiting: [WaitingCount]
    /// This server's mark on a cluster's bus, the same for all its loops (random, as a node's instance is).
    var process: String { String(processMark, radix: 16) }
    /// The same mark as a number, as a session token names its process (``SessionToken``).
    let processMark = UInt64.random(in: 1..<(1 << 60))
    static let siblingEventLimit = 65_536

    /// A count that loops share.
    final class WaitingCount: Sendable {
        let value = Atomic<Int>(0)
    }

    init(cores: [ServerCore], metrics: MetricsSettings) {
        self.cores = cores.map { LoopBound($0, loop: $0.handle) }
        metricsReporter = Mutex(Reporting(reporter: MetricsReporter(settings: metrics)))
        siblingEventsWaiting = cores.map { _ in WaitingCount() }
    }

    var count: Int { cores.count }

    /// Reports the sum of every loop's latest counts, from whichever loop gathered them: a loop that
    /// did not answer (it has stopped), or whose part is older than one reported before (two gathers
    /// crossing), counts with its latest, so that no total ever seems to go down.
    func report(_ parts: [MetricsSnapshot?]) {
        metricsReporter.withLock { reporting in
            for case let part? in parts where part.sequence > reporting.latest[part.loop]?.sequence ?? 0 {
                reporting.latest[part.loop] = part
            }
            reporting.reporter.report(MetricsSnapshot.sum(Array(reporting.latest.values)))
        }
    }

    /// The reporter, and the latest counts of each loop.
    private struct Reporting {
        let reporter: MetricsReporter
        var latest: [Int: MetricsSnapshot] = [:]
    }

    /// What ``gather(from:_:then:)`` has collected so far.
    private struct Gathering<Part: Sendable>: Sendable {
        var parts: [Part?]
        var arrived = 0
    }

    /// The loop serving connection (or client) `id`: ids are dealt round the loops.
    func loop(ofConnection id: UInt64) -> Int { Int((id &- 1) % UInt64(cores.count)) }

    /// Claims `channel` for loop `index`, declared as `kind` in `codec`; false when another loop holds it.
    func claim(_ channel: String, for index: Int, kind: Registration.Kind?, codec: DeclaredCodec?) -> Bool {
        claims.withLock { claims in
            if let holder = claims[channel], holder.loop != index { return false }
            claims[channel] = Claim(loop: index, kind: kind, codec: codec)
            return true
        }
    }

    /// The loop whose client holds `channel`, if one does.
    func holder(of channel: String) -> Claim? { claims.withLock { $0[channel] } }

    /// Loop `index` let `channel` go.
    func release(_ channel: String, by index: Int) {
        claims.withLock { claims in
            if claims[channel]?.loop == index { claims.removeValueShrinking(forKey: channel) }
        }
    }

    /// Loop `index` has listeners on `channel` now, or none any more.
    func listen(to channel: String, loop index: Int) {
        _ = interest.withLock { $0[channel, default: []].insert(index) }
    }

    func stopListening(to channel: String, loop index: Int) {
        interest.withLock { interest in
            interest[channel]?.remove(index)
            if interest[channel]?.isEmpty == true { interest.removeValueShrinking(forKey: channel) }
        }
    }

    /// The loops but `index` with listeners on `channel`.
    func loopsListening(to channel: String, besides index: Int) -> [Int] {
        interest.withLock { $0[channel]?.filter { $0 != index } ?? [] }
    }

    /// A loop has stopped; returns how many have.
    @discardableResult
    func loopStopped() -> Int { stopped.add(1, ordering: .acquiringAndReleasing).newValue }
    var stoppedLoops: Int { stopped.load(ordering: .acquiring) }

    /// A loop's drain is over; returns how many loops' are.
    func loopDrained() -> Int { drained.add(1, ordering: .acquiringAndReleasing).newValue }

    /// Runs `part` on every loop and hands the results, in loop order, to `then` on loop `home`'s
    /// thread (nil for a loop that has stopped). One loop: at once. Nothing is handed over if loop
    /// `home` has stopped meanwhile (its shutdown answered what it was asked).
    func gather<Part: Sendable>(from home: Int, _ part: @escaping @Sendable (ServerCore) -> Part,
                                then: @escaping @Sendable ([Part?]) -> Void) {
        if cores.count == 1 { return then([part(cores[0].value)]) }
        let collected = Mutex(Gathering<Part>(parts: Array(repeating: nil, count: cores.count)))
        let homeCore = cores[home]
        for (index, core) in cores.enumerated() {
            let arrive: @Sendable (Part?) -> Void = { value in
                let all: [Part?]? = collected.withLock { c in
                    c.parts[index] = value
                    c.arrived += 1
                    return c.arrived == c.parts.count ? c.parts : nil
                }
                guard let all else { return }
                if homeCore.loop.isInLoopThread { then(all) } else { homeCore.loop.execute { then(all) } }
            }
            if core.loop.isInLoopThread {
                arrive(part(core.value))
            } else if !core.loop.execute({ arrive(part(core.value)) }) {
                arrive(nil)
            }
        }
    }
}

extension LoopGroup {
    /// Adds up the stats of several loops: numbers are summed (but for the uptime, `nodes` and
    /// `remoteHolders`: the most any loop has), flags are true if true on every loop, maps are merged
    /// key by key, and anything else is taken from the first loop.
    static func sum(_ values: [ChannelValue]) -> ChannelValue {
        guard let first = values.first else { return .null }
        switch first {
        case .int32, .int64:
            return .int(values.reduce(0) { $0 + ($1.intValue ?? 0) })
        case .bool:  // `connected`: whether every loop is
            return .bool(values.allSatisfy { if case .bool(true) = $0 { true } else { false } })
        case .map:
            var keys: [ChannelValue] = []
            var parts: [String: [ChannelValue]] = [:]
            for case .map(let entries) in values {
                for entry in entries {
                    guard case .string(let name) = entry.key else { continue }
                    if parts[name] == nil { keys.append(entry.key) }
                    parts[name, default: []].append(entry.value)
                }
            }
            return .map(keys.compactMap { key in
                guard case .string(let name) = key, let all = parts[name] else { return nil }
                // What each loop sees of the whole (other nodes, how long it has run) is not summed.
                if ["uptimeSeconds", "nodes", "remoteHolders"].contains(name) { return .init(key, .int(all.compactMap(\.intValue).max() ?? 0)) }
                return .init(key, sum(all))
            })
        default:
            return first
        }
    }
}
