import Testing
import SwitchboardCodec
import SwitchboardPlugins
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// Numbers at the edges of their types, where a conversion once trapped (issue 27, "no trap on client
/// input"). The other places that take a number from a client are listed in the issue's note.
@Suite struct NoTrapTests {
    @Test("a rate limit with the smallest rate refuses with a retryAfterMs that fits an Int, in binary and text mode")
    func retryAfterOfATinyRate() throws {
        let rules = [RateLimitRule(channels: ["switchboard/echo"], perConnection: .init(rate: 5e-324, burst: 1))]
        let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: LiveSettings(PluginConfiguration(rateLimits: rules))))
        let peer = embedded.connect()
        for id in UInt32(1)...2 { peer.send(try .call(id, "switchboard/echo", "echo")) }
        embedded.run()
        let answers = try peer.frames()
        #expect(answers.map(\.kind) == [.reply, .error] && answers[1].errorCode == "rate_limited")
        let retry = try JSONText.parse(try #require(answers[1].payload))["details"]?["retryAfterMs"]?.intValue
        #expect((retry ?? 0) > 0)

        let text = embedded.connect(name: "192.0.2.2:5000")  // another address: anonymous buckets are per address
        text.send(line: #"{"id":1,"call":"switchboard/echo","method":"echo"}"#)
        text.send(line: #"{"id":2,"call":"switchboard/echo","method":"echo"}"#)
        embedded.run()
        #expect(try text.lines().map { $0["error"]?["code"] } == [nil, "rate_limited"])
    }

    @Test("a request log whose slowMs is beyond Int64's microseconds logs requests instead of trapping on them")
    func requestLogWithAHugeSlowMs() throws {
        for slowMs in [1e300, -1e300] {
            let settings = LiveSettings(PluginConfiguration(requestLog: RequestLogSettings(slowMs: slowMs)))
            let embedded = try EmbeddedServer(plugins: PluginConfiguration.plugins(reading: settings))
            let peer = embedded.connect()
            peer.send(try .call(1, "switchboard/echo", "echo", 7))
            embedded.run()
            #expect(try peer.frames().map(\.kind) == [.reply])
        }
    }

    @Test("a ticker at intervalMs 0 emits a batch per loop turn, not the whole outbound limit at once, and goes on")
    func tickerAtIntervalZeroGivesTheLoopBack() throws {
        let embedded = try EmbeddedServer()
        let peer = embedded.connect()
        peer.send(try .call(1, "switchboard/ticker", "listen", .stringMap(["intervalMs": 0])))
        embedded.run(turns: 3)
        let first = try peer.frames().filter { $0.id == 0 }.count
        #expect(first > 0 && first <= 3 * 1024, "\(first) events in three loop turns")
        var more = 0
        for _ in 0..<5 {  // the ticker waits 1 ms between batches
            embedded.advanceTime(byMs: 1)
            more += try peer.frames().count
        }
        #expect(more > 4096)
    }
}
