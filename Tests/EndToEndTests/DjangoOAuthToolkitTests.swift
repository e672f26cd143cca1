import Foundation
import Testing
import BearerdTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// `bearerd login`, `token` and `run` against a second real authorization server,
/// django-oauth-toolkit 3.x (`DjangoOAuthFixture`), which differs from the Authlib fixture where
/// real deployments do: endpoints under `/o/` ending in `/` (404 without), an issuer with a path,
/// metadata only from OIDC discovery unless the RFC 8414 document is mounted at the root, no
/// `device_authorization_endpoint` in either document, `none` missing from
/// `token_endpoint_auth_methods_supported`, loopback redirect ports ignored only for IP literals,
/// rotating refresh tokens without a grace period, RFC 7009 revocation of an access token that
/// also revokes its refresh token, and a plain protected view answering a bad token with a bare 403.
@Suite("django-oauth-toolkit: login, token and run", .serialized,
       .enabled(if: Prerequisite.runs(DjangoOAuthFixture.isAvailable) && Prerequisite.runs(AuthServerFixture.isAvailable),
                "\(DjangoOAuthFixture.unavailableReason ?? AuthServerFixture.unavailableReason ?? "")"))
struct DjangoOAuthToolkitTests {
    /// `routes`: the `routes:` entries, each line indented as in the file (default: `/` to the API).
    static func config(_ dot: DjangoOAuthFixture, dir: String, routes: String? = nil) -> String {
        let entries = routes ?? "  - match: /\n    upstream: \(dot.apiURL)\n    session: me"
        return """
            state_dir: \(dir)/state
            sessions:
              me:
                grant: authorization_code
                issuer: \(dot.issuer)
                client_id: native
                client_auth: none
                scope: openid read
            routes:
            \(entries)
            """
    }

    static func signIn(_ cfg: String, dir: String) throws -> CommandLineTests.Output {
        try CommandLineTests.run(["login", "-c", cfg, "me", "--timeout", "30"], env: ["BROWSER": try LoginTests.browser(dir: dir)])
    }

    static func json(_ r: TestClient.Response) -> [String: Any] {
        ((try? JSONSerialization.jsonObject(with: Data(r.body))) as? [String: Any]) ?? [:]
    }

