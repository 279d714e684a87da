import SwitchboardCodec
import SwitchboardPluginAPI
import SwitchboardTransport
import SwitchboardWire

/// What a connection holds only when plugins are loaded: the connection as plugins see it, what the
/// pipeline asks of every connection, the gates' kept verdicts, and the way a request takes through the
/// stages. A connection without plugins has none, so the paths no plugin touches test one reference.
///
/// Its methods take the connection they work for: the session holds no reference back (a strong one
/// would be a cycle, an unowned one a check per use).
final class PluginSession {
    /// The connection as plugins see it.
    let context: ConnectionContext
    /// What the plugins loaded at start-up ask of every connection, read once (the pipeline is fixed
    /// while the server runs).
    let seesRequests: Bool, tracesRequests: Bool
    /// The pipeline's inbound stages (a constant: read without a run-time exclusivity check).
    let inboundStages: [Pipeline.Stage<any InboundProcessor, InboundKind>]
    /// The same stages as gates, when all are and no stage sees answers: binary calls and sends are then
    /// judged by ``admit(_:_:through:on:)`` and go on as without plugins, rather than take the whole pipeline.
    let gates: [Pipeline.Stage<any InboundGate, InboundKind>]?
    /// The pipeline's ``Pipeline/gateEpoch``, which a reload advances: verdicts kept under an older value
    /// are judged again.
    let gateEpoch: VerdictEpoch
    /// The gates' verdicts on the last channel and kind judged by ``admit(_:_:through:on:)``; a HELLO
    /// forgets them.
    var gateMemo: GateMemo?
    /// The trace of the request being routed, taken by ``Connection/makeRequest(_:methodCodec:)`` (see ``RequestTrace``).
    var pendingTrace: RequestTrace?
    /// Whether the identity the transport proved (a TLS certificate) has been asked about.
    private(set) var hasIdentifiedPeer = false

    init(context: ConnectionContext, pipeline: Pipeline) {
        self.context = context
        seesRequests = pipeline.seesRequests
        tracesRequests = pipeline.seesAnswers
        inboundStages = pipeline.inbound
        gates = pipeline.seesAnswers ? nil : pipeline.gates
        gateEpoch = pipeline.gateEpoch
    }

    // MARK: Identity

    /// Before its first bytes: a client that proved who it is with a TLS certificate is that identity
    /// from its first request, HELLO or not. False if the plugins refuse the certificate.
    @inline(never)
    func identifyPeer(of connection: Connection) -> Bool {
        hasIdentifiedPeer = true
        guard connection.transport.peerIdentity != nil else { return true }
        return identify(token: nil, client: nil, of: connection)
    }

    /// Asks the plugins who the HELLO's client is; false if one refuses it.
    @inline(never)
    func identify(_ hello: ChannelValue, of connection: Connection) -> Bool {
        identify(token: hello["token"]?.stringValue, client: hello["client"]?.stringValue, of: connection)
    }

    /// Asks the plugins who the client is, from its HELLO and its TLS certificate; false if one refuses.
    /// A verified certificate's subject is the identity when no plugin names another.
    private func identify(token: String?, client: String?, of connection: Connection) -> Bool {
        let certificate = connection.transport.peerIdentity
        let hello = Hello(token: token, client: client, certificateSubject: certificate)
        switch connection.core.pipeline.authenticate(hello, connection: context) {
        case .refuse: return false
        case .identity(let identity): context.authenticated(as: identity)
        case .pass: context.authenticated(as: certificate)
        }
        gateMemo = nil  // the verdicts were for the identity before
        context.clientName = client
        return true
    }

    // MARK: Inbound

    /// A binary MESSAGE that some stage sees, on its way to `route`: true if it goes on as without
    /// plugins (the gates, which judge it by its channel and kind, let it through); false if they refused
    /// it or it took the whole pipeline (a stage that is no gate, or a kind only its method tells).
    func letsThroughGates(_ frame: FrameDecoder.View, taking route: Route?, on connection: Connection) -> Bool {
        guard let gates, let kind = gatedKind(of: route) else {
            runInbound(message: frame, on: connection)
            return false
        }
        switch admit(frame.channel, kind, through: gates, on: connection) {
        case .admitted: return true
        case .refused(let refusal):
            if frame.id != 0 { connection.writeError(refusal, id: frame.id) }  // id 0: nobody waits (counted)
            return false
        case .byMethod:
            runInbound(message: frame, on: connection)
            return false
        }
    }

