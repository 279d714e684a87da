#if canImport(Glibc)
import Glibc
#endif
import Synchronization
import Testing
import SwitchboardCodec
import SwitchboardPlugins
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// A server method (`test/block`) whose handler holds its loop's thread until the test lets it go: a
/// loop can be stopped between two frames that one read brought, while the jobs other loops send it wait.
final class LoopGate: Sendable {
    private let entered = Atomic<Int>(0)
    private let released = Atomic<Int>(0)

    /// Installs `test/block` on `server`: the n-th call waits until ``release()`` was called n times.
    func install(on server: Server) {
        MethodChannel(name: "test/block", server: server).setMethodCallHandler { [self] _, result in
            let ticket = entered.add(1, ordering: .acquiringAndReleasing).newValue
            _ = waitUntil(20) { released.load(ordering: .acquiring) >= ticket }
            result.success(.null)
        }
    }

    /// Waits until `count` calls have begun (their loop is held).
    func waitForEntered(_ count: Int) async throws {
        #expect(try await eventually { entered.load(ordering: .acquiring) >= count })
    }

    func release() { released.add(1, ordering: .acquiringAndReleasing) }
}

/// What a request meets when the channel it goes to changes between the caller's loop and the holder's.
@Suite("Requests in flight between loops")
struct InFlightBetweenLoopsTests {
    /// viewer may send on `orders/*` and call nothing there; ops may register them.
    static let rules = AccessRules(users: [
        .init(name: "viewer", tokenSha256: sha("viewer-token"), allow: .init(call: ["test/*"], send: ["orders/*"])),
        .init(name: "ops", tokenSha256: sha("ops-token"), allow: .init(register: ["orders/*", "test/fence"])),
        .init(name: "ops2", tokenSha256: sha("ops2-token"), allow: .init(register: ["orders/*", "test/fence"])),
    ])

    private func user(_ token: String, port: Int) async throws -> RawConnection {
        let wire = try RawConnection(port: port)
        try wire.send(hello(token: token))
        #expect(try await wire.frame().kind == .welcome)
        return wire
    }

    /// Replies to every request `wire` (a holder) was sent, up to the one on `fence`; returns those on `channel`.
    private func requestsReaching(_ wire: RawConnection, on channel: String, before fence: String) async throws -> [Frame] {
        var reached: [Frame] = []
        while true {
            let frame = try await wire.nextNonPing()
            guard frame.kind == .message else { continue }
            try wire.send(Frame(.reply, id: frame.id, payload: Array("done".utf8)))
            if frame.channel == fence { return reached }
            if frame.channel == channel { reached.append(frame) }
        }
    }

