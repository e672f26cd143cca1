import BearerdConfig
import BearerdIO
import BearerdOAuth
import BearerdProxyCore
import BearerdTLS
import Logging
import Synchronization

/// Why a caller gets bearerd's own 401 (docs/architecture.md §6.16): the answer's JSON `error`,
/// its `WWW-Authenticate` parameters and the metric reason. Never carries the caller's token.
public struct CallerRefusal: Sendable, Equatable {
    /// The JSON body's `error`: `caller_token_required`, `invalid_token`, or the token
    /// endpoint's own `error` (`invalid_grant`, `invalid_request`).
    public var error: String
    /// Human detail (the validator's reason text or the endpoint's `error_description`, scrubbed).
    public var detail: String
    /// Stable reason for logs and `bearerd_caller_rejections_total`: `caller_token_required`,
    /// `caller_jwt.*`, `sts_refused`.
    public var reason: String
    /// RFC 6750 §3.1 `error` of the challenge; nil when the request carried no token (§3.1: no
    /// error code then).
    public var challengeError: String?

    public init(error: String, detail: String, reason: String, challengeError: String?) {
        self.error = error
        self.detail = detail
        self.reason = reason
        self.challengeError = challengeError
    }

    /// No `Authorization: Bearer` on a route that needs the caller's token.
    public static let missingToken = CallerRefusal(error: "caller_token_required",
                                                   detail: "this route acts on behalf of its callers: send Authorization: Bearer <your token>",
                                                   reason: "caller_token_required", challengeError: nil)

    /// `caller_jwt` judged the token.
    public static func invalid(_ failure: CallerJWT.Failure) -> CallerRefusal {
        CallerRefusal(error: "invalid_token", detail: failure.description, reason: failure.reason, challengeError: "invalid_token")
    }

    /// The `WWW-Authenticate` value of the 401 (RFC 6750 §3).
    public var challenge: String {
        var v = "Bearer realm=\"bearerd\""
        if let challengeError {
            v += ", error=\"\(challengeError)\", error_description=\"" + Self.quotable(detail) + "\""
        }
        return v
    }

    /// RFC 6750 §3: `error_description` holds %x20-21 / %x23-5B / %x5D-7E only.
    static func quotable(_ s: String) -> String {
        String(decoding: s.utf8.prefix(200).map { ($0 >= 0x20 && $0 <= 0x7E && $0 != 0x22 && $0 != 0x5C) ? $0 : 0x20 }, as: UTF8.self)
    }
}

/// The caller's side of one request on an on-behalf-of route: the token (kept only for the
/// exchange, never logged), its cache key and, when it is a JWT, when it ends (wall seconds).
public struct CallerIdentity: Sendable {
    public let token: String
    public let key: CallerKey
    public var expiresAt: Int64?

    /// nil for an empty token (no key: callers without a token never share an entry). The hash
    /// is OpenSSL's (this runs per request; the pure one serves the tests and the fuzzer).
    public init?(token: String) {
        guard !token.isEmpty else { return nil }
        var t = token
        guard let key = t.withUTF8({ CallerKey(sha256Digest: Digest.sha256(UnsafeRawBufferPointer($0))) }) else { return nil }
        self.token = token
        self.key = key
    }
}

/// What a caller's request gets from its on-behalf-of session.
public enum CallerAnswer: Sendable {
    case token(PublishedToken)
    /// The caller's own fault: 401, nothing is forwarded.
    case refused(CallerRefusal)
    /// bearerd's or the token endpoint's trouble: 503 with Retry-After.
    case unavailable(TokenUnavailable)
}

/// Counters of one on-behalf-of session, for `/metrics`.
public struct CallerSessionSnapshot: Sendable {
    public var cache: CallerCacheCounters
    public var maxEntries: Int
    public var inFlight: Int
    /// Exchanges by outcome: `ok`, `refused`, `failed`.
    public var exchanges: [String: UInt64]
    /// 401s bearerd answered itself, by reason.
    public var rejections: [String: UInt64]
    /// Upstream rejections of an exchanged token that were re-exchanged.
    public var reexchanges: UInt64
    /// `caller_jwt` on the session: whether its keys were ever obtained (readiness).
    public var keysReady: Bool
    public var keysProblem: String?
}

