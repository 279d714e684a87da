import SwitchboardCodec

/// A resumable session (protocol/resumption.md): the positions of its two streams and what the
/// server has sent that the client has not acknowledged. Loop thread only, like its connection.
final class Session {
    /// `ackMs`, told in every WELCOME that grants a session.
    static let ackMs: UInt64 = 1000

    /// `ackBytes`, told in every WELCOME that grants a session: 64 KiB, or half of what a session may
    /// keep (`limit`) when that is less, so that a client acknowledging as told never overflows it.
    static func ackBytes(keeping limit: Int) -> UInt64 { UInt64(max(1, min(65_536, limit / 2))) }
    /// No stream of a session passes this position (2^53 − 1: exact in any JSON reader).
    static let maxPosition: UInt64 = (1 << 53) - 1

    let token: SessionToken
    /// The identity that made it: access control's user, or the certificate's subject; nil for anyone.
    let identity: String?
    /// Whether it was made over TLS (it then resumes only over TLS).
    let overTLS: Bool
    /// Whom it counts against when parked sessions must make room: its identity, else its address.
    let owner: String
    /// The server's received position: the bytes of the client's stream handled.
    private(set) var receivedPosition: UInt64 = 0
    /// The received position last told the client (by WELCOME or POSITION).
    private(set) var toldPosition: UInt64 = 0
    /// When the first byte received since ``toldPosition`` arrived.
    private var untoldSince: UInt64?
    /// A POSITION goes out with the next flush.
    private(set) var isPositionDue = false
    /// Bytes of input handled in the current read that are not in the client's stream (POSITION,
    /// END), subtracted when the read is counted.
    var uncountedInput = 0
    /// Bytes at the front of the connection's outbound buffer that precede the stream (the WELCOME),
    /// skipped when the next flush is kept.
    var uncountedOutput = 0
    /// What was sent and not acknowledged; its ``ReplayBuffer/end`` is the server's sent position.
    /// Changed only through ``changeReplay(_:)``: no access to it spans a call, so none is checked at
    /// run time (one per flush otherwise).
    private(set) var replay = ReplayBuffer()
    /// The connection that carries it, parked or not; nil once it ended.
    var connection: Connection?
    /// When its connection was lost, while it is parked.
    var parkedAt: UInt64?

    /// How often each side acknowledges, in bytes (``ackBytes(keeping:)``).
    let ackBytes: UInt64

    init(token: SessionToken, identity: String?, overTLS: Bool, address: String, ackBytes: UInt64) {
        self.ackBytes = ackBytes
        self.token = token
        self.identity = identity
        self.overTLS = overTLS
        owner = identity.map { "user " + $0 } ?? "address " + address
    }

    /// The server's sent position.
    var sentPosition: UInt64 { replay.end }

    /// Counts `bytes` more of the client's stream handled, at `now`; false if the stream would pass
    /// ``maxPosition``.
    func countReceived(_ bytes: Int, at now: UInt64) -> Bool {
        let counted = bytes - uncountedInput
        uncountedInput = 0
        guard counted > 0 else { return true }
        guard UInt64(counted) <= Self.maxPosition - receivedPosition else { return false }
        receivedPosition += UInt64(counted)
        if untoldSince == nil { untoldSince = now }
        if receivedPosition - toldPosition >= ackBytes { isPositionDue = true }
        return true
    }

    /// Whether a POSITION is due because `ackMs` passed since the first byte not yet acknowledged;
    /// marks it due.
    func positionIsDueByTime(at now: UInt64) -> Bool {
        guard !isPositionDue, let since = untoldSince, now - since >= Self.ackMs else { return false }
        isPositionDue = true
        return true
    }

    /// The received position to send in a POSITION (or a WELCOME), which counts as telling it.
    func tellPosition() -> UInt64 {
        toldPosition = receivedPosition
        untoldSince = nil
        isPositionDue = false
        return receivedPosition
    }

    /// Keeps `bytes` (a flush), less the ``uncountedOutput`` at their front; false if what is kept
    /// would pass `limit`, or the stream ``maxPosition``.
    func keepSent(_ bytes: consuming [UInt8], limit: Int) -> Bool {
        if uncountedOutput > 0 {
            bytes.removeFirst(min(uncountedOutput, bytes.count))
            uncountedOutput = 0
        }
        var kept = ReplayBuffer()  // taken out as `changeReplay(_:)` does (its closure could not consume `bytes`)
        swap(&kept, &replay)
        defer { swap(&kept, &replay) }
        guard UInt64(bytes.count) <= Self.maxPosition - kept.end, kept.count + bytes.count <= limit else { return false }
        kept.append(bytes, limit: limit)
        return true
    }

