/// The NATS client protocol, as bytes: what a client writes (``NATSCommand``) and an incremental parser
/// for what a server sends (``NATSParser``). No I/O here; ``NATSBus`` drives it on a loop.
/// Reference: https://docs.nats.io/reference/reference-protocols/nats-protocol

/// A message delivered by the bus (a NATS `MSG` or `HMSG`).
public struct BusMessage: Sendable, Equatable {
    public var subject: String
    /// Where a request wants its reply.
    public var replyTo: String?
    /// The status code of a header block's first line (`NATS/1.0 503` for "no responders"), if any.
    public var status: Int?
    /// Header fields, in order (empty without a header block).
    public var headers: [Header]
    public var payload: [UInt8]

    public struct Header: Sendable, Equatable {
        public var name: String
        public var value: String

        public init(_ name: String, _ value: String) {
            self.name = name
            self.value = value
        }
    }

    public init(subject: String, replyTo: String? = nil, status: Int? = nil, headers: [Header] = [], payload: [UInt8]) {
        self.subject = subject
        self.replyTo = replyTo
        self.status = status
        self.headers = headers
        self.payload = payload
    }

    /// The first value of header `name`.
    public func header(_ name: String) -> String? { headers.first { $0.name == name }?.value }
}

/// What a NATS server sends.
enum NATSInbound: Equatable {
    /// `INFO {json}`: the server's description (its JSON text).
    case info(String)
    /// `MSG` or `HMSG`, for subscription `sid`.
    case message(sid: UInt64, BusMessage)
    case ping
    case pong
    case ok
    /// `-ERR 'text'`.
    case error(String)
}

/// The server sent something that is not the NATS protocol, or more than the limits allow: the
/// connection cannot go on.
struct NATSProtocolError: Error, Equatable, CustomStringConvertible {
    let description: String
}

/// What a client writes.
enum NATSCommand {
    /// `CONNECT {json}`.
    static func connect(name: String, echo: Bool = true) -> [UInt8] {
        let options = #"{"verbose":false,"pedantic":false,"lang":"swift","version":"1","protocol":1,"#
            + #""headers":true,"no_responders":true,"echo":\#(echo),"name":"\#(jsonEscaped(name))"}"#
        return Array("CONNECT \(options)\r\n".utf8)
    }

    static let ping = Array("PING\r\n".utf8)
    static let pong = Array("PONG\r\n".utf8)

    /// `PUB`, or `HPUB` when there are headers.
    static func publish(_ subject: String, replyTo: String?, headers: [BusMessage.Header], payload: [UInt8], into out: inout [UInt8]) {
        let reply = replyTo.map { " \($0)" } ?? ""
        if headers.isEmpty {
            out += Array("PUB \(subject)\(reply) \(payload.count)\r\n".utf8)
        } else {
            var block = Array("NATS/1.0\r\n".utf8)
            for header in headers { block += Array("\(header.name): \(header.value)\r\n".utf8) }
            block += [13, 10]
            out += Array("HPUB \(subject)\(reply) \(block.count) \(block.count + payload.count)\r\n".utf8)
            out += block
        }
        out += payload
        out += [13, 10]
    }

    /// `SUB subject [queue] sid`.
    static func subscribe(_ subject: String, queue: String?, sid: UInt64) -> [UInt8] {
        Array("SUB \(subject)\(queue.map { " \($0)" } ?? "") \(sid)\r\n".utf8)
    }

    /// `UNSUB sid`.
    static func unsubscribe(sid: UInt64) -> [UInt8] { Array("UNSUB \(sid)\r\n".utf8) }

    private static func jsonEscaped(_ text: String) -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case _ where scalar.value < 0x20: out += "?"
            default: out.unicodeScalars.append(scalar)
            }
        }
        return out
    }

    /// Whether `header` can be sent as one: a name of HTTP token characters, a value without control
    /// characters (so without CR or LF).
    static func isValidHeader(_ header: BusMessage.Header) -> Bool {
        !header.name.isEmpty
            && header.name.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F && !Array(#"()<>@,;:\"/[]?={}"#.utf8).contains($0) }
            && !header.value.utf8.contains { ($0 < 0x20 && $0 != 0x09) || $0 == 0x7F }
    }

    /// Whether `subject` can be sent as one: not empty, no whitespace or control characters, no empty
    /// token (NATS separates tokens with `.`).
    static func isValidSubject(_ subject: String) -> Bool {
        !subject.isEmpty && !subject.utf8.contains { $0 <= 0x20 || $0 == 0x7F }
            && !subject.split(separator: ".", omittingEmptySubsequences: false).contains { $0.isEmpty }
    }
}

/// Splits what a server sends into ``NATSInbound`` values, however the bytes arrive. Bounded: a control
/// line longer than `maxControlLine` or a payload larger than `maxPayload` is a protocol error.
struct NATSParser {
    let maxControlLine: Int
    let maxPayload: Int
    private var buffer: [UInt8] = []
    private var start = 0

