import Testing
import SwitchboardCodec
@testable import SwitchboardServer
import SwitchboardTesting
import SwitchboardWire

/// Resuming over WebSocket and on any loop, takeovers over WebSocket, and tokens that name another loop
/// (protocol/resumption.md, "Resuming" and "Loops and nodes"). Each runs on one loop and on four: on
/// four, connections are dealt round, so each new connection lands on the loop after the last one's.
@Suite struct SessionTransportTests {
    static let loopCounts = Array(Set([1, 4, ServerConfiguration.testLoops])).sorted()

    static func resumingHello(_ token: String, position: Int, id: UInt32) -> Frame {
        Frame(.hello, id: id, payload: Array(#"{"session":{"token":"\#(token)","position":\#(position)}}"#.utf8))
    }

    static func token(_ frame: Frame?) throws -> String {
        try #require(try JSONText.parse(frame?.payload ?? [])["session"]?["token"]?.stringValue)
    }

    /// A holder's session made over TCP resumes over WebSocket, on whichever loop the WebSocket lands:
    /// what follows the HELLO is read there, its caller waited and gets the answer given after resuming.
    @Test(arguments: loopCounts)
    func sessionResumesOverWebSocket(loops: Int) async throws {
        try await withServer({ $0.loops = loops }) { _, port in
            var holder: RawConnection? = try RawConnection(port: port)
            try holder?.send(Frame(.hello, id: 1, payload: Array(#"{"session":{}}"#.utf8)))
            let token = try Self.token(try await holder?.frame())
            try holder?.send(Frame(.register, id: 2, channel: "held.ws", payload: nil))
            let registered = try #require(try await holder?.frame())
            holder = nil  // lost
            let caller = try RawConnection(port: port)
            try caller.send(.call(7, "held.ws", "work"))
            let resumer = try #require(RawWebSocket(port: port))
            resumer.send(opcode: 2, Self.resumingHello(token, position: registered.bytes.count, id: 3).bytes)
            resumer.send(opcode: 2, Frame(.ping, id: 4, payload: nil).bytes)  // before the answer: the stream's next frame
            let welcome = try #require(try RawWebSocket.frames(resumer.receive()).first)
            #expect(try JSONText.parse(welcome.payload ?? [])["session"]?["resumed"] == true, "\(welcome)")
            var received: [Frame] = []
            while received.count < 2, let message = resumer.receive() { received += try RawWebSocket.frames(message) }
            #expect(received.map(\.kind).sorted { $0.rawValue < $1.rawValue } == [.message, .pong])
            let forwarded = try #require(received.first { $0.kind == .message })
            #expect(forwarded.channel == "held.ws")
            resumer.send(opcode: 2, Frame(.reply, id: forwarded.id, payload: try StandardMethodCodec().encodeSuccessEnvelope("done")).bytes)
            #expect(try await caller.frame().envelope() == .success("done"))
        }
    }

    /// A WebSocket whose session another connection takes over gets ERROR `session_taken`, then a close
    /// frame with code 1000.
    @Test(arguments: loopCounts)
    func takenWebSocketClosesWith1000(loops: Int) async throws {
        try await withServer({ $0.loops = loops }) { _, port in
            let old = try #require(RawWebSocket(port: port))
            old.send(opcode: 2, Frame(.hello, id: 1, payload: Array(#"{"session":{}}"#.utf8)).bytes)
            let token = try Self.token(try RawWebSocket.frames(old.receive()).first)
            let resumer = try RawConnection(port: port)
            try resumer.send(Self.resumingHello(token, position: 0, id: 2))
            #expect(try JSONText.parse(try await resumer.frame().payload ?? [])["session"]?["resumed"] == true)
            let error = try #require(try RawWebSocket.frames(old.receive()).first)
            #expect(error.errorCode == "session_taken" && error.id == 0)
            let close = try #require(old.receive())
            #expect(close.opcode == 8 && RawWebSocket.closeCode(close.payload) == 1000)
        }
    }

    /// A token that names another loop's session with a secret that is not its own moves nothing: the
    /// connection is refused (`unknown`) where it is, and the new session it then asks for is made on
    /// its own loop.
    @Test(arguments: loopCounts)
    func forgedTokenMovesNothing(loops: Int) async throws {
        try await withServer({ $0.loops = loops }) { _, port in
            let first = try RawConnection(port: port)  // on loop i
            try first.send(Frame(.hello, id: 1, payload: Array(#"{"session":{}}"#.utf8)))
            let real = try #require(SessionToken(text: try Self.token(try await first.frame())))
            var bytes = try #require(SessionToken.bytes(base64URL: real.text))
            bytes[SessionToken.byteCount - SessionToken.secretCount] ^= 1  // the same session's name, another secret
            let forged = SessionToken.base64URL(bytes)
            for transport in ["tcp", "ws"] {
                // On loop i + 1, then i + 2 for the WebSocket's turn.
                let tcp = transport == "tcp" ? try RawConnection(port: port) : nil
                let ws = transport == "ws" ? try #require(RawWebSocket(port: port)) : nil
                func send(_ frame: Frame) throws {
                    if let ws { ws.send(opcode: 2, frame.bytes) } else { try tcp?.send(frame) }
                }
                func next() async throws -> Frame? {
                    if let ws { return try RawWebSocket.frames(ws.receive()).first }
                    return try await tcp?.frame()
                }
                let landed = (Int(real.loop) + (transport == "ws" ? 2 : 1)) % loops
                try send(Self.resumingHello(forged, position: 0, id: 2))
                let refusal = try #require(try await next())
                #expect(refusal.errorCode == "cannot_resume", "\(transport)")
                #expect(try JSONText.parse(refusal.payload ?? [])["details"]?["reason"] == "unknown", "\(transport)")
                try send(Frame(.hello, id: 3, payload: Array(#"{"session":{}}"#.utf8)))
                let made = try #require(SessionToken(text: try Self.token(try await next())))
                #expect(Int(made.loop) == landed, "\(transport): the connection stayed on its loop")
            }
        }
    }
}
