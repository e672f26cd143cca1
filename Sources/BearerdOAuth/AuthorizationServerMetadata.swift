/// What an authorization server publishes about itself (RFC 8414; OIDC Discovery 1.0), the
/// members bearerd uses. Pure: the caller fetches the document.
///
/// `issuer` must equal the configured issuer exactly (RFC 8414 §3.3, OIDC Discovery §4.3): a
/// document that names another issuer is refused, whatever URL it came from.
public struct AuthorizationServerMetadata: Sendable, Equatable {
    public var issuer: String
    public var tokenEndpoint: String
    public var authorizationEndpoint: String?
    public var deviceAuthorizationEndpoint: String?
    /// `token_endpoint_auth_methods_supported`; nil when absent (RFC 8414 §2: then
    /// `client_secret_basic` is the default).
    public var tokenEndpointAuthMethods: [String]?
    public var codeChallengeMethods: [String]?

    public struct Problem: Error, Sendable, Equatable, CustomStringConvertible {
        /// `discovery.malformed`, `discovery.missing_field`, `discovery.issuer_mismatch`, `discovery.insecure_endpoint`.
        public var reason: String
        public var message: String
        public var description: String { message }
    }

    /// The well-known URLs to try, in order: RFC 8414 §3.1 (the well-known segment inserted
    /// between host and path), then OIDC Discovery §4 (appended to the issuer).
    public static func wellKnownURLs(issuer: String) -> [String] {
        let trimmed = issuer.hasSuffix("/") ? String(issuer.dropLast()) : issuer
        guard let schemeEnd = trimmed.firstRange(of: "://") else { return [] }
        let afterScheme = trimmed[schemeEnd.upperBound...]
        let slash = afterScheme.firstIndex(of: "/") ?? afterScheme.endIndex
        let origin = trimmed[..<slash]
        let path = trimmed[slash...]
        return [origin + "/.well-known/oauth-authorization-server" + path, trimmed + "/.well-known/openid-configuration"]
    }

    /// Parses and checks a metadata document fetched for `expectedIssuer`.
    public static func parse(_ body: [UInt8], expectedIssuer: String) throws(Problem) -> AuthorizationServerMetadata {
        guard let value = try? JSONParser(maxDepth: 8, maxBytes: 1 << 20).parse(body), let o = value.objectValue else {
            throw Problem(reason: "discovery.malformed", message: "the metadata document is not a JSON object")
        }
        func string(_ k: String) -> String? { o[k]?.stringValue.flatMap { $0.isEmpty ? nil : $0 } }
        func strings(_ k: String) -> [String]? {
            guard case .array(let items)? = o[k] else { return nil }
            return items.compactMap(\.stringValue)
        }
        guard let issuer = string("issuer") else {
            throw Problem(reason: "discovery.missing_field", message: "the metadata document has no issuer")
        }
        // RFC 8414 §3.3: identical (a trailing slash is a different issuer; be lenient only there).
        func norm(_ s: String) -> String { s.hasSuffix("/") ? String(s.dropLast()) : s }
        guard norm(issuer) == norm(expectedIssuer) else {
            throw Problem(reason: "discovery.issuer_mismatch",
                          message: "the metadata names issuer \(issuer), not the configured \(expectedIssuer) (RFC 8414 §3.3)")
        }
        guard let token = string("token_endpoint") else {
            throw Problem(reason: "discovery.missing_field", message: "the metadata document has no token_endpoint")
        }
        let meta = AuthorizationServerMetadata(
            issuer: issuer, tokenEndpoint: token, authorizationEndpoint: string("authorization_endpoint"),
            deviceAuthorizationEndpoint: string("device_authorization_endpoint"),
            tokenEndpointAuthMethods: strings("token_endpoint_auth_methods_supported"),
            codeChallengeMethods: strings("code_challenge_methods_supported"))
        // An https issuer may not send us to cleartext endpoints.
        if expectedIssuer.hasPrefix("https://") {
            for e in [meta.tokenEndpoint, meta.authorizationEndpoint, meta.deviceAuthorizationEndpoint].compactMap({ $0 }) where !e.hasPrefix("https://") {
                throw Problem(reason: "discovery.insecure_endpoint", message: "the https issuer lists a non-https endpoint \(e)")
            }
        }
        return meta
    }
}

/// RFC 7636: the PKCE pair of one authorization request (S256). Pure: randomness is an argument.
public struct PKCE: Sendable, Equatable {
    public let verifier: OAuthSecret
    public let challenge: String
    public static let method = "S256"

    /// `random`: at least 32 random bytes (RFC 7636 §4.1: 43–128 characters once encoded).
    public init(random: [UInt8]) {
        let v = Base64.encodeURL(random)
        verifier = OAuthSecret(v)
        challenge = Base64.encodeURL(SHA256.hash(Array(v.utf8)))
    }
}

/// OpenID Connect Core §3.1.2.1 / §3.1.3.7: the `nonce` of a sign-in whose scope contains
/// `openid`, sent in the authorization request and expected back in the `id_token`. Pure:
/// randomness is an argument.
public struct OpenIDNonce: Sendable, Equatable {
    public let value: String

    /// `random`: at least 16 random bytes.
    public init(random: [UInt8]) {
        value = Base64.encodeURL(random)
    }

    /// True when the space-separated `scope` asks for OpenID Connect (the `openid` value).
    public static func isRequested(scope: String?) -> Bool {
        scope?.split(separator: " ").contains("openid") ?? false
    }

    public struct Mismatch: Error, Sendable, Equatable, CustomStringConvertible {
        public var description: String
    }

    /// Checks the `nonce` claim of an `id_token` (a compact JWS) against this one.
    ///
    /// Only the payload is read: the id_token's signature is NOT verified here. bearerd received
    /// it directly from the token endpoint over the connection it opened (OIDC Core §3.1.3.7
    /// item 6 allows TLS server validation instead of a signature check for this case) and uses
    /// it for nothing but this replay check: the access and refresh tokens are what it keeps.
    public func check(idToken: String) throws(Mismatch) {
        let parts = idToken.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let payload = Base64.decodeURL(String(parts[1])),
              let claims = (try? JSONParser(maxDepth: 16, maxBytes: 64 * 1024).parse(payload))?.objectValue else {
            throw Mismatch(description: "the id_token is not a readable JWT")
        }
        guard let nonce = claims["nonce"]?.stringValue else {
            throw Mismatch(description: "the id_token carries no nonce, though this sign-in sent one (OpenID Connect Core §3.1.3.7)")
        }
        // Not secret, but compare without an early exit anyway.
        let a = Array(nonce.utf8), b = Array(value.utf8)
        var diff = UInt8(a.count == b.count ? 0 : 1)
        for i in 0..<min(a.count, b.count) { diff |= a[i] ^ b[i] }
        guard diff == 0 else {
            throw Mismatch(description: "the id_token's nonce does not match this sign-in (a replayed or substituted token)")
        }
    }
}
