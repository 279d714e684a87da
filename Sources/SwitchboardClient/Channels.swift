import SwitchboardTransport
import SwitchboardCodec

/// Calls methods on a server's channel: Flutter's `MethodChannel`, client side.
public struct MethodChannel: Sendable {
    /// The channel's name.
    public let name: String
    /// How calls and envelopes are encoded.
    public let codec: any MethodCodec
    /// The connection.
    public let client: Client

    /// Makes a channel object; nothing is sent until a call.
    public init(name: String, codec: any MethodCodec = StandardMethodCodec(), client: Client) {
        self.name = name
        self.codec = codec
        self.client = client
    }

    /// Calls `method` and returns its result.
    /// - Throws: ``ChannelError`` for an error envelope, ``MissingImplementation`` for "not implemented",
    ///   ``ClientError`` when the call could not complete, `CancellationError` when the task was cancelled.
    @discardableResult
    public func invokeMethod(_ method: String, arguments: ChannelValue = .null, timeout: Duration? = nil) async throws -> ChannelValue {
        let payload = try codec.encodeMethodCall(MethodCall(method: method, arguments: arguments))
        guard let reply = try await client.request(channel: name, payload: payload, timeout: timeout) else {
            throw MissingImplementation(channel: name, method: method)
        }
        do {
            return try codec.decodeEnvelope(reply).get()
        } catch let error as CodecError {
            throw ClientError.badReply("\(error)")
        }
    }

    /// Calls `method` with `Encodable` arguments and decodes the result as `R`.
    public func invokeMethod<R: Decodable>(_ method: String, arguments: some Encodable, as type: R.Type = R.self,
                                           timeout: Duration? = nil) async throws -> R {
        let value = try await invokeMethod(method, arguments: try ChannelValueEncoder().encode(arguments), timeout: timeout)
        return try ChannelValueDecoder().decode(R.self, from: value)
    }

    /// Serves this channel from the client: calls from the server and, through the server, from every
    /// other client (the channel is registered with the server; nil unregisters). The handler returns the
    /// result, throws a ``ChannelError`` for an error envelope or ``MissingImplementation`` for a null reply.
    /// - Throws: ``ClientError/server(code:message:)`` `channel_taken` if someone else handles the channel.
    public func setMethodCallHandler(_ handler: (@Sendable (MethodCall) async throws -> ChannelValue)?) async throws {
        let codec = self.codec
        let incoming: IncomingHandler? = handler.map { handler in
            { @Sendable payload async throws -> [UInt8]? in
                let call = try codec.decodeMethodCall(payload)
                do {
                    return try codec.encodeSuccessEnvelope(try await handler(call))
                } catch let error as ChannelError {
                    return try codec.encodeErrorEnvelope(error)
                } catch is MissingImplementation {
                    return nil
                } catch is CancellationError {
                    return try codec.encodeErrorEnvelope(ChannelError(code: "cancelled", message: "the caller cancelled"))
                } catch {
                    return try codec.encodeErrorEnvelope(ChannelError(code: "error", message: "\(error)"))
                }
            }
        }
        try await client.setIncomingHandler(name, declaration: declaration(kind: "method", codec: codec), incoming)
    }
}

/// The REGISTER declaration for a channel whose codec is one of Flutter's (none for custom codecs).
func declaration(kind: String, codec: Any) -> ChannelValue {
    let name: String? = switch codec {
    case is StandardMethodCodec, is StandardMessageCodec: "standard"
    case is JSONMethodCodec, is JSONMessageCodec: "json"
    case is StringCodec: "string"
    case is BinaryCodec: "binary"
    default: nil
    }
    var entries: [ChannelValue.MapEntry] = [.init("kind", .string(kind))]
    if let name { entries.append(.init("codec", .string(name))) }
    return .map(entries)
}

/// Sends messages to a server's channel: Flutter's `BasicMessageChannel`, client side.
public struct BasicMessageChannel<Codec: MessageCodec>: Sendable {
    /// The channel's name.
    public let name: String
    /// How messages are encoded.
    public let codec: Codec
    /// The connection.
    public let client: Client

    /// Makes a channel object.
    public init(name: String, codec: Codec, client: Client) {
        self.name = name
        self.codec = codec
        self.client = client
    }

