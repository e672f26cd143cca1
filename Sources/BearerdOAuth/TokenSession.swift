/// Namespace of the token session: its state machine, policy and the values it exchanges
/// with the driver (docs/architecture.md §6). The driver (BearerdProxy) runs one `StateMachine` per
/// session on the session's serial queue and carries out its actions.
public enum TokenSession {}

/// A reading of the monotonic clock, in nanoseconds from an arbitrary origin. Supplied by the
/// driver (`DispatchTime.now().uptimeNanoseconds`); the cores never read a clock.
public struct MonotonicInstant: Sendable, Hashable, Comparable, CustomStringConvertible {
    public var nanoseconds: UInt64

    public init(nanoseconds: UInt64) { self.nanoseconds = nanoseconds }

    /// `s` seconds after the origin, saturating: negative or NaN is the origin, beyond
    /// `UInt64.max` nanoseconds is `UInt64.max`.
    public static func seconds(_ s: Double) -> MonotonicInstant {
        let ns = (s * 1e9).rounded(.towardZero)
        guard ns > 0 else { return MonotonicInstant(nanoseconds: 0) }  // Also NaN.
        if ns >= 0x1p64 { return MonotonicInstant(nanoseconds: .max) }
        return MonotonicInstant(nanoseconds: UInt64(ns))  // 0 < ns < 2^64: cannot trap.
    }

    public static func < (a: MonotonicInstant, b: MonotonicInstant) -> Bool { a.nanoseconds < b.nanoseconds }

    /// Saturating at zero and at `UInt64.max`.
    public static func + (a: MonotonicInstant, d: Duration) -> MonotonicInstant {
        let n = d.nanosecondsClamped
        if n >= 0 {
            let (sum, overflow) = a.nanoseconds.addingReportingOverflow(UInt64(n))
            return MonotonicInstant(nanoseconds: overflow ? .max : sum)
        }
        let m = n.magnitude
        return MonotonicInstant(nanoseconds: a.nanoseconds >= m ? a.nanoseconds - m : 0)
    }

    public static func - (a: MonotonicInstant, d: Duration) -> MonotonicInstant { a + (.zero - d) }

    /// `a - b` as a (possibly negative) duration.
    public static func - (a: MonotonicInstant, b: MonotonicInstant) -> Duration {
        a >= b ? .nanoseconds(Int64(clamping: a.nanoseconds - b.nanoseconds))
               : .zero - .nanoseconds(Int64(clamping: b.nanoseconds - a.nanoseconds))
    }

    public var description: String { "t+\(Double(nanoseconds) / 1e9)s" }
}

extension Duration {
    /// Whole nanoseconds, clamped to `Int64`.
    public var nanosecondsClamped: Int64 {
        let (s, atto) = components
        let (ns, overflow) = s.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return s < 0 ? .min : .max }
        let (sum, o2) = ns.addingReportingOverflow(atto / 1_000_000_000)
        return o2 ? (s < 0 ? .min : .max) : sum
    }

    /// Seconds as a `Double` (for logs and `Retry-After`).
    public var secondsDouble: Double { Double(nanosecondsClamped) / 1e9 }

    /// `self × factor`, rounded to a nanosecond, saturating at the `Int64` nanosecond bounds
    /// (`Double(Int64.max)` is 2^63, which `Int64(_:)` would trap on); a NaN factor gives zero.
    func scaled(by factor: Double) -> Duration {
        let product = (Double(nanosecondsClamped) * factor).rounded()
        if product.isNaN { return .zero }
        if product >= 0x1p63 { return .nanoseconds(Int64.max) }
        if product <= -0x1p63 { return .nanoseconds(Int64.min) }
        return .nanoseconds(Int64(product))  // |product| < 2^63: cannot trap.
    }
}

extension TokenSession {
    /// Identifies one caller waiting for a token (a request on some loop). Chosen by the
    /// driver, unique among the waiters of one session.
    public struct WaiterID: Sendable, Hashable, Comparable, CustomStringConvertible {
        public let rawValue: UInt64
        public init(_ rawValue: UInt64) { self.rawValue = rawValue }
        public static func < (a: WaiterID, b: WaiterID) -> Bool { a.rawValue < b.rawValue }
        public var description: String { "waiter#\(rawValue)" }
    }

    /// What the session publishes for the loops' fast path: a loop may use `accessToken`
    /// without asking the session while `now < usableWithoutWaitingUntil`.
    ///
    /// Invariants: `usableWithoutWaitingUntil ≤ expiresAt`; `generation ≥ 1`, and a new
    /// access token always has a larger generation than every earlier one.
    public struct CurrentToken: Sendable, Equatable, CustomStringConvertible {
        public let accessToken: OAuthSecret
        /// +1 per new access token. A 401 refreshes only if it was against the current one.
        public let generation: UInt64
        /// True expiry on the monotonic clock (request sent + `L`).
        public let expiresAt: MonotonicInstant
        /// Start of the hard window, or the moment the token was rejected upstream.
        public let usableWithoutWaitingUntil: MonotonicInstant
        /// When the token request that returned this token was sent (the origin when unknown).
        public let requestedAt: MonotonicInstant

