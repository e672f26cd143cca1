/// How the client authenticates at the token endpoint (RFC 6749 §2.3.1; RFC 7591 §2 names), as
/// configured (`client_auth:`, the raw values) and as encoded in token requests.
public enum ClientAuthentication: String, Sendable, Equatable, CaseIterable {
    /// `Authorization: Basic base64(urlencode(id) ":" urlencode(secret))` (RFC 6749 §2.3.1).
    case clientSecretBasic = "client_secret_basic"
    /// `client_id` and `client_secret` in the form body (RFC 6749 §2.3.1, "NOT RECOMMENDED" but common).
    case clientSecretPost = "client_secret_post"
    /// Public client: `client_id` in the body, no secret (RFC 6749 §2.1, §3.2.1).
    case none = "none"
    /// A JWT signed with the client's key (RFC 7523 §2.2, OIDC Core §9): `client_assertion_type`
    /// and `client_assertion` in the body; the assertion is made fresh per request
    /// (signed with `client_key_file`).
    case privateKeyJWT = "private_key_jwt"
    /// Mutual TLS (RFC 8705 §2): the TLS client certificate (the session's `tls:`) authenticates;
    /// `client_id` in the body.
    case tlsClientAuth = "tls_client_auth"
    /// An externally issued JWT (a federated credential, e.g. a projected Kubernetes token an IdP
    /// trusts) as `client_assertion` (RFC 7523 §2.2; `client_assertion_file`, re-read per
    /// request); `client_id` in the body only when configured.
    case clientAssertion = "client_assertion"

    /// The methods that send a client secret.
    public var usesSecret: Bool { self == .clientSecretBasic || self == .clientSecretPost }
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
        /// RFC 7523 §2.1: a JWT is the authorization grant (`assertion`).
        case jwtBearer(assertion: OAuthSecret)
        /// RFC 8693 §2.1: a subject token (and optionally an actor token) is exchanged.
        case tokenExchange(TokenExchange)

        /// The `grant_type` value.
        public var grantType: String {
            switch self {
            case .clientCredentials: "client_credentials"
            case .refreshToken: "refresh_token"
            case .password: "password"
            case .authorizationCode: "authorization_code"
            case .deviceCode: "urn:ietf:params:oauth:grant-type:device_code"
            case .jwtBearer: "urn:ietf:params:oauth:grant-type:jwt-bearer"
            case .tokenExchange: "urn:ietf:params:oauth:grant-type:token-exchange"
            }
        }
    }

    /// The parameters of an RFC 8693 §2.1 token exchange request.
    public struct TokenExchange: Sendable, Equatable {
        /// RFC 8693 §3 token type URIs.
        public static let jwtType = "urn:ietf:params:oauth:token-type:jwt"
        public static let accessTokenType = "urn:ietf:params:oauth:token-type:access_token"
        public static let idTokenType = "urn:ietf:params:oauth:token-type:id_token"
        public static let refreshTokenType = "urn:ietf:params:oauth:token-type:refresh_token"

        public var subjectToken: OAuthSecret
        public var subjectTokenType: String
        public var actorToken: OAuthSecret?
        public var actorTokenType: String?
        public var requestedTokenType: String?

        public init(subjectToken: OAuthSecret, subjectTokenType: String, actorToken: OAuthSecret? = nil,
                    actorTokenType: String? = nil, requestedTokenType: String? = nil) {
            self.subjectToken = subjectToken
            self.subjectTokenType = subjectTokenType
            self.actorToken = actorToken
            self.actorTokenType = actorTokenType
            self.requestedTokenType = requestedTokenType
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
    /// `private_key_jwt`: the signed assertion for this request (`ClientAssertion`);
    /// `client_assertion`: the external JWT read for this request.
    public var clientAssertion: OAuthSecret?
    /// `audience:` values (RFC 8693 §2.1 and vendors' `audience`), one parameter per value.
    public var audiences: [String] = []
    /// `resource:` values (RFC 8707 §2), one parameter per value.
    public var resources: [String] = []

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
            && a.clientAssertion == b.clientAssertion && a.audiences == b.audiences && a.resources == b.resources
    }

    /// Parameter names the codec writes itself; `extraParameters` may not repeat them.
    public static let reservedParameterNames: Set<String> = [
        "grant_type", "client_id", "client_secret", "refresh_token", "username", "password", "scope",
        "code", "redirect_uri", "code_verifier", "device_code", "client_assertion", "client_assertion_type",
        "assertion", "subject_token", "subject_token_type", "actor_token", "actor_token_type", "requested_token_type",
    ]

    /// Why a request could not be encoded (a configuration problem, never retried).
    public struct EncodingError: Error, Sendable, Equatable, CustomStringConvertible {
        /// Stable dotted reason: `token.missing_client_secret`, `token.reserved_parameter`.
        public let reason: String
        public let detail: String
        public var description: String { "\(reason): \(detail)" }
    }

    /// Encodes the request as `POST` body and headers (RFC 6749 §4.3.2, §4.4.2, §6 and
    /// Appendix B; RFC 7523 §2.1; RFC 8693 §2.1; RFC 8707 §2). Body parameter order:
    /// `grant_type`, grant parameters, `scope`, `audience`s, `resource`s, client parameters
    /// (post / none / assertions), extra parameters.
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
        case .jwtBearer(let assertion):
            pairs.append(("assertion", assertion.exposedValue))
        case .tokenExchange(let exchange):
            if let requested = exchange.requestedTokenType { pairs.append(("requested_token_type", requested)) }
            pairs.append(("subject_token", exchange.subjectToken.exposedValue))
            pairs.append(("subject_token_type", exchange.subjectTokenType))
            if let actor = exchange.actorToken {
                pairs.append(("actor_token", actor.exposedValue))
                // RFC 8693 §2.1: actor_token_type is REQUIRED when actor_token is present.
                pairs.append(("actor_token_type", exchange.actorTokenType ?? TokenExchange.jwtType))
            }
        }
        if let scope, !scope.isEmpty { pairs.append(("scope", scope)) }
        for audience in audiences { pairs.append(("audience", audience)) }
        for resource in resources { pairs.append(("resource", resource)) }
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
            // A grant that is itself a credential (jwt_bearer, token_exchange) may have no client.
            if !clientID.isEmpty { pairs.append(("client_id", clientID)) }
        case .clientAssertion:
            guard let assertion = clientAssertion else {
                throw EncodingError(reason: "token.missing_client_assertion", detail: "client_assertion needs the JWT of client_assertion_file")
            }
            if !clientID.isEmpty { pairs.append(("client_id", clientID)) }
            pairs.append(("client_assertion_type", ClientAssertion.type))
            pairs.append(("client_assertion", assertion.exposedValue))
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
