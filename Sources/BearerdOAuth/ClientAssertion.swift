/// The JWT of `client_auth: private_key_jwt` (RFC 7523 §3, OIDC Core §9), built here and signed
/// by the caller (`BearerdTLS.JWTSigner`): pure, time and randomness are arguments.
///
/// Claims: `iss` = `sub` = client_id, `aud` = the token endpoint URL, a fresh `jti`, `iat`, and
/// `exp` at most 5 minutes later (60 s by default). Header: `alg` (RS256 or ES256 from the key),
/// `typ` JWT, `kid` when configured.
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
