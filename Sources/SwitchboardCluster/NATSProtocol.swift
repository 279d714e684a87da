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
public enum NATSInbound: Equatable, Sendable {
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
public struct NATSProtocolError: Error, Equatable, CustomStringConvertible {
    public let description: String
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
        let blockSize = headerBlockSize(headers)
        out += headers.isEmpty ? Array("PUB ".utf8) : Array("HPUB ".utf8)
        out += subject.utf8
        if let replyTo {
            out.append(0x20)
            out += replyTo.utf8
        }
        if !headers.isEmpty {
            out.append(0x20)
            appendDecimal(blockSize, to: &out)
        }
        out.append(0x20)
        appendDecimal(blockSize + payload.count, to: &out)
        out += [13, 10]
        if !headers.isEmpty {
            out += "NATS/1.0\r\n".utf8
            for header in headers {
                out += header.name.utf8
                out += [0x3A, 0x20]
                out += header.value.utf8
                out += [13, 10]
            }
            out += [13, 10]
        }
        out += payload
        out += [13, 10]
    }

    /// The bytes `headers` take as an HPUB header block (0 for none): "NATS/1.0\r\n", a
    /// "name: value\r\n" line each, and the closing "\r\n".
    static func headerBlockSize(_ headers: [BusMessage.Header]) -> Int {
        guard !headers.isEmpty else { return 0 }
        return headers.reduce(12) { $0 + $1.name.utf8.count + $1.value.utf8.count + 4 }
    }

    private static func appendDecimal(_ value: Int, to out: inout [UInt8]) {
        guard value >= 10 else { return out.append(UInt8(truncatingIfNeeded: 0x30 + value)) }
        appendDecimal(value / 10, to: &out)
        out.append(UInt8(truncatingIfNeeded: 0x30 + value % 10))
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
        !header.name.isEmpty && header.name.utf8.allSatisfy(isTokenByte)
            && !header.value.utf8.contains { ($0 < 0x20 && $0 != 0x09) || $0 == 0x7F }
    }

    /// An HTTP token character: visible ASCII but for the separators `()<>@,;:\"/[]?={}`.
    private static func isTokenByte(_ byte: UInt8) -> Bool {
        switch byte {
        case 0x28, 0x29, 0x3C, 0x3E, 0x40, 0x2C, 0x3B, 0x3A, 0x5C, 0x22, 0x2F, 0x5B, 0x5D, 0x3F, 0x3D, 0x7B, 0x7D: false
        default: byte > 0x20 && byte < 0x7F
        }
    }

    /// Whether `subject` can be sent as one: not empty, no whitespace or control characters, no empty
    /// token (NATS separates tokens with `.`).
    static func isValidSubject(_ subject: String) -> Bool {
        var previous: UInt8 = 0x2E  // a leading "." makes an empty first token
        for byte in subject.utf8 {
            if byte <= 0x20 || byte == 0x7F || (byte == 0x2E && previous == 0x2E) { return false }
            previous = byte
        }
        return previous != 0x2E  // also false when empty
    }
}

/// Splits what a server sends into ``NATSInbound`` values, however the bytes arrive. Bounded: a control
/// line longer than `maxControlLine` or a payload larger than `maxPayload` is a protocol error. Public
/// for the fuzzer (`Fuzz/`); ``NATSBus`` is its one user.
public struct NATSParser {
    public let maxControlLine: Int
    public let maxPayload: Int
    private var buffer: [UInt8] = []
    private var start = 0

    public init(maxControlLine: Int = 4096, maxPayload: Int = 8 << 20) {
        self.maxControlLine = maxControlLine
        self.maxPayload = maxPayload
    }

    /// The bytes held, not yet parsed into operations.
    public var bufferedBytes: Int { buffer.count - start }

    public mutating func feed(_ bytes: [UInt8]) {
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
    public mutating func next() throws(NATSProtocolError) -> NATSInbound? {
        guard let lineEnd = findLineEnd() else {
            // A line at the limit may be waiting for the LF after its CR: too long only past that.
            if buffer.count - start > maxControlLine + 1 { throw NATSProtocolError(description: "control line too long") }
            return nil
        }
        let line = buffer[start..<lineEnd]
        let fields = ControlFields(line)
        guard fields.count > 0 else { throw NATSProtocolError(description: "empty control line") }
        // Every operation's name has four letters or fewer, in any case.
        let verb = String(decoding: line[fields[0]].prefix(5).map { $0 >= 0x61 && $0 <= 0x7A ? $0 - 0x20 : $0 }, as: UTF8.self)
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
            throw NATSProtocolError(description: "unknown operation \(verb)")
        }
    }

