// Theory of operation
// ===================
//
// One `TokenSession.StateMachine` holds everything a token session decides (docs/architecture.md §6):
// the current access token and its generation, the one token request that may be in flight,
// the callers waiting for it, the retry schedule and the rejection breaker. It performs no
// I/O and reads no clock: every input carries `now` (a `MonotonicInstant`), every output is
// an `Action` the driver carries out on the session's serial queue.
//
// Inputs (facts)                               Outputs (imperatives)
//   start(now:)                                  .startFetch(FetchRequest)
//   tokenRequested(waiter:now:)                  .resumeWaiters([WaiterID], with:)
//   waiterTimedOut(waiter:now:)                  .scheduleWaiterTimeout(WaiterID, at:)
//   fetchSucceeded(_:sentAt:now:)                .scheduleRefresh(at:) / .scheduleRetry(at:)
//   fetchFailed(_:requestSent:now:)              .cancelTimer
//   refreshTimerFired(now:) / retryTimerFired    .publish(CurrentToken?)
//   upstreamRejected(generation:waiter:now:)     .reportBreakerTripped(until:)   (5 counted
//   upstreamAccepted(generation:now:)              refreshes per 30 s pass; the 6th trips it)
//   credentialsChanged(now:)                     .reportNeedsReauthentication(failure)
//                                                .reportNegativeCached(failure, until:)
//
// Driver contract:
// * Carry out actions in order. `.startFetch` is only emitted when no fetch is in flight;
//   answer every one with exactly one `fetchSucceeded` or `fetchFailed`.
// * `sentAt` is the monotonic instant the request was handed to the transport: the token's
//   expiry counts from it. Persist a rotated refresh token *before* `fetchSucceeded`.
// * A fetch may be answered from the state file instead of the server (another process
//   rotated first, docs/architecture.md §6): `fetchSucceeded(stored.adoptableGrant(…), sentAt: now, now:)`.
//   On `invalid_grant`, re-read the state file once under the lock first; only if nothing
//   newer is there, report `fetchFailed(invalid_grant)`.
// * There is one session timer: `.scheduleRefresh` / `.scheduleRetry` replace it,
//   `.cancelTimer` disarms it. A stale firing is harmless (it is checked against the state).
// * Waiter timeouts are separate one-shot timers; a timeout for a waiter already resumed is
//   ignored. Every waiter passed to `tokenRequested` is resumed exactly once.
// * `.publish` is the loops' fast path: a loop uses the published token while
//   `now < usableWithoutWaitingUntil` and asks the session otherwise.
//
// Token life, with L the lifetime and t0 the instant the request was sent:
//
//   t0 ─────────── soft point ───────── hard point ────────── expiry (t0 + L)
//        served at once   │ served at once,       │ callers wait for the      │ no token:
//                         │ one background fetch  │ one fetch (≤ 10 s), or    │ wait for the fetch
//                         │                       │ get the old token if it   │ or fail with
//                         │                       │ failed transiently        │ retryAfter
//
// Retries: attempts 1 s then 2 s apart (±10 %), `Retry-After` obeyed (≤ 1 h); after the
// last attempt of a round, backoff 1, 2, 4 … s (≤ 30 s, ±20 %) before the next round.
// Waiters without a usable token wait for the next attempt when it starts within the wait
// bound (within a round or between rounds alike); only when it does not, or when their own
// bound runs out, are they failed (with the delay as `retryAfter`: the 503 of docs/architecture.md §5).
//
// Rejections (docs/architecture.md §6.8, "Breaker"): a token is *proven* once an
// upstream answered a request carrying it with a status that is not a rejection
// (`upstreamAccepted`, reported by the driver once per generation). A rejected token is never
// served again, not even while the refresh fails: its callers wait for the refresh or get a
// `TokenUnavailable` (a 503, never the upstream's 401). Forced refreshes are paced: at most one
// per `forcedRefreshInterval` (1 s); a rejection inside it waits in `.pacingForcedRefresh` for
// the next one. Only the rejection of a never-proven token is counted by the breaker; while it
// is open such a rejection is resumed with `.passThrough` (relay the upstream's answer).