    /// The kind of a binary MESSAGE taking `route` when the route alone tells it (a call or a send); nil
    /// when it takes the method (an event channel's listen or cancel, or a channel nobody serves).
    private func gatedKind(of route: Route?) -> InboundKind? {
        switch route {
        case .local(.method)?: .call
        case .local(.message)?: .message
        case .held(let registration)?:
            switch registration.kind {
            case .message?: .message
            case .method?, nil: .call
            case .event?: nil
            }
        case .local(.event)?, nil: nil
        }
    }

    /// A binary MESSAGE, through the inbound stages.
    @inline(never)
    func runInbound(message frame: FrameDecoder.View, on connection: Connection) {
        var request = InboundRequest(connection: context, channel: frame.channel, method: nil, payload: .bytes(frame.payload),
                                     expectsAnswer: frame.id != 0, isText: false)
        start(&request, on: connection)
        continueInbound(&request, target: .request(frame.id == 0 ? nil : .binary(id: frame.id)), from: 0, on: connection)
    }

    /// A text-mode call, listen, cancel (`method` given) or send (`method` nil), through the inbound stages.
    func runInbound(text origin: PendingRequest.Origin, method: String?, channel: String, value: ChannelValue,
                    on connection: Connection) {
        var request = InboundRequest(connection: context, channel: channel, method: method, payload: .value(value),
                                     expectsAnswer: true, isText: true)
        start(&request, on: connection)
        continueInbound(&request, target: .request(origin), from: 0, on: connection)
    }

    /// A REGISTER, through the inbound stages.
    @inline(never)
    func runInbound(register frame: FrameDecoder.View, on connection: Connection) {
        var request = InboundRequest(connection: context, channel: frame.channel, method: nil, payload: .bytes(frame.payload),
                                     expectsAnswer: frame.id != 0, isText: false)
        request.kind = .register
        if tracesRequests { request.receivedAt = EventLoop.nanoseconds() }
        continueInbound(&request, target: .register(id: frame.id), from: 0, on: connection)
    }

    private func start(_ request: inout InboundRequest, on connection: Connection) {
        connection.core.classify(&request, for: connection)
        if tracesRequests { request.receivedAt = EventLoop.nanoseconds() }
    }

    /// Runs the stages from `index` on, then routes what they let through.
    func continueInbound(_ request: inout InboundRequest, target: InboundTarget, from index: Int, on connection: Connection) {
        let stages = inboundStages
        var next = index
        while next < stages.count {
            let stage = stages[next]
            next += 1
            if request.kindsOnArrival != 0, let gate = stage.gate { judgeKindsOnArrival(of: &request, by: gate, in: stage) }
            guard stage.sees(request.channel, request.kind) else { continue }
            let decision: InboundDecision
            do {
                if let gate = stage.gate {
                    let verdict = request.possibleKinds == 0
                        ? gate.judge(request.connection, channel: request.channel, kind: request.kind)
                        : verdictOnEveryKind(of: &request, by: gate)
                    decision = verdict.admit(now: request.connection.now, method: request.method).map { .reject($0) } ?? .next
                } else {
                    decision = try stage.processor.process(&request)
                }
            } catch {
                return refuse(request, target, error: pluginFailed(stage.plugin, "\(error)", on: connection), on: connection)
            }
            if request.isPayloadChanged || request.isRenamed {
                request.isPayloadChanged = false
                request.isRenamed = false
                if request.kind != .register { connection.core.classify(&request, for: connection) }  // what it is may have changed
            }
            switch consume decision {
            case .next: continue
            case .reject(let rejection):
                connection.core.countRejection(by: stage.plugin, code: rejection.code)
                return refuse(request, target, error: rejection.error, on: connection)
            case .answer(let answer):
                return answerDirectly(answer, request: request, target: target, plugin: stage.plugin, on: connection)
            case .later(let body):
                let parked = park(request, target: target, resumeAt: next, plugin: stage.plugin, on: connection)
                let waiting = LoopBound(parked, loop: connection.core.handle)
                return body(Decider(token: DecisionToken { decision in waiting.onLoop { $0.resume(with: decision) } }))
            }
        }
        dispatch(request, target: target, on: connection)
    }

    /// A gate's verdict on a request whose kind only another node can tell: its verdict on each kind
    /// the request could be. The kinds it refuses travel with the request, for the holder's node to
    /// refuse (protocol/cluster.md); the request is refused here only when every kind it could be is.
    private func verdictOnEveryKind(of request: inout InboundRequest, by gate: any InboundGate) -> GateVerdict {
        var admitted: GateVerdict?, refused: GateVerdict?
        for kind in InboundKind.allCases where request.possibleKinds & kind.bit != 0 {
            let verdict = gateVerdict(on: &request, as: kind, by: gate)
            if case .refuse = verdict {
                request.refusedKinds |= kind.bit
                refused = refused ?? verdict
            } else if kind == request.kind || admitted == nil {
                admitted = verdict  // a meter counts the request as the kind its method says, when it may be that
            }
        }
        return admitted ?? refused ?? .admit
    }

