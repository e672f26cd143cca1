import Foundation
import Testing
import BearerdTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// `bearerd login` against the real authorization server (Authlib fixture): discovery from its
/// RFC 8414 metadata, authorization code with PKCE over a loopback redirect, a scripted browser
/// (`$BROWSER` runs curl, which follows the redirects as a person's browser would), then `token`
/// and `run` keep the session (docs/architecture.md §3, §4).
@Suite("bearerd login (authorization code + PKCE)", .serialized,
       .enabled(if: Prerequisite.runs(AuthServerFixture.isAvailable), "\(AuthServerFixture.unavailableReason ?? "")"))
struct LoginTests {
    /// A browser stand-in: curl follows the authorization endpoint's redirect to the loopback
    /// callback. `extra` is appended to the authorization URL (the fixture's test switches).
    static func browser(dir: String, extra: String = "") throws -> String {
        let path = dir + "/browser"
        try "#!/bin/sh\nexec curl -sS -o /dev/null -L \"$1\(extra)\"\n".write(toFile: path, atomically: true, encoding: .utf8)
        chmod(path, 0o755)
        return path
    }

    static func config(auth: AuthServerFixture, dir: String, extra: String = "") -> String {
        """
        state_dir: \(dir)/state
        sessions:
          me:
            grant: authorization_code
            issuer: \(auth.issuer)
            client_id: native
            client_auth: none
            scope: read
        \(extra)
        routes:
          - match: /
            upstream: \(auth.apiURL)
            session: me
        """
    }

