import BearerdHTTP

/// What routing and header rewriting need of one configured route (`RouteConfig.rule` builds
/// it once per configuration). Immutable, pure data; a class, so a request reads its route's
/// fields where the router keeps them (one reference count) instead of copying four strings
/// per request (measured).
public final class RouteRule: Sendable {
    /// Path prefix.
    public let match: String
    /// Host the request must name (ASCII case-insensitive, port ignored), if any.
    public let host: String?
    /// Forward `/prefix/x` as `/x`.
    public let stripPrefix: Bool
    /// The upstream URL's base path ("" or "/v1").
    public let upstreamBasePath: String
    /// The upstream's `host[:port]`, the `Host` of forwarded requests.
    public let upstreamAuthority: String

    public init(match: String, host: String? = nil, stripPrefix: Bool = false, upstreamBasePath: String = "",
                upstreamAuthority: String) {
        self.match = match
        self.host = host
        self.stripPrefix = stripPrefix
        self.upstreamBasePath = upstreamBasePath
        self.upstreamAuthority = upstreamAuthority
    }
}

/// The route table: first match wins on path prefix and optional Host (docs/architecture.md §4 `routes`).
/// Immutable; built once per configuration and shared by all loops.
public struct Router: Sendable {
    public let routes: [RouteRule]

    public init(rules: [RouteRule]) {
        self.routes = rules
    }

    /// Index of the first route whose prefix matches `path` and whose `host` (if any) equals the
    /// request's host name (ASCII case-insensitive, port ignored).
    public func match(path: Substring, host: Substring?) -> Int? {
        // Computed on the first route that names a host (most tables have none).
        var hostName: Substring??
        // By index, not `enumerated()`, which copies every rule (retaining its strings).
        for i in routes.indices {
            if let h = routes[i].host {
                if hostName == nil { hostName = .some(host.map(RequestTarget.hostWithoutPort)) }
                guard let name = hostName ?? nil, asciiCaseInsensitiveEquals(String(name), h) else { continue }
            }
            // Bytes, not Characters: a path is ASCII, and this runs for every request.
            if Self.hasPrefix(path, routes[i].match) { return i }
        }
        return nil
    }

    /// Whether `path`'s UTF-8 bytes begin with `prefix`'s (a byte comparison of contiguous
    /// storage; the generic `starts(with:)` walks two iterators).
    static func hasPrefix(_ path: Substring, _ prefix: String) -> Bool {
        let r = path.utf8.withContiguousStorageIfAvailable { p in
            prefix.utf8.withContiguousStorageIfAvailable { q in
                guard p.count >= q.count else { return false }
                for i in 0..<q.count where p[i] != q[i] { return false }
                return true
            }
        }
        if let r, let r { return r }
        return path.utf8.starts(with: prefix.utf8)
    }
}

extension RequestTarget {
    /// The upstream target: base path + (path with the route prefix stripped when asked) + query.
    /// On UTF-8 bytes: `hasPrefix`/`dropFirst` on a `Substring` compare and count `Character`s
    /// (grapheme breaking per request, measured, bench/RESULTS.md); the prefix was matched on bytes anyway.
    public static func upstreamTarget(path: Substring, query: Substring?, route: RouteRule) -> String {
        var rest = path.utf8[...]
        if route.stripPrefix {
            let match = route.match.utf8
            let strip = match.last == UInt8(ascii: "/") ? match.count - 1 : match.count
            rest = rest.dropFirst(strip)
        }
        var out = route.upstreamBasePath
        out.reserveCapacity(out.utf8.count + 1 + rest.count + (query.map { $0.utf8.count + 1 } ?? 0))
        if rest.first != UInt8(ascii: "/") { out += "/" }
        out += Substring(rest)
        if let query {
            out += "?"
            out += query
        }
        return out
    }
}
