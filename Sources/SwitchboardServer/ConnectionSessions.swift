import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// What a HELLO's `session` may still do on a connection (protocol/resumption.md, "Asking for a session").
enum SessionStage {
    /// No frame has been handled: a HELLO now may ask for a session.
    case firstFrame
    /// The first frame has been handled (or the one try after a refusal used): `session` is ignored.
    case asked
    /// A resuming HELLO got `cannot_resume`: the next frame, if it is a HELLO, may ask for a new session,
    /// and one that asks to resume again gets `bad_hello`.
    case refused
    /// A session ended on this connection: the POSITION and END that cross its END are ignored.
    case ended

    /// Whether a HELLO's `session` counts now.
    var helloMayAsk: Bool { self == .firstFrame || self == .refused }
}

/// Why a resuming HELLO is refused (protocol/resumption.md, "When a session cannot be resumed").
enum CannotResume: String, Error {
    case unknown, expired, evicted, overflowed, ended, position, restarted
    case otherNode = "other_node"
    /// A session of another identity (or made over TLS, presented without it): counted as `identity`,
    /// told as `unknown`, so that a stolen token tells its holder nothing.
    case otherIdentity = "identity"

    var error: WireError {
        let message = switch self {
        case .unknown, .otherIdentity: "no such session"
        case .expired: "session expired"
        case .evicted: "session evicted"
        case .overflowed: "session overflowed"
        case .ended: "session ended"
        case .position: "session cannot be resumed from that position"
        case .restarted: "session was made by a server process that is gone"
        case .otherNode: "session lives on another node"
        }
        let told = self == .otherIdentity ? CannotResume.unknown : self
        return .plugin(code: "cannot_resume", message: message, details: .stringMap(["reason": .string(told.rawValue)]))
    }
}

/// Why a session ended, as the server tells its client in END.
enum SessionEnd: String {
    case overflowed
}

extension Connection {
    // MARK: Negotiation

    /// Answers a binary HELLO: WELCOME, with a session when the HELLO asks for one and may; `bad_hello`
    /// for a `session` that is not one, `cannot_resume` for one that cannot be resumed.
    func answerBinaryHello(_ hello: ChannelValue, id: UInt32, welcome: ChannelValue) {
        // A connection past its address's cap came only to resume a session of that address.
        let mayOnlyResume = sessionStage == .firstFrame && admittedToResume
        guard sessionStage.helloMayAsk, core.config.sessionTTLMs > 0, let value = hello["session"] else {
            if mayOnlyResume { return refuseOverAddressCap() }
            if sessionStage == .refused { sessionStage = .asked }
            // A later HELLO, and its WELCOME, are in the session's streams like any frame; one that names
            // another identity would hand the session to it.
            if let session, session.identity != sessionIdentity {
                return fail(.badHello("a HELLO may not change the identity of the connection's session"), id: id)
            }
            return writeFrame(.welcome, id: id, payload: try? JSONText.serialize(welcome))
        }
        guard let request = SessionRequest(value) else {
            return fail(.badHello("session must be {} or {\"token\":string,\"position\":0…2^53−1}"), id: id)
        }
        let wasRefused = sessionStage == .refused
        sessionStage = .asked
        switch request {
        case .new:
            if mayOnlyResume { return refuseOverAddressCap() }
            guard !core.isDraining else {
                return writeFrame(.welcome, id: id, payload: try? JSONText.serialize(welcome))
            }
            flush()  // a cannot_resume before this HELLO goes first, and is not in the session's stream
            // The session's connection is a new one, over a transport a resume can point elsewhere; this
            // one (which holds nothing but its HELLO) hands its transport's events and input on to it.
            let successor = Connection(id: self.id, transport: SessionTransport(over: transport), core: core)
            if let plugins = successor.plugins, !plugins.identifyPeer(of: successor) || !plugins.identify(hello, of: successor) {
                return fail(.unauthorized, id: id)  // as it was for this connection: the same question, the same answer
            }
            successor.continueAfter(self)
            handOver(to: successor)
            core.connectionReplaced(by: successor)
            let session = core.sessions.make(process: core.group?.processMark ?? 0, loop: core.index,
                                              identity: sessionIdentity, overTLS: isOverTLS,
                                              address: successor.admittedHost ?? transport.remoteAddress,
                                              keeping: core.config.sessionBytes, for: successor)
            successor.writeFrame(.welcome, id: id, payload: try? JSONText.serialize(Self.welcome(welcome, granting: session, resumed: false,
                                                                                              ttlMs: core.config.sessionTTLMs)))
            session.uncountedOutput = successor.outbound.bytes.count  // the WELCOME: the stream begins after it
            successor.replaceSession(with: session)
            logger.debug("session made", metadata: ["session": "\(session.token.number)"])
        case .resume(let text, let position):
            guard !wasRefused else { return fail(.badHello("one resuming HELLO per connection"), id: id) }
            if let move = SessionMove(text, hello: hello, id: id, from: self) { return ask(move) }
            resume(text, from: position, mayOnlyResume: mayOnlyResume, welcome: welcome, id: id)
            if mayOnlyResume, heir == nil, pendingMove == nil { refuseOverAddressCap() }  // after its cannot_resume
        }
    }

