import CWslay

/// One side of a WebSocket connection (RFC 6455), framed by wslay: bytes in, messages out; messages in,
/// bytes out. wslay answers pings, masks a client's frames and checks a server's, checks control
/// frames, reassembles fragments and enforces the message size limit (closing with 1009).
final class WebSocketSession {
    enum Opcode: UInt8 { case text = 1, binary = 2 }
    enum Role { case server, client }

    /// Set once, in init (after `self` exists, which wslay's callbacks need). Unchecked: read on every
    /// call, never written again.
    @exclusivity(unchecked) private var context: wslay_event_context_ptr?
    private let role: Role
    private let maxMessage: Int
    // The properties wslay's callbacks touch are `@exclusivity(unchecked)`: the callbacks run on the loop
    // thread inside `wslay_event_recv` and `wslay_event_send`, which `receive` and `takeOutput` call while
    // holding no access to any of them, and the `on…` handlers must not call back into the session (see
    // `onData`). Checked at run time, they cost more than wslay's own work on every message.
    @exclusivity(unchecked) private var input: [UInt8] = []
    @exclusivity(unchecked) private var inputOffset = 0
    /// Where wslay's reads of `input` stop (see ``receiveFromServer()``).
    @exclusivity(unchecked) private var inputLimit = 0
    /// Client side: bytes of a large frame that wslay has begun and not read to its end yet. Unchecked:
    /// touched only by ``receiveFromServer()``, which no callback reaches.
    @exclusivity(unchecked) private var owedToWslay = 0
    /// Client side: the messages read, for the owner to take (``takeReceived()``) instead of `onData`
    /// and `onMessageEnd`: each binary message's bytes, each text message's followed by a newline (a
    /// JSON line each). Unchecked: appended to by wslay's callbacks and ``receiveFromServer()``, taken
    /// between calls.
    @exclusivity(unchecked) private var received: [UInt8] = []
    @exclusivity(unchecked) private var output: [UInt8] = []
    /// Server side: the bytes of text and binary messages as they arrive (a message may come in several
    /// calls), valid during the call, which must not call back into the session. wslay buffers no
    /// message: a message costs no copy of its own.
    @exclusivity(unchecked) var onData: (Opcode, UnsafeBufferPointer<UInt8>) -> Void = { _, _ in }
    /// Server side: the end of a text or binary message.
    @exclusivity(unchecked) var onMessageEnd: (Opcode) -> Void = { _ in }
    /// The opcode of the message being received (from its first frame; continuations carry 0).
    @exclusivity(unchecked) private var receiving: Opcode?
    /// Any frame's start, control frames included: traffic, for the heartbeat.
    @exclusivity(unchecked) var onFrame: () -> Void = {}

    init(role: Role = .server, maxMessage: Int) {
        self.role = role
        self.maxMessage = maxMessage
        var callbacks = wslay_event_callbacks()
        callbacks.recv_callback = { context, buffer, length, _, user in
            guard let session = WebSocketSession.owner(user), let buffer else { return -1 }
            let available = session.inputLimit - session.inputOffset
            guard available > 0 else {
                wslay_event_set_error(context, Int32(WSLAY_ERR_WOULDBLOCK.rawValue))
                return -1
            }
            let count = min(available, length)
            session.input.withUnsafeBufferPointer { source in
                buffer.update(from: source.baseAddress! + session.inputOffset, count: count)
            }
            session.inputOffset += count
            return count
        }
        callbacks.send_callback = { _, data, length, _, user in
            guard let session = WebSocketSession.owner(user), let data else { return -1 }
            session.output.append(contentsOf: UnsafeBufferPointer(start: data, count: length))
            return length
        }
        callbacks.on_frame_recv_start_callback = { _, argument, user in
            guard let session = WebSocketSession.owner(user), let argument else { return }
            if let opcode = Opcode(rawValue: argument.pointee.opcode) { session.receiving = opcode }
            session.onFrame()
        }
        callbacks.on_frame_recv_chunk_callback = { _, argument, user in
            guard let session = WebSocketSession.owner(user), let argument, let opcode = session.receiving else { return }
            let bytes = UnsafeBufferPointer(start: argument.pointee.data, count: argument.pointee.data_length)
            if session.role == .client { session.received.append(contentsOf: bytes) } else { session.onData(opcode, bytes) }
        }
        callbacks.on_msg_recv_callback = { _, argument, user in
            guard let session = WebSocketSession.owner(user), let argument,
                  let opcode = Opcode(rawValue: argument.pointee.opcode) else { return }  // control frames: wslay's
            session.receiving = nil
            if session.role == .client {
                if opcode == .text { session.received.append(10) }
            } else {
                session.onMessageEnd(opcode)
            }
        }
        let user = Unmanaged.passUnretained(self).toOpaque()
        switch role {
        case .server: wslay_event_context_server_init(&context, &callbacks, user)
        case .client:
            callbacks.genmask_callback = { _, buffer, length, _ in
                guard let buffer else { return -1 }
                for index in 0..<length { buffer[index] = UInt8.random(in: 0...255) }
                return 0
            }
            wslay_event_context_client_init(&context, &callbacks, user)
        }
        wslay_event_config_set_max_recv_msg_length(context, UInt64(maxMessage))
        wslay_event_config_set_no_buffering(context, 1)
    }