extension TokenSession {
    /// The token session's decisions (docs/architecture.md §6). Owns the current token, the generation
    /// counter, the in-flight fetch and its waiters, the retry schedule and the breaker.
    ///
    /// Lives on the session's serial queue (a value type; the driver owns the only copy).
    /// Invariants: at most one fetch in flight; waiters exist only in `.fetching` and
    /// `.backingOff` and `.pacingForcedRefresh`; every waiter is resumed exactly once; generations strictly increase.
    public struct StateMachine: Sendable {
        /// Valid transitions are listed on each case.
        enum Phase: Sendable {
            /// Nothing requested yet, no token.
            /// Exits: `start`, `tokenRequested`, `credentialsChanged` → `.fetching(.start)`.
            case idle
            /// One token request in flight; `waiters` wait for its outcome.
            /// Exits: `fetchSucceeded` → `.ready`; `fetchFailed` → `.fetching` (the one
            /// same-token retry), `.backingOff`, `.negativeCached` or `.needsReauthentication`.
            case fetching(Fetching)
            /// A retryable failure; the next attempt is due at `at`.
            /// Exits: `retryTimerFired` (at or after `at`), `credentialsChanged` → `.fetching`.
            case backingOff(BackingOff)
            /// The current token was rejected within `forcedRefreshInterval` of the last forced
            /// refresh: the next one starts at `at`; `waiters` (requests and rejections) wait for it.
            /// Exits: `retryTimerFired` (at or after `at`) → `.fetching(.rejected)`;
            /// `credentialsChanged` → `.fetching(.start)`.
            case pacingForcedRefresh(Pacing)
            /// A token is held; the background refresh is due at `refreshAt`.
            /// Exits: `refreshTimerFired` → `.fetching(.soft / .hard)`; `tokenRequested`
            /// in the hard window or after expiry → `.fetching(.hard)`; `upstreamRejected`
            /// of the current generation → `.fetching(.rejected)`, or `.pacingForcedRefresh`
            /// within a second of the last forced refresh (a breaker refusal stays `.ready`).
            case ready(Ready)
            /// A permanent failure: no requests to the server until `until`.
            /// Exits: `tokenRequested` at or after `until` → `.fetching`;
            /// `credentialsChanged` → `.fetching(.start)`.
            case negativeCached(NegativeCached)
            /// `invalid_grant` on a refresh_token session: no traffic to the server.
            /// Exits: `credentialsChanged` only → `.fetching(.start)`.
            case needsReauthentication(TokenEndpointFailure)
        }

        struct Fetching: Sendable {
            var reason: FetchRequest.Reason
            var attempt: Int
            var round: Int
            var sameTokenRetryUsed: Bool
            /// Credentials changed while this request was in flight: a credential failure
            /// of it says nothing about the new ones.
            var credentialsChanged: Bool
            var waiters: [WaiterID]
        }

        struct BackingOff: Sendable {
            var reason: FetchRequest.Reason
            var nextAttempt: Int
            var round: Int
            var at: MonotonicInstant
            var lastFailure: TokenEndpointFailure
            /// Callers without a usable token that wait for the attempt at `at` (each joined
            /// while `at` was within its wait bound; its own timeout ends its wait).
            var waiters: [WaiterID]
        }

        struct Pacing: Sendable {
            var at: MonotonicInstant
            var waiters: [WaiterID]
        }

        struct Ready: Sendable {
            var refreshAt: MonotonicInstant
            /// No-progress guard: no fetch before this instant.
            var notBefore: MonotonicInstant?
        }

        struct NegativeCached: Sendable {
            var until: MonotonicInstant
            var failure: TokenEndpointFailure
        }

        /// The current token with its schedule.
        struct Token: Sendable {
            var accessToken: OAuthSecret
            var generation: UInt64
            var expiresAt: MonotonicInstant
            var hardAt: MonotonicInstant
            /// When the token request that returned it was sent (`sentAt`).
            var requestedAt: MonotonicInstant
            /// Set when an upstream rejected this generation: it is never served again.
            var rejectedAt: MonotonicInstant?
            /// An upstream answered a request carrying it with a status that is not a rejection.
            var proven: Bool

