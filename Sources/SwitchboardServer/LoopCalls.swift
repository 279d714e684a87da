import SwitchboardCluster
import SwitchboardCodec

/// A request on a channel a client holds on another loop of this server, on its way there: a typed job,
/// without the subjects and headers of the bus (protocol/cluster.md, "The loops of one server").
/// Requests on held event channels go by the bus, which keeps the streams.
struct LoopCall: Sendable {
    let channel: String
    /// The request, its bytes copied out of the caller's inbound buffer.
    let input: RouteInput
    let isText: Bool
    /// The calling loop, and its id for the call; nil when no answer is wanted.
    let from: Int
    let id: UInt64?
    /// Whether it was passed on once already (the channel changed loops on its way).
    var passedOn = false
}

extension ServerCore {
    /// Sends a request on `name`, held on loop `holder`, there; its answer comes back to `request`,
    /// and a CANCEL follows it.
    func routeToLoop(_ holder: Int, channel name: String, input: RouteInput, request: PendingRequest) {
        guard let target = group?.cores[holder] else { return request.answer(.error(.goingAway)) }
        var owned = input
        if case .bytes(let bytes?) = input { owned = .bytes(Array(bytes)[...]) }
        var id: UInt64?
        if !request.isDetached {
            nextLoopCall += 1
            id = nextLoopCall
            loopCallsWaiting[nextLoopCall] = request
        }
        let call = LoopCall(channel: name, input: owned, isText: request.isText, from: index, id: id)
        guard target.loop.execute({ target.value.serveLoopCall(call) }) else {
            if let id { loopCallsWaiting.removeValue(forKey: id) }
            return request.answer(.error(.goingAway))  // that loop has stopped: the server is stopping
        }
        loopCallsOut += 1
        guard let id else { return }
        let here = index
        request.onCancel = .relayed { [unowned self] in
            if !target.loop.execute({ target.value.cancelLoopCall(from: here, id: id) }) { loopCallAnswered(id, .error(.goingAway)) }
        }
    }

    /// Calls sent to other loops whose callers still wait (one answered otherwise, say by a shutdown,
    /// is let go by ``forgetAnsweredLoopCalls()``).
    var loopCallsPending: Int { loopCallsWaiting.values.reduce(0) { $0 + ($1.isAnswered ? 0 : 1) } }

    /// Lets go of the calls sent to other loops whose callers were answered otherwise.
    func forgetAnsweredLoopCalls() {
        guard loopCallsWaiting.values.contains(where: \.isAnswered) else { return }
        loopCallsWaiting = loopCallsWaiting.filter { !$0.value.isAnswered }
    }

    /// The answer to this loop's call `id` came back.
    func loopCallAnswered(_ id: UInt64, _ answer: Answer) {
        loopCallsWaiting.removeValue(forKey: id)?.answer(answer)
    }

    /// A call from another loop on a channel a client here holds.
    func serveLoopCall(_ call: LoopCall) {
        let caller = group?.cores[call.from]
        let key = LoopCallKey(loop: call.from, id: call.id ?? 0)
        guard phase == .running || phase == .draining else {
            if let id = call.id { caller?.onLoop { $0.loopCallAnswered(id, .error(.goingAway)) } }
            return
        }
        guard let registration = registrations[call.channel] else {
            // Let go meanwhile: held on another loop now (passed on, once), or nowhere (no handler).
            if !call.passedOn, let holder = group?.holder(of: call.channel), holder.loop != index, !holder.isEvent,
               let next = group?.cores[holder.loop] {
                var passed = call
                passed.passedOn = true
                if next.loop.execute({ [passed] in next.value.serveLoopCall(passed) }) { return }
            }
            if let id = call.id { caller?.onLoop { $0.loopCallAnswered(id, .notImplemented) } }
            return
        }
        loopCallsIn += 1
        registration.countRequest()
        let request = PendingRequest(remoteText: call.isText, wantsAnswer: call.id != nil,
                                     methodCodec: registration.kind == .method ? registration.sharedMethodCodec : nil) {
            [unowned self] answer in
            guard let id = call.id else { return }
            loopCallsServed.removeValue(forKey: key)
            caller?.onLoop { $0.loopCallAnswered(id, answer) }
            requestFinished()
        }
        routeToHolder(registration, input: call.input, request: request, from: .remote(loopNames[call.from]))
        if call.id != nil, !request.isAnswered { loopCallsServed[key] = request }
    }

    /// The caller of a call from another loop cancelled it: it is answered here as this loop's own
    /// client's would be.
    func cancelLoopCall(from loop: Int, id: UInt64) {
        guard let request = loopCallsServed[LoopCallKey(loop: loop, id: id)] else { return }
        request.notifyCancel()
        request.answer(request.cancelAnswer)
    }

    /// A broadcast this loop made, for the listeners on the node's other loops: each loop of a cluster
    /// node is a node of its own on the bus, but a bus may be down or hung, so a node's broadcasts reach
    /// its own loops in-process, always, and the loops pass over their siblings' copies on the bus
    /// (protocol/cluster.md). Handed to each sibling loop as a broadcast from another node; one more
    /// than a sibling has room for is dropped and counted in `loopEventsDropped`.
    func shareWithSiblingLoops(_ event: OutboundEvent) {
        guard let group, group.count > 1, let frame = event.binaryFrame, let envelope = ClusterLink.eventEnvelope(in: frame) else { return }
        let channel = event.channel
        for (loop, core) in group.cores.enumerated() where loop != index {
            let waiting = group.siblingBroadcastsWaiting[loop]
            guard waiting.value.add(1, ordering: .relaxed).newValue <= LoopGroup.siblingBroadcastLimit else {
                waiting.value.subtract(1, ordering: .relaxed)
                cluster?.loopEventsDropped += 1
                continue
            }
            let queued = core.loop.execute {
                waiting.value.subtract(1, ordering: .relaxed)
                core.value.deliverRemote(on: channel, envelope: envelope, frame: frame, holderNode: nil)
            }
            if !queued { waiting.value.subtract(1, ordering: .relaxed) }  // that loop has stopped
        }
    }

    /// The server is stopping: calls from other loops still open here get `going_away`.
    func stopServingLoopCalls() {
        for request in Array(loopCallsServed.values) { request.answer(.error(.goingAway)) }
    }
}

/// A call from another loop: that loop and its id for the call.
struct LoopCallKey: Hashable {
    let loop: Int
    let id: UInt64
}
