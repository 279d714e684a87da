import ArgumentParser
import Dispatch
import SwitchboardClient
import SwitchboardCodec
#if canImport(Glibc)
import Glibc
#endif

/// `switchboard top`: the server's connections and channels, refreshed every second, like nats-top.
struct Top: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Watch the server's connections and channels live (q quits).",
        discussion: """
            Reads switchboard/stats, switchboard/channels and switchboard/connections every interval.
            Keys: 1-8 sort the connections by that column (again: reverse), q quits.
            With --once, prints one plain screen (rates over one interval) and exits.
            """)

    @OptionGroup var connection: ConnectionOptions
    @Option(help: "Milliseconds between refreshes.") var interval = 1000
    @Option(help: "Sort connections by: \(TopColumn.allCases.map(\.rawValue).joined(separator: ", ")).")
    var sort: TopColumn = .id
    @Flag(help: "Print one screen without escape codes, then exit.") var once = false

    func validate() throws {
        guard interval >= 100 else { throw ValidationError("--interval is at least 100 ms") }
    }

    func run() async throws {
        try await withClient(connection) { client in
            var screen = TopScreen(server: "\(connection.host ?? "127.0.0.1"):\(connection.port ?? 7420)", sort: sort)
            let sampler = TopSampler(client: client)
            if once {
                screen.previous = try await sampler.sample()
                try await Task.sleep(for: .milliseconds(interval))
                screen.current = try await sampler.sample()
                print(screen.lines(width: 200, height: 1000).joined(separator: "\n"))
                return
            }
            let terminal = Terminal()
            defer { terminal.restore() }
            let (events, input) = AsyncStream.makeStream(of: TopEvent.self)
            terminal.readKeys(into: input)
            let ticker = Task {
                while !Task.isCancelled {
                    input.yield(.tick)
                    try? await Task.sleep(for: .milliseconds(interval))
                }
            }
            defer { ticker.cancel() }
            // Samples are taken beside the loop, so that a key (q above all) is answered while a slow
            // server keeps one out; a tick that comes meanwhile is skipped.
            var isSampling = false
            for await event in events {
                switch event {
                case .tick:
                    guard !isSampling else { continue }
                    isSampling = true
                    Task {
                        do { input.yield(.sampled(.success(try await sampler.sample()))) } catch { input.yield(.sampled(.failure(error))) }
                    }
                    continue
                case .sampled(let result):
                    isSampling = false
                    screen.previous = screen.current
                    screen.current = try result.get()
                case .key(UInt8(ascii: "q")), .key(UInt8(ascii: "Q")), .quit:
                    return
                case .key(let key):
                    let index = Int(key) - Int(UInt8(ascii: "1"))
                    guard TopColumn.allCases.indices.contains(index) else { continue }
                    screen.choose(TopColumn.allCases[index])
                }
                let (width, height) = terminal.size
                terminal.draw(screen.lines(width: width, height: height))
            }
        }
    }
}

enum TopEvent: Sendable { case tick, key(UInt8), quit, sampled(Result<TopSample, any Error>) }

/// The connection columns `top` sorts by, in the order of their keys 1-8.
enum TopColumn: String, CaseIterable, ExpressibleByArgument {
    case id, client, transport, age, `in`, out, pending, requests

    /// Numbers sort largest first, names from A.
    var descendsByDefault: Bool { ![.id, .client, .transport].contains(self) }
}

/// One reading of the server's introspection channels.
struct TopSample: Sendable {
    var at: ContinuousClock.Instant
    var stats: ChannelValue
    var channels: [ChannelValue]
    var totalChannels: Int
    var connections: [ChannelValue]
    var totalConnections: Int
}

/// Reads the three introspection channels.
struct TopSampler: Sendable {
    let client: Client

    func sample() async throws -> TopSample {
        let stats = try await MethodChannel(name: "switchboard/stats", client: client).invokeMethod("get")
        let channels = try await MethodChannel(name: "switchboard/channels", client: client)
            .invokeMethod("list", arguments: .stringMap(["limit": 1000]))
        let page = try await MethodChannel(name: "switchboard/connections", client: client)
            .invokeMethod("list", arguments: .stringMap(["limit": 1000]))
        return TopSample(at: .now, stats: stats, channels: channels["channels"]?.listValue ?? [],
                         totalChannels: channels["total"]?.intValue ?? 0,
                         connections: page["connections"]?.listValue ?? [], totalConnections: page["total"]?.intValue ?? 0)
    }
}

/// What `top` shows, made from the last two samples: totals, then connections, then channels.
struct TopScreen {
    let server: String
    var sort: TopColumn
    var descending: Bool
    var previous: TopSample?
    var current: TopSample?

