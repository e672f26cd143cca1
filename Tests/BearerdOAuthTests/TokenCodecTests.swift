import Testing
@testable import BearerdOAuth

@Suite struct TokenRequestTests {
    func body(_ r: EncodedTokenRequest) -> String { String(decoding: r.body, as: UTF8.self) }

    @Test func clientCredentialsBasic() throws {
        let r = try TokenRequest(grant: .clientCredentials, clientID: "my-service", clientSecret: OAuthSecret("s3cr3t"),
                                 clientAuthentication: .clientSecretBasic, scope: "read write",
                                 extraParameters: [("audience", "https://api.example.com"), ("b", "1")]).encode()
        #expect(body(r) == "grant_type=client_credentials&scope=read+write&audience=https%3A%2F%2Fapi.example.com&b=1")
        #expect(r.headers.map(\.name) == ["Content-Type", "Accept", "Authorization"])
        #expect(r.header("content-type") == "application/x-www-form-urlencoded")
        #expect(r.header("Accept") == "application/json")
        #expect(r.header("Authorization") == "Basic bXktc2VydmljZTpzM2NyM3Q=")
        #expect(!r.description.contains("s3cr3t") && !r.description.contains("bXkt"))
    }

    @Test func basicCredentialsAreURLEncodedBeforeBase64() throws {
        // RFC 6749 §2.3.1: id and secret are form-encoded, then joined by ':' and Base64-encoded.
        let r = try TokenRequest(grant: .clientCredentials, clientID: "my:client id+ü",
                                 clientSecret: OAuthSecret("s:e c+r/é")).encode()
        #expect(r.header("Authorization") == "Basic bXklM0FjbGllbnQraWQlMkIlQzMlQkM6cyUzQWUrYyUyQnIlMkYlQzMlQTk=")
        #expect(body(r) == "grant_type=client_credentials")
    }

    @Test func clientSecretPost() throws {
        let r = try TokenRequest(grant: .clientCredentials, clientID: "my:client id+ü", clientSecret: OAuthSecret("s:e c+r/é"),
                                 clientAuthentication: .clientSecretPost).encode()
        #expect(body(r) == "grant_type=client_credentials&client_id=my%3Aclient+id%2B%C3%BC&client_secret=s%3Ae+c%2Br%2F%C3%A9")
        #expect(r.header("Authorization") == nil)
    }

    @Test func refreshTokenNone() throws {
        let r = try TokenRequest(grant: .refreshToken(OAuthSecret("rt/1+2")), clientID: "cli", clientAuthentication: .none).encode()
        #expect(body(r) == "grant_type=refresh_token&refresh_token=rt%2F1%2B2&client_id=cli")
        #expect(r.header("Authorization") == nil)
        #expect(!body(r).contains("client_secret"))
    }

    @Test func noneIgnoresASecret() throws {
        let r = try TokenRequest(grant: .clientCredentials, clientID: "cli", clientSecret: OAuthSecret("x"),
                                 clientAuthentication: .none).encode()
        #expect(body(r) == "grant_type=client_credentials&client_id=cli")
    }

    @Test func passwordGrantAllMethods() throws {
        let grant = TokenRequest.Grant.password(username: "svc user", password: OAuthSecret("p&ss=word"))
        let basic = try TokenRequest(grant: grant, clientID: "app", clientSecret: OAuthSecret("sec"), scope: "a").encode()
        #expect(body(basic) == "grant_type=password&username=svc+user&password=p%26ss%3Dword&scope=a")
        #expect(basic.header("Authorization") == "Basic " + Base64.encode(Array("app:sec".utf8)))
        let post = try TokenRequest(grant: grant, clientID: "app", clientSecret: OAuthSecret("sec"),
                                    clientAuthentication: .clientSecretPost).encode()
        #expect(body(post) == "grant_type=password&username=svc+user&password=p%26ss%3Dword&client_id=app&client_secret=sec")
        let none = try TokenRequest(grant: grant, clientID: "app", clientAuthentication: .none).encode()
        #expect(body(none) == "grant_type=password&username=svc+user&password=p%26ss%3Dword&client_id=app")
    }

