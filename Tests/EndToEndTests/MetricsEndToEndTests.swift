import Foundation
import Testing
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

/// The admin listener over real sockets: traffic through bearerd (a 401 → refresh → replay, a
/// token endpoint that starts refusing the client, a session that never gets a token, routes
/// with and without `host:`, a 404 and a 400), then `/metrics` scraped and parsed by the
/// reference Prometheus parser (`prometheus_client`, Tests/Fixtures/parse_metrics.py), and
/// `/readyz` both ways.
@Suite("Admin metrics and readiness", .serialized,
       .enabled(if: Prerequisite.runs(PrometheusParser.isAvailable), "\(PrometheusParser.unavailableReason ?? "")"))
struct MetricsEndToEndTests {
    /// A token endpoint on 127.0.0.1 (TestOrigin): the n-th request gets `tok-<n>` (1 h), or
    /// RFC 6749 §5.2 `invalid_client` while `refusing`; each answer after `delay` seconds.
    final class TokenEndpoint: @unchecked Sendable {  // @unchecked: state guarded by `lock`
        private let lock = NSLock()
        private var served = 0
        private var _refusing: Bool
        private let delay: Double
        private(set) var origin: TestOrigin!

        init(refusing: Bool = false, delay: Double = 0) throws {
            _refusing = refusing
            self.delay = delay
            origin = try TestOrigin { [unowned self] _ in self.answer() }
        }

        var refusing: Bool {
            get { lock.withLock { _refusing } }
            set { lock.withLock { _refusing = newValue } }
        }
        var count: Int { lock.withLock { served } }

        private func answer() -> TestOrigin.Reply {
            let (n, refuse) = lock.withLock { served += 1; return (served, _refusing) }
            let reply: TestOrigin.Reply
            if refuse {
                reply = .response(status: 401, headers: [("Content-Type", "application/json")],
                                  body: Array("{\"error\":\"invalid_client\",\"error_description\":\"client svc is disabled\"}".utf8))
            } else {
                reply = .response(status: 200, headers: [("Content-Type", "application/json")],
                                  body: Array("{\"access_token\":\"tok-\(n)\",\"token_type\":\"Bearer\",\"expires_in\":3600}".utf8))
            }
            return delay > 0 ? .delayed(delay, reply) : reply
        }

        func session(_ name: String) -> SessionConfig {
            SessionConfig(name: name, grant: .clientCredentials,
                          tokenURL: EndpointURL(scheme: "http", host: "127.0.0.1", port: origin.port, path: "/token"),
                          clientID: "svc", clientSecret: .literal(Secret("svc-secret")))
        }

        func stop() { origin.stop() }
    }

    /// An upstream that answers 401 `invalid_token` to revoked tokens and on paths under
    /// `/always/`, and 200 otherwise.
    final class Upstream: @unchecked Sendable {  // @unchecked: state guarded by `lock`
        private let lock = NSLock()
        private var revoked: Set<String> = []
        private(set) var origin: TestOrigin!

        init() throws {
            origin = try TestOrigin { [unowned self] r in
                let auth = r.head.headers["Authorization"] ?? ""
                if r.head.target.hasPrefix("/always/") || self.lock.withLock({ self.revoked.contains(auth) }) {
                    return .response(status: 401, headers: [("WWW-Authenticate", "Bearer error=\"invalid_token\"")],
                                     body: Array("revoked".utf8))
                }
                return .response(status: 200, headers: [("Content-Type", "text/plain")], body: Array("ok \(auth)".utf8))
            }
        }

        func revoke(_ token: String) { lock.withLock { _ = revoked.insert("Bearer " + token) } }
        func stop() { origin.stop() }
    }

