import SwitchboardCodec
import SwitchboardPluginAPI
import SwitchboardWire

/// Routing on one loop: where a channel's name leads (a server-side channel, a channel a client holds
/// here, or elsewhere: another loop or node), the call's handler, and the listeners of event channels.
extension ServerCore {
    /// Hands a request (`origin` nil: a MESSAGE with id 0, answered nowhere) to the channel's handler or
    /// holder; returns the request, which may or may not be answered yet. `refusedKinds`: what the
    /// plugins refused a request that goes to another node, were it of that kind (``InboundRequest/refusedKinds``).
    @discardableResult
    func route(channel name: String, input: RouteInput, origin: PendingRequest.Origin?, connection: Connection,
               refusing refusedKinds: UInt8 = 0) -> PendingRequest {
        let entry: ChannelEntry
        switch connection.route(named: name) {
        case .local(let local)?: entry = local
        case .held(let registration)?:
            let request = connection.makeRequest(origin, to: registration)
            routeToHolder(registration, input: input, request: request, from: .local(connection))
            return request
        case nil:
            let request = connection.makeRequest(origin, methodCodec: nil)
            if let siblings, let holder = group?.holder(of: name), holder.loop != index {  // a client of another loop holds it
                routeElsewhere(siblings, node: siblings.names[holder.loop], channel: name, input: input, request: request,
                               connection: connection, refusing: refusedKinds, mayBeStream: holder.isEvent)
            } else if let cluster {  // a client of another node may hold it
                routeElsewhere(cluster, node: nil, channel: name, input: input, request: request, connection: connection,
                               refusing: refusedKinds, mayBeStream: true)
            } else {
                request.answer(.notImplemented)
            }
            return request
        }
        let request: PendingRequest
        switch entry {
        case .method(let method):
            request = connection.makeRequest(origin, methodCodec: method.codec)
            method.counts.requests += 1
            guard let call = methodCall(input, codec: method.codec.codec, request: request) else { return request }
            method.handler(call, MethodResult(request: request, loop: handle))
        case .event(let event):
            event.counts.requests += 1
            request = connection.makeRequest(origin, methodCodec: nil)
            guard let call = methodCall(input, codec: event.codec, request: request) else { return request }
            switch call.method {
            case "listen": listen(event, arguments: call.arguments, connection: connection, request: request)
            case "cancel":
                if let stream = connection.streams[name] {
                    connection.endStream(stream, notifyHandler: true, arguments: call.arguments)
                    request.answer(.success(.null, event.codec))
                } else {
                    request.answer(.failure(ChannelError(code: "error", message: "No active stream to cancel"), event.codec))
                }
            default: request.answer(.notImplemented)
            }
        case .message(let message):
            message.counts.requests += 1
            request = connection.makeRequest(origin, methodCodec: nil)
            switch input {
            case .bytes(let payload): message.handle(.bytes(payload.map(Array.init)), request)
            case .message(let value): message.handle(.value(value), request)
            case .call: request.answer(.error(.badRequest("\(name) is a message channel: use \"send\"")))
            }
        }
        return request
    }

    /// Decodes a binary method call read in place and runs its channel's handler: the common request,
    /// which `Connection` sends here straight, without the routing enum. Returns `request`.
    @discardableResult @inline(__always)
    func invoke(_ method: MethodEntry, payload: ArraySlice<UInt8>?, request: consuming PendingRequest,
                connection: Connection) -> PendingRequest {
        method.counts.requests += 1
        let call: MethodCall
        do throws(CodecError) {
            call = try connection.withMethodCallReuse { reuse throws(CodecError) in
                try method.codec.codec.decodeMethodCall(from: payload, reusing: &reuse)
            }
        } catch {
            request.answer(.error(.badPayload("method call could not be decoded: \(error)")))
            return request
        }
        // The request moves into the handler's result and back out: no retain and release per call.
        let result = MethodResult(request: request, loop: handle)
        method.handler(call, result)
        return result.takeRequest()
    }

    private func methodCall(_ input: RouteInput, codec: any MethodCodec, request: PendingRequest) -> MethodCall? {
        switch input {
        case .call(let call): return call
        case .message: request.answer(.error(.badRequest("this is a method or event channel: use \"call\" or \"listen\"")))
        case .bytes(let payload):
            do throws(CodecError) { return try codec.decodeMethodCall(from: payload) } catch {
                request.answer(.error(.badPayload("method call could not be decoded: \(error)")))
            }
        }
        return nil
    }

