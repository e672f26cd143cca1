/// How the client authenticates at the token endpoint (RFC 6749 §2.3.1; RFC 7591 §2 names).
public enum ClientAuthentication: String, Sendable, Equatable, CaseIterable {
    /// `Authorization: Basic base64(urlencode(id) ":" urlencode(secret))` (RFC 6749 §2.3.1).
    case clientSecretBasic = "client_secret_basic"
    /// `client_id` and `client_secret` in the form body (RFC 6749 §2.3.1, "NOT RECOMMENDED" but common).
    case clientSecretPost = "client_secret_post"
    /// Public client: `client_id` in the body, no secret (RFC 6749 §2.1, §3.2.1).
    case none = "none"
    /// A JWT signed with the client's key (RFC 7523 §2.2, OIDC Core §9): `client_assertion_type`
    /// and `client_assertion` in the body; the assertion is made fresh per request.
    case privateKeyJWT = "private_key_jwt"
    /// Mutual TLS (RFC 8705 §2): the TLS client certificate authenticates; `client_id` in the body.
    case tlsClientAuth = "tls_client_auth"
}

/// One token request, before encoding: the grant and the client's credentials.
///
/// Holds secrets only as `OAuthSecret`, so printing a request never shows them.
public struct TokenRequest: Sendable, Equatable {
    /// The grant being exercised.
    public enum Grant: Sendable, Equatable {
        /// RFC 6749 §4.4.2.
        case clientCredentials
        /// RFC 6749 §6.
        case refreshToken(OAuthSecret)
        /// RFC 6749 §4.3.2.
        case password(username: String, password: OAuthSecret)
        /// RFC 6749 §4.1.3 with RFC 7636 §4.5 (`code_verifier`).
        case authorizationCode(code: OAuthSecret, redirectURI: String, codeVerifier: OAuthSecret)
        /// RFC 8628 §3.4.
        case deviceCode(OAuthSecret)

        /// The `grant_type` value.
        public var grantType: String {
            switch self {
            case .clientCredentials: "client_credentials"
            case .refreshToken: "refresh_token"
            case .password: "password"
            case .authorizationCode: "authorization_code"
            case .deviceCode: "urn:ietf:params:oauth:grant-type:device_code"
            }
        }
    }

    public var grant: Grant
    public var clientID: String
    public var clientSecret: OAuthSecret?
    public var clientAuthentication: ClientAuthentication
    /// Space-separated scope (RFC 6749 §3.3); omitted when nil or empty.
    public var scope: String?
    /// Extra form parameters (`params:` in the config), sent in this order after the standard ones.
    public var extraParameters: [(String, String)]
    /// `private_key_jwt`: the signed assertion for this request (`ClientAssertion`).
    public var clientAssertion: OAuthSecret?

    public init(grant: Grant, clientID: String, clientSecret: OAuthSecret? = nil,
                clientAuthentication: ClientAuthentication = .clientSecretBasic,
                scope: String? = nil, extraParameters: [(String, String)] = []) {
        self.grant = grant
        self.clientID = clientID
        self.clientSecret = clientSecret
        self.clientAuthentication = clientAuthentication
        self.scope = scope
        self.extraParameters = extraParameters
    }

    public static func == (a: TokenRequest, b: TokenRequest) -> Bool {
        a.grant == b.grant && a.clientID == b.clientID && a.clientSecret == b.clientSecret
            && a.clientAuthentication == b.clientAuthentication && a.scope == b.scope
            && a.extraParameters.elementsEqual(b.extraParameters, by: { $0 == $1 })
    }

    /// Parameter names the codec writes itself; `extraParameters` may not repeat them.
    public static let reservedParameterNames: Set<String> = [
        "grant_type", "client_id", "client_secret", "refresh_token", "username", "password", "scope",
        "code", "redirect_uri", "code_verifier", "device_code", "client_assertion", "client_assertion_type",
    ]

