import BearerdOAuth
import BearerdHTTP
import BearerdProxyCore

/// The validated configuration (docs/architecture.md §4). Produced by `ConfigLoader`; immutable
/// once loaded. Every value here has already been checked: ports in range, durations positive,
/// routes pointing at existing sessions, secrets readable.
public struct BearerdConfig: Sendable {
    /// Path of the file this configuration was read from (for messages).
    public var file: String
    /// The client listeners with their access-control settings.
    public var listeners: [ListenerConfig]
    /// Their addresses, in file order.
    public var listen: [ListenAddress] { listeners.map(\.address) }
    public var admin: ListenAddress?
    public var stateDir: String?
    /// Number of event loops; default one per CPU the process may use (`EventLoopGroup.coreCount`).
    public var loops: Int?
    /// How sockets get readiness events (`io:`; extension). nil: `$BEARERD_IO`, else the loop poller (`IOMode.defaultMode`).
    public var ioMode: IOModeSetting?
    /// Frontend limits (`limits:`; an extension of docs/architecture.md §4).
    public var limits: HTTP1Limits
    /// Frontend timeouts (`timeouts:` at top level).
    public var frontendTimeouts: FrontendTimeouts
    /// `log:` (format, level, access line).
    public var log: LogConfig = LogConfig()
    /// Longest wait at start for every session's first token before systemd hears READY=1
    /// anyway (with a STATUS= naming what is missing). Default 30 s.
    public var startupTimeout: Duration = .seconds(30)
    /// `outbound_proxy:` resolved (for `env`, from the environment at load).
    public var outboundProxy: OutboundProxy = .direct
    /// `shared_cache:` (docs/architecture.md §6.13), nil when replicas do not share tokens.
    public var sharedCache: SharedCacheConfig?
    /// `tracing:` (docs/architecture.md §2.9), nil when traces are off (the default).
    public var tracing: TracingConfig?
    /// Sessions by name, in file order.
    public var sessions: [SessionConfig]
    /// Routes in file order; first match wins.
    public var routes: [RouteConfig]
    /// `token_api:` (docs/architecture.md §4), if configured.
    public var tokenAPI: TokenAPIConfig?

    public init(file: String, listen: [ListenAddress], admin: ListenAddress? = nil, stateDir: String? = nil,
                loops: Int? = nil, limits: HTTP1Limits = HTTP1Limits(), frontendTimeouts: FrontendTimeouts = FrontendTimeouts(),
                sessions: [SessionConfig] = [], routes: [RouteConfig] = []) {
        self.file = file
        self.listeners = listen.map { ListenerConfig(address: $0) }
        self.admin = admin
        self.stateDir = stateDir
        self.loops = loops
        self.limits = limits
        self.frontendTimeouts = frontendTimeouts
        self.sessions = sessions
        self.routes = routes
    }

    public func session(named name: String) -> SessionConfig? {
        sessions.first { $0.name == name }
    }
}

/// A listening address: `host:port`, `[::1]:port`, or `unix:/path`.
public enum ListenAddress: Sendable, Equatable, CustomStringConvertible {
    case tcp(host: String, port: UInt16)
    case unix(path: String)

    public var description: String {
        switch self {
        case .tcp(let host, let port): return host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
        case .unix(let path): return "unix:\(path)"
        }
    }
}

/// Top-level `timeouts:` for the client side.
public struct FrontendTimeouts: Sendable, Equatable {
    /// Time allowed to receive a complete request head (slowloris guard). Default 10 s.
    public var headerRead: Duration = .seconds(10)
    /// Idle keep-alive time between requests. Default 60 s.
    public var idle: Duration = .seconds(60)
    /// Grace for in-flight requests on SIGTERM/SIGINT. Default 10 s.
    public var shutdownGrace: Duration = .seconds(10)
    public init() {}
}

