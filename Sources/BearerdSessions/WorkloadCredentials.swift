import BearerdOAuth
import BearerdConfig

/// Keyless workload identity (docs/architecture.md §4 `jwt_bearer`, `token_exchange`, `client_assertion`,
/// `audience`, `resource`; docs/architecture.md §6.10): the token request of a
/// session with its credential files read now, and the checks of an exchange's response.
extension SessionSettings {
    /// Reads one credential file by path (never cached: Kubernetes swaps a `..data` symlink).
    /// A JWT credential that is empty, not a JWT, or expired (its unverified `exp`) is a
    /// transient failure naming the key and path, never sent; it recovers as soon as the file
    /// holds a valid JWT again.
    static func readCredential(key: String, path: String, mustBeJWT: Bool,
                               wallClockNow: Int64) -> Result<OAuthSecret, TokenEndpointFailure> {
        let text: String
        do throws(ConfigError) {
            text = try ConfigLoader.resolveSecret(.file(path), environment: [:]).value
        } catch {
            return .failure(TokenEndpointFailure(classification: .retryable, reason: "credential.unreadable",
                                                 errorDescription: "\(key) \(error.message)"))
        }
        let token = CredentialJWT.trimmed(text)
        if mustBeJWT, let problem = CredentialJWT.problem(content: token, wallClockNow: wallClockNow) {
            return .failure(TokenEndpointFailure(classification: .retryable, reason: problem.reason,
                                                 errorDescription: "\(key) \(path): \(problem)"))
        }
        if token.isEmpty {
            return .failure(TokenEndpointFailure(classification: .retryable, reason: "credential.empty",
                                                 errorDescription: "\(key) \(path): the file is empty"))
        }
        return .success(OAuthSecret(token))
    }

    /// Token types whose tokens are JWTs (RFC 8693 §3), checked like assertions.
    static func isJWTType(_ type: String?) -> Bool {
        type == nil || type == TokenRequest.TokenExchange.jwtType || type == TokenRequest.TokenExchange.idTokenType
    }

    /// The token request with everything read now: `assertion_file` (jwt_bearer), the subject
    /// and actor tokens (token_exchange; `subjectToken` is the subject session's token when the
    /// session chains), `client_assertion_file`, `audience`s and `resource`s.
    ///
    /// `callerToken`: on behalf of callers (docs/architecture.md §6.16), the incoming request's
    /// own bearer token, sent as the subject token (`subject: caller`) or the assertion
    /// (`assertion: caller`); never read from or written to anywhere else.
    func preparedRequest(refreshToken: OAuthSecret?, subjectToken: OAuthSecret? = nil, callerToken: OAuthSecret? = nil,
                         wallClockNow: Int64 = wallClockSeconds()) -> Result<TokenRequest, TokenEndpointFailure> {
        var request = tokenRequest(refreshToken: refreshToken)
        request.audiences = config.audiences
        request.resources = config.resources
        if config.grant == .jwtBearer, config.onBehalfOf != nil {
            guard let callerToken else {
                return .failure(TokenEndpointFailure(classification: .permanent, reason: "credential.caller_missing",
                                                     errorDescription: "assertion: caller needs a caller's token"))
            }
            request.grant = .jwtBearer(assertion: callerToken)
        } else if config.grant == .jwtBearer, let path = config.assertionFile {
            switch Self.readCredential(key: "assertion_file", path: path, mustBeJWT: true, wallClockNow: wallClockNow) {
            case .success(let assertion): request.grant = .jwtBearer(assertion: assertion)
            case .failure(let f): return .failure(f)
            }
        }
        if config.grant == .tokenExchange, let exchange = config.exchange {
            let subject: OAuthSecret
            switch exchange.subject {
            case .file(let path):
                switch Self.readCredential(key: "subject_token_file", path: path, mustBeJWT: Self.isJWTType(exchange.subjectTokenType),
                                           wallClockNow: wallClockNow) {
                case .success(let token): subject = token
                case .failure(let f): return .failure(f)
                }
            case .session(let name):
                guard let subjectToken else {
                    return .failure(TokenEndpointFailure(classification: .retryable, reason: "credential.subject_unavailable",
                                                         errorDescription: "subject_session \(name) has no token"))
                }
                subject = subjectToken
            case .caller:
                guard let callerToken else {
                    return .failure(TokenEndpointFailure(classification: .permanent, reason: "credential.caller_missing",
                                                         errorDescription: "subject: caller needs a caller's token"))
                }
                subject = callerToken
            }
            var actor: OAuthSecret?
            if let path = exchange.actorTokenFile {
                switch Self.readCredential(key: "actor_token_file", path: path, mustBeJWT: Self.isJWTType(exchange.actorTokenType),
                                           wallClockNow: wallClockNow) {
                case .success(let token): actor = token
                case .failure(let f): return .failure(f)
                }
            }
            request.grant = .tokenExchange(.init(subjectToken: subject, subjectTokenType: exchange.subjectTokenType,
                                                 actorToken: actor, actorTokenType: actor == nil ? nil : exchange.actorTokenType,
                                                 requestedTokenType: exchange.requestedTokenType))
        }
        if config.clientAuth == .clientAssertion, let path = config.clientAssertionFile {
            switch Self.readCredential(key: "client_assertion_file", path: path, mustBeJWT: true, wallClockNow: wallClockNow) {
            case .success(let assertion): request.clientAssertion = assertion
            case .failure(let f): return .failure(f)
            }
        }
        return .success(request)
    }

