import BearerdOAuth

/// One loop's counters, read by the admin `/metrics` endpoint by hopping onto each loop
/// (`BearerdServer.collectMetrics`) and summed by route label (`merge`).
///
/// Owned by a `LoopContext` and touched only on its loop, so counting takes no lock. Per-route
/// counters live in `routes`, indexed by a slot the loop assigns to each route label
/// (`slot(for:)`): slots are only ever appended, so an exchange that keeps the slot of the
/// runtime it started under counts correctly across a reload. Slot 0 is `route="none"`:
/// requests no route matched and requests bearerd answered itself before routing (400, 408,
/// 414, 431, CONNECT's 405).
public struct LoopMetrics: Sendable {
    public var routes: [RouteMetrics] = [RouteMetrics(label: RouteMetrics.noRoute)]
    /// Response body bytes relayed to clients.
    public var responseBytes: UInt64 = 0
    /// Client connections open on the proxy listeners (admin connections excluded); set when
    /// a snapshot is taken.
    public var openConnections: Int = 0
    /// Idle keep-alive connections in the upstream pool; set when a snapshot is taken.
    public var idleUpstreamConnections: Int = 0

    public init() {}

    /// The slot of `label`, appended if new.
    package mutating func slot(for label: String) -> Int {
        if let i = routes.firstIndex(where: { $0.label == label }) { return i }
        routes.append(RouteMetrics(label: label))
        return routes.count - 1
    }

    @inline(__always)
    package mutating func countRequest(slot: Int, status: Int) {
        routes[slot].statuses[status, default: 0] &+= 1
    }

    /// A proxied request with its client protocol and, for gRPC calls, the `grpc-status` relayed.
    @inline(__always)
    package mutating func countRequest(slot: Int, status: Int, http2: Bool, grpcStatus: String?) {
        routes[slot].statuses[status, default: 0] &+= 1
        routes[slot].protocols[http2 ? 1 : 0] &+= 1
        if let grpcStatus { routes[slot].grpcStatuses[grpcStatus, default: 0] &+= 1 }
    }

    @inline(__always)
    package mutating func countUpstreamError(slot: Int, _ kind: UpstreamErrorKind) {
        routes[slot].upstreamErrors[kind.rawValue] &+= 1
    }

    @inline(__always)
    package mutating func countReplay(slot: Int, _ outcome: ReplayOutcome) {
        routes[slot].replays[outcome.rawValue] &+= 1
    }

    @inline(__always)
    package mutating func observeUpstreamLatency(slot: Int, nanoseconds: UInt64) {
        routes[slot].upstreamLatency.observe(nanoseconds: nanoseconds)
    }

    /// Adds `o` to these counters, route by route label (loops number their slots independently).
    package mutating func merge(_ o: LoopMetrics) {
        var index: [String: Int] = [:]
        for (i, r) in routes.enumerated() { index[r.label] = i }
        for r in o.routes {
            if let i = index[r.label] {
                routes[i].merge(r)
            } else {
                index[r.label] = routes.count
                routes.append(r)
            }
        }
        responseBytes &+= o.responseBytes
        openConnections += o.openConnections
        idleUpstreamConnections += o.idleUpstreamConnections
    }
}

/// The counters of one route label (see `LoopMetrics`). Fixed-size arrays for the enumerated
/// outcomes; the status dictionary gains a key the first time a status is seen, then counts
/// in place.
public struct RouteMetrics: Sendable {
    /// The `route` label of requests that matched no route or were answered before routing.
    public static let noRoute = "none"

    /// `match`, prefixed by `host` when the route has one (`api.example.com/v1/`).
    public let label: String
    /// Responses answered to clients by status; 0 means the client went away before a response.
    public var statuses: [Int: UInt64] = [:]
    /// Indexed by `UpstreamErrorKind.rawValue`.
    public var upstreamErrors: [UInt64] = Array(repeating: 0, count: UpstreamErrorKind.allCases.count)
    /// Indexed by `ReplayOutcome.rawValue`.
    public var replays: [UInt64] = Array(repeating: 0, count: ReplayOutcome.allCases.count)
    /// From the request head handed to the upstream connection to the upstream's final response head.
    public var upstreamLatency = LatencyHistogram()
    /// Proxied requests by client protocol: [h1, h2].
    public var protocols: [UInt64] = [0, 0]
    /// gRPC calls by the `grpc-status` the client got (a string: relayed as the upstream sent it).
    public var grpcStatuses: [String: UInt64] = [:]

