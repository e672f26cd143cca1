import BearerdHTTP
import BearerdIO
import BearerdOAuth
import Foundation
import BearerdTestSupport
import Testing
@testable import BearerdProxy
@testable import BearerdProxyCore
@testable import BearerdConfig
@testable import BearerdSessions
@testable import BearerdService

/// The Prometheus text writer, the per-loop counters and their merge, the rendering of every
/// family, `/readyz`, the replay-outcome and error-label vocabularies
/// (the session driver's counters are in BearerdSessionsTests/SessionMetricsTests).
@Suite(.serialized)
struct MetricsTests {
    // MARK: text format

    @Test func labelValuesAndHelpAreEscaped() {
        #expect(PrometheusText.escapeLabelValue("plain/path") == "plain/path")
        #expect(PrometheusText.escapeLabelValue("a\"b\\c\nd") == "a\\\"b\\\\c\\nd")
        #expect(PrometheusText.escapeHelp("say \"hi\"\\\nnext") == "say \"hi\"\\\\\\nnext")
        var w = PrometheusText()
        w.family("x_total", .counter, help: "line one\nline two")
        w.sample("x_total", [("route", "h\"/"), ("status", "200")], UInt64(3))
        #expect(w.text == "# HELP x_total line one\\nline two\n# TYPE x_total counter\nx_total{route=\"h\\\"/\",status=\"200\"} 3\n")
    }

    @Test func specialFloatsUseGoSpelling() {
        #expect(PrometheusText.format(.nan) == "NaN")
        #expect(PrometheusText.format(.infinity) == "+Inf")
        #expect(PrometheusText.format(-.infinity) == "-Inf")
        #expect(PrometheusText.format(0.25) == "0.25")
        #expect(Double(PrometheusText.format(1e-9)) == 1e-9)
    }

    @Test func histogramBucketsAreCumulativeWithInclusiveBounds() {
        var h = LatencyHistogram()
        h.observe(nanoseconds: 5_000_000)        // exactly 5 ms: le="0.005"
        h.observe(nanoseconds: 5_000_001)        // just above: le="0.01"
        h.observe(nanoseconds: 700_000_000)      // le="1.0"
        h.observe(nanoseconds: 31_000_000_000)   // above 30 s: only +Inf
        #expect(h.count == 4)
        var w = PrometheusText()
        w.family("lat_seconds", .histogram, help: "h")
        w.histogram("lat_seconds", [("route", "/a/")], h)
        let lines = w.text.split(separator: "\n").map(String.init)
        #expect(lines.contains("lat_seconds_bucket{route=\"/a/\",le=\"0.005\"} 1"))
        #expect(lines.contains("lat_seconds_bucket{route=\"/a/\",le=\"0.01\"} 2"))
        #expect(lines.contains("lat_seconds_bucket{route=\"/a/\",le=\"0.5\"} 2"))
        #expect(lines.contains("lat_seconds_bucket{route=\"/a/\",le=\"1.0\"} 3"))
        #expect(lines.contains("lat_seconds_bucket{route=\"/a/\",le=\"30.0\"} 3"))
        #expect(lines.contains("lat_seconds_bucket{route=\"/a/\",le=\"+Inf\"} 4"))
        #expect(lines.contains("lat_seconds_count{route=\"/a/\"} 4"))
        let sum = lines.first { $0.hasPrefix("lat_seconds_sum") }.flatMap { Double($0.split(separator: " ")[1]) }
        #expect(sum.map { abs($0 - 31.710000001) < 1e-9 } == true)
        // 12 bounds + Inf, in increasing order, then _sum and _count.
        let buckets = lines.filter { $0.hasPrefix("lat_seconds_bucket") }
        #expect(buckets.count == 13)
        #expect(buckets.last?.contains("le=\"+Inf\"") == true)
        #expect(lines.last?.hasPrefix("lat_seconds_count") == true)
    }

    // MARK: loop counters

