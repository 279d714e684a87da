import Testing
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// Wire-v1 section 2, "Errors in binary mode": one row per condition.
@Suite struct ErrorTable {
    @Test(arguments: [
        // hex frame,                                     code,              id, closes
        ("00000004 03 00 0000",                          "malformed_frame",  0, true),   // length < 8
        ("00000004 03 00 0000 00000011",                 "malformed_frame", 17, true),   // length < 8, whole header in
        ("00000008 03 00 0005 00000009",                 "malformed_frame",  9, true),   // chanlen > length - 8
        ("00100000 03 00 0004 00000001",                 "frame_too_large",  0, true),   // 1 MiB > 64 KiB maxFrame
        ("00000008 0f 00 0000 00000003",                 "bad_frame",        3, false),  // unknown type
        ("00000008 02 00 0000 00000004",                 "bad_frame",        4, false),  // WELCOME from a client
        ("00000008 07 00 0000 00000005",                 "bad_frame",        5, false),  // ERROR from a client
        ("00000008 08 00 0000 00000006",                 "bad_frame",        6, false),  // GOAWAY from a client
        ("00000008 05 02 0000 00000007",                 "bad_frame",        7, false),  // reserved flag bit
        ("00000009 05 01 0000 00000008 ff",              "bad_frame",        8, false),  // NULL_PAYLOAD with P > 0
        ("00000009 05 00 0001 0000000a 61",              "bad_frame",       10, false),  // channel on PING
        ("00000008 03 00 0000 0000000b",                 "bad_channel",     11, false),  // MESSAGE without channel
        ("0000000a 03 00 0002 0000000c c328",            "bad_channel",     12, false),  // channel not UTF-8
        ("0000000c 0c 00 0001 0000000d 61 000000",       "bad_frame",       13, false),  // DEMAND of 3 bytes
        ("0000000d 0c 00 0001 0000000e 61 00000000",     "bad_frame",       14, false),  // DEMAND of 0
        ("00000010 0d 00 0000 0000000f 0000000000000000", "bad_frame",      15, false),  // POSITION without a session
        ("00000008 0e 00 0000 00000010",                 "bad_frame",       16, false),  // END without a session
    ] as [(String, String, UInt32, Bool)])
    func hostileFrame(hex: String, code: String, id: UInt32, closes: Bool) async throws {
        try await withServer({ $0.maxFrame = 64 * 1024 }) { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(hex: hex)
            let error = try await wire.frame()
            #expect(error.errorCode == code)
            #expect(error.id == id)
            if closes {
                #expect(try await wire.isClosedByServer())
            } else {
                #expect(try await wire.barrier().isEmpty)  // still open, nothing else sent
            }
        }
    }

    @Test func oversizedLengthIsRefusedBeforeTheBodyArrives() async throws {
        try await withServer({ $0.maxFrame = 1024 }) { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(hex: "7fffffff")  // only the length: the body never comes
            #expect(try await wire.frame().errorCode == "frame_too_large")
            #expect(try await wire.isClosedByServer())
        }
    }

    /// The ERROR answers the id: the first request goes on (its handler finishes), but no REPLY with
    /// that id follows, so the id gets exactly one answer and is free again.
    @Test func duplicateIdIsTheOneAnswerAndTheFirstRequestGoesOn() async throws {
        let finished = AtomicCounter(), released = AtomicCounter()
        try await withServer(setUp: { server in
            MethodChannel(name: "slow", server: server).setMethodCallHandler { call in
                _ = try await eventually { released.value > 0 }  // until the duplicate has been refused
                finished.increment()
                return call.arguments
            }
        }) { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(.call(5, "slow", "x", "first"))
            try wire.send(.call(5, "slow", "x", "second"))
            let duplicate = try await wire.frame()
            #expect(duplicate.errorCode == "duplicate_id" && duplicate.id == 5)
            released.increment()
            #expect(try await eventually { finished.value == 1 })
            #expect(try await wire.barrier().isEmpty)  // no REPLY for id 5 after its ERROR
            try wire.send(.call(5, "switchboard/echo", "echo", "again"))  // the id is free again
            let reply = try await wire.frame()
            #expect(reply.kind == .reply && reply.id == 5)
            #expect(try reply.envelope() == .success("again"))
        }
    }

