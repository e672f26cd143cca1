import Testing
@testable import BearerdOAuth

/// Token requests of the keyless workload grants (RFC 7523 §2.1 jwt-bearer, RFC 8693 token
/// exchange), external client assertions (RFC 7523 §2.2) and `audience`/`resource` lists
/// (RFC 8707 §2), and the inspection of credential files' JWTs.
@Suite struct WorkloadGrantTests {
    func body(_ r: EncodedTokenRequest) -> String { String(decoding: r.body, as: UTF8.self) }

    static func jwt(_ claims: String, header: String = #"{"alg":"RS256","typ":"JWT"}"#) -> String {
        Base64.encodeURL(Array(header.utf8)) + "." + Base64.encodeURL(Array(claims.utf8)) + ".c2ln"
    }

    @Test func jwtBearerWithoutClientSendsNoClientID() throws {
        let r = try TokenRequest(grant: .jwtBearer(assertion: OAuthSecret("a.b.c")), clientID: "",
                                 clientAuthentication: .none, scope: "api").encode()
        #expect(body(r) == "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=a.b.c&scope=api")
        #expect(r.header("Authorization") == nil)
        #expect(!r.description.contains("a.b.c"))
    }

    @Test func jwtBearerWithAClientKeepsItsAuthentication() throws {
        let r = try TokenRequest(grant: .jwtBearer(assertion: OAuthSecret("x.y.z")), clientID: "svc",
                                 clientSecret: OAuthSecret("s"), clientAuthentication: .clientSecretPost).encode()
        #expect(body(r) == "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=x.y.z&client_id=svc&client_secret=s")
    }

    @Test func tokenExchangeWithActorAndRequestedType() throws {
        let exchange = TokenRequest.TokenExchange(subjectToken: OAuthSecret("sub.jwt.sig"), subjectTokenType: TokenRequest.TokenExchange.jwtType,
                                                  actorToken: OAuthSecret("act.jwt.sig"), actorTokenType: nil,
                                                  requestedTokenType: TokenRequest.TokenExchange.accessTokenType)
        var request = TokenRequest(grant: .tokenExchange(exchange), clientID: "", clientAuthentication: .none)
        request.audiences = ["https://a.example", "https://b.example"]
        request.resources = ["https://api.example/v1"]
        let r = try request.encode()
        #expect(body(r) == "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Atoken-exchange"
            + "&requested_token_type=urn%3Aietf%3Aparams%3Aoauth%3Atoken-type%3Aaccess_token"
            + "&subject_token=sub.jwt.sig&subject_token_type=urn%3Aietf%3Aparams%3Aoauth%3Atoken-type%3Ajwt"
            // RFC 8693 §2.1: actor_token_type is required with actor_token (jwt by default).
            + "&actor_token=act.jwt.sig&actor_token_type=urn%3Aietf%3Aparams%3Aoauth%3Atoken-type%3Ajwt"
            + "&audience=https%3A%2F%2Fa.example&audience=https%3A%2F%2Fb.example&resource=https%3A%2F%2Fapi.example%2Fv1")
    }

    @Test func tokenExchangeMinimal() throws {
        let exchange = TokenRequest.TokenExchange(subjectToken: OAuthSecret("tok"), subjectTokenType: TokenRequest.TokenExchange.accessTokenType)
        let r = try TokenRequest(grant: .tokenExchange(exchange), clientID: "sts-client", clientSecret: OAuthSecret("pw")).encode()
        #expect(body(r) == "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Atoken-exchange&subject_token=tok"
            + "&subject_token_type=urn%3Aietf%3Aparams%3Aoauth%3Atoken-type%3Aaccess_token")
        #expect(r.header("Authorization") == "Basic " + Base64.encode(Array("sts-client:pw".utf8)))
    }

    @Test func externalClientAssertion() throws {
        var request = TokenRequest(grant: .clientCredentials, clientID: "app-id", clientAuthentication: .clientAssertion, scope: "s")
        request.clientAssertion = OAuthSecret("fed.jwt.sig")
        let r = try request.encode()
        #expect(body(r) == "grant_type=client_credentials&scope=s&client_id=app-id"
            + "&client_assertion_type=urn%3Aietf%3Aparams%3Aoauth%3Aclient-assertion-type%3Ajwt-bearer&client_assertion=fed.jwt.sig")
        request.clientID = ""
        #expect(!body(try request.encode()).contains("client_id"))
        request.clientAssertion = nil
        #expect(throws: TokenRequest.EncodingError.self) { try request.encode() }
    }

    @Test func grantParametersAreReservedForExtraParameters() {
        for name in ["assertion", "subject_token", "subject_token_type", "actor_token", "actor_token_type", "requested_token_type"] {
            #expect(TokenRequest.reservedParameterNames.contains(name))
            #expect(throws: TokenRequest.EncodingError.self) {
                try TokenRequest(grant: .clientCredentials, clientID: "c", clientAuthentication: .none, extraParameters: [(name, "x")]).encode()
            }
        }
    }

    @Test func audienceAndResourceWithOtherGrants() throws {
        var request = TokenRequest(grant: .clientCredentials, clientID: "c", clientSecret: OAuthSecret("s"), scope: "a b")
        request.audiences = ["api"]
        request.resources = ["https://r1/", "https://r2/"]
        #expect(body(try request.encode()) == "grant_type=client_credentials&scope=a+b&audience=api&resource=https%3A%2F%2Fr1%2F&resource=https%3A%2F%2Fr2%2F")
    }

    // MARK: credential files

    @Test func credentialFileInspection() {
        let now: Int64 = 1_800_000_000
        let valid = Self.jwt(#"{"iss":"k8s","exp":1800000600}"#)
        #expect(CredentialJWT.problem(content: valid + "\n", wallClockNow: now) == nil)
        #expect(CredentialJWT.inspect(valid) == .jwt(expiresAt: 1_800_000_600))
        #expect(CredentialJWT.problem(content: Self.jwt(#"{"sub":"x"}"#), wallClockNow: now) == nil)
        let expired = Self.jwt(#"{"exp":1799999990}"#)
        #expect(CredentialJWT.problem(content: expired, wallClockNow: now) == .expired(expiresAt: 1_799_999_990, secondsAgo: 10))
        #expect(CredentialJWT.problem(content: " \n", wallClockNow: now) == .empty)
        #expect(CredentialJWT.problem(content: "not a jwt", wallClockNow: now)?.reason == "credential.not_a_jwt")
        #expect(CredentialJWT.problem(content: "a.b.c.d.e", wallClockNow: now)?.description.contains("JWE") == true)
        #expect(CredentialJWT.problem(content: "eyJ.e30.x", wallClockNow: now)?.reason == "credential.not_a_jwt")
        // Extreme exp values saturate instead of trapping.
        let huge = Self.jwt(#"{"exp":-99999999999999999999999}"#)
        if case .expired(_, let ago)? = CredentialJWT.problem(content: huge, wallClockNow: .max) { #expect(ago >= 0) }
        #expect(CredentialJWT.problem(content: Self.jwt(#"{"exp":99999999999999999999999}"#), wallClockNow: now) == nil)
        #expect(CredentialJWT.problem(content: Self.jwt(#"{"exp":1}"#), wallClockNow: .min) == nil)
        #expect(CredentialJWT.problem(content: Self.jwt(#"{"exp":-9223372036854775808}"#), wallClockNow: .max) != nil)
    }
}