    @Test func loopsMergeByRouteLabelWhateverTheirSlots() {
        var a = LoopMetrics()
        let a1 = a.slot(for: "/x/"), a2 = a.slot(for: "api.test/y/")
        var b = LoopMetrics()
        let b1 = b.slot(for: "api.test/y/"), b2 = b.slot(for: "/z/")
        #expect(a.slot(for: "/x/") == a1)  // stable
        a.countRequest(slot: a1, status: 200)
        a.countRequest(slot: a2, status: 502)
        a.countUpstreamError(slot: a2, .upstreamUnreachable)
        a.countRequest(slot: 0, status: 404)
        b.countRequest(slot: b1, status: 502)
        b.countRequest(slot: b2, status: 200)
        b.countReplay(slot: b1, .replayedAfterRefresh)
        b.observeUpstreamLatency(slot: b1, nanoseconds: 1_000)
        b.countRequest(slot: 0, status: 404)
        b.responseBytes = 10
        b.openConnections = 2
        a.responseBytes = 5
        var total = LoopMetrics()
        total.merge(a)
        total.merge(b)
        func route(_ label: String) -> RouteMetrics? { total.routes.first { $0.label == label } }
        #expect(total.routes.map(\.label) == ["none", "/x/", "api.test/y/", "/z/"])
        #expect(route("none")?.statuses == [404: 2])
        #expect(route("/x/")?.statuses == [200: 1])
        #expect(route("api.test/y/")?.statuses == [502: 2])
        #expect(route("api.test/y/")?.upstreamErrors[UpstreamErrorKind.upstreamUnreachable.rawValue] == 1)
        #expect(route("api.test/y/")?.replays[ReplayOutcome.replayedAfterRefresh.rawValue] == 1)
        #expect(route("api.test/y/")?.upstreamLatency.count == 1)
        #expect(route("/z/")?.statuses == [200: 1])
        #expect(total.responseBytes == 15)
        #expect(total.openConnections == 2)
    }

    @Test func aReloadKeepsSlotsOfKnownLabelsAndAppendsNewOnes() throws {
        func runtime(_ routes: [RouteConfig]) throws -> ProxyRuntime {
            try ProxyRuntime(config: BearerdConfig(file: "t", listen: [], routes: routes), logger: CapturedLogs().logger)
        }
        let up = UpstreamURL(scheme: "http", host: "127.0.0.1", port: 9, basePath: "")
        let loop = EventLoop(index: 950, readBufferSize: 4096)
        let ctx = LoopContext(loop: loop, runtime: try runtime([RouteConfig(match: "/a/", upstream: up),
                                                                RouteConfig(match: "/b/", host: "h.test", upstream: up)]))
        #expect(ctx.routeSlots == [1, 2])
        #expect(ctx.metrics.routes.map(\.label) == ["none", "/a/", "h.test/b/"])
        ctx.metrics.countRequest(slot: ctx.routeSlots[0], status: 200)
        ctx.runtime = try runtime([RouteConfig(match: "/c/", upstream: up), RouteConfig(match: "/a/", upstream: up)])
        #expect(ctx.routeSlots == [3, 1])
        #expect(ctx.metrics.routes.map(\.label) == ["none", "/a/", "h.test/b/", "/c/"])
        #expect(ctx.metrics.routes[1].statuses == [200: 1])  // counters survive the reload
    }

    // MARK: rendering

    /// Families of a rendering, checking the format's structure on the way: HELP then TYPE
    /// once per family, and every sample inside the family last opened.
    static func families(_ text: String) -> [String: (type: String, samples: [String])] {
        var out: [String: (type: String, samples: [String])] = [:]
        var current = ""
        var lastHelp = ""
        for line in text.split(separator: "\n", omittingEmptySubsequences: false).map(String.init) {
            if line.isEmpty { continue }
            if line.hasPrefix("# HELP ") {
                lastHelp = String(line.dropFirst(7).split(separator: " ")[0])
            } else if line.hasPrefix("# TYPE ") {
                let parts = line.dropFirst(7).split(separator: " ")
                current = String(parts[0])
                #expect(lastHelp == current, "TYPE without HELP: \(line)")
                #expect(out[current] == nil, "family \(current) opened twice")
                out[current] = (String(parts[1]), [])
            } else {
                let name = String(line.prefix { $0 != "{" && $0 != " " })
                let family = ["_bucket", "_sum", "_count"].reduce(name) { n, s in
                    out[current]?.type == "histogram" && n.hasSuffix(s) ? String(n.dropLast(s.count)) : n
                }
                #expect(family == current, "sample \(line) outside its family \(current)")
                out[current]?.samples.append(line)
            }
        }
        return out
    }

