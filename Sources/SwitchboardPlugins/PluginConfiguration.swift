import Foundation
import Logging
import Synchronization
import SwitchboardCodec
import SwitchboardPluginAPI

/// The `--config` file: which of the first plugins to load and how (schema: `docs/plugins.md`).
///
/// JSON, read through `Codable`; unknown keys are errors, so that a misspelt key is not silently
/// ignored. Every section is optional: a plugin is loaded when its section is present at start-up.
public struct PluginConfiguration: Codable, Sendable, Equatable {
    /// Old channel name → new channel name.
    public var aliases: [String: String]?
    public var access: AccessRules?
    public var rateLimits: [RateLimitRule]?
    public var requestLog: RequestLogSettings?

    public init(aliases: [String: String]? = nil, access: AccessRules? = nil, rateLimits: [RateLimitRule]? = nil,
                requestLog: RequestLogSettings? = nil) {
        self.aliases = aliases
        self.access = access
        self.rateLimits = rateLimits
        self.requestLog = requestLog
    }

    private enum CodingKeys: String, CodingKey, CaseIterable { case aliases, access, rateLimits, requestLog }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.strictContainer(keyedBy: CodingKeys.self)
        aliases = try c.decodeIfPresent([String: String].self, forKey: .aliases)
        access = try c.decodeIfPresent(AccessRules.self, forKey: .access)
        rateLimits = try c.decodeIfPresent([RateLimitRule].self, forKey: .rateLimits)
        requestLog = try c.decodeIfPresent(RequestLogSettings.self, forKey: .requestLog)
    }

    /// Why a configuration file was refused, in words that name the line or the key.
    public struct Invalid: Error, CustomStringConvertible {
        public let description: String
    }

    /// Reads and checks the file at `path`.
    public static func load(path: String) throws(Invalid) -> PluginConfiguration {
        guard let data = FileManager.default.contents(atPath: path) else {
            throw Invalid(description: "\(path): cannot be read")
        }
        do throws(Invalid) {
            return try parse(data)
        } catch {
            throw Invalid(description: "\(path): \(error.description)")
        }
    }

    /// Parses and checks a configuration's JSON text.
    public static func parse(_ data: Data) throws(Invalid) -> PluginConfiguration {
        let configuration: PluginConfiguration
        do {
            configuration = try JSONDecoder().decode(PluginConfiguration.self, from: data)
        } catch let error as DecodingError {
            throw Invalid(description: describe(error, in: data))
        } catch {
            throw Invalid(description: "\(error)")
        }
        try configuration.check()
        return configuration
    }

    /// The checks `Codable` cannot make.
    private func check() throws(Invalid) {
        for (old, new) in aliases ?? [:] where old.isEmpty || new.isEmpty || old == new {
            throw Invalid(description: "aliases: \"\(old)\" → \"\(new)\" must map a name to another name")
        }
        for (index, user) in (access?.users ?? []).enumerated() {
            guard let hex = user.tokenSha256?.lowercased() else { continue }  // a certificate user
            guard hex.count == 64, hex.allSatisfy({ $0.isHexDigit }) else {
                throw Invalid(description: "access.users[\(index)] (\(user.name)): tokenSha256 must be 64 hexadecimal digits")
            }
        }
        if let users = access?.users, Set(users.map(\.name)).count != users.count {
            throw Invalid(description: "access.users: two users have the same name")
        }
        for (index, rule) in (rateLimits ?? []).enumerated() {
            for (label, limit) in [("perConnection", rule.perConnection), ("perUser", rule.perUser)] {
                guard let limit else { continue }
                guard limit.rate > 0, limit.burst >= 1 else {
                    throw Invalid(description: "rateLimits[\(index)].\(label): rate must be > 0 and burst ≥ 1")
                }
            }
            guard rule.perConnection != nil || rule.perUser != nil else {
                throw Invalid(description: "rateLimits[\(index)]: needs perConnection or perUser")
            }
        }
        if let log = requestLog {
            guard (log.sampleOneIn ?? 1) >= 1 else { throw Invalid(description: "requestLog.sampleOneIn must be ≥ 1") }
            guard Logger.Level(rawValue: log.level ?? "notice") != nil else {
                throw Invalid(description: "requestLog.level must be one of trace, debug, info, notice, warning, error, critical")
            }
        }
    }

    /// A decoding error as `line L, column C: …` or `at key.path: …`.
    private static func describe(_ error: DecodingError, in data: Data) -> String {
        func path(_ keys: [any CodingKey]) -> String {
            keys.map { $0.intValue.map { "[\($0)]" } ?? ".\($0.stringValue)" }.joined().drop { $0 == "." }.description
        }
        switch error {
        case .dataCorrupted(let context) where context.codingPath.isEmpty:
            // Foundation's message names no place on Linux: Switchboard's own JSON reader finds it.
            let bytes = [UInt8](data)
            do throws(CodecError) { _ = try JSONText.parse(bytes) } catch {
                let before = bytes.prefix(min(error.offset, bytes.count))
                let line = before.count { $0 == UInt8(ascii: "\n") } + 1
                let column = before.count - (before.lastIndex(of: UInt8(ascii: "\n")).map { $0 + 1 } ?? 0) + 1
                return "line \(line), column \(column): not valid JSON (\(error.reason))"
            }
            return "not valid JSON: \(context.debugDescription)"
        case .dataCorrupted(let context):
            return "at \(path(context.codingPath)): \(context.debugDescription)"
        case .keyNotFound(let key, let context):
            return "at \(path(context.codingPath + [key])): missing (required)"
        case .typeMismatch(let type, let context):
            return "at \(path(context.codingPath)): expected \(type)"
        case .valueNotFound(let type, let context):
            return "at \(path(context.codingPath)): expected \(type), found null"
        @unknown default:
            return "\(error)"
        }
    }

    /// The plugins its sections ask for, in the order they run: aliases (so later plugins see the new
    /// names), access control, rate limits, then the request log (outermost on the way out, it sees the
    /// refusals too). They read their settings from `settings`, which a reload replaces.
    public static func plugins(reading settings: LiveSettings) -> [any Plugin] {
        let current = settings.current
        var plugins: [any Plugin] = []
        if current.aliases != nil { plugins.append(ChannelAliases(settings: settings)) }
        if current.access != nil { plugins.append(AccessControl(settings: settings)) }
        if current.rateLimits != nil { plugins.append(RateLimiter(settings: settings)) }
        if current.requestLog != nil { plugins.append(RequestLog(settings: settings)) }
        return plugins
    }
}