    @Test func signInThenTokenAndRunKeepTheSession() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("login")
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.config(auth: auth, dir: dir))
        // Before anyone signed in, `token` says what to do.
        let before = try CommandLineTests.run(["token", "-c", cfg, "me"])
        #expect(before.status != 0)
        #expect(before.stderr.contains("bearerd login me"), "\(before.stderr)")
        // A proxy already running says so too (/readyz), and picks the sign-in up by itself.
        let port = try RunningBearerd.freePort(), admin = try RunningBearerd.freePort()
        let running = try RunningBearerd(config: "listen: 127.0.0.1:\(port)\nadmin: 127.0.0.1:\(admin)\n" + Self.config(auth: auth, dir: dir), dir: dir)
        defer { _ = running.stop() }
        #expect(running.waitServing(port: port, path: "/early")?.status == 503)
        let ready = try TestClient.get(port: admin, path: "/readyz")
        #expect(ready.status == 503)
        #expect(ready.bodyText.contains("bearerd login me"), "\(ready.bodyText)")

        let login = try CommandLineTests.run(["login", "-c", cfg, "me"], env: ["BROWSER": try Self.browser(dir: dir)])
        #expect(login.status == 0, "\(login.stderr)")
        #expect(login.stderr.contains("Open this URL to sign in: http://127.0.0.1:\(auth.port)/oauth/authorize?response_type=code&client_id=native"))
        #expect(login.stderr.contains("code_challenge_method=S256"))
        #expect(login.stderr.contains("redirect_uri=http%3A%2F%2F127.0.0.1%3A"))
        #expect(login.stderr.contains("Signed in"))
        var st = stat()
        #expect(stat(dir + "/state/me.json", &st) == 0 && (st.st_mode & 0o777) == 0o600)

        // `token` prints a token the API accepts; `run` serves requests as the signed-in user.
        let token = try CommandLineTests.run(["token", "-c", cfg, "me"])
        #expect(token.status == 0, "\(token.stderr)")
        let api = try auth.request("GET", "/api/direct", headers: [("Authorization", "Bearer \(token.stdout.trimmingCharacters(in: .newlines))")])
        #expect(api.status == 200)
        // No SIGHUP: the running proxy adopts the new sign-in on the next request.
        var through = try TestClient.get(port: port, path: "/hello")
        let deadline = Date().addingTimeInterval(10)
        while through.status != 200 && Date() < deadline {
            Thread.sleep(forTimeInterval: 0.3)
            through = try TestClient.get(port: port, path: "/hello")
        }
        #expect(through.status == 200, "\(running.logs)")
        #expect(through.bodyText.contains("alice"), "\(through.bodyText)")
        #expect(running.waitLog("new sign-in found in the state file"))
    }

    /// docs/architecture.md §5: endpoint URLs are used exactly as published or configured. The fixture serves
    /// `/oauth/authorize/`, `/oauth/token/` and `/oauth/revoke/` and answers 404 without the slash
    /// (as Django does); discovery (an issuer ending in `/`), the browser sign-in, a configured
    /// `token_url`, and a refresh after the access token was revoked at the published revocation
    /// endpoint all go to the slashed paths.
    @Test func endpointsThatEndInASlashAreUsedAsPublished() throws {
        let auth = try AuthServerFixture.start(trailingSlash: true)
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("login")
        let text = Self.config(auth: auth, dir: dir, extra: """
              svc:
                grant: client_credentials
                token_url: \(auth.tokenURL)
                client_id: svc
                client_secret: svc-secret
                scope: read
            """)
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", text)
        #expect(try CommandLineTests.run(["check", "-c", cfg]).status == 0)
        let login = try CommandLineTests.run(["login", "-c", cfg, "me", "--timeout", "30"], env: ["BROWSER": try Self.browser(dir: dir)])
        #expect(login.status == 0, "\(login.stderr)")
        #expect(login.stderr.contains("Open this URL to sign in: http://127.0.0.1:\(auth.port)/oauth/authorize/?response_type=code&client_id=native"),
                "\(login.stderr)")
        // A configured token_url ending in `/`.
        let svc = try CommandLineTests.run(["token", "-c", cfg, "svc"])
        #expect(svc.status == 0, "\(svc.stderr)")

        let port = try RunningBearerd.freePort()
        let running = try RunningBearerd(config: "listen: 127.0.0.1:\(port)\n" + text, dir: dir)
        defer { _ = running.stop() }
        #expect(running.waitServing(port: port, path: "/hello")?.status == 200, "\(running.logs)")
        // Revoke the stored access token at the published revocation endpoint (RFC 7009): the
        // next request's 401 makes bearerd refresh at `/oauth/token/` and replay.
        let meta = try JSONSerialization.jsonObject(with: Data(try auth.request("GET", "/.well-known/oauth-authorization-server").body)) as? [String: Any]
        let revocation = try #require(meta?["revocation_endpoint"] as? String)
        #expect(revocation == auth.revokeURL && revocation.hasSuffix("/oauth/revoke/"))
        let access = try CommandLineTests.run(["token", "-c", cfg, "me"]).stdout.trimmingCharacters(in: .newlines)
        let revoked = try auth.request("POST", String(revocation.dropFirst("http://127.0.0.1:\(auth.port)".count)),
                                       headers: [("Content-Type", "application/x-www-form-urlencoded")],
                                       body: Array("token=\(access)&token_type_hint=access_token&client_id=native".utf8))
        #expect(revoked.status == 200, "\(revoked.bodyText)")
        #expect(try auth.request("GET", "/api/direct", headers: [("Authorization", "Bearer \(access)")]).status == 401)
        let after = try TestClient.get(port: port, path: "/hello")
        #expect(after.status == 200, "\(running.logs)")
        let stats = try auth.stats()
        #expect(stats["not_found_without_slash"] as? Int == 0, "\(stats)")
        #expect(stats["revocations"] as? Int == 1, "\(stats)")
        #expect(((stats["by_grant"] as? [String: Any])?["refresh_token"] as? Int ?? 0) >= 1, "\(stats)")
    }

    /// Providers without metadata (GitHub OAuth apps): `authorization_url:` with `token_url:`
    /// instead of `issuer:`; `check` says which key is missing.
    @Test func endpointsNamedWithoutDiscovery() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("login")
        let named = Self.config(auth: auth, dir: dir).replacingOccurrences(of: "issuer: \(auth.issuer)", with: """
            authorization_url: http://127.0.0.1:\(auth.port)/oauth/authorize
                token_url: \(auth.tokenURL)
            """)
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", named)
        let check = try CommandLineTests.run(["check", "-c", cfg])
        #expect(check.status == 0, "\(check.stdout)\(check.stderr)")
        let login = try CommandLineTests.run(["login", "-c", cfg, "me", "--timeout", "30"], env: ["BROWSER": try Self.browser(dir: dir)])
        #expect(login.status == 0, "\(login.stderr)")
        #expect(login.stderr.contains("Open this URL to sign in: http://127.0.0.1:\(auth.port)/oauth/authorize?response_type=code"), "\(login.stderr)")
        let token = try CommandLineTests.run(["token", "-c", cfg, "me"])
        #expect(token.status == 0, "\(token.stderr)")
        #expect(try auth.request("GET", "/api/direct", headers: [("Authorization", "Bearer \(token.stdout.trimmingCharacters(in: .newlines))")]).status == 200)

        // token_url alone: the missing key is named, with the line of the session's token_url.
        let missing = try CommandLineTests.tempFile("bearerd.yaml", named.replacingOccurrences(
            of: "authorization_url: http://127.0.0.1:\(auth.port)/oauth/authorize\n    ", with: ""))
        let bad = try CommandLineTests.run(["check", "-c", missing])
        #expect(bad.status != 0)
        #expect((bad.stdout + bad.stderr).contains(":5: sessions.me.authorization_url: missing: grant authorization_code needs authorization_url: (with token_url:), or issuer:"),
                "\(bad.stdout)\(bad.stderr)")
        // The device endpoint key on an authorization_code session is refused.
        let wrong = try CommandLineTests.tempFile("bearerd.yaml", named.replacingOccurrences(of: "authorization_url:", with: "device_authorization_url:"))
        let bad2 = try CommandLineTests.run(["check", "-c", wrong])
        #expect(bad2.status != 0)
        #expect((bad2.stdout + bad2.stderr).contains("sessions.me.device_authorization_url: only used with grant device_code"), "\(bad2.stdout)\(bad2.stderr)")
    }

    /// Servers that compare redirect URIs exactly (Glewlwyd, many enterprise servers) refuse the
    /// port chosen at run time: the timeout says the server may have refused the redirect URI;
    /// `redirect_uri:` fixes the loopback URL (port and path as given) and the sign-in works.
    @Test func aFixedRedirectURIForServersThatCompareItExactly() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("login")
        let fixedPort = try RunningBearerd.freePort()
        let registered = "http://127.0.0.1:\(fixedPort)/bearerd/cb/"
        let body = try JSONSerialization.data(withJSONObject: ["client_id": "exact", "redirect_uri": registered])
        #expect(try auth.request("POST", "/_test/register-exact-redirect-client", headers: [("Content-Type", "application/json")],
                                 body: Array(body)).status == 200)
        let base = Self.config(auth: auth, dir: dir).replacingOccurrences(of: "client_id: native", with: "client_id: exact")
        let chosen = try CommandLineTests.tempFile("bearerd.yaml", base)
        let refused = try CommandLineTests.run(["login", "-c", chosen, "me", "--timeout", "2"], env: ["BROWSER": try Self.browser(dir: dir)])
        #expect(refused.status == 1)
        #expect(refused.stderr.contains("the server may have refused the redirect URI"), "\(refused.stderr)")
        #expect(refused.stderr.contains("redirect_uri:"), "\(refused.stderr)")

        let fixed = try CommandLineTests.tempFile("bearerd.yaml", base.replacingOccurrences(
            of: "scope: read", with: "scope: read\n    redirect_uri: \(registered)"))
        let login = try CommandLineTests.run(["login", "-c", fixed, "me", "--timeout", "30"], env: ["BROWSER": try Self.browser(dir: dir)])
        #expect(login.status == 0, "\(login.stderr)")
        #expect(login.stderr.contains("redirect_uri=http%3A%2F%2F127.0.0.1%3A\(fixedPort)%2Fbearerd%2Fcb%2F&"), "\(login.stderr)")
        let token = try CommandLineTests.run(["token", "-c", fixed, "me"])
        #expect(token.status == 0, "\(token.stderr)")

        // Only a loopback http URL: anything else is a config error with its line.
        for bad in ["https://127.0.0.1:8765/callback", "http://app.example.com:8765/callback", "http://10.0.0.1:8765/callback"] {
            let cfg = try CommandLineTests.tempFile("bearerd.yaml", base.replacingOccurrences(of: "scope: read", with: "scope: read\n    redirect_uri: \(bad)"))
            let check = try CommandLineTests.run(["check", "-c", cfg])
            #expect(check.status != 0)
            #expect((check.stdout + check.stderr).contains("bearerd.yaml:9: sessions.me.redirect_uri: must be an http:// loopback URL"),
                    "\(check.stdout)\(check.stderr)")
        }
    }

    /// OIDC Core §3.1.2.1: with `openid` in the scope a fresh `nonce` is sent (Authlib's
    /// OpenIDCode, required here, refuses the request without one) and the id_token must carry
    /// it back: a substituted one stops the sign-in and nothing is stored.
    /// A `dpop: true` person session: the code is exchanged with a DPoP proof (after the
    /// server's nonce demand), so the stored session's token is bound to the session's key.
    @Test func aDPoPSessionSignsInWithAProof() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        #expect(try auth.request("POST", "/_test/dpop?enable=1&nonce=1").status == 200)
        let dir = try RunningBearerd.tempDir("login")
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.config(auth: auth, dir: dir)
            .replacingOccurrences(of: "scope: read", with: "scope: read\n    dpop: true"))
        let check = try CommandLineTests.run(["check", "-c", cfg])
        #expect(check.status == 0, "\(check.stdout)\(check.stderr)")
        let login = try CommandLineTests.run(["login", "-c", cfg, "me", "--timeout", "30"], env: ["BROWSER": try Self.browser(dir: dir)])
        #expect(login.status == 0, "\(login.stderr)")
        let token = try CommandLineTests.run(["token", "-c", cfg, "--format", "json", "me"])
        #expect(token.status == 0, "\(token.stderr)")
        let object = try JSONSerialization.jsonObject(with: Data(token.stdout.utf8)) as? [String: Any]
        #expect(object?["token_type"] as? String == "DPoP", "\(token.stdout)")
        let access = try #require(object?["access_token"] as? String)
        let jkt = try #require(DPoPEndToEndTests.boundJKT(access), "the signed-in token is not DPoP-bound")
        // The key the token is bound to is the session's (check prints its thumbprint).
        let again = try CommandLineTests.run(["check", "-c", cfg])
        #expect(again.stdout.contains("jkt \(jkt)"), "\(again.stdout)")
    }

    @Test func openIDSignInSendsAndChecksANonce() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("login")
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.config(auth: auth, dir: dir).replacingOccurrences(of: "scope: read", with: "scope: openid read"))
        let bad = try CommandLineTests.run(["login", "-c", cfg, "me", "--timeout", "30"], env: ["BROWSER": try Self.browser(dir: dir, extra: "&test_bad_nonce=1")])
        #expect(bad.status == 1)
        #expect(bad.stderr.contains("the id_token's nonce does not match this sign-in"), "\(bad.stderr)")
        #expect(!FileManager.default.fileExists(atPath: dir + "/state/me.json"))

        let login = try CommandLineTests.run(["login", "-c", cfg, "me", "--timeout", "30"], env: ["BROWSER": try Self.browser(dir: dir)])
        #expect(login.status == 0, "\(login.stderr)")
        let url = login.stderr.split(separator: "\n").first { $0.hasPrefix("Open this URL to sign in: ") } ?? ""
        let nonces = url.split(separator: "&").filter { $0.hasPrefix("nonce=") }
        #expect(nonces.count == 1 && nonces[0].count >= 6 + 22, "\(url)")
        let again = try CommandLineTests.run(["login", "-c", cfg, "me", "--timeout", "30"], env: ["BROWSER": try Self.browser(dir: dir)])
        #expect(again.status == 0, "\(again.stderr)")
        #expect(!again.stderr.contains(String(nonces.first ?? "nonce=")), "a nonce is never reused")
        // Without openid, no nonce.
        #expect(!(try CommandLineTests.run(["login", "-c", try CommandLineTests.tempFile("bearerd.yaml", Self.config(auth: auth, dir: dir)), "me", "--timeout", "30"],
                                           env: ["BROWSER": try Self.browser(dir: dir)]).stderr.contains("nonce=")))
    }

    @Test func aRefusedOrForgedSignInStopsWithAClearMessage() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("login")
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.config(auth: auth, dir: dir))
        let denied = try CommandLineTests.run(["login", "-c", cfg, "me"], env: ["BROWSER": try Self.browser(dir: dir, extra: "&test_deny=1")])
        #expect(denied.status == 1)
        #expect(denied.stderr.contains("the sign-in was refused: access_denied"), "\(denied.stderr)")
        #expect(!FileManager.default.fileExists(atPath: dir + "/state/me.json"))

        // A callback with someone else's state (CSRF) is refused.
        let forger = dir + "/forger"
        try """
            #!/bin/sh
            redirect=$(printf '%s' "$1" | sed -n 's/.*redirect_uri=\\([^&]*\\).*/\\1/p' | sed 's/%3A/:/g; s/%2F/\\//g')
            exec curl -sS -o /dev/null "$redirect?code=stolen&state=forged"
            """.write(toFile: forger, atomically: true, encoding: .utf8)
        chmod(forger, 0o755)
        let forged = try CommandLineTests.run(["login", "-c", cfg, "me"], env: ["BROWSER": forger])
        #expect(forged.status == 1)
        #expect(forged.stderr.contains("state does not match"), "\(forged.stderr)")
    }

    @Test func discoveryProblemsAreReportedByCheck() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("login")
        // An issuer whose metadata names another issuer (localhost vs 127.0.0.1) is refused.
        let wrong = try CommandLineTests.tempFile("bearerd.yaml", Self.config(auth: auth, dir: dir).replacingOccurrences(
            of: "issuer: http://127.0.0.1:\(auth.port)", with: "issuer: http://localhost:\(auth.port)"))
        let check = try CommandLineTests.run(["check", "-c", wrong])
        #expect(check.status != 0)
        #expect(check.stdout.contains("sessions.me.issuer") || check.stderr.contains("sessions.me.issuer"), "\(check.stdout)\(check.stderr)")
        #expect((check.stdout + check.stderr).contains("RFC 8414 §3.3"))
        let closed = try RunningBearerd.freePort()
        let unreachable = try CommandLineTests.tempFile("bearerd.yaml", Self.config(auth: auth, dir: dir).replacingOccurrences(
            of: "issuer: http://127.0.0.1:\(auth.port)", with: "issuer: http://127.0.0.1:\(closed)"))
        let check2 = try CommandLineTests.run(["check", "-c", unreachable])
        #expect(check2.status != 0)
        #expect((check2.stdout + check2.stderr).contains("cannot read the metadata of http://127.0.0.1:\(closed)"))
    }
}

