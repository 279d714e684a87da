import Testing
import SwitchboardCodec
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

@Suite struct Channels {
    @Test(arguments: [1, 2, 5, 11, 12, 13, 4096])
    func replySurvivesAnySplit(chunkSize: Int) async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            var bytes: [UInt8] = []
            for id in 1...3 as ClosedRange<UInt32> {
                bytes += try Frame.call(id, "switchboard/echo", "echo", .int(Int(id) * 1000)).bytes
            }
            for start in stride(from: 0, to: bytes.count, by: chunkSize) {
                try wire.send(Array(bytes[start..<min(start + chunkSize, bytes.count)]))
            }
            for id in 1...3 as ClosedRange<UInt32> {
                let reply = try await wire.frame()
                #expect(reply.kind == .reply && reply.id == id)
                #expect(try reply.envelope() == .success(.int(Int(id) * 1000)))
            }
        }
    }

    @Test func methodChannelAnswers() async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            let args: ChannelValue = ["list": [1, .int64(2), 3.5, .uint8List([1, 2])], "nil": nil]
            try wire.send(.call(1, "switchboard/echo", "echo", args))
            #expect(try await wire.frame().envelope() == .success(args))
            try wire.send(.call(2, "switchboard/echo", "fail", [7]))
            #expect(try await wire.frame().envelope()
                == .failure(ChannelError(code: "demo_error", message: "requested failure", details: [7])))
            try wire.send(.call(3, "switchboard/echo", "nope"))
            let notImplemented = try await wire.frame()
            #expect(notImplemented.kind == .reply && notImplemented.id == 3 && notImplemented.payload == nil)
            try wire.send(.call(4, "no/such/channel", "x"))
            let none = try await wire.frame()
            #expect(none.kind == .reply && none.id == 4 && none.payload == nil)
            // id 0: no reply wanted.
            try wire.send(.call(0, "switchboard/echo", "echo", 1))
            #expect(try await wire.barrier().isEmpty)
        }
    }

    @Test func jsonMethodChannel() async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(Frame(.message, id: 1, channel: "switchboard/echo.json",
                                payload: Array(#"{"method":"echo","args":{"a":[1,"b"]}}"#.utf8)))
            #expect(try await wire.frame().payload == Array(#"[{"a":[1,"b"]}]"#.utf8))
            try wire.send(Frame(.message, id: 2, channel: "switchboard/echo.json",
                                payload: Array(#"{"method":"fail","args":null}"#.utf8)))
            #expect(try await wire.frame().payload == Array(#"["demo_error","requested failure",null]"#.utf8))
        }
    }

    @Test func messageChannelsReturnTheSameBytes() async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            // int64 holding a small value, map order z-before-a, a NaN payload: all preserved.
            let message = RawConnection.bytes(hex: "0d 02 07 01 7a 04 0500000000000000 07 01 61 06 000000000000 010000000000f87f")
            let cases: [(String, [UInt8]?, [UInt8]?)] = [
                ("switchboard/message", message, message),
                ("switchboard/message", nil, [0]),            // null message → the standard null byte
                ("switchboard/message.string", Array("héllo".utf8), Array("héllo".utf8)),
                ("switchboard/message.binary", [], []),        // empty stays empty
                ("switchboard/message.binary", nil, nil),      // null stays null
                ("switchboard/message.binary", [0, 255, 7], [0, 255, 7]),
            ]
            for (i, (channel, sent, expected)) in cases.enumerated() {
                try wire.send(Frame(.message, id: UInt32(i + 1), channel: channel, payload: sent))
                let reply = try await wire.frame()
                #expect(reply.kind == .reply && reply.id == UInt32(i + 1))
                #expect(reply.payload == expected, "\(channel)")
            }
        }
    }

    @Test func pingIsMirrored() async throws {
        try await withServer { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(Frame(.ping, id: 42, payload: [9, 8, 7]))
            #expect(try await wire.frame() == Frame(.pong, id: 42, payload: [9, 8, 7]))
            try wire.send(Frame(.ping, id: 43, payload: nil))
            #expect(try await wire.frame() == Frame(.pong, id: 43, payload: nil))
        }
    }

    @Test func callbackHandlerMayAnswerFromAnotherThreadExactlyOnce() async throws {
        try await withServer(setUp: { server in
            MethodChannel(name: "later", server: server).setMethodCallHandler { call, result in
                Task.detached {
                    result.success(call.arguments)
                    result.success("ignored")
                    result.error(ChannelError(code: "ignored"))
                }
            }
        }) { _, port in
            let wire = try RawConnection(port: port)
            for id in 1...20 as ClosedRange<UInt32> { try wire.send(.call(id, "later", "m", .int(Int(id)))) }
            var seen = Set<UInt32>()
            for _ in 1...20 {
                let reply = try await wire.frame()
                #expect(try reply.envelope() == .success(.int(Int(reply.id))))
                seen.insert(reply.id)
            }
            #expect(seen.count == 20)
            #expect(try await wire.barrier().isEmpty)
        }
    }

    @Test func answeredRequestsAreReleased() async throws {
        let results = WeakResults()
        try await withServer(setUp: { server in
            MethodChannel(name: "tracked", server: server).setMethodCallHandler { call, result in
                results.add(result.request.value)
                result.success(call.arguments)
            }
            MethodChannel(name: "tracked.async", server: server).setMethodCallHandler { call in call.arguments }
        }) { _, port in
            let wire = try RawConnection(port: port)
            for id in 1...50 as ClosedRange<UInt32> { try wire.send(.call(id, "tracked", "m")) }
            for id in 51...100 as ClosedRange<UInt32> { try wire.send(.call(id, "tracked.async", "m")) }
            for _ in 1...100 { _ = try await wire.frame() }
            _ = try await wire.barrier()
            #expect(results.count == 50)
            #expect(results.alive == 0)  // no cycle keeps a finished request alive
        }
    }

    @Test func cancelTellsTheHandlerAndStillAnswersOnce() async throws {
        let cancelled = CancelFlag()
        try await withServer(setUp: { server in
            MethodChannel(name: "forever", server: server).setMethodCallHandler { _ in
                await untilCancelled()
                cancelled.set()
                return "too late"
            }
            BasicMessageChannel(name: "never", codec: StandardMessageCodec(), server: server)
                .setMessageHandler { _, _ in }
        }) { _, port in
            let wire = try RawConnection(port: port)
            try wire.send(.call(8, "forever", "wait"))
            try wire.send(Frame(.cancel, id: 8, payload: nil))
            let reply = try await wire.frame()
            #expect(reply.kind == .reply && reply.id == 8)
            guard case .failure(let error) = try reply.envelope() else { throw TestFailure("expected an error envelope") }
            #expect(error.code == "cancelled")
            try wire.send(Frame(.message, id: 9, channel: "never", payload: [0]))
            try wire.send(Frame(.cancel, id: 9, payload: nil))
            let refusal = try await wire.frame()
            #expect(refusal.errorCode == "cancelled" && refusal.id == 9)
            #expect(try await wire.barrier().isEmpty)
            #expect(try await eventually { cancelled.isSet })
        }
    }

    @Test func serverCallsAndMessagesAClient() async throws {
        let clients = Clients()
        try await withServer(setUp: { server in
            MethodChannel(name: "register-me", server: server).setMethodCallHandler { _, result in
                clients.add(result.client)
                result.success(nil)
            }
        }) { server, port in
            let wire = try RawConnection(port: port)
            try wire.send(.call(1, "register-me", "hi"))
            _ = try await wire.frame()
            let client = try #require(clients.first)
            let reverse = MethodChannel(name: "client/math", server: server)
            let outcome = Outcome()
            reverse.invokeMethod("double", arguments: 21, on: client) { outcome.set($0) }
            let call = try await wire.frame()
            #expect(call.kind == .message && call.channel == "client/math" && call.id != 0)
            #expect(try StandardMethodCodec().decodeMethodCall(call.payload) == MethodCall(method: "double", arguments: 21))
            try wire.send(Frame(.reply, id: call.id, payload: try StandardMethodCodec().encodeSuccessEnvelope(42)))
            #expect(try await outcome.wait() == .success(42))

            let notImplemented = Outcome()
            reverse.invokeMethod("other", on: client) { notImplemented.set($0) }
            let second = try await wire.frame()
            try wire.send(Frame(.reply, id: second.id, payload: nil))
            #expect(try await notImplemented.wait() == .failure(.notImplemented))

            let messages = BasicMessageChannel(name: "client/notes", codec: StringCodec(), server: server)
            let answered = MessageOutcome()
            messages.send("note", to: client) { answered.set($0) }
            let message = try await wire.frame()
            #expect(message.payload == Array("note".utf8))
            try wire.send(Frame(.reply, id: message.id, payload: Array("ack".utf8)))
            #expect(try await answered.wait() == .success("ack"))

            let pending = Outcome()
            reverse.invokeMethod("hang", on: client) { pending.set($0) }
            _ = try await wire.frame()
            wire.finishSending()  // half-closed with nothing of its own open: the server closes it
            #expect(try await pending.wait() == .failure(.disconnected))
        }
    }
}

/// Small thread-safe boxes for values produced on the server's loop.
final class CancelFlag: Sendable {
    private let flag = Mutex(false)
    func set() { flag.withLock { $0 = true } }
    var isSet: Bool { flag.withLock { $0 } }
}

/// Weak references to the server's requests, taken on the loop thread, counted from the test's.
final class WeakResults: Sendable {
    /// The request is never touched through this reference, only checked for nil under the lock.
    private struct Entry: @unchecked Sendable { weak var request: PendingRequest? }
    private let entries = Mutex<[Entry]>([])
    func add(_ request: PendingRequest) { entries.withLock { $0.append(Entry(request: request)) } }
    var count: Int { entries.withLock { $0.count } }
    var alive: Int { entries.withLock { $0.filter { $0.request != nil }.count } }
}

final class Clients: Sendable {
    private let list = Mutex<[ClientID]>([])
    func add(_ id: ClientID) { list.withLock { $0.append(id) } }
    var first: ClientID? { list.withLock { $0.first } }
}

final class Box<T: Sendable>: Sendable {
    private let value = Mutex<T?>(nil)
    func set(_ v: T) { value.withLock { $0 = v } }
    func wait() async throws -> T {
        guard try await eventually(5, { value.withLock { $0 } != nil }), let v = value.withLock({ $0 }) else {
            throw TestFailure("timed out waiting for a value")
        }
        return v
    }
}
typealias Outcome = Box<Result<ChannelValue, InvokeError>>
typealias MessageOutcome = Box<Result<String?, InvokeError>>

import Synchronization
