import Testing
@testable import BearerdOAuth

@Suite("Authorization server metadata (RFC 8414) and PKCE (RFC 7636)")
struct DiscoveryAndPKCETests {
    @Test func wellKnownURLs() {
        #expect(AuthorizationServerMetadata.wellKnownURLs(issuer: "https://as.example.com") ==
                ["https://as.example.com/.well-known/oauth-authorization-server", "https://as.example.com/.well-known/openid-configuration"])
        // RFC 8414 §3.1: the well-known segment goes between host and path.
        #expect(AuthorizationServerMetadata.wellKnownURLs(issuer: "https://login.example.com/tenant/v2.0") ==
                ["https://login.example.com/.well-known/oauth-authorization-server/tenant/v2.0",
                 "https://login.example.com/tenant/v2.0/.well-known/openid-configuration"])
        #expect(AuthorizationServerMetadata.wellKnownURLs(issuer: "nonsense").isEmpty)
    }

    @Test func parseChecksTheIssuer() throws {
        let doc = #"{"issuer":"https://as.example.com","token_endpoint":"https://as.example.com/token","authorization_endpoint":"https://as.example.com/authorize","device_authorization_endpoint":"https://as.example.com/device","token_endpoint_auth_methods_supported":["private_key_jwt","none"]}"#
        let m = try AuthorizationServerMetadata.parse(Array(doc.utf8), expectedIssuer: "https://as.example.com")
        #expect(m.tokenEndpoint == "https://as.example.com/token")
        #expect(m.deviceAuthorizationEndpoint == "https://as.example.com/device")
        #expect(m.tokenEndpointAuthMethods == ["private_key_jwt", "none"])
        func reason(_ json: String, _ issuer: String = "https://as.example.com") -> String? {
            do { _ = try AuthorizationServerMetadata.parse(Array(json.utf8), expectedIssuer: issuer); return nil } catch { return error.reason }
        }
        #expect(reason(doc, "https://evil.example.com") == "discovery.issuer_mismatch")
        #expect(reason("[]") == "discovery.malformed")
        #expect(reason(#"{"token_endpoint":"https://as.example.com/t"}"#) == "discovery.missing_field")
        #expect(reason(#"{"issuer":"https://as.example.com"}"#) == "discovery.missing_field")
        #expect(reason(#"{"issuer":"https://as.example.com","token_endpoint":"http://as.example.com/t"}"#) == "discovery.insecure_endpoint")
    }

    /// RFC 7636 Appendix B's example.
    @Test func pkceS256() {
        let random: [UInt8] = [116, 24, 223, 180, 151, 153, 224, 37, 79, 250, 96, 125, 216, 173, 187, 186, 22, 212, 37, 77,
                               105, 214, 191, 240, 91, 88, 5, 88, 83, 132, 141, 121]
        let p = PKCE(random: random)
        #expect(p.verifier.exposedValue == "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk")
        #expect(p.challenge == "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM")
    }

    @Test func formDecoding() {
        #expect(FormURLEncoding.decode("a+b%20c%2Fd%zz%4") == "a b c/d%zz%4")
        #expect(FormURLEncoding.decode(FormURLEncoding.encode("é & =/?")) == "é & =/?")
    }

    @Test func codeAndDeviceGrantsEncode() throws {
        let r = TokenRequest(grant: .authorizationCode(code: OAuthSecret("c1"), redirectURI: "http://127.0.0.1:5/callback", codeVerifier: OAuthSecret("v1")),
                             clientID: "native", clientAuthentication: .none)
        #expect(String(decoding: try r.encode().body, as: UTF8.self)
                == "grant_type=authorization_code&code=c1&redirect_uri=http%3A%2F%2F127.0.0.1%3A5%2Fcallback&code_verifier=v1&client_id=native")
        let d = TokenRequest(grant: .deviceCode(OAuthSecret("dc")), clientID: "tv", clientAuthentication: .none)
        #expect(String(decoding: try d.encode().body, as: UTF8.self)
                == "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Adevice_code&device_code=dc&client_id=tv")
    }
}

@Suite("Client authentication without a secret (RFC 7523, RFC 8705)")
struct ClientAuthEncodingTests {
    @Test func tlsClientAuthSendsTheClientIDOnly() throws {
        let r = TokenRequest(grant: .clientCredentials, clientID: "svc", clientSecret: OAuthSecret("ignored"), clientAuthentication: .tlsClientAuth, scope: "read")
        let e = try r.encode()
        #expect(String(decoding: e.body, as: UTF8.self) == "grant_type=client_credentials&scope=read&client_id=svc")
        #expect(e.header("Authorization") == nil)
    }

