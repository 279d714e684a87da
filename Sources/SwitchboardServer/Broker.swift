import SwitchboardCodec
import SwitchboardPluginAPI
import SwitchboardTransport
import SwitchboardWire

/// The codec a client declared for a channel it holds (wire-v1 section 6), for bridging text clients.
enum DeclaredCodec: String {
    case standard, json, string, binary

    var methodCodec: (any MethodCodec)? {
        switch self {
        case .standard: StandardMethodCodec()
        case .json: JSONMethodCodec()
        case .string, .binary: nil
        }
    }

    func encodeMessage(_ value: ChannelValue) throws(CodecError) -> [UInt8]? {
        switch self {
        case .standard: try StandardMessageCodec().encode(value)
        case .json: try JSONMessageCodec().encode(value)
        case .string: try StringCodec().encode(StringCodec().message(from: value))
        case .binary: try BinaryCodec().encode(BinaryCodec().message(from: value))
        }
    }

    func decodeMessage(_ payload: [UInt8]?) throws(CodecError) -> ChannelValue {
        switch self {
        case .standard: try StandardMessageCodec().decode(payload)
        case .json: try JSONMessageCodec().decode(payload)
        case .string: StringCodec().value(of: try StringCodec().decode(payload))
        case .binary: BinaryCodec().value(of: try BinaryCodec().decode(payload))
        }
    }
}

/// Who made a request on a held channel: a client of this node, or one of another node (protocol/cluster.md).
enum Caller {
    case local(Connection)
    /// The calling node's bus instance.
    case remote(String)
}

/// A channel held by a client. Loop thread only.
final class Registration {
    enum Kind: String { case method, event, message }
    /// Where the holder's `listen` stands, for event channels.
    enum Upstream {
        case idle
        /// The first `listen` went to the holder; these listens wait for its answer.
        case starting([(caller: Caller, request: PendingRequest, arguments: ChannelValue)])
        case active
    }

    let name: String
    /// Strong, so that reading it costs no check (an `unowned` load is an atomic retain and release): the
    /// directory lets go of a registration when its holder leaves (``ServerCore/holderLeft(_:)``), and the
    /// holder's route cache, the one way back from the holder, is emptied when it closes.
    let holder: Connection
    let kind: Kind?
    let codec: DeclaredCodec?
    /// The listeners of a held event channel, kept by the server.
    let events: EventEntry?
    /// The listeners other nodes have on a held event channel, by node: those nodes keep the streams,
    /// this one sends them the holder's events.
    var remoteListeners: [String: Int] = [:]
    /// Nodes whose beacons reported fewer listeners than counted here, and in how many beacons in a row.
    var listenerShortfalls: [String: Int] = [:]
    /// Nodes whose listeners were forgotten when they went silent, and how many events the stream had
    /// had then: if one was only taken for gone, its beacons bring its listeners back, and the events
    /// since are what they missed. At most ``forgottenLimit`` nodes.
    private(set) var forgottenAt: [String: Int] = [:]
    static let forgottenLimit = 64

    /// `node`'s listeners are forgotten (it went silent).
    func noteForgotten(_ node: String) {
        if forgottenAt.count >= Self.forgottenLimit { forgottenAt = [:] }  // nodes that never came back
        forgottenAt[node] = counts.events
    }

    /// The events `node`'s forgotten listeners missed, if they were forgotten; forgets that they were.
    func eventsMissedSinceForgotten(by node: String) -> Int? {
        forgottenAt.removeValue(forKey: node).map { max(0, counts.events - $0) }
    }
    var upstream = Upstream.idle
    let counts = ChannelCounts()
    /// ``Pipeline/gateEpoch`` when the gates last allowed its holder to hold it (Revocation.swift).
    var judgedEpoch = 0
    /// Where its counts are added up too: the loop's sums over every channel clients held, and, for a
    /// channel without a metrics label of its own, over those (``ServerCore/HeldCounts``).
    private let sums: ServerCore.HeldCounts, isLabeled: Bool
    /// Events the holder sent before its answer to the first `listen` arrived (it may emit from onListen).
    var early: [OutboundEvent] = []

