import SwitchboardPluginAPI

/// Channel aliases: requests on an old channel name go to the new one, and the events of a stream
/// listened to by its old name go out under the old name, so clients built against the old names keep
/// working after a rename. (The server sends a client's DEMANDs on the old name to the new one.)
public struct ChannelAliases: Plugin {
    public let name = "aliases"
    let settings: LiveSettings

    public init(settings: LiveSettings) { self.settings = settings }

    public var inbound: [any InboundProcessor] { [Rename(settings: settings)] }
    public var outbound: [any OutboundProcessor] { [RenameBack()] }

    struct Rename: InboundProcessor {
        let settings: LiveSettings
        let table = GenerationCache<[String: String]>()

        func process(_ request: inout InboundRequest) throws -> InboundDecision {
            if let new = table.value(settings, { $0.aliases ?? [:] })[request.channel] { request.channel = new }
            return .next
        }
    }

    /// Renames the events of streams listened to by an old name (the server records the name a listen
    /// used once every stage has admitted it; see ``ConnectionContext/listenedName(of:)``).
    struct RenameBack: OutboundProcessor {
        var scope: Scope<OutboundKind> { Scope(kinds: [.event, .endOfStream]) }

        func applies(to connection: ConnectionContext, channel: String) -> Bool {
            connection.listenedName(of: channel) != nil
        }

        func process(_ message: inout OutboundMessage) throws -> OutboundDecision {
            if let old = message.connection.listenedName(of: message.channel) { message.channel = old }
            return .pass
        }
    }
}
