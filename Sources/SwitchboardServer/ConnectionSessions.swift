import SwitchboardCodec
import SwitchboardWire

/// What a HELLO's `session` may still do on a connection (protocol/resumption.md, "Asking for a session").
enum SessionStage {
    /// No frame has been handled: a HELLO now may ask for a session.
    case firstFrame
    /// The first frame has been handled (or the one try after a refusal used): `session` is ignored.
    case asked
    /// A resuming HELLO got `cannot_resume`: the next HELLO may ask for a new session, and one that
    /// asks to resume again gets `bad_hello`.
    case refused
    /// A session ended on this connection: the POSITION and END that cross its END are ignored.
    case ended

    /// Whether a HELLO's `session` counts now.
    var helloMayAsk: Bool { self == .firstFrame || self == .refused }
}

/// Why a resuming HELLO is refused (protocol/resumption.md, "When a session cannot be resumed").
enum CannotResume: String {
    case unknown, expired, evicted, overflowed, ended, position, restarted
    case otherNode = "other_node"

    var error: WireError {
        let message = switch self {
        case .unknown: "no such session"
        case .expired: "session expired"
        case .evicted: "session evicted"
        case .overflowed: "session overflowed"
        case .ended: "session ended"
        case .position: "session cannot be resumed from that position"
        case .restarted: "session was made by a server process that is gone"
        case .otherNode: "session lives on another node"
        }
        return .plugin(code: "cannot_resume", message: message, details: .stringMap(["reason": .string(rawValue)]))
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
    func answerBinaryHello(_ hello: ChannelValue, id: UInt32, length: Int, welcome: ChannelValue) {
        guard sessionStage.helloMayAsk, let value = hello["session"] else {
            if sessionStage == .refused { sessionStage = .asked }
            session?.uncountedInput += length
            return writeFrame(.welcome, id: id, payload: try? JSONText.serialize(welcome))
        }
        guard let request = SessionRequest(value) else {
            return fail(.badHello("session must be {} or {\"token\":string,\"position\":0…2^53−1}"), id: id)
        }
        let wasRefused = sessionStage == .refused
        sessionStage = .asked
        switch request {
        case .new:
            guard core.config.sessionTTLMs > 0, !core.isDraining else {
                return writeFrame(.welcome, id: id, payload: try? JSONText.serialize(welcome))
            }
            let session = core.sessions.make(process: core.group?.processMark ?? 0, loop: core.index,
                                              identity: sessionIdentity, overTLS: isOverTLS)
            writeFrame(.welcome, id: id, payload: try? JSONText.serialize(Self.welcome(welcome, granting: session, resumed: false, ttlMs: core.config.sessionTTLMs)))
            session.uncountedOutput = outbound.bytes.count  // the WELCOME and anything before it
            self.session = session
            logger.debug("session made", metadata: ["session": "\(session.token.number)"])
        case .resume(let text, let position):
            guard !wasRefused else { return fail(.badHello("one resuming HELLO per connection"), id: id) }
            if let refusal = findSession(text, position: position) {
                sessionStage = .refused
                writeError(refusal.error, id: id)
            }
        }
    }

    /// The session a resuming HELLO names, or why it cannot be resumed.
    private func findSession(_ text: String, position: UInt64) -> CannotResume? {
        if core.isDraining { return .ended }
        guard let token = SessionToken(text: text) else { return .unknown }
        guard token.process == core.group?.processMark ?? 0 else { return .restarted }
        guard Int(token.loop) == core.index, let session = core.sessions.find(token) else { return .unknown }
        guard session.identity == sessionIdentity, !session.overTLS || isOverTLS else { return .unknown }
        // Parking, and resuming what is parked, come with issue 32's next step: a session ends with its connection.
        _ = position
        return .unknown
    }

    /// WELCOME's fields and the granted session's.
    private static func welcome(_ welcome: ChannelValue, granting session: Session, resumed: Bool, ttlMs: UInt64) -> ChannelValue {
        guard case .map(var fields) = welcome else { return welcome }
        let position = session.tellPosition()
        fields.append(.init("session", .stringMap([
            "token": .string(session.token.text), "resumed": .bool(resumed), "position": .int(Int(position)),
            "ttlMs": .int(Int(ttlMs)), "ackBytes": .int(Int(Session.ackBytes)), "ackMs": .int(Int(Session.ackMs)),
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
        core.sessions.end(session)
        self.session = nil
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
        core.sessions.end(session)
        self.session = nil
        sessionStage = .ended
        writeFrame(.end, payload: try? JSONText.serialize(.stringMap(["reason": .string(reason.rawValue)])))
        logger.info("session ended", metadata: ["session": "\(session.token.number)", "reason": "\(reason.rawValue)"])
    }

    /// The connection is closing with its session.
    func connectionLost(_ reason: CloseReason) {
        guard let session else { return }
        // Parking comes with issue 32's next step: until then a session ends with its connection.
        core.sessions.end(session)
        self.session = nil
    }
}
