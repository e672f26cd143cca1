import BearerdHTTP
import BearerdIO
import Logging
import BearerdTLS
import BearerdProxyCore
import BearerdConfig
import BearerdSessions
import BearerdService

/// Everything derived from one configuration that request handling needs: the router, one
/// `UpstreamTarget` per route (TLS contexts built once), limits and timeouts. Immutable; each loop
/// holds the current one and is handed a new one on SIGHUP (`LoopContext.runtime`).
/// A formatted credential (`inject.value(token)`) kept by a loop's token cache. Immutable.
final class CachedCredential {
    let token: String
    let inject: InjectConfig
    let value: String
    init(token: String, inject: InjectConfig, value: String) {
        self.token = token
        self.inject = inject
        self.value = value
    }
}

/// One route's configuration, shared by reference. Immutable.
final class RouteRef: Sendable {
    let config: RouteConfig
    /// `config.rejectStatuses` as the exchange machine keeps it (built once, not per request).
    let rejectSet: StatusCodeSet
    /// How a `sign:` route signs (from its session's `grant:` and `region:`); nil elsewhere.
    let signing: RouteSigning?
    /// `issuer: from_upstream`: warns when a rejection names other metadata (nil elsewhere).
    let issuerWatch: UpstreamIssuerWatch?
    init(_ config: RouteConfig, sessions: [SessionConfig] = []) {
        self.config = config
        issuerWatch = UpstreamIssuerWatch(route: config, sessions: sessions)
        signing = RouteSigning.plan(route: config, sessions: sessions)
        rejectSet = RouteSigning.rejectSet(route: config, signing: signing)
    }
}

/// A route's use of the caller's own bearer token (docs/architecture.md §6.16): validated by the
/// route's `caller_jwt:` guard, exchanged by an on-behalf-of session, both, or neither. Immutable.
struct RouteCallerPolicy {
    let guardian: CallerJWTGuard?
    let onBehalfOf: CallerSessionDriver?
    /// The request must carry `Authorization: Bearer`, which never reaches the upstream.
    var needsCallerToken: Bool { guardian != nil || onBehalfOf != nil }
}

public final class ProxyRuntime: @unchecked Sendable {  // @unchecked: immutable after init
    public let config: BearerdConfig
    public let router: Router
    public let targets: [UpstreamTarget]
    /// Each route's configuration behind a reference, so an exchange holds it without copying
    /// (and retaining) its many fields per request.
    let routeRefs: [RouteRef]
    /// The token session of each route (nil for routes without `session`).
    public let routeSessions: [TokenSessionDriver?]
    /// How each route treats the caller's own bearer token (docs/architecture.md §6.16).
    let routeCallers: [RouteCallerPolicy]
    public let logger: Logger
    /// `logger`'s handler when it is bearerd's own: access lines are handed to it directly
    /// (no metadata dictionary, existential box and cast per request). nil with any other
    /// handler (tests that capture logs), which gets them through `logger`.
    let accessHandler: BearerdLogHandler?
    /// Write one access-log line per request.
    public let accessLog: Bool
    /// `logger` logs at trace level (the upstream request and response heads, redacted). Read
    /// once here: asking `logger.logLevel` copies the logger's handler per request (measured).
    let tracesExchanges: Bool
    /// `tracing:` (docs/architecture.md §2.9): nil when traces are off (one nil check per request).
    let tracer: Tracer?
    let headerReadTimeout: UInt64
    let idleTimeout: UInt64
    /// The Host allowlist of each configured listener under this configuration (its routes'
    /// hosts included), built once here so requests only look names up.
    let hostAllowlists: [(address: ListenAddress, allowlist: HostAllowlist)]
    /// The server TLS context of each listener with `tls:` (ALPN h2,http/1.1), built once.
    let listenerTLS: [(address: ListenAddress, context: TLSContext)]

