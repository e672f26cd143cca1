import BearerdHTTP
import Foundation
import Testing
import BearerdTLS
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdSessions

/// Messages of a configuration that must fail, as `FILE:LINE: key: what is wrong` lines.
func configErrors(_ yaml: String, environment: [String: String] = [:], checkFiles: Bool = false,
                  file: String = "bearerd.yaml") -> [String] {
    do throws(ConfigErrors) {
        _ = try ConfigLoader.parse(yaml: yaml, file: file, environment: environment, checkFiles: checkFiles)
        return []
    } catch {
        return error.errors.map(\.description)
    }
}

func parseConfig(_ yaml: String, environment: [String: String] = [:], checkFiles: Bool = false,
                 file: String = "bearerd.yaml") throws -> BearerdConfig {
    try ConfigLoader.parse(yaml: yaml, file: file, environment: environment, checkFiles: checkFiles)
}

/// A scratch directory removed when the value goes away.
final class TemporaryDirectory {
    let path: String
    init() throws {
        path = NSTemporaryDirectory() + "bearerd-config-tests-" + UUID().uuidString
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    @discardableResult
    func write(_ name: String, _ contents: String) throws -> String {
        let file = path + "/" + name
        try contents.write(toFile: file, atomically: true, encoding: .utf8)
        return file
    }
    deinit { try? FileManager.default.removeItem(atPath: path) }
}

let minimalRoute = """
    routes:
      - match: /
        upstream: http://127.0.0.1:9000
    """

@Suite struct ConfigLoaderValidTests {
    @Test func fullConfigBuildsTheExpectedModel() throws {
        let yaml = """
            listen:
              - 127.0.0.1:8080
              - "[::1]:8081"
              - unix:/run/bearerd/api.sock
            admin: 127.0.0.1:9901
            state_dir: /var/lib/bearerd
            loops: 4
            limits:
              header_bytes: 32KiB
              request_target: 4096
              headers: 50
            timeouts:
              header_read: 5s
              idle: 2m
              shutdown_grace: 1500ms
            sessions:
              partner:
                grant: client_credentials
                token_url: https://auth.example.com/oauth2/token?tenant=x
                client_id: my-service
                client_secret_file: secrets/partner
                client_auth: client_secret_post
                scope: read write
                params:
                  audience: https://api.example.com
                  resource: "42"
                refresh_before: 60s
                default_lifetime: 1h
                tls:
                  ca_file: /etc/ssl/ca.pem
                request_timeout: 20s
                wait_timeout: 3s
              me:
                grant: refresh_token
                token_url: http://[::1]:8443/token
                client_id: cli
                client_auth: none
                refresh_token_file: /etc/bearerd/me.refresh
              legacy:
                grant: password
                token_url: https://auth.example.com/token
                client_id: app
                client_secret_env: APP_SECRET
                username: svc-user
                password: hunter2
            routes:
              - match: /partner/
                host: API.Internal
                strip_prefix: true
                upstream: https://api.example.com:8443/v2/
                session: partner
                tls:
                  ca_file: /etc/ssl/private-ca.pem
                  client_cert: /etc/bearerd/client.pem
                  client_key: /etc/bearerd/client.key
                timeouts: { connect: 2s, response: 30s, idle: 90s }
                replay_body_limit: 2MiB
                reject_statuses: [401, 403]
                replay_methods: [GET, HEAD]
              - match: /
                upstream: http://127.0.0.1:9000
                session: me
            """
        let config = try parseConfig(yaml, file: "/etc/bearerd/bearerd.yaml")
        #expect(config.file == "/etc/bearerd/bearerd.yaml")
        #expect(config.listen == [.tcp(host: "127.0.0.1", port: 8080), .tcp(host: "::1", port: 8081), .unix(path: "/run/bearerd/api.sock")])
        #expect(config.admin == .tcp(host: "127.0.0.1", port: 9901))
        #expect(config.stateDir == "/var/lib/bearerd")
        #expect(config.loops == 4)
        #expect(config.limits == HTTP1Limits(maxHeaderBytes: 32 * 1024, maxRequestTarget: 4096, maxHeaderCount: 50))
        #expect(config.frontendTimeouts.headerRead == .seconds(5))
        #expect(config.frontendTimeouts.idle == .seconds(120))
        #expect(config.frontendTimeouts.shutdownGrace == .milliseconds(1500))

        #expect(config.sessions.map(\.name) == ["partner", "me", "legacy"])
        let partner = try #require(config.session(named: "partner"))
        #expect(partner == SessionConfig(
            name: "partner", grant: .clientCredentials,
            tokenURL: EndpointURL(scheme: "https", host: "auth.example.com", port: 443, path: "/oauth2/token", query: "tenant=x"),
            clientID: "my-service", clientSecret: .file("/etc/bearerd/secrets/partner"), clientAuth: .clientSecretPost,
            scope: "read write", params: [("audience", "https://api.example.com"), ("resource", "42")],
            refreshBefore: .seconds(60), defaultLifetime: .seconds(3600), tls: TLSSettings(caFile: "/etc/ssl/ca.pem"),
            requestTimeout: .seconds(20), waitTimeout: .seconds(3)))
        #expect(partner.line == 17)
        let me = try #require(config.session(named: "me"))
        #expect(me.grant == .refreshToken)
        #expect(me.tokenURL == EndpointURL(scheme: "http", host: "::1", port: 8443, path: "/token"))
        #expect(me.clientAuth == .none)
        #expect(me.clientSecret == nil)
        #expect(me.refreshTokenFile == "/etc/bearerd/me.refresh")
        let legacy = try #require(config.session(named: "legacy"))
        #expect(legacy.grant == .password)
        #expect(legacy.clientSecret == .env("APP_SECRET"))
        #expect(legacy.username == "svc-user")
        #expect(legacy.password == .literal(Secret("hunter2")))

