import SwitchboardCodec
import SwitchboardWire

/// A bench connection's side of a resumable session that is never cut (`--session`,
/// protocol/resumption.md): its HELLO asks for a session, its WELCOME must grant one, and it acknowledges
/// the server's stream as the spec says: a POSITION once `ackBytes` of it arrived since the last one, or
/// `ackMs` after the first byte not yet acknowledged, never for nothing new. It keeps nothing to send
/// again: the bench measures what resumability costs the server, which a client that never reconnects
/// does not change.
struct SessionAcknowledger {
    /// The payload of a HELLO that asks for a new session.
    static let helloPayload = Array(#"{"version":1,"session":{}}"#.utf8)
    /// What a client that closes on purpose sends first, so that its session ends instead of staying
    /// parked (where a parked listener would go on costing the next run its events).
    static let end = Frame(.end, payload: nil).bytes

    private var ackBytes: UInt64 = 0, ackNanoseconds: UInt64 = 0
    /// The server's stream received so far, and the part of it acknowledged.
    private var received: UInt64 = 0, told: UInt64 = 0
    /// When the first byte not yet acknowledged was seen (as far as a read tells).
    private var untoldSince: UInt64?

    /// Reads the WELCOME's `session` (its acknowledgement intervals); ends the bench if it grants none.
    mutating func welcome(_ payload: ArraySlice<UInt8>) {
        guard let session = (try? JSONText.parse(payload))?["session"], let bytes = session["ackBytes"]?.intValue,
              let ms = session["ackMs"]?.intValue, bytes > 0, ms > 0 else {
            abortBench("--session: the WELCOME grants no session (a server without sessions, or --session-ttl 0)")
        }
        ackBytes = UInt64(bytes)
        ackNanoseconds = UInt64(ms) * 1_000_000
    }

    /// Counts a frame the server sent after its WELCOME; false for POSITION and END, which are not in
    /// its stream (an END would mean the server ended the session: the caller treats it as an error).
    mutating func count(_ frame: ScannedFrame) -> Bool {
        guard frame.type != Frame.Kind.position.rawValue, frame.type != Frame.Kind.end.rawValue else { return false }
        received += UInt64(frame.size)
        return true
    }

    /// Appends a POSITION if one is due at `now` (call it once per read).
    mutating func appendPosition(to out: inout [UInt8], now: UInt64) {
        guard received > told else { return }
        let since = untoldSince ?? now
        guard received - told >= ackBytes || now - since >= ackNanoseconds else {
            untoldSince = since
            return
        }
        Frame.write(.position, id: 0, channel: "", payload: (0..<8).map { UInt8(truncatingIfNeeded: received >> (56 - 8 * UInt64($0))) },
                    to: &out)
        told = received
        untoldSince = nil
    }
}