    public init(config: BearerdConfig, logger: Logger, accessLog: Bool = true, sessions: SessionManager? = nil) throws(ConfigErrors) {
        self.config = config
        self.logger = logger
        accessHandler = logger.handler as? BearerdLogHandler
        tracesExchanges = logger.logLevel <= .trace
        tracer = sessions?.tracer
        self.accessLog = accessLog
        router = Router(rules: config.routes.map(\.rule))
        routeRefs = config.routes.map { RouteRef($0, sessions: config.sessions) }
        var targets: [UpstreamTarget] = []
        var errors: [ConfigError] = []
        var listenerTLS: [(address: ListenAddress, context: TLSContext)] = []
        for (i, l) in config.listeners.enumerated() {
            guard let tls = l.tls else { continue }
            do throws(TLSError) {
                listenerTLS.append((l.address, try TLSContext.server(certificateChainFile: tls.cert, privateKeyFile: tls.key, clientCAFile: nil,
                                                                     requireClientCertificate: false, alpn: ["h2", "http/1.1"])))
            } catch {
                errors.append(ConfigError(file: config.file, line: l.line, key: "listen[\(i)].tls", message: error.message))
            }
        }
        self.listenerTLS = listenerTLS
        for (i, r) in config.routes.enumerated() {
            do {
                targets.append(try UpstreamTarget(url: r.upstream, tls: r.tls, timeouts: r.timeouts, http2: r.http2,
                                                  outboundProxy: config.outboundProxy))
            } catch {
                errors.append(ConfigError(file: config.file, line: r.line, key: "routes[\(i)].tls", message: error.message))
            }
        }
        var routeSessions: [TokenSessionDriver?] = []
        for (i, r) in config.routes.enumerated() {
            guard let name = r.session else { routeSessions.append(nil); continue }
            if let d = sessions?.session(named: name) {
                routeSessions.append(d)
            } else {
                routeSessions.append(nil)
                errors.append(ConfigError(file: config.file, line: r.line, key: "routes[\(i)].session", message: "session '\(name)' is not running"))
            }
        }
        var routeCallers: [RouteCallerPolicy] = []
        for (i, r) in config.routes.enumerated() {
            var guardian: CallerJWTGuard?
            if let c = r.callerJWT {
                do throws(ConfigErrors) {
                    guardian = try sessions?.routeGuard(for: c, route: r.match)
                } catch {
                    errors += error.errors.map { e in
                        var e = e
                        e.file = config.file
                        e.key = "routes[\(i)].caller_jwt"
                        return e
                    }
                }
            }
            routeCallers.append(RouteCallerPolicy(guardian: guardian, onBehalfOf: routeSessions[i]?.caller))
        }
        if !errors.isEmpty { throw ConfigErrors(errors) }
        self.targets = targets
        self.routeSessions = routeSessions
        self.routeCallers = routeCallers
        headerReadTimeout = config.frontendTimeouts.headerRead.nanoseconds
        idleTimeout = config.frontendTimeouts.idle.nanoseconds
        let routeHosts = config.routes.compactMap(\.host)
        hostAllowlists = config.listeners.map { ($0.address, HostAllowlist(listener: $0, routeHosts: routeHosts)) }
    }

    /// The server TLS context of `listener` under this configuration, if it has `tls:`.
    func tlsContext(for listener: ListenerConfig) -> TLSContext? {
        listenerTLS.first(where: { $0.address == listener.address })?.context
    }

    /// The Host allowlist of `listener` under this configuration (built here if the listener is
    /// not one of this configuration's, e.g. one a reload removed that still has connections).
    func hostAllowlist(for listener: ListenerConfig) -> HostAllowlist {
        if let entry = hostAllowlists.first(where: { $0.address == listener.address }) { return entry.allowlist }
        return HostAllowlist(listener: listener, routeHosts: config.routes.compactMap(\.host))
    }
}

