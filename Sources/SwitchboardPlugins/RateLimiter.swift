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

    func matches(_ channel: String, _ kind: InboundKind) -> Bool {
        (kinds.map { $0.contains { RateLimitRule.kind(named: $0) == kind } } ?? true)
            && channels.contains { ChannelPattern($0).matches(channel) }
    }
}

/// A token bucket: `burst` tokens, refilled at `rate` per second.
struct TokenBucket {
    private var tokens: Double
    private var updatedAt: ContinuousClock.Instant

    init(_ limit: RateLimitRule.Limit, now: ContinuousClock.Instant) {
        tokens = limit.burst
        updatedAt = now
    }

    /// Refills up to `now`.
    mutating func refill(_ limit: RateLimitRule.Limit, now: ContinuousClock.Instant) {
        let elapsed = updatedAt.duration(to: now)
        let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) * 1e-18
        tokens = min(limit.burst, tokens + seconds * limit.rate)
        updatedAt = now
    }

    /// Milliseconds until a token is there; 0 when one is there now.
    func wait(_ limit: RateLimitRule.Limit) -> Int {
        tokens >= 1 ? 0 : max(1, Int(((1 - tokens) / limit.rate * 1000).rounded(.up)))
    }

    mutating func take() { tokens -= 1 }
}

/// Rate limiting: the first rule whose channels and kinds match a request applies its buckets (per
/// connection, and per user for identified clients). A request over either gets ERROR `rate_limited`
/// with `retryAfterMs` in its details; nothing else on the connection is affected, and a refused
/// request takes no token.
public struct RateLimiter: Plugin {
    public let name = "rateLimit"
    let settings: LiveSettings
    let users: UserBuckets

    public init(settings: LiveSettings) {
        self.settings = settings
        users = UserBuckets()
    }

    public var inbound: [any InboundProcessor] { [Check(settings: settings, users: users)] }

    /// The per-user buckets, shared by every loop: one lock per identified request.
    final class UserBuckets: Sendable {
        struct Key: Hashable { let user: String; let rule: Int }
        let state = Mutex<(generation: Int, buckets: [Key: TokenBucket])>((-1, [:]))

        func take(user: String, rule: Int, limit: RateLimitRule.Limit, generation: Int, now: ContinuousClock.Instant) -> Int {
            state.withLock { state in
                if state.generation != generation { state = (generation, [:]) }  // new rules: new buckets
                let key = Key(user: user, rule: rule)
                var bucket = state.buckets[key] ?? TokenBucket(limit, now: now)
                bucket.refill(limit, now: now)
                let wait = bucket.wait(limit)
                if wait == 0 { bucket.take() }
                state.buckets[key] = bucket
                return wait
            }
        }
    }

    /// One connection's rules and buckets, for one configuration generation.
    final class ConnectionState {
        var generation = -1
        var rules: [RateLimitRule] = []
        var buckets: [TokenBucket?] = []
        var lastChannel = ""
        var lastKind = InboundKind.register
        var lastRule: Int?
    }

    struct Check: InboundProcessor {
        let settings: LiveSettings
        let users: UserBuckets

        func process(_ request: inout InboundRequest) throws -> InboundDecision {
            let context = request.connection
            let state: ConnectionState
            if let kept = context.storage[ConnectionState.self] {
                state = kept
            } else {
                state = ConnectionState()
                context.storage[ConnectionState.self] = state
            }
            let generation = settings.generation
            if state.generation != generation {
                state.generation = generation
                state.rules = settings.current.rateLimits ?? []
                state.buckets = Array(repeating: nil, count: state.rules.count)
                state.lastChannel = ""
            }
            if state.lastKind != request.kind || state.lastChannel != request.channel {
                state.lastRule = state.rules.firstIndex { $0.matches(request.channel, request.kind) }
                state.lastKind = request.kind
                state.lastChannel = request.channel
            }
            guard let index = state.lastRule else { return .next }
            let rule = state.rules[index]
            let now = ContinuousClock.now
            if let limit = rule.perConnection {
                var bucket = state.buckets[index] ?? TokenBucket(limit, now: now)
                bucket.refill(limit, now: now)
                let wait = bucket.wait(limit)
                guard wait == 0 else {
                    state.buckets[index] = bucket
                    return .reject(.rateLimited(retryAfterMs: wait))
                }
                if let userLimit = rule.perUser, let user = context.identity {
                    let userWait = users.take(user: user, rule: index, limit: userLimit, generation: generation, now: now)
                    guard userWait == 0 else {
                        state.buckets[index] = bucket
                        return .reject(.rateLimited(retryAfterMs: userWait))
                    }
                }
                bucket.take()
                state.buckets[index] = bucket
                return .next
            }
            if let userLimit = rule.perUser, let user = context.identity {
                let wait = users.take(user: user, rule: index, limit: userLimit, generation: generation, now: now)
                if wait > 0 { return .reject(.rateLimited(retryAfterMs: wait)) }
            }
            return .next
        }
    }
}
