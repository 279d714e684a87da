import FuzzSupport
import SwitchboardWire

// Input: one byte seeding the chunk sizes, then the byte stream a binary client sends.
//
// The stream is decoded twice: with `next` on chunks as a socket might deliver them, and with `peek`
// on the whole stream at once. Both must give the same frames, rejections and fatal error. Every frame
// must be at most maxFrame long and re-encode (`Frame.write`) to exactly the bytes it was read from,
// which decode back to the same frame.

let maxFrame: UInt32 = 1024

enum Event: Equatable {
    case frame(Frame)
    case rejected(WireError, id: UInt32)
    case failed(WireError)
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    var input = FuzzInput(start, count)
    let seed = input.takeByte()
    let stream = input.rest
    let chunked = decodeWithNext(chunks(of: stream, sizes: chunkSizes(total: stream.count, seed: seed)))
    let whole = decodeWithPeek(stream)
    check(chunked.events == whole.events, "chunked \(chunked.events) != whole \(whole.events)")
    check(chunked.left == whole.left, "chunked left \(chunked.left) bytes, whole left \(whole.left)")
    return 0
}

/// Decodes chunk by chunk with `next`, as a connection does; stops at the first thrown error.
func decodeWithNext(_ chunks: [[UInt8]]) -> (events: [Event], left: Int) {
    var decoder = FrameDecoder(maxFrame: maxFrame)
    var buffer = InboundBuffer()
    var events: [Event] = []
    for chunk in chunks {
        buffer.append(chunk)
        do {
            while let decoded = try decoder.next(from: &buffer) {
                switch decoded {
                case .frame(let frame): events.append(.frame(frame))
                case .rejected(let error, let id): events.append(.rejected(error, id: id))
                }
            }
        } catch {
            events.append(.failed(error))
            return (events, -1)
        }
    }
    return (events, buffer.readableBytes)
}

/// Decodes the whole stream with `peek`, checking each frame against the bytes it came from.
func decodeWithPeek(_ stream: [UInt8]) -> (events: [Event], left: Int) {
    var decoder = FrameDecoder(maxFrame: maxFrame)
    var buffer = InboundBuffer()
    buffer.append(stream)
    var events: [Event] = []
    while true {
        let peeked: FrameDecoder.Peeked?
        do {
            peeked = try decoder.peek(buffer)
        } catch {
            switch error {
            case .frameTooLarge(let declared): check(declared > maxFrame, "frameTooLarge for \(declared) bytes")
            case .malformedFrame: break
            default: check(false, "peek threw \(error), which is not fatal")
            }
            events.append(.failed(error))
            return (events, -1)
        }
        guard let result = peeked else { return (events, buffer.readableBytes) }
        let length = result.length
        let raw = Array(buffer.readable.prefix(length))
        check(raw.count == length && length >= Frame.headerSize && length - 4 <= Int(maxFrame),
              "frame of \(length) bytes from \(buffer.readableBytes) readable, maxFrame \(maxFrame)")
        switch result {
        case .frame(let view, _):
            let frame = view.frame
            check(frame.bytes == raw, "re-encoded \(hex(frame.bytes)) != read \(hex(raw))")
            var again = InboundBuffer()
            again.append(frame.bytes)
            var fresh = FrameDecoder(maxFrame: maxFrame)
            check((try? fresh.next(from: &again)) == .frame(frame) && again.readableBytes == 0,
                  "re-encoded frame does not decode back: \(hex(frame.bytes))")
            events.append(.frame(frame))
        case .rejected(let error, let id, _):
            switch error {
            case .badFrame, .badChannel: break
            default: check(false, "rejected with \(error)")
            }
            events.append(.rejected(error, id: id))
        }
        buffer.consume(length)
    }
}