    /// RFC 8693 §2.2.1 checks of an exchange's answer: `issued_token_type` must be the
    /// `requested_token_type` when one was asked for; `token_type` `N_A` (a token that is not an
    /// OAuth access token) only where every route using the session says how to send it
    /// (`inject:`). Nil when the grant may be used.
    func exchangeProblem(_ grant: TokenGrant) -> TokenEndpointFailure? {
        guard config.grant == .tokenExchange else { return nil }
        if let requested = config.exchange?.requestedTokenType, grant.issuedTokenType != requested {
            return TokenEndpointFailure(classification: .permanent, reason: "token.issued_token_type_mismatch",
                                        errorDescription: "requested_token_type is \(requested) but the server issued "
                                            + (grant.issuedTokenType ?? "no issued_token_type"))
        }
        if grant.tokenType == TokenResponseParser.notApplicableTokenType, !routesInject {
            return TokenEndpointFailure(classification: .permanent, reason: "token.token_type_not_applicable",
                                        errorDescription: "the server issued a token of token_type N_A (not an OAuth access token, RFC 8693 §2.2.1): "
                                            + "set inject: on every route using session \(config.name) to say how it is sent")
        }
        return nil
    }

    /// What the token request's identity depends on beyond grant, URL, client and scope
    /// (`bearerd token`'s cache binding): audiences, resources, the subject source and the
    /// exchange's token types. Empty for sessions without these keys.
    static func workloadIdentity(_ s: SessionConfig) -> String {
        var parts: [String] = []
        if !s.audiences.isEmpty { parts.append("audience=" + s.audiences.joined(separator: "\u{1F}")) }
        if !s.resources.isEmpty { parts.append("resource=" + s.resources.joined(separator: "\u{1F}")) }
        if let a = s.assertionFile { parts.append("assertion_file=" + a) }
        if let c = s.clientAssertionFile { parts.append("client_assertion_file=" + c) }
        if let e = s.exchange {
            switch e.subject {
            case .file(let p): parts.append("subject_token_file=" + p)
            case .session(let n): parts.append("subject_session=" + n)
            case .caller: parts.append("subject=caller")
            }
            parts.append("subject_token_type=" + e.subjectTokenType)
            if let a = e.actorTokenFile { parts.append("actor_token_file=" + a + "|" + (e.actorTokenType ?? "")) }
            if let r = e.requestedTokenType { parts.append("requested_token_type=" + r) }
        }
        return parts.joined(separator: "\n")
    }
}
