import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

/// The loaded plugins, flattened into the orders they run in. Filled before the server runs, read-only
/// after: the paths that no plugin touches test one flag each.
final class Pipeline {
    /// A processor with its plugin's name and its scope, read once at load. A class: the loop over the
    /// stages then retains one reference per stage rather than copying an existential and two arrays.
    final class Stage<Processor, Kind: ScopedKind> {
        let plugin: String
        let processor: Processor
        let scope: Scope<Kind>
        /// The processor as a gate, if it is one (the pipeline then asks its `judge`).
        let gate: (any InboundGate)?
        /// The scope's kinds as bits, and whether it covers every channel: per request, ``sees(_:_:)``
        /// reads these rather than copying the scope.
        private let kinds: UInt8, isEveryChannel: Bool

        init(plugin: String, processor: Processor, scope: Scope<Kind>) {
            self.plugin = plugin
            self.processor = processor
            self.scope = scope
            gate = processor as? any InboundGate
            kinds = scope.mask
            isEveryChannel = scope.isEveryChannel
        }

        /// Whether the processor sees traffic of `kind` on `channel`.
        func sees(_ channel: String, _ kind: Kind) -> Bool {
            kinds & kind.bit != 0 && (isEveryChannel || scope.channels.contains { $0.matches(channel) })
        }
    }

    private(set) var plugins: [any Plugin] = []
    /// In load order.
    private(set) var inbound: [Stage<any InboundProcessor, InboundKind>] = []
    /// In reverse load order.
    private(set) var outbound: [Stage<any OutboundProcessor, OutboundKind>] = []
    /// The inbound stages as gates, when every one is a gate (see ``InboundGate``); else nil.
    private(set) var gates: [Stage<any InboundGate, InboundKind>]?
    /// Advances whenever any gate's epoch does: a connection's kept verdicts hold while it stands still.
    let gateEpoch = VerdictEpoch()
    /// The gates' epochs that lead ``gateEpoch``.
    private var gateEpochs: [ObjectIdentifier] = []
    /// Requests go through the plugins (the gates, or ``Connection/runInbound(message:)`` and its kin):
    /// some stage sees them on the way in, or sees their answers on the way out.
    private(set) var seesRequests = false
    /// Some outbound stage sees replies or errors: requests then carry a ``RequestTrace``.
    private(set) var seesAnswers = false
    /// Some outbound stage sees events: streams then ask, once each, which stages apply to them.
    private(set) var seesEvents = false
    var isEmpty: Bool { plugins.isEmpty }
    /// Whether a loaded plugin decides who may do what now (``Plugin/controlsAccess``).
    var controlsAccess: Bool { plugins.contains { $0.controlsAccess } }

    func load(_ plugin: any Plugin) {
        plugins.append(plugin)
        inbound += plugin.inbound.map { Stage(plugin: plugin.name, processor: $0, scope: $0.scope) }
        outbound = plugin.outbound.reversed().map { Stage(plugin: plugin.name, processor: $0, scope: $0.scope) } + outbound
        let asGates = inbound.compactMap { stage in
            (stage.processor as? any InboundGate).map { Stage(plugin: stage.plugin, processor: $0, scope: stage.scope) }
        }
        gates = asGates.count == inbound.count ? asGates : nil
        for epoch in inbound.compactMap({ $0.gate?.epoch }) where !gateEpochs.contains(ObjectIdentifier(epoch)) {
            gateEpochs.append(ObjectIdentifier(epoch))
            epoch.lead(gateEpoch)
        }
        seesAnswers = outbound.contains { $0.scope.seesAny(of: [.reply, .error]) }
        seesRequests = !inbound.isEmpty || seesAnswers
        seesEvents = outbound.contains { $0.scope.seesAny(of: [.event, .endOfStream]) }
    }

    /// The first verdict other than `.pass`, in load order.
    func authenticate(_ hello: Hello, connection: ConnectionContext) -> Authentication {
        for plugin in plugins {
            let verdict = plugin.authenticate(hello, connection: connection)
            if case .pass = verdict { continue }
            return verdict
        }
        return .pass
    }

    /// The stages that see events on `channel` for `connection`: asked when a stream starts; nil for none.
    func eventStages(for connection: ConnectionContext, channel: String) -> [Stage<any OutboundProcessor, OutboundKind>]? {
        guard seesEvents else { return nil }
        let stages = outbound.filter {
            ($0.sees(channel, .event) || $0.sees(channel, .endOfStream))
                && $0.processor.applies(to: connection, channel: channel)
        }
        return stages.isEmpty ? nil : stages
    }
}