/// The state one loop owns: its upstream pool, its frontend connections, its copy of the
/// runtime, its metrics. Touched only on `loop`.
///
/// Invariant: `routeSlots[i]` is the `metrics.routes` slot of route `i` of `runtime`
/// (recomputed whenever `runtime` is replaced; slots are never removed, so an exchange that
/// keeps the slot it started with stays correct across a reload).
final class LoopContext {
    let loop: EventLoop
    let pool: BackendPool
    var runtime: ProxyRuntime {
        didSet {
            if runtime !== oldValue {
                assignRouteSlots()
                hostChecks = []  // the allowlists depend on the configuration's routes
                admittedPolicy = nil
            }
        }
    }
    /// The loop's client connections, each at its `frontendSlot`: joining and leaving cost no
    /// hashing (a dictionary and a deadline registration per connection cost ~1,400 of the ~48,000
    /// instructions of a new connection, bench/RESULTS.md). Their deadlines are swept by one
    /// registration per loop (`deadlineSweep`, registered while there is a connection) on the
    /// loop's tick.
    @exclusivity(unchecked) private(set) var frontends: [ClientConnection] = []
    /// Registered with the loop while `frontends` is not empty (the sweep holds this context
    /// strongly, as the connections do; the cycle ends with the last connection).
    @exclusivity(unchecked) private var deadlineSweep: FrontendDeadlineSweep?
    @exclusivity(unchecked) var metrics = LoopMetrics()
    @exclusivity(unchecked) private(set) var routeSlots: [Int] = []
    /// Set on shutdown: finish in-flight exchanges, keep no connection alive.
    @exclusivity(unchecked) var draining = false
    /// The request field lines this loop's client connections parsed lately (their parsers
    /// share it; the responses' are the pool's).
    let requestLines = HTTP1Parser.FieldLineCache()
    /// The text of the client address this loop's last connection came from (`clientHost`).
    @exclusivity(unchecked) private var peerHosts = SocketAddress.HostMemo()

    /// One listener's Host allowlist under `runtime` (docs/architecture.md §4 `listen:`), built once per
    /// loop, not per connection. The policy is held, so its identity is never another's.
    private struct HostCheck {
        let policy: ListenerPolicy
        let allowlist: HostAllowlist
    }
    /// At most `maximumHostChecks` (one per listener in practice); emptied when `runtime` changes.
    @exclusivity(unchecked) private var hostChecks: [HostCheck] = []
    private static let maximumHostChecks = 16
    /// The last `Host` value admitted for an origin-form request, and by which listener (one of
    /// `hostChecks`, so the identity is of a live policy): loop-wide, as a check's answer depends
    /// only on the allowlist and the authority, and a loop's clients mostly name one host, so a
    /// new connection's first request skips the check too. Cleared with `hostChecks`.
    @exclusivity(unchecked) private var admittedPolicy: ObjectIdentifier?
    @exclusivity(unchecked) private var admittedHost = ""

    init(loop: EventLoop, runtime: ProxyRuntime) {
        self.loop = loop
        self.runtime = runtime
        pool = BackendPool(loop: loop)
        assignRouteSlots()
    }

    /// The numeric text of a client's address ("127.0.0.1", "::1"; "unix"), as
    /// `SocketAddress.host` gives it, without formatting it again for the same address.
    func clientHost(_ peer: SocketAddress) -> String {
        peerHosts.host(of: peer)
    }

    /// Whether `policy`'s Host allowlist admits a request with this target and `Host` field;
    /// refused: the authority that was checked (nil: the request named none).
    func checkHost(target: String, hostField: String?, policy: ListenerPolicy) -> HostAdmission {
        let originForm = target.utf8.first == UInt8(ascii: "/")
        if originForm, let hostField, admittedPolicy == ObjectIdentifier(policy), hostField == admittedHost { return .admitted }
        let allowlist: HostAllowlist
        if let found = hostChecks.first(where: { $0.policy === policy }) {
            allowlist = found.allowlist
        } else {
            if hostChecks.count >= Self.maximumHostChecks {
                hostChecks.removeFirst()
                admittedPolicy = nil  // it may have been the one removed
            }
            allowlist = policy.loopbackNamesOnly ? HostAllowlist(listener: policy.config, routeHosts: [])
                                                 : runtime.hostAllowlist(for: policy.config)
            hostChecks.append(HostCheck(policy: policy, allowlist: allowlist))
        }
        let authority = HostAllowlist.requestAuthority(target: target, hostField: hostField)
        guard allowlist.admits(authority) else { return .refused(authority: authority) }
        if originForm, let hostField {
            admittedPolicy = ObjectIdentifier(policy)
            admittedHost = hostField
        }
        return .admitted
    }

    /// A client connection starts on this loop (on `loop`).
    func addFrontend(_ c: ClientConnection) {
        guard c.frontendSlot < 0 else { return }
        c.frontendSlot = frontends.count
        frontends.append(c)
        if deadlineSweep == nil {
            let sweep = FrontendDeadlineSweep(self)
            deadlineSweep = sweep
            loop.register(sweep)
        }
    }

