import Testing
@testable import BearerdConfig
import BearerdOAuth
import BearerdSessions

/// docs/architecture.md §5: authorization server endpoints are used exactly as configured or published (path,
/// trailing slash and query byte for byte); only a route's upstream base path is normalised.
@Suite("Endpoint URLs")
struct EndpointURLTests {
    @Test func pathTrailingSlashAndQueryAreKept() throws {
        let u = try EndpointURL.parse("http://127.0.0.1:8000/o/authorize/").get()
        #expect(u.text == "http://127.0.0.1:8000/o/authorize/")
        #expect(u.description == "http://127.0.0.1:8000/o/authorize/")
        #expect(u.path == "/o/authorize/")
        #expect(u.requestTarget == "/o/authorize/")
        #expect(u.authority == "127.0.0.1:8000")

        let q = try EndpointURL.parse("https://login.example.com/tenant/token/?api-version=2.0&x=%2F").get()
        #expect(q.requestTarget == "/tenant/token/?api-version=2.0&x=%2F")
        #expect(q.port == 443 && q.isTLS && q.host == "login.example.com")
        #expect(q.text == "https://login.example.com/tenant/token/?api-version=2.0&x=%2F")

        // No path at all: requests go to `/`, the text stays as written.
        let bare = try EndpointURL.parse("http://[::1]:9000").get()
        #expect(bare.requestTarget == "/" && bare.text == "http://[::1]:9000" && bare.host == "::1")
        // An explicit default port stays in the text (it is the client assertion's `aud`).
        #expect(try EndpointURL.parse("https://a.example:443/token").get().text == "https://a.example:443/token")
    }

    @Test func badEndpointsAreRefused() {
        for bad in ["ftp://a/token", "http://a/tok en", "http://u:p@a/token", "http://a/token#x", "http:///token", "http://a/t?q=a b"] {
            guard case .failure = EndpointURL.parse(bad) else {
                Issue.record("accepted \(bad)")
                continue
            }
        }
        guard case .failure = EndpointURL.parse("https://issuer.example/?x=1", allowQuery: false) else {
            Issue.record("accepted an issuer with a query")
            return
        }
    }

    @Test func upstreamBasePathsAreStillNormalised() throws {
        #expect(try ConfigValues.url("http://a/v2/").basePath == "/v2")
    }

    @Test func configuredTokenURLKeepsItsSlash() throws {
        let config = try ConfigLoader.parse(yaml: """
            sessions:
              s:
                grant: client_credentials
                token_url: https://auth.example.com/o/token/?tenant=t
                client_id: c
                client_auth: none
            routes:
              - match: /
                upstream: http://127.0.0.1:9000/
                session: s
            """, file: "t.yaml", environment: [:], checkFiles: false)
        let s = try #require(config.session(named: "s"))
        #expect(s.tokenURL.text == "https://auth.example.com/o/token/?tenant=t")
        #expect(s.tokenURL.requestTarget == "/o/token/?tenant=t")
    }

    /// The authorization request's parameters go after the endpoint as published: `?` when it has
    /// no query, `&` after a query of its own (RFC 6749 §3.1: its query component is kept).
    @Test(arguments: [
        ("http://127.0.0.1:8000/o/authorize/", "http://127.0.0.1:8000/o/authorize/?response_type=code&"),
        ("https://idp.example/authorize?tenant=t", "https://idp.example/authorize?tenant=t&response_type=code&"),
        ("https://idp.example/authorize?", "https://idp.example/authorize?response_type=code&"),
    ])
    func authorizationURLKeepsTheEndpoint(endpoint: String, prefix: String) throws {
        var session = SessionConfig(name: "me", grant: .authorizationCode,
                                    tokenURL: try EndpointURL.parse("https://idp.example/token/").get(), clientID: "cli", clientAuth: .none)
        session.authorizationEndpoint = try EndpointURL.parse(endpoint).get()
        let config = BearerdConfig(file: "t.yaml", listen: [], stateDir: "/nonexistent", sessions: [session])
        let signIn = try SignIn(config: config, session: session, environment: [:])
        let url = try #require(signIn.authorizationURL(redirectURI: "http://127.0.0.1:1/callback", state: "s",
                                                       pkce: PKCE(random: Array(repeating: 7, count: 32))))
        #expect(url.hasPrefix(prefix), "\(url)")
    }
}
