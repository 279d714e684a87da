import SwitchboardCodec
import SwitchboardConsole
import SwitchboardPluginAPI
import SwitchboardTransport

extension ServerCore {
    /// The HTTP endpoints (wire-v1 section 8): the console page at `/`, `/healthz`, and `/metrics` in
    /// Prometheus's text format for whom ``refusal(ofMetricsTo:from:)`` lets in; nil (404) for anything
    /// else. Each counts every loop's connections. `peer` is the client's address.
    func respond(to request: HTTPRequestHead, from peer: String, _ answer: @escaping (HTTPResponse?) -> Void) {
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
            if let refusal = refusal(ofMetricsTo: request, from: peer) { return answer(refusal) }
            let respond = LoopBound(answer, loop: handle)
            reportMetrics {
                respond.value(HTTPResponse(status: 200, contentType: "text/plain; version=0.0.4; charset=utf-8", body: exposition()))
            }
        default:
            answer(nil)
        }
    }

    /// Why `request` may not read `/metrics` (401 or 403), or nil if it may (wire-v1 section 8). With
    /// `--token` or access control, it needs `Authorization: Bearer TOKEN`: the server's token, and with
    /// access control a user's, identified as a HELLO with that token would be, whom the gates let call
    /// `switchboard/stats` (rate limits are not charged). With neither, only loopback peers may: nothing
    /// else could tell a stranger from an operator.
    func refusal(ofMetricsTo request: HTTPRequestHead, from peer: String) -> HTTPResponse? {
        let isGuarded = pipeline.controlsAccess
        guard config.token != nil || isGuarded else {
            return isLoopbackAddress(peer) && request.isAddressedToThisMachine ? nil
                : HTTPResponse(status: 403, text: "/metrics is served to loopback clients only when the server has no token and no access control\n")
        }
        let unauthorized = HTTPResponse(status: 401, text: "/metrics needs Authorization: Bearer with a known token\n",
                                        headers: [#"WWW-Authenticate: Bearer realm="switchboard""#])
        guard let token = Self.bearerToken(request) else { return unauthorized }
        if let required = config.token, !Digest.constantTimeEquals(token, required) { return unauthorized }
        guard isGuarded else { return nil }
        let context = ConnectionContext(id: 0, remoteAddress: peer, eventLoop: eventLoop)
        switch pipeline.authenticate(Hello(token: token, client: nil, certificateSubject: nil), connection: context) {
        case .refuse, .pass: return unauthorized  // a known token has an identity
        case .identity(let identity): context.authenticated(as: identity)
        }
        let isRefused = pipeline.inbound.contains { stage in
            guard let gate = stage.gate, stage.sees(Self.statsChannel, .call) else { return false }
            switch gate.judge(context, channel: Self.statsChannel, kind: .call) {
            case .refuse: return true
            case .byMethod(let judge): return judge("get") != nil  // /metrics is what `get` answers
            case .admit, .meter: return false
            }
        }
        return isRefused ? HTTPResponse(status: 403, text: "\(context.identity ?? "this user") may not read /metrics (switchboard/stats)\n") : nil
    }

    private static let statsChannel = "switchboard/stats"

    /// The token of an `Authorization: Bearer TOKEN` header (the scheme in any case).
    static func bearerToken(_ request: HTTPRequestHead) -> String? {
        guard let value = request.header("Authorization") else { return nil }
        let parts = value.split(separator: " ", maxSplits: 1)
        guard parts.count == 2, parts[0].lowercased() == "bearer" else { return nil }
        let token = parts[1].trimmingPrefix(while: { $0 == " " })
        return token.isEmpty ? nil : String(token)
    }

    /// Runs `part` on every loop and hands the results to `then` on this loop.
    func gatherFromEveryLoop<Part: Sendable>(_ part: @escaping @Sendable (ServerCore) -> Part,
                                             then: @escaping @Sendable ([Part?]) -> Void) {
        guard let group else { return then([part(self)]) }
        group.gather(from: index, part, then: then)
    }
}
