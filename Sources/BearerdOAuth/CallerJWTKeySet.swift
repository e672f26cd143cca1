/// The caller IdP's keys of one `caller_jwt` with `jwks_url`, and when to fetch them again
/// (docs/architecture.md §6.16): keys by `kid`; a token whose `kid` (or,
/// without `kid`, whose algorithm) matches no key asks for a re-fetch at most once per
/// `minimumRefetchInterval` (30 s); a failed fetch keeps the keys there were; the keys are also
/// refreshed every `refreshInterval` (1 h) so a key the IdP withdrew stops verifying.
///
/// Owns the current `JWKSet` and the fetch bookkeeping. Pure: the monotonic clock is an
/// argument; the driver (on the queue that owns this value) runs the fetch the value asks for
/// and reports its end with `fetchSucceeded` / `fetchFailed`. Invariants: at most one fetch in
/// flight; a fetch starts only when none did within `minimumRefetchInterval`.
public struct CallerJWTKeySet: Sendable {
    /// 30 s: an attacker minting tokens with random `kid`s costs the IdP at most one fetch per
    /// 30 s per key set.
    public static let minimumRefetchInterval: Duration = .seconds(30)

    public var refreshInterval: Duration

    /// The keys in use (empty before the first successful fetch).
    public private(set) var keys: JWKSet
    /// When the keys in use were fetched; nil before the first success.
    public private(set) var loadedAt: MonotonicInstant?
    /// Consecutive failed fetches since the last success (for logs and readiness).
    public private(set) var consecutiveFailures: Int = 0

    private enum Fetch: Sendable, Equatable {
        case idle(lastStarted: MonotonicInstant?)
        case inFlight(started: MonotonicInstant)
    }
    private var fetch: Fetch = .idle(lastStarted: nil)

    public init(refreshInterval: Duration = .seconds(3600)) {
        self.refreshInterval = max(refreshInterval, Self.minimumRefetchInterval)
        self.keys = JWKSet()
    }

    /// What to do with a token whose key is not in the set.
    public enum FetchAdvice: Sendable, Equatable {
        /// Fetch the key set now (recorded as started: the driver must report its end), then
        /// select again once.
        case fetchNow
        /// A fetch is under way: wait for it, then select again once.
        case waitForFetch
        /// No fetch allowed before `until`: answer with the failure (`unknownKey`, or 503 while
        /// `hasKeys` is false: the caller is not at fault for keys bearerd never obtained).
        case refuse(until: MonotonicInstant)
    }

    public enum Selection: Sendable {
        /// Check the signature with these (never empty).
        case keys([JWKSet.Key])
        case unknown(FetchAdvice)
    }

    public var hasKeys: Bool { loadedAt != nil }
    public var isFetching: Bool { if case .inFlight = fetch { return true } else { return false } }

    /// The keys for a token's `kid` and `alg` at `now`. A miss asks for a fetch if the rule
    /// allows one (and then records it as started).
    public mutating func select(keyID: String?, algorithm: CallerJWT.Algorithm, now: MonotonicInstant) -> Selection {
        if let keyID, keys.contains(keyID: keyID) {
            let found = keys.candidates(keyID: keyID, algorithm: algorithm)
            // The kid is known but bound to another algorithm or key type: that is not a
            // rotation, so no fetch.
            return found.isEmpty ? .unknown(.refuse(until: now)) : .keys(found)
        }
        let found = keys.candidates(keyID: keyID, algorithm: algorithm)
        if !found.isEmpty { return .keys(found) }
        return .unknown(adviseFetch(now: now))
    }

    /// What to do with a caller's token.
    public enum Verdict: Sendable, Equatable {
        case valid(CallerJWT.Validated)
        /// 401 with `failure.description` as `error_description`; no exchange.
        case invalid(CallerJWT.Failure)
        /// Fetch the key set (started: report its end), then call `validate` again once.
        case fetchKeysAndRetry
        /// A fetch is under way: when it ends, call `validate` again once.
        case waitForKeysAndRetry
        /// No key was ever obtained and no fetch may start yet: 503 (bearerd's problem, not the
        /// caller's).
        case keysUnavailable
    }

    /// Parse, key selection (with the re-fetch rule) and verification in one step. On a retry
    /// after a fetch the rule no longer allows another, so the answer is final.
    public mutating func validate(_ token: String, policy: CallerJWT.Policy, now: MonotonicInstant,
                                  wallClockNow: Int64) -> Verdict {
        let jws: CallerJWT.Parsed
        do { jws = try CallerJWT.parse(token) } catch { return .invalid(error) }
        switch select(keyID: jws.keyID, algorithm: jws.algorithm, now: now) {
        case .keys(let candidates):
            do { return .valid(try CallerJWT.verify(jws, candidates: candidates, policy: policy, wallClockNow: wallClockNow)) } catch {
                return .invalid(error)
            }
        case .unknown(.fetchNow): return .fetchKeysAndRetry
        case .unknown(.waitForFetch): return .waitForKeysAndRetry
        case .unknown(.refuse): return hasKeys ? .invalid(.unknownKey) : .keysUnavailable
        }
    }

    /// Whether to start a fetch at `now` without a token asking (at start-up and every
    /// `refreshInterval`); records the start when true.
    public mutating func startScheduledFetch(now: MonotonicInstant) -> Bool {
        if let loadedAt, now - loadedAt < refreshInterval { return false }
        return adviseFetch(now: now) == .fetchNow
    }

    /// A fetch ended with a key set: it replaces the keys.
    public mutating func fetchSucceeded(_ set: JWKSet, now: MonotonicInstant) {
        keys = set
        loadedAt = now
        consecutiveFailures = 0
        endFetch(now: now)
    }

    /// A fetch failed (network, status, `JWKSet.Problem`): the old keys stay.
    public mutating func fetchFailed(now: MonotonicInstant) {
        consecutiveFailures = consecutiveFailures == .max ? .max : consecutiveFailures + 1
        endFetch(now: now)
    }

    private mutating func endFetch(now: MonotonicInstant) {
        switch fetch {
        case .inFlight(let started): fetch = .idle(lastStarted: started)
        case .idle: fetch = .idle(lastStarted: now)  // an unrequested report: count it as a fetch now
        }
    }

    private mutating func adviseFetch(now: MonotonicInstant) -> FetchAdvice {
        switch fetch {
        case .inFlight:
            return .waitForFetch
        case .idle(let last?) where now - last < Self.minimumRefetchInterval:
            return .refuse(until: last + Self.minimumRefetchInterval)
        case .idle:
            fetch = .inFlight(started: now)
            return .fetchNow
        }
    }
}
