import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// A named channel of method calls, answered by a handler on the server: Flutter's `MethodChannel`.
///
/// ```swift
/// let math = MethodChannel(name: "math", server: server)
/// math.setMethodCallHandler { call in
///     guard call.method == "double", let n = call.arguments.intValue else { throw MethodNotImplemented() }
///     return .int(n * 2)
/// }
/// ```
public final class MethodChannel: Sendable {
    /// The channel's name.
    public let name: String
    /// How calls and envelopes are encoded.
    public let codec: any MethodCodec
    /// The server's cores, not the ``Server``: a handler that captures its channel must not keep the
    /// server alive through the jobs that set the channel up (a server that never runs frees itself).
    let cores: [LoopBound<ServerCore>]

    /// Makes a channel on `server`; it answers nothing until a handler is set.
    public init(name: String, codec: any MethodCodec = StandardMethodCodec(), server: Server) {
        self.name = name
        self.codec = codec
        cores = server.group.cores
    }

    /// Sets (or, with nil, removes) the handler. It runs on the loop thread of the connection that
    /// called (with several loops, on several threads at once) and must answer through `result` exactly
    /// once, from any thread, now or later.
    public func setMethodCallHandler(_ handler: (@Sendable (MethodCall, MethodResult) -> Void)?) {
        let name = self.name, codec = self.codec
        cores.onEveryLoop { core in
            core.setChannel(name, handler.map { .method(MethodEntry(codec: codec, handler: $0)) })
        }
    }

    /// Sets an async handler: its return value is the success result; a thrown ``ChannelError`` is an
    /// error envelope, ``MethodNotImplemented`` a not-implemented reply, any other error an error
    /// envelope with code `error`. A CANCEL from the caller cancels the task.
    public func setMethodCallHandler(_ handler: @escaping @Sendable (MethodCall) async throws -> ChannelValue) {
        setMethodCallHandler { call, result in
            let task = Task {
                do {
                    result.success(try await handler(call))
                } catch let error as ChannelError {
                    result.error(error)
                } catch is MethodNotImplemented {
                    result.notImplemented()
                } catch {
                    result.error(ChannelError(code: "error", message: "\(error)"))
                }
            }
            result.onCancel { task.cancel() }
        }
    }

    /// Calls `method` on a connected client's handler of this channel; `completion` runs on the
    /// client's loop thread.
    public func invokeMethod(
        _ method: String, arguments: ChannelValue = .null, on client: ClientID,
        completion: @escaping @Sendable (Result<ChannelValue, InvokeError>) -> Void
    ) {
        let name = self.name, codec = self.codec
        cores.owner(of: client).onLoop { core in
            let payload: [UInt8]
            do throws(CodecError) { payload = try codec.encodeMethodCall(MethodCall(method: method, arguments: arguments)) } catch {
                return completion(.failure(.codec(error)))
            }
            core.sendRequest(to: client, channel: name, payload: payload) { reply in
                switch reply {
                case .failure(let error): completion(.failure(error))
                case .success(nil): completion(.failure(.notImplemented))
                case .success(let bytes?):
                    do throws(CodecError) {
                        switch try codec.decodeEnvelope(bytes) {
                        case .success(let value): completion(.success(value))
                        case .failure(let error): completion(.failure(.error(error)))
                        }
                    } catch { completion(.failure(.codec(error))) }
                }
            }
        }
    }
}

/// Thrown by an async method handler for "not implemented" (a null reply).
public struct MethodNotImplemented: Error, Sendable {
    /// Makes the error.
    public init() {}
}

/// The one answer to one method call: success, error or not implemented. Callable from any thread;
/// only the first answer counts (the loop ignores later ones). A small value: copies answer the same call.
public struct MethodResult: Sendable {
    let request: HandedRequest
    /// The caller.
    public let client: ClientID

    init(request: consuming PendingRequest, loop: LoopHandle) {
        client = ClientID(request.connectionID)
        self.request = HandedRequest(request, on: loop)
    }

    /// The request, moved back out once the handler has returned (loop thread only).
    consuming func takeRequest() -> PendingRequest { request.take() }

    // Each answer is given at once when the handler answers on the loop thread (the common case: no
    // hop and no closure), else queued onto the loop.

    /// Answers with a success envelope.
    public func success(_ value: ChannelValue) {
        if request.isOnItsLoop { request.value.answerSuccess(value) } else { request.onLoop { $0.answerSuccess(value) } }
    }

    /// Answers with an error envelope.
    public func error(_ error: ChannelError) {
        if request.isOnItsLoop { request.value.answerError(error) } else { request.onLoop { $0.answerError(error) } }
    }