        #expect(config.routes.count == 2)
        let first = config.routes[0]
        var timeouts = RouteTimeouts()
        timeouts.connect = .seconds(2)
        timeouts.response = .seconds(30)
        timeouts.idle = .seconds(90)
        #expect(first == RouteConfig(
            match: "/partner/", host: "api.internal", stripPrefix: true,
            upstream: UpstreamURL(scheme: "https", host: "api.example.com", port: 8443, basePath: "/v2"),
            session: "partner",
            tls: TLSSettings(caFile: "/etc/ssl/private-ca.pem", clientCert: "/etc/bearerd/client.pem", clientKey: "/etc/bearerd/client.key"),
            timeouts: timeouts, replayBodyLimit: 2 << 20, rejectStatuses: [401, 403], replayMethods: .only(["GET", "HEAD"]),
            line: 47))
        #expect(config.routes[1].upstream.description == "http://127.0.0.1:9000")
        #expect(config.routes[1].session == "me")
    }

    @Test func defaultsAreApplied() throws {
        let config = try parseConfig("""
            sessions:
              partner:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: id
                client_secret: s3cret
            routes:
              - match: /
                upstream: https://api.example.com
                session: partner
            """)
        #expect(config.listen == [.tcp(host: "127.0.0.1", port: 8080)])
        #expect(config.admin == nil)
        #expect(config.stateDir == nil)
        #expect(config.loops == nil)
        #expect(config.limits == HTTP1Limits(maxHeaderBytes: 64 * 1024, maxRequestTarget: 8 * 1024, maxHeaderCount: 100))
        #expect(config.frontendTimeouts == FrontendTimeouts())
        #expect(config.frontendTimeouts.headerRead == .seconds(10))
        #expect(config.frontendTimeouts.idle == .seconds(60))
        #expect(config.frontendTimeouts.shutdownGrace == .seconds(10))

        let session = try #require(config.sessions.first)
        #expect(session.clientAuth == .clientSecretBasic)
        #expect(session.defaultLifetime == .seconds(300))
        #expect(session.refreshBefore == nil)
        #expect(session.requestTimeout == .seconds(15))
        #expect(session.waitTimeout == .seconds(10))
        #expect(session.params.isEmpty)
        #expect(session.tls == nil)

        let route = try #require(config.routes.first)
        #expect(route.stripPrefix == false)
        #expect(route.host == nil)
        #expect(route.tls == nil)
        #expect(route.upstream == UpstreamURL(scheme: "https", host: "api.example.com", port: 443, basePath: ""))
        #expect(route.timeouts.connect == .seconds(5))
        #expect(route.timeouts.response == .seconds(60))
        #expect(route.timeouts.idle == .seconds(60))
        #expect(route.replayBodyLimit == 1 << 20)
        #expect(route.rejectStatuses == [401])
        #expect(route.replayMethods == .all)
        #expect(route.line == 8)
    }

    @Test func listenAcceptsOneString() throws {
        let config = try parseConfig("listen: 127.0.0.2:80\n" + minimalRoute)
        #expect(config.listen == [.tcp(host: "127.0.0.2", port: 80)])
    }

    @Test func mergeKeysShareSettings() throws {
        let config = try parseConfig("""
            routes:
              - &base
                match: /a/
                upstream: https://api.example.com
                timeouts: { connect: 1s }
              - <<: *base
                match: /b/
            """)
        #expect(config.routes.map(\.match) == ["/a/", "/b/"])
        #expect(config.routes[1].timeouts.connect == .seconds(1))
        #expect(config.routes[1].upstream.host == "api.example.com")
    }

    @Test func relativePathsFollowTheConfigFile() throws {
        let dir = try TemporaryDirectory()
        try dir.write("partner.secret", "abc\n")
        let file = try dir.write("bearerd.yaml", """
            sessions:
              partner:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: id
                client_secret_file: partner.secret
            routes:
              - match: /
                upstream: https://api.example.com
                session: partner
            """)
        let config = try ConfigLoader.load(path: file, environment: [:], checkFiles: true)
        let session = try #require(config.sessions.first)
        #expect(session.clientSecret == .file(dir.path + "/partner.secret"))
        let secrets = try ConfigLoader.resolveSecrets(of: session, in: config, environment: [:])
        #expect(secrets.clientSecret == Secret("abc"))
        #expect(secrets.password == nil)
    }
}

@Suite struct ConfigLoaderErrorTests {
    @Test func unknownKeyWithSuggestion() {
        let errors = configErrors("""
            sessions:
              partner:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: id
                client_secret: x
                refresh_befor: 30s
            \(minimalRoute)
            """)
        #expect(errors == ["bearerd.yaml:7: sessions.partner.refresh_befor: unknown key (did you mean 'refresh_before'?)"])
    }

