import Foundation
import Testing
@testable import BearerdConfig

/// Route `http2:` and listener `tls:` (docs/architecture.md §4).
@Suite("Config: http2 and listener tls")
struct ConfigHTTP2Tests {
    @Test func http2DefaultsToAutoAndTakesEachValue() throws {
        #expect(try parseConfig(minimalRoute).routes[0].http2 == .auto)
        for (raw, mode) in [("auto", HTTP2Mode.auto), ("prior_knowledge", .priorKnowledge), ("off", .off)] {
            let c = try parseConfig("routes:\n  - match: /\n    upstream: http://127.0.0.1:9000\n    http2: \(raw)\n")
            #expect(c.routes[0].http2 == mode)
        }
    }

    @Test func aWrongHTTP2ValueSaysWhereAndWhat() {
        let errors = configErrors("routes:\n  - match: /\n    upstream: http://127.0.0.1:9000\n    http2: yes\n")
        #expect(errors.count == 1)
        #expect(errors.first?.hasPrefix("bearerd.yaml:4: routes[0].http2:") == true)
        #expect(errors.first?.contains("prior_knowledge") == true)
        let close = configErrors("routes:\n  - match: /\n    upstream: http://127.0.0.1:9000\n    http2: prior-knowledge\n")
        #expect(close.first?.contains("prior_knowledge") == true)
    }

    @Test func listenerTLS() throws {
        let dir = try TemporaryDirectory()
        let cert = dir.path + "/l.pem", key = dir.path + "/l.key"
        FileManager.default.createFile(atPath: cert, contents: Data("x".utf8))
        FileManager.default.createFile(atPath: key, contents: Data("x".utf8))
        let c = try parseConfig("listen:\n  - address: 127.0.0.1:8443\n    tls: {cert: \(cert), key: \(key)}\n" + minimalRoute, checkFiles: true)
        #expect(c.listeners[0].tls == ListenerTLS(cert: cert, key: key))
        #expect(try parseConfig("listen: [127.0.0.1:8080]\n" + minimalRoute).listeners[0].tls == nil)

        let missingKey = configErrors("listen:\n  - address: 127.0.0.1:8443\n    tls: {cert: \(cert)}\n" + minimalRoute)
        #expect(missingKey.contains { $0.hasPrefix("bearerd.yaml:3: listen[0].tls.key:") })
        let unknown = configErrors("listen:\n  - address: 127.0.0.1:8443\n    tls: {cert: \(cert), key: \(key), ca_file: x}\n" + minimalRoute)
        #expect(unknown.contains { $0.contains("listen[0].tls.ca_file") })
        let onUnix = configErrors("listen:\n  - unix: /run/b.sock\n    tls: {cert: \(cert), key: \(key)}\n" + minimalRoute)
        #expect(onUnix.contains { $0.contains("listen[0].tls: applies to TCP listeners only") })
        let absent = configErrors("listen:\n  - address: 127.0.0.1:8443\n    tls: {cert: \(dir.path)/nope.pem, key: \(key)}\n" + minimalRoute, checkFiles: true)
        #expect(absent.contains { $0.contains("listen[0].tls.cert") && $0.contains("nope.pem") })
    }
}

/// Route `inject:` (docs/architecture.md §4).
@Suite("Config: inject")
struct ConfigInjectTests {
    let base = """
        sessions:
          s: { grant: client_credentials, token_url: "http://127.0.0.1:1/t", client_id: c, client_secret: x }
        routes:
          - match: /
            upstream: http://127.0.0.1:9000
            session: s

        """

    @Test func defaultIsAuthorizationBearer() throws {
        #expect(try parseConfig(base).routes[0].inject == .bearer)
    }

    @Test func customHeaderAndFormat() throws {
        let c = try parseConfig(base + "    inject: { header: X-Api-Key, format: \"{token}\" }\n")
        #expect(c.routes[0].inject == InjectConfig(header: "X-Api-Key", prefix: "", suffix: ""))
        #expect(c.routes[0].inject.value("t1") == "t1")
        let bare = try parseConfig(base + "    inject: { header: X-Partner-Key }\n")
        #expect(bare.routes[0].inject == InjectConfig(header: "X-Partner-Key", prefix: "", suffix: ""))
        let wrapped = try parseConfig(base + "    inject: { format: \"Token token={token}; v=2\" }\n")
        #expect(wrapped.routes[0].inject == InjectConfig(header: "Authorization", prefix: "Token token=", suffix: "; v=2"))
    }

