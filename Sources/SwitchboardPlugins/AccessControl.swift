import SwitchboardPluginAPI
import SwitchboardTransport

/// The `access` section: users identified by their HELLO token, and what each may do.
public struct AccessRules: Codable, Sendable, Equatable {
    public var users: [User]?
    /// The rights of connections that sent no token; none when omitted.
    public var anonymous: Grants?

    public init(users: [User]? = nil, anonymous: Grants? = nil) {
        self.users = users
        self.anonymous = anonymous
    }

    private enum CodingKeys: String, CodingKey, CaseIterable { case users, anonymous }
    public init(from decoder: any Decoder) throws {
        let c = try decoder.strictContainer(keyedBy: CodingKeys.self)
        users = try c.decodeIfPresent([User].self, forKey: .users)
        anonymous = try c.decodeIfPresent(Grants.self, forKey: .anonymous)
    }

    public struct User: Codable, Sendable, Equatable {
        public var name: String
        /// The SHA-256 of the user's token, in hexadecimal (`printf %s TOKEN | sha256sum`): the file
        /// never holds the token itself.
        public var tokenSha256: String?
        /// The subject of the user's TLS client certificate, as RFC 2253 text (`CN=alice,O=Example`;
        /// `openssl x509 -noout -subject -nameopt RFC2253`), for servers that require client certificates.
        public var certificateSubject: String?
        public var allow: Rights?
        public var deny: Rights?

        public init(name: String, tokenSha256: String? = nil, certificateSubject: String? = nil, allow: Rights? = nil, deny: Rights? = nil) {
            self.name = name
            self.tokenSha256 = tokenSha256
            self.certificateSubject = certificateSubject
            self.allow = allow
            self.deny = deny
        }

        private enum CodingKeys: String, CodingKey, CaseIterable { case name, tokenSha256, certificateSubject, allow, deny }
        public init(from decoder: any Decoder) throws {
            let c = try decoder.strictContainer(keyedBy: CodingKeys.self)
            name = try c.decode(String.self, forKey: .name)
            tokenSha256 = try c.decodeIfPresent(String.self, forKey: .tokenSha256)
            certificateSubject = try c.decodeIfPresent(String.self, forKey: .certificateSubject)
            guard tokenSha256 != nil || certificateSubject != nil else {
                throw DecodingError.dataCorruptedError(forKey: .name, in: c,
                                                       debugDescription: "user \(name) needs tokenSha256 or certificateSubject")
            }
            allow = try c.decodeIfPresent(Rights.self, forKey: .allow)
            deny = try c.decodeIfPresent(Rights.self, forKey: .deny)
        }
    }

    public struct Grants: Codable, Sendable, Equatable {
        public var allow: Rights?
        public var deny: Rights?

        public init(allow: Rights? = nil, deny: Rights? = nil) {
            self.allow = allow
            self.deny = deny
        }

        private enum CodingKeys: String, CodingKey, CaseIterable { case allow, deny }
        public init(from decoder: any Decoder) throws {
            let c = try decoder.strictContainer(keyedBy: CodingKeys.self)
            allow = try c.decodeIfPresent(Rights.self, forKey: .allow)
            deny = try c.decodeIfPresent(Rights.self, forKey: .deny)
        }
    }

    /// Channel patterns per right. In `allow`, an absent right allows everything that is not denied
    /// (as in NATS permissions) and an empty list nothing; in `deny`, an absent right denies nothing.
    public struct Rights: Codable, Sendable, Equatable {
        public var call: [String]?
        public var listen: [String]?
        public var send: [String]?
        public var register: [String]?

        public init(call: [String]? = nil, listen: [String]? = nil, send: [String]? = nil, register: [String]? = nil) {
            self.call = call
            self.listen = listen
            self.send = send
            self.register = register
        }

        private enum CodingKeys: String, CodingKey, CaseIterable { case call, listen, send, register }
        public init(from decoder: any Decoder) throws {
            let c = try decoder.strictContainer(keyedBy: CodingKeys.self)
            call = try c.decodeIfPresent([String].self, forKey: .call)
            listen = try c.decodeIfPresent([String].self, forKey: .listen)
            send = try c.decodeIfPresent([String].self, forKey: .send)
            register = try c.decodeIfPresent([String].self, forKey: .register)
        }

        func patterns(for kind: InboundKind) -> [String]? {
            switch kind {
            case .call: call
            case .listen: listen
            case .message: send
            case .register: register
            case .cancel: nil
            }
        }
    }
}

