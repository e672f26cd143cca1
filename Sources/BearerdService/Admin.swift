import BearerdHTTP
import BearerdIO
import BearerdOAuth
import BearerdProxyCore
import BearerdConfig
import BearerdSessions
import BearerdTLS

/// Where the server is in its life, for `/readyz`: `starting` until `start()` has bound every
/// listener, `serving`, then `shuttingDown` from the moment `shutdown` is called.
///
/// Owns the phase; written by the controlling thread, read by the admin responder on any
/// loop, guarded by `lock`.
public final class ServerLifecycle: @unchecked Sendable {  // @unchecked: `current` is guarded by `lock`
    public enum Phase: Sendable, Equatable {
        case starting, serving, shuttingDown
    }

    private let lock = Lock()
    private var current = Phase.starting

    public init() {}

    public var phase: Phase {
        get { lock.withLock { current } }
        set { lock.withLock { current = newValue } }
    }
}

/// The admin endpoints (docs/operations.md "Metrics"):
/// - `GET /healthz`: 200 `{"status":"ok"}` while the process serves (also while shutting down).
/// - `GET /readyz`: 200 `{"status":"ready"}` once the listeners are bound and every session
///   holds an unexpired token; otherwise 503 with a JSON body saying what is missing.
/// - `GET /metrics`: the Prometheus text format 0.0.4.
///
/// Holds only a weak reference to the server; every answer is built from snapshots (the
/// loops' counters are gathered by hopping onto each loop, the sessions' under their locks).
public final class AdminResponder: LocalResponder, @unchecked Sendable {  // @unchecked: `server` is weak and only read
    weak var server: AdminStatusSource?
    public init(server: AdminStatusSource) { self.server = server }

    static let jsonType = "application/json"
    static let metricsType = "text/plain; version=0.0.4; charset=utf-8"

    public func respond(to head: HTTPRequestHead, body: [UInt8], loop: EventLoop, reply: @escaping (HTTPResponseHead, [UInt8]) -> Void) {
        let path = head.target.split(separator: "?", maxSplits: 1).first.map(String.init) ?? head.target
        @Sendable func send(_ status: Int, _ s: String, type: String) {
            var headers = HTTPHeaders()
            headers.add("Content-Type", type)
            headers.add("Cache-Control", "no-store")
            reply(HTTPResponseHead(status: status, reason: ErrorResponse.reasonPhrase(status), headers: headers), Array(s.utf8))
        }
        guard head.method == "GET" || head.method == "HEAD" else {
            send(405, "{\"error\":\"method_not_allowed\"}\n", type: Self.jsonType)
            return
        }
        switch path {
        case "/healthz":
            send(200, "{\"status\":\"ok\"}\n", type: Self.jsonType)
        case "/readyz":
            let r = Self.readiness(phase: server?.lifecyclePhase ?? .shuttingDown,
                                   sessions: server.map(Self.sessionSnapshots) ?? [], now: monotonicNanos())
            send(r.status, r.body, type: Self.jsonType)
        case "/metrics":
            guard let server else {
                send(503, "{\"status\":\"shutting_down\"}\n", type: Self.jsonType)
                return
            }
            server.collectMetrics { [weak server] m in
                let sessions = server.map(Self.sessionSnapshots) ?? []
                let text = Self.renderMetrics(m, sessions: sessions, now: monotonicNanos(), accept: server?.acceptBudgetSnapshot,
                                              traces: server?.sessions.tracer?.exporter.counters)
                loop.execute { send(200, text, type: Self.metricsType) }
            }
        default:
            send(404, "{\"error\":\"not_found\"}\n", type: Self.jsonType)
        }
    }

    /// The client-connection budget (`DescriptorBudget`): its size, what it counts now, and the
    /// accepts it (or a lack of descriptors) turned away.
    static func renderAcceptBudget(_ a: AcceptBudget.Snapshot, into w: inout PrometheusText) {
        w.family("bearerd_descriptor_limit", .gauge, help: "The soft RLIMIT_NOFILE in force.")
        w.sample("bearerd_descriptor_limit", [], UInt64(clamping: a.limit))
        w.family("bearerd_connection_budget", .gauge,
                 help: "Client connections (all listeners) accepted at most at once: half of what RLIMIT_NOFILE leaves after the descriptors open at start and a reserve.")
        w.sample("bearerd_connection_budget", [], UInt64(clamping: a.budget))
        w.family("bearerd_budget_connections", .gauge, help: "Client connections (all listeners) open now, counted against the budget.")
        w.sample("bearerd_budget_connections", [], UInt64(clamping: a.open))
        w.family("bearerd_accept_pauses_total", .counter,
                 help: "Times accepting paused instead of taking a waiting connection, by reason (connection_budget: at the budget, until a connection closes; out_of_descriptors: accept failed with EMFILE/ENFILE, for 100 ms).")
        w.sample("bearerd_accept_pauses_total", [("reason", "connection_budget")], a.pausesAtBudget)
        w.sample("bearerd_accept_pauses_total", [("reason", "out_of_descriptors")], a.outOfDescriptors)
    }