            var published: CurrentToken {
                let until = rejectedAt.map { Swift.min($0, hardAt) } ?? hardAt
                return CurrentToken(accessToken: accessToken, generation: generation, expiresAt: expiresAt,
                                    usableWithoutWaitingUntil: Swift.min(until, expiresAt), requestedAt: requestedAt)
            }
            func usableWithoutWaiting(_ now: MonotonicInstant) -> Bool { published.isUsableWithoutWaiting(at: now) }
            func notExpired(_ now: MonotonicInstant) -> Bool { now < expiresAt }
            /// May be handed out when no newer token can be had: not expired, not rejected.
            func servableAfterFailure(_ now: MonotonicInstant) -> Bool { rejectedAt == nil && now < expiresAt }
        }

        public enum Action: Sendable, Equatable {
            case startFetch(FetchRequest)
            case resumeWaiters([WaiterID], with: WaiterResult)
            case scheduleWaiterTimeout(WaiterID, at: MonotonicInstant)
            case scheduleRefresh(at: MonotonicInstant)
            case scheduleRetry(at: MonotonicInstant)
            case cancelTimer
            /// Make this the loops' fast-path token (nil: none; ask the session).
            case publish(CurrentToken?)
            /// Log at error level: rejections are not about our token.
            case reportBreakerTripped(until: MonotonicInstant)
            /// Log at error level; `bearerd check` and `/readyz` say a new refresh token is needed.
            case reportNeedsReauthentication(TokenEndpointFailure)
            /// Log at error level: a permanent failure, requests fail fast until `until`.
            case reportNegativeCached(TokenEndpointFailure, until: MonotonicInstant)
        }

        public let policy: Policy
        private var phase: Phase = .idle
        private var token: Token?
        private var lastGeneration: UInt64 = 0
        private var breaker: RejectionBreaker
        /// When the last forced (rejection-triggered) refresh started: paces the next one.
        private var lastForcedRefreshAt: MonotonicInstant?
        private var random: any RandomNumberGenerator & Sendable

        /// - Parameter random: the only source of jitter (seed it in tests; the driver passes
        ///   `SystemRandomNumberGenerator()`).
        public init(policy: Policy, random: any RandomNumberGenerator & Sendable) {
            self.policy = policy
            self.breaker = RejectionBreaker(configuration: policy.breaker)
            self.random = random
        }

        // MARK: Queries

        /// The current token (possibly expired or rejected), for publication and logs.
        public var currentToken: CurrentToken? { token?.published }

        public var currentGeneration: UInt64 { token?.generation ?? 0 }

        public var isFetchInFlight: Bool { if case .fetching = phase { return true }; return false }

        public var status: Status {
            switch phase {
            case .idle: .idle
            case .fetching, .pacingForcedRefresh: .fetching
            case .ready: .ready
            case .backingOff(let b): .backingOff(until: b.at)
            case .negativeCached(let n): .negativeCached(until: n.until)
            case .needsReauthentication: .needsReauthentication
            }
        }

        /// Waiters currently held (for tests and metrics).
        public var waiterCount: Int {
            switch phase {
            case .fetching(let f): f.waiters.count
            case .backingOff(let b): b.waiters.count
            case .pacingForcedRefresh(let p): p.waiters.count
            default: 0
            }
        }

        /// Whether the current token was proven (for tests).
        public var currentTokenProven: Bool { token?.proven ?? false }

        /// The breaker, for tests.
        public var rejectionBreaker: RejectionBreaker { breaker }

        // MARK: Inputs

        /// The session was created: fetch the first token eagerly so the first request does
        /// not wait.
        public mutating func start(now: MonotonicInstant) -> [Action] {
            guard case .idle = phase else { return [] }
            return [beginFetch(.start, attempt: 1, round: 1, waiters: [])]
        }