/// Access control: identifies clients by token at HELLO (an unknown token is refused with
/// `unauthorized`), then checks every call, send, listen and REGISTER against the client's rights;
/// a refusal is ERROR `forbidden` and the connection stays open. Deny wins over allow. A `cancel` is
/// always allowed (it only stops the client's own stream).
///
/// Rights are looked up once per connection and configuration generation, and its last verdict is kept
/// per connection: a client that keeps calling one channel costs no pattern match.
public struct AccessControl: Plugin {
    public let name = "access"
    let settings: LiveSettings

    public init(settings: LiveSettings) { self.settings = settings }

    public var inbound: [any InboundProcessor] { [Check(settings: settings)] }

    public var controlsAccess: Bool { settings.current.access != nil }

    public func authenticate(_ hello: Hello, connection: ConnectionContext) -> Authentication {
        guard let access = settings.current.access else { return .pass }
        if let token = hello.token {
            let hash = Digest.sha256Hex(Array(token.utf8))
            guard let user = access.users?.first(where: { $0.tokenSha256?.lowercased() == hash }) else { return .refuse }
            connection.keep(Credential(tokenSha256: hash))  // a reload that changes the user's token revokes it
            return .identity(user.name)
        }
        if let subject = hello.certificateSubject {
            // A verified certificate no user names is refused, not taken for anonymous (wire.md).
            guard let user = access.users?.first(where: { $0.certificateSubject == subject }) else { return .refuse }
            connection.keep(Credential(certificateSubject: subject))
            return .identity(user.name)
        }
        connection.keep(Credential())  // anonymous
        return .pass
    }

    /// What proved a connection's identity at its last HELLO: a token's hash, a certificate, or nothing.
    final class Credential {
        let tokenSha256: String?
        let certificateSubject: String?

        init(tokenSha256: String? = nil, certificateSubject: String? = nil) {
            self.tokenSha256 = tokenSha256
            self.certificateSubject = certificateSubject
        }

        /// Whether it still proves `user` (a reload may have changed the user's token or certificate).
        func proves(_ user: AccessRules.User) -> Bool {
            if let tokenSha256 { return user.tokenSha256?.lowercased() == tokenSha256 }
            if let certificateSubject { return user.certificateSubject == certificateSubject }
            return false
        }

        var isAnonymous: Bool { tokenSha256 == nil && certificateSubject == nil }
    }

    /// A pattern of a right: channels, and for calls the method (`orders/*#find`); nil: every method
    /// but an operator's (``BuiltInChannels/operatorMethods``) in `allow`, every method in `deny`.
    struct RightPattern {
        let channel: ChannelPattern
        let method: String?

        /// `text` as written under `kind`: a call's pattern is split at its last `#`, and `#*` names every
        /// method (so `name#*` is how a pattern names a channel whose name holds `#`).
        init(_ text: String, kind: InboundKind) {
            guard kind == .call, let hash = text.lastIndex(of: "#") else {
                channel = ChannelPattern(text)
                method = nil
                return
            }
            channel = ChannelPattern(String(text[..<hash]))
            let name = String(text[text.index(after: hash)...])
            method = name == "*" ? nil : name
        }
    }

    /// A client's rights, compiled: patterns per kind.
    struct Compiled {
        var allow: [InboundKind: [RightPattern]] = [:]
        var deny: [InboundKind: [RightPattern]] = [:]

        /// `allowsByDefault`: an absent right under `allow` allows everything not denied, but for
        /// `register`, which rights with any rules at all must grant by name (holding a channel means
        /// receiving other users' requests on it).
        init(allow: AccessRules.Rights?, deny: AccessRules.Rights?, allowsByDefault: Bool) {
            let hasRules = allow != nil || deny != nil
            for kind in InboundKind.allCases where kind != .cancel {
                if let patterns = allow?.patterns(for: kind) {
                    self.allow[kind] = patterns.map { RightPattern($0, kind: kind) }
                } else if !allowsByDefault || (kind == .register && hasRules) {
                    self.allow[kind] = []
                }
                self.deny[kind] = (deny?.patterns(for: kind) ?? []).map { RightPattern($0, kind: kind) }
            }
        }