    init(name: String, holder: Connection, kind: Kind?, codec: DeclaredCodec?, queueLimit: Int,
         sums: ServerCore.HeldCounts, isLabeled: Bool) {
        self.sums = sums
        self.isLabeled = isLabeled
        self.name = name
        self.holder = holder
        self.kind = kind
        self.codec = codec
        events = kind == .event
            ? EventEntry(name: name, codec: codec?.methodCodec ?? StandardMethodCodec(), handler: BrokerListeners(),
                         overflow: .dropOldest, queueLimit: queueLimit)
            : nil
        sharedMethodCodec = codec?.methodCodec.map(SharedMethodCodec.init)
    }

    /// What a request on a channel its holder declared `kind` does (protocol/plugins.md): a text-mode
    /// send, or a binary MESSAGE to a message channel, is a send; `listen` and `cancel` on an event
    /// channel are what they say (`method` is asked only there); anything else is a call.
    static func requestKind(_ kind: Kind?, isSend: Bool, isText: Bool, method: () -> String?) -> InboundKind {
        if isSend || (kind == .message && !isText) { return .message }
        guard kind == .event else { return .call }
        switch method() {
        case "listen"?: return .listen
        case "cancel"?: return .cancel
        default: return .call
        }
    }

    /// A request routed to the channel.
    func countRequest() {
        counts.requests += 1
        sums.all.requests += 1
        if !isLabeled { sums.unlabeled.requests += 1 }
    }

    /// An event published on the channel.
    func countEvent() {
        counts.events += 1
        sums.all.events += 1
        if !isLabeled { sums.unlabeled.events += 1 }
    }

    /// About what holding a channel costs besides its name (measured: 40,000 channels of 200-byte names
    /// held 70 MiB): what its release frees, for the housekeeping that gives free memory back to the kernel.
    static let footprint = 1536

    /// The declared method codec, made once and shared by the requests forwarded to the holder.
    let sharedMethodCodec: SharedMethodCodec?
    var methodCodec: (any MethodCodec)? { sharedMethodCodec?.codec }
    /// What the channel is, as the cluster marks it (``ServedCall/channelMark``): a method channel's
    /// method codec (`s`, `j`), or `-`.
    var channelMark: Character {
        guard kind == .method else { return "-" }
        switch codec {
        case .standard?: return "s"
        case .json?: return "j"
        default: return "-"
        }
    }
}

/// The stream handler of a client-held event channel: the server keeps the listeners itself; when the
/// last one leaves (cancel, re-listen or disconnect) the holder is told with a `cancel`.
struct BrokerListeners: StreamHandler {
    func onListen(arguments: ChannelValue, sink: EventSink) -> ChannelError? { nil }
    func onCancel(arguments: ChannelValue, sink: EventSink) {
        guard let stream = sink.liveStream else { return }  // live: the stream is ending as this runs
        stream.connection.core.listenerLeft(stream.entry.name, arguments: arguments)
    }
}

extension ServerCore {
    // MARK: REGISTER / UNREGISTER

    func register(_ frame: Frame, from connection: Connection) {
        var kind: Registration.Kind?
        var codec: DeclaredCodec?
        if let payload = frame.payload, !payload.isEmpty {
            guard let declaration = try? JSONText.parse(payload), case .map = declaration else {
                return connection.writeError(.badPayload("REGISTER payload must be a JSON object"), id: frame.id)
            }
            if let k = declaration["kind"] {
                guard let name = k.stringValue, let parsed = Registration.Kind(rawValue: name) else {
                    return connection.writeError(.badPayload("kind must be method, event or message"), id: frame.id)
                }
                kind = parsed
            }
            if let c = declaration["codec"] {
                guard let name = c.stringValue, let parsed = DeclaredCodec(rawValue: name) else {
                    return connection.writeError(.badPayload("codec must be standard, json, string or binary"), id: frame.id)
                }
                codec = parsed
            }
            if kind != .message, let codec, codec.methodCodec == nil {
                return connection.writeError(.badPayload("\(codec.rawValue) is a message codec"), id: frame.id)
            }
        }
        if directory.channels[frame.channel] != nil { return connection.writeError(.channelTaken, id: frame.id) }
        if let existing = directory.registrations[frame.channel] {
            guard existing.holder === connection else { return connection.writeError(.channelTaken, id: frame.id) }
            release(existing, reason: "re-registered", keepingClaim: true)
        } else if connection.held.count >= config.maxRegistrationsPerConnection {
            stats.registrationsRefused += 1
            return connection.writeError(.tooManyRegistrations, id: frame.id)
        }
        if loopCount > 1, let group, !group.claim(frame.channel, for: index, kind: kind, codec: codec) {  // held on another loop
            return connection.writeError(.channelTaken, id: frame.id)
        }
        let isLabeled = labeledHeld.count < config.metrics.channelLimit
        if isLabeled { labeledHeld.insert(frame.channel) }
        let registration = Registration(name: frame.channel, holder: connection, kind: kind, codec: codec,
                                        queueLimit: config.eventQueueLimit, sums: heldCounts, isLabeled: isLabeled)
        registration.judgedEpoch = pipeline.gateEpoch.value
        directory.hold(registration)
        connection.held.insert(frame.channel)
        cluster?.hold(frame.channel)
        if frame.id != 0 { connection.writeFrame(.reply, id: frame.id, payload: nil) }  // id 0: no answer wanted
    }

