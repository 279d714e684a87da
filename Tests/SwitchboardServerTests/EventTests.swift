import Synchronization
import Testing
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

private let codec = StandardMethodCodec()

@Suite struct EventStreams {
    @Test func tickerCountsThenEnds() async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(.call(1, "switchboard/ticker", "listen", ["count": 5, "intervalMs": 1]))
            let reply = try await wire.frame()
            #expect(reply.kind == .reply && reply.id == 1)
            #expect(try reply.envelope() == .success(nil))
            #expect(try await wire.events(on: "switchboard/ticker") == (0..<5).map { .success(.int($0)) })
            // The stream has ended: cancel has nothing to cancel.
            try wire.send(.call(2, "switchboard/ticker", "cancel"))
            #expect(try await wire.frame().envelope() == .failure(ChannelError(code: "error", message: "No active stream to cancel")))
        }
    }

    @Test func zeroIntervalAndZeroCount() async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(.call(1, "switchboard/ticker", "listen", ["count": 2000, "intervalMs": 0]))
            _ = try await wire.frame()
            #expect(try await wire.events(on: "switchboard/ticker") == (0..<2000).map { .success(.int($0)) })
            try wire.send(.call(2, "switchboard/ticker", "listen", ["count": 0]))
            _ = try await wire.frame()
            #expect(try await wire.events(on: "switchboard/ticker").isEmpty)
        }
    }

    @Test(arguments: [["count": -1], ["intervalMs": 1.5], ["count": "3"], [1, 2]] as [ChannelValue])
    func tickerRefusesBadArguments(arguments: ChannelValue) async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(.call(1, "switchboard/ticker", "listen", arguments))
            guard case .failure(let error) = try await wire.frame().envelope() else { throw TestFailure("expected refusal") }
            #expect(error.code == "bad_arguments")
            #expect(try await wire.barrier().isEmpty)  // no stream started
        }
    }

    @Test func cancelStopsTheStreamWithNoLaterEvent() throws {
        let embedded = try EmbeddedServer()
        let peer = embedded.connect()
        peer.send(try .call(1, "switchboard/ticker", "listen", .stringMap(["intervalMs": 1])))
        embedded.advanceTime(byMs: 3)
        #expect(try peer.frames().filter { $0.kind == .message }.count >= 2)
        peer.send(try .call(2, "switchboard/ticker", "cancel"))
        embedded.run()
        let frames = try peer.frames()
        let reply = try #require(frames.last)
        #expect(reply.kind == .reply && reply.id == 2)
        #expect(try reply.envelope() == .success(nil))
        #expect(frames.dropLast().allSatisfy { $0.kind == .message })  // events sent before the cancel arrived
        embedded.advanceTime(byMs: 30)  // thirty of the ticker's intervals
        #expect(try peer.frames().isEmpty)
    }

    @Test func secondListenReplacesTheFirstSilently() async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(.call(1, "switchboard/ticker", "listen", ["intervalMs": 1]))
            _ = try await wire.frame()
            _ = try await wire.frame()
            try wire.send(.call(2, "switchboard/ticker", "listen", ["count": 3, "intervalMs": 1]))
            var frame = try await wire.frame()
            while frame.kind == .message {  // the old stream's events, never its end
                #expect(frame.payload != nil)
                frame = try await wire.frame()
            }
            #expect(frame.id == 2)
            // Only the new stream follows: it starts again at 0.
            #expect(try await wire.events(on: "switchboard/ticker") == [.success(0), .success(1), .success(2)])
        }
    }

    @Test func demandPacesTheStream() throws {
        let embedded = try EmbeddedServer()
        let peer = embedded.connect()
        func demand(_ n: UInt32) {
            var payload: [UInt8] = []
            Frame.appendBigEndian(n, to: &payload)
            peer.send(Frame(.demand, channel: "switchboard/ticker", payload: payload))
        }
        func events() throws -> [Result<ChannelValue, ChannelError>] {
            try peer.frames().filter { $0.kind == .message && $0.payload != nil }.map { try $0.envelope() }
        }
        demand(3)  // before listen: kept for the stream
        peer.send(try .call(1, "switchboard/ticker", "listen", .stringMap(["intervalMs": 0, "count": 100])))
        embedded.advanceTime(byMs: 50)  // fifty of the ticker's turns
        let first = try peer.frames()
        #expect(first.first?.kind == .reply && first.first?.id == 1)
        #expect(try first.dropFirst().map { try $0.envelope() } == (0..<3).map { .success(.int($0)) })  // no credit: the ticker waits
        demand(2)
        embedded.advanceTime(byMs: 50)
        #expect(try events() == (3..<5).map { .success(.int($0)) })
        demand(0xFFFF_FFFF)  // unbounded: back to push
        embedded.advanceTime(byMs: 50)
        let rest = try peer.frames()
        #expect(rest.last.map { $0.kind == .message && $0.payload == nil } == true)  // the end
        #expect(try rest.dropLast().map { try $0.envelope() } == (5..<100).map { .success(.int($0)) })
    }

    @Test func creditQueueDropsOldestAndCountsIt() async throws {
        let channel = Mutex<EventChannel?>(nil)
        try await withServer(setUp: { server in
            let events = EventChannel(name: "burst", queueLimit: 4, server: server)
            events.setStreamHandler(StreamHandlerClosures(onListen: { _, sink in
                for i in 0..<10 { sink.success(.int(i)) }  // arrive before any credit
                return nil
            }))
            channel.withLock { $0 = events }
        }) { _, port in
            let wire = try RawConnection(port: port)
            try wire.demand(1, on: "burst")
            try wire.send(.call(1, "burst", "listen"))
            #expect(try await wire.frame().id == 1)
            // Events emitted inside onListen wait behind the listen reply: the queue of 4 keeps 6…9.
            #expect(try await wire.frame().envelope() == .success(6))  // the one credit
            #expect(try await wire.barrier().isEmpty)
            try wire.demand(100, on: "burst")
            var values: [ChannelValue] = []
            for _ in 0..<3 { values.append(try await wire.frame().envelope().get()) }
            #expect(values == [7, 8, 9])
            try wire.send(.call(2, "switchboard/stats", "get"))
            let stats = try await wire.frame().envelope().get()
            #expect(stats["eventsDropped"] == ["queueFull": 6])  // overflowed while waiting behind the reply
        }
    }

    @Test func errorEventsAndEndFromAnyThread() async throws {
        try await withServer(setUp: { server in
            EventChannel(name: "mixed", server: server).setStreamHandler(StreamHandlerClosures(onListen: { _, sink in
                Task.detached {
                    sink.success("a")
                    sink.error(ChannelError(code: "oops", message: "bad", details: 1))
                    sink.success("b")
                    sink.endOfStream()
                    sink.success("after end")
                }
                return nil
            }))
        }) { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(.call(1, "mixed", "listen"))
            #expect(try await wire.frame().id == 1)
            #expect(try await wire.events(on: "mixed")
                == [.success("a"), .failure(ChannelError(code: "oops", message: "bad", details: 1)), .success("b")])
            #expect(try await wire.barrier().isEmpty)
        }
    }

    @Test func roomBroadcastReachesBinaryAndTextListenersInOrder() async throws {
        try await withServer { _, port in
            var listeners: [RawConnection] = []
            for _ in 0..<20 {
                let listener = try RawConnection(port: port)
                try listener.send(.call(1, "switchboard/room", "listen"))
                #expect(try await listener.frame().id == 1)
                listeners.append(listener)
            }
            let text = try RawConnection(port: port)
            try text.send(line: #"{"id":"t","listen":"switchboard/room"}"#)
            #expect(try await text.line() == ["id": "t", "result": nil])
            let poster = try RawConnection(port: port)
            for i in 0..<50 as Range<UInt8> {
                try poster.send(Frame(.message, id: UInt32(i) + 1, channel: "switchboard/room.post", payload: [i, i]))
            }
            for i in 0..<50 as Range<UInt32> {
                let reply = try await poster.frame()
                #expect(reply.kind == .reply && reply.id == i + 1 && reply.payload == nil)
            }
            for listener in listeners {
                for i in 0..<50 as Range<UInt8> {
                    #expect(try await listener.frame().envelope() == .success(.uint8List([i, i])))
                }
            }
            for i in 0..<50 {
                #expect(try await text.line() == ["event": "switchboard/room", "data": [.int(i), .int(i)]])
            }
            try poster.send(Frame(.message, id: 99, channel: "switchboard/room.post", payload: nil))
            let refused = try await poster.frame()
            #expect(refused.errorCode == "bad_payload" && refused.id == 99)
        }
    }

    @Test func disconnectRunsOnCancel() async throws {
        let cancelled = CancelFlag()
        try await withServer(setUp: { server in
            EventChannel(name: "watched", server: server).setStreamHandler(StreamHandlerClosures(
                onListen: { _, _ in nil }, onCancel: { _, _ in cancelled.set() }))
        }) { _, port in
            do {
                let wire = try RawConnection(port: port)
                try wire.send(.call(1, "watched", "listen"))
                _ = try await wire.frame()
            }
            #expect(try await eventually { cancelled.isSet })
        }
    }
}
