import SwitchboardCluster
import SwitchboardCodec
import SwitchboardPluginAPI
import SwitchboardWire

/// This loop's listeners of an event channel a client holds on another loop or node (`holderNode`, as
/// ``Elsewhere`` names it): their events come from there. Loop thread only.
final class RemoteStream {
    let entry: EventEntry
    let holderNode: String
    /// Tells this stream from a later one on the same channel: a listener of a retired stream (its
    /// holder ended it, or its node went silent) tells no node when it leaves.
    let id: UInt64

    init(entry: EventEntry, holderNode: String, id: UInt64) {
        self.entry = entry
        self.holderNode = holderNode
        self.id = id
    }
}

/// The stream handler of a ``RemoteStream``: a listener's leaving is told to the holder's side, which
/// cancels the holder's stream when no loop or node has a listener left.
struct RemoteListeners: StreamHandler {
    let streamID: UInt64
    /// The holder's side (``RemoteStream/holderNode``).
    let holderNode: String

    func onListen(arguments: ChannelValue, sink: EventSink) -> ChannelError? { nil }
    func onCancel(arguments: ChannelValue, sink: EventSink) {
        guard let stream = sink.liveStream else { return }
        stream.connection.core.listenerLeftRemoteStream(stream.entry.name, streamID: streamID, arguments: arguments)
    }
}

/// A listen on its way to another loop or node.
struct RemoteListen {
    let input: ClusterLink.CallInput
    /// What the caller's plugins refused it, were it of that kind (``InboundRequest/refusedKinds``).
    let refusedKinds: UInt8
    let payload: [UInt8]
    let arguments: ChannelValue
    let request: PendingRequest
    let connection: Connection

    /// Whether its requester still waits for it (a listen with id 0 is kept by its connection too).
    var isWanted: Bool { request.connection === connection && !request.isAnswered }
}

extension ServerCore {
    // MARK: Calling another loop or node

    /// Where the holder's side `node` (a loop, or a node's instance) is reached.
    func elsewhere(holding node: String) -> (any Elsewhere)? {
        SiblingLoops.isLoop(node) ? siblings : cluster
    }

    /// A request on a channel nobody serves here: it goes to the loop or the nodes whose clients hold
    /// the channel (``Elsewhere``; to `node`, when known), and their answer comes back to the requester.
    /// A listen or cancel it `mayBeStream` carry (on a channel whose kind only the holder's side may
    /// know, or an event channel) starts or ends a stream here.
    func routeElsewhere(_ elsewhere: any Elsewhere, node: String?, channel name: String, input: RouteInput, request: PendingRequest,
                        connection: Connection, refusing refusedKinds: UInt8, mayBeStream: Bool) {
        let streamCall = mayBeStream ? self.streamCall(input) : nil
        // A cancel of the stream this connection has from another node's holder (retired or not) ends it
        // here; any other `cancel` goes on as a call (the channel may well be a method channel).
        if let streamCall, streamCall.method == "cancel", let stream = connection.streams[name],
           stream.entry.handler is RemoteListeners {
            connection.endStream(stream, notifyHandler: true, arguments: streamCall.arguments)
            return request.answer(.success(.null, stream.entry.codec))
        }
        let kind: ClusterLink.CallInput
        let payload: ArraySlice<UInt8>
        switch input {
        case .bytes(let bytes?):
            kind = .bytes
            payload = bytes
        case .bytes(nil):
            kind = .empty
            payload = []
        case .call(let call):
            kind = .call
            guard let json = try? JSONText.serialize(.stringMap(["method": .string(call.method), "args": call.arguments])) else {
                return request.answer(.error(.badPayload("the call has no JSON form")))
            }
            payload = json[...]
        case .message(let value):
            kind = .message
            guard let json = try? JSONText.serialize(value) else { return request.answer(.error(.badPayload("the message has no JSON form"))) }
            payload = json[...]
        }
        if let streamCall, streamCall.method == "listen" {
            return listenRemotely(name, via: elsewhere, RemoteListen(input: kind, refusedKinds: refusedKinds, payload: Array(payload),
                                                     arguments: streamCall.arguments, request: request, connection: connection))
        }
        guard !request.isDetached else {
            elsewhere.call(name, node: node, input: kind, fromText: request.isText, refusing: refusedKinds, payload: payload, completion: nil)
            return
        }
        // The core outlives every call: its ways elsewhere drop them when they close.
        let id = elsewhere.call(name, node: node, input: kind, fromText: request.isText, refusing: refusedKinds, payload: payload) {
            [unowned self] outcome in remoteAnswered(outcome, request: request)
        }
        // A CANCEL goes to the holder's side, which answers it as it would its own client's. (Each way
        // elsewhere lives as long as the core, and drops its calls when it closes.)
        if let id { request.onCancel = .relayed { elsewhere.cancelCall(id) } }
    }