    deinit { wslay_event_context_free(context) }

    /// Server side: where the peer's frames begin and end, followed byte by byte as they arrive.
    private var boundaries = FrameBoundaries()
    /// Server side: the peer has sent part of a frame, or the first frames of a message it has not ended.
    var isInsideFrame: Bool { boundaries.isInsideFrame || receiving != nil }

    /// Reads `bytes`: delivers the messages they complete. False on a fatal error (the session is over).
    func receive(_ bytes: [UInt8]) -> Bool {
        if role == .server { boundaries.advance(over: bytes) }
        if inputOffset == input.count {
            input = bytes
            inputOffset = 0
        } else {
            input.removeFirst(inputOffset)
            inputOffset = 0
            input += bytes
        }
        guard role == .client else { return wslayRead(upTo: input.count) }
        return receiveFromServer()
    }

    /// Lets wslay read `input` up to `limit`. False on a fatal error.
    private func wslayRead(upTo limit: Int) -> Bool {
        inputLimit = limit
        return wslay_event_recv(context) == 0
    }

    /// A server's frames, read here when they are whole, final, unmasked binary frames outside a
    /// fragmented message (a server's events: going through wslay cost more than the rest of a delivery
    /// on the client). wslay reads every other frame (text, whose UTF-8 it checks, control frames,
    /// fragments, anything it must refuse)
    /// and only ever whole frames, so that it is always at a frame's start when this looks, except for a
    /// frame over 64 KiB, which it reads as it comes, the rest of it owed to it before this looks again.
    private func receiveFromServer() -> Bool {
        guard wslay_event_want_read(context) != 0 else { return true }  // nothing is read after a close or an error
        let input = self.input  // the same buffer wslay reads from, which nothing changes meanwhile
        return input.withUnsafeBufferPointer { bytes in
            var offset = inputOffset, failed = false
            defer { inputOffset = offset }
            /// Lets wslay read up to `limit`; false when it failed or reads no more (a close, an error).
            func wslayReads(upTo limit: Int) -> Bool {
                inputOffset = offset
                defer { offset = inputOffset }
                guard wslayRead(upTo: limit) else { failed = true; return false }
                return inputOffset == limit && wslay_event_want_read(context) != 0
            }
            while offset < bytes.count {
                if owedToWslay > 0 {
                    let count = min(owedToWslay, bytes.count - offset)
                    owedToWslay -= count
                    guard wslayReads(upTo: offset + count) else { break }
                    continue
                }
                guard let frame = Self.frameHeader(bytes, at: offset) else { break }  // more to come
                let end = offset + frame.headerSize + frame.payloadSize
                if end <= bytes.count, frame.opcode != nil, receiving == nil, frame.payloadSize <= maxMessage {
                    received.append(contentsOf: UnsafeBufferPointer(rebasing: bytes[(offset + frame.headerSize)..<end]))
                    offset = end
                } else if end <= bytes.count {
                    guard wslayReads(upTo: end) else { break }
                } else if frame.headerSize + frame.payloadSize > 1 << 16 {
                    owedToWslay = end - bytes.count
                    guard wslayReads(upTo: bytes.count) else { break }
                } else {
                    break  // a small frame's rest is on its way
                }
            }
            return !failed
        }
    }