    /// TLS handshakes of bearerd's clients (upstreams, token endpoints, STS, Redis) by peer and
    /// whether a kept session was resumed (docs/architecture.md §2.3).
    static func renderTLSHandshakes(_ stats: [String: TLSHandshakeStats.Counts], into w: inout PrometheusText) {
        w.family("bearerd_tls_handshakes_total", .counter,
                 help: "Completed client TLS handshakes by peer (host:port) and whether they resumed a kept session.")
        for (peer, c) in stats.sorted(by: { $0.key < $1.key }) {
            w.sample("bearerd_tls_handshakes_total", [("peer", peer), ("resumed", "false")], c.full)
            w.sample("bearerd_tls_handshakes_total", [("peer", peer), ("resumed", "true")], c.resumed)
        }
    }

    static func sessionSnapshots(_ server: AdminStatusSource) -> [SessionSnapshot] {
        server.sessions.sessionNames.compactMap { server.sessions.session(named: $0)?.snapshot }
    }

    // MARK: /readyz

    /// The `/readyz` answer. 200 `{"status":"ready"}`; else 503 with `{"status":"starting"}`,
    /// `{"status":"shutting_down"}`, or `{"status":"not_ready","missing":[…]}` with one entry
    /// per session without an unexpired token: `session`, `state` (`idle`, `fetching`,
    /// `backing_off`, `negative_cached`, `needs_reauthentication`, `expired`), `retry_in_s`
    /// when a retry is scheduled, and `detail` (the last token endpoint failure as in the 503
    /// bodies, scrubbed of secrets, else why there is no token yet); and one entry with state
    /// `state_not_persisted` per session whose rotated refresh token could not be written.
    /// Sink files that cannot be written are listed under `degraded` without failing readiness
    /// (`TokenSinkReadiness`).
    static func readiness(phase: ServerLifecycle.Phase, sessions: [SessionSnapshot], now: UInt64) -> (status: Int, body: String) {
        switch phase {
        case .starting: return (503, "{\"status\":\"starting\"}\n")
        case .shuttingDown: return (503, "{\"status\":\"shutting_down\"}\n")
        case .serving: break
        }
        var missing: [String] = []
        for s in sessions where !s.holdsValidToken(now: now) {
            var retryAt: UInt64?
            let state: String
            switch s.status {
            case .idle: state = "idle"
            case .fetching: state = "fetching"
            case .ready: state = "expired"
            case .backingOff(let until): state = "backing_off"; retryAt = until.nanoseconds
            case .negativeCached(let until): state = "negative_cached"; retryAt = until.nanoseconds
            case .needsReauthentication: state = "needs_reauthentication"
            }
            var entry = "{\"session\":" + ErrorResponse.jsonString(s.name) + ",\"state\":" + ErrorResponse.jsonString(state)
            if let retryAt {
                let ns = retryAt > now ? retryAt - now : 0
                entry += ",\"retry_in_s\":" + String((ns + 999_999_999) / 1_000_000_000)
            }
            let detail = s.lastFailure ?? (s.expiresAt == nil ? "no token yet" : "the token has expired")
            entry += ",\"detail\":" + ErrorResponse.jsonString(detail) + "}"
            missing.append(entry)
        }
        // A session serving tokens whose refresh token is only in memory: a restart would lose
        // it (docs/architecture.md §6.7). Not ready, so an operator sees it before restarting.
        for s in sessions where s.holdsValidToken(now: now) {
            guard let why = s.persistFailure else { continue }
            missing.append("{\"session\":" + ErrorResponse.jsonString(s.name) + ",\"state\":\"state_not_persisted\",\"detail\":"
                           + ErrorResponse.jsonString("the rotated refresh token is only in memory: " + why + " (retrying)") + "}")
        }
        // Degraded, still ready: sink files that cannot be written (docs/architecture.md §4 `sinks:`, see
        // `TokenSinkReadiness`) and a shared cache in trouble (docs/architecture.md §6.13: Redis is
        // never required, so its trouble is shown, not failed on).
        var degraded = TokenSinkReadiness.degraded(sessions)
        if sessions.contains(where: \.sharedCacheDegraded) { degraded.insert("\"shared_cache_degraded\"", at: 0) }
        let extra = degraded.isEmpty ? "" : ",\"degraded\":[" + degraded.joined(separator: ",") + "]"
        if missing.isEmpty { return (200, "{\"status\":\"ready\"" + extra + "}\n") }
        return (503, "{\"status\":\"not_ready\",\"missing\":[" + missing.joined(separator: ",") + "]" + extra + "}\n")
    }