/// A secret value. Prints redacted; compares in constant time.
public struct Secret: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible {
    public let value: String
    public init(_ value: String) { self.value = value }
    public var description: String { "<redacted>" }
    public var debugDescription: String { "<redacted>" }
    public static func == (a: Secret, b: Secret) -> Bool {
        let x = Array(a.value.utf8), y = Array(b.value.utf8)
        var diff = UInt8(truncatingIfNeeded: x.count ^ y.count)
        for i in 0..<min(x.count, y.count) { diff |= x[i] ^ y[i] }
        return diff == 0
    }
}

/// Where a secret comes from (`*_file`, `*_env` or a literal). Resolved at load and on SIGHUP.
public enum SecretSource: Sendable, Equatable {
    case file(String)
    case env(String)
    case literal(Secret)
}

/// `io:` (docs/architecture.md §2.2): how the event loops get readiness events. BearerdIO's `EventLoop.IOMode`
/// has the same raw values; the server maps one to the other.
public enum IOModeSetting: String, Sendable, CaseIterable {
    /// A Dispatch read and write source per socket.
    case sources
    /// One edge-triggered epoll set per loop behind one Dispatch source (the default).
    case poller
}

public enum GrantType: String, Sendable, Equatable, CaseIterable {
    case clientCredentials = "client_credentials"
    case refreshToken = "refresh_token"
    case password = "password"
    /// A helper command mints the token (RFC 6749 §5.1 JSON on its stdout); no token endpoint.
    case exec = "exec"
    /// A person's session started by `bearerd login` (RFC 6749 §4.1 with PKCE, RFC 8252), then
    /// kept alive by its refresh token in `state_dir`.
    case authorizationCode = "authorization_code"
    /// A person's session started by `bearerd login` with the device flow (RFC 8628).
    case deviceCode = "device_code"
    /// RFC 7523 §2.1: the JWT in `assertion_file` is the grant (re-read per request).
    case jwtBearer = "jwt_bearer"
    /// RFC 8693: a subject token (a file, or another session's access token) is exchanged.
    case tokenExchange = "token_exchange"
    /// Signing keys for AWS Signature V4 (docs/architecture.md §6.15): temporary credentials from
    /// `credentials:`, not a token. Routes with `sign:` sign requests with them.
    case aws = "aws"
    /// Signing keys for Alibaba Cloud OSS V4 signatures (docs/architecture.md §6.15).
    case aliyun = "aliyun"

    /// Sessions whose "token" is a set of signing keys (`credentials:`).
    public var isSigning: Bool { self == .aws || self == .aliyun }

    /// Grants whose credential is a token (a JWT file or another session's token): `client_id`
    /// is optional and `client_auth` defaults to `none` unless a client secret is configured.
    public var isTokenGrant: Bool { self == .jwtBearer || self == .tokenExchange }

    /// Sessions kept alive by a refresh token (from a file, or from `bearerd login`).
    public var usesRefreshToken: Bool { self == .refreshToken || self == .authorizationCode || self == .deviceCode }
    /// A person signs in with `bearerd login` to start it.
    public var isPersonal: Bool { self == .authorizationCode || self == .deviceCode }
}

/// `host[:port]` as a URL and a Host field carry it: an IPv6 address in brackets, the port only
/// when it is not the scheme's default.
func urlAuthority(host: String, port: UInt16, defaultPort: UInt16) -> String {
    let h = host.utf8.contains(UInt8(ascii: ":")) ? "[\(host)]" : host
    return port == defaultPort ? h : "\(h):\(port)"
}

/// A route's `upstream`: an absolute `http` or `https` URL whose base path is joined with
/// request paths (endpoints of an authorization server are `EndpointURL`s).
public struct UpstreamURL: Sendable, Equatable, CustomStringConvertible {
    public var scheme: String      // "http" or "https"
    public var host: String        // without brackets for IPv6
    public var port: UInt16
    /// Base path without trailing slash ("" for none), e.g. "/v2".
    public var basePath: String

    public init(scheme: String, host: String, port: UInt16, basePath: String) {
        self.scheme = scheme
        self.host = host
        self.port = port
        self.basePath = basePath
    }

    public var isTLS: Bool { scheme == "https" }
    public var defaultPort: UInt16 { isTLS ? 443 : 80 }
    /// Host header value: host, plus port when not the default.
    public var authority: String { urlAuthority(host: host, port: port, defaultPort: defaultPort) }
    public var description: String { "\(scheme)://\(authority)\(basePath)" }
}