    /// Resumes the session `text` names from the client's `position`, or answers why it cannot.
    private func resume(_ text: String, from position: UInt64, mayOnlyResume: Bool, welcome: ChannelValue, id: UInt32) {
        switch findSession(text) {
        case .failure(let refusal):
            refuseResume(refusal, id: id)
        case .success(let session):
            guard let holder = session.connection, holder.transport is SessionTransport else { return refuseResume(.unknown, id: id) }
            // Past its address's cap, only a session of that address: the place it gives back is that address's.
            if mayOnlyResume, holder.admittedHost != admittedHost { return }
            if session.parkedAt == nil { holder.flush() }  // the stream so far is kept, and goes to the old connection
            guard holder.session === session else { return refuseResume(.overflowed, id: id) }
            guard let missed = session.missed(from: position) else { return refuseResume(.position, id: id) }
            holder.resume(session, over: self, missed: missed, welcome: welcome, id: id)
        }
    }

    /// Closes a connection that came past its address's cap to resume and did not: counted as the cap's refusal.
    func refuseOverAddressCap() {
        closeAfterFlush(.overAddressLimit)
    }

    private func refuseResume(_ refusal: CannotResume, id: UInt32) {
        core.sessions.refusedCounts[refusal.rawValue, default: 0] += 1
        let now = core.eventLoop.now
        if core.sessions.lastRefusalLog.map({ now - $0 >= 1000 }) ?? true {  // a flood of bad tokens logs once a second
            core.sessions.lastRefusalLog = now
            logger.notice("refusing to resume a session", metadata: ["reason": "\(refusal.rawValue)", "remote": "\(transport.remoteAddress)",
                                                                     "refused": "\(core.sessions.refusedCounts)"])
        }
        sessionStage = .refused
        writeError(refusal.error, id: id)
    }

    /// The session a resuming HELLO names, or why it cannot be resumed.
    private func findSession(_ text: String) -> Result<Session, CannotResume> {
        if core.isDraining { return .failure(.ended) }
        guard let token = SessionToken(text: text) else { return .failure(.unknown) }
        guard token.process == core.group?.processMark ?? 0 else {  // a node of the cluster, or a process that is gone
            return .failure(core.cluster?.hears(process: String(token.process, radix: 16)) == true ? .otherNode : .restarted)
        }
        // A loop this server does not have, or another loop's session on a transport that cannot move there.
        guard Int(token.loop) == core.index else { return .failure(.unknown) }
        return core.findSession(token, identity: sessionIdentity, overTLS: isOverTLS)
    }

    // MARK: Resuming

    /// Its HELLO resumes a session of another loop. That loop is asked first whether it has the
    /// session, for this connection's identity (the secret is compared there), while this connection
    /// waits out of the table, its input paused; a forged or stale token moves nothing. Then the
    /// connection moves there (``finish(_:)``), or is refused here and goes on (``moveAnswered(_:)``).
    private func ask(_ move: SessionMove) {
        stopForMove(move)
        core.connectionHandedOver(self)
        let here = LoopBound(self, loop: core.handle), target = move.loop
        let token = move.token, identity = sessionIdentity, overTLS = isOverTLS
        let asked = target.loop.execute {
            let refusal: CannotResume? = switch target.value.findSession(token, identity: identity, overTLS: overTLS) {
            case .success: nil
            case .failure(let refusal): refusal
            }
            here.loop.execute { here.value.moveAnswered(refusal) }  // a loop that has stopped has no connection waiting
        }
        if !asked { core.handle.execute { here.value.moveAnswered(.ended) } }  // that loop has stopped: the server is stopping
    }