    // MARK: /metrics

    /// The whole exposition: proxy families from the loops' summed counters, then session
    /// families. Every family documented in docs/operations.md "Metrics"; names are stable.
    static func renderMetrics(_ m: LoopMetrics, sessions: [SessionSnapshot], now: UInt64, accept: AcceptBudget.Snapshot? = nil,
                              traces: TraceExporter.Counters? = nil) -> String {
        var w = PrometheusText()
        w.family("bearerd_build_info", .gauge, help: "Always 1; the version label says which bearerd runs.")
        w.sample("bearerd_build_info", [("version", BearerdVersion.string)], 1)

        // Routes in slot order: "none" first, then configuration order (routes a reload
        // removed keep their series until restart).
        let routes = m.routes

        w.family("bearerd_requests_total", .counter,
                 help: "Requests answered to clients, by route and status (route=\"none\": no route matched or answered before routing; status=\"0\": the client left before a response).")
        for r in routes {
            for (status, n) in r.statuses.sorted(by: { $0.key < $1.key }) {
                w.sample("bearerd_requests_total", [("route", r.label), ("status", String(status))], n)
            }
        }

        w.family("bearerd_requests_by_protocol_total", .counter,
                 help: "Proxied requests by route and the client's protocol (h1: HTTP/1.x, h2: HTTP/2).")
        for r in routes where r.protocols.contains(where: { $0 > 0 }) {
            w.sample("bearerd_requests_by_protocol_total", [("route", r.label), ("protocol", "h1")], r.protocols[0])
            w.sample("bearerd_requests_by_protocol_total", [("route", r.label), ("protocol", "h2")], r.protocols[1])
        }

        w.family("bearerd_grpc_responses_total", .counter,
                 help: "gRPC calls by route and the grpc-status their client got (from the upstream or bearerd's own).")
        for r in routes {
            for (code, n) in r.grpcStatuses.sorted(by: { $0.key < $1.key }) {
                w.sample("bearerd_grpc_responses_total", [("route", r.label), ("grpc_status", code)], n)
            }
        }

        w.family("bearerd_upstream_errors_total", .counter,
                 help: "Routed requests answered by bearerd with an error instead of an upstream response, by route and error.")
        for r in routes where r.upstreamErrors.contains(where: { $0 > 0 }) {
            for kind in UpstreamErrorKind.allCases {
                w.sample("bearerd_upstream_errors_total", [("route", r.label), ("error", kind.label)], r.upstreamErrors[kind.rawValue])
            }
        }

        w.family("bearerd_upstream_response_seconds", .histogram,
                 help: "Time from sending the request head upstream to the upstream's final response head, by route.")
        for r in routes where r.label != RouteMetrics.noRoute {
            w.histogram("bearerd_upstream_response_seconds", [("route", r.label)], r.upstreamLatency)
        }

        w.family("bearerd_replays_total", .counter,
                 help: "Upstream rejections (reject_statuses) by route and what became of them (replayed or why not).")
        for r in routes where r.replays.contains(where: { $0 > 0 }) {
            for outcome in ReplayOutcome.allCases {
                w.sample("bearerd_replays_total", [("route", r.label), ("outcome", outcome.label)], r.replays[outcome.rawValue])
            }
        }

        w.family("bearerd_response_body_bytes_total", .counter, help: "Response body bytes relayed to clients.")
        w.sample("bearerd_response_body_bytes_total", [], m.responseBytes)
        w.family("bearerd_open_connections", .gauge, help: "Client connections open now on the proxy listeners.")
        w.sample("bearerd_open_connections", [], m.openConnections)
        w.family("bearerd_upstream_idle_connections", .gauge, help: "Idle keep-alive upstream connections in the pools.")
        w.sample("bearerd_upstream_idle_connections", [], m.idleUpstreamConnections)
        Self.renderTLSHandshakes(TLSHandshakeStats.snapshot, into: &w)
        if let a = accept { Self.renderAcceptBudget(a, into: &w) }
        if let traces { Self.renderTraces(traces, into: &w) }

        guard !sessions.isEmpty else { return w.text }
        func perSession(_ name: String, _ kind: PrometheusText.Kind, _ help: String, _ value: (SessionSnapshot) -> UInt64) {
            w.family(name, kind, help: help)
            for s in sessions { w.sample(name, [("session", s.name)], value(s)) }
        }
        perSession("bearerd_token_requests_total", .counter,
                   "Token endpoint requests sent (retries included); for signing sessions, credentials requests (STS, vending endpoint or helper).") { $0.counters.tokenRequests }

        w.family("bearerd_token_refreshes_total", .counter,
                 help: "Finished token (or signing credentials) fetch attempts by session, reason (start, soft, hard, rejected), outcome (success, adopted, failure) and error.")
        for s in sessions {
            let keys = s.counters.refreshes.keys.sorted { ($0.reason, $0.outcome, $0.error) < ($1.reason, $1.outcome, $1.error) }
            for k in keys {
                w.sample("bearerd_token_refreshes_total",
                         [("session", s.name), ("reason", k.reason), ("outcome", k.outcome), ("error", k.error)],
                         s.counters.refreshes[k] ?? 0)
            }
        }
        perSession("bearerd_forced_refreshes_total", .counter, "Refreshes started because an upstream rejected the current token.") { $0.counters.forcedRefreshes }
        perSession("bearerd_breaker_trips_total", .counter, "Times the rejection breaker opened.") { $0.counters.breakerTrips }
        w.family("bearerd_rejections_not_replayed_total", .counter,
                 help: "Upstream rejections the session had no token to replay with, by reason (breaker_open: relayed; others: answered 503).")
        for s in sessions {
            for reason in s.counters.rejectionsNotReplayed.keys.sorted() {
                w.sample("bearerd_rejections_not_replayed_total", [("session", s.name), ("reason", reason)],
                         s.counters.rejectionsNotReplayed[reason] ?? 0)
            }
        }
        w.family("bearerd_token_exchanges_total", .counter,
                 help: "Token exchanges (RFC 8693) by session and outcome (success, failure, subject_rejected: the subject session was refreshed and the exchange retried).")
        for s in sessions {
            for outcome in s.counters.tokenExchanges.keys.sorted() {
                w.sample("bearerd_token_exchanges_total", [("session", s.name), ("outcome", outcome)], s.counters.tokenExchanges[outcome] ?? 0)
            }
        }
        perSession("bearerd_token_state_persist_failures_total", .counter,
                   "Failed writes of a session's state file (rotated refresh token kept in memory and retried).") { $0.counters.statePersistFailures }
        TokenSinkReadiness.renderMetrics(into: &w, sessions: sessions)
        perSession("bearerd_shared_cache_hits_total", .counter,
                   "Token fetches answered by a fresh record in the shared cache (no token request).") { $0.counters.sharedCacheHits }
        perSession("bearerd_shared_cache_misses_total", .counter,
                   "Token fetches this replica made under the shared cache's lock.") { $0.counters.sharedCacheMisses }
        perSession("bearerd_shared_cache_lock_waits_total", .counter,
                   "Token fetches that waited for another replica holding the shared cache's lock.") { $0.counters.sharedCacheLockWaits }
        perSession("bearerd_shared_cache_fallbacks_total", .counter,
                   "Token fetches made locally because the shared cache failed or the wait for another replica ran out.") { $0.counters.sharedCacheFallbacks }
        perSession("bearerd_shared_cache_stale_locks_total", .counter,
                   "Shared cache locks without expiry (or longer than this replica's lock lifetime) replaced instead of waited for.") { $0.counters.sharedCacheStaleLocks }
        perSession("bearerd_shared_cache_older_records_total", .counter,
                   "Shared cache records older than the session's lineage refused (an old record put back in Redis).") { $0.counters.sharedCacheOlderRecords }
        perSession("bearerd_token_waits_total", .counter, "Callers that waited for a shared token fetch.") { $0.counters.waits }
        w.family("bearerd_token_waiters", .gauge, help: "Callers waiting for a shared token fetch now.")
        for s in sessions { w.sample("bearerd_token_waiters", [("session", s.name)], s.waiters) }
        if sessions.contains(where: { $0.dpopNonceRetries != nil }) {
            w.family("bearerd_dpop_nonce_retries_total", .counter,
                     help: "Requests sent again with a server's DPoP nonce (RFC 9449), by session and side (token_endpoint, upstream).")
            for s in sessions {
                guard let n = s.dpopNonceRetries else { continue }
                w.sample("bearerd_dpop_nonce_retries_total", [("session", s.name), ("side", "token_endpoint")], n.tokenEndpoint)
                w.sample("bearerd_dpop_nonce_retries_total", [("session", s.name), ("side", "upstream")], n.upstream)
            }
        }

        w.family("bearerd_stale_token_serves_total", .counter,
                 help: "Tokens handed to waiting callers past their hard point or after a rejection (but before expiry), by reason.")
        for s in sessions {
            for reason in StaleTokenReason.allCases {
                w.sample("bearerd_stale_token_serves_total", [("session", s.name), ("reason", reason.label)],
                         s.counters.staleServes[reason.rawValue])
            }
        }

        w.family("bearerd_token_expiry_seconds", .gauge,
                 help: "Seconds until the session's current token (a signing session's keys) expires (0 once expired; absent while the session has none).")
        for s in sessions {
            guard let expiresAt = s.expiresAt else { continue }
            let seconds = expiresAt > now ? Double(expiresAt - now) / 1e9 : 0
            w.sample("bearerd_token_expiry_seconds", [("session", s.name)], (seconds * 1000).rounded() / 1000)
        }
        perSession("bearerd_token_generation", .gauge, "Generation of the session's current token (0 before the first).") { $0.generation }
        w.family("bearerd_session_ready", .gauge, help: "1 when the session holds an unexpired token, else 0.")
        for s in sessions { w.sample("bearerd_session_ready", [("session", s.name)], s.holdsValidToken(now: now) ? 1 : 0) }
        renderSigning(into: &w, sessions: sessions)
        renderCallers(into: &w, sessions: sessions, guards: CallerJWTGuard.snapshots)
        return w.text
    }