/// An authorization server's endpoint: token, authorization, device authorization, revocation,
/// introspection, discovery or `issuer` (docs/architecture.md §5). Unlike `UpstreamURL`, whose base path is
/// joined with request paths, an endpoint is used exactly as configured or published: `text`
/// is the URL as written, and requests go to `path` and `query` byte for byte, a trailing slash
/// included (Django-based servers serve `/authorize/` and answer 404 to `/authorize`).
///
/// Immutable value. Invariants: `scheme` is `http` or `https` (lowercase); `host` is a checked
/// host name or address (IPv6 without brackets); `path` is empty or starts with `/`, and neither
/// it nor `query` holds spaces, controls or non-ASCII characters.
public struct EndpointURL: Sendable, Equatable, Hashable, CustomStringConvertible {
    /// The URL as configured or published (the client assertion's `aud`, the base of the
    /// authorization URL).
    public let text: String
    public let scheme: String
    public let host: String
    public let port: UInt16
    /// The path exactly as written; "" when the URL has none (requests then go to `/`).
    public let path: String
    /// The query exactly as written (without `?`), if any.
    public let query: String?

    /// From checked parts: `text` is made from them (the default port left out).
    public init(scheme: String, host: String, port: UInt16, path: String, query: String? = nil) {
        let authority = urlAuthority(host: host, port: port, defaultPort: scheme == "https" ? 443 : 80)
        self.init(text: "\(scheme)://\(authority)\(path)" + (query.map { "?" + $0 } ?? ""),
                  scheme: scheme, host: host, port: port, path: path, query: query)
    }

    init(text: String, scheme: String, host: String, port: UInt16, path: String, query: String?) {
        self.text = text
        self.scheme = scheme
        self.host = host
        self.port = port
        self.path = path
        self.query = query
    }

    public var isTLS: Bool { scheme == "https" }
    public var defaultPort: UInt16 { isTLS ? 443 : 80 }
    /// Host header value: host, plus port when not the default.
    public var authority: String { urlAuthority(host: host, port: port, defaultPort: defaultPort) }
    /// The origin-form request target (RFC 9112 §3.2.1): the path as written (`/` when empty)
    /// and the query, unchanged.
    public var requestTarget: String {
        (path.isEmpty ? "/" : path) + (query.map { "?" + $0 } ?? "")
    }
    public var description: String { text }

    /// What `tokenURL` holds for `grant: exec` sessions, which have no token endpoint.
    public static let execPlaceholder = EndpointURL(scheme: "exec", host: "localhost", port: 0, path: "")
    /// What `tokenURL` holds until an `issuer:`'s metadata has been read.
    public static let discoveryPlaceholder = EndpointURL(scheme: "discovery", host: "localhost", port: 0, path: "")
}

/// Upstream (or token endpoint) TLS settings.
public struct TLSSettings: Sendable, Equatable, Hashable {
    public var caFile: String?
    public var clientCert: String?
    public var clientKey: String?
    public init(caFile: String? = nil, clientCert: String? = nil, clientKey: String? = nil) {
        self.caFile = caFile
        self.clientCert = clientCert
        self.clientKey = clientKey
    }
}