    public init(label: String) {
        self.label = label
    }

    /// The `route` label of a configured route (its `host:` and `match:`).
    public static func label(host: String?, match: String) -> String {
        guard let host, !host.isEmpty else { return match }
        return host + match
    }

    package mutating func merge(_ o: RouteMetrics) {
        for (k, v) in o.statuses { statuses[k, default: 0] &+= v }
        for i in upstreamErrors.indices { upstreamErrors[i] &+= o.upstreamErrors[i] }
        for i in replays.indices { replays[i] &+= o.replays[i] }
        upstreamLatency.merge(o.upstreamLatency)
        for i in protocols.indices { protocols[i] &+= o.protocols[i] }
        for (k, v) in o.grpcStatuses { grpcStatuses[k, default: 0] &+= v }
    }
}

/// Why a routed request got an error from bearerd instead of an upstream response (docs/architecture.md §5).
/// The raw value indexes `RouteMetrics.upstreamErrors`; `label` is the JSON body's `error`.
public enum UpstreamErrorKind: Int, CaseIterable, Sendable {
    case tokenUnavailable, upstreamUnreachable, upstreamTimeout, upstreamTLS, upstreamInvalidResponse
    /// The outbound proxy answered CONNECT with 407: its credentials are missing or wrong (502).
    case outboundProxyAuthRequired

    public var label: String {
        switch self {
        case .tokenUnavailable: "token_unavailable"
        case .upstreamUnreachable: "upstream_unreachable"
        case .upstreamTimeout: "upstream_timeout"
        case .upstreamTLS: "upstream_tls"
        case .upstreamInvalidResponse: "upstream_invalid_response"
        case .outboundProxyAuthRequired: "outbound_proxy_auth_required"
        }
    }
}

/// What became of an upstream response whose status is in the route's `reject_statuses`
/// (docs/architecture.md §6.8). The raw value indexes `RouteMetrics.replays`.
public enum ReplayOutcome: Int, CaseIterable, Sendable {
    /// Replayed with a token the session requested before it learned of the rejection (the
    /// request carried an older generation and got the current token at once, or the rejection
    /// joined a fetch already in flight). Provisional: a rejection of it is replayed once more.
    case replayedCurrentToken
    /// Replayed with the token of a refresh requested after the session learned of the rejection.
    case replayedAfterRefresh
    /// The replay was rejected too; that response went to the client.
    case rejectedAgain
    /// Not replayed: the request body was not kept (over `replay_body_limit`, or still streaming).
    case notReplayable
    /// Not replayed: the method is not in `replay_methods`.
    case methodNotAllowed
    /// Not replayed: the rejection's own body was too large to hold while deciding.
    case rejectionTooLarge
    /// Not replayed: the rejection breaker is open.
    case breakerOpen
    /// Not replayed: no newer token could be had (the refresh failed, the session is backing
    /// off, negative-cached or needs a new refresh token).
    case refreshFailed
    /// Not replayed: `WWW-Authenticate` names another error than `invalid_token` (e.g. `insufficient_scope`).
    case notTokenError

    public var label: String {
        switch self {
        case .replayedCurrentToken: "replayed_current_token"
        case .replayedAfterRefresh: "replayed_after_refresh"
        case .rejectedAgain: "rejected_again"
        case .notReplayable: "not_replayable"
        case .methodNotAllowed: "method_not_allowed"
        case .rejectionTooLarge: "rejection_too_large"
        case .breakerOpen: "breaker_open"
        case .refreshFailed: "refresh_failed"
        case .notTokenError: "not_token_error"
        }
    }

    /// The counter for a rejection that was not replayed for `reason`.
    public init(_ reason: ReplayPolicy.Reason) {
        switch reason {
        case .rejectedAgain: self = .rejectedAgain
        case .notTokenError: self = .notTokenError
        case .notReplayable: self = .notReplayable
        case .methodNotAllowed: self = .methodNotAllowed
        case .rejectionTooLarge: self = .rejectionTooLarge
        }
    }

    /// The outcome of a replay that was abandoned for `reason` (a `RejectionOutcome.passThrough`
    /// reason or a `TokenUnavailable.detail`).
    public static func abandoned(reason: String) -> ReplayOutcome {
        reason.hasPrefix("token.breaker_open") ? .breakerOpen : .refreshFailed
    }
}