/// What an answer's outbound stages need to know of its request (kept only while some stage sees
/// answers). A class: a request carries one pointer, nil when nothing traces it.
final class RequestTrace {
    let channel: String
    let method: String?
    /// ``EventLoop/nanoseconds()`` when the request arrived.
    let receivedAt: UInt64

    init(channel: String, method: String?, receivedAt: UInt64) {
        self.channel = channel
        self.method = method
        self.receivedAt = receivedAt
    }
}

/// Where an inbound request goes once every stage has let it through.
enum InboundTarget {
    /// A request answered through the connection (`origin` nil: a MESSAGE with id 0, answered nowhere).
    case request(PendingRequest.Origin?)
    /// A REGISTER with this id.
    case register(id: UInt32)
}

/// A request whose stage decided later: it waits here, open on its connection, for the ``Decider``.
/// Only the decider holds it, and it holds its connection weakly: a plugin that keeps a decider keeps
/// no connection alive.
final class ParkedRequest {
    private weak var connection: Connection?
    /// Let go once decided.
    private var request: InboundRequest?
    let target: InboundTarget
    /// The stage after the one that deferred.
    let resumeAt: Int
    let plugin: String
    /// The open request standing for it in the connection's tables (nil for id 0 and REGISTER).
    let placeholder: PendingRequest?

    init(connection: Connection, request: InboundRequest, target: InboundTarget, resumeAt: Int, plugin: String,
         placeholder: PendingRequest?) {
        self.connection = connection
        self.request = request
        self.target = target
        self.resumeAt = resumeAt
        self.plugin = plugin
        self.placeholder = placeholder
    }

    /// The decision, or nil when the plugin dropped its decider undecided.
    func resume(with decision: InboundDecision?) {
        guard let connection, let request else { return }
        self.request = nil
        connection.resume(self, request: request, with: decision)
    }
}

extension ServerCore {
    /// Judges what `request` is from where its channel leads before routing: its kind, its method (read
    /// from a binary payload without decoding the arguments), and how to encode a direct answer.
    func classify(_ request: inout InboundRequest, for connection: Connection) {
        let isSend = request.isText && request.knownMethod == nil
        /// The method, read now (it decides the kind) unless a text client sent it.
        func method(_ codec: SharedMethodCodec?) -> String? {
            guard !request.isText, case .bytes(let bytes) = request.payload else { return request.knownMethod }
            return try? connection.withMethodCallReuse { reuse in
                (codec?.codec ?? StandardMethodCodec()).methodName(in: bytes, reusing: &reuse)
            }
        }
        /// On an event channel, `listen` and `cancel` are what they say; any other method is a call
        /// (refused by the server, or forwarded to a client holding the channel).
        func eventKind(_ method: String?) -> InboundKind { method == "listen" ? .listen : method == "cancel" ? .cancel : .call }
        request.codec = nil
        request.encodeMessage = nil
        request.isMethodPending = false
        request.possibleKinds = 0

        /// On a channel a client holds, declared as `kind` in `declared`.
        func held(_ kind: Registration.Kind?, _ declared: DeclaredCodec?, _ methodCodec: SharedMethodCodec?) {
            request.kind = Registration.requestKind(kind, isSend: isSend, isText: request.isText) {
                request.knownMethod = method(methodCodec)
                return request.knownMethod
            }
            if request.kind == .message {
                if !request.isText { request.knownMethod = nil }
                if let declared {
                    request.encodeMessage = { value throws(CodecError) in try declared.encodeMessage(value) }
                }
            } else {
                request.codec = methodCodec
                if kind != .event { request.isMethodPending = !request.isText }
            }
        }

        switch route(named: request.channel, for: connection) {
        case .local(.method(let entry))?:
            request.kind = isSend ? .message : .call
            request.codec = entry.codec
            request.isMethodPending = !request.isText  // read when a stage asks
        case .local(.event(let entry))?:
            request.knownMethod = method(entry.sharedCodec)
            request.kind = isSend ? .message : eventKind(request.knownMethod)
            request.codec = entry.sharedCodec
        case .local(.message(let entry))?:
            // A text client's call or listen here is refused by the router ("use send"): judged as a call.
            request.kind = isSend || !request.isText ? .message : .call
            request.encodeMessage = entry.encode
            if !request.isText { request.knownMethod = nil }
        case .held(let registration)?:
            held(registration.kind, registration.codec, registration.sharedMethodCodec)
        case nil:
            if loopCount > 1, let claim = group?.holder(of: request.channel), claim.loop != index {
                // Held on another loop: judged by what its holder declared it to be, as on its own loop.
                return held(claim.kind, claim.codec, claim.codec?.methodCodec.map(SharedMethodCodec.init))
            }
            // Held on another node, or nowhere: only the holder's node can tell what the request is. Its
            // method is read as either codec would read it (a Standard call and a JSON one never look alike).
            if isSend { request.kind = .message; return }
            request.knownMethod = method(nil) ?? method(SharedMethodCodec(JSONMethodCodec()))
            request.kind = eventKind(request.knownMethod)
            request.possibleKinds = InboundKind.call.bit | (request.isText ? 0 : InboundKind.message.bit) | request.kind.bit
        }
    }