    /// Refuses the call with an ERROR, as a plugin's refusal is answered (loop thread only).
    func refuse(_ error: WireError) { request.value.answer(.error(error)) }

    /// Answers with a null reply ("not implemented").
    public func notImplemented() {
        if request.isOnItsLoop { request.value.answer(.notImplemented) } else { request.onLoop { $0.answer(.notImplemented) } }
    }

    /// Runs `body` if the caller cancels (CANCEL frame) before an answer is given. The cancel itself is
    /// answered with the error code `cancelled`; later answers are ignored.
    public func onCancel(_ body: @escaping @Sendable () -> Void) {
        request.onLoop { request in
            if !request.isAnswered { request.onCancel = .handler(body) }  // answered: nothing left to cancel
        }
    }
}

extension [LoopBound<ServerCore>] {
    /// Runs `body` with each core on its loop thread.
    func onEveryLoop(_ body: @escaping @Sendable (ServerCore) -> Void) {
        for core in self { core.onLoop(body) }
    }

    /// The core whose loop thread calls; nil off every loop thread.
    var current: LoopBound<ServerCore>? { first { $0.loop.isInLoopThread } }
    /// The index of the calling loop (0 off every loop thread).
    var currentIndex: Int { firstIndex { $0.loop.isInLoopThread } ?? 0 }

    /// The core serving `client` (connection ids are dealt round the loops).
    func owner(of client: ClientID) -> LoopBound<ServerCore> { self[Int((client.rawValue &- 1) % UInt64(count))] }
}

extension LoopBound {
    /// Runs `body` with the value on the loop thread: at once when already there, else queued.
    func onLoop(_ body: @escaping @Sendable (Value) -> Void) {
        if loop.isInLoopThread {
            body(value)
        } else {
            let bound = self
            loop.execute { body(bound.value) }
        }
    }
}

/// A named channel of event streams: Flutter's `EventChannel`. Each listening client gets its own
/// ``EventSink``; ``broadcast(_:)`` reaches every current listener with one encoding.
public final class EventChannel: Sendable {
    /// The channel's name.
    public let name: String
    /// How `listen`/`cancel` calls and event envelopes are encoded.
    public let codec: any MethodCodec
    /// What happens when a listener's queue is full.
    public let overflow: OverflowPolicy
    /// Per-listener queue length; nil = the server's default.
    public let queueLimit: Int?
    /// The server's cores, not the ``Server``: a handler that captures its channel must not keep the
    /// server alive through the jobs that set the channel up (a server that never runs frees itself).
    let cores: [LoopBound<ServerCore>]
    /// Broadcasts from other threads on their way to the loop.
    let producerQueue: ProducerQueue

    /// Makes a channel on `server`.
    public init(name: String, codec: any MethodCodec = StandardMethodCodec(), overflow: OverflowPolicy = .dropOldest,
                queueLimit: Int? = nil, server: Server) {
        self.name = name
        self.codec = codec
        self.overflow = overflow
        self.queueLimit = queueLimit
        cores = server.group.cores
        producerQueue = ProducerQueue(limit: queueLimit ?? server.configuration.eventQueueLimit, overflow: overflow,
                                      loop: server.core.loop)
    }

    /// Sets (or removes) the stream handler; its methods run on the loop thread of the listener's
    /// connection (with several loops, on several threads at once).
    public func setStreamHandler(_ handler: (any StreamHandler)?) {
        let name = self.name, codec = self.codec, overflow = self.overflow, queueLimit = self.queueLimit
        cores.onEveryLoop { core in
            core.setChannel(name, handler.map {
                .event(EventEntry(name: name, codec: codec, handler: $0, overflow: overflow,
                                  queueLimit: queueLimit ?? core.config.eventQueueLimit))
            })
        }
    }

    /// Sends `value` to every current listener, encoded once per wire encoding. Callable from any
    /// thread: on a loop thread it is queued for that loop's listeners at once, and crosses once to each
    /// other loop with listeners; from another thread it waits for one coalesced hop to loop 0 in a
    /// queue bounded by ``queueLimit`` under ``overflow`` (drops counted as `producerQueueFull`), so a
    /// producer faster than the loop never blocks and never grows memory.
    public func broadcast(_ value: ChannelValue) { send(.data(value)) }

    /// Sends an error event to every current listener. Callable from any thread, as ``broadcast(_:)``.
    public func broadcastError(_ error: ChannelError) { send(.error(error)) }

    private func send(_ content: EventContent) {
        let name = self.name
        if let core = cores.current { return core.value.broadcast(on: name, content) }
        enqueue(content)
    }

