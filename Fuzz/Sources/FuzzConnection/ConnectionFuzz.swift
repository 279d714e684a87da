import FuzzSupport
import SwitchboardCodec
import SwitchboardPlugins
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

// Input: one byte seeding the chunk sizes, one byte of options, then what a client sends.
//   options bit 0: the server requires the token "t" (HELLO payload {"token":"t"}).
//   options bit 2: every plugin of `--config` is loaded, set so that none changes an answer (the user
//                  of token "t" and anonymous connections may do anything, the rate limit is never
//                  reached, the alias renames a channel nobody serves to another): the pipeline must be
//                  invisible, so the same exact answers are checked.
//   options bit 1: backpressure: the peer reads nothing until it has sent everything, its socket
//                  buffers nothing (every unread byte is queued in the server), and the server's
//                  outbound limit is 4 KiB instead of 16 KiB, so that plain floods of requests reach it.
//
// A fresh server with the demo channels gets the bytes over an in-memory transport, one loop turn per
// chunk; then the peer reads everything (input the server held back under backpressure goes in as the
// output drains), closes its side, and closes fully once the server has. Besides not crashing:
// - after every loop turn, what the server holds for the peer stays within `heldBound`;
// - what the server wrote is well formed. Binary mode (first byte not `{`): whole frames of server
//   kinds, at most one answer per client frame with that id, nothing after an ERROR that closes the
//   connection, and, once every byte sent has reached the server (and no slow_consumer), exactly the
//   answers and the closing ERROR that `expectedAnswers` derives from the input. Text mode: JSON
//   object lines.

let maxFrame: UInt32 = 2048

/// Plugins that change no answer (options bit 2).
let invisiblePlugins = PluginConfiguration(
    aliases: ["fuzz/old": "fuzz/new"],
    access: AccessRules(  // the user's token is "t"; anonymous connections have every right
        users: [.init(name: "t", tokenSha256: "e3b98a4da31a127d4bde6e43033f66ba274cab0eb7eb1c70ec41402bf6273dd8")],
        anonymous: .init()),
    rateLimits: [RateLimitRule(channels: ["*"], perConnection: .init(rate: 1e12, burst: 1e12))],
    requestLog: RequestLogSettings(sampleOneIn: 1, level: "trace"))