    /// The header of the frame at `offset`, if it is all there: its size, the payload's, and the opcode
    /// when the frame is final, unmasked, binary, without reserved bits and with its length in the fewest
    /// bytes (nil otherwise: wslay reads it, and refuses what it must). An absurd length is clamped.
    @inline(__always)
    private static func frameHeader(_ input: UnsafeBufferPointer<UInt8>, at offset: Int) -> (headerSize: Int, payloadSize: Int, opcode: Opcode?)? {
        guard input.count - offset >= 2 else { return nil }
        let first = input[offset], second = input[offset + 1]
        let lengthSize = switch second & 0x7F { case 126: 2; case 127: 8; default: 0 }
        let headerSize = 2 + lengthSize + (second & 0x80 != 0 ? 4 : 0)
        guard input.count - offset >= headerSize else { return nil }
        var payloadSize = Int(second & 0x7F)
        if lengthSize > 0 {
            payloadSize = 0
            for index in 0..<lengthSize { payloadSize = payloadSize << 8 | Int(input[offset + 2 + index]) }
            if lengthSize == 8, input[offset + 2] & 0x80 != 0 || payloadSize > 1 << 40 { payloadSize = 1 << 40 }
        }
        let isMinimal = lengthSize == 0 || (lengthSize == 2 ? payloadSize >= 126 : payloadSize > 0xFFFF)
        let isPlainBinary = first == 0x82 && second & 0x80 == 0 && isMinimal
        return (headerSize, payloadSize, isPlainBinary ? .binary : nil)
    }

    /// Client side: the messages read so far (see `received`).
    func takeReceived() -> [UInt8] {
        var messages: [UInt8] = []
        swap(&messages, &received)
        return messages
    }

    /// Queues a message (copied by wslay); false once the session is closing.
    func queue(_ opcode: Opcode, _ message: [UInt8]) -> Bool {
        message.withUnsafeBufferPointer { bytes in
            var argument = wslay_event_msg(opcode: opcode.rawValue, msg: bytes.baseAddress, msg_length: bytes.count)
            return wslay_event_queue_msg(context, &argument) == 0
        }
    }

    /// Queues a close frame with `code` and a short reason.
    func queueClose(_ code: UInt16, reason: String) {
        let reason = Array(reason.utf8.prefix(120))
        _ = reason.withUnsafeBufferPointer { wslay_event_queue_close(context, code, $0.baseAddress, $0.count) }
    }

    /// What wslay has to send now (frames queued, pongs, a close), as bytes.
    func takeOutput() -> [UInt8] {
        _ = wslay_event_send(context)
        defer { output = [] }
        return output
    }

    /// The peer's close frame arrived.
    var closeReceived: Bool { wslay_event_get_close_received(context) != 0 }
    /// The status code the peer closed with (0 if it has not, or gave none).
    var closeCodeReceived: UInt16 { closeReceived ? wslay_event_get_status_code_received(context) : 0 }
    /// The status code this side closed with (0 if it has not).
    var closeCodeSent: UInt16 { wslay_event_get_close_sent(context) != 0 ? wslay_event_get_status_code_sent(context) : 0 }

    private static func owner(_ user: UnsafeMutableRawPointer?) -> WebSocketSession? {
        user.map { Unmanaged<WebSocketSession>.fromOpaque($0).takeUnretainedValue() }
    }
}

/// Follows the frames of a WebSocket byte stream without reading them (wslay does): how much of the
/// current frame is still to come, and the start of a header that is not all in yet.
struct FrameBoundaries {
    private var remaining = 0
    private var header: [UInt8] = []

    var isInsideFrame: Bool { remaining > 0 || !header.isEmpty }

    mutating func advance(over bytes: [UInt8]) {
        var index = 0
        while index < bytes.count {
            if remaining > 0 {
                let count = min(remaining, bytes.count - index)
                remaining -= count
                index += count
                continue
            }
            header.append(bytes[index])
            index += 1
            guard let payload = Self.payloadSize(header) else { continue }  // more header to come
            header.removeAll(keepingCapacity: true)
            remaining = payload
        }
    }

    /// The payload size once `header` is a whole frame header (an absurd length is clamped: wslay
    /// refuses such a frame anyway).
    private static func payloadSize(_ header: [UInt8]) -> Int? {
        guard header.count >= 2 else { return nil }
        let lengthSize = switch header[1] & 0x7F { case 126: 2; case 127: 8; default: 0 }
        guard header.count == 2 + lengthSize + (header[1] & 0x80 != 0 ? 4 : 0) else { return nil }
        guard lengthSize > 0 else { return Int(header[1] & 0x7F) }
        return header[2..<(2 + lengthSize)].reduce(0) { min($0 << 8 | Int($1), 1 << 40) }
    }
}