    init(server: String, sort: TopColumn) {
        self.server = server
        self.sort = sort
        descending = sort.descendsByDefault
    }

    /// Sorts by `column`; choosing the column already sorted by reverses the order.
    mutating func choose(_ column: TopColumn) {
        if column == sort { descending.toggle() } else { sort = column; descending = column.descendsByDefault }
    }

    func lines(width: Int, height: Int) -> [String] {
        guard let now = current else { return ["switchboard top: connecting to \(server)…"] }
        let seconds = previous.map { previous in
            let elapsed = previous.at.duration(to: now.at).components
            return max(0.001, Double(elapsed.seconds) + Double(elapsed.attoseconds) / 1e18)
        }
        func rate(_ value: Int?, _ before: Int?) -> Double? {
            guard let seconds, let value, let before else { return nil }
            return Double(max(0, value - before)) / seconds
        }
        let stats = now.stats, old = previous?.stats
        var out = [
            "switchboard top  \(server)  up \(duration(stats["uptimeSeconds"]?.intValue ?? 0))  "
                + "connections \(stats["connections"]?.intValue ?? 0) (\(stats["connectionsTotal"]?.intValue ?? 0) since start)",
            "requests/s \(number(rate(stats["requests"]?.intValue, old?["requests"]?.intValue)))  "
                + "events/s \(number(rate(stats["events"]?.intValue, old?["events"]?.intValue)))  "
                + "in \(bytes(rate(stats["bytesIn"]?.intValue, old?["bytesIn"]?.intValue)))/s  "
                + "out \(bytes(rate(stats["bytesOut"]?.intValue, old?["bytesOut"]?.intValue)))/s  "
                + "replies pending \(stats["repliesPending"]?.intValue ?? 0)  "
                + "events dropped \(dropped(stats["eventsDropped"]))",
            "",
        ]

        let before = Dictionary((previous?.connections ?? []).map { ($0["id"]?.intValue ?? 0, $0) }, uniquingKeysWith: { a, _ in a })
        let rows = now.connections.map { row -> [TopColumn: Cell] in
            let old = before[row["id"]?.intValue ?? 0]
            return [
                .id: .number(Double(row["id"]?.intValue ?? 0), "\(row["id"]?.intValue ?? 0)"),
                .client: .text(row["client"]?.stringValue ?? row["identity"]?.stringValue ?? "-"),
                .transport: .text("\(row["transport"]?.stringValue ?? "?")/\(row["mode"]?.stringValue ?? "?")"),
                .age: .number(Double(row["ageMs"]?.intValue ?? 0), duration((row["ageMs"]?.intValue ?? 0) / 1000)),
                .in: rateCell(rate(row["bytesIn"]?.intValue, old?["bytesIn"]?.intValue)),
                .out: rateCell(rate(row["bytesOut"]?.intValue, old?["bytesOut"]?.intValue)),
                .pending: .number(Double(row["pendingOutboundBytes"]?.intValue ?? 0), bytes(Double(row["pendingOutboundBytes"]?.intValue ?? 0))),
                .requests: .number(Double(row["openRequests"]?.intValue ?? 0), "\(row["openRequests"]?.intValue ?? 0)"),
            ]
        }.sorted { a, b in
            let (x, y) = descending ? (b[sort]!, a[sort]!) : (a[sort]!, b[sort]!)
            return x < y
        }
        let shown = now.connections.count < now.totalConnections ? " (first \(now.connections.count) of \(now.totalConnections))" : ""
        out.append("CONNECTIONS\(shown), sorted by \(sort.rawValue) \(descending ? "▼" : "▲")   keys 1-8 sort, q quits")
        let headers = TopColumn.allCases.enumerated().map { "\($0.offset + 1):\($0.element.rawValue.uppercased())" }
        let widths = [7, 18, 14, 9, 10, 10, 10, 11]
        out.append(columns(headers, widths))
        let channelRows = min(now.channels.count, max(3, height / 3))
        let room = max(1, height - out.count - channelRows - 3)
        for row in rows.prefix(room) { out.append(columns(TopColumn.allCases.map { row[$0]!.shown }, widths)) }

        out.append("")
        out.append("CHANNELS (\(now.totalChannels))")
        let oldChannels = Dictionary((previous?.channels ?? []).map { ($0["name"]?.stringValue ?? "", $0) }, uniquingKeysWith: { a, _ in a })
        let channelWidths = [34, 8, 9, 6, 10, 10, 10]
        out.append(columns(["NAME", "KIND", "CODEC", "HELD", "LISTENERS", "REQ/S", "EVENTS/S"], channelWidths))
        for channel in now.channels.prefix(channelRows) {
            let old = oldChannels[channel["name"]?.stringValue ?? ""]
            out.append(columns([
                channel["name"]?.stringValue ?? "?", channel["kind"]?.stringValue ?? "-", channel["codec"]?.stringValue ?? "-",
                channel["held"] == true ? "yes" : "no", "\(channel["listeners"]?.intValue ?? 0)",
                number(rate(channel["requests"]?.intValue, old?["requests"]?.intValue)),
                number(rate(channel["events"]?.intValue, old?["events"]?.intValue)),
            ], channelWidths))
        }
        return out.map { String($0.prefix(width)) }
    }