    @Test("a send judged on the caller's loop while the holder's loop re-declares the channel a method channel does not reach the holder as a call the caller may not make")
    func sendInFlightWhileChannelBecomesMethodChannel() async throws {
        let settings = LiveSettings(PluginConfiguration(access: Self.rules))
        let gate = LoopGate()
        try await withServer({ $0.loops = 4 }, setUp: { server in
            for plugin in PluginConfiguration.plugins(reading: settings) { server.load(plugin) }
            gate.install(on: server)
        }) { _, port in
            let viewer = try await user("viewer-token", port: port)  // loop 0
            let ops = try await user("ops-token", port: port)  // loop 1
            try ops.send(Frame(.register, id: 2, channel: "orders/notes", payload: Array(#"{"kind":"message","codec":"binary"}"#.utf8)))
            try ops.send(Frame(.register, id: 3, channel: "test/fence", payload: Array(#"{"kind":"method"}"#.utf8)))
            #expect(try await ops.frame() == Frame(.reply, id: 2, payload: nil))
            #expect(try await ops.frame() == Frame(.reply, id: 3, payload: nil))
            // One read on loop 1: a call that holds the loop, then the REGISTER that makes the channel a method channel.
            try ops.send(try Frame.call(4, "test/block", "wait").bytes
                         + Frame(.register, id: 5, channel: "orders/notes", payload: Array(#"{"kind":"method"}"#.utf8)).bytes)
            try await gate.waitForEntered(1)
            // Still a message channel where viewer's loop looks: a send, allowed, on its way to loop 1.
            try viewer.send(Frame(.message, id: 11, channel: "orders/notes", payload: [1, 2, 3]))
            try viewer.send(.call(12, "test/fence", "after"))  // goes to loop 1 after it
            _ = try await viewer.barrier()
            gate.release()
            let reached = try await requestsReaching(ops, on: "orders/notes", before: "test/fence")
            // On the holder's loop it is a call now, which viewer may not make: refused, and nothing reaches ops.
            #expect(reached.isEmpty, "forwarded to the holder as a call: \(reached)")
            let answers = [try await viewer.frame(), try await viewer.frame()]
            #expect(answers.first { $0.id == 11 }?.errorCode == "forbidden", "\(answers)")
        }
    }

    @Test("a send passed on to the loop the channel moved to is judged by what the channel is there: a new holder's method channel gets no call the caller may not make")
    func sendPassedOnToANewHoldersMethodChannel() async throws {
        let settings = LiveSettings(PluginConfiguration(access: Self.rules))
        let gate = LoopGate()
        try await withServer({ $0.loops = 4 }, setUp: { server in
            for plugin in PluginConfiguration.plugins(reading: settings) { server.load(plugin) }
            gate.install(on: server)
        }) { _, port in
            let viewer = try await user("viewer-token", port: port)  // loop 0
            let first = try await user("ops-token", port: port)  // loop 1
            let second = try await user("ops2-token", port: port)  // loop 2
            let observer = try await user("ops-token", port: port)  // loop 3, which may read the stats
            try first.send(Frame(.register, id: 2, channel: "orders/notes", payload: Array(#"{"kind":"message","codec":"binary"}"#.utf8)))
            #expect(try await first.frame() == Frame(.reply, id: 2, payload: nil))
            // One read on loop 1: hold the loop, let the channel go, hold the loop again.
            try first.send(try Frame.call(3, "test/block", "wait").bytes + Frame(.unregister, id: 4, channel: "orders/notes", payload: nil).bytes
                           + Frame.call(5, "test/block", "wait").bytes)
            try await gate.waitForEntered(1)
            try viewer.send(Frame(.message, id: 11, channel: "orders/notes", payload: [1, 2, 3]))  // a send, allowed
            _ = try await viewer.barrier()
            gate.release()
            try await gate.waitForEntered(2)  // let go on loop 1, which is held again
            // Another user takes the name, as a method channel, on loop 2.
            try second.send(Frame(.register, id: 3, channel: "orders/notes", payload: Array(#"{"kind":"method"}"#.utf8)))
            #expect(try await second.frame() == Frame(.reply, id: 3, payload: nil))
            gate.release()
            // The send is answered, or some loop serves it: a holder has it.
            #expect(try await eventually(5) {
                guard case .success(let stats) = try await call(observer, 9, "switchboard/stats", "get") else { return false }
                let crossLoop = stats["crossLoop"]
                return crossLoop?["callsPending"]?.intValue == 0 || (crossLoop?["callsServing"]?.intValue ?? 0) > 0
            })
            let reached = try await second.barrier().filter { $0.kind == .message && $0.channel == "orders/notes" }
            for frame in reached { try second.send(Frame(.reply, id: frame.id, payload: Array("done".utf8))) }
            #expect(reached.isEmpty, "passed on to the new holder as a call: \(reached)")
            let answer = try await viewer.nextNonPing()
            #expect(answer.id == 11 && answer.kind == .error, "\(answer)")
        }
    }
}

@Suite("What waits between loops is bounded")
struct CrossLoopBoundTests {
    @Test("ends a holder sends before it answers the first listen are kept once: only one crosses to each listening loop, whatever the holder sends")
    func endsBeforeTheListenIsAnsweredCrossOnce() async throws {
        try await withServer({ $0.loops = 2 }) { _, port in
            let listener = try RawConnection(port: port), holder = try RawConnection(port: port)  // loops 0 and 1
            try holder.send(Frame(.register, id: 1, channel: "ev", payload: Array(#"{"kind":"event"}"#.utf8)))
            #expect(try await holder.frame() == Frame(.reply, id: 1, payload: nil))
            try listener.send(.call(2, "ev", "listen"))
            let listen = try await holder.nextNonPing()  // left unanswered while the holder sends ends
            #expect(listen.kind == .message && listen.channel == "ev")
            var ends: [UInt8] = []
            for _ in 0..<2000 { ends += Frame(.message, id: 0, channel: "ev", payload: nil).bytes }
            try holder.send(ends)
            _ = try await holder.barrier()
            try holder.send(Frame(.reply, id: listen.id, payload: try StandardMethodCodec().encodeSuccessEnvelope(.null)))
            #expect(try await listener.nextNonPing().id == 2)
            let end = try await listener.nextNonPing()
            #expect(end.channel == "ev" && end.payload == nil)
            guard case .success(let stats) = try await call(listener, 9, "switchboard/stats", "get") else { throw TestFailure("no stats") }
            #expect(stats["crossLoop"]?["eventsIn"] == 1, "ends that crossed: \(String(describing: stats["crossLoop"]))")
        }
    }

    @Test("listens with id 0 to an event channel held on another loop, whose holder has not answered the first, leave nothing waiting once their connection is gone, and never more than its open requests")
    func detachedListensToAnotherLoopAreNotKeptForever() async throws {
        try await withServer({ $0.loops = 4; $0.maxOpenRequests = 8 }) { _, port in
            let attacker = try RawConnection(port: port)  // loop 0
            let holder = try RawConnection(port: port)  // loop 1
            let observer = try RawConnection(port: port)  // loop 2
            try holder.send(Frame(.register, id: 1, channel: "ev", payload: Array(#"{"kind":"event"}"#.utf8)))
            #expect(try await holder.frame() == Frame(.reply, id: 1, payload: nil))
            var burst: [UInt8] = []
            for _ in 0..<200 { burst += try Frame.call(0, "ev", "listen").bytes }
            try attacker.send(burst)
            let first = try await holder.nextNonPing()  // the first listen, which the holder leaves unanswered
            #expect(first.kind == .message && first.channel == "ev")
            _ = try await attacker.barrier()
            attacker.reset()
            // Everything the attacker began is gone with it (or at least bounded by its open requests).
            var crossLoop: ChannelValue?
            let settled = try await eventually(5) {
                guard case .success(let stats) = try await call(observer, 7, "switchboard/stats", "get") else { return false }
                crossLoop = stats["crossLoop"]
                return stats["connections"]?.intValue == 2
            }
            #expect(settled)
            let pending = crossLoop?["callsPending"]?.intValue ?? -1, serving = crossLoop?["callsServing"]?.intValue ?? -1
            #expect(pending <= 8 && serving <= 8, "calls still kept for a client that left: \(String(describing: crossLoop))")
        }
    }

    @Test("a holder's events past the sibling loop's room are dropped and counted, but its stream's end is not lost: the listener on the other loop hears that the holder left")
    func endOfStreamSurvivesTheSiblingEventLimit() async throws {
        let gate = LoopGate()
        try await withServer({ $0.loops = 4 }, setUp: { server in gate.install(on: server) }) { _, port in
            let viewer = try RawConnection(port: port), app = try RawConnection(port: port)  // loops 0 and 1
            let others = [try RawConnection(port: port), try RawConnection(port: port)]
            let blocker = try RawConnection(port: port)  // loop 0
            try app.send(Frame(.register, id: 2, channel: "feeds/prices", payload: Array(#"{"kind":"event"}"#.utf8)))
            #expect(try await app.frame() == Frame(.reply, id: 2, payload: nil))
            try viewer.send(.call(3, "feeds/prices", "listen"))
            let listen = try await app.nextNonPing()
            try app.send(Frame(.reply, id: listen.id, payload: try StandardMethodCodec().encodeSuccessEnvelope(.null)))
            #expect(try await viewer.nextNonPing().id == 3)
            try blocker.send(.call(4, "test/block", "wait"))
            try await gate.waitForEntered(1)  // loop 0 is held: what loop 1 sends it waits
            let event = try Frame(.message, id: 0, channel: "feeds/prices", payload: StandardMethodCodec().encodeSuccessEnvelope(1)).bytes
            var burst: [UInt8] = []
            burst.reserveCapacity(event.count * 70_000)
            for _ in 0..<70_000 { burst += event }
            try app.send(burst)
            _ = try await app.barrier()  // all of them handed to loop 0, or dropped
            try app.send(Frame(.unregister, id: 5, channel: "feeds/prices", payload: nil))
            #expect(try await app.nextNonPing() == Frame(.reply, id: 5, payload: nil))
            gate.release()
            // The listener gets what its queue kept, then handler_gone and the end: it must not wait for ever.
            var sawEnd = false
            do {
                while !sawEnd {
                    let frame = try await viewer.nextNonPing()
                    sawEnd = frame.channel == "feeds/prices" && frame.payload == nil
                }
            } catch {}
            #expect(sawEnd, "the listener on loop 0 never heard that the holder left")
            guard case .success(let stats) = try await call(others[0], 9, "switchboard/stats", "get") else { throw TestFailure("no stats") }
            #expect((stats["crossLoop"]?["dropped"]?.intValue ?? 0) > 0, "\(String(describing: stats["crossLoop"]))")
        }
    }

    @Test("calls to another loop that a duplicate id took off the wire stay bounded by the open-request limit, and go with their connection")
    func callsDetachedByDuplicateIDsAreNotKeptForever() async throws {
        try await withServer({ $0.loops = 4; $0.maxOpenRequests = 8 }) { _, port in
            let attacker = try RawConnection(port: port)  // loop 0
            let holder = try RawConnection(port: port)  // loop 1
            let observer = try RawConnection(port: port)  // loop 2
            try holder.send(Frame(.register, id: 1, channel: "svc", payload: Array(#"{"kind":"method"}"#.utf8)))
            #expect(try await holder.frame() == Frame(.reply, id: 1, payload: nil))
            // Each pair: a call the holder never answers, then the same id again, which answers the id
            // with duplicate_id and takes the first call off the wire (so it no longer counts as open).
            var burst: [UInt8] = []
            for _ in 0..<200 { burst += try Frame.call(7, "svc", "work").bytes + Frame.call(7, "svc", "work").bytes }
            try attacker.send(burst)
            _ = try await attacker.barrier()
            attacker.reset()
            var crossLoop: ChannelValue?
            let settled = try await eventually(5) {
                guard case .success(let stats) = try await call(observer, 7, "switchboard/stats", "get") else { return false }
                crossLoop = stats["crossLoop"]
                return stats["connections"]?.intValue == 2
            }
            #expect(settled)
            let pending = crossLoop?["callsPending"]?.intValue ?? -1, serving = crossLoop?["callsServing"]?.intValue ?? -1
            #expect(pending <= 8 && serving <= 8, "calls still kept for a client that left: \(String(describing: crossLoop))")
        }
    }
}
