import SwitchboardCodec
import SwitchboardWire

/// The server a workload talks to. Every target is driven by the same client code through an adapter.
enum BenchTarget: String, CaseIterable {
    case switchboard, redis, nats
}

// MARK: - Request/reply adapters

/// Speaks one server's request/reply protocol for the `rpc` workload. Replies come back in order on each
/// connection for every target used here, so latency is measured against a FIFO of send times.
protocol RPCAdapter: AnyObject {
    /// Bytes sent right after connecting.
    var handshake: [UInt8] { get }
    /// Consumes the handshake's answer; true once requests may flow.
    func isReady(_ buffer: inout InboundBuffer) -> Bool
    /// Appends one request.
    func appendRequest(to out: inout [UInt8])
    /// Consumes complete replies; nil on a protocol error.
    func takeReplies(_ buffer: inout InboundBuffer) -> Int?
    /// Appends what acknowledges the replies taken so far, if anything is due at `now` (a session's POSITION).
    func appendAcknowledgement(to out: inout [UInt8], now: UInt64)
    /// What goes before the close at the end of a run (a session's END).
    var farewell: [UInt8] { get }
}

extension RPCAdapter {
    func appendAcknowledgement(to out: inout [UInt8], now: UInt64) {}
    var farewell: [UInt8] { [] }
}

/// Switchboard: `echo` of a Uint8List on `switchboard/echo`, or a raw payload on a client-held channel
/// (`relay`: caller → server → holder → server → caller); with `session`, in a resumable session.
final class SwitchboardRPC: RPCAdapter {
    private let template: [UInt8]
    private var nextID: UInt32 = 0
    private var acknowledger: SessionAcknowledger?

    init(size: Int, relayChannel: String?, session: Bool = false) throws {
        acknowledger = session ? SessionAcknowledger() : nil
        var frame: [UInt8] = []
        if let relayChannel {
            Frame.write(.message, id: 0, channel: relayChannel, payload: [UInt8](repeating: 0x5A, count: size), to: &frame)
        } else {
            let call = MethodCall(method: "echo", arguments: .uint8List([UInt8](repeating: 0x5A, count: size)))
            Frame.write(.message, id: 0, channel: "switchboard/echo", payload: try StandardMethodCodec().encodeMethodCall(call), to: &frame)
        }
        template = frame
    }

    var handshake: [UInt8] { Frame(.hello, id: 0x7FFF_FFFF, payload: acknowledger == nil ? nil : SessionAcknowledger.helloPayload).bytes }

    func isReady(_ buffer: inout InboundBuffer) -> Bool {
        var welcomed = false
        _ = scanFrames(&buffer) { bytes, frame in
            if frame.type == Frame.Kind.welcome.rawValue {
                welcomed = true
                acknowledger?.welcome(bytes[frame.payload])
            }
        }
        return welcomed
    }

    func appendRequest(to out: inout [UInt8]) {
        nextID = nextID == 0x7FFF_FFFE ? 1 : nextID + 1
        let start = out.count
        out.append(contentsOf: template)
        for i in 0..<4 { out[start + 8 + i] = UInt8(truncatingIfNeeded: nextID >> (24 - 8 * i)) }
    }

    func takeReplies(_ buffer: inout InboundBuffer) -> Int? {
        var count = 0, bad = false
        let ok = scanFrames(&buffer) { _, frame in
            if acknowledger?.count(frame) == false {  // a POSITION; an END would be the session's end: an error
                bad = bad || frame.type == Frame.Kind.end.rawValue
                return
            }
            if frame.type == Frame.Kind.reply.rawValue, !frame.isNull { count += 1 } else { bad = true }
        }
        return ok && !bad ? count : nil
    }

    func appendAcknowledgement(to out: inout [UInt8], now: UInt64) {
        acknowledger?.appendPosition(to: &out, now: now)
    }

    var farewell: [UInt8] { acknowledger == nil ? [] : SessionAcknowledger.end }
}

