import SwitchboardCodec
import SwitchboardConsole
import SwitchboardTransport

extension ServerCore {
    /// The HTTP endpoints (wire-v1 section 8): the console page at `/`, `/healthz`, and `/metrics` in
    /// Prometheus's text format; nil (404) for anything else.
    func respond(to request: HTTPRequestHead) -> HTTPResponse? {
        switch request.path {
        case "/":
            return HTTPResponse(status: 200, contentType: "text/html; charset=utf-8", body: ConsolePage.html)
        case "/healthz":
            let serving = phase == .running
            let status: ChannelValue = .stringMap([
                "status": .string(serving ? "serving" : "draining"),
                "connections": .int(connectionCount),
                "uptimeSeconds": .int(Int((eventLoop.now - startedAt) / 1000)),
            ])
            return HTTPResponse(status: serving ? 200 : 503, contentType: "application/json",
                                body: ((try? JSONText.serialize(status)) ?? []) + [10])
        case "/metrics":
            guard let exposition = config.metrics.exposition else { return nil }
            metricsReporter.report(self)
            return HTTPResponse(status: 200, contentType: "text/plain; version=0.0.4; charset=utf-8", body: exposition())
        default:
            return nil
        }
    }
}