    /// Queues `content` for one coalesced hop onto loop 0, from any thread (the loop's own included).
    func enqueue(_ content: EventContent) {
        let name = self.name, queue = producerQueue, core = cores[0]
        queue.add(content) {
            let (events, dropped) = queue.take()
            core.value.countDrop("producerQueueFull", count: dropped)
            for event in events { core.value.broadcast(on: name, event) }
        }
    }
}

/// Produces one client's event stream: Flutter's `StreamHandler`. Both methods run on the loop thread of
/// the listener's connection (with several loops, on several threads at once).
public protocol StreamHandler: Sendable {
    /// A client started listening; return an error to refuse (sent as the listen reply).
    func onListen(arguments: ChannelValue, sink: EventSink) -> ChannelError?
    /// The client's stream ended: it cancelled, listened again, disconnected, or the server is stopping.
    func onCancel(arguments: ChannelValue, sink: EventSink)
}

/// A ``StreamHandler`` made of two closures.
public struct StreamHandlerClosures: StreamHandler {
    let listen: @Sendable (ChannelValue, EventSink) -> ChannelError?
    let cancel: @Sendable (ChannelValue, EventSink) -> Void

    /// Makes a handler.
    public init(onListen: @escaping @Sendable (ChannelValue, EventSink) -> ChannelError?,
                onCancel: @escaping @Sendable (ChannelValue, EventSink) -> Void = { _, _ in }) {
        listen = onListen
        cancel = onCancel
    }

    public func onListen(arguments: ChannelValue, sink: EventSink) -> ChannelError? { listen(arguments, sink) }
    public func onCancel(arguments: ChannelValue, sink: EventSink) { cancel(arguments, sink) }
}

/// One listener's end of an event stream: Flutter's `EventSink`. `success`, `error` and `endOfStream`
/// may be called from any thread; after the stream ends they do nothing.
///
/// From another thread, events wait for one coalesced hop onto its connection's loop in a queue bounded
/// by the channel's queue length under its overflow policy (drops counted as `producerQueueFull`).
///
/// A handler may keep its sinks as long as it likes: a sink refers to its stream weakly, so a kept sink
/// never keeps a finished stream (and through it the connection and the server) alive.
public final class EventSink: Sendable {
    struct Target {
        /// Weak: the stream's anchor lives exactly as long as the stream.
        weak var anchor: EventStream.Anchor?
        let eventLoop: EventLoop
        var stream: EventStream? { anchor?.stream }
    }
    let target: LoopBound<Target>
    /// The listening client.
    public let client: ClientID
    let producerQueue: ProducerQueue

    init(stream: EventStream, loop: LoopHandle, client: ClientID) {
        target = LoopBound(Target(anchor: stream.anchor, eventLoop: stream.connection.core.eventLoop), loop: loop)
        self.client = client
        producerQueue = ProducerQueue(limit: stream.entry.queueLimit, overflow: stream.entry.overflow, loop: loop)
    }

    /// Sends an event.
    public func success(_ value: ChannelValue) { send(.data(value)) }
    /// Sends an error event; the stream goes on.
    public func error(_ error: ChannelError) { send(.error(error)) }
    /// Ends the stream.
    public func endOfStream() { send(.end) }

    private func send(_ content: EventContent) {
        if target.loop.isInLoopThread { target.value.stream?.emit(content); return }
        let target = self.target, queue = producerQueue
        queue.add(content) {
            let (events, dropped) = queue.take()
            // Ended meanwhile: like events sent after the end, these go nowhere (drops included).
            guard let stream = target.value.stream else { return }
            stream.connection.core.countDrop("producerQueueFull", count: dropped)
            for event in events { stream.emit(event) }
        }
    }

    /// The stream while it lasts, for the loop-thread-only properties below: checked in every build,
    /// since a foreign thread here would race the loop.
    var liveStream: EventStream? {
        precondition(target.loop.isInLoopThread || !target.loop.isRunning, "EventSink: this property is for the loop thread")
        return target.value.stream
    }

    /// Loop thread only: whether an event sent now goes straight out (the stream is live, has credit,
    /// nothing waits before it, and the connection is under its outbound limit).
    public var isReady: Bool { liveStream?.isReady ?? false }

    /// Loop thread only: the listener's outstanding credit; nil when the stream is in push mode.
    public var outstandingCredit: UInt32? { liveStream?.outstandingCredit }

    /// Loop thread only: whether the stream is still live.
    public var isActive: Bool { liveStream?.isActive ?? false }