    static func json(_ r: TestClient.Response) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(r.body))) as? [String: Any] ?? [:]
    }

    static func sessionRoute(_ match: String, _ upstream: Upstream, session: String) -> RouteConfig {
        var r = route(match, origin: upstream.origin.port)
        r.session = session
        return r
    }

    @Test func scrapeAfterReplayAndTokenFailuresParses() throws {
        let tokens = try TokenEndpoint()
        defer { tokens.stop() }
        let broken = try TokenEndpoint(refusing: true)
        defer { broken.stop() }
        let upstream = try Upstream()
        defer { upstream.stop() }
        let proxy = try TestProxy(routes: [Self.sessionRoute("/api/", upstream, session: "s"),
                                           Self.sessionRoute("/broken/", upstream, session: "broken"),
                                           route("/open/", origin: upstream.origin.port, matchHost: "open.test")],
                                  sessions: [tokens.session("s"), broken.session("broken")], admin: true)
        defer { proxy.stop() }
        let admin = try #require(proxy.server.adminAddress).port

        // Not ready while "broken" has no token: 503 JSON naming it, never a secret.
        var readiness: TestClient.Response?
        for _ in 0..<100 {
            let r = try TestClient.get(port: admin, path: "/readyz")
            let missing = Self.json(r)["missing"] as? [[String: Any]] ?? []
            if missing.count == 1, missing[0]["state"] as? String == "negative_cached" { readiness = r; break }
            Thread.sleep(forTimeInterval: 0.05)
        }
        let notReady = try #require(readiness, "s never got its token, or broken never failed")
        #expect(notReady.status == 503)
        #expect(notReady["Content-Type"] == "application/json")
        #expect(Self.json(notReady)["status"] as? String == "not_ready")
        let entry = try #require((Self.json(notReady)["missing"] as? [[String: Any]])?.first)
        #expect(entry["session"] as? String == "broken")
        #expect((entry["detail"] as? String)?.contains("invalid_client") == true)
        #expect((entry["retry_in_s"] as? Int).map { $0 >= 1 && $0 <= 60 } == true)
        #expect(!notReady.bodyText.contains("svc-secret"))

        // Traffic.
        #expect(try TestClient.get(port: proxy.port, path: "/api/a").status == 200)
        upstream.revoke("tok-1")
        let replayed = try TestClient.get(port: proxy.port, path: "/api/b")
        #expect(replayed.status == 200)
        #expect(replayed.bodyText == "ok Bearer tok-2")
        tokens.refusing = true
        upstream.revoke("tok-2")
        // docs/architecture.md §6: a rejected token we cannot renew is a 503, never the upstream's 401.
        #expect(try TestClient.get(port: proxy.port, path: "/api/c").status == 503)  // refresh refused
        #expect(try TestClient.get(port: proxy.port, path: "/api/d").status == 503)  // rejected tok-2 is not served again
        let unavailable = try TestClient.get(port: proxy.port, path: "/broken/x")
        #expect(unavailable.status == 503)
        #expect(try TestClient.get(port: proxy.port, path: "/open/x", headers: [("Host", "open.test")]).status == 200)
        #expect(try TestClient.get(port: proxy.port, path: "/nothing").status == 404)
        let bad = try TestClient(port: proxy.port)
        try bad.send("GET /api/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n")
        #expect(try bad.readResponse().status == 400)
        let kept = try TestClient(port: proxy.port)  // stays open across the scrape
        try kept.send("GET /open/y HTTP/1.1\r\nHost: open.test\r\n\r\n")
        #expect(try kept.readResponse().status == 200)

        let scrape = try TestClient.get(port: admin, path: "/metrics")
        #expect(scrape.status == 200)
        #expect(scrape["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8")
        let m = try PrometheusParser.parse(scrape.bodyText)
        #expect(!scrape.bodyText.contains("tok-"), "a token in the metrics")
        #expect(!scrape.bodyText.contains("svc-secret"))

        // Types as the parser read them (counter families lose `_total`).
        #expect(m.type("bearerd_requests") == "counter")
        #expect(m.type("bearerd_upstream_response_seconds") == "histogram")
        #expect(m.type("bearerd_open_connections") == "gauge")
        #expect(m.type("bearerd_token_expiry_seconds") == "gauge")
        #expect(m.type("bearerd_token_waiters") == "gauge")
        #expect(m.type("bearerd_replays") == "counter")

        func requests(_ route: String, _ status: String) -> Double? {
            m.value("bearerd_requests_total", ["route": route, "status": status])
        }
        #expect(requests("/api/", "200") == 2)
        #expect(requests("/api/", "401") == nil)
        #expect(requests("/api/", "503") == 2)
        #expect(m.value("bearerd_upstream_errors_total", ["route": "/api/", "error": "token_unavailable"]) == 2)
        #expect(requests("/broken/", "503") == 1)
        #expect(requests("open.test/open/", "200") == 2)
        #expect(requests("none", "404") == 1)
        #expect(requests("none", "400") == 1)
        #expect(m.value("bearerd_upstream_errors_total", ["route": "/broken/", "error": "token_unavailable"]) == 1)
        #expect(m.value("bearerd_upstream_errors_total", ["route": "/broken/", "error": "upstream_unreachable"]) == 0)

        // a, b (rejected), b (replayed), c (rejected): four upstream response heads on /api/.
        let api = ["route": "/api/"]
        #expect(m.value("bearerd_upstream_response_seconds_count", api) == 4)
        #expect(m.value("bearerd_upstream_response_seconds_bucket", api.merging(["le": "+Inf"]) { $1 }) == 4)
        #expect((m.value("bearerd_upstream_response_seconds_sum", api) ?? 0) > 0)
        let buckets = m.samples("bearerd_upstream_response_seconds_bucket", api).map(\.value)
        #expect(buckets.count == 13)
        #expect(zip(buckets, buckets.dropFirst()).allSatisfy { $0 <= $1 }, "buckets not cumulative: \(buckets)")
        #expect(m.value("bearerd_upstream_response_seconds_count", ["route": "/broken/"]) == 0)

        func replays(_ outcome: String) -> Double? { m.value("bearerd_replays_total", ["route": "/api/", "outcome": outcome]) }
        #expect(replays("replayed_after_refresh") == 1)
        #expect(replays("refresh_failed") == 1)
        #expect(replays("replayed_current_token") == 0)
        #expect(replays("rejected_again") == 0)
        #expect(replays("breaker_open") == 0)

        func refreshes(_ session: String, _ reason: String, _ outcome: String, _ error: String) -> Double? {
            m.value("bearerd_token_refreshes_total", ["session": session, "reason": reason, "outcome": outcome, "error": error])
        }
        #expect(refreshes("s", "start", "success", "") == 1)
        #expect(refreshes("s", "rejected", "success", "") == 1)
        #expect(refreshes("s", "rejected", "failure", "invalid_client") == 1)
        #expect(refreshes("broken", "start", "failure", "invalid_client") == 1)
        #expect(m.samples("bearerd_token_refreshes_total", ["session": "s"]).count == 3)
        #expect(m.value("bearerd_token_requests_total", ["session": "s"]) == 3)
        #expect(m.value("bearerd_forced_refreshes_total", ["session": "s"]) == 2)
        #expect(m.value("bearerd_breaker_trips_total", ["session": "s"]) == 0)
        #expect(m.value("bearerd_stale_token_serves_total", ["session": "s", "reason": "refresh_failed"]) == 0)
        #expect(m.value("bearerd_rejections_not_replayed_total", ["session": "s", "reason": "negative_cached"]) == 1)
        #expect(m.value("bearerd_stale_token_serves_total", ["session": "s", "reason": "wait_timeout"]) == 0)
        #expect(m.value("bearerd_token_waits_total", ["session": "s"]) == 2)  // b and c waited for their forced refresh
        #expect(m.value("bearerd_token_waiters", ["session": "s"]) == 0)
        let expiry = try #require(m.value("bearerd_token_expiry_seconds", ["session": "s"]))
        #expect(expiry > 3500 && expiry <= 3600)
        #expect(m.value("bearerd_token_expiry_seconds", ["session": "broken"]) == nil)  // no token: absent
        #expect(m.value("bearerd_token_generation", ["session": "s"]) == 2)
        #expect(m.value("bearerd_session_ready", ["session": "s"]) == 1)
        #expect(m.value("bearerd_session_ready", ["session": "broken"]) == 0)
        #expect((m.value("bearerd_open_connections", [:]) ?? 0) >= 1)
        #expect((m.value("bearerd_response_body_bytes_total", [:]) ?? 0) > 0)
        #expect(tokens.count == 3)
        _ = kept
    }

    /// Rejections that are not about our token: each replay is rejected again, the sixth
    /// forced refresh in 30 s trips the breaker, a body over `replay_body_limit` and a method
    /// outside `replay_methods` are not replayed.
    @Test func rejectedAgainBreakerAndUnreplayableRequests() throws {
        let tokens = try TokenEndpoint()
        defer { tokens.stop() }
        let upstream = try Upstream()
        defer { upstream.stop() }
        var limited = Self.sessionRoute("/always/", upstream, session: "s")
        limited.replayBodyLimit = 16
        limited.replayMethods = .only(["GET", "POST"])
        let proxy = try TestProxy(routes: [limited], sessions: [tokens.session("s")], admin: true)
        defer { proxy.stop() }
        let admin = try #require(proxy.server.adminAddress).port
        for _ in 0..<100 where (try? TestClient.get(port: admin, path: "/readyz"))?.status != 200 {
            Thread.sleep(forTimeInterval: 0.05)
        }
        for i in 0..<6 {
            #expect(try TestClient.get(port: proxy.port, path: "/always/\(i)").status == 401)
        }
        let c = try TestClient(port: proxy.port)
        let body = String(repeating: "x", count: 100)
        try c.send("POST /always/big HTTP/1.1\r\nHost: x\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)")
        #expect(try c.readResponse().status == 401)
        try c.send("DELETE /always/gone HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try c.readResponse().status == 401)

        let m = try PrometheusParser.parse(try TestClient.get(port: admin, path: "/metrics").bodyText)
        func replays(_ outcome: String) -> Double? { m.value("bearerd_replays_total", ["route": "/always/", "outcome": outcome]) }
        #expect(replays("replayed_after_refresh") == 5)
        #expect(replays("rejected_again") == 5)
        #expect(replays("breaker_open") == 1)
        #expect(replays("not_replayable") == 1)
        #expect(replays("method_not_allowed") == 1)
        #expect(replays("refresh_failed") == 0)
        #expect(m.value("bearerd_breaker_trips_total", ["session": "s"]) == 1)
        #expect(m.value("bearerd_forced_refreshes_total", ["session": "s"]) == 5)
        #expect(m.value("bearerd_token_refreshes_total", ["session": "s", "reason": "rejected", "outcome": "success", "error": ""]) == 5)
        #expect(m.value("bearerd_requests_total", ["route": "/always/", "status": "401"]) == 8)
        // 6 first attempts, 5 replays, the POST and the DELETE.
        #expect(m.value("bearerd_upstream_response_seconds_count", ["route": "/always/"]) == 13)
        #expect(tokens.count == 6)
    }

    @Test func coalescedWaitersThenReady() throws {
        let tokens = try TokenEndpoint(delay: 4)
        defer { tokens.stop() }
        let upstream = try Upstream()
        defer { upstream.stop() }
        let proxy = try TestProxy(routes: [Self.sessionRoute("/", upstream, session: "s")], sessions: [tokens.session("s")], admin: true)
        defer { proxy.stop() }
        let admin = try #require(proxy.server.adminAddress).port

        let early = try TestClient.get(port: admin, path: "/readyz")
        #expect(early.status == 503)
        #expect(early["Content-Type"] == "application/json")
        let missing = try #require((Self.json(early)["missing"] as? [[String: Any]])?.first)
        #expect(missing["session"] as? String == "s")
        // The session's start runs on its own queue: on a loaded machine /readyz can come first.
        #expect(["fetching", "idle"].contains(missing["state"] as? String ?? ""), "\(missing)")
        #expect(missing["detail"] as? String == "no token yet")

        // Blocking clients on threads of their own: Dispatch's global pool (as wide as the
        // cores on Linux) is what the scrape's merge runs on.
        final class Statuses: @unchecked Sendable {  // @unchecked: guarded by `lock`
            let lock = NSLock()
            var values: [Int] = []
        }
        let statuses = Statuses()
        let group = DispatchGroup()
        let port = proxy.port
        for i in 0..<3 {
            group.enter()
            Thread {
                let s = (try? TestClient.get(port: port, path: "/w\(i)"))?.status ?? -1
                statuses.lock.withLock { statuses.values.append(s) }
                group.leave()
            }.start()
        }
        // While the one token request is delayed, the three requests wait for it.
        var sawWaiters = false
        for _ in 0..<180 {
            if let text = try? TestClient.get(port: admin, path: "/metrics").bodyText,
               let m = try? PrometheusParser.parse(text), m.value("bearerd_token_waiters", ["session": "s"]) == 3 {
                sawWaiters = true
                break
            }
            Thread.sleep(forTimeInterval: 0.02)
        }
        #expect(sawWaiters)
        #expect(group.wait(timeout: .now() + 10) == .success)
        #expect(statuses.lock.withLock { statuses.values } == [200, 200, 200])

        let ready = try TestClient.get(port: admin, path: "/readyz")
        #expect(ready.status == 200)
        #expect(ready["Content-Type"] == "application/json")
        #expect(Self.json(ready)["status"] as? String == "ready")
        let m = try PrometheusParser.parse(try TestClient.get(port: admin, path: "/metrics").bodyText)
        #expect(m.value("bearerd_token_waits_total", ["session": "s"]) == 3)
        #expect(m.value("bearerd_token_waiters", ["session": "s"]) == 0)
        #expect(m.value("bearerd_token_requests_total", ["session": "s"]) == 1)
        #expect(m.value("bearerd_token_refreshes_total", ["session": "s", "reason": "start", "outcome": "success", "error": ""]) == 1)
        #expect(m.value("bearerd_requests_total", ["route": "/", "status": "200"]) == 3)
        #expect(tokens.count == 1)
    }

    /// A SIGHUP-style reload that reorders and adds routes: counters stay with their route label.
    @Test func countersFollowRouteLabelsAcrossAReload() throws {
        let upstream = try Upstream()
        defer { upstream.stop() }
        let proxy = try TestProxy(routes: [route("/a/", origin: upstream.origin.port)], admin: true)
        defer { proxy.stop() }
        let admin = try #require(proxy.server.adminAddress).port
        #expect(try TestClient.get(port: proxy.port, path: "/a/1").status == 200)
        let config = BearerdConfig(file: "<test>", listen: proxy.server.runtime.config.listen, admin: proxy.server.runtime.config.admin,
                                   loops: 1, routes: [route("/b/", origin: upstream.origin.port), route("/a/", origin: upstream.origin.port)])
        try proxy.server.reload(config)
        var reloaded = false
        for _ in 0..<100 {
            if (try? TestClient.get(port: proxy.port, path: "/b/1"))?.status == 200 { reloaded = true; break }
            Thread.sleep(forTimeInterval: 0.02)
        }
        #expect(reloaded)
        #expect(try TestClient.get(port: proxy.port, path: "/a/2").status == 200)
        let m = try PrometheusParser.parse(try TestClient.get(port: admin, path: "/metrics").bodyText)
        #expect(m.value("bearerd_requests_total", ["route": "/a/", "status": "200"]) == 2)
        #expect(m.value("bearerd_requests_total", ["route": "/b/", "status": "200"]) == 1)
        #expect(m.value("bearerd_upstream_response_seconds_count", ["route": "/a/"]) == 2)
        #expect(m.value("bearerd_upstream_response_seconds_count", ["route": "/b/"]) == 1)
    }

    @Test func healthzAnswersJSON() throws {
        let upstream = try Upstream()
        defer { upstream.stop() }
        let proxy = try TestProxy(routes: [route(origin: upstream.origin.port)], admin: true)
        defer { proxy.stop() }
        let admin = try #require(proxy.server.adminAddress).port
        let h = try TestClient.get(port: admin, path: "/healthz")
        #expect(h.status == 200)
        #expect(h["Content-Type"] == "application/json")
        #expect(Self.json(h)["status"] as? String == "ok")
        // No session: ready as soon as the listeners are bound.
        let r = try TestClient.get(port: admin, path: "/readyz")
        #expect(r.status == 200)
        #expect(Self.json(r)["status"] as? String == "ready")
        // A scrape without sessions still parses, and counts no admin request as proxy traffic.
        let m = try PrometheusParser.parse(try TestClient.get(port: admin, path: "/metrics").bodyText)
        #expect(m.samples("bearerd_requests_total", [:]).isEmpty)
        #expect(m.type("bearerd_token_refreshes") == nil)
    }
}

