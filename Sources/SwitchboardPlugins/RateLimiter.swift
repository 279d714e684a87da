import Synchronization
import SwitchboardServer

/// One entry of the `rateLimits` section: token buckets for requests on matching channels.
public struct RateLimitRule: Codable, Sendable, Equatable {
    /// Channel patterns (`name`, `prefix/*`, `*`).
    public var channels: [String]
    /// The kinds counted (`call`, `send`, `listen`, `cancel`, `register`); all when omitted.
    public var kinds: [String]?
    /// A bucket per connection.
    public var perConnection: Limit?
    /// A bucket per user, shared by all of the user's connections (identified connections only).
    public var perUser: Limit?

    public init(channels: [String], kinds: [String]? = nil, perConnection: Limit? = nil, perUser: Limit? = nil) {
        self.channels = channels
        self.kinds = kinds
        self.perConnection = perConnection
        self.perUser = perUser
    }

    /// `rate` requests per second on average, with bursts of up to `burst`.
    public struct Limit: Codable, Sendable, Equatable {
        public var rate: Double
        public var burst: Double

        public init(rate: Double, burst: Double) {
            self.rate = rate
            self.burst = burst
        }

        private enum CodingKeys: String, CodingKey, CaseIterable { case rate, burst }
        public init(from decoder: any Decoder) throws {
            try rejectUnknownKeys(decoder, CodingKeys.self)
            let c = try decoder.container(keyedBy: CodingKeys.self)
            rate = try c.decode(Double.self, forKey: .rate)
            burst = try c.decode(Double.self, forKey: .burst)
        }
    }

    private enum CodingKeys: String, CodingKey, CaseIterable { case channels, kinds, perConnection, perUser }
    public init(from decoder: any Decoder) throws {
        try rejectUnknownKeys(decoder, CodingKeys.self)
        let c = try decoder.container(keyedBy: CodingKeys.self)
        channels = try c.decode([String].self, forKey: .channels)
        kinds = try c.decodeIfPresent([String].self, forKey: .kinds)
        for kind in kinds ?? [] where RateLimitRule.kind(named: kind) == nil {
            throw DecodingError.dataCorruptedError(forKey: .kinds, in: c,
                                                   debugDescription: "unknown kind \"\(kind)\" (call, send, listen, cancel, register)")
        }
        perConnection = try c.decodeIfPresent(Limit.self, forKey: .perConnection)
        perUser = try c.decodeIfPresent(Limit.self, forKey: .perUser)
    }

    static func kind(named name: String) -> InboundKind? {
        name == "send" ? .message : InboundKind(rawValue: name).flatMap { $0 == .message ? nil : $0 }
    }
}

/// A token bucket: `burst` tokens, refilled at `rate` per second, on the loop's clock (milliseconds,
/// read once per loop turn). A class of plain numbers, so that updating one calls nothing out and needs
/// no run-time exclusivity check.
final class TokenBucket {
    private var tokens: Double
    private var updatedAt: UInt64

    init(_ limit: RateLimitRule.Limit, now: UInt64) {
        tokens = limit.burst
        updatedAt = now
    }

    /// 0 when a token is there (refilled up to `now`, in milliseconds), without taking it; else the
    /// milliseconds until there will be one.
    func wait(_ limit: RateLimitRule.Limit, now: UInt64) -> Int {
        refill(limit, now: now)
        // A hair below one: a retry exactly `retryAfterMs` later must not fall short by a rounding error.
        return tokens >= 1 - 1e-9 ? 0 : max(1, Int(((1 - tokens) / limit.rate * 1000).rounded(.up)))
    }

    /// Takes a token if there is one; else returns the milliseconds until there will be.
    func take(_ limit: RateLimitRule.Limit, now: UInt64) -> Int {
        let wait = wait(limit, now: now)
        if wait == 0 { tokens -= 1 }
        return wait
    }

    /// A clock that reads earlier than the last one (another loop's, shared by a user's bucket) adds
    /// nothing rather than wrapping around.
    private func refill(_ limit: RateLimitRule.Limit, now: UInt64) {
        guard now > updatedAt else { return }
        tokens = min(limit.burst, tokens + Double(now - updatedAt) * 1e-3 * limit.rate)
        updatedAt = now
    }
}

/// Rate limiting: the first rule whose channels and kinds match a request applies its buckets (per
/// connection, and per user for identified clients). A request over either gets ERROR `rate_limited`
/// with `retryAfterMs` in its details; nothing else on the connection is affected, and a refused
/// request takes no token.
public struct RateLimiter: Plugin {
    public let name = "rateLimit"
    let settings: LiveSettings
    let users: UserBuckets
    let rules = GenerationCache<[Rule]>()

