import SwitchboardCodec
import SwitchboardPluginAPI
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
    /// Requests go through the plugins (the gates, or ``PluginSession/runInbound(message:on:)`` and its kin):
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
        connection.plugins?.resume(self, request: request, with: decision, on: connection)
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
        request.kindsOnArrival = 0

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

        switch connection.route(named: request.channel) {
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
                // Held on another loop: judged by what its holder declared it to be, as on its own loop,
                // and by what else it could be when it arrives there (the holder's loop checks that).
                held(claim.kind, claim.codec, claim.codec?.methodCodec.map(SharedMethodCodec.init))
                if !isSend {
                    let kinds = InboundKind.call.bit | InboundKind.listen.bit | InboundKind.cancel.bit
                        | (request.isText ? 0 : InboundKind.message.bit)
                    request.kindsOnArrival = kinds & ~request.kind.bit
                }
                return
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
                connection.plugins?.pluginFailed(stage.plugin, "on an event: \(error)", on: connection)
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
