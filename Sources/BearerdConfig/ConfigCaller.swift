import BearerdOAuth
import Yams

/// `caller_jwt:` on an on-behalf-of session or on a route (docs/architecture.md §6.16): what a
/// caller's bearer token must be before bearerd uses it.
public struct CallerJWTConfig: Sendable, Equatable {
    /// Where the caller IdP's public keys come from.
    public enum Keys: Sendable, Equatable {
        /// `jwks_url:`, fetched at start, cached, re-fetched hourly and on an unknown `kid` (at
        /// most once per 30 s).
        case url(EndpointURL)
        /// `jwks_file:`, read at start, hourly and on an unknown `kid` (at most once per 30 s); a
        /// reload with the same settings keeps the keys read.
        case file(String)
    }
    /// `iss` must equal it exactly.
    public var issuer: String
    /// `aud` must contain it.
    public var audience: String
    public var keys: Keys
    /// Clock-skew allowance for `exp`, `nbf` and `iat` (default 60 s, at most 5 min).
    public var leeway: Duration = .seconds(60)
    /// `ca_file:` for an https `jwks_url` signed by a private CA (else the system trust store).
    public var caFile: String?
    public var line: Int

    public init(issuer: String, audience: String, keys: Keys, line: Int) {
        self.issuer = issuer
        self.audience = audience
        self.keys = keys
        self.line = line
    }

    /// The policy of the pure validator.
    public var policy: CallerJWT.Policy {
        CallerJWT.Policy(issuer: issuer, audience: audience, leewaySeconds: leeway.components.seconds)
    }
}

/// A session that acts on behalf of each caller (`subject: caller` on token_exchange,
/// `assertion: caller` on jwt_bearer; docs/architecture.md §6.16): the caller's own bearer token
/// is the grant, one exchanged token per caller.
public struct OnBehalfOfConfig: Sendable, Equatable {
    /// `caller_cache.max_entries` (default 10,000): the LRU bound of exchanged tokens.
    public var maxEntries: Int = OnBehalfOfConfig.defaultMaxEntries
    /// `caller_jwt:` on the session: callers are validated before any exchange.
    public var callerJWT: CallerJWTConfig?

    public static let defaultMaxEntries = 10_000
    public static let maximumMaxEntries = 1_000_000

    public init(maxEntries: Int = OnBehalfOfConfig.defaultMaxEntries, callerJWT: CallerJWTConfig? = nil) {
        self.maxEntries = maxEntries
        self.callerJWT = callerJWT
    }
}

extension ConfigBuilder {
    /// `subject: caller` / `assertion: caller` with `caller_cache:` and `caller_jwt:`; nil for an
    /// ordinary session (and every misplaced key reported).
    func onBehalfOf(_ f: Fields, grant: GrantType?) -> OnBehalfOfConfig? {
        var isCaller = false
        for (key, needs, conflicting) in [("subject", GrantType.tokenExchange, ["subject_token_file", "subject_session"]),
                                          ("assertion", GrantType.jwtBearer, ["assertion_file"])] {
            guard let e = f[key] else { continue }
            guard let value = text(e, in: f, expected: "caller") else { continue }
            guard value == "caller" else {
                fail(e.valueLine, f.key(key), "expected caller (the incoming request's own bearer token), got \(ConfigValues.quoted(value))")
                continue
            }
            if let grant, grant != needs {
                fail(e.keyLine, f.key(key), "only used with grant \(needs.rawValue) (this session has grant \(grant.rawValue))")
                continue
            }
            for other in conflicting where f[other] != nil {
                fail(f[other]?.keyLine ?? e.keyLine, f.key(other), "give either \(key): caller or \(other), not both")
            }
            isCaller = true
        }
        let cache = f["caller_cache"].flatMap { e in
            fields(e.value, path: f.key("caller_cache"), line: e.keyLine, known: ConfigKeys.callerCache, expected: "a mapping such as { max_entries: 10000 }")
        }
        let maxEntries = cache.flatMap { integer($0, "max_entries", range: 1...OnBehalfOfConfig.maximumMaxEntries) }
        let jwt = callerJWT(f)
        guard isCaller else {
            for key in ["caller_cache", "caller_jwt"] where f[key] != nil {
                fail(f[key]?.keyLine ?? f.line, f.key(key), "only used on a session acting for callers (subject: caller with grant token_exchange, "
                     + "or assertion: caller with grant jwt_bearer); a route takes caller_jwt: to admit only valid callers")
            }
            return nil
        }
        if let e = f["sinks"] {
            fail(e.keyLine, f.key("sinks"), "a session acting for callers holds one token per caller, none to write to a file")
        }
        return OnBehalfOfConfig(maxEntries: maxEntries ?? OnBehalfOfConfig.defaultMaxEntries, callerJWT: jwt)
    }

