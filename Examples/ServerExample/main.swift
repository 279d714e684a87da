import SwitchboardCodec
import SwitchboardServer

let port = CommandLine.arguments.dropFirst().first.flatMap { Int($0) } ?? 7420  // `server-example 0`: any free port
let server = try Server(configuration: ServerConfiguration(port: port))

MethodChannel(name: "math", server: server).setMethodCallHandler { call in
    guard call.method == "square", let n = call.arguments.intValue else { throw MethodNotImplemented() }
    let (square, overflow) = n.multipliedReportingOverflow(by: n)  // a client's number never traps the server
    guard !overflow else { throw ChannelError(code: "bad_arguments", message: "\(n) squared is out of range") }
    return .int(square)
}

let temperature = EventChannel(name: "sensors/temperature", server: server)
temperature.setStreamHandler(StreamHandlerClosures(onListen: { _, sink in
    sink.success(21.5)  // the current value first; broadcasts follow
    return nil
}))
Task {
    for reading in stride(from: 22.0, to: .infinity, by: 0.5) {
        try await Task.sleep(for: .milliseconds(100))
        temperature.broadcast(.float64(reading))  // encoded once for every listener
    }
}
try await server.run(handlingSignals: true)  // SIGINT/SIGTERM: drain, end streams, exit 0
