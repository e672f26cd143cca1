import Testing
@testable import BearerdConfig

/// On behalf of callers (docs/architecture.md §4, §6.16): `subject: caller`, `assertion: caller`,
/// `caller_cache:` and `caller_jwt:` on sessions and routes, and every misplaced or conflicting key.
@Suite("Config: on behalf of callers")
struct ConfigCallerTests {
    static func yaml(_ session: String, grant: String = "token_exchange", route: String = "session: caller") -> String {
        "sessions:\n  caller:\n    grant: \(grant)\n    token_url: https://sts.example.com/token\n    client_id: sidecar\n    client_secret: x\n"
            + session + "\nroutes:\n  - match: /\n    upstream: https://orders.internal\n    " + route + "\n"
    }

    @Test func tokenExchangeForCallers() throws {
        let c = try parseConfig(Self.yaml("""
                subject: caller
                audience: https://orders.internal
                caller_cache: { max_entries: 100 }
                caller_jwt:
                  issuer: https://login.example.com
                  jwks_url: https://login.example.com/jwks
                  audience: bearerd
                  leeway: 30s
            """))
        let s = try #require(c.session(named: "caller"))
        #expect(s.exchange?.subject == .caller)
        // A caller's token is an access token unless configured (RFC 8693 §3).
        #expect(s.exchange?.subjectTokenType == "urn:ietf:params:oauth:token-type:access_token")
        let obo = try #require(s.onBehalfOf)
        #expect(obo.maxEntries == 100)
        let jwt = try #require(obo.callerJWT)
        #expect(jwt.issuer == "https://login.example.com" && jwt.audience == "bearerd")
        #expect(jwt.leeway == .seconds(30))
        guard case .url(let u) = jwt.keys else { Issue.record("expected jwks_url"); return }
        #expect(u.description == "https://login.example.com/jwks")
        #expect(jwt.policy.leewaySeconds == 30)
    }

    @Test func defaultsAndEntraStyle() throws {
        let c = try parseConfig(Self.yaml("    assertion: caller\n    params: { requested_token_use: on_behalf_of }", grant: "jwt_bearer"))
        let s = try #require(c.session(named: "caller"))
        #expect(s.assertionFile == nil)
        #expect(s.onBehalfOf == OnBehalfOfConfig(maxEntries: 10_000, callerJWT: nil))
        // Without either, a session acts for itself.
        let plain = try parseConfig(Self.yaml("    subject_token_file: /dev/null"))
        #expect(plain.session(named: "caller")?.onBehalfOf == nil)
    }

    @Test func misplacedAndConflictingKeys() {
        let other = configErrors(Self.yaml("    subject: me"))
        #expect(other.contains { $0.contains("sessions.caller.subject: expected caller") }, "\(other)")
        let both = configErrors(Self.yaml("    subject: caller\n    subject_token_file: /dev/null"))
        #expect(both.contains { $0.contains("sessions.caller.subject_token_file: give either subject: caller or subject_token_file, not both") }, "\(both)")
        let wrongGrant = configErrors(Self.yaml("    assertion: caller"))
        #expect(wrongGrant.contains { $0.contains("sessions.caller.assertion: only used with grant jwt_bearer") }, "\(wrongGrant)")
        let assertionBoth = configErrors(Self.yaml("    assertion: caller\n    assertion_file: /dev/null", grant: "jwt_bearer"))
        #expect(assertionBoth.contains { $0.contains("give either assertion: caller or assertion_file, not both") }, "\(assertionBoth)")
        let cacheAlone = configErrors(Self.yaml("    subject_token_file: /dev/null\n    caller_cache: { max_entries: 10 }"))
        #expect(cacheAlone.contains { $0.contains("sessions.caller.caller_cache: only used on a session acting for callers") }, "\(cacheAlone)")
        let zero = configErrors(Self.yaml("    subject: caller\n    caller_cache: { max_entries: 0 }"))
        #expect(zero.contains { $0.contains("sessions.caller.caller_cache.max_entries: must be 1–1000000, got 0") }, "\(zero)")
        let sinks = configErrors(Self.yaml("    subject: caller\n    sinks: [{ path: /tmp/x }]"))
        #expect(sinks.contains { $0.contains("sessions.caller.sinks: a session acting for callers holds one token per caller") }, "\(sinks)")
        let noSubject = configErrors(Self.yaml("    audience: x"))
        #expect(noSubject.contains { $0.contains("or subject: caller") }, "\(noSubject)")
    }

