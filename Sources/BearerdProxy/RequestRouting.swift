import BearerdHTTP
import BearerdProxyCore
import BearerdConfig

/// Why a request is answered by bearerd itself before any upstream is chosen.
struct Refusal {
    var status: Int
    /// The JSON body's `error` (a stable reason).
    var error: String
    var detail: String
    var fields: [(String, String)] = []
    var extra: [(String, String)] = []
    /// The connection cannot carry another request after this answer (HTTP/1.1).
    var closes: Bool
}

/// What becomes of a request head, the same for HTTP/1.1 and HTTP/2 clients.
enum RoutingDecision {
    case proxy(routeIndex: Int, upstreamHead: HTTPRequestHead, logPath: Substring, websocket: Bool)
    case refuse(Refusal)
}

/// Admission (docs/architecture.md §4 `listen:` access control and §5 browser guard: Host allowlist of loopback listeners, browser guard) and routing of one
/// request, shared by the HTTP/1.1 connection and HTTP/2 streams. One per client connection,
/// on its loop. Immutable (what it remembers between requests is the loop's, `LoopContext.checkHost`),
/// and held in a `let` of the connection, so a request's calls borrow it: no copy, and no object
/// of its own to allocate and free per connection.
struct RequestGate {
    let policy: ListenerPolicy?
    let clientAddress: String
    /// `http` or `https` (the listener's), for X-Forwarded-Proto.
    let scheme: String
    init(policy: ListenerPolicy?, clientAddress: String, scheme: String) {
        self.policy = policy
        self.clientAddress = clientAddress
        self.scheme = scheme
    }

    /// nil when the listener admits the request; else the refusal (logged here).
    func admission(_ head: HTTPRequestHead, ctx: LoopContext) -> Refusal? {
        guard let policy else { return nil }
        let runtime = ctx.runtime
        if policy.checksHost,
           case .refused(let authority) = ctx.checkHost(target: head.target, hostField: head.headers.first(.host), policy: policy) {
            let shown = authority.map { HostAllowlist.hostPart($0).map(String.init) ?? String($0) } ?? ""
            runtime.logger.warning("host refused", metadata: ["client": "\(clientAddress)", "listener": "\(policy.label)", "host": "\(shown)"])
            let detail = authority == nil
                ? "the request names no host; \(policy.label) needs a Host header naming it"
                : policy.loopbackNamesOnly
                ? "\(policy.label) answers only localhost and loopback addresses (a DNS-rebinding guard)"
                : "\(policy.label) answers only localhost, loopback addresses, its routes' hosts and allowed_hosts; add \(shown) to allowed_hosts if it is meant to reach bearerd"
            return Refusal(status: 421, error: "host_not_allowed", detail: detail, fields: [("host", shown)], closes: true)
        }
        if policy.guardsBrowsers, case .refuse(let r) = policy.browserGuard.check(head) {
            runtime.logger.warning("cross-site request refused", metadata: [
                "client": "\(clientAddress)", "listener": "\(policy.label)", "reason": "\(r.reason)", "origin": "\(r.origin ?? "")",
            ])
            return Refusal(status: 403, error: "cross_site_request", detail: r.detail, closes: true)
        }
        return nil
    }

    /// Upgrade rules, target checks and the route (docs/architecture.md §5). `framing`: the request body's.
    func route(_ head: HTTPRequestHead, framing: HTTP1BodyFraming, ctx: LoopContext) -> RoutingDecision {
        let upgrade = ProxyHeaders.upgradeRequest(head)
        if case .unsupported(let why) = upgrade {
            // Never a silent downgrade (docs/architecture.md §5).
            return .refuse(Refusal(status: 400, error: "proxy.unsupported_upgrade", detail: why, closes: true))
        }
        guard let parts = RequestTarget.split(head.target) else {
            if head.method == "CONNECT" {
                return .refuse(Refusal(status: 405, error: "proxy.connect_not_supported", detail: "bearerd is a reverse proxy; CONNECT is not supported",
                                       extra: [("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")], closes: true))
            }
            return .refuse(Refusal(status: 400, error: "http1.invalid_target", detail: "request target must be origin-form or absolute-form", closes: true))
        }
        if RequestTarget.hasDotSegment(parts.path) {
            return .refuse(Refusal(status: 400, error: "proxy.dot_segment", detail: "request path contains a dot segment", closes: true))
        }
        let host = parts.authority ?? head.headers.first(.host).map { Substring($0) }
        let runtime = ctx.runtime
        guard let routeIndex = runtime.router.match(path: parts.path, host: host) else {
            // A body bearerd will not read: the connection cannot carry another request.
            return .refuse(Refusal(status: 404, error: "no_route", detail: "no route matches \(parts.path)", closes: framing != .none))
        }
        let rule = runtime.router.routes[routeIndex]
        // An origin-form target that the route neither strips nor prefixes goes upstream as the
        // client sent it: the same string, not a rebuilt one.
        let target = parts.authority == nil && !rule.stripPrefix && rule.upstreamBasePath.isEmpty
            ? head.target
            : RequestTarget.upstreamTarget(path: parts.path, query: parts.query, route: rule)
        var upstreamHead = ProxyHeaders.upstreamRequest(client: head, framing: framing, target: target, route: rule,
                                                        clientAddress: clientAddress, originalHost: host, forwardedProto: scheme)
        // docs/architecture.md §6.16: the caller's own token never reaches the upstream, whatever
        // field the route's credential goes in.
        if runtime.routeCallers[routeIndex].needsCallerToken { upstreamHead.headers.remove("Authorization") }
        let websocket = upgrade == .websocket && framing == .none
        if websocket { ProxyHeaders.addWebSocketUpgrade(&upstreamHead) }
        return .proxy(routeIndex: routeIndex, upstreamHead: upstreamHead, logPath: parts.path, websocket: websocket)
    }
}