    public init(settings: LiveSettings) {
        self.settings = settings
        users = UserBuckets()
    }

    public var inbound: [any InboundProcessor] { [Check(settings: settings, users: users, rules: rules)] }

    /// A rule, compiled.
    struct Rule: Sendable {
        let channels: [ChannelPattern]
        let kinds: Set<InboundKind>?
        let perConnection: RateLimitRule.Limit?
        let perUser: RateLimitRule.Limit?

        init(_ rule: RateLimitRule) {
            channels = rule.channels.map(ChannelPattern.init)
            kinds = rule.kinds.map { Set($0.compactMap(RateLimitRule.kind(named:))) }
            perConnection = rule.perConnection
            perUser = rule.perUser
        }

        func matches(_ channel: String, _ kind: InboundKind) -> Bool {
            (kinds?.contains(kind) ?? true) && channels.contains { $0.matches(channel) }
        }
    }

    /// The per-user buckets, shared by every loop: one lock per identified request.
    final class UserBuckets: Sendable {
        struct Key: Hashable { let user: String; let rule: Int }
        private let state = Mutex<(generation: Int, buckets: [Key: TokenBucket])>((-1, [:]))

        /// Takes a token from the user's bucket (`taking`), or only says how long until there is one.
        func wait(user: String, rule: Int, limit: RateLimitRule.Limit, generation: Int, now: UInt64, taking: Bool) -> Int {
            state.withLock { state in
                // New rules, new buckets; a loop still on the older rules (mid-reload) does not reset them.
                if generation > state.generation { state = (generation, [:]) }
                let key = Key(user: user, rule: rule)
                let bucket = state.buckets[key] ?? TokenBucket(limit, now: now)
                state.buckets[key] = bucket
                return taking ? bucket.take(limit, now: now) : bucket.wait(limit, now: now)
            }
        }
    }

    /// One connection's buckets, for one configuration generation (a reload makes new ones), and the
    /// rule the last request matched. Immutable but for the buckets' numbers: a new one (sharing the
    /// buckets) replaces it when the channel changes, so that reading it is the only access per request.
    final class ConnectionState {
        let generation: Int
        let rules: [Rule]
        /// Per rule: nil when the rule has no per-connection limit.
        let buckets: [TokenBucket?]
        /// The rule the last request matched (nil: none).
        let last: LastVerdict<Int?>?

        init(generation: Int, rules: [Rule], buckets: [TokenBucket?], last: LastVerdict<Int?>? = nil) {
            self.generation = generation
            self.rules = rules
            self.buckets = buckets
            self.last = last
        }
    }

    struct Check: InboundGate {
        let settings: LiveSettings
        let users: UserBuckets
        let rules: GenerationCache<[Rule]>

        func admit(_ context: ConnectionContext, channel: String, kind: InboundKind) -> Rejection? {
            let now = context.now
            var state: ConnectionState
            if let kept = context.state(ConnectionState.self), kept.generation == settings.generation {
                state = kept
            } else {
                let (generation, rules) = rules.snapshot(settings) { ($0.rateLimits ?? []).map(Rule.init) }
                state = ConnectionState(generation: generation, rules: rules,
                                        buckets: rules.map { rule in rule.perConnection.map { TokenBucket($0, now: now) } })
            }
            let index: Int?
            if let last = state.last?.value(for: channel, kind) {
                index = last
            } else {
                index = state.rules.firstIndex { $0.matches(channel, kind) }
                state = ConnectionState(generation: state.generation, rules: state.rules, buckets: state.buckets,
                                        last: LastVerdict(channel: channel, kind: kind, value: index))
                context.keep(state)
            }
            guard let index else { return nil }
            let rule = state.rules[index]
            let bucket = state.buckets[index]
            guard let userLimit = rule.perUser, let user = context.identity else {
                // One bucket: take its token, or say how long until there is one.
                guard let bucket, let limit = rule.perConnection else { return nil }
                let wait = bucket.take(limit, now: now)
                return wait > 0 ? .rateLimited(retryAfterMs: wait) : nil
            }
            // Two buckets: a request refused by either takes a token from neither, and learns the longer wait.
            let connectionWait = bucket.flatMap { bucket in rule.perConnection.map { bucket.wait($0, now: now) } } ?? 0
            let userWait = users.wait(user: user, rule: index, limit: userLimit, generation: state.generation, now: now,
                                      taking: connectionWait == 0)
            if connectionWait > 0 || userWait > 0 { return .rateLimited(retryAfterMs: max(connectionWait, userWait)) }
            if let bucket, let limit = rule.perConnection { _ = bucket.take(limit, now: now) }
            return nil
        }
    }
}
