import Testing
@testable import SwitchboardCluster

@Suite("NATS protocol")
struct NATSProtocolTests {
    /// Everything `bytes` parses into, fed `chunk` bytes at a time.
    func parse(_ text: String, chunk: Int = .max, parser: NATSParser = NATSParser()) throws -> [NATSInbound] {
        var parser = parser
        var out: [NATSInbound] = []
        let bytes = Array(text.utf8)
        var index = 0
        while index < bytes.count {
            let end = min(bytes.count, index + chunk)
            parser.feed(Array(bytes[index..<end]))
            index = end
            while let operation = try parser.next() { out.append(operation) }
        }
        return out
    }

    @Test("a control line at the limit is read however it is cut, even between its CR and LF (found by fuzz-nats-parser)")
    func lineAtTheLimit() throws {
        let line = "PING" + String(repeating: " ", count: 12)  // 16 bytes: the limit below
        for chunk in 1...18 {
            #expect(try parse(line + "\r\n", chunk: chunk, parser: NATSParser(maxControlLine: 16)) == [.ping], "chunk \(chunk)")
        }
        #expect(throws: NATSProtocolError(description: "control line too long")) {
            try parse(line + " \r", parser: NATSParser(maxControlLine: 16))  // 17 bytes and no LF yet
        }
    }

    @Test("every server operation, whole or one byte at a time")
    func operations() throws {
        let stream = "INFO {\"server_id\":\"x\",\"max_payload\":1048576}\r\nPING\r\nPONG\r\n+OK\r\n-ERR 'Slow Consumer Detected'\r\n"
            + "MSG room.a 7 5\r\nhello\r\nMSG room.a 7 _INBOX.1.2 0\r\n\r\n"
            + "HMSG _INBOX.1.3 2 16 16\r\nNATS/1.0 503\r\n\r\n\r\n"
            + "HMSG x 3 reply 22 25\r\nNATS/1.0\r\nNode: n1\r\n\r\nabc\r\n"
        let expected: [NATSInbound] = [
            .info("{\"server_id\":\"x\",\"max_payload\":1048576}"), .ping, .pong, .ok, .error("Slow Consumer Detected"),
            .message(sid: 7, BusMessage(subject: "room.a", payload: Array("hello".utf8))),
            .message(sid: 7, BusMessage(subject: "room.a", replyTo: "_INBOX.1.2", payload: [])),
            .message(sid: 2, BusMessage(subject: "_INBOX.1.3", status: 503, payload: [])),
            .message(sid: 3, BusMessage(subject: "x", replyTo: "reply", headers: [.init("Node", "n1")], payload: Array("abc".utf8))),
        ]
        #expect(try parse(stream) == expected)
        #expect(try parse(stream, chunk: 1) == expected)
        #expect(try parse(stream, chunk: 7) == expected)
    }

    @Test("malformed or oversized input is a protocol error", arguments: [
        "BOGUS\r\n", "MSG a\r\n", "MSG a x 3\r\nabc\r\n", "MSG a 1 -3\r\n", "MSG a 1 3\r\nabcd\r\n",
        "HMSG a 1 9 3\r\nabc\r\n", "HMSG a 1 3 3\r\nabc\r\n", "MSG a 1 2000\r\n", String(repeating: "x", count: 300),
    ])
    func malformed(_ text: String) {
        #expect(throws: NATSProtocolError.self) { try parse(text, parser: NATSParser(maxControlLine: 256, maxPayload: 1000)) }
    }

    @Test("commands: CONNECT asks for headers and no-responders; PUB, HPUB, SUB, UNSUB")
    func commands() {
        let connect = String(decoding: NATSCommand.connect(name: "node \"1\""), as: UTF8.self)
        #expect(connect.hasPrefix("CONNECT {") && connect.hasSuffix("}\r\n"))
        #expect(connect.contains(#""headers":true"#) && connect.contains(#""no_responders":true"#))
        #expect(connect.contains(#""name":"node \"1\"""#))
        var out: [UInt8] = []
        NATSCommand.publish("a.b", replyTo: nil, headers: [], payload: Array("hi".utf8), into: &out)
        NATSCommand.publish("a.b", replyTo: "r", headers: [.init("Node", "n1")], payload: Array("hi".utf8), into: &out)
        #expect(String(decoding: out, as: UTF8.self)
            == "PUB a.b 2\r\nhi\r\nHPUB a.b r 22 24\r\nNATS/1.0\r\nNode: n1\r\n\r\nhi\r\n")
        #expect(String(decoding: NATSCommand.subscribe("a.*", queue: "q", sid: 4), as: UTF8.self) == "SUB a.* q 4\r\n")
        #expect(String(decoding: NATSCommand.unsubscribe(sid: 4), as: UTF8.self) == "UNSUB 4\r\n")
        #expect(NATSCommand.isValidSubject("switchboard/room.post"))
        #expect(!NATSCommand.isValidSubject("a b") && !NATSCommand.isValidSubject("a..b") && !NATSCommand.isValidSubject(""))
    }

    @Test("server URLs")
    func urls() {
        #expect(NATSBus.Server(url: "nats://127.0.0.1:4333") == NATSBus.Server(host: "127.0.0.1", port: 4333))
        #expect(NATSBus.Server(url: "localhost") == NATSBus.Server(host: "localhost", port: 4222))
        #expect(NATSBus.Server(url: "nats://h:0") == nil && NATSBus.Server(url: "nats://:4222") == nil)
        #expect(NATSBus.Server(url: "nats://localhost:4222") == NATSBus.Server(host: "localhost", port: 4222))
        #expect(NATSBus.Server(url: "nats://[::1]:4333") == NATSBus.Server(host: "::1", port: 4333))
        #expect(NATSBus.Server(url: "[::1]") == NATSBus.Server(host: "::1", port: 4222))
        #expect(NATSBus.Server(url: "nats://[::1]x") == nil && NATSBus.Server(url: "nats://[]:1") == nil)
        #expect(NATSBus.Server(host: "::1", port: 4222).description == "nats://[::1]:4222")
    }
}
