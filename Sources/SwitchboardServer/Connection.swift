import Logging
import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// Why a connection was closed; counted in stats (`closes`) and logged.
enum CloseReason: String {
    /// The peer closed (or half-closed and every request it made was answered).
    case peerClosed
    /// A frame, line or HELLO that ends the connection (wire-v1 section 2's closing errors).
    case protocolError
    /// A missing or wrong token.
    case unauthorized
    /// Over the outbound limit for longer than the grace period.
    case slowConsumer
    /// Nothing arrived for two heartbeat intervals.
    case heartbeatTimeout
    /// The server shut down.
    case shutdown
    /// A read or write failed (such as a reset by the peer).
    case ioError
    /// The peer half-closed and its open requests were not answered within the drain timeout.
    case peerGone
    /// The TLS handshake failed (a plain-text client on the TLS port, an untrusted certificate).
    case tlsHandshakeFailed
    /// The TLS handshake did not finish in time.
    case tlsHandshakeTimeout
    /// A TLS error after the handshake, or a peer that stopped in the middle of a record.
    case tlsError
    /// A WebSocket protocol error, or a message over maxFrame (closed with 1002 or 1009).
    case webSocketError
    /// A WebSocket upgrade from a browser origin the server does not allow (closed with 1008).
    case webSocketRefused
    /// An operator closed it (`switchboard/connections` `close`).
    case closedByOperator
    /// No complete frame, line or HTTP request head within the first-frame timeout.
    case firstFrameTimeout
    /// A frame, line, HTTP request head, TLS record or WebSocket frame stayed unfinished past the frame timeout.
    case frameTimeout

    init(_ failure: TransportFailure.Kind) {
        switch failure {
        case .tlsHandshakeFailed: self = .tlsHandshakeFailed
        case .tlsHandshakeTimeout: self = .tlsHandshakeTimeout
        case .tlsError: self = .tlsError
        case .webSocketError: self = .webSocketError
        case .webSocketRefused: self = .webSocketRefused
        }
    }
}

/// One client connection. Loop thread only: all of its state belongs to the loop.
///
/// Replies and events made while handling input are appended to `outbound` and the connection is marked
/// dirty; the server flushes every dirty connection once per loop turn, just before the loop blocks, so
/// fifty pipelined calls cost one write.
final class Connection {
    enum Mode {
        case undecided, binary, text

        /// What a connection's first byte chooses (wire-v1 section 1).
        init(firstByte: UInt8) { self = firstByte == UInt8(ascii: "{") ? .text : .binary }

        /// A letter other than `G` (HTTP): a person typing a word, since no valid frame can start with a
        /// byte ≥ 0x40 (its length would pass 1 GiB, more than any maxFrame).
        static func startsAWord(_ byte: UInt8) -> Bool {
            byte != UInt8(ascii: "G") && (UInt8(ascii: "A")...UInt8(ascii: "Z") ~= byte || UInt8(ascii: "a")...UInt8(ascii: "z") ~= byte)
        }
    }

    /// What a person who typed a word gets after the ERROR, before the connection closes.
    static let modesExplanation = Array("""

        switchboard: this port speaks JSON lines or binary frames. A JSON line starts with { and asks \
        one thing, for example {"id":1,"ping":true} or \
        {"id":2,"call":"switchboard/echo","method":"echo","args":"hi"}. See protocol/text-mode.md.

        """.utf8)

    /// Answers a first byte that starts a word: the ERROR `frame_too_large` wire-v1 promises a binary
    /// client for that length (sent at once: no 4th byte can make it fit), then a plain line for the
    /// person, then closes.
    private func answerTypedWord(_ buffer: InboundBuffer) {
        let declared = (0..<4).reduce(UInt32(0)) { $0 << 8 | UInt32($1 < buffer.readableBytes ? buffer.byte(at: $1) : 0) }
        writeError(.frameTooLarge(declared: declared))
        writeRaw(Self.modesExplanation)
        closeAfterFlush(.protocolError, intent: .tooLarge)
    }