    /// On-behalf-of sessions and `caller_jwt` guards (docs/architecture.md §6.16), present when
    /// one is configured. No label carries a caller's token or fingerprint.
    static func renderCallers(into w: inout PrometheusText, sessions: [SessionSnapshot],
                              guards: [(owner: String, refusals: [String: UInt64], fetches: [String: UInt64], keys: Int)]) {
        let callers = sessions.compactMap { s in s.caller.map { (s.name, $0) } }
        if !callers.isEmpty {
            w.family("bearerd_caller_cache_entries", .gauge, help: "Exchanged tokens (and remembered refusals) held for callers.")
            for (n, c) in callers { w.sample("bearerd_caller_cache_entries", [("session", n)], UInt64(c.cache.size)) }
            w.family("bearerd_caller_cache_max_entries", .gauge, help: "caller_cache.max_entries: the LRU bound.")
            for (n, c) in callers { w.sample("bearerd_caller_cache_max_entries", [("session", n)], UInt64(c.maxEntries)) }
            w.family("bearerd_caller_cache_lookups_total", .counter,
                     help: "Caller lookups by result: hit, miss, coalesced (joined an exchange under way), refused (a refusal remembered for 5 s).")
            for (n, c) in callers {
                w.sample("bearerd_caller_cache_lookups_total", [("session", n), ("result", "hit")], c.cache.hits)
                w.sample("bearerd_caller_cache_lookups_total", [("session", n), ("result", "miss")], c.cache.misses)
                w.sample("bearerd_caller_cache_lookups_total", [("session", n), ("result", "coalesced")], c.cache.coalesced)
                w.sample("bearerd_caller_cache_lookups_total", [("session", n), ("result", "refused")], c.cache.refusalHits)
            }
            w.family("bearerd_caller_cache_evictions_total", .counter, help: "Callers evicted to stay within max_entries (least recently used first).")
            for (n, c) in callers { w.sample("bearerd_caller_cache_evictions_total", [("session", n)], c.cache.evictions) }
            w.family("bearerd_caller_exchanges_total", .counter, help: "Token exchanges for callers by outcome: ok, refused (the caller's token), failed (outage, 5xx, timeout).")
            for (n, c) in callers {
                for outcome in ["ok", "refused", "failed"] {
                    w.sample("bearerd_caller_exchanges_total", [("session", n), ("outcome", outcome)], c.exchanges[outcome] ?? 0)
                }
            }
            w.family("bearerd_caller_reexchanges_total", .counter, help: "Upstream rejections of a caller's exchanged token that led to a new exchange.")
            for (n, c) in callers { w.sample("bearerd_caller_reexchanges_total", [("session", n)], c.reexchanges) }
            w.family("bearerd_caller_rejections_total", .counter,
                     help: "401s bearerd answered itself for callers, by reason (caller_token_required, caller_jwt.*, sts_refused).")
            for (n, c) in callers {
                for (reason, v) in c.rejections.sorted(by: { $0.key < $1.key }) {
                    w.sample("bearerd_caller_rejections_total", [("session", n), ("reason", reason)], v)
                }
            }
        }
        guard !guards.isEmpty else { return }
        w.family("bearerd_caller_jwt_keys", .gauge, help: "Keys of the caller IdP's key set in use, per caller_jwt (a route's or a session's).")
        for g in guards { w.sample("bearerd_caller_jwt_keys", [("caller_jwt", g.owner)], UInt64(g.keys)) }
        w.family("bearerd_caller_jwt_key_loads_total", .counter, help: "Loads of the caller IdP's key set (jwks_url fetches, jwks_file reads) by outcome.")
        for g in guards {
            for outcome in ["ok", "failed"] { w.sample("bearerd_caller_jwt_key_loads_total", [("caller_jwt", g.owner), ("outcome", outcome)], g.fetches[outcome] ?? 0) }
        }
        w.family("bearerd_caller_jwt_rejections_total", .counter, help: "401s of routes guarded by caller_jwt alone (no on-behalf-of session), by reason.")
        for g in guards {
            for (reason, v) in g.refusals.sorted(by: { $0.key < $1.key }) {
                w.sample("bearerd_caller_jwt_rejections_total", [("caller_jwt", g.owner), ("reason", reason)], v)
            }
        }
    }