    /// Sends `message` and returns the reply (a null reply decodes as the codec's null message).
    public func send(_ message: Codec.Message, timeout: Duration? = nil) async throws -> Codec.Message {
        let reply = try await client.request(channel: name, payload: try codec.encode(message), timeout: timeout)
        do { return try codec.decode(reply) } catch { throw ClientError.badReply("\(error)") }
    }

    /// Serves this channel from the client: messages from the server and, through it, from other
    /// clients (registered with the server; nil unregisters).
    public func setMessageHandler(_ handler: (@Sendable (Codec.Message) async throws -> Codec.Message)?) async throws {
        let codec = self.codec
        let incoming: IncomingHandler? = handler.map { handler in
            { @Sendable payload async throws -> [UInt8]? in try codec.encode(try await handler(try codec.decode(payload))) }
        }
        try await client.setIncomingHandler(name, declaration: declaration(kind: "message", codec: codec), incoming)
    }
}

/// Listens to a server's event channel: Flutter's `EventChannel`, client side.
public struct EventChannel: Sendable {
    /// The channel's name.
    public let name: String
    /// How `listen`/`cancel` and events are encoded.
    public let codec: any MethodCodec
    /// The connection.
    public let client: Client

    /// Makes a channel object.
    public init(name: String, codec: any MethodCodec = StandardMethodCodec(), client: Client) {
        self.name = name
        self.codec = codec
        self.client = client
    }

    /// The channel's events: `listen` is sent when iteration starts, `cancel` when the iterating task is
    /// cancelled or the iterator is dropped. An error event ends the iteration by throwing its
    /// ``ChannelError`` (as `await for` does in Dart); end of stream ends it normally. After a reconnect
    /// the stream is listened to again (also when the server ended it because it was shutting down).
    /// The stream is paced: see ``EventStream``.
    public func receiveBroadcastStream(arguments: ChannelValue = .null) -> EventStream {
        EventStream(channel: self, arguments: arguments)
    }
}

/// The events of one `listen`, as an `AsyncSequence` backed by an `AsyncThrowingStream`. The stream is
/// paced (DEMAND credit): the client asks for ``window`` events ahead of its consumer and for more as
/// they are consumed, so a consumer that falls behind makes the server hold events back (under the
/// channel's overflow policy, counted) instead of this client dropping any.
public struct EventStream: AsyncSequence, Sendable {
    public typealias Element = ChannelValue
    let channel: EventChannel
    let arguments: ChannelValue

    /// Events asked for ahead of the consumer: at most this many wait in the client.
    public static let window: UInt32 = 1024

    /// Starts listening.
    public func makeAsyncIterator() -> Iterator {
        let (stream, continuation) = AsyncThrowingStream<ChannelValue, any Error>.makeStream(bufferingPolicy: .unbounded)
        let core = channel.client.core
        let listener = StreamListener(channel: channel.name, codec: channel.codec, arguments: arguments, credit: Self.window,
            onEvent: { event in
                switch event {
                case .success(let value): continuation.yield(value)
                case .failure(let error): continuation.finish(throwing: error)
                }
            },
            onEnd: { error in continuation.finish(throwing: error) })
        let bound = LoopBound(listener, loop: core.loop)
        let queued = core.loop.execute {
            continuation.onTermination = { _ in core.loop.execute { core.value.stopListening(bound.value) } }
            core.value.listen(bound.value)
        }
        if !queued { continuation.finish(throwing: ClientError.closed) }
        return Iterator(events: stream.makeAsyncIterator()) { credit in
            core.loop.execute { core.value.addCredit(credit, to: bound.value) }
        }
    }

    /// Iterates the events, asking for more (a quarter of ``EventStream/window`` at a time) as they
    /// are consumed.
    public struct Iterator: AsyncIteratorProtocol {
        var events: AsyncThrowingStream<ChannelValue, any Error>.Iterator
        let grant: @Sendable (UInt32) -> Void
        var consumed: UInt32 = 0

        init(events: AsyncThrowingStream<ChannelValue, any Error>.Iterator, grant: @escaping @Sendable (UInt32) -> Void) {
            self.events = events
            self.grant = grant
        }

        /// The next event; nil at the end of the stream.
        public mutating func next() async throws -> ChannelValue? {
            guard let event = try await events.next() else { return nil }
            consumed += 1
            if consumed == EventStream.window / 4 {
                consumed = 0
                grant(EventStream.window / 4)
            }
            return event
        }
    }
}
