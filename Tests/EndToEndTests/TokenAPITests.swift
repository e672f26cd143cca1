import Foundation
import Testing
import BearerdTestSupport

/// The local token endpoint (docs/architecture.md §4 `token_api:`) with the real binary and the Authlib
/// fixture: a unix socket whose peers are checked with SO_PEERCRED (a client run as uid 65534
/// is refused), a loopback TCP port that demands `Bearerd-Token-Request: 1` and refuses
/// browser-like requests, sessions it is not configured for, and `bearerd check` refusing a
/// non-loopback TCP listen.
@Suite("Token API", .serialized, .enabled(if: Prerequisite.runs(AuthServerFixture.isAvailable), "\(AuthServerFixture.unavailableReason ?? "")"))
struct TokenAPITests {
    struct Answer {
        var status: Int
        var headers: [String: String]
        var body: String
        var json: [String: Any] { TokenSinkTests.jsonObject(body) ?? [:] }
    }

    /// Sends one raw HTTP/1.1 request over a unix socket from a python3 child process, run as
    /// `uid` when given (setpriv), and parses the answer.
    static func unixRequest(_ socket: String, _ request: String, uid: UInt32? = nil) throws -> Answer {
        let script = #"""
        import socket, sys
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(10)
        s.connect(sys.argv[1])
        try:
            s.sendall(sys.argv[2].encode())
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused at accept and closed already: the answer is still there to read
        data = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break  # a peer refused at accept: its answer, then the close of an unread socket
            if not chunk:
                break
            data += chunk
        sys.stdout.write(data.decode("utf-8", "replace"))
        """#
        let p = Process()
        let python = ["/usr/bin/python3", "-c", script, socket, request]
        if let uid {
            p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            p.arguments = ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups"] + python
        } else {
            p.executableURL = URL(fileURLWithPath: python[0])
            p.arguments = Array(python.dropFirst())
        }
        let out = Pipe(), err = Pipe()
        p.standardOutput = out
        p.standardError = err
        try p.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        let errors = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        #expect(p.terminationStatus == 0, "\(String(decoding: errors, as: UTF8.self))")
        return parse(String(decoding: data, as: UTF8.self))
    }

    /// What a raw unix-socket client saw: every byte until the server closed (or `seconds`
    /// passed: `timedOut`), and whether the close was a reset.
    struct Raw {
        var text: String
        var timedOut: Bool
        var reset: Bool
        var statusLines: [Substring] { text.split(separator: "\r\n").filter { $0.hasPrefix("HTTP/1.1 ") } }
    }

    /// Connects to `socket` (as `uid` when given), sends `request` (nothing when empty), and
    /// reads until the server closes, at most `seconds`. The client never sends more, and never
    /// closes first: whatever ends the connection is the server's doing.
    static func rawUnix(_ socket: String, _ request: String, uid: UInt32? = nil, seconds: Double = 5) throws -> Raw {
        let script = #"""
        import socket, sys, time
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(sys.argv[1])
        if sys.argv[2]:
            try:
                s.sendall(sys.argv[2].encode())
            except (BrokenPipeError, ConnectionResetError):
                pass  # closed by the server already (refused at accept): its answer is still there to read
        s.settimeout(float(sys.argv[3]))
        data, end = b"", "eof"
        while True:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                end = "timeout"
                break
            except ConnectionResetError:
                end = "reset"
                break
            if not chunk:
                break
            data += chunk
        sys.stdout.write(end + "\n" + data.decode("utf-8", "replace"))
        """#
        let p = Process()
        let python = ["/usr/bin/python3", "-c", script, socket, request, String(seconds)]
        if let uid {
            p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
            p.arguments = ["--reuid=\(uid)", "--regid=\(uid)", "--clear-groups"] + python
        } else {
            p.executableURL = URL(fileURLWithPath: python[0])
            p.arguments = Array(python.dropFirst())
        }
        let out = Pipe(), err = Pipe()
        p.standardOutput = out
        p.standardError = err
        try p.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        let errors = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        #expect(p.terminationStatus == 0, "\(String(decoding: errors, as: UTF8.self))")
        let text = String(decoding: data, as: UTF8.self)
        let end = text.prefix { $0 != "\n" }
        return Raw(text: String(text.dropFirst(end.count + 1)), timedOut: end == "timeout", reset: end == "reset")
    }

    static func parse(_ text: String) -> Answer {
        let parts = text.components(separatedBy: "\r\n\r\n")
        let headLines = (parts.first ?? "").components(separatedBy: "\r\n")
        let status = Int(headLines.first?.split(separator: " ").dropFirst().first ?? "") ?? 0
        var headers: [String: String] = [:]
        for l in headLines.dropFirst() {
            guard let colon = l.firstIndex(of: ":") else { continue }
            headers[l[..<colon].lowercased()] = l[l.index(after: colon)...].trimmingCharacters(in: .whitespaces)
        }
        return Answer(status: status, headers: headers, body: parts.dropFirst().joined(separator: "\r\n\r\n"))
    }

    static func get(_ path: String, _ extra: [String] = [], method: String = "GET") -> String {
        ([ "\(method) \(path) HTTP/1.1", "Host: localhost", "Connection: close" ] + extra).joined(separator: "\r\n") + "\r\n\r\n"
    }

    static func tcp(_ port: UInt16, _ path: String, _ headers: [(String, String)]) throws -> Answer {
        let r = try TestClient.get(port: port, path: path, headers: headers)
        var h: [String: String] = [:]
        for f in r.head.headers.fields { h[f.name.lowercased()] = f.value }
        return Answer(status: r.status, headers: h, body: r.bodyText)
    }

    static func config(auth: AuthServerFixture, port: UInt16, admin: UInt16, tokenAPI: String) -> String {
        """
        listen: [127.0.0.1:\(port)]
        admin: 127.0.0.1:\(admin)
        sessions:
          partner:
            grant: client_credentials
            token_url: \(auth.tokenURL)
            client_id: svc
            client_secret: svc-secret
          other:
            grant: client_credentials
            token_url: \(auth.tokenURL)
            client_id: svc-post
            client_secret: post-secret
            client_auth: client_secret_post
          broken:
            grant: client_credentials
            token_url: \(auth.tokenURL)
            client_id: svc
            client_secret: wrong-secret
        token_api:
        \(tokenAPI)
        routes:
          - match: /
            upstream: http://127.0.0.1:9
            session: partner
        """
    }

    @Test func unixSocketChecksThePeerUidAndServesOnlyListedSessions() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("token-api-unix")
        #expect(chmod(dir, 0o755) == 0)
        let socket = dir + "/token.sock"
        let port = try RunningBearerd.freePort()
        let admin = try RunningBearerd.freePort()
        let cfg = Self.config(auth: auth, port: port, admin: admin, tokenAPI: """
              listen: unix:\(socket)
              sessions: [partner, broken]
              allowed_uids: [\(getuid())]
            """)
        let b = try RunningBearerd(config: cfg, dir: dir)
        defer { _ = b.stop() }
        #expect(b.waitServing(port: admin, path: "/healthz") != nil, "\(b.logs)")
        #expect(TokenSinkTests.wait(seconds: 10) { FileManager.default.fileExists(atPath: socket) })

        // The right caller, the right session: the JSON form with the token the proxy holds.
        let before = Int64(Date().timeIntervalSince1970)
        let ok = try Self.unixRequest(socket, Self.get("/v1/token/partner"))
        #expect(ok.status == 200, "\(ok.body) \(b.logs)")
        #expect(ok.headers["content-type"] == "application/json")
        #expect(ok.headers["cache-control"] == "no-store")
        let o = ok.json
        #expect(o.count == 4)
        let token = try #require(o["access_token"] as? String)
        #expect(o["token_type"] as? String == "Bearer")
        #expect(o["session"] as? String == "partner")
        let expiresAt = try TokenFormatCommandTests.seconds(try #require(o["expires_at"] as? String))
        #expect(expiresAt >= before + 3600 - 2 && expiresAt <= Int64(Date().timeIntervalSince1970) + 3600)
        let api = try TestClient.get(port: auth.port, path: "/api/x", headers: [("Authorization", "Bearer " + token)])
        #expect(api.status == 200, "the token is a live one: \(api.bodyText)")
        // A second call hands out the same token (no new token request).
        #expect(try Self.unixRequest(socket, Self.get("/v1/token/partner")).json["access_token"] as? String == token)

        // Another uid: refused, nothing handed out (a client run as uid 65534 needs root to start).
        let asRoot = try Prerequisite.check(Prerequisite.isRoot, "root (a client run as uid 65534 with setpriv)")
        if asRoot {
            let stranger = try Self.unixRequest(socket, Self.get("/v1/token/partner"), uid: 65534)
            #expect(stranger.status == 403, "\(stranger.body)")
            #expect(stranger.json["error"] as? String == "peer_not_allowed")
            #expect(!stranger.body.contains(token))
        }

        // Browser-like requests: refused even from an allowed uid.
        for h in ["Origin: http://127.0.0.1", "Sec-Fetch-Site: same-origin", "Sec-Fetch-Mode: cors"] {
            let r = try Self.unixRequest(socket, Self.get("/v1/token/partner", [h]))
            #expect(r.status == 403, "\(h): \(r.body)")
            #expect(r.json["error"] as? String == "browser_request_refused")
        }
        // Unknown, or defined but not listed: 404, never its token.
        for name in ["nope", "other", "partner/", "Partner", "partner%00"] {
            let r = try Self.unixRequest(socket, Self.get("/v1/token/" + name))
            #expect(r.status == 404, "\(name): \(r.body)")
            #expect(r.headers["content-type"] == "application/json")
            #expect(r.json["access_token"] == nil)
        }
        let wrongPath = try Self.unixRequest(socket, Self.get("/v1/tokens/partner"))
        #expect(wrongPath.status == 404)
        let post = try Self.unixRequest(socket, Self.get("/v1/token/partner", ["Content-Length: 0"], method: "POST"))
        #expect(post.status == 405, "\(post.body)")
        #expect(post.json["error"] as? String == "method_not_allowed")

        // A listed session without a token: 503 token_unavailable with Retry-After (docs/architecture.md §5).
        let broken = try Self.unixRequest(socket, Self.get("/v1/token/broken"))
        #expect(broken.status == 503, "\(broken.body)")
        #expect(broken.json["error"] as? String == "token_unavailable")
        #expect(broken.json["session"] as? String == "broken")
        #expect(Int(broken.headers["retry-after"] ?? "") ?? 0 >= 1, "\(broken.headers)")

        // Counted and logged with the caller and the fingerprint, never the token.
        let metrics = try TestClient.get(port: admin, path: "/metrics").bodyText
        #expect(TokenSinkTests.metric(metrics, "bearerd_token_api_handouts_total{session=\"partner\"}") == 2, "\(metrics)")
        #expect(TokenSinkTests.metric(metrics, "bearerd_token_api_handouts_total{session=\"other\"}") == 0)
        #expect(TokenSinkTests.wait(seconds: 5) { b.logs.components(separatedBy: "token handed out").count == 3 }, "\(b.logs)")
        let line = try #require(b.logs.split(separator: "\n").first { $0.contains("token handed out") })
        #expect(line.contains("uid \(getuid())"), "\(line)")
        #expect(line.contains("token.fingerprint"), "\(line)")
        #expect(!b.logs.contains(token))
        if asRoot { #expect(b.logs.contains("uid 65534"), "the refusal names the caller: \(b.logs)") }
    }

    /// A stranger on the unix socket is refused at accept: a 403 arrives before it sends a byte,
    /// and with a body announced (`Expect: 100-continue`) it never gets a 100. The allowed uid
    /// cannot send a body either (413 at the head, no 100), and a 403 ends its connection.
    @Test func strangersAreRefusedAtAcceptAndBodiesAreNeverRead() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("token-api-accept")
        #expect(chmod(dir, 0o755) == 0)
        let socket = dir + "/token.sock"
        let port = try RunningBearerd.freePort()
        let admin = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: Self.config(auth: auth, port: port, admin: admin, tokenAPI: """
              listen: unix:\(socket)
              sessions: [partner]
            """), dir: dir)
        defer { _ = b.stop() }
        #expect(b.waitServing(port: admin, path: "/healthz") != nil, "\(b.logs)")
        #expect(TokenSinkTests.wait(seconds: 10) { FileManager.default.fileExists(atPath: socket) })
        #expect(try Self.unixRequest(socket, Self.get("/v1/token/partner")).status == 200, "\(b.logs)")

        if getuid() == 0 {
            // Sends nothing at all: the answer comes anyway, then the close.
            let silent = try Self.rawUnix(socket, "", uid: 65534)
            #expect(!silent.timedOut, "refused at accept, not after reading a request: \(silent.text)")
            #expect(silent.statusLines == ["HTTP/1.1 403 Forbidden"], "\(silent.text)")
            #expect(silent.text.contains("peer_not_allowed"))
            // Announces a body and waits for 100 Continue: none comes, only the 403.
            let expecting = try Self.rawUnix(socket, "POST /v1/token/partner HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100000\r\nExpect: 100-continue\r\n\r\n",
                                             uid: 65534)
            #expect(!expecting.timedOut)
            #expect(!expecting.text.contains("100 Continue"), "\(expecting.text)")
            #expect(expecting.statusLines == ["HTTP/1.1 403 Forbidden"], "\(expecting.text)")
            #expect(b.waitLog("token API peer refused at accept"), "\(b.logs)")
            #expect(b.logs.contains("uid 65534"))
        } else if ProcessInfo.processInfo.environment["CI"] != nil {
            Issue.record("a client as another uid needs root (setpriv)")
        }

        // The allowed uid announcing a body: 413 at once, no 100 Continue, the connection closed.
        let body = try Self.rawUnix(socket, "POST /v1/token/partner HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        #expect(!body.timedOut, "\(body.text)")
        #expect(!body.text.contains("100 Continue"), "\(body.text)")
        #expect(body.statusLines == ["HTTP/1.1 413 Content Too Large"] || body.statusLines == ["HTTP/1.1 413 Payload Too Large"], "\(body.text)")
        #expect(body.text.contains("request_body_not_allowed"))
        // A GET with a body sent along: the same.
        let getBody = try Self.rawUnix(socket, "GET /v1/token/partner HTTP/1.1\r\nHost: localhost\r\nContent-Length: 3\r\n\r\nabc")
        #expect(getBody.statusLines.count == 1 && getBody.statusLines[0].hasPrefix("HTTP/1.1 413"), "\(getBody.text)")
        #expect(!getBody.text.contains("access_token"))

        // A 403 ends the connection: the request pipelined behind it is never answered.
        let pipelined = try Self.rawUnix(socket, Self.get("/v1/token/partner", ["Origin: http://127.0.0.1"]).replacingOccurrences(of: "Connection: close\r\n", with: "")
                                         + "GET /v1/token/partner HTTP/1.1\r\nHost: localhost\r\n\r\n")
        #expect(!pipelined.timedOut, "closed after the 403: \(pipelined.text)")
        #expect(pipelined.statusLines == ["HTTP/1.1 403 Forbidden"], "\(pipelined.text)")
        #expect(pipelined.text.contains("browser_request_refused"))
        #expect(!pipelined.text.contains("access_token"))
    }

    /// The TCP token API answers loopback names only, not a route's `host:` (a DNS-rebinding
    /// page on that name would read tokens); the admin listener on a loopback address checks
    /// Host the same way.
    @Test func tcpTokenAPIAndAdminAdmitLoopbackHostsOnly() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("token-api-host")
        let port = try RunningBearerd.freePort()
        let admin = try RunningBearerd.freePort()
        let apiPort = try RunningBearerd.freePort()
        let cfg = Self.config(auth: auth, port: port, admin: admin, tokenAPI: """
              listen: 127.0.0.1:\(apiPort)
              sessions: [partner]
            """).replacingOccurrences(of: "  - match: /\n", with: "  - match: /\n    host: api.example.com\n")
        #expect(cfg.contains("host: api.example.com"))
        let b = try RunningBearerd(config: cfg, dir: dir)
        defer { _ = b.stop() }
        #expect(b.waitServing(port: apiPort, path: "/v1/token/partner") != nil, "\(b.logs)")
        let marker = ("Bearerd-Token-Request", "1")
        for host in ["api.example.com", "api.example.com:\(apiPort)", "evil.example"] {
            let r = try Self.tcp(apiPort, "/v1/token/partner", [marker, ("Host", host)])
            #expect(r.status == 421, "\(host): \(r.status) \(r.body)")
            #expect(r.json["access_token"] == nil)
        }
        for host in ["localhost", "127.0.0.1:\(apiPort)", "[::1]:\(apiPort)", "localhost."] {
            let r = try Self.tcp(apiPort, "/v1/token/partner", [marker, ("Host", host)])
            #expect(r.status == 200, "\(host): \(r.status) \(r.body)")
        }

        for host in ["evil.example", "api.example.com", "evil.example:\(admin)"] {
            for path in ["/metrics", "/readyz", "/healthz"] {
                let r = try TestClient.get(port: admin, path: path, headers: [("Host", host)])
                #expect(r.status == 421, "\(host)\(path): \(r.status)")
                #expect(!r.bodyText.contains("bearerd_"), "\(r.bodyText)")
                #expect(!r.bodyText.contains("partner"), "\(r.bodyText)")
            }
        }
        for host in ["localhost:\(admin)", "127.0.0.1:\(admin)", "[::1]:\(admin)", "127.0.0.2"] {
            let r = try TestClient.get(port: admin, path: "/metrics", headers: [("Host", host)])
            #expect(r.status == 200, "\(host): \(r.status)")
            #expect(r.bodyText.contains("bearerd_build_info"))
        }
    }

    @Test func loopbackTCPNeedsTheRequestHeaderAndRefusesBrowsers() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("token-api-tcp")
        let port = try RunningBearerd.freePort()
        let admin = try RunningBearerd.freePort()
        let apiPort = try RunningBearerd.freePort()
        let cfg = Self.config(auth: auth, port: port, admin: admin, tokenAPI: """
              listen: 127.0.0.1:\(apiPort)
              sessions: [partner]
            """)
        let b = try RunningBearerd(config: cfg, dir: dir)
        defer { _ = b.stop() }
        #expect(b.waitServing(port: apiPort, path: "/v1/token/partner") != nil, "\(b.logs)")
        let marker = ("Bearerd-Token-Request", "1")

        let missing = try Self.tcp(apiPort, "/v1/token/partner", [])
        #expect(missing.status == 403, "\(missing.body)")
        #expect(missing.json["error"] as? String == "token_request_header_required")
        #expect(missing.json["access_token"] == nil)
        let wrong = try Self.tcp(apiPort, "/v1/token/partner", [("Bearerd-Token-Request", "yes")])
        #expect(wrong.status == 403)

        let ok = try Self.tcp(apiPort, "/v1/token/partner", [marker])
        #expect(ok.status == 200, "\(ok.body) \(b.logs)")
        let token = try #require(ok.json["access_token"] as? String)
        #expect(ok.json["session"] as? String == "partner")

        for browser in [("Origin", "http://127.0.0.1:\(apiPort)"), ("Origin", "null"), ("Sec-Fetch-Site", "same-origin"),
                        ("Sec-Fetch-Mode", "no-cors"), ("Sec-Fetch-Dest", "empty")] {
            let r = try Self.tcp(apiPort, "/v1/token/partner", [marker, browser])
            #expect(r.status == 403, "\(browser): \(r.body)")
            #expect(!r.body.contains(token))
        }
        // A Host that is not loopback (DNS rebinding) is refused before anything else.
        let rebound = try Self.tcp(apiPort, "/v1/token/partner", [marker, ("Host", "evil.example")])
        #expect(rebound.status == 421 || rebound.status == 403, "\(rebound.status) \(rebound.body)")
        #expect(!rebound.body.contains(token))
        let unknown = try Self.tcp(apiPort, "/v1/token/other", [marker])
        #expect(unknown.status == 404)
        #expect(b.logs.contains("caller"))
        #expect(b.logs.contains("127.0.0.1"))
        #expect(!b.logs.contains(token))
    }

    @Test func sighupMovesTheListenerAndChangesTheSessionsServed() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("token-api-reload")
        #expect(chmod(dir, 0o755) == 0)
        let port = try RunningBearerd.freePort()
        let admin = try RunningBearerd.freePort()
        let first = try RunningBearerd.freePort()
        let socket = dir + "/token.sock"
        let b = try RunningBearerd(config: Self.config(auth: auth, port: port, admin: admin, tokenAPI: """
              listen: 127.0.0.1:\(first)
              sessions: [partner]
            """), dir: dir)
        defer { _ = b.stop() }
        #expect(b.waitServing(port: first, path: "/v1/token/partner") != nil, "\(b.logs)")
        #expect(try Self.tcp(first, "/v1/token/partner", [("Bearerd-Token-Request", "1")]).status == 200)

        try b.rewrite(Self.config(auth: auth, port: port, admin: admin, tokenAPI: """
              listen: unix:\(socket)
              sessions: [other]
            """))
        b.signal(SIGHUP)
        #expect(b.waitLog("token API listener moved"), "\(b.logs)")
        // The old port no longer accepts; the socket serves the newly listed session only.
        #expect(TokenSinkTests.wait(seconds: 5) { (try? Self.tcp(first, "/v1/token/partner", [("Bearerd-Token-Request", "1")])) == nil })
        let other = try Self.unixRequest(socket, Self.get("/v1/token/other"))
        #expect(other.status == 200, "\(other.body) \(b.logs)")
        #expect(other.json["session"] as? String == "other")
        #expect(try Self.unixRequest(socket, Self.get("/v1/token/partner")).status == 404)

        // A reload that removes token_api: the socket stops answering.
        try b.rewrite(Self.config(auth: auth, port: port, admin: admin, tokenAPI: "").replacingOccurrences(of: "token_api:\n", with: ""))
        b.signal(SIGHUP)
        #expect(TokenSinkTests.wait(seconds: 10) { b.logs.components(separatedBy: "token API listener moved").count == 3 }, "\(b.logs)")
        #expect(TokenSinkTests.wait(seconds: 5) { !FileManager.default.fileExists(atPath: socket) }, "the socket file is removed")
    }

    @Test func checkRefusesANonLoopbackTCPListenAndUnknownSessions() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        for (listen, why) in [("0.0.0.0:9902", "not a loopback address"), ("192.0.2.1:9902", "not a loopback address"),
                              ("localhost:9902", "not a loopback address")] {
            let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.config(auth: auth, port: 8080, admin: 9901, tokenAPI: """
                  listen: \(listen)
                  sessions: [partner]
                """))
            let out = try CommandLineTests.run(["check", "-c", cfg])
            #expect(out.status != 0)
            #expect(out.stderr.contains("\(cfg):21: token_api.listen: "), "\(out.stderr)")
            #expect(out.stderr.contains(why), "\(out.stderr)")
        }
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", Self.config(auth: auth, port: 8080, admin: 9901, tokenAPI: """
              listen: 127.0.0.1:9902
              sessions: [partner, partnr]
              allowed_uids: [1000]
            """))
        let out = try CommandLineTests.run(["check", "-c", cfg])
        #expect(out.status != 0)
        #expect(out.stderr.contains("token_api.sessions[1]: no session named 'partnr' (did you mean 'partner'?)"), "\(out.stderr)")
        #expect(out.stderr.contains("token_api.allowed_uids: applies to a unix: listen only"), "\(out.stderr)")
        let good = try CommandLineTests.tempFile("bearerd.yaml", Self.config(auth: auth, port: 8080, admin: 9901, tokenAPI: """
              listen: "[::1]:9902"
              sessions: [partner]
            """))
        let fine = try CommandLineTests.run(["check", "-c", good])
        #expect(fine.status == 0, "\(fine.stderr)")
    }
}
