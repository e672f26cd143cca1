import BearerdTLS
import BearerdIO
import BearerdProxyCore
import BearerdConfig

/// An access token as the loops see it: the value to inject, its generation (for the replay
/// rule of DESIGN §6) and a fingerprint for logs. Never logged or printed whole.
public struct PublishedToken: Sendable, Equatable, CustomStringConvertible {
    public let value: String
    public let generation: UInt64
    /// First 8 hex digits of SHA-256 of `value`.
    public let fingerprint: String
    /// Monotonic nanoseconds until which the token may be used without asking the session.
    public let usableUntil: UInt64

    public init(value: String, generation: UInt64, fingerprint: String, usableUntil: UInt64) {
        self.value = value
        self.generation = generation
        self.fingerprint = fingerprint
        self.usableUntil = usableUntil
    }

    public var description: String { "token(gen \(generation), \(fingerprint))" }
}

/// No token can be had now (DESIGN §5): the client gets a 503 with `Retry-After`.
public struct TokenUnavailable: Error, Sendable, Equatable {
    public let session: String
    /// Seconds until the next attempt (Retry-After), at least 1.
    public let retryAfterSeconds: Int
    /// The reason, with the server's RFC 6749 `error`/`error_description` when it sent one; never a secret.
    public let detail: String

    public init(session: String, retryAfterSeconds: Int, detail: String) {
        self.session = session
        self.retryAfterSeconds = max(1, retryAfterSeconds)
        self.detail = detail
    }
}

/// What to do with a request whose token the upstream rejected.
public enum RejectionOutcome: Sendable, Equatable {
    /// Replay once with this (newer) token. `refreshed`: it came from the refresh this rejection
    /// joined or started; false when the session already held it (the request carried an older one).
    case replay(PublishedToken, refreshed: Bool)
    /// Do not replay: the rejection goes to the client as it is (the breaker is open: the
    /// rejections are not about our token; or the session stopped).
    case passThrough(reason: String)
    /// Do not replay: no newer token could be had within the wait bound. The client gets the
    /// 503 `token_unavailable` of DESIGN §5, never the upstream's rejection (DESIGN §6).
    case unavailable(TokenUnavailable)
}