/// One entry of `sessions:`.
public struct SessionConfig: Sendable, Equatable {
    public var name: String
    public var grant: GrantType
    public var tokenURL: EndpointURL
    public var clientID: String
    public var clientSecret: SecretSource?
    public var clientAuth: ClientAuthentication
    public var scope: String?
    /// Extra form parameters, in file order.
    public var params: [(String, String)]
    public var refreshBefore: Duration?
    public var defaultLifetime: Duration
    public var refreshTokenFile: String?
    public var username: String?
    public var password: SecretSource?
    public var tls: TLSSettings?
    /// Timeout of one token request (default 15 s).
    public var requestTimeout: Duration
    /// Longest a request waits for a token in the hard window (default 10 s).
    public var waitTimeout: Duration
    /// `private_key_jwt`: the PEM private key (RSA → RS256, P-256 → ES256) and optional `kid`.
    public var clientKeyFile: String?
    public var clientKeyID: String?
    /// `issuer:` (RFC 8414 / OIDC discovery, or `from_upstream`: RFC 9728) instead of
    /// `token_url`; the endpoints below are filled from its metadata before the session runs
    /// (`tokenURL` too).
    public var issuerSource: IssuerSource?
    /// `issuer: URL` (nil for `from_upstream`, whose chosen issuer is in `issuerSource`).
    public var issuer: EndpointURL? {
        get { if case .fixed(let u)? = issuerSource { return u } else { return nil } }
        set { issuerSource = newValue.map { .fixed($0) } }
    }
    public var authorizationEndpoint: EndpointURL?
    public var deviceAuthorizationEndpoint: EndpointURL?
    /// `redirect_uri:` of an authorization_code session: a fixed loopback redirect (127.0.0.1,
    /// [::1] or localhost; http) for servers that compare redirect URIs exactly; nil: a port
    /// chosen at run time (RFC 8252 §7.3).
    public var redirectURI: EndpointURL?
    /// `grant: exec`: the helper's argv (no shell) and how long it may run (`timeout`, default 10 s).
    public var command: [String]?
    public var commandTimeout: Duration = .seconds(10)
    /// `grant: aws` / `grant: aliyun`: region, STS endpoint and where the keys come from.
    public var signing: SigningCredentialsConfig?
    /// `grant: jwt_bearer`: the file holding the assertion (RFC 7523 §2.1), opened per request.
    public var assertionFile: String?
    /// `client_auth: client_assertion`: the file holding the external client assertion.
    public var clientAssertionFile: String?
    /// `audience:` / `resource:` (RFC 8693 §2.1, RFC 8707 §2), each value sent once, in order.
    public var audiences: [String] = []
    public var resources: [String] = []
    /// `grant: token_exchange` (RFC 8693 §2.1).
    public var exchange: TokenExchangeConfig?
    /// `subject: caller` / `assertion: caller` (docs/architecture.md §6.16): the session acts
    /// for each caller; nil for a session with one identity of its own.
    public var onBehalfOf: OnBehalfOfConfig?
    /// `dpop: true` (RFC 9449): proofs on token requests and upstream requests, tokens sent as
    /// `Authorization: DPoP`. `dpop_key_file`: the key (P-256 → ES256, RSA ≥ 2048 → RS256);
    /// nil: a P-256 key generated once and kept in `state_dir` as `<session>.dpop.pem`.
    public var dpop: Bool = false
    public var dpopKeyFile: String?
    /// `sinks:` files rewritten with every new token (not part of `==`: they change no token).
    public var sinks: [SinkConfig] = []
    /// Source line of the session's key, for messages.
    public var line: Int

    public init(name: String, grant: GrantType, tokenURL: EndpointURL, clientID: String,
                clientSecret: SecretSource? = nil, clientAuth: ClientAuthentication = .clientSecretBasic,
                scope: String? = nil, params: [(String, String)] = [], refreshBefore: Duration? = nil,
                defaultLifetime: Duration = .seconds(300), refreshTokenFile: String? = nil,
                username: String? = nil, password: SecretSource? = nil, tls: TLSSettings? = nil,
                requestTimeout: Duration = .seconds(15), waitTimeout: Duration = .seconds(10), line: Int = 0,
                issuer: EndpointURL? = nil, clientKeyFile: String? = nil, clientKeyID: String? = nil) {
        self.issuerSource = issuer.map { .fixed($0) }
        self.clientKeyFile = clientKeyFile
        self.clientKeyID = clientKeyID
        self.name = name
        self.grant = grant
        self.tokenURL = tokenURL
        self.clientID = clientID
        self.clientSecret = clientSecret
        self.clientAuth = clientAuth
        self.scope = scope
        self.params = params
        self.refreshBefore = refreshBefore
        self.defaultLifetime = defaultLifetime
        self.refreshTokenFile = refreshTokenFile
        self.username = username
        self.password = password
        self.tls = tls
        self.requestTimeout = requestTimeout
        self.waitTimeout = waitTimeout
        self.line = line
    }