    @Test func everyFamilyRendersWithItsLabels() throws {
        var m = LoopMetrics()
        let api = m.slot(for: "/api/"), open = m.slot(for: "open.test/open/")
        m.countRequest(slot: api, status: 200)
        m.countRequest(slot: api, status: 200)
        m.countRequest(slot: api, status: 401)
        m.countRequest(slot: open, status: 503)
        m.countRequest(slot: 0, status: 400)
        m.countUpstreamError(slot: open, .tokenUnavailable)
        m.countReplay(slot: api, .replayedAfterRefresh)
        m.countReplay(slot: api, .breakerOpen)
        m.observeUpstreamLatency(slot: api, nanoseconds: 2_000_000)
        m.responseBytes = 1234
        m.openConnections = 3
        m.idleUpstreamConnections = 1

        var c = SessionMetrics()
        c.tokenRequests = 4
        c.refreshes[TokenRefreshKey(reason: "start", outcome: "success", error: "")] = 1
        c.refreshes[TokenRefreshKey(reason: "rejected", outcome: "failure", error: "invalid_client")] = 2
        c.forcedRefreshes = 2
        c.breakerTrips = 1
        c.waits = 7
        c.staleServes[StaleTokenReason.waitTimeout.rawValue] = 1
        let now: UInt64 = 1_000_000_000_000
        let sessions = [
            SessionSnapshot(name: "partner", counters: c, status: .ready, generation: 3, expiresAt: now + 90_500_000_000, waiters: 2),
            SessionSnapshot(name: "me", status: .fetching),
            SessionSnapshot(name: "old", status: .needsReauthentication, generation: 1, expiresAt: now - 1),
        ]
        let text = AdminResponder.renderMetrics(m, sessions: sessions, now: now)
        let f = Self.families(text)
        let lines = Set(text.split(separator: "\n").map(String.init))

        #expect(f["bearerd_requests_total"]?.type == "counter")
        #expect(lines.contains("bearerd_requests_total{route=\"/api/\",status=\"200\"} 2"))
        #expect(lines.contains("bearerd_requests_total{route=\"/api/\",status=\"401\"} 1"))
        #expect(lines.contains("bearerd_requests_total{route=\"open.test/open/\",status=\"503\"} 1"))
        #expect(lines.contains("bearerd_requests_total{route=\"none\",status=\"400\"} 1"))
        #expect(lines.contains("bearerd_upstream_errors_total{route=\"open.test/open/\",error=\"token_unavailable\"} 1"))
        #expect(lines.contains("bearerd_upstream_errors_total{route=\"open.test/open/\",error=\"upstream_timeout\"} 0"))
        #expect(f["bearerd_upstream_errors_total"]?.samples.count == UpstreamErrorKind.allCases.count)  // only the route that had one
        #expect(f["bearerd_upstream_response_seconds"]?.type == "histogram")
        #expect(lines.contains("bearerd_upstream_response_seconds_bucket{route=\"/api/\",le=\"0.005\"} 1"))
        #expect(lines.contains("bearerd_upstream_response_seconds_count{route=\"/api/\"} 1"))
        #expect(lines.contains("bearerd_upstream_response_seconds_count{route=\"open.test/open/\"} 0"))
        #expect(!text.contains("bearerd_upstream_response_seconds_count{route=\"none\"}"))
        #expect(lines.contains("bearerd_replays_total{route=\"/api/\",outcome=\"replayed_after_refresh\"} 1"))
        #expect(lines.contains("bearerd_replays_total{route=\"/api/\",outcome=\"breaker_open\"} 1"))
        #expect(lines.contains("bearerd_replays_total{route=\"/api/\",outcome=\"not_replayable\"} 0"))
        #expect(lines.contains("bearerd_response_body_bytes_total 1234"))
        #expect(lines.contains("bearerd_open_connections 3"))
        #expect(f["bearerd_open_connections"]?.type == "gauge")
        #expect(lines.contains("bearerd_upstream_idle_connections 1"))
        #expect(lines.contains("bearerd_build_info{version=\"\(BearerdVersion.string)\"} 1"))

        #expect(lines.contains("bearerd_token_requests_total{session=\"partner\"} 4"))
        #expect(lines.contains("bearerd_token_requests_total{session=\"me\"} 0"))
        #expect(lines.contains("bearerd_token_refreshes_total{session=\"partner\",reason=\"start\",outcome=\"success\",error=\"\"} 1"))
        #expect(lines.contains("bearerd_token_refreshes_total{session=\"partner\",reason=\"rejected\",outcome=\"failure\",error=\"invalid_client\"} 2"))
        #expect(lines.contains("bearerd_forced_refreshes_total{session=\"partner\"} 2"))
        #expect(lines.contains("bearerd_breaker_trips_total{session=\"partner\"} 1"))
        #expect(lines.contains("bearerd_token_waits_total{session=\"partner\"} 7"))
        #expect(lines.contains("bearerd_token_waiters{session=\"partner\"} 2"))
        #expect(f["bearerd_token_waiters"]?.type == "gauge")
        #expect(lines.contains("bearerd_stale_token_serves_total{session=\"partner\",reason=\"wait_timeout\"} 1"))
        #expect(lines.contains("bearerd_stale_token_serves_total{session=\"partner\",reason=\"refresh_failed\"} 0"))
        #expect(lines.contains("bearerd_token_expiry_seconds{session=\"partner\"} 90.5"))
        #expect(lines.contains("bearerd_token_expiry_seconds{session=\"old\"} 0.0"))       // expired: 0
        #expect(!text.contains("bearerd_token_expiry_seconds{session=\"me\"}"))           // no token: absent
        #expect(lines.contains("bearerd_token_generation{session=\"partner\"} 3"))
        #expect(lines.contains("bearerd_session_ready{session=\"partner\"} 1"))
        #expect(lines.contains("bearerd_session_ready{session=\"me\"} 0"))
        #expect(lines.contains("bearerd_session_ready{session=\"old\"} 0"))

        // Counters end in _total; nothing but counters does.
        for (name, family) in f {
            #expect((family.type == "counter") == name.hasSuffix("_total"), "\(name)")
        }
        #expect(!text.contains("NaN"))
    }

