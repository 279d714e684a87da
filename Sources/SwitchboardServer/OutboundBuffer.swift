import SwitchboardCodec
import SwitchboardWire

/// A connection's output that its transport does not have yet, and its place in the server's list of
/// connections to flush. A struct stored in its connection: no object of its own and no retain per write.
///
/// Replies and events made while handling input are appended to ``bytes`` and the connection is marked
/// dirty; the server flushes every dirty connection once per loop turn, just before the loop blocks, so
/// fifty pipelined calls cost one write.
struct OutboundBuffer {
    /// Bytes made but not yet handed to the transport. Only ever read, or exchanged with `swap`: no access
    /// releases anything or calls out, so the compiler proves them exclusive and checks none at run time.
    fileprivate(set) var bytes: [UInt8] = []
    /// Frames (or lines) in ``bytes``, added to the server's counters when they are handed over: one
    /// counter update per turn rather than one per frame.
    fileprivate(set) var unflushedFrames = 0
    /// Whether the connection is in the server's dirty list (marked means linked).
    var isDirty = false
    /// The connection marked dirty before this one (see `ServerCore.firstDirty`).
    var nextDirty: Connection?
}

extension Connection {
    // MARK: Output

    /// Links the connection into the server's dirty list, once until the list is flushed. The old head is
    /// moved, not copied, into the link: copying it cost a retain and a release per loop turn.
    func markDirty() {
        if !outbound.isDirty {
            outbound.isDirty = true
            var link: Connection? = self
            swap(&link, &core.firstDirty)
            outbound.nextDirty = consume link
        }
    }

    func writeFrame(_ kind: Frame.Kind, id: UInt32 = 0, channel: String = "", payload: [UInt8]?) {
        appendFrame { Frame.write(kind, id: id, channel: channel, payload: payload, to: &$0) }
    }

    /// ``writeFrame(_:id:channel:payload:)`` with a payload that is part of a larger buffer (a frame read
    /// in place), copied from there.
    func writeFrame(_ kind: Frame.Kind, id: UInt32 = 0, channel: String = "", copying payload: ArraySlice<UInt8>?) {
        appendFrame { Frame.write(kind, id: id, channel: channel, copying: payload, to: &$0) }
    }

    /// Appends one frame (or line), which `write` puts at the end of the outbound bytes.
    @inline(__always)
    private func appendFrame(_ write: (inout [UInt8]) -> Void) {
        guard !isClosed else { return }
        var bytes = takeOutbound()
        write(&bytes)
        outbound.unflushedFrames += 1
        restoreOutbound(consume bytes)
        markDirty()
    }

    /// Takes the outbound bytes out of the connection while a call that is not the connection's own (the wire
    /// encoder, a codec, which may run custom code) appends to it: no access to the property spans such a
    /// call, and output the call makes on this connection meanwhile lands in a fresh buffer.
    func takeOutbound() -> [UInt8] {
        var bytes: [UInt8] = []
        swap(&bytes, &outbound.bytes)
        return bytes
    }

    /// Puts back what `takeOutbound()` took, ahead of anything written meanwhile.
    private func restoreOutbound(_ bytes: consuming [UInt8]) {
        var meanwhile = bytes
        swap(&meanwhile, &outbound.bytes)
        guard !meanwhile.isEmpty else { return }  // rare: output made while the buffer was out
        var buffer = takeOutbound()
        buffer.append(copying: meanwhile)
        swap(&buffer, &outbound.bytes)
    }

    func writeRaw(_ bytes: [UInt8]) {
        appendFrame { $0.append(copying: bytes) }
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
        // Two paths, not one `?:`: the binary frame is a constant of the event, read borrowed, while a
        // text line is made here; merged, both would be owned, and fan-out would retain the shared frame.
        if mode == .text, let line = event.textLine {
            writeRaw(line)
        } else if mode != .text, let frame = event.binaryFrame {
            writeRaw(frame)
        } else {
            core.countDrop("unencodable")
            return false
        }
        return true
    }

    /// Hands the outbound bytes to the transport: for every dirty connection once per loop turn, and at once
    /// before a close. A dirty connection stays in the dirty list (flushed again, then with nothing to
    /// write) until that list is flushed.
    func flush() {
        guard !isClosed else { return }
        if let session { keepSent(by: session) }
        if !outbound.bytes.isEmpty {
            core.stats.framesOut += outbound.unflushedFrames
            core.stats.bytesOut += outbound.bytes.count
            bytesOut += outbound.bytes.count
            outbound.unflushedFrames = 0
            // The transport may report a failed write synchronously, and closing touches the buffer:
            // hand it a buffer of its own, then take the (emptied) buffer back to keep its capacity.
            var bytes = takeOutbound()
            transport.write(&bytes)
            if outbound.bytes.isEmpty, !isClosed { swap(&bytes, &outbound.bytes) }
        }
        afterWrite()
    }

    /// Keeps what this flush hands over in the session's stream (protocol/resumption.md), then adds the
    /// POSITION that is due, which is not in it. What the client leaves unacknowledged past the
    /// `--session-bytes` ends the session (END `overflowed`).
    private func keepSent(by session: Session) {
        if !outbound.bytes.isEmpty, !session.keepSent(outbound.bytes, limit: core.config.sessionBytes) {
            return endSession(.overflowed)
        }
        guard session.isPositionDue else { return }
        var bytes = takeOutbound()  // no access to the buffer spans a call: its accesses stay unchecked
        Self.appendPosition(of: session, to: &bytes)
        restoreOutbound(consume bytes)
        outbound.unflushedFrames += 1
    }

    /// Writes a REPLY with a success envelope, encoded in place in the outbound buffer.
    func writeSuccess(_ value: ChannelValue, codec: any MethodCodec, id: UInt32) {
        guard !isClosed else { return }
        var bytes = takeOutbound()
        let start = Frame.startFrame(.reply, id: id, to: &bytes)
        do throws(CodecError) {
            try codec.encodeSuccessEnvelope(value, appendingTo: &bytes)
        } catch {
            bytes.removeSubrange(start...)
            restoreOutbound(consume bytes)
            return writeBinaryAnswer(.failure(ChannelError(code: "encode_failed", message: "\(error)"), codec), id: id)
        }
        Frame.finishFrame(startingAt: start, in: &bytes)
        outbound.unflushedFrames += 1
        restoreOutbound(consume bytes)
        markDirty()
    }

    func writeBinaryAnswer(_ answer: Answer, id: UInt32) {
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
}