/// The per-caller half of an on-behalf-of session (`subject: caller`, `assertion: caller`;
/// docs/architecture.md §6.16): one exchanged token per caller, never reused across callers.
///
/// Owns the `CallerTokenCache` (entries, in-flight exchanges and their waiters), the outage
/// backoff and the counters, all behind `state` (a `Mutex`, held for O(1) work: a lookup, a
/// finish): a cached caller is served on its own loop without a hop. Exchanges run on the
/// session's queue (`session.queue`), with the session's settings (client authentication,
/// audience, resource, DPoP), several at once (one per caller). Invariants: at most one exchange
/// in flight per caller (the cache's rule); every waiter is resumed exactly once on its loop; the
/// caller's token is sent only to the session's token endpoint and appears nowhere else (logs
/// carry the key's fingerprint).
public final class CallerSessionDriver: @unchecked Sendable {  // @unchecked: mutable state in `state` or confined to the session queue
    public let name: String
    /// `caller_cache:` and `caller_jwt:` as configured (a reload that changes them makes a new driver).
    public let config: OnBehalfOfConfig
    /// `caller_jwt:` on the session: callers are validated before any exchange.
    public let callerJWT: CallerJWTGuard?
    unowned let session: TokenSessionDriver
    private let clock: any SessionClock
    private let logger: Logger

    enum Waiter {
        case token(EventLoop, (CallerAnswer) -> Void)
        /// `refreshed`: whether the answer may be final (the exchange started after the rejection).
        case rejection(EventLoop, refreshed: Bool, (RejectionOutcome) -> Void)
    }

    private struct State {
        var cache: CallerTokenCache<Waiter>
        var generation: UInt64 = 0
        /// After a failed exchange (outage, 5xx, timeout): no new exchange before this instant.
        var outageUntil: MonotonicInstant?
        var outageStreak = 0
        var lastFailure: String?
        var exchanges: [String: UInt64] = [:]
        var rejections: [String: UInt64] = [:]
        var reexchanges: UInt64 = 0
        var stopped = false
        /// The `PublishedToken` last handed out per caller, so a cache hit hands out the same
        /// object instead of a new one with its fingerprint hashed again (measured: a third of a
        /// hit's instructions). At most `handOutLimit` (emptied when full: a bound of about
        /// 50 KiB, outside the cache's own ceiling); checked against the cached token's value.
        var handedOut: [CallerKey: PublishedToken] = [:]

        /// `fingerprint`: the token's, when the caller hashed it already (off the lock).
        mutating func handOut(_ secret: OAuthSecret, _ key: CallerKey, fingerprint: String? = nil) -> PublishedToken {
            if let p = handedOut[key], p.value == secret.exposedValue { return p }
            if handedOut.count >= CallerSessionDriver.handOutLimit { handedOut.removeAll(keepingCapacity: true) }
            let p = PublishedToken(value: secret.exposedValue, generation: generation, fingerprint: fingerprint ?? secret.fingerprint,
                                   usableUntil: UInt64.max)
            handedOut[key] = p
            return p
        }
    }
    static let handOutLimit = 256
    private let state: Mutex<State>
    /// Session queue: the periodic sweep of expired entries.
    private var sweepTimer: SessionTimer?

    init(session: TokenSessionDriver, config: OnBehalfOfConfig, callerJWT: CallerJWTGuard?, clock: any SessionClock, logger: Logger) {
        self.session = session
        name = session.name
        self.config = config
        self.callerJWT = callerJWT
        self.clock = clock
        self.logger = logger
        state = Mutex(State(cache: CallerTokenCache(maxEntries: config.maxEntries)))
    }

    func start() {
        callerJWT?.start()
        session.queue.execute { [self] in scheduleSweep() }
    }

