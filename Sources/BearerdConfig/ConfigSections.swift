import BearerdOAuth
import BearerdHTTP
import Yams
import BearerdProxyCore
#if canImport(Glibc)
import Glibc
#endif

/// The walk over the sections of docs/architecture.md §4: top level, `sessions:`, `routes:`, then the checks
/// that span sections (routes naming sessions, `state_dir` for refresh tokens, shadowed routes).
extension ConfigBuilder {
    /// A secret key as written, for cross-checks and the deferred file checks.
    struct SecretChoice {
        var source: SecretSource
        var key: String
        var line: Int
    }

    func build(_ yaml: String) -> BearerdConfig? {
        guard let composed = compose(yaml) else { return nil }
        guard let root = composed, !Self.isNull(root) else {
            fail(1, Self.documentKey, "the file is empty; a configuration needs at least routes: (see config.example.yaml)")
            return nil
        }
        guard let top = fields(root, path: "", line: 1, known: ConfigKeys.top,
                               expected: "a mapping of settings (listen, sessions, routes, …)") else { return nil }

        let allowRemote = bool(top, "allow_remote") ?? false
        let allowedHosts = top["allowed_hosts"].flatMap { hostList($0, key: "allowed_hosts") } ?? []
        let allowedOrigins = top["allowed_origins"].flatMap { originList($0, key: "allowed_origins") } ?? []
        var listeners = [ListenerConfig(address: .tcp(host: "127.0.0.1", port: 8080), allowedHosts: allowedHosts, allowedOrigins: allowedOrigins, line: 0)]
        if let entry = top["listen"] {
            listeners = self.listeners(entry, allowRemote: allowRemote, allowedHosts: allowedHosts, allowedOrigins: allowedOrigins)
        }
        let admin = top["admin"].flatMap { address($0.value, key: "admin") }
        if let admin, listeners.contains(where: { $0.address == admin }), let entry = top["admin"] {
            fail(entry.valueLine, "admin", "\(admin) is also a listen address; the admin endpoints need their own")
        }
        let stateDir = path(top, "state_dir", mustRead: false)
        if checkFiles, let stateDir, let entry = top["state_dir"] {
            let kind = ConfigFiles.kind(of: stateDir)
            if kind.exists, !kind.isDirectory { fail(entry.valueLine, "state_dir", "\(stateDir) exists and is not a directory") }
        }
        let loops = integer(top, "loops", range: 1...1024)
        let ioMode = choice(top, "io", IOModeSetting.self)
        let limits = top["limits"].flatMap { limitsSection($0) } ?? HTTP1Limits()
        let nested = top["timeouts"].flatMap { frontendTimeouts($0) }
        var timeouts = nested?.timeouts ?? FrontendTimeouts()
        if let grace = duration(top, "shutdown_grace") {
            if let nestedLine = nested?.graceLine {
                fail(top["shutdown_grace"]!.keyLine, "shutdown_grace", "also set as timeouts.shutdown_grace (line \(nestedLine)); keep one")
            }
            timeouts.shutdownGrace = grace
        }
        let startupTimeout = duration(top, "startup_timeout")
        let log = top["log"].flatMap { logSection($0) }

        var sessions: [SessionConfig] = []
        var sessionNames: [String] = []
        var refreshSessions: [(name: String, line: Int)] = []
        if let entry = top["sessions"],
           let section = fields(entry.value, path: "sessions", line: entry.keyLine, known: nil,
                                expected: "a mapping of session names to sessions") {
            for item in section.entries {
                sessionNames.append(item.name)
                guard let session = session(item) else { continue }
                sessions.append(session)
                if session.grant.usesRefreshToken { refreshSessions.append((session.name, session.line)) }
            }
        }
        if stateDir == nil, top["state_dir"] == nil { checkDPoPKeyHome(sessions) }
        if stateDir == nil, top["state_dir"] == nil, let first = refreshSessions.first {
            fail(first.line, "state_dir", "missing: session '\(first.name)' is kept alive by a refresh token (rotated ones, and those `bearerd login` obtains, are kept in state_dir)")
        }

        var routes: [RouteConfig] = []
        var routeIndices: [Int] = []
        var routeSessions: [(index: Int, name: String, line: Int)] = []
        if let entry = top["routes"] {
            if case .sequence(let items) = entry.value {
                if items.isEmpty { fail(entry.valueLine, "routes", "expected at least one route") }
                for (index, item) in items.enumerated() {
                    guard let (route, sessionLine) = route(item, index: index) else { continue }
                    routes.append(route)
                    routeIndices.append(index)
                    if let name = route.session { routeSessions.append((index, name, sessionLine)) }
                }
            } else {
                fail(entry.valueLine, "routes", "expected a list of routes (each starting with '- match:'), got \(Self.describe(entry.value))")
            }
        } else {
            missing(top, "routes", "a list of routes, e.g. '- match: /' with 'upstream: http://127.0.0.1:9000'")
        }
        for reference in routeSessions where !sessionNames.contains(reference.name) {
            var message = "no session named '\(reference.name)'"
            if let guess = ConfigValues.suggestion(for: reference.name, among: sessionNames) {
                message += " (did you mean \(guess)?)"
            } else if sessionNames.isEmpty {
                message += " (no sessions are defined under sessions:)"
            } else {
                message += " (defined: \(sessionNames.joined(separator: ", ")))"
            }
            fail(reference.line, "routes[\(reference.index)].session", message)
        }
        checkChains(sessions, allNames: sessionNames)
        let api = top["token_api"].flatMap { self.tokenAPI($0, sessionNames: sessionNames, listeners: listeners, admin: admin) }
        checkShadowedRoutes(Array(zip(routeIndices, routes)))
        checkSigning(sessions: sessions, routes: Array(zip(routeIndices, routes)))
        checkCallerSessions(sessions, tokenAPI: api, tokenAPILine: top["token_api"]?.keyLine ?? 0)
        checkFromUpstream(sessions: sessions, routes: Array(zip(routeIndices, routes)))

        var config = BearerdConfig(file: file, listen: [], admin: admin, stateDir: stateDir, loops: loops,
                                   limits: limits, frontendTimeouts: timeouts, sessions: sessions, routes: routes)
        config.listeners = listeners
        config.ioMode = ioMode
        config.tokenAPI = api
        if let log { config.log = log }
        if let startupTimeout { config.startupTimeout = startupTimeout }
        if let e = top["outbound_proxy"], let raw = text(e, in: top, expected: "env, none or a proxy URL such as http://proxy.internal:3128") {
            switch raw {
            case "none":
                break
            case "env":
                switch OutboundProxy.fromEnvironment(environment) {
                case .success(let p): config.outboundProxy = p
                case .failure(let f): fail(e.valueLine, "outbound_proxy", "the proxy in the environment: \(f.message)")
                }
            default:
                switch OutboundProxy.parseEndpoint(raw) {
                case .success(let endpoint): config.outboundProxy = OutboundProxy(https: endpoint, http: endpoint)
                case .failure(let f): fail(e.valueLine, "outbound_proxy", "expected env, none or a proxy URL such as http://proxy.internal:3128: \(f.message)")
                }
            }
        }
        if let e = top["shared_cache"] { config.sharedCache = sharedCacheSection(e) }
        if let e = top["tracing"] { config.tracing = tracingSection(e) }
        return config
    }

