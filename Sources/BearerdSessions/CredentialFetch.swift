import BearerdConfig
import BearerdIO
import BearerdOAuth
import BearerdProxyCore
import BearerdTLS
import Dispatch
import Logging

/// One fetch of a signing session's keys (`grant: aws`, `grant: aliyun`; docs/architecture.md
/// §6.15), from the session's `credentials:` source, as a token grant: the keys written as
/// `credential_process` JSON (`TemporaryCredentials.encodedAsToken`) with the lifetime from their
/// `Expiration` (wall clock now → Expiration; `default_lifetime` for keys without one, so static
/// files are read again that often). The session driver hands the result to `finishFetch` like
/// any token answer, so margins, coalescing, retries, the breaker, persistence, the shared cache,
/// metrics and logs all apply.
///
/// Owns nothing beyond the fetch in progress: the HTTP client of an STS or vending request
/// (cancelled through the handle `start` returns) or the helper run on a global queue.
/// Runs on the session queue; `done` is called exactly once, on that queue. Every file
/// (projected token, key files, `url_token_file`) is opened by path for this fetch and never
/// cached (docs/architecture.md §6.10). Neither a secret, nor a session token, nor a presented
/// web identity token is ever logged or put into a failure's text (a server echoing one back
/// has it cut: `redacting`).
struct CredentialFetch {
    let settings: SessionSettings
    let signing: SigningCredentialsConfig
    let queue: EventLoop
    let clock: any SessionClock
    /// The session's logger (a helper's stderr, scrubbed).
    let logger: Logger

    init?(settings: SessionSettings, queue: EventLoop, clock: any SessionClock, logger: Logger) {
        guard let signing = settings.config.signing else { return nil }
        self.settings = settings
        self.signing = signing
        self.queue = queue
        self.clock = clock
        self.logger = logger
    }

    typealias Done = (Result<TokenGrant, TokenEndpointFailure>, _ requestSent: Bool) -> Void

    /// Whether this source makes a request (STS, vending endpoint, helper): counted in
    /// `bearerd_token_requests_total`. Reading static files is not a request.
    var sendsRequest: Bool {
        if case .staticKeys = signing.source { return false }
        return true
    }