    func stop() {
        callerJWT?.stop()
        session.queue.execute { [self] in
            sweepTimer?.cancel()
            state.withLock { $0.stopped = true }
        }
    }

    public var snapshot: CallerSessionSnapshot {
        let s = state.withLock { s in
            (s.cache.counters, s.cache.maxEntries, s.cache.inFlightCount, s.exchanges, s.rejections, s.reexchanges)
        }
        return CallerSessionSnapshot(cache: s.0, maxEntries: s.1, inFlight: s.2,
                                     exchanges: s.3, rejections: s.4, reexchanges: s.5,
                                     keysReady: callerJWT?.hasKeys ?? true, keysProblem: callerJWT?.lastProblem)
    }

    /// Counts a 401 bearerd answered itself for this session's callers (the exchange calls it).
    public func countRefusal(_ reason: String) {
        state.withLock { $0.rejections[reason, default: 0] &+= 1 }
    }

    // MARK: The request path (any loop)

    /// The exchanged token for `caller`, at once from the cache or after the one exchange for
    /// this caller; `completion` runs exactly once on `loop` (synchronously on a hit).
    ///
    /// `trace`: the waiting exchange's span (`tracing:`, docs/architecture.md §2.9): the exchange
    /// this request starts becomes its child span.
    public func token(for caller: CallerIdentity, on loop: EventLoop, trace: TraceContext? = nil,
                      completion: @escaping (CallerAnswer) -> Void) {
        let now = clock.now()
        switch state.withLock({ s -> (CallerTokenCache<Waiter>.Lookup, PublishedToken?)? in
            guard let found = s.cache.cached(caller.key, now: now) else { return nil }
            if case .hit(let secret) = found { return (found, s.handOut(secret, caller.key)) }
            return (found, nil)
        }) {
        case (.hit, let token?)?:
            completion(.token(token))
            return
        case (.refused(let error, let description), _)?:
            completion(.refused(stsRefusal(error: error, description: description)))
            return
        default:
            break
        }
        // A miss: the caller is judged before anything is sent for it.
        guard let callerJWT else {
            var c = caller
            c.expiresAt = TokenResponseParser.jwtExpiry(caller.token)
            lookup(c, on: loop, trace: trace, completion: completion)
            return
        }
        callerJWT.validate(caller.token, key: caller.key, on: loop) { [self] verdict in
            switch verdict {
            case .valid(let v):
                var c = caller
                c.expiresAt = v.expiresAt
                lookup(c, on: loop, trace: trace, completion: completion)
            case .invalid(let failure):
                logger.info("caller token refused", metadata: ["caller": "\(caller.key.fingerprint)", "reason": "\(failure.reason)"])
                completion(.refused(.invalid(failure)))
            case .keysUnavailable(let detail):
                completion(.unavailable(TokenUnavailable(session: name, retryAfterSeconds: 5, detail: "caller_jwt: " + detail)))
            }
        }
    }

    private func lookup(_ caller: CallerIdentity, on loop: EventLoop, trace: TraceContext?, completion: @escaping (CallerAnswer) -> Void) {
        let now = clock.now()
        enum Next { case answer(CallerAnswer), exchange, wait }
        let next: Next = state.withLock { s in
            if s.stopped { return .answer(.unavailable(TokenUnavailable(session: name, retryAfterSeconds: 1, detail: "token.session_stopped"))) }
            // A cached caller may have arrived meanwhile; an outage refuses only new exchanges.
            if let hit = s.cache.cached(caller.key, now: now) {
                switch hit {
                case .hit(let secret): return .answer(.token(s.handOut(secret, caller.key)))
                case .refused(let e, let d): return .answer(.refused(stsRefusal(error: e, description: d)))
                default: break
                }
            }
            if let until = s.outageUntil, now < until {
                let seconds = Int((until.nanoseconds - now.nanoseconds + 999_999_999) / 1_000_000_000)
                return .answer(.unavailable(TokenUnavailable(session: name, retryAfterSeconds: seconds,
                                                             detail: s.lastFailure ?? "the token endpoint is failing")))
            }
            switch s.cache.lookup(caller.key, now: now, waiter: .token(loop, completion)) {
            case .exchange: return .exchange
            case .joined: return .wait
            case .hit(let secret): return .answer(.token(s.handOut(secret, caller.key)))
            case .refused(let e, let d): return .answer(.refused(stsRefusal(error: e, description: d)))
            }
        }
        switch next {
        case .answer(let a):
            completion(a)
        case .exchange: session.queue.execute { [self] in exchange(caller, trace: trace) }
        case .wait: break
        }
    }