        /// A caller needs a token (the fast path did not apply).
        public mutating func tokenRequested(waiter: WaiterID, now: MonotonicInstant) -> [Action] {
            if let t = token, t.usableWithoutWaiting(now) {
                var actions: [Action] = [.resumeWaiters([waiter], with: .token(t.published))]
                // A late refresh timer must not delay the background refresh.
                if case .ready(let r) = phase, now >= r.refreshAt, r.notBefore.map({ now >= $0 }) ?? true {
                    actions.append(beginFetch(.soft, attempt: 1, round: 1, waiters: []))
                }
                return actions
            }
            // No token, an expired or rejected one, or one inside the hard window.
            switch phase {
            case .idle:
                return [beginFetch(.start, attempt: 1, round: 1, waiters: [waiter]),
                        .scheduleWaiterTimeout(waiter, at: now + policy.waitTimeout)]

            case .fetching(var f):
                f.waiters.append(waiter)
                phase = .fetching(f)
                return [.scheduleWaiterTimeout(waiter, at: now + policy.waitTimeout)]

            case .pacingForcedRefresh(var p):
                p.waiters.append(waiter)
                phase = .pacingForcedRefresh(p)
                return [.scheduleWaiterTimeout(waiter, at: now + policy.waitTimeout)]

            case .ready(let r):
                if let notBefore = r.notBefore, now < notBefore {
                    if let t = token, t.servableAfterFailure(now) { return [.resumeWaiters([waiter], with: .token(t.published))] }
                    return [.resumeWaiters([waiter], with: .failure(TokenUnavailable(
                        reason: "token.no_progress", retryAfter: notBefore - now)))]
                }
                return [beginFetch(token == nil ? .start : .hard, attempt: 1, round: 1, waiters: [waiter]),
                        .scheduleWaiterTimeout(waiter, at: now + policy.waitTimeout)]

            case .backingOff(var b):
                if let t = token, t.servableAfterFailure(now) { return [.resumeWaiters([waiter], with: .token(t.published))] }
                // docs/architecture.md §6: wait for the next attempt when it starts within the wait bound.
                if b.at - now <= policy.waitTimeout {
                    b.waiters.append(waiter)
                    phase = .backingOff(b)
                    return [.scheduleWaiterTimeout(waiter, at: now + policy.waitTimeout)]
                }
                return [.resumeWaiters([waiter], with: .failure(TokenUnavailable(
                    reason: "token.unavailable", retryAfter: b.at - now, lastFailure: b.lastFailure)))]

            case .negativeCached(let n):
                if now >= n.until {
                    return [beginFetch(token == nil ? .start : .hard, attempt: 1, round: 1, waiters: [waiter]),
                            .scheduleWaiterTimeout(waiter, at: now + policy.waitTimeout)]
                }
                if let t = token, t.servableAfterFailure(now) { return [.resumeWaiters([waiter], with: .token(t.published))] }
                return [.resumeWaiters([waiter], with: .failure(TokenUnavailable(
                    reason: "token.negative_cached", retryAfter: n.until - now, lastFailure: n.failure)))]

            case .needsReauthentication(let failure):
                if let t = token, t.servableAfterFailure(now) { return [.resumeWaiters([waiter], with: .token(t.published))] }
                return [.resumeWaiters([waiter], with: .failure(TokenUnavailable(
                    reason: "token.needs_reauthentication", retryAfter: policy.reauthenticationRetryAfter,
                    lastFailure: failure)))]
            }
        }

        /// A waiter's bound ran out. Ignored if it was already resumed.
        public mutating func waiterTimedOut(waiter: WaiterID, now: MonotonicInstant) -> [Action] {
            let retryAfter: Duration
            let lastFailure: TokenEndpointFailure?
            switch phase {
            case .fetching(var f):
                guard let i = f.waiters.firstIndex(of: waiter) else { return [] }
                f.waiters.remove(at: i)
                phase = .fetching(f)
                retryAfter = policy.waitTimeoutRetryAfter
                lastFailure = nil
            case .backingOff(var b):
                guard let i = b.waiters.firstIndex(of: waiter) else { return [] }
                b.waiters.remove(at: i)
                phase = .backingOff(b)
                retryAfter = b.at - now
                lastFailure = b.lastFailure
            case .pacingForcedRefresh(var p):
                guard let i = p.waiters.firstIndex(of: waiter) else { return [] }
                p.waiters.remove(at: i)
                phase = .pacingForcedRefresh(p)
                retryAfter = p.at - now
                lastFailure = nil
            default:
                return []
            }
            if policy.serveValidTokenOnWaitTimeout, let t = token, t.servableAfterFailure(now) {
                return [.resumeWaiters([waiter], with: .token(t.published))]
            }
            return [.resumeWaiters([waiter], with: .failure(TokenUnavailable(
                reason: "token.wait_timeout", retryAfter: retryAfter, lastFailure: lastFailure)))]
        }