    let id: UInt64
    let transport: any Transport
    /// Strong (not `unowned`, which costs a check per use): the core outlives every connection.
    let core: ServerCore
    var logger: Logger
    private(set) var mode = Mode.undecided
    private var inbound = InboundBuffer()
    private var frameDecoder: FrameDecoder
    var lineDecoder: LineDecoder
    /// Bytes made but not yet handed to the transport. Only ever read, or exchanged with `swap`: no access
    /// releases anything or calls out, so the compiler proves them exclusive and checks none at run time.
    private var outbound: [UInt8] = []
    /// Frames (or lines) in `outbound`, added to the server's counters when they are handed over: one
    /// counter update per turn rather than one per frame.
    private var unflushedFrames = 0
    var isDirty = false
    /// The connection marked dirty before this one (see `ServerCore.firstDirty`).
    var nextDirty: Connection?
    private(set) var isClosed = false
    private(set) var isClosing = false
    var closingSince: UInt64?
    var isAuthenticated: Bool
    /// Requests from this client still open after their handler's first run: binary ones by their wire
    /// id, text ones by a serial number.
    private var binaryRequests: [UInt32: PendingRequest] = [:]
    private var textRequests: [UInt64: PendingRequest] = [:]
    private var nextSerial: UInt64 = 0
    /// What decoding the last method call leaves for the next (see ``MethodCallReuse``).
    private var methodCallReuse = MethodCallReuse()
    /// An answered request to reuse for the next one (see ``PendingRequest/reuse(connection:origin:serial:methodCodec:)``).
    private var spareRequest: PendingRequest?
    /// Server-initiated requests waiting for this client's REPLY.
    private var outgoing: [UInt32: Outgoing] = [:]
    private var nextOutgoingID: UInt32 = 0
    /// Active event streams by channel.
    var streams: [String: EventStream] = [:]
    /// The channels this connection holds by REGISTER (``ServerCore/registrations`` has them by name).
    var held: Set<String> = []
    /// Some stream has queued events or a producer waiting to be told it may send: set by the streams,
    /// checked after each write, so that connections with nothing waiting skip the pump.
    var hasWaitingStreams = false
    /// Where this connection's last request went (see `ServerCore.route(named:for:)`).
    var lastRoute: Route?
    var lastRouteName = ""
    /// The `ServerCore.routesVersion` the cached route belongs to (-1: none yet).
    var lastRouteVersion = -1
    /// Credit that arrived before `listen`, by channel: for at most ``pendingCreditLimit`` channels.
    private(set) var pendingCredit: [String: Credit] = [:]
    /// The bytes of the names in ``pendingCredit``.
    private var pendingCreditNameBytes = 0
    var overLimitSince: UInt64?
    /// When the peer half-closed; the connection closes once its open requests are answered (or, if
    /// they take longer than the drain timeout, cancels them and closes: see `ServerCore.keepHouse`).
    private(set) var peerFinishedAt: UInt64?
    private var peerFinishedSending: Bool { peerFinishedAt != nil }
    /// Reading is paused: the output it would make has nowhere to go (see ``mustPauseInput``).
    private(set) var isInputPaused = false
    /// `processInput` is running: answers given meanwhile must not start it again.
    private var isProcessingInput = false
    /// How a half-closed connection's close is counted once its requests are answered.
    private var closeReasonOncePeerIsDone = CloseReason.peerClosed
    var lastInbound: UInt64
    var lastPing: UInt64
    /// When it was accepted, and its traffic, for `switchboard/connections`.
    let openedAt: UInt64
    var bytesIn = 0, bytesOut = 0
    /// The name its HELLO gave, if any.
    var clientName: String?
    /// The host that ``ConnectionQuota`` counted it under, released when it closes; nil if not counted.
    var admittedHost: String?
    /// A frame or line has been read whole: the first-frame deadline is met.
    private var hasCompletedFrame = false
    /// When housekeeping first saw the current unfinished frame (or line, or head), and `bytesIn` then.
    private var partialSince: UInt64?
    private var bytesInWhenPartialSeen = 0
    /// The connection as plugins see it, made with the connection when plugins are loaded (only code
    /// that runs then asks for it).
    var context: ConnectionContext {
        guard let pluginContext else { preconditionFailure("a plugin context asked for with no plugin loaded") }
        return pluginContext
    }
    private let pluginContext: ConnectionContext?
    /// The trace of the request being routed, taken by ``makeRequest(_:methodCodec:)`` (see ``RequestTrace``).
    var pendingTrace: RequestTrace?
    /// What the plugins loaded at start-up ask of every connection, read once (the pipeline is fixed
    /// while the server runs): constants, so that the paths no plugin touches test them for free.
    let hasPlugins: Bool, seesRequests: Bool, tracesRequests: Bool
    /// The pipeline's inbound stages (a constant: read without a run-time exclusivity check).
    let inboundStages: [Pipeline.Stage<any InboundProcessor, InboundKind>]
    /// The same stages as gates, when all are and no stage sees answers: binary calls and sends are then
    /// judged by ``admit(_:_:through:)`` and go on as without plugins, rather than take the whole pipeline.
    let gates: [Pipeline.Stage<any InboundGate, InboundKind>]?
    /// ``Pipeline/gateEpoch``.
    let gateEpoch: VerdictEpoch
    /// ``ServerConfiguration/maxOpenRequests``.
    let maxOpenRequests: Int
    /// The gates' verdicts on the last channel and kind judged by ``admit(_:_:through:)``; a HELLO
    /// forgets them.
    var gateMemo: GateMemo?
    /// Whether the identity the transport proved (a TLS certificate) has been asked about.
    private var hasIdentifiedPeer = false

    init(id: UInt64, transport: any Transport, core: ServerCore) {
        self.id = id
        self.transport = transport
        self.core = core
        frameDecoder = FrameDecoder(maxFrame: core.config.maxFrame)
        lineDecoder = LineDecoder(maxLine: Int(core.config.maxFrame))
        isAuthenticated = core.config.token == nil
        lastInbound = core.eventLoop.now
        lastPing = lastInbound
        openedAt = lastInbound
        logger = core.logger
        logger[metadataKey: "connection.id"] = "\(id)"
        hasPlugins = !core.pipeline.isEmpty
        seesRequests = core.pipeline.seesRequests
        tracesRequests = core.pipeline.seesAnswers
        inboundStages = core.pipeline.inbound
        gates = core.pipeline.seesAnswers ? nil : core.pipeline.gates
        gateEpoch = core.pipeline.gateEpoch
        maxOpenRequests = core.config.maxOpenRequests
        pluginContext = hasPlugins ? ConnectionContext(id: id, remoteAddress: transport.remoteAddress, eventLoop: core.eventLoop) : nil
    }

    var pendingBytes: Int { outbound.count + transport.queuedBytes }
    /// Bytes of events waiting in this connection's stream queues (for credit or for outbound room).
    var waitingEventBytes = 0
    var isOverOutboundLimit: Bool { pendingBytes >= core.config.outboundLimit }
    var openRequestCount: Int { binaryRequests.count + textRequests.count }
    var isText: Bool { mode == .text }
    var hasChosenBinary: Bool { mode == .binary }

    // MARK: Input

