import Synchronization
import Testing
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// Results a handler keeps, to answer later from another call's handler.
private final class KeptResults: Sendable {
    private let results = Mutex<[String: MethodResult]>([:])
    func keep(_ result: MethodResult, as name: String) { results.withLock { $0[name] = result } }
    func take(_ name: String) -> MethodResult? { results.withLock { $0.removeValue(forKey: name) } }
}

/// A connection reuses an answered request, and the storage of the last Uint8List argument, for the
/// next call: only when nothing else holds them, so a handler that keeps either never sees it change.
@Suite struct Reuse {
    /// A channel whose handler answers `echo` at once, holds `hold` open, answers `answerAndKeep` at
    /// once but keeps its result, and on `release` answers a kept result with `release`'s argument.
    private func keepingChannel(on embedded: EmbeddedServer) -> KeptResults {
        let kept = KeptResults()
        MethodChannel(name: "keep", server: embedded.server).setMethodCallHandler { call, result in
            switch call.method {
            case "echo": result.success(call.arguments)
            case "hold": kept.keep(result, as: "hold")
            case "answerAndKeep":
                result.success("first")
                kept.keep(result, as: "answered")
            case "release":
                kept.take(call.arguments.stringValue == "second" ? "answered" : "hold")?.success(call.arguments)
                result.success("released")
            default: result.notImplemented()
            }
        }
        embedded.run()
        return kept
    }

    @Test func aResultKeptByItsHandlerIsNeverReusedForAnotherCall() throws {
        let embedded = try EmbeddedServer()
        defer { embedded.finish() }
        _ = keepingChannel(on: embedded)
        let peer = embedded.connect()
        var answers: [UInt32: ChannelValue] = [:]
        func exchange(_ calls: [(UInt32, String, ChannelValue)]) throws {
            for (id, method, argument) in calls { peer.send(try .call(id, "keep", method, argument)) }
            embedded.run()
            for frame in try peer.frames() where frame.kind == .reply {
                #expect(answers[frame.id] == nil, "a second answer for id \(frame.id)")
                answers[frame.id] = try frame.envelope().get()
            }
        }
        // 1 stays open while 2 and 3 are answered at once (their requests may be reused, 1's not).
        try exchange([(1, "hold", .null), (2, "echo", "two"), (3, "echo", "three")])
        #expect(answers == [2: "two", 3: "three"])
        // 4 is answered at once, but its handler keeps its result: 5, held open, must get a request of
        // its own, or the kept result's late answer would reach 5.
        try exchange([(4, "answerAndKeep", .null), (5, "hold", .null)])
        try exchange([(6, "release", "second")])
        #expect(answers[4] == "first" && answers[5] == nil && answers[6] == "released")
        try exchange([(7, "release", "late")])
        #expect(answers[5] == "late" && answers[7] == "released" && answers[1] == nil)
    }

    /// A cancel hook set after the answer belongs to nothing: a later request that reuses the answered
    /// one must not run it when it is cancelled.
    @Test func aHookSetAfterTheAnswerNeverRunsForALaterRequest() throws {
        let embedded = try EmbeddedServer()
        defer { embedded.finish() }
        let staleHookRuns = AtomicCounter()
        let kept = KeptResults()
        MethodChannel(name: "late", server: embedded.server).setMethodCallHandler { call, result in
            if call.method == "hold" { return kept.keep(result, as: "hold") }
            result.success(.null)
            result.onCancel { staleHookRuns.increment() }
        }
        embedded.run()
        let peer = embedded.connect()
        peer.send(try .call(1, "late", "answer"))
        peer.send(try .call(2, "late", "hold"))
        embedded.run()
        peer.send(Frame(.cancel, id: 2, payload: nil))
        embedded.run()
        let answers = try peer.frames().filter { $0.kind == .reply }
        #expect(answers.map(\.id) == [1, 2])
        guard case .failure(let error)? = try answers.last?.envelope() else { Issue.record("2 not answered with an error"); return }
        #expect(error.code == "cancelled")
        #expect(staleHookRuns.value == 0)
    }

    @Test func anArgumentKeptByItsHandlerKeepsItsBytes() throws {
        let embedded = try EmbeddedServer()
        defer { embedded.finish() }
        let kept = Mutex<[ChannelValue]>([])
        MethodChannel(name: "store", server: embedded.server).setMethodCallHandler { call, result in
            kept.withLock { $0.append(call.arguments) }
            result.success(.null)
        }
        embedded.run()
        let peer = embedded.connect()
        let sent: [ChannelValue] = (0..<20).map { .uint8List([UInt8](repeating: UInt8($0), count: 10 + $0)) }
        for (index, argument) in sent.enumerated() { peer.send(try .call(UInt32(index + 1), "store", "put", argument)) }
        embedded.run()
        #expect(try peer.frames().count == sent.count)
        #expect(kept.withLock { $0 } == sent)
    }
}