    @Test func badInjectSettingsSayWhatIsWrong() {
        let noToken = configErrors(base + "    inject: { header: X-Api-Key, format: \"static\" }\n")
        #expect(noToken.contains { $0.hasPrefix("bearerd.yaml:7: routes[0].inject.format: must contain {token} exactly once") })
        let twice = configErrors(base + "    inject: { format: \"{token}{token}\" }\n")
        #expect(twice.contains { $0.contains("routes[0].inject.format: must contain {token} exactly once") })
        let badName = configErrors(base + "    inject: { header: \"X Api\" }\n")
        #expect(badName.contains { $0.contains("routes[0].inject.header: \"X Api\" is not a header name") })
        let reserved = configErrors(base + "    inject: { header: Host }\n")
        #expect(reserved.contains { $0.contains("routes[0].inject.header: Host is set by bearerd itself") })
        let unknown = configErrors(base + "    inject: { header: X-Key, prefix: a }\n")
        #expect(unknown.contains { $0.contains("routes[0].inject.prefix") })
        let noSession = configErrors("routes:\n  - match: /\n    upstream: http://127.0.0.1:9000\n    inject: { header: X-Key }\n")
        #expect(noSession.contains { $0.contains("routes[0].inject: inject needs a session") })
    }
}

/// `grant: exec` (docs/architecture.md §4).
@Suite("Config: grant exec")
struct ConfigExecTests {
    @Test func commandAndTimeout() throws {
        let c = try parseConfig("""
            sessions:
              sts:
                grant: exec
                command: [/bin/sh, -c, "echo {}"]
                timeout: 3s
            """ + "\n" + minimalRoute, checkFiles: true)
        let s = try #require(c.session(named: "sts"))
        #expect(s.grant == .exec)
        #expect(s.command == ["/bin/sh", "-c", "echo {}"])
        #expect(s.commandTimeout == .seconds(3))
        #expect(try parseConfig("sessions:\n  sts: { grant: exec, command: [true] }\n" + minimalRoute, checkFiles: true)
            .session(named: "sts")?.commandTimeout == .seconds(10))
    }

    @Test func mistakesAreNamed() {
        let missing = configErrors("sessions:\n  sts: { grant: exec }\n" + minimalRoute)
        #expect(missing.contains { $0.contains("sessions.sts.command: missing") })
        let shell = configErrors("sessions:\n  sts: { grant: exec, command: \"get-token --a\" }\n" + minimalRoute)
        #expect(shell.contains { $0.contains("sessions.sts.command: expected a list") && $0.contains("no shell") })
        let notThere = configErrors("sessions:\n  sts: { grant: exec, command: [/nonexistent/get-token] }\n" + minimalRoute, checkFiles: true)
        #expect(notThere.contains { $0.contains("/nonexistent/get-token is not an executable file") })
        let notInPath = configErrors("sessions:\n  sts: { grant: exec, command: [no-such-helper-xyz] }\n" + minimalRoute, checkFiles: true)
        #expect(notInPath.contains { $0.contains("no-such-helper-xyz is not found in PATH") })
        let tokenURL = configErrors("sessions:\n  sts: { grant: exec, command: [true], token_url: \"https://a/t\" }\n" + minimalRoute)
        #expect(tokenURL.contains { $0.contains("sessions.sts.token_url: not used with grant exec") })
        let onOther = configErrors("sessions:\n  s: { grant: client_credentials, token_url: \"https://a/t\", client_id: c, client_secret: x, command: [true] }\n" + minimalRoute)
        #expect(onOther.contains { $0.contains("sessions.s.command: only used with grant exec") })
    }
}