    func unregister(_ name: String, id: UInt32, from connection: Connection) {
        guard let registration = directory.registrations[name], registration.holder === connection else {
            return connection.writeError(.notRegistered, id: id)
        }
        release(registration, reason: "unregistered")
        if id != 0 { connection.writeFrame(.reply, id: id, payload: nil) }
    }

    /// A connection closes: every channel it held goes.
    func holderLeft(_ connection: Connection) {
        connection.failForwarded(on: nil, .disconnected)  // one pass over its table, not one per channel
        for name in connection.held {
            if let registration = directory.registrations[name] { release(registration, reason: "disconnected", failingForwarded: false) }
        }
    }

    /// A reload took the channel away from its holder: as if it had unregistered.
    func revoke(_ registration: Registration) { release(registration, reason: "revoked") }

    /// The holder is gone: forwarded requests get `handler_gone`, listeners an error event then the end.
    private func release(_ registration: Registration, reason: String, failingForwarded: Bool = true, keepingClaim: Bool = false) {
        directory.letGo(registration.name)
        releasedSinceTrim += Registration.footprint + registration.name.utf8.count
        registration.holder.held.removeShrinking(registration.name)
        labeledHeld.remove(registration.name)
        if loopCount > 1, !keepingClaim { group?.release(registration.name, by: index) }
        cluster?.letGo(registration.name)
        if failingForwarded { registration.holder.failForwarded(on: registration, .disconnected) }
        if case .starting(let waiting) = registration.upstream {
            for listen in waiting { listen.request.answer(.error(.handlerGone)) }
        }
        registration.upstream = .idle
        guard let events = registration.events else { return }
        let ending = endListeners(of: events)
        if !registration.remoteListeners.isEmpty {
            for event in ending { publishFromHolder(event, registration, ending: true) }
            registration.remoteListeners = [:]
        }
    }

    /// The holder of `events` is gone: its listeners get an error event (`handler_gone`), then the end.
    /// Returns the two events.
    @discardableResult
    func endListeners(of events: EventEntry) -> [OutboundEvent] {
        let gone = OutboundEvent(channel: events.name, content: .error(ChannelError(
            code: WireError.handlerGone.code, message: WireError.handlerGone.message)), codec: events.codec)
        let end = OutboundEvent(channel: events.name, content: .end, codec: events.codec)
        for stream in events.listeners.all {
            stream.deliver(gone)
            stream.deliver(end)
        }
        return [gone, end]
    }

    // MARK: Forwarding

