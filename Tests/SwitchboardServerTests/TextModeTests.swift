import Testing
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

@Suite struct TextModeConnections {
    @Test func linesSplitAnywhereAndManyPerRead() async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            let lines = (1...20).map { #"{"id":\#($0),"call":"switchboard/echo","method":"echo","args":"é\#($0)"}"# + "\r\n" }
            let bytes = Array(lines.joined().utf8)
            var offset = 0
            var step = 1
            while offset < bytes.count {  // 1, 2, 3 … bytes per write, splitting inside characters too
                try wire.send(Array(bytes[offset..<min(offset + step, bytes.count)]))
                offset += step
                step = step % 7 + 1
            }
            for id in 1...20 {
                #expect(try await wire.line() == ["id": .int(id), "result": .string("é\(id)")])
            }
        }
    }

    @Test func longLineIsSkippedAcrossReadsWithoutBuffering() async throws {
        try await withServer({ $0.maxFrame = 1024 }) { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(line: #"{"id":1,"ping":true}"#)
            #expect(try await wire.line() == ["id": 1, "pong": true])
            try wire.send(Array(#"{"id":2,"call":""#.utf8))
            for _ in 0..<64 { try wire.send([UInt8](repeating: UInt8(ascii: "x"), count: 4096)) }  // 256 KiB, one line
            try wire.send(Array("\"}\n".utf8))
            try wire.send(line: #"{"id":3,"ping":true}"#)
            let error = try await wire.line()
            #expect(error["error"]?["code"] == "bad_request")
            #expect(try await wire.line() == ["id": 3, "pong": true])
            try wire.send(line: #"{"id":4,"call":"switchboard/stats","method":"get"}"#)
            let stats = try await wire.line()
            #expect((stats["result"]?["bytesIn"]?.intValue ?? 0) > 256 * 1024)
        }
    }

    @Test func textListenerThatStopsReadingIsASlowConsumer() async throws {
        try await withServer({
            $0.outboundLimit = 32 * 1024
            $0.slowConsumerGraceMs = 200
        }) { _, port in
            let slow = try RawConnection(port: port)
            try slow.send(line: #"{"id":1,"listen":"switchboard/room"}"#)
            #expect(try await slow.line() == ["id": 1, "result": nil])
            // The poster on the listener's loop (connections are dealt round the loops in turn): from
            // another loop, posts would arrive in batches, and all of a batch past the limit would be
            // dropped rather than written, so the kernel's buffers would not fill.
            let others = try (1..<ServerConfiguration.testLoops).map { _ in try RawConnection(port: port) }
            let poster = try RawConnection(port: port)
            defer { _ = others }
            for i in 1...300 as ClosedRange<UInt32> {
                try poster.send(Frame(.message, id: i, channel: "switchboard/room.post", payload: [UInt8](repeating: 7, count: 8192)))
                _ = try await poster.frame()
            }
            var stats: ChannelValue = .null, id: UInt32 = 1000
            #expect(try await eventually {  // the grace (200 ms) passes
                id += 1
                try poster.send(.call(id, "switchboard/stats", "get"))
                stats = try await poster.frame().envelope().get()
                return stats["slowConsumersClosed"] == 1
            })
            #expect((stats["eventsDropped"]?["outboundLimit"]?.intValue ?? 0) > 0)
            #expect(try await slow.isClosedByServer())
        }
    }

    @Test func customValuesHaveNoJSONFormAndSaySo() async throws {
        struct Opaque: StandardCustomValue {
            static let typeByte: UInt8 = 200
            func write(to writer: inout StandardWriter) throws(CodecError) { writer.writeByte(1) }
            static func read(from reader: inout StandardReader) throws(CodecError) -> Opaque { _ = try reader.readByte(); return Opaque() }
        }
        try await withServer(setUp: { server in
            MethodChannel(name: "opaque", server: server).setMethodCallHandler { _ in .custom(Opaque()) }
        }) { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(line: #"{"id":1,"call":"opaque","method":"get"}"#)
            let answer = try await wire.line()
            #expect(answer["id"] == 1)
            #expect(answer["error"]?["code"] == "bad_payload")
            try wire.send(line: #"{"id":2,"ping":true}"#)
            #expect(try await wire.line() == ["id": 2, "pong": true])
        }
    }
}

@Suite struct OverflowPolicies {
    /// Listens with credit 1 on a channel whose handler emits 0…9 during onListen, then takes the rest.
    func received(policy: OverflowPolicy) async throws -> [ChannelValue] {
        var values: [ChannelValue] = []
        try await withServer(setUp: { server in
            EventChannel(name: "burst", overflow: policy, queueLimit: 4, server: server)
                .setStreamHandler(StreamHandlerClosures(onListen: { _, sink in
                    for i in 0..<10 { sink.success(.int(i)) }
                    return nil
                }))
        }) { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(.call(1, "burst", "listen"))
            _ = try await wire.frame()
            for frame in try await wire.barrier() { values.append(try frame.envelope().get()) }
        }
        return values
    }

    @Test func dropNewestKeepsTheFirstEvents() async throws {
        #expect(try await received(policy: .dropNewest) == [0, 1, 2, 3])
    }

    @Test func keepLatestKeepsOnlyTheLastEvent() async throws {
        #expect(try await received(policy: .keepLatest) == [9])
    }

    @Test func dropOldestKeepsTheLastEvents() async throws {
        #expect(try await received(policy: .dropOldest) == [6, 7, 8, 9])
    }
}

/// A person who types a word into `nc` instead of a JSON line.
@Suite struct TypedWords {
    /// A letter other than `G` cannot start a valid frame (wire-v1 section 1): the server answers at once,
    /// with the ERROR frame wire-v1 names for that length, then a line a person can read, and closes.
    @Test(arguments: ["hello\n", "HELP\r\n", "x", "ping"])
    func wordGetsTheErrorThenAnExplanation(typed: String) async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(Array(typed.utf8))
            let bytes = try await wire.bytesUntilClosed()
            try #require(bytes.count > 12)
            let frameLength = 4 + (0..<4).reduce(0) { $0 << 8 | Int(bytes[$1]) }
            var inbound = InboundBuffer()
            inbound.append(Array(bytes.prefix(frameLength)))
            var decoder = FrameDecoder(maxFrame: 1 << 30)
            guard case .frame(let error)? = try decoder.next(from: &inbound) else { throw TestFailure("no ERROR frame") }
            #expect(error.errorCode == "frame_too_large")
            let explanation = String(decoding: bytes.dropFirst(frameLength), as: UTF8.self)
            #expect(explanation.hasPrefix("\nswitchboard: "))
            #expect(explanation.contains(#"{"id":1,"ping":true}"#))
            #expect(explanation.contains("protocol/text-mode.md"))
            #expect(explanation.hasSuffix("\n"))
        }
    }
}