    /// Proxied requests by client protocol, gRPC calls by grpc-status, merged across loops.
    @Test func protocolAndGRPCStatusFamilies() {
        var a = LoopMetrics(), b = LoopMetrics()
        let sa = a.slot(for: "/svc/"), sb = b.slot(for: "/svc/")
        a.countRequest(slot: sa, status: 200, http2: true, grpcStatus: "0")
        a.countRequest(slot: sa, status: 200, http2: false, grpcStatus: nil)
        b.countRequest(slot: sb, status: 200, http2: true, grpcStatus: "16")
        b.countRequest(slot: sb, status: 200, http2: true, grpcStatus: "0")
        a.merge(b)
        let text = AdminResponder.renderMetrics(a, sessions: [], now: 1)
        #expect(text.contains(#"bearerd_requests_by_protocol_total{route="/svc/",protocol="h1"} 1"#))
        #expect(text.contains(#"bearerd_requests_by_protocol_total{route="/svc/",protocol="h2"} 3"#))
        #expect(text.contains(#"bearerd_grpc_responses_total{route="/svc/",grpc_status="0"} 2"#))
        #expect(text.contains(#"bearerd_grpc_responses_total{route="/svc/",grpc_status="16"} 1"#))
        #expect(text.contains(#"bearerd_requests_total{route="/svc/",status="200"} 4"#))
    }

    @Test func withoutSessionsNoSessionFamilies() {
        let text = AdminResponder.renderMetrics(LoopMetrics(), sessions: [], now: 1)
        #expect(!text.contains("session="))
        #expect(text.contains("# TYPE bearerd_requests_total counter"))
        // The proxy-wide families, bearerd_tls_handshakes_total among them (its samples come and go with peers).
        #expect(Self.families(text).count == 11)
    }

    // MARK: /readyz

