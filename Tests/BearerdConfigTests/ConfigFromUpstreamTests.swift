import Testing
@testable import BearerdConfig

/// `issuer: from_upstream` and `allowed_issuers:` (docs/architecture.md §4, §6.16): the
/// authorization server named by the upstream, only from the allowed list.
@Suite("Config: issuer from_upstream")
struct ConfigFromUpstreamTests {
    static func yaml(session: String, routes: String = "  - { match: /, upstream: \"https://mcp.example.com/v1\", session: mcp }") -> String {
        "sessions:\n  mcp:\n    grant: client_credentials\n    client_id: c\n    client_secret: x\n" + session + "\nroutes:\n" + routes + "\n"
    }

    @Test func fromUpstreamIsItsOwnFormWithTheAllowedIssuers() throws {
        let c = try parseConfig(Self.yaml(session: "    issuer: from_upstream\n    allowed_issuers: [\"https://auth.example.com\", \"http://127.0.0.1:8443/realm\"]"))
        let s = try #require(c.session(named: "mcp"))
        let settings = try #require(s.issuerSource?.fromUpstream)
        #expect(settings.allowed.map(\.description) == ["https://auth.example.com", "http://127.0.0.1:8443/realm"])
        #expect(settings.resolved == nil)
        #expect(s.issuer == nil)  // not a fixed issuer
        #expect(s.tokenURL == .discoveryPlaceholder)
        // A fixed issuer is still the other form.
        let fixed = try parseConfig(Self.yaml(session: "    issuer: https://auth.example.com"))
        #expect(fixed.session(named: "mcp")?.issuerSource == .fixed(try #require(fixed.session(named: "mcp")?.issuer)))
        // One allowed issuer as a scalar.
        let one = try parseConfig(Self.yaml(session: "    issuer: from_upstream\n    allowed_issuers: https://auth.example.com"))
        #expect(one.session(named: "mcp")?.issuerSource?.fromUpstream?.allowed.count == 1)
    }

    @Test func allowedIssuersAreRequiredAndOnlyWithFromUpstream() {
        let none = configErrors(Self.yaml(session: "    issuer: from_upstream"))
        #expect(none.contains { $0.hasPrefix("bearerd.yaml:6: sessions.mcp.allowed_issuers: missing: issuer: from_upstream needs allowed_issuers") }, "\(none)")
        let empty = configErrors(Self.yaml(session: "    issuer: from_upstream\n    allowed_issuers: []"))
        #expect(empty.contains { $0.contains("sessions.mcp.allowed_issuers: expected at least one issuer URL") }, "\(empty)")
        let stray = configErrors(Self.yaml(session: "    issuer: https://auth.example.com\n    allowed_issuers: [https://auth.example.com]"))
        #expect(stray.contains { $0.hasPrefix("bearerd.yaml:7: sessions.mcp.allowed_issuers: only used with issuer: from_upstream") }, "\(stray)")
        let tokenURL = configErrors(Self.yaml(session: "    token_url: https://auth.example.com/token\n    allowed_issuers: [https://auth.example.com]"))
        #expect(tokenURL.contains { $0.contains("sessions.mcp.allowed_issuers: only used with issuer: from_upstream") }, "\(tokenURL)")
    }

    @Test func allowedIssuersAreHTTPSOrLoopback() {
        let plain = configErrors(Self.yaml(session: "    issuer: from_upstream\n    allowed_issuers:\n      - https://auth.example.com\n      - http://auth.example.com"))
        #expect(plain.contains { $0.hasPrefix("bearerd.yaml:9: sessions.mcp.allowed_issuers[1]: an allowed issuer must be https:// (http:// only on a loopback host)") }, "\(plain)")
        let query = configErrors(Self.yaml(session: "    issuer: from_upstream\n    allowed_issuers: [\"https://a.example.com/?x=1\"]"))
        #expect(query.contains { $0.contains("sessions.mcp.allowed_issuers[0]") }, "\(query)")
        let notURL = configErrors(Self.yaml(session: "    issuer: from_upstream\n    allowed_issuers: [auth.example.com]"))
        #expect(notURL.contains { $0.contains("sessions.mcp.allowed_issuers[0]: expected an http:// or https:// URL") }, "\(notURL)")
        for loopback in ["http://127.0.0.1:9000", "http://localhost:9000", "http://[::1]:9000"] {
            #expect(configErrors(Self.yaml(session: "    issuer: from_upstream\n    allowed_issuers: [\"\(loopback)\"]")).isEmpty, "\(loopback)")
        }
        #expect(!configErrors(Self.yaml(session: "    issuer: from_upstream\n    allowed_issuers: [\"http://127.0.0.1.example.com\"]")).isEmpty)
        let both = configErrors(Self.yaml(session: "    issuer: from_upstream\n    token_url: https://a.example.com/t\n    allowed_issuers: [https://a.example.com]"))
        #expect(both.contains { $0.contains("sessions.mcp.issuer: give either token_url or issuer") }, "\(both)")
    }

    @Test func theSessionNeedsOneUpstream() {
        let session = "    issuer: from_upstream\n    allowed_issuers: [https://auth.example.com]"
        let unused = configErrors(Self.yaml(session: session, routes: "  - { match: /, upstream: \"https://mcp.example.com\" }"))
        #expect(unused.contains { $0.hasPrefix("bearerd.yaml:2: sessions.mcp.issuer: from_upstream takes the authorization server from the upstream of the routes that use this session, and no route names session 'mcp'") }, "\(unused)")
        let two = configErrors(Self.yaml(session: session, routes: """
              - { match: /a/, upstream: "https://mcp.example.com/v1", session: mcp }
              - { match: /b/, upstream: "https://other.example.com", session: mcp }
            """))
        #expect(two.contains { $0.contains("sessions.mcp.issuer: from_upstream needs one upstream (the protected resource) with one tls:, but routes[0] (https://mcp.example.com/v1), routes[1] (https://other.example.com) use this session") }, "\(two)")
        let sameTwice = configErrors(Self.yaml(session: session, routes: """
              - { match: /a/, upstream: "https://mcp.example.com/v1", session: mcp }
              - { match: /b/, upstream: "https://mcp.example.com/v1", session: mcp, strip_prefix: true }
            """))
        #expect(sameTwice.isEmpty, "\(sameTwice)")
    }
}
