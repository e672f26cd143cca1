import BearerdOAuth
import BearerdTLS
import BearerdConfig

/// One session's configuration with its secrets read and its TLS context built: everything a
/// `TokenSessionDriver` needs to make a token request. Built off the loops (start-up, SIGHUP,
/// `bearerd token`); replaced whole on reload.
///
/// Holds secrets only as `OAuthSecret` (prints redacted).
struct SessionSettings {
    var config: SessionConfig
    var clientSecret: OAuthSecret?
    var password: OAuthSecret?
    /// For `https` token URLs: verification as for upstreams (docs/architecture.md §2.3), ALPN `http/1.1`.
    var tlsContext: TLSContext?
    /// refresh_token sessions: the current content of `refresh_token_file` (nil when the file
    /// cannot be read: the state file may still hold a rotated token).
    var operatorRefreshToken: OAuthSecret?
    /// Why `operatorRefreshToken` is nil although a file is configured (for logs).
    var operatorFileProblem: String?
    /// `client_auth: private_key_jwt`: the key that signs each request's client assertion.
    var signer: JWTSigner?
    /// `outbound_proxy:` towards the token endpoint, if any.
    var proxy: OutboundProxy.Endpoint?
    /// token_exchange: every route using this session sets `inject:`, so a token of type `N_A`
    /// (RFC 8693 §2.2.1, not an OAuth access token) can be sent as those routes say.
    var routesInject = true
    /// `dpop: true`: the session's key and nonces (RFC 9449). Kept across reloads by the driver
    /// while the key stays the same.
    var dpop: DPoPProofer?
    /// The skew observed from the token endpoint's `Date` (kept across reloads by the driver).
    var clockSkew = ClockSkew()
    /// `sinks:` with the header and token type they are written with (nil: the session's sinks, Bearer).
    var sinkPlan: TokenSinkPlan?

    var operatorFingerprint: String? { operatorRefreshToken?.fingerprint }

    var grantKind: TokenSession.GrantKind {
        switch config.grant {
        // exec: no refresh token, a new token on every fetch, like client_credentials.
        case .clientCredentials, .exec, .jwtBearer, .tokenExchange, .aws, .aliyun: .clientCredentials
        // A person's session, once `bearerd login` stored its refresh token, is a refresh_token session.
        case .refreshToken, .authorizationCode, .deviceCode: .refreshToken
        case .password: .password
        }
    }

    /// `SessionConfig` → the state machine's policy: `refresh_before`, `wait_timeout`,
    /// `request_timeout` (the shared request's own timeout); every other number is docs/architecture.md §6's default.
    var policy: TokenSession.Policy {
        var p = TokenSession.Policy(grant: grantKind, refreshBefore: config.refreshBefore)
        p.waitTimeout = config.waitTimeout
        p.fetchTimeout = config.requestTimeout
        return p
    }

    /// `default_lifetime` for responses without `expires_in` and without a JWT `exp`.
    var responseParser: TokenResponseParser {
        var parser = TokenResponseParser(defaultLifetime: config.defaultLifetime, maxBodyBytes: TokenEndpointClient.maxBodyBytes)
        parser.acceptsNotApplicableTokenType = config.grant == .tokenExchange
        parser.requiresDPoP = config.dpop
        return parser
    }

    /// The token request of this session's grant (RFC 6749 §4.3.2, §4.4.2, §6).
    func tokenRequest(refreshToken: OAuthSecret?) -> TokenRequest {
        let grant: TokenRequest.Grant
        switch config.grant {
        case .clientCredentials, .exec, .aws, .aliyun: grant = .clientCredentials  // never sent: exec and signing sessions have their own fetch
        case .refreshToken, .authorizationCode, .deviceCode: grant = .refreshToken(refreshToken ?? OAuthSecret(""))
        case .password: grant = .password(username: config.username ?? "", password: password ?? OAuthSecret(""))
        // The credentials are read per request (`preparedRequest`); these are placeholders.
        case .jwtBearer: grant = .jwtBearer(assertion: OAuthSecret(""))
        case .tokenExchange: grant = .tokenExchange(.init(subjectToken: OAuthSecret(""), subjectTokenType: TokenRequest.TokenExchange.jwtType))
        }
        var request = TokenRequest(grant: grant, clientID: config.clientID, clientSecret: clientSecret,
                                   clientAuthentication: config.clientAuth, scope: config.scope, extraParameters: config.params)
        if let signer {
            request.clientAssertion = clientAssertion(signer)
        }
        return request
    }

