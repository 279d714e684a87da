import Glibc
import Testing
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// The next frame on `wire` that is not an event (a room post of the warm-up may still be on its way).
private func nextNonEvent(_ wire: RawConnection) async throws -> Frame {
    while true {
        let frame = try await wire.frame()
        if frame.kind != .message || frame.id != 0 { return frame }
    }
}

/// Nodes of several loops: each loop is a node of the cluster, and the server still behaves as one.
@Suite("A cluster of nodes with several loops", .serialized, .needsNATSServer)
struct ClusterLoopTests {
    @Test("each loop of a node is a node of the cluster: broadcasts and calls reach every loop of every node, and channel_taken holds within a node")
    func loopsOfNodes() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(2, loops: 2, nats: nats)
        // The nth connection to a node is on its loop (n - 1) % 2.
        let a0 = try RawConnection(port: nodes.servers[0].port), a1 = try RawConnection(port: nodes.servers[0].port)
        let b0 = try RawConnection(port: nodes.servers[1].port), b1 = try RawConnection(port: nodes.servers[1].port)
        #expect(try await eventually {
            try b0.send(.call(1, "switchboard/stats", "get"))
            let stats = try await b0.frame().envelope().get()
            return stats["cluster"]?["connected"] == true && stats["cluster"]?["nodes"] == 3 && stats["loops"] == 2
        })

        for listener in [a0, a1, b1] {
            try listener.send(.call(2, "switchboard/room", "listen"))
            #expect(try await listener.frame().kind == .reply)
        }
        // Posts from node b's loop 0 until all three listeners have one (their subscriptions reach nats-server).
        let posted = Frame(.message, id: 0, channel: "switchboard/room", payload: try StandardMethodCodec().encodeSuccessEnvelope(.uint8List([9])))
        var heard: [Bool] = [false, false, false]
        #expect(try await eventually {
            try b0.send(Frame(.message, id: 3, channel: "switchboard/room.post", payload: [9]))
            for (index, listener) in [a0, a1, b1].enumerated() {
                for frame in try await listener.barrier() where frame == posted { heard[index] = true }
            }
            _ = try await b0.barrier()
            return heard.allSatisfy { $0 }
        })

        // A channel held on node b's loop 1, called from both loops of node a.
        try b1.send(Frame(.register, id: 4, channel: "held/m", payload: Array(#"{"kind":"method"}"#.utf8)))
        #expect(try await nextNonEvent(b1).kind == .reply)
        try b0.send(Frame(.register, id: 5, channel: "held/m", payload: nil))
        #expect(try await b0.frame().errorCode == "channel_taken")
        // Callers that listen to nothing: node a's third and fourth connections, on its loops 0 and 1.
        let callers = [try RawConnection(port: nodes.servers[0].port), try RawConnection(port: nodes.servers[0].port)]
        // Once node b's subscription has reached nats-server (a call gets more than the null reply of no holder):
        var probe: UInt32 = 100
        #expect(try await eventually {
            probe += 1
            try callers[0].send(.call(probe, "held/m", "probe"))
            for forwarded in try await b1.barrier() where forwarded.kind == .message {
                try b1.send(Frame(.reply, id: forwarded.id, payload: [0]))
            }
            return try await callers[0].barrier().contains { $0.kind == .reply && $0.payload == [0] }
        })
        try await Task.sleep(for: .milliseconds(100))  // real time: late answers to earlier probes, however many come
        _ = try await b1.barrier()
        _ = try await callers[0].barrier()
        for caller in callers {
            try caller.send(.call(7, "held/m", "x"))
            let forwarded = try await nextNonEvent(b1)
            #expect(forwarded.kind == .message && forwarded.channel == "held/m")
            try b1.send(Frame(.reply, id: forwarded.id, payload: [1, 2]))
            #expect(try await caller.frame() == Frame(.reply, id: 7, payload: [1, 2]))
        }
        // Node b's loop 0 calls the channel its loop 1 holds: the node keeps its own clients' calls.
        try b0.send(.call(8, "held/m", "y"))
        let forwarded = try await nextNonEvent(b1)
        try b1.send(Frame(.reply, id: forwarded.id, payload: [3]))
        #expect(try await b0.frame() == Frame(.reply, id: 8, payload: [3]))
        try b0.send(.call(9, "switchboard/stats", "get"))
        let stats = try await b0.frame().envelope().get()
        #expect(stats["crossLoop"]?["callsOut"] == 1 && stats["crossLoop"]?["callsIn"] == 1)
        await nodes.stop()
    }
}