    func handle(_ event: TransportEvent) {
        switch event {
        case .data(let bytes):
            guard !isClosing else { return }
            core.stats.bytesIn += bytes.count
            bytesIn += bytes.count
            lastInbound = core.eventLoop.now
            guard !bytes.isEmpty else { return }  // traffic without bytes (a WebSocket ping): the heartbeat's
            if hasPlugins, !hasIdentifiedPeer, !identifyPeer() {
                mode = Mode(firstByte: bytes[0])  // the refusal goes out in the mode the client chose
                return fail(.unauthorized, id: 0)
            }
            processInput(bytes)
        case .closed where isClosing:
            close(.shutdown)  // a graceful close finished; its reason was counted when it began
        case .closed(let error?):
            logger.debug("connection failed: \(error)")
            close(.ioError)
        case .closed(nil):
            // The peer closed its sending side: a client that went away looks the same as one that only
            // half-closed (`printf … | nc -q1`). Its streams end now (a silent stream would otherwise never
            // notice); requests it already sent are still answered, then the connection closes.
            peerFinishedAt = core.eventLoop.now
            for stream in Array(streams.values) { endStream(stream, notifyHandler: true) }
            closeIfPeerIsDone()
        case .drained:
            afterWrite()
        case .failed(let failure):
            logger.info("closing connection: \(failure)")
            close(CloseReason(failure.kind))
        }
    }

    /// Handles every complete frame or line in `bytes` plus what was buffered before. The buffer and the
    /// decoders are taken out of the connection for the whole batch (they are this function's alone), so
    /// their accesses need no per-frame exclusivity checks.
    ///
    /// Input waits while the output it would make has nowhere to go: once the connection is at or over
    /// its outbound limit (replies are never dropped, so reading on would buffer without bound), the
    /// rest stays in the buffer and reading pauses. The peer's kernel buffers then fill and it waits:
    /// TCP's own backpressure, as Redis and NATS use it.
    private func processInput(_ bytes: [UInt8]) {
        isProcessingInput = true
        defer { isProcessingInput = false }
        // What the transport holds cannot change while input is processed (it changes on writes and
        // their callbacks, between turns): only `outbound` is checked per frame.
        let outboundRoom = core.config.outboundLimit - transport.queuedBytes
        var buffer = InboundBuffer()
        swap(&buffer, &inbound)
        buffer.append(bytes)
        if mode == .undecided, buffer.readableBytes > 0 {
            mode = Mode(firstByte: buffer.byte(at: 0))
            pluginContext?.encoding = mode == .text ? .text : .binary
            logger.debug("connection opened in \(mode) mode")
            if core.isDraining { sendGoAway() }
            if mode == .binary, Mode.startsAWord(buffer.byte(at: 0)) { return answerTypedWord(buffer) }
        }
        var count = 0
        if mode == .text {
            var decoder = lineDecoder
            while !isClosing, outbound.count < outboundRoom, let line = decoder.next(from: &buffer) {
                count += 1
                TextMode.handle(line, on: self)
            }
            lineDecoder = decoder
        } else {
            var decoder = FrameDecoder(maxFrame: 0)  // swapped, not copied: no retain of its channel cache
            swap(&decoder, &frameDecoder)
            while !isClosing, outbound.count < outboundRoom, let length = decodeFrame(&decoder, in: buffer) {
                count += 1
                buffer.consume(length)  // after the frame's view (and its payload slice) is gone
            }
            swap(&decoder, &frameDecoder)
        }
        core.stats.framesIn += count
        if count > 0 {
            hasCompletedFrame = true
            partialSince = nil  // whatever is left began with this read
        }
        inbound = buffer
        if !isClosing, isOverOutboundLimit, !isInputPaused {
            isInputPaused = true
            transport.pauseReading()
        }
    }

    /// Reads again once the reason for pausing is gone, starting with what was read before the pause.
    private func resumeInputIfPossible() {
        guard isInputPaused, !isProcessingInput, !isClosing, !isOverOutboundLimit else { return }
        isInputPaused = false
        lastInbound = core.eventLoop.now  // the silence was the server's doing: no heartbeat verdict on it
        lastPing = lastInbound
        transport.resumeReading()
        processInput([])
    }

    /// Handles the next frame in `buffer`, read in place; returns its length, or nil when more bytes are
    /// needed or the connection failed. Inlined into the read loop: called out of line, its result
    /// (a generic enum holding a view of the buffer) is copied through value witnesses, twice per frame.
    @inline(__always)
    private func decodeFrame(_ decoder: inout FrameDecoder, in buffer: InboundBuffer) -> Int? {
        let peeked: FrameDecoder.Peeked?
        do { peeked = try decoder.peek(buffer) } catch {
            let id: UInt32 = if case .malformedFrame = error { Self.headerID(buffer) } else { 0 }
            fail(error, id: id)
            return nil
        }
        switch peeked {
        case .frame(let view, let length)?:
            handleFrame(view)
            return length
        case .rejected(let error, let id, let length)?:
            writeError(error, id: id)
            return length
        case nil: return nil
        }
    }

    /// The id of a frame whose header is in but is unusable; 0 when the header was never read.
    private static func headerID(_ inbound: InboundBuffer) -> UInt32 {
        guard inbound.readableBytes >= 12 else { return 0 }
        return (8..<12).reduce(0) { $0 << 8 | UInt32(inbound.byte(at: $1)) }
    }

    private func handleFrame(_ frame: FrameDecoder.View) {
        if frame.kind.isServerOnly { return writeError(.badFrame("clients may not send \(frame.kind)"), id: frame.id) }
        if !isAuthenticated, frame.kind != .hello, frame.kind != .ping { return fail(.unauthorized, id: frame.id) }
        switch frame.kind {
        case .hello: handleHello(payload: frame.payload.map(Array.init), id: frame.id, textID: nil)
        case .ping: writeFrame(.pong, id: frame.id, payload: frame.payload.map(Array.init))
        case .pong: break
        case .message: handleMessage(frame)
        case .reply: handleReply(frame)
        case .cancel: cancelRequest(frame.id)
        case .demand: handleDemand(frame)
        case .register: seesRequests ? runInbound(register: frame) : core.register(frame.frame, from: self)
        case .unregister: core.unregister(frame.channel, id: frame.id, from: self)
        case .welcome, .error, .goAway: break  // refused above
        }
    }