        /// The in-flight request returned a token. `sentAt` is when it was sent.
        public mutating func fetchSucceeded(_ grant: TokenGrant, sentAt: MonotonicInstant, now: MonotonicInstant) -> [Action] {
            guard case .fetching(let f) = phase else { return [] }
            // Clamped again (a grant may be built by hand): keeps every instant below far from overflow.
            let lifetime = min(max(grant.lifetime, .nanoseconds(1)), TokenGrant.maximumLifetime)
            let expiresAt = sentAt + lifetime
            let hardMargin = policy.hardMargin(lifetime: lifetime)
            let factor = Double.random(in: policy.softMarginFactor, using: &random)
            let refreshIn = grant.refreshIn.map { min($0, TokenGrant.maximumLifetime) }
            let softMargin = max(policy.softMargin(lifetime: lifetime, refreshIn: refreshIn).scaled(by: factor), hardMargin)
            let hardAt = expiresAt - hardMargin
            var refreshAt = max(expiresAt - softMargin, now + policy.minimumRefreshDelay)
            var notBefore: MonotonicInstant? = nil

            let generation: UInt64
            var proven = false
            var requestedAt = sentAt
            if let old = token {
                // docs/architecture.md §6.6: only the *same* access token is no
                // progress. A different token is progress even when it expires sooner: servers
                // shorten lifetimes, and holding those refreshes back starved clients with 503s.
                let sameToken = old.accessToken == grant.accessToken
                if sameToken {
                    let guardUntil = max(now + policy.noProgressDelay, hardAt)
                    notBefore = guardUntil
                    refreshAt = max(refreshAt, guardUntil)
                }
                generation = sameToken ? old.generation : lastGeneration + 1
                proven = sameToken && old.proven
                // The same token was first issued earlier: whatever killed it since still applies.
                if sameToken { requestedAt = min(old.requestedAt, sentAt) }
            } else {
                generation = lastGeneration + 1
            }
            lastGeneration = max(lastGeneration, generation)
            token = Token(accessToken: grant.accessToken, generation: generation, expiresAt: expiresAt,
                          hardAt: hardAt, requestedAt: requestedAt, rejectedAt: nil, proven: proven)
            phase = .ready(Ready(refreshAt: refreshAt, notBefore: notBefore))
            let published = token!.published  // Just assigned above.
            var actions: [Action] = [.publish(published)]
            if !f.waiters.isEmpty { actions.append(.resumeWaiters(f.waiters, with: .token(published))) }
            actions.append(.scheduleRefresh(at: refreshAt))
            return actions
        }

