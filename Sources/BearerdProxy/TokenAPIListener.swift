import BearerdConfig
import BearerdIO
import BearerdService
import BearerdSessions
import Logging

/// The token API's listener (DESIGN §4 `token_api:`): binds `listen`, and gives every accepted
/// connection a `TokenAPIResponder` that knows its caller (the unix peer's SO_PEERCRED, read at
/// accept, or the TCP peer's address). A loopback TCP listen also gets the Host allowlist and
/// browser guard of a loopback listener (`ListenerPolicy`); the responder refuses every
/// browser-like request on top.
///
/// Owned by `BearerdServer` and driven from its controlling thread (start, reload, shutdown):
/// `listener` and `pending` are touched only there. `settings` is read by requests on any loop.
/// A unix socket file is made 0666: access is decided per connection by `allowed_uids`, so that
/// the uids listed can connect whatever their groups.
final class TokenAPIHost: @unchecked Sendable {  // @unchecked: mutable state touched only on the server's controlling thread
    let settings = TokenAPISettings(nil)
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
        let policy: PolicyBox
        if case .tcp = address {
            policy = PolicyBox(ListenerPolicy(ListenerConfig(address: address)))
        } else {
            policy = PolicyBox(nil)
        }
        let onAccept: (Int32, SocketAddress, EventLoop) -> Void = { [weak server] fd, peer, loop in
            guard let server else {
                loop.syscalls.closeFD(fd)
                return
            }
            let caller: TokenAPICaller
            if case .unix = address {
                let creds = try? Sys.peerCredentials(fd)
                caller = TokenAPICaller(.unix(uid: creds?.uid, pid: creds?.pid))
            } else {
                caller = TokenAPICaller(.tcp(address: "\(peer)"))
            }
            let responder = TokenAPIResponder(caller: caller, settings: settings, sessions: sessions, logger: logger)
            server.acceptHandler(policy: policy, responder: responder)(fd, peer, loop)
        }
        switch address {
        case .tcp(let host, let port):
            return try Listener.bind(host: host, port: port, group: server.group, onAccept: onAccept)
        case .unix(let path):
            return try Listener.bindUnix(path: path, mode: 0o666, group: server.group, onAccept: onAccept)
        }
    }
}
