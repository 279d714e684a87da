#if canImport(Combine)
import Combine
#else
import OpenCombine
#endif
import Synchronization
import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// A connection to a Switchboard server, with its own libuv loop on its own thread.
///
/// ```swift
/// let client = try await Client.connect(ClientConfiguration(host: "127.0.0.1", port: 7420))
/// let echo = MethodChannel(name: "switchboard/echo", client: client)
/// print(try await echo.invokeMethod("echo", arguments: ["hello": 1]))
/// for try await tick in EventChannel(name: "switchboard/ticker", client: client)
///     .receiveBroadcastStream(arguments: ["count": 3, "intervalMs": 100]) { print(tick) }
/// await client.close()
/// ```
public final class Client: Sendable {
    /// How it was configured.
    public let configuration: ClientConfiguration
    let core: LoopBound<ClientCore>
    private let box = StatusBox()
    private let nextID = Atomic<UInt32>(0)

    private final class StatusBox: Sendable {
        let status = Mutex(Status())
        let sessionSubject = SessionSubject()
    }

    private struct Status {
        var state = ConnectionState.connecting
        var watchers: [UInt64: AsyncStream<ConnectionState>.Continuation] = [:]
        var sessionWatchers: [UInt64: AsyncStream<SessionEvent>.Continuation] = [:]
        var nextWatcher: UInt64 = 0
        var isStopped = false
        var stopWaiters: [CheckedContinuation<Void, Never>] = []
    }

    private init(configuration: ClientConfiguration) throws {
        self.configuration = configuration
        let loop = try EventLoop()
        let box = self.box
        core = LoopBound(ClientCore(config: configuration, loop: loop) { state in
            let watchers = box.status.withLock { s in
                s.state = state
                return Array(s.watchers.values)
            }
            for watcher in watchers { watcher.yield(state) }
        } publishSession: { event in
            let watchers = box.status.withLock { Array($0.sessionWatchers.values) }
            for watcher in watchers { watcher.yield(event) }
            box.sessionSubject.send(event)
        }, loop: loop.handle)
    }

    /// Connects (TCP, then HELLO/WELCOME) and returns a ready client.
    /// - Throws: ``ClientError/connectionFailed(_:)`` when the server cannot be reached or refuses HELLO.
    public static func connect(_ configuration: ClientConfiguration = ClientConfiguration()) async throws -> Client {
        let client = try Client(configuration: configuration)
        let core = client.core
        let result: Result<Void, ClientError> = await withCheckedContinuation { continuation in
            core.loop.execute { core.value.start { continuation.resume(returning: $0) } }
            startThread { [weak client] in
                core.value.loop.run()
                client?.markStopped()
            }
        }
        try result.get()
        return client
    }

    /// The connection's current state.
    public var state: ConnectionState { box.status.withLock { $0.state } }

    /// The current state, then every change, until the client is closed.
    public func stateUpdates() -> AsyncStream<ConnectionState> {
        AsyncStream { continuation in
            let id = box.status.withLock { s in
                s.nextWatcher += 1
                s.watchers[s.nextWatcher] = continuation
                continuation.yield(s.state)
                if s.isStopped { continuation.finish() }
                return s.nextWatcher
            }
            continuation.onTermination = { [weak self] _ in
                _ = self?.box.status.withLock { $0.watchers.removeValue(forKey: id) }
            }
        }
    }

    /// What happens to the session (``ClientConfiguration/session``) from now on, until the client is
    /// closed: ``SessionEvent/resumed`` after each resumed connection, ``SessionEvent/restarted(_:)``
    /// when a session could not be resumed, ``SessionEvent/ended(reason:streams:)`` when the server
    /// ended it.
    public func sessionEvents() -> AsyncStream<SessionEvent> {
        AsyncStream { continuation in
            let id = box.status.withLock { s in
                s.nextWatcher += 1
                s.sessionWatchers[s.nextWatcher] = continuation
                if s.isStopped { continuation.finish() }
                return s.nextWatcher
            }
            continuation.onTermination = { [weak self] _ in
                _ = self?.box.status.withLock { $0.sessionWatchers.removeValue(forKey: id) }
            }
        }
    }

    /// ``sessionEvents()`` as a Combine publisher (OpenCombine on Linux); it finishes when the client
    /// has closed.
    public var sessionEventPublisher: AnyPublisher<SessionEvent, Never> { box.sessionSubject.eraseToAnyPublisher() }

    /// Closes the connection for good and waits for the client's thread to finish. Calls in flight fail
    /// with ``ClientError/closed``; streams end.
    public func close() async {
        let core = self.core
        core.loop.execute { core.value.close() }
        await withCheckedContinuation { continuation in
            let done = box.status.withLock { s in
                if s.isStopped { return true }
                s.stopWaiters.append(continuation)
                return false
            }
            if done { continuation.resume() }
        }
    }

    deinit {
        let core = self.core
        core.loop.execute { core.value.close() }
    }