/// The most the server may hold for its peer: bytes queued in the transport (past the peer's window).
/// Connection.swift reads a frame or line only while its output not yet handed to the transport plus the
/// transport's queue is below the outbound limit (`processInput`: `outbound.count < outboundRoom`),
/// pauses reading once at or over it (`isOverOutboundLimit`), and writes an event only below it
/// (`EventStream.deliver` and `pump`; ends of stream are exempt and tiny), so the limit is crossed only
/// by the output of one step taken below it:
/// - one input frame or line: its answer, at most about 4 bytes per input byte (echo.json re-serializes
///   `1e15,` as `1000000000000000.0,`; a text room post of n bytes is an event of up to 4n: `255,`), or
///   for `switchboard/stats` up to ~700 bytes; plus, for a room post, the event to this connection's
///   own room listener (as long as the post, up to 4 times that in text mode);
/// - or one event, pumped from a stream's queue or emitted by the ticker (as long as the post it
///   carries, or tiny).
/// So with F the longest frame or line in the input (at most maxFrame + 4): limit + 5 F + 1 KiB. A
/// channel the connection holds itself (REGISTER) lets one step answer many requests at once (its
/// forwarded requests all get `handler_gone` when it unregisters, its waiting listens all get the
/// answer to the first one): then each input byte may add up to 8 more. Output still in the
/// connection's own buffer at the end of a turn (past 8 flush rounds) is not visible here.
func heldBound(_ stream: [UInt8], outboundLimit: Int) -> Int {
    var longest = 0
    var holds = false
    if stream.first == UInt8(ascii: "{") {
        var start = 0
        for (index, byte) in stream.enumerated() where byte == UInt8(ascii: "\n") {
            longest = max(longest, index + 1 - start)
            start = index + 1
        }
        longest = min(max(longest, stream.count - start), Int(maxFrame) + 1)  // a longer line gets a short error
    } else {
        var offset = 0
        while offset + 4 <= stream.count {
            let length = (offset..<offset + 4).reduce(0) { $0 << 8 | Int(stream[$1]) }
            guard length >= 8, length <= Int(maxFrame), offset + 4 + length <= stream.count else { break }
            longest = max(longest, 4 + length)
            if stream[offset + 4] == Frame.Kind.register.rawValue { holds = true }
            offset += 4 + length
        }
    }
    return outboundLimit + 5 * longest + 1024 + (holds ? 8 * stream.count : 0)
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    var input = FuzzInput(start, count)
    let seed = input.takeByte()
    let options = input.takeByte()
    let stream = input.rest

    let backpressure = options & 2 != 0
    var configuration = ServerConfiguration()
    configuration.maxFrame = maxFrame
    configuration.outboundLimit = backpressure ? 4 * 1024 : 16 * 1024
    if options & 1 != 0 { configuration.token = "t" }
    let plugins = options & 4 != 0 ? PluginConfiguration.plugins(reading: LiveSettings(invisiblePlugins)) : []
    guard let embedded = try? EmbeddedServer(configuration: configuration, plugins: plugins) else { fatalError("no server") }
    let peer = embedded.connect(name: "fuzz")
    // The peer reads at most readBudget bytes while it sends (an endless ticker stream would otherwise
    // keep every loop turn busy), then stops reading, and the server must hold back.
    let readBudget = backpressure ? 0 : 256 * 1024
    peer.peerWindow = backpressure ? 0 : 64 * 1024
    let bound = heldBound(stream, outboundLimit: configuration.outboundLimit)

    /// One loop turn, after which the server holds no more than `bound` for the peer.
    func turn() {
        embedded.run(turns: 1)
        check(peer.queuedBytes <= bound, "the server holds \(peer.queuedBytes) bytes for the peer, bound \(bound)")
    }

    var output: [UInt8] = []
    for chunk in chunks(of: stream, sizes: chunkSizes(total: stream.count, seed: seed)) {
        peer.send(chunk)
        turn()
        output += peer.takeWritten(max: max(0, readBudget - output.count))
    }
    // The peer reads everything; input held back while the server was over its limit goes in as the
    // output drains. Settled: every byte sent has reached the server, or the server is closing.
    var settled = false
    for _ in 0..<256 {
        turn()
        output += peer.takeWritten()
        if peer.isClosed || peer.isClosingGracefully || (!peer.isReadingPaused && !peer.deliverWaitingInput()) {
            settled = true
            break
        }
    }
    turn()
    output += peer.takeWritten()
    peer.peerCloses()
    turn()
    turn()
    output += peer.takeWritten()
    if peer.isClosingGracefully { peer.peerCloses() }  // the server closed too: the peer sees it and closes
    embedded.finish()

    if stream.first == UInt8(ascii: "{") {
        checkLines(output)
    } else if let first = stream.first, startsAWord(first) {
        checkTypedWord(output)
    } else {
        checkFrames(output, answering: stream, token: configuration.token, exact: settled)
    }
    return 0
}

/// A letter other than `G` (HTTP) as the first byte: a person typing a word, not a frame.
func startsAWord(_ byte: UInt8) -> Bool {
    byte != UInt8(ascii: "G") && (UInt8(ascii: "A")...UInt8(ascii: "Z") ~= byte || UInt8(ascii: "a")...UInt8(ascii: "z") ~= byte)
}

/// A typed word: the ERROR `frame_too_large` wire-v1 promises for that length, then one plain line for
/// the person, and nothing else.
func checkTypedWord(_ output: [UInt8]) {
    guard output.count >= 4 else { return check(false, "no ERROR first: \(hex(output))") }
    let frameEnd = min(output.count, 4 + output.prefix(4).reduce(0) { $0 << 8 | Int($1) })
    let frames = decodeAll(Array(output.prefix(frameEnd)), maxFrame: 1 << 30)
    guard let error = frames.frames.first, frames.frames.count == 1, frames.left == 0 else {
        return check(false, "no ERROR first: \(hex(output.prefix(64)))")
    }
    check(error.kind == .error && errorCode(error) == "frame_too_large", "the first frame is not frame_too_large")
    let rest = output.dropFirst(frameEnd)
    check(rest.starts(with: Array("\nswitchboard: ".utf8)) && rest.last == UInt8(ascii: "\n")
              && rest.dropFirst().dropLast().allSatisfy { $0 != UInt8(ascii: "\n") },
          "not one plain line after the ERROR: \(hex(rest.prefix(64)))")
}

