import Logging
import SwitchboardCluster
import SwitchboardCodec
import SwitchboardTransport
import SwitchboardWire

// The server's side of the cluster protocol: ``ClusterLink`` (in SwitchboardCluster) works on bytes and
// ids; here the server's answers, events and requests become its records, and back.

extension ClusterLink {
    /// A node of the cluster `settings` describe: the whole server, or (`loop`) one of its loops, whose
    /// broadcasts carry `process`, the server's mark: its sibling loops had them in-process (``SiblingLoops``).
    /// Its beacons carry the mark too, which session tokens name (``SessionToken/process``).
    convenience init(settings: ClusterSettings, loop index: Int?, process: String, eventLoop loop: EventLoop, logger: Logger) throws(UVError) {
        var options = NATSBus.Options(servers: settings.servers, name: "switchboard \(settings.node)" + (index.map { " loop \($0)" } ?? ""))
        options.connectTimeoutMs = settings.connectTimeoutMs
        options.pingIntervalMs = settings.pingIntervalMs
        try self.init(options: options, node: settings.node, process: index == nil ? nil : process, eventLoop: loop, logger: logger)
        if !process.isEmpty { beaconHeaders = [.init("Sb-Process", process)] }
    }
}

/// A request from another node, as the link keeps it while it is served here.
extension PendingRequest: ServedCall {
    var channelMark: Character { RemoteAnswer.channelMark(methodCodec: methodCodec?.codec) }

    func cancel() {
        notifyCancel()
        answer(cancelAnswer)
    }

    func callerLost() {
        let hook = onCancel
        answer(.error(.handlerGone))
        hook.run()
    }

    func stop() { answer(.error(.goingAway)) }
}

/// An ``Answer`` as it crosses the bus from the holder's node to the caller's: a kind, a codec flag
/// for an envelope, and the payload's bytes (protocol/cluster.md).
enum RemoteAnswer {
    /// What the payload holds.
    enum Kind: UInt8 {
        /// The holder's REPLY payload (`b`), or none (`n`).
        case bytes = 0x62, empty = 0x6E
        /// A success (`s`) or error (`f`) envelope.
        case success = 0x73, failure = 0x66
        /// Not implemented, or a null reply (`z`): no payload.
        case null = 0x7A  // ClusterReply.nullKind
        /// A text-mode message reply, as JSON (`v`).
        case value = 0x76
        /// An ERROR payload (`{"code","message","details"}`, `e`).
        case error = 0x65
    }

    /// The kind, whether the envelope is JSON, and the payload of `answer`.
    static func encode(_ answer: Answer) -> (kind: Kind, isJSON: Bool, payload: [UInt8]) {
        switch answer {
        case .success(let value, let codec):
            guard let payload = try? codec.encodeSuccessEnvelope(value) else {
                return encode(.error(.badPayload("the answer could not be encoded")))
            }
            return (.success, codec is JSONMethodCodec, payload)
        case .failure(let error, let codec):
            guard let payload = try? codec.encodeErrorEnvelope(error) else {
                return encode(.error(.badPayload("error envelope could not be encoded")))
            }
            return (.failure, codec is JSONMethodCodec, payload)
        case .notImplemented: return (.null, false, [])
        case .messageBytes(nil): return (.empty, false, [])
        case .messageBytes(let bytes?): return (.bytes, false, bytes)
        case .messageValue(let value):
            guard let payload = try? JSONText.serialize(value) else { return encode(.error(.badPayload("reply has no JSON form"))) }
            return (.value, false, payload)
        case .error(let error): return (.error, false, error.payload)
        }
    }

    static func decode(_ reply: ClusterReply) -> Answer {
        let malformed = Answer.error(.badPayload("another node's answer could not be read"))
        switch Kind(rawValue: reply.kind) {
        case .success, .failure:
            let codec: any MethodCodec = reply.flags & ClusterReply.jsonFlag != 0 ? JSONMethodCodec() : StandardMethodCodec()
            switch try? codec.decodeEnvelope(Array(reply.payload)) {
            case .success(let value)?: return .success(value, codec)
            case .failure(let error)?: return .failure(error, codec)
            case nil: return malformed
            }
        case .null: return .notImplemented
        case .empty: return .messageBytes(nil)
        case .bytes: return .messageBytes(Array(reply.payload))
        case .value:
            guard let value = try? JSONText.parse(reply.payload) else { return malformed }
            return .messageValue(value)
        case .error:
            guard let error = try? JSONText.parse(reply.payload), let code = error["code"]?.stringValue else { return malformed }
            switch code {
            case WireError.handlerGone.code: return .error(.handlerGone)
            case WireError.cancelled.code: return .error(.cancelled)
            case WireError.goingAway.code: return .error(.goingAway)
            default: return .error(.plugin(code: code, message: error["message"]?.stringValue ?? "", details: error["details"]))
            }
        case nil: return malformed
        }
    }

    /// What a channel whose method codec is `codec` (nil: not a method channel) is, as the link marks
    /// it (``ServedCall/channelMark``): `s` the standard method codec, `j` the JSON one, `-` any other.
    static func channelMark(methodCodec codec: (any MethodCodec)?) -> Character {
        switch codec {
        case is StandardMethodCodec: "s"
        case is JSONMethodCodec: "j"
        default: "-"
        }
    }

    /// The method codec a mark names, if it names one.
    static func methodCodec(marked mark: Character) -> (any MethodCodec)? {
        switch mark {
        case "s": StandardMethodCodec()
        case "j": JSONMethodCodec()
        default: nil
        }
    }
}