    /// A client connection ended or passed its channel on (on `loop`); the last one moves into
    /// its slot.
    func removeFrontend(_ c: ClientConnection) {
        let i = c.frontendSlot
        guard i >= 0, i < frontends.count, frontends[i] === c else { return }
        c.frontendSlot = -1
        let last = frontends.removeLast()
        if i < frontends.count {
            frontends[i] = last
            last.frontendSlot = i
        }
        if frontends.isEmpty, let sweep = deadlineSweep {
            deadlineSweep = nil
            loop.unregister(sweep)
        }
    }

    /// The tick's check of every client connection's deadline, as the loop checks registered ones.
    fileprivate func sweepFrontendDeadlines(now: UInt64) {
        var expired: [ClientConnection] = []
        for f in frontends {
            let d = f.deadline
            if d != 0 && d <= now { expired.append(f) }
        }
        for f in expired { f.deadlineExpired(now: now) }
    }

    private func assignRouteSlots() {
        routeSlots = runtime.config.routes.map { metrics.slot(for: RouteMetrics.label(host: $0.host, match: $0.match)) }
        tokenCache = Array(repeating: CachedToken(), count: runtime.routeSessions.count)
    }

    /// This loop's copy of each route's published token (`runtime.routeSessions[i]`), with the
    /// publication version it was read at: the request path reads it with one atomic load and no
    /// mutex; the session's lock is taken only when the version moved (docs/architecture.md §2.5).
    private struct CachedToken {
        var version: UInt64 = .max
        var token: PublishedToken?
        /// `inject:`'s value for `token` (`Bearer <token>`), built once per token, not per request.
        var credential: CachedCredential?
    }
    @exclusivity(unchecked) private var tokenCache: [CachedToken] = []

    /// The token of route `index` of `runtime` if it may be used now without asking the session.
    /// `runtime` must be this loop's current one (else the session is asked directly).
    func usableToken(route index: Int, of runtime: ProxyRuntime, session: TokenSessionDriver, now: UInt64) -> PublishedToken? {
        guard runtime === self.runtime, index >= 0, index < tokenCache.count else { return session.usableToken(now: now) }
        let version = session.publishedVersion
        if tokenCache[index].version != version {
            // Read after the version: the token is at least as new as `version` says.
            tokenCache[index] = CachedToken(version: version, token: session.publishedToken)
        }
        guard let t = tokenCache[index].token, now < t.usableUntil else { return nil }
        return t
    }

    /// The credential field's value for `token` on route `index` (`inject.value(token.value)`),
    /// from this loop's cache when the same token was formatted before.
    func credentialValue(route index: Int, of runtime: ProxyRuntime, token: PublishedToken, inject: InjectConfig) -> String {
        guard runtime === self.runtime, index >= 0, index < tokenCache.count else { return inject.value(token.value) }
        // The same token's string compares by its storage first: O(1) for the cached copy.
        if let c = tokenCache[index].credential, c.token == token.value, c.inject == inject { return c.value }
        let value = inject.value(token.value)
        tokenCache[index].credential = CachedCredential(token: token.value, inject: inject, value: value)
        return value
    }

    /// A copy of the counters with the gauges filled in (`/metrics`). On `loop`.
    func metricsSnapshot() -> LoopMetrics {
        var m = metrics
        m.openConnections = frontends.reduce(0) { $0 + ($1.isProxyConnection ? 1 : 0) }
        m.idleUpstreamConnections = pool.idleCount
        return m
    }
}

/// The answer of `LoopContext.checkHost`.
enum HostAdmission {
    case admitted
    /// `authority`: the one checked (nil: the request named none).
    case refused(authority: Substring?)
}

/// The one loop registration behind every client connection's deadline (`LoopContext.frontends`):
/// due on every tick while the loop has client connections (registered only then).
private final class FrontendDeadlineSweep: LoopTimeoutable {
    let ctx: LoopContext
    init(_ ctx: LoopContext) { self.ctx = ctx }
    var deadline: UInt64 { ctx.frontends.isEmpty ? 0 : 1 }
    func deadlineExpired(now: UInt64) { ctx.sweepFrontendDeadlines(now: now) }
}
