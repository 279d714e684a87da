import SwitchboardCodec
import SwitchboardPluginAPI
import SwitchboardTransport
import SwitchboardWire

/// The one answer a request gets, before it is put in the requester's encoding.
enum Answer: Sendable {
    case success(ChannelValue, any MethodCodec)
    case failure(ChannelError, any MethodCodec)
    /// A null reply: "not implemented" for calls, a null reply for messages.
    case notImplemented
    case messageBytes([UInt8]?)
    case messageValue(ChannelValue)
    case error(WireError)
}

/// What a text-mode request asked for, which decides the shape of its answer line.
enum TextRequestKind { case call, listen, cancel, send }

/// A request (MESSAGE with id != 0, or a text-mode request) that has not been answered yet.
/// Loop thread only. Answering removes it from its connection; a second answer is ignored.
final class PendingRequest {
    enum Origin {
        case binary(id: UInt32)
        indirect case text(id: ChannelValue?, kind: TextRequestKind)  // boxed: copying a binary origin stays trivial
        /// Its answer goes nowhere, yet its connection keeps it (``Connection/keepOffWire(_:)``): a request
        /// a duplicate id took off the wire, or a listen with id 0, that waits on a holder or elsewhere.
        case offWire

        var isText: Bool { if case .text = self { true } else { false } }
    }

    /// Strong: the connection's request tables hold the request until it is answered or abandoned,
    /// and both break this back reference (a weak one cost a side-table allocation per request). A
    /// success given while the handler first runs keeps it, for the request to become its connection's
    /// spare with it (``Connection/settle(_:)`` breaks it otherwise, and a closing connection lets its
    /// spare go): reusing the spare then sets nothing.
    var connection: Connection?
    let connectionID: UInt64
    /// The loop whose thread alone touches the request: set on that thread when the request is first
    /// handed to a handler (``HandedRequest``), and never changed after, so other threads may read it.
    /// A connection's spare request keeps it, so most calls set nothing; a request that goes to a holder
    /// or elsewhere never needs it (a strong reference set for every new request cost a retain and a
    /// release per relayed call).
    private(set) var loop: LoopHandle?
    private(set) var origin: Origin
    /// Orders open requests; 0 for a detached request (one its connection does not keep).
    private(set) var serial: UInt64
    /// Set for method calls: their answers are envelopes in this codec, and so is a CANCEL's (`cancelled`).
    private(set) var methodCodec: SharedMethodCodec?
    /// Whether the request outlived its handler's first run and sits in the connection's table of open
    /// requests (most are answered at once and never need it).
    var isRegistered = false
    /// What a CANCEL from the requester does before the answer: run the handler's hook (an async
    /// handler cancels its task), or tell the client the request was forwarded to.
    var onCancel = OnCancel.nothing

    enum OnCancel {
        case nothing
        case handler(() -> Void)
        /// Forwarded to a client holding the channel, under that client's id `id`.
        case forwarded(holder: Connection, id: UInt32)
        /// Sent to another node: the CANCEL is relayed there (by `body`), and the answer to it comes
        /// from there, as that node answers its own clients' CANCELs.
        case relayed(() -> Void)

        /// Tells whoever works on the request that it is cancelled.
        func run() {
            switch self {
            case .nothing: break
            case .handler(let body), .relayed(let body): body()
            case .forwarded(let holder, let id): holder.sendCancel(id)
            }
        }
    }
    private(set) var isAnswered = false
    /// Where the answer goes for a request from another node; nil for this node's clients.
    private var remoteAnswer: ((Answer) -> Void)?
    /// Set (by ``Connection/makeRequest(_:methodCodec:)``) only while some plugin's outbound stage sees
    /// answers (see ``Pipeline/seesAnswers``); never touched otherwise.
    var trace: RequestTrace?

    init(connection: Connection, origin: Origin, serial: UInt64, methodCodec: SharedMethodCodec?) {
        self.connection = connection
        self.connectionID = connection.id
        self.origin = origin
        self.serial = serial
        self.methodCodec = methodCodec
    }

    /// A request nobody waits for (a MESSAGE with id 0): handlers run as usual, the answer goes nowhere.
    private init(connectionID: UInt64) {
        self.connectionID = connectionID
        origin = .binary(id: 0)
        serial = 0
        methodCodec = nil
    }

    static func detached(connectionID: UInt64) -> PendingRequest { PendingRequest(connectionID: connectionID) }

    /// A request from a client on another node (protocol/cluster.md): `answer` sends its one answer
    /// back over the bus; `text` says whether that client speaks text mode, which decides the form of
    /// a relayed answer; without `wantsAnswer` it is detached.
    init(remoteText text: Bool, wantsAnswer: Bool, methodCodec: SharedMethodCodec?, answer: @escaping (Answer) -> Void) {
        connectionID = 0
        origin = text ? .text(id: nil, kind: .call) : .binary(id: 0)
        serial = wantsAnswer ? 1 : 0
        self.methodCodec = methodCodec
        remoteAnswer = answer
    }