    /// Starts the fetch. Returns the HTTP client while a request is in flight (so the driver can
    /// cancel it on its timeout or at stop), nil otherwise.
    func start(_ done: @escaping Done) -> TokenEndpointClient? {
        let now = clock.wallClockSeconds()
        switch signing.source {
        case .webIdentity(let w):
            let token: OAuthSecret
            switch SessionSettings.readCredential(key: "credentials.web_identity.token_file", path: w.tokenFile, mustBeJWT: true, wallClockNow: now) {
            case .success(let t): token = t
            case .failure(let f): done(.failure(f), false); return nil
            }
            let form: EncodedTokenRequest
            do throws(CredentialsError) {
                form = try STSRequestForm.assumeRoleWithWebIdentity(roleARN: w.roleARN, sessionName: w.sessionName, webIdentityToken: token,
                                                                    durationSeconds: w.durationSeconds)
            } catch {
                done(.failure(Self.localFailure(error)), false); return nil
            }
            return post(form, to: signing.stsURL, done) { status, headers, body in
                Self.classify(status: status, headers: headers, body: body, wallClockNow: clock.wallClockSeconds()) { () throws(CredentialsError) in
                    try TemporaryCredentials.fromSTSXML(body, action: .assumeRoleWithWebIdentity, redacting: [token])
                }
            }

        case .assumeRole(let a):
            let keys: TemporaryCredentials
            switch Self.readKeys(a.keys, prefix: "credentials.assume_role", wallClockNow: now) {
            case .success(let k): keys = k
            case .failure(let f): done(.failure(f), false); return nil
            }
            let form: EncodedTokenRequest
            do throws(CredentialsError) {
                form = try STSRequestForm.assumeRole(roleARN: a.roleARN, sessionName: a.sessionName, externalID: a.externalID,
                                                     durationSeconds: a.durationSeconds)
            } catch {
                done(.failure(Self.localFailure(error)), false); return nil
            }
            let url = signing.stsURL
            // SigV4, service `sts`, the session's region (the AWS "Signature Version 4" rules, as
            // `RequestSigning` implements them for every request bearerd signs).
            let signed = RequestSigning.sign(
                method: "POST", target: url.requestTarget, host: url.authority, headers: form.headers,
                scheme: .awsV4(region: signing.region, service: "sts"),
                credentials: .init(accessKeyID: keys.accessKeyID, secretAccessKey: keys.secret.exposedValue,
                                   sessionToken: keys.sessionToken?.exposedValue),
                payload: .hashed(RequestSigning.hex(Digest.sha256(form.body))), epochSeconds: now, crypto: SigningCrypto.shared)
            let s: RequestSigning.Signed
            switch signed {
            case .success(let v): s = v
            case .failure(let e):
                done(.failure(TokenEndpointFailure(classification: .permanent, reason: "credentials.sign_failed",
                                                   errorDescription: "cannot sign the AssumeRole request for \(url): \(e.reason)")), false)
                return nil
            }
            let headers = form.headers.filter { !s.remove.contains($0.name.lowercased()) } + s.add
            let target = s.target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
            let signedURL = EndpointURL(scheme: url.scheme, host: url.host, port: url.port, path: target.first.map(String.init) ?? "/",
                                        query: target.count > 1 ? String(target[1]) : nil)
            return post(EncodedTokenRequest(body: form.body, headers: headers), to: signedURL, done) { status, responseHeaders, body in
                Self.classify(status: status, headers: responseHeaders, body: body, wallClockNow: clock.wallClockSeconds()) { () throws(CredentialsError) in
                    try TemporaryCredentials.fromSTSXML(body, action: .assumeRole, redacting: [keys.secret] + (keys.sessionToken.map { [$0] } ?? []))
                }
            }

        case .url(let v):
            var headers = v.headers.map { (name: $0.name, value: $0.value) }
            var sent: [OAuthSecret] = []
            if let path = v.tokenFile {
                switch SessionSettings.readCredential(key: "credentials.url_token_file", path: path, mustBeJWT: false, wallClockNow: now) {
                case .success(let t):
                    headers.removeAll { $0.name.lowercased() == "authorization" }
                    headers.append((name: "Authorization", value: t.exposedValue))
                    sent.append(t)
                case .failure(let f): done(.failure(f), false); return nil
                }
            }
            let url = v.url
            let timeout = settings.config.requestTimeout
            let client = TokenEndpointClient.get(url, headers: headers, tls: settings.tlsContext,
                                                 proxy: settings.proxy, on: queue) { outcome in
                done(Self.answer(outcome, parse: { status, responseHeaders, body in
                    Self.classify(status: status, headers: responseHeaders, wallClockNow: clock.wallClockSeconds(),
                                  vending: true) { () throws(CredentialsError) in
                        try TemporaryCredentials.fromVendingURLJSON(body)
                    }
                }, defaultLifetime: settings.config.defaultLifetime, now: clock.wallClockSeconds()), outcome.requestWasSent)
            }
            clock.schedule(after: timeout, on: queue) { [weak client] in client?.cancel(detail: "credentials request timed out after \(timeout)") }
            return client

        case .exec(let argv):
            let timeout = settings.config.commandTimeout
            let program = argv.first ?? "?"
            let defaultLifetime = settings.config.defaultLifetime
            let queue = self.queue, clock = self.clock, logger = self.logger
            DispatchQueue.global().async {
                let outcome = CommandRunner.run(argv, timeout: timeout)
                queue.execute {
                    TokenSessionDriver.logHelperStderr(outcome, program: program, what: "credentials command", logger: logger)
                    let result: Result<TokenGrant, TokenEndpointFailure>
                    switch CommandRunner.judged(outcome, program: program, timeout: timeout, kind: "credentials") {
                    case .failure(let f):
                        result = .failure(f)
                    case .success(let o):
                        do throws(CredentialsError) {
                            let c = try TemporaryCredentials.fromCredentialProcessJSON(o.stdout)
                            result = Self.grant(c, wallClockNow: clock.wallClockSeconds(), defaultLifetime: defaultLifetime)
                        } catch {
                            // A helper printing something else is broken now; it may be fixed: transient.
                            result = .failure(TokenEndpointFailure(classification: .retryable, reason: error.reason,
                                                                   errorDescription: "\(program): \(error.description)"))
                        }
                    }
                    done(result, true)
                }
            }
            return nil

        case .staticKeys(let k):
            switch Self.readKeys(k, prefix: "credentials.static", wallClockNow: now) {
            case .success(let keys): done(Self.grant(keys, wallClockNow: now, defaultLifetime: settings.config.defaultLifetime), false)
            case .failure(let f): done(.failure(f), false)
            }
            return nil

        case .oidcRole(let o):
            let token: OAuthSecret
            switch SessionSettings.readCredential(key: "credentials.oidc_role.token_file", path: o.tokenFile, mustBeJWT: true, wallClockNow: now) {
            case .success(let t): token = t
            case .failure(let f): done(.failure(f), false); return nil
            }
            let split: (query: String, request: EncodedTokenRequest)
            do throws(CredentialsError) {
                split = try STSRequestForm.aliyunAssumeRoleWithOIDCSplit(roleARN: o.roleARN, oidcProviderARN: o.oidcProviderARN, oidcToken: token,
                                                                         sessionName: o.sessionName, durationSeconds: o.durationSeconds, timestamp: now)
            } catch {
                done(.failure(Self.localFailure(error)), false); return nil
            }
            let sts = signing.stsURL
            let url = EndpointURL(scheme: sts.scheme, host: sts.host, port: sts.port, path: sts.path.isEmpty ? "/" : sts.path,
                                  query: (sts.query.map { $0 + "&" } ?? "") + split.query)
            return post(split.request, to: url, done) { status, headers, body in
                Self.classify(status: status, headers: headers, wallClockNow: clock.wallClockSeconds()) { () throws(CredentialsError) in
                    try TemporaryCredentials.fromAliyunSTSJSON(body, redacting: [token])
                }
            }
        }
    }