    /// A table cell: what it shows, and how it sorts.
    enum Cell: Comparable {
        case number(Double, String)
        case text(String)

        var shown: String {
            switch self {
            case .number(_, let text), .text(let text): text
            }
        }

        static func < (a: Cell, b: Cell) -> Bool {
            switch (a, b) {
            case (.number(let x, _), .number(let y, _)): x < y
            default: a.shown < b.shown
            }
        }
    }

    /// The sum of a map of counts by reason.
    private func dropped(_ tally: ChannelValue?) -> Int {
        guard case .map(let entries)? = tally else { return 0 }
        return entries.reduce(0) { $0 + ($1.value.intValue ?? 0) }
    }

    private func rateCell(_ value: Double?) -> Cell { .number(value ?? 0, bytes(value) + "/s") }

    private func columns(_ cells: [String], _ widths: [Int]) -> String {
        zip(cells, widths).map { cell, width in
            cell.count >= width ? String(cell.prefix(width - 1)) + " " : cell + String(repeating: " ", count: width - cell.count)
        }.joined()
    }

    private func number(_ value: Double?) -> String {
        guard let value else { return "-" }
        if value >= 10 || value == 0 { return "\(Int(value.rounded()))" }
        let tenths = Int((value * 10).rounded())
        return "\(tenths / 10).\(tenths % 10)"
    }

    private func bytes(_ value: Double?) -> String {
        guard let value else { return "-" }
        let units = ["B", "KiB", "MiB", "GiB", "TiB"]
        var scaled = value, unit = 0
        while scaled >= 1024, unit < units.count - 1 { scaled /= 1024; unit += 1 }
        return "\(number(scaled)) \(units[unit])"
    }

    private func duration(_ seconds: Int) -> String {
        seconds < 60 ? "\(seconds)s" : seconds < 3600 ? "\(seconds / 60)m\(seconds % 60)s" : "\(seconds / 3600)h\(seconds / 60 % 60)m"
    }
}

/// The terminal while `top` runs: no echo, keys one at a time, the alternate screen; all undone by
/// ``restore()``.
final class Terminal {
    private var saved = termios()
    private let isTerminal = isatty(0) == 1
    private var interrupt: (any DispatchSourceSignal)?

    init() {
        if isTerminal {
            tcgetattr(0, &saved)
            var raw = saved
            raw.c_lflag &= ~tcflag_t(ICANON | ECHO)
            tcsetattr(0, TCSANOW, &raw)
        }
        output("\u{1B}[?1049h\u{1B}[?25l")
    }

    func restore() {
        output("\u{1B}[?25h\u{1B}[?1049l")
        if isTerminal { tcsetattr(0, TCSANOW, &saved) }
    }

    /// Columns and rows (80×24 when they cannot be asked).
    var size: (width: Int, height: Int) {
        var window = winsize()
        guard ioctl(1, UInt(TIOCGWINSZ), &window) == 0, window.ws_col > 0 else { return (80, 24) }
        return (Int(window.ws_col), Int(window.ws_row))
    }

    func draw(_ lines: [String]) {
        output("\u{1B}[H" + lines.map { $0 + "\u{1B}[K" }.joined(separator: "\r\n") + "\u{1B}[J")
    }

    private func output(_ text: String) {
        var bytes = Array(text.utf8)[...]
        while !bytes.isEmpty {
            let n = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
            guard n > 0 else { return }
            bytes = bytes.dropFirst(n)
        }
    }

    /// Reads keys on a thread of their own (a blocking read) until stdin ends; SIGINT quits too.
    func readKeys(into input: AsyncStream<TopEvent>.Continuation) {
        signal(SIGINT, SIG_IGN)
        let interrupt = DispatchSource.makeSignalSource(signal: SIGINT)
        interrupt.setEventHandler { input.yield(.quit) }
        interrupt.resume()
        self.interrupt = interrupt
        DispatchQueue.global().async {
            var byte: UInt8 = 0
            while read(0, &byte, 1) == 1 { input.yield(.key(byte)) }
        }
    }
}
