import Synchronization
import SwitchboardPluginAPI
import SwitchboardTransport

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
            let c = try decoder.strictContainer(keyedBy: CodingKeys.self)
            rate = try c.decode(Double.self, forKey: .rate)
            burst = try c.decode(Double.self, forKey: .burst)
        }
    }

    private enum CodingKeys: String, CodingKey, CaseIterable { case channels, kinds, perConnection, perUser }
    public init(from decoder: any Decoder) throws {
        let c = try decoder.strictContainer(keyedBy: CodingKeys.self)
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
    @inline(__always)
    func wait(_ limit: RateLimitRule.Limit, now: UInt64) -> Int {
        refill(limit, now: now)
        // A hair below one: a retry exactly `retryAfterMs` later must not fall short by a rounding error.
        // At most a year: a tiny rate would make the wait too large for an Int (or infinite), and trap.
        return tokens >= 1 - 1e-9 ? 0 : max(1, Int(min(((1 - tokens) / limit.rate * 1000).rounded(.up), 31_536_000_000)))
    }

    /// Whether it holds its whole burst (refilled up to `now`): then it is no different from a new one.
    func isFull(_ limit: RateLimitRule.Limit, now: UInt64) -> Bool {
        refill(limit, now: now)
        return tokens >= limit.burst - 1e-9
    }

    /// Takes a token if there is one; else returns the milliseconds until there will be.
    @inline(__always)
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
/// connection, and per user for identified clients; an anonymous connection's per-connection limit is
/// a bucket shared by every anonymous connection from its address, so that reconnecting does not
/// refill it). A request over either gets ERROR `rate_limited` with `retryAfterMs` in its details;
/// nothing else on the connection is affected, and a refused request takes no token.
public struct RateLimiter: Plugin {
    public let name = "rateLimit"
    let settings: LiveSettings
    let users: UserBuckets
    let addresses: AddressBuckets
    let rules = GenerationCache<[Rule]>()

    public init(settings: LiveSettings) {
        self.settings = settings
        users = UserBuckets()
        addresses = AddressBuckets(capacity: Self.addressCapacity)
    }

    /// The addresses whose anonymous buckets are kept (see ``AddressBuckets``).
    static let addressCapacity = 10_000

    public var inbound: [any InboundProcessor] { [Check(settings: settings, users: users, addresses: addresses, rules: rules)] }

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

    /// The per-user buckets, shared by every loop.
    final class UserBuckets: Sendable {
        struct Key: Hashable { let user: String; let rule: Int }
        private let state = Mutex<(generation: Int, buckets: [Key: SharedBucket])>((-1, [:]))

        /// The user's bucket for rule `rule` of generation `generation`.
        func bucket(user: String, rule: Int, limit: RateLimitRule.Limit, generation: Int, now: UInt64) -> SharedBucket {
            state.withLock { state in
                // New rules, new buckets; a loop still on the older rules (mid-reload) does not reset them.
                if generation > state.generation { state = (generation, [:]) }
                let key = Key(user: user, rule: rule)
                if let bucket = state.buckets[key] { return bucket }
                let bucket = SharedBucket(limit, now: now)
                state.buckets[key] = bucket
                return bucket
            }
        }
    }

    /// The buckets anonymous connections share per remote address (its host, not its port), on every
    /// loop. At most `capacity` addresses are kept: when full, the buckets that have refilled go first
    /// (a full bucket is no different from a new one); if that frees less than a quarter, arbitrary
    /// others go too until a quarter is free, so a flood from many addresses costs a sweep per
    /// `capacity / 4` new ones. An address whose bucket went while short starts afresh on its next
    /// connection (its open connections keep the old one). A reload starts them all afresh.
    final class AddressBuckets: Sendable {
        struct Key: Hashable { let host: String; let rule: Int }
        struct Entry { let bucket: SharedBucket; let limit: RateLimitRule.Limit }
        let capacity: Int
        private let state = Mutex<(generation: Int, buckets: [Key: Entry])>((-1, [:]))

        init(capacity: Int) { self.capacity = capacity }

        /// The bucket for rule `rule` of generation `generation` of the anonymous connections from `host`.
        func bucket(host: String, rule: Int, limit: RateLimitRule.Limit, generation: Int, now: UInt64) -> SharedBucket {
            state.withLock { state in
                if generation > state.generation { state = (generation, [:]) }
                let key = Key(host: host, rule: rule)
                if let entry = state.buckets[key] { return entry.bucket }
                if state.buckets.count >= capacity { Self.makeRoom(in: &state.buckets, capacity: capacity, now: now) }
                let bucket = SharedBucket(limit, now: now)
                state.buckets[key] = Entry(bucket: bucket, limit: limit)
                return bucket
            }
        }

        /// How many addresses' buckets are kept.
        var count: Int { state.withLock { $0.buckets.count } }

        private static func makeRoom(in buckets: inout [Key: Entry], capacity: Int, now: UInt64) {
            buckets = buckets.filter { !$0.value.bucket.isFull($0.value.limit, now: now) }
            let target = capacity - max(1, capacity / 4)
            guard buckets.count > target else { return }
            buckets = Dictionary(uniqueKeysWithValues: buckets.prefix(target).map { ($0.key, $0.value) })
        }
    }

    /// A bucket shared by connections on any loop (a user's, or an address's anonymous connections):
    /// one lock per request.
    final class SharedBucket: Sendable {
        private let bucket: Mutex<TokenBucket>

        init(_ limit: RateLimitRule.Limit, now: UInt64) { bucket = Mutex(TokenBucket(limit, now: now)) }

        /// Takes a token (`taking`), or only says how long until there is one.
        func wait(_ limit: RateLimitRule.Limit, now: UInt64, taking: Bool) -> Int {
            bucket.withLock { taking ? $0.take(limit, now: now) : $0.wait(limit, now: now) }
        }

        func isFull(_ limit: RateLimitRule.Limit, now: UInt64) -> Bool { bucket.withLock { $0.isFull(limit, now: now) } }
    }

    /// A rule's bucket for one identified connection (alone when the rule has no per-user limit; else
    /// inside a ``SharedMeter``).
    final class ConnectionMeter: GateMeter {
        let limit: RateLimitRule.Limit
        let bucket: TokenBucket

        init(limit: RateLimitRule.Limit, bucket: TokenBucket) {
            self.limit = limit
            self.bucket = bucket
        }

        func admit(now: UInt64) -> Rejection? {
            let wait = bucket.take(limit, now: now)
            return wait > 0 ? .rateLimited(retryAfterMs: wait) : nil
        }
    }

    /// A rule's buckets for a connection that shares one: a user's connection, the user's and the
    /// connection's if the rule has one; an anonymous connection, its address's alone (which never holds
    /// more than the connection's own would). A request refused by either takes a token from neither,
    /// and learns the longer wait.
    final class SharedMeter: GateMeter {
        let connection: ConnectionMeter?
        let sharedLimit: RateLimitRule.Limit
        let sharedBucket: SharedBucket

        init(connection: ConnectionMeter?, sharedLimit: RateLimitRule.Limit, sharedBucket: SharedBucket) {
            self.connection = connection
            self.sharedLimit = sharedLimit
            self.sharedBucket = sharedBucket
        }

        func admit(now: UInt64) -> Rejection? {
            let connectionWait = connection.map { $0.bucket.wait($0.limit, now: now) } ?? 0
            let sharedWait = sharedBucket.wait(sharedLimit, now: now, taking: connectionWait == 0)
            if connectionWait > 0 || sharedWait > 0 { return .rateLimited(retryAfterMs: max(connectionWait, sharedWait)) }
            if let connection { _ = connection.bucket.take(connection.limit, now: now) }
            return nil
        }
    }

    /// One connection's buckets, for one configuration generation (a reload makes new ones), and its
    /// meters for one HELLO (a new identity keeps the connection's buckets, and takes its user's).
    final class ConnectionState {
        let generation: Int
        let helloCount: Int
        let rules: [Rule]
        /// Per rule: nil when the rule has no per-connection limit.
        let buckets: [ConnectionMeter?]
        /// Per rule: nil when the rule limits nothing this connection does.
        let meters: [(any GateMeter)?]
        let last: LastVerdict?

        init(generation: Int, helloCount: Int, rules: [Rule], buckets: [ConnectionMeter?], meters: [(any GateMeter)?],
             last: LastVerdict? = nil) {
            self.generation = generation
            self.helloCount = helloCount
            self.rules = rules
            self.buckets = buckets
            self.meters = meters
            self.last = last
        }
    }

    struct Check: InboundGate {
        let settings: LiveSettings
        let users: UserBuckets
        let addresses: AddressBuckets
        let rules: GenerationCache<[Rule]>

        var epoch: VerdictEpoch? { settings.epoch }

        func judge(_ context: ConnectionContext, channel: String, kind: InboundKind) -> GateVerdict {
            let state = self.state(of: context)
            if let verdict = state.last?.verdict(for: channel, kind) { return verdict }
            var verdict = GateVerdict.admit
            if let index = state.rules.firstIndex(where: { $0.matches(channel, kind) }), let meter = state.meters[index] {
                verdict = .meter(meter)
            }
            context.keep(ConnectionState(generation: state.generation, helloCount: state.helloCount, rules: state.rules,
                                         buckets: state.buckets, meters: state.meters,
                                         last: LastVerdict(channel: channel, kind: kind, verdict: verdict)))
            return verdict
        }

        /// The connection's buckets and meters for the settings and HELLO in force.
        private func state(of context: ConnectionContext) -> ConnectionState {
            let kept = context.state(ConnectionState.self)
            if let kept, kept.generation == settings.generation, kept.helloCount == context.helloCount { return kept }
            let now = context.now
            let (generation, rules): (Int, [Rule])
            let buckets: [ConnectionMeter?]
            if let kept, kept.generation == settings.generation {
                (generation, rules, buckets) = (kept.generation, kept.rules, kept.buckets)
            } else {
                (generation, rules) = self.rules.snapshot(settings) { ($0.rateLimits ?? []).map(Rule.init) }
                buckets = rules.map { rule in rule.perConnection.map { ConnectionMeter(limit: $0, bucket: TokenBucket($0, now: now)) } }
            }
            let meters = rules.indices.map { index -> (any GateMeter)? in
                guard let user = context.identity else {
                    guard let limit = rules[index].perConnection else { return nil }
                    let bucket = addresses.bucket(host: hostOfAddress(context.remoteAddress), rule: index, limit: limit,
                                                  generation: generation, now: now)
                    return SharedMeter(connection: nil, sharedLimit: limit, sharedBucket: bucket)
                }
                guard let userLimit = rules[index].perUser else { return buckets[index] }
                let userBucket = users.bucket(user: user, rule: index, limit: userLimit, generation: generation, now: now)
                return SharedMeter(connection: buckets[index], sharedLimit: userLimit, sharedBucket: userBucket)
            }
            let state = ConnectionState(generation: generation, helloCount: context.helloCount, rules: rules, buckets: buckets, meters: meters)
            context.keep(state)
            return state
        }
    }
}
