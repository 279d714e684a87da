import SwitchboardCodec
import SwitchboardTransport

/// Where channel names lead on one loop: the channels the server serves, the channels this loop's
/// clients hold, and the streams this loop's listeners follow on channels held on another loop or node.
/// Its ``version`` changes with every channel and registration, which invalidates each connection's
/// ``RouteCache``. Owned by its ``ServerCore``; loop thread only. Its operations only keep the tables:
/// what a change means for streams, holders and counts is the core's.
final class ChannelDirectory {
    /// The channels the server serves.
    private(set) var channels: [String: ChannelEntry] = [:]
    /// The channels clients of this loop hold (broker routing).
    private(set) var registrations: [String: Registration] = [:]
    /// This loop's listeners of event channels held on other loops or nodes, by channel.
    private(set) var remoteStreams: [String: RemoteStream] = [:]
    /// The last remote stream's id.
    private var lastRemoteStreamID: UInt64 = 0
    /// Changes whenever a channel or registration does.
    private(set) var version = 0

    /// Where `name` leads on this loop (nil: nowhere here); each connection keeps its last answer (see
    /// ``Connection/route(named:)``).
    func route(named name: String) -> Route? {
        if let entry = channels[name] { return .local(entry) }
        if let registration = registrations[name] { return .held(registration) }
        return nil
    }

    // MARK: Served channels

    /// Serves `name` by `entry`, or no longer (nil).
    func setChannel(_ name: String, _ entry: ChannelEntry?) {
        channels[name] = entry
        version &+= 1
    }

    // MARK: Held channels

    /// Routes `registration`'s channel to its holder, in place of any earlier registration of it.
    func hold(_ registration: Registration) {
        registrations[registration.name] = registration
        version &+= 1
    }

    /// Routes `name` to no holder, giving the table's room back as it empties (`removeValueShrinking`).
    func letGo(_ name: String) {
        registrations.removeValueShrinking(forKey: name)
        version &+= 1
    }

    // MARK: Streams from elsewhere

    /// Starts the stream this loop's listeners of `name` follow, held by `holderNode`, under a new id.
    func startRemoteStream(_ name: String, holderNode: String, codec: any MethodCodec, queueLimit: Int) -> RemoteStream {
        lastRemoteStreamID += 1
        let entry = EventEntry(name: name, codec: codec, handler: RemoteListeners(streamID: lastRemoteStreamID, holderNode: holderNode),
                               overflow: .dropOldest, queueLimit: queueLimit)
        let stream = RemoteStream(entry: entry, holderNode: holderNode, id: lastRemoteStreamID)
        remoteStreams[name] = stream
        return stream
    }

    /// Forgets the stream on `name` (its holder ended it, or its node went silent): later listens go to
    /// whoever holds it then.
    func retireRemoteStream(_ name: String) {
        remoteStreams.removeValue(forKey: name)
    }

    /// The streams on channels that `holderNode` holds.
    func remoteStreams(heldBy holderNode: String) -> [(name: String, stream: RemoteStream)] {
        remoteStreams.compactMap { $0.value.holderNode == holderNode ? ($0.key, $0.value) : nil }
    }

    /// Forgets every table (the loop has stopped).
    func removeAll() {
        channels = [:]
        registrations = [:]
        remoteStreams = [:]
    }
}

/// Where a connection's last request went (see ``Connection/route(named:)``).
struct RouteCache {
    let name: String
    let route: Route?
    /// The ``ChannelDirectory/version`` the route belongs to (-1: none yet).
    let version: Int
    /// The local method ``route`` leads to, if it is one, unretained: ``route`` holds it. For the calls
    /// a connection handles while it processes input (see ``Connection/handleMessage``), where nothing
    /// replaces the cache.
    let method: Unmanaged<MethodEntry>?
    /// The registration ``route`` leads to, if it is of a method or message channel (whose binary
    /// requests go to the holder as they came), unretained as ``method`` is.
    let held: Unmanaged<Registration>?

    init(name: String = "", route: Route? = nil, version: Int = -1) {
        self.name = name
        self.route = route
        self.version = version
        method = if case .local(.method(let entry))? = route { unsafe Unmanaged.passUnretained(entry) } else { nil }
        held = if case .held(let registration)? = route, registration.kind != .event {
            unsafe Unmanaged.passUnretained(registration)
        } else {
            nil
        }
    }
}