/// Redis: pipelined `ECHO` with an S-byte argument (RESP2).
final class RedisRPC: RPCAdapter {
    private let request: [UInt8]
    private let replyLength: Int

    init(size: Int) {
        request = Array("*2\r\n$4\r\nECHO\r\n$\(size)\r\n".utf8) + [UInt8](repeating: 0x5A, count: size) + Array("\r\n".utf8)
        replyLength = "$\(size)\r\n".utf8.count + size + 2
    }

    var handshake: [UInt8] { Array("PING\r\n".utf8) }

    func isReady(_ buffer: inout InboundBuffer) -> Bool {
        guard buffer.readableBytes >= 7 else { return false }
        buffer.consume(7)  // +PONG\r\n
        return true
    }

    func appendRequest(to out: inout [UInt8]) { out.append(contentsOf: request) }

    func takeReplies(_ buffer: inout InboundBuffer) -> Int? {
        let count = buffer.readableBytes / replyLength
        guard count > 0 else { return 0 }
        guard buffer.byte(at: 0) == UInt8(ascii: "$") else { return nil }
        buffer.consume(count * replyLength)
        return count
    }
}

/// NATS: request/reply through a responder connection (see ``NATSResponder``): PUB with a reply inbox,
/// the answer arrives as MSG on the inbox.
final class NATSRPC: RPCAdapter {
    private let request: [UInt8]
    private var lines = NATSLines()

    init(size: Int, inbox: String) {
        request = Array("PUB bench.echo \(inbox) \(size)\r\n".utf8) + [UInt8](repeating: 0x5A, count: size) + Array("\r\n".utf8)
        handshake = Array("CONNECT {\"verbose\":false,\"pedantic\":false}\r\nSUB \(inbox) 1\r\nPING\r\n".utf8)
    }

    let handshake: [UInt8]

    func isReady(_ buffer: inout InboundBuffer) -> Bool {
        var ready = false
        _ = lines.scan(&buffer) { verb, _, _ in if verb == "PONG" { ready = true } }
        return ready
    }

    func appendRequest(to out: inout [UInt8]) { out.append(contentsOf: request) }

    func takeReplies(_ buffer: inout InboundBuffer) -> Int? {
        var count = 0
        let ok = lines.scan(&buffer) { verb, _, _ in if verb == "MSG" { count += 1 } }
        return ok ? count : nil
    }
}

/// Splits the NATS text protocol: verb lines, and MSG lines followed by their payload.
struct NATSLines {
    /// Calls `body(verb, line, payload)` for each complete message; false on a protocol error.
    mutating func scan(_ buffer: inout InboundBuffer, _ body: (String, ArraySlice<UInt8>, ArraySlice<UInt8>) -> Void) -> Bool {
        var consumed = 0
        let bytes = buffer.readable
        var i = bytes.startIndex
        while let newline = bytes[i...].firstIndex(of: UInt8(ascii: "\n")) {
            let line = bytes[i..<newline]
            let verbEnd = line.firstIndex(of: UInt8(ascii: " ")) ?? (line.last == 13 ? newline - 1 : newline)
            let verb = String(decoding: line[line.startIndex..<verbEnd], as: UTF8.self)
            if verb == "MSG" {
                // MSG <subject> <sid> [reply-to] <#bytes>
                let fields = line.split(separator: UInt8(ascii: " "))
                guard let last = fields.last, let size = Int(String(decoding: last.filter { $0 != 13 }, as: UTF8.self)) else { return false }
                let payloadStart = newline + 1
                guard bytes.endIndex - payloadStart >= size + 2 else { break }
                body(verb, line, bytes[payloadStart..<(payloadStart + size)])
                i = payloadStart + size + 2
            } else {
                if verb == "-ERR" { return false }
                body(verb, line, bytes[i..<i])
                i = newline + 1
            }
            consumed = i - bytes.startIndex
        }
        buffer.consume(consumed)
        return true
    }
}

