import Dispatch
import Foundation
import BearerdHTTP
import BearerdIO
import Logging

/// The running proxy: event loops, listeners, the admin listener and each loop's context.
///
/// Created and controlled from the main thread (start, reload, shutdown); per-loop state is
/// changed only by hopping onto that loop. `runtime` is the configuration in force, swapped
/// whole on reload.
public final class BearerdServer: @unchecked Sendable {  // @unchecked: mutable state below is only touched from the controlling thread
    public private(set) var runtime: ProxyRuntime
    public let group: EventLoopGroup
    /// The token sessions (DESIGN §6), each on its own serial queue.
    public let sessions: SessionManager
    private var contexts: [LoopContext] = []
    private var listeners: [Listener] = []
    private var adminListener: Listener?
    public private(set) var boundAddresses: [SocketAddress] = []
    public private(set) var adminAddress: SocketAddress?
    private let logger: Logger
    private let extraResponder: LocalResponder?
    private var adminContexts: [LoopContext] = []

    /// - Parameter responder: when set, every listener answers locally instead of proxying (demo and test upstreams).
    public init(config: BearerdConfig, logger: Logger, accessLog: Bool = true, responder: LocalResponder? = nil,
                environment: [String: String] = ProcessInfo.processInfo.environment) throws(ConfigErrors) {
        sessions = try SessionManager(config: config, logger: logger, environment: environment)
        runtime = try ProxyRuntime(config: config, logger: logger, accessLog: accessLog, sessions: sessions)
        self.logger = logger
        extraResponder = responder
        group = EventLoopGroup(count: config.loops ?? EventLoopGroup.coreCount, ioMode: config.ioMode ?? .fromEnvironment)
        contexts = group.loops.map { LoopContext(loop: $0, runtime: runtime) }
    }

    /// Binds every listener; throws on the first one that cannot be bound. Listeners matched by
    /// a socket-activated fd in `inherited` (`SocketActivation.match`) use it instead of binding;
    /// inherited fds that match no listener are logged and closed.
    public func start(inheriting inherited: [SocketActivation.Inherited] = []) throws(IOError) {
        Sys.ignoreSIGPIPE()
        sessions.start()
        let activation = SocketActivation.match(inherited, listeners: runtime.config.listeners, admin: runtime.config.admin)
        for s in activation.unmatched {
            logger.warning("closing an inherited socket that matches no configured listener", metadata: ["socket": "\(s)"])
            close(s.fd)
        }
        for (index, address) in runtime.config.listen.enumerated() {
            let l = try bind(address, responder: extraResponder, inherited: activation.listeners[index])
            listeners.append(l)
            boundAddresses.append(l.localAddress)
        }
        if let admin = runtime.config.admin {
            let l = try bind(admin, responder: AdminResponder(server: self), inherited: activation.admin)
            adminListener = l
            adminAddress = l.localAddress
        }
        logger.info("bearerd started", metadata: [
            "listen": "\(boundAddresses.map(\.description).joined(separator: ","))",
            "loops": "\(group.loops.count)",
            "routes": "\(runtime.config.routes.count)",
        ])
    }

    /// `inherited`: a socket-activated fd to accept on instead of binding `address`.
    private func bind(_ address: ListenAddress, responder: LocalResponder?, inherited: Int32? = nil) throws(IOError) -> Listener {
        let contexts = self.contexts
        let accept: (Int32, SocketAddress, EventLoop) -> Void = { fd, peer, loop in
            let ctx = contexts[loop.index]
            loop.runEvent {
                let channel = SocketChannel(fd: fd, loop: loop)
                let conn = FrontendConnection(channel: channel, ctx: ctx, peer: peer, local: responder)
                conn.start()
            }
        }
        if let inherited {
            logger.info("using a socket-activated listener", metadata: ["listen": "\(address)", "fd": "\(inherited)"])
            return try Listener.adopt(fd: inherited, group: group, onAccept: accept)
        }
        switch address {
        case .tcp(let host, let port):
            return try Listener.bind(host: host, port: port, group: group, onAccept: accept)
        case .unix(let path):
            return try Listener.bindUnix(path: path, group: group, onAccept: accept)
        }
    }

