import SwitchboardCodec
import SwitchboardPluginAPI
import SwitchboardWire

/// A connection's requests: those its client made that are still open after their handler's first run
/// (binary ones by wire id, text ones and those whose answers go nowhere by serial), those the server
/// made of the client that wait for its REPLY, and the spares that let most calls allocate nothing. A
/// struct stored in its connection: no object of its own and no retain per call.
///
/// No access to the connection's table spans a call or a release anywhere (the tables are used through
/// a swap, see ``Connection/withBinaryRequests(_:)``), so the compiler proves every access exclusive and
/// checks none at run time: one access that did would cost a check on each of them, on every call.
struct RequestTable {
    /// Open binary requests by their wire id.
    var binary: [UInt32: PendingRequest] = [:]
    /// Open text requests by serial number.
    var text: [UInt64: PendingRequest] = [:]
    /// Requests whose answers go nowhere but that still wait on a holder, a loop or a node, by serial
    /// number (see ``Connection/keepOffWire(_:)``): open requests too, though the client waits for none.
    var offWire: [UInt64: PendingRequest] = [:]
    /// The serial number of the last request made (see ``PendingRequest/serial``).
    var lastSerial: UInt64 = 0
    /// An answered request to reuse for the next one (see ``PendingRequest/reuse(connection:origin:serial:methodCodec:)``).
    var spare: PendingRequest?
    /// What decoding the last method call leaves for the next (see ``MethodCallReuse``).
    var methodCallReuse = MethodCallReuse()
    /// Server-initiated requests waiting for this client's REPLY, by the id they were sent with.
    var outgoing: [UInt32: Connection.Outgoing] = [:]
    /// The id of the last server-initiated request.
    var lastOutgoingID: UInt32 = 0

    /// The requests that count against ``ServerConfiguration/maxOpenRequests``.
    var openCount: Int { binary.count + text.count + offWire.count }
    /// The requests whose answers the client waits for.
    var answersOwed: Int { binary.count + text.count }
}

extension Connection {
    // MARK: Requests

    /// Whether this client may open one more request: every request, binary or text, with plugins or
    /// without, asks before it is routed. Past ``ServerConfiguration/maxOpenRequests`` open ones, the
    /// request is refused with `too_many_requests` carrying its id (`textID` in text mode), and counted.
    func admitsRequest(id: UInt32, textID: ChannelValue? = nil) -> Bool {
        guard requests.openCount >= maxOpenRequests else { return true }
        core.stats.openRequestsRefused += 1
        writeError(.tooManyRequests, id: id, textID: textID)
        return false
    }

    /// Routes a request from this client. One its handler does not answer at once is kept in the table
    /// of open requests (for CANCEL, duplicate ids, disconnects and the shutdown drain).
    func handleRequest(_ origin: PendingRequest.Origin, channel: String, input: RouteInput, refusing refusedKinds: UInt8 = 0) {
        settle(core.route(channel: channel, input: input, origin: origin, connection: self, refusing: refusedKinds))
    }

    /// Hands a binary method call to its channel's handler on this loop, decoded in place: the common
    /// request, and the one way a binary call reaches a local method, whether it comes straight from the
    /// read loop, past the gates or through the whole pipeline (`origin` nil: a MESSAGE with id 0,
    /// answered nowhere). It skips the routing enum, and an answered request becomes the next one's spare.
    @inline(__always)
    func dispatchCall(to method: MethodEntry, payload: ArraySlice<UInt8>?, origin: PendingRequest.Origin?) {
        let request = core.invoke(method, payload: payload, request: makeRequest(origin, methodCodec: method.codec), connection: self)
        if origin != nil { settle(consume request) }  // moved: a copy (kept in debug builds) is never the spare
    }