    /// Sets ``loop``, once (``HandedRequest``).
    fileprivate func setLoop(_ loop: LoopHandle) { self.loop = loop }

    /// Makes an answered request, that nothing else refers to, a new request of the same connection:
    /// its connection keeps one such spare, and most calls are answered at once, so most calls allocate
    /// no request.
    func reuse(connection: Connection, origin: Origin, serial: UInt64, methodCodec: SharedMethodCodec?) {
        if connection !== self.connection { self.connection = connection }  // mostly kept: see ``connection``
        self.origin = origin
        self.serial = serial
        // Mostly the codec of the call before: assigning it again would retain and release it.
        if methodCodec !== self.methodCodec { self.methodCodec = methodCodec }
        isRegistered = false
        isAnswered = false
        onCancel = .nothing  // a hook set after the last answer must not reach this request
    }

    /// Takes the request off the wire, its answer to go nowhere, while `connection` keeps it as an open
    /// request under `serial` (a detached one gets its first serial here).
    func keepOffWire(by connection: Connection, serial: UInt64) {
        self.connection = connection
        origin = .offWire
        self.serial = serial
    }

    /// Forgets the requester (it disconnected): a late answer goes nowhere.
    func abandon() {
        connection = nil
        onCancel = .nothing
    }

    /// Forgets the requester, which went away, and tells whoever works on the request, as its CANCEL
    /// would (wire.md: the requests of a peer that goes away are cancelled): whatever answer follows
    /// goes nowhere.
    func abandonCancelling() {
        let hook = onCancel
        abandon()
        hook.run()
    }

    var isText: Bool { origin.isText }
    /// Whether nobody waits for the answer (a MESSAGE with id 0), nor keeps the request open.
    var isDetached: Bool { serial == 0 }

    /// Tells whoever works on the request that the requester cancelled it.
    func notifyCancel() { onCancel.run() }

    /// What a CANCEL answers when the handler has produced nothing.
    var cancelAnswer: Answer { Self.cancelAnswer(methodCodec: methodCodec?.codec) }

    /// What a CANCEL answers on a channel with `methodCodec` (nil: not a method channel).
    static func cancelAnswer(methodCodec: (any MethodCodec)?) -> Answer {
        guard let methodCodec else { return .error(.cancelled) }
        return .failure(ChannelError(code: "cancelled", message: "the caller cancelled"), methodCodec)
    }

    /// Answers a method call with a success envelope in its channel's codec.
    func answerSuccess(_ value: ChannelValue) {
        // The codec itself, copied out of the shared box: holding the box across the answer (which
        // may change the request's codec) retained and released it per call.
        guard let codec = methodCodec?.codec else { return answer(.notImplemented) }  // set for every method call
        if remoteAnswer != nil { return answer(.success(value, codec)) }
        if isRegistered {
            take()?.finish(self, success: value, codec: codec)
            return
        }
        // Answered while its handler first runs (the common call): the connection is lent to the answer
        // unretained and stays in ``connection``. Sound: that field holds it strongly, and nothing clears
        // the field meanwhile (only `take`, `abandon` and `reuse` do: this request is answered here, is in
        // no table a close would abandon, and is not yet anyone's spare); and the first run happens inside
        // the connection's own input handling (or its plugins' continuation), which holds it too. Taking
        // it out and setting it again for the next call cost a retain and a release per call.
        guard !isAnswered else { return }
        isAnswered = true
        onCancel = .nothing
        guard let requester = unsafe connection.map({ Unmanaged.passUnretained($0) }) else { return }  // detached
        unsafe requester._withUnsafeGuaranteedRef { $0.finish(self, success: value, codec: codec) }
    }

    /// Answers a method call with an error envelope in its channel's codec.
    func answerError(_ error: ChannelError) {
        guard let methodCodec else { return answer(.notImplemented) }
        answer(.failure(error, methodCodec.codec))
    }

    /// Sends the answer (if the requester is still connected) and closes the request.
    func answer(_ answer: consuming Answer) {
        if let remoteAnswer {
            guard !isAnswered else { return }
            isAnswered = true
            onCancel = .nothing
            self.remoteAnswer = nil
            return remoteAnswer(answer)
        }
        take()?.finish(self, with: answer)
    }

    /// Whether a holder's REPLY answers the request as it came (``answer(replyCopying:)``): a binary
    /// request of this loop's client (text ones get it decoded, and others' go back where they came from).
    var takesReplyAsItCame: Bool { remoteAnswer == nil && !isText }

    /// Answers a request relayed to a holder with the holder's REPLY payload, read in place: copied into
    /// the requester's REPLY. Only where ``takesReplyAsItCame``.
    func answer(replyCopying payload: ArraySlice<UInt8>?) {
        assert(takesReplyAsItCame, "a holder's reply taken as it came by a request that decodes it")
        take()?.finish(self, replyCopying: payload)
    }

