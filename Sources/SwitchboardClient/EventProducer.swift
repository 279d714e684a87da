import SwitchboardCodec

/// Produces a client-held event channel's events: the client-side counterpart of a server's
/// `StreamHandler`. The server keeps the listeners; it calls `onListen` when the first one arrives and
/// `onCancel` when the last one leaves, so a producer runs only while someone listens.
public protocol EventProducer: Sendable {
    /// Start producing into `sink`; return an error to refuse the listen.
    func onListen(arguments: ChannelValue, sink: ProducerSink) async -> ChannelError?
    /// Stop producing.
    func onCancel(arguments: ChannelValue) async
}

/// Where a client-held event channel's events go: every listener, through the server (encoded once by
/// this client, fanned out by the server). Callable from any thread.
public struct ProducerSink: Sendable {
    let channel: EventChannel

    /// Sends an event.
    public func success(_ value: ChannelValue) { send(try? channel.codec.encodeSuccessEnvelope(value)) }
    /// Sends an error event; the stream goes on.
    public func error(_ error: ChannelError) { send(try? channel.codec.encodeErrorEnvelope(error)) }
    /// Ends every listener's stream.
    public func endOfStream() { channel.client.post(channel: channel.name, payload: nil) }

    private func send(_ envelope: [UInt8]?) {
        guard let envelope else { return }
        channel.client.post(channel: channel.name, payload: envelope)
    }
}

extension EventChannel {
    /// Holds this event channel for other clients, produced by `producer` (nil unregisters).
    /// - Throws: ``ClientError/server(code:message:)`` `channel_taken` if someone else handles it.
    public func setStreamHandler(_ producer: (any EventProducer)?) async throws {
        let codec = self.codec
        let sink = ProducerSink(channel: self)
        let incoming: IncomingHandler? = producer.map { producer in
            { @Sendable payload async throws -> [UInt8]? in
                let call = try codec.decodeMethodCall(payload)
                switch call.method {
                case "listen":
                    if let refusal = await producer.onListen(arguments: call.arguments, sink: sink) {
                        return try codec.encodeErrorEnvelope(refusal)
                    }
                    return try codec.encodeSuccessEnvelope(.null)
                case "cancel":
                    await producer.onCancel(arguments: call.arguments)
                    return try codec.encodeSuccessEnvelope(.null)
                default:
                    return nil
                }
            }
        }
        try await client.setIncomingHandler(name, declaration: declaration(kind: "event", codec: codec), incoming)
    }
}