    /// The listen or cancel a request may carry (decoded as the holder's side would).
    private func streamCall(_ input: RouteInput) -> MethodCall? {
        let call: MethodCall?
        switch input {
        case .call(let c): call = c
        case .message: call = nil
        case .bytes(let payload?):
            // Decoded whole only when its method, read as either codec reads it, is one of the two.
            var reuse = MethodCallReuse()
            let standard = StandardMethodCodec().methodName(in: payload, reusing: &reuse)
            let method = standard ?? JSONMethodCodec().methodName(in: payload, reusing: &reuse)
            guard method == "listen" || method == "cancel" else { return nil }
            call = (standard != nil ? try? StandardMethodCodec().decodeMethodCall(from: payload) : nil)
                ?? (try? JSONMethodCodec().decodeMethodCall(from: payload))
        case .bytes(nil): call = nil
        }
        guard let call, call.method == "listen" || call.method == "cancel" else { return nil }
        return call
    }

    private func remoteAnswered(_ outcome: ClusterLink.CallOutcome, request: PendingRequest) {
        switch outcome {
        case .reply(let reply): request.answer(RemoteAnswer.decode(reply))
        case .noHolder: request.answer(.notImplemented)
        case .expired: request.answer(.error(.handlerGone))
        case .cancelled(let mark): request.answer(PendingRequest.cancelAnswer(methodCodec: mark.flatMap(RemoteAnswer.methodCodec(marked:))))
        }
    }

    /// Sends a listen, by `elsewhere`, to the holder's side that feeds this loop's listeners of `name`,
    /// or, with no stream yet, to whoever holds it.
    private func listenRemotely(_ name: String, via elsewhere: any Elsewhere, _ listen: RemoteListen) {
        // A listen with id 0 waits for its answer too: its connection keeps it among its open requests
        // (past their limit it is dropped), so that it is bounded, and cancelled if the connection goes.
        if listen.request.isDetached, !listen.connection.keepOffWire(listen.request) { return }
        guard listen.isWanted else { return }
        // Interested in the channel's events before the listen goes, so that none sent after its answer is missed.
        elsewhere.listenerAdded(on: name)
        let node = directory.remoteStreams[name].flatMap { self.elsewhere(holding: $0.holderNode) === elsewhere ? $0.holderNode : nil }
        let id = elsewhere.call(name, node: node, input: listen.input, fromText: listen.request.isText,
                                refusing: listen.refusedKinds, payload: listen.payload[...]) { [unowned self] outcome in
            remoteListenAnswered(outcome, channel: name, via: elsewhere, listen)
            elsewhere.listenerRemoved(from: name)  // the new stream, if any, counts for itself now
        }
        if let id { listen.request.onCancel = .relayed { elsewhere.cancelCall(id) } }
    }