    /// The session's loop answered a move: the connection goes there, or, refused (or closed by its
    /// peer meanwhile), it comes back here and goes on as after a refusal on this loop.
    func moveAnswered(_ refusal: CannotResume?) {
        guard let move = pendingMove else { return }
        if refusal == nil, move.lost == nil, move.transport.canDetach { return finish(move) }
        stayAfterMove()
        core.connectionReturned(self)
        if let lost = move.lost { return handle(lost) }
        guard let refusal else {  // output waits to be written on it, which could not go along: closed, the client tries again
            logger.info("cannot move a resuming connection with output waiting", metadata: ["to": "loop \(move.token.loop)"])
            return close(.ioError)
        }
        transport.resumeReading()
        refuseResume(refusal, id: move.id)
        if admittedToResume { return refuseOverAddressCap() }  // it came only to resume
        processInput(move.input)
    }

    /// Sends this connection, with the state of its layers, its HELLO and what followed it, to the loop
    /// of the session the HELLO resumes, where a connection of that loop reads them as its own (the
    /// HELLO's checks are made again there); its place under the caps goes along.
    private func finish(_ move: SessionMove) {
        pendingMove = nil
        isWaitingToMove = false
        let host = admittedHost, toResume = admittedToResume
        admittedHost = nil
        let quota = core.quota
        let connection: DetachedConnection?
        do { connection = try move.transport.detach() } catch {
            if let host { quota.release(host) }
            return logger.warning("cannot move a resuming connection to loop \(move.token.loop): \(error)")
        }
        guard let connection else {  // checked just before: not reached
            if let host { quota.release(host) }
            return
        }
        let target = move.loop, bytes = move.hello + move.input
        if !target.loop.execute({ target.value.adoptResuming(connection, host: host, toResume: toResume, input: bytes) }) {
            if let host { quota.release(host) }
            connection.close()
        }
    }

    /// `resumer`'s HELLO resumed this connection's session: this connection goes on over its transport
    /// (taking it from the connection that carries it, if any), answering WELCOME and then its stream
    /// from the client's position: `missed`, then what was made and not yet flushed.
    func resume(_ session: Session, over resumer: Connection, missed: [UInt8], welcome: ChannelValue, id: UInt32) {
        core.sessions.resumed += 1
        if session.parkedAt != nil {
            core.sessions.unpark(session)
            core.connectionResumed(self)
        } else {
            core.sessions.taken += 1
            let old = sessionTransport?.inner ?? transport
            var error = Frame(.error, payload: WireError.plugin(code: "session_taken", message: "a resuming HELLO on another connection took the session", details: nil).payload).bytes
            old.write(&error)
            old.closeNow(.normal)  // over WebSocket, close code 1000
            core.tallies.closes[CloseReason.sessionTaken.rawValue, default: 0] += 1
            logger.info("session taken over", metadata: ["session": "\(session.token.number)"])
        }
        // The resumer's place under the caps is this connection's now; the old place is given back.
        let oldPlace = admittedHost
        admittedHost = resumer.admittedHost
        resumer.admittedHost = oldPlace
        sessionTransport?.replace(with: resumer.transport)
        dropInput()
        resumer.handOver(to: self)
        core.connectionHandedOver(resumer)
        core.releaseAdmission(of: resumer)
        let unflushed = takeOutbound()
        writeFrame(.welcome, id: id, payload: try? JSONText.serialize(Self.welcome(welcome, granting: session, resumed: true,
                                                                                   ttlMs: core.config.sessionTTLMs)))
        writeRaw(missed)
        session.uncountedOutput = outbound.bytes.count
        writeRaw(unflushed)
        logger.debug("session resumed", metadata: ["session": "\(session.token.number)"])
        for stream in Array(streams.values) { stream.activate() }  // those held while parked go on
        afterWrite()  // streams that waited for room go on
    }

    // MARK: Parking