    /// `tracing:` (docs/architecture.md §2.9): what the span exporter sent, dropped and holds.
    static func renderTraces(_ c: TraceExporter.Counters, into w: inout PrometheusText) {
        w.family("bearerd_trace_spans_exported_total", .counter, help: "Spans the OTLP collector accepted.")
        w.sample("bearerd_trace_spans_exported_total", [], c.exported)
        w.family("bearerd_trace_spans_dropped_total", .counter,
                 help: "Spans dropped, by reason (queue_full: the export queue was full; export_failed: the collector did not take them after retries).")
        w.sample("bearerd_trace_spans_dropped_total", [("reason", "queue_full")], c.droppedQueueFull)
        w.sample("bearerd_trace_spans_dropped_total", [("reason", "export_failed")], c.droppedExportFailed)
        w.family("bearerd_trace_export_retries_total", .counter, help: "Export requests sent again after a transport failure, 429 or 5xx.")
        w.sample("bearerd_trace_export_retries_total", [], c.retries)
        w.family("bearerd_trace_spans_queued", .gauge, help: "Spans waiting in the export queue now.")
        w.sample("bearerd_trace_spans_queued", [], c.queued)
    }

    /// Signing sessions' families (docs/architecture.md §6.15), present when one is configured.
    static func renderSigning(into w: inout PrometheusText, sessions: [SessionSnapshot]) {
        let signing = sessions.compactMap { s in s.signing.map { (s.name, $0) } }
        guard !signing.isEmpty else { return }
        func family(_ name: String, _ kind: PrometheusText.Kind, _ help: String, _ value: (SigningState.Counters) -> UInt64) {
            w.family(name, kind, help: help)
            for (session, c) in signing { w.sample(name, [("session", session)], value(c)) }
        }
        family("bearerd_signed_requests_total", .counter, "Requests signed with the session's keys (replays and retries signed again count again).") { $0.signedRequests }
        family("bearerd_signing_credential_rejections_total", .counter,
               "Upstream answers saying the keys are no longer good (ExpiredToken, InvalidAccessKeyId, SecurityTokenExpired, ...).") { $0.credentialRejections }
        family("bearerd_signing_skew_adoptions_total", .counter, "RequestTimeTooSkewed answers whose server time was adopted for signing.") { $0.skewAdoptions }
        family("bearerd_signing_signature_mismatches_total", .counter, "SignatureDoesNotMatch answers (never replayed).") { $0.signatureMismatches }
        w.family("bearerd_signing_clock_offset_seconds", .gauge, help: "Seconds added to the host clock when signing (adopted from a server's RequestTimeTooSkewed).")
        for (session, c) in signing { w.sample("bearerd_signing_clock_offset_seconds", [("session", session)], Double(c.clockOffsetSeconds)) }
    }
}