    // MARK: - Top level

    private func limitsSection(_ entry: Entry) -> HTTP1Limits? {
        guard let f = fields(entry.value, path: "limits", line: entry.keyLine, known: ConfigKeys.limits,
                             expected: "a mapping (header_bytes, request_target, headers)") else { return nil }
        var limits = HTTP1Limits()
        if let v = size(f, "header_bytes", minimum: 1024, maximum: ConfigValues.maximumHeaderBytes) { limits.maxHeaderBytes = v }
        if let v = size(f, "request_target", minimum: 16, maximum: ConfigValues.maximumHeaderBytes) { limits.maxRequestTarget = v }
        if let v = integer(f, "headers", range: 1...10_000) { limits.maxHeaderCount = v }
        if limits.maxRequestTarget > limits.maxHeaderBytes, let e = f["request_target"] {
            fail(e.valueLine, f.key("request_target"), "\(limits.maxRequestTarget) bytes is more than limits.header_bytes (\(limits.maxHeaderBytes)), which includes the request line")
        }
        return limits
    }

    /// `timeouts:`, and the line of its `shutdown_grace` key if set (the top-level spelling of
    /// that key must not be given as well).
    private func frontendTimeouts(_ entry: Entry) -> (timeouts: FrontendTimeouts, graceLine: Int?)? {
        guard let f = fields(entry.value, path: "timeouts", line: entry.keyLine, known: ConfigKeys.frontendTimeouts,
                             expected: "a mapping (header_read, idle, shutdown_grace)") else { return nil }
        var timeouts = FrontendTimeouts()
        if let v = duration(f, "header_read") { timeouts.headerRead = v }
        if let v = duration(f, "idle") { timeouts.idle = v }
        if let v = duration(f, "shutdown_grace") { timeouts.shutdownGrace = v }
        return (timeouts, f["shutdown_grace"]?.keyLine)
    }

    // MARK: - Sessions

    /// `dpop:` and `dpop_key_file:` (RFC 9449, docs/architecture.md §6.11): the key file only with
    /// `dpop: true`. Its type and size are checked where it is read (`bearerd check`, start).
    private func dpopSettings(_ f: Fields) -> (Bool, String?) {
        let dpop = bool(f, "dpop") ?? false
        let keyFile = path(f, "dpop_key_file", mustRead: true)
        if !dpop, let e = f["dpop_key_file"] {
            fail(e.keyLine, f.key("dpop_key_file"), "only used with dpop: true")
            return (false, nil)
        }
        return (dpop, keyFile)
    }