    /// POSTs `request` to `url` with the session's TLS settings and outbound proxy, bounded by
    /// `request_timeout`; `parse` classifies a complete answer.
    private func post(_ request: EncodedTokenRequest, to url: EndpointURL, _ done: @escaping Done,
                      parse: @escaping (Int, [(name: String, value: String)], [UInt8]) -> Result<TemporaryCredentials, TokenEndpointFailure>) -> TokenEndpointClient {
        let timeout = settings.config.requestTimeout
        let defaultLifetime = settings.config.defaultLifetime
        let clock = self.clock
        let client = TokenEndpointClient.post(request, to: url, tls: settings.tlsContext, proxy: settings.proxy, on: queue) { outcome in
            done(Self.answer(outcome, parse: parse, defaultLifetime: defaultLifetime, now: clock.wallClockSeconds()), outcome.requestWasSent)
        }
        clock.schedule(after: timeout, on: queue) { [weak client] in client?.cancel(detail: "credentials request timed out after \(timeout)") }
        return client
    }

    // MARK: Classification (pure)

    /// One transport outcome as a grant or a failure.
    static func answer(_ outcome: TokenEndpointOutcome,
                       parse: (Int, [(name: String, value: String)], [UInt8]) -> Result<TemporaryCredentials, TokenEndpointFailure>,
                       defaultLifetime: Duration, now: Int64) -> Result<TokenGrant, TokenEndpointFailure> {
        switch outcome {
        case .response(let status, let headers, let body):
            return parse(status, headers, body).flatMap { grant($0, wallClockNow: now, defaultLifetime: defaultLifetime) }
        case .tooLarge(let status):
            return .failure(TokenEndpointFailure(classification: .retryable, reason: "token.response_too_large", status: status))
        case .transportFailure(let detail, _):
            return .failure(.transport(detail))
        }
    }

