import SwitchboardCluster
import SwitchboardCodec
import SwitchboardWire

/// This node's listeners of an event channel a client holds on another node (`holderNode`): their
/// events come from that node, on the channel's subject. Loop thread only.
final class RemoteStream {
    let entry: EventEntry
    let holderNode: String

    init(entry: EventEntry, holderNode: String) {
        self.entry = entry
        self.holderNode = holderNode
    }
}

/// The stream handler of a ``RemoteStream``: a listener's leaving is told to the holder's node, which
/// cancels the holder's stream when no node has a listener left.
struct RemoteListeners: StreamHandler {
    let holderNode: String

    func onListen(arguments: ChannelValue, sink: EventSink) -> ChannelError? { nil }
    func onCancel(arguments: ChannelValue, sink: EventSink) {
        guard let stream = sink.liveStream else { return }
        stream.connection.core.remoteListenerLeft(stream.entry.name, holderNode: holderNode, arguments: arguments)
    }
}

/// An ``Answer`` as it crosses the bus from the holder's node to the caller's: the `Sb-Answer` header
/// names the case (and `Sb-Codec` the codec of an envelope), the payload carries its bytes
/// (protocol/cluster.md).
enum RemoteAnswer {
    /// The `Sb-Answer` and `Sb-Codec` values and the payload of `answer`.
    static func encode(_ answer: Answer) -> (kind: String, codec: String?, payload: [UInt8]) {
        switch answer {
        case .success(let value, let codec):
            guard let payload = try? codec.encodeSuccessEnvelope(value) else {
                return encode(.error(.badPayload("the answer could not be encoded")))
            }
            return ("success", codecName(codec), payload)
        case .failure(let error, let codec):
            guard let payload = try? codec.encodeErrorEnvelope(error) else {
                return encode(.error(.badPayload("error envelope could not be encoded")))
            }
            return ("failure", codecName(codec), payload)
        case .notImplemented: return ("null", nil, [])
        case .messageBytes(nil): return ("none", nil, [])
        case .messageBytes(let bytes?): return ("bytes", nil, bytes)
        case .messageValue(let value):
            guard let payload = try? JSONText.serialize(value) else { return encode(.error(.badPayload("reply has no JSON form"))) }
            return ("value", nil, payload)
        case .error(let error): return ("error", nil, error.payload)
        }
    }

    static func decode(_ message: BusMessage) -> Answer {
        let malformed = Answer.error(.badPayload("another node's answer could not be read"))
        switch message.header("Sb-Answer") {
        case "success", "failure":
            let codec: any MethodCodec = message.header("Sb-Codec") == "json" ? JSONMethodCodec() : StandardMethodCodec()
            switch try? codec.decodeEnvelope(message.payload) {
            case .success(let value)?: return .success(value, codec)
            case .failure(let error)?: return .failure(error, codec)
            case nil: return malformed
            }
        case "null": return .notImplemented
        case "none": return .messageBytes(nil)
        case "bytes": return .messageBytes(message.payload)
        case "value":
            guard let value = try? JSONText.parse(message.payload) else { return malformed }
            return .messageValue(value)
        case "error":
            guard let error = try? JSONText.parse(message.payload), let code = error["code"]?.stringValue else { return malformed }
            switch code {
            case WireError.handlerGone.code: return .error(.handlerGone)
            case WireError.cancelled.code: return .error(.cancelled)
            case WireError.goingAway.code: return .error(.goingAway)
            default: return .error(.plugin(code: code, message: error["message"]?.stringValue ?? "", details: error["details"]))
            }
        default: return malformed
        }
    }

    private static func codecName(_ codec: any MethodCodec) -> String { codec is JSONMethodCodec ? "json" : "standard" }
}

extension ServerCore {
    // MARK: Calling another node

    /// A request on a channel nobody serves here: it goes to the nodes whose clients hold the channel
    /// (NATS request and reply, to their queue group), and their answer comes back to the requester.
    func routeToCluster(_ cluster: ClusterLink, channel name: String, input: RouteInput, request: PendingRequest,
                        connection: Connection) {
        let streamCall = self.streamCall(input)
        if let streamCall, streamCall.method == "cancel" {
            return cancelRemoteStream(name, arguments: streamCall.arguments, request: request, connection: connection)
        }
        let kind: ClusterLink.CallInput
        let payload: [UInt8]
        switch input {
        case .bytes(let bytes?):
            kind = .bytes
            payload = Array(bytes)
        case .bytes(nil):
            kind = .none
            payload = []
        case .call(let call):
            kind = .call
            guard let json = try? JSONText.serialize(.stringMap(["method": .string(call.method), "args": call.arguments])) else {
                return request.answer(.error(.badPayload("the call has no JSON form")))
            }
            payload = json
        case .message(let value):
            kind = .message
            guard let json = try? JSONText.serialize(value) else { return request.answer(.error(.badPayload("the message has no JSON form"))) }
            payload = json
        }
        let text = request.isText
        guard !request.isDetached else {
            cluster.call(name, input: kind, fromText: text, payload: payload, completion: nil)
            return
        }
        guard let streamCall else {
            let id = cluster.call(name, input: kind, fromText: text, payload: payload) { [weak self] outcome in
                self?.remoteAnswered(outcome, request: request)
            }
            if let id { request.onCancel = .handler { [weak cluster] in cluster?.cancelCall(id) } }
            return
        }
        // A listen: subscribed to the channel's events before it goes, so none sent after its answer is
        // missed; a node's listeners all follow the holder that answered its first listen.
        cluster.listenerAdded(on: name)
        cluster.call(name, node: remoteStreams[name]?.holderNode, input: kind, fromText: text, payload: payload) { [weak self] outcome in
            guard let self else { return }
            remoteListenAnswered(outcome, channel: name, arguments: streamCall.arguments, request: request, connection: connection)
            self.cluster?.listenerRemoved(from: name)  // the new stream, if any, counts for itself now
        }
    }

