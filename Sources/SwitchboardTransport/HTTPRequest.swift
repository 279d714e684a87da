import CHTTPParser

/// An HTTP/1.1 request head: what the server's HTTP endpoints and the WebSocket upgrade look at.
public struct HTTPRequestHead: Sendable {
    public var method = ""
    /// The request target: path and query, as sent.
    public var target = ""
    public var headers: [(name: String, value: String)] = []
    /// Whether the request asks to switch protocols (an `Upgrade` header).
    public var isUpgrade = false

    /// The path, without the query.
    public var path: String { String(target.prefix { $0 != "?" }) }

    /// The first value of header `name` (any case).
    public func header(_ name: String) -> String? {
        let name = name.lowercased()
        return headers.first { $0.name.lowercased() == name }?.value
    }

    /// Whether the request was addressed to this machine by name: its `Host` is `localhost` or a
    /// loopback address (or absent, as no browser sends it). A page whose own name was made to resolve
    /// to 127.0.0.1 (DNS rebinding) reaches a loopback server with its own name here, so what the server
    /// grants loopback peers is granted only to requests that pass this too.
    public var isAddressedToThisMachine: Bool {
        guard let host = header("Host") else { return true }
        guard let authority = HTTPUpgradeTransport.Authority(host, defaultPort: nil) else { return false }
        let name = authority.host.hasPrefix("[") ? authority.host.dropFirst().dropLast() : authority.host
        return name == "localhost" || isLoopbackAddress(String(name))
    }
}

/// An HTTP response the server writes, then closes the connection.
public struct HTTPResponse: Sendable {
    public var status: Int
    public var contentType: String
    public var body: [UInt8]
    /// More header lines (`Name: value`), such as a 401's `WWW-Authenticate`.
    public var headers: [String]

    public init(status: Int, contentType: String = "text/plain; charset=utf-8", body: [UInt8], headers: [String] = []) {
        self.status = status
        self.contentType = contentType
        self.body = body
        self.headers = headers
    }

    public init(status: Int, text: String, headers: [String] = []) { self.init(status: status, body: Array(text.utf8), headers: headers) }

    /// The bytes on the wire, with `Connection: close`.
    var bytes: [UInt8] {
        let head = "HTTP/1.1 \(status) \(Self.reason(status))\r\nContent-Type: \(contentType)\r\n"
            + headers.map { $0 + "\r\n" }.joined()
            + "Content-Length: \(body.count)\r\nConnection: close\r\nCache-Control: no-store\r\n\r\n"
        return Array(head.utf8) + body
    }

    static func reason(_ status: Int) -> String {
        switch status {
        case 101: "Switching Protocols"
        case 200: "OK"
        case 400: "Bad Request"
        case 401: "Unauthorized"
        case 403: "Forbidden"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 408: "Request Timeout"
        case 426: "Upgrade Required"
        case 431: "Request Header Fields Too Large"
        case 503: "Service Unavailable"
        default: "Status"
        }
    }
}

/// Reads one request head with http-parser, however its bytes arrive, up to `limit` bytes.
final class HTTPRequestParser {
    enum Outcome {
        case needMore
        /// The head, and the bytes that came after it (the first WebSocket frames, say).
        case complete(HTTPRequestHead, rest: [UInt8])
        case malformed(String)
        case tooLarge
    }

    private var parser = http_parser()
    private var settings = http_parser_settings()
    private var head = HTTPRequestHead()
    private var field = "", value = "", isInValue = false
    private var isHeadComplete = false
    private var seen = 0
    let limit: Int

    init(limit: Int = 16 * 1024) {
        self.limit = limit
        http_parser_init(&parser, HTTP_REQUEST)
        settings.on_url = { parser, at, length in
            HTTPRequestParser.owner(parser)?.head.target += HTTPRequestParser.text(at, length)
            return 0
        }
        settings.on_header_field = { parser, at, length in
            guard let owner = HTTPRequestParser.owner(parser) else { return 1 }
            if owner.isInValue { owner.endHeader() }
            owner.field += HTTPRequestParser.text(at, length)
            return 0
        }
        settings.on_header_value = { parser, at, length in
            guard let owner = HTTPRequestParser.owner(parser) else { return 1 }
            owner.isInValue = true
            owner.value += HTTPRequestParser.text(at, length)
            return 0
        }
        settings.on_headers_complete = { parser in
            guard let parser, let owner = HTTPRequestParser.owner(parser) else { return 1 }
            if owner.isInValue { owner.endHeader() }
            owner.head.method = String(cString: http_method_str(http_method(UInt32(parser.pointee.method))))
            owner.isHeadComplete = true
            return 0
        }
    }

    /// Feeds `bytes`; says whether the head is complete.
    func feed(_ bytes: [UInt8]) -> Outcome {
        // The parser never sees more than `limit` bytes of a head, however many came in one read.
        guard seen < limit else { return .tooLarge }
        guard !bytes.isEmpty else { return .needMore }  // an empty read would tell the parser the input ended
        let allowed = min(bytes.count, limit - seen)
        let consumed = bytes.withUnsafeBufferPointer { buffer in
            parser.data = Unmanaged.passUnretained(self).toOpaque()
            return buffer.withMemoryRebound(to: CChar.self) { chars in
                http_parser_execute(&parser, &settings, chars.baseAddress, allowed)
            }
        }
        seen += consumed
        if isHeadComplete {
            head.isUpgrade = parser.upgrade == 1
            let after = parser.upgrade == 1 ? Array(bytes[min(consumed, bytes.count)...]) : []
            return .complete(head, rest: after)
        }
        let error = switchboard_http_errno(&parser)
        if error != HPE_OK {
            return .malformed(String(cString: http_errno_description(error)))
        }
        return seen >= limit ? .tooLarge : .needMore
    }

    private func endHeader() {
        head.headers.append((field, value))
        field = ""
        value = ""
        isInValue = false
    }

    private static func owner(_ parser: UnsafeMutablePointer<http_parser>?) -> HTTPRequestParser? {
        guard let data = parser?.pointee.data else { return nil }
        return Unmanaged<HTTPRequestParser>.fromOpaque(data).takeUnretainedValue()
    }

    private static func text(_ at: UnsafePointer<CChar>?, _ length: Int) -> String {
        guard let at else { return "" }
        return String(decoding: UnsafeRawBufferPointer(start: at, count: length), as: UTF8.self)
    }
}