    /// The keys as a token grant: lifetime from wall clock `now` to their `Expiration`, or
    /// `default_lifetime` for keys without one. Keys already expired are a transient failure
    /// (the source handed out stale keys; asking again may give fresh ones).
    static func grant(_ c: TemporaryCredentials, wallClockNow: Int64, defaultLifetime: Duration) -> Result<TokenGrant, TokenEndpointFailure> {
        guard let expiresAt = c.expiresAt else {
            return .success(TokenGrant(accessToken: c.encodedAsToken, lifetime: min(max(defaultLifetime, .seconds(1)), TokenGrant.maximumLifetime),
                                       lifetimeSource: .defaultLifetime))
        }
        let (remaining, overflow) = expiresAt.subtractingReportingOverflow(wallClockNow)
        if overflow || remaining <= 0 {
            return .failure(TokenEndpointFailure(classification: .retryable, reason: "credentials.expired",
                                                 errorDescription: "the keys' Expiration \(ISO8601Timestamp.format(expiresAt)) has passed (key \(BearerdOAuth.fingerprint(c.accessKeyID)))"))
        }
        let lifetime = remaining >= TokenGrant.maximumLifetime.components.seconds ? TokenGrant.maximumLifetime : .seconds(remaining)
        return .success(TokenGrant(accessToken: c.encodedAsToken, lifetime: lifetime, lifetimeSource: .expiresIn))
    }

    /// STS and vending errors that are about the moment, not the configuration: retried with
    /// backoff. Throttling and server trouble; an expired or not-yet-valid projected token
    /// (the kubelet rotates it, docs/architecture.md §6.10); Alibaba's OIDC token errors alike.
    static let transientCodes: Set<String> = [
        "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequestsException", "ServiceUnavailable",
        "ServiceUnavailableException", "InternalFailure", "InternalError", "InternalServiceError", "IDPCommunicationError",
        "RequestExpired", "InvalidIdentityToken", "ExpiredTokenException", "ExpiredToken",
        "AuthenticationFail.OIDCToken.Expired", "AuthenticationFail.OIDCToken.Invalid", "InvalidParameter.OIDCToken",
    ]
    /// Errors that name the configuration or the role's trust: negative-cached, not retried at once.
    static let permanentCodes: Set<String> = [
        "AccessDenied", "AccessDeniedException", "InvalidClientTokenId", "SignatureDoesNotMatch", "IncompleteSignature",
        "InvalidParameterValue", "InvalidParameterCombination", "MissingParameter", "ValidationError", "MalformedPolicyDocument",
        "PackedPolicyTooLarge", "RegionDisabledException", "IDPRejectedClaim", "UnrecognizedClientException", "OptInRequired",
        "NoPermission", "EntityNotExist.Role", "EntityNotExist.OIDCProvider", "InvalidParameter.RoleArn",
        "InvalidParameter.OIDCProviderArn", "InvalidParameter.RoleSessionName", "InvalidParameter.DurationSeconds",
        "AuthenticationFail.NoPermission", "NotFound",
    ]

