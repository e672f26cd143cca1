import Dispatch
import Foundation
import BearerdHTTP
import BearerdIO
import BearerdTLS
import Logging
import BearerdProxyCore
import BearerdConfig
import BearerdSessions
import BearerdService

/// The running proxy: event loops, listeners, the admin listener and each loop's context.
///
/// Created and controlled from the main thread (start, reload, shutdown); per-loop state is
/// changed only by hopping onto that loop. `runtime` is the configuration in force, swapped
/// whole on reload.
public final class BearerdServer: @unchecked Sendable {  // @unchecked: mutable state below is only touched from the controlling thread
    public private(set) var runtime: ProxyRuntime
    public let group: EventLoopGroup
    /// The token sessions (docs/architecture.md §6), each on its own serial queue.
    public let sessions: SessionManager
    /// Starting, serving or shutting down (for `/readyz`).
    public let lifecycle = ServerLifecycle()
    private var contexts: [LoopContext] = []
    /// The proxy listeners in force, in `runtime.config.listeners` order.
    private var running: [RunningListener] = []
    private var adminListener: Listener?
    /// `token_api:` (TokenAPIListener.swift).
    let tokenAPI = TokenAPIHost()
    /// The client-connection budget every listener accepts under (RLIMIT_NOFILE less a reserve,
    /// halved for the upstream connections); configured once the listeners are bound.
    public let acceptBudget = AcceptBudget()
    /// Descriptors open once `start()` had bound everything (the budget's baseline).
    private var descriptorsAtStart = 0
    /// Where the token API listens (nil without `token_api:`).
    public var tokenAPIAddress: SocketAddress? { tokenAPI.localAddress }
    public private(set) var boundAddresses: [SocketAddress] = []
    public private(set) var adminAddress: SocketAddress?
    private let logger: Logger
    private let extraResponder: LocalResponder?
    private var adminContexts: [LoopContext] = []
    /// Where scrapes and the shutdown poll gather the loops' answers: a queue of our own, so a
    /// busy global pool (DNS lookups block threads there) cannot stall /metrics or a drain.
    private let controlQueue = DispatchQueue(label: "bearerd.control")
    /// What is listening now, for status lines read on other threads (systemd's STATUS=).
    private let summaryLock = Lock()
    private var _listenerSummary: [String] = []
    public var listenerSummary: [String] { summaryLock.withLock { _listenerSummary } }

    private func publishListeners() {
        var list = running.map { "\($0.config.address)" }
        if let admin = runtime.config.admin { list.append("admin \(admin)") }
        summaryLock.withLock { _listenerSummary = list }
    }

    /// - Parameter responder: when set, every listener answers locally instead of proxying (demo and test upstreams).
    public init(config: BearerdConfig, logger: Logger, accessLog: Bool = true, responder: LocalResponder? = nil,
                environment: [String: String] = ProcessInfo.processInfo.environment) throws(ConfigErrors) {
        sessions = try SessionManager(config: config, logger: logger, environment: environment)
        runtime = try ProxyRuntime(config: config, logger: logger, accessLog: accessLog, sessions: sessions)
        self.logger = logger
        extraResponder = responder
        group = EventLoopGroup(count: config.loops ?? EventLoopGroup.coreCount, ioMode: config.ioMode.flatMap { EventLoop.IOMode(rawValue: $0.rawValue) } ?? .fromEnvironment)
        contexts = group.loops.map { LoopContext(loop: $0, runtime: runtime) }
    }

