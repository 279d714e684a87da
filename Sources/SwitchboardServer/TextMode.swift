import SwitchboardCodec
import SwitchboardWire

/// Wire-v1 section 5: one JSON object per line in, one compact JSON object per line out.
enum TextMode {
    static func handle(_ decoded: LineDecoder.Decoded, on connection: Connection) {
        guard case .line(let line) = decoded else {
            return writeError(.badRequest("line longer than \(connection.lineDecoder.maxLine) bytes"), id: nil, on: connection)
        }
        if line.allSatisfy({ $0 == 0x20 || $0 == 0x09 || $0 == 0x0D }) { return }
        let request: ChannelValue
        do { request = try JSONText.parse(line) } catch {
            return writeError(.badRequest("invalid JSON: \(error)"), id: nil, on: connection)
        }
        guard case .map(let fields) = request else {
            return writeError(.badRequest("a request is a JSON object"), id: nil, on: connection)
        }
        let id = request["id"]
        if let id {
            switch id {
            case .int32, .int64, .float64, .string: break
            default: return writeError(.badRequest("id must be a number or a string"), id: nil, on: connection)
            }
        }
        let verbs = ["call", "listen", "cancel", "send", "ping", "demand", "hello"]
        let present = fields.compactMap { entry -> String? in
            guard case .string(let key) = entry.key, verbs.contains(key) else { return nil }
            return key
        }
        guard present.count == 1, let verb = present.first else {
            return writeError(.badRequest("a request needs exactly one of \(verbs.joined(separator: ", "))"), id: id, on: connection)
        }
        if !connection.isAuthenticated, verb != "hello", verb != "ping" {
            return connection.fail(.unauthorized, id: 0, textID: id)
        }
        if verb == "hello" {
            guard case .map = request["hello"]! else {
                return connection.fail(.badHello("hello must be a JSON object"), id: 0, textID: id)
            }
            return connection.handleHello(payload: try? JSONText.serialize(request["hello"]!), id: 0, textID: id)
        }
        if verb == "ping" { return writeLine(withID(id, ["pong": true]), on: connection) }
        guard case .string(let channel)? = request[verb], !channel.isEmpty else {
            return writeError(.badRequest("\"\(verb)\" needs a channel name"), id: id, on: connection)
        }
        if verb == "demand" {
            guard let n = request["n"]?.intValue, n == -1 || n > 0 else {
                return writeError(.badRequest("\"n\" must be a positive integer or -1"), id: id, on: connection)
            }
            connection.addDemand(n == -1 ? 0xFFFF_FFFF : UInt32(min(n, Int(Credit.maxCounted))), channel: channel)
            return writeLine(withID(id, ["result": .null]), on: connection)
        }
        if connection.core.isDraining { return writeError(.goingAway, id: id, on: connection) }
        guard connection.admitsRequest(id: 0, textID: id) else { return }
        let input: RouteInput
        let kind: TextRequestKind
        switch verb {
        case "call":
            guard case .string(let method)? = request["method"] else {
                return writeError(.badRequest("\"call\" needs a \"method\" string"), id: id, on: connection)
            }
            input = .call(MethodCall(method: method, arguments: request["args"] ?? .null))
            kind = .call
        case "listen":
            input = .call(MethodCall(method: "listen", arguments: request["args"] ?? .null))
            kind = .listen
        case "cancel":
            input = .call(MethodCall(method: "cancel", arguments: request["args"] ?? .null))
            kind = .cancel
        default:
            input = .message(request["message"] ?? .null)
            kind = .send
        }
        if let plugins = connection.plugins, plugins.seesRequests {
            return throughPlugins(input, origin: .text(id: id, kind: kind), channel: channel, through: plugins, on: connection)
        }
        connection.handleRequest(.text(id: id, kind: kind), channel: channel, input: input)
    }

    /// A request, through the plugins' stages (out of line: most servers load none).
    @inline(never)
    private static func throughPlugins(_ input: RouteInput, origin: PendingRequest.Origin, channel: String,
                                       through plugins: PluginSession, on connection: Connection) {
        switch input {
        case .call(let call):
            plugins.runInbound(text: origin, method: call.method, channel: channel, value: call.arguments, on: connection)
        case .message(let message): plugins.runInbound(text: origin, method: nil, channel: channel, value: message, on: connection)
        case .bytes: plugins.runInbound(text: origin, method: nil, channel: channel, value: .null, on: connection)
        }
    }

    static func withID(_ id: ChannelValue?, _ fields: KeyValuePairs<String, ChannelValue>) -> ChannelValue {
        var entries: [ChannelValue.MapEntry] = id.map { [.init("id", $0)] } ?? []
        entries += fields.map { .init(.string($0.key), $0.value) }
        return .map(entries)
    }

    static func errorObject(_ error: ChannelError) -> ChannelValue {
        .stringMap(["code": .string(error.code), "message": error.message.map(ChannelValue.string) ?? .null,
                    "details": error.details])
    }

    static func writeLine(_ value: ChannelValue, on connection: Connection) {
        guard var line = try? JSONText.serialize(value, options: .textMode) else {
            return writeError(.badPayload("the answer has no JSON form"), id: value["id"], on: connection)
        }
        line.append(UInt8(ascii: "\n"))
        connection.writeRaw(line)
    }

    static func writeError(_ error: WireError, id: ChannelValue?, on connection: Connection) {
        var fields: [ChannelValue.MapEntry] = [.init("code", .string(error.code)), .init("message", .string(error.message))]
        if let details = error.details { fields.append(.init("details", details)) }
        writeLine(withID(id, ["error": .map(fields)]), on: connection)
    }

    static func writeAnswer(_ answer: Answer, id: ChannelValue?, kind: TextRequestKind, on connection: Connection) {
        switch answer {
        case .success(let value, _):
            writeLine(withID(id, kind == .send ? ["reply": value] : ["result": value]), on: connection)
        case .failure(let error, _): writeLine(withID(id, ["error": errorObject(error)]), on: connection)
        case .notImplemented:
            writeLine(withID(id, kind == .send ? ["reply": .null] : ["notImplemented": true]), on: connection)
        case .messageValue(let value): writeLine(withID(id, ["reply": value]), on: connection)
        case .messageBytes: writeError(.badPayload("reply has no text form"), id: id, on: connection)
        case .error(let error): writeError(error, id: id, on: connection)
        }
    }
}