    public static func == (a: SessionConfig, b: SessionConfig) -> Bool {
        a.name == b.name && a.grant == b.grant && a.tokenURL == b.tokenURL && a.clientID == b.clientID
            && a.clientSecret == b.clientSecret && a.clientAuth == b.clientAuth && a.scope == b.scope
            && a.params.elementsEqual(b.params, by: { $0 == $1 }) && a.refreshBefore == b.refreshBefore
            && a.defaultLifetime == b.defaultLifetime && a.refreshTokenFile == b.refreshTokenFile
            && a.username == b.username && a.password == b.password && a.tls == b.tls
            && a.requestTimeout == b.requestTimeout && a.waitTimeout == b.waitTimeout
            && a.command == b.command && a.commandTimeout == b.commandTimeout && a.issuerSource == b.issuerSource && a.clientKeyFile == b.clientKeyFile && a.clientKeyID == b.clientKeyID
            && a.authorizationEndpoint == b.authorizationEndpoint && a.deviceAuthorizationEndpoint == b.deviceAuthorizationEndpoint
            && a.redirectURI == b.redirectURI
            && a.assertionFile == b.assertionFile && a.clientAssertionFile == b.clientAssertionFile
            && a.audiences == b.audiences && a.resources == b.resources && a.exchange == b.exchange
            && a.dpop == b.dpop && a.dpopKeyFile == b.dpopKeyFile && a.signing == b.signing
    }

    /// The files whose content is a JWT sent as a credential (docs/architecture.md §6 "Files that hold
    /// credentials"), with the key naming each: opened by path for every token request.
    public var credentialFiles: [(key: String, path: String)] {
        var out: [(key: String, path: String)] = []
        if let assertionFile { out.append(("assertion_file", assertionFile)) }
        if case .file(let p)? = exchange?.subject { out.append(("subject_token_file", p)) }
        if let p = exchange?.actorTokenFile { out.append(("actor_token_file", p)) }
        if let clientAssertionFile { out.append(("client_assertion_file", clientAssertionFile)) }
        return out
    }
}

/// `grant: token_exchange` settings of a session (RFC 8693 §2.1).
public struct TokenExchangeConfig: Sendable, Equatable {
    /// Where the subject token comes from.
    public enum Subject: Sendable, Equatable {
        /// `subject_token_file:`, re-read for every request.
        case file(String)
        /// `subject_session:`: that session's current access token (sessions chain).
        case session(String)
        /// `subject: caller`: each incoming request's own bearer token (on behalf of callers,
        /// docs/architecture.md §6.16).
        case caller
    }
    public var subject: Subject
    /// `subject_token_type:`; default `…:jwt` for a file, `…:access_token` for a session.
    public var subjectTokenType: String
    public var actorTokenFile: String?
    /// `actor_token_type:`; default `…:jwt` when `actor_token_file` is set.
    public var actorTokenType: String?
    public var requestedTokenType: String?

    public init(subject: Subject, subjectTokenType: String, actorTokenFile: String? = nil,
                actorTokenType: String? = nil, requestedTokenType: String? = nil) {
        self.subject = subject
        self.subjectTokenType = subjectTokenType
        self.actorTokenFile = actorTokenFile
        self.actorTokenType = actorTokenType
        self.requestedTokenType = requestedTokenType
    }

    /// The session named by `subject_session:`, if any.
    public var subjectSession: String? {
        if case .session(let n) = subject { return n }
        return nil
    }
}

/// `replay_methods`: every method, or a listed set.
public enum ReplayMethods: Sendable, Equatable {
    case all
    case only(Set<String>)
    public func allows(_ method: String) -> Bool {
        switch self {
        case .all: return true
        case .only(let set): return set.contains(method)
        }
    }
}