    /// A DPoP session without `dpop_key_file` keeps its generated key in `state_dir`, so the
    /// tokens bound to it survive a restart: without either there is nowhere to keep it.
    private func checkDPoPKeyHome(_ sessions: [SessionConfig]) {
        guard let s = sessions.first(where: { $0.dpop && $0.dpopKeyFile == nil }) else { return }
        fail(s.line, "state_dir", "missing: session '\(s.name)' has dpop: true without dpop_key_file, so its generated key is kept in state_dir (or set dpop_key_file)")
    }

    /// Letters, digits, `.`, `_`, `-`; not starting with `.` (names become state file names).
    static func isSessionName(_ name: String) -> Bool {
        !name.isEmpty && name.utf8.count <= 64 && !name.hasPrefix(".") && name.utf8.allSatisfy { c in
            (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || c == 0x2D || c == 0x2E || c == 0x5F
        }
    }

    private func session(_ item: Entry) -> SessionConfig? {
        let sessionPath = "sessions.\(item.name)"
        if !Self.isSessionName(item.name) {
            fail(item.keyLine, sessionPath, "a session name may hold only letters, digits, '.', '_' and '-' (at most 64, not starting with '.')")
        }
        guard let f = fields(item.value, path: sessionPath, line: item.keyLine, known: ConfigKeys.session,
                             expected: "a session mapping (grant, token_url, client_id, …)") else { return nil }

        let grant = choice(f, "grant", GrantType.self)
        if f["grant"] == nil { missing(f, "grant", "client_credentials, refresh_token, password, exec, authorization_code, device_code, jwt_bearer, token_exchange, aws or aliyun") }
        let sinks = self.sinks(f)
        if let grant, grant.isSigning {
            var s = signingSession(item, f, grant: grant)
            s?.sinks = sinks
            return s
        }
        for k in ["region", "sts_url", "credentials"] {
            if let e = f[k] { fail(e.keyLine, f.key(k), "only used with grant aws or aliyun (this session has grant \(grant?.rawValue ?? "?"))") }
        }
        if grant == .exec {
            var s = execSession(item, f)
            s?.sinks = sinks
            return s
        }
        for k in ["command", "timeout"] {
            if let e = f[k] { fail(e.keyLine, f.key(k), "only used with grant exec (this session has grant \(grant?.rawValue ?? "?"))") }
        }
        let givenTokenURL = parsed(f, "token_url", expected: "an http:// or https:// URL") { (raw: String) throws(ConfigValues.Problem) -> EndpointURL in
            try ConfigValues.endpointURL(raw, allowQuery: true)
        }
        // `issuer:` a URL or from_upstream (with allowed_issuers): ConfigIssuerSource.swift.
        let issuerSource = self.issuerSource(f)
        switch (f["token_url"], f["issuer"]) {
        case (nil, nil):
            missing(f, "token_url", "the token endpoint, e.g. https://auth.example.com/oauth2/token, or issuer: for discovery")
        case (_?, let i?):
            fail(i.keyLine, f.key("issuer"), "give either token_url or issuer (whose metadata names the token endpoint), not both")
        default:
            break
        }
        // A person's grant names its authorization (or device authorization) endpoint directly,
        // with token_url, when the provider publishes no metadata (GitHub OAuth apps); else issuer:.
        let endpointKeys: [(key: String, grant: GrantType)] = [("authorization_url", .authorizationCode), ("device_authorization_url", .deviceCode)]
        var endpoints: [String: EndpointURL] = [:]
        for (key, needs) in endpointKeys {
            let url = parsed(f, key, expected: "an http:// or https:// URL") { (raw: String) throws(ConfigValues.Problem) -> EndpointURL in
                try ConfigValues.endpointURL(raw, allowQuery: true)
            }
            guard let e = f[key] else {
                if let grant, grant == needs, f["issuer"] == nil, let t = f["token_url"] {
                    fail(t.keyLine, f.key(key), "missing: grant \(grant.rawValue) needs \(key): (with token_url:), or issuer: instead of both "
                         + "(its metadata names the \(needs == .deviceCode ? "device authorization" : "authorization") endpoint)")
                }
                continue
            }
            if let grant, grant != needs {
                fail(e.keyLine, f.key(key), "only used with grant \(needs.rawValue) (this session has grant \(grant.rawValue))")
            } else if let i = f["issuer"] {
                fail(i.keyLine, f.key("issuer"), "give either issuer or \(key) and token_url, not both")
            }
            endpoints[key] = url
        }
        let tokenURL: EndpointURL? = givenTokenURL ?? (issuerSource != nil ? .discoveryPlaceholder : nil)
        let clientID = text(f, "client_id", expected: "a client identifier") ?? (grant?.isTokenGrant == true ? "" : nil)
        if f["client_id"] == nil, grant?.isTokenGrant != true { missing(f, "client_id") }
        let clientAuthGiven = f["client_auth"] != nil
        let clientAuth = choice(f, "client_auth", ClientAuthentication.self)
        let scope = scopes(f)
        let params = sessionParams(f)
        let refreshBefore = duration(f, "refresh_before", maximum: ConfigValues.maximumLifetime)
        let defaultLifetime = duration(f, "default_lifetime", maximum: ConfigValues.maximumLifetime)
        let requestTimeout = duration(f, "request_timeout")
        let waitTimeout = duration(f, "wait_timeout")
        let tls = tlsSettings(f)

        // Client authentication (RFC 6749 §2.3.1): a secret for the secret methods, none for `none`.
        let secret = secretChoice(f, ["client_secret_file", "client_secret_env", "client_secret"])
        // jwt_bearer and token_exchange: the grant is the credential; no client authentication
        // unless a client secret is configured.
        let authMethod = clientAuth ?? ((grant?.isTokenGrant == true && secret == nil) ? .none : .clientSecretBasic)
        let workload = workloadKeys(f, grant: grant, clientAuth: authMethod)
        let clientKeyFile = path(f, "client_key_file", mustRead: true)
        let clientKeyID = text(f, "client_key_id", expected: "a key identifier (kid)")
        if clientAuth != nil || !clientAuthGiven {
            if !authMethod.usesSecret, let secret {
                fail(secret.line, f.key(secret.key), "client_auth is \(authMethod.rawValue), so no client secret is sent; remove \(secret.key) or set client_auth: client_secret_basic")
            } else if authMethod == .privateKeyJWT {
                if f["client_key_file"] == nil { missing(f, "client_key_file", "private_key_jwt signs with a PEM private key (RSA or P-256)") }
            } else if authMethod == .clientAssertion {
                // client_assertion_file: checked with the workload keys.
            } else if authMethod == .tlsClientAuth {
                if tls?.clientCert == nil || tls?.clientKey == nil {
                    fail(f["client_auth"]?.valueLine ?? f.line, f.key("tls"), "missing: tls_client_auth authenticates with tls: {client_cert, client_key}")
                }
            } else if authMethod != .none, secret == nil, !hasSecretKey(f, ["client_secret_file", "client_secret_env", "client_secret"]) {
                let why = clientAuthGiven ? "client_auth \(authMethod.rawValue)" : "client_auth client_secret_basic (the default)"
                fail(f.line, f.key("client_secret_file"), "missing: \(why) needs one of client_secret_file, client_secret_env or client_secret; a public client sets client_auth: none")
            }
        }

        // Grant-specific keys (RFC 6749 §6 refresh, §4.3 password).
        let refreshTokenFile = path(f, "refresh_token_file", mustRead: false)
        let username = text(f, "username", expected: "a user name")
        let password = secretChoice(f, ["password_file", "password_env", "password"])
        if let grant {
            if grant == .refreshToken {
                if f["refresh_token_file"] == nil { missing(f, "refresh_token_file", "grant refresh_token starts from a refresh token kept in a file (or use grant authorization_code / device_code and `bearerd login`)") }
                if let refreshTokenFile, checkFiles, let e = f["refresh_token_file"] {
                    checkSecret(.file(refreshTokenFile), line: e.valueLine, key: f.key("refresh_token_file"))
                }
            } else if let e = f["refresh_token_file"] {
                fail(e.keyLine, f.key("refresh_token_file"), "only used with grant refresh_token (this session has grant \(grant.rawValue))")
            }
            if grant == .password {
                if f["username"] == nil { missing(f, "username", "grant password needs username and one of password_file, password_env or password") }
                if password == nil, !hasSecretKey(f, ["password_file", "password_env", "password"]) {
                    fail(f.line, f.key("password_file"), "missing: grant password needs one of password_file, password_env or password")
                }
            } else {
                for name in ["username", "password", "password_file", "password_env"] {
                    if let e = f[name] {
                        fail(e.keyLine, f.key(name), "only used with grant password (this session has grant \(grant.rawValue))")
                    }
                }
            }
        }
        if checkFiles {
            if let secret, authMethod != .none { checkSecret(secret.source, line: secret.line, key: f.key(secret.key)) }
            if let password, grant == .password { checkSecret(password.source, line: password.line, key: f.key(password.key)) }
        }
        if authMethod != .privateKeyJWT {
            for k in ["client_key_file", "client_key_id"] {
                if let e = f[k] { fail(e.keyLine, f.key(k), "only used with client_auth private_key_jwt") }
            }
        }
        if tls != nil, let tokenURL, !tokenURL.isTLS, tokenURL != .discoveryPlaceholder, let e = f["tls"] {
            fail(e.keyLine, f.key("tls"), "tls settings need an https:// token_url")
        }

        // RFC 8252 §7.3 / §8.3: a fixed loopback redirect, for servers that match it exactly.
        let redirectURI = parsed(f, "redirect_uri", expected: "a loopback URL, e.g. http://127.0.0.1:8765/callback") {
            (raw: String) throws(ConfigValues.Problem) -> EndpointURL in
            let u = try ConfigValues.endpointURL(raw, allowQuery: false)
            guard u.scheme == "http", ["127.0.0.1", "::1", "localhost"].contains(u.host) else {
                throw ConfigValues.Problem("must be an http:// loopback URL on 127.0.0.1, [::1] or localhost (RFC 8252 §7.3), "
                                           + "e.g. http://127.0.0.1:8765/callback: bearerd listens there for the browser, got \(u.scheme)://\(u.authority)")
            }
            return u
        }
        if let e = f["redirect_uri"], let grant, grant != .authorizationCode {
            fail(e.keyLine, f.key("redirect_uri"), "only used with grant authorization_code (this session has grant \(grant.rawValue))")
        }

        guard let grant, let tokenURL, let clientID, clientAuth != nil || !clientAuthGiven else { return nil }
        var session = SessionConfig(
            name: item.name, grant: grant, tokenURL: tokenURL, clientID: clientID,
            clientSecret: authMethod == .none ? nil : secret?.source, clientAuth: authMethod, scope: scope,
            params: params, refreshBefore: refreshBefore, defaultLifetime: defaultLifetime ?? .seconds(300),
            refreshTokenFile: grant == .refreshToken ? refreshTokenFile : nil,
            username: grant == .password ? username : nil, password: grant == .password ? password?.source : nil,
            tls: tls, requestTimeout: requestTimeout ?? .seconds(15), waitTimeout: waitTimeout ?? .seconds(10),
            line: item.keyLine, clientKeyFile: authMethod == .privateKeyJWT ? clientKeyFile : nil,
            clientKeyID: authMethod == .privateKeyJWT ? clientKeyID : nil)
        session.issuerSource = issuerSource
        session.authorizationEndpoint = endpoints["authorization_url"]
        session.deviceAuthorizationEndpoint = endpoints["device_authorization_url"]
        session.redirectURI = grant == .authorizationCode ? redirectURI : nil
        session.assertionFile = workload.assertionFile
        session.clientAssertionFile = workload.clientAssertionFile
        session.audiences = workload.audiences
        session.resources = workload.resources
        session.exchange = workload.exchange
        session.onBehalfOf = onBehalfOf(f, grant: grant)
        (session.dpop, session.dpopKeyFile) = dpopSettings(f)
        session.sinks = sinks
        if grant == .tokenExchange, workload.exchange == nil { return nil }
        return session
    }

    /// `grant: exec`: `command` (argv, no shell; argv[0] an absolute path or a name looked up in
    /// PATH), `timeout` (default 10 s, at most 10 min); the token endpoint keys do not apply.
    private func execSession(_ item: Entry, _ f: Fields) -> SessionConfig? {
        for k in ["token_url", "client_id", "client_secret_file", "client_secret_env", "client_secret", "client_auth", "scope", "params", "dpop", "dpop_key_file",
                  "refresh_token_file", "username", "password", "password_file", "password_env", "tls", "request_timeout",
                  "authorization_url", "device_authorization_url", "redirect_uri", "assertion_file", "audience", "resource",
                  "subject_token_file", "subject_session", "subject_token_type", "actor_token_file", "actor_token_type",
                  "requested_token_type", "client_assertion_file", "subject", "assertion", "caller_cache", "caller_jwt"] {
            if let e = f[k] { fail(e.keyLine, f.key(k), "not used with grant exec: the command obtains the token itself") }
        }
        var argv: [String]?
        if let e = f["command"] {
            argv = self.argv(e, in: f, hint: "a list: the program and its arguments, e.g. [/usr/local/bin/get-token, --audience, api]")
        } else {
            missing(f, "command", "grant exec runs a command that prints the token response, e.g. [/usr/local/bin/get-token]")
        }
        let timeout = duration(f, "timeout", maximum: .seconds(600))
        let refreshBefore = duration(f, "refresh_before", maximum: ConfigValues.maximumLifetime)
        let defaultLifetime = duration(f, "default_lifetime", maximum: ConfigValues.maximumLifetime)
        let waitTimeout = duration(f, "wait_timeout")
        guard let argv else { return nil }
        var s = SessionConfig(name: item.name, grant: .exec, tokenURL: .execPlaceholder, clientID: "", clientAuth: .none,
                              refreshBefore: refreshBefore, defaultLifetime: defaultLifetime ?? .seconds(300),
                              requestTimeout: (timeout ?? .seconds(10)) + .seconds(1), waitTimeout: waitTimeout ?? .seconds(10),
                              line: item.keyLine)
        s.command = argv
        s.commandTimeout = timeout ?? .seconds(10)
        return s
    }

    /// `scope: read write` or `scope: [read, write]` (RFC 6749 §3.3: space-delimited).
    private func scopes(_ f: Fields) -> String? {
        guard let entry = f["scope"] else { return nil }
        guard case .sequence(let items) = entry.value else { return text(entry, in: f, expected: "scopes such as \"read write\"") }
        var scopes: [String] = []
        for (index, item) in items.enumerated() {
            guard case .scalar(let s) = item, !Self.isNull(item), !s.string.isEmpty, !s.string.contains(" ") else {
                fail(Self.line(item), "\(f.key("scope"))[\(index)]", "expected one scope without spaces, got \(Self.describe(item))")
                continue
            }
            scopes.append(s.string)
        }
        guard !scopes.isEmpty else {
            fail(entry.valueLine, f.key("scope"), "expected at least one scope")
            return nil
        }
        return scopes.joined(separator: " ")
    }

    private func hasSecretKey(_ f: Fields, _ names: [String]) -> Bool {
        names.contains { f[$0] != nil }
    }

    /// At most one of `names` (`*_file`, `*_env`, literal); the first valid one is returned, every
    /// further one is reported.
    private func secretChoice(_ f: Fields, _ names: [String]) -> SecretChoice? {
        let given = names.compactMap { f[$0] }.sorted { $0.keyLine < $1.keyLine }
        for extra in given.dropFirst() {
            let first = given[0]
            fail(extra.keyLine, f.key(extra.name), "give only one of \(names.joined(separator: ", ")) (\(first.name) is set at line \(first.keyLine))")
        }
        guard let entry = given.first else { return nil }
        let isLiteral = entry.name == names[2]
        let expected = entry.name.hasSuffix("_file") ? "a file path" : entry.name.hasSuffix("_env") ? "an environment variable name" : "the secret"
        guard let raw = text(entry, in: f, expected: expected, secret: isLiteral) else { return nil }
        if entry.name.hasSuffix("_file") {
            guard let path = filePath(raw, line: entry.valueLine, key: f.key(entry.name)) else { return nil }
            return SecretChoice(source: .file(path), key: entry.name, line: entry.valueLine)
        }
        if entry.name.hasSuffix("_env") {
            guard raw.utf8.allSatisfy({ $0 == 0x5F || ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x41 && $0 <= 0x5A) || ($0 >= 0x61 && $0 <= 0x7A) }) else {
                let hint = raw.hasPrefix("$") ? " (write the name without $)" : ""
                fail(entry.valueLine, f.key(entry.name), "expected an environment variable name (letters, digits and _), got \(ConfigValues.quoted(raw))\(hint)")
                return nil
            }
            return SecretChoice(source: .env(raw), key: entry.name, line: entry.valueLine)
        }
        return SecretChoice(source: .literal(Secret(raw)), key: entry.name, line: entry.valueLine)
    }