    @Test func callerJWTIsCheckedWherever() {
        let missing = configErrors(Self.yaml("    subject: caller\n    caller_jwt: { jwks_url: https://login.example.com/jwks }"))
        #expect(missing.contains { $0.contains("sessions.caller.caller_jwt.issuer: missing required key") }, "\(missing)")
        #expect(missing.contains { $0.contains("sessions.caller.caller_jwt.audience: missing required key") }, "\(missing)")
        let twoSources = configErrors(Self.yaml("    subject: caller\n    caller_jwt: { issuer: i, audience: a, jwks_url: https://l.example/jwks, jwks_file: /dev/null }"))
        #expect(twoSources.contains { $0.contains("caller_jwt.jwks_file: give either jwks_url or jwks_file, not both") }, "\(twoSources)")
        let noSource = configErrors(Self.yaml("    subject: caller\n    caller_jwt: { issuer: i, audience: a }"))
        #expect(noSource.contains { $0.contains("caller_jwt.jwks_url: missing required key") }, "\(noSource)")
        // The keys decide who gets through: never fetched over plain HTTP from another host.
        let plain = configErrors(Self.yaml("    subject: caller\n    caller_jwt: { issuer: i, audience: a, jwks_url: http://login.example.com/jwks }"))
        #expect(plain.contains { $0.contains("https:// is required (http:// only on the loopback)") }, "\(plain)")
        let loopback = configErrors(Self.yaml("    subject: caller\n    caller_jwt: { issuer: i, audience: a, jwks_url: http://127.0.0.1:9/jwks }"))
        #expect(loopback.isEmpty, "\(loopback)")
        let caOnHTTP = configErrors(Self.yaml("    subject: caller\n    caller_jwt: { issuer: i, audience: a, jwks_url: http://127.0.0.1:9/jwks, ca_file: /dev/null }"))
        #expect(caOnHTTP.contains { $0.contains("caller_jwt.ca_file: only used with an https:// jwks_url") }, "\(caOnHTTP)")
        let leeway = configErrors(Self.yaml("    subject: caller\n    caller_jwt: { issuer: i, audience: a, jwks_file: /dev/null, leeway: 10m }"))
        #expect(leeway.contains { $0.contains("caller_jwt.leeway: must be at most") }, "\(leeway)")
    }

    @Test func routeCallerJWT() throws {
        let c = try parseConfig(Self.yaml("    subject_token_file: /dev/null",
                                          route: "session: caller\n    caller_jwt: { issuer: https://login.example.com, audience: bearerd, jwks_file: /etc/jwks.json }"))
        let jwt = try #require(c.routes.first?.callerJWT)
        #expect(jwt.keys == .file("/etc/jwks.json"))
        let noSession = configErrors(Self.yaml("    subject_token_file: /dev/null",
                                               route: "caller_jwt: { issuer: i, audience: a, jwks_file: /dev/null }"))
        #expect(noSession.contains { $0.contains("routes[0].caller_jwt: caller_jwt needs a session: on this route") }, "\(noSession)")
    }

    @Test func callerSessionsHaveNoTokenOfTheirOwn() {
        let chained = configErrors("""
            sessions:
              caller:
                grant: token_exchange
                token_url: https://sts.example.com/token
                client_id: sidecar
                client_secret: x
                subject: caller
              chain:
                grant: token_exchange
                token_url: https://sts.example.com/token
                subject_session: caller
            token_api:
              listen: 127.0.0.1:9902
              sessions: [caller]
            routes:
              - { match: /, upstream: "https://orders.internal", session: caller }
            """)
        #expect(chained.contains { $0.contains("sessions.chain.subject_session: session 'caller' acts for each caller and has no token of its own to exchange") }, "\(chained)")
        #expect(chained.contains { $0.contains("token_api.sessions: session 'caller' acts for each caller and has no token of its own to hand out") }, "\(chained)")
    }
}
