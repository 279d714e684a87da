#if canImport(Glibc)
import Glibc
#endif
import Synchronization
import Testing
import SwitchboardCodec
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// A server with four loops, spoken to in raw bytes. Loop 0 deals connections round the loops in the
/// order it accepts them, so the `n`th connection a test opens (from 1) is on loop `(n - 1) % 4`.
@Suite("Loops") struct LoopTests {
    /// `count` connections, the `n`th on loop `(n - 1) % 4`.
    private func connect(_ count: Int, port: Int) throws -> [RawConnection] {
        try (0..<count).map { _ in try RawConnection(port: port) }
    }

    private func stats(via wire: RawConnection) async throws -> ChannelValue {
        try wire.send(.call(900, "switchboard/stats", "get"))
        return try await wire.frame().envelope().get()
    }

    @Test("connections are dealt round the loops; their ids tell the loop; stats and lists add up every loop")
    func connectionsAreDealtRound() async throws {
        try await withServer({ $0.loops = 4 }) { _, port in
            let wires = try connect(6, port: port)
            for wire in wires { #expect(try await wire.barrier().isEmpty) }  // each one served
            let stats = try await stats(via: wires[5])
            #expect(stats["loops"] == 4 && stats["connections"] == 6 && stats["connectionsTotal"] == 6)
            try wires[5].send(.call(1, "switchboard/connections", "list", ["limit": 4, "offset": 1]))
            let list = try await wires[5].frame().envelope().get()
            #expect(list["total"] == 6)
            #expect(list["connections"]?.listValue?.compactMap { $0["id"]?.intValue } == [2, 3, 4, 5])
            // `close` reaches a connection on another loop.
            try wires[5].send(.call(2, "switchboard/connections", "close", 3))
            #expect(try await wires[5].frame().envelope() == .success(.null))
            #expect(try await wires[2].isClosedByServer())
        }
    }

    @Test("a call to a channel a client holds on another loop gets the answers a caller on the holder's loop gets, CANCEL and handler_gone included")
    func callsCrossLoops() async throws {
        try await withServer({ $0.loops = 4 }) { _, port in
            let wires = try connect(5, port: port)
            let holder = wires[0], sameLoop = wires[4], otherLoop = wires[1]  // loops 0, 0, 1
            try holder.send(Frame(.register, id: 1, channel: "held/m", payload: Array(#"{"kind":"method"}"#.utf8)))
            #expect(try await holder.frame() == Frame(.reply, id: 1, payload: nil))

            // An answer, an error envelope and a null reply, each from both loops.
            for (answer, method) in [([0, 3, 1, 2, 3] as [UInt8]?, "ok"), ([1, 7, 1, 0x78, 0, 0], "err"), (nil, "none")] {
                var frames: [Frame] = []
                for caller in [sameLoop, otherLoop] {
                    try caller.send(.call(10, "held/m", method))
                    let forwarded = try await holder.frame()
                    #expect(forwarded.kind == .message && forwarded.channel == "held/m")
                    #expect(try StandardMethodCodec().decodeMethodCall(from: forwarded.payload?[...]).method == method)
                    try holder.send(Frame(.reply, id: forwarded.id, payload: answer))
                    frames.append(try await caller.frame())
                }
                #expect(frames[0] == frames[1] && frames[0].kind == .reply && frames[0].payload == answer)
            }

            // CANCEL: the holder hears it, and both callers get the same answer.
            var cancelled: [Frame] = []
            for caller in [sameLoop, otherLoop] {
                try caller.send(.call(11, "held/m", "slow"))
                let forwarded = try await holder.frame()
                try caller.send(Frame(.cancel, id: 11, payload: nil))
                #expect(try await holder.frame() == Frame(.cancel, id: forwarded.id, payload: nil))
                cancelled.append(try await caller.frame())
            }
            #expect(cancelled[0] == cancelled[1])

            // The holder leaves: both callers' open calls get handler_gone.
            try sameLoop.send(.call(12, "held/m", "pending"))
            try otherLoop.send(.call(12, "held/m", "pending"))
            _ = try await holder.frame()
            _ = try await holder.frame()
            shutdown(holder.fd, Int32(SHUT_RDWR))
            for caller in [sameLoop, otherLoop] {
                let gone = try await caller.frame()
                #expect(gone.errorCode == "handler_gone" && gone.id == 12)
            }
            // No holder now: a null reply, as for any channel nobody serves.
            try otherLoop.send(.call(13, "held/m", "again"))
            #expect(try await otherLoop.frame() == Frame(.reply, id: 13, payload: nil))
            let stats = try await stats(via: otherLoop)
            #expect(stats["crossLoop"]?["callsOut"]?.intValue ?? 0 >= 5)
            #expect(stats["crossLoop"]?["callsPending"] == 0 && stats["crossLoop"]?["callsServing"] == 0)
        }
    }

    @Test("channel_taken holds across loops, and a channel let go on one loop can be held on another")
    func oneHolderPerServer() async throws {
        try await withServer({ $0.loops = 4 }) { _, port in
            let wires = try connect(3, port: port)
            try wires[0].send(Frame(.register, id: 1, channel: "solo", payload: nil))
            #expect(try await wires[0].frame().kind == .reply)
            for wire in wires.dropFirst() {
                try wire.send(Frame(.register, id: 2, channel: "solo", payload: nil))
                let taken = try await wire.frame()
                #expect(taken.errorCode == "channel_taken" && taken.id == 2)
            }
            try wires[0].send(Frame(.unregister, id: 3, channel: "solo", payload: nil))
            #expect(try await wires[0].frame().kind == .reply)
            try wires[2].send(Frame(.register, id: 4, channel: "solo", payload: nil))
            #expect(try await wires[2].frame() == Frame(.reply, id: 4, payload: nil))
            // The claim goes with the connection too.
            shutdown(wires[2].fd, Int32(SHUT_RDWR))
            var id: UInt32 = 4
            #expect(try await eventually {  // once the server has seen the close
                id += 1
                try wires[1].send(Frame(.register, id: id, channel: "solo", payload: nil))
                return try await wires[1].frame() == Frame(.reply, id: id, payload: nil)
            })
        }
    }

    @Test("listeners on other loops of a client-held event channel: one listen and one cancel reach the holder, events and the end reach them all")
    func heldStreamsCrossLoops() async throws {
        try await withServer({ $0.loops = 4 }) { _, port in
            let wires = try connect(4, port: port)
            let holder = wires[0], listeners = Array(wires[1...3])  // loops 0; 1, 2, 3
            try holder.send(Frame(.register, id: 1, channel: "held/e", payload: Array(#"{"kind":"event"}"#.utf8)))
            #expect(try await holder.frame().kind == .reply)
            try listeners[0].send(.call(5, "held/e", "listen"))
            let listen = try await holder.frame()
            #expect(try StandardMethodCodec().decodeMethodCall(from: listen.payload?[...]).method == "listen")
            try holder.send(Frame(.reply, id: listen.id, payload: try StandardMethodCodec().encodeSuccessEnvelope(.null)))
            #expect(try await listeners[0].frame().kind == .reply)
            for listener in listeners.dropFirst() {
                try listener.send(.call(5, "held/e", "listen"))
                #expect(try await listener.frame().kind == .reply)  // the stream is live: the holder hears nothing
            }
            let event = try StandardMethodCodec().encodeSuccessEnvelope("tick")
            try holder.send(Frame(.message, id: 0, channel: "held/e", payload: event))
            for listener in listeners { #expect(try await listener.frame() == Frame(.message, id: 0, channel: "held/e", payload: event)) }
            for listener in listeners.dropLast() {
                try listener.send(.call(6, "held/e", "cancel"))
                #expect(try await listener.frame().kind == .reply)
            }
            #expect(try await holder.barrier().isEmpty)  // a listener is left
            try listeners[2].send(.call(6, "held/e", "cancel"))
            #expect(try await listeners[2].frame().kind == .reply)
            let cancel = try await holder.frame()
            #expect(try StandardMethodCodec().decodeMethodCall(from: cancel.payload?[...]).method == "cancel")
        }
    }

    @Test("/metrics reports every loop's latest counts: a loop that did not answer, or a gather older than the last, never makes a total go back or count twice")
    func metricsNeverCountTwice() throws {
        var config = ServerConfiguration()
        config.loops = 2
        let server = try Server(configuration: config)
        func snapshot(loop: Int, sequence: UInt64, frames: Int) -> MetricsSnapshot {
            var snapshot = MetricsSnapshot(loop: loop, sequence: sequence)
            snapshot.totals[.init(label: "switchboard_frames_in_total", dimensions: [:])] = frames
            return snapshot
        }
        func framesIn() -> String? {
            let text = String(decoding: config.metrics.exposition?() ?? [], as: UTF8.self)
            return text.split(separator: "\n").first { $0.hasPrefix("switchboard_frames_in_total ") }.map(String.init)
        }
        server.group.report([snapshot(loop: 0, sequence: 2, frames: 10), snapshot(loop: 1, sequence: 2, frames: 5)])
        #expect(framesIn() == "switchboard_frames_in_total 15")
        server.group.report([snapshot(loop: 0, sequence: 3, frames: 12), nil])                        // loop 1 stopped
        #expect(framesIn() == "switchboard_frames_in_total 17")
        server.group.report([snapshot(loop: 0, sequence: 1, frames: 7), snapshot(loop: 1, sequence: 1, frames: 2)])  // an old gather
        #expect(framesIn() == "switchboard_frames_in_total 17")
    }

    @Test("a listen from another loop that the quick look cannot tell (a Standard size in long form) still starts a stream there")
    func unusualListenCrossesLoops() async throws {
        try await withServer({ $0.loops = 4 }) { _, port in
            let wires = try connect(2, port: port)
            let holder = wires[0], listener = wires[1]  // loops 0 and 1
            try holder.send(Frame(.register, id: 1, channel: "held/x", payload: Array(#"{"kind":"event"}"#.utf8)))
            #expect(try await holder.frame().kind == .reply)
            try listener.send(Frame(.message, id: 5, channel: "held/x", payload: [7, 254, 6, 0] + Array("listen".utf8) + [0]))
            let listen = try await holder.frame()
            #expect(try StandardMethodCodec().decodeMethodCall(from: listen.payload?[...]).method == "listen")
            try holder.send(Frame(.reply, id: listen.id, payload: try StandardMethodCodec().encodeSuccessEnvelope(.null)))
            #expect(try await listener.frame().kind == .reply)
            let event = try StandardMethodCodec().encodeSuccessEnvelope(7)
            try holder.send(Frame(.message, id: 0, channel: "held/x", payload: event))
            #expect(try await listener.frame() == Frame(.message, id: 0, channel: "held/x", payload: event))
            try listener.send(.call(6, "held/x", "cancel"))
            #expect(try await listener.frame().kind == .reply)
            let cancel = try await holder.frame()
            #expect(try StandardMethodCodec().decodeMethodCall(from: cancel.payload?[...]).method == "cancel")
        }
    }

    @Test("a broadcast crosses once to each loop with listeners, and only to those")
    func broadcastsCrossOncePerLoop() async throws {
        try await withServer({ $0.loops = 4 }) { _, port in
            let wires = try connect(6, port: port)  // loops 0, 1, 2, 3, 0, 1
            for listener in [wires[1], wires[2], wires[5]] {  // loops 1, 2, 1
                try listener.send(.call(1, "switchboard/room", "listen"))
                #expect(try await listener.frame().kind == .reply)
            }
            try wires[0].send(Frame(.message, id: 2, channel: "switchboard/room.post", payload: [1, 2, 3]))
            #expect(try await wires[0].frame().kind == .reply)
            let expected = Frame(.message, id: 0, channel: "switchboard/room",
                                 payload: try StandardMethodCodec().encodeSuccessEnvelope(.uint8List([1, 2, 3])))
            for listener in [wires[1], wires[2], wires[5]] { #expect(try await listener.frame() == expected) }
            let stats = try await stats(via: wires[3])
            #expect(stats["crossLoop"]?["eventsOut"] == 1 && stats["crossLoop"]?["eventsIn"] == 2)  // to loops 1 and 2
            #expect(stats["events"] == 3)  // counted on each loop that delivered it
        }
    }

    @Test("broadcasts a sibling loop has no room for (65,536 waiting) are dropped and counted, never queued without bound")
    func siblingLoopEventsAreBounded() async throws {
        let blocking = Atomic<Bool>(false), released = Atomic<Bool>(false)
        let extra = 100, burst = LoopGroup.siblingEventLimit + extra
        try await withServer({ $0.loops = 2 }, setUp: { server in
            let events = EventChannel(name: "burst/events", server: server)
            events.setStreamHandler(StreamHandlerClosures(onListen: { _, _ in nil }))
            // Callback handlers run on the caller's loop thread (async ones would run in tasks).
            MethodChannel(name: "burst", server: server).setMethodCallHandler { _, result in
                for i in 0..<burst { events.broadcast(.int(i)) }  // on loop 0's thread: straight to the other loop
                result.success(.null)
            }
            MethodChannel(name: "block", server: server).setMethodCallHandler { _, result in
                blocking.store(true, ordering: .releasing)
                while !released.load(ordering: .acquiring) { usleep(1000) }  // holds its loop: nothing there drains
                result.success(.null)
            }
        }) { _, port in
            let wires = try connect(2, port: port)  // loops 0, 1
            try wires[1].send(.call(1, "burst/events", "listen"))
            #expect(try await wires[1].frame().kind == .reply)
            try wires[1].send(.call(2, "block", "now"))
            #expect(try await eventually { blocking.load(ordering: .acquiring) })
            try wires[0].send(.call(3, "burst", "now"))
            #expect(try await wires[0].frame().envelope() == .success(.null))
            released.store(true, ordering: .releasing)
            let stats = try await stats(via: wires[0])
            #expect(stats["crossLoop"]?["dropped"] == .int(extra), "\(stats["crossLoop"] ?? .null)")
            #expect(stats["crossLoop"]?["eventsOut"] == .int(burst))
        }
    }
}
