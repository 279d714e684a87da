#if canImport(Combine)
import Combine
#else
import OpenCombine
#endif
import Synchronization
import Testing
import SwitchboardClient
import SwitchboardCodec
import SwitchboardServer

/// A callback-based source, like a sensor SDK.
final class Sensor {
    var onReading: ((Double) -> Void)?
    func emit(_ value: Double) { onReading?(value) }
}

@Suite struct ReadmeClientExamples {
    @Test func clientInTenLines() async throws {
        let server = try startServer()
        // README client begins (port from the test server)
        let client = try await Client.connect(ClientConfiguration(host: "127.0.0.1", port: server.port))
        let echo = SwitchboardClient.MethodChannel(name: "switchboard/echo", client: client)
        let reply = try await echo.invokeMethod("echo", arguments: ["hello": [1, 2, 3]])
        var ticks: [ChannelValue] = []
        for try await tick in SwitchboardClient.EventChannel(name: "switchboard/ticker", client: client)
            .receiveBroadcastStream(arguments: ["count": 3, "intervalMs": 10]) {
            ticks.append(tick)
        }
        await client.close()
        // README client ends
        #expect(reply == ["hello": [1, 2, 3]])
        #expect(ticks == [0, 1, 2])
        await stop(server)
    }

    @Test func passthroughSubjectFeedsAServerEventChannel() async throws {
        let sensor = Sensor()
        var forwarding: AnyCancellable?
        let server = try startServer { server in
            // README subject begins
            let readings = PassthroughSubject<Double, Never>()
            let temperature = SwitchboardServer.EventChannel(name: "sensors/temperature", server: server)
            temperature.setStreamHandler(StreamHandlerClosures(onListen: { _, _ in nil }))
            forwarding = readings.sink { temperature.broadcast(.float64($0)) }  // broadcast is thread-safe
            sensor.onReading = { readings.send($0) }
            // README subject ends
        }
        let client = try await connect(server)
        let received = Mutex<[ChannelValue]>([])
        let listening = Task {
            for try await value in SwitchboardClient.EventChannel(name: "sensors/temperature", client: client)
                .receiveBroadcastStream() {
                received.withLock { $0.append(value) }
            }
        }
        try await Task.sleep(for: .milliseconds(100))
        for reading in [20.5, 21.0, 21.5] { sensor.emit(reading) }
        for _ in 0..<200 where received.withLock({ $0.count }) < 3 { try await Task.sleep(for: .milliseconds(5)) }
        #expect(received.withLock { $0 } == [20.5, 21.0, 21.5])
        listening.cancel()
        forwarding?.cancel()
        await client.close()
        await stop(server)
    }
}
