import Foundation
import Testing
import SwitchboardTesting
import SwitchboardTransport

@Suite struct TCPTransportTests {
    /// A write that fails at once (the peer reset the connection) must not call the owner back from
    /// inside `write`, where the owner may be midway through changing its state.
    @Test("a write that fails is reported on the next loop turn, not from inside write; later writes are dropped")
    func failedWriteIsReportedLater() throws {
        let loop = try EventLoop()
        defer { loop.finishDriving() }
        var accepted: TCPConnection?
        let listener = try TCPListener(loop: loop, host: "127.0.0.1", port: 0) { accepted = $0 }
        defer { listener.cancel() }
        let peer = try #require(RawSocket(port: listener.port))
        func run(until condition: () -> Bool) -> Bool { waitUntil(5) { loop.runOnce(); return condition() } }
        #expect(run { accepted != nil })
        let connection = try #require(accepted)
        var events: [TransportEvent] = []
        var insideWrite = false, calledFromWrite = false
        connection.start { event in
            if insideWrite { calledFromWrite = true }
            events.append(event)
        }
        connection.pauseReading()  // the reset must reach the write, not the read
        peer.reset()
        usleep(50_000)  // real time: the RST must reach this socket in the kernel, which nothing here can observe
        var bytes = [UInt8](repeating: 7, count: 64)
        insideWrite = true
        connection.write(&bytes)
        var more = [UInt8](repeating: 8, count: 64)
        connection.write(&more)  // after the failure: dropped, no second report
        insideWrite = false
        #expect(!calledFromWrite && events.isEmpty)
        #expect(run { !events.isEmpty })
        guard case .closed(let error?)? = events.first else { Issue.record("expected a failure, got \(events)"); return }
        #expect(error.operation == "uv_try_write")
        for _ in 0..<10 { loop.runOnce() }
        #expect(events.count == 1)
        connection.closeNow()
    }
}