/// Route `timeouts:`.
public struct RouteTimeouts: Sendable, Equatable {
    /// TCP connect plus TLS handshake. Default 5 s.
    public var connect: Duration = .seconds(5)
    /// From the request fully sent to the response head, and between response reads. Default 60 s.
    public var response: Duration = .seconds(60)
    /// How long an idle pooled upstream connection is kept. Default 60 s.
    public var idle: Duration = .seconds(60)
    public init() {}
}

/// One entry of `routes:`.
/// Where and how a route's token goes into the upstream request (`inject:`): the header, and the
/// text around the token (`format` split at `{token}`). Default `Authorization: Bearer {token}`.
public struct InjectConfig: Sendable, Equatable {
    public var header: String
    public var prefix: String
    public var suffix: String
    public init(header: String, prefix: String, suffix: String) {
        self.header = header
        self.prefix = prefix
        self.suffix = suffix
    }
    public static let bearer = InjectConfig(header: "Authorization", prefix: "Bearer ", suffix: "")

    /// The header's value for `token`.
    @inline(__always)
    public func value(_ token: String) -> String { prefix + token + suffix }
}

/// How a route talks to its upstream (docs/architecture.md §4 `http2:`).
public enum HTTP2Mode: String, Sendable, Equatable, CaseIterable {
    /// ALPN `h2,http/1.1` on https upstreams (HTTP/2 when the server picks it); HTTP/1.1 on http.
    case auto
    /// HTTP/2 without negotiation: h2c on http:// upstreams (gRPC servers); ALPN `h2` only on https.
    case priorKnowledge = "prior_knowledge"
    /// HTTP/1.1 only.
    case off
}

public struct RouteConfig: Sendable, Equatable {
    /// Path prefix, e.g. "/partner/".
    public var match: String
    /// Optional Host header to match (case-insensitive, port ignored).
    public var host: String?
    public var stripPrefix: Bool
    public var upstream: UpstreamURL
    public var session: String?
    public var tls: TLSSettings?
    public var timeouts: RouteTimeouts
    public var replayBodyLimit: Int
    public var rejectStatuses: [Int]
    public var replayMethods: ReplayMethods
    /// `http2:` (default `auto`).
    public var http2: HTTP2Mode
    /// `inject:` (default `Authorization: Bearer {token}`).
    public var inject: InjectConfig
    /// Whether `inject:` was written (a token of type `N_A` is sent only where it says how).
    public var injectConfigured = false
    /// `sign:`: requests are signed with the session's keys instead of carrying a token.
    public var sign: SignConfig?
    /// `caller_jwt:` (docs/architecture.md §6.16): only callers with a valid JWT get through.
    public var callerJWT: CallerJWTConfig?
    /// Source line of the route entry, for messages.
    public var line: Int

    public init(match: String, host: String? = nil, stripPrefix: Bool = false, upstream: UpstreamURL,
                session: String? = nil, tls: TLSSettings? = nil, timeouts: RouteTimeouts = RouteTimeouts(),
                replayBodyLimit: Int = 1 << 20, rejectStatuses: [Int] = [401], replayMethods: ReplayMethods = .all,
                http2: HTTP2Mode = .auto, inject: InjectConfig = .bearer, line: Int = 0) {
        self.http2 = http2
        self.inject = inject
        self.match = match
        self.host = host
        self.stripPrefix = stripPrefix
        self.upstream = upstream
        self.session = session
        self.tls = tls
        self.timeouts = timeouts
        self.replayBodyLimit = replayBodyLimit
        self.rejectStatuses = rejectStatuses
        self.replayMethods = replayMethods
        self.line = line
    }
}

/// A configuration error: `FILE:LINE: key: what is wrong`.
public struct ConfigError: Error, Sendable, Equatable, CustomStringConvertible {
    public var file: String
    public var line: Int
    /// Dotted key path, e.g. `routes[1].upstream` or `sessions.partner.client_secret_file`.
    public var key: String
    public var message: String
    public init(file: String, line: Int, key: String, message: String) {
        self.file = file
        self.line = line
        self.key = key
        self.message = message
    }
    /// `FILE:LINE: key: message`; the location parts are left out when unknown (line 0, empty key),
    /// e.g. `bearerd.yaml: cannot read: No such file or directory`.
    public var description: String {
        var parts: [String] = []
        if !file.isEmpty { parts.append(line > 0 ? "\(file):\(line)" : file) }
        if !key.isEmpty { parts.append(key) }
        parts.append(message)
        return parts.joined(separator: ": ")
    }
}

