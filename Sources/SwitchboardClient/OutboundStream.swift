import SwitchboardWire

/// The client's stream of frames to the server (protocol/resumption.md, "Streams and positions"): what it
/// has written and the server has not acknowledged, then what it has not written yet. Positions count
/// the stream's bytes from the session's start. Without a session the client acknowledges everything
/// it writes at once, so only unwritten frames stay.
struct OutboundStream {
    /// The stream from position `acknowledged` on, starting at index `start`.
    private var bytes: [UInt8] = []
    private var start = 0
    /// The position just past each frame kept, from index `firstFrame` on.
    private var frameEnds: [UInt64] = []
    private var firstFrame = 0
    /// Index in `frameEnds` of the first frame not written to the current connection.
    private var nextFrame = 0
    /// How much of the stream the server has acknowledged (and the client forgotten).
    private(set) var acknowledged: UInt64 = 0
    /// How much of the stream has been written to the current connection.
    private(set) var written: UInt64 = 0
    /// How much of the stream has ever been written, on any connection.
    private(set) var sent: UInt64 = 0
    /// Bytes written and not acknowledged that the stream may keep before it holds new frames back.
    let bound: Int

    init(bound: Int) { self.bound = bound }

    /// The position past the last frame.
    var end: UInt64 { acknowledged + UInt64(bytes.count - start) }

    /// Appends `frame` and returns the position just past it.
    @discardableResult
    mutating func append(_ kind: Frame.Kind, id: UInt32, channel: String, payload: [UInt8]?) -> UInt64 {
        Frame.write(kind, id: id, channel: channel, payload: payload, to: &bytes)
        frameEnds.append(end)
        return end
    }

    /// The next bytes to write: whole frames from `written` on, as far as the bound allows (always one
    /// frame when nothing written is unacknowledged, so a frame larger than the bound still goes).
    mutating func nextWrite() -> ArraySlice<UInt8>? {
        var target = written
        while nextFrame < frameEnds.count {
            let frameEnd = frameEnds[nextFrame]
            if frameEnd - acknowledged > UInt64(bound), target > acknowledged { break }
            target = frameEnd
            nextFrame += 1
        }
        guard target > written else { return nil }
        let from = start + Int(written - acknowledged), to = start + Int(target - acknowledged)
        written = target
        sent = max(sent, written)
        return bytes[from..<to]
    }

    /// The server has received the stream up to `position`: forget it. A position outside what was sent
    /// changes nothing.
    mutating func acknowledge(_ position: UInt64) {
        guard position > acknowledged, position <= sent else { return }
        start += Int(position - acknowledged)
        acknowledged = position
        written = max(written, position)
        while firstFrame < frameEnds.count, frameEnds[firstFrame] <= position { firstFrame += 1 }
        nextFrame = max(nextFrame, firstFrame)
        if start == bytes.count {
            bytes.removeAll(keepingCapacity: true)
            frameEnds.removeAll(keepingCapacity: true)
            (start, firstFrame, nextFrame) = (0, 0, 0)
        } else if start > 65536, start > bytes.count / 2 {
            bytes.removeFirst(start)
            start = 0
            frameEnds.removeFirst(firstFrame)
            nextFrame -= firstFrame
            firstFrame = 0
        }
    }

    /// Forgets everything written (a connection without a session).
    mutating func acknowledgeWritten() { acknowledge(written) }

    /// A resumed connection's server has received the stream up to `position`: write again from there.
    /// False when the client no longer has (or never sent) that position.
    mutating func resume(from position: UInt64) -> Bool {
        guard position >= acknowledged, position <= sent else { return false }
        acknowledge(position)
        written = position
        nextFrame = firstFrame
        while nextFrame < frameEnds.count, frameEnds[nextFrame] <= position { nextFrame += 1 }
        return true
    }

    /// The frames never written to any connection, in order.
    func unsentFrames() -> [Frame] {
        var buffer = InboundBuffer()
        buffer.append(Array(bytes[(start + Int(sent - acknowledged))...]))
        var decoder = FrameDecoder(maxFrame: .max)
        var frames: [Frame] = []
        while case .frame(let frame)? = try? decoder.next(from: &buffer) { frames.append(frame) }
        return frames
    }
}