    /// The connection is lost (`reason` parks a session): its session is parked, with everything the
    /// connection holds, until it is resumed or ends. A session that already keeps more than
    /// `--session-bytes` ends `overflowed` instead, and the connection closes.
    func park(_ reason: CloseReason) {
        guard let session else { return }
        flush()  // what was made goes to the stream (and to the old transport, which may still read it)
        guard self.session != nil, session.keptBytes <= core.config.sessionBytes else {
            return endParked(.overflowed, closing: reason)
        }
        session.trimKept()
        let old = sessionTransport?.replace(with: ParkedTransport(of: transport)) ?? transport
        dropInput()
        if reason == .frameTimeout {  // its ERROR is not in the stream
            var error = Frame(.error, payload: WireError.timeout("a frame was not finished within \(core.config.frameTimeoutMs) ms").payload).bytes
            old.write(&error)
        }
        old.closeNow()
        core.connectionParked(self)
        for stream in streams.values { stream.holdWhileParked() }
        logger.debug("session parked", metadata: ["session": "\(session.token.number)", "reason": "\(reason.rawValue)"])
        if let evicted = core.sessions.park(session, at: core.eventLoop.now) { evicted.connection?.endParked(.evicted) }
    }

    /// Ends this connection's session for `reason` and closes the connection, which lets go of what
    /// it held as any closing connection does (callers of its channels get `handler_gone`).
    func endParked(_ reason: SessionEndCause, closing closeReason: CloseReason = .sessionEnded) {
        let wasParked = session?.parkedAt != nil
        if let session {
            core.sessions.end(session, reason, at: core.eventLoop.now)
            replaceSession(with: nil)
            logger.info("session ended", metadata: ["session": "\(session.token.number)", "reason": "\(reason.rawValue)"])
        }
        close(closeReason)
        if wasParked { core.parkedSessionEnded(self) }
    }

    /// WELCOME's fields and the granted session's.
    private static func welcome(_ welcome: ChannelValue, granting session: Session, resumed: Bool, ttlMs: UInt64) -> ChannelValue {
        guard case .map(var fields) = welcome else { return welcome }
        let position = session.tellPosition()
        fields.append(.init("session", .stringMap([
            "token": .string(session.token.text), "resumed": .bool(resumed), "position": .int(Int(position)),
            "ttlMs": .int(Int(clamping: ttlMs)), "ackBytes": .int(Int(session.ackBytes)), "ackMs": .int(Int(Session.ackMs)),
        ])))
        return .map(fields)
    }

    /// Who a session is bound to: access control's user (or the certificate's subject, which it
    /// names when no plugin names another), else the certificate's subject; nil for anyone.
    private var sessionIdentity: String? { plugins.map { $0.context.identity } ?? transport.peerIdentity }

    private var isOverTLS: Bool { transport.scheme == "tls" || transport.scheme == "wss" }

    // MARK: Positions

    /// Counts `bytes` of input handled in one read (some of them, perhaps, not in the stream).
    func countInput(_ bytes: Int, into session: Session) {
        guard session.countReceived(bytes, at: core.eventLoop.now) else { return endSession(.overflowed) }
        if session.isPositionDue { markDirty() }
    }

    /// A POSITION from the client: forgets what it acknowledged.
    func handlePosition(_ frame: FrameDecoder.View) {
        guard let session else { return refuseSessionFrame(frame) }
        session.uncountedInput += Frame.headerSize + (frame.payload?.count ?? 0)
        guard let payload = frame.payload, payload.count == 8 else {
            return writeError(.badFrame("POSITION payload must be exactly 8 bytes"), id: frame.id)
        }
        let position = payload.reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        if !session.acknowledge(position) { writeError(.badFrame("POSITION past the server's sent position"), id: frame.id) }
    }

    /// An END from the client: its session ends; the connection goes on without it.
    func handleEnd(_ frame: FrameDecoder.View) {
        guard let session else { return refuseSessionFrame(frame) }
        session.uncountedInput += Frame.headerSize + (frame.payload?.count ?? 0)
        guard frame.payload?.isEmpty ?? true else { return writeError(.badFrame("a client's END has no payload"), id: frame.id) }
        core.sessions.end(session, .end, at: core.eventLoop.now)
        replaceSession(with: nil)
        sessionStage = .ended
        logger.debug("session ended by its client", metadata: ["session": "\(session.token.number)"])
    }

