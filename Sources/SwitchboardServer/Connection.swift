import Logging
import SwitchboardCodec
import SwitchboardPluginAPI
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
    /// A resuming HELLO on another connection took its session (protocol/resumption.md).
    case sessionTaken
    /// Its session, parked since its connection was lost, ended (expired, evicted, overflowed or drained).
    case sessionEnded
    /// It came past its address's cap, which only a resuming HELLO may (protocol/resumption.md, "Limits"),
    /// and its first frame resumed nothing; counted as the cap's refusal of a connection.
    case overAddressLimit

    /// Whether a connection lost this way parks its session rather than ending it (protocol/resumption.md,
    /// "A parked session").
    var parksSession: Bool {
        switch self {
        case .peerClosed, .ioError, .heartbeatTimeout, .tlsError, .frameTimeout: true
        default: false
        }
    }

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
/// Besides its input, streams and deadlines, it is made of parts: its ``OutboundBuffer`` (output flushed
/// once per loop turn), its ``RequestTable`` (open requests, server-initiated ones, spares), its
/// ``RouteCache``, and a ``PluginSession`` when plugins are loaded. A binary call to a method served here
/// takes one function, ``dispatchCall(to:payload:origin:)``; every other request takes the router.
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
    /// What it has made and not yet handed to the transport, and its link in the dirty list.
    var outbound = OutboundBuffer()
    /// The requests it made that are still open, and those it was sent.
    var requests = RequestTable()
    /// Where its last request went.
    private var routeCache = RouteCache()
    /// What the plugins need of it; nil when none is loaded, so that the paths no plugin touches test
    /// one reference for nil.
    let plugins: PluginSession?
    private(set) var isClosed = false
    private(set) var isClosing = false
    var closingSince: UInt64?
    var isAuthenticated: Bool
    /// Active event streams by channel.
    var streams: [String: EventStream] = [:]
    /// The channels this connection holds by REGISTER (``ChannelDirectory/registrations`` has them by name).
    var held: Set<String> = []
    /// Some stream has queued events or a producer waiting to be told it may send: set by the streams,
    /// checked after each write, so that connections with nothing waiting skip the pump.
    var hasWaitingStreams = false
    /// Credit that arrived before `listen`, by channel: for at most ``pendingCreditLimit`` channels.
    private(set) var pendingCredit: [String: Credit] = [:]
    /// The bytes of the names in ``pendingCredit``.
    private var pendingCreditNameBytes = 0
    var overLimitSince: UInt64?
    /// When the peer half-closed; the connection closes once its open requests are answered (or, if
    /// they take longer than the drain timeout, cancels them and closes: see `ServerCore.keepHouse`).
    private(set) var peerFinishedAt: UInt64?
    var peerFinishedSending: Bool { peerFinishedAt != nil }
    /// Reading is paused: the output it would make has nowhere to go (see ``mustPauseInput``).
    private(set) var isInputPaused = false
    /// `processInput` is running: answers given meanwhile must not start it again.
    private var isProcessingInput = false
    /// How a half-closed connection's close is counted once its requests are answered.
    var closeReasonOncePeerIsDone = CloseReason.peerClosed
    var lastInbound: UInt64
    var lastPing: UInt64
    /// When it was accepted, and its traffic, for `switchboard/connections`.
    let openedAt: UInt64
    var bytesIn = 0, bytesOut = 0
    /// The name its HELLO gave, if any.
    var clientName: String?
    /// The host that ``ConnectionQuota`` counted it under, released when it closes; nil if not counted.
    var admittedHost: String?
    /// It came past its address's cap, by the margin that address's parked sessions give: its first frame
    /// must resume one of them (protocol/resumption.md, "Limits").
    var admittedToResume = false
    /// A frame or line has been read whole: the first-frame deadline is met.
    private var hasCompletedFrame = false
    /// When housekeeping first saw the current unfinished frame (or line, or head), and `bytesIn` then.
    private var partialSince: UInt64?
    private var bytesInWhenPartialSeen = 0
    /// ``ServerConfiguration/maxOpenRequests``.
    let maxOpenRequests: Int
    /// Its resumable session, if it has one (protocol/resumption.md).
    var session: Session?
    /// What a HELLO's `session` may still do on it.
    var sessionStage = SessionStage.firstFrame
    /// The connection whose session this one's HELLO resumed: its transport's events go there.
    var heir: Connection?
    /// Where this connection's socket goes, with its HELLO, when that HELLO resumes a session of another loop.
    var pendingMove: SessionMove?
    /// Whether ``pendingMove`` is set, read for every transport event instead of it: the move is changed
    /// in place, which makes every access to it checked for exclusivity at run time (measured: 115
    /// instructions per rpc call at depth 1), and this flag is only ever read or assigned.
    var isWaitingToMove = false

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
        maxOpenRequests = core.config.maxOpenRequests
        plugins = core.pipeline.isEmpty ? nil
            : PluginSession(context: ConnectionContext(id: id, remoteAddress: transport.remoteAddress, eventLoop: core.eventLoop),
                            pipeline: core.pipeline)
    }

    var hasPlugins: Bool { plugins != nil }
    /// The connection as plugins see it (only code that runs when plugins are loaded asks for it).
    var context: ConnectionContext {
        guard let plugins else { preconditionFailure("a plugin context asked for with no plugin loaded") }
        return plugins.context
    }
    var pendingBytes: Int { outbound.bytes.count + transport.queuedBytes }
    /// Bytes of events waiting in this connection's stream queues (for credit or for outbound room).
    var waitingEventBytes = 0
    var isOverOutboundLimit: Bool { pendingBytes >= core.config.outboundLimit }
    var openRequestCount: Int { requests.openCount }
    var isText: Bool { mode == .text }
    var hasChosenBinary: Bool { mode == .binary }

    // MARK: Input

    func handle(_ event: TransportEvent) {
        if let heir { return heir.handle(event) }
        if isWaitingToMove { return holdWhileMoving(event) }
        switch event {
        case .data(let bytes):
            guard !isClosing else { return }
            core.stats.bytesIn += bytes.count
            bytesIn += bytes.count
            lastInbound = core.eventLoop.now
            guard !bytes.isEmpty else { return }  // traffic without bytes (a WebSocket ping): the heartbeat's
            if let plugins, !plugins.hasIdentifiedPeer, !plugins.identifyPeer(of: self) {
                mode = Mode(firstByte: bytes[0])  // the refusal goes out in the mode the client chose
                return fail(.unauthorized, id: 0)
            }
            processInput(bytes)
        case .closed where isClosing:
            close(.shutdown)  // a graceful close finished; its reason was counted when it began
        case .closed(let error?):
            logger.debug("connection failed: \(error)")
            close(.ioError)
        case .closed(nil) where session != nil:
            close(.peerClosed)  // parks the session: its streams go on
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
    func processInput(_ bytes: [UInt8]) {
        isProcessingInput = true
        defer {
            isProcessingInput = false
            if isClosing { routeCache = RouteCache() }  // kept while input was processed (`releaseState`)
        }
        // What the transport holds cannot change while input is processed (it changes on writes and
        // their callbacks, between turns): only `outbound` is checked per frame.
        let outboundRoom = core.config.outboundLimit - transport.queuedBytes
        var buffer = InboundBuffer()
        swap(&buffer, &inbound)
        buffer.append(bytes)
        if mode == .undecided, buffer.readableBytes > 0 {
            mode = Mode(firstByte: buffer.byte(at: 0))
            plugins?.context.encoding = mode == .text ? .text : .binary
            logger.debug("connection opened in \(mode) mode")
            if core.isDraining { sendGoAway() }
            if mode == .binary, Mode.startsAWord(buffer.byte(at: 0)) { return answerTypedWord(buffer) }
        }
        var count = 0
        if mode == .text {
            var decoder = lineDecoder
            while !isClosing, outbound.bytes.count < outboundRoom, let line = decoder.next(from: &buffer) {
                count += 1
                if !hasCompletedFrame, count == 1, admittedToResume { return refuseOverAddressCap() }  // text mode has no sessions
                TextMode.handle(line, on: self)
            }
            lineDecoder = decoder
        } else {
            var decoder = FrameDecoder(maxFrame: 0)  // swapped, not copied: no retain of its channel cache
            swap(&decoder, &frameDecoder)
            var readable = buffer.readableBytes
            if sessionStage.helloMayAsk,
               let heir = handleFramesWhileHelloMayAsk(&decoder, in: &buffer, count: &count, readable: &readable, outboundRoom: outboundRoom) {
                core.stats.framesIn += count  // the HELLO resumed a session: what follows it is that session's stream
                return heir.processInput(Array(buffer.readable))
            }
            while !isClosing, outbound.bytes.count < outboundRoom, let length = decodeFrame(&decoder, in: buffer) {
                count += 1
                buffer.consume(length)  // after the frame's view (and its payload slice) is gone
            }
            swap(&decoder, &frameDecoder)
            if let session { countInput(readable - buffer.readableBytes, into: session) }
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

    /// While a HELLO may ask for a session (protocol/resumption.md), frames are handled one at a time,
    /// so that the one that makes a session is the last one before its stream begins (`readable`: the
    /// bytes left after it). Returns the connection whose session a HELLO resumed, if one did.
    @inline(never)
    private func handleFramesWhileHelloMayAsk(_ decoder: inout FrameDecoder, in buffer: inout InboundBuffer, count: inout Int,
                                              readable: inout Int, outboundRoom: Int) -> Connection? {
        // Past its address's cap, a connection may only resume: a first frame that is not a HELLO is not handled.
        if sessionStage == .firstFrame, admittedToResume, buffer.readableBytes > 4, buffer.byte(at: 4) != Frame.Kind.hello.rawValue {
            refuseOverAddressCap()
            return nil
        }
        var stage = sessionStage
        while stage.helloMayAsk, !isClosing, outbound.bytes.count < outboundRoom, let length = decodeFrame(&decoder, in: buffer) {
            count += 1
            buffer.consume(length)
            if sessionStage == stage { sessionStage = .asked }  // the frame that may ask is the first, or the one after cannot_resume
            stage = sessionStage
            readable = buffer.readableBytes
            if let heir { return heir }
            if pendingMove != nil {  // the HELLO goes to its session's loop, with what followed it
                pendingMove?.input = Array(buffer.readable)
                buffer.consume(buffer.readableBytes)
                return nil
            }
        }
        return nil
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
        case .register:
            if let plugins, plugins.seesRequests {
                plugins.runInbound(register: frame, on: self)
            } else {
                core.register(frame.frame, from: self)
            }
        case .unregister: core.unregister(frame.channel, id: frame.id, from: self)
        case .position: handlePosition(frame)
        case .end: handleEnd(frame)
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
        if let plugins, !plugins.identify(hello, of: self) { return fail(.unauthorized, id: id, textID: textID) }
        isAuthenticated = true
        clientName = hello["client"]?.stringValue
        let welcome = core.welcome
        if mode == .text {
            TextMode.writeLine(TextMode.withID(textID, ["welcome": welcome]), on: self)
        } else {
            answerBinaryHello(hello, id: id, welcome: welcome)
        }
    }

    /// A MESSAGE, with its payload still in the inbound buffer: a method call is decoded in place.
    private func handleMessage(_ frame: FrameDecoder.View) {
        if frame.id != 0, !requests.binary.isEmpty, let first = withBinaryRequests({ $0[frame.id] }) {
            // An ERROR carrying a pending request's id is that request's answer (wire-v1 section 2), so
            // this one ERROR answers the id: the first request goes on, still open until it is finished
            // (it counts against the limit and goes with the connection), but its own answer never follows.
            detach(first)
            return writeError(.duplicateId, id: frame.id)
        }
        if core.isDraining {
            if frame.id != 0 { writeError(.goingAway, id: frame.id) }
            return
        }
        if frame.id != 0, !admitsRequest(id: frame.id) { return }
        if plugins?.seesRequests != true {
            refreshRoute(named: frame.channel)
            // The common calls, a local method's or a holder's: the method entry or registration is lent
            // unretained (holding it for the call cost a retain and a release). Sound: the route cache
            // holds it strongly, and nothing replaces the cache while input is processed (this runs only
            // then): lookups are made only by input processing, which does not nest; housekeeping runs
            // between turns; and a close while input is processed leaves the cache until processing ends
            // (`releaseState`). Checked in release builds too: a frame handled otherwise would be a use after free.
            precondition(isProcessingInput, "a frame handled outside input processing")
            let origin: PendingRequest.Origin? = frame.id == 0 ? nil : .binary(id: frame.id)
            if let method = unsafe routeCache.method {
                return unsafe method._withUnsafeGuaranteedRef { dispatchCall(to: $0, payload: frame.payload, origin: origin) }
            }
            if let held = unsafe routeCache.held {
                return unsafe held._withUnsafeGuaranteedRef { relayCall(to: $0, payload: frame.payload, origin: origin) }
            }
        }
        let route = route(named: frame.channel)
        // Gates judge a call or a send here, then it goes on as without plugins; anything else (or any
        // other stage) takes the whole pipeline.
        if let plugins, plugins.seesRequests, frame.id != 0 || !isHolderEvent(frame),
           !plugins.letsThroughGates(frame, taking: route, on: self) {
            return
        }
        if case .local(.method(let method))? = route {
            dispatchCall(to: method, payload: frame.payload, origin: frame.id == 0 ? nil : .binary(id: frame.id))
        } else if frame.id == 0 {
            core.route(channel: frame.channel, input: .bytes(frame.payload), origin: nil, connection: self)
        } else {
            handleRequest(.binary(id: frame.id), channel: frame.channel, input: .bytes(frame.payload))
        }
    }

    /// Where `name` leads, through the connection's one-entry cache: a connection mostly calls one
    /// channel, and its frame decoder hands back the same string object each time, so a hit costs a
    /// pointer comparison instead of hashing the name (twice, for a channel a client holds, or one
    /// that is nowhere on this loop: nil).
    func route(named name: String) -> Route? {
        refreshRoute(named: name)
        return routeCache.route
    }

    /// Points the route cache at `name`, looking it up unless the cache has it for the directory's version.
    private func refreshRoute(named name: String) {
        let version = core.directory.version
        if routeCache.version == version, routeCache.name == name { return }
        routeCache = RouteCache(name: name, route: core.directory.route(named: name), version: version)
    }

    /// Forgets a cached route the directory has changed since (housekeeping): it may name a registration
    /// whose holder has left, which the registration would keep in memory.
    func dropStaleRoute() {
        if routeCache.version != core.directory.version { routeCache = RouteCache() }
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
        let channel = plugins?.context.channel(renamedFrom: channel) ?? channel
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

    /// A holder's event on its own event channel (a MESSAGE with id 0): an event, not a request.
    private func isHolderEvent(_ frame: FrameDecoder.View) -> Bool {
        guard frame.id == 0, case .held(let registration)? = route(named: frame.channel) else { return false }
        return registration.holder === self && registration.kind == .event
    }

    /// Tracks the outbound limit, and lets waiting streams and paused input go once there is room.
    func afterWrite() {
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
        if session != nil { return park(deadline) }
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
        if session != nil, !isClosing, reason.parksSession { return park(reason) }
        if !isClosing {
            isClosing = true
            releaseState(reason)
            core.connectionClosed(self, reason: reason)
        }
        isClosed = true
        _ = takeOutbound()
        transport.closeNow()
    }

    /// Its session goes on over another transport (or none, parked): the old one's input is dropped
    /// (frames read and not handled, and an unfinished one, are not received).
    func dropInput() {
        inbound = InboundBuffer()
        frameDecoder = FrameDecoder(maxFrame: core.config.maxFrame)
        isInputPaused = false
        peerFinishedAt = nil
        partialSince = nil
        overLimitSince = nil
        lastInbound = core.eventLoop.now
        lastPing = lastInbound
    }

    /// Goes on where `predecessor`, whose first frame was a HELLO that made a session, left off: a
    /// session's connection runs over a ``SessionTransport``, which a resume points at another transport.
    func continueAfter(_ predecessor: Connection) {
        mode = predecessor.mode
        hasCompletedFrame = true
        sessionStage = .asked
        isAuthenticated = predecessor.isAuthenticated
        clientName = predecessor.clientName
        swap(&admittedHost, &predecessor.admittedHost)
    }

    /// Its HELLO resumes a session of another loop, where it may go: it stops here, its input paused,
    /// without a close of its own (its place under the caps goes with it).
    func stopForMove(_ move: SessionMove) {
        pendingMove = move
        isWaitingToMove = true
        isClosing = true
        isClosed = true
        transport.pauseReading()
    }

    /// It did not move after all: it goes on here.
    func stayAfterMove() {
        pendingMove = nil
        isWaitingToMove = false
        isClosing = false
        isClosed = false
    }

    /// An event of its transport while it may move: input (none comes while paused) goes along, and an
    /// end is kept for when it stays.
    private func holdWhileMoving(_ event: TransportEvent) {
        switch event {
        case .data(let bytes): pendingMove?.input += bytes
        case .closed, .failed: if pendingMove?.lost == nil { pendingMove?.lost = event }
        case .drained: break
        }
    }

    /// This connection's HELLO resumed `heir`'s session, which now has its transport: it goes away
    /// without a close of its own (nothing was made on it).
    func handOver(to heir: Connection) {
        var heir: Connection? = heir
        swap(&heir, &self.heir)
        isClosing = true
        isClosed = true
        plugins?.context.dropStates()
    }

    /// Ends streams (handlers told), fails server-initiated requests, cancels open requests (their answers go nowhere).
    private func releaseState(_ reason: CloseReason) {
        if session != nil { connectionLost(reason) }
        plugins?.context.dropStates()
        core.holderLeft(self)
        for stream in Array(streams.values) {
            endStream(stream, notifyHandler: true)
        }
        dropRequests()
        var spare: PendingRequest?
        swap(&spare, &requests.spare)  // it names this connection back (see PendingRequest.connection)
        // The route cache may name a channel this connection held, which names it back; while input is
        // processed, a call may be using its method entry (see `handleMessage`): let go of it after.
        if !isProcessingInput { routeCache = RouteCache() }
        core.requestFinished()  // the shutdown drain may have been waiting for these
        logger.debug("connection closed: \(reason.rawValue)")
    }
}
