import BearerdOAuth
import BearerdConfig

/// Counters of one token session, for `/metrics` (one counter per outcome, failures
/// classified). Monotonic since the session was created. A value snapshot: read it with
/// `TokenSessionDriver.metrics` or `TokenSessionDriver.snapshot`.
public struct SessionMetrics: Sendable, Equatable {
    /// Token requests sent to the token endpoint (attempts, retries included).
    public var tokenRequests: UInt64 = 0
    /// Requests that returned a usable token.
    public var tokensObtained: UInt64 = 0
    /// Tokens taken from the state file instead of the server (another process rotated, or a restart).
    public var tokensAdopted: UInt64 = 0
    /// Failed requests by class: transport, 408, 429, 5xx, `temporarily_unavailable`, `server_error`.
    public var failuresRetryable: UInt64 = 0
    /// `invalid_client`, `unauthorized_client`, `invalid_scope`, `unsupported_grant_type`, other 4xx, bad responses.
    public var failuresPermanent: UInt64 = 0
    /// `invalid_grant` (a dead refresh token or password).
    public var failuresInvalidGrant: UInt64 = 0
    /// Refreshes started because an upstream rejected the current token.
    public var forcedRefreshes: UInt64 = 0
    /// Times the rejection breaker opened.
    public var breakerTrips: UInt64 = 0
    /// Upstream rejections the session answered without a token to replay with, by reason
    /// (`breaker_open`: relayed; `unavailable`, `wait_timeout`, `negative_cached`,
    /// `needs_reauthentication`, `no_progress`, …: the client got a 503). Labels come from the
    /// state machine's fixed reasons.
    public var rejectionsNotReplayed: [String: UInt64] = [:]
    /// Token exchanges (RFC 8693) by outcome: `success`, `failure`, `subject_rejected` (the
    /// server refused the subject session's token: that session was refreshed and the
    /// exchange retried once).
    public var tokenExchanges: [String: UInt64] = [:]
    /// Failed writes of the state file (docs/architecture.md §6.7).
    public var statePersistFailures: UInt64 = 0
    /// Shared cache (docs/architecture.md §6): records adopted at once, fetches this replica made under the
    /// lock, fetches that waited for another replica's lock, and local fetches because Redis failed.
    public var sharedCacheHits: UInt64 = 0
    public var sharedCacheMisses: UInt64 = 0
    public var sharedCacheLockWaits: UInt64 = 0
    public var sharedCacheFallbacks: UInt64 = 0
    /// Shared-cache locks without expiry (or longer than this replica's) replaced instead of
    /// waited for, and records older than the session's lineage refused (rolled back in Redis).
    public var sharedCacheStaleLocks: UInt64 = 0
    public var sharedCacheOlderRecords: UInt64 = 0
    /// Every finished token fetch attempt, by what triggered it, how it ended and why.
    public var refreshes: [TokenRefreshKey: UInt64] = [:]
    /// Callers (requests, or rejected requests waiting to replay) that waited for a shared fetch.
    public var waits: UInt64 = 0
    /// Tokens handed to waiting callers although past their hard point or rejected (but not
    /// expired), indexed by `StaleTokenReason.rawValue`.
    public var staleServes: [UInt64] = Array(repeating: 0, count: StaleTokenReason.allCases.count)

    public init() {}
}

/// The labels of `bearerd_token_refreshes_total`: one finished token fetch attempt.
public struct TokenRefreshKey: Sendable, Hashable {
    /// `TokenSession.FetchRequest.Reason`: `start`, `soft`, `hard`, `rejected`.
    public var reason: String
    /// `success` (from the token endpoint), `adopted` (from the state file), `failure`.
    public var outcome: String
    /// `""` on success; else `errorLabel(for:)`.
    public var error: String

    public init(reason: String, outcome: String, error: String) {
        self.reason = reason
        self.outcome = outcome
        self.error = error
    }

    /// STS error codes (AWS and Alibaba Cloud) that get a label of their own.
    static let stsErrors: Set<String> = [
        "AccessDenied", "InvalidIdentityToken", "ExpiredTokenException", "ExpiredToken", "IDPRejectedClaim",
        "IDPCommunicationError", "InvalidClientTokenId", "SignatureDoesNotMatch", "Throttling", "RequestExpired",
        "InvalidParameterValue", "ValidationError", "RegionDisabledException", "ServiceUnavailable", "InternalFailure",
        "NoPermission", "AuthenticationFail.OIDCToken.Expired", "AuthenticationFail.OIDCToken.Invalid",
        "EntityNotExist.Role", "EntityNotExist.OIDCProvider",
    ]