    /// POSITION or END without a session: `bad_frame`, as for a type wire-v1 does not know, unless
    /// they crossed the END of a session that ended here.
    private func refuseSessionFrame(_ frame: FrameDecoder.View) {
        guard sessionStage != .ended else { return }
        writeError(.badFrame("unknown frame type \(frame.kind.rawValue)"), id: frame.id)
    }

    /// The POSITION due for `session`, appended to `bytes` (which the flush hands over: a POSITION is not
    /// in the stream).
    static func appendPosition(of session: Session, to bytes: inout [UInt8]) {
        let position = session.tellPosition()
        Frame.write(.position, id: 0, channel: "", payload: (0..<8).map { UInt8(truncatingIfNeeded: position >> (56 - 8 * UInt64($0))) },
                    to: &bytes)
    }

    // MARK: Ending

    /// The server ends the session: END tells the client why, and the connection goes on without it.
    func endSession(_ reason: SessionEnd) {
        guard let session else { return }
        if session.parkedAt != nil { return endParked(.overflowed) }
        core.sessions.end(session, .overflowed, at: core.eventLoop.now)
        replaceSession(with: nil)
        sessionStage = .ended
        writeFrame(.end, payload: try? JSONText.serialize(.stringMap(["reason": .string(reason.rawValue)])))
        logger.info("session ended", metadata: ["session": "\(session.token.number)", "reason": "\(reason.rawValue)"])
    }

    /// The connection is closing with its session, for a reason that ends it (a closing ERROR, an
    /// operator, shutdown).
    func connectionLost(_ reason: CloseReason) {
        guard let session else { return }
        core.sessions.end(session, .closed, at: core.eventLoop.now)
        replaceSession(with: nil)
    }

    /// Whether a frame of `size` bytes fits in what this connection's session may keep (always, without
    /// one). A frame for the session's client that others send (a forwarded request or message, a relayed
    /// CANCEL) and that does not fit is not sent, so that no other client can end the session.
    func sessionHasRoom(forFrameOf size: Int) -> Bool {
        guard let session else { return true }
        return session.hasRoom(forFrameOf: size, pending: outbound.bytes.count, limit: core.config.sessionBytes)
    }

    /// A frame another client sent for this connection's session, dropped for want of room (`message`, an
    /// id-0 MESSAGE; `cancel`, a relayed CANCEL): counted in the stats' `sessions.dropped`.
    func countDroppedForSession(_ kind: String) {
        core.sessions.droppedCounts[kind, default: 0] += 1
    }

    /// Sets ``session`` by exchange, never by assignment: no access to it then releases anything, so
    /// its reads (one per flush and per read) need no exclusivity check at run time.
    func replaceSession(with new: Session?) {
        var new = new
        swap(&new, &session)
    }


    /// The transport of a session's connection, which a resume points elsewhere.
    private var sessionTransport: SessionTransport? { transport as? SessionTransport }
}

/// The transport of a parked session's connection: output goes nowhere (the session keeps it), and
/// the peer is named as the lost transport named it.
final class ParkedTransport: Transport {
    let remoteAddress: String
    let isLoopbackPeer: Bool
    let peerIdentity: String?
    let scheme: String

    init(of lost: any Transport) {
        remoteAddress = lost.remoteAddress
        isLoopbackPeer = lost.isLoopbackPeer
        peerIdentity = lost.peerIdentity
        scheme = lost.scheme
    }

    func start(_ handler: @escaping (TransportEvent) -> Void) {}
    func write(_ bytes: inout [UInt8]) { bytes = [] }  // the session keeps them: no second buffer of their size
    var queuedBytes: Int { 0 }
    var isOpen: Bool { true }
    func pauseReading() {}
    func resumeReading() {}
    func closeAfterWrites() {}
    func closeAfterWrites(_ intent: CloseIntent) {}
    func closeNow() {}
    var holdsPartialInput: Bool { false }
}