    /// `caller_jwt: { issuer, audience, jwks_url | jwks_file, leeway, ca_file }`.
    func callerJWT(_ owner: Fields) -> CallerJWTConfig? {
        guard let entry = owner["caller_jwt"],
              let f = fields(entry.value, path: owner.key("caller_jwt"), line: entry.keyLine, known: ConfigKeys.callerJWT,
                             expected: "a mapping (issuer, audience, jwks_url or jwks_file)") else { return nil }
        let issuer = text(f, "issuer", expected: "the caller tokens' issuer (their iss claim)")
        if f["issuer"] == nil { missing(f, "issuer", "the caller tokens' iss, compared exactly") }
        let audience = text(f, "audience", expected: "the audience caller tokens must name (their aud claim)")
        if f["audience"] == nil { missing(f, "audience", "the value the caller tokens' aud must contain, e.g. bearerd") }
        let url = parsed(f, "jwks_url", expected: "an http:// or https:// URL") { (raw: String) throws(ConfigValues.Problem) -> EndpointURL in
            let u = try ConfigValues.endpointURL(raw, allowQuery: true)
            guard u.isTLS || ["127.0.0.1", "::1", "localhost"].contains(u.host) else {
                throw ConfigValues.Problem("the caller IdP's keys decide who gets through: https:// is required (http:// only on the loopback), got \(ConfigValues.quoted(raw))")
            }
            return u
        }
        let file = path(f, "jwks_file", mustRead: true)
        let leeway = duration(f, "leeway", maximum: .seconds(300))
        let caFile = path(f, "ca_file", mustRead: true)
        var keys: CallerJWTConfig.Keys?
        switch (f["jwks_url"], f["jwks_file"]) {
        case (nil, nil): missing(f, "jwks_url", "where the caller IdP publishes its keys (or jwks_file: a local JWK Set)")
        case (_?, let e?): fail(e.keyLine, f.key("jwks_file"), "give either jwks_url or jwks_file, not both")
        case (_?, nil): keys = url.map { .url($0) }
        case (nil, _?): keys = file.map { .file($0) }
        }
        if let e = f["ca_file"], url?.isTLS != true {
            fail(e.keyLine, f.key("ca_file"), "only used with an https:// jwks_url")
        }
        guard let issuer, let audience, let keys else { return nil }
        var config = CallerJWTConfig(issuer: issuer, audience: audience, keys: keys, line: entry.keyLine)
        if let leeway { config.leeway = leeway }
        config.caFile = caFile
        return config
    }

    /// Caller sessions hold no single token: no `token_api:` hand-out, no `subject_session:`
    /// pointing at one, no shared cache record.
    func checkCallerSessions(_ sessions: [SessionConfig], tokenAPI: TokenAPIConfig?, tokenAPILine: Int) {
        let callers = Set(sessions.filter { $0.onBehalfOf != nil }.map(\.name))
        guard !callers.isEmpty else { return }
        for s in sessions {
            if let target = s.exchange?.subjectSession, callers.contains(target) {
                fail(s.line, "sessions.\(s.name).subject_session", "session '\(target)' acts for each caller and has no token of its own to exchange")
            }
        }
        for name in tokenAPI?.sessions ?? [] where callers.contains(name) {
            fail(tokenAPILine, "token_api.sessions", "session '\(name)' acts for each caller and has no token of its own to hand out")
        }
    }
}
