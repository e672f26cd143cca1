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
    /// Starting, serving or shutting down (for `/readyz`).
    public let lifecycle = ServerLifecycle()
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

    /// Binds every listener; throws on the first one that cannot be bound.
    public func start() throws(IOError) {
        Sys.ignoreSIGPIPE()
        sessions.start()
        for listener in runtime.config.listeners {
            let l = try bind(listener.address, policy: ListenerPolicy(listener), responder: extraResponder)
            listeners.append(l)
            boundAddresses.append(l.localAddress)
        }
        if let admin = runtime.config.admin {
            let l = try bind(admin, policy: nil, responder: AdminResponder(server: self))
            adminListener = l
            adminAddress = l.localAddress
        }
        lifecycle.phase = .serving
        logger.info("bearerd started", metadata: [
            "listen": "\(boundAddresses.map(\.description).joined(separator: ","))",
            "loops": "\(group.loops.count)",
            "routes": "\(runtime.config.routes.count)",
        ])
    }

    /// Binds one listener; `policy` (nil for admin) carries its access control (unix file mode,
    /// owner, SO_PEERCRED allowlist; Host allowlist) to every connection it accepts.
    private func bind(_ address: ListenAddress, policy: ListenerPolicy?, responder: LocalResponder?) throws(IOError) -> Listener {
        let accept = acceptHandler(policy: policy, responder: responder)
        switch address {
        case .tcp(let host, let port):
            return try Listener.bind(host: host, port: port, group: group, onAccept: accept)
        case .unix(let path):
            let c = policy?.config
            return try Listener.bindUnix(path: path, mode: c?.mode ?? 0o660, owner: c?.owner, fileGroup: c?.group, group: group, onAccept: accept)
        }
    }

    /// What a listener runs for each accepted fd: a `FrontendConnection` on the loop it was
    /// handed to, under `policy` (SO_PEERCRED and Host checks; nil: none, as for admin).
    func acceptHandler(policy: ListenerPolicy?, responder: LocalResponder?) -> (Int32, SocketAddress, EventLoop) -> Void {
        let contexts = self.contexts
        return { fd, peer, loop in
            let ctx = contexts[loop.index]
            loop.runEvent {
                let channel = SocketChannel(fd: fd, loop: loop)
                let conn = FrontendConnection(channel: channel, ctx: ctx, peer: peer, local: responder, policy: policy)
                conn.start()
            }
        }
    }

    /// Installs a new configuration (SIGHUP). Listener changes need a restart and are reported.
    /// `accessLog`: whether to write access lines from now on (nil: as before).
    public func reload(_ config: BearerdConfig, accessLog: Bool? = nil,
                       environment: [String: String] = ProcessInfo.processInfo.environment) throws(ConfigErrors) {
        try sessions.reload(config, environment: environment)
        let next = try ProxyRuntime(config: config, logger: logger, accessLog: accessLog ?? runtime.accessLog, sessions: sessions)
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
        lifecycle.phase = .shuttingDown
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
                let m = ctx.metricsSnapshot()
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