    /// HELLO, or a text-mode `hello` (whose `id`, `textID`, is echoed).
    func handleHello(payload: [UInt8]?, id: UInt32, textID: ChannelValue?) {
        var hello: ChannelValue = .map([])
        if let payload, !payload.isEmpty {
            guard let parsed = try? JSONText.parse(payload), case .map = parsed else {
                return fail(.badHello("HELLO payload is not a JSON object"), id: id, textID: textID)
            }
            hello = parsed
        }
        if let version = hello["version"] {
            let isOne = switch version {
            case .int32(1), .int64(1): true
            case .float64(let d): d == 1
            default: false
            }
            guard isOne else { return fail(.unsupportedVersion, id: id, textID: textID) }
        }
        if let token = core.config.token {
            guard case .string(let given)? = hello["token"], Digest.constantTimeEquals(given, token) else {
                return fail(.unauthorized, id: id, textID: textID)
            }
        }
        if hasPlugins, !identify(hello) { return fail(.unauthorized, id: id, textID: textID) }
        isAuthenticated = true
        clientName = hello["client"]?.stringValue
        let welcome = core.welcome
        if mode == .text {
            TextMode.writeLine(TextMode.withID(textID, ["welcome": welcome]), on: self)
        } else {
            writeFrame(.welcome, id: id, payload: try? JSONText.serialize(welcome))
        }
    }

    /// Before its first bytes: a client that proved who it is with a TLS certificate is that identity
    /// from its first request, HELLO or not. False if the plugins refuse the certificate.
    @inline(never)
    private func identifyPeer() -> Bool {
        hasIdentifiedPeer = true
        guard transport.peerIdentity != nil else { return true }
        return identify(token: nil, client: nil)
    }

    /// Asks the plugins who the HELLO's client is; false if one refuses it.
    @inline(never)
    private func identify(_ hello: ChannelValue) -> Bool {
        identify(token: hello["token"]?.stringValue, client: hello["client"]?.stringValue)
    }

    /// Asks the plugins who the client is, from its HELLO and its TLS certificate; false if one refuses.
    /// A verified certificate's subject is the identity when no plugin names another.
    private func identify(token: String?, client: String?) -> Bool {
        let certificate = transport.peerIdentity
        let hello = Hello(token: token, client: client, certificateSubject: certificate)
        switch core.pipeline.authenticate(hello, connection: context) {
        case .refuse: return false
        case .identity(let identity): context.authenticated(as: identity)
        case .pass: context.authenticated(as: certificate)
        }
        gateMemo = nil  // the verdicts were for the identity before
        context.clientName = client
        return true
    }

    /// A MESSAGE, with its payload still in the inbound buffer: a method call is decoded in place.
    private func handleMessage(_ frame: FrameDecoder.View) {
        if frame.id != 0, !binaryRequests.isEmpty, let first = withBinaryRequests({ $0[frame.id] }) {
            // An ERROR carrying a pending request's id is that request's answer (wire-v1 section 2), so
            // this one ERROR answers the id: the first request goes on, but its own answer never follows.
            detach(first)
            return writeError(.duplicateId, id: frame.id)
        }
        if core.isDraining {
            if frame.id != 0 { writeError(.goingAway, id: frame.id) }
            return
        }
        if frame.id != 0, !admitsRequest(id: frame.id) { return }
        if seesRequests, frame.id != 0 || !isHolderEvent(frame) {
            // Gates judge a call or a send here, then it goes on as without plugins; anything else (or
            // any other stage) takes the whole pipeline.
            guard let gates else { return runInbound(message: frame) }
            let route = core.route(named: frame.channel, for: self)
            guard let kind = gatedKind(of: route) else { return runInbound(message: frame) }
            switch admit(frame.channel, kind, through: gates) {
            case .admitted: break
            case .refused(let refusal):
                if frame.id != 0 { writeError(refusal, id: frame.id) }  // id 0: nobody waits (counted)
                return
            case .byMethod: return runInbound(message: frame)
            }
            if frame.id != 0, case .local(.method(let method))? = route {  // as below, with the route in hand
                var request = makeRequest(.binary(id: frame.id), methodCodec: method.codec)
                core.invoke(method, payload: frame.payload, request: request, connection: self)
                return settle(&request)
            }
        }
        if frame.id == 0 {
            core.route(channel: frame.channel, input: .bytes(frame.payload), origin: nil, connection: self)
        } else if case .local(.method(let method))? = core.route(named: frame.channel, for: self) {
            var request = makeRequest(.binary(id: frame.id), methodCodec: method.codec)
            core.invoke(method, payload: frame.payload, request: request, connection: self)
            settle(&request)
        } else {
            handleRequest(.binary(id: frame.id), channel: frame.channel, input: .bytes(frame.payload))
        }
    }

    private func handleReply(_ frame: FrameDecoder.View) {
        guard let waiting = withOutgoing({ $0.removeValue(forKey: frame.id) }) else { core.stats.ignoredFrames += 1; return }
        waiting.complete(.success(frame.payload.map(Array.init)), core: core)
    }

    private func handleDemand(_ frame: FrameDecoder.View) {
        guard let payload = frame.payload, payload.count == 4 else {
            return writeError(.badFrame("DEMAND payload must be exactly 4 bytes"), id: frame.id)
        }
        let n = payload.reduce(UInt32(0)) { $0 << 8 | UInt32($1) }
        guard n > 0 else { return writeError(.badFrame("DEMAND of 0"), id: frame.id) }
        addDemand(n, channel: frame.channel)
    }

    /// Channels, and bytes of their names, that a connection may keep credit for before their `listen`.
    static let pendingCreditLimit = (channels: 1024, nameBytes: 64 * 1024)

    /// Adds credit to the channel's active stream, or keeps it for the next `listen` while the channels
    /// kept stay within ``pendingCreditLimit`` (past it, the DEMAND is ignored and counted).
    func addDemand(_ n: UInt32, channel: String) {
        let channel = hasPlugins ? context.channelRenames[channel] ?? channel : channel
        if let stream = streams[channel] {
            stream.addCredit(n)
        } else if let credit = pendingCredit[channel] {
            pendingCredit[channel] = credit.adding(n)
        } else if pendingCredit.count < Self.pendingCreditLimit.channels,
                  pendingCreditNameBytes + channel.utf8.count <= Self.pendingCreditLimit.nameBytes {
            keepPendingCredit(Credit.unbounded.adding(n), for: channel)
        } else {
            core.stats.demandsIgnored += 1
        }
    }

