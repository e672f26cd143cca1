import Foundation
import Testing
@testable import BearerdConfig
@testable import BearerdOAuth
@testable import BearerdSessions

/// The workload identity keys of docs/architecture.md §4 (`jwt_bearer`, `token_exchange`, `client_assertion`,
/// `audience`, `resource`): parsing, defaults, and the `bearerd check` errors (FILE:LINE).
@Suite struct ConfigWorkloadTests {
    static let jwt = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4IiwiZXhwIjo0MTAyNDQ0ODAwfQ.c2ln"

    @Test func jwtBearerNeedsNoClientAndTakesAudienceLists() throws {
        let config = try parseConfig("""
            sessions:
              k8s:
                grant: jwt_bearer
                token_url: https://sts.example.com/token
                assertion_file: /var/run/secrets/tokens/bearerd
                audience: [https://a.example, https://b.example]
                resource: https://a.example/
            """ + "\n" + minimalRoute)
        let s = try #require(config.session(named: "k8s"))
        #expect(s.grant == .jwtBearer)
        #expect(s.clientID == "")
        #expect(s.clientAuth == .none)
        #expect(s.assertionFile == "/var/run/secrets/tokens/bearerd")
        #expect(s.audiences == ["https://a.example", "https://b.example"])
        #expect(s.resources == ["https://a.example/"])
    }

    @Test func tokenExchangeDefaultsTheSubjectTokenType() throws {
        let config = try parseConfig("""
            sessions:
              k8s:
                grant: jwt_bearer
                token_url: https://sts.example.com/token
                assertion_file: /t
              file:
                grant: token_exchange
                token_url: https://sts.example.com/token
                subject_token_file: /t
                actor_token_file: /a
              chained:
                grant: token_exchange
                token_url: https://sts.example.com/token
                subject_session: k8s
                requested_token_type: urn:ietf:params:oauth:token-type:access_token
            """ + "\n" + minimalRoute)
        let file = try #require(config.session(named: "file")?.exchange)
        #expect(file.subject == .file("/t"))
        #expect(file.subjectTokenType == "urn:ietf:params:oauth:token-type:jwt")
        #expect(file.actorTokenType == "urn:ietf:params:oauth:token-type:jwt")
        let chained = try #require(config.session(named: "chained")?.exchange)
        #expect(chained.subject == .session("k8s"))
        #expect(chained.subjectTokenType == "urn:ietf:params:oauth:token-type:access_token")
        #expect(chained.requestedTokenType == "urn:ietf:params:oauth:token-type:access_token")
    }

    @Test func chainsMustNameSessionsAndEnd() {
        let errors = configErrors("""
            sessions:
              a:
                grant: token_exchange
                token_url: https://sts.example.com/token
                subject_session: b
              b:
                grant: token_exchange
                token_url: https://sts.example.com/token
                subject_session: a
              c:
                grant: token_exchange
                token_url: https://sts.example.com/token
                subject_session: k8z
              k8s:
                grant: jwt_bearer
                token_url: https://sts.example.com/token
                assertion_file: /t
              d:
                grant: token_exchange
                token_url: https://sts.example.com/token
                subject_session: d
            """ + "\n" + minimalRoute)
        #expect(errors.contains("bearerd.yaml:5: sessions.a.subject_session: sessions chain in a cycle: a → b → a (a token exchange needs a subject that does not depend on itself)"), "\(errors)")
        #expect(errors.contains("bearerd.yaml:9: sessions.b.subject_session: sessions chain in a cycle: b → a → b (a token exchange needs a subject that does not depend on itself)"))
        #expect(errors.contains("bearerd.yaml:13: sessions.c.subject_session: no session named 'k8z' (did you mean 'k8s'?)"), "\(errors)")
        #expect(errors.contains { $0.hasPrefix("bearerd.yaml:21: sessions.d.subject_session: sessions chain in a cycle: d → d") }, "\(errors)")
    }

    @Test func subjectSourceIsExactlyOne() {
        let both = configErrors("""
            sessions:
              x:
                grant: token_exchange
                token_url: https://sts.example.com/token
                subject_token_file: /t
                subject_session: y
            """ + "\n" + minimalRoute)
        #expect(both.contains("bearerd.yaml:6: sessions.x.subject_session: give either subject_token_file or subject_session, not both"), "\(both)")
        let neither = configErrors("""
            sessions:
              x:
                grant: token_exchange
                token_url: https://sts.example.com/token
            """ + "\n" + minimalRoute)
        #expect(neither.contains { $0.hasPrefix("bearerd.yaml:2: sessions.x.subject_token_file: missing required key (grant token_exchange needs subject_token_file: or subject_session:") }, "\(neither)")
    }

    @Test func misplacedAndConflictingKeys() {
        let errors = configErrors("""
            sessions:
              x:
                grant: client_credentials
                token_url: https://sts.example.com/token
                client_id: svc
                client_secret: s
                assertion_file: /t
                subject_session: y
                client_assertion_file: /c
                audience: https://a.example
                params:
                  audience: https://b.example
                  resource: https://r.example/
              y:
                grant: client_credentials
                token_url: https://sts.example.com/token
                client_id: fed
                client_auth: client_assertion
            """ + "\n" + minimalRoute)
        #expect(errors.contains("bearerd.yaml:7: sessions.x.assertion_file: only used with grant jwt_bearer (this session has grant client_credentials)"), "\(errors)")
        #expect(errors.contains("bearerd.yaml:8: sessions.x.subject_session: only used with grant token_exchange (this session has grant client_credentials)"))
        #expect(errors.contains("bearerd.yaml:9: sessions.x.client_assertion_file: only used with client_auth client_assertion"))
        #expect(errors.contains("bearerd.yaml:12: sessions.x.params.audience: audience: is set on the session too; use only the session's audience: key (a string or a list; each value is sent once)"), "\(errors)")
        // params: resource alone (no resource: key) stays a plain extra parameter.
        #expect(!errors.contains { $0.contains("params.resource") })
        #expect(errors.contains { $0.hasPrefix("bearerd.yaml:14: sessions.y.client_assertion_file: missing required key") }, "\(errors)")
        #expect(!errors.contains { $0.contains("sessions.y.client_secret") }, "client_assertion needs no secret: \(errors)")
    }