    /// Why a request could not be encoded (a configuration problem, never retried).
    public struct EncodingError: Error, Sendable, Equatable, CustomStringConvertible {
        /// Stable dotted reason: `token.missing_client_secret`, `token.reserved_parameter`.
        public let reason: String
        public let detail: String
        public var description: String { "\(reason): \(detail)" }
    }

    /// Encodes the request as `POST` body and headers (RFC 6749 §4.3.2, §4.4.2, §6 and
    /// Appendix B). Body parameter order: `grant_type`, grant parameters, `scope`, client
    /// parameters (post / none), extra parameters.
    public func encode() throws(EncodingError) -> EncodedTokenRequest {
        var pairs: [(String, String)] = [("grant_type", grant.grantType)]
        switch grant {
        case .clientCredentials:
            break
        case .refreshToken(let token):
            pairs.append(("refresh_token", token.exposedValue))
        case .password(let username, let password):
            pairs.append(("username", username))
            pairs.append(("password", password.exposedValue))
        case .authorizationCode(let code, let redirectURI, let verifier):
            pairs.append(("code", code.exposedValue))
            pairs.append(("redirect_uri", redirectURI))
            pairs.append(("code_verifier", verifier.exposedValue))
        case .deviceCode(let code):
            pairs.append(("device_code", code.exposedValue))
        }
        if let scope, !scope.isEmpty { pairs.append(("scope", scope)) }
        var headers: [(name: String, value: String)] = [
            ("Content-Type", "application/x-www-form-urlencoded"),
            ("Accept", "application/json"),
        ]
        switch clientAuthentication {
        case .clientSecretBasic:
            guard let secret = clientSecret else {
                throw EncodingError(reason: "token.missing_client_secret", detail: "client_secret_basic needs a client secret")
            }
            let credentials = FormURLEncoding.encode(clientID) + ":" + FormURLEncoding.encode(secret.exposedValue)
            headers.append(("Authorization", "Basic " + Base64.encode(Array(credentials.utf8))))
        case .clientSecretPost:
            guard let secret = clientSecret else {
                throw EncodingError(reason: "token.missing_client_secret", detail: "client_secret_post needs a client secret")
            }
            pairs.append(("client_id", clientID))
            pairs.append(("client_secret", secret.exposedValue))
        case .none, .tlsClientAuth:
            pairs.append(("client_id", clientID))
        case .privateKeyJWT:
            guard let assertion = clientAssertion else {
                throw EncodingError(reason: "token.missing_client_assertion", detail: "private_key_jwt needs a signed client assertion")
            }
            pairs.append(("client_id", clientID))
            pairs.append(("client_assertion_type", ClientAssertion.type))
            pairs.append(("client_assertion", assertion.exposedValue))
        }
        for (name, value) in extraParameters {
            guard !TokenRequest.reservedParameterNames.contains(name) else {
                throw EncodingError(reason: "token.reserved_parameter", detail: "extra parameter '\(name)' is set by bearerd itself")
            }
            pairs.append((name, value))
        }
        return EncodedTokenRequest(body: Array(FormURLEncoding.encode(pairs).utf8), headers: headers)
    }
}

/// The bytes of an encoded token request. Its body and `Authorization` header carry
/// secrets, so it prints redacted.
public struct EncodedTokenRequest: Sendable, CustomStringConvertible, CustomDebugStringConvertible {
    /// `application/x-www-form-urlencoded` body.
    public let body: [UInt8]
    /// Header fields in order: `Content-Type`, `Accept`, then `Authorization` for Basic.
    public let headers: [(name: String, value: String)]

    public init(body: [UInt8], headers: [(name: String, value: String)]) {
        self.body = body
        self.headers = headers
    }

    public var description: String {
        "EncodedTokenRequest(body: <redacted \(body.count) bytes>, headers: \(headers.map { $0.name }))"
    }
    public var debugDescription: String { description }

    /// The value of the first header named `name` (case-insensitive).
    public func header(_ name: String) -> String? {
        headers.first { $0.name.lowercased() == name.lowercased() }?.value
    }
}