    /// Keeps `credit` for the next `listen` on `channel`.
    func keepPendingCredit(_ credit: Credit, for channel: String) {
        if pendingCredit.updateValue(credit, forKey: channel) == nil { pendingCreditNameBytes += channel.utf8.count }
    }

    /// Takes the credit kept for the next `listen` on `channel`, if any.
    func takePendingCredit(for channel: String) -> Credit? {
        guard let credit = pendingCredit.removeValue(forKey: channel) else { return nil }
        pendingCreditNameBytes -= channel.utf8.count
        return credit
    }

    // MARK: Requests

    /// Whether this client may open one more request: every request, binary or text, with plugins or
    /// without, asks before it is routed. Past ``ServerConfiguration/maxOpenRequests`` open ones, the
    /// request is refused with `too_many_requests` carrying its id (`textID` in text mode), and counted.
    func admitsRequest(id: UInt32, textID: ChannelValue? = nil) -> Bool {
        guard binaryRequests.count + textRequests.count >= maxOpenRequests else { return true }
        core.stats.openRequestsRefused += 1
        writeError(.tooManyRequests, id: id, textID: textID)
        return false
    }

    /// Routes a request from this client. One its handler does not answer at once is kept in the table
    /// of open requests (for CANCEL, duplicate ids, disconnects and the shutdown drain).
    func handleRequest(_ origin: PendingRequest.Origin, channel: String, input: RouteInput, refusing refusedKinds: UInt8 = 0) {
        var request = core.route(channel: channel, input: input, origin: origin, connection: self, refusing: refusedKinds)
        settle(&request)
    }

    /// After a request's handler has run: an open request goes into the table of open requests; an
    /// answered one becomes the spare for the next request, unless its handler kept its `MethodResult`
    /// (which a later answer would then reach).
    func settle(_ request: inout PendingRequest) {
        guard !request.isAnswered else {
            if isKnownUniquelyReferenced(&request) { spareRequest = request }
            return
        }
        if isClosing { return request.abandonCancelling() }
        request.isRegistered = true
        switch request.origin {
        case .binary(let id): withBinaryRequests { $0[id] = request }
        case .text: textRequests[request.serial] = request
        }
        core.stats.repliesPending += 1
    }

    /// A new request from this client (detached, answered nowhere, when `origin` is nil).
    func makeRequest(_ origin: PendingRequest.Origin?, methodCodec: SharedMethodCodec?) -> PendingRequest {
        guard let origin else { return .detached(connectionID: id) }
        nextSerial += 1
        let request: PendingRequest
        if let spare = spareRequest {
            spareRequest = nil
            spare.reuse(connection: self, origin: origin, serial: nextSerial, methodCodec: methodCodec)
            request = spare
        } else {
            request = PendingRequest(connection: self, origin: origin, serial: nextSerial, methodCodec: methodCodec)
        }
        if tracesRequests { request.trace = pendingTrace }  // nil too: a reused request keeps no old trace
        return request
    }

    /// The kind of a binary MESSAGE taking `route` when the route alone tells it (a call or a send); nil
    /// when it takes the method (an event channel's listen or cancel, or a channel nobody serves).
    private func gatedKind(of route: Route?) -> InboundKind? {
        switch route {
        case .local(.method)?: .call
        case .local(.message)?: .message
        case .held(let registration)?:
            switch registration.kind {
            case .message?: .message
            case .method?, nil: .call
            case .event?: nil
            }
        case .local(.event)?, nil: nil
        }
    }

    /// A holder's event on its own event channel (a MESSAGE with id 0): an event, not a request.
    private func isHolderEvent(_ frame: FrameDecoder.View) -> Bool {
        guard frame.id == 0, case .held(let registration)? = core.route(named: frame.channel, for: self) else { return false }
        return registration.holder === self && registration.kind == .event
    }

    /// Takes an open request out of the tables without answering it: a parked request goes on as a new one.
    func withdraw(_ request: PendingRequest) {
        forget(request)
        request.abandon()
    }

    private func cancelRequest(_ id: UInt32) {
        guard let request = withBinaryRequests({ $0[id] }) else { core.stats.ignoredFrames += 1; return }
        cancel(request)
    }

    /// Cancels `request` as a CANCEL does: whoever works on it is told, and it is answered, by the loop
    /// or node it was relayed to if it was (in the form the channel's own node gives), else here.
    private func cancel(_ request: PendingRequest) {
        request.notifyCancel()
        if case .relayed = request.onCancel { return }
        request.answer(request.cancelAnswer)
    }

    /// Closes `request` and writes its answer in this connection's encoding.
    func finish(_ request: PendingRequest, with answer: Answer) {
        guard !isClosing else { return }
        var answer = answer
        if tracesRequests, let trace = request.trace { answer = filterAnswer(answer, trace: trace, codec: request.methodCodec?.codec) }
        forget(request)
        switch request.origin {
        case .binary(let id): writeBinaryAnswer(answer, id: id)
        case .text(let id, let kind): TextMode.writeAnswer(answer, id: id, kind: kind, on: self)
        }
        afterAnswer(request)
    }

    /// ``finish(_:with:)`` for a success envelope, the common answer, without wrapping the value in an
    /// ``Answer`` (each wrapping copies it).
    func finish(_ request: PendingRequest, success value: ChannelValue, codec: any MethodCodec) {
        guard !isClosing else { return }
        if tracesRequests { return finish(request, with: .success(value, codec)) }
        forget(request)
        switch request.origin {
        case .binary(let id): writeSuccess(value, codec: codec, id: id)
        case .text(let id, let kind): TextMode.writeAnswer(.success(value, codec), id: id, kind: kind, on: self)
        }
        afterAnswer(request)
    }

