// A client that provides channels for every other client, through the server (broker routing):
//   greeter/hello  a method channel: hello(name) → "Hello, name!"
//   greeter/clock  an event channel: the time every second while someone listens
//
//   swift run broker-example [--port 7420]
//   switchboard call greeter/hello hello '"Ada"'
//   switchboard listen greeter/clock --count 3
import SwitchboardClient
import SwitchboardCodec

#if canImport(Glibc)
import Glibc
#endif

/// Emits the seconds since the Unix epoch once a second, only while someone listens.
final class Clock: EventProducer {
    private let task = Mutex<Task<Void, Never>?>(nil)

    func onListen(arguments: ChannelValue, sink: ProducerSink) async -> ChannelError? {
        let ticking = Task {
            while !Task.isCancelled {
                sink.success(.int(time(nil)))
                try? await Task.sleep(for: .seconds(1))
            }
        }
        task.withLock { $0 = ticking }
        return nil
    }

    func onCancel(arguments: ChannelValue) async {
        task.withLock { $0?.cancel() }
    }
}

import Synchronization

let arguments = CommandLine.arguments
let port = arguments.firstIndex(of: "--port").flatMap { arguments.dropFirst($0 + 1).first.flatMap { Int($0) } } ?? 7420
do {
    let client = try await Client.connect(ClientConfiguration(host: "127.0.0.1", port: port))
    try await MethodChannel(name: "greeter/hello", client: client).setMethodCallHandler { call in
        guard call.method == "hello", let name = call.arguments.stringValue else {
            throw MissingImplementation(channel: "greeter/hello", method: call.method)
        }
        return .string("Hello, \(name)!")
    }
    try await EventChannel(name: "greeter/clock", client: client).setStreamHandler(Clock())
    print("serving greeter/hello and greeter/clock through 127.0.0.1:\(port); Ctrl-C to stop")

    for await state in client.stateUpdates() {  // runs until the client closes; reconnects on its own
        print("connection: \(state)")
    }
} catch {
    // Expected failures (no server; greeter/* held by someone else) get one line and an exit code, not a crash.
    let hint = if case ClientError.server("channel_taken", _) = error { " (is another broker-example running?)" } else { "" }
    let line = Array("broker-example: \(error)\(hint)\n".utf8)
    _ = line.withUnsafeBytes { write(2, $0.baseAddress, $0.count) }  // standard error
    if case ClientError.connectionFailed = error { exit(3) }
    exit(1)
}
