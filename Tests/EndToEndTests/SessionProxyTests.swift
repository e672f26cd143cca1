import Foundation
import Testing
import BearerdHTTP
import BearerdIO
import BearerdOAuth
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

/// Token sessions end to end: bearerd in front of a real Authlib authorization server whose
/// Bearer-protected `/api/` is the upstream (it validates tokens and answers 401 with
/// `WWW-Authenticate`), with its fault hooks for the token endpoint.
@Suite("Sessions against a real authorization server", .serialized, .enabled(if: Prerequisite.runs(AuthServerFixture.isAvailable), "\(AuthServerFixture.unavailableReason ?? "")"))
struct SessionProxyTests {
    static func session(_ name: String = "s", grant: GrantType = .clientCredentials, auth: AuthServerFixture,
                        clientID: String = "svc", secret: String? = "svc-secret", clientAuth: ClientAuthentication = .clientSecretBasic,
                        username: String? = nil, password: String? = nil, scope: String? = nil) -> SessionConfig {
        SessionConfig(name: name, grant: grant,
                      tokenURL: EndpointURL(scheme: "http", host: "127.0.0.1", port: auth.port, path: "/oauth/token"),
                      clientID: clientID, clientSecret: secret.map { .literal(Secret($0)) }, clientAuth: clientAuth,
                      scope: scope, username: username, password: password.map { .literal(Secret($0)) })
    }

    static func apiRoute(_ auth: AuthServerFixture, session: String = "s", replayBodyLimit: Int = 1 << 20) -> RouteConfig {
        var r = route("/", origin: auth.port, basePath: "/api")
        r.session = session
        r.replayBodyLimit = replayBodyLimit
        return r
    }