    /// Routes a request (or a holder's event) on a client-held channel.
    func routeToHolder(_ registration: Registration, input: RouteInput, request: PendingRequest, from caller: Caller) {
        // A reload may have taken the channel away: then no holder has it (Revocation.swift).
        if revokeIfRefused(registration, epoch: pipeline.gateEpoch.value) { return request.answer(.notImplemented) }
        if case .local(let connection) = caller, registration.holder === connection, registration.kind == .event,
           request.isDetached, case .bytes(let payload) = input {
            return fanOut(registration, payload: payload.map(Array.init))
        }
        if registration.kind == .event, let events = registration.events {
            if let call = eventCall(registration, input: input, request: request) {
                switch (call.method, caller) {
                case ("listen", _): return listenToHolder(registration, events: events, call: call, caller: caller, request: request)
                case ("cancel", .local(let connection)):
                    return cancelHeldStream(registration, events: events, call: call, connection: connection, request: request)
                case ("cancel", .remote):  // a node's listeners leave with a `leave`: this caller had no stream
                    return request.answer(.failure(ChannelError(code: "error", message: "No active stream to cancel"), events.codec))
                default: break
                }
            } else if request.isAnswered {
                return
            }
        }
        let payload: [UInt8]?
        switch input {
        case .bytes(let bytes): return forward(registration, payload: bytes, request: request)
        case .call(let call):
            guard registration.kind != .message, let codec = registration.methodCodec else {
                return request.answer(.error(.badRequest("\(registration.name) declared no method codec")))
            }
            do throws(CodecError) { payload = try codec.encodeMethodCall(call) } catch {
                return request.answer(.error(.badPayload("\(error)")))
            }
        case .message(let value):
            guard registration.kind == .message, let codec = registration.codec else {
                return request.answer(.error(.badRequest("\(registration.name) declared no message codec")))
            }
            do throws(CodecError) { payload = try codec.encodeMessage(value) } catch {
                return request.answer(.error(.badPayload("\(error)")))
            }
        }
        forward(registration, payload: payload?[...], request: request)
    }

    /// Sends the request to the holder under a fresh id of its own, and relays its one answer back.
    func forward(_ registration: Registration, payload: ArraySlice<UInt8>?, request: PendingRequest,
                         then: ((Result<[UInt8]?, InvokeError>) -> Void)? = nil) {
        stats.forwardedRequests += 1
        let holder = registration.holder
        if then == nil, request.isDetached {  // a MESSAGE with id 0: nothing to relay
            guard holder.sessionHasRoom(forFrameOf: Frame.headerSize + registration.name.utf8.count + (payload?.count ?? 0)) else {
                return holder.countDroppedForSession("message")
            }
            holder.writeFrame(.message, id: 0, channel: registration.name, copying: payload)
            return
        }
        // The holder's table of requests waiting for its REPLY holds the request (or `then`) only until the
        // answer, a CANCEL, or the holder or registration going, whichever comes first.
        let waiter: Connection.Outgoing.Waiter = if let then { .completion(then) } else { .relay(request) }
        guard let id = holder.sendRequest(channel: registration.name, payload: payload, forwardedOn: registration,
                                          waiter: waiter) else { return }
        request.onCancel = .forwarded(holder: holder, id: id)  // CANCEL is relayed to the holder
    }

    /// Puts the holder's answer into the requester's terms.
    func relay(_ result: Result<[UInt8]?, InvokeError>, of registration: Registration?, to request: PendingRequest) {
        guard case .success(let payload) = result else { return request.answer(.error(result == .failure(.noRoom) ? .handlerBusy : .handlerGone)) }
        guard request.isText else { return request.answer(.messageBytes(payload)) }
        guard let registration, let codec = registration.codec else {
            return request.answer(.error(.badRequest("the channel declared no codec")))
        }
        if registration.kind == .message {
            do throws(CodecError) { request.answer(.messageValue(try codec.decodeMessage(payload))) } catch {
                request.answer(.error(.badPayload("the holder's reply could not be decoded: \(error)")))
            }
            return
        }
        guard let payload, let methodCodec = codec.methodCodec else { return request.answer(.notImplemented) }
        do throws(CodecError) {
            switch try methodCodec.decodeEnvelope(payload) {
            case .success(let value): request.answer(.success(value, methodCodec))
            case .failure(let error): request.answer(.failure(error, methodCodec))
            }
        } catch {
            request.answer(.error(.badPayload("the holder's reply could not be decoded: \(error)")))
        }
    }

    // MARK: Held event channels

    /// The listen/cancel call of a request to a held event channel; nil if it is some other call.
    private func eventCall(_ registration: Registration, input: RouteInput, request: PendingRequest) -> MethodCall? {
        if case .message = input {
            request.answer(.error(.badRequest("\(registration.name) is an event channel: use \"listen\"")))
        }
        return heldEventCall(registration, input: input)
    }

