import FuzzSupport
import SwitchboardServer
import SwitchboardTesting
import SwitchboardTransport

// Input: one byte seeding the chunk sizes, then what a client sends to a port: HTTP requests, WebSocket
// upgrades and frames (masked or not, fragmented, control frames, over the limit), or anything else.
// The connection goes through the same HTTP and WebSocket layer as the server's ports (http-parser and
// wslay underneath), into a server with the demo channels. Besides not crashing or leaking (ASan):
// - a request the layer answers in HTTP (first byte `G`, not upgraded) gets exactly
//   one HTTP/1.1 response head first;
// - what the server holds for the peer stays bounded.

let maxFrame = 2048

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ start: UnsafeRawPointer, _ count: Int) -> CInt {
    var input = FuzzInput(start, count)
    let seed = input.takeByte()
    let stream = input.rest
    var configuration = ServerConfiguration()
    configuration.maxFrame = UInt32(maxFrame)
    configuration.outboundLimit = 16 * 1024
    guard let embedded = try? EmbeddedServer(configuration: configuration) else { fatalError("no server") }
    let options = HTTPUpgradeTransport.Options(maxFrame: maxFrame, allowedOrigins: ["https://*.ok"]) { head, answer in
        answer(head.path == "/healthz" ? HTTPResponse(status: 200, text: "ok\n") : nil)
    }
    let peer = embedded.connect(name: "fuzz") { HTTPUpgradeTransport(over: $0, options: options) }
    peer.peerWindow = 64 * 1024
    var output: [UInt8] = []
    for chunk in chunks(of: stream, sizes: chunkSizes(total: stream.count, seed: seed)) {
        peer.send(chunk)
        embedded.run(turns: 1)
        output += peer.takeWritten(max: max(0, 256 * 1024 - output.count))
        check(peer.queuedBytes <= 16 * 1024 + 64 * 1024 + 4 * maxFrame, "the server holds \(peer.queuedBytes) bytes")
    }
    embedded.run(turns: 2)
    output += peer.takeWritten()
    peer.peerCloses()
    embedded.run(turns: 2)
    output += peer.takeWritten()
    embedded.finish()
    if stream.first == UInt8(ascii: "G"), !output.isEmpty {
        check(output.starts(with: Array("HTTP/1.1 ".utf8)), "an HTTP request answered with something else")
    }
    return 0
}