    /// Forwards a binary request on a method or message channel to the client holding it, with its
    /// payload read in place: the common request to a holder, which skips the routing enum and the rest
    /// of ``ServerCore/routeToHolder(_:input:request:from:)``. For a connection whose plugins see no
    /// requests only: with no gate loaded, no reload can have taken the channel from its holder
    /// (``ServerCore/revokeIfRefused(_:epoch:)`` finds no refusal).
    func relayCall(to registration: Registration, payload: ArraySlice<UInt8>?, origin: PendingRequest.Origin?) {
        let request = makeRequest(origin, to: registration)
        core.forward(registration, payload: payload, request: request)
        if origin != nil { settle(consume request) }
    }

    /// A new request from this client to the holder of `registration`, counted as the channel's unless it
    /// is the holder's own MESSAGE with id 0 on it (an event it sends).
    func makeRequest(_ origin: PendingRequest.Origin?, to registration: Registration) -> PendingRequest {
        if registration.holder !== self || origin != nil { registration.countRequest() }
        return makeRequest(origin, methodCodec: registration.kind == .method ? registration.sharedMethodCodec : nil)
    }

    /// After a request's handler has run: an open request goes into the table of open requests; an
    /// answered one becomes the spare for the next request, unless its handler kept its `MethodResult`
    /// (which a later answer would then reach).
    /// Takes `request` (moved, not copied: a copy would cost a retain and a release per call).
    func settle(_ request: consuming PendingRequest) {
        guard !request.isAnswered else {
            guard isKnownUniquelyReferenced(&request), !isClosing else {
                request.connection = nil  // kept for the spare (see PendingRequest.connection): not one
                return
            }
            var spare: PendingRequest? = consume request
            swap(&spare, &requests.spare)  // the old spare, if any, is let go outside the access
            return
        }
        if isClosing { return request.abandonCancelling() }
        register(request)
    }

    /// Puts `request` in the table its origin says; one whose answer goes on the wire is a reply pending.
    private func register(_ request: PendingRequest) {
        request.isRegistered = true
        switch request.origin {
        case .binary(let id): withBinaryRequests { $0[id] = request }
        case .text: withTextRequests { $0[request.serial] = request }
        case .offWire: return withOffWire { $0[request.serial] = request }
        }
        core.stats.repliesPending += 1
    }

    /// Keeps a request with id 0 that is about to wait on a holder, a loop or a node among this
    /// connection's open requests until it is finished, so that it counts against the limit and is
    /// cancelled if the connection closes first (wire.md, "Open requests"). False, and it must not be
    /// sent, when the connection is closing or has as many open requests as it may (counted as refused:
    /// nobody waits for an ERROR).
    func keepOffWire(_ request: PendingRequest) -> Bool {
        guard !isClosing else { return false }
        guard requests.openCount < maxOpenRequests else {
            core.stats.openRequestsRefused += 1
            return false
        }
        requests.lastSerial += 1
        request.keepOffWire(by: self, serial: requests.lastSerial)
        register(request)
        return true
    }

    /// A new request from this client (detached, answered nowhere, when `origin` is nil).
    func makeRequest(_ origin: PendingRequest.Origin?, methodCodec: SharedMethodCodec?) -> PendingRequest {
        guard let origin else { return .detached(connectionID: id) }
        requests.lastSerial += 1
        let request: PendingRequest
        var spare: PendingRequest?
        swap(&spare, &requests.spare)
        if let spare {
            spare.reuse(connection: self, origin: origin, serial: requests.lastSerial, methodCodec: methodCodec)
            request = spare
        } else {
            request = PendingRequest(connection: self, origin: origin, serial: requests.lastSerial, methodCodec: methodCodec)
        }
        if let plugins, plugins.tracesRequests { request.trace = plugins.pendingTrace }  // nil too: a reused request keeps no old trace
        return request
    }

    /// Takes an open request out of the tables without answering it: a parked request goes on as a new one.
    func withdraw(_ request: PendingRequest) {
        forget(request)
        request.abandon()
    }

    func cancelRequest(_ id: UInt32) {
        guard let request = withBinaryRequests({ $0[id] }) else { core.stats.ignoredFrames += 1; return }
        cancel(request)
    }

