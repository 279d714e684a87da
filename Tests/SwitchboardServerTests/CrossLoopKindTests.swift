import Testing
import SwitchboardPlugins
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// A request judged on its caller's loop whose channel changes kind on the holder's loop before it arrives.
@Suite("Kinds of requests in flight between loops")
struct CrossLoopKindTests {
    @Test("a text-mode listen judged on the caller's loop, whose channel its holder re-declares a method channel on the way, is refused forbidden as the call it has become, and counted in crossLoop.callsForbidden")
    func textListenThatBecomesACall() async throws {
        let settings = LiveSettings(PluginConfiguration(access: InFlightBetweenLoopsTests.rules))  // viewer may listen, not call, on orders/*
        let gate = LoopGate()
        try await withServer({ $0.loops = 4 }, setUp: { server in
            for plugin in PluginConfiguration.plugins(reading: settings) { server.load(plugin) }
            gate.install(on: server)
        }) { _, port in
            let text = try RawConnection(port: port)  // loop 0
            try text.send(line: #"{"hello":{"version":1,"token":"viewer-token"}}"#)
            #expect(try await text.line()["welcome"] != nil)
            let ops = try RawConnection(port: port)  // loop 1
            try ops.send(hello(token: "ops-token"))
            #expect(try await ops.frame().kind == .welcome)
            let observer = try RawConnection(port: port)  // loop 2
            try observer.send(hello(token: "ops2-token"))
            #expect(try await observer.frame().kind == .welcome)
            try ops.send(Frame(.register, id: 2, channel: "orders/feed", payload: Array(#"{"kind":"event"}"#.utf8)))
            #expect(try await ops.frame() == Frame(.reply, id: 2, payload: nil))
            // One read on loop 1: a call that holds the loop, then the REGISTER that makes the channel a method channel.
            try ops.send(try Frame.call(3, "test/block", "wait").bytes
                         + Frame(.register, id: 4, channel: "orders/feed", payload: Array(#"{"kind":"method"}"#.utf8)).bytes)
            try await gate.waitForEntered(1)
            // Still an event channel where the viewer's loop looks: a listen, allowed, on its way to loop 1.
            try text.send(line: #"{"id":12,"listen":"orders/feed"}"#)
            try text.send(line: #"{"id":13,"call":"test/block","method":"wait"}"#)  // loop 0 has sent the listen
            try await gate.waitForEntered(2)
            gate.release()
            gate.release()
            #expect(try await text.line()["id"] == 13)
            let answer = try await text.line()
            #expect(answer["id"] == 12 && answer["error"]?["code"] == "forbidden", "\(answer)")
            let reached = try await ops.barrier().filter { $0.kind == .message && $0.channel == "orders/feed" }
            #expect(reached.isEmpty, "forwarded to the holder as a call: \(reached)")
            guard case .success(let stats) = try await call(observer, 9, "switchboard/stats", "get") else { throw TestFailure("no stats") }
            #expect(stats["crossLoop"]?["callsForbidden"] == 1, "\(String(describing: stats["crossLoop"]))")
        }
    }
}