extension ClusterLoopTests {
    @Test("a node's broadcasts reach its listeners on every loop while its bus is down")
    func ownListenersDuringOutage() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(1, loops: 2, nats: nats)
        // The nth connection is on loop (n - 1) % 2: listeners on loops 0 and 1, the poster on loop 0.
        let listeners = [try RawConnection(port: nodes.servers[0].port), try RawConnection(port: nodes.servers[0].port)]
        let poster = try RawConnection(port: nodes.servers[0].port)
        func cluster() async throws -> ChannelValue {
            try poster.send(.call(1, "switchboard/stats", "get"))
            return try await poster.frame().envelope().get()["cluster"] ?? .null
        }
        #expect(try await eventually { try await cluster()["connected"] == true })
        for listener in listeners {
            try listener.send(.call(2, "switchboard/room", "listen"))
            #expect(try await listener.frame().kind == .reply)
        }
        nats.stop()
        // Both loops' buses are down: each has failed to reconnect at least once (the sum, at least twice each).
        #expect(try await eventually {
            let stats = try await cluster()
            return stats["connected"] == false && stats["busConnectFailures"]?.intValue ?? 0 >= 4
        })
        for id in 1...100 { try poster.send(Frame(.message, id: UInt32(10 + id), channel: "switchboard/room.post", payload: [7])) }
        let event = Frame(.message, id: 0, channel: "switchboard/room", payload: try StandardMethodCodec().encodeSuccessEnvelope(.uint8List([7])))
        var heard = [0, 0]
        // Bound: all 100 on both loops within 10 s (at once, in fact); not one more.
        #expect(try await eventually {
            for (index, listener) in listeners.enumerated() {
                heard[index] += try await listener.barrier().filter { $0 == event }.count
            }
            return heard == [100, 100]
        }, "\(heard)")
        #expect(heard == [100, 100])
        await nodes.stop()
    }

    @Test("a node's broadcasts reach its listeners on every loop at once while its nats-server hangs, and once it resumes none comes twice")
    func ownListenersWhileTheServerHangs() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(1, loops: 2, nats: nats)
        // The nth connection is on loop (n - 1) % 2: listeners on loops 0 and 1, the poster on loop 0.
        let listeners = [try RawConnection(port: nodes.servers[0].port), try RawConnection(port: nodes.servers[0].port)]
        let poster = try RawConnection(port: nodes.servers[0].port)
        func connected() async throws -> Bool {
            _ = try await poster.barrier()  // the posts' answers
            try poster.send(.call(1, "switchboard/stats", "get"))
            return try await poster.frame().envelope().get()["cluster"]?["connected"] == true
        }
        #expect(try await eventually { try await connected() })
        for listener in listeners {
            try listener.send(.call(2, "switchboard/room", "listen"))
            #expect(try await listener.frame().kind == .reply)
        }
        func post(_ byte: UInt8, id: Int) throws {
            try poster.send(Frame(.message, id: UInt32(10 + id), channel: "switchboard/room.post", payload: [byte]))
        }
        func event(_ byte: UInt8) throws -> Frame {
            Frame(.message, id: 0, channel: "switchboard/room", payload: try StandardMethodCodec().encodeSuccessEnvelope(.uint8List([byte])))
        }
        // The server accepts and never answers: the connection looks alive for two pings (about 3 s).
        nats.signal(SIGSTOP)
        for id in 1...100 { try post(7, id: id) }
        var heard = [[Frame]](repeating: [], count: 2)
        // All 100 on both loops while the server is still stopped and its connection not yet found
        // dead (the bus still says connected, and has not reconnected); before, the sibling loop heard
        // none of them until then.
        #expect(try await eventually {
            for (index, listener) in listeners.enumerated() { heard[index] += try await listener.barrier().filter { $0.channel == "switchboard/room" } }
            return heard.map(\.count) == [100, 100]
        }, "\(heard.map(\.count))")
        let meanwhile = try await clusterStats(poster)
        #expect(meanwhile["connected"] == true && meanwhile["busReconnects"] == 0, "\(meanwhile)")
        nats.signal(SIGCONT)
        // Once the bus is back, one more post: each loop hears it once, after the 100, and nothing twice.
        #expect(try await eventually { try await connected() })
        try post(8, id: 101)
        #expect(try await eventually {
            for (index, listener) in listeners.enumerated() { heard[index] += try await listener.barrier().filter { $0.channel == "switchboard/room" } }
            return heard.allSatisfy { $0.last == (try? event(8)) }
        })
        for index in 0..<2 { heard[index] += try await listeners[index].barrier().filter { $0.channel == "switchboard/room" } }
        let expected = try Array(repeating: event(7), count: 100) + [event(8)]
        #expect(heard[0] == expected && heard[1] == expected, "\(heard.map(\.count))")
        await nodes.stop()
    }
}