    @Test func checkReadsTheCredentialFiles() throws {
        let dir = try TemporaryDirectory()
        let good = try dir.write("good.jwt", Self.jwt + "\n")
        let opaque = try dir.write("opaque", "not-a-jwt\n")
        let errors = configErrors("""
            sessions:
              a:
                grant: jwt_bearer
                token_url: https://sts.example.com/token
                assertion_file: \(opaque)
              b:
                grant: token_exchange
                token_url: https://sts.example.com/token
                subject_token_file: \(good)
                actor_token_file: \(dir.path)/missing
            """ + "\n" + minimalRoute, checkFiles: true)
        #expect(errors == [
            "bearerd.yaml:5: sessions.a.assertion_file: \(opaque) holds no JWT (a JWT has three dot-separated parts, found 1)",
            "bearerd.yaml:10: sessions.b.actor_token_file: cannot read \(dir.path)/missing: No such file or directory",
        ], "\(errors)")
    }

    /// RFC 8693 §2.2.1: `issued_token_type` must be the requested type; `N_A` only with inject:.
    @Test func exchangeAnswersAreChecked() throws {
        var session = SessionConfig(name: "x", grant: .tokenExchange, tokenURL: try ConfigValues.endpointURL("https://sts.example/token", allowQuery: true),
                                    clientID: "", clientAuth: .none)
        session.exchange = TokenExchangeConfig(subject: .file("/t"), subjectTokenType: TokenRequest.TokenExchange.jwtType,
                                               requestedTokenType: TokenRequest.TokenExchange.accessTokenType)
        var settings = SessionSettings(config: session)
        var parser = settings.responseParser
        #expect(parser.acceptsNotApplicableTokenType)
        let body = Array(#"{"access_token":"t","token_type":"N_A","expires_in":60,"issued_token_type":"urn:ietf:params:oauth:token-type:jwt"}"#.utf8)
        let grant = try parser.parse(status: 200, headers: [], body: body, wallClockNow: 0).get()
        let mismatch = try #require(settings.exchangeProblem(grant))
        #expect(mismatch.reason == "token.issued_token_type_mismatch")
        #expect(mismatch.detail.contains("urn:ietf:params:oauth:token-type:access_token") && mismatch.detail.contains("urn:ietf:params:oauth:token-type:jwt"))
        settings.config.exchange?.requestedTokenType = nil
        settings.routesInject = false
        #expect(settings.exchangeProblem(grant)?.reason == "token.token_type_not_applicable")
        settings.routesInject = true
        #expect(settings.exchangeProblem(grant) == nil)
        // Other grants still refuse N_A.
        parser.acceptsNotApplicableTokenType = false
        if case .failure(let f) = parser.parse(status: 200, headers: [], body: body, wallClockNow: 0) {
            #expect(f.reason == "token.unsupported_token_type")
        } else {
            Issue.record("N_A accepted outside token exchange")
        }
    }

    /// Credential files are read per request: an expired JWT is a transient failure that names
    /// the key and the file, and is not sent.
    @Test func anExpiredCredentialIsNotSent() throws {
        let dir = try TemporaryDirectory()
        let expired = "eyJhbGciOiJFUzI1NiJ9." + Base64.encodeURL(Array(#"{"exp":100}"#.utf8)) + ".c2ln"
        let file = try dir.write("t", expired)
        var session = SessionConfig(name: "k8s", grant: .jwtBearer, tokenURL: try ConfigValues.endpointURL("https://sts.example/token", allowQuery: true),
                                    clientID: "", clientAuth: .none)
        session.assertionFile = file
        session.audiences = ["a", "b"]
        let settings = SessionSettings(config: session)
        guard case .failure(let f) = settings.preparedRequest(refreshToken: nil, wallClockNow: 160) else {
            Issue.record("an expired assertion was prepared for sending")
            return
        }
        #expect(f.classification == .retryable)
        #expect(f.reason == "credential.expired")
        #expect(f.detail == "credential.expired: assertion_file \(file): the JWT expired 60 s ago (exp 100)")
        try dir.write("t", Self.jwt + "\n")
        let request = try settings.preparedRequest(refreshToken: nil, wallClockNow: 160).get()
        #expect(request.grant == .jwtBearer(assertion: OAuthSecret(Self.jwt)))
        #expect(request.audiences == ["a", "b"])
    }

    /// `bearerd token`'s cache binding changes with the identity-bearing keys.
    @Test func theTokenCacheBindingFollowsTheWorkloadKeys() throws {
        var a = SessionConfig(name: "x", grant: .tokenExchange, tokenURL: try ConfigValues.endpointURL("https://sts.example/token", allowQuery: true),
                              clientID: "", clientAuth: .none)
        a.exchange = TokenExchangeConfig(subject: .session("k8s"), subjectTokenType: TokenRequest.TokenExchange.accessTokenType)
        var b = a
        b.audiences = ["https://api.example"]
        var c = a
        c.exchange?.subject = .session("other")
        let ids = Set([a, b, c].map(SessionSettings.workloadIdentity))
        #expect(ids.count == 3)
    }
}
