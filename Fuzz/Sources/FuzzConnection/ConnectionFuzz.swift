import FuzzSupport
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

// Input: one byte seeding the chunk sizes, one byte of options, then what a client sends.
//   options bit 0: the server requires the token "t" (HELLO payload {"token":"t"}).
//   options bit 1: the peer reads nothing until it has sent everything (backpressure).
//
// A fresh server with the demo channels gets the bytes over an in-memory transport, one loop turn per
// chunk, then the peer closes its side (and closes fully once the server has). Besides not crashing,
// what the server wrote must be well formed. Binary mode (first byte not `{`): whole frames of server
// kinds, at most one answer per client frame with that id, nothing after an ERROR that closes the
// connection. Text mode: JSON object lines.

let maxFrame: UInt32 = 2048

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    var input = FuzzInput(start, count)
    let seed = input.takeByte()
    let options = input.takeByte()
    let stream = input.rest

    var configuration = ServerConfiguration()
    configuration.maxFrame = maxFrame
    configuration.outboundLimit = 16 * 1024
    if options & 1 != 0 { configuration.token = "t" }
    guard let embedded = try? EmbeddedServer(configuration: configuration) else { fatalError("no server") }
    let peer = embedded.connect(name: "fuzz")
    // The peer reads at most readBudget bytes while it sends (an endless ticker stream would otherwise
    // keep every loop turn busy), then stops reading, and the server must hold back.
    let readBudget = options & 2 != 0 ? 0 : 256 * 1024
    peer.peerWindow = 64 * 1024

    var output: [UInt8] = []
    for chunk in chunks(of: stream, sizes: chunkSizes(total: stream.count, seed: seed)) {
        peer.send(chunk)
        embedded.run(turns: 1)
        output += peer.takeWritten(max: max(0, readBudget - output.count))
    }
    embedded.run(turns: 2)
    output += peer.takeWritten()
    peer.peerCloses()
    embedded.run(turns: 2)
    output += peer.takeWritten()
    if peer.isClosingGracefully { peer.peerCloses() }  // the server closed too: the peer sees it and closes
    embedded.finish()

    if stream.first == UInt8(ascii: "{") {
        checkLines(output)
    } else {
        checkFrames(output, answering: stream)
    }
    return 0
}

/// Text mode: every line the server wrote is a JSON object.
func checkLines(_ output: [UInt8]) {
    check(output.isEmpty || output.last == UInt8(ascii: "\n"), "partial line at the end: \(hex(output.suffix(64)))")
    for line in output.split(separator: UInt8(ascii: "\n")) {
        guard case .map? = try? JSONText.parse(line) else { return check(false, "not a JSON object: \(hex(line))") }
    }
}

/// Binary mode: the output is whole frames the server may send, answers match requests.
func checkFrames(_ output: [UInt8], answering stream: [UInt8]) {
    let frames = decodeAll(output, maxFrame: 1 << 30)
    check(frames.left == 0 && !frames.failed, "output is not whole frames: \(hex(output.suffix(64)))")
    let serverKinds: Set<Frame.Kind> = [.welcome, .message, .reply, .ping, .pong, .error, .goAway, .cancel]
    var answers: [UInt32: Int] = [:]
    for (index, frame) in frames.frames.enumerated() {
        check(serverKinds.contains(frame.kind), "the server sent a \(frame.kind) frame")
        if frame.kind == .error, let code = errorCode(frame), closingCodes.contains(code) {
            check(index == frames.frames.count - 1, "\(frames.frames.count - index - 1) frames after ERROR \(code)")
            continue
        }
        if frame.id != 0, [.reply, .error, .welcome, .pong].contains(frame.kind) { answers[frame.id, default: 0] += 1 }
    }
    var requests: [UInt32: Int] = [:]
    for id in decodeAll(stream, maxFrame: maxFrame).ids { requests[id, default: 0] += 1 }
    for (id, count) in answers {
        check(count <= requests[id] ?? 0, "\(count) answers with id \(id) to \(requests[id] ?? 0) frames with it")
    }
}

/// Codes after which the server closes the connection (wire-v1, Errors).
let closingCodes: Set<String> = ["malformed_frame", "frame_too_large", "unauthorized", "bad_hello",
                                 "unsupported_version", "slow_consumer"]

func errorCode(_ frame: Frame) -> String? {
    guard let payload = frame.payload, case .string(let code)? = (try? JSONText.parse(payload))?["code"] else { return nil }
    return code
}

/// Frames in `bytes` up to the first fatal error, and the ids of all frames read (rejected ones too).
func decodeAll(_ bytes: [UInt8], maxFrame: UInt32) -> (frames: [Frame], ids: [UInt32], left: Int, failed: Bool) {
    var decoder = FrameDecoder(maxFrame: maxFrame)
    var buffer = InboundBuffer()
    buffer.append(bytes)
    var frames: [Frame] = []
    var ids: [UInt32] = []
    while true {
        do {
            switch try decoder.next(from: &buffer) {
            case .frame(let frame)?: frames.append(frame); ids.append(frame.id)
            case .rejected(_, let id)?: ids.append(id)
            case nil: return (frames, ids, buffer.readableBytes, false)
            }
        } catch {
            return (frames, ids, buffer.readableBytes, true)
        }
    }
}