/// The connection that answers NATS requests: subscribed to `bench.echo`, it publishes every request's
/// payload to its reply subject.
final class NATSResponder {
    private var lines = NATSLines()
    let handshake = Array("CONNECT {\"verbose\":false,\"pedantic\":false}\r\nSUB bench.echo 1\r\nPING\r\n".utf8)

    /// Answers what arrived; returns whether the handshake PONG was seen.
    func respond(_ buffer: inout InboundBuffer, into out: inout [UInt8]) -> Bool {
        var ready = false
        _ = lines.scan(&buffer) { verb, line, payload in
            if verb == "PONG" { ready = true }
            guard verb == "MSG" else { return }
            let fields = line.split(separator: UInt8(ascii: " "))  // MSG subject sid reply-to size
            guard fields.count == 5 else { return }
            out.append(contentsOf: Array("PUB ".utf8))
            out.append(contentsOf: fields[3])
            out.append(contentsOf: Array(" \(payload.count)\r\n".utf8))
            out.append(contentsOf: payload)
            out.append(contentsOf: Array("\r\n".utf8))
        }
        return ready
    }
}

/// The Switchboard holder for `relay`: registers the channel, then echoes every forwarded request.
final class SwitchboardHolder {
    let channel: String
    init(channel: String) { self.channel = channel }

    var handshake: [UInt8] { Frame(.register, id: 1, channel: channel, payload: nil).bytes }

    /// Answers forwarded requests; returns whether the REGISTER was acknowledged.
    func respond(_ buffer: inout InboundBuffer, into out: inout [UInt8]) -> Bool {
        var registered = false
        _ = scanFrames(&buffer) { bytes, frame in
            if frame.type == Frame.Kind.reply.rawValue, frame.id == 1 { registered = true }
            guard frame.type == Frame.Kind.message.rawValue, frame.id != 0 else { return }
            Frame.write(.reply, id: frame.id, channel: "", payload: Array(bytes[frame.payload]), to: &out)
        }
        return registered
    }
}

// MARK: - Fan-out adapters

/// Speaks one server's pub/sub for the `fanout` workload, on one connection (listener or publisher).
protocol FanoutAdapter: AnyObject {
    /// What a listener sends to subscribe.
    var listenHandshake: [UInt8] { get }
    /// What the publisher sends first.
    var publisherHandshake: [UInt8] { get }
    /// Consumes the handshake's answer; true once ready.
    func isReady(_ buffer: inout InboundBuffer) -> Bool
    /// Calls `body` with the posted bytes of every complete delivery; false on a protocol error.
    func deliveries(_ buffer: inout InboundBuffer, _ body: (ArraySlice<UInt8>) -> Void) -> Bool
    /// Appends one post (with whatever makes the server acknowledge it).
    func appendPost(_ payload: [UInt8], to out: inout [UInt8])
    /// Consumes acknowledgements of posts; nil on a protocol error.
    func acknowledgements(_ buffer: inout InboundBuffer) -> Int?
    /// Appends what acknowledges what was received so far, if anything is due at `now` (a session's POSITION).
    func appendAcknowledgement(to out: inout [UInt8], now: UInt64)
    /// What goes before the close at the end of a run (a session's END).
    var farewell: [UInt8] { get }
}

extension FanoutAdapter {
    func appendAcknowledgement(to out: inout [UInt8], now: UInt64) {}
    var farewell: [UInt8] { [] }
}

func makeFanoutAdapter(_ target: BenchTarget, session: Bool = false) -> any FanoutAdapter {
    switch target {
    case .switchboard: SwitchboardFanout(session: session)
    case .redis: RedisFanout()
    case .nats: NATSFanout()
    }
}

/// Switchboard: listen on `switchboard/room`, post to `switchboard/room.post` (acknowledged by its reply);
/// with `session`, each connection in a resumable session (a listener's HELLO goes before its listen, and
/// it is ready at the WELCOME: the listen's REPLY may come with the first events).
final class SwitchboardFanout: FanoutAdapter {
    private var nextID: UInt32 = 0
    private var acknowledger: SessionAcknowledger?
    let listenHandshake: [UInt8]
    let publisherHandshake: [UInt8]