    /// The listen or cancel a request carries, if it is one (decoded as the holder's node would).
    private func streamCall(_ input: RouteInput) -> MethodCall? {
        let call: MethodCall?
        switch input {
        case .call(let c): call = c
        case .message: call = nil
        case .bytes(let payload?):
            // Decoded only when it may be one: a Standard call whose method is a 6-byte string, or JSON.
            guard payload.count >= 8, payload.first == 7 && payload[payload.startIndex + 1] == 6 || payload.first == UInt8(ascii: "{") else {
                return nil
            }
            call = (try? StandardMethodCodec().decodeMethodCall(from: payload)) ?? (try? JSONMethodCodec().decodeMethodCall(from: payload))
        case .bytes(nil): call = nil
        }
        guard let call, call.method == "listen" || call.method == "cancel" else { return nil }
        return call
    }

    private func remoteAnswered(_ outcome: ClusterLink.CallOutcome, request: PendingRequest) {
        switch outcome {
        case .reply(let message): request.answer(RemoteAnswer.decode(message))
        case .noHolder: request.answer(.notImplemented)
        case .expired: request.answer(.error(.handlerGone))
        }
    }

    private func remoteListenAnswered(_ outcome: ClusterLink.CallOutcome, channel name: String, arguments: ChannelValue,
                                      request: PendingRequest, connection: Connection) {
        guard case .reply(let message) = outcome, let holderNode = message.header("Sb-Node") else {
            return remoteAnswered(outcome, request: request)
        }
        let answer = RemoteAnswer.decode(message)
        guard case .success(_, let codec) = answer else { return request.answer(answer) }
        let remote = remoteStreams[name]
        guard request.connection === connection, !request.isAnswered, remote == nil || remote?.holderNode == holderNode else {
            // Nobody to listen (the requester left or cancelled), or another holder already feeds this
            // node's listeners: the holder's node is told at once that this listener is gone.
            remoteListenerLeft(name, holderNode: holderNode, arguments: arguments)
            return request.answer(.error(.handlerGone))
        }
        let entry: EventEntry
        if let remote {
            entry = remote.entry
        } else {
            entry = EventEntry(name: name, codec: codec, handler: RemoteListeners(holderNode: holderNode),
                               overflow: .dropOldest, queueLimit: config.eventQueueLimit)
            remoteStreams[name] = RemoteStream(entry: entry, holderNode: holderNode)
        }
        addListener(entry, connection: connection, arguments: arguments, notifyingReplaced: true)
        request.answer(.success(.null, entry.codec))
        connection.streams[name]?.activate()
    }

    private func cancelRemoteStream(_ name: String, arguments: ChannelValue, request: PendingRequest, connection: Connection) {
        guard let remote = remoteStreams[name], let stream = connection.streams[name], stream.entry === remote.entry else {
            return request.answer(.failure(ChannelError(code: "error", message: "No active stream to cancel"), StandardMethodCodec()))
        }
        connection.endStream(stream, notifyHandler: true, arguments: arguments)
        request.answer(.success(.null, remote.entry.codec))
    }

    /// One of this node's listeners of a channel held on `holderNode` left: that node is told, as a
    /// `cancel` call that wants no answer.
    func remoteListenerLeft(_ name: String, holderNode: String, arguments: ChannelValue) {
        guard let cluster, let payload = try? JSONText.serialize(.stringMap(["method": "cancel", "args": arguments])) else { return }
        cluster.call(name, node: holderNode, input: .call, payload: payload, completion: nil)
    }

    // MARK: Serving another node

    /// A call from a client of another node, on a channel a client here holds.
    func serveRemote(_ call: ClusterLink.IncomingCall, on name: String) {
        guard let cluster else { return }
        guard let registration = registrations[name] else { return cluster.answer(call, with: .notImplemented) }
        registration.counts.requests += 1
        let message = call.message
        let request = PendingRequest(remoteText: message.header("Sb-Text") == "1", wantsAnswer: call.id != nil,
                                     methodCodec: registration.kind == .method ? registration.sharedMethodCodec : nil) {
            [weak cluster] answer in cluster?.answer(call, with: answer)
        }
        let input: RouteInput
        switch message.header("Sb-Input") {
        case "bytes": input = .bytes(message.payload[...])
        case "none": input = .bytes(nil)
        case "call":
            guard let json = try? JSONText.parse(message.payload), let method = json["method"]?.stringValue else {
                return request.answer(.error(.badPayload("another node's call could not be read")))
            }
            input = .call(MethodCall(method: method, arguments: json["args"] ?? .null))
        case "message":
            guard let value = try? JSONText.parse(message.payload) else {
                return request.answer(.error(.badPayload("another node's message could not be read")))
            }
            input = .message(value)
        default: return request.answer(.error(.badRequest("another node's call has no known input")))
        }
        routeToHolder(registration, input: input, request: request, from: .remote(call.caller))
        cluster.serve(call, by: request)
    }

    // MARK: A node going silent

    /// `node` sent no beacon for a lease: this node's listeners of channels held there get
    /// `handler_gone` then the end, and its listeners of channels held here are forgotten.
    func peerLost(_ node: String) {
        logger.warning("a cluster node went silent", metadata: ["instance": "\(node)"])
        for remote in remoteStreams.values where remote.holderNode == node {
            endListeners(of: remote.entry)
        }
        for registration in Array(registrations.values) {
            guard let count = registration.remoteListeners[node] else { continue }
            remoteListenerLeft(registration, node: node, arguments: .null, count: count)
        }
    }
}