    @Test func refreshBasicAndPost() throws {
        let basic = try TokenRequest(grant: .refreshToken(OAuthSecret("r")), clientID: "c", clientSecret: OAuthSecret("s")).encode()
        #expect(body(basic) == "grant_type=refresh_token&refresh_token=r")
        #expect(basic.header("Authorization") == "Basic " + Base64.encode(Array("c:s".utf8)))
        let post = try TokenRequest(grant: .refreshToken(OAuthSecret("r")), clientID: "c", clientSecret: OAuthSecret("s"),
                                    clientAuthentication: .clientSecretPost).encode()
        #expect(body(post) == "grant_type=refresh_token&refresh_token=r&client_id=c&client_secret=s")
    }

    @Test func configurationErrors() {
        #expect(throws: TokenRequest.EncodingError.self) {
            try TokenRequest(grant: .clientCredentials, clientID: "c", clientAuthentication: .clientSecretBasic).encode()
        }
        #expect(throws: TokenRequest.EncodingError.self) {
            try TokenRequest(grant: .clientCredentials, clientID: "c", clientAuthentication: .clientSecretPost).encode()
        }
        do {
            _ = try TokenRequest(grant: .clientCredentials, clientID: "c", clientAuthentication: .none,
                                 extraParameters: [("client_secret", "x")]).encode()
            Issue.record("reserved parameter accepted")
        } catch {
            #expect(error.reason == "token.reserved_parameter")
        }
    }
}

@Suite struct TokenResponseTests {
    let parser = TokenResponseParser(defaultLifetime: .seconds(300))
    let now: Int64 = 1_700_000_000

    func parse(_ status: Int, _ body: String, headers: [(name: String, value: String)] = []) -> Result<TokenGrant, TokenEndpointFailure> {
        parser.parse(status: status, headers: headers, body: Array(body.utf8), wallClockNow: now)
    }
    func grant(_ r: Result<TokenGrant, TokenEndpointFailure>) -> TokenGrant? { try? r.get() }
    func failure(_ r: Result<TokenGrant, TokenEndpointFailure>) -> TokenEndpointFailure? {
        if case .failure(let f) = r { return f }
        return nil
    }

    @Test func standardSuccess() throws {
        let g = try #require(grant(parse(200, #"{"access_token":"abc","token_type":"Bearer","expires_in":3600,"refresh_token":"r2","scope":"read"}"#)))
        #expect(g.accessToken == OAuthSecret("abc"))
        #expect(g.lifetime == .seconds(3600))
        #expect(g.lifetimeSource == .expiresIn)
        #expect(g.refreshToken == OAuthSecret("r2"))
        #expect(g.scope == "read")
        #expect(g.refreshIn == nil)
    }

    @Test func expiresInAsNumericStringAndCaseInsensitiveType() throws {
        let g = try #require(grant(parse(200, #"{"access_token":"abc","token_type":"bEaReR","expires_in":"1800"}"#)))
        #expect(g.lifetime == .seconds(1800))
        #expect(g.lifetimeSource == .expiresIn)
    }

    @Test func jwtExpFallback() throws {
        let jwt = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4IiwiZXhwIjoxNzAwMDAzNjAwfQ.sig"  // exp = now + 3600
        let g = try #require(grant(parse(200, #"{"access_token":"\#(jwt)","token_type":"Bearer"}"#)))
        #expect(g.lifetime == .seconds(3600))
        #expect(g.lifetimeSource == .jwtExpiry)
        let zero = try #require(grant(parse(200, #"{"access_token":"\#(jwt)","token_type":"Bearer","expires_in":0}"#)))
        #expect(zero.lifetimeSource == .jwtExpiry)
    }

    @Test func defaultLifetime() throws {
        let g = try #require(grant(parse(200, #"{"access_token":"opaque","token_type":"Bearer","expires_in":-5}"#)))
        #expect(g.lifetime == .seconds(300))
        #expect(g.lifetimeSource == .defaultLifetime)
        let bogus = try #require(grant(parse(200, #"{"access_token":"a.b.c","token_type":"Bearer","expires_in":"soon"}"#)))
        #expect(bogus.lifetimeSource == .defaultLifetime)
    }

    @Test func refreshInHonoured() throws {
        let g = try #require(grant(parse(200, #"{"access_token":"a","token_type":"Bearer","expires_in":7200,"refresh_in":3600}"#)))
        #expect(g.refreshIn == .seconds(3600))
    }