    static func json(_ body: String) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(body.utf8))) as? [String: Any] ?? [:]
    }

    @Test func readinessBothWays() throws {
        let now: UInt64 = 500_000_000_000
        let good = SessionSnapshot(name: "good", status: .ready, generation: 1, expiresAt: now + 1)
        let ready = AdminResponder.readiness(phase: .serving, sessions: [good], now: now)
        #expect(ready.status == 200)
        #expect(Self.json(ready.body)["status"] as? String == "ready")
        #expect(AdminResponder.readiness(phase: .serving, sessions: [], now: now).status == 200)

        // Holding an unexpired token is enough, whatever the state (a refresh may be failing).
        let stale = SessionSnapshot(name: "stale", status: .negativeCached(until: MonotonicInstant(nanoseconds: now + 5)),
                                    generation: 2, expiresAt: now + 10, lastFailure: "invalid_client (HTTP 401): bad")
        #expect(AdminResponder.readiness(phase: .serving, sessions: [good, stale], now: now).status == 200)

        let broken = SessionSnapshot(name: "partner", status: .negativeCached(until: MonotonicInstant(nanoseconds: now + 59_200_000_000)),
                                     lastFailure: "invalid_client (HTTP 401): client \"x\" unknown")
        let starting = SessionSnapshot(name: "me", status: .fetching)
        let dead = SessionSnapshot(name: "cli", status: .needsReauthentication, generation: 4, expiresAt: now - 1,
                                   lastFailure: "invalid_grant (HTTP 400): revoked")
        let r = AdminResponder.readiness(phase: .serving, sessions: [good, broken, starting, dead], now: now)
        #expect(r.status == 503)
        let body = Self.json(r.body)
        #expect(body["status"] as? String == "not_ready")
        let missing = try #require(body["missing"] as? [[String: Any]])
        #expect(missing.count == 3)
        #expect(missing[0]["session"] as? String == "partner")
        #expect(missing[0]["state"] as? String == "negative_cached")
        #expect(missing[0]["retry_in_s"] as? Int == 60)
        #expect(missing[0]["detail"] as? String == "invalid_client (HTTP 401): client \"x\" unknown")
        #expect(missing[1]["session"] as? String == "me")
        #expect(missing[1]["state"] as? String == "fetching")
        #expect(missing[1]["detail"] as? String == "no token yet")
        #expect(missing[1]["retry_in_s"] == nil)
        #expect(missing[2]["state"] as? String == "needs_reauthentication")
        #expect(missing[2]["detail"] as? String == "invalid_grant (HTTP 400): revoked")

        #expect(AdminResponder.readiness(phase: .starting, sessions: [good], now: now).status == 503)
        #expect(Self.json(AdminResponder.readiness(phase: .starting, sessions: [good], now: now).body)["status"] as? String == "starting")
        let down = AdminResponder.readiness(phase: .shuttingDown, sessions: [good], now: now)
        #expect(down.status == 503)
        #expect(Self.json(down.body)["status"] as? String == "shutting_down")
    }

    /// The responder itself, on a server that is shutting down: /readyz 503, /healthz 200,
    /// both JSON; unknown paths 404; other methods 405.
    @Test func responderWhileShuttingDown() async throws {
        let config = BearerdConfig(file: "t", listen: [.tcp(host: "127.0.0.1", port: 0)], loops: 1)
        let server = try BearerdServer(config: config, logger: CapturedLogs().logger)
        #expect(server.lifecycle.phase == .starting)
        let responder = AdminResponder(server: server)
        let loop = server.group.loops[0]
        func ask(_ method: String, _ path: String) async -> (HTTPResponseHead, String) {
            await withCheckedContinuation { c in
                let head = HTTPRequestHead(method: method, target: path, version: .http1_1, headers: ["Host": "x"])
                loop.execute {
                    responder.respond(to: head, body: [], loop: loop) { h, b in c.resume(returning: (h, String(decoding: b, as: UTF8.self))) }
                }
            }
        }
        var (h, body) = await ask("GET", "/readyz")
        #expect(h.status == 503)
        #expect(Self.json(body)["status"] as? String == "starting")

        await withCheckedContinuation { c in server.shutdown(grace: .milliseconds(10)) { c.resume() } }
        #expect(server.lifecycle.phase == .shuttingDown)
        (h, body) = await ask("GET", "/readyz?verbose=1")
        #expect(h.status == 503)
        #expect(h.headers["Content-Type"] == "application/json")
        #expect(Self.json(body)["status"] as? String == "shutting_down")
        (h, body) = await ask("GET", "/healthz")
        #expect(h.status == 200)
        #expect(h.headers["Content-Type"] == "application/json")
        #expect(Self.json(body)["status"] as? String == "ok")
        (h, _) = await ask("GET", "/nope")
        #expect(h.status == 404)
        (h, _) = await ask("POST", "/metrics")
        #expect(h.status == 405)
        (h, body) = await ask("GET", "/metrics")
        #expect(h.status == 200)
        #expect(h.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8")
        #expect(body.contains("# TYPE bearerd_requests_total counter"))
    }

    // MARK: vocabularies

    @Test func errorLabelsAreBounded() {
        func label(_ f: TokenEndpointFailure) -> String { TokenRefreshKey.errorLabel(for: f) }
        #expect(label(TokenEndpointFailure(classification: .permanent, reason: "token.invalid_client", status: 401, oauthError: "invalid_client")) == "invalid_client")
        #expect(label(TokenEndpointFailure(classification: .invalidGrant, reason: "token.invalid_grant", status: 400, oauthError: "invalid_grant")) == "invalid_grant")
        #expect(label(TokenEndpointFailure(classification: .retryable, reason: "token.temporarily_unavailable", status: 400, oauthError: "temporarily_unavailable")) == "temporarily_unavailable")
        // A server's own code (or one scrubbed of an echoed secret) cannot become a label value.
        #expect(label(TokenEndpointFailure(classification: .permanent, reason: "token.made_up", status: 400, oauthError: "made_up")) == "other_oauth_error")
        #expect(label(TokenEndpointFailure(classification: .permanent, reason: "token.x", status: 400, oauthError: "<redacted>")) == "other_oauth_error")
        #expect(label(.transport("connection refused")) == "transport")
        #expect(label(TokenEndpointFailure(classification: .retryable, reason: "token.http_503", status: 503)) == "http_5xx")
        #expect(label(TokenEndpointFailure(classification: .retryable, reason: "token.http_429", status: 429)) == "http_4xx")
        #expect(label(TokenEndpointFailure(classification: .permanent, reason: "token.malformed_json", status: 200)) == "malformed_json")
        #expect(label(TokenEndpointFailure(classification: .invalidGrant, reason: "token.no_refresh_token")) == "no_refresh_token")
    }

    @Test func replayOutcomesAtTheDecision() {
        func outcome(_ i: ReplayPolicy.Input) -> ReplayOutcome? {
            switch ReplayPolicy.decide(i) {
            case .notRejected, .replay: return nil  // a replay's outcome comes later
            case .passThrough(let r), .refreshOnlyPassThrough(let r): return ReplayOutcome(r)
            }
        }
        #expect(outcome(.init(status: 200)) == nil)
        #expect(outcome(.init(status: 401)) == nil)
        #expect(outcome(.init(status: 401, alreadyReplayed: true)) == .rejectedAgain)
        #expect(outcome(.init(status: 401, wwwAuthenticate: ["Bearer error=\"insufficient_scope\""])) == .notTokenError)
        #expect(outcome(.init(status: 401, bodyReplayable: false)) == .notReplayable)
        #expect(outcome(.init(status: 401, methodAllowed: false)) == .methodNotAllowed)
        #expect(outcome(.init(status: 403, rejectStatuses: [401, 403], methodAllowed: false)) == .methodNotAllowed)
        #expect(outcome(.init(status: 403, methodAllowed: false)) == nil)
        #expect(ReplayOutcome(.rejectionTooLarge) == .rejectionTooLarge)
        #expect(ReplayOutcome.abandoned(reason: "token.breaker_open") == .breakerOpen)
        #expect(ReplayOutcome.abandoned(reason: "token.negative_cached: invalid_client (HTTP 401)") == .refreshFailed)
        #expect(ReplayOutcome.abandoned(reason: "no newer token") == .refreshFailed)
        #expect(Set(ReplayOutcome.allCases.map(\.label)).count == ReplayOutcome.allCases.count)
    }
}