    /// A gate's verdicts on the kinds a request to another loop could be when it arrives
    /// (``InboundRequest/kindsOnArrival``), of those its stage sees: the kinds it refuses travel with
    /// the request, for the holder's loop to refuse it if it is one of them there.
    private func judgeKindsOnArrival(of request: inout InboundRequest, by gate: any InboundGate,
                                     in stage: Pipeline.Stage<any InboundProcessor, InboundKind>) {
        for kind in InboundKind.allCases where request.kindsOnArrival & kind.bit != 0 && stage.sees(request.channel, kind) {
            if case .refuse = gateVerdict(on: &request, as: kind, by: gate) { request.refusedKinds |= kind.bit }
        }
    }

    /// A gate's verdict on `request` were it of `kind`, its method decided (a meter decides later).
    private func gateVerdict(on request: inout InboundRequest, as kind: InboundKind, by gate: any InboundGate) -> GateVerdict {
        let verdict = gate.judge(request.connection, channel: request.channel, kind: kind)
        if case .byMethod(let judge) = verdict, let rejection = judge(request.method) { return .refuse(rejection) }
        return verdict
    }

    /// Routes a request every stage let through: a binary method call by ``Connection/dispatchCall(to:payload:origin:)``,
    /// as without plugins, anything else through the router.
    private func dispatch(_ request: InboundRequest, target: InboundTarget, on connection: Connection) {
        switch target {
        case .register(let id):
            var payload: [UInt8]?
            if case .bytes(let bytes) = request.payload { payload = bytes.map(Array.init) }
            connection.core.register(Frame(.register, id: id, channel: request.channel, payload: payload), from: connection)
        case .request(let origin):
            if request.kind == .listen { followRename(of: request, on: connection) }
            if case .bytes(let bytes) = request.payload, case .local(.method(let method))? = connection.route(named: request.channel) {
                return traced(request) { connection.dispatchCall(to: method, payload: bytes, origin: origin) }
            }
            let input: RouteInput = switch request.payload {
            case .bytes(let bytes): .bytes(bytes)
            case .value(let value) where request.kind == .message: .message(value)
            case .value(let value): .call(MethodCall(method: request.knownMethod ?? request.kind.rawValue, arguments: value))
            }
            guard let origin else {
                connection.core.route(channel: request.channel, input: input, origin: nil, connection: connection,
                                      refusing: request.refusedKinds)
                return
            }
            traced(request) { connection.handleRequest(origin, channel: request.channel, input: input, refusing: request.refusedKinds) }
        }
    }

    /// A `listen` a stage renamed: the client's DEMANDs on the name it used go to the new name, the
    /// credit it already gave included.
    private func followRename(of request: InboundRequest, on connection: Connection) {
        let original = request.originalChannel.flatMap { $0 == request.channel ? nil : $0 }
        context.listened(to: request.channel, as: original)
        if let original, let credit = connection.takePendingCredit(for: original) {
            connection.keepPendingCredit(credit, for: request.channel)
        }
    }

    /// Counts and logs a plugin's failure; returns the `plugin_error` its request is answered with.
    @discardableResult
    func pluginFailed(_ plugin: String, _ why: String, on connection: Connection) -> WireError {
        connection.core.countPluginFailure(plugin)
        connection.logger.warning("plugin \(plugin) failed: \(why)")
        return .plugin(code: "plugin_error", message: "plugin \(plugin) failed: \(why)", details: nil)
    }

    /// Refuses a request with `error`: an ERROR (an error line in text mode), nothing for id 0.
    private func refuse(_ request: InboundRequest, _ target: InboundTarget, error: WireError, on connection: Connection) {
        switch target {
        case .register(let id): connection.writeError(error, id: id)
        case .request(nil): break  // id 0: nobody waits for an answer (the refusal is counted)
        case .request(let origin?): answerNow(origin, .error(error), request: request, on: connection)
        }
    }

    private func answerDirectly(_ answer: DirectAnswer, request: InboundRequest, target: InboundTarget, plugin: String,
                                on connection: Connection) {
        guard case .request(let origin) = target else {  // REGISTER
            let failure = pluginFailed(plugin, "a REGISTER cannot be answered by a plugin", on: connection)
            return refuse(request, target, error: failure, on: connection)
        }
        guard let origin else { return }
        answerNow(origin, self.answer(for: answer, request: request), request: request, on: connection)
    }