    /// The upstream rejected `rejected`, the exchanged token of `caller`: the entry is dropped if
    /// it still holds that token, and the request is replayed once with the newer token (one
    /// already cached: provisional) or the one a new exchange brings (final).
    public func reportRejected(_ caller: CallerIdentity, rejected: PublishedToken, on loop: EventLoop, trace: TraceContext? = nil,
                               completion: @escaping (RejectionOutcome) -> Void) {
        let now = clock.now()
        enum Next { case answer(RejectionOutcome), exchange, wait }
        let next: Next = state.withLock { s in
            if s.stopped { return .answer(.passThrough(reason: "token.session_stopped")) }
            s.cache.invalidate(caller.key, token: OAuthSecret(rejected.value))
            if let newer = s.cache.liveToken(caller.key, now: now) {
                return .answer(.replay(s.handOut(newer, caller.key), refreshed: false))
            }
            s.reexchanges &+= 1
            switch s.cache.lookup(caller.key, now: now, waiter: .rejection(loop, refreshed: true, completion)) {
            case .exchange: return .exchange
            case .joined: return .wait
            case .hit(let secret): return .answer(.replay(s.handOut(secret, caller.key), refreshed: false))
            case .refused(let e, _): return .answer(.passThrough(reason: "caller refused by the token endpoint (\(e))"))
            }
        }
        switch next {
        case .answer(let o): completion(o)
        case .exchange:
            logger.info("upstream rejected a caller's exchanged token; exchanging again", metadata: [
                "caller": "\(caller.key.fingerprint)", "token.fingerprint": "\(rejected.fingerprint)"])
            session.queue.execute { [self] in exchange(caller, trace: trace) }
        case .wait: break
        }
    }

    /// A rejection relayed as it is: the entry goes, so the caller's next request exchanges again.
    public func reportRejectedWithoutReplay(_ caller: CallerIdentity, rejected: PublishedToken) {
        state.withLock { $0.cache.invalidate(caller.key, token: OAuthSecret(rejected.value)) }
    }

    private func stsRefusal(error: String, description: String?) -> CallerRefusal {
        CallerRefusal(error: error.isEmpty ? "invalid_grant" : error,
                      detail: "the token endpoint refused the caller's token" + (description.map { ": " + $0 } ?? ""),
                      reason: "sts_refused", challengeError: "invalid_token")
    }

    // MARK: The exchange (session queue)

    private func exchange(_ caller: CallerIdentity, trace: TraceContext?) {
        let settings = session.currentSettings
        let started = clock.now()
        // docs/architecture.md §2.9: a CLIENT child span of the exchange that started it.
        let tracer = trace == nil ? nil : session.tracing.tracer
        let span = trace.flatMap { parent in tracer.map { (context: $0.child(of: parent), parent: parent.spanID, start: monotonicNanos()) } }
        session.sendCallerExchange(settings.preparedRequest(refreshToken: nil, callerToken: OAuthSecret(caller.token),
                                                            wallClockNow: clock.wallClockSeconds()),
                                   traceparent: span?.context.traceparent) { [self] sentAt, result in
            if let tracer, let span {
                var attributes = [TraceAttribute("bearerd.grant", settings.config.grant.rawValue), TraceAttribute("bearerd.token.reason", "caller"),
                                  TraceAttribute("url.full", settings.config.tokenURL.description)]
                let status: TraceStatus
                switch result {
                case .success:
                    attributes.append(TraceAttribute("bearerd.outcome", "ok"))
                    status = .unset
                case .failure(let f):
                    attributes.append(TraceAttribute("bearerd.outcome", Self.isCallerRefusal(f) ? "refused" : "failed"))
                    attributes.append(TraceAttribute("error.type", f.reason))
                    if let e = f.oauthError { attributes.append(TraceAttribute("oauth.error", e)) }
                    if let code = f.status { attributes.append(TraceAttribute("http.response.status_code", code)) }
                    status = .error(f.oauthError ?? f.reason)
                }
                tracer.exporter.submit(SpanRecord(context: span.context, parent: span.parent, name: "token exchange for a caller", kind: .client,
                                                  start: span.start, end: monotonicNanos(), attributes: attributes, status: status))
            }
            finish(caller, result: result, sentAt: sentAt, started: started, settings: settings)
        }
    }