    /// Starts `connection`'s stream on `entry` (replacing its previous one, whose handler is told when
    /// `notifyingReplaced`), with any credit that came before the listen. The stream waits for `activate()`.
    @discardableResult
    func addListener(_ entry: EventEntry, connection: Connection, arguments: ChannelValue, notifyingReplaced: Bool) -> EventStream {
        if let old = connection.streams[entry.name] { connection.endStream(old, notifyHandler: notifyingReplaced) }
        let credit = connection.takePendingCredit(for: entry.name) ?? .unbounded
        let stages = connection.hasPlugins ? pipeline.eventStages(for: connection.context, channel: entry.name) : nil
        let stream = EventStream(connection: connection, entry: entry, arguments: arguments, credit: credit, outboundStages: stages)
        stream.sink = EventSink(stream: stream, loop: handle, client: ClientID(connection.id))
        connection.streams[entry.name] = stream
        entry.listeners.add(stream)
        // Interest in events from elsewhere: broadcasts on a server-side channel, the events of a channel
        // held elsewhere (a held channel's events here come from its holder alone); the stream remembers,
        // so that its leaving is counted the same way.
        if siblings != nil || cluster != nil, isFedFromElsewhere(entry) {
            stream.countsForCluster = true
            for source in sources(of: entry) { source.listenerAdded(on: entry.name) }
        }
        return stream
    }

    private func listen(_ entry: EventEntry, arguments: ChannelValue, connection: Connection, request: PendingRequest) {
        let stream = addListener(entry, connection: connection, arguments: arguments, notifyingReplaced: true)
        if let refusal = entry.handler.onListen(arguments: arguments, sink: stream.sink) {
            connection.endStream(stream, notifyHandler: false)
            return request.answer(.failure(refusal, entry.codec))
        }
        request.answer(.success(.null, entry.codec))
        stream.activate()
    }

    func broadcast(on name: String, _ content: EventContent) {
        guard case .event(let entry)? = directory.channels[name] else { return }
        entry.counts.events += 1
        let event = OutboundEvent(channel: name, content: content, codec: entry.codec)
        entry.listeners.deliver(event)
        // To the sibling loops in-process, never by a bus, which may be down or hung (protocol/cluster.md).
        siblings?.publish(event)
        cluster?.publish(event)
    }

    /// Ends the streams of this loop's listeners on the server-side channel `name` (after what waits in them).
    func endListeners(on name: String) {
        guard case .event(let entry)? = directory.channels[name] else { return }
        let end = OutboundEvent(channel: name, content: .end, codec: entry.codec)
        entry.listeners.deliver(end)
    }

    /// Whether `entry` gets events from elsewhere: a server-side channel's broadcasts, or the events
    /// of a channel held on another loop or node (a held channel's events here come from its holder alone).
    private func isFedFromElsewhere(_ entry: EventEntry) -> Bool {
        if case .event(let local)? = directory.channels[entry.name], local === entry { return true }
        return directory.remoteStreams[entry.name]?.entry === entry
    }

    /// Where the events of `entry` (``isFedFromElsewhere(_:)``) come from: a channel held elsewhere's
    /// from its holder's side; a server-side channel's broadcasts from the sibling loops and other nodes.
    private func sources(of entry: EventEntry) -> [any Elsewhere] {
        if let remote = entry.handler as? RemoteListeners { return elsewhere(holding: remote.holderNode).map { [$0] } ?? [] }
        return [siblings as (any Elsewhere)?, cluster].compactMap { $0 }
    }

    /// An event from another loop or node for this loop's listeners: a broadcast, or (`holderNode` set)
    /// an event of the channel held there that this loop's listeners follow.
    func deliverRemote(on name: String, envelope: [UInt8]?, frame: [UInt8], holderNode: String?) {
        let entry: EventEntry
        if let holderNode {
            guard let remote = directory.remoteStreams[name], remote.holderNode == holderNode else { return }
            entry = remote.entry
        } else {
            guard case .event(let local)? = directory.channels[name] else { return }
            entry = local
        }
        entry.counts.events += 1
        let event = OutboundEvent(channel: name, envelope: envelope, frame: frame, codec: entry.codec)
        entry.listeners.deliver(event)
        if holderNode != nil, envelope == nil { directory.retireRemoteStream(name) }  // the holder ended it
    }

    /// `stream` left its channel's listeners.
    func listenerRemoved(_ stream: EventStream) {
        guard stream.countsForCluster else { return }
        for source in sources(of: stream.entry) { source.listenerRemoved(from: stream.entry.name) }
    }

    func sendRequest(to client: ClientID, channel: String, payload: [UInt8]?,
                     completion: @escaping (Result<[UInt8]?, InvokeError>) -> Void) {
        guard let connection = connections[client.rawValue] else { return completion(.failure(.disconnected)) }
        connection.sendRequest(channel: channel, payload: payload?[...], waiter: .completion(completion))
    }

    func countDrop(_ reason: String, count: Int = 1) {
        guard count > 0 else { return }
        tallies.eventsDropped[reason, default: 0] += count
    }
}