/// Text mode: every line the server wrote is a JSON object.
func checkLines(_ output: [UInt8]) {
    check(output.isEmpty || output.last == UInt8(ascii: "\n"), "partial line at the end: \(hex(output.suffix(64)))")
    for line in output.split(separator: UInt8(ascii: "\n")) {
        guard case .map? = try? JSONText.parse(line) else { return check(false, "not a JSON object: \(hex(line))") }
    }
}

/// Binary mode: the output is whole frames the server may send, answers match requests; with `exact`
/// (every byte sent reached the server), the answers are exactly those `expectedAnswers` predicts.
func checkFrames(_ output: [UInt8], answering stream: [UInt8], token: String?, exact: Bool) {
    let frames = decodeAll(output, maxFrame: 1 << 30)
    check(frames.left == 0 && !frames.failed, "output is not whole frames: \(hex(output.suffix(64)))")
    let serverKinds: Set<Frame.Kind> = [.welcome, .message, .reply, .ping, .pong, .error, .goAway, .cancel, .position, .end]
    var answers: [UInt32: Int] = [:]
    var closing: (code: String, id: UInt32)?
    for (index, frame) in frames.frames.enumerated() {
        check(serverKinds.contains(frame.kind), "the server sent a \(frame.kind) frame")
        if frame.kind == .error, let code = errorCode(frame), closingCodes.contains(code) {
            check(index == frames.frames.count - 1, "\(frames.frames.count - index - 1) frames after ERROR \(code)")
            closing = (code, frame.id)
            continue
        }
        if frame.id != 0, [.reply, .error, .welcome, .pong].contains(frame.kind) { answers[frame.id, default: 0] += 1 }
    }
    var requests: [UInt32: Int] = [:]
    for id in decodeAll(stream, maxFrame: maxFrame).ids { requests[id, default: 0] += 1 }
    for (id, count) in answers {
        check(count <= requests[id] ?? 0, "\(count) answers with id \(id) to \(requests[id] ?? 0) frames with it")
    }

    // A slow_consumer close depends on the clock (the grace period), not on the input.
    guard exact, closing?.code != "slow_consumer", let expected = expectedAnswers(stream, token: token) else { return }
    if let want = expected.closing {
        check(closing.map { $0.code == want.code && want.ids.contains($0.id) } ?? false,
              "closing ERROR \(closing.map { "\($0.code) id \($0.id)" } ?? "none"), expected \(want.code) id \(want.ids)")
    } else {
        check(closing == nil, "closing ERROR \(closing!.code) id \(closing!.id), expected none")
    }
    for id in Set(answers.keys).union(expected.answers.keys) where !expected.unpredictable.contains(id) {
        let got = answers[id] ?? 0, want = expected.answers[id] ?? 0
        check(got == want, "\(got) answers with id \(id), expected \(want)")
    }
}

