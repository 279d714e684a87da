import SwitchboardCodec
import SwitchboardConsole
import SwitchboardTransport

extension ServerCore {
    /// The HTTP endpoints (wire-v1 section 8): the console page at `/`, `/healthz`, and `/metrics` in
    /// Prometheus's text format; nil (404) for anything else. Each counts every loop's connections.
    func respond(to request: HTTPRequestHead, _ answer: @escaping (HTTPResponse?) -> Void) {
        switch request.path {
        case "/":
            answer(HTTPResponse(status: 200, contentType: "text/html; charset=utf-8", body: ConsolePage.html))
        case "/healthz":
            let serving = phase == .running, uptime = Int((eventLoop.now - startedAt) / 1000)
            let respond = LoopBound(answer, loop: handle)
            gatherFromEveryLoop({ $0.connectionCount }) { counts in
                let status: ChannelValue = .stringMap([
                    "status": .string(serving ? "serving" : "draining"),
                    "connections": .int(counts.reduce(0) { $0 + ($1 ?? 0) }),
                    "uptimeSeconds": .int(uptime),
                ])
                respond.value(HTTPResponse(status: serving ? 200 : 503, contentType: "application/json",
                                           body: ((try? JSONText.serialize(status)) ?? []) + [10]))
            }
        case "/metrics":
            guard let exposition = config.metrics.exposition else { return answer(nil) }
            let respond = LoopBound(answer, loop: handle)
            reportMetrics {
                respond.value(HTTPResponse(status: 200, contentType: "text/plain; version=0.0.4; charset=utf-8", body: exposition()))
            }
        default:
            answer(nil)
        }
    }

    /// Runs `part` on every loop and hands the results to `then` on this loop.
    func gatherFromEveryLoop<Part: Sendable>(_ part: @escaping @Sendable (ServerCore) -> Part,
                                             then: @escaping @Sendable ([Part?]) -> Void) {
        guard let group else { return then([part(self)]) }
        group.gather(from: index, part, then: then)
    }
}
