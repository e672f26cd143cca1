import Testing
@testable import BearerdOAuth

/// RFC 9449 proofs as built before signing: header members, claims, `htu` without query and
/// fragment, `ath` against the RFC's own example, nonces.
@Suite struct DPoPTests {
    static func decode(_ part: Substring) throws -> JSONValue {
        let bytes = try #require(Base64.decodeURL(String(part)))
        return try JSONParser(maxDepth: 8, maxBytes: 1 << 16).parse(bytes)
    }

    @Test func proofForAResourceRequest() throws {
        let jwk = #"{"kty":"EC","crv":"P-256","x":"l8tFrhx-34tV3hRICRDY9zCkDlpBhF42UQUfWVAWBFs","y":"9VE4jf_Ok_o64zbTTlcuNJajHmt6v9TDVrU0CdvGRDA"}"#
        let input = DPoP.signingInput(algorithm: "ES256", publicJWK: jwk, jti: "e1j3V_bKic8-LAEB", method: "GET",
                                      uri: "https://resource.example.org/protectedresource?x=1#frag", issuedAt: 1562262618,
                                      accessToken: "Kz~8mXK1EalYznwH-LC-1fBAo.4Ljp~zsPE_NeO.gxU", nonce: "eyJ7S_zG.eyJH0-Z.HX4w-7v")
        let parts = input.split(separator: ".")
        #expect(parts.count == 2)
        let header = try Self.decode(parts[0])
        #expect(header["typ"]?.stringValue == "dpop+jwt")
        #expect(header["alg"]?.stringValue == "ES256")
        #expect(header["jwk"]?["crv"]?.stringValue == "P-256")
        #expect(header["jwk"]?["d"] == nil)
        let claims = try Self.decode(parts[1])
        #expect(claims["htm"]?.stringValue == "GET")
        #expect(claims["htu"]?.stringValue == "https://resource.example.org/protectedresource")
        #expect(claims["iat"]?.int64Value == 1562262618)
        #expect(claims["jti"]?.stringValue == "e1j3V_bKic8-LAEB")
        #expect(claims["nonce"]?.stringValue == "eyJ7S_zG.eyJH0-Z.HX4w-7v")
        // RFC 9449 §7.1's example access token and its `ath`.
        #expect(claims["ath"]?.stringValue == "fUHyO2r2Z3DZ53EsNrWBb0xWXoaNy59IiKCAqksmQEo")
    }

    @Test func proofForATokenRequestHasNoAth() throws {
        let input = DPoP.signingInput(algorithm: "RS256", publicJWK: #"{"kty":"RSA","e":"AQAB","n":"abc"}"#, jti: "j",
                                      method: "POST", uri: "https://as.example/token/", issuedAt: 10)
        let claims = try Self.decode(input.split(separator: ".")[1])
        #expect(claims["ath"] == nil && claims["nonce"] == nil)
        #expect(claims["htu"]?.stringValue == "https://as.example/token/")
        let jws = DPoP.assemble(signingInput: input, signature: [1, 2, 3])
        #expect(jws.split(separator: ".").count == 3)
    }

    @Test func nonceAcceptanceAndChallenge() throws {
        #expect(DPoP.acceptableNonce("eyJ7S_zG.eyJH0-Z.HX4w-7v") != nil)
        #expect(DPoP.acceptableNonce("") == nil)
        #expect(DPoP.acceptableNonce("a b") == nil)
        #expect(DPoP.acceptableNonce("a\"b") == nil)
        #expect(DPoP.acceptableNonce(String(repeating: "n", count: 513)) == nil)
        let asks = try WWWAuthenticate.parse(#"DPoP error="use_dpop_nonce", error_description="Resource server requires nonce in DPoP proof""#)
        #expect(DPoP.asksForNonce(asks))
        let invalid = try WWWAuthenticate.parse(#"DPoP error="invalid_token", algs="ES256""#)
        #expect(!DPoP.asksForNonce(invalid))
        #expect(!DPoP.asksForNonce(try WWWAuthenticate.parse(#"Bearer error="use_dpop_nonce""#)))
    }
}