    @Test(arguments: [
        ("switchboard/echo", [0xFF] as [UInt8]?),       // not a method call
        ("switchboard/echo", nil),                      // NULL_PAYLOAD on a method channel
        ("switchboard/echo.json", Array("{\"method\":".utf8)),
        ("switchboard/ticker", nil),                    // NULL_PAYLOAD on an event channel
        ("switchboard/message", [0x07, 0x05, 0x61]),    // truncated standard message
        ("switchboard/message.string", [0xC3, 0x28]),   // invalid UTF-8
    ] as [(String, [UInt8]?)])
    func badPayloadIsTheRequestsAnswer(channel: String, payload: [UInt8]?) async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(Frame(.message, id: 21, channel: channel, payload: payload))
            let answer = try await wire.frame()
            #expect(answer.errorCode == "bad_payload")
            #expect(answer.id == 21)
            #expect(try await wire.barrier().isEmpty)
        }
    }

    @Test func unmatchedReplyAndCancelAreIgnoredAndCounted() async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(Frame(.reply, id: 77, payload: nil))
            try wire.send(Frame(.cancel, id: 78, payload: nil))
            #expect(try await wire.barrier().isEmpty)
            try wire.send(.call(1, "switchboard/stats", "get"))
            let stats = try await wire.frame().envelope().get()
            #expect(stats["ignoredFrames"] == 2)
        }
    }

    @Test func tokenIsRequiredBeforeAnyOtherFrame() async throws {
        try await withServer({ $0.token = "s3cret" }) { _, port in
            let early = try RawConnection(port: port)
            try early.send(Frame(.ping, id: 1, payload: nil))  // PING is allowed before HELLO
            #expect(try await early.frame().kind == .pong)
            try early.send(.call(2, "switchboard/echo", "echo"))
            let refused = try await early.frame()
            #expect(refused.errorCode == "unauthorized" && refused.id == 2)
            #expect(try await early.isClosedByServer())

            let wrong = try RawConnection(port: port)
            try wrong.send(Frame(.hello, id: 3, payload: Array(#"{"version":1,"token":"nope"}"#.utf8)))
            #expect(try await wrong.frame().errorCode == "unauthorized")
            #expect(try await wrong.isClosedByServer())

            let good = try RawConnection(port: port)
            try good.send(Frame(.hello, id: 4, payload: Array(#"{"version":1,"token":"s3cret","client":"t"}"#.utf8)))
            let welcome = try await good.frame()
            #expect(welcome.kind == .welcome && welcome.id == 4)
            let body = try JSONText.parse(welcome.payload!)
            #expect(body["version"] == 1 && body["maxFrame"] == .int(16 << 20) && body["heartbeatMs"] == 0)
            #expect(body["server"]?.stringValue?.hasPrefix("switchboard/") == true)
            try good.send(.call(5, "switchboard/echo", "echo", "ok"))
            #expect(try await good.frame().envelope() == .success("ok"))
            // A second HELLO is checked again.
            try good.send(Frame(.hello, id: 6, payload: Array(#"{"token":"bad"}"#.utf8)))
            #expect(try await good.frame().errorCode == "unauthorized")
        }
    }

    @Test(arguments: [
        (#"[1]"#, "bad_hello"),
        (#"not json"#, "bad_hello"),
        (#"{"version":2}"#, "unsupported_version"),
        (#"{"version":"1"}"#, "unsupported_version"),
    ])
    func badHello(payload: String, code: String) async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(Frame(.hello, id: 9, payload: Array(payload.utf8)))
            let error = try await wire.frame()
            #expect(error.errorCode == code && error.id == 9)
            #expect(try await wire.isClosedByServer())
        }
    }

    @Test func emptyAndNullHelloMeanAnEmptyObject() async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(Frame(.hello, id: 1, payload: nil))
            try wire.send(Frame(.hello, id: 2, payload: []))
            #expect(try await wire.frame().kind == .welcome)
            #expect(try await wire.frame().kind == .welcome)
        }
    }

    @Test func badInputLeavesOtherConnectionsAlone() async throws {
        try await withServer { _, port in
            let good = try RawConnection(port: port)
            try good.send(.call(1, "switchboard/ticker", "listen", ["intervalMs": 5]))
            #expect(try await good.frame().kind == .reply)
            for garbage in ["00000001 ff", "ffffffff", "00000008 03 00 0009 00000000"] {
                let bad = try RawConnection(port: port)
                try bad.send(hex: garbage)
                _ = try await bad.isClosedByServer()
            }
            var events: [Frame] = []
            for _ in 0..<3 { events.append(try await good.frame()) }
            #expect(events.allSatisfy { $0.kind == .message && $0.channel == "switchboard/ticker" })
        }
    }
}