        /// The in-flight request failed. `requestSent`: the request may have reached the
        /// server (a transport failure after sending is ambiguous for a rotating refresh token).
        public mutating func fetchFailed(_ failure: TokenEndpointFailure, requestSent: Bool, now: MonotonicInstant) -> [Action] {
            guard case .fetching(var f) = phase else { return [] }

            // The one immediate same-token retry (docs/architecture.md §6.7).
            if policy.grant == .refreshToken, failure.isTransport, requestSent, !f.sameTokenRetryUsed {
                f.sameTokenRetryUsed = true
                phase = .fetching(f)
                return [.startFetch(FetchRequest(reason: f.reason, attempt: f.attempt, round: f.round,
                                                 isSameTokenRetry: true, timeout: policy.fetchTimeout))]
            }
            // A credential failure of a request made with replaced credentials: try the new ones.
            if f.credentialsChanged, failure.classification != .retryable {
                return [beginFetch(.start, attempt: 1, round: 1, waiters: f.waiters)]
            }

            switch failure.classification {
            case .invalidGrant where policy.grant == .refreshToken:
                phase = .needsReauthentication(failure)
                var actions: [Action] = [.cancelTimer, .reportNeedsReauthentication(failure)]
                actions += resumeWithOldTokenOrFail(f.waiters, now: now, failure: TokenUnavailable(
                    reason: "token.needs_reauthentication", retryAfter: policy.reauthenticationRetryAfter,
                    lastFailure: failure))
                return actions

            case .permanent, .invalidGrant:
                let until = now + policy.negativeCacheDuration
                phase = .negativeCached(NegativeCached(until: until, failure: failure))
                var actions: [Action] = [.cancelTimer, .reportNegativeCached(failure, until: until)]
                actions += resumeWithOldTokenOrFail(f.waiters, now: now, failure: TokenUnavailable(
                    reason: "token.negative_cached", retryAfter: policy.negativeCacheDuration, lastFailure: failure))
                return actions

            case .retryable:
                var delay: Duration
                var next = (attempt: f.attempt + 1, round: f.round)
                let inRound = f.attempt < policy.attemptsPerRound
                if inRound {
                    let base = policy.attemptDelays.isEmpty ? .seconds(1)
                        : policy.attemptDelays[min(f.attempt - 1, policy.attemptDelays.count - 1)]
                    delay = jittered(base, policy.attemptJitter)
                } else {
                    delay = jittered(roundBackoff(afterRound: f.round), policy.roundBackoffJitter)
                    next = (1, f.round + 1)
                }
                if let requested = failure.retryAfter { delay = max(delay, min(requested, policy.retryAfterCap)) }
                let at = now + delay
                var b = BackingOff(reason: f.reason, nextAttempt: next.attempt, round: next.round, at: at,
                                   lastFailure: failure, waiters: [])
                var actions: [Action] = []
                if let t = token, t.servableAfterFailure(now) {
                    // The old token is still good: serve it rather than keep anyone waiting.
                    if !f.waiters.isEmpty { actions.append(.resumeWaiters(f.waiters, with: .token(t.published))) }
                } else if delay <= policy.waitTimeout {
                    // docs/architecture.md §6: the next attempt starts within the wait bound (in this round or
                    // the next): wait for it; each waiter's own timeout still bounds its wait.
                    b.waiters = f.waiters
                } else if !f.waiters.isEmpty {
                    actions.append(.resumeWaiters(f.waiters, with: .failure(TokenUnavailable(
                        reason: "token.unavailable", retryAfter: delay, lastFailure: failure))))
                }
                phase = .backingOff(b)
                actions.append(.scheduleRetry(at: at))
                return actions
            }
        }

        /// The background refresh timer fired.
        public mutating func refreshTimerFired(now: MonotonicInstant) -> [Action] {
            guard case .ready(let r) = phase, now >= r.refreshAt else { return [] }
            let reason: FetchRequest.Reason = (token.map { now >= $0.hardAt } ?? true) ? .hard : .soft
            return [beginFetch(reason, attempt: 1, round: 1, waiters: [])]
        }

        /// The retry timer fired.
        public mutating func retryTimerFired(now: MonotonicInstant) -> [Action] {
            switch phase {
            case .backingOff(let b) where now >= b.at:
                return [beginFetch(b.reason, attempt: b.nextAttempt, round: b.round, waiters: b.waiters)]
            case .pacingForcedRefresh(let p) where now >= p.at:
                lastForcedRefreshAt = now
                return [beginFetch(.rejected, attempt: 1, round: 1, waiters: p.waiters)]
            default:
                return []
            }
        }

        /// An upstream answered a request that carried `generation` with a status that is not a
        /// rejection (docs/architecture.md §6.9): that token is proven, and a rejection of it counted
        /// by the breaker before this report arrived is forgiven. The driver reports only the
        /// first such answer per generation.
        public mutating func upstreamAccepted(generation: UInt64, now: MonotonicInstant) -> [Action] {
            breaker.forgive(generation: generation)
            guard var t = token, t.generation == generation, !t.proven else { return [] }
            t.proven = true
            token = t
            return []
        }