    /// A field of decimal digits, as a number (nil if it is not one, or too large).
    private static func decimal(_ field: ArraySlice<UInt8>) -> Int? {
        guard !field.isEmpty, field.count <= 18 else { return nil }
        var value = 0
        for byte in field {
            guard byte >= 0x30, byte <= 0x39 else { return nil }
            value = value * 10 + Int(byte - 0x30)
        }
        return value
    }

    /// The space-separated fields of a control line (at most six are kept: no operation has more),
    /// without allocating.
    private struct ControlFields {
        private var ranges = InlineArray<6, Range<Int>>(repeating: 0..<0)
        private(set) var count = 0

        init(_ line: ArraySlice<UInt8>) {
            var index = line.startIndex
            while index < line.endIndex {
                while index < line.endIndex, line[index] == 0x20 { index += 1 }
                guard index < line.endIndex else { break }
                let fieldStart = index
                while index < line.endIndex, line[index] != 0x20 { index += 1 }
                if count < 6 { ranges[count] = fieldStart..<index }
                count += 1
            }
        }

        subscript(index: Int) -> Range<Int> { ranges[index] }
    }

    /// `MSG subject sid [reply] size` or `HMSG subject sid [reply] headerSize totalSize`, with its payload.
    private mutating func message(_ fields: ControlFields, isHeaders: Bool, payloadAt payloadStart: Int) throws(NATSProtocolError) -> NATSInbound? {
        let counts = isHeaders ? 2 : 1
        let name = isHeaders ? "HMSG" : "MSG"
        guard fields.count == 3 + counts || fields.count == 4 + counts,
              let sid = Self.decimal(buffer[fields[2]]) else { throw NATSProtocolError(description: "malformed \(name)") }
        guard let total = Self.decimal(buffer[fields[fields.count - 1]]),
              let headerSize = isHeaders ? Self.decimal(buffer[fields[fields.count - 2]]) : 0, headerSize <= total else {
            throw NATSProtocolError(description: "malformed size in \(name)")
        }
        guard total <= maxPayload else { throw NATSProtocolError(description: "message of \(total) bytes over the limit") }
        guard buffer.count >= payloadStart + total + 2 else { return nil }
        guard buffer[payloadStart + total] == 13, buffer[payloadStart + total + 1] == 10 else {
            throw NATSProtocolError(description: "payload not followed by CRLF")
        }
        var message = BusMessage(subject: String(decoding: buffer[fields[1]], as: UTF8.self),
                                 replyTo: fields.count == 4 + counts ? String(decoding: buffer[fields[3]], as: UTF8.self) : nil,
                                 payload: Array(buffer[(payloadStart + headerSize)..<(payloadStart + total)]))
        if isHeaders {
            try Self.parseHeaders(buffer[payloadStart..<(payloadStart + headerSize)], into: &message)
        }
        start = payloadStart + total + 2
        return .message(sid: UInt64(sid), message)
    }

    /// `NATS/1.0[ status[ description]]` then `name: value` lines, then an empty line.
    private static func parseHeaders(_ block: ArraySlice<UInt8>, into message: inout BusMessage) throws(NATSProtocolError) {
        guard block.starts(with: "NATS/1.0".utf8) else { throw NATSProtocolError(description: "header block without NATS/1.0") }
        var lineStart = block.startIndex
        var isFirst = true
        while lineStart < block.endIndex {
            let lineEnd = block[lineStart...].firstIndex(of: 10) ?? block.endIndex
            let line = trimmed(block[lineStart..<lineEnd])  // drops the CR too
            lineStart = lineEnd + 1
            if isFirst {
                isFirst = false
                let status = trimmed(line.dropFirst(8)).prefix { $0 != 0x20 }
                message.status = status.isEmpty ? nil : decimal(status)
                continue
            }
            // A line that is not a header is skipped: whoever published it, the connection goes on.
            guard let colon = line.firstIndex(of: 0x3A) else { continue }
            message.headers.append(.init(String(decoding: line[..<colon], as: UTF8.self),
                                         String(decoding: trimmed(line[(colon + 1)...]), as: UTF8.self)))
        }
    }

    /// `bytes` without leading and trailing spaces, tabs and carriage returns.
    private static func trimmed(_ bytes: ArraySlice<UInt8>) -> ArraySlice<UInt8> {
        let isSpace = { (byte: UInt8) in byte == 0x20 || byte == 0x09 || byte == 13 }
        guard let first = bytes.firstIndex(where: { !isSpace($0) }), let last = bytes.lastIndex(where: { !isSpace($0) }) else {
            return bytes[bytes.startIndex..<bytes.startIndex]
        }
        return bytes[first...last]
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