    static func storedRefreshToken(_ dir: String) -> String? {
        guard let data = FileManager.default.contents(atPath: dir + "/state/me.json"),
              let obj = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] else { return nil }
        return obj["refresh_token"] as? String
    }

    /// Discovery from DOT's OIDC document (RFC 8414's URL for an issuer with a path is
    /// `/.well-known/oauth-authorization-server/o`, which a default DOT mount answers 404) or, with
    /// the root mount DOT recommends, from RFC 8414 metadata; the browser sign-in with PKCE, a
    /// nonce checked in DOT's RS256 id_token and a redirect port chosen at run time (DOT lets any
    /// port through for 127.0.0.1, RFC 8252 §7.3); `token` and `run`; an access token the server
    /// no longer accepts is renewed with the rotated refresh token, which is persisted, and the
    /// request replayed. The second run has DOT's RFC 9700 gates on (its 4.0 defaults): the
    /// callback then carries `iss` (RFC 9207), which bearerd does not need, and tokens are stored hashed.
    @Test(arguments: zip([false, true], [false, true])) func signInTokenAndRunWithRotation(rootMetadata: Bool, rfc9700: Bool) throws {
        let dot = try DjangoOAuthFixture.start(rootMetadata: rootMetadata, rfc9700: rfc9700)
        defer { dot.stop() }
        if rootMetadata {
            let meta = Self.json(try dot.request("GET", "/.well-known/oauth-authorization-server/o"))
            #expect(meta["issuer"] as? String == dot.issuer)
            #expect(meta["device_authorization_endpoint"] == nil, "DOT publishes no device endpoint")
            #expect((meta["authorization_response_iss_parameter_supported"] as? Bool ?? false) == rfc9700, "\(meta)")
        }
        let dir = try RunningBearerd.tempDir("dot")
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.config(dot, dir: dir))
        let check = try CommandLineTests.run(["check", "-c", cfg])
        #expect(check.status == 0, "\(check.stdout)\(check.stderr)")

        let login = try Self.signIn(cfg, dir: dir)
        #expect(login.status == 0, "\(login.stderr)\n\(dot.log.suffix(3000))")
        #expect(login.stderr.contains("Open this URL to sign in: http://127.0.0.1:\(dot.port)/o/authorize/?response_type=code&client_id=native&redirect_uri=http%3A%2F%2F127.0.0.1%3A"),
                "\(login.stderr)")
        #expect(login.stderr.contains("&nonce="), "\(login.stderr)")
        #expect(login.stderr.contains("Signed in"))
        let firstRefresh = try #require(Self.storedRefreshToken(dir))

        // `token` prints a token DOT's protected view accepts, quietly.
        let token = try CommandLineTests.run(["token", "-c", cfg, "me"])
        #expect(token.status == 0, "\(token.stderr)")
        #expect(token.stderr.isEmpty, "quiet by default: \(token.stderr)")
        let direct = try dot.api("/api/direct", token: token.stdout.trimmingCharacters(in: .newlines))
        #expect(direct.status == 200, "\(direct.bodyText)")
        #expect(Self.json(direct)["user"] as? String == "alice")
        #expect(Self.json(direct)["scope"] as? String == "openid read")

        let port = try RunningBearerd.freePort()
        let running = try RunningBearerd(config: "listen: 127.0.0.1:\(port)\n" + Self.config(dot, dir: dir), dir: dir)
        defer { _ = running.stop() }
        let first = running.waitServing(port: port, path: "/hello")
        #expect(first?.status == 200, "\(running.logs)")
        #expect(first.map { Self.json($0)["client_id"] as? String } == "native")
        #expect(try dot.tokenRequests("refresh_token") == 0)

        // DOT no longer accepts the access token (401 invalid_token): refresh, rotate, replay.
        try dot.expireAll()
        let after = try TestClient.get(port: port, path: "/after")
        #expect(after.status == 200, "\(running.logs)")
        #expect(Self.json(after)["path"] as? String == "/api/after")
        #expect(running.waitLog("replaying rejected request"), "\(running.logs)")
        #expect(try dot.tokenRequests("refresh_token") == 1)
        let rotated = try #require(Self.storedRefreshToken(dir))
        #expect(rotated != firstRefresh, "the rotated refresh token is persisted")
        // `token` adopts what `run` stored: a token the API accepts, with no token request.
        let again = try CommandLineTests.run(["token", "-c", cfg, "me"])
        #expect(again.status == 0, "\(again.stderr)")
        #expect(try dot.api("/api/again", token: again.stdout.trimmingCharacters(in: .newlines)).status == 200)
        #expect(try dot.tokenRequests("refresh_token") == 1)

        let stats = try dot.stats()
        #expect((stats["refresh_tokens"] as? [String: Any])?["revoked"] as? Int == 1, "\(stats)")
        #expect((stats["token_errors"] as? [String: Any])?.isEmpty == true, "\(stats)")
        // Only the RFC 8414 URL of the default mount may 404; every OAuth endpoint was hit as published.
        let notFound = stats["not_found"] as? [String] ?? []
        #expect(notFound == (rootMetadata ? [] : Array(repeating: "/.well-known/oauth-authorization-server/o", count: notFound.count)), "\(stats)")
    }

    /// DOT revokes the refresh token with the access token (RFC 7009 §2.1 allows it): the refresh
    /// is `invalid_grant`, the client gets 503 `token_unavailable` (never DOT's 401), the token
    /// endpoint is not asked again, and a new `bearerd login` is picked up by the running proxy.
    @Test func revocationAtTheServerEndsTheSessionUntilTheNextSignIn() throws {
        let dot = try DjangoOAuthFixture.start()
        defer { dot.stop() }
        let dir = try RunningBearerd.tempDir("dot")
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.config(dot, dir: dir))
        #expect(try Self.signIn(cfg, dir: dir).status == 0)
        let port = try RunningBearerd.freePort()
        let running = try RunningBearerd(config: "listen: 127.0.0.1:\(port)\n" + Self.config(dot, dir: dir), dir: dir)
        defer { _ = running.stop() }
        #expect(running.waitServing(port: port, path: "/hello")?.status == 200, "\(running.logs)")

        let access = try CommandLineTests.run(["token", "-c", cfg, "me"]).stdout.trimmingCharacters(in: .newlines)
        #expect(try dot.revoke(access).status == 200)
        let refused = try TestClient.get(port: port, path: "/revoked")
        #expect(refused.status == 503, "\(refused.bodyText)")
        #expect(Self.json(refused)["error"] as? String == "token_unavailable", "\(refused.bodyText)")
        #expect(refused.bodyText.contains("invalid_grant"), "\(refused.bodyText)")
        #expect(running.waitLog("session me needs a new sign-in: run `bearerd login me`"), "\(running.logs)")
        #expect(try TestClient.get(port: port, path: "/still").status == 503)
        #expect(try dot.tokenRequests("refresh_token") == 1, "no retry of an invalid_grant")

        #expect(try Self.signIn(cfg, dir: dir).status == 0)
        var back = try TestClient.get(port: port, path: "/back")
        let deadline = Date().addingTimeInterval(10)
        while back.status != 200 && Date() < deadline {
            Thread.sleep(forTimeInterval: 0.2)
            back = try TestClient.get(port: port, path: "/back")
        }
        #expect(back.status == 200, "\(running.logs)")
        #expect(running.waitLog("new sign-in found in the state file"))
    }

    /// DOT rotates refresh tokens with no grace period: a refresh token presented twice is
    /// `invalid_grant` and ends the session. With 6 s tokens, `bearerd run` (soft refresh) and
    /// `bearerd token` (renewing anything with under 5 s left) both rotate the one refresh token
    /// for 8 s; the state file's lock and re-read (docs/architecture.md §6, rotation durability) must keep every
    /// refresh on the newest token: no `invalid_grant`, every printed token accepted.
    @Test func runAndTokenShareRotationsWithoutAGraceWindow() throws {
        let dot = try DjangoOAuthFixture.start(tokenLifetime: 6)
        defer { dot.stop() }
        let dir = try RunningBearerd.tempDir("dot")
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.config(dot, dir: dir))
        #expect(try Self.signIn(cfg, dir: dir).status == 0)
        let port = try RunningBearerd.freePort()
        let running = try RunningBearerd(config: "listen: 127.0.0.1:\(port)\n" + Self.config(dot, dir: dir), dir: dir)
        defer { _ = running.stop() }
        #expect(running.waitServing(port: port, path: "/hello")?.status == 200, "\(running.logs)")

        let deadline = Date().addingTimeInterval(8)
        var rounds = 0
        while Date() < deadline && rounds < 200 {
            rounds += 1
            let token = try CommandLineTests.run(["token", "-c", cfg, "me"])
            #expect(token.status == 0, "\(token.stderr)")
            let printed = token.stdout.trimmingCharacters(in: .newlines)
            // DOT deletes the previous access token when its refresh token is used: a refresh
            // by `run` between the print and this call may have revoked it; then `token` has the new one.
            if try dot.api("/api/t", token: printed).status != 200 {
                let now = try CommandLineTests.run(["token", "-c", cfg, "me"]).stdout.trimmingCharacters(in: .newlines)
                #expect(now != printed, "a printed token refused while it is still the session's")
                #expect(try dot.api("/api/t", token: now).status == 200)
            }
            // `run` holds the token it had before `token` rotated (DOT revoked it): the 401 is
            // answered by a refresh from the newest refresh token in the state file (re-read
            // under the lock; a stored access token this short-lived is not adopted) and a replay.
            #expect(try TestClient.get(port: port, path: "/r").status == 200, "\(running.logs)")
        }
        let stats = try dot.stats()
        #expect((stats["token_errors"] as? [String: Any])?.isEmpty == true, "\(stats)\n\(running.logs)")
        #expect(try dot.tokenRequests("refresh_token") >= 2, "\(stats)")
    }

    /// DOT compares `localhost` redirect URIs with their port (RFC 8252 §8.3 does not recommend
    /// them; only the IP literals get any port): the run-time port is never redirected to, and the
    /// sign-in times out with the hint; `redirect_uri:` with the registered URL works. A fixed
    /// 127.0.0.1 port on the stock client works too (DOT ignores the port there).
    @Test func fixedRedirectURIs() throws {
        let dot = try DjangoOAuthFixture.start()
        defer { dot.stop() }
        let dir = try RunningBearerd.tempDir("dot")
        let fixedPort = try RunningBearerd.freePort()
        let registered = "http://localhost:\(fixedPort)/bearerd/cb/"
        try dot.registerApplication(clientID: "exact", redirectURIs: registered)
        let base = Self.config(dot, dir: dir).replacingOccurrences(of: "client_id: native", with: "client_id: exact")
        let chosen = try CommandLineTests.tempFile("bearerd.yaml", base)
        let refused = try CommandLineTests.run(["login", "-c", chosen, "me", "--timeout", "3"], env: ["BROWSER": try LoginTests.browser(dir: dir)])
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("the server may have refused the redirect URI"), "\(refused.stderr)")

        let fixed = try CommandLineTests.tempFile("bearerd.yaml", base.replacingOccurrences(
            of: "scope: openid read", with: "scope: openid read\n    redirect_uri: \(registered)"))
        let login = try Self.signIn(fixed, dir: dir)
        #expect(login.status == 0, "\(login.stderr)\n\(dot.log.suffix(2000))")
        #expect(login.stderr.contains("redirect_uri=http%3A%2F%2Flocalhost%3A\(fixedPort)%2Fbearerd%2Fcb%2F&"), "\(login.stderr)")
        let token = try CommandLineTests.run(["token", "-c", fixed, "me"])
        #expect(Self.json(try dot.api("/api/exact", token: token.stdout.trimmingCharacters(in: .newlines)))["client_id"] as? String == "exact")

        let loopback = try CommandLineTests.tempFile("bearerd.yaml", Self.config(dot, dir: dir).replacingOccurrences(
            of: "scope: openid read", with: "scope: openid read\n    redirect_uri: http://127.0.0.1:\(fixedPort)/callback"))
        let native = try Self.signIn(loopback, dir: dir)
        #expect(native.status == 0, "\(native.stderr)")
        #expect(native.stderr.contains("redirect_uri=http%3A%2F%2F127.0.0.1%3A\(fixedPort)%2Fcallback&"), "\(native.stderr)")
    }

    /// DOT's plain `ProtectedResourceView` answers an expired token with a bare 403 (no
    /// `WWW-Authenticate`): by default that is not a rejection (RFC 6750 §3.1: 403 is
    /// insufficient_scope) and goes to the client with no refresh; `reject_statuses: [401, 403]`
    /// on the route makes it one, and the request is refreshed and replayed.
    @Test func aBare403IsARejectionOnlyWhereConfigured() throws {
        let dot = try DjangoOAuthFixture.start()
        defer { dot.stop() }
        let dir = try RunningBearerd.tempDir("dot")
        let routes = """
              - match: /plain/
                strip_prefix: true
                upstream: \(dot.legacyAPIURL)
                session: me
              - match: /lenient/
                strip_prefix: true
                upstream: \(dot.legacyAPIURL)
                session: me
                reject_statuses: [401, 403]
            """
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.config(dot, dir: dir, routes: routes))
        #expect(try Self.signIn(cfg, dir: dir).status == 0)
        let port = try RunningBearerd.freePort()
        let running = try RunningBearerd(config: "listen: 127.0.0.1:\(port)\n" + Self.config(dot, dir: dir, routes: routes), dir: dir)
        defer { _ = running.stop() }
        #expect(running.waitServing(port: port, path: "/plain/a")?.status == 200, "\(running.logs)")

        try dot.expireAll()
        let plain = try TestClient.get(port: port, path: "/plain/b")
        #expect(plain.status == 403)
        #expect(plain["WWW-Authenticate"] == nil)
        #expect(try dot.tokenRequests("refresh_token") == 0)
        let lenient = try TestClient.get(port: port, path: "/lenient/c")
        #expect(lenient.status == 200, "\(running.logs)")
        #expect(Self.json(lenient)["path"] as? String == "/legacy/c")
        #expect(try dot.tokenRequests("refresh_token") == 1)
        #expect(try TestClient.get(port: port, path: "/plain/d").status == 200, "the renewed token serves both routes")
    }
}