    /// What a direct answer is in the requester's encoding.
    private func answer(for answer: DirectAnswer, request: InboundRequest) -> Answer {
        let codec = request.codec?.codec ?? StandardMethodCodec()
        switch answer {
        case .notImplemented: return .notImplemented
        case .success(let value) where request.kind == .message:
            if request.isText { return .messageValue(value) }
            guard let encode = request.encodeMessage else {
                return .error(.plugin(code: "plugin_error", message: "the channel's message codec is unknown", details: nil))
            }
            do throws(CodecError) { return .messageBytes(try encode(value)) } catch {
                return .error(.badPayload("reply could not be encoded: \(error)"))
            }
        case .success(let value): return .success(value, codec)
        case .failure(let error) where request.kind == .message && !request.isText:
            return .error(WireError(carrying: error))  // a message reply has no error envelope
        case .failure(let error): return .failure(error, codec)
        }
    }

    /// Answers a request that never reached a channel.
    private func answerNow(_ origin: PendingRequest.Origin, _ answer: Answer, request inbound: InboundRequest,
                           on connection: Connection) {
        let request = traced(inbound) { connection.makeRequest(origin, methodCodec: inbound.codec) }
        request.answer(answer)
        connection.settle(request)
    }

    /// Runs `body` with the request's trace ready for the ``PendingRequest`` it makes.
    private func traced<Result>(_ request: InboundRequest, _ body: () -> Result) -> Result {
        guard request.receivedAt != 0 else { return body() }
        var request = request  // its method is read when first asked for
        pendingTrace = RequestTrace(channel: request.channel, method: request.method, receivedAt: request.receivedAt)
        defer { pendingTrace = nil }
        return body()
    }

    private func park(_ request: InboundRequest, target: InboundTarget, resumeAt: Int, plugin: String,
                      on connection: Connection) -> ParkedRequest {
        var kept = request
        if case .bytes(let bytes?) = request.payload { kept.payload = .bytes(ArraySlice(Array(bytes))) }  // off the read buffer
        var placeholder: PendingRequest?
        if case .request(let origin?) = target {
            let open = traced(request) { connection.makeRequest(origin, methodCodec: request.codec) }
            placeholder = open
            connection.settle(open)  // registers it: CANCEL, duplicate ids, disconnects and the drain see it
        }
        return ParkedRequest(connection: connection, request: kept, target: target, resumeAt: resumeAt, plugin: plugin,
                             placeholder: placeholder)
    }

    /// A deferred decision arrived (on the loop); nil: the plugin dropped its decider undecided.
    func resume(_ parked: ParkedRequest, request: InboundRequest, with decision: InboundDecision?, on connection: Connection) {
        if let placeholder = parked.placeholder {
            guard !placeholder.isAnswered, placeholder.connection != nil else { return }  // cancelled, closed or drained
            // A duplicate id answered it while it was parked: it is let go without going on.
            if case .offWire = placeholder.origin { return connection.withdraw(placeholder) }
        } else if connection.isClosing {
            return
        }
        if case .next? = decision {
            if let placeholder = parked.placeholder { connection.withdraw(placeholder) }
            var request = request
            if request.kind != .register { connection.core.classify(&request, for: connection) }  // the routes may have changed meanwhile
            continueInbound(&request, target: parked.target, from: parked.resumeAt, on: connection)
            if parked.placeholder != nil {  // as after any answer: the drain or a half-closed peer may wait for it
                connection.core.requestFinished()
                connection.closeIfPeerIsDone()
            }
            return
        }
        let answer: Answer
        switch decision {
        case .reject(let rejection)?:
            connection.core.countRejection(by: parked.plugin, code: rejection.code)
            answer = .error(rejection.error)
        case .answer(let direct)? where parked.placeholder != nil: answer = self.answer(for: direct, request: request)
        case .answer?:
            if case .request(nil) = parked.target { return }  // id 0: answered nowhere
            answer = .error(pluginFailed(parked.plugin, "a REGISTER cannot be answered by a plugin", on: connection))
        case .later?: answer = .error(pluginFailed(parked.plugin, "deferred twice", on: connection))
        case nil, .next?: answer = .error(pluginFailed(parked.plugin, "dropped its decision", on: connection))
        }
        if let placeholder = parked.placeholder { return placeholder.answer(answer) }
        if case .error(let error) = answer { refuse(request, parked.target, error: error, on: connection) }
    }

    // MARK: Outbound