    /// Binds every listener; throws on the first one that cannot be bound. Listeners matched by
    /// a socket-activated fd in `inherited` (`SocketActivation.match`) use it instead of binding;
    /// inherited fds that match no listener are logged and closed.
    public func start(inheriting inherited: [SocketActivation.Inherited] = []) throws(IOError) {
        Sys.ignoreSIGPIPE()
        let rlimit = Sys.raiseDescriptorLimit()
        if rlimit.after > rlimit.before {
            logger.info("raised the descriptor limit (RLIMIT_NOFILE) to its hard limit", metadata: ["from": "\(rlimit.before)", "to": "\(rlimit.after)"])
        }
        acceptBudget.events = { [logger] event in
            switch event {
            case .pausedAtBudget(let open, let budget, let limit):
                logger.warning("connection budget reached: accepting paused until a connection closes", metadata: [
                    "connections": "\(open)", "connection_budget": "\(budget)", "rlimit_nofile": "\(limit)",
                ])
            case .streakEnded(let refused, let open, let budget):
                logger.info("below the connection budget again: accepting freely", metadata: [
                    "pauses": "\(refused)", "connections": "\(open)", "connection_budget": "\(budget)",
                ])
            case .outOfDescriptors(let e, let budget, let limit):
                logger.warning("out of descriptors although below the connection budget: accepting paused briefly", metadata: [
                    "error": "\(String(cString: strerror(e)))", "connection_budget": "\(budget)", "rlimit_nofile": "\(limit)",
                ])
            }
        }
        sessions.start()
        let activation = SocketActivation.match(inherited, listeners: runtime.config.listeners, admin: runtime.config.admin)
        for s in activation.unmatched {
            logger.warning("closing an inherited socket that matches no configured listener", metadata: ["socket": "\(s)"])
            close(s.fd)
        }
        for (index, listener) in runtime.config.listeners.enumerated() {
            running.append(try open(listener, inherited: activation.listeners[index]))
        }
        boundAddresses = running.map(\.listener.localAddress)
        if let admin = runtime.config.admin {
            let l = try bind(admin, policy: Self.adminPolicy(admin), responder: AdminResponder(server: self), inherited: activation.admin)
            adminListener = l
            adminAddress = l.localAddress
        }
        try tokenAPI.start(runtime.config, server: self)
        descriptorsAtStart = Sys.openDescriptorCount() ?? 0
        configureBudget(runtime.config)
        publishListeners()
        lifecycle.phase = .serving
        logger.info("bearerd started", metadata: [
            "listen": "\(boundAddresses.map(\.description).joined(separator: ","))",
            "loops": "\(group.loops.count)",
            "routes": "\(runtime.config.routes.count)",
            "connection_budget": "\(acceptBudget.snapshot.budget)",
        ])
    }

    /// The budget under `config`: the soft RLIMIT_NOFILE, the descriptors open at start, and
    /// the reserve for `config`'s sessions and listeners (`DescriptorBudget.reserve`).
    private func configureBudget(_ config: BearerdConfig) {
        guard let limit = Sys.descriptorLimits()?.soft else { return }
        let listeners = config.listeners.count + (config.admin == nil ? 0 : 1) + (config.tokenAPI == nil ? 0 : 1)
        acceptBudget.configure(limit: limit, inUse: descriptorsAtStart,
                               reserve: DescriptorBudget.reserve(sessions: config.sessions.count, listeners: listeners))
    }

    /// The admin listener's policy: on a loopback address, the Host check with loopback names
    /// only (a DNS-rebinding page must not read `/metrics` or `/readyz`); no browser guard.
    static func adminPolicy(_ address: ListenAddress) -> PolicyBox {
        PolicyBox(ListenerPolicy(ListenerConfig(address: address), surface: .admin))
    }

    /// A proxy listener with its access-control policy, bound (or adopted from `inherited`).
    private func open(_ config: ListenerConfig, inherited: Int32? = nil) throws(IOError) -> RunningListener {
        let box = PolicyBox(ListenerPolicy(config, tls: runtime.tlsContext(for: config)))
        return RunningListener(config: config, listener: try bind(config.address, policy: box, responder: extraResponder, inherited: inherited), policy: box)
    }

    /// Binds one listener; `policy` (nil for admin) carries its access control (unix file mode,
    /// owner, SO_PEERCRED allowlist; Host allowlist) to every connection it accepts.
    /// `inherited`: a socket-activated fd to accept on instead of binding `address`.
    private func bind(_ address: ListenAddress, policy: PolicyBox, responder: LocalResponder?, inherited: Int32? = nil) throws(IOError) -> Listener {
        let accept = acceptHandler(policy: policy, responder: responder)
        if let inherited {
            logger.info("using a socket-activated listener", metadata: ["listen": "\(address)", "fd": "\(inherited)"])
            return try Listener.adopt(fd: inherited, group: group, budget: acceptBudget, onAccept: accept)
        }
        switch address {
        case .tcp(let host, let port):
            return try Listener.bind(host: host, port: port, group: group, budget: acceptBudget, onAccept: accept)
        case .unix(let path):
            let c = policy.policy?.config
            return try Listener.bindUnix(path: path, mode: c?.mode ?? 0o660, owner: c?.owner, fileGroup: c?.group, group: group,
                                         budget: acceptBudget, onAccept: accept)
        }
    }