    private func checkSecret(_ source: SecretSource, line: Int, key: String) {
        do throws(ConfigError) {
            _ = try ConfigLoader.resolveSecret(source, environment: environment, file: file, line: line, key: key)
        } catch {
            errors.append(error)
        }
    }

    /// `params:` — extra token-request form fields, in file order; values never echoed (they may be credentials).
    private func sessionParams(_ f: Fields) -> [(String, String)] {
        guard let entry = f["params"],
              let section = fields(entry.value, path: f.key("params"), line: entry.keyLine, known: nil,
                                   expected: "a mapping of form parameter names to values") else { return [] }
        var result: [(String, String)] = []
        for item in section.entries {
            if let own = Self.paramsWithOwnKey[item.name], f[own] != nil {
                fail(item.keyLine, section.key(item.name), "\(own): is set on the session too; use only the session's \(own): key (a string or a list; each value is sent once)")
                continue
            }
            if ConfigKeys.reservedParams.contains(item.name) {
                fail(item.keyLine, section.key(item.name), "bearerd sets \(item.name) itself; use the session's own keys")
                continue
            }
            guard let value = text(item, in: section, expected: "a text value", secret: true) else { continue }
            result.append((item.name, value))
        }
        return result
    }

    /// `tls:` of a session or route: CA file, client certificate and key (both or neither).
    func tlsSettings(_ owner: Fields) -> TLSSettings? {
        guard let entry = owner["tls"],
              let f = fields(entry.value, path: owner.key("tls"), line: entry.keyLine, known: ConfigKeys.tls,
                             expected: "a mapping (ca_file, client_cert, client_key)") else { return nil }
        let settings = TLSSettings(caFile: path(f, "ca_file", mustRead: true),
                                   clientCert: path(f, "client_cert", mustRead: true),
                                   clientKey: path(f, "client_key", mustRead: true))
        if let e = f["client_cert"], f["client_key"] == nil {
            fail(e.keyLine, f.key("client_key"), "missing: client_cert needs client_key too (mutual TLS uses both)")
        }
        if let e = f["client_key"], f["client_cert"] == nil {
            fail(e.keyLine, f.key("client_cert"), "missing: client_key needs client_cert too (mutual TLS uses both)")
        }
        return settings == TLSSettings() ? nil : settings
    }