    /// Passes an answer through the outbound stages that see it; a stage that drops it or fails turns it
    /// into `plugin_error`, since the request still needs its one answer.
    func filterAnswer(_ answer: Answer, trace: RequestTrace, codec methodCodec: (any MethodCodec)?, on connection: Connection) -> Answer {
        let kind: OutboundKind
        let content: OutboundMessage.Content
        switch answer {
        case .success(let value, _): (kind, content) = (.reply, .value(value))
        case .messageValue(let value): (kind, content) = (.reply, .value(value))
        case .messageBytes(let bytes): (kind, content) = (.reply, .bytes(bytes))
        case .notImplemented: (kind, content) = (.reply, .notImplemented)
        case .failure(let error, _): (kind, content) = (.error, .error(error))
        case .error(let error):
            (kind, content) = (.error, .error(ChannelError(code: error.code, message: error.message, details: error.details ?? .null)))
        }
        var message = OutboundMessage(connection: context, channel: trace.channel, kind: kind, method: trace.method,
                                      elapsed: .nanoseconds(Int64(EventLoop.nanoseconds() &- trace.receivedAt)), content: content)
        for stage in connection.core.pipeline.outbound where stage.sees(trace.channel, kind) {
            guard stage.processor.applies(to: context, channel: trace.channel) else { continue }
            let decision: OutboundDecision
            do { decision = try stage.processor.process(&message) } catch {
                return .error(pluginFailed(stage.plugin, "\(error)", on: connection))
            }
            if case .drop = decision {
                connection.core.countDrop("plugin")
                return .error(.plugin(code: "plugin_error", message: "plugin \(stage.plugin) withheld the answer", details: nil))
            }
        }
        guard message.isChanged else { return answer }
        // A method call's answer stays an envelope in its codec; a message's reply a message.
        switch message.content {
        case .value(let value): return methodCodec.map { .success(value, $0) } ?? .messageValue(value)
        case .error(let error):
            return methodCodec.map { .failure(error, $0) } ?? .error(WireError(carrying: error))
        case .bytes(let bytes): return .messageBytes(bytes)
        case .notImplemented, .end: return .notImplemented
        }
    }

    // MARK: Gates

    /// Runs a binary call or send through the gates, with the verdicts kept for its channel and kind
    /// when they still hold.
    func admit(_ channel: String, _ kind: InboundKind, through gates: [Pipeline.Stage<any InboundGate, InboundKind>],
               on connection: Connection) -> GateAdmission {
        let memo = verdicts(on: channel, kind, through: gates)
        if memo.judgesMethods { return .byMethod }
        guard let (plugin, rejection) = memo.admit(now: connection.core.eventLoop.now) else { return .admitted }
        return .refused(refuse(rejection, by: plugin, on: connection))
    }

    @inline(never)
    private func refuse(_ rejection: Rejection, by plugin: String, on connection: Connection) -> WireError {
        connection.core.countRejection(by: plugin, code: rejection.code)
        return rejection.error
    }

    /// The kept verdicts if they still hold for `kind` requests on `channel`; else the gates' new ones.
    private func verdicts(on channel: String, _ kind: InboundKind, through gates: [Pipeline.Stage<any InboundGate, InboundKind>]) -> GateMemo {
        let epoch = gateEpoch.value
        if let kept = gateMemo, kept.kind == kind, kept.epoch == epoch, kept.channel == channel { return kept }
        let memo = judge(channel, kind, through: gates, epoch: epoch)
        gateMemo = memo
        return memo
    }

    /// Asks each gate that sees `kind` requests on `channel` for its verdict, up to the first refusal.
    @inline(never)  // once per connection and channel: out of the per-request path
    private func judge(_ channel: String, _ kind: InboundKind, through gates: [Pipeline.Stage<any InboundGate, InboundKind>],
                       epoch: Int) -> GateMemo {
        var meters: [GateMemo.Metered] = []
        var refusal: (plugin: String, rejection: Rejection)?
        for gate in gates where gate.sees(channel, kind) {
            switch gate.processor.judge(context, channel: channel, kind: kind) {
            case .admit: continue
            case .meter(let meter): meters.append(GateMemo.Metered(plugin: gate.plugin, meter: meter))
            case .refuse(let rejection): refusal = (gate.plugin, rejection)
            case .byMethod: return GateMemo(channel: channel, kind: kind, epoch: epoch, meters: [], refusal: nil, judgesMethods: true)
            }
            if refusal != nil { break }
        }
        return GateMemo(channel: channel, kind: kind, epoch: epoch, meters: meters, refusal: refusal)
    }
}