    /// `request` as sent again: a new client assertion (new `jti`, `iat` from the skew now in
    /// effect) when bearerd signs one; anything else unchanged.
    func resigned(_ request: TokenRequest) -> TokenRequest {
        guard let signer, request.clientAssertion != nil else { return request }
        var r = request
        r.clientAssertion = clientAssertion(signer)
        return r
    }

    /// A fresh RFC 7523 assertion for the token endpoint (new `jti`, 60 s). Nil when signing
    /// fails (the encode then refuses the request: `token.missing_client_assertion`).
    private func clientAssertion(_ signer: JWTSigner) -> OAuthSecret? {
        var g = SystemRandomNumberGenerator()
        let jti = Base64.encodeURL((0..<16).map { _ in UInt8.random(in: 0...255, using: &g) })
        let input = ClientAssertion.signingInput(algorithm: signer.algorithm, keyID: config.clientKeyID ?? signer.jwk.thumbprint,
                                                 clientID: config.clientID,
                                                 audience: config.tokenURL.description, jti: jti,
                                                 now: clockSkew.issuedAt(localNow: wallClockSeconds()))
        guard let signature = try? signer.sign(Array(input.utf8)) else { return nil }
        return OAuthSecret(ClientAssertion.assemble(signingInput: input, signature: signature))
    }

    /// True when a reload changed anything that could change the server's answer.
    func credentialsDiffer(from other: SessionSettings) -> Bool {
        config != other.config || clientSecret != other.clientSecret || password != other.password
            || operatorFingerprint != other.operatorFingerprint
    }

    /// True when what a token is issued for changed (so a held token no longer fits): token
    /// URL, client, client authentication, scope, extra parameters, user name or TLS settings.
    /// Refresh timing and secrets alone do not count.
    func identityDiffers(from other: SessionSettings) -> Bool {
        let a = config, b = other.config
        return a.tokenURL != b.tokenURL || a.clientID != b.clientID || a.clientAuth != b.clientAuth || a.scope != b.scope
            || !a.params.elementsEqual(b.params, by: { $0 == $1 }) || a.username != b.username || a.tls != b.tls
            || a.grant != b.grant || a.audiences != b.audiences || a.resources != b.resources || a.exchange != b.exchange
            || a.assertionFile != b.assertionFile || a.clientAssertionFile != b.clientAssertionFile
            || a.signing != b.signing  // another role, source or region: the held keys are not for it
    }