    /// RFC 6749 §5.2 token endpoint error codes, and the two of §4.1.2.1 that token endpoints also send.
    static let oauthErrors: Set<String> = [
        "invalid_request", "invalid_client", "invalid_grant", "unauthorized_client", "unsupported_grant_type",
        "invalid_scope", "server_error", "temporarily_unavailable",
    ]

    /// The `error` label of a failure, from a bounded vocabulary (a server cannot make up
    /// label values): the RFC 6749 `error` when it is a registered code, `other_oauth_error`
    /// for any other `error`, `transport` when no HTTP response came, `http_4xx` / `http_5xx`
    /// for an error status without an `error` member, else bearerd's own reason without its
    /// `token.` prefix (`malformed_json`, `missing_access_token`, `unsupported_token_type`,
    /// `response_too_large`, `no_refresh_token`, …).
    public static func errorLabel(for f: TokenEndpointFailure) -> String {
        if f.reason.hasPrefix("sts.") {
            // An STS or vending endpoint's own error code (docs/architecture.md §6.15): the known
            // ones by name, any other as `sts_other` (a server cannot make up label values).
            let code = String(f.reason.dropFirst(4))
            return stsErrors.contains(code) ? "sts_" + code : "sts_other"
        }
        if let code = f.oauthError {
            return oauthErrors.contains(code) ? code : "other_oauth_error"
        }
        if f.isTransport { return "transport" }
        if let status = f.status, f.reason == "token.http_\(status)" {
            return "http_\(status / 100)xx"
        }
        return f.reason.hasPrefix("token.") ? String(f.reason.dropFirst(6)) : f.reason
    }
}

/// Why a waiting caller was given a token that is no longer served without waiting.
public enum StaleTokenReason: Int, CaseIterable, Sendable {
    /// The refresh failed (retry pending, negative-cached, or a new refresh token is needed).
    case refreshFailed
    /// The caller's wait bound ran out (`Policy.serveValidTokenOnWaitTimeout`).
    case waitTimeout
    /// The server returned no newer token and the no-progress guard holds the next refresh back.
    case noProgress

    public var label: String {
        switch self {
        case .refreshFailed: "refresh_failed"
        case .waitTimeout: "wait_timeout"
        case .noProgress: "no_progress"
        }
    }
}

/// One consistent read of a session for the admin endpoints (`TokenSessionDriver.snapshot`).
/// Carries no token: only its generation and expiry.
public struct SessionSnapshot: Sendable {
    public var name: String
    public var counters: SessionMetrics
    public var status: TokenSession.Status
    /// Generation of the current token, 0 before the first.
    public var generation: UInt64
    /// Monotonic nanoseconds at which the current token expires; nil while the session has none.
    public var expiresAt: UInt64?
    /// Callers waiting for the session now.
    public var waiters: Int
    /// The last token endpoint failure (scrubbed of secrets, as in the 503 bodies), cleared by a success.
    public var lastFailure: String?
    /// Why the newest refresh token is only in memory (its state file write failed); nil when on disk.
    public var persistFailure: String?
    /// `shared_cache:` configured and its last operation failed (`/readyz`: `shared_cache_degraded`).
    public var sharedCacheDegraded = false
    /// `dpop: true` sessions: DPoP nonce retries (RFC 9449 §8 at the token endpoint, §9 upstream).
    public var dpopNonceRetries: (tokenEndpoint: UInt64, upstream: UInt64)?
    /// `sinks:` files and whether each holds the current token (docs/architecture.md §4).
    public var sinks: [SinkStatus] = []
    /// Tokens handed out by the token API.
    public var apiHandouts: UInt64 = 0
    /// Signing sessions (docs/architecture.md §6.15): signed requests, rejections, skew
    /// adoptions, signature mismatches and the clock offset; nil for token sessions.
    public var signing: SigningState.Counters?
    /// On-behalf-of sessions (docs/architecture.md §6.16): the per-caller cache and exchanges.
    public var caller: CallerSessionSnapshot?

    public init(name: String, counters: SessionMetrics = SessionMetrics(), status: TokenSession.Status = .idle,
                generation: UInt64 = 0, expiresAt: UInt64? = nil, waiters: Int = 0, lastFailure: String? = nil,
                persistFailure: String? = nil) {
        self.persistFailure = persistFailure
        self.name = name
        self.counters = counters
        self.status = status
        self.generation = generation
        self.expiresAt = expiresAt
        self.waiters = waiters
        self.lastFailure = lastFailure
    }

    /// The session holds a token that has not expired at `now` (monotonic nanoseconds).
    /// An on-behalf-of session holds no token of its own: it is ready once its `caller_jwt`
    /// keys (if any) are loaded.
    public func holdsValidToken(now: UInt64) -> Bool {
        if let caller { return caller.keysReady }
        guard let expiresAt else { return false }
        return now < expiresAt
    }
}