    @Test func refreshWithoutNewRefreshTokenKeepsOld() throws {
        let g = try #require(grant(parse(200, #"{"access_token":"a","token_type":"Bearer","expires_in":60}"#)))
        #expect(g.refreshToken == nil)
        #expect(g.keepingRefreshToken(OAuthSecret("old")).refreshToken == OAuthSecret("old"))
        let rotated = try #require(grant(parse(200, #"{"access_token":"a","token_type":"Bearer","refresh_token":"new"}"#)))
        #expect(rotated.keepingRefreshToken(OAuthSecret("old")).refreshToken == OAuthSecret("new"))
    }

    /// docs/architecture.md §6: only the RFC 6749 §5.2 errors naming the client's own credentials are permanent.
    @Test(arguments: [
        (200, #"{"access_token":"a","token_type":"Bearer","error":"invalid_client"}"#, "token.invalid_client"),
        (401, #"{"error":"invalid_client"}"#, "token.invalid_client"),
        (400, #"{"error":"invalid_scope"}"#, "token.invalid_scope"),
        (401, #"{"error":"unauthorized_client"}"#, "token.unauthorized_client"),
        (400, #"{"error":"unsupported_grant_type"}"#, "token.unsupported_grant_type"),
    ])
    func permanentFailures(status: Int, body: String, reason: String) throws {
        let f = try #require(failure(parse(status, body)))
        #expect(f.classification == .permanent)
        #expect(f.reason == reason)
        #expect(f.retryAfter == nil)
    }

    /// docs/architecture.md §6: a malformed, non-JSON or unusable response (any status) is transient, never
    /// negative-cached: a maintenance page or a misconfigured gateway answering `200` must not
    /// lock the session out after the endpoint recovers.
    @Test(arguments: [
        (200, "", "token.malformed_json"),
        (200, "<html><body>Down for maintenance</body></html>", "token.malformed_json"),
        (200, "[1]", "token.not_an_object"),
        (200, #"{"token_type":"Bearer","expires_in":60}"#, "token.missing_access_token"),
        (200, #"{"access_token":"","token_type":"Bearer"}"#, "token.missing_access_token"),
        (200, #"{"access_token":"a\r\nX-Evil: 1","token_type":"Bearer"}"#, "token.invalid_access_token"),
        (200, #"{"access_token":"a","token_type":"mac","expires_in":60}"#, "token.unsupported_token_type"),
        (200, #"{"access_token":"a","expires_in":60}"#, "token.unsupported_token_type"),
        (200, #"{"error":7}"#, "token.malformed_error"),
        (400, #"{"error":"invalid_request"}"#, "token.invalid_request"),
        (404, "not found", "token.http_404"),
        (403, "<html>Forbidden by the gateway</html>", "token.http_403"),
    ])
    func malformedOrUnusableResponsesAreTransient(status: Int, body: String, reason: String) throws {
        let f = try #require(failure(parse(status, body)))
        #expect(f.classification == .retryable)
        #expect(f.reason == reason)
    }

    @Test func errorResponseCarriesRFC6749Fields() throws {
        let f = try #require(failure(parse(400, #"{"error":"invalid_client","error_description":"Client authentication failed","error_uri":"https://as/errors#1"}"#)))
        #expect(f.classification == .permanent)
        #expect(f.oauthError == "invalid_client")
        #expect(f.errorDescription == "Client authentication failed")
        #expect(f.errorURI == "https://as/errors#1")
        #expect(f.status == 400)
        #expect(f.detail == "invalid_client (HTTP 400): Client authentication failed")
    }

    @Test func descriptionIsSanitised() throws {
        let f = try #require(failure(parse(400, #"{"error":"invalid_client","error_description":"bad\nline\u00e9"}"#)))
        #expect(f.errorDescription == "bad?line?")
    }

    @Test func invalidGrantIsItsOwnClass() throws {
        let f = try #require(failure(parse(400, #"{"error":"invalid_grant","error_description":"Refresh token expired"}"#)))
        #expect(f.classification == .invalidGrant)
        #expect(f.reason == "token.invalid_grant")
    }

    @Test(arguments: [
        (408, "", "token.http_408"), (500, "oops", "token.http_500"), (502, "", "token.http_502"),
        (400, #"{"error":"temporarily_unavailable"}"#, "token.temporarily_unavailable"),
        (200, #"{"error":"server_error"}"#, "token.server_error"),
        (503, #"{"error":"invalid_request"}"#, "token.http_503"),
    ])
    func retryableFailures(status: Int, body: String, reason: String) throws {
        let f = try #require(failure(parse(status, body)))
        #expect(f.classification == .retryable)
        #expect(f.reason == reason)
    }

    @Test func retryAfterDefaultsAndCaps() throws {
        #expect(failure(parse(429, ""))?.retryAfter == .seconds(5))
        #expect(failure(parse(503, ""))?.retryAfter == .seconds(5))
        #expect(failure(parse(500, ""))?.retryAfter == nil)
        #expect(failure(parse(429, "", headers: [("Retry-After", "120")]))?.retryAfter == .seconds(120))
        #expect(failure(parse(503, "", headers: [("retry-after", "86400")]))?.retryAfter == .seconds(3600))
        // 1700000000 is Tue, 14 Nov 2023 22:13:20 GMT.
        #expect(failure(parse(503, "", headers: [("Retry-After", "Tue, 14 Nov 2023 22:15:00 GMT")]))?.retryAfter == .seconds(100))
        #expect(failure(parse(503, "", headers: [("Retry-After", "Tue, 14 Nov 2023 22:00:00 GMT")]))?.retryAfter == .zero)
        #expect(failure(parse(503, "", headers: [("Retry-After", "soon")]))?.retryAfter == .seconds(5))
        // Permanent failures never carry a delay.
        #expect(failure(parse(400, #"{"error":"invalid_client"}"#, headers: [("Retry-After", "10")]))?.retryAfter == nil)
    }

    @Test func oversizedBodyRefused() throws {
        let big = "{\"access_token\":\"" + String(repeating: "a", count: 1 << 20) + "\",\"token_type\":\"Bearer\"}"
        let f = try #require(failure(parse(200, big)))
        #expect(f.reason == "token.response_too_large")
        #expect(f.classification == .retryable)
        #expect(failure(parse(503, big))?.classification == .retryable)
    }

    @Test func transportFailure() {
        let f = TokenEndpointFailure.transport("connection refused")
        #expect(f.classification == .retryable)
        #expect(f.status == nil)
        #expect(f.detail == "token.transport: connection refused")
    }
}

@Suite struct RetryAfterTests {
    @Test func forms() {
        #expect(RetryAfter.parse("0", wallClockNow: 0) == .zero)
        #expect(RetryAfter.parse(" 17 ", wallClockNow: 0) == .seconds(17))
        #expect(RetryAfter.parse("-1", wallClockNow: 0) == nil)
        #expect(RetryAfter.parse("1.5", wallClockNow: 0) == nil)
        #expect(RetryAfter.parse("Sun, 06 Nov 1994 08:49:37 GMT", wallClockNow: 784_111_777 - 10) == .seconds(10))
        #expect(RetryAfter.parse("99999999999999999999999", wallClockNow: 0) != nil)
    }

    @Test func imfFixdate() {
        #expect(HTTPDate.parseIMFFixdate("Sun, 06 Nov 1994 08:49:37 GMT") == 784_111_777)
        #expect(HTTPDate.parseIMFFixdate("Thu, 01 Jan 1970 00:00:00 GMT") == 0)
        #expect(HTTPDate.parseIMFFixdate("Thu, 29 Feb 2024 12:00:00 GMT") == 1_709_208_000)
        #expect(HTTPDate.parseIMFFixdate("Mon, 06 Nov 1994 08:49:37 GMT") == nil)  // wrong weekday
        #expect(HTTPDate.parseIMFFixdate("Thu, 29 Feb 2023 12:00:00 GMT") == nil)  // no such day
        #expect(HTTPDate.parseIMFFixdate("Sunday, 06-Nov-94 08:49:37 GMT") == nil)  // rfc850 not accepted
        #expect(HTTPDate.parseIMFFixdate("Sun, 06 Nov 1994 08:49:37 UTC") == nil)
        #expect(HTTPDate.parseIMFFixdate("Sun, 06 Nov 1994 24:49:37 GMT") == nil)
    }
}