        public init(accessToken: OAuthSecret, generation: UInt64, expiresAt: MonotonicInstant,
                    usableWithoutWaitingUntil: MonotonicInstant, requestedAt: MonotonicInstant = MonotonicInstant(nanoseconds: 0)) {
            self.accessToken = accessToken
            self.generation = generation
            self.expiresAt = expiresAt
            self.usableWithoutWaitingUntil = usableWithoutWaitingUntil
            self.requestedAt = requestedAt
        }

        public func isUsableWithoutWaiting(at now: MonotonicInstant) -> Bool { now < usableWithoutWaitingUntil }
        public func isExpired(at now: MonotonicInstant) -> Bool { now >= expiresAt }

        /// Whether this token was requested at or after `instant` — for a replay, the moment the
        /// session learned of the rejection (docs/architecture.md §6.8). Whatever made
        /// the upstream reject (a revocation, a key rotation at the IdP) happened before that
        /// moment, so it cannot have killed such a token. A token requested earlier (the current
        /// one handed to a request that carried an older generation, or one from a fetch that was
        /// already in flight) may have been killed by the same event: its replay is provisional.
        public func wasRequested(atOrAfter instant: MonotonicInstant) -> Bool { requestedAt >= instant }

        public var description: String {
            "CurrentToken(fingerprint: \(accessToken.fingerprint), generation: \(generation), expiresAt: \(expiresAt))"
        }
    }

    /// Why no token can be handed out: what the 503 of docs/architecture.md §5 is built from.
    public struct TokenUnavailable: Error, Sendable, Equatable, CustomStringConvertible {
        /// Stable dotted reason: `token.unavailable` (fetch failed, the next attempt is not
        /// within the wait bound), `token.negative_cached`, `token.needs_reauthentication`,
        /// `token.wait_timeout`, `token.no_progress`, `token.breaker_open` (with `.passThrough`),
        /// `token.refresh_not_possible`.
        public let reason: String
        /// Time until the next attempt to get a token: the 503's `Retry-After`.
        public let retryAfter: Duration
        /// The token endpoint's last answer, if one caused this.
        public let lastFailure: TokenEndpointFailure?

        public init(reason: String, retryAfter: Duration, lastFailure: TokenEndpointFailure? = nil) {
            self.reason = reason
            self.retryAfter = retryAfter < .zero ? .zero : retryAfter
            self.lastFailure = lastFailure
        }

        /// Whole seconds for the `Retry-After` header: rounded up, at least 1.
        public var retryAfterSeconds: Int {
            let ns = retryAfter.nanosecondsClamped  // ≥ 0 (init), so no rounding toward zero below.
            let (whole, part) = ns.quotientAndRemainder(dividingBy: 1_000_000_000)
            return max(1, Int(whole) + (part > 0 ? 1 : 0))  // whole ≤ Int64.max / 10^9: no overflow.
        }

        /// For the 503 body's `detail`: the server's `error: error_description` when it sent one.
        public var detail: String { lastFailure.map { "\(reason): \($0.detail)" } ?? reason }

        public var description: String { "TokenUnavailable(\(detail), retryAfter: \(retryAfterSeconds)s)" }
    }

    /// How a waiter is resumed.
    public enum WaiterResult: Sendable, Equatable {
        case token(CurrentToken)
        /// No token within the wait bound: the client gets the 503 of docs/architecture.md §5 (for a held
        /// rejection too: never the upstream's rejection).
        case failure(TokenUnavailable)
        /// Only for a rejection: relay the upstream's answer, the rejection is not about our
        /// token (the breaker is open, docs/architecture.md §6.9).
        case passThrough(TokenUnavailable)
    }

    /// One token request the driver must send.
    public struct FetchRequest: Sendable, Equatable {
        /// What triggered the request (for logs and metrics).
        public enum Reason: String, Sendable, Equatable {
            /// No token yet (startup, after a failure without a token, after a credentials change).
            case start
            /// Background refresh at the soft margin; callers keep the current token.
            case soft
            /// Hard window or expired token: callers wait for this request.
            case hard
            /// An upstream rejected the current generation (docs/architecture.md §6.8).
            case rejected
        }