    @Test func privateKeyJWTCarriesTheAssertion() throws {
        var r = TokenRequest(grant: .clientCredentials, clientID: "svc", clientAuthentication: .privateKeyJWT)
        #expect(throws: TokenRequest.EncodingError.self) { try r.encode() }
        r.clientAssertion = OAuthSecret("h.c.s")
        let body = String(decoding: try r.encode().body, as: UTF8.self)
        #expect(body == "grant_type=client_credentials&client_id=svc&client_assertion_type=urn%3Aietf%3Aparams%3Aoauth%3Aclient-assertion-type%3Ajwt-bearer&client_assertion=h.c.s")
    }

    @Test func assertionClaims() throws {
        let input = ClientAssertion.signingInput(algorithm: "ES256", keyID: "k1", clientID: "svc", audience: "https://as/token",
                                                 jti: "j1", now: 1_000, lifetime: 10_000)
        let parts = input.split(separator: ".").map(String.init)
        #expect(parts.count == 2)
        let header = String(decoding: try #require(Base64.decodeURL(parts[0])), as: UTF8.self)
        let claims = String(decoding: try #require(Base64.decodeURL(parts[1])), as: UTF8.self)
        #expect(header == #"{"alg":"ES256","typ":"JWT","kid":"k1"}"#)
        // exp capped at 5 minutes whatever was asked.
        #expect(claims == #"{"iss":"svc","sub":"svc","aud":"https://as/token","jti":"j1","iat":1000,"exp":1300}"#)
        #expect(ClientAssertion.assemble(signingInput: input, signature: [0xfb, 0xff]) == input + ".-_8")
    }
}

/// OIDC Core §3.1.2.1, §3.1.3.7: the nonce of a sign-in with `openid`, checked in the id_token.
@Suite("OpenID Connect nonce")
struct OpenIDNonceTests {
    static func idToken(_ payload: String) -> String {
        Base64.encodeURL(Array(#"{"alg":"ES256"}"#.utf8)) + "." + Base64.encodeURL(Array(payload.utf8)) + ".c2ln"
    }

    @Test func requestedOnlyForTheOpenIDScopeValue() {
        #expect(OpenIDNonce.isRequested(scope: "openid offline_access"))
        #expect(OpenIDNonce.isRequested(scope: "read openid"))
        #expect(!OpenIDNonce.isRequested(scope: "openidx read"))
        #expect(!OpenIDNonce.isRequested(scope: nil))
    }

    @Test func theIDTokenMustCarryTheSameNonce() throws {
        let nonce = OpenIDNonce(random: Array(repeating: 1, count: 16))
        #expect(nonce.value.count == 22)
        try nonce.check(idToken: Self.idToken(#"{"sub":"alice","nonce":"\#(nonce.value)"}"#))
        #expect(throws: OpenIDNonce.Mismatch.self) { try nonce.check(idToken: Self.idToken(#"{"sub":"alice","nonce":"other"}"#)) }
        #expect(throws: OpenIDNonce.Mismatch.self) { try nonce.check(idToken: Self.idToken(#"{"sub":"alice","nonce":"\#(nonce.value)x"}"#)) }
        #expect(throws: OpenIDNonce.Mismatch.self) { try nonce.check(idToken: Self.idToken(#"{"sub":"alice"}"#)) }
        #expect(throws: OpenIDNonce.Mismatch.self) { try nonce.check(idToken: Self.idToken(#"{"nonce":7}"#)) }
        for malformed in ["", "a.b", "a.!!!.c", "a.b.c.d", Self.idToken("[1]"), Self.idToken("not json")] {
            #expect(throws: OpenIDNonce.Mismatch.self) { try nonce.check(idToken: malformed) }
        }
    }
}

/// RFC 7638: the JWK thumbprint that is `private_key_jwt`'s default `kid`.
@Suite("JWK thumbprint (RFC 7638)")
struct JWKThumbprintTests {
    @Test func theRFC7638ExampleKey() throws {
        // RFC 7638 §3.1.
        let n = try #require(Base64.decodeURL("0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw"))
        let jwk = PublicJWK.rsa(n: n, e: [1, 0, 1])
        #expect(jwk.canonicalJSON.hasPrefix(#"{"e":"AQAB","kty":"RSA","n":"0vx7"#))
        #expect(jwk.thumbprint == "NzbLsXh8uDCcd-6MNwXF4W_7noWXFZAfHkxZsRGC9Xs")
    }

    @Test func aP256Key() throws {
        // RFC 7517 Appendix A.1's EC key; thumbprint computed independently with joserfc
        // (`import_key({...}).thumbprint()`).
        let x = try #require(Base64.decodeURL("MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4"))
        let y = try #require(Base64.decodeURL("4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM"))
        let jwk = PublicJWK.ec(crv: "P-256", x: x, y: y)
        #expect(jwk.canonicalJSON == #"{"crv":"P-256","kty":"EC","x":"MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4","y":"4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM"}"#)
        #expect(jwk.thumbprint == "cn-I_WNMClehiVp51i_0VpOENW1upEerA8sEam5hn-s")
        #expect(jwk.registration(kid: "k1", alg: "ES256").hasSuffix(#","kid":"k1","use":"sig","alg":"ES256"}"#))
    }
}