    /// Installs a new configuration (SIGHUP). Listener changes need a restart and are reported.
    public func reload(_ config: BearerdConfig, environment: [String: String] = ProcessInfo.processInfo.environment) throws(ConfigErrors) {
        try sessions.reload(config, environment: environment)
        let next = try ProxyRuntime(config: config, logger: logger, accessLog: runtime.accessLog, sessions: sessions)
        if config.listen != runtime.config.listen || config.admin != runtime.config.admin {
            logger.warning("listen/admin changes take effect after a restart")
        }
        runtime = next
        for ctx in contexts {
            ctx.loop.execute { ctx.runtime = next }
        }
        logger.info("configuration reloaded", metadata: ["routes": "\(config.routes.count)"])
    }

    /// Stops accepting, lets in-flight exchanges finish for up to `grace`, then calls `completion`
    /// (on an arbitrary queue).
    public func shutdown(grace: Duration, completion: @escaping @Sendable () -> Void) {
        for l in listeners { l.stop() }
        adminListener?.stop()
        let deadline = monotonicNanos() + grace.nanoseconds
        for ctx in contexts {
            ctx.loop.execute {
                ctx.draining = true
                for (_, f) in ctx.frontends { f.drain() }
            }
        }
        let contexts = self.contexts
        let sessions = self.sessions
        @Sendable func poll() {
            let group = DispatchGroup()
            let counter = Counter()
            for ctx in contexts {
                group.enter()
                ctx.loop.execute {
                    counter.add(ctx.frontends.count)
                    group.leave()
                }
            }
            group.notify(queue: .global()) {
                if counter.value == 0 || monotonicNanos() >= deadline {
                    for ctx in contexts {
                        ctx.loop.execute {
                            for (_, f) in ctx.frontends { f.channel.close() }
                            ctx.pool.closeAll()
                        }
                    }
                    sessions.stop()
                    DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(50)) { completion() }
                } else {
                    DispatchQueue.global().asyncAfter(deadline: .now() + .milliseconds(50)) { poll() }
                }
            }
        }
        poll()
    }

    /// Sums every loop's counters (hops onto each loop; never blocks one).
    public func collectMetrics(completion: @escaping @Sendable (LoopMetrics) -> Void) {
        let group = DispatchGroup()
        let lock = Lock()
        let box = MetricsBox()
        for ctx in contexts {
            group.enter()
            ctx.loop.execute {
                var m = ctx.metrics
                m.openConnections = ctx.frontends.count
                lock.withLock { box.total.merge(m) }
                group.leave()
            }
        }
        group.notify(queue: .global()) {
            completion(lock.withLock { box.total })
        }
    }
}

/// Accumulator for `collectMetrics`, guarded by the caller's lock.
final class MetricsBox: @unchecked Sendable {  // @unchecked: only touched under the caller's lock
    var total = LoopMetrics()
}

/// A lock-protected counter for the shutdown poll.
final class Counter: @unchecked Sendable {  // @unchecked: guarded by `lock`
    private let lock = Lock()
    private var v = 0
    func add(_ n: Int) { lock.withLock { v += n } }
    var value: Int { lock.withLock { v } }
}

/// The admin endpoints: `GET /healthz`, `/readyz`, `/metrics` (Prometheus text format 0.0.4).
final class AdminResponder: LocalResponder, @unchecked Sendable {  // @unchecked: `server` is weak and only read
    weak var server: BearerdServer?
    init(server: BearerdServer) { self.server = server }

