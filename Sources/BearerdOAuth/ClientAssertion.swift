/// The JWT of `client_auth: private_key_jwt` (RFC 7523 §3, OIDC Core §9), built here and signed
/// by the caller (`BearerdTLS.JWTSigner`): pure, time and randomness are arguments.
///
/// Claims: `iss` = `sub` = client_id, `aud` = the token endpoint URL, a fresh `jti`, `iat`, and
/// `exp` at most 5 minutes later (60 s by default). Header: `alg` (RS256 or ES256 from the key),
/// `typ` JWT, `kid` (`client_key_id`, else the key's RFC 7638 thumbprint: `PublicJWK`).
public enum ClientAssertion {
    public static let type = "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
    public static let maximumLifetime: Int64 = 300

    /// The JWS signing input: base64url(header) "." base64url(claims).
    public static func signingInput(algorithm: String, keyID: String?, clientID: String, audience: String,
                                    jti: String, now: Int64, lifetime: Int64 = 60) -> String {
        var header = "{\"alg\":" + JSONWriter.quote(algorithm) + ",\"typ\":\"JWT\""
        if let keyID { header += ",\"kid\":" + JSONWriter.quote(keyID) }
        header += "}"
        let life = min(max(lifetime, 1), maximumLifetime)
        let exp = now.addingReportingOverflow(life).partialValue
        let claims = "{\"iss\":" + JSONWriter.quote(clientID) + ",\"sub\":" + JSONWriter.quote(clientID)
            + ",\"aud\":" + JSONWriter.quote(audience) + ",\"jti\":" + JSONWriter.quote(jti)
            + ",\"iat\":\(now),\"exp\":\(exp)}"
        return Base64.encodeURL(Array(header.utf8)) + "." + Base64.encodeURL(Array(claims.utf8))
    }

    /// The compact JWS: signing input "." base64url(signature).
    public static func assemble(signingInput: String, signature: [UInt8]) -> String {
        signingInput + "." + Base64.encodeURL(signature)
    }
}

/// The public half of a `private_key_jwt` client key as a JWK (RFC 7517, RFC 7518 §6), and its
/// RFC 7638 thumbprint, bearerd's default `kid`. Pure: the key's numbers come from the caller.
public enum PublicJWK: Sendable, Equatable {
    /// RSA modulus and public exponent, big-endian without leading zeros.
    case rsa(n: [UInt8], e: [UInt8])
    /// A P-256 point, each coordinate 32 bytes big-endian.
    case ec(crv: String, x: [UInt8], y: [UInt8])

    /// RFC 7638 §3.2: only the required members, in lexicographic order, no white space.
    public var canonicalJSON: String {
        switch self {
        case .rsa(let n, let e):
            return #"{"e":"\#(Base64.encodeURL(e))","kty":"RSA","n":"\#(Base64.encodeURL(n))"}"#
        case .ec(let crv, let x, let y):
            return "{\"crv\":" + JSONWriter.quote(crv) + #","kty":"EC","x":"\#(Base64.encodeURL(x))","y":"\#(Base64.encodeURL(y))"}"#
        }
    }

    /// RFC 7638 §3.1: base64url(SHA-256(canonical JSON)).
    public var thumbprint: String {
        Base64.encodeURL(SHA256.hash(Array(canonicalJSON.utf8)))
    }

    /// The JWK to register with the server: the required members plus `kid`, `use: sig` and `alg`.
    public func registration(kid: String, alg: String) -> String {
        String(canonicalJSON.dropLast()) + ",\"kid\":" + JSONWriter.quote(kid) + ",\"use\":\"sig\",\"alg\":" + JSONWriter.quote(alg) + "}"
    }
}