/// The reference parser, run as `python3 Tests/Fixtures/parse_metrics.py` with the exposition
/// on stdin; its JSON comes back as families of samples.
struct PrometheusParser {
    struct Sample {
        var name: String
        var labels: [String: String]
        var value: Double
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    var families: [(name: String, type: String, samples: [Sample])]

    func type(_ family: String) -> String? { families.first { $0.name == family }?.type }

    /// Samples named `name` whose labels include every pair of `labels`.
    func samples(_ name: String, _ labels: [String: String]) -> [Sample] {
        families.flatMap(\.samples).filter { s in s.name == name && labels.allSatisfy { s.labels[$0.key] == $0.value } }
    }

    /// The value of the one sample named `name` with exactly `labels`.
    func value(_ name: String, _ labels: [String: String]) -> Double? {
        families.flatMap(\.samples).first { $0.name == name && $0.labels == labels }?.value
    }

    static var script: String {
        AuthServerFixture.repositoryRoot.appendingPathComponent("Tests/Fixtures/parse_metrics.py").path
    }

    static func parse(_ text: String) throws -> PrometheusParser {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = [AuthServerFixture.python, script]
        let stdin = Pipe(), stdout = Pipe(), stderr = Pipe()
        p.standardInput = stdin
        p.standardOutput = stdout
        p.standardError = stderr
        try p.run()
        stdin.fileHandleForWriting.write(Data(text.utf8))
        try stdin.fileHandleForWriting.close()
        let out = stdout.fileHandleForReading.readDataToEndOfFile()
        let err = stderr.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        guard p.terminationStatus == 0 else {
            throw Failure(description: "parse_metrics.py: \(String(decoding: err, as: UTF8.self))\n--- exposition ---\n\(text)")
        }
        guard let root = try JSONSerialization.jsonObject(with: out) as? [String: Any],
              let families = root["families"] as? [[String: Any]] else {
            throw Failure(description: "unexpected output: \(String(decoding: out, as: UTF8.self))")
        }
        return PrometheusParser(families: families.map { f in
            let samples = (f["samples"] as? [[String: Any]] ?? []).map { s in
                Sample(name: s["name"] as? String ?? "", labels: s["labels"] as? [String: String] ?? [:],
                       value: (s["value"] as? NSNumber)?.doubleValue ?? .nan)
            }
            return (f["name"] as? String ?? "", f["type"] as? String ?? "", samples)
        })
    }

    /// True when the interpreter can import `prometheus_client` (Tests/Fixtures/requirements.txt).
    static var isAvailable: Bool { availability == nil }
    static var unavailableReason: String? { availability }

    private static let availability: String? = AuthServerFixture.pythonMissing(modules: ["prometheus_client.parser"])
}