    // MARK: - Routes

    private func route(_ node: Node, index: Int) -> (RouteConfig, sessionLine: Int)? {
        let path = "routes[\(index)]"
        let line = Self.line(node)
        guard let f = fields(node, path: path, line: line, known: ConfigKeys.route,
                             expected: "a route mapping (match, upstream, …)") else { return nil }

        let match = parsed(f, "match", expected: "a path prefix such as /api/") { (raw: String) throws(ConfigValues.Problem) -> String in
            guard raw.hasPrefix("/") else { throw ConfigValues.Problem("a path prefix must start with '/', got \(ConfigValues.quoted(raw))") }
            if raw.contains("?") || raw.contains("#") { throw ConfigValues.Problem("a path prefix must not contain '?' or '#'") }
            if raw.unicodeScalars.contains(where: { $0.value <= 0x20 || $0.value == 0x7F }) {
                throw ConfigValues.Problem("a path prefix must not contain spaces or control characters")
            }
            return raw
        }
        if f["match"] == nil { missing(f, "match", "a path prefix such as / or /api/") }
        let host = parsed(f, "host", expected: "a host name") { (raw: String) throws(ConfigValues.Problem) -> String in
            if raw.contains(":"), !raw.hasPrefix("[") {
                throw ConfigValues.Problem("give the host name without a port (the port is ignored when matching), got \(ConfigValues.quoted(raw))")
            }
            guard ConfigValues.isHostName(raw) else { throw ConfigValues.Problem("\(ConfigValues.quoted(raw)) is not a valid host name") }
            return raw.lowercased()
        }
        let stripPrefix = bool(f, "strip_prefix") ?? false
        let upstream = parsed(f, "upstream", expected: "an http:// or https:// URL") { (raw: String) throws(ConfigValues.Problem) -> UpstreamURL in
            try ConfigValues.url(raw)
        }
        if f["upstream"] == nil { missing(f, "upstream", "where requests go, e.g. https://api.example.com") }
        let session = text(f, "session", expected: "the name of a session")
        let tls = tlsSettings(f)
        if tls != nil, let upstream, !upstream.isTLS, let e = f["tls"] {
            fail(e.keyLine, f.key("tls"), "tls settings need an https:// upstream")
        }
        var timeouts = RouteTimeouts()
        if let entry = f["timeouts"],
           let t = fields(entry.value, path: f.key("timeouts"), line: entry.keyLine, known: ConfigKeys.routeTimeouts,
                          expected: "a mapping (connect, response, idle)") {
            if let v = duration(t, "connect") { timeouts.connect = v }
            if let v = duration(t, "response") { timeouts.response = v }
            if let v = duration(t, "idle") { timeouts.idle = v }
        }
        let replayBodyLimit = size(f, "replay_body_limit", minimum: 0, maximum: ConfigValues.maximumReplayBody) ?? (1 << 20)
        let rejectStatuses = f["reject_statuses"].flatMap { statuses($0, in: f) } ?? [401]
        let replayMethods = f["replay_methods"].flatMap { methods($0, in: f) } ?? .all
        let http2 = choice(f, "http2", HTTP2Mode.self) ?? .auto
        let inject = injectSettings(f) ?? .bearer
        if let e = f["inject"], f["session"] == nil {
            fail(e.keyLine, f.key("inject"), "inject needs a session: on this route (it says where that session's token goes)")
        }

        guard let match, let upstream else { return nil }
        var route = RouteConfig(match: match, host: host, stripPrefix: stripPrefix, upstream: upstream, session: session,
                                tls: tls, timeouts: timeouts, replayBodyLimit: replayBodyLimit,
                                rejectStatuses: rejectStatuses, replayMethods: replayMethods, http2: http2, inject: inject, line: line)
        route.injectConfigured = f["inject"] != nil
        route.sign = signSettings(f)
        route.callerJWT = callerJWT(f)
        if let e = f["caller_jwt"], f["session"] == nil {
            fail(e.keyLine, f.key("caller_jwt"), "caller_jwt needs a session: on this route (a valid caller's token is replaced by that session's credential)")
        }
        return (route, f["session"]?.valueLine ?? line)
    }

