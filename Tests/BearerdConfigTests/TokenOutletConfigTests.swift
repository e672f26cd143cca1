import Foundation
import Testing
@testable import BearerdConfig
@testable import BearerdSessions

/// `sinks:` and `token_api:` (docs/architecture.md §4): what the loader accepts and how it reports
/// `FILE:LINE: key: what is wrong`; the header decision shared with `bearerd token`; the sink
/// writer's files and backoff are tested in BearerdSessionsTests/TokenSinkFileTests.
@Suite struct TokenOutletConfigTests {
    static func yaml(session extra: String = "", top: String = "", dpop: Bool = false) -> String {
        """
        state_dir: /tmp/bearerd-state-never-created
        sessions:
          partner:
            grant: client_credentials
            token_url: https://auth.example.com/token
            client_id: c
            client_secret: s
            dpop: \(dpop)
        \(extra)
          other:
            grant: client_credentials
            token_url: https://auth.example.com/token
            client_id: c
            client_secret: s
        \(top)
        routes:
          - match: /a/
            upstream: http://127.0.0.1:9
            session: partner
            inject: { header: X-Api-Key, format: "k {token}" }
          - match: /b/
            upstream: http://127.0.0.1:9
            session: partner
        """
    }

    @Test func sinksParseWithDefaultsAndOctalModes() throws {
        let c = try parseConfig(Self.yaml(session: """
                sinks:
                  - { path: /run/x/a.token }
                  - path: /run/x/b.json
                    mode: 0600
                    format: json
                  - { path: rel/c.header, mode: 660, format: header }
            """))
        let s = try #require(c.session(named: "partner")).sinks
        #expect(Array(s.map(\.path).prefix(2)) == ["/run/x/a.token", "/run/x/b.json"])
        #expect(s.last?.path.hasSuffix("rel/c.header") == true, "relative to the config file: \(s.map(\.path))")
        #expect(s.map(\.mode) == [0o640, 0o600, 0o660])
        #expect(s.map(\.format) == [.token, .json, .header])
        #expect(c.session(named: "other")?.sinks == [])
    }

    @Test func sinkErrorsNameFileLineAndKey() {
        let errors = configErrors(Self.yaml(session: """
                sinks:
                  - { path: /run/x/a }
                  - { path: /run/x/w, mode: 0666 }
                  - { path: /run/x/b, format: yaml }
                  - { path: /run/x/c, owner: root }
                  - { mode: 0600 }
                  - { path: /run/x/a }
            """))
        #expect(errors.count == 5, "\(errors)")
        #expect(errors.contains("bearerd.yaml:11: sessions.partner.sinks[1].mode: a token file must not be world-writable, got 666"), "\(errors)")
        #expect(errors.contains { $0.hasPrefix("bearerd.yaml:12: sessions.partner.sinks[2].format: expected one of token, header, json") }, "\(errors)")
        #expect(errors.contains { $0.hasPrefix("bearerd.yaml:13: sessions.partner.sinks[3].owner: unknown key") }, "\(errors)")
        #expect(errors.contains { $0.contains("sessions.partner.sinks[4].path: missing required key") }, "\(errors)")
        #expect(errors.contains("bearerd.yaml:15: sessions.partner.sinks[5].path: /run/x/a is already a sink of this session (line 10)"), "\(errors)")
        #expect(configErrors(Self.yaml(session: "    sinks: /run/x/a")).contains { $0.contains("sessions.partner.sinks: expected a list of sinks") })
    }

    @Test func tokenAPIParsesUnixAndLoopbackTCP() throws {
        let unix = try parseConfig(Self.yaml(top: """
            token_api:
              listen: unix:/run/bearerd/token.sock
              sessions: [partner]
              allowed_uids: [1000, 0]
            """))
        #expect(unix.tokenAPI == TokenAPIConfig(listen: .unix(path: "/run/bearerd/token.sock"), sessions: ["partner"], allowedUIDs: [1000, 0]))
        for listen in ["127.0.0.1:9902", "127.0.0.2:9902", "\"[::1]:9902\""] {
            let tcp = try parseConfig(Self.yaml(top: "token_api: { listen: \(listen), sessions: [partner, other] }"))
            #expect(tcp.tokenAPI?.sessions == ["partner", "other"])
            #expect(tcp.tokenAPI?.allowedUIDs == nil)
        }
    }

    @Test func tokenAPIRefusesNonLoopbackUnknownSessionsAndUidsOnTCP() {
        for listen in ["0.0.0.0:9902", "10.0.0.1:9902", "localhost:9902", "\"[::]:9902\""] {
            let errors = configErrors(Self.yaml(top: """
                token_api:
                  listen: \(listen)
                  sessions: [partner]
                """))
            #expect(errors.contains { $0.hasPrefix("bearerd.yaml:16: token_api.listen: ") && $0.contains("not a loopback address") }, "\(listen): \(errors)")
        }
        let errors = configErrors(Self.yaml(top: """
            token_api:
              listen: 127.0.0.1:9902
              sessions: [partner, partnr]
              allowed_uids: [1000]
              mode: 0600
            """))
        #expect(errors.contains("bearerd.yaml:17: token_api.sessions[1]: no session named 'partnr' (did you mean 'partner'?)"), "\(errors)")
        #expect(errors.contains("bearerd.yaml:18: token_api.allowed_uids: applies to a unix: listen only (a TCP peer's uid cannot be checked)"), "\(errors)")
        #expect(errors.contains { $0.hasPrefix("bearerd.yaml:19: token_api.mode: unknown key") }, "\(errors)")
        let missing = configErrors(Self.yaml(top: "token_api: { sessions: [] }"))
        #expect(missing.contains { $0.contains("token_api.listen: missing required key") }, "\(missing)")
        #expect(missing.contains { $0.contains("token_api.sessions: expected at least one session name") }, "\(missing)")
        let clash = configErrors("listen: [127.0.0.1:8080]\n" + Self.yaml(top: "token_api: { listen: 127.0.0.1:8080, sessions: [partner] }"))
        #expect(clash.contains { $0.contains("token_api.listen: 127.0.0.1:8080 is also a listen or admin address") }, "\(clash)")
    }

    @Test func theHeaderDecisionIsSharedWithBearerdToken() throws {
        let c = try parseConfig(Self.yaml())
        let partner = try #require(c.session(named: "partner"))
        // The first route using the session decides; a session without routes is Bearer.
        #expect(c.tokenHeader(for: partner) == InjectConfig(header: "X-Api-Key", prefix: "k ", suffix: ""))
        #expect(c.tokenHeader(for: try #require(c.session(named: "other"))) == .bearer)
        let d = try parseConfig(Self.yaml(dpop: true))
        let bound = try #require(d.session(named: "partner"))
        #expect(d.tokenHeader(for: bound) == InjectConfig(header: "Authorization", prefix: "DPoP ", suffix: ""))
        #expect(BearerdConfig.tokenType(for: bound) == "DPoP")
        let plan = TokenSinkPlan(bound, in: d)
        #expect(plan.render(.header, token: "T", expiresAt: 0) == Array("Authorization: DPoP T\n".utf8))
        // `token` is exactly the token: no line ending (issue 31 item 4).
        #expect(plan.render(.token, token: "T", expiresAt: 0) == Array("T".utf8))
        #expect(String(decoding: plan.render(.json, token: "T", expiresAt: 0), as: UTF8.self)
                == "{\"access_token\":\"T\",\"token_type\":\"DPoP\",\"expires_at\":\"1970-01-01T00:00:00Z\",\"session\":\"partner\"}\n")
    }
}