    /// A complete answer of an STS or vending endpoint: the keys, or a classified failure.
    /// `decode` reads the body (its errors carry `sts.<Code>` for a server's error document).
    /// Throttling and 5xx are retryable (with `Retry-After`, or 5 s for 429/503 and throttling
    /// codes), an expired or invalid projected token is transient, `AccessDenied` and the other
    /// configuration errors are permanent; an unusable answer is retryable like a token
    /// endpoint's (docs/architecture.md §6). `vending`: a vending endpoint, whose 401/403 is
    /// transient (its `url_token_file` rotates) and whose other 4xx are permanent.
    static func classify(status: Int, headers: [(name: String, value: String)], body: [UInt8] = [], wallClockNow: Int64, vending: Bool = false,
                         decode: () throws(CredentialsError) -> TemporaryCredentials) -> Result<TemporaryCredentials, TokenEndpointFailure> {
        let retryAfter = headers.first { $0.name.lowercased() == "retry-after" }
            .flatMap { RetryAfter.parse($0.value, wallClockNow: wallClockNow) }
            .map { min($0, .seconds(3600)) }
        let statusRetryable = status == 408 || status == 429 || (500...599).contains(status)
        func failure(_ cls: TokenEndpointFailure.Classification, _ reason: String, _ text: String?) -> Result<TemporaryCredentials, TokenEndpointFailure> {
            var f = TokenEndpointFailure(classification: cls, reason: reason, status: status, errorDescription: text)
            if cls == .retryable {
                let throttled = status == 429 || status == 503 || reason.lowercased().contains("throttl") || reason.hasSuffix("RequestLimitExceeded")
                f.retryAfter = retryAfter ?? (throttled ? .seconds(5) : nil)
            }
            return .failure(f)
        }
        do throws(CredentialsError) {
            let c = try decode()
            guard (200...299).contains(status) else { return failure(.retryable, "token.http_\(status)", "credentials in a non-2xx answer") }
            return .success(c)
        } catch {
            var error = error
            if error.reason == "sts.error_without_code", let nested = nestedQueryError(body) {
                error = nested
            }
            if let code = error.code, error.reason.hasPrefix("sts.") {
                let text = [code, error.message].compactMap { $0 }.joined(separator: ": ")
                if transientCodes.contains(code) || code.hasPrefix("Throttling") || code.hasPrefix("ServiceUnavailable") {
                    return failure(.retryable, error.reason, text)
                }
                if permanentCodes.contains(code) { return failure(.permanent, error.reason, text) }
                return failure(statusRetryable || !(400...499).contains(status) ? .retryable : .permanent, error.reason, text)
            }
            guard (200...299).contains(status) else {
                if vending, status == 401 || status == 403 || statusRetryable {
                    return failure(.retryable, "token.http_\(status)", error.message)
                }
                if vending, (400...499).contains(status) { return failure(.permanent, "token.http_\(status)", error.message) }
                // An STS refusing the caller (401/403) names the keys or the role, whatever the body.
                if !vending, status == 401 || status == 403 { return failure(.permanent, "token.http_\(status)", error.message) }
                return failure(.retryable, "token.http_\(status)", error.message)
            }
            // A 2xx without usable keys (a maintenance page, a half-configured vendor): transient.
            return failure(.retryable, error.reason, error.description)
        }
    }

    /// The query protocol's other error shape, `<ErrorResponse><Errors><Error><Code>` (botocore
    /// reads it; moto's STS answers its authentication errors so), as `sts.<Code>`.
    static func nestedQueryError(_ body: [UInt8]) -> CredentialsError? {
        guard let root = try? SimpleXML.Reader().parse(body), root.name == "ErrorResponse",
              let error = root.child("Errors")?.child("Error"), let code = error.child("Code")?.text, !code.isEmpty else { return nil }
        let safe = code.unicodeScalars.prefix(64).map { s -> String in
            switch s {
            case "a"..."z", "A"..."Z", "0"..."9", ".", "_", "-": return String(s)
            default: return "_"
            }
        }.joined()
        return CredentialsError(reason: "sts." + safe, code: safe, message: error.child("Message").map { String($0.text.prefix(256)).filter { $0.isASCII && !$0.isNewline } })
    }

    /// A request bearerd cannot build from the configuration (a role ARN or session name STS
    /// would refuse): permanent.
    static func localFailure(_ e: CredentialsError) -> TokenEndpointFailure {
        TokenEndpointFailure(classification: .permanent, reason: e.reason, errorDescription: e.description)
    }