        /// The verdict on `kind` requests to `channel`: plain, unless some pattern for the channel names a
        /// method or the channel has operator methods; then each call is judged by its method.
        func verdict(_ kind: InboundKind, _ channel: String, refusal: @escaping @Sendable (String?) -> Rejection) -> GateVerdict {
            if kind == .cancel { return .admit }
            let denied = deny[kind, default: []].filter { $0.channel.matches(channel) }
            let allowed = allow[kind].map { $0.filter { $0.channel.matches(channel) } }
            let operatorMethods = kind == .call ? BuiltInChannels.operatorMethods[channel] ?? [] : []
            guard operatorMethods.isEmpty, !denied.contains(where: { $0.method != nil }),
                  !(allowed ?? []).contains(where: { $0.method != nil }) else {
                let methods = MethodRights(denied: denied.map(\.method), allowed: allowed?.map(\.method), operatorMethods: operatorMethods)
                return .byMethod { method in methods.permit(method) ? nil : refusal(method) }
            }
            if !denied.isEmpty { return .refuse(refusal(nil)) }
            if let allowed, allowed.isEmpty { return .refuse(refusal(nil)) }
            return .admit
        }
    }

    /// The call rights on one channel whose patterns name methods, or that has operator methods.
    struct MethodRights: Sendable {
        /// The methods the matching `deny` patterns name (nil: all of them).
        let denied: [String?]
        /// The methods the matching `allow` patterns name (nil: all but operator methods); nil when
        /// `allow` has no call patterns (everything not denied, but operator methods).
        let allowed: [String?]?
        let operatorMethods: [String]

        func permit(_ method: String?) -> Bool {
            guard let method else {
                // A call whose method could not be read may be any method: allowed only where none is
                // denied, none is an operator's, and a pattern allows every method.
                return operatorMethods.isEmpty && denied.isEmpty && (allowed?.contains(nil) ?? true)
            }
            if denied.contains(where: { $0 == nil || $0 == method }) { return false }
            let isOperatorMethod = operatorMethods.contains(method)
            guard let allowed else { return !isOperatorMethod }
            return allowed.contains { $0 == nil ? !isOperatorMethod : $0 == method }
        }
    }

    /// One connection's rights, for one HELLO and configuration generation, and its last verdict.
    /// Immutable: replaced whole when any of that changes.
    final class ConnectionState {
        let generation: Int
        /// The connection's ``ConnectionContext/helloCount`` the rights were looked up for.
        let helloCount: Int
        /// nil: the section was removed by a reload (everything passes).
        let rights: Compiled?
        let last: LastVerdict?

        init(generation: Int, helloCount: Int, rights: Compiled?, last: LastVerdict? = nil) {
            self.generation = generation
            self.helloCount = helloCount
            self.rights = rights
            self.last = last
        }
    }

    struct Check: InboundGate {
        let settings: LiveSettings

        var epoch: VerdictEpoch? { settings.epoch }

        func judge(_ context: ConnectionContext, channel: String, kind: InboundKind) -> GateVerdict {
            let generation = settings.generation
            var state = context.state(ConnectionState.self)
            if state == nil || state?.generation != generation || state?.helloCount != context.helloCount {
                state = ConnectionState(generation: generation, helloCount: context.helloCount, rights: rights(of: context))
                state.map(context.keep)
            }
            guard let state else { return .admit }
            if let verdict = state.last?.verdict(for: channel, kind) { return verdict }
            let verdict = Self.verdict(on: channel, kind, rights: state.rights, identity: context.identity)
            context.keep(ConnectionState(generation: state.generation, helloCount: state.helloCount, rights: state.rights,
                                         last: LastVerdict(channel: channel, kind: kind, verdict: verdict)))
            return verdict
        }

        private static func verdict(on channel: String, _ kind: InboundKind, rights: Compiled?, identity: String?) -> GateVerdict {
            guard let rights else { return .admit }
            let who = identity.map { "user \($0)" } ?? "anonymous connections"
            let right = kind == .message ? "send" : kind.rawValue
            return rights.verdict(kind, channel) { method in
                .forbidden("\(who) may not \(right) \(method.map { "\(channel)#\($0)" } ?? "on \(channel)")")
            }
        }

        private func rights(of context: ConnectionContext) -> Compiled? {
            guard let access = settings.current.access else { return nil }
            let credential = context.state(Credential.self)
            guard let credential, !credential.isAnonymous, let identity = context.identity else {
                return Compiled(allow: access.anonymous?.allow, deny: access.anonymous?.deny,
                                allowsByDefault: access.anonymous != nil)
            }
            guard let user = access.users?.first(where: { $0.name == identity }), credential.proves(user) else {
                return Compiled(allow: nil, deny: nil, allowsByDefault: false)  // removed, or its token changed: no rights
            }
            return Compiled(allow: user.allow, deny: user.deny, allowsByDefault: true)
        }
    }
}
