import SwitchboardServer

/// Channel aliases: requests on an old channel name go to the new one, and the events of a stream
/// listened to by its old name go out under the old name, so clients built against the old names keep
/// working after a rename. (The server sends a client's DEMANDs on the old name to the new one.)
public struct ChannelAliases: Plugin {
    public let name = "aliases"
    let settings: LiveSettings

    public init(settings: LiveSettings) { self.settings = settings }

    public var inbound: [any InboundProcessor] { [Rename(settings: settings)] }
    public var outbound: [any OutboundProcessor] { [RenameBack()] }

    /// The new names a connection listens to by their old ones: new → old.
    final class Listened {
        var oldNames: [String: String] = [:]
    }

    struct Rename: InboundProcessor {
        let settings: LiveSettings
        let table = GenerationCache<[String: String]>()

        func process(_ request: inout InboundRequest) throws -> InboundDecision {
            guard let new = table.value(settings, { $0.aliases ?? [:] })[request.channel] else {
                if request.kind == .listen {  // a listen by the new name: its events keep that name
                    request.connection.state(Listened.self)?.oldNames[request.channel] = nil
                }
                return .next
            }
            let old = request.channel
            request.channel = new
            if request.kind == .listen {
                let context = request.connection
                let listened = context.state(Listened.self) ?? Listened()
                context.keep(listened)
                listened.oldNames[new] = old
            }
            return .next
        }
    }

    struct RenameBack: OutboundProcessor {
        var scope: Scope<OutboundKind> { Scope(kinds: [.event, .endOfStream]) }

        func applies(to connection: ConnectionContext, channel: String) -> Bool {
            connection.state(Listened.self)?.oldNames[channel] != nil
        }

        func process(_ message: inout OutboundMessage) throws -> OutboundDecision {
            if let old = message.connection.state(Listened.self)?.oldNames[message.channel] { message.channel = old }
            return .pass
        }
    }
}