    @Test func unknownKeysEverywhere() {
        let errors = configErrors("""
            listn: 127.0.0.1:8080
            limits:
              header_byte: 1KiB
            routes:
              - match: /
                upstream: http://127.0.0.1:9000
                timeouts: { conect: 1s }
                client_id: x
                frobnicate: 1
            """)
        #expect(errors == [
            "bearerd.yaml:1: listn: unknown key (did you mean 'listen'?)",
            "bearerd.yaml:3: limits.header_byte: unknown key (did you mean 'header_bytes'?)",
            "bearerd.yaml:7: routes[0].timeouts.conect: unknown key (did you mean 'connect'?)",
            "bearerd.yaml:8: routes[0].client_id: unknown key ('client_id' belongs in a session under sessions:, which the route names with session:)",
            "bearerd.yaml:9: routes[0].frobnicate: unknown key (expected one of: match, host, strip_prefix, upstream, session, tls, timeouts, replay_body_limit, reject_statuses, replay_methods, http2, inject, sign, caller_jwt)",
        ])
    }

    @Test func wrongTypesSayWhatWasExpected() {
        let errors = configErrors("""
            limits: [1, 2]
            timeouts: 10s
            sessions:
              - partner
            routes:
              match: /
            """)
        #expect(errors == [
            "bearerd.yaml:1: limits: expected a mapping (header_bytes, request_target, headers), got a list",
            "bearerd.yaml:2: timeouts: expected a mapping (header_read, idle, shutdown_grace), got \"10s\"",
            "bearerd.yaml:4: sessions: expected a mapping of session names to sessions, got a list",
            "bearerd.yaml:6: routes: expected a list of routes (each starting with '- match:'), got a mapping",
        ])
        #expect(configErrors("- a\n- b\n") == [
            "bearerd.yaml:1: (document): expected a mapping of settings (listen, sessions, routes, …), got a list",
        ])
        #expect(configErrors("loops: four\n" + minimalRoute) == ["bearerd.yaml:1: loops: expected a whole number, got \"four\""])
        #expect(configErrors("loops: 0\n" + minimalRoute) == ["bearerd.yaml:1: loops: must be 1–1024, got 0"])
        #expect(configErrors("""
            routes:
              - match: /
                upstream: http://127.0.0.1:9000
                strip_prefix: yes
                session:
            """) == [
                "bearerd.yaml:4: routes[0].strip_prefix: expected true or false, got \"yes\"",
                "bearerd.yaml:5: routes[0].session: expected the name of a session, got an empty value",
            ])
    }

    @Test func badDurations() {
        func durationError(_ value: String) -> [String] {
            configErrors("timeouts:\n  idle: \(value)\n" + minimalRoute)
        }
        #expect(durationError("60") == ["bearerd.yaml:2: timeouts.idle: missing unit in \"60\": write 60s for seconds (units: ms, s, m, h)"])
        #expect(durationError("5 minutes") == ["bearerd.yaml:2: timeouts.idle: unknown unit ' minutes' in \"5 minutes\" (use ms, s, m or h)"])
        #expect(durationError("1.5s") == ["bearerd.yaml:2: timeouts.idle: expected a whole number with a unit, got \"1.5s\" (write 1500ms rather than 1.5s)"])
        #expect(durationError("0s") == ["bearerd.yaml:2: timeouts.idle: must be greater than zero, got \"0s\""])
        #expect(durationError("-5s") == ["bearerd.yaml:2: timeouts.idle: must be positive, got \"-5s\""])
        #expect(durationError("soon") == ["bearerd.yaml:2: timeouts.idle: expected a duration such as 500ms, 30s, 5m or 1h, got \"soon\""])
        #expect(durationError("3000000h") == ["bearerd.yaml:2: timeouts.idle: must be at most 24h, got \"3000000h\""])
        #expect(durationError("99999999999999999999999ms") == ["bearerd.yaml:2: timeouts.idle: must be at most 24h, got \"99999999999999999999999ms\""])
    }

    /// docs/architecture.md §2.7: values `check` used to accept wrapped to negative nanoseconds at run time.
    /// Every duration key refuses what is above its maximum, at the value's line.
    @Test(arguments: ["307445734m", "3000000h", "1441m", "86400001ms", "9223372036854775807h", "99999999999999999999999s"])
    func everyDurationKeyRefusesHugeValues(value: String) {
        let yaml = """
            shutdown_grace: \(value)
            startup_timeout: \(value)
            timeouts:
              header_read: \(value)
              idle: \(value)
            sessions:
              partner:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: svc
                client_auth: none
                refresh_before: 8761h
                default_lifetime: 99999999999999999999999h
                request_timeout: \(value)
                wait_timeout: \(value)
            routes:
              - match: /
                upstream: http://127.0.0.1:9000
                session: partner
                timeouts: { connect: \(value), response: \(value), idle: \(value) }
            """
        let errors = configErrors(yaml)
        let timeout = "must be at most 24h, got \"\(value)\""
        let lifetime = "must be at most 8760h, got"
        #expect(errors.count == 11)
        for (line, key) in [(1, "shutdown_grace"), (2, "startup_timeout"), (4, "timeouts.header_read"), (5, "timeouts.idle"),
                            (14, "sessions.partner.request_timeout"), (15, "sessions.partner.wait_timeout"),
                            (20, "routes[0].timeouts.connect"), (20, "routes[0].timeouts.response"), (20, "routes[0].timeouts.idle")] {
            #expect(errors.contains("bearerd.yaml:\(line): \(key): \(timeout)"), "\(key)")
        }
        #expect(errors.contains("bearerd.yaml:12: sessions.partner.refresh_before: \(lifetime) \"8761h\""))
        #expect(errors.contains("bearerd.yaml:13: sessions.partner.default_lifetime: \(lifetime) \"99999999999999999999999h\""))
    }

    @Test func durationsAtTheirMaximumAreAccepted() throws {
        let config = try parseConfig("""
            shutdown_grace: 24h
            timeouts:
              header_read: 86400000ms
              idle: 1440m
            sessions:
              partner:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: svc
                client_auth: none
                refresh_before: 8760h
                default_lifetime: 31536000s
                request_timeout: 86400s
            routes:
              - match: /
                upstream: http://127.0.0.1:9000
                session: partner
                timeouts: { connect: 24h }
            """)
        #expect(config.frontendTimeouts.shutdownGrace == .seconds(86_400))
        #expect(config.frontendTimeouts.headerRead == .seconds(86_400))
        #expect(config.frontendTimeouts.idle == .seconds(86_400))
        #expect(config.sessions.first?.refreshBefore == .seconds(31_536_000))
        #expect(config.sessions.first?.defaultLifetime == .seconds(31_536_000))
        #expect(config.sessions.first?.requestTimeout == .seconds(86_400))
        #expect(config.routes.first?.timeouts.connect == .seconds(86_400))
    }

    @Test func badSizes() {
        func sizeError(_ value: String) -> [String] {
            configErrors("""
                routes:
                  - match: /
                    upstream: http://127.0.0.1:9000
                    replay_body_limit: \(value)
                """)
        }
        #expect(sizeError("1MB") == ["bearerd.yaml:4: routes[0].replay_body_limit: unknown unit 'MB' in \"1MB\" (use B, KiB, MiB or GiB; did you mean 1MiB?)"])
        #expect(sizeError("big") == ["bearerd.yaml:4: routes[0].replay_body_limit: expected a size such as 65536, 64KiB or 1MiB, got \"big\""])
        #expect(sizeError("1.5MiB") == ["bearerd.yaml:4: routes[0].replay_body_limit: expected a whole number, got \"1.5MiB\" (write 1536KiB rather than 1.5MiB)"])
        #expect(sizeError("[1]") == ["bearerd.yaml:4: routes[0].replay_body_limit: expected a size such as 65536, 64KiB or 1MiB, got a list"])
        #expect(configErrors("limits:\n  header_bytes: 100\n" + minimalRoute) == ["bearerd.yaml:2: limits.header_bytes: must be at least 1024 bytes, got 100"])
        #expect(sizeError("99999999999999999999GiB") == ["bearerd.yaml:4: routes[0].replay_body_limit: must be at most 1GiB, got \"99999999999999999999GiB\""])
        #expect(sizeError("2GiB") == ["bearerd.yaml:4: routes[0].replay_body_limit: must be at most 1GiB, got \"2GiB\""])
        #expect(sizeError("9223372036854775807KiB") == ["bearerd.yaml:4: routes[0].replay_body_limit: must be at most 1GiB, got \"9223372036854775807KiB\""])
        #expect(configErrors("limits:\n  header_bytes: 17MiB\n" + minimalRoute) == ["bearerd.yaml:2: limits.header_bytes: must be at most 16MiB, got \"17MiB\""])
        #expect(configErrors("limits:\n  request_target: 99999999999999999999\n" + minimalRoute)
                == ["bearerd.yaml:2: limits.request_target: must be at most 16MiB, got \"99999999999999999999\""])
        #expect(configErrors("limits:\n  header_bytes: 16MiB\n" + minimalRoute) == [])
        #expect(sizeError("1GiB") == [])
    }

    @Test func badURLs() {
        func upstreamError(_ value: String) -> [String] {
            configErrors("""
                routes:
                  - match: /
                    upstream: \(value)
                """)
        }
        #expect(upstreamError("ftp://x") == ["bearerd.yaml:3: routes[0].upstream: expected an http:// or https:// URL, got \"ftp://x\""])
        #expect(upstreamError("api.example.com") == ["bearerd.yaml:3: routes[0].upstream: expected an http:// or https:// URL, got \"api.example.com\""])
        #expect(upstreamError("https://api.example.com/v1?key=abc") == ["bearerd.yaml:3: routes[0].upstream: an upstream URL must not have a query (the client's query is forwarded as is)"])
        #expect(upstreamError("https://api.example.com/#top") == ["bearerd.yaml:3: routes[0].upstream: a URL here must not have a fragment (\"#top\")"])
        #expect(upstreamError("https://user:pa55@api.example.com") == ["bearerd.yaml:3: routes[0].upstream: a URL here must not contain user info (user:password@); credentials belong in a session"])
        #expect(upstreamError("http://api.example.com:99999") == ["bearerd.yaml:3: routes[0].upstream: port must be 1–65535, got 99999"])
        #expect(upstreamError("http://::1:80") == ["bearerd.yaml:3: routes[0].upstream: put an IPv6 address in brackets, e.g. http://[::1]:8080, got \"http://::1:80\""])
        #expect(upstreamError("http://") == ["bearerd.yaml:3: routes[0].upstream: missing host in \"http://\""])
    }

    @Test func badAddresses() {
        #expect(configErrors("listen: 8080\n" + minimalRoute) == ["bearerd.yaml:1: listen: missing host in \"8080\": write 127.0.0.1:8080 (or 0.0.0.0:8080 for every interface)"])
        #expect(configErrors("listen: [localhost]\n" + minimalRoute) == ["bearerd.yaml:1: listen[0]: missing port in \"localhost\" (expected host:port, [v6]:port or unix:/absolute/path)"])
        #expect(configErrors("listen:\n  - 127.0.0.1:0\n  - unix:run/x.sock\n" + minimalRoute) == [
            "bearerd.yaml:2: listen[0]: port must be 1–65535, got 0",
            "bearerd.yaml:3: listen[1]: a Unix socket path must be absolute, got \"unix:run/x.sock\"",
        ])
        #expect(configErrors("admin: ::1:9901\n" + minimalRoute) == ["bearerd.yaml:1: admin: put an IPv6 address in brackets, e.g. \"[::1]:8080\", got \"::1:9901\""])
        #expect(configErrors("listen:\n  - [::1]:8080\n" + minimalRoute) == [
            "bearerd.yaml:2: yaml: did not find expected node content while parsing a flow node; quote IPv6 addresses: \"[::1]:8080\"",
        ])
        #expect(configErrors("admin: [127.0.0.1:9901]\n" + minimalRoute) == [
            "bearerd.yaml:1: admin: expected an address such as 127.0.0.1:8080, \"[::1]:8080\" or unix:/run/bearerd.sock, got a list (quote IPv6 addresses: \"[::1]:8080\")",
        ])
        #expect(configErrors("listen: [localhost:1, localhost:1]\nadmin: localhost:1\n" + minimalRoute) == [
            "bearerd.yaml:1: listen[1]: localhost:1 is listed twice",
            "bearerd.yaml:2: admin: localhost:1 is also a listen address; the admin endpoints need their own",
        ])
    }

    @Test func missingRequiredKeys() {
        let errors = configErrors("""
            sessions:
              partner:
                client_secret: x
            routes:
              - session: partner
            """)
        #expect(errors == [
            "bearerd.yaml:2: sessions.partner.grant: missing required key (client_credentials, refresh_token, password, exec, authorization_code, device_code, jwt_bearer, token_exchange, aws or aliyun)",
            "bearerd.yaml:2: sessions.partner.token_url: missing required key (the token endpoint, e.g. https://auth.example.com/oauth2/token, or issuer: for discovery)",
            "bearerd.yaml:2: sessions.partner.client_id: missing required key",
            "bearerd.yaml:5: routes[0].match: missing required key (a path prefix such as / or /api/)",
            "bearerd.yaml:5: routes[0].upstream: missing required key (where requests go, e.g. https://api.example.com)",
        ])
        #expect(configErrors("listen: 127.0.0.1:8080\n") == [
            "bearerd.yaml:1: routes: missing required key (a list of routes, e.g. '- match: /' with 'upstream: http://127.0.0.1:9000')",
        ])
        #expect(configErrors("routes: []\n") == ["bearerd.yaml:1: routes: expected at least one route"])
    }

    @Test func routeNamingAnUnknownSession() {
        let errors = configErrors("""
            sessions:
              partner:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: id
                client_secret: x
            routes:
              - match: /a/
                upstream: http://127.0.0.1:9000
                session: parnter
              - match: /b/
                upstream: http://127.0.0.1:9000
                session: billing
            """)
        #expect(errors == [
            "bearerd.yaml:10: routes[0].session: no session named 'parnter' (did you mean 'partner'?)",
            "bearerd.yaml:13: routes[1].session: no session named 'billing' (defined: partner)",
        ])
    }

    @Test func secretFileMissingWithCheckFiles() throws {
        let dir = try TemporaryDirectory()
        let yaml = """
            sessions:
              partner:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: id
                client_secret_file: \(dir.path)/missing
            \(minimalRoute)
            """
        #expect(configErrors(yaml, checkFiles: true) == [
            "bearerd.yaml:6: sessions.partner.client_secret_file: cannot read \(dir.path)/missing: No such file or directory",
        ])
        #expect(configErrors(yaml, checkFiles: false).isEmpty)
        try dir.write("missing", "\n")
        #expect(configErrors(yaml, checkFiles: true) == ["bearerd.yaml:6: sessions.partner.client_secret_file: \(dir.path)/missing is empty"])
        try FileManager.default.removeItem(atPath: dir.path + "/missing")
        try FileManager.default.createDirectory(atPath: dir.path + "/missing", withIntermediateDirectories: false)
        #expect(configErrors(yaml, checkFiles: true) == ["bearerd.yaml:6: sessions.partner.client_secret_file: cannot read \(dir.path)/missing: is a directory"])
    }

    @Test func otherFilesAreCheckedToo() throws {
        let dir = try TemporaryDirectory()
        try dir.write("ca.pem", "-----BEGIN CERTIFICATE-----\n")
        let errors = configErrors("""
            state_dir: \(dir.path)/ca.pem
            sessions:
              me:
                grant: refresh_token
                token_url: https://auth.example.com/token
                client_id: cli
                client_auth: none
                refresh_token_file: \(dir.path)/me.refresh
            routes:
              - match: /
                upstream: https://api.example.com
                session: me
                tls:
                  ca_file: ca.pem
                  client_cert: client.pem
                  client_key: client.key
            """, checkFiles: true, file: dir.path + "/bearerd.yaml")
        #expect(errors == [
            "\(dir.path)/bearerd.yaml:1: state_dir: \(dir.path)/ca.pem exists and is not a directory",
            "\(dir.path)/bearerd.yaml:8: sessions.me.refresh_token_file: cannot read \(dir.path)/me.refresh: No such file or directory",
            "\(dir.path)/bearerd.yaml:15: routes[0].tls.client_cert: cannot read \(dir.path)/client.pem: No such file or directory",
            "\(dir.path)/bearerd.yaml:16: routes[0].tls.client_key: cannot read \(dir.path)/client.key: No such file or directory",
        ])
    }

    @Test func secretEnvironmentVariableMissing() {
        let yaml = """
            sessions:
              legacy:
                grant: password
                token_url: https://auth.example.com/token
                client_id: app
                client_secret_env: APP_SECRET
                username: svc
                password_env: SVC_PASSWORD
            \(minimalRoute)
            """
        #expect(configErrors(yaml, environment: ["SVC_PASSWORD": ""], checkFiles: true) == [
            "bearerd.yaml:6: sessions.legacy.client_secret_env: environment variable APP_SECRET is not set",
            "bearerd.yaml:8: sessions.legacy.password_env: environment variable SVC_PASSWORD is empty",
        ])
        #expect(configErrors(yaml, environment: ["APP_SECRET": "a", "SVC_PASSWORD": "b"], checkFiles: true).isEmpty)
    }

    @Test func twoSecretSources() {
        let errors = configErrors("""
            sessions:
              partner:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: id
                client_secret_file: /run/x
                client_secret: topsecret
            \(minimalRoute)
            """)
        #expect(errors == [
            "bearerd.yaml:7: sessions.partner.client_secret: give only one of client_secret_file, client_secret_env, client_secret (client_secret_file is set at line 6)",
        ])
    }

    @Test func clientAuthAndSecretMustAgree() {
        let base = """
            sessions:
              s:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: id

            """
        #expect(configErrors(base + "    client_auth: none\n    client_secret: x\n" + minimalRoute) == [
            "bearerd.yaml:7: sessions.s.client_secret: client_auth is none, so no client secret is sent; remove client_secret or set client_auth: client_secret_basic",
        ])
        #expect(configErrors(base + minimalRoute) == [
            "bearerd.yaml:2: sessions.s.client_secret_file: missing: client_auth client_secret_basic (the default) needs one of client_secret_file, client_secret_env or client_secret; a public client sets client_auth: none",
        ])
        #expect(configErrors(base + "    client_auth: client-secret-post\n" + minimalRoute) == [
            "bearerd.yaml:6: sessions.s.client_auth: expected one of client_secret_basic, client_secret_post, none, private_key_jwt, tls_client_auth, client_assertion, got \"client-secret-post\" (did you mean 'client_secret_post'?)",
        ])
    }

    @Test func grantSpecificKeys() {
        let errors = configErrors("""
            sessions:
              me:
                grant: refresh_token
                token_url: https://auth.example.com/token
                client_id: cli
                client_auth: none
                username: someone
              cc:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: id
                client_secret: x
                refresh_token_file: /x
              pw:
                grant: password
                token_url: https://auth.example.com/token
                client_id: id
                client_auth: none
            \(minimalRoute)
            """)
        #expect(errors == [
            "bearerd.yaml:2: sessions.me.refresh_token_file: missing required key (grant refresh_token starts from a refresh token kept in a file (or use grant authorization_code / device_code and `bearerd login`))",
            "bearerd.yaml:2: state_dir: missing: session 'me' is kept alive by a refresh token (rotated ones, and those `bearerd login` obtains, are kept in state_dir)",
            "bearerd.yaml:7: sessions.me.username: only used with grant password (this session has grant refresh_token)",
            "bearerd.yaml:13: sessions.cc.refresh_token_file: only used with grant refresh_token (this session has grant client_credentials)",
            "bearerd.yaml:14: sessions.pw.username: missing required key (grant password needs username and one of password_file, password_env or password)",
            "bearerd.yaml:14: sessions.pw.password_file: missing: grant password needs one of password_file, password_env or password",
        ])
    }

    @Test func duplicateKeysAreReportedWithTheirPath() {
        let errors = configErrors("""
            listen: 127.0.0.1:8080
            sessions:
              partner:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: id
                client_secret: x
                client_id: other
            routes:
              - match: /a/
                upstream: http://127.0.0.1:9000
                timeouts: { connect: 1s, connect: 2s }
                "match": /b/
              - match: /c/
                upstream: ftp://x
            listen: 127.0.0.1:8081
            """)
        #expect(errors == [
            "bearerd.yaml:8: sessions.partner.client_id: duplicate key (already set at line 6)",
            "bearerd.yaml:12: routes[0].timeouts.connect: duplicate key (already set at line 12)",
            "bearerd.yaml:13: routes[0].match: duplicate key (already set at line 10)",
            "bearerd.yaml:15: routes[1].upstream: expected an http:// or https:// URL, got \"ftp://x\"",
            "bearerd.yaml:16: listen: duplicate key (already set at line 1)",
        ])
    }

    @Test func repeatedAndFlowDuplicates() {
        #expect(configErrors("""
            routes:
              - match: /a/
                upstream: http://x
                upstream: http://y
                upstream: http://z
            """) == [
                "bearerd.yaml:4: routes[0].upstream: duplicate key (already set at line 3)",
                "bearerd.yaml:5: routes[0].upstream: duplicate key (already set at line 3)",
            ])
        #expect(configErrors("""
            routes:
              - {match: /a/, upstream: http://x,
                 'match': /b/}
            """) == ["bearerd.yaml:3: routes[0].match: duplicate key (already set at line 2)"])
        #expect(configErrors("""
            sessions:
              a: {grant: password}
              a: {grant: password}
            \(minimalRoute)
            """).contains("bearerd.yaml:3: sessions.a: duplicate key (already set at line 2)"))
    }

    @Test func moreHelpfulMessages() {
        #expect(configErrors("routes: []\n---\nroutes: []\n") == [
            "bearerd.yaml:2: yaml: a second YAML document starts here; bearerd reads one document per file",
        ])
        #expect(configErrors("routes:\n  - match: /\n    upstream: http://x: y\n") == [
            "bearerd.yaml:3: yaml: mapping values are not allowed in this context; a value containing ': ' must be quoted",
        ])
        #expect(configErrors("""
            sessions:
              s:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: id
                client_secret_env: $SECRET
                upstream: http://x
            \(minimalRoute)
            """) == [
                "bearerd.yaml:6: sessions.s.client_secret_env: expected an environment variable name (letters, digits and _), got \"$SECRET\" (write the name without $)",
                "bearerd.yaml:7: sessions.s.upstream: unknown key ('upstream' belongs in a route under routes:)",
            ])
    }

    @Test func scopeAsAList() throws {
        let config = try parseConfig("""
            sessions:
              s:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: id
                client_secret: x
                scope: [read, "write:all"]
            \(minimalRoute)
            """)
        #expect(config.sessions.first?.scope == "read write:all")
    }

    @Test func yamlSyntaxErrorsHaveALine() {
        let errors = configErrors("""
            listen: 127.0.0.1:8080
            sessions:
              partner:
                grant: "client_credentials
            routes: []
            """)
        #expect(errors == ["bearerd.yaml:5: yaml: found unexpected end of stream while scanning a quoted scalar (which starts at line 4)"])
        #expect(configErrors("routes:\n\t- match: /\n") == [
            "bearerd.yaml:2: yaml: found character that cannot start any token while scanning for the next token; YAML does not allow tabs for indentation",
        ])
        let badIndent = configErrors("routes:\n  - match: /\n    upstream: http://x\n   session: a\n")
        #expect(badIndent.count == 1)
        #expect(badIndent.first?.hasPrefix("bearerd.yaml:4: yaml: ") == true)
    }

    @Test func emptyFile() {
        #expect(configErrors("") == ["bearerd.yaml:1: (document): the file is empty; a configuration needs at least routes: (see config.example.yaml)"])
        #expect(configErrors("# only a comment\n") == configErrors(""))
    }

    @Test func unreadableConfigFile() {
        do throws(ConfigErrors) {
            _ = try ConfigLoader.load(path: "/nonexistent/bearerd.yaml", environment: [:])
            Issue.record("expected an error")
        } catch {
            #expect(error.description == "/nonexistent/bearerd.yaml: cannot read: No such file or directory")
        }
    }

    @Test func allErrorsAreCollectedInLineOrder() {
        let errors = configErrors("""
            routes:
              - match: api
                upstream: http://127.0.0.1:9000
                timeouts: { connect: 5 }
            listen: 127.0.0.1:99999
            sessions:
              bad name:
                grant: implicit
            """)
        #expect(errors == [
            "bearerd.yaml:2: routes[0].match: a path prefix must start with '/', got \"api\"",
            "bearerd.yaml:4: routes[0].timeouts.connect: missing unit in \"5\": write 5s for seconds (units: ms, s, m, h)",
            "bearerd.yaml:5: listen: port must be 1–65535, got 99999",
            "bearerd.yaml:7: sessions.bad name: a session name may hold only letters, digits, '.', '_' and '-' (at most 64, not starting with '.')",
            "bearerd.yaml:7: sessions.bad name.token_url: missing required key (the token endpoint, e.g. https://auth.example.com/oauth2/token, or issuer: for discovery)",
            "bearerd.yaml:7: sessions.bad name.client_id: missing required key",
            "bearerd.yaml:7: sessions.bad name.client_secret_file: missing: client_auth client_secret_basic (the default) needs one of client_secret_file, client_secret_env or client_secret; a public client sets client_auth: none",
            "bearerd.yaml:8: sessions.bad name.grant: expected one of client_credentials, refresh_token, password, exec, authorization_code, device_code, jwt_bearer, token_exchange, aws, aliyun, got \"implicit\"",
        ])
    }

    @Test func shadowedRoutes() {
        let errors = configErrors("""
            routes:
              - match: /api
                upstream: http://127.0.0.1:9000
              - match: /api/v2/
                upstream: http://127.0.0.1:9001
              - match: /apiary/
                upstream: http://127.0.0.1:9002
              - match: /x/
                host: a.example
                upstream: http://127.0.0.1:9003
              - match: /x/
                upstream: http://127.0.0.1:9004
              - match: /x/y
                host: a.example
                upstream: http://127.0.0.1:9005
            """)
        #expect(errors == [
            "bearerd.yaml:4: routes[1].match: this route is never used: routes[0] (line 2, match \"/api\") comes first and takes every request it would; put more specific routes first",
            "bearerd.yaml:13: routes[5].match: this route is never used: routes[3] (line 8, match \"/x/\", host a.example) comes first and takes every request it would; put more specific routes first",
        ])
    }

    @Test func routeValueChecks() {
        let errors = configErrors("""
            routes:
              - match: /a/
                host: api.example.com:8080
                upstream: http://127.0.0.1:9000
                tls:
                  client_cert: /c.pem
                reject_statuses: [401, 200, x]
                replay_methods: [get, "BAD METHOD"]
              - match: /b/
                upstream: http://127.0.0.1:9000
                replay_methods: GET
            """)
        #expect(errors == [
            "bearerd.yaml:3: routes[0].host: give the host name without a port (the port is ignored when matching), got \"api.example.com:8080\"",
            "bearerd.yaml:5: routes[0].tls: tls settings need an https:// upstream",
            "bearerd.yaml:6: routes[0].tls.client_key: missing: client_cert needs client_key too (mutual TLS uses both)",
            "bearerd.yaml:7: routes[0].reject_statuses[1]: expected a status code 400–599, got 200",
            "bearerd.yaml:7: routes[0].reject_statuses[2]: expected a status code 400–599, got \"x\"",
            "bearerd.yaml:8: routes[0].replay_methods[0]: methods are case-sensitive (RFC 9110 §9.1): did you mean GET?",
            "bearerd.yaml:8: routes[0].replay_methods[1]: expected a method name such as GET, got \"BAD METHOD\"",
            "bearerd.yaml:11: routes[1].replay_methods: expected all or a list of methods such as [GET, HEAD, PUT, DELETE], got \"GET\"",
        ])
    }

    @Test func paramsCannotOverrideProtocolFields() {
        let errors = configErrors("""
            sessions:
              s:
                grant: client_credentials
                token_url: https://auth.example.com/token
                client_id: id
                client_secret: x
                params:
                  grant_type: password
                  assertion: [a, b]
            \(minimalRoute)
            """)
        #expect(errors == [
            "bearerd.yaml:8: sessions.s.params.grant_type: bearerd sets grant_type itself; use the session's own keys",
            "bearerd.yaml:9: sessions.s.params.assertion: expected a text value, got a list",
        ])
    }
}

@Suite struct ConfigSecretTests {
    @Test func secretsNeverAppearInMessagesOrDescriptions() throws {
        let errors = configErrors("""
            sessions:
              s:
                grant: client_credentials
                token_url: https://user:hunter2@auth.example.com/token?api_key=hunter2
                client_id: id
                client_auth: none
                client_secret: hunter2
                params:
                  client_assertion: { x: hunter2 }
              t:
                grant: password
                token_url: https://auth.example.com/token
                client_id: id
                client_auth: none
                username: u
                password: [hunter2]
            \(minimalRoute)
            """)
        #expect(errors.count == 4)
        for error in errors { #expect(!error.contains("hunter2"), "\(error)") }

        let config = try parseConfig("""
            sessions:
              s:
                grant: password
                token_url: https://auth.example.com/token
                client_id: id
                client_secret: hunter2
                username: u
                password: hunter2
            \(minimalRoute)
            """)
        let session = try #require(config.sessions.first)
        #expect(!String(describing: session).contains("hunter2"))
        #expect(!String(reflecting: session).contains("hunter2"))
        #expect(!String(describing: config).contains("hunter2"))
        #expect(Secret("hunter2").description == "<redacted>")
        #expect("\(Secret("hunter2"))" == "<redacted>")
    }

    @Test func resolveSecretFromEachSource() throws {
        let dir = try TemporaryDirectory()
        let lf = try dir.write("lf", "s3cret\n")
        let crlf = try dir.write("crlf", "s3cret\r\n")
        let none = try dir.write("none", "s3cret")
        let twoLines = try dir.write("two", "s3cret\n\n")
        for path in [lf, crlf, none] {
            #expect(try ConfigLoader.resolveSecret(.file(path), environment: [:]).value == "s3cret")
        }
        #expect(throws: ConfigError(file: "", line: 0, key: "", message: "\(twoLines) holds more than one line (only one trailing newline is removed)")) {
            try ConfigLoader.resolveSecret(.file(twoLines), environment: [:])
        }
        #expect(try ConfigLoader.resolveSecret(.env("X"), environment: ["X": "v"]).value == "v")
        #expect(try ConfigLoader.resolveSecret(.literal(Secret("lit")), environment: [:]).value == "lit")
        do throws(ConfigError) {
            _ = try ConfigLoader.resolveSecret(.env("NOPE"), environment: [:])
            Issue.record("expected an error")
        } catch {
            #expect(error.description == "environment variable NOPE is not set")
        }
        do throws(ConfigError) {
            _ = try ConfigLoader.resolveSecret(.file(dir.path + "/absent"), environment: [:], file: "b.yaml", line: 3, key: "sessions.a.client_secret_file")
            Issue.record("expected an error")
        } catch {
            #expect(error.description == "b.yaml:3: sessions.a.client_secret_file: cannot read \(dir.path)/absent: No such file or directory")
        }
    }
}

@Suite struct ConfigValueTests {
    @Test func durations() throws {
        #expect(try ConfigValues.duration("500ms") == .milliseconds(500))
        #expect(try ConfigValues.duration("30s") == .seconds(30))
        #expect(try ConfigValues.duration("5m") == .seconds(300))
        #expect(try ConfigValues.duration("1h") == .seconds(3600))
        #expect(throws: ConfigValues.Problem("unknown unit 'd' in \"1d\" (use ms, s, m or h)")) { try ConfigValues.duration("1d") }
        #expect(throws: ConfigValues.Problem("use a single unit: write 90s for \"1m30s\"")) { try ConfigValues.duration("1m30s") }
        #expect(throws: ConfigValues.Problem("use a single unit: write 1500ms for \"1s500ms\"")) { try ConfigValues.duration("1s500ms") }
        #expect(throws: ConfigValues.Problem("must be at most 24h, got \"99999999999s\"")) { try ConfigValues.duration("99999999999s") }
        #expect(throws: ConfigValues.Problem("must be at most 24h, got \"307445734m\"")) { try ConfigValues.duration("307445734m") }
        #expect(throws: ConfigValues.Problem("must be at most 24h, got \"3000000h\"")) { try ConfigValues.duration("3000000h") }
        // n × unit overflows Int64 milliseconds: refused, not trapped.
        #expect(throws: ConfigValues.Problem("must be at most 24h, got \"9223372036854775807h\"")) { try ConfigValues.duration("9223372036854775807h") }
        #expect(throws: ConfigValues.Problem("must be at most 24h, got \"99999999999999999999999999s\"")) {
            try ConfigValues.duration("99999999999999999999999999s")
        }
        #expect(try ConfigValues.duration("24h") == .seconds(86_400))
        #expect(try ConfigValues.duration("8760h", maximum: ConfigValues.maximumLifetime) == .seconds(31_536_000))
        #expect(throws: ConfigValues.Problem("must be at most 8760h, got \"8761h\"")) {
            try ConfigValues.duration("8761h", maximum: ConfigValues.maximumLifetime)
        }
        #expect(ConfigValues.describe(.seconds(90)) == "90s")
        #expect(ConfigValues.describe(.milliseconds(1500)) == "1500ms")
        #expect(ConfigValues.describe(.seconds(7200)) == "2h")
    }

    @Test func sizes() throws {
        #expect(try ConfigValues.size("0") == 0)
        #expect(try ConfigValues.size("65536") == 65536)
        #expect(try ConfigValues.size("512B") == 512)
        #expect(try ConfigValues.size("64KiB") == 65536)
        #expect(try ConfigValues.size("1MiB") == 1 << 20)
        #expect(try ConfigValues.size("2GiB") == 2 << 30)
        #expect(throws: ConfigValues.Problem("unknown unit 'k' in \"64k\" (use B, KiB, MiB or GiB; did you mean 64KiB?)")) { try ConfigValues.size("64k") }
        #expect(throws: ConfigValues.Problem("must be at most 1024GiB, got \"99999999GiB\"")) { try ConfigValues.size("99999999GiB") }
        #expect(throws: ConfigValues.Problem("must be at most 1024GiB, got \"99999999999999999999GiB\"")) { try ConfigValues.size("99999999999999999999GiB") }
        #expect(throws: ConfigValues.Problem("must be at most 1024GiB, got \"1025GiB\"")) { try ConfigValues.size("1025GiB") }
        #expect(try ConfigValues.size("1024GiB") == 1 << 40)
        #expect(ConfigValues.describe(bytes: 16 << 20) == "16MiB")
        #expect(ConfigValues.describe(bytes: 1000) == "1000")
    }

    @Test func addresses() throws {
        #expect(try ConfigValues.address("127.0.0.1:8080") == .tcp(host: "127.0.0.1", port: 8080))
        #expect(try ConfigValues.address("localhost:1") == .tcp(host: "localhost", port: 1))
        #expect(try ConfigValues.address("[::1]:65535") == .tcp(host: "::1", port: 65535))
        #expect(try ConfigValues.address("[fe80::1%eth0]:80") == .tcp(host: "fe80::1%eth0", port: 80))
        #expect(try ConfigValues.address("unix:/run/bearerd/api.sock") == .unix(path: "/run/bearerd/api.sock"))
        #expect(try ConfigValues.address("[::1]:8080").description == "[::1]:8080")
        #expect(throws: ConfigValues.Problem("\"zz\" is not an IPv6 address")) { try ConfigValues.address("[zz]:80") }
        #expect(throws: ConfigValues.Problem("missing host in \":8080\": write 127.0.0.1:8080 (or 0.0.0.0:8080 for every interface)")) {
            try ConfigValues.address(":8080")
        }
        let long = "unix:/" + String(repeating: "a", count: 107)
        #expect(throws: ConfigValues.Problem("Unix socket path is 108 bytes, longer than the 107 the system allows")) { try ConfigValues.address(long) }
    }

    @Test func urls() throws {
        #expect(try ConfigValues.url("HTTPS://API.Example.com")
            == UpstreamURL(scheme: "https", host: "api.example.com", port: 443, basePath: ""))
        #expect(try ConfigValues.url("http://example.com/")
            == UpstreamURL(scheme: "http", host: "example.com", port: 80, basePath: ""))
        #expect(try ConfigValues.url("http://[::1]:9000/base/path//")
            == UpstreamURL(scheme: "http", host: "::1", port: 9000, basePath: "/base/path"))
        // A route's upstream has no query (token endpoints, which may, are EndpointURLs).
        #expect(throws: ConfigValues.Problem.self) { try ConfigValues.url("https://a.example/token?x=1") }
        #expect(try ConfigValues.url("http://[::1]:9000/v1").authority == "[::1]:9000")
        #expect(throws: ConfigValues.Problem("the path contains a space")) { try ConfigValues.url("http://a/b c") }
        #expect(ConfigValues.redactedURL("https://u:p@h/x?k=v") == "https://…@h/x?…")
    }

    @Test func suggestions() {
        #expect(ConfigValues.suggestion(for: "refresh_befor", among: ConfigKeys.session) == "'refresh_before'")
        #expect(ConfigValues.suggestion(for: "upstreams", among: ConfigKeys.route) == "'upstream'")
        #expect(ConfigValues.suggestion(for: "tiemouts", among: ConfigKeys.route) == "'timeouts'")
        #expect(ConfigValues.suggestion(for: "timeout", among: ConfigKeys.route) == "'timeouts'")
        #expect(ConfigValues.suggestion(for: "secret_file", among: ConfigKeys.session) == "'client_secret_file'")
        #expect(ConfigValues.suggestion(for: "zzz", among: ConfigKeys.route) == nil)
        #expect(ConfigValues.editDistance("kitten", "sitting") == 3)
    }
}