    /// What a listener runs for each accepted fd: a `FrontendConnection` on the loop it was
    /// handed to, under `policy` (SO_PEERCRED and Host checks; nil: none). The connection's
    /// slot of `acceptBudget` is given back when its descriptor is closed.
    func acceptHandler(policy box: PolicyBox, responder: LocalResponder?) -> (Int32, SocketAddress, EventLoop) -> Void {
        let contexts = self.contexts
        let budget = acceptBudget
        return { fd, peer, loop in
            let ctx = contexts[loop.index]
            let policy = box.policy  // as of the accept: a reload may change it
            loop.runEvent {
                let channel = SocketChannel(fd: fd, loop: loop)
                channel.onDescriptorClosed = { budget.release() }
                if let tls = policy?.tls {
                    do {
                        channel.serveTLS(try TLSEngine(server: tls))
                    } catch {
                        ctx.runtime.logger.error("cannot start TLS on an accepted connection", metadata: ["error": "\(error)"])
                        channel.close()
                        return
                    }
                }
                let conn = FrontendConnection(channel: channel, ctx: ctx, peer: peer, local: responder, policy: policy)
                // TCP listeners defer accepts until the first bytes arrive (`Listener.deferAccept`).
                conn.start(readingFirst: peer.family != AF_UNIX)
            }
        }
    }

    /// Installs a new configuration (SIGHUP): sessions, routes and limits for the next request
    /// on every connection; listeners added are bound and listeners removed stop accepting
    /// (their open connections finish); a listener kept gets its new access control. If a new
    /// listener cannot be bound, nothing changes and the error says which (`listen[i]`).
    /// `accessLog`: whether to write access lines from now on (nil: as before).
    public func reload(_ config: BearerdConfig, accessLog: Bool? = nil,
                       environment: [String: String] = ProcessInfo.processInfo.environment) throws(ConfigErrors) {
        let oldAdmin = runtime.config.admin
        // 1. Bind what is new first: a failure here leaves everything as it was.
        var added: [RunningListener] = []
        func undo() { for a in added { a.listener.stop() } }
        for (i, l) in config.listeners.enumerated() where !running.contains(where: { $0.config.address == l.address }) {
            do throws(IOError) {
                added.append(try open(l))
            } catch {
                undo()
                throw ConfigErrors([ConfigError(file: config.file, line: l.line, key: "listen[\(i)]", message: "cannot listen on \(l.address): \(error)")])
            }
        }
        var newAdmin: Listener?
        if let admin = config.admin, admin != oldAdmin {
            do throws(IOError) {
                newAdmin = try bind(admin, policy: Self.adminPolicy(admin), responder: AdminResponder(server: self))
            } catch {
                undo()
                throw ConfigErrors([ConfigError(file: config.file, line: 0, key: "admin", message: "cannot listen on \(admin): \(error)")])
            }
        }
        do throws(IOError) {
            try tokenAPI.prepare(config, server: self)
        } catch {
            undo()
            newAdmin?.stop()
            throw ConfigErrors([ConfigError(file: config.file, line: config.tokenAPI?.line ?? 0, key: "token_api.listen", message: "cannot listen: \(error)")])
        }
        // 2. Sessions and the runtime.
        let next: ProxyRuntime
        do throws(ConfigErrors) {
            try sessions.reload(config, environment: environment)
            next = try ProxyRuntime(config: config, logger: logger, accessLog: accessLog ?? runtime.accessLog, sessions: sessions)
        } catch {
            undo()
            newAdmin?.stop()
            tokenAPI.abandon()
            throw error
        }
        runtime = next
        // Every loop takes the new runtime before listeners change, so a connection accepted
        // under a new policy meets the runtime that goes with it. (Loops never wait for the
        // controlling thread, so waiting here cannot deadlock.)
        let applied = DispatchGroup()
        for ctx in contexts {
            applied.enter()
            ctx.loop.execute { ctx.runtime = next; applied.leave() }
        }
        if applied.wait(timeout: .now() + 5) == .timedOut {
            logger.warning("an event loop took over 5 s to take the new configuration")
        }
        // 3. Listeners: keep (with new settings), add, remove.
        var kept: [RunningListener] = []
        for l in config.listeners {
            if let a = added.first(where: { $0.config.address == l.address }) {
                kept.append(a)
                logger.info("listener added", metadata: ["listen": "\(a.listener.localAddress)"])
            } else if var r = running.first(where: { $0.config.address == l.address }) {
                if r.config != l {
                    r.policy.policy = ListenerPolicy(l, tls: next.tlsContext(for: l))
                    if case .unix = l.address, l.mode != r.config.mode || l.owner != r.config.owner || l.group != r.config.group {
                        do throws(IOError) {
                            try r.listener.applyUnixPermissions(mode: l.mode, owner: l.owner, group: l.group)
                        } catch {
                            logger.error("cannot change the socket file's owner or mode", metadata: ["listen": "\(l.address)", "error": "\(error)"])
                        }
                    }
                    r.config = l
                }
                kept.append(r)
            }
        }
        for r in running where !config.listeners.contains(where: { $0.address == r.config.address }) {
            r.listener.stop()
            logger.info("listener removed; its open connections finish", metadata: ["listen": "\(r.listener.localAddress)"])
        }
        running = kept
        boundAddresses = running.map(\.listener.localAddress)
        if config.admin != oldAdmin {
            adminListener?.stop()
            adminListener = newAdmin
            adminAddress = newAdmin?.localAddress
            logger.info("admin listener moved", metadata: ["admin": "\(adminAddress.map { "\($0)" } ?? "none")"])
        }
        tokenAPI.commit(config, logger: logger)
        configureBudget(config)
        publishListeners()
        logger.info("configuration reloaded", metadata: ["routes": "\(config.routes.count)", "listeners": "\(running.count)"])
    }

