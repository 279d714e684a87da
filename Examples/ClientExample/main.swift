import SwitchboardClient
#if canImport(Glibc)
import Glibc
#endif

let port = CommandLine.arguments.dropFirst().first.flatMap { Int($0) } ?? 7420  // `client-example PORT`
do {
    let client = try await Client.connect(ClientConfiguration(host: "127.0.0.1", port: port))
    let echo = MethodChannel(name: "switchboard/echo", client: client)
    let reply = try await echo.invokeMethod("echo", arguments: ["hello": [1, 2, 3]])
    print(reply)  // {"hello":[1,2,3]}
    for try await tick in EventChannel(name: "switchboard/ticker", client: client)
        .receiveBroadcastStream(arguments: ["count": 3, "intervalMs": 10]) {
        print(tick)  // 0, 1, 2
    }
    await client.close()
} catch {  // one line, not a crash: it needs a server with the demo channels, as scripts/serve starts
    print("client-example: \(error) (is scripts/serve running on port \(port)?)")
    exit(1)
}
