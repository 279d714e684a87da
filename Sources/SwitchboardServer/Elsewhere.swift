import SwitchboardCluster
import SwitchboardCodec

/// Where work goes that nothing on this loop can do: the sibling loops of this server
/// (``SiblingLoops``: typed jobs, and the claims table of ``LoopGroup``) or the other nodes of a
/// cluster (``ClusterLink``, over a ``ClusterBus``). The server asks them in that order: a request on
/// a channel a client of a sibling loop holds goes to that loop, any other to the cluster, if any
/// (``ServerCore/route(channel:input:origin:connection:refusing:)``). Broadcasts, and the events of a
/// channel held here, go to both.
///
/// Both speak the link's terms (protocol/cluster.md): calls and their answers are records
/// (``ClusterLink/CallInput``, ``ClusterReply``) between a caller and a holder, each named by a string:
/// a node's instance, or `loop <i>`. How a request crosses, and how its answer, its CANCEL, a listen's
/// stream and a listener's leave come back, is written once, in RemoteCalls.swift. Loop thread only.
protocol Elsewhere: AnyObject {
    // MARK: Calls

    /// Sends a call on `channel` to `node`'s holder, or (nil) to whoever holds it; with a `completion`,
    /// its one outcome comes back to it. Returns the call's id (nil: it wants no answer).
    @discardableResult
    func call(_ channel: String, node: String?, input: ClusterLink.CallInput, fromText: Bool, refusing refusedKinds: UInt8,
              payload: ArraySlice<UInt8>, completion: ((ClusterLink.CallOutcome) -> Void)?) -> UInt64?
    /// The caller cancelled call `id`: the holder working on it hears, and answers it.
    func cancelCall(_ id: UInt64)
    /// Keeps `call` (the request serving the call `key` names, not answered yet) reachable by a cancel
    /// until it is answered.
    func serve(_ key: ClusterLink.CallKey?, by call: any ServedCall)
    /// Sends the answer to the call `key` names (nil: it wants none), as a record.
    func answer(_ key: ClusterLink.CallKey?, kind: UInt8, flags: UInt8, payload: [UInt8])
    /// The largest payload an answer can carry.
    var recordRoom: Int { get }
    /// A call came for a channel no client here holds (any more).
    func notHeld(_ call: ClusterLink.IncomingCall, on channel: String)
    /// Where calls from elsewhere go, and who hears that one of them was answered.
    var onCalls: ((_ channel: String, _ calls: [ClusterLink.IncomingCall]) -> Void)? { get set }
    var onServedAnswered: (() -> Void)? { get set }
    /// Calls from elsewhere being served here.
    var servingCount: Int { get }
    /// Calls from elsewhere refused here because the caller's side refused the caller their kind.
    var callsForbidden: Int { get set }
    /// Whether calls from elsewhere are still served while this loop drains: a sibling loop's are (the
    /// loops drain together), another node's go to other holders.
    var servesWhileDraining: Bool { get }

    // MARK: Events and interest

    /// Sends a local event on `channel`, as its wire `frame` (nil: it has none, counted as unsent): a
    /// broadcast, or (`fromHolder`) an event of a channel a client holds here.
    func publish(on channel: String, frame: [UInt8]?, fromHolder: Bool)
    /// A local listener joined or left `channel`: events on it are wanted here while one is left.
    func listenerAdded(on channel: String)
    func listenerRemoved(from channel: String)
    /// Where events from elsewhere go: the channel, the envelope (nil: the end of the stream), the
    /// whole frame, and the holder's side when the event came from a holder (nil: a broadcast).
    var onEvent: ((_ channel: String, _ envelope: [UInt8]?, _ frame: [UInt8], _ holderNode: String?) -> Void)? { get set }

    // MARK: Stopping

    /// The server stops: calls from elsewhere still open here are answered `going_away`.
    func stopServing()
    /// Stops for good: nothing more goes out or comes in, and no completion runs.
    func close()
}

extension Elsewhere {
    /// Sends a local event elsewhere: a broadcast, or (`fromHolder`) an event of a channel a client
    /// holds here, for the listeners elsewhere.
    func publish(_ event: OutboundEvent, fromHolder: Bool = false) {
        publish(on: event.channel, frame: event.binaryFrame, fromHolder: fromHolder)
    }

    /// Sends the answer to the call `key` names (nil: it wants none); `startsStream` marks the success
    /// of an event channel's listen, which starts the caller's stream; `kindFlag` tells the caller what
    /// the channel is (``ClusterReply/kindFlag(mark:)``).
    func answer(_ key: ClusterLink.CallKey?, with answer: Answer, startsStream: Bool = false, kindFlag: UInt8 = 0) {
        guard key != nil else { return }
        var (kind, isJSON, payload) = RemoteAnswer.encode(answer)
        if payload.count > recordRoom {  // what cannot cross is said, not lost
            (kind, isJSON, payload) = RemoteAnswer.encode(.error(.badPayload("the answer (\(payload.count) bytes) is larger than the cluster bus carries")))
        }
        let flags = (isJSON ? ClusterReply.jsonFlag : 0) | (startsStream && kind == .success ? ClusterReply.streamFlag : 0) | kindFlag
        self.answer(key, kind: kind.rawValue, flags: flags, payload: payload)
    }
}

/// The other nodes of a cluster.
extension ClusterLink: Elsewhere {
    var servesWhileDraining: Bool { false }

    /// Answered as NATS's no-responders would be: the null reply.
    func notHeld(_ call: ClusterLink.IncomingCall, on channel: String) { answer(call.key, with: .notImplemented) }
}