    /// Cancels `request` as a CANCEL does: whoever works on it is told, and it is answered, by the loop
    /// or node it was relayed to if it was (in the form the channel's own node gives), else here.
    private func cancel(_ request: PendingRequest) {
        request.notifyCancel()
        if case .relayed = request.onCancel { return }
        request.answer(request.cancelAnswer)
    }

    /// Closes `request` and writes its answer in this connection's encoding.
    func finish(_ request: PendingRequest, with answer: consuming Answer) {
        guard !isClosing else { return }
        if let plugins, plugins.tracesRequests, let trace = request.trace {
            answer = plugins.filterAnswer(answer, trace: trace, codec: request.methodCodec?.codec, on: self)
        }
        closeRequest(request, binary: { writeBinaryAnswer(answer, id: $0) }, text: { copy answer })
    }

    /// ``finish(_:with:)`` for a success envelope, the common answer, without wrapping the value in an
    /// ``Answer`` (each wrapping copies it).
    func finish(_ request: PendingRequest, success value: ChannelValue, codec: any MethodCodec) {
        guard !isClosing else { return }
        if plugins?.tracesRequests == true { return finish(request, with: .success(value, codec)) }
        closeRequest(request, binary: { writeSuccess(value, codec: codec, id: $0) }, text: { .success(value, codec) })
    }

    /// ``finish(_:with:)`` for a binary request relayed to a holder, with the holder's REPLY payload read
    /// in place: copied into the REPLY to this client, with no array of its own.
    func finish(_ request: PendingRequest, replyCopying payload: ArraySlice<UInt8>?) {
        guard !isClosing else { return }
        if plugins?.tracesRequests == true { return finish(request, with: .messageBytes(payload.map(Array.init))) }
        closeRequest(request, binary: { writeFrame(.reply, id: $0, copying: payload) }, text: { .messageBytes(payload.map(Array.init)) })
    }

    /// Takes an answered request out of the tables and writes its answer where its origin says: a binary
    /// one by `binary` (given the id), a text one as `text` makes it.
    @inline(__always)
    private func closeRequest(_ request: PendingRequest, binary: (UInt32) -> Void, text: () -> Answer) {
        forget(request)
        switch request.origin {
        case .binary(let id): binary(id)
        case .text(let id, let kind): TextMode.writeAnswer(text(), id: id, kind: kind, on: self)
        case .offWire: break
        }
        afterAnswer(request)
    }

    /// Runs `body` with ``RequestTable/methodCallReuse`` taken out of the connection for the call (so no
    /// access to the table spans the codec's code), then puts it back.
    func withMethodCallReuse<Result>(_ body: (inout MethodCallReuse) throws(CodecError) -> Result) throws(CodecError) -> Result {
        var reuse = MethodCallReuse()
        swap(&reuse, &requests.methodCallReuse)
        defer { swap(&reuse, &requests.methodCallReuse) }
        return try body(&reuse)
    }

    /// Takes an answered request out of the table of open requests.
    private func forget(_ request: PendingRequest) {
        guard request.isRegistered else { return }
        switch request.origin {
        case .binary(let id): withBinaryRequests { _ = $0.removeValue(forKey: id) }
        case .text: withTextRequests { _ = $0.removeValue(forKey: request.serial) }
        case .offWire: return withOffWire { _ = $0.removeValue(forKey: request.serial) }
        }
        core.stats.repliesPending -= 1
    }

    /// Takes an open request off the wire (a duplicate id was answered in its place): it goes on, and
    /// stays open (counted against the limit, cancelled if the connection closes first) until it is
    /// finished, but its answer goes nowhere.
    func detach(_ request: PendingRequest) {
        forget(request)
        request.keepOffWire(by: self, serial: request.serial)
        register(request)
        afterAnswer(request)
    }