    /// Runs `change` on ``replay`` taken out of the session meanwhile.
    private func changeReplay<Result>(_ change: (inout ReplayBuffer) -> Result) -> Result {
        var kept = ReplayBuffer()
        swap(&kept, &replay)
        defer { swap(&kept, &replay) }
        return change(&kept)
    }

    /// Lets go of memory reserved for what it has not kept yet (it was parked).
    func trimKept() { changeReplay { $0.trimCapacity() } }

    /// The client's POSITION: forgets what it acknowledged. False if it names a position past the
    /// sent position; a position before the last one is ignored.
    func acknowledge(_ position: UInt64) -> Bool {
        guard position <= sentPosition else { return false }
        if position > replay.start { changeReplay { $0.release(upTo: position) } }
        return true
    }

    /// Forgets what it kept (the session ended).
    func forgetKept() { changeReplay { $0.removeAll() } }

    /// The bytes kept from `position` on, or nil if `position` lies outside them; `position` then
    /// counts as the client's acknowledgement.
    func missed(from position: UInt64) -> [UInt8]? {
        guard position >= replay.start, position <= replay.end else { return nil }
        return changeReplay { kept in
            let bytes = kept.bytes(from: position)
            kept.release(upTo: position)
            return bytes
        }
    }

    /// Bytes kept for the client.
    var keptBytes: Int { replay.count }

    /// Whether a frame of `size` bytes fits in what the session may keep (`limit`), after the `pending`
    /// bytes not yet flushed into it.
    func hasRoom(forFrameOf size: Int, pending: Int, limit: Int) -> Bool {
        replay.count + pending + size <= limit
    }
}

/// What a HELLO's `session` asks (protocol/resumption.md, "Asking for a session").
enum SessionRequest {
    case new
    case resume(token: String, position: UInt64)

    /// The request in `value`; nil if it is not one (answered `bad_hello`).
    init?(_ value: ChannelValue) {
        guard case .map = value else { return nil }
        guard let token = value["token"] else {
            self = .new
            return
        }
        guard case .string(let text) = token, let position = value["position"].flatMap(Self.position) else { return nil }
        self = .resume(token: text, position: position)
    }

    /// An integer from 0 to 2^53 − 1, written as an integer or as a number with no fraction.
    private static func position(_ value: ChannelValue) -> UInt64? {
        switch value {
        case .int32(let v): v >= 0 ? UInt64(v) : nil
        case .int64(let v): v >= 0 && UInt64(v) <= Session.maxPosition ? UInt64(v) : nil
        case .float64(let v):
            v >= 0 && v <= Double(Session.maxPosition) && v.rounded(.towardZero) == v ? UInt64(v) : nil
        default: nil
        }
    }
}

/// The sessions of one loop, by number: live and parked ones, and why recent ones ended.
final class SessionTable {
    /// Sessions numbered on this loop so far: the next one's number.
    private var numbered: UInt64 = 0
    /// The sessions that have not ended.
    private(set) var live: [UInt64: Session] = [:]
    /// The parked ones, longest parked first.
    private(set) var parked: [Session] = []
    /// Why sessions ended, for one time to live after, at most `limit` of them, oldest first.
    private var ended: [UInt64: EndedSession] = [:]
    private var endedOrder: [UInt64] = []
    /// This loop's share of ``ServerConfiguration/maxParkedSessions``, and ``ServerConfiguration/sessionTTLMs``.
    let limit: Int, ttlMs: UInt64
    /// Sessions made, resumed, and taken from a connection that still carried them.
    var made = 0, resumed = 0, taken = 0
    /// Sessions ended, by ``SessionEndCause``; resumes refused, by reason (`identity` besides the
    /// ``CannotResume`` reasons).
    private(set) var endedCounts: [String: Int] = [:]
    var refusedCounts: [String: Int] = [:]
    /// Frames others sent for sessions of this loop, dropped for want of room, by kind (`message`, `cancel`).
    var droppedCounts: [String: Int] = [:]
    /// When a refusal was last logged (at most one a second).
    var lastRefusalLog: UInt64?

    /// A session that ended: enough to tell its client why, and nothing more.
    struct EndedSession {
        let token: SessionToken
        let identity: String?
        let reason: CannotResume
        let at: UInt64
    }

