import Foundation
import Testing
import SwitchboardClient
import SwitchboardCodec
import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport

/// Passes everything through to the transport below, except that it can send only the first half of
/// the next write: over TLS, the server then holds half a record.
private final class HalvingTransport: Transport {
    let inner: any Transport
    var halveNextWrite = false
    init(_ inner: any Transport) { self.inner = inner }
    func start(_ handler: @escaping (TransportEvent) -> Void) { inner.start(handler) }
    func write(_ bytes: inout [UInt8]) {
        if halveNextWrite {
            halveNextWrite = false
            bytes.removeLast(bytes.count / 2)
        }
        inner.write(&bytes)
    }
    var queuedBytes: Int { inner.queuedBytes }
    var isOpen: Bool { inner.isOpen }
    var remoteAddress: String { inner.remoteAddress }
    func pauseReading() { inner.pauseReading() }
    func resumeReading() { inner.resumeReading() }
    func closeAfterWrites() { inner.closeAfterWrites() }
    func closeNow() { inner.closeNow() }
}

@Suite("Deadlines over TLS, and our own clients")
struct DeadlineClientTests {
    @Test("a TLS record that stops halfway is closed at the frame timeout, with an error line first, counted as frameTimeout")
    func halfTLSRecord() async throws {
        let server = try startTLSServer { $0.frameTimeoutMs = 300 }
        let loop = try EventLoop()
        defer { loop.finishDriving() }
        func run(until condition: () -> Bool) -> Bool { waitUntil(5) { loop.runOnce(); return condition() } }
        var tcp: TCPConnection?
        TCPConnection.connect(loop: loop, host: "127.0.0.1", port: server.tlsPort) { tcp = try? $0.get() }
        #expect(run { tcp != nil })
        let halving = HalvingTransport(try #require(tcp))
        let tls = try TLSTransport(over: halving, context: TLSContext.client(caFile: TestCertificates.path("ca.pem")),
                                   serverName: "127.0.0.1", loop: loop)
        var received: [UInt8] = [], ended = false
        tls.start { event in
            switch event {
            case .data(let bytes): received += bytes
            case .closed, .failed: ended = true
            case .drained: break
            }
        }
        var line = Array(#"{"id":1,"ping":true}"#.utf8) + [10]
        tls.write(&line)
        #expect(run { received.contains(10) })
        received = []
        halving.halveNextWrite = true
        var half = Array(#"{"id":2,"call":"switchboard/echo","method":"echo","args":"unfinished"}"#.utf8) + [10]
        tls.write(&half)
        #expect(run { ended })
        #expect(String(decoding: received, as: UTF8.self).contains(#""code":"timeout""#))
        tls.closeNow()
        let stats: ChannelValue = try await MethodChannel(name: "switchboard/stats", client: try await connect(server)).invokeMethod("get")
        #expect(stats["closes"]?["frameTimeout"]?.intValue == 1)
        await stop(server)
    }

    @Test("the Swift client over TCP, TLS, ws:// and wss:// says HELLO at once, and may then stay idle past every deadline")
    func ownClientsAreNotTimedOut() async throws {
        let server = try startTLSServer { $0.firstFrameTimeoutMs = 200; $0.frameTimeoutMs = 200 }
        var clients: [Client] = []
        for (secure, webSocket) in [(false, false), (true, false), (false, true), (true, true)] {
            var config = ClientConfiguration(port: secure ? server.tlsPort : server.port)
            config.reconnect = nil
            config.requestTimeout = .seconds(5)
            config.webSocket = webSocket
            if secure { config.tls = try TLSContext.client(caFile: TestCertificates.path("ca.pem")) }
            clients.append(try await Client.connect(config))
        }
        try await Task.sleep(for: .milliseconds(1000))  // real time: real clients on their own loops, five first-frame deadlines of silence
        for client in clients {
            #expect(try await echo(client).invokeMethod("echo", arguments: "still here") == "still here")
            await client.close()
        }
        let stats: ChannelValue = try await MethodChannel(name: "switchboard/stats", client: try await connect(server)).invokeMethod("get")
        #expect(stats["closes"]?["firstFrameTimeout"] == nil && stats["closes"]?["frameTimeout"] == nil)
        await stop(server)
    }
}
