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
import SwitchboardTesting

/// A callback-based source, like a sensor SDK.
final class Sensor {
    var onReading: ((Double) -> Void)?
    func emit(_ value: Double) { onReading?(value) }
}

@Suite struct ReadmeClientExamples {
    static let root = String(#filePath.dropLast("Tests/SwitchboardClientTests/ReadmeClientExampleTests.swift".count))

    /// The README shows `Examples/ClientExample/main.swift` whole.
    @Test func readmeShowsTheExample() throws {
        let readme = try String(contentsOfFile: Self.root + "README.md", encoding: .utf8)
        let example = try String(contentsOfFile: Self.root + "Examples/ClientExample/main.swift", encoding: .utf8)
        #expect(readme.contains("## A client in Swift\n\n```swift\n" + example + "```\n"))
    }

    /// The client example, built as `client-example` (it imports only SwitchboardClient), run as a user runs it.
    @Test func clientExampleRuns() async throws {
        let server = try startServer()
        let example = try ProgramRun(ProgramRun.builtExecutable("client-example"), ["\(server.port)"])
        #expect(try await example.remainder() == "{\"hello\":[1,2,3]}\n0\n1\n2\n")
        #expect(try await example.exitCode() == 0)
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