    /// `inject: {header, format}`: a header name (RFC 9110 token, not one bearerd manages) and a
    /// format with exactly one `{token}`.
    private func injectSettings(_ owner: Fields) -> InjectConfig? {
        guard let entry = owner["inject"],
              let f = fields(entry.value, path: owner.key("inject"), line: entry.keyLine, known: ConfigKeys.inject,
                             expected: "a mapping (header, format), e.g. { header: X-Api-Key, format: \"{token}\" }") else { return nil }
        var header = "Authorization"
        if let h = text(f, "header", expected: "a header name such as X-Api-Key") {
            let reserved = ["host", "content-length", "transfer-encoding", "connection", "keep-alive", "te", "trailer", "upgrade",
                            "proxy-connection", "expect", "via", "x-forwarded-for", "x-forwarded-proto", "x-forwarded-host"]
            if !Self.isToken(h) {
                fail(f["header"]!.valueLine, f.key("header"), "\(ConfigValues.quoted(h)) is not a header name (letters, digits and !#$%&'*+-.^_`|~)")
            } else if reserved.contains(h.lowercased()) {
                fail(f["header"]!.valueLine, f.key("header"), "\(h) is set by bearerd itself; choose the header the upstream reads the credential from")
            } else {
                header = h
            }
        }
        var prefix = "Bearer ", suffix = ""
        if let format = text(f, "format", expected: "a text with {token} in it, e.g. \"Bearer {token}\"") {
            let parts = format.split(separator: "{token}", omittingEmptySubsequences: false).map(String.init)
            if parts.count != 2 {
                fail(f["format"]!.valueLine, f.key("format"), "must contain {token} exactly once, got \(ConfigValues.quoted(format))")
            } else if format.unicodeScalars.contains(where: { $0.value < 0x20 || $0.value == 0x7F }) {
                fail(f["format"]!.valueLine, f.key("format"), "must not contain control characters (it becomes a header value)")
            } else {
                prefix = parts[0]
                suffix = parts[1]
            }
        } else if f["header"] != nil && !asciiEq(header, "Authorization") {
            // A custom header without format: the bare token (API-key style).
            prefix = ""
        }
        return InjectConfig(header: header, prefix: prefix, suffix: suffix)
    }

