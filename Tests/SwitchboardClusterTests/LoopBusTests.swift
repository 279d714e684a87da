import Testing
@testable import SwitchboardCluster
import SwitchboardTransport

/// The in-process bus between loops, with two loops this thread drives.
@Suite("LoopBus") struct LoopBusTests {
    final class Received { var messages: [BusMessage] = [] }

    @Test("subjects and wildcards match as in NATS")
    func subjectMatching() {
        #expect(LoopBusHub.matches("a.b", pattern: "a.*"))
        #expect(!LoopBusHub.matches("a.b.c", pattern: "a.*"))
        #expect(!LoopBusHub.matches("a", pattern: "a.*"))
        #expect(LoopBusHub.matches("a.b.c", pattern: "a.>"))
        #expect(!LoopBusHub.matches("a", pattern: "a.>"))
        #expect(LoopBusHub.matches("x.y.z", pattern: "*.y.*"))
        #expect(!LoopBusHub.matches("x.q.z", pattern: "*.y.*"))
    }

    @Test("a loop hears the others, never itself; a queue group gets one copy; no responders, a full inbox and a late unsubscribe are answered or counted")
    func delivery() throws {
        let loops = [try EventLoop(), try EventLoop()]
        defer { for loop in loops { loop.finishDriving() } }
        let hub = LoopBusHub(loops: loops.map(\.handle), inboxLimit: 2)
        let buses = [hub.bus(0, loop: loops[0]), hub.bus(1, loop: loops[1])]
        let heard = [Received(), Received()]
        for (index, bus) in buses.enumerated() {
            _ = try bus.subscribe("a.*", queue: nil) { heard[index].messages.append($0) }
            _ = try bus.subscribe("q", queue: "g") { heard[index].messages.append($0) }
        }
        func run() { for loop in loops { loop.runOnce() } }

        try buses[0].publish("a.b", payload: [1])
        try buses[0].publish("a.b.c", payload: [2])  // matches nothing
        try buses[0].publish("q", payload: [3])      // the group's other member only: no echo
        run()
        #expect(heard[0].messages.isEmpty)
        #expect(heard[1].messages.map(\.payload) == [[1], [3]])

        // Nobody else subscribes: the reply subject gets NATS's no-responders status.
        try buses[0].publish("nobody", replyTo: "a.reply", headers: [], payload: [])
        run()
        #expect(heard[0].messages.map(\.status) == [503])

        // Loop 1 does not run: past two waiting messages, publishes are dropped and counted, requests are not.
        heard[1].messages = []
        for n in 0..<3 { try buses[0].publish("a.x", payload: [UInt8(n)]) }
        try buses[0].publish("a.x", replyTo: "a.back", headers: [], payload: [9])
        #expect(buses[0].counters.dropped == 1)
        run()
        #expect(heard[1].messages.map(\.payload) == [[0], [1], [9]])

        // A request whose subscription went before it arrived is answered with no-responders.
        heard[0].messages = []
        let late = try buses[1].subscribe("late", queue: nil) { _ in Issue.record("delivered after unsubscribe") }
        try buses[0].publish("late", replyTo: "a.late", headers: [], payload: [])
        buses[1].unsubscribe(late)
        run()
        run()
        #expect(heard[0].messages.map(\.status) == [503])
        #expect(throws: BusError.self) { try buses[0].publish("bad subject", payload: []) }
    }

    @Test("only what mayDrop allows is dropped; a loop that leaves answers the requests still waiting for it")
    func controlMessagesAndLeaving() throws {
        let loops = [try EventLoop(), try EventLoop()]
        defer { for loop in loops { loop.finishDriving() } }
        let hub = LoopBusHub(loops: loops.map(\.handle), inboxLimit: 1, mayDrop: { $0.header("Keep") == nil })
        let buses = [hub.bus(0, loop: loops[0]), hub.bus(1, loop: loops[1])]
        let heard = [Received(), Received()]
        _ = try buses[0].subscribe("back.*", queue: nil) { heard[0].messages.append($0) }
        _ = try buses[1].subscribe("work", queue: nil) { heard[1].messages.append($0) }
        func run() { for loop in loops { loop.runOnce() } }

        try buses[0].publish("work", payload: [1])
        try buses[0].publish("work", payload: [2])                                // dropped: the inbox holds one
        try buses[0].publish("work", headers: [.init("Keep", "1")], payload: [3])  // kept
        #expect(buses[0].counters.dropped == 1)
        run()
        #expect(heard[1].messages.map(\.payload) == [[1], [3]])

        // Loop 1 leaves with a request waiting for it: the requester hears no-responders.
        try buses[0].publish("work", replyTo: "back.1", headers: [], payload: [4])
        buses[1].close()
        run()
        #expect(heard[0].messages.map(\.status) == [503])
        #expect(heard[1].messages.count == 2)
    }
}