        public let reason: Reason
        /// 1-based attempt within the round (at most `Policy.attemptsPerRound`).
        public let attempt: Int
        /// 1-based retry round.
        public let round: Int
        /// The one immediate retry of a refresh_token request whose transport failed after it
        /// was sent (same refresh token, docs/architecture.md §6.7).
        public let isSameTokenRetry: Bool
        /// The shared request's own timeout (never a client's), 15 s by default.
        public let timeout: Duration
    }

    /// Coarse state, for `/readyz`, `bearerd token` and logs.
    public enum Status: Sendable, Equatable {
        case idle
        case fetching
        case ready
        case backingOff(until: MonotonicInstant)
        case negativeCached(until: MonotonicInstant)
        case needsReauthentication
    }

    /// The grant a session uses; only `refreshToken` has a dead-refresh-token state.
    public enum GrantKind: String, Sendable, Equatable {
        case clientCredentials = "client_credentials"
        case refreshToken = "refresh_token"
        case password
    }

    /// The numbers of docs/architecture.md §6. Every field is a documented default; `refreshBefore`,
    /// `defaultLifetime` (in `TokenResponseParser`) and the reject statuses are per-session config.
    public struct Policy: Sendable, Equatable {
        public var grant: GrantKind
        /// `refresh_before` (config): soft margin when the server sends no `refresh_in`.
        public var refreshBefore: Duration?
        /// `L ≥ this` → soft margin `L/2`; below it `min(softMarginCap, L/2)`. 2 h.
        public var longLifetimeThreshold: Duration = .seconds(7200)
        /// 300 s.
        public var softMarginCap: Duration = .seconds(300)
        /// The soft margin is multiplied by a factor drawn from this range. [0.9, 1.0].
        public var softMarginFactor: ClosedRange<Double> = 0.9...1.0
        /// Hard margin `min(hardMarginCap, L/4)`. 60 s.
        public var hardMarginCap: Duration = .seconds(60)
        /// How long a caller waits for the in-flight fetch. 10 s.
        public var waitTimeout: Duration = .seconds(10)
        /// A waiter that times out while the token has not truly expired gets that token
        /// rather than a failure. Default true.
        public var serveValidTokenOnWaitTimeout: Bool = true
        /// The shared token request's own timeout. 15 s.
        public var fetchTimeout: Duration = .seconds(15)
        /// Attempts per round. 3.
        public var attemptsPerRound: Int = 3
        /// Delay before attempt n+1 of a round: 1 s, 2 s (the last entry repeats).
        public var attemptDelays: [Duration] = [.seconds(1), .seconds(2)]
        /// ±10 %.
        public var attemptJitter: Double = 0.10
        /// Between rounds: `base × 2^(round−1)`, capped, ±jitter. 1 s, 30 s, ±20 %.
        public var roundBackoffBase: Duration = .seconds(1)
        public var roundBackoffCap: Duration = .seconds(30)
        public var roundBackoffJitter: Double = 0.20
        /// `Retry-After` is obeyed up to this. 1 h.
        public var retryAfterCap: Duration = .seconds(3600)
        /// Permanent errors fail requests fast for this long. 60 s.
        public var negativeCacheDuration: Duration = .seconds(60)
        /// No-progress guard: no new refresh before `max(now + this, hard point)`. 30 s.
        public var noProgressDelay: Duration = .seconds(30)
        /// Earliest background refresh after a new token, whatever the margins say. 1 s.
        public var minimumRefreshDelay: Duration = .seconds(1)
        /// `Retry-After` told to clients while the session needs a new refresh token. 60 s.
        public var reauthenticationRetryAfter: Duration = .seconds(60)
        /// `Retry-After` after a wait timeout while the fetch is still running. 1 s.
        public var waitTimeoutRetryAfter: Duration = .seconds(1)
        /// Rejection breaker (docs/architecture.md §6.9).
        public var breaker: RejectionBreaker.Configuration = .init()
        /// At most one forced (rejection-triggered) refresh per this interval; later
        /// rejections wait for the next one. 1 s.
        public var forcedRefreshInterval: Duration = .seconds(1)

        public init(grant: GrantKind, refreshBefore: Duration? = nil) {
            self.grant = grant
            self.refreshBefore = refreshBefore
        }

        /// Hard margin `min(60 s, L/4)`.
        public func hardMargin(lifetime: Duration) -> Duration {
            min(hardMarginCap, lifetime / 4)
        }

        /// Soft margin before the random factor: server `refresh_in` (as `L − refresh_in`),
        /// else `refresh_before`, else `L/2` when `L ≥ 2 h`, else `min(300 s, L/2)`.
        public func softMargin(lifetime: Duration, refreshIn: Duration?) -> Duration {
            if let refreshIn { return max(.zero, lifetime - refreshIn) }
            if let refreshBefore { return refreshBefore }
            return lifetime >= longLifetimeThreshold ? lifetime / 2 : min(softMarginCap, lifetime / 2)
        }
    }
}
