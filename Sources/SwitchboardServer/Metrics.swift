import CoreMetrics
import Prometheus

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
            return text
        }, channelLimit: channelLimit)
    }
}

/// Reports the server's plain counters to swift-metrics now and then, as deltas: the paths that count
/// stay plain integer increments, and a backend sees ordinary counters and gauges. Loop thread only.
final class MetricsReporter {
    private let settings: MetricsSettings
    private var counters: [String: CoreMetrics.Counter] = [:]
    private var gauges: [String: CoreMetrics.Gauge] = [:]
    /// The last total reported, per counter and labels (a total that went down restarted from 0).
    private var reported: [String: Int] = [:]
    /// Channels with a label of their own (the first `channelLimit` seen keep theirs).
    private var labeledChannels: Set<String> = []

    init(settings: MetricsSettings) { self.settings = settings }

    /// Reports everything `core` counts.
    func report(_ core: ServerCore) {
        let stats = core.stats
        gauge("switchboard_connections", value: core.connectionCount)
        gauge("switchboard_replies_pending", value: stats.repliesPending)
        gauge("switchboard_registrations", value: core.registrations.count)
        gauge("switchboard_uptime_seconds", value: Int((core.eventLoop.now - core.startedAt) / 1000))
        count("switchboard_connections_total", total: stats.connectionsTotal)
        count("switchboard_frames_in_total", total: stats.framesIn)
        count("switchboard_frames_out_total", total: stats.framesOut)
        count("switchboard_bytes_in_total", total: stats.bytesIn)
        count("switchboard_bytes_out_total", total: stats.bytesOut)
        count("switchboard_slow_consumers_closed_total", total: stats.slowConsumersClosed)
        count("switchboard_ignored_frames_total", total: stats.ignoredFrames)
        count("switchboard_forwarded_requests_total", total: stats.forwardedRequests)
        count("switchboard_accept_errors_total", total: stats.acceptErrors)
        let tallies = core.tallies
        for (reason, total) in tallies.eventsDropped { count("switchboard_events_dropped_total", ["reason": reason], total: total) }
        for (reason, total) in tallies.closes { count("switchboard_closes_total", ["reason": reason], total: total) }
        for (plugin, codes) in tallies.pluginRejections {
            for (code, total) in codes { count("switchboard_plugin_rejections_total", ["plugin": plugin, "code": code], total: total) }
        }
        for (plugin, total) in tallies.pluginFailures { count("switchboard_plugin_failures_total", ["plugin": plugin], total: total) }
        if let cluster = core.cluster {
            let metrics = cluster.metrics
            for (label, total) in metrics.totals { count(label, total: total) }
            for (label, value) in metrics.gauges { gauge(label, value: value) }
        }
        let channels = core.channelCounts()
        // Channels gone since: forget their totals (one that comes back starts again from 0).
        let present = Set(channels.map(\.name))
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
        for (name, counts, isEvent) in channels {
            let label = channelLabel(name)
            // Per channel, then added into its label's counter: channels summed as `other` may come and go.
            add("switchboard_channel_requests_total", ["channel": label], key: Self.channelKey + "requests " + name, total: counts.requests)
            if isEvent { add("switchboard_channel_events_total", ["channel": label], key: Self.channelKey + "events " + name, total: counts.events) }
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

extension ServerCore {
    /// Every channel's counts, served here or held by clients, and whether it is an event channel.
    func channelCounts() -> [(name: String, counts: ChannelCounts, isEvent: Bool)] {
        var out: [(String, ChannelCounts, Bool)] = []
        for (name, entry) in channels {
            let isEvent = if case .event = entry { true } else { false }
            out.append((name, entry.counts, isEvent))
        }
        for (name, registration) in registrations { out.append((name, registration.counts, registration.kind == .event)) }
        return out
    }
}