    init(maxControlLine: Int = 4096, maxPayload: Int = 8 << 20) {
        self.maxControlLine = maxControlLine
        self.maxPayload = maxPayload
    }

    mutating func feed(_ bytes: [UInt8]) {
        if start > 0, start == buffer.count {
            buffer.removeAll(keepingCapacity: true)
            start = 0
        } else if start > 65_536 {
            buffer.removeFirst(start)
            start = 0
        }
        buffer += bytes
    }

    /// The next complete operation, or nil until more bytes arrive.
    mutating func next() throws(NATSProtocolError) -> NATSInbound? {
        guard let lineEnd = findLineEnd() else {
            if buffer.count - start > maxControlLine { throw NATSProtocolError(description: "control line too long") }
            return nil
        }
        let line = buffer[start..<lineEnd]
        let fields = line.split(separator: 0x20, omittingEmptySubsequences: true).map { String(decoding: $0, as: UTF8.self) }
        guard let verb = fields.first?.uppercased() else { throw NATSProtocolError(description: "empty control line") }
        let afterLine = lineEnd + 2
        switch verb {
        case "PING": start = afterLine; return .ping
        case "PONG": start = afterLine; return .pong
        case "+OK": start = afterLine; return .ok
        case "-ERR":
            start = afterLine
            let text = String(decoding: line.dropFirst(4), as: UTF8.self).trimmingSpaces
            return .error(text.hasPrefix("'") && text.hasSuffix("'") && text.count >= 2 ? String(text.dropFirst().dropLast()) : text)
        case "INFO":
            start = afterLine
            return .info(String(decoding: line.dropFirst(4), as: UTF8.self).trimmingSpaces)
        case "MSG", "HMSG":
            return try message(fields, isHeaders: verb == "HMSG", payloadAt: afterLine)
        default:
            throw NATSProtocolError(description: "unknown operation \(verb.prefix(16))")
        }
    }

    /// `MSG subject sid [reply] size` or `HMSG subject sid [reply] headerSize totalSize`, with its payload.
    private mutating func message(_ fields: [String], isHeaders: Bool, payloadAt payloadStart: Int) throws(NATSProtocolError) -> NATSInbound? {
        let counts = isHeaders ? 2 : 1
        guard fields.count == 3 + counts || fields.count == 4 + counts,
              let sid = UInt64(fields[2]) else { throw NATSProtocolError(description: "malformed \(fields[0])") }
        let sizes = fields.suffix(counts).map { Int($0) }
        guard let total = sizes.last ?? nil, let headerSize = isHeaders ? sizes.first ?? nil : 0,
              total >= 0, headerSize >= 0, headerSize <= total else {
            throw NATSProtocolError(description: "malformed size in \(fields[0])")
        }
        guard total <= maxPayload else { throw NATSProtocolError(description: "message of \(total) bytes over the limit") }
        guard buffer.count >= payloadStart + total + 2 else { return nil }
        guard buffer[payloadStart + total] == 13, buffer[payloadStart + total + 1] == 10 else {
            throw NATSProtocolError(description: "payload not followed by CRLF")
        }
        var message = BusMessage(subject: fields[1], replyTo: fields.count == 4 + counts ? fields[3] : nil,
                                 payload: Array(buffer[(payloadStart + headerSize)..<(payloadStart + total)]))
        if isHeaders {
            try parseHeaders(buffer[payloadStart..<(payloadStart + headerSize)], into: &message)
        }
        start = payloadStart + total + 2
        return .message(sid: sid, message)
    }

    /// `NATS/1.0[ status[ description]]` then `name: value` lines, then an empty line.
    private func parseHeaders(_ block: ArraySlice<UInt8>, into message: inout BusMessage) throws(NATSProtocolError) {
        let text = String(decoding: block, as: UTF8.self)
        var lines = text.split(separator: "\r\n" as Character, omittingEmptySubsequences: false)
        guard let first = lines.first, first.hasPrefix("NATS/1.0") else { throw NATSProtocolError(description: "header block without NATS/1.0") }
        lines.removeFirst()
        let status = first.dropFirst("NATS/1.0".count).trimmingSpaces.prefix { $0 != " " }
        message.status = status.isEmpty ? nil : Int(status)
        for line in lines where !line.isEmpty {
            guard let colon = line.firstIndex(of: ":") else { throw NATSProtocolError(description: "malformed header line") }
            message.headers.append(.init(String(line[..<colon]), String(line[line.index(after: colon)...]).trimmingSpaces))
        }
    }

    private func findLineEnd() -> Int? {
        var index = start
        let end = min(buffer.count, start + maxControlLine + 2)
        while index + 1 < end {
            if buffer[index] == 13, buffer[index + 1] == 10 { return index }
            index += 1
        }
        return nil
    }
}

extension StringProtocol {
    var trimmingSpaces: String {
        String(drop { $0 == " " || $0 == "\t" }.reversed().drop { $0 == " " || $0 == "\t" }.reversed())
    }
}
