import BearerdConfig
import BearerdProxyCore
import BearerdTLS

/// What one bound listener enforces on its connections, fixed at bind: the SO_PEERCRED
/// allowlist of a unix socket, whether the Host of requests is checked (loopback TCP), and
/// the browser guard.
/// Immutable; shared by every loop.
public final class ListenerPolicy: Sendable {
    public let config: ListenerConfig
    /// `unix:/path` or `host:port`, for messages.
    public let label: String
    /// A unix listener with `allow_uids`/`allow_gids`: every connection's peer is checked.
    public let checksPeer: Bool
    /// A loopback TCP listener without `allowed_hosts: ["*"]`: every request's Host is checked.
    public let checksHost: Bool
    /// The browser guard (DESIGN §5), with the listener's `allowed_origins`: every request is checked.
    public let browserGuard: BrowserGuard
    /// `https` for a listener with `tls:`, else `http` (X-Forwarded-Proto, the guard's own origin).
    public let scheme: String
    /// The listener's server TLS context (`tls:`), nil for plain HTTP.
    public let tls: TLSContext?

    public init(_ config: ListenerConfig, tls: TLSContext? = nil) {
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