    /// Key files (`access_key_id_file`, `secret_access_key_file`, optional `session_token_file`),
    /// read now; each value must be visible ASCII (it goes into signatures and header fields).
    static func readKeys(_ k: CredentialSourceConfig.StaticKeys, prefix: String, wallClockNow: Int64) -> Result<TemporaryCredentials, TokenEndpointFailure> {
        func read(_ key: String, _ path: String) -> Result<OAuthSecret, TokenEndpointFailure> {
            SessionSettings.readCredential(key: prefix + "." + key, path: path, mustBeJWT: false, wallClockNow: wallClockNow).flatMap { value in
                guard value.exposedValue.utf8.allSatisfy({ $0 >= 0x21 && $0 <= 0x7E }) else {
                    return .failure(TokenEndpointFailure(classification: .retryable, reason: "credential.invalid",
                                                         errorDescription: "\(prefix).\(key) \(path): holds a space, control or non-ASCII byte"))
                }
                return .success(value)
            }
        }
        let id: OAuthSecret, secret: OAuthSecret
        switch read("access_key_id_file", k.accessKeyIDFile) {
        case .success(let v): id = v
        case .failure(let f): return .failure(f)
        }
        guard id.exposedValue.utf8.count <= TemporaryCredentials.maxAccessKeyIDBytes else {
            return .failure(TokenEndpointFailure(classification: .retryable, reason: "credential.invalid",
                                                 errorDescription: "\(prefix).access_key_id_file \(k.accessKeyIDFile): longer than \(TemporaryCredentials.maxAccessKeyIDBytes) bytes"))
        }
        switch read("secret_access_key_file", k.secretAccessKeyFile) {
        case .success(let v): secret = v
        case .failure(let f): return .failure(f)
        }
        var token: OAuthSecret?
        if let path = k.sessionTokenFile {
            switch read("session_token_file", path) {
            case .success(let v): token = v
            case .failure(let f): return .failure(f)
            }
        }
        return .success(TemporaryCredentials(accessKeyID: id.exposedValue, secret: secret, sessionToken: token, expiresAt: nil))
    }
}


extension TokenEndpointOutcome {
    /// Whether the server may have acted on the request.
    var requestWasSent: Bool {
        switch self {
        case .response, .tooLarge: return true
        case .transportFailure(_, let sent): return sent
        }
    }
}

extension SessionConfig {
    /// The endpoint a signing session's keys come from over HTTP (`sts_url:` for the STS
    /// sources, `url:` for a vending endpoint); nil for `exec` and `static`. Its `tls:` and the
    /// outbound proxy apply as to a token endpoint (docs/architecture.md §6.15).
    var credentialsEndpoint: EndpointURL? {
        guard let signing else { return nil }
        switch signing.source {
        case .webIdentity, .assumeRole, .oidcRole: return signing.stsURL
        case .url(let v): return v.url
        case .exec, .staticKeys: return nil
        }
    }

    /// What a signing session's keys are issued for (the `bearerd token` cache binding and the
    /// persisted keys' binding): grant, region, STS endpoint and the whole source. Nil for
    /// token sessions.
    var signingIdentity: String? {
        guard let s = signing else { return nil }
        var parts = [grant.rawValue, s.region, s.stsURL.description, s.source.name]
        switch s.source {
        case .webIdentity(let w): parts += [w.roleARN, w.tokenFile, w.sessionName, w.durationSeconds.map(String.init) ?? ""]
        case .assumeRole(let a):
            parts += [a.roleARN, a.keys.accessKeyIDFile, a.keys.secretAccessKeyFile, a.keys.sessionTokenFile ?? "",
                      a.externalID ?? "", a.sessionName, a.durationSeconds.map(String.init) ?? ""]
        case .url(let v): parts += [v.url.description, v.tokenFile ?? ""] + v.headers.map { $0.name + ":" + $0.value }
        case .exec(let argv): parts += argv
        case .staticKeys(let k): parts += [k.accessKeyIDFile, k.secretAccessKeyFile, k.sessionTokenFile ?? ""]
        case .oidcRole(let o): parts += [o.roleARN, o.oidcProviderARN, o.tokenFile, o.sessionName, o.durationSeconds.map(String.init) ?? ""]
        }
        return parts.joined(separator: "\u{1F}")
    }
}