    private func finish(_ caller: CallerIdentity, result: Result<TokenGrant, TokenEndpointFailure>, sentAt: MonotonicInstant,
                        started: MonotonicInstant, settings: SessionSettings) {
        let now = clock.now()
        let outcome: CallerTokenCache<Waiter>.Outcome
        let label: String
        var fingerprint: String?
        var failureDetail = "token exchange failed"
        var outageFailure: TokenEndpointFailure?
        switch result {
        case .success(let grant):
            // Usable until the hard margin before expiry (docs/architecture.md §6), from the
            // moment the request was sent, and never beyond the caller's own token.
            let hard = settings.policy.hardMargin(lifetime: grant.lifetime)
            let life = grant.lifetime - hard
            let callerLife = caller.expiresAt.map { CallerJWT.lifetime(until: $0, wallClockNow: clock.wallClockSeconds()) }
            let expiry = CallerTokenCache<Waiter>.entryExpiry(now: sentAt, tokenLifetime: life, callerLifetime: callerLife)
            outcome = .token(grant.accessToken, expiresAt: expiry)
            label = "ok"
            // Hashed once, here, off the lock: the log line and the token handed out share it.
            fingerprint = grant.accessToken.fingerprint
            logger.info("exchanged a caller's token", metadata: [
                "caller": "\(caller.key.fingerprint)", "token.fingerprint": "\(fingerprint ?? "")",
                "expires_in_s": "\(grant.lifetime.components.seconds)", "elapsed_ms": "\((now.nanoseconds &- started.nanoseconds) / 1_000_000)"])
        case .failure(let f) where Self.isCallerRefusal(f):
            label = "refused"
            outcome = .refused(error: f.oauthError ?? "invalid_grant", description: f.errorDescription.map(Redaction.scrub))
            logger.info("the token endpoint refused a caller's token", metadata: [
                "caller": "\(caller.key.fingerprint)", "oauth.error": "\(f.oauthError ?? "")"])
        case .failure(let f):
            label = "failed"
            outcome = .failed
            failureDetail = Self.describe(f)
            if Self.isOutage(f) { outageFailure = f }
            let level: Logger.Level = f.classification == .permanent ? .error : .warning
            logger.log(level: level, "token exchange for a caller failed", metadata: [
                "caller": "\(caller.key.fingerprint)", "reason": "\(f.reason)", "detail": "\(failureDetail)"])
        }
        /// What every waiter of this exchange gets, decided once.
        enum Resolved {
            case token(PublishedToken)
            case refused(error: String, description: String?)
            case unavailable(TokenUnavailable)
        }
        let (waiters, resolved): ([Waiter], Resolved) = state.withLock { s in
            s.exchanges[label, default: 0] &+= 1
            s.generation &+= 1
            var retryAfter = 1
            if let f = outageFailure {
                // Outage backoff: 1 s, 2 s, 4 s … 30 s (the server's Retry-After, up to 1 h, wins).
                s.outageStreak = min(s.outageStreak + 1, 6)
                var delay = Duration.seconds(min(30, 1 << (s.outageStreak - 1)))
                if let ra = f.retryAfter { delay = min(ra, .seconds(3600)) }
                s.outageUntil = now + delay
                s.lastFailure = failureDetail
                retryAfter = max(1, Int(delay.components.seconds))
            } else if label != "failed" {
                // A token or the caller's own refusal: the endpoint answers. (Any other failure
                // is one caller's: its request fails, the others' exchanges go on.)
                s.outageStreak = 0
                s.outageUntil = nil
            }
            let waiters = s.cache.finish(caller.key, outcome: outcome, now: now)
            switch outcome {
            case .token(let secret, _):
                // One object for every waiter, and for the hits after them.
                return (waiters, .token(s.handOut(secret, caller.key, fingerprint: fingerprint)))
            case .refused(let e, let d):
                return (waiters, .refused(error: e, description: d))
            case .failed:
                return (waiters, .unavailable(TokenUnavailable(session: name, retryAfterSeconds: retryAfter, detail: failureDetail)))
            }
        }
        for w in waiters {
            switch (w, resolved) {
            case (.token(let loop, let done), .token(let t)):
                loop.execute { done(.token(t)) }
            case (.token(let loop, let done), .refused(let e, let d)):
                let r = stsRefusal(error: e, description: d)
                loop.execute { done(.refused(r)) }
            case (.token(let loop, let done), .unavailable(let u)):
                loop.execute { done(.unavailable(u)) }
            case (.rejection(let loop, let refreshed, let done), .token(let t)):
                loop.execute { done(.replay(t, refreshed: refreshed)) }
            case (.rejection(let loop, _, let done), .refused(let e, _)):
                loop.execute { done(.passThrough(reason: "caller refused by the token endpoint (\(e))")) }
            case (.rejection(let loop, _, let done), .unavailable(let u)):
                loop.execute { done(.unavailable(u)) }
            }
        }
    }

