import BearerdOAuth
import BearerdTLS

/// The shell's `CallerJWTCrypto`: JWK numbers → OpenSSL keys (`BearerdTLS.JWKPublicKey`) for
/// `caller_jwt` (docs/architecture.md §6.16). Stateless; safe from any thread.
public struct OpenSSLCallerJWTCrypto: CallerJWTCrypto {
    public init() {}

    public func publicKey(for jwk: JWK) -> Result<any CallerJWTPublicKey, JWKSet.Skip> {
        let components: JWKPublicKey.Components
        switch jwk.material {
        case .rsa(let n, let e): components = .rsa(n: n, e: e)
        case .ec(let curve, let x, let y): components = .ec(curve: curve.rawValue, x: x, y: y)
        case .ed25519(let x): components = .ed25519(x: x)
        }
        do {
            return .success(OpenSSLCallerKey(try JWKPublicKey(components)))
        } catch {
            return .failure(JWKSet.Skip(index: 0, keyID: jwk.keyID, reason: error.message))
        }
    }
}

/// One imported key, as the pure core sees it. Immutable; any thread.
final class OpenSSLCallerKey: CallerJWTPublicKey {
    let key: JWKPublicKey

    init(_ key: JWKPublicKey) { self.key = key }

    func verify(_ algorithm: CallerJWT.Algorithm, signingInput: [UInt8], signature: [UInt8]) -> Bool {
        key.verify(algorithm: algorithm.rawValue, signingInput: signingInput, signature: signature)
    }
}