    /// Runs `body` with ``methodCallReuse`` taken out of the connection for the call (so no access to
    /// the property spans the codec's code), then puts it back.
    func withMethodCallReuse<Result>(_ body: (inout MethodCallReuse) throws(CodecError) -> Result) throws(CodecError) -> Result {
        var reuse = MethodCallReuse()
        swap(&reuse, &methodCallReuse)
        defer { swap(&reuse, &methodCallReuse) }
        return try body(&reuse)
    }

    /// Takes an answered request out of the table of open requests.
    private func forget(_ request: PendingRequest) {
        guard request.isRegistered else { return }
        switch request.origin {
        case .binary(let id): withBinaryRequests { _ = $0.removeValue(forKey: id) }
        case .text: textRequests.removeValue(forKey: request.serial)
        }
        core.stats.repliesPending -= 1
    }

    /// Takes an open request off the wire: it goes on, but its answer will go nowhere.
    private func detach(_ request: PendingRequest) {
        forget(request)
        request.abandon()
        afterAnswer(request)
    }

    /// The shutdown drain or a half-closed peer may have waited for this answer.
    private func afterAnswer(_ request: PendingRequest) {
        guard request.isRegistered else { return }
        core.requestFinished()
        closeIfPeerIsDone()
    }

    /// The peer half-closed and its open requests outlived the drain timeout: each is cancelled, oldest
    /// first, as by a CANCEL (its handler is told, and it is answered, with `cancelled` unless the
    /// handler answers at once), and the connection closes once they are, counted as `peerGone`.
    func abandonOpenRequests() {
        closeReasonOncePeerIsDone = .peerGone
        let open = (Array(binaryRequests.values) + Array(textRequests.values)).sorted { $0.serial < $1.serial }
        for request in open { cancel(request) }
    }

    func closeIfPeerIsDone() {
        if peerFinishedSending, openRequestCount == 0 { closeAfterFlush(closeReasonOncePeerIsDone) }
    }

    /// Writes a REPLY with a success envelope, encoded in place in the outbound buffer.
    private func writeSuccess(_ value: ChannelValue, codec: any MethodCodec, id: UInt32) {
        guard !isClosed else { return }
        var bytes = takeOutbound()
        let start = Frame.startFrame(.reply, id: id, to: &bytes)
        do throws(CodecError) {
            try codec.encodeSuccessEnvelope(value, appendingTo: &bytes)
        } catch {
            bytes.removeSubrange(start...)
            restoreOutbound(bytes)
            return writeBinaryAnswer(.failure(ChannelError(code: "encode_failed", message: "\(error)"), codec), id: id)
        }
        Frame.finishFrame(startingAt: start, in: &bytes)
        unflushedFrames += 1
        restoreOutbound(bytes)
        markDirty()
    }

    private func writeBinaryAnswer(_ answer: Answer, id: UInt32) {
        switch answer {
        case .success(let value, let codec):
            writeSuccess(value, codec: codec, id: id)
        case .failure(let error, let codec):
            if let payload = try? codec.encodeErrorEnvelope(error) {
                writeFrame(.reply, id: id, payload: payload)
            } else {
                writeError(.badPayload("error envelope could not be encoded"), id: id)
            }
        case .notImplemented: writeFrame(.reply, id: id, payload: nil)
        case .messageBytes(let bytes): writeFrame(.reply, id: id, payload: bytes)
        case .messageValue: writeError(.badPayload("reply has no binary form"), id: id)
        case .error(let error): writeError(error, id: id)
        }
    }

    /// Answers every open request (for shutdown), oldest first.
    func answerAllOpenRequests(with answer: Answer) {
        let open = (Array(binaryRequests.values) + Array(textRequests.values)).sorted { $0.serial < $1.serial }
        for request in open { request.answer(answer) }
    }

    /// What waits for the REPLY to a server-initiated request: the REPLY payload, or why none came.
    typealias OutgoingCompletion = (Result<[UInt8]?, InvokeError>) -> Void

    /// A server-initiated request waiting for this client's REPLY.
    struct Outgoing {
        enum Waiter {
            /// A client's request, forwarded: the answer is relayed to it (no closure per request).
            case relay(PendingRequest)
            case completion(OutgoingCompletion)
        }
        let waiter: Waiter
        /// The held channel the request was forwarded on, to be failed if the holder lets the channel go;
        /// nil for the server's own requests (`invokeMethod`, `send`).
        let registration: Registration?

        func complete(_ result: Result<[UInt8]?, InvokeError>, core: ServerCore) {
            switch waiter {
            case .relay(let request): core.relay(result, of: registration, to: request)
            case .completion(let completion): completion(result)
            }
        }
    }

    /// Sends a server-initiated MESSAGE (forwarded on `registration`, if given); `waiter` gets its
    /// answer. Returns the id used on this connection (nil if it could not be sent; `waiter` then got a
    /// failure).
    @discardableResult
    func sendRequest(channel: String, payload: [UInt8]?, forwardedOn registration: Registration? = nil,
                     waiter: Outgoing.Waiter) -> UInt32? {
        let request = Outgoing(waiter: waiter, registration: registration)
        guard mode == .binary, !isClosing else {
            request.complete(.failure(mode == .text ? .textClient : .disconnected), core: core)
            return nil
        }
        // One hash per request: an id still in use (only after 2^32 requests) is put back and skipped.
        repeat { nextOutgoingID &+= 1 } while nextOutgoingID == 0
        while let inUse = withOutgoing({ $0.updateValue(request, forKey: nextOutgoingID) }) {
            withOutgoing { $0[nextOutgoingID] = inUse }
            repeat { nextOutgoingID &+= 1 } while nextOutgoingID == 0
        }
        writeFrame(.message, id: nextOutgoingID, channel: channel, payload: payload)
        return nextOutgoingID
    }