/// The device flow (RFC 8628) against django-oauth-toolkit: DOT publishes no
/// `device_authorization_endpoint` (neither in its OIDC nor its RFC 8414 metadata, although
/// `grant_types_supported` lists the device grant), so the session names
/// `device_authorization_url:` and `token_url:`; its 8-character user codes, `interval` and
/// `authorization_pending` answers; a denial.
@Suite("django-oauth-toolkit: device flow", .serialized,
       .enabled(if: Prerequisite.runs(DjangoOAuthFixture.isAvailable), "\(DjangoOAuthFixture.unavailableReason ?? "")"))
struct DjangoOAuthToolkitDeviceTests {
    static func config(_ dot: DjangoOAuthFixture, dir: String, endpoints: String? = nil) -> String {
        """
        state_dir: \(dir)/state
        sessions:
          tv:
            grant: device_code
            \(endpoints ?? "device_authorization_url: \(dot.deviceAuthorizationURL)\n    token_url: \(dot.tokenURL)")
            client_id: tv
            client_auth: none
            scope: read
        routes:
          - match: /
            upstream: \(dot.apiURL)
            session: tv
        """
    }

    @Test func approvedThenTokenAndRun() throws {
        let dot = try DjangoOAuthFixture.start()
        defer { dot.stop() }
        let dir = try RunningBearerd.tempDir("dot-device")
        // With issuer: only, check says what DOT's metadata lacks.
        let viaIssuer = try CommandLineTests.tempFile("bearerd.yaml", Self.config(dot, dir: dir, endpoints: "issuer: \(dot.issuer)"))
        let check = try CommandLineTests.run(["check", "-c", viaIssuer])
        #expect(check.status != 0)
        #expect((check.stdout + check.stderr).contains("publishes no device_authorization_endpoint"), "\(check.stdout)\(check.stderr)")

        let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.config(dot, dir: dir))
        #expect(try CommandLineTests.run(["check", "-c", cfg]).status == 0)
        let (status, text) = try DeviceLoginTests.login(cfg) { code in
            #expect(code.count == 8, "user code: \(code)")
            // Approved only after at least one poll was answered authorization_pending.
            let deadline = Date().addingTimeInterval(10)
            while (try? dot.stats()["token_errors"] as? [String: Any])?["authorization_pending"] == nil && Date() < deadline {
                Thread.sleep(forTimeInterval: 0.1)
            }
            try dot.decideDevice(userCode: code, user: "bob")
        }
        #expect(status == 0, "\(text)\n\(dot.log.suffix(2000))")
        #expect(text.contains("Open http://127.0.0.1:\(dot.port)/o/device/ and enter code "), "\(text)")
        let token = try CommandLineTests.run(["token", "-c", cfg, "tv"])
        #expect(token.status == 0, "\(token.stderr)")
        let me = try dot.api("/api/me", token: token.stdout.trimmingCharacters(in: .newlines))
        #expect(DjangoOAuthToolkitTests.json(me)["user"] as? String == "bob", "\(me.bodyText)")
        #expect(DjangoOAuthToolkitTests.json(me)["client_id"] as? String == "tv", "\(me.bodyText)")

