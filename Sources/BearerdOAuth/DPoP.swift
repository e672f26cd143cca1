/// DPoP proofs (RFC 9449): the JWT a client signs for every token request and every request to
/// a resource, proving possession of the key its tokens are bound to. Built here, signed by the
/// caller (`BearerdTLS.JWTSigner`), like `ClientAssertion`: pure, time and randomness are
/// arguments.
///
/// Header (RFC 9449 §4.2): `typ` `dpop+jwt`, `alg` (ES256, RS256 or PS256 from the key), `jwk`
/// the public key (no private members). Claims: `jti` (fresh per proof, replays included),
/// `htm` (the method), `htu` (the target URI without query and fragment), `iat`; `ath`
/// (base64url SHA-256 of the access token) on requests to a resource; `nonce` when the server
/// supplied one (`DPoP-Nonce`, RFC 9449 §8, §9).
public enum DPoP {
    /// `token_type` of a DPoP-bound access token (RFC 9449 §5) and the `Authorization` scheme.
    public static let scheme = "DPoP"
    /// The header field that carries a proof (RFC 9449 §4.1) and the one a server's nonce comes in.
    public static let proofHeader = "DPoP"
    public static let nonceHeader = "DPoP-Nonce"

    /// `htu` (RFC 9449 §4.2): the URI without query and fragment. `url` is an absolute URI.
    public static func htu(_ url: String) -> String {
        var end = url.endIndex
        if let q = url.firstIndex(where: { $0 == "?" || $0 == "#" }) { end = q }
        return String(url[..<end])
    }

    /// `ath` (RFC 9449 §4.2): base64url(SHA-256(ASCII access token)).
    public static func ath(accessToken: String) -> String {
        Base64.encodeURL(SHA256.hash(Array(accessToken.utf8)))
    }

    /// The JWS signing input of one proof. `publicJWK` is the JSON text of the public key
    /// (`{"kty":...}`), as `JWTSigner.publicJWK` writes it.
    public static func signingInput(algorithm: String, publicJWK: String, jti: String, method: String, uri: String,
                                    issuedAt: Int64, accessToken: String? = nil, nonce: String? = nil) -> String {
        let header = "{\"typ\":\"dpop+jwt\",\"alg\":" + JSONWriter.quote(algorithm) + ",\"jwk\":" + publicJWK + "}"
        var claims = "{\"jti\":" + JSONWriter.quote(jti) + ",\"htm\":" + JSONWriter.quote(method)
            + ",\"htu\":" + JSONWriter.quote(htu(uri)) + ",\"iat\":\(issuedAt)"
        if let accessToken { claims += ",\"ath\":" + JSONWriter.quote(ath(accessToken: accessToken)) }
        if let nonce { claims += ",\"nonce\":" + JSONWriter.quote(nonce) }
        claims += "}"
        return Base64.encodeURL(Array(header.utf8)) + "." + Base64.encodeURL(Array(claims.utf8))
    }

    /// The compact JWS: signing input "." base64url(signature).
    public static func assemble(signingInput: String, signature: [UInt8]) -> String {
        signingInput + "." + Base64.encodeURL(signature)
    }

    /// A `DPoP-Nonce` value is used only when it is a non-empty NQCHAR string (RFC 9449 §8.1:
    /// `%x21 / %x23-5B / %x5D-7E`), at most 512 bytes: anything else from a server is ignored.
    public static func acceptableNonce(_ value: String) -> String? {
        guard !value.isEmpty, value.utf8.count <= 512 else { return nil }
        for b in value.utf8 where !(b == 0x21 || (0x23...0x5B).contains(b) || (0x5D...0x7E).contains(b)) { return nil }
        return value
    }

    /// True when a resource server's challenges ask for a nonce (RFC 9449 §9: 401 with
    /// `WWW-Authenticate: DPoP error="use_dpop_nonce"`): replay with a fresh proof carrying the
    /// nonce, not a rejection of the token.
    public static func asksForNonce(_ challenges: [AuthenticationChallenge]) -> Bool {
        challenges.contains { $0.scheme.lowercased() == "dpop" && $0.parameter("error") == "use_dpop_nonce" }
    }
}