    /// The call a request on a held event channel carries, if it is one.
    func heldEventCall(_ registration: Registration, input: RouteInput) -> MethodCall? {
        switch input {
        case .call(let call): return call
        case .message: return nil
        case .bytes(let payload):
            // Without a declared codec the call is opaque; a Standard-encoded listen/cancel is still recognised.
            let codec = registration.methodCodec ?? StandardMethodCodec()
            return try? codec.decodeMethodCall(from: payload)
        }
    }

    private func listenToHolder(_ registration: Registration, events: EventEntry, call: MethodCall,
                                caller: Caller, request: PendingRequest) {
        switch registration.upstream {
        case .active:
            attach(caller, to: registration, events: events, arguments: call.arguments)
            request.answer(.success(.null, events.codec))
            if case .local(let connection) = caller { connection.streams[events.name]?.activate() }
        case .starting(var waiting):
            guard waitsForHolder(request, from: caller, on: registration) else { return }
            waiting.append((caller, request, call.arguments))
            registration.upstream = .starting(waiting)
        case .idle:
            guard let payload = try? events.codec.encodeMethodCall(call) else {
                return request.answer(.error(.badPayload("listen arguments cannot be encoded")))
            }
            guard waitsForHolder(request, from: caller, on: registration) else { return }
            registration.upstream = .starting([(caller, request, call.arguments)])
            let upstream = PendingRequest.detached(connectionID: registration.holder.id)
            forward(registration, payload: payload[...], request: upstream) { [weak self, weak registration] result in
                guard let self, let registration else { return }
                self.holderAnswered(listen: result, registration: registration, events: events)
            }
        }
    }

    /// Readies a listen to wait, in `registration`'s list, for the holder's answer to the first: one
    /// with id 0 from a client here is kept among its connection's open requests (false: past their
    /// limit, and it is dropped), and a cancel, or its requester going, takes it off the list.
    private func waitsForHolder(_ request: PendingRequest, from caller: Caller, on registration: Registration) -> Bool {
        if request.isDetached, case .local(let connection) = caller, !connection.keepOffWire(request) { return false }
        // `unowned request`: the closure lives in the request's own `onCancel`, which an answer and a
        // reuse as the connection's spare clear first, so it never outlives the request nor runs for the
        // next call that reuses it (and the spare check, which counts strong references, is not fooled).
        request.onCancel = .handler { [weak registration, unowned request] in
            guard let registration, case .starting(var waiting) = registration.upstream else { return }
            waiting.removeAll { $0.request === request }
            registration.upstream = .starting(waiting)
        }
        return true
    }

    private func holderAnswered(listen result: Result<[UInt8]?, InvokeError>, registration: Registration, events: EventEntry) {
        guard case .starting(let all) = registration.upstream else { return }
        let waiting = all.filter { !$0.request.isAnswered }  // a listen cancelled meanwhile starts no stream
        var refusal: ChannelError?
        switch result {
        case .failure(let error):
            let wire: WireError = error == .noRoom ? .handlerBusy : .handlerGone
            refusal = ChannelError(code: wire.code, message: wire.message)
        case .success(nil): refusal = ChannelError(code: "error", message: "the holder does not implement listen")
        case .success(let payload?):
            if case .failure(let error)? = try? events.codec.decodeEnvelope(payload) { refusal = error }
        }
        registration.upstream = refusal == nil ? .active : .idle
        for listen in waiting {
            if let refusal {
                listen.request.answer(.failure(refusal, events.codec))
            } else {
                attach(listen.caller, to: registration, events: events, arguments: listen.arguments)
            }
        }
        let early = registration.early
        registration.early = []
        guard refusal == nil else { return }
        for stream in events.listeners.all {  // queued behind the listen reply, so they follow it
            for event in early { stream.deliver(event) }
        }
        for listen in waiting {
            listen.request.answer(.success(.null, events.codec))
            if case .local(let connection) = listen.caller { connection.streams[events.name]?.activate() }
        }
        // After the answers: another node sees its listen's answer before these (one NATS connection).
        for event in early { publishFromHolder(event, registration) }
        if early.contains(where: \.isEnd) {  // the holder ended the stream before it answered the listen
            registration.upstream = .idle
            registration.remoteListeners = [:]
        }
    }