        // The device-flow session is renewed with its rotated refresh token like any other.
        let port = try RunningBearerd.freePort()
        let running = try RunningBearerd(config: "listen: 127.0.0.1:\(port)\n" + Self.config(dot, dir: dir), dir: dir)
        defer { _ = running.stop() }
        #expect(running.waitServing(port: port, path: "/hello")?.status == 200, "\(running.logs)")
        try dot.expireAll()
        let after = try TestClient.get(port: port, path: "/after")
        #expect(after.status == 200, "\(running.logs)")
        #expect(DjangoOAuthToolkitTests.json(after)["user"] as? String == "bob")
        #expect(try dot.tokenRequests("refresh_token") == 1)
        // Only the RFC 8414 URL that `check` with issuer: tried (DOT's default mount has none).
        #expect((try dot.stats()["not_found"] as? [String]) == ["/.well-known/oauth-authorization-server/o"])
    }

    @Test func deniedStopsWithAClearMessage() throws {
        let dot = try DjangoOAuthFixture.start()
        defer { dot.stop() }
        let dir = try RunningBearerd.tempDir("dot-device")
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.config(dot, dir: dir))
        let (status, text) = try DeviceLoginTests.login(cfg) { code in
            try dot.decideDevice(userCode: code, approve: false)
        }
        #expect(status == 1)
        #expect(text.contains("refused (access_denied)"), "\(text)")
        #expect(!FileManager.default.fileExists(atPath: dir + "/state/tv.json"))
    }
}