    private func remoteListenAnswered(_ outcome: ClusterLink.CallOutcome, channel name: String, via elsewhere: any Elsewhere,
                                      _ listen: RemoteListen) {
        guard case .reply(let reply) = outcome, reply.startsStream, case .success(_, let codec) = RemoteAnswer.decode(reply) else {
            return remoteAnswered(outcome, request: listen.request)  // not an event channel's stream: a plain answer
        }
        guard listen.isWanted else {  // the requester left or cancelled: the holder's node is told at once
            return leave(name, holderNode: reply.node, arguments: listen.arguments)
        }
        let holderNode = reply.node
        if let remote = directory.remoteStreams[name], remote.holderNode != holderNode {
            // Two first listens went to different holders: this one follows the stream already here.
            leave(name, holderNode: holderNode, arguments: listen.arguments)
            return listenRemotely(name, via: elsewhere, listen)
        }
        let connection = listen.connection
        if let old = connection.streams[name] { connection.endStream(old, notifyHandler: true) }  // a listen replaces a stream
        let entry = (directory.remoteStreams[name]
            ?? directory.startRemoteStream(name, holderNode: holderNode, codec: codec, queueLimit: config.eventQueueLimit)).entry
        addListener(entry, connection: connection, arguments: listen.arguments, notifyingReplaced: true)
        listen.request.answer(.success(.null, entry.codec))
        connection.streams[name]?.activate()
    }

    /// One of this loop's listeners of `name` left its stream `streamID`: the holder's side is told,
    /// unless that stream was retired; the stream goes with its last listener.
    func listenerLeftRemoteStream(_ name: String, streamID: UInt64, arguments: ChannelValue) {
        guard let remote = directory.remoteStreams[name], remote.id == streamID else { return }
        leave(name, holderNode: remote.holderNode, arguments: arguments)
        if remote.entry.listeners.isEmpty { directory.retireRemoteStream(name) }
    }

    /// Tells `holderNode` that one listener of `name` here is gone (a `leave`, which wants no answer).
    private func leave(_ name: String, holderNode: String, arguments: ChannelValue) {
        guard let elsewhere = self.elsewhere(holding: holderNode), let payload = try? JSONText.serialize(arguments) else { return }
        elsewhere.call(name, node: holderNode, input: .leave, fromText: false, refusing: 0, payload: payload[...], completion: nil)
    }

    // MARK: Serving another loop or node

    /// Calls from clients of another loop or node (one batch), on a channel a client here holds.
    func serveRemote(_ calls: [ClusterLink.IncomingCall], on name: String, via elsewhere: any Elsewhere) {
        guard let registration = directory.registrations[name] else {
            for call in calls { elsewhere.notHeld(call, on: name) }
            return
        }
        for call in calls { serveRemote(call, by: registration, elsewhere) }
    }

    private func serveRemote(_ call: ClusterLink.IncomingCall, by registration: Registration, _ elsewhere: any Elsewhere) {
        if call.input == .leave {  // one of that node's listeners left (heard while draining too)
            let arguments = (try? JSONText.parse(call.payload)) ?? .null
            return remoteListenerLeft(registration, node: call.caller, arguments: arguments)
        }
        let key = call.key
        guard !isDraining || elsewhere.servesWhileDraining else { return elsewhere.answer(key, with: .error(.goingAway)) }
        registration.countRequest()
        let input: RouteInput
        switch call.input {
        case .bytes: input = .bytes(call.payload)
        case .empty: input = .bytes(nil)
        case .call:
            guard let json = try? JSONText.parse(call.payload), let method = json["method"]?.stringValue else {
                return elsewhere.answer(key, with: .error(.badPayload("another node's call could not be read")))
            }
            input = .call(MethodCall(method: method, arguments: json["args"] ?? .null))
        case .message:
            guard let value = try? JSONText.parse(call.payload) else {
                return elsewhere.answer(key, with: .error(.badPayload("another node's message could not be read")))
            }
            input = .message(value)
        case .leave, nil: return elsewhere.answer(key, with: .error(.badRequest("another node's call has no known input")))
        }
        if call.refusedKinds != 0 {  // the caller's node could not tell what it is: its kind here decides
            let isSend = if case .message = input { true } else { false }
            let kind = Registration.requestKind(registration.kind, isSend: isSend, isText: call.isText) {
                heldEventCall(registration, input: input)?.method
            }
            if call.refusedKinds & kind.bit != 0 {
                elsewhere.callsForbidden += 1
                let right = kind == .message ? "send" : kind.rawValue
                return elsewhere.answer(key, with: .error(.plugin(code: "forbidden", message: "the caller may not \(right) on \(registration.name)",
                                                                  details: nil)))
            }
        }
        // An event channel's listen: its success starts the caller node's stream.
        let listens = registration.kind == .event && heldEventCall(registration, input: input)?.method == "listen"
        let methodCodec = registration.kind == .method ? registration.sharedMethodCodec : nil
        let kindFlag = ClusterReply.kindFlag(mark: registration.channelMark)
        let request = PendingRequest(remoteText: call.isText, wantsAnswer: key != nil, methodCodec: methodCodec) {
            answer in elsewhere.answer(key, with: answer, startsStream: listens, kindFlag: kindFlag)
        }
        routeToHolder(registration, input: input, request: request, from: .remote(call.caller))
        if !request.isAnswered { elsewhere.serve(key, by: request) }
    }