extension ClusterLoopTests {
    @Test("a channel held on one loop of a node is listened to from its other loop while the node's bus is down: the listen, the holder's events and the cancel go between the loops, never by the bus")
    func siblingStreamDuringOutage() async throws {
        let nats = try NATSServerProcess()
        let nodes = try ClusterNodes(1, loops: 2, nats: nats)
        // The nth connection is on loop (n - 1) % 2: the holder on loop 0, the listener on loop 1.
        let holder = try RawConnection(port: nodes.servers[0].port), listener = try RawConnection(port: nodes.servers[0].port)
        let asker = try RawConnection(port: nodes.servers[0].port)
        func cluster() async throws -> ChannelValue {
            try asker.send(.call(1, "switchboard/stats", "get"))
            return try await asker.frame().envelope().get()["cluster"] ?? .null
        }
        #expect(try await eventually { try await cluster()["connected"] == true })
        try holder.send(Frame(.register, id: 1, channel: "held/feed", payload: Array(#"{"kind":"event"}"#.utf8)))
        #expect(try await holder.frame().kind == .reply)
        nats.stop()
        // Both loops' buses are down: each has failed to reconnect at least once (the sum, at least twice each).
        #expect(try await eventually {
            let stats = try await cluster()
            return stats["connected"] == false && stats["busConnectFailures"]?.intValue ?? 0 >= 4
        })
        try listener.send(.call(2, "held/feed", "listen"))
        let listen = try await holder.frame()
        #expect(try StandardMethodCodec().decodeMethodCall(from: listen.payload?[...]).method == "listen")
        try holder.send(Frame(.reply, id: listen.id, payload: try StandardMethodCodec().encodeSuccessEnvelope(.null)))
        #expect(try await listener.frame() == Frame(.reply, id: 2, payload: try StandardMethodCodec().encodeSuccessEnvelope(.null)))
        let event = try StandardMethodCodec().encodeSuccessEnvelope(7)
        try holder.send(Frame(.message, id: 0, channel: "held/feed", payload: event))
        #expect(try await listener.frame() == Frame(.message, id: 0, channel: "held/feed", payload: event))
        try listener.send(.call(3, "held/feed", "cancel"))
        #expect(try await listener.frame().kind == .reply)
        let cancel = try await holder.frame()
        #expect(try StandardMethodCodec().decodeMethodCall(from: cancel.payload?[...]).method == "cancel")
        await nodes.stop()
    }
}