    private func markStopped() {
        let (waiters, watchers, sessionWatchers) = box.status.withLock { s in
            s.isStopped = true
            defer { s.stopWaiters = []; s.watchers = [:]; s.sessionWatchers = [:] }
            return (s.stopWaiters, Array(s.watchers.values), Array(s.sessionWatchers.values))
        }
        for watcher in watchers { watcher.finish() }
        for watcher in sessionWatchers { watcher.finish() }
        box.sessionSubject.send(completion: .finished)
        for waiter in waiters { waiter.resume() }
    }

    // MARK: Requests

    /// A fresh request id (1 … 0x7FFFFFFF; the client's own internal requests use the upper half).
    private func makeID() -> UInt32 {
        let n = nextID.wrappingAdd(1, ordering: .relaxed).newValue
        return n & 0x7FFF_FFFF == 0 ? 1 : n & 0x7FFF_FFFF
    }

    /// Sends `payload` on `channel` and returns the REPLY payload (nil = null reply).
    ///
    /// Cancelling the calling task, or running past `timeout` (default: the configuration's), sends
    /// CANCEL and fails the call at once (`CancellationError`, ``ClientError/timedOut``).
    public func request(channel: String, payload: [UInt8]?, timeout: Duration? = nil) async throws -> [UInt8]? {
        try Task.checkCancellation()
        let id = makeID()
        let call = CallState()
        let core = self.core
        let timeout = timeout ?? configuration.requestTimeout
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<[UInt8]?, any Error>) in
                let queued = core.loop.execute {
                    guard call.markSent() else { return continuation.resume(throwing: CancellationError()) }
                    core.value.request(id: id, channel: channel, payload: payload, timeout: timeout) {
                        continuation.resume(with: $0)
                    }
                }
                if !queued { continuation.resume(throwing: ClientError.closed) }  // the loop has stopped
            }
        } onCancel: {
            if call.cancelBeforeSend() { return }
            core.loop.execute { core.value.cancel(id: id) }
        }
    }

    /// Sends a PING and waits for its PONG.
    public func ping(timeout: Duration? = nil) async throws {
        let id = makeID()
        let core = self.core
        let timeout = timeout ?? configuration.requestTimeout
        _ = try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<[UInt8]?, any Error>) in
                let queued = core.loop.execute { core.value.ping(id: id, timeout: timeout) { continuation.resume(with: $0) } }
                if !queued { continuation.resume(throwing: ClientError.closed) }
            }
        } onCancel: {
            core.loop.execute { core.value.cancel(id: id) }
        }
    }

    /// Sends `payload` on `channel` with no reply wanted (id 0).
    public func post(channel: String, payload: [UInt8]?) {
        let core = self.core
        core.loop.execute { core.value.post(channel: channel, payload: payload) }
    }

    /// Sets (or removes) the handler of MESSAGEs to `channel` on this client, and holds the channel on
    /// the server for other clients (REGISTER; UNREGISTER when removed). Re-registered after reconnects.
    /// - Throws: ``ClientError/server(code:message:)`` `channel_taken` when another client or the server
    ///   already handles the channel (the handler is then removed again).
    func setIncomingHandler(_ channel: String, declaration: ChannelValue?, _ handler: IncomingHandler?) async throws {
        let core = self.core
        let payload = try declaration.map { try JSONText.serialize($0) }
        let result: Result<[UInt8]?, any Error> = await withCheckedContinuation { continuation in
            let queued = core.loop.execute {
                core.value.handlers[channel] = handler
                core.value.register(channel, declaration: payload, remove: handler == nil) { result in
                    if case .failure = result, handler != nil { core.value.handlers[channel] = nil }
                    continuation.resume(returning: result)
                }
            }
            if !queued { continuation.resume(returning: .failure(ClientError.closed)) }
        }
        _ = try result.get()
    }
}

/// Whether a call was sent before its task was cancelled: the two race from different threads.
private final class CallState: Sendable {
    private let state = Mutex(0)  // 0 new, 1 sent, 2 cancelled before sending

    /// On the loop: true if the call may go out.
    func markSent() -> Bool {
        state.withLock { s in
            guard s == 0 else { return false }
            s = 1
            return true
        }
    }

    /// From the cancelling thread: true if the call had not been sent (and now never will be).
    func cancelBeforeSend() -> Bool {
        state.withLock { s in
            guard s == 0 else { return false }
            s = 2
            return true
        }
    }
}

/// The subject behind ``Client/sessionEventPublisher``.
private final class SessionSubject: @unchecked Sendable {
    // @unchecked: the subject's only stored property is a PassthroughSubject, which serializes its own
    // state under a lock in both Combine and OpenCombine; events are sent from the client's loop thread
    // alone (and its completion once, after that loop has finished), and subscribing is thread-safe.
    private let subject = PassthroughSubject<SessionEvent, Never>()

    func send(_ event: SessionEvent) { subject.send(event) }
    func send(completion: Subscribers.Completion<Never>) { subject.send(completion: completion) }
    func eraseToAnyPublisher() -> AnyPublisher<SessionEvent, Never> { subject.eraseToAnyPublisher() }
}