    static func json(_ r: TestClient.Response) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(r.body))) as? [String: Any] ?? [:]
    }

    static func count(_ stats: [String: Any], _ group: String, _ key: String) -> Int {
        ((stats[group] as? [String: Any])?[key] as? Int) ?? 0
    }

    @Test(arguments: [
        ("svc", "svc-secret", ClientAuthentication.clientSecretBasic),
        ("svc-post", "post-secret", ClientAuthentication.clientSecretPost),
        ("we:ird", "p@ss w+rd/:", ClientAuthentication.clientSecretBasic),
    ])
    func clientCredentialsInjectsABearerToken(clientID: String, secret: String, method: ClientAuthentication) throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let proxy = try TestProxy(routes: [Self.apiRoute(auth)],
                                  sessions: [Self.session(auth: auth, clientID: clientID, secret: secret, clientAuth: method)])
        defer { proxy.stop() }
        let r = try TestClient.get(port: proxy.port, path: "/hello?x=1", headers: [("Authorization", "Bearer client-own-token")])
        #expect(r.status == 200, "\(r.bodyText)")
        #expect(Self.json(r)["client_id"] as? String == clientID)
        #expect(Self.json(r)["path"] as? String == "/api/hello")
        #expect(Self.count(try auth.stats(), "by_grant", "client_credentials") == 1)
        #expect(!proxy.logs.text.contains(secret))
    }

    @Test func passwordGrantWorks() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let proxy = try TestProxy(routes: [Self.apiRoute(auth)],
                                  sessions: [Self.session(grant: .password, auth: auth, clientID: "app", secret: "app-secret",
                                                          username: "alice", password: "wonderland", scope: "read")])
        defer { proxy.stop() }
        let r = try TestClient.get(port: proxy.port, path: "/me")
        #expect(r.status == 200)
        #expect(Self.json(r)["user"] as? String == "alice")
        #expect(Self.json(r)["scope"] as? String == "read")
        #expect(!proxy.logs.text.contains("wonderland"))
    }

    @Test func revocationLeadsToOneRefreshAndAReplayOfGetAndPost() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let proxy = try TestProxy(routes: [Self.apiRoute(auth)], sessions: [Self.session(auth: auth)])
        defer { proxy.stop() }
        #expect(try TestClient.get(port: proxy.port, path: "/warm").status == 200)
        try auth.revokeAll()
        let get = try TestClient.get(port: proxy.port, path: "/after-revoke")
        #expect(get.status == 200)
        #expect(Self.count(try auth.stats(), "by_grant", "client_credentials") == 2)

        try auth.revokeAll()
        let body = TestOrigin.pattern(256 * 1024, seed: 7)
        let c = try TestClient(port: proxy.port)
        try c.send(Array("POST /upload HTTP/1.1\r\nHost: x\r\nContent-Length: \(body.count)\r\nContent-Type: application/octet-stream\r\n\r\n".utf8) + body)
        let post = try c.readResponse(method: "POST")
        #expect(post.status == 200)
        let digest = BearerdOAuth.hex(SHA256.hash(body))
        #expect(Self.json(post)["body_sha256"] as? String == digest)
        #expect(Self.json(post)["body_length"] as? Int == body.count)
        let stats = try auth.stats()
        #expect(Self.count(stats, "by_grant", "client_credentials") == 3)
        #expect(proxy.logs.text.contains("replaying rejected request"))
    }

    @Test func manyRequestsRejectedTogetherCauseOneRefresh() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let proxy = try TestProxy(routes: [Self.apiRoute(auth)], sessions: [Self.session(auth: auth)])
        defer { proxy.stop() }
        #expect(try TestClient.get(port: proxy.port, path: "/warm").status == 200)
        // Open the client connections first, then revoke, then fire every request at once.
        let n = 500
        let clients = try (0..<n).map { _ in try TestClient(port: proxy.port, timeout: 60) }
        try auth.revokeAll()
        for (i, c) in clients.enumerated() { try c.send("GET /c/\(i) HTTP/1.1\r\nHost: x\r\n\r\n") }
        var ok = 0
        for c in clients where (try? c.readResponse())?.status == 200 { ok += 1 }
        #expect(ok == n)
        #expect(Self.count(try auth.stats(), "by_grant", "client_credentials") == 2)
    }

    @Test func largeStreamedBodyIsNotReplayedAndTheRejectionReachesTheClient() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let proxy = try TestProxy(routes: [Self.apiRoute(auth)], sessions: [Self.session(auth: auth)])
        defer { proxy.stop() }
        #expect(try TestClient.get(port: proxy.port, path: "/warm").status == 200)
        try auth.revokeAll()
        let body = TestOrigin.pattern(2 << 20)
        let c = try TestClient(port: proxy.port, timeout: 30)
        try c.send(Array("POST /big HTTP/1.1\r\nHost: x\r\nContent-Length: \(body.count)\r\n\r\n".utf8) + body)
        let r = try c.readResponse(method: "POST")
        #expect(r.status == 401)
        #expect(r["WWW-Authenticate"]?.contains("invalid_token") == true)
        // The token was still refreshed for later requests.
        Thread.sleep(forTimeInterval: 0.3)
        #expect(Self.count(try auth.stats(), "by_grant", "client_credentials") == 2)
        #expect(try TestClient.get(port: proxy.port, path: "/later").status == 200)
    }

    @Test func insufficientScopeIsNeverReplayed() throws {
        let origin = try TestOrigin { _ in
            .response(status: 401, headers: [("WWW-Authenticate", "Bearer error=\"insufficient_scope\", scope=\"admin\"")], body: Array("no".utf8))
        }
        defer { origin.stop() }
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        var r = route(origin: origin.port)
        r.session = "s"
        let proxy = try TestProxy(routes: [r], sessions: [Self.session(auth: auth)])
        defer { proxy.stop() }
        let resp = try TestClient.get(port: proxy.port, path: "/admin")
        #expect(resp.status == 401)
        #expect(origin.requests.count == 1)
        #expect(origin.requests.first?.head.headers["Authorization"]?.hasPrefix("Bearer ") == true)
        #expect(Self.count(try auth.stats(), "by_grant", "client_credentials") == 1)
    }

    @Test func tokenEndpointFailureWhileTheTokenIsValidFailsNoRequest() throws {
        let auth = try AuthServerFixture.start(tokenLifetime: 3600)
        defer { auth.stop() }
        let proxy = try TestProxy(routes: [Self.apiRoute(auth)], sessions: [Self.session(auth: auth)])
        defer { proxy.stop() }
        #expect(try TestClient.get(port: proxy.port, path: "/warm").status == 200)
        try auth.failNextTokenRequests(count: 100, status: 503, error: "temporarily_unavailable")
        for i in 0..<20 {
            #expect(try TestClient.get(port: proxy.port, path: "/still/\(i)").status == 200)
        }
        #expect(Self.count(try auth.stats(), "by_grant", "client_credentials") == 1)
    }

    @Test func noTokenGives503WithRetryAfterAndRecovers() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        try auth.failNextTokenRequests(count: 3, status: 503, error: "temporarily_unavailable", retryAfter: "1")
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        var r = route(origin: origin.port)
        r.session = "s"
        // docs/architecture.md §6: a request waits for the next attempt when it starts within wait_timeout;
        // with 500 ms against Retry-After: 1 none does, so the client gets the 503 at once.
        var session = Self.session(auth: auth)
        session.waitTimeout = .milliseconds(500)
        let proxy = try TestProxy(routes: [r], sessions: [session])
        defer { proxy.stop() }
        let first = try TestClient.get(port: proxy.port, path: "/x")
        #expect(first.status == 503)
        #expect(first["Retry-After"].flatMap(Int.init) != nil)
        #expect(first["Content-Type"] == "application/json")
        #expect(first.bodyText.contains("\"error\":\"token_unavailable\""))
        #expect(first.bodyText.contains("\"session\":\"s\""))
        #expect(first.bodyText.contains("temporarily_unavailable"))
        #expect(origin.requests.isEmpty)
        // The endpoint recovers (its scripted failures run out): within seconds requests pass.
        var recovered = false
        for _ in 0..<40 {
            Thread.sleep(forTimeInterval: 0.5)
            if (try? TestClient.get(port: proxy.port, path: "/y"))?.status == 200 { recovered = true; break }
        }
        #expect(recovered)
        #expect(origin.requests.first?.head.headers["Authorization"]?.hasPrefix("Bearer ") == true)
    }

    @Test func invalidClientIsSurfacedInThe503AndLogs() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let proxy = try TestProxy(routes: [Self.apiRoute(auth)], sessions: [Self.session(auth: auth, secret: "wrong-secret")])
        defer { proxy.stop() }
        let r = try TestClient.get(port: proxy.port, path: "/x")
        #expect(r.status == 503)
        #expect(r.bodyText.contains("invalid_client"))
        #expect(!r.bodyText.contains("wrong-secret"))
        Thread.sleep(forTimeInterval: 0.2)
        #expect(proxy.logs.text.contains("invalid_client"))
        #expect(!proxy.logs.text.contains("wrong-secret"))
    }

    @Test func afterExpiryWithTheEndpointDownRequestsGet503AndTheUpstreamIsNotCalled() throws {
        let auth = try AuthServerFixture.start(tokenLifetime: 3)
        defer { auth.stop() }
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        var r = route(origin: origin.port)
        r.session = "s"
        let proxy = try TestProxy(routes: [r], sessions: [Self.session(auth: auth)])
        defer { proxy.stop() }
        #expect(try TestClient.get(port: proxy.port, path: "/valid").status == 200)
        try auth.failNextTokenRequests(count: 1000, status: 500, error: "server_error")
        // While the token is valid every request passes, even with the endpoint failing.
        #expect(try TestClient.get(port: proxy.port, path: "/still-valid").status == 200)
        Thread.sleep(forTimeInterval: 3.5)
        let before = origin.requests.count
        let expired = try TestClient.get(port: proxy.port, path: "/expired")
        #expect(expired.status == 503)
        #expect((expired["Retry-After"].flatMap(Int.init) ?? 0) >= 1)
        #expect(expired.bodyText.contains("server_error"))
        #expect(origin.requests.count == before)
        try auth.clearFaults()
        var recovered = false
        for _ in 0..<60 {
            if (try? TestClient.get(port: proxy.port, path: "/back"))?.status == 200 { recovered = true; break }
            Thread.sleep(forTimeInterval: 0.5)
        }
        #expect(recovered, "no recovery within 30 s after the endpoint came back")
    }

    @Test func adminReportsSessionReadinessAndCounters() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let proxy = try TestProxy(routes: [Self.apiRoute(auth)], sessions: [Self.session(auth: auth)], admin: true)
        defer { proxy.stop() }
        let admin = try #require(proxy.server.adminAddress).port
        var ready = false
        for _ in 0..<50 {
            if (try? TestClient.get(port: admin, path: "/readyz"))?.status == 200 { ready = true; break }
            Thread.sleep(forTimeInterval: 0.1)
        }
        #expect(ready)
        #expect(try TestClient.get(port: proxy.port, path: "/x").status == 200)
        let m = try TestClient.get(port: admin, path: "/metrics").bodyText
        #expect(m.contains("bearerd_token_requests_total{session=\"s\"} 1"))
        #expect(m.contains("bearerd_session_ready{session=\"s\"} 1"))
    }

    /// docs/architecture.md §6: a token endpoint answering `200` with an HTML page or an empty body is down,
    /// not refusing us: the session retries with backoff and the waiting request gets the token
    /// of the attempt after the endpoint recovers (it used to be negative-cached for 60 s).
    @Test func malformedTokenResponsesAreRetriedAndTheRequestWaitsForRecovery() throws {
        let tokens = try ScriptedTokenEndpoint { call in
            switch call.index {
            case 0: .steps([.respond(status: 200, headers: [("Content-Type", "text/html")],
                                     body: "<html><body>Down for maintenance</body></html>")])
            case 1: .steps([.respond(status: 200, headers: [("Content-Type", "application/json")], body: "")])
            default: .token(lifetime: 3600)
            }
        }
        defer { tokens.stop() }
        let origin = try TestOrigin { r in
            let token = r.head.headers["Authorization"].map { String($0.dropFirst("Bearer ".count)) }
            return tokens.isValid(token) ? .response(status: 200, headers: [], body: Array("ok".utf8))
                : .response(status: 401, headers: [("WWW-Authenticate", "Bearer error=\"invalid_token\"")], body: [])
        }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [withSession(route(origin: origin.port))], sessions: [scriptedSession(tokens)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port, timeout: 20)
        try c.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 200, "\(r.status) \(r.bodyText)")
        #expect(tokens.calls.count == 3)
        #expect(!proxy.logs.text.contains("not retried for a while"))
    }

    /// docs/architecture.md §6.9: revocations of proven tokens are never the breaker's business. Each
    /// POST follows a GET the token served, then the token is revoked: all 20 POSTs are
    /// replayed after one forced refresh each (they used to get the upstream's 401 from the
    /// sixth on, `reason=token.breaker_open`).
    @Test func twentyRevocationsOfProvenTokensAreAllReplayed() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let proxy = try TestProxy(routes: [Self.apiRoute(auth)], sessions: [Self.session(auth: auth)])
        defer { proxy.stop() }
        let started = Date()
        var replayed = 0
        for i in 0..<20 {
            // Twenty revocations in about 10 s: one every 0.5 s (forced refreshes are paced at 1/s).
            let due = started.addingTimeInterval(Double(i) * 0.5)
            if due > Date() { Thread.sleep(until: due) }
            let get = try TestClient.get(port: proxy.port, path: "/get/\(i)")
            #expect(get.status == 200, "GET \(i): \(get.status)")
            try auth.revokeAll()
            let c = try TestClient(port: proxy.port, timeout: 15)
            let body = Array("payload \(i)".utf8)
            try c.send(Array("POST /post/\(i) HTTP/1.1\r\nHost: x\r\nContent-Length: \(body.count)\r\n\r\n".utf8) + body)
            let post = try c.readResponse(method: "POST")
            #expect(post.status == 200, "POST \(i): \(post.status) \(post.bodyText)")
            if post.status == 200, Self.json(post)["body_length"] as? Int == body.count { replayed += 1 }
        }
        #expect(replayed == 20)
        #expect(Self.count(try auth.stats(), "by_grant", "client_credentials") == 21)
        #expect(!proxy.logs.text.contains("breaker"))
        #expect(!proxy.logs.text.contains("not replaying"))
    }

    /// docs/architecture.md §6.9: an upstream that rejects every token opens the breaker after 5
    /// forced refreshes; the token endpoint sees at most 6 requests (start + 5) however hard the
    /// clients push, and while it is open the rejections are logged once per route (they used
    /// to be logged once per request) and counted in `bearerd_rejections_not_replayed_total`.
    @Test func anUpstreamThatRejectsEveryTokenOpensTheBreakerAndLogsOncePerRoute() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let origin = try TestOrigin { _ in
            .response(status: 401, headers: [("WWW-Authenticate", "Bearer error=\"invalid_token\"")], body: Array("no".utf8))
        }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [withSession(route("/a/", origin: origin.port)), withSession(route("/b/", origin: origin.port))],
                                  sessions: [scriptedSession(tokens)], admin: true)
        defer { proxy.stop() }
        let session = try #require(proxy.server.sessions.session(named: "s"))
        let deadline = Date().addingTimeInterval(20)
        var statuses: [Int: Int] = [:]
        var openedAt: Date?
        var n = 0
        // Load until the breaker opened, then 2 s more (bounded: 20 s, 4000 requests).
        while Date() < deadline, n < 4000 {
            if openedAt == nil, session.metrics.breakerTrips > 0 { openedAt = Date() }
            if let openedAt, Date().timeIntervalSince(openedAt) > 2 { break }
            let path = n % 2 == 0 ? "/a/x" : "/b/x"
            let r = try TestClient.get(port: proxy.port, path: path)
            statuses[r.status, default: 0] += 1
            n += 1
        }
        #expect(openedAt != nil, "the breaker never opened (\(statuses))")
        #expect(session.metrics.breakerTrips == 1)
        #expect(tokens.calls.count <= 6, "\(tokens.calls.count) token requests")
        #expect(statuses[401, default: 0] > 0)
        let lines = proxy.logs.lines.filter { $0.contains("breaker is open") }
        #expect(lines.count == 2, "\(lines)")  // one per route
        #expect(proxy.logs.lines.filter { $0.contains("not replaying rejected request") && $0.hasPrefix("[warning]") }.isEmpty)
        let counted = session.metrics.rejectionsNotReplayed["breaker_open"] ?? 0
        #expect(counted >= 10, "\(counted)")
        let admin = try #require(proxy.server.adminAddress).port
        let m = try TestClient.get(port: admin, path: "/metrics").bodyText
        #expect(m.contains("bearerd_rejections_not_replayed_total{session=\"s\",reason=\"breaker_open\"} "))
    }
}