/// The transport of a session's connection: the transport it runs over now, which a resume replaces
/// by the resuming connection's (and parking by a ``ParkedTransport``). Its events reach the
/// connection through the connection that started it, whose ``Connection/heir`` it is. (`@safe`: its
/// one unsafe part, ``holder``, is kept alive by hand as its comment says, and never leaves it.)
@safe final class SessionTransport: Transport {
    /// The transport it runs over now, in an object of its own that ``queuedBytes`` (read for every
    /// event delivered) borrows: with no retain, as a `let` is read. Over plain TCP, passed through
    /// unchanged, that count is read from the TCP connection at once, with no call through the layer
    /// above it: what the path without a session pays.
    private final class Holder {
        let transport: any Transport
        let tcp: TCPConnection?
        init(_ transport: any Transport) {
            self.transport = transport
            tcp = (transport as? HTTPUpgradeTransport)?.passThroughTCP ?? transport as? TCPConnection
        }
    }
    /// Sound: retained by hand once when made (in `init` and `replace(with:)`) and released once, when
    /// replaced or in `deinit`; borrowed only by `queuedBytes`, whose getters do not call out, so
    /// nothing replaces it meanwhile (and only on the loop thread, as every access here).
    @exclusivity(unchecked) private var holder: Unmanaged<Holder>

    init(over inner: any Transport) { unsafe holder = .passRetained(Holder(inner)) }

    deinit { unsafe holder.release() }

    /// The transport it runs over now.
    var inner: any Transport { unsafe holder.takeUnretainedValue().transport }

    /// Goes on over `new`; returns the transport it ran over.
    @discardableResult
    func replace(with new: any Transport) -> any Transport {
        let old = inner
        let replaced = unsafe holder
        unsafe holder = .passRetained(Holder(new))
        unsafe replaced.release()
        return old
    }

    func start(_ handler: @escaping (TransportEvent) -> Void) {}  // started by the connection it came from
    func write(_ bytes: inout [UInt8]) { inner.write(&bytes) }
    var queuedBytes: Int { unsafe holder._withUnsafeGuaranteedRef { $0.tcp?.queuedBytes ?? $0.transport.queuedBytes } }
    var isOpen: Bool { inner.isOpen }
    var remoteAddress: String { inner.remoteAddress }
    var isLoopbackPeer: Bool { inner.isLoopbackPeer }
    var peerIdentity: String? { inner.peerIdentity }
    var scheme: String { inner.scheme }
    func pauseReading() { inner.pauseReading() }
    func resumeReading() { inner.resumeReading() }
    func closeAfterWrites() { inner.closeAfterWrites() }
    func closeAfterWrites(_ intent: CloseIntent) { inner.closeAfterWrites(intent) }
    func closeNow() { inner.closeNow() }
    func closeNow(_ intent: CloseIntent) { inner.closeNow(intent) }
    var holdsPartialInput: Bool { inner.holdsPartialInput }
}

/// A resuming HELLO read on one loop for a session of another, and the connection it came on, which
/// moves there with the state of its layers (TLS, WebSocket) once that loop has found the session.
struct SessionMove {
    let loop: LoopBound<ServerCore>
    let transport: HTTPUpgradeTransport
    let token: SessionToken
    /// The HELLO, to be read again there, and its id, for a refusal here.
    let hello: [UInt8]
    let id: UInt32
    /// What followed the HELLO.
    var input: [UInt8] = []
    /// How the transport ended while the session's loop was asked, if it did: nothing moves then.
    var lost: TransportEvent?

    /// The move `text` asks of `connection`, if the token names another loop of this process and the
    /// connection runs over a transport that can move.
    init?(_ text: String, hello: ChannelValue, id: UInt32, from connection: Connection) {
        let core = connection.core
        guard let token = SessionToken(text: text), let group = core.group, token.process == group.processMark,
              Int(token.loop) != core.index, group.cores.indices.contains(Int(token.loop)),
              let transport = connection.transport as? HTTPUpgradeTransport,
              let payload = try? JSONText.serialize(hello) else { return nil }
        loop = group.cores[Int(token.loop)]
        self.transport = transport
        self.token = token
        self.hello = Frame(.hello, id: id, payload: payload).bytes
        self.id = id
    }
}

extension ServerCore {
    /// This loop's session that `token` names, if it has it, it has not ended, and it is bound to
    /// `identity` (and, made over TLS, presented over TLS: `overTLS`); else why it cannot be resumed.
    func findSession(_ token: SessionToken, identity: String?, overTLS: Bool) -> Result<Session, CannotResume> {
        if isDraining { return .failure(.ended) }
        guard let session = sessions.find(token) else {
            return .failure(sessions.endReason(token, identity: identity, at: eventLoop.now) ?? .unknown)
        }
        guard session.identity == identity, !session.overTLS || overTLS else { return .failure(.otherIdentity) }
        return .success(session)
    }
}