    /// Reads the session's secrets now (client secret, password, refresh token file) and builds
    /// its TLS context. Errors are located like the loader's (`FILE:LINE: key: what is wrong`)
    /// and never carry a secret.
    static func resolve(_ session: SessionConfig, in config: BearerdConfig,
                        environment: [String: String]) throws(ConfigErrors) -> SessionSettings {
        var errors: [ConfigError] = []
        var clientSecret: OAuthSecret?
        var password: OAuthSecret?
        do throws(ConfigErrors) {
            let secrets = try ConfigLoader.resolveSecrets(of: session, in: config, environment: environment)
            clientSecret = secrets.clientSecret.map { OAuthSecret($0.value) }
            password = secrets.password.map { OAuthSecret($0.value) }
        } catch {
            errors += error.errors
        }
        var tlsContext: TLSContext?
        // A signing session's keys come from its STS or vending endpoint (docs/architecture.md §6.15).
        let endpoint = session.grant.isSigning ? session.credentialsEndpoint : session.tokenURL
        if endpoint?.isTLS == true {
            do throws(TLSError) {
                tlsContext = try TLSContext.client(caFile: session.tls?.caFile, clientCert: session.tls?.clientCert,
                                                   clientKey: session.tls?.clientKey, alpn: ["http/1.1"])
            } catch {
                errors.append(ConfigError(file: config.file, line: session.line, key: "sessions.\(session.name).tls",
                                          message: error.message))
            }
        }
        var operatorToken: OAuthSecret?
        var problem: String?
        if session.grant == .refreshToken, let path = session.refreshTokenFile {
            do throws(ConfigError) {
                operatorToken = OAuthSecret(try ConfigLoader.resolveSecret(.file(path), environment: environment).value)
            } catch {
                // Not fatal: the state file may hold a rotated refresh token. The driver says
                // so if neither is usable.
                problem = error.message
            }
        }
        var signer: JWTSigner?
        if session.clientAuth == .privateKeyJWT, let keyFile = session.clientKeyFile {
            do throws(TLSError) {
                signer = try JWTSigner(pemFile: keyFile)
            } catch {
                errors.append(ConfigError(file: config.file, line: session.line, key: "sessions.\(session.name).client_key_file",
                                          message: error.message))
            }
        }
        let clockSkew = ClockSkew()
        var dpop: DPoPProofer?
        if session.dpop {
            do throws(DPoPProofer.KeyProblem) {
                dpop = try DPoPProofer.load(session, stateDir: config.stateDir, clockSkew: clockSkew)
            } catch {
                let key: String
                switch error {
                case .unusable(let k, _): key = k == "state_dir" ? "state_dir" : "sessions.\(session.name).\(k)"
                case .store: key = "state_dir"
                }
                errors.append(ConfigError(file: config.file, line: session.line, key: key, message: error.description))
            }
        }
        guard errors.isEmpty else { throw ConfigErrors(errors) }
        var settings = SessionSettings(config: session, clientSecret: clientSecret, password: password, tlsContext: tlsContext,
                                       operatorRefreshToken: operatorToken, operatorFileProblem: problem, signer: signer,
                                       proxy: endpoint.flatMap { config.outboundProxy.endpoint(scheme: $0.scheme, host: $0.host, port: $0.port) })
        settings.routesInject = config.routes.allSatisfy { $0.session != session.name || $0.injectConfigured }
        settings.dpop = dpop
        settings.clockSkew = clockSkew
        settings.sinkPlan = TokenSinkPlan(session, in: config)
        return settings
    }
}

extension JWTSigner {
    /// The signer's public key as a JWK (RFC 7517); its thumbprint is the default `kid`.
    var jwk: PublicJWK {
        switch publicNumbers {
        case .rsa(let n, let e): .rsa(n: n, e: e)
        case .p256(let x, let y): .ec(crv: "P-256", x: x, y: y)
        }
    }
}

/// What `bearerd check` tells about a `private_key_jwt` session's key: the `kid` its assertions
/// carry (`client_key_id`, else the key's RFC 7638 thumbprint) and the public JWK to register.
public struct ClientKeyDescription: Sendable {
    public var kid: String
    public var thumbprint: String
    public var publicJWK: String

    /// Nil for sessions without `private_key_jwt`; a failure says why the key cannot be read.
    public static func of(_ session: SessionConfig) -> Result<ClientKeyDescription, TLSError>? {
        guard session.clientAuth == .privateKeyJWT, let file = session.clientKeyFile else { return nil }
        do throws(TLSError) {
            let signer = try JWTSigner(pemFile: file)
            let jwk = signer.jwk
            let kid = session.clientKeyID ?? jwk.thumbprint
            return .success(ClientKeyDescription(kid: kid, thumbprint: jwk.thumbprint, publicJWK: jwk.registration(kid: kid, alg: signer.algorithm)))
        } catch {
            return .failure(error)
        }
    }
}

extension String {
    /// Every occurrence of `target` (non-empty) replaced by `replacement`; stdlib only.
    func replacingAll(_ target: String, with replacement: String) -> String {
        guard !target.isEmpty else { return self }
        var out = ""
        var rest = Substring(self)
        while let r = rest.firstRange(of: target) {
            out += rest[..<r.lowerBound]
            out += replacement
            rest = rest[r.upperBound...]
        }
        return out + rest
    }
}