    private func asciiEq(_ a: String, _ b: String) -> Bool { a.lowercased() == b.lowercased() }

    private func statuses(_ entry: Entry, in f: Fields) -> [Int]? {
        let key = f.key("reject_statuses")
        guard let items = listItems(entry, key: key, expected: "a list of status codes such as [401, 403]") else { return nil }
        var result: [Int] = []
        var ok = true
        for (index, item) in items.enumerated() {
            let itemKey = entry.value.sequence == nil ? key : "\(key)[\(index)]"
            guard case .scalar(let s) = item, let code = Int(s.string) else {
                fail(Self.line(item), itemKey, "expected a status code 400–599, got \(Self.describe(item))")
                ok = false
                continue
            }
            guard (400...599).contains(code) else {
                fail(Self.line(item), itemKey, "expected a status code 400–599, got \(code)")
                ok = false
                continue
            }
            if !result.contains(code) { result.append(code) }
        }
        return ok ? result : nil
    }

    private func methods(_ entry: Entry, in f: Fields) -> ReplayMethods? {
        let key = f.key("replay_methods")
        let expected = "all or a list of methods such as [GET, HEAD, PUT, DELETE]"
        switch entry.value {
        case .scalar(let s) where s.string == "all":
            return .all
        case .sequence(let sequence):
            var set = Set<String>()
            var ok = true
            for (index, item) in sequence.enumerated() {
                guard case .scalar(let s) = item, !Self.isNull(item), Self.isToken(s.string) else {
                    fail(Self.line(item), "\(key)[\(index)]", "expected a method name such as GET, got \(Self.describe(item))")
                    ok = false
                    continue
                }
                let standard = ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"]
                if s.string != s.string.uppercased(), standard.contains(s.string.uppercased()) {
                    fail(Self.line(item), "\(key)[\(index)]", "methods are case-sensitive (RFC 9110 §9.1): did you mean \(s.string.uppercased())?")
                    ok = false
                    continue
                }
                set.insert(s.string)
            }
            return ok ? .only(set) : nil
        default:
            fail(entry.valueLine, key, "expected \(expected), got \(Self.describe(entry.value))")
            return nil
        }
    }

    /// RFC 9110 §5.6.2 `token`.
    static func isToken(_ s: String) -> Bool {
        !s.isEmpty && s.utf8.allSatisfy { c in
            (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || "!#$%&'*+-.^_`|~".utf8.contains(c)
        }
    }

    /// First match wins: a route whose every request an earlier route already takes is an error.
    private func checkShadowedRoutes(_ routes: [(index: Int, route: RouteConfig)]) {
        for (position, (j, later)) in routes.enumerated() {
            for (i, earlier) in routes[..<position] {
                guard earlier.host == nil || earlier.host == later.host, later.match.hasPrefix(earlier.match) else { continue }
                let rest = later.match.dropFirst(earlier.match.count)
                guard earlier.match.hasSuffix("/") || rest.isEmpty || rest.hasPrefix("/") else { continue }
                fail(later.line, "routes[\(j)].match",
                     "this route is never used: routes[\(i)] (line \(earlier.line), match \(ConfigValues.quoted(earlier.match))\(earlier.host.map { ", host \($0)" } ?? "")) comes first and takes every request it would; put more specific routes first")
                break
            }
        }
    }
}