/// What the server must answer to a binary stream, derived from the stream alone (wire.md "Ids and
/// answers", "Errors"); the demo channels answer at once, so no request stays pending. Per id != 0, in
/// the frames read before the one that closes the connection:
/// - one answer per HELLO (WELCOME), PING (PONG), MESSAGE, REGISTER, UNREGISTER (REPLY or ERROR), per
///   frame rejected by the decoder or a server-only kind (`bad_frame`, `bad_channel`), per DEMAND with
///   a bad payload (`bad_frame`); none for PONG, REPLY, CANCEL, a good DEMAND.
/// - a MESSAGE to a channel this connection may hold (it sent a REGISTER for the name) is forwarded to
///   itself and may stay pending: its id is unpredictable from then on (its answer depends on a REPLY,
///   CANCEL or UNREGISTER, and a later MESSAGE with that id may get `duplicate_id` instead).
/// The closing frame gets the closing ERROR (not counted in `answers`): `malformed_frame` (id 0, or the
/// header's id when its 12 bytes had arrived: it depends on the chunking), `frame_too_large` (id 0),
/// `unauthorized` for a frame other than HELLO or PING before a good HELLO when a token is required, and
/// `bad_hello`, `unsupported_version` or `unauthorized` for a HELLO.
/// Nil when the first frame is an accepted HELLO that names a `session` (protocol/resumption.md): what
/// follows depends on the session (POSITION and END, its END on overflow), which this model leaves out.
func expectedAnswers(_ stream: [UInt8], token: String?) -> (answers: [UInt32: Int], unpredictable: Set<UInt32>,
                                                            closing: (code: String, ids: [UInt32])?)? {
    var answers: [UInt32: Int] = [:]
    var unpredictable: Set<UInt32> = []
    var mayBeHeld: Set<String> = []
    var isAuthenticated = token == nil
    var isFirstFrame = true
    func answer(_ id: UInt32) { if id != 0 { answers[id, default: 0] += 1 } }

    var decoder = FrameDecoder(maxFrame: maxFrame)
    var buffer = InboundBuffer()
    buffer.append(stream)
    while true {
        let decoded: FrameDecoder.Decoded
        do {
            guard let next = try decoder.next(from: &buffer) else { return (answers, unpredictable, nil) }
            decoded = next
        } catch {
            let ids: [UInt32] = if case .malformedFrame = error, buffer.readableBytes >= 12 {
                [0, (8..<12).reduce(0) { $0 << 8 | UInt32(buffer.byte(at: $1)) }]
            } else {
                [0]
            }
            return (answers, unpredictable, (error.code, ids))
        }
        let isFirst = isFirstFrame  // the one frame whose HELLO may ask for a session
        isFirstFrame = false
        guard case .frame(let frame) = decoded else {
            if case .rejected(_, let id) = decoded { answer(id) }
            continue
        }
        if frame.kind.isServerOnly {
            answer(frame.id)
            continue
        }
        if !isAuthenticated, frame.kind != .hello, frame.kind != .ping {
            return (answers, unpredictable, ("unauthorized", [frame.id]))
        }
        switch frame.kind {
        case .hello:
            if let code = helloRefusal(frame.payload, token: token) { return (answers, unpredictable, (code, [frame.id])) }
            if isFirst, let payload = frame.payload, (try? JSONText.parse(payload))?["session"] != nil { return nil }
            isAuthenticated = true
            answer(frame.id)
        case .ping, .register, .unregister:
            answer(frame.id)
            if frame.kind == .register, !demoChannels.contains(frame.channel) { mayBeHeld.insert(frame.channel) }
        case .message:
            if frame.id == 0 { break }
            if mayBeHeld.contains(frame.channel) || unpredictable.contains(frame.id) {
                unpredictable.insert(frame.id)
            } else {
                answer(frame.id)
            }
        case .position, .end:  // without a session: unknown types, bad_frame
            answer(frame.id)
        case .demand:
            let credit = frame.payload.map { $0.reduce(UInt32(0)) { $0 << 8 | UInt32($1) } }
            if frame.payload?.count != 4 || credit == 0 { answer(frame.id) }
        case .pong, .reply, .cancel, .welcome, .error, .goAway:
            break
        }
    }
}

/// The closing ERROR code a HELLO gets, nil if it is accepted (Connection.handleHello).
func helloRefusal(_ payload: [UInt8]?, token: String?) -> String? {
    var hello: ChannelValue = .map([])
    if let payload, !payload.isEmpty {
        guard let parsed = try? JSONText.parse(payload), case .map = parsed else { return "bad_hello" }
        hello = parsed
    }
    if let version = hello["version"] {
        switch version {
        case .int32(1), .int64(1): break
        case .float64(let d) where d == 1: break
        default: return "unsupported_version"
        }
    }
    if let token, hello["token"] != .string(token) { return "unauthorized" }
    return nil
}

/// The demo channels (protocol/demo-channels.md): a REGISTER of one of them gets `channel_taken`.
let demoChannels: Set<String> = ["switchboard/echo", "switchboard/echo.json", "switchboard/message",
                                 "switchboard/message.string", "switchboard/message.binary", "switchboard/ticker",
                                 "switchboard/room", "switchboard/room.post", "switchboard/stats"]

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