/// `issuer:` and the person grants (docs/architecture.md §4).
@Suite("Config: issuer and sign-in grants")
struct ConfigIssuerTests {
    @Test func issuerInsteadOfTokenURL() throws {
        let c = try parseConfig("""
            state_dir: /tmp/bearerd-state
            sessions:
              person: { grant: authorization_code, issuer: "https://auth.example.com", client_id: cli, client_auth: none, scope: openid offline_access }
              cc: { grant: client_credentials, issuer: "https://auth.example.com/tenant", client_id: svc, client_secret: x }
            """ + "\n" + minimalRoute)
        let p = try #require(c.session(named: "person"))
        #expect(p.grant == .authorizationCode && p.grant.isPersonal && p.grant.usesRefreshToken)
        #expect(p.issuer?.description == "https://auth.example.com")
        #expect(p.tokenURL == .discoveryPlaceholder)
        #expect(c.session(named: "cc")?.issuer?.description == "https://auth.example.com/tenant")
    }

    @Test func mistakesAreNamed() {
        let both = configErrors("sessions:\n  s: { grant: client_credentials, token_url: \"https://a/t\", issuer: \"https://a\", client_id: c, client_secret: x }\n" + minimalRoute)
        #expect(both.contains { $0.contains("sessions.s.issuer: give either token_url or issuer") })
        let neither = configErrors("sessions:\n  s: { grant: client_credentials, client_id: c, client_secret: x }\n" + minimalRoute)
        #expect(neither.contains { $0.contains("sessions.s.token_url: missing") && $0.contains("issuer") })
        let personNoIssuer = configErrors("state_dir: /tmp/x\nsessions:\n  p: { grant: device_code, token_url: \"https://a/t\", client_id: c, client_auth: none }\n" + minimalRoute)
        #expect(personNoIssuer.contains { $0.contains("sessions.p.device_authorization_url: missing: grant device_code needs device_authorization_url: (with token_url:), or issuer:") })
        let noState = configErrors("sessions:\n  p: { grant: authorization_code, issuer: \"https://a\", client_id: c, client_auth: none }\n" + minimalRoute)
        #expect(noState.contains { $0.contains("state_dir: missing: session 'p'") })
        let query = configErrors("sessions:\n  s: { grant: client_credentials, issuer: \"https://a/?x=1\", client_id: c, client_secret: x }\n" + minimalRoute)
        #expect(query.contains { $0.contains("sessions.s.issuer") })
    }
}

/// `client_auth: private_key_jwt` and `tls_client_auth` (docs/architecture.md §4).
@Suite("Config: client authentication without a shared secret")
struct ConfigClientKeyTests {
    @Test func privateKeyJWTNeedsAKeyAndNoSecret() throws {
        let dir = try TemporaryDirectory()
        let key = dir.path + "/k.pem"
        FileManager.default.createFile(atPath: key, contents: Data("x".utf8))
        let c = try parseConfig("sessions:\n  wl: { grant: client_credentials, token_url: \"https://a/t\", client_id: w, client_auth: private_key_jwt, client_key_file: \(key), client_key_id: k1 }\n" + minimalRoute, checkFiles: true)
        #expect(c.session(named: "wl")?.clientAuth == .privateKeyJWT)
        #expect(c.session(named: "wl")?.clientKeyFile == key)
        #expect(c.session(named: "wl")?.clientKeyID == "k1")
        let noKey = configErrors("sessions:\n  wl: { grant: client_credentials, token_url: \"https://a/t\", client_id: w, client_auth: private_key_jwt }\n" + minimalRoute)
        #expect(noKey.contains { $0.contains("sessions.wl.client_key_file: missing") })
        let withSecret = configErrors("sessions:\n  wl: { grant: client_credentials, token_url: \"https://a/t\", client_id: w, client_auth: private_key_jwt, client_key_file: \(key), client_secret: s }\n" + minimalRoute)
        #expect(withSecret.contains { $0.contains("sessions.wl.client_secret: client_auth is private_key_jwt, so no client secret is sent") })
        let keyElsewhere = configErrors("sessions:\n  s: { grant: client_credentials, token_url: \"https://a/t\", client_id: w, client_secret: x, client_key_file: \(key) }\n" + minimalRoute)
        #expect(keyElsewhere.contains { $0.contains("sessions.s.client_key_file: only used with client_auth private_key_jwt") })
    }

