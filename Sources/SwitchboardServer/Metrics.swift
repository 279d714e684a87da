import CoreMetrics
import Prometheus
import SwitchboardCodec
import SwitchboardPluginAPI

/// Where the server's counters go: a swift-metrics factory, Prometheus's by default (served at
/// `GET /metrics`). An embedder can give another backend's factory.
public struct MetricsSettings: Sendable {
    /// Makes the counters and gauges.
    public var factory: any MetricsFactory
    /// The text `GET /metrics` serves, in Prometheus's exposition format; nil: 404.
    public var exposition: (@Sendable () -> [UInt8])?
    /// Channels that get a label of their own in the per-channel counters; the rest are summed as `other`.
    public var channelLimit: Int
    /// How often the counters are reported to a factory without an ``exposition`` (one with an
    /// exposition is reported to at each `GET /metrics`, when they are read).
    public var intervalMs: UInt64

    public init(factory: any MetricsFactory, exposition: (@Sendable () -> [UInt8])?, channelLimit: Int = 100, intervalMs: UInt64 = 1000) {
        self.factory = factory
        self.exposition = exposition
        self.channelLimit = channelLimit
        self.intervalMs = intervalMs
    }

    /// A Prometheus registry of the server's own.
    public static func prometheus(channelLimit: Int = 100) -> MetricsSettings {
        let registry = PrometheusCollectorRegistry()
        return MetricsSettings(factory: PrometheusMetricsFactory(registry: registry), exposition: {
            var text: [UInt8] = []
            registry.emit(into: &text)
            return MetricsHelp.adding(to: text)
        }, channelLimit: channelLimit)
    }
}

/// What one loop counts, as the reporter takes it: the snapshots of several loops add up.
struct MetricsSnapshot: Sendable {
    struct Total: Hashable, Sendable {
        let label: String
        let dimensions: [String: String]
    }
    struct ChannelTotals: Sendable {
        var requests = 0, events = 0
        var isEvent = false

        mutating func add(_ other: ChannelTotals) {
            requests += other.requests
            events += other.events
            isEvent = isEvent || other.isEvent
        }
    }
    /// The loop it was taken on, and its place among that loop's snapshots.
    var loop = 0, sequence: UInt64 = 0
    var gauges: [String: Int] = [:]
    var totals: [Total: Int] = [:]
    var channels: [String: ChannelTotals] = [:]
    /// The held channels not in ``channels``: those past each loop's `--metrics-channels`, gone ones too.
    var unlabeledHeld = ChannelTotals()

    /// The sum of `parts` (the uptime is the longest).
    static func sum(_ parts: [MetricsSnapshot]) -> MetricsSnapshot {
        var sum = MetricsSnapshot()
        for part in parts {
            for (label, value) in part.gauges {
                sum.gauges[label] = switch label {
                // What each loop sees of the whole is not summed: the longest uptime, the most nodes seen,
                // and connected only if every loop is.
                case "switchboard_uptime_seconds", "switchboard_cluster_nodes", "switchboard_cluster_remote_holders":
                    max(sum.gauges[label] ?? 0, value)
                case "switchboard_cluster_connected": min(sum.gauges[label] ?? 1, value)
                default: (sum.gauges[label] ?? 0) + value
                }
            }
            for (total, value) in part.totals { sum.totals[total, default: 0] += value }
            for (name, counts) in part.channels {
                sum.channels[name, default: ChannelTotals()].add(counts)
            }
            sum.unlabeledHeld.add(part.unlabeledHeld)
        }
        return sum
    }
}