/// The device flow (RFC 8628): `bearerd login` prints the code, a person (the test) approves it at
/// the fixture, and the polling `login` stores the session; a denial stops it clearly.
@Suite("bearerd login (device flow)", .serialized,
       .enabled(if: Prerequisite.runs(AuthServerFixture.isAvailable), "\(AuthServerFixture.unavailableReason ?? "")"))
struct DeviceLoginTests {
    static func config(auth: AuthServerFixture, dir: String, endpoints: String? = nil) -> String {
        """
        state_dir: \(dir)/state
        sessions:
          tv:
            grant: device_code
            \(endpoints ?? "issuer: \(auth.issuer)")
            client_id: tv
            client_auth: none
            scope: read
        routes:
          - match: /
            upstream: \(auth.apiURL)
            session: tv
        """
    }

    /// Starts `bearerd login`, waits for its "enter code" line, lets `decide` act on the user
    /// code, and returns the exit status with everything it printed.
    static func login(_ cfg: String, decide: (String) throws -> Void) throws -> (Int32, String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: CommandLineTests.binary)
        p.arguments = ["login", "-c", cfg, "tv"]
        let err = Pipe()
        p.standardError = err
        p.standardOutput = FileHandle.nullDevice
        try p.run()
        var text = ""
        let fh = err.fileHandleForReading
        while !text.contains(" and enter code ") || !text.hasSuffix("\n") {
            let d = fh.availableData
            if d.isEmpty { break }
            text += String(decoding: d, as: UTF8.self)
        }
        let code = text.split(separator: "\n").first { $0.contains(" and enter code ") }
            .map { String($0.split(separator: " ").last ?? "") } ?? ""
        try decide(code)
        text += String(decoding: fh.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        return (p.terminationStatus, text)
    }