    func countRejection(by plugin: String, code: String) {
        tallies.pluginRejections[plugin, default: [:]][code, default: 0] += 1
    }

    func countPluginFailure(_ plugin: String) {
        tallies.pluginFailures[plugin, default: 0] += 1
    }

    /// The `plugins` entry of `switchboard/stats`: per plugin, its rejections by code and its failures.
    var pluginStats: ChannelValue {
        .map(pipeline.plugins.map { plugin in
            let rejected = (tallies.pluginRejections[plugin.name] ?? [:]).sorted { $0.key < $1.key }
            return .init(.string(plugin.name), .stringMap([
                "rejected": .map(rejected.map { .init(.string($0.key), .int($0.value)) }),
                "failed": .int(tallies.pluginFailures[plugin.name] ?? 0),
            ]))
        })
    }
}

extension Connection {
    // MARK: Inbound

    /// A binary MESSAGE, through the inbound stages.
    @inline(never)
    func runInbound(message frame: FrameDecoder.View) {
        var request = InboundRequest(connection: context, channel: frame.channel, method: nil, payload: .bytes(frame.payload),
                                     expectsAnswer: frame.id != 0, isText: false)
        start(&request)
        continueInbound(&request, target: .request(frame.id == 0 ? nil : .binary(id: frame.id)), from: 0)
    }

    /// A text-mode call, listen, cancel (`method` given) or send (`method` nil), through the inbound stages.
    func runInbound(text origin: PendingRequest.Origin, method: String?, channel: String, value: ChannelValue) {
        var request = InboundRequest(connection: context, channel: channel, method: method, payload: .value(value),
                                     expectsAnswer: true, isText: true)
        start(&request)
        continueInbound(&request, target: .request(origin), from: 0)
    }

    /// A REGISTER, through the inbound stages.
    @inline(never)
    func runInbound(register frame: FrameDecoder.View) {
        var request = InboundRequest(connection: context, channel: frame.channel, method: nil, payload: .bytes(frame.payload),
                                     expectsAnswer: frame.id != 0, isText: false)
        request.kind = .register
        if tracesRequests { request.receivedAt = EventLoop.nanoseconds() }
        continueInbound(&request, target: .register(id: frame.id), from: 0)
    }

    private func start(_ request: inout InboundRequest) {
        core.classify(&request, for: self)
        if tracesRequests { request.receivedAt = EventLoop.nanoseconds() }
    }

