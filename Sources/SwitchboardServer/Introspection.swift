import SwitchboardCodec

extension Server {
    /// Installs `switchboard/stats` (`get`: the server's counters, summed over its loops, as
    /// `protocol/demo-channels.md` lists them). The demo channels include it.
    public func installStatsChannel() {
        MethodChannel(name: "switchboard/stats", server: self).setMethodCallHandler { [group] call, result in
            guard call.method == "get" else { return result.notImplemented() }
            group.gather(from: group.cores.currentIndex, { $0.statsValue }) { parts in
                result.success(LoopGroup.sum(parts.compactMap { $0 }))
            }
        }
    }

    /// Installs the introspection channels of `protocol/demo-channels.md`, which the console page and
    /// `switchboard top` read: `switchboard/channels` (`list`) and `switchboard/connections` (`list`,
    /// `close`). `close` is an operator's power: guard it with access control where clients are not
    /// all trusted.
    public func installIntrospectionChannels() {
        MethodChannel(name: "switchboard/channels", server: self).setMethodCallHandler { [group] call, result in
            guard Introspection.mayUse("switchboard/channels", result, group) else { return }
            guard call.method == "list" else { return result.notImplemented() }
            guard let page = Introspection.Page(call.arguments) else {
                return result.error(Introspection.badArguments("list takes null or {\"offset\": n ≥ 0, \"limit\": 1…1000}"))
            }
            // Each loop gives its first rows by name up to the page's end; the page is cut from them all.
            group.gather(from: group.cores.currentIndex, { ($0.directory.channels.count, $0.directory.registrations.count, $0.channelRows(upTo: page.end)) }) { parts in
                let loops = parts.compactMap { $0 }
                // Every loop serves the same channels; a held one is held on one loop.
                let total = (loops.map(\.0).max() ?? 0) + loops.reduce(0) { $0 + $1.1 }
                let rows = Introspection.merge(loops.map(\.2)).dropFirst(page.offset).prefix(page.limit)
                result.success(.stringMap(["total": .int(total), "channels": .list(Array(rows))]))
            }
        }
        MethodChannel(name: "switchboard/connections", server: self).setMethodCallHandler { [group] call, result in
            guard Introspection.mayUse("switchboard/connections", result, group) else { return }
            switch call.method {
            case "list":
                guard let page = Introspection.Page(call.arguments) else {
                    return result.error(Introspection.badArguments("list takes null or {\"offset\": n ≥ 0, \"limit\": 1…1000}"))
                }
                // Each loop gives the first rows it has up to the page's end; the page is cut from them all.
                let upTo = Introspection.Page(offset: 0, limit: page.end)
                group.gather(from: group.cores.currentIndex, { ($0.connections.count, $0.connectionRows(upTo)) }) { parts in
                    let rows = parts.compactMap { $0?.1 }.joined().sorted { $0.id < $1.id }.dropFirst(page.offset).prefix(page.limit)
                    result.success(.stringMap([
                        "total": .int(parts.reduce(0) { $0 + ($1?.0 ?? 0) }), "connections": .list(rows.map(\.row)),
                    ]))
                }
            case "close":
                guard let id = call.arguments.intValue, id > 0 else {
                    return result.error(Introspection.badArguments("close takes a connection id"))
                }
                group.cores[group.loop(ofConnection: UInt64(id))].onLoop { core in
                    guard let connection = core.connections[UInt64(id)] else {
                        return result.error(ChannelError(code: "not_found", message: "no connection \(id)"))
                    }
                    result.success(.null)  // first: the caller may be closing itself
                    connection.logger.notice("closed by an operator")
                    connection.closeAfterFlush(.closedByOperator)
                }
            default:
                result.notImplemented()
            }
        }
    }
}

enum Introspection {
    /// Whether the caller of `result` may use the introspection channel `name`, which shows other
    /// clients' connections and channels: when a plugin judges rights (access control), it has judged
    /// this call already; without one, only a client on this machine may (protocol/plugins.md, "Security
    /// model"). Anyone else is refused with `forbidden` here.
    static func mayUse(_ name: String, _ result: MethodResult, _ group: LoopGroup) -> Bool {
        let core = group.cores[group.cores.currentIndex].value  // the caller's loop: handlers run there
        if core.pipeline.controlsAccess || core.connections[result.client.rawValue]?.transport.isLoopbackPeer == true { return true }
        result.refuse(.plugin(code: "forbidden", message: "\(name) is served to clients on this machine only, unless access control says otherwise",
                              details: nil))
        return false
    }

    /// Which rows a `list` returns: by id (connections) or name (channels), from `offset`, at most `limit`.
    struct Page {
        var offset = 0, limit = 100

        init(offset: Int, limit: Int) {
            self.offset = offset
            self.limit = limit
        }

        /// Where the page ends: past every row there can be when `offset + limit` is beyond `Int.max`.
        var end: Int {
            let (sum, overflow) = offset.addingReportingOverflow(limit)
            return overflow ? .max : sum
        }

        init?(_ arguments: ChannelValue) {
            guard !arguments.isNull else { return }
            guard case .map = arguments else { return nil }
            if let value = arguments["offset"] {
                guard let offset = value.intValue, offset >= 0 else { return nil }
                self.offset = offset
            }
            if let value = arguments["limit"] {
                guard let limit = value.intValue, (1...1000).contains(limit) else { return nil }
                self.limit = limit
            }
        }
    }