extension ServerCore {
    /// What this loop counts, for ``MetricsReporter``.
    var metricsSnapshot: MetricsSnapshot {
        metricsSnapshots += 1
        var snapshot = MetricsSnapshot(loop: index, sequence: metricsSnapshots)
        func total(_ label: String, _ value: Int, _ dimensions: [String: String] = [:]) {
            snapshot.totals[.init(label: label, dimensions: dimensions), default: 0] += value
        }
        snapshot.gauges = [
            "switchboard_connections": connectionCount, "switchboard_replies_pending": stats.repliesPending,
            "switchboard_registrations": directory.registrations.count, "switchboard_uptime_seconds": Int((eventLoop.now - startedAt) / 1000),
        ]
        total("switchboard_connections_total", stats.connectionsTotal)
        total("switchboard_frames_in_total", stats.framesIn)
        total("switchboard_frames_out_total", stats.framesOut)
        total("switchboard_bytes_in_total", stats.bytesIn)
        total("switchboard_bytes_out_total", stats.bytesOut)
        total("switchboard_slow_consumers_closed_total", stats.slowConsumersClosed)
        total("switchboard_ignored_frames_total", stats.ignoredFrames)
        total("switchboard_forwarded_requests_total", stats.forwardedRequests)
        total("switchboard_accept_errors_total", stats.acceptErrors)
        total("switchboard_registrations_refused_total", stats.registrationsRefused)
        total("switchboard_open_requests_refused_total", stats.openRequestsRefused)
        total("switchboard_demands_ignored_total", stats.demandsIgnored)
        for (reason, value) in tallies.eventsDropped { total("switchboard_events_dropped_total", value, ["reason": reason]) }
        for (reason, value) in tallies.closes { total("switchboard_closes_total", value, ["reason": reason]) }
        snapshot.gauges["switchboard_sessions_live"] = sessions.live.count - sessions.parked.count
        snapshot.gauges["switchboard_sessions_parked"] = sessions.parked.count
        snapshot.gauges["switchboard_session_buffered_bytes"] = sessions.bufferedBytes
        total("switchboard_sessions_made_total", sessions.made)
        total("switchboard_sessions_resumed_total", sessions.resumed)
        total("switchboard_sessions_taken_total", sessions.taken)
        for (reason, value) in sessions.endedCounts { total("switchboard_sessions_ended_total", value, ["reason": reason]) }
        for (reason, value) in sessions.refusedCounts { total("switchboard_resumes_refused_total", value, ["reason": reason]) }
        for (kind, value) in sessions.droppedCounts { total("switchboard_session_frames_dropped_total", value, ["kind": kind]) }
        for (plugin, codes) in tallies.pluginRejections {
            for (code, value) in codes { total("switchboard_plugin_rejections_total", value, ["plugin": plugin, "code": code]) }
        }
        for (plugin, value) in tallies.pluginFailures { total("switchboard_plugin_failures_total", value, ["plugin": plugin]) }
        if let cluster {
            let metrics = cluster.metrics
            for (label, value) in metrics.totals { total(label, value) }
            for (label, value) in metrics.gauges { snapshot.gauges[label] = value }
        }
        // The served channels and the held ones with a label: the work is bounded by `--metrics-channels`
        // per loop, however many channels clients hold; the others come summed.
        for (name, entry) in directory.channels {
            let isEvent = if case .event = entry { true } else { false }
            snapshot.channels[name, default: .init()].add(.init(requests: entry.counts.requests, events: entry.counts.events, isEvent: isEvent))
        }
        for name in labeledHeld {
            guard let registration = directory.registrations[name] else { continue }
            let counts = registration.counts
            snapshot.channels[name, default: .init()].add(.init(requests: counts.requests, events: counts.events, isEvent: registration.kind == .event))
        }
        snapshot.unlabeledHeld = .init(requests: heldCounts.unlabeled.requests, events: heldCounts.unlabeled.events)
        return snapshot
    }

    /// Reports every loop's counters, then runs `then` on this loop.
    func reportMetrics(then: @escaping @Sendable () -> Void) {
        guard let group else { return then() }
        group.gather(from: index, { $0.metricsSnapshot }) { parts in
            group.report(parts)
            then()
        }
    }
}

/// Reports the server's plain counters to swift-metrics now and then, as deltas: the paths that count
/// stay plain integer increments, and a backend sees ordinary counters and gauges. Used under the
/// server's lock, by one loop at a time.
final class MetricsReporter {
    private let settings: MetricsSettings
    private var counters: [String: CoreMetrics.Counter] = [:]
    private var gauges: [String: CoreMetrics.Gauge] = [:]
    /// The last total reported, per counter and labels (a total that went down restarted from 0).
    private var reported: [String: Int] = [:]
    /// Channels with a label of their own (the first `channelLimit` seen keep theirs).
    private var labeledChannels: Set<String> = []

    init(settings: MetricsSettings) { self.settings = settings }