        /// An upstream rejected a request that carried `generation` (the replay decision was
        /// `.refreshThenReplay` or `.refreshOnlyPassThrough`). With a `waiter`, it is resumed
        /// with the token to replay with, `.passThrough` (relay the rejection: the breaker is
        /// open), or a failure (no newer token within the wait bound: the client gets the 503 of
        /// docs/architecture.md §5, never the upstream's rejection).
        ///
        /// Compare-and-swap: only the current generation is marked rejected; an older one gets
        /// the current token at once (or, if that one was rejected too, waits for its refresh;
        /// past its hard point or expired, waits like `tokenRequested`).
        /// A proven token's rejection always gets its forced refresh (paced: one per
        /// `forcedRefreshInterval`); a never-proven one's is subject to the breaker. Joining
        /// a fetch in flight is always allowed. The no-progress guard applies to both.
        public mutating func upstreamRejected(generation: UInt64, waiter: WaiterID?, now: MonotonicInstant) -> [Action] {
            func fail(_ reason: String, _ retryAfter: Duration, _ last: TokenEndpointFailure? = nil) -> [Action] {
                guard let waiter else { return [] }
                return [.resumeWaiters([waiter], with: .failure(TokenUnavailable(reason: reason, retryAfter: retryAfter, lastFailure: last)))]
            }
            guard var t = token, generation <= t.generation else {
                return fail("token.refresh_not_possible", policy.waitTimeoutRetryAfter)
            }
            if generation < t.generation, t.rejectedAt == nil {
                // An older token: the current one replays at once, no refresh, while it may be
                // used without waiting. Past its hard point (an outage kept it in service) or
                // expired, the replay waits like any request that needs a token: an expired
                // current token would be rejected in its turn.
                guard let waiter else { return [] }
                if t.usableWithoutWaiting(now) { return [.resumeWaiters([waiter], with: .token(t.published))] }
                return tokenRequested(waiter: waiter, now: now)
            }
            // The current token was rejected (by this request, or earlier by another one).
            var actions: [Action] = []
            let timeout: [Action] = waiter.map { [.scheduleWaiterTimeout($0, at: now + policy.waitTimeout)] } ?? []
            let joining = waiter.map { [$0] } ?? []
            if t.rejectedAt == nil, !isReadyWithinNoProgressGuard(now), !markingWaitsForBreaker(t) {
                t.rejectedAt = now
                token = t
                actions.append(.publish(t.published))
            }
            switch phase {
            case .fetching(var f):
                f.waiters += joining
                phase = .fetching(f)
                return actions + timeout

            case .pacingForcedRefresh(var p):
                p.waiters += joining
                phase = .pacingForcedRefresh(p)
                return actions + timeout

            case .backingOff(var b):
                // Wait for the next attempt when it starts within the wait bound (docs/architecture.md §6).
                guard b.at - now <= policy.waitTimeout else {
                    return actions + fail("token.unavailable", b.at - now, b.lastFailure)
                }
                b.waiters += joining
                phase = .backingOff(b)
                return actions + timeout

            case .ready(let r):
                if let notBefore = r.notBefore, now < notBefore {
                    return fail("token.no_progress", notBefore - now)
                }
                if !t.proven {
                    switch breaker.admitForcedRefresh(at: now, generation: t.generation) {
                    case .open(let until):
                        return passThrough(waiter, "token.breaker_open", until - now)
                    case .tripped(let until):
                        return [.reportBreakerTripped(until: until)] + passThrough(waiter, "token.breaker_open", until - now)
                    case .allowed:
                        break
                    }
                    // Marked only now: a rejection the breaker refuses leaves the token in service.
                    if t.rejectedAt == nil {
                        t.rejectedAt = now
                        token = t
                        actions.append(.publish(t.published))
                    }
                }
                return actions + forceRefresh(waiters: joining, now: now) + timeout

            case .negativeCached(let n):
                if now >= n.until { return actions + forceRefresh(waiters: joining, now: now) + timeout }
                return actions + fail("token.negative_cached", n.until - now, n.failure)
            case .needsReauthentication(let failure):
                return actions + fail("token.needs_reauthentication", policy.reauthenticationRetryAfter, failure)
            case .idle:
                return actions + fail("token.refresh_not_possible", policy.waitTimeoutRetryAfter)
            }
        }

        private func passThrough(_ waiter: WaiterID?, _ reason: String, _ retryAfter: Duration) -> [Action] {
            guard let waiter else { return [] }
            return [.resumeWaiters([waiter], with: .passThrough(TokenUnavailable(reason: reason, retryAfter: retryAfter)))]
        }

