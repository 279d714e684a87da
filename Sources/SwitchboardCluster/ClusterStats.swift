import Logging
import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// What a link counts, for `switchboard/stats` and `/metrics` (protocol/cluster.md, "Stats").
extension ClusterLink {
    // MARK: Stats

    /// For `/metrics`: the totals (counters), then the values of now (gauges), as `switchboard/stats`
    /// has them.
    package var metrics: (totals: [(String, Int)], gauges: [(String, Int)]) {
        let bus = self.bus.counters
        let totals = [
            ("events_out", eventsOut), ("events_in", eventsIn), ("events_unsent", eventsUnsent), ("events_malformed", eventsMalformed),
            ("events_missed", eventsMissed),
            ("batches_malformed", batchesMalformed),
            ("calls_out", callsOut), ("calls_in", callsIn), ("calls_no_holder", callsNoResponders), ("calls_expired", callsExpired),
            ("calls_forbidden", callsForbidden),
            ("nodes_lost", peersLost), ("stalls", stalls),
            ("bus_messages_out", bus.messagesOut), ("bus_messages_in", bus.messagesIn), ("bus_bytes_out", bus.bytesOut),
            ("bus_bytes_in", bus.bytesIn), ("bus_dropped", bus.dropped), ("bus_reconnects", bus.reconnects),
            ("bus_connect_failures", bus.connectFailures), ("bus_possibly_lost", bus.possiblyLost),
            ("loop_events_dropped", loopEventsDropped),
            ("bus_server_errors", bus.serverErrors), ("bus_slow_consumer", bus.slowConsumer),
        ]
        let gauges = [
            ("connected", self.bus.isConnected ? 1 : 0), ("nodes", peers.count), ("remote_holders", peers.values.reduce(0) { $0 + $1.held }),
            ("channels_listened", subscriptions.count), ("channels_held", held.count),
            ("calls_pending", outgoing.count), ("calls_serving", served.count),
        ]
        return (totals.map { ("switchboard_cluster_\($0.0)_total", $0.1) }, gauges.map { ("switchboard_cluster_\($0.0)", $0.1) })
    }

    /// For `switchboard/stats`.
    package var statsValue: ChannelValue {
        let bus = self.bus.counters
        return .stringMap([
            "node": .string(node), "connected": .bool(self.bus.isConnected),
            "eventsOut": .int(eventsOut), "eventsIn": .int(eventsIn),
            "eventsUnsent": .int(eventsUnsent), "eventsMalformed": .int(eventsMalformed),
            "eventsMissed": .int(eventsMissed),
            "batchesMalformed": .int(batchesMalformed),
            "channelsListened": .int(subscriptions.count),
            "channelsHeld": .int(held.count),
            "nodes": .int(peers.count), "nodesLost": .int(peersLost),
            "remoteHolders": .int(peers.values.reduce(0) { $0 + $1.held }),
            "callsOut": .int(callsOut), "callsIn": .int(callsIn),
            "callsPending": .int(outgoing.count), "callsServing": .int(served.count),
            "callsNoHolder": .int(callsNoResponders), "callsExpired": .int(callsExpired),
            "callsForbidden": .int(callsForbidden),
            "busMessagesOut": .int(bus.messagesOut), "busMessagesIn": .int(bus.messagesIn),
            "busBytesOut": .int(bus.bytesOut), "busBytesIn": .int(bus.bytesIn),
            "busDropped": .int(bus.dropped), "busReconnects": .int(bus.reconnects),
            "busConnectFailures": .int(bus.connectFailures), "busPossiblyLost": .int(bus.possiblyLost),
            "loopEventsDropped": .int(loopEventsDropped),
            "busServerErrors": .int(bus.serverErrors), "busSlowConsumer": .int(bus.slowConsumer),
            "stalls": .int(stalls),
        ])
    }
}