    /// Loop thread only: runs `body` once, the next time the sink becomes ready (see ``isReady``).
    public func onReady(_ body: @escaping () -> Void) { liveStream?.readyCallback = body }

    /// Loop thread only: the loop this sink's stream lives on, for producers that need timers.
    public var eventLoop: EventLoop {
        precondition(target.loop.isInLoopThread || !target.loop.isRunning, "EventSink: this property is for the loop thread")
        return target.value.eventLoop
    }
}

/// A named channel of messages: Flutter's `BasicMessageChannel`.
public final class BasicMessageChannel<Codec: MessageCodec>: Sendable {
    /// The channel's name.
    public let name: String
    /// How messages are encoded.
    public let codec: Codec
    /// The server's cores, not the ``Server``: a handler that captures its channel must not keep the
    /// server alive through the jobs that set the channel up (a server that never runs frees itself).
    let cores: [LoopBound<ServerCore>]

    /// Makes a channel on `server`.
    public init(name: String, codec: Codec, server: Server) {
        self.name = name
        self.codec = codec
        cores = server.group.cores
    }

    /// Sets (or removes) the message handler; it runs on the loop thread of the connection that sent
    /// (with several loops, on several threads at once) and answers through `reply`.
    // Specialized for the built-in codecs: a handler set from another module (an embedder's, or
    // SwitchboardDemo's room.post) would otherwise run the generic code for every message, about 1,300
    // instructions more per post (scripts/bench-instructions' fan-out, +2.7 % per delivery). So is `reply`.
    @specialized(where Codec == BinaryCodec)
    @specialized(where Codec == StandardMessageCodec)
    @specialized(where Codec == StringCodec)
    @specialized(where Codec == JSONMessageCodec)
    public func setMessageHandler(_ handler: (@Sendable (Codec.Message, MessageReply<Codec>) -> Void)?) {
        let name = self.name, codec = self.codec
        cores.onEveryLoop { core in
            let loop = core.handle  // not the core: the channel table must not keep the core alive
            core.setChannel(name, handler.map { handler in
                .message(MessageEntry(codecName: Introspection.codecName(codec), encode: { value throws(CodecError) in try codec.encode(codec.message(from: value)) }) { input, request in
                    let message: Codec.Message
                    do throws(CodecError) {
                        switch input {
                        case .bytes(let payload): message = try codec.decode(payload)
                        case .value(let value): message = try codec.message(from: value)
                        }
                    } catch {
                        return request.answer(.error(.badPayload("message could not be decoded: \(error)")))
                    }
                    handler(message, MessageReply(request: request, codec: codec, loop: loop))
                })
            })
        }
    }

    /// Sends `message` to a connected client's handler of this channel; `reply` runs on the client's
    /// loop thread.
    public func send(_ message: Codec.Message, to client: ClientID,
                     reply: @escaping @Sendable (Result<Codec.Message, InvokeError>) -> Void) {
        let name = self.name, codec = self.codec
        cores.owner(of: client).onLoop { core in
            let payload: [UInt8]?
            do throws(CodecError) { payload = try codec.encode(message) } catch { return reply(.failure(.codec(error))) }
            core.sendRequest(to: client, channel: name, payload: payload) { answer in
                switch answer {
                case .failure(let error): reply(.failure(error))
                case .success(let bytes):
                    do throws(CodecError) { reply(.success(try codec.decode(bytes))) } catch { reply(.failure(.codec(error))) }
                }
            }
        }
    }
}

/// The one reply to one message. Callable from any thread; only the first reply counts.
public final class MessageReply<Codec: MessageCodec>: Sendable {
    private let request: HandedRequest
    private let codec: Codec
    /// The sender.
    public let client: ClientID

    init(request: PendingRequest, codec: Codec, loop: LoopHandle) {
        self.request = HandedRequest(request, on: loop)
        self.codec = codec
        self.client = ClientID(request.connectionID)
    }

    /// Replies with `message`.
    @specialized(where Codec == BinaryCodec)
    @specialized(where Codec == StandardMessageCodec)
    @specialized(where Codec == StringCodec)
    @specialized(where Codec == JSONMessageCodec)
    public func reply(_ message: Codec.Message) {
        let codec = self.codec
        request.onLoop { request in
            if request.isText { return request.answer(.messageValue(codec.value(of: message))) }
            do throws(CodecError) { request.answer(.messageBytes(try codec.encode(message))) } catch {
                request.answer(.error(.badPayload("reply could not be encoded: \(error)")))
            }
        }
    }

    /// Answers with an ERROR instead of a reply.
    public func fail(_ error: WireError) { request.onLoop { $0.answer(.error(error)) } }
}
