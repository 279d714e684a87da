import Logging
import SwitchboardCluster
import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// Joins a ``Server`` to other Switchboard nodes over NATS (protocol/cluster.md).
public struct ClusterSettings: Sendable {
    /// The NATS servers to connect to, tried in turn.
    public var servers: [NATSBus.Server]
    /// This node's name, as NATS and the stats show it.
    public var node: String

    public init(servers: [NATSBus.Server], node: String) {
        self.servers = servers
        self.node = node
    }
}

/// A node's end of the cluster. An event a channel broadcasts goes to the bus once, as the very wire
/// frame its local listeners get, on the channel's subject; the node subscribes to a channel's subject
/// while it has listeners on it, and hands what comes in to them. Delivery across nodes is NATS core's:
/// at most once, in order per publishing node. Loop thread only.
final class ClusterLink {
    let settings: ClusterSettings
    private let bus: NATSBus
    /// Channels with local listeners: how many, and the subscription.
    private var listenerCounts: [String: Int] = [:]
    private var subscriptions: [String: BusSubscription] = [:]
    /// The bus subject of each channel this node published on or listens to.
    private var subjects: [String: String] = [:]
    /// Broadcasts sent to the bus, and remote ones handed to local listeners.
    private(set) var eventsOut = 0, eventsIn = 0
    /// Broadcasts that did not go out (a value with no wire form, a frame over NATS's max_payload, no
    /// bus connection, the bus's send queue full), and messages on an event subject that were not such
    /// a frame for that channel.
    private(set) var eventsUnsent = 0, eventsMalformed = 0
    /// Where remote events go: the channel, the envelope, and the whole frame.
    var onEvent: ((String, [UInt8], [UInt8]) -> Void)?

    init(settings: ClusterSettings, loop: EventLoop, logger: Logger) throws(UVError) {
        self.settings = settings
        var options = NATSBus.Options(servers: settings.servers, name: "switchboard \(settings.node)")
        options.echo = false  // a node's own broadcasts have reached its listeners already
        var logger = logger
        logger[metadataKey: "node"] = "\(settings.node)"
        bus = try NATSBus(loop: loop, options: options, logger: logger)
        bus.onConnectionChange = { connected in
            if connected { logger.notice("cluster bus connected") } else { logger.warning("cluster bus lost its connection") }
        }
    }

    func start() { bus.start() }

    /// Stops for good: nothing more goes out or comes in.
    func close() {
        bus.close()
        subscriptions = [:]
        listenerCounts = [:]
        onEvent = nil
    }

    /// Sends a local broadcast to the other nodes.
    func publish(_ event: OutboundEvent) {
        guard let frame = event.binaryFrame else { eventsUnsent += 1; return }  // no wire form: no listener got it either
        let dropped = bus.counters.dropped
        do {
            try bus.publish(subject(event.channel), headers: [], payload: frame)
        } catch {
            eventsUnsent += 1
            return
        }
        if bus.counters.dropped == dropped { eventsOut += 1 } else { eventsUnsent += 1 }
    }

    /// Interest: a local listener joined `channel`; the first one subscribes to it.
    func listenerAdded(on channel: String) {
        listenerCounts[channel, default: 0] += 1
        guard listenerCounts[channel] == 1 else { return }
        subscriptions[channel] = try? bus.subscribe(subject(channel), queue: nil) { [weak self] message in
            self?.received(message.payload, on: channel)
        }
    }

    /// A local listener left `channel`; after the last one the node unsubscribes.
    func listenerRemoved(from channel: String) {
        guard let count = listenerCounts[channel] else { return }
        if count > 1 { listenerCounts[channel] = count - 1; return }
        listenerCounts.removeValue(forKey: channel)
        if let subscription = subscriptions.removeValue(forKey: channel) { bus.unsubscribe(subscription) }
    }

    /// A channel's subject: a digest of its name, since a name may hold anything a subject may not.
    private func subject(_ channel: String) -> String {
        if let subject = subjects[channel] { return subject }
        let subject = "switchboard.event." + Digest.sha256Hex(Array(channel.utf8))
        subjects[channel] = subject
        return subject
    }

    /// Takes a remote event only as one whole MESSAGE frame with id 0 and a payload, on `channel`, read
    /// by the same decoder as a connection's frames.
    private func received(_ bytes: [UInt8], on channel: String) {
        var buffer = InboundBuffer()
        buffer.append(bytes)
        var decoder = FrameDecoder(maxFrame: UInt32(clamping: bytes.count))
        guard case .frame(let frame)? = try? decoder.next(from: &buffer), buffer.readableBytes == 0,
              frame.kind == .message, frame.id == 0, frame.channel == channel, let envelope = frame.payload else {
            eventsMalformed += 1
            return
        }
        eventsIn += 1
        onEvent?(channel, envelope, bytes)
    }

    /// For `switchboard/stats`.
    var statsValue: ChannelValue {
        let bus = self.bus.counters
        return .stringMap([
            "node": .string(settings.node), "connected": .bool(self.bus.isConnected),
            "eventsOut": .int(eventsOut), "eventsIn": .int(eventsIn),
            "eventsUnsent": .int(eventsUnsent), "eventsMalformed": .int(eventsMalformed),
            "channelsListened": .int(subscriptions.count),
            "busMessagesOut": .int(bus.messagesOut), "busMessagesIn": .int(bus.messagesIn),
            "busBytesOut": .int(bus.bytesOut), "busBytesIn": .int(bus.bytesIn),
            "busDropped": .int(bus.dropped), "busReconnects": .int(bus.reconnects),
            "busServerErrors": .int(bus.serverErrors), "busSlowConsumer": .int(bus.slowConsumer),
        ])
    }
}
