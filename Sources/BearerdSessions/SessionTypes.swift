import BearerdIO
import BearerdConfig
import BearerdOAuth

/// An access token as the loops see it: the value to inject, its generation (for the replay
/// rule of docs/architecture.md §6) and a fingerprint for logs. Never logged or printed whole. Immutable;
/// a class, so the loops' caches and each request hold one reference, not two strings.
public final class PublishedToken: Sendable, Equatable, CustomStringConvertible {
    public let value: String
    public let generation: UInt64
    /// First 8 hex digits of SHA-256 of `value`.
    public let fingerprint: String
    /// Monotonic nanoseconds until which the token may be used without asking the session.
    public let usableUntil: UInt64
    /// A signing session's keys, decoded once here from `value` (docs/architecture.md §6.15);
    /// nil for a token.
    public let signingKeys: TemporaryCredentials?

    public init(value: String, generation: UInt64, fingerprint: String, usableUntil: UInt64,
                signingKeys: TemporaryCredentials? = nil) {
        self.value = value
        self.generation = generation
        self.fingerprint = fingerprint
        self.usableUntil = usableUntil
        self.signingKeys = signingKeys
    }

    public var description: String { "token(gen \(generation), \(fingerprint))" }

    public static func == (a: PublishedToken, b: PublishedToken) -> Bool {
        a.value == b.value && a.generation == b.generation && a.fingerprint == b.fingerprint && a.usableUntil == b.usableUntil
    }
}

/// No token can be had now (docs/architecture.md §5): the client gets a 503 with `Retry-After`.
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
    /// Replay with this (newer) token. `refreshed`: it was requested after the session learned of
    /// this rejection (a refresh this rejection started, or one started since), so whatever killed
    /// the rejected token cannot have killed it: a rejection of this replay goes to the client.
    /// False when the token was requested earlier: the session's current token handed to a request
    /// that carried an older generation, or the result of a fetch already in flight. One revocation
    /// can kill both tokens, so such a replay is provisional: if it is rejected too, that is the
    /// first news about its token, and the request is replayed once more (docs/architecture.md §6).
    case replay(PublishedToken, refreshed: Bool)
    /// Do not replay: the rejection goes to the client as it is (the breaker is open: the
    /// rejections are not about our token; or the session stopped).
    case passThrough(reason: String)
    /// Do not replay: no newer token could be had within the wait bound. The client gets the
    /// 503 `token_unavailable` of docs/architecture.md §5, never the upstream's rejection (docs/architecture.md §6).
    case unavailable(TokenUnavailable)
}