    /// Runs the stages from `index` on, then routes what they let through.
    func continueInbound(_ request: inout InboundRequest, target: InboundTarget, from index: Int) {
        let stages = inboundStages
        var next = index
        while next < stages.count {
            let stage = stages[next]
            next += 1
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
                return refuse(request, target, error: pluginFailed(stage.plugin, "\(error)"))
            }
            if request.isPayloadChanged || request.isRenamed {
                request.isPayloadChanged = false
                request.isRenamed = false
                if request.kind != .register { core.classify(&request, for: self) }  // what it is may have changed
            }
            switch consume decision {
            case .next: continue
            case .reject(let rejection):
                core.countRejection(by: stage.plugin, code: rejection.code)
                return refuse(request, target, error: rejection.error)
            case .answer(let answer):
                return answerDirectly(answer, request: request, target: target, plugin: stage.plugin)
            case .later(let body):
                let parked = park(request, target: target, resumeAt: next, plugin: stage.plugin)
                return body(Decider(token: DecisionToken(LoopBound(parked, loop: core.handle))))
            }
        }
        dispatch(request, target: target)
    }

    /// A gate's verdict on a request whose kind only another node can tell: its verdict on each kind
    /// the request could be. The kinds it refuses travel with the request, for the holder's node to
    /// refuse (protocol/cluster.md); the request is refused here only when every kind it could be is.
    private func verdictOnEveryKind(of request: inout InboundRequest, by gate: any InboundGate) -> GateVerdict {
        var admitted: GateVerdict?, refused: GateVerdict?
        for kind in InboundKind.allCases where request.possibleKinds & kind.bit != 0 {
            var verdict = gate.judge(request.connection, channel: request.channel, kind: kind)
            if case .byMethod(let judge) = verdict, let rejection = judge(request.method) { verdict = .refuse(rejection) }
            if case .refuse = verdict {
                request.refusedKinds |= kind.bit
                refused = refused ?? verdict
            } else if kind == request.kind || admitted == nil {
                admitted = verdict  // a meter counts the request as the kind its method says, when it may be that
            }
        }
        return admitted ?? refused ?? .admit
    }

    /// Routes a request every stage let through: a binary method call as ``handleMessage(_:)`` would,
    /// anything else through the router.
    private func dispatch(_ request: InboundRequest, target: InboundTarget) {
        switch target {
        case .register(let id):
            var payload: [UInt8]?
            if case .bytes(let bytes) = request.payload { payload = bytes.map(Array.init) }
            core.register(Frame(.register, id: id, channel: request.channel, payload: payload), from: self)
        case .request(let origin):
            if request.kind == .listen { followRename(of: request) }
            if let origin, case .bytes(let bytes) = request.payload,
               case .local(.method(let method))? = core.route(named: request.channel, for: self) {
                var pending = traced(request) { makeRequest(origin, methodCodec: method.codec) }
                core.invoke(method, payload: bytes, request: pending, connection: self)
                return settle(&pending)
            }
            let input: RouteInput = switch request.payload {
            case .bytes(let bytes): .bytes(bytes)
            case .value(let value) where request.kind == .message: .message(value)
            case .value(let value): .call(MethodCall(method: request.knownMethod ?? request.kind.rawValue, arguments: value))
            }
            guard let origin else {
                core.route(channel: request.channel, input: input, origin: nil, connection: self, refusing: request.refusedKinds)
                return
            }
            traced(request) { handleRequest(origin, channel: request.channel, input: input, refusing: request.refusedKinds) }
        }
    }

    /// A `listen` a stage renamed: the client's DEMANDs on the name it used go to the new name, the
    /// credit it already gave included.
    private func followRename(of request: InboundRequest) {
        let original = request.originalChannel.flatMap { $0 == request.channel ? nil : $0 }
        context.listened(to: request.channel, as: original)
        if let original, let credit = takePendingCredit(for: original) { keepPendingCredit(credit, for: request.channel) }
    }

    /// Counts and logs a plugin's failure; returns the `plugin_error` its request is answered with.
    @discardableResult
    func pluginFailed(_ plugin: String, _ why: String) -> WireError {
        core.countPluginFailure(plugin)
        logger.warning("plugin \(plugin) failed: \(why)")
        return .plugin(code: "plugin_error", message: "plugin \(plugin) failed: \(why)", details: nil)
    }

    /// Refuses a request with `error`: an ERROR (an error line in text mode), nothing for id 0.
    private func refuse(_ request: InboundRequest, _ target: InboundTarget, error: WireError) {
        switch target {
        case .register(let id): writeError(error, id: id)
        case .request(nil): break  // id 0: nobody waits for an answer (the refusal is counted)
        case .request(let origin?): answerNow(origin, .error(error), request: request)
        }
    }

    private func answerDirectly(_ answer: DirectAnswer, request: InboundRequest, target: InboundTarget, plugin: String) {
        guard case .request(let origin) = target else {  // REGISTER
            return refuse(request, target, error: pluginFailed(plugin, "a REGISTER cannot be answered by a plugin"))
        }
        guard let origin else { return }
        answerNow(origin, self.answer(for: answer, request: request), request: request)
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
    private func answerNow(_ origin: PendingRequest.Origin, _ answer: Answer, request inbound: InboundRequest) {
        var request = traced(inbound) { makeRequest(origin, methodCodec: inbound.codec) }
        request.answer(answer)
        settle(&request)
    }

    /// Runs `body` with the request's trace ready for the ``PendingRequest`` it makes.
    private func traced<Result>(_ request: InboundRequest, _ body: () -> Result) -> Result {
        guard request.receivedAt != 0 else { return body() }
        var request = request
        pendingTrace = RequestTrace(channel: request.channel, method: request.method, receivedAt: request.receivedAt)
        defer { pendingTrace = nil }
        return body()
    }

    private func park(_ request: InboundRequest, target: InboundTarget, resumeAt: Int, plugin: String) -> ParkedRequest {
        var kept = request
        if case .bytes(let bytes?) = request.payload { kept.payload = .bytes(ArraySlice(Array(bytes))) }  // off the read buffer
        var placeholder: PendingRequest?
        if case .request(let origin?) = target {
            var open = traced(request) { makeRequest(origin, methodCodec: request.codec) }
            placeholder = open
            settle(&open)  // registers it: CANCEL, duplicate ids, disconnects and the drain see it
        }
        return ParkedRequest(connection: self, request: kept, target: target, resumeAt: resumeAt, plugin: plugin,
                             placeholder: placeholder)
    }

    /// A deferred decision arrived (on the loop); nil: the plugin dropped its decider undecided.
    func resume(_ parked: ParkedRequest, request: InboundRequest, with decision: InboundDecision?) {
        if let placeholder = parked.placeholder {
            guard !placeholder.isAnswered, placeholder.connection != nil else { return }  // cancelled, closed or drained
        } else if isClosing {
            return
        }
        if case .next? = decision {
            if let placeholder = parked.placeholder { withdraw(placeholder) }
            var request = request
            if request.kind != .register { core.classify(&request, for: self) }  // the routes may have changed meanwhile
            continueInbound(&request, target: parked.target, from: parked.resumeAt)
            if parked.placeholder != nil {  // as after any answer: the drain or a half-closed peer may wait for it
                core.requestFinished()
                closeIfPeerIsDone()
            }
            return
        }
        let answer: Answer
        switch decision {
        case .reject(let rejection)?:
            core.countRejection(by: parked.plugin, code: rejection.code)
            answer = .error(rejection.error)
        case .answer(let direct)? where parked.placeholder != nil: answer = self.answer(for: direct, request: request)
        case .answer?:
            if case .request(nil) = parked.target { return }  // id 0: answered nowhere
            answer = .error(pluginFailed(parked.plugin, "a REGISTER cannot be answered by a plugin"))
        case .later?: answer = .error(pluginFailed(parked.plugin, "deferred twice"))
        case nil, .next?: answer = .error(pluginFailed(parked.plugin, "dropped its decision"))
        }
        if let placeholder = parked.placeholder { return placeholder.answer(answer) }
        if case .error(let error) = answer { refuse(request, parked.target, error: error) }
    }

    // MARK: Outbound

    /// Passes an answer through the outbound stages that see it; a stage that drops it or fails turns it
    /// into `plugin_error`, since the request still needs its one answer.
    func filterAnswer(_ answer: Answer, trace: RequestTrace, codec methodCodec: (any MethodCodec)?) -> Answer {
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
        for stage in core.pipeline.outbound where stage.sees(trace.channel, kind) {
            guard stage.processor.applies(to: context, channel: trace.channel) else { continue }
            let decision: OutboundDecision
            do { decision = try stage.processor.process(&message) } catch {
                return .error(pluginFailed(stage.plugin, "\(error)"))
            }
            if case .drop = decision {
                core.countDrop("plugin")
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
}

extension WireError {
    /// An ERROR carrying an error envelope's code, message and details (where no envelope can go).
    init(carrying error: ChannelError) {
        self = .plugin(code: error.code, message: error.message ?? error.code, details: error.details)
    }
}

extension EventStream {
    /// Passes an event through this stream's outbound stages: the shared event, a changed copy for this
    /// listener only, or nil when a stage dropped it (counted as `eventsDropped.plugin`).
    func filter(_ event: OutboundEvent, through stages: [Pipeline.Stage<any OutboundProcessor, OutboundKind>]) -> OutboundEvent? {
        let content: OutboundMessage.Content
        switch event.content {
        case .data(let value): content = .value(value)
        case .error(let error): content = .error(error)
        case .end: content = .end
        case .encoded(let envelope):
            switch try? event.codec?.decodeEnvelope(envelope) {
            case .success(let value)?: content = .value(value)
            case .failure(let error)?: content = .error(error)
            case nil: content = .bytes(envelope)
            }
        }
        let context = connection.context
        var message = OutboundMessage(connection: context, channel: event.channel, kind: event.isEnd ? .endOfStream : .event,
                                      method: nil, elapsed: nil, content: content)
        for stage in stages where stage.sees(message.channel, message.kind) {
            let decision: OutboundDecision
            do { decision = try stage.processor.process(&message) } catch {
                connection.pluginFailed(stage.plugin, "on an event: \(error)")
                if event.isEnd { continue }  // an end always goes out: the stream must end
                connection.core.countDrop("plugin")
                return nil
            }
            if case .drop = decision, !event.isEnd {
                connection.core.countDrop("plugin")
                return nil
            }
        }
        guard message.isChanged else { return event }
        let changed: EventContent = switch message.content {
        case .value(let value): .data(value)
        case .error(let error): .error(error)
        case .bytes(let bytes?): .encoded(bytes)
        case .end, .notImplemented, .bytes(nil): event.content
        }
        return OutboundEvent(channel: message.channel, content: event.isEnd ? .end : changed, codec: event.codec)
    }
}

/// The gates' verdicts on a connection's last gated channel and kind, kept while the pipeline's
/// ``Pipeline/gateEpoch`` stands still and no HELLO comes (see ``InboundGate``). Immutable: replaced
/// whole when any of that changes.
final class GateMemo {
    /// A gate that decides each request.
    struct Metered {
        let plugin: String
        let meter: any GateMeter
    }

    let channel: String
    let kind: InboundKind
    /// ``Pipeline/gateEpoch`` when judged.
    let epoch: Int
    /// The first gate asked per request (most often the only one) and its plugin, then the others.
    let meter: (any GateMeter)?, meterPlugin: String, moreMeters: [Metered]
    /// The gate that refuses every such request, after the meters before it admitted it; nil for none.
    let refusal: (plugin: String, rejection: Rejection)?
    /// Some gate judges such requests by their method: they take the whole pipeline, which reads it.
    let judgesMethods: Bool

    init(channel: String, kind: InboundKind, epoch: Int, meters: [Metered], refusal: (plugin: String, rejection: Rejection)?,
         judgesMethods: Bool = false) {
        self.channel = channel
        self.kind = kind
        self.epoch = epoch
        self.judgesMethods = judgesMethods
        meter = meters.first?.meter
        meterPlugin = meters.first?.plugin ?? ""
        moreMeters = Array(meters.dropFirst())
        self.refusal = refusal
    }

    /// The first refusal of a request the verdicts hold for, with the refusing plugin.
    @inline(__always)
    func admit(now: UInt64) -> (plugin: String, rejection: Rejection)? {
        guard let meter else { return refusal }
        if let rejection = meter.admit(now: now) { return (meterPlugin, rejection) }
        if moreMeters.isEmpty { return refusal }
        for metered in moreMeters {
            if let rejection = metered.meter.admit(now: now) { return (metered.plugin, rejection) }
        }
        return refusal
    }
}

/// The gates' verdict on one binary call or send, judged without its method.
enum GateAdmission {
    case admitted
    /// Refused with this answer (counted).
    case refused(WireError)
    /// A gate judges it by its method: it takes the whole pipeline.
    case byMethod
}

extension Connection {
    /// Runs a binary call or send through the gates, with the verdicts kept for its channel and kind
    /// when they still hold.
    func admit(_ channel: String, _ kind: InboundKind, through gates: [Pipeline.Stage<any InboundGate, InboundKind>]) -> GateAdmission {
        let memo = verdicts(on: channel, kind, through: gates)
        if memo.judgesMethods { return .byMethod }
        guard let (plugin, rejection) = memo.admit(now: core.eventLoop.now) else { return .admitted }
        return .refused(refuse(rejection, by: plugin))
    }

    @inline(never)
    private func refuse(_ rejection: Rejection, by plugin: String) -> WireError {
        core.countRejection(by: plugin, code: rejection.code)
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