/// All errors found in one file (the loader reports every error it can, not just the first).
public struct ConfigErrors: Error, Sendable, CustomStringConvertible {
    public var errors: [ConfigError]
    public init(_ errors: [ConfigError]) { self.errors = errors }
    public var description: String { errors.map(\.description).joined(separator: "\n") }
}

extension RouteConfig {
    /// What the pure router and header rules need of this route.
    public var rule: RouteRule {
        RouteRule(match: match, host: host, stripPrefix: stripPrefix, upstreamBasePath: upstream.basePath,
                  upstreamAuthority: upstream.authority)
    }
}

/// `credentials:` of a signing session (`grant: aws`, `grant: aliyun`; docs/architecture.md §6.15).
public struct SigningCredentialsConfig: Sendable, Equatable {
    /// `region:` (`us-east-1`, `cn-hangzhou`): the signature's scope and the default STS endpoint.
    public var region: String
    /// `sts_url:`; default: the region's STS endpoint (`https://sts.REGION.amazonaws.com`,
    /// `https://sts.REGION.aliyuncs.com`). Used by `web_identity`, `assume_role`, `oidc_role`.
    public var stsURL: EndpointURL
    /// Exactly one source.
    public var source: CredentialSourceConfig

    public init(region: String, stsURL: EndpointURL, source: CredentialSourceConfig) {
        self.region = region
        self.stsURL = stsURL
        self.source = source
    }

    /// The files bearerd opens for every fetch (checked by `bearerd check`, named in errors).
    public var files: [(key: String, path: String)] {
        switch source {
        case .webIdentity(let w): return [("credentials.web_identity.token_file", w.tokenFile)]
        case .assumeRole(let a):
            var out = [("credentials.assume_role.access_key_id_file", a.keys.accessKeyIDFile),
                       ("credentials.assume_role.secret_access_key_file", a.keys.secretAccessKeyFile)]
            if let t = a.keys.sessionTokenFile { out.append(("credentials.assume_role.session_token_file", t)) }
            return out
        case .staticKeys(let k):
            var out = [("credentials.static.access_key_id_file", k.accessKeyIDFile),
                       ("credentials.static.secret_access_key_file", k.secretAccessKeyFile)]
            if let t = k.sessionTokenFile { out.append(("credentials.static.session_token_file", t)) }
            return out
        case .url(let u): return u.tokenFile.map { [("credentials.url_token_file", $0)] } ?? []
        case .oidcRole(let o): return [("credentials.oidc_role.token_file", o.tokenFile)]
        case .exec: return []
        }
    }
}

/// Where a signing session's keys come from: each yields a key id, a secret, a session token
/// (optional only for `static` and `exec`) and an expiration (none: re-read every `default_lifetime`).
public enum CredentialSourceConfig: Sendable, Equatable {
    /// AWS STS `AssumeRoleWithWebIdentity` with a projected token file re-read per call (EKS IRSA).
    case webIdentity(WebIdentity)
    /// AWS STS `AssumeRole`, signed (SigV4, service `sts`) with base keys read from files.
    case assumeRole(AssumeRole)
    /// A vending endpoint answering container-credentials JSON or seed 004's JSON (GET).
    case url(VendingURL)
    /// A helper printing `credential_process` JSON (Version 1); argv, no shell.
    case exec([String])
    /// Keys from files (session token optional), re-read every `default_lifetime`.
    case staticKeys(StaticKeys)
    /// Alibaba Cloud STS `AssumeRoleWithOIDC` with a projected token file (ACK RRSA).
    case oidcRole(OIDCRole)

    /// The key under `credentials:` (for messages and `bearerd check`).
    public var name: String {
        switch self {
        case .webIdentity: return "web_identity"
        case .assumeRole: return "assume_role"
        case .url: return "url"
        case .exec: return "exec"
        case .staticKeys: return "static"
        case .oidcRole: return "oidc_role"
        }
    }