    /// Closes the request: the requester's connection for the first answer (nil once it has gone),
    /// nil for any later one.
    private func take() -> Connection? {
        guard !isAnswered else { return nil }
        isAnswered = true
        onCancel = .nothing
        defer { connection = nil }
        return connection
    }
}

/// A request in a handler's hands (``MethodResult``, ``MessageReply``), which may keep it and answer
/// from any thread. A ``LoopBound`` of the request without a loop handle of its own: the request keeps
/// its loop, so handing a request over retains nothing (a `LoopBound` retained its loop handle, two
/// atomic operations per call).
///
/// `@unchecked Sendable` is sound as `LoopBound`'s is: the request's state is touched only through
/// ``value``, ``take()`` and ``onLoop(_:)``, on its loop's thread (checked in debug builds), and other
/// threads read nothing of it but ``PendingRequest/loop``, which `init` sets on that thread before the
/// request is handed over, and which is never changed after.
struct HandedRequest: @unchecked Sendable {
    private let request: PendingRequest
    private var loop: LoopHandle { request.loop! }  // set by init

    /// Hands `request` over on `loop`, the thread calling (which is the request's for good).
    init(_ request: consuming PendingRequest, on loop: LoopHandle) {
        if request.loop == nil { request.setLoop(loop) }
        assert(request.loop === loop, "a request handed over on another loop than its own")
        self.request = request
    }

    /// Whether the caller is the request's loop thread.
    var isOnItsLoop: Bool { loop.isInLoopThread }

    /// The request; its loop's thread only.
    var value: PendingRequest {
        assert(isOnItsLoop || !loop.isRunning, "a request touched off its loop's thread")
        return request
    }

    /// The request, moved out (no retain where ``value`` would copy it); its loop's thread only.
    consuming func take() -> PendingRequest {
        assert(isOnItsLoop || !loop.isRunning, "a request touched off its loop's thread")
        return request
    }

    /// Runs `body` with the request on its loop's thread: at once when already there, else queued.
    func onLoop(_ body: @escaping @Sendable (PendingRequest) -> Void) {
        if isOnItsLoop { return body(request) }
        let handed = self
        loop.execute { body(handed.value) }
    }
}

/// Input to a message handler: bytes from a binary client or a value from a text client.
enum MessageInput {
    case bytes([UInt8]?)
    case value(ChannelValue)
}

/// Where a channel name leads: a channel served here, or one a client holds.
enum Route {
    case local(ChannelEntry)
    case held(Registration)
}

/// A server-side channel as the router sees it.
enum ChannelEntry {
    case method(MethodEntry)
    case event(EventEntry)
    case message(MessageEntry)

    var counts: ChannelCounts {
        switch self {
        case .method(let method): method.counts
        case .event(let event): event.counts
        case .message(let message): message.counts
        }
    }
}

/// A channel's traffic, for `/metrics`: requests routed to it, events published on it. Plain integers
/// updated by a lone `+= 1` that calls nothing out, so the compiler checks no access at run time.
final class ChannelCounts {
    var requests = 0
    var events = 0
}

final class MethodEntry {
    let codec: SharedMethodCodec
    let handler: @Sendable (MethodCall, MethodResult) -> Void
    let counts = ChannelCounts()
    init(codec: any MethodCodec, handler: @escaping @Sendable (MethodCall, MethodResult) -> Void) {
        self.codec = SharedMethodCodec(codec)
        self.handler = handler
    }
}

final class MessageEntry {
    let handle: (MessageInput, PendingRequest) -> Void
    let counts = ChannelCounts()
    /// The codec's name, for `switchboard/channels`.
    let codecName: String
    /// Encodes a reply value in the channel's codec (for a plugin's direct answer).
    let encode: @Sendable (ChannelValue) throws(CodecError) -> [UInt8]?
    init(codecName: String, encode: @escaping @Sendable (ChannelValue) throws(CodecError) -> [UInt8]?,
         handle: @escaping (MessageInput, PendingRequest) -> Void) {
        self.codecName = codecName
        self.encode = encode
        self.handle = handle
    }
}

final class EventEntry {
    let name: String
    let codec: any MethodCodec
    /// The same codec behind one reference, for requests that carry it (see ``SharedMethodCodec``).
    let sharedCodec: SharedMethodCodec
    let handler: any StreamHandler
    let overflow: OverflowPolicy
    let queueLimit: Int
    /// Active streams (one per listening connection).
    var listeners = Listeners()
    let counts = ChannelCounts()

    init(name: String, codec: any MethodCodec, handler: any StreamHandler, overflow: OverflowPolicy, queueLimit: Int) {
        self.name = name
        self.codec = codec
        sharedCodec = SharedMethodCodec(codec)
        self.handler = handler
        self.overflow = overflow
        self.queueLimit = max(1, queueLimit)
    }
}