    // On the per-call paths, the tables of binary and server-initiated requests are used through the
    // table itself, taken out of the connection for the lookup or change (nothing calls out meanwhile):
    // no access to the properties spans a call, so the compiler proves them exclusive and checks none at
    // run time.

    private func withBinaryRequests<Result>(_ body: (inout [UInt32: PendingRequest]) -> Result) -> Result {
        var table: [UInt32: PendingRequest] = [:]
        swap(&table, &binaryRequests)
        defer { swap(&table, &binaryRequests) }
        return body(&table)
    }

    private func withOutgoing<Result>(_ body: (inout [UInt32: Outgoing]) -> Result) -> Result {
        var table: [UInt32: Outgoing] = [:]
        swap(&table, &outgoing)
        defer { swap(&table, &outgoing) }
        return body(&table)
    }

    /// Fails a server-initiated request still waiting for this client's REPLY.
    func failOutgoing(_ id: UInt32, _ error: InvokeError) {
        withOutgoing { $0.removeValue(forKey: id) }?.complete(.failure(error), core: core)
    }

    /// Fails, in id order, every request forwarded on `registration` (on any held channel, when nil)
    /// that still waits for a REPLY.
    func failForwarded(on registration: Registration?, _ error: InvokeError) {
        let ids = outgoing.compactMap { id, request -> UInt32? in
            guard let forwardedOn = request.registration else { return nil }
            return registration == nil || forwardedOn === registration ? id : nil
        }
        for id in ids.sorted() { failOutgoing(id, error) }
    }

    /// Tells this client that the server no longer wants the answer to its request `id`.
    func sendCancel(_ id: UInt32) {
        guard withOutgoing({ $0.removeValue(forKey: id) }) != nil else { return }
        writeFrame(.cancel, id: id, payload: nil)
    }

    // MARK: Output

    func markDirty() {
        if !isDirty {
            isDirty = true
            nextDirty = core.firstDirty
            core.firstDirty = self
        }
    }

    func writeFrame(_ kind: Frame.Kind, id: UInt32 = 0, channel: String = "", payload: [UInt8]?) {
        guard !isClosed else { return }
        var bytes = takeOutbound()
        Frame.write(kind, id: id, channel: channel, payload: payload, to: &bytes)
        unflushedFrames += 1
        restoreOutbound(bytes)
        markDirty()
    }

    /// Takes `outbound` out of the connection while a call that is not the connection's own (the wire
    /// encoder, a codec, which may run custom code) appends to it: no access to the property spans such a
    /// call, and output the call makes on this connection meanwhile lands in a fresh buffer.
    private func takeOutbound() -> [UInt8] {
        var bytes: [UInt8] = []
        swap(&bytes, &outbound)
        return bytes
    }

    /// Puts back what `takeOutbound()` took, ahead of anything written meanwhile.
    private func restoreOutbound(_ bytes: consuming [UInt8]) {
        var meanwhile = bytes
        swap(&meanwhile, &outbound)
        guard !meanwhile.isEmpty else { return }  // rare: output made while the buffer was out
        var buffer = takeOutbound()
        buffer.append(contentsOf: meanwhile)
        swap(&buffer, &outbound)
    }

    func writeRaw(_ bytes: [UInt8]) {
        guard !isClosed else { return }
        var buffer = takeOutbound()
        buffer.append(contentsOf: bytes)
        restoreOutbound(buffer)
        unflushedFrames += 1
        markDirty()
    }

    /// Writes an ERROR frame (or, in text mode, an error line with `textID`) that leaves the connection open.
    func writeError(_ error: WireError, id: UInt32 = 0, textID: ChannelValue? = nil) {
        if mode == .text {
            TextMode.writeError(error, id: textID, on: self)
            return
        }
        writeFrame(.error, id: id, payload: error.payload)
    }

    /// The size of `event` in this connection's encoding; nil if it has none.
    func encodedSize(of event: OutboundEvent) -> Int? {
        (mode == .text ? event.textLine : event.binaryFrame)?.count
    }

    /// Writes an event in this connection's encoding; false if it could not be encoded (counted as a drop).
    @discardableResult
    func writeEvent(_ event: OutboundEvent) -> Bool {
        guard let bytes = mode == .text ? event.textLine : event.binaryFrame else {
            core.countDrop("unencodable")
            return false
        }
        writeRaw(bytes)
        return true
    }

    /// Hands `outbound` to the transport: for every dirty connection once per loop turn, and at once
    /// before a close. A dirty connection stays in the dirty list (flushed again, then with nothing to
    /// write) until that list is flushed.
    func flush() {
        guard !isClosed else { return }
        if !outbound.isEmpty {
            core.stats.framesOut += unflushedFrames
            core.stats.bytesOut += outbound.count
            bytesOut += outbound.count
            unflushedFrames = 0
            // The transport may report a failed write synchronously, and closing touches `outbound`:
            // hand it a buffer of its own, then take the (emptied) buffer back to keep its capacity.
            var bytes = takeOutbound()
            transport.write(&bytes)
            if outbound.isEmpty, !isClosed { swap(&bytes, &outbound) }
        }
        afterWrite()
    }

    /// Tracks the outbound limit, and lets waiting streams and paused input go once there is room.
    private func afterWrite() {
        guard !isClosed else { return }
        if isOverOutboundLimit {
            if overLimitSince == nil { overLimitSince = core.eventLoop.now }
            return
        }
        overLimitSince = nil
        resumeInputIfPossible()
        guard hasWaitingStreams else { return }
        hasWaitingStreams = false
        for stream in Array(streams.values) { stream.pump() }  // a stream still waiting sets the flag again
    }

    // MARK: Streams