    /// Key files: `access_key_id_file`, `secret_access_key_file`, optional `session_token_file`.
    public struct StaticKeys: Sendable, Equatable {
        public var accessKeyIDFile: String
        public var secretAccessKeyFile: String
        public var sessionTokenFile: String?
        public init(accessKeyIDFile: String, secretAccessKeyFile: String, sessionTokenFile: String? = nil) {
            self.accessKeyIDFile = accessKeyIDFile
            self.secretAccessKeyFile = secretAccessKeyFile
            self.sessionTokenFile = sessionTokenFile
        }
    }

    public struct WebIdentity: Sendable, Equatable {
        public var roleARN: String
        public var tokenFile: String
        /// `session_name:` (default `bearerd`), `RoleSessionName`.
        public var sessionName: String
        /// `duration:` (`DurationSeconds`); nil: the role's default.
        public var durationSeconds: Int?
        public init(roleARN: String, tokenFile: String, sessionName: String = "bearerd", durationSeconds: Int? = nil) {
            self.roleARN = roleARN
            self.tokenFile = tokenFile
            self.sessionName = sessionName
            self.durationSeconds = durationSeconds
        }
    }

    public struct AssumeRole: Sendable, Equatable {
        public var roleARN: String
        public var keys: StaticKeys
        public var externalID: String?
        public var sessionName: String
        public var durationSeconds: Int?
        public init(roleARN: String, keys: StaticKeys, externalID: String? = nil, sessionName: String = "bearerd",
                    durationSeconds: Int? = nil) {
            self.roleARN = roleARN
            self.keys = keys
            self.externalID = externalID
            self.sessionName = sessionName
            self.durationSeconds = durationSeconds
        }
    }

    public struct VendingURL: Sendable, Equatable {
        public var url: EndpointURL
        /// `url_headers:` sent as written (in file order).
        public var headers: [Header]
        /// `url_token_file:`: its content is sent as `Authorization`, re-read per call (the
        /// `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` of EKS Pod Identity).
        public var tokenFile: String?
        public struct Header: Sendable, Equatable {
            public var name: String
            public var value: String
            public init(name: String, value: String) { self.name = name; self.value = value }
        }
        public init(url: EndpointURL, headers: [Header] = [], tokenFile: String? = nil) {
            self.url = url
            self.headers = headers
            self.tokenFile = tokenFile
        }
    }

    public struct OIDCRole: Sendable, Equatable {
        public var roleARN: String
        public var oidcProviderARN: String
        public var tokenFile: String
        public var sessionName: String
        public var durationSeconds: Int?
        public init(roleARN: String, oidcProviderARN: String, tokenFile: String, sessionName: String = "bearerd",
                    durationSeconds: Int? = nil) {
            self.roleARN = roleARN
            self.oidcProviderARN = oidcProviderARN
            self.tokenFile = tokenFile
            self.sessionName = sessionName
            self.durationSeconds = durationSeconds
        }
    }
}

/// A route's `sign:` (docs/architecture.md §6.15).
public struct SignConfig: Sendable, Equatable {
    /// `service:` for SigV4 (`s3`, `execute-api`, `bedrock`, …); nil for OSS (always `oss`).
    public var service: String?
    /// `bucket:` for OSS when the upstream host does not name it (`BUCKET.oss-REGION.aliyuncs.com`).
    public var bucket: String?
    /// `payload:`: `unsigned` (default for S3 and OSS: bodies stream) or `signed`.
    public var payload: Payload
    /// Source line of the `sign:` key, for messages.
    public var line: Int = 0

    public enum Payload: String, Sendable, Equatable, CaseIterable {
        /// `UNSIGNED-PAYLOAD`: the body is not hashed and streams.
        case unsigned
        /// The body's SHA-256 is signed: the body is read first (up to `replay_body_limit`).
        case signed
    }

    public init(service: String?, bucket: String? = nil, payload: Payload) {
        self.service = service
        self.bucket = bucket
        self.payload = payload
    }
}