    /// Also against endpoints that end in `/` and 404 without it (django-oauth-toolkit's shape):
    /// the device authorization and token endpoints are used exactly as published (docs/architecture.md §5).
    @Test(arguments: [false, true]) func approvedAtTheVerificationPage(trailingSlash: Bool) throws {
        let auth = try AuthServerFixture.start(trailingSlash: trailingSlash)
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("device")
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.config(auth: auth, dir: dir))
        let (status, text) = try Self.login(cfg) { code in
            #expect(code.count == 9, "user code: \(code)")
            Thread.sleep(forTimeInterval: 1)  // the person takes a moment; login keeps polling
            _ = try auth.request("POST", "/_test/device/approve", headers: [("Content-Type", "application/json")],
                                 body: Array(#"{"user_code":"\#(code)","user":"bob"}"#.utf8))
        }
        #expect(status == 0, "\(text)")
        #expect(text.contains("Open http://127.0.0.1:\(auth.port)/device and enter code "))
        let token = try CommandLineTests.run(["token", "-c", cfg, "tv"])
        #expect(token.status == 0, "\(token.stderr)")
        let api = try auth.request("GET", "/api/whoami", headers: [("Authorization", "Bearer \(token.stdout.trimmingCharacters(in: .newlines))")])
        #expect(api.status == 200)
        #expect(api.bodyText.contains("bob"), "\(api.bodyText)")
        // Polling kept to the interval: no slow_down earned.
        let stats = try auth.stats()
        #expect(((stats["by_grant"] as? [String: Any])?["device_poll_fast"]) == nil, "\(stats)")
        #expect(stats["not_found_without_slash"] as? Int == 0, "\(stats)")
    }

    /// Without discovery: `device_authorization_url:` with `token_url:`.
    @Test func approvedWithoutDiscovery() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("device")
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.config(auth: auth, dir: dir, endpoints: """
            device_authorization_url: http://127.0.0.1:\(auth.port)/oauth/device
                token_url: \(auth.tokenURL)
            """))
        let (status, text) = try Self.login(cfg) { code in
            _ = try auth.request("POST", "/_test/device/approve", headers: [("Content-Type", "application/json")],
                                 body: Array(#"{"user_code":"\#(code)","user":"bob"}"#.utf8))
        }
        #expect(status == 0, "\(text)")
        let token = try CommandLineTests.run(["token", "-c", cfg, "tv"])
        #expect(token.status == 0, "\(token.stderr)")
        #expect(try auth.request("GET", "/api/whoami", headers: [("Authorization", "Bearer \(token.stdout.trimmingCharacters(in: .newlines))")]).bodyText.contains("bob"))
    }

    @Test func deniedStopsWithAClearMessage() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("device")
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.config(auth: auth, dir: dir))
        let (status, text) = try Self.login(cfg) { code in
            _ = try auth.request("POST", "/_test/device/approve", headers: [("Content-Type", "application/json")],
                                 body: Array(#"{"user_code":"\#(code)","approve":false}"#.utf8))
        }
        #expect(status == 1)
        #expect(text.contains("refused (access_denied)"), "\(text)")
    }
}
