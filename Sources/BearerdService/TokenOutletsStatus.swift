import BearerdProxyCore
import BearerdSessions

/// How sink files and the token API show on the admin endpoints (docs/architecture.md §4 `sinks:`,
/// `token_api:`). Stateless.
///
/// A sink that cannot be written makes `/readyz` report it under `degraded` but does not fail
/// readiness: the proxy still serves every request with a valid token, and taking a replica out
/// of a load balancer because a side file is unwritable would turn a local problem into an outage.
/// The degraded entry and `bearerd_sinks_failing` are what alerts should watch.
public enum TokenSinkReadiness {
    /// One `{"session","state":"sink_failing","path","detail"}` entry per failing sink.
    public static func degraded(_ sessions: [SessionSnapshot]) -> [String] {
        var out: [String] = []
        for s in sessions {
            for sink in s.sinks {
                guard let failure = sink.failure else { continue }
                out.append("{\"session\":" + ErrorResponse.jsonString(s.name) + ",\"state\":\"sink_failing\",\"path\":"
                           + ErrorResponse.jsonString(sink.path) + ",\"detail\":" + ErrorResponse.jsonString(failure + " (retrying)") + "}")
            }
        }
        return out
    }

    /// `bearerd_sink_writes_total`, `bearerd_sink_write_failures_total` (by session and path),
    /// `bearerd_sinks_failing` (by session, sessions with sinks) and
    /// `bearerd_token_api_handouts_total` (by session).
    static func renderMetrics(into w: inout PrometheusText, sessions: [SessionSnapshot]) {
        let withSinks = sessions.filter { !$0.sinks.isEmpty }
        if !withSinks.isEmpty {
            w.family("bearerd_sink_writes_total", .counter, help: "Sink files written with a new token, by session and path.")
            for s in withSinks {
                for sink in s.sinks { w.sample("bearerd_sink_writes_total", [("session", s.name), ("path", sink.path)], sink.writes) }
            }
            w.family("bearerd_sink_write_failures_total", .counter,
                     help: "Failed writes of sink files (each retry counts), by session and path.")
            for s in withSinks {
                for sink in s.sinks { w.sample("bearerd_sink_write_failures_total", [("session", s.name), ("path", sink.path)], sink.failures) }
            }
            w.family("bearerd_sinks_failing", .gauge, help: "Sink files of the session that do not hold its current token because their last write failed.")
            for s in withSinks {
                w.sample("bearerd_sinks_failing", [("session", s.name)], UInt64(s.sinks.filter { $0.failure != nil }.count))
            }
        }
        w.family("bearerd_token_api_handouts_total", .counter, help: "Tokens handed out by the token API (GET /v1/token/NAME), by session.")
        for s in sessions { w.sample("bearerd_token_api_handouts_total", [("session", s.name)], s.apiHandouts) }
    }
}
