import BearerdOAuth

/// Counters of one token session, for `/metrics` (one counter per outcome, failures
/// classified). Monotonic since the session was created. A value snapshot: read it with
/// `TokenSessionDriver.metrics`.
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

    public init() {}
}
