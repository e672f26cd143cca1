import BearerdConfig
import BearerdIO
import BearerdProxyCore
import BearerdService
import BearerdSessions
import Logging

/// The token API's listener (docs/architecture.md §4 `token_api:`): binds `listen`, and gives every accepted
/// connection a `TokenAPIResponder` that knows its caller (the unix peer's SO_PEERCRED, read at
/// accept, or the TCP peer's address). A unix peer whose uid `allowed_uids` does not list is
/// refused at accept: a 403 is written and the connection closed before a byte of its request
/// is read (the refusal log is rate-limited). A loopback TCP listen gets a Host check that
/// admits loopback names only (not the routes' hosts: a DNS-rebinding page could own such a
/// name) and the browser guard (`ListenerPolicy.Surface.tokenAPI`); the responder refuses
/// every browser-like request on top.
///
/// Owned by `BearerdServer` and driven from its controlling thread (start, reload, shutdown):
/// `listener` and `pending` are touched only there. `settings` is read by requests on any loop.
/// A unix socket file is made 0666: access is decided per connection by `allowed_uids`, so that
/// the uids listed can connect whatever their groups.
final class TokenAPIHost: @unchecked Sendable {  // @unchecked: mutable state touched only on the server's controlling thread
    let settings = TokenAPISettings(nil)
    /// Refusals logged at most a few per 10 s (created with the first listener).
    private var refusals: RefusalLog?
    private var listener: Listener?
    private var listen: ListenAddress?
    /// A listener bound by `prepare` for a reload, until `commit` or `abandon`.
    private var pending: (listener: Listener?, listen: ListenAddress?)?

    var localAddress: SocketAddress? { listener?.localAddress }

    func start(_ config: BearerdConfig, server: BearerdServer) throws(IOError) {
        settings.config = config.tokenAPI
        guard let api = config.tokenAPI else { return }
        listener = try bind(api.listen, server: server)
        listen = api.listen
        server.runtime.logger.info("token API listening", metadata: ["token_api.listen": "\(api.listen)", "token_api.sessions": "\(api.sessions.joined(separator: ","))"])
    }

    /// Reload, first half: binds the new address if it changed (a failure leaves all as it was).
    func prepare(_ config: BearerdConfig, server: BearerdServer) throws(IOError) {
        let next = config.tokenAPI?.listen
        if next == listen {
            pending = (listener, listen)
            return
        }
        pending = (try next.map { a throws(IOError) in try bind(a, server: server) }, next)
    }

    /// Reload, second half: the new settings apply to the next request; a moved listener stops
    /// accepting (its open connections finish).
    func commit(_ config: BearerdConfig, logger: Logger) {
        settings.config = config.tokenAPI
        guard let p = pending else { return }
        pending = nil
        if p.listen != listen {
            listener?.stop()
            logger.info("token API listener moved", metadata: ["token_api.listen": "\(p.listen.map { "\($0)" } ?? "none")"])
        }
        listener = p.listener
        listen = p.listen
    }

    func abandon() {
        if let p = pending, p.listen != listen { p.listener?.stop() }
        pending = nil
    }

    func stop() {
        listener?.stop()
        listener = nil
    }

    private func bind(_ address: ListenAddress, server: BearerdServer) throws(IOError) -> Listener {
        let settings = self.settings
        let sessions = server.sessions
        let logger = server.runtime.logger
        let budget = server.acceptBudget
        let refusals = self.refusals ?? RefusalLog(logger: logger)
        self.refusals = refusals
        let policy: PolicyBox
        if case .tcp = address {
            policy = PolicyBox(ListenerPolicy(ListenerConfig(address: address), surface: .tokenAPI))
        } else {
            policy = PolicyBox(nil)
        }
        let onAccept: (Int32, SocketAddress, EventLoop) -> Void = { [weak server] fd, peer, loop in
            guard let server else {
                loop.syscalls.closeFD(fd)
                budget.release()
                return
            }
            let caller: TokenAPICaller
            if case .unix = address {
                let creds = try? Sys.peerCredentials(fd)
                caller = TokenAPICaller(.unix(uid: creds?.uid, pid: creds?.pid))
                guard TokenAPIResponder.admits(uid: creds?.uid, settings.config) else {
                    Self.refuseAtAccept(fd, caller: caller, sys: loop.syscalls, refusals: refusals)
                    budget.release()
                    return
                }
            } else {
                caller = TokenAPICaller(.tcp(address: "\(peer)"))
            }
            let responder = TokenAPIResponder(caller: caller, settings: settings, sessions: sessions, logger: logger, refusals: refusals)
            server.acceptHandler(policy: policy, responder: responder)(fd, peer, loop)
        }
        switch address {
        case .tcp(let host, let port):
            return try Listener.bind(host: host, port: port, group: server.group, budget: budget, onAccept: onAccept)
        case .unix(let path):
            return try Listener.bindUnix(path: path, mode: 0o666, group: server.group, budget: budget, onAccept: onAccept)
        }
    }

    /// A unix peer not in `allowed_uids`: one 403 written into the empty socket (it fits its
    /// buffer whole; a short write is not retried) and the descriptor closed, with nothing read.
    /// Its request, if sent, is never parsed, and no `100 Continue` can reach it.
    static func refuseAtAccept(_ fd: Int32, caller: TokenAPICaller, sys: Syscalls, refusals: RefusalLog) {
        let detail: String
        if case .unix(let uid?, _) = caller.identity {
            detail = "uid \(uid) is not in token_api.allowed_uids"
        } else {
            detail = "the peer's credentials could not be read"
        }
        let bytes = ErrorResponse.make(status: 403, error: "peer_not_allowed", detail: detail, close: true)
        _ = bytes.withUnsafeBytes { try? sys.write(fd, from: $0) }
        sys.closeFD(fd)
        refusals.warning("token API peer refused at accept", ["caller": "\(caller)", "status": "403", "error": "peer_not_allowed"])
    }
}