    /// Reports the counts of `snapshot` (the sum over the loops).
    func report(_ snapshot: MetricsSnapshot) {
        for (label, value) in snapshot.gauges { gauge(label, value: value) }
        for (total, value) in snapshot.totals { count(total.label, total.dimensions, total: value) }
        // Channels gone since: forget their totals (one that comes back starts again from 0).
        let present = Set(snapshot.channels.keys)
        for name in labeledChannels.subtracting(present) {
            // A gone channel's series end, and its label is free for another channel: the number of
            // series stays bounded however many channels come and go.
            labeledChannels.remove(name)
            for label in ["switchboard_channel_requests_total", "switchboard_channel_events_total"] {
                counters.removeValue(forKey: Self.key(label, ["channel": name]))?.destroy()
            }
        }
        reported = reported.filter { key, _ in
            guard key.hasPrefix(Self.channelKey) else { return true }
            return present.contains(String(key.drop { $0 != " " }.dropFirst()))
        }
        for (name, counts) in snapshot.channels.sorted(by: { $0.key < $1.key }) {
            let label = channelLabel(name)
            // Per channel, then added into its label's counter: channels summed as `other` may come and go.
            add("switchboard_channel_requests_total", ["channel": label], key: Self.channelKey + "requests " + name, total: counts.requests)
            if counts.isEvent { add("switchboard_channel_events_total", ["channel": label], key: Self.channelKey + "events " + name, total: counts.events) }
        }
        // Kept under keys of their own: these totals never go down, so no filter above drops them.
        if snapshot.unlabeledHeld.requests > 0 {
            add("switchboard_channel_requests_total", ["channel": "other"], key: "unlabeled held requests", total: snapshot.unlabeledHeld.requests)
        }
        if snapshot.unlabeledHeld.events > 0 {
            add("switchboard_channel_events_total", ["channel": "other"], key: "unlabeled held events", total: snapshot.unlabeledHeld.events)
        }
    }

    /// Marks the keys of per-channel totals in `reported` (no counter's name starts with it).
    private static let channelKey = "\u{0}"

    private func channelLabel(_ name: String) -> String {
        if labeledChannels.contains(name) { return name }
        guard labeledChannels.count < settings.channelLimit else { return "other" }
        labeledChannels.insert(name)
        return name
    }

    private func count(_ label: String, _ dimensions: [String: String] = [:], total: Int) {
        add(label, dimensions, key: Self.key(label, dimensions), total: total)
    }

    /// Adds to the counter what `total` grew by since it was last seen under `key`.
    private func add(_ label: String, _ dimensions: [String: String], key: String, total: Int) {
        let last = reported[key] ?? 0
        let delta = total >= last ? total - last : total
        reported[key] = total
        let name = Self.key(label, dimensions)
        let counter = counters[name] ?? CoreMetrics.Counter(label: label, dimensions: dimensions.sorted { $0.key < $1.key }, factory: settings.factory)
        counters[name] = counter
        if delta > 0 { counter.increment(by: Int64(delta)) }
    }

    private func gauge(_ label: String, value: Int) {
        let gauge = gauges[label] ?? CoreMetrics.Gauge(label: label, dimensions: [], factory: settings.factory)
        gauges[label] = gauge
        gauge.record(value)
    }

    private static func key(_ label: String, _ dimensions: [String: String]) -> String {
        dimensions.isEmpty ? label : label + "{" + dimensions.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: ",") + "}"
    }
}

/// `switchboard/stats` of one loop.
extension ServerCore {
    /// This loop's stats (``LoopGroup/sum(_:)`` adds up the loops'): with several loops, `loops` counts
    /// 1 per loop, and `crossLoop` what went between them; on a cluster's node, `cluster`.
    var statsValue: ChannelValue {
        guard case .map(var entries) = localStats, siblings != nil || cluster != nil else { return localStats }
        if let siblings {
            entries.append(.init("loops", .int(1)))
            entries.append(.init("crossLoop", siblings.statsValue))
        }
        if let cluster { entries.append(.init("cluster", cluster.statsValue)) }
        return .map(entries)
    }

    private var localStats: ChannelValue {
        .stringMap([
            "server": .string(switchboardServerName),
            "connections": .int(connections.count),
            "framesIn": .int(stats.framesIn), "framesOut": .int(stats.framesOut),
            "bytesIn": .int(stats.bytesIn), "bytesOut": .int(stats.bytesOut),
            "repliesPending": .int(stats.repliesPending),
            "eventsDropped": .map(tallies.eventsDropped.sorted { $0.key < $1.key }.map { .init(.string($0.key), .int($0.value)) }),
            "slowConsumersClosed": .int(stats.slowConsumersClosed),
            "uptimeSeconds": .int(Int((eventLoop.now - startedAt) / 1000)),
            "connectionsTotal": .int(stats.connectionsTotal),
            "ignoredFrames": .int(stats.ignoredFrames),
            "registrations": .int(directory.registrations.count), "registrationsRefused": .int(stats.registrationsRefused),
            "openRequestsRefused": .int(stats.openRequestsRefused), "demandsIgnored": .int(stats.demandsIgnored),
            "forwardedRequests": .int(stats.forwardedRequests),
            "acceptErrors": .int(stats.acceptErrors),
            "closes": .map(tallies.closes.sorted { $0.key < $1.key }.map { .init(.string($0.key), .int($0.value)) }),
            "plugins": pluginStats,
            "requests": .int(totals.requests), "events": .int(totals.events),
            "sessions": sessions.statsValue,
        ])
    }
}
