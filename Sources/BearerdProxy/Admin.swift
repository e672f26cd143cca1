import BearerdHTTP
import BearerdIO

/// The admin endpoints: `GET /healthz`, `/readyz`, `/metrics` (Prometheus text format 0.0.4).
final class AdminResponder: LocalResponder, @unchecked Sendable {  // @unchecked: `server` is weak and only read
    weak var server: BearerdServer?
    init(server: BearerdServer) { self.server = server }

    func respond(to head: HTTPRequestHead, body: [UInt8], loop: EventLoop, reply: @escaping (HTTPResponseHead, [UInt8]) -> Void) {
        let path = head.target.split(separator: "?", maxSplits: 1).first.map(String.init) ?? head.target
        @Sendable func text(_ status: Int, _ s: String, type: String = "text/plain; charset=utf-8") {
            reply(HTTPResponseHead(status: status, reason: ErrorResponse.reasonPhrase(status), headers: ["Content-Type": type]), Array(s.utf8))
        }
        guard head.method == "GET" || head.method == "HEAD" else {
            text(405, "method not allowed\n")
            return
        }
        switch path {
        case "/healthz":
            text(200, "ok\n")
        case "/readyz":
            // Ready when every session can hand out a token now (DESIGN §4 admin).
            guard let server else { text(503, "shutting down\n"); return }
            let now = monotonicNanos()
            var notReady: [String] = []
            for name in server.sessions.sessionNames {
                guard let d = server.sessions.session(named: name) else { continue }
                if d.usableToken(now: now) == nil && d.status != .ready { notReady.append("\(name): \(d.status)") }
            }
            if notReady.isEmpty {
                text(200, "ready\n")
            } else {
                text(503, "not ready\n" + notReady.joined(separator: "\n") + "\n")
            }
        case "/metrics":
            guard let server else { text(503, "shutting down\n"); return }
            let sessionLines = AdminResponder.sessionMetrics(server.sessions)
            server.collectMetrics { m in
                let body = AdminResponder.prometheus(m) + sessionLines
                loop.execute { text(200, body, type: "text/plain; version=0.0.4") }
            }
        default:
            text(404, "not found\n")
        }
    }

    static func sessionMetrics(_ sessions: SessionManager) -> String {
        var s = ""
        let names = sessions.sessionNames
        guard !names.isEmpty else { return s }
        let series: [(String, String, (SessionMetrics) -> UInt64)] = [
            ("bearerd_token_requests_total", "Token endpoint requests sent.", { $0.tokenRequests }),
            ("bearerd_tokens_obtained_total", "Access tokens obtained from the token endpoint.", { $0.tokensObtained }),
            ("bearerd_tokens_adopted_total", "Tokens adopted from the state file.", { $0.tokensAdopted }),
            ("bearerd_token_failures_retryable_total", "Token requests failed transiently.", { $0.failuresRetryable }),
            ("bearerd_token_failures_permanent_total", "Token requests failed permanently.", { $0.failuresPermanent }),
            ("bearerd_token_failures_invalid_grant_total", "Refresh tokens refused (invalid_grant).", { $0.failuresInvalidGrant }),
            ("bearerd_forced_refreshes_total", "Refreshes triggered by upstream rejections.", { $0.forcedRefreshes }),
            ("bearerd_breaker_trips_total", "Times the rejection breaker opened.", { $0.breakerTrips }),
        ]
        for (metric, help, value) in series {
            s += "# HELP \(metric) \(help)\n# TYPE \(metric) counter\n"
            for name in names {
                guard let d = sessions.session(named: name) else { continue }
                s += "\(metric){session=\"\(name)\"} \(value(d.metrics))\n"
            }
        }
        s += "# HELP bearerd_session_ready Whether the session can hand out a token now.\n# TYPE bearerd_session_ready gauge\n"
        let now = monotonicNanos()
        for name in names {
            guard let d = sessions.session(named: name) else { continue }
            s += "bearerd_session_ready{session=\"\(name)\"} \(d.usableToken(now: now) != nil ? 1 : 0)\n"
        }
        return s
    }

    static func prometheus(_ m: LoopMetrics) -> String {
        var s = "# HELP bearerd_requests_total Requests answered, by status.\n# TYPE bearerd_requests_total counter\n"
        for (status, n) in m.requests.sorted(by: { $0.key < $1.key }) {
            s += "bearerd_requests_total{status=\"\(status)\"} \(n)\n"
        }
        s += "# HELP bearerd_upstream_errors_total Upstream failures, by kind.\n# TYPE bearerd_upstream_errors_total counter\n"
        for (kind, n) in m.upstreamErrors.sorted(by: { $0.key < $1.key }) {
            s += "bearerd_upstream_errors_total{error=\"\(kind)\"} \(n)\n"
        }
        s += "# HELP bearerd_response_body_bytes_total Response body bytes sent to clients.\n# TYPE bearerd_response_body_bytes_total counter\n"
        s += "bearerd_response_body_bytes_total \(m.responseBytes)\n"
        s += "# HELP bearerd_open_connections Client connections open now.\n# TYPE bearerd_open_connections gauge\n"
        s += "bearerd_open_connections \(m.openConnections)\n"
        return s
    }
}