        /// `.ready` with the no-progress guard holding: a rejection changes nothing.
        private func isReadyWithinNoProgressGuard(_ now: MonotonicInstant) -> Bool {
            if case .ready(let r) = phase, let notBefore = r.notBefore, now < notBefore { return true }
            return false
        }

        /// `.ready` with a never-proven token: the breaker decides (in `upstreamRejected`)
        /// whether the rejection is about our token at all; the token is marked only then.
        private func markingWaitsForBreaker(_ t: Token) -> Bool {
            if case .ready = phase, !t.proven { return true }
            return false
        }

        /// Starts the forced refresh now, or at `lastForcedRefreshAt + forcedRefreshInterval`
        /// (docs/architecture.md §6: at most one per second per session; later rejections wait for it).
        private mutating func forceRefresh(waiters: [WaiterID], now: MonotonicInstant) -> [Action] {
            if let last = lastForcedRefreshAt, now < last + policy.forcedRefreshInterval {
                let at = last + policy.forcedRefreshInterval
                phase = .pacingForcedRefresh(Pacing(at: at, waiters: waiters))
                return [.scheduleRetry(at: at)]
            }
            lastForcedRefreshAt = now
            return [beginFetch(.rejected, attempt: 1, round: 1, waiters: waiters)]
        }

        /// The configuration or the credentials (client secret, password, refresh token file)
        /// were reloaded (SIGHUP, or a newer operator file). Lifts `needsReauthentication`,
        /// the negative cache and any backoff, resets the breaker, and fetches at once.
        /// `reissue`: what the token was issued for changed (token URL, client, scope, params):
        /// a ready session fetches a new token at once (the current one serves meanwhile);
        /// otherwise (a rotated secret) a valid token is kept until its normal refresh.
        public mutating func credentialsChanged(now: MonotonicInstant, reissue: Bool = false) -> [Action] {
            breaker.reset()
            switch phase {
            case .fetching(var f):
                f.credentialsChanged = true
                phase = .fetching(f)
                return []
            case .ready:
                return reissue ? [.cancelTimer, beginFetch(.start, attempt: 1, round: 1, waiters: [])] : []
            case .idle, .negativeCached, .needsReauthentication:
                return [.cancelTimer, beginFetch(.start, attempt: 1, round: 1, waiters: [])]
            case .backingOff(let b):
                return [.cancelTimer, beginFetch(.start, attempt: 1, round: 1, waiters: b.waiters)]
            case .pacingForcedRefresh(let p):
                return [.cancelTimer, beginFetch(.start, attempt: 1, round: 1, waiters: p.waiters)]
            }
        }

        // MARK: Helpers

        private mutating func beginFetch(_ reason: FetchRequest.Reason, attempt: Int, round: Int, waiters: [WaiterID]) -> Action {
            phase = .fetching(Fetching(reason: reason, attempt: attempt, round: round, sameTokenRetryUsed: false,
                                       credentialsChanged: false, waiters: waiters))
            return .startFetch(FetchRequest(reason: reason, attempt: attempt, round: round, isSameTokenRetry: false,
                                            timeout: policy.fetchTimeout))
        }

        private func resumeWithOldTokenOrFail(_ waiters: [WaiterID], now: MonotonicInstant, failure: TokenUnavailable) -> [Action] {
            guard !waiters.isEmpty else { return [] }
            if let t = token, t.servableAfterFailure(now) { return [.resumeWaiters(waiters, with: .token(t.published))] }
            return [.resumeWaiters(waiters, with: .failure(failure))]
        }

        /// `base × 2^(round−1)`, capped.
        private func roundBackoff(afterRound round: Int) -> Duration {
            var d = policy.roundBackoffBase
            var r = 1
            while r < round && d < policy.roundBackoffCap { d = d * 2; r += 1 }
            return min(d, policy.roundBackoffCap)
        }

        private mutating func jittered(_ base: Duration, _ jitter: Double) -> Duration {
            guard jitter > 0 else { return base }
            return base.scaled(by: Double.random(in: (1 - jitter)...(1 + jitter), using: &random))
        }
    }
}