extension Decoder {
    /// The keyed container of a settings type that fails on a key the type does not know (every
    /// settings type decodes through it), so that a misspelt key is not silently ignored.
    func strictContainer<Keys: CodingKey & CaseIterable>(keyedBy _: Keys.Type) throws -> KeyedDecodingContainer<Keys> {
        let known = Set(Keys.allCases.map(\.stringValue))
        for key in try container(keyedBy: AnyKey.self).allKeys where !known.contains(key.stringValue) {
            throw DecodingError.dataCorrupted(.init(
                codingPath: codingPath + [key],
                debugDescription: "unknown key (known: \(known.sorted().joined(separator: ", ")))"))
        }
        return try container(keyedBy: Keys.self)
    }
}

private struct AnyKey: CodingKey {
    var stringValue: String
    var intValue: Int? { nil }
    init(stringValue: String) { self.stringValue = stringValue }
    init?(intValue: Int) { nil }
}

/// A gate's last verdict on a connection, for the requests the pipeline judges afresh each time (text
/// mode, listens, pipelines with stages that are not gates): most connections keep using one channel.
struct LastVerdict {
    let channel: String
    let kind: InboundKind
    let verdict: GateVerdict

    /// The verdict, if it was about this channel and kind.
    func verdict(for channel: String, _ kind: InboundKind) -> GateVerdict? {
        kind == self.kind && channel == self.channel ? verdict : nil
    }
}

/// A value made from the settings of one generation, made again when they change: plugins read their
/// settings through it, so a request costs an atomic load and a lock, not a copy of the configuration.
final class GenerationCache<Value: Sendable>: Sendable {
    private let kept = Mutex<(generation: Int, value: Value)?>(nil)

    func value(_ settings: LiveSettings, _ make: (PluginConfiguration) -> Value) -> Value {
        snapshot(settings, make).value
    }

    /// The value with the generation it was made from.
    func snapshot(_ settings: LiveSettings, _ make: (PluginConfiguration) -> Value) -> (generation: Int, value: Value) {
        let generation = settings.generation
        return kept.withLock { kept in
            if let kept, kept.generation >= generation { return kept }
            let value = make(settings.current)
            kept = (generation, value)
            return (generation, value)
        }
    }
}

/// The configuration the plugins read, replaced as a whole by a reload. Its epoch, read without a lock,
/// tells the verdicts and state kept per connection that they are stale.
public final class LiveSettings: Sendable {
    private let state: Mutex<PluginConfiguration>
    /// Advances with every ``replace(with:)``.
    public let epoch = VerdictEpoch()

    public init(_ configuration: PluginConfiguration) { state = Mutex(configuration) }

    /// The configuration in force.
    public var current: PluginConfiguration { state.withLock { $0 } }
    /// Changes with every ``replace(with:)``.
    public var generation: Int { epoch.value }

    /// Puts `configuration` in force for the next request.
    public func replace(with configuration: PluginConfiguration) {
        state.withLock { $0 = configuration }
        epoch.advance()
    }

    /// Loads the file at `path` again: a valid file replaces the settings; an invalid one is logged
    /// and the old settings stay. Sections absent at start-up stay off (plugins load at start-up only).
    @discardableResult
    public func reload(path: String, logger: Logger) -> Bool {
        do throws(PluginConfiguration.Invalid) {
            let configuration = try PluginConfiguration.load(path: path)
            let before = current
            let added = [("aliases", before.aliases == nil && configuration.aliases != nil),
                         ("access", before.access == nil && configuration.access != nil),
                         ("rateLimits", before.rateLimits == nil && configuration.rateLimits != nil),
                         ("requestLog", before.requestLog == nil && configuration.requestLog != nil)]
            for (section, isNew) in added where isNew {
                logger.warning("config reload: section \(section) was not loaded at start-up; it takes effect after a restart")
            }
            replace(with: configuration)
            logger.notice("config reloaded from \(path)")
            return true
        } catch {
            logger.error("config reload failed, keeping the previous configuration: \(error.description)")
            return false
        }
    }
}
