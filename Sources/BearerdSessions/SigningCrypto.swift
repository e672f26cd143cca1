import BearerdProxyCore
import BearerdTLS
import Synchronization

/// OpenSSL's SHA-256 and HMAC for the request signers (signing routes, and the STS `AssumeRole`
/// call of a signing session), keeping the signing keys it derived (docs/architecture.md §6.15):
/// a key depends only on the secret, the day and the scope, so a signed request costs one HMAC
/// for its signature instead of five.
///
/// Owns a `SigningKeyCache` behind a `Mutex` (loops share a route's signer); any thread.
/// Invariant: a cached key is returned only for the exact secret, prefix, day and scope it was
/// derived from.
public final class SigningCrypto: RequestSigning.Crypto, Sendable {
    /// The process's: room for the keys of 16 secrets and scopes at once (routes and sessions are few).
    public static let shared = SigningCrypto(capacity: 16)

    private let keys: Mutex<RequestSigning.SigningKeyCache>

    public init(capacity: Int = 4) { keys = Mutex(RequestSigning.SigningKeyCache(capacity: capacity)) }

    public func sha256(_ bytes: [UInt8]) -> [UInt8] { Digest.sha256(bytes) }
    public func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] { Digest.hmacSHA256(key: key, message: message) }

    public func signingKey(secret: String, prefix: String, date: String, scope: [String]) -> [UInt8] {
        if let key = keys.withLock({ $0.key(secret: secret, prefix: prefix, date: date, scope: scope) }) { return key }
        let key = RequestSigning.deriveSigningKey(secret: secret, prefix: prefix, date: date, scope: scope, crypto: self)
        keys.withLock { $0.insert(key, secret: secret, prefix: prefix, date: date, scope: scope) }
        return key
    }

    /// Keys held now (tests).
    var cachedKeys: Int { keys.withLock { $0.count } }
}
