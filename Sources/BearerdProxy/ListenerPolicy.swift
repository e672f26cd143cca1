import BearerdConfig
import BearerdProxyCore
import BearerdTLS

/// What one bound listener enforces on its connections, fixed at bind: the SO_PEERCRED
/// allowlist of a unix socket, whether the Host of requests is checked (loopback TCP), and
/// the browser guard.
/// Immutable; shared by every loop.
public final class ListenerPolicy: Sendable {
    /// Which of bearerd's surfaces the listener serves: what its Host check admits and whether
    /// the browser guard runs.
    public enum Surface: Sendable {
        /// A `listen:` entry: loopback names, its routes' hosts and `allowed_hosts`; browser guard.
        case proxy
        /// `token_api.listen`: loopback names only (a route's `host:` is a name a DNS-rebinding
        /// page could own); browser guard (the responder refuses browsers on top).
        case tokenAPI
        /// `admin`: loopback names only (`/readyz` and `/metrics` carry session names, token
        /// endpoint errors and paths); no browser guard (nothing there acts on a request).
        case admin
    }
    public let surface: Surface
    public let config: ListenerConfig
    /// `unix:/path` or `host:port`, for messages.
    public let label: String
    /// A unix listener with `allow_uids`/`allow_gids`: every connection's peer is checked.
    public let checksPeer: Bool
    /// A loopback TCP listener without `allowed_hosts: ["*"]`: every request's Host is checked.
    public let checksHost: Bool
    /// The browser guard (docs/architecture.md §5), with the listener's `allowed_origins`: every request is checked.
    public let browserGuard: BrowserGuard
    /// `https` for a listener with `tls:`, else `http` (X-Forwarded-Proto, the guard's own origin).
    public let scheme: String
    /// The listener's server TLS context (`tls:`), nil for plain HTTP.
    public let tls: TLSContext?

    /// The Host check admits the built-in loopback names and the listener's own host only.
    public var loopbackNamesOnly: Bool { surface != .proxy }
    /// Requests pass the browser guard.
    public var guardsBrowsers: Bool { surface != .admin }

    public init(_ config: ListenerConfig, tls: TLSContext? = nil, surface: Surface = .proxy) {
        self.surface = surface
        self.config = config
        self.tls = tls
        label = config.address.description
        if case .unix = config.address {
            checksPeer = config.allowUIDs != nil || config.allowGIDs != nil
        } else {
            checksPeer = false
        }
        checksHost = config.checksHost
        let tls = config.tls != nil
        scheme = tls ? "https" : "http"
        browserGuard = BrowserGuard(scheme: tls ? .https : .http, allowedOrigins: config.allowedOrigins)
    }
}