    /// `node`'s beacon told how many listeners it has on channels held here. Fewer than counted here
    /// in two beacons in a row (one could precede a listen's answer reaching it) means `leave`s were
    /// lost: the count follows the beacon, and the holder hears `cancel` if no listener is left. More
    /// than counted (never so otherwise: this node counts a listener before that node does, and forgets
    /// it after) means this node forgot them: see ``rejoin(_:node:listeners:)``.
    func reconcileListeners(of node: String, _ counts: [String: Int]) {
        for (name, reported) in counts {
            guard let registration = directory.registrations[name], registration.events != nil,
                  reported > registration.remoteListeners[node] ?? 0 else { continue }
            rejoin(registration, node: node, listeners: reported)
        }
        for registration in directory.registrations.values {
            guard let counted = registration.remoteListeners[node] else { continue }
            let reported = counts[registration.name] ?? 0
            guard reported < counted else {
                registration.listenerShortfalls[node] = nil
                continue
            }
            let shortfalls = registration.listenerShortfalls[node, default: 0] + 1
            guard shortfalls >= 2 else {
                registration.listenerShortfalls[node] = shortfalls
                continue
            }
            registration.listenerShortfalls[node] = nil
            logger.notice("a node's listeners were fewer than counted: leaves were lost",
                          metadata: ["channel": "\(registration.name)", "instance": "\(node)"])
            remoteListenerLeft(registration, node: node, arguments: .null, count: counted - reported)
        }
    }

    /// `node` has listeners on `registration`'s stream that this node forgot: it took `node` for gone
    /// (as a node that stalls past the lease takes every other), while `node` went on and even listened
    /// again. They are counted again, and the events they missed meanwhile are counted as unsent; if the
    /// holder's stream has ended meanwhile, theirs are ended (`handler_gone`, then the end), so that their
    /// clients listen again. Either way no stream waits for events that never come.
    private func rejoin(_ registration: Registration, node: String, listeners: Int) {
        let missed = registration.eventsMissedSinceForgotten(by: node)
        guard case .active = registration.upstream else {
            logger.notice("a node follows a stream of a channel held here that has ended: ended there too",
                          metadata: ["channel": "\(registration.name)", "instance": "\(node)"])
            if let events = registration.events {
                for event in endListeners(of: events) { cluster?.publish(event, fromHolder: true) }
            }
            return
        }
        logger.notice("a node's listeners were more than counted: this node had taken it for gone",
                      metadata: ["channel": "\(registration.name)", "instance": "\(node)"])
        if let missed { cluster?.countUnsent(missed) }
        registration.remoteListeners[node] = listeners
        registration.listenerShortfalls[node] = nil
    }

    // MARK: A node going silent

    /// `node` sent no beacon for a lease: this node's listeners of channels held there get
    /// `handler_gone` then the end, and its listeners of channels held here are forgotten.
    func peerLost(_ node: String) {
        logger.warning("a cluster node went silent", metadata: ["instance": "\(node)"])
        for (name, remote) in directory.remoteStreams(heldBy: node) {
            directory.retireRemoteStream(name)
            endListeners(of: remote.entry)
        }
        for registration in Array(directory.registrations.values) {
            guard let count = registration.remoteListeners[node] else { continue }
            registration.noteForgotten(node)
            remoteListenerLeft(registration, node: node, arguments: .null, count: count)
        }
    }
}