    /// The shutdown drain or a half-closed peer may have waited for this answer.
    private func afterAnswer(_ request: PendingRequest) {
        guard request.isRegistered else { return }
        core.requestFinished()
        closeIfPeerIsDone()
    }

    /// The peer half-closed and its open requests outlived the drain timeout: each is cancelled, oldest
    /// first, as by a CANCEL (its handler is told, and it is answered, with `cancelled` unless the
    /// handler answers at once), and the connection closes once they are, counted as `peerGone`.
    func abandonOpenRequests() {
        closeReasonOncePeerIsDone = .peerGone
        for request in openRequestsOldestFirst { cancel(request) }
    }

    func closeIfPeerIsDone() {
        if peerFinishedSending, requests.answersOwed == 0 { closeAfterFlush(closeReasonOncePeerIsDone) }
    }

    /// Answers every open request (for shutdown), oldest first.
    func answerAllOpenRequests(with answer: Answer) {
        for request in openRequestsOldestFirst { request.answer(answer) }
    }

    private var openRequestsOldestFirst: [PendingRequest] {
        let open = withBinaryRequests { Array($0.values) } + withTextRequests { Array($0.values) }
            + withOffWire { Array($0.values) }
        return open.sorted { $0.serial < $1.serial }
    }

    /// What waits for the REPLY to a server-initiated request: the REPLY payload, or why none came.
    typealias OutgoingCompletion = (Result<[UInt8]?, InvokeError>) -> Void

    /// A server-initiated request waiting for this client's REPLY.
    struct Outgoing {
        enum Waiter {
            /// A client's request, forwarded: the answer is relayed to it (no closure per request).
            case relay(PendingRequest)
            case completion(OutgoingCompletion)
        }
        let waiter: Waiter
        /// The held channel the request was forwarded on, to be failed if the holder lets the channel go;
        /// nil for the server's own requests (`invokeMethod`, `send`).
        let registration: Registration?

        /// Completes with the client's REPLY, read in place: a binary request relayed here gets it as it
        /// came, with no array of its own.
        consuming func complete(reply payload: ArraySlice<UInt8>?, core: ServerCore) {
            if case .relay(let request) = waiter, request.takesReplyAsItCame {
                return request.answer(replyCopying: payload)
            }
            complete(.success(payload.map(Array.init)), core: core)
        }

        consuming func complete(_ result: Result<[UInt8]?, InvokeError>, core: ServerCore) {
            switch waiter {
            case .relay(let request): core.relay(result, of: registration, to: request)
            case .completion(let completion): completion(result)
            }
        }
    }

    /// Sends a server-initiated MESSAGE (forwarded on `registration`, if given); `waiter` gets its
    /// answer. Returns the id used on this connection (nil if it could not be sent; `waiter` then got a
    /// failure).
    @discardableResult
    func sendRequest(channel: String, payload: ArraySlice<UInt8>?, forwardedOn registration: Registration? = nil,
                     waiter: consuming Outgoing.Waiter) -> UInt32? {
        let request = Outgoing(waiter: consume waiter, registration: registration)  // moved: a copy cost a retain and a release
        guard mode == .binary, !isClosing else {
            request.complete(.failure(mode == .text ? .textClient : .disconnected), core: core)
            return nil
        }
        if session != nil, !sessionHasRoom(forFrameOf: Frame.headerSize + channel.utf8.count + (payload?.count ?? 0)) {
            request.complete(.failure(.noRoom), core: core)  // a caller must not end the holder's session
            return nil
        }
        // One hash per request, and the request moved into the table: an id still in use (only after
        // 2^32 requests) gets its request back, and ours tries the next id.
        var id = requests.lastOutgoingID
        repeat { id &+= 1 } while id == 0
        var table: [UInt32: Outgoing] = [:]
        swap(&table, &requests.outgoing)
        var displaced = table.updateValue(consume request, forKey: id)
        while let inUse = displaced {
            let ours = table.updateValue(inUse, forKey: id)!
            repeat { id &+= 1 } while id == 0
            displaced = table.updateValue(ours, forKey: id)
        }
        swap(&table, &requests.outgoing)
        requests.lastOutgoingID = id
        writeFrame(.message, id: id, channel: channel, copying: payload)
        return id
    }