    /// Removes `stream`; with `notifyHandler` its handler's `onCancel` runs with `arguments`
    /// (the cancel call's, or else the listen call's).
    func endStream(_ stream: EventStream, notifyHandler: Bool, arguments: ChannelValue? = nil) {
        guard streams[stream.entry.name] === stream else { return }
        streams.removeValue(forKey: stream.entry.name)
        stream.entry.listeners.remove(stream)
        core.listenerRemoved(stream)
        stream.stop(dropReason: "cancelled")
        if notifyHandler { stream.entry.handler.onCancel(arguments: arguments ?? stream.arguments, sink: stream.sink) }
        closeIfPeerIsDone()
    }

    // MARK: Deadlines

    /// Bytes of an unfinished frame that must arrive within each frame timeout for it to go on.
    static let frameProgressBytes = 64 * 1024

    /// Whether the client is in the middle of something: a frame or line in the buffer, an over-long
    /// line being skipped, or, in a layer below, an HTTP request head, a WebSocket frame or a TLS record.
    private var holdsPartialInput: Bool {
        inbound.readableBytes > 0 || lineDecoder.isSkippingLine || transport.holdsPartialInput
    }

    /// The deadline this connection has missed, if any (wire.md, "Limits and liveness"), checked by
    /// housekeeping: its first complete frame within ``ServerConfiguration/firstFrameTimeoutMs`` of
    /// being accepted, and the end of a frame it began within ``ServerConfiguration/frameTimeoutMs``
    /// of housekeeping's seeing it begun (or 64 KiB more of it). Input the server stopped reading, and
    /// a peer that has finished sending, are not timed; a connection idle between frames never is.
    func missedDeadline(at now: UInt64) -> CloseReason? {
        guard !isClosing, !isInputPaused, !peerFinishedSending else { return nil }
        let config = core.config
        if !hasCompletedFrame, config.firstFrameTimeoutMs > 0, now - openedAt >= config.firstFrameTimeoutMs {
            return .firstFrameTimeout
        }
        guard config.frameTimeoutMs > 0, holdsPartialInput else {
            partialSince = nil
            return nil
        }
        guard let since = partialSince, bytesIn - bytesInWhenPartialSeen < Self.frameProgressBytes else {
            partialSince = now  // begun, or still coming fast enough: a new period
            bytesInWhenPartialSeen = bytesIn
            return nil
        }
        return now - since >= config.frameTimeoutMs ? .frameTimeout : nil
    }

    /// Closes a connection that missed `deadline`, telling it why in its mode (ERROR `timeout`, or an
    /// error line); one with no mode yet gets 408 for an unfinished HTTP head, or only the close.
    func timeOut(_ deadline: CloseReason) {
        let limit = deadline == .firstFrameTimeout ? core.config.firstFrameTimeoutMs : core.config.frameTimeoutMs
        let what = deadline == .firstFrameTimeout ? "no complete frame or line" : "a frame or line was not finished"
        logger.info("closing: \(deadline.rawValue)")
        if mode != .undecided { writeError(.timeout("\(what) within \(limit) ms")) }
        closeAfterFlush(deadline, intent: .timeout)
    }

    // MARK: Closing

    /// GOAWAY, or the text-mode `goaway` line; nothing before the mode is known.
    func sendGoAway() {
        let reason: ChannelValue = .stringMap(["reason": "server shutting down"])
        switch mode {
        case .text: TextMode.writeLine(.stringMap(["goaway": reason]), on: self)
        case .binary: writeFrame(.goAway, payload: try? JSONText.serialize(reason))
        case .undecided: break
        }
    }

    /// Sends `error` and closes (the errors that wire-v1 says end a connection).
    func fail(_ error: WireError, id: UInt32, textID: ChannelValue? = nil) {
        writeError(error, id: id, textID: textID)
        let reason: CloseReason = switch error {
        case .unauthorized: .unauthorized
        case .slowConsumer: .slowConsumer
        default: .protocolError
        }
        logger.debug("closing: \(error.code): \(error.message)")
        let intent: CloseIntent = switch error {
        case .unauthorized, .slowConsumer: .policy
        case .frameTooLarge: .tooLarge
        default: .protocolError
        }
        closeAfterFlush(reason, intent: intent)
    }

    /// Stops reading, flushes what is queued, then closes.
    func closeAfterFlush(_ reason: CloseReason, intent: CloseIntent? = nil) {
        guard !isClosing else { return }
        isClosing = true
        closingSince = core.eventLoop.now
        releaseState(reason)
        flush()
        transport.closeAfterWrites(intent ?? (reason == .shutdown ? .goingAway : .normal))
        core.connectionClosed(self, reason: reason)
    }

    /// Closes at once (peer gone, I/O error, slow consumer); `reason` counts only if the connection was
    /// not closing already.
    func close(_ reason: CloseReason) {
        guard !isClosed else { return }
        if !isClosing {
            isClosing = true
            releaseState(reason)
            core.connectionClosed(self, reason: reason)
        }
        isClosed = true
        _ = takeOutbound()
        transport.closeNow()
    }

    /// Ends streams (handlers told), fails server-initiated requests, cancels open requests (their answers go nowhere).
    private func releaseState(_ reason: CloseReason) {
        pluginContext?.dropStates()
        core.holderLeft(self)
        for stream in Array(streams.values) {
            endStream(stream, notifyHandler: true)
        }
        let waiting = withOutgoing { table in
            defer { table = [:] }
            return table
        }
        for request in waiting.values { request.complete(.failure(.disconnected), core: core) }
        let open = withBinaryRequests { table in
            defer { table = [:] }
            return table
        }
        // Whatever the close (a reset, an error, a slow consumer), the requests' answers can go nowhere:
        // each is cancelled, so that its handler, holder, loop or node stops working on it.
        for request in open.values { request.abandonCancelling() }
        for request in textRequests.values { request.abandonCancelling() }
        core.stats.repliesPending -= open.count + textRequests.count
        textRequests = [:]
        core.requestFinished()  // the shutdown drain may have been waiting for these
        logger.debug("connection closed: \(reason.rawValue)")
    }
}
