import CWslay

/// One side of a WebSocket connection (RFC 6455), framed by wslay: bytes in, messages out; messages in,
/// bytes out. wslay answers pings, masks a client's frames and checks a server's, checks control
/// frames, reassembles fragments and enforces the message size limit (closing with 1009).
final class WebSocketSession {
    enum Opcode: UInt8 { case text = 1, binary = 2 }
    enum Role { case server, client }

    private var context: wslay_event_context_ptr?
    // The properties wslay's callbacks touch are `@exclusivity(unchecked)`: the callbacks run on the loop
    // thread inside `wslay_event_recv` and `wslay_event_send`, which `receive` and `takeOutput` call while
    // holding no access to any of them, and the `on…` handlers must not call back into the session (see
    // `onData`). Checked at run time, they cost more than wslay's own work on every message.
    @exclusivity(unchecked) private var input: [UInt8] = []
    @exclusivity(unchecked) private var inputOffset = 0
    @exclusivity(unchecked) private var output: [UInt8] = []
    /// The bytes of text and binary messages as they arrive (a message may come in several calls),
    /// valid during the call, which must not call back into the session. wslay buffers no message:
    /// a message costs no copy of its own.
    @exclusivity(unchecked) var onData: (Opcode, UnsafeBufferPointer<UInt8>) -> Void = { _, _ in }
    /// The end of a text or binary message.
    @exclusivity(unchecked) var onMessageEnd: (Opcode) -> Void = { _ in }
    /// The opcode of the message being received (from its first frame; continuations carry 0).
    @exclusivity(unchecked) private var receiving: Opcode?
    /// Any frame's start, control frames included: traffic, for the heartbeat.
    @exclusivity(unchecked) var onFrame: () -> Void = {}

    init(role: Role = .server, maxMessage: Int) {
        var callbacks = wslay_event_callbacks()
        callbacks.recv_callback = { context, buffer, length, _, user in
            guard let session = WebSocketSession.owner(user), let buffer else { return -1 }
            let available = session.input.count - session.inputOffset
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
            session.onData(opcode, UnsafeBufferPointer(start: argument.pointee.data, count: argument.pointee.data_length))
        }
        callbacks.on_msg_recv_callback = { _, argument, user in
            guard let session = WebSocketSession.owner(user), let argument,
                  let opcode = Opcode(rawValue: argument.pointee.opcode) else { return }  // control frames: wslay's
            session.receiving = nil
            session.onMessageEnd(opcode)
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

    /// Reads `bytes`: delivers the messages they complete. False on a fatal error (the session is over).
    func receive(_ bytes: [UInt8]) -> Bool {
        if inputOffset == input.count {
            input = bytes
            inputOffset = 0
        } else {
            input.removeFirst(inputOffset)
            inputOffset = 0
            input += bytes
        }
        return wslay_event_recv(context) == 0
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