    /// Stops accepting, lets in-flight exchanges finish for up to `grace`, then calls `completion`
    /// (on an arbitrary queue).
    public func shutdown(grace: Duration, completion: @escaping @Sendable () -> Void) {
        lifecycle.phase = .shuttingDown
        for r in running { r.listener.stop() }
        adminListener?.stop()
        tokenAPI.stop()
        let deadline = monotonicNanos() + grace.nanoseconds
        for ctx in contexts {
            ctx.loop.execute {
                ctx.draining = true
                for f in ctx.frontends { f.drain() }
            }
        }
        let contexts = self.contexts
        let sessions = self.sessions
        let controlQueue = self.controlQueue
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
            group.notify(queue: controlQueue) {
                if counter.value == 0 || monotonicNanos() >= deadline {
                    for ctx in contexts {
                        ctx.loop.execute {
                            for f in ctx.frontends { f.channel.close() }
                            ctx.pool.closeAll()
                        }
                    }
                    sessions.stop()
                    controlQueue.asyncAfter(deadline: .now() + .milliseconds(50)) { completion() }
                } else {
                    controlQueue.asyncAfter(deadline: .now() + .milliseconds(50)) { poll() }
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
                let m = ctx.metricsSnapshot()
                lock.withLock { box.total.merge(m) }
                group.leave()
            }
        }
        group.notify(queue: controlQueue) {
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

/// One proxy listener in force: its configuration, its socket and the access-control policy
/// its accept handler reads (swapped by a reload). Owned by `BearerdServer`'s controlling thread.
struct RunningListener {
    var config: ListenerConfig
    let listener: Listener
    let policy: PolicyBox
}

/// The policy a listener's accept handler applies to each new connection; a reload replaces it.
/// Read on the accepting loop, written on the controlling thread, under `lock`.
final class PolicyBox: @unchecked Sendable {  // @unchecked: `value` guarded by `lock`
    private let lock = Lock()
    private var value: ListenerPolicy?
    init(_ policy: ListenerPolicy?) { value = policy }
    var policy: ListenerPolicy? {
        get { lock.withLock { value } }
        set { lock.withLock { value = newValue } }
    }
}