    /// The channel rows of every loop as one list by name: a channel served on every loop adds up its
    /// loops' counts; a held one is held on one loop.
    static func merge(_ loops: [[(name: String, row: ChannelValue)]]) -> [ChannelValue] {
        var byName: [String: [ChannelValue]] = [:]
        for rows in loops { for (name, row) in rows { byName[name, default: []].append(row) } }
        return byName.keys.sorted().compactMap { byName[$0].map(LoopGroup.sum) }
    }

    static func badArguments(_ message: String) -> ChannelError {
        ChannelError(code: "bad_arguments", message: message)
    }

    /// A codec's short name: `standard`, `json`, `string`, `binary`, or the type's name for a codec of
    /// the embedder's own.
    static func codecName(_ codec: Any) -> String {
        switch codec {
        case is StandardMethodCodec, is StandardMessageCodec: "standard"
        case is JSONMethodCodec, is JSONMessageCodec: "json"
        case is StringCodec: "string"
        case is BinaryCodec: "binary"
        default: String(describing: type(of: codec))
        }
    }
}

extension ServerCore {
    /// Requests and events of every channel there has been: read from the channels the server serves
    /// and from the sums over the held ones, so that the work does not grow with what clients hold.
    var totals: (requests: Int, events: Int) {
        directory.channels.values.reduce((stats.goneChannelRequests + heldCounts.all.requests, stats.goneChannelEvents + heldCounts.all.events)) {
            ($0.0 + $1.counts.requests, $0.1 + $1.counts.events)
        }
    }

    /// The counts of this loop's held channels added up, kept as they are counted (gone ones too).
    final class HeldCounts {
        /// Every held channel's.
        let all = ChannelCounts()
        /// Those of the held channels without a metrics label of their own (``ServerCore/labeledHeld``).
        let unlabeled = ChannelCounts()
    }

    /// Keeps the counts of a served channel that goes in the totals.
    func channelGone(_ counts: ChannelCounts) {
        stats.goneChannelRequests += counts.requests
        stats.goneChannelEvents += counts.events
    }

    /// This loop's first `end` rows of `switchboard/channels` `list` by name: of the channels served
    /// here or held by a client of this loop (its listeners on every loop counted).
    func channelRows(upTo end: Int) -> [(name: String, row: ChannelValue)] {
        let names = Set((Array(directory.channels.keys) + Array(directory.registrations.keys)).sorted().prefix(end))
        var rows: [(String, ChannelValue)] = []
        for (name, entry) in directory.channels where names.contains(name) {
            let (kind, codec, listeners): (String, String, Int) = switch entry {
            case .method(let method): ("method", Introspection.codecName(method.codec.codec), 0)
            case .event(let event): ("event", Introspection.codecName(event.codec), event.listeners.all.count)
            case .message(let message): ("message", message.codecName, 0)
            }
            rows.append((name, Self.channelRow(name, kind: kind, codec: .string(codec), held: false,
                                               listeners: listeners, counts: entry.counts)))
        }
        for (name, registration) in directory.registrations where names.contains(name) {
            rows.append((name, Self.channelRow(
                name, kind: registration.kind?.rawValue, codec: registration.codec.map { .string($0.rawValue) } ?? .null,
                held: true, listeners: (registration.events?.listeners.all.count ?? 0) + registration.remoteListeners.values.reduce(0, +),
                counts: registration.counts)))
        }
        return rows
    }

    private static func channelRow(_ name: String, kind: String?, codec: ChannelValue, held: Bool, listeners: Int,
                                   counts: ChannelCounts) -> ChannelValue {
        .stringMap([
            "name": .string(name), "kind": kind.map(ChannelValue.string) ?? .null, "codec": codec, "held": .bool(held),
            "listeners": .int(listeners), "requests": .int(counts.requests), "events": .int(counts.events),
        ])
    }

    /// One page of this loop's rows of `switchboard/connections` `list`, by id.
    func connectionRows(_ page: Introspection.Page) -> [(id: UInt64, row: ChannelValue)] {
        let ids = connections.keys.sorted().dropFirst(page.offset).prefix(page.limit)
        let now = eventLoop.now
        return ids.compactMap { connections[$0] }.map { connection in
            let transport = connection.transport
            let mode = switch connection.mode {
            case .binary: "binary"
            case .text: "text"
            case .undecided: "undecided"
            }
            let identity = connection.hasPlugins ? connection.context.identity : transport.peerIdentity
            let listens: [ChannelValue] = connection.streams.keys.sorted().compactMap { channel in
                guard let stream = connection.streams[channel] else { return nil }
                let credit: ChannelValue = switch stream.credit {
                case .unbounded: .null
                case .counted(let n): .int(Int(n))
                }
                return .stringMap(["channel": .string(channel), "credit": credit])
            }
            return (connection.id, .stringMap([
                "id": .int(Int(connection.id)), "remote": .string(transport.remoteAddress),
                "transport": .string(transport.scheme), "mode": .string(mode),
                "client": connection.clientName.map(ChannelValue.string) ?? .null,
                "identity": identity.map(ChannelValue.string) ?? .null,
                "ageMs": .int(Int(now - connection.openedAt)),
                "bytesIn": .int(connection.bytesIn), "bytesOut": .int(connection.bytesOut),
                "pendingOutboundBytes": .int(connection.pendingBytes + connection.waitingEventBytes),
                "openRequests": .int(connection.openRequestCount),
                "listens": .list(listens),
            ]))
        }
    }
}