    init(limit: Int, ttlMs: UInt64) {
        self.limit = max(1, limit)
        self.ttlMs = ttlMs
    }

    /// A new session for `connection` from `address`, numbered on `loop` of the process marked `process`,
    /// that may keep `keeping` bytes.
    func make(process: UInt64, loop: Int, identity: String?, overTLS: Bool, address: String, keeping: Int,
              for connection: Connection) -> Session {
        numbered += 1
        made += 1
        let session = Session(token: SessionToken(process: process, loop: UInt16(truncatingIfNeeded: loop), number: numbered),
                              identity: identity, overTLS: overTLS, address: address, ackBytes: Session.ackBytes(keeping: keeping))
        session.connection = connection
        live[session.token.number] = session
        return session
    }

    /// The session `token` names on this loop, if it has not ended and the secret matches.
    func find(_ token: SessionToken) -> Session? {
        guard let session = live[token.number], session.token.matches(token) else { return nil }
        return session
    }

    /// Why the session `token` names ended, if that is remembered (the whole token, and the same identity).
    func endReason(_ token: SessionToken, identity: String?, at now: UInt64) -> CannotResume? {
        guard let ended = ended[token.number], ended.token.matches(token), ended.identity == identity,
              now - ended.at < ttlMs else { return nil }
        return ended.reason
    }

    /// Parks `session` at `now`; returns the session that must end to make room, if one must: the one
    /// parked longest of the owner (identity, else address) with the most parked sessions, so that
    /// whoever parks many ends their own, never another's while they have more.
    func park(_ session: Session, at now: UInt64) -> Session? {
        session.parkedAt = now
        parked.append(session)
        guard parked.count > limit else { return nil }
        var counts: [String: Int] = [:]
        for parked in parked { counts[parked.owner, default: 0] += 1 }
        let most = counts.values.max() ?? 0
        return parked.first { counts[$0.owner] == most }
    }

    /// `session` is no longer parked (resumed, or ending).
    func unpark(_ session: Session) {
        guard session.parkedAt != nil else { return }
        session.parkedAt = nil
        parked.removeAll { $0 === session }
    }

    /// The parked sessions whose time to live is over at `now`.
    func expired(at now: UInt64) -> [Session] {
        parked.prefix { now - ($0.parkedAt ?? now) >= ttlMs }.map { $0 }
    }

    /// Ends `session` for `cause`, remembered for one time to live: it is forgotten, with what it kept.
    func end(_ session: Session, _ cause: SessionEndCause, at now: UInt64) {
        unpark(session)
        session.forgetKept()
        session.connection = nil
        guard live.removeValue(forKey: session.token.number) != nil else { return }
        endedCounts[cause.rawValue, default: 0] += 1
        let number = session.token.number
        ended[number] = EndedSession(token: session.token, identity: session.identity, reason: cause.refusal, at: now)
        endedOrder.append(number)
        while endedOrder.count > limit || endedOrder.first.map({ now - (ended[$0]?.at ?? now) >= ttlMs }) == true {
            ended.removeValue(forKey: endedOrder.removeFirst())
        }
    }
}

/// Why a session ended, as stats count it (protocol/resumption.md, "Settings, stats and metrics").
enum SessionEndCause: String {
    case expired, evicted, overflowed
    /// A closing ERROR, an operator, shutdown.
    case closed
    /// The client's END.
    case end

    /// What a resuming HELLO is told.
    var refusal: CannotResume {
        switch self {
        case .expired: .expired
        case .evicted: .evicted
        case .overflowed: .overflowed
        case .closed, .end: .ended
        }
    }
}

extension SessionTable {
    /// `sessions` in `switchboard/stats`.
    var statsValue: ChannelValue {
        .stringMap([
            "live": .int(live.count - parked.count), "parked": .int(parked.count),
            "bufferedBytes": .int(bufferedBytes),
            "made": .int(made), "resumed": .int(resumed), "taken": .int(taken),
            "ended": .map(endedCounts.sorted { $0.key < $1.key }.map { .init(.string($0.key), .int($0.value)) }),
            "refused": .map(refusedCounts.sorted { $0.key < $1.key }.map { .init(.string($0.key), .int($0.value)) }),
            "dropped": .map(droppedCounts.sorted { $0.key < $1.key }.map { .init(.string($0.key), .int($0.value)) }),
        ])
    }

    /// Bytes kept for sessions: sent and not acknowledged, and kept while parked.
    var bufferedBytes: Int { live.values.reduce(0) { $0 + $1.keptBytes } }
}