    init(session: Bool) {
        acknowledger = session ? SessionAcknowledger() : nil
        let listen = (try? Frame.call(id: 1, channel: "switchboard/room", method: "listen")) ?? []
        let hello = Frame(.hello, id: 0x7FFF_FFFF, payload: session ? SessionAcknowledger.helloPayload : nil).bytes
        listenHandshake = session ? hello + listen : listen
        publisherHandshake = hello
    }

    func isReady(_ buffer: inout InboundBuffer) -> Bool {
        var ready = false
        _ = scanFrames(&buffer) { bytes, frame in
            if frame.type == Frame.Kind.welcome.rawValue {
                acknowledger?.welcome(bytes[frame.payload])
            } else {
                _ = acknowledger?.count(frame)
            }
            if frame.type == Frame.Kind.reply.rawValue || frame.type == Frame.Kind.welcome.rawValue { ready = true }
        }
        return ready
    }

    func deliveries(_ buffer: inout InboundBuffer, _ body: (ArraySlice<UInt8>) -> Void) -> Bool {
        var ok = true
        let framesOK = scanFrames(&buffer) { bytes, frame in
            if let counted = acknowledger?.count(frame) {  // a session: skip POSITION, and the listen's REPLY
                guard counted else { ok = ok && frame.type != Frame.Kind.end.rawValue; return }
                guard frame.type != Frame.Kind.reply.rawValue || frame.id != 1 else { return }
            }
            // A success envelope holding a Uint8List: 00 08 size(1, 3 or 5 bytes) bytes…
            let p = frame.payload
            guard frame.type == Frame.Kind.message.rawValue, p.count >= 3, bytes[p.lowerBound] == 0, bytes[p.lowerBound + 1] == 8 else {
                ok = false
                return
            }
            let sizeBytes = bytes[p.lowerBound + 2] == 254 ? 3 : bytes[p.lowerBound + 2] == 255 ? 5 : 1
            body(bytes[(p.lowerBound + 2 + sizeBytes)..<p.upperBound])
        }
        return ok && framesOK
    }

    func appendPost(_ payload: [UInt8], to out: inout [UInt8]) {
        nextID = nextID == 0x7FFF_FFFE ? 1 : nextID + 1
        Frame.write(.message, id: nextID, channel: "switchboard/room.post", payload: payload, to: &out)
    }

    func acknowledgements(_ buffer: inout InboundBuffer) -> Int? {
        var count = 0, bad = false
        let ok = scanFrames(&buffer) { _, frame in
            if acknowledger?.count(frame) == false {  // a POSITION; an END would be the session's end: an error
                bad = bad || frame.type == Frame.Kind.end.rawValue
                return
            }
            if frame.type == Frame.Kind.reply.rawValue { count += 1 } else { bad = true }
        }
        return ok && !bad ? count : nil
    }

    func appendAcknowledgement(to out: inout [UInt8], now: UInt64) {
        acknowledger?.appendPosition(to: &out, now: now)
    }

    var farewell: [UInt8] { acknowledger == nil ? [] : SessionAcknowledger.end }
}

/// Redis: SUBSCRIBE room / PUBLISH room (acknowledged by its integer reply).
final class RedisFanout: FanoutAdapter {
    let listenHandshake = Array("SUBSCRIBE room\r\n".utf8)
    let publisherHandshake = Array("PING\r\n".utf8)
    private var isListener = false

    func isReady(_ buffer: inout InboundBuffer) -> Bool {
        let confirmation = "*3\r\n$9\r\nsubscribe\r\n$4\r\nroom\r\n:1\r\n".utf8.count
        if buffer.readableBytes >= 7, buffer.byte(at: 0) == UInt8(ascii: "+") { buffer.consume(7); return true }
        guard buffer.readableBytes >= confirmation else { return false }
        buffer.consume(confirmation)
        isListener = true
        return true
    }