    func respond(to head: HTTPRequestHead, body: [UInt8], loop: EventLoop, reply: @escaping (HTTPResponseHead, [UInt8]) -> Void) {
        let path = head.target.split(separator: "?", maxSplits: 1).first.map(String.init) ?? head.target
        @Sendable func text(_ status: Int, _ s: String, type: String = "text/plain; charset=utf-8") {
            reply(HTTPResponseHead(status: status, reason: ErrorResponse.reasonPhrase(status), headers: ["Content-Type": type]), Array(s.utf8))
        }
        guard head.method == "GET" || head.method == "HEAD" else {
            text(405, "method not allowed\n")
            return
        }
        switch path {
        case "/healthz":
            text(200, "ok\n")
        case "/readyz":
            // Ready when every session can hand out a token now (DESIGN §4 admin).
            guard let server else { text(503, "shutting down\n"); return }
            let now = monotonicNanos()
            var notReady: [String] = []
            for name in server.sessions.sessionNames {
                guard let d = server.sessions.session(named: name) else { continue }
                if d.usableToken(now: now) == nil && d.status != .ready { notReady.append("\(name): \(d.status)") }
            }
            if notReady.isEmpty {
                text(200, "ready\n")
            } else {
                text(503, "not ready\n" + notReady.joined(separator: "\n") + "\n")
            }
        case "/metrics":
            guard let server else { text(503, "shutting down\n"); return }
            let sessionLines = AdminResponder.sessionMetrics(server.sessions)
            server.collectMetrics { m in
                let body = AdminResponder.prometheus(m) + sessionLines
                loop.execute { text(200, body, type: "text/plain; version=0.0.4") }
            }
        default:
            text(404, "not found\n")
        }
    }

    static func sessionMetrics(_ sessions: SessionManager) -> String {
        var s = ""
        let names = sessions.sessionNames
        guard !names.isEmpty else { return s }
        let series: [(String, String, (SessionMetrics) -> UInt64)] = [
            ("bearerd_token_requests_total", "Token endpoint requests sent.", { $0.tokenRequests }),
            ("bearerd_tokens_obtained_total", "Access tokens obtained from the token endpoint.", { $0.tokensObtained }),
            ("bearerd_tokens_adopted_total", "Tokens adopted from the state file.", { $0.tokensAdopted }),
            ("bearerd_token_failures_retryable_total", "Token requests failed transiently.", { $0.failuresRetryable }),
            ("bearerd_token_failures_permanent_total", "Token requests failed permanently.", { $0.failuresPermanent }),
            ("bearerd_token_failures_invalid_grant_total", "Refresh tokens refused (invalid_grant).", { $0.failuresInvalidGrant }),
            ("bearerd_forced_refreshes_total", "Refreshes triggered by upstream rejections.", { $0.forcedRefreshes }),
            ("bearerd_breaker_trips_total", "Times the rejection breaker opened.", { $0.breakerTrips }),
        ]
        for (metric, help, value) in series {
            s += "# HELP \(metric) \(help)\n# TYPE \(metric) counter\n"
            for name in names {
                guard let d = sessions.session(named: name) else { continue }
                s += "\(metric){session=\"\(name)\"} \(value(d.metrics))\n"
            }
        }
        s += "# HELP bearerd_session_ready Whether the session can hand out a token now.\n# TYPE bearerd_session_ready gauge\n"
        let now = monotonicNanos()
        for name in names {
            guard let d = sessions.session(named: name) else { continue }
            s += "bearerd_session_ready{session=\"\(name)\"} \(d.usableToken(now: now) != nil ? 1 : 0)\n"
        }
        return s
    }

    static func prometheus(_ m: LoopMetrics) -> String {
        var s = "# HELP bearerd_requests_total Requests answered, by status.\n# TYPE bearerd_requests_total counter\n"
        for (status, n) in m.requests.sorted(by: { $0.key < $1.key }) {
            s += "bearerd_requests_total{status=\"\(status)\"} \(n)\n"
        }
        s += "# HELP bearerd_upstream_errors_total Upstream failures, by kind.\n# TYPE bearerd_upstream_errors_total counter\n"
        for (kind, n) in m.upstreamErrors.sorted(by: { $0.key < $1.key }) {
            s += "bearerd_upstream_errors_total{error=\"\(kind)\"} \(n)\n"
        }
        s += "# HELP bearerd_response_body_bytes_total Response body bytes sent to clients.\n# TYPE bearerd_response_body_bytes_total counter\n"
        s += "bearerd_response_body_bytes_total \(m.responseBytes)\n"
        s += "# HELP bearerd_open_connections Client connections open now.\n# TYPE bearerd_open_connections gauge\n"
        s += "bearerd_open_connections \(m.openConnections)\n"
        return s
    }
}