    /// The token endpoint refused the caller's token itself (RFC 6749 §5.2, RFC 8693 §2.2.2, and
    /// the on-behalf-of errors of OpenID Connect and Entra): an OAuth `error` about the grant or
    /// the user, not about bearerd's client. Those are the caller's 401, remembered 5 s.
    /// `invalid_client`, `unauthorized_client`, `unsupported_grant_type` are bearerd's
    /// configuration (503, logged at error level).
    static func isCallerRefusal(_ f: TokenEndpointFailure) -> Bool {
        guard let e = f.oauthError else { return false }
        return callerErrors.contains(e)
    }
    static let callerErrors: Set<String> = [
        "invalid_grant", "invalid_request", "invalid_scope", "invalid_target", "access_denied",
        "interaction_required", "consent_required", "login_required", "account_selection_required",
    ]

    /// A failure that says the token endpoint itself is in trouble, so that new exchanges for
    /// every caller wait (the outage backoff): no answer (transport, timeout), 429, 502–504, or
    /// bearerd's own configuration refused. Any other failure (a 500 one caller's token
    /// provokes, a malformed answer) fails that caller's request only, so no caller can hold
    /// back the others'.
    static func isOutage(_ f: TokenEndpointFailure) -> Bool {
        if f.classification == .permanent && f.status != nil { return true }  // invalid_client and kin: nobody gets through
        guard let status = f.status else { return f.reason == "token.transport" }
        return status == 429 || (502...504).contains(status)
    }

    static func describe(_ f: TokenEndpointFailure) -> String {
        var d = f.reason
        if let e = f.oauthError { d += ": " + e }
        if let desc = f.errorDescription { d += " (" + Redaction.scrub(desc) + ")" }
        if let status = f.status { d += " [HTTP \(status)]" }
        return d
    }

    private func scheduleSweep() {
        sweepTimer = clock.schedule(after: .seconds(60), on: session.queue) { [self] in
            let stopped = state.withLock { s in
                s.cache.removeExpired(now: clock.now())
                return s.stopped
            }
            if !stopped { scheduleSweep() }
        }
    }
}