    /// A listen the holder accepted: a stream here, or one more listener counted for another node.
    private func attach(_ caller: Caller, to registration: Registration, events: EventEntry, arguments: ChannelValue) {
        switch caller {
        case .local(let connection): addListener(events, connection: connection, arguments: arguments, notifyingReplaced: false)
        case .remote(let node):
            registration.remoteListeners[node, default: 0] += 1
            registration.listenerShortfalls[node] = nil  // the count changed: beacons are judged afresh
        }
    }

    private func cancelHeldStream(_ registration: Registration, events: EventEntry, call: MethodCall,
                                  connection: Connection, request: PendingRequest) {
        guard let stream = connection.streams[events.name] else {
            return request.answer(.failure(ChannelError(code: "error", message: "No active stream to cancel"), events.codec))
        }
        connection.endStream(stream, notifyHandler: true, arguments: call.arguments)  // the last one out tells the holder
        request.answer(.success(.null, events.codec))
    }

    /// A listener of a held event channel left; the last one's leaving is forwarded as `cancel`.
    func listenerLeft(_ name: String, arguments: ChannelValue) {
        guard let registration = directory.registrations[name] else { return }
        cancelUpstreamIfUnheard(registration, arguments: arguments)
    }

    /// A listener on another node left (`count` of them, when the node is lost).
    func remoteListenerLeft(_ registration: Registration, node: String, arguments: ChannelValue, count: Int = 1) {
        guard let listening = registration.remoteListeners[node] else { return }
        registration.remoteListeners[node] = listening > count ? listening - count : nil
        registration.listenerShortfalls[node] = nil
        cancelUpstreamIfUnheard(registration, arguments: arguments)
    }

    /// With no listener left on any node, the holder's stream is cancelled.
    private func cancelUpstreamIfUnheard(_ registration: Registration, arguments: ChannelValue) {
        guard let events = registration.events, events.listeners.isEmpty, registration.remoteListeners.isEmpty,
              case .active = registration.upstream else { return }
        registration.upstream = .idle
        guard let payload = try? events.codec.encodeMethodCall(MethodCall(method: "cancel", arguments: arguments)) else { return }
        forward(registration, payload: payload[...], request: .detached(connectionID: registration.holder.id)) { _ in }
    }

    /// An event from the holder goes to every listener, encoded once per wire encoding.
    private func fanOut(_ registration: Registration, payload: [UInt8]?) {
        guard let events = registration.events else { return }
        registration.countEvent()
        let event = OutboundEvent(channel: registration.name, content: payload.map(EventContent.encoded) ?? .end,
                                  codec: registration.methodCodec)
        // Kept for the holder's answer: up to the queue's limit, and an end, after which nothing more
        // (an end is never dropped between loops, so a holder's thousand ends must not be kept).
        if case .starting = registration.upstream, registration.early.last?.isEnd != true,
           registration.early.count < events.queueLimit || payload == nil {
            registration.early.append(event)
        }
        events.listeners.deliver(event)
        if !registration.remoteListeners.isEmpty { publishFromHolder(event, registration) }
        if payload == nil, case .active = registration.upstream {
            registration.upstream = .idle
            registration.remoteListeners = [:]  // their streams end with this event
        }  // while starting, the end waits in `early` for the holder's answer to the listen
    }

    /// Sends an event of `registration` to its listeners elsewhere: the sibling loops and the other
    /// nodes with listeners on it. `ending`: it ends their streams (the end, or what precedes it), and
    /// no sibling loop drops it.
    func publishFromHolder(_ event: OutboundEvent, _ registration: Registration, ending: Bool = false) {
        var toLoops = false, toNodes = false
        for node in registration.remoteListeners.keys {
            if SiblingLoops.isLoop(node) { toLoops = true } else { toNodes = true }
        }
        if toLoops { siblings?.publish(on: event.channel, frame: event.binaryFrame, fromHolder: true, ending: ending) }
        if toNodes { cluster?.publish(event, fromHolder: true) }
    }
}