    @Test func tlsClientAuthNeedsACertificate() {
        let missing = configErrors("sessions:\n  m: { grant: client_credentials, token_url: \"https://a/t\", client_id: w, client_auth: tls_client_auth }\n" + minimalRoute)
        #expect(missing.contains { $0.contains("sessions.m.tls: missing: tls_client_auth authenticates with tls: {client_cert, client_key}") })
        let ok = configErrors("sessions:\n  m: { grant: client_credentials, token_url: \"https://a/t\", client_id: w, client_auth: tls_client_auth, tls: { client_cert: /c.pem, client_key: /k.pem } }\n" + minimalRoute)
        #expect(ok.isEmpty, "\(ok)")
    }
}

/// `outbound_proxy:` (docs/architecture.md §4): parsing and curl's environment rules.
@Suite("Config: outbound_proxy")
struct OutboundProxyConfigTests {
    @Test func urlEnvAndNone() throws {
        #expect(try parseConfig(minimalRoute).outboundProxy == .direct)
        #expect(try parseConfig("outbound_proxy: none\n" + minimalRoute).outboundProxy == .direct)
        let u = try parseConfig("outbound_proxy: http://user:p%40ss@proxy.internal:3128\n" + minimalRoute).outboundProxy
        #expect(u.https == OutboundProxy.Endpoint(host: "proxy.internal", port: 3128, credentials: "user:p@ss"))
        #expect(u.http == u.https)
        #expect(u.https?.description == "http://proxy.internal:3128")
        let e = try parseConfig("outbound_proxy: env\n" + minimalRoute,
                                environment: ["HTTPS_PROXY": "http://a:8080", "http_proxy": "b", "HTTP_PROXY": "ignored:1", "no_proxy": " .internal, localhost:8443 ,*.svc"]).outboundProxy
        #expect(e.https == OutboundProxy.Endpoint(host: "a", port: 8080))
        #expect(e.http == OutboundProxy.Endpoint(host: "b", port: 1080))
        #expect(e.noProxy == [".internal", "localhost:8443", "*.svc"])
        let onlyUpper = try parseConfig("outbound_proxy: env\n" + minimalRoute, environment: ["HTTP_PROXY": "http://x:1"]).outboundProxy
        #expect(onlyUpper.http == nil)  // as curl: upper-case HTTP_PROXY is not read
    }

    @Test func noProxyRules() {
        let p = OutboundProxy(https: .init(host: "p", port: 1), http: .init(host: "p", port: 1), noProxy: [".internal", "localhost:8443", "*.svc", "10.0.0.1"])
        #expect(p.endpoint(scheme: "https", host: "api.example.com", port: 443) != nil)
        #expect(p.endpoint(scheme: "https", host: "auth.internal", port: 443) == nil)
        #expect(p.endpoint(scheme: "https", host: "internal", port: 443) == nil)
        #expect(p.endpoint(scheme: "https", host: "xinternal", port: 443) != nil)
        #expect(p.endpoint(scheme: "https", host: "localhost", port: 8443) == nil)
        #expect(p.endpoint(scheme: "https", host: "localhost", port: 443) != nil)
        #expect(p.endpoint(scheme: "http", host: "db.svc", port: 80) == nil)
        #expect(p.endpoint(scheme: "http", host: "10.0.0.1", port: 80) == nil)
        #expect(OutboundProxy(https: .init(host: "p", port: 1), noProxy: ["*"]).endpoint(scheme: "https", host: "a", port: 1) == nil)
        #expect(OutboundProxy(https: .init(host: "p", port: 1)).endpoint(scheme: "http", host: "a", port: 1) == nil)
    }

    @Test func badValuesAreNamed() {
        let socks = configErrors("outbound_proxy: socks5://p:1080\n" + minimalRoute)
        #expect(socks.contains { $0.contains("bearerd.yaml:1: outbound_proxy:") && $0.contains("only http:// proxies") })
        let port = configErrors("outbound_proxy: http://p:0\n" + minimalRoute)
        #expect(port.contains { $0.contains("outbound_proxy:") && $0.contains("invalid proxy port") })
        let env = configErrors("outbound_proxy: env\n" + minimalRoute, environment: ["HTTPS_PROXY": "https://p:1"])
        #expect(env.contains { $0.contains("outbound_proxy: the proxy in the environment") })
    }
}