    // The tables of open and server-initiated requests are used through the table itself, taken out of
    // the connection for the lookup or change (nothing calls out meanwhile): no access to the property
    // spans a call, so the compiler proves them exclusive and checks none at run time.

    func withBinaryRequests<Result>(_ body: (inout [UInt32: PendingRequest]) -> Result) -> Result {
        var table: [UInt32: PendingRequest] = [:]
        swap(&table, &requests.binary)
        defer { swap(&table, &requests.binary) }
        return body(&table)
    }

    private func withTextRequests<Result>(_ body: (inout [UInt64: PendingRequest]) -> Result) -> Result {
        var table: [UInt64: PendingRequest] = [:]
        swap(&table, &requests.text)
        defer { swap(&table, &requests.text) }
        return body(&table)
    }

    private func withOffWire<Result>(_ body: (inout [UInt64: PendingRequest]) -> Result) -> Result {
        var table: [UInt64: PendingRequest] = [:]
        swap(&table, &requests.offWire)
        defer { swap(&table, &requests.offWire) }
        return body(&table)
    }

    private func withOutgoing<Result>(_ body: (inout [UInt32: Outgoing]) -> Result) -> Result {
        var table: [UInt32: Outgoing] = [:]
        swap(&table, &requests.outgoing)
        defer { swap(&table, &requests.outgoing) }
        return body(&table)
    }

    func handleReply(_ frame: FrameDecoder.View) {
        guard let waiting = withOutgoing({ $0.removeValue(forKey: frame.id) }) else { core.stats.ignoredFrames += 1; return }
        waiting.complete(reply: frame.payload, core: core)
    }

    /// Fails a server-initiated request still waiting for this client's REPLY.
    func failOutgoing(_ id: UInt32, _ error: InvokeError) {
        withOutgoing { $0.removeValue(forKey: id) }?.complete(.failure(error), core: core)
    }

    /// Fails, in id order, every request forwarded on `registration` (on any held channel, when nil)
    /// that still waits for a REPLY.
    func failForwarded(on registration: Registration?, _ error: InvokeError) {
        let ids = withOutgoing { table in
            table.compactMap { id, request -> UInt32? in
                guard let forwardedOn = request.registration else { return nil }
                return registration == nil || forwardedOn === registration ? id : nil
            }
        }
        for id in ids.sorted() { failOutgoing(id, error) }
    }

    /// Tells this client that the server no longer wants the answer to its request `id`.
    func sendCancel(_ id: UInt32) {
        guard withOutgoing({ $0.removeValue(forKey: id) }) != nil else { return }
        guard sessionHasRoom(forFrameOf: Frame.headerSize) else { return countDroppedForSession("cancel") }  // its answer is ignored
        writeFrame(.cancel, id: id, payload: nil)
    }

    /// For a close: fails the server-initiated requests, and cancels the open ones, whose answers can go
    /// nowhere whatever the close (a reset, an error, a slow consumer), so that each one's handler, holder,
    /// loop or node stops working on it.
    func dropRequests() {
        let waiting = withOutgoing { table in
            defer { table = [:] }
            return table
        }
        for request in waiting.values { request.complete(.failure(.disconnected), core: core) }
        let open = withBinaryRequests { table in
            defer { table = [:] }
            return table
        }
        let openText = withTextRequests { table in
            defer { table = [:] }
            return table
        }
        let offWire = withOffWire { table in
            defer { table = [:] }
            return table
        }
        for request in open.values { request.abandonCancelling() }
        for request in openText.values { request.abandonCancelling() }
        for request in offWire.values { request.abandonCancelling() }
        core.stats.repliesPending -= open.count + openText.count
    }
}