    func deliveries(_ buffer: inout InboundBuffer, _ body: (ArraySlice<UInt8>) -> Void) -> Bool {
        // *3\r\n$7\r\nmessage\r\n$4\r\nroom\r\n$<size>\r\n<payload>\r\n
        let prefix = "*3\r\n$7\r\nmessage\r\n$4\r\nroom\r\n$".utf8.count
        var consumed = 0
        let bytes = buffer.readable
        var i = bytes.startIndex
        while bytes.endIndex - i > prefix {
            guard bytes[i] == UInt8(ascii: "*") else { return false }
            guard let sizeEnd = bytes[(i + prefix)...].firstIndex(of: 13) else { break }
            guard let size = Int(String(decoding: bytes[(i + prefix)..<sizeEnd], as: UTF8.self)) else { return false }
            let start = sizeEnd + 2
            guard bytes.endIndex - start >= size + 2 else { break }
            body(bytes[start..<(start + size)])
            i = start + size + 2
            consumed = i - bytes.startIndex
        }
        buffer.consume(consumed)
        return true
    }

    func appendPost(_ payload: [UInt8], to out: inout [UInt8]) {
        out.append(contentsOf: Array("*3\r\n$7\r\nPUBLISH\r\n$4\r\nroom\r\n$\(payload.count)\r\n".utf8))
        out.append(contentsOf: payload)
        out.append(contentsOf: [13, 10])
    }

    func acknowledgements(_ buffer: inout InboundBuffer) -> Int? {
        var count = 0, consumed = 0
        let bytes = buffer.readable
        var i = bytes.startIndex
        while let newline = bytes[i...].firstIndex(of: 10) {
            guard bytes[i] == UInt8(ascii: ":") else { return nil }
            count += 1
            i = newline + 1
            consumed = i - bytes.startIndex
        }
        buffer.consume(consumed)
        return count
    }
}

/// NATS: SUB room / PUB room, each post followed by a PING whose PONG acknowledges it.
final class NATSFanout: FanoutAdapter {
    private var lines = NATSLines()
    let listenHandshake = Array("CONNECT {\"verbose\":false,\"pedantic\":false}\r\nSUB room 1\r\nPING\r\n".utf8)
    let publisherHandshake = Array("CONNECT {\"verbose\":false,\"pedantic\":false}\r\nPING\r\n".utf8)

    func isReady(_ buffer: inout InboundBuffer) -> Bool {
        var ready = false
        _ = lines.scan(&buffer) { verb, _, _ in if verb == "PONG" { ready = true } }
        return ready
    }

    func deliveries(_ buffer: inout InboundBuffer, _ body: (ArraySlice<UInt8>) -> Void) -> Bool {
        lines.scan(&buffer) { verb, _, payload in if verb == "MSG" { body(payload) } }
    }

    func appendPost(_ payload: [UInt8], to out: inout [UInt8]) {
        out.append(contentsOf: Array("PUB room \(payload.count)\r\n".utf8))
        out.append(contentsOf: payload)
        out.append(contentsOf: Array("\r\nPING\r\n".utf8))
    }

    func acknowledgements(_ buffer: inout InboundBuffer) -> Int? {
        var count = 0
        let ok = lines.scan(&buffer) { verb, _, _ in if verb == "PONG" { count += 1 } }
        return ok ? count : nil
    }
}

extension Frame {
    /// A StandardMethodCodec call frame's bytes.
    static func call(id: UInt32, channel: String, method: String, arguments: ChannelValue = .null) throws -> [UInt8] {
        Frame(.message, id: id, channel: channel,
              payload: try StandardMethodCodec().encodeMethodCall(MethodCall(method: method, arguments: arguments))).bytes
    }
}

/// A handshake that proves the server has set a connection up (a PING answered, or HELLO/CONNECT).
func greeting(_ target: BenchTarget, index: Int) -> any RPCAdapter {
    switch target {
    case .switchboard: (try? SwitchboardRPC(size: 0, relayChannel: nil))!
    case .redis: RedisRPC(size: 0)
    case .nats: NATSRPC(size: 0, inbox: "_INBOX.greeting.\(index)")
    }
}
