import Testing
import SwitchboardTransport

/// A loop whose clock the caller moves (``EventLoop/useManualClock()``): what EmbeddedServer's
/// `advanceTime(byMs:)` stands on.
@Suite struct ManualClockTests {
    @Test("the clock stands still until moved; timers fire by due time, then in the order started, each at its own time")
    func timersFireInOrderAtTheirTimes() throws {
        let loop = try EventLoop()
        defer { loop.finishDriving() }
        try loop.useManualClock()
        let start = loop.now
        var fired: [(String, UInt64)] = []
        let late = try Timer(loop: loop), early = try Timer(loop: loop), tie = try Timer(loop: loop)
        let repeating = try Timer(loop: loop), stopped = try Timer(loop: loop), now = try Timer(loop: loop)
        late.start(after: 30) { fired.append(("late", loop.now - start)) }
        early.start(after: 10) { fired.append(("early", loop.now - start)) }
        tie.start(after: 10) { fired.append(("tie", loop.now - start)) }
        repeating.start(after: 15, repeat: 10) { fired.append(("repeating", loop.now - start)) }
        stopped.start(after: 5) { fired.append(("stopped", loop.now - start)) }
        stopped.stop()
        now.start(after: 0) { fired.append(("now", loop.now - start)) }
        loop.runOnce()
        #expect(fired.map(\.0) == ["now"] && loop.now == start)
        fired = []
        loop.advanceTime(byMs: 40) { loop.runOnce() }
        #expect(fired.map(\.0) == ["early", "tie", "repeating", "repeating", "late", "repeating"])
        #expect(fired.map(\.1) == [10, 10, 15, 25, 30, 35])
        #expect(loop.now == start + 40)
    }

    @Test("a timer restarted or cancelled before it is due does not fire then")
    func restartAndCancel() throws {
        let loop = try EventLoop()
        defer { loop.finishDriving() }
        try loop.useManualClock()
        var fired: [String] = []
        let restarted = try Timer(loop: loop), cancelled = try Timer(loop: loop)
        restarted.start(after: 10) { fired.append("first") }
        cancelled.start(after: 10) { fired.append("cancelled") }
        loop.advanceTime(byMs: 5) { loop.runOnce() }
        restarted.start(after: 10) { fired.append("restarted") }
        cancelled.cancel()
        loop.advanceTime(byMs: 9) { loop.runOnce() }
        #expect(fired.isEmpty)
        loop.advanceTime(byMs: 1) { loop.runOnce() }
        #expect(fired == ["restarted"])
    }
}
