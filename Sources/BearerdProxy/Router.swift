import BearerdHTTP
import BearerdProxyCore

/// The route table: first match wins on path prefix and optional Host (DESIGN §4 `routes`).
/// Immutable; built once per configuration and shared by all loops.
public struct Router: Sendable {
    public let routes: [RouteConfig]

    public init(routes: [RouteConfig]) {
        self.routes = routes
    }

    /// Index of the first route whose prefix matches `path` and whose `host` (if any) equals the
    /// request's host name (ASCII case-insensitive, port ignored).
    public func match(path: Substring, host: Substring?) -> Int? {
        let hostName = host.map(RequestTarget.hostWithoutPort)
        for (i, r) in routes.enumerated() {
            if let h = r.host {
                guard let hostName, asciiCaseInsensitiveEquals(String(hostName), h) else { continue }
            }
            if path.hasPrefix(r.match) { return i }
        }
        return nil
    }
}

/// Splitting and rewriting request targets (RFC 9112 §3.2). Pure functions.
public enum RequestTarget {
    public struct Parts: Equatable {
        /// Path, always starting with "/".
        public var path: Substring
        /// Query without "?", or nil.
        public var query: Substring?
        /// Authority from an absolute-form target, which replaces Host (RFC 9112 §3.2.2).
        public var authority: Substring?
    }

    /// Splits origin-form or absolute-form; nil for forms a reverse proxy does not serve.
    public static func split(_ target: String) -> Parts? {
        var rest = Substring(target)
        var authority: Substring?
        if !rest.hasPrefix("/") {
            let lower = rest.prefix(8).lowercased()
            let schemeLength: Int
            if lower.hasPrefix("http://") { schemeLength = 7 } else if lower.hasPrefix("https://") { schemeLength = 8 } else { return nil }
            rest = rest.dropFirst(schemeLength)
            let end = rest.firstIndex(where: { $0 == "/" || $0 == "?" }) ?? rest.endIndex
            authority = rest[..<end]
            if authority!.isEmpty || authority!.contains("@") { return nil }
            rest = rest[end...]
            if rest.isEmpty { rest = "/" } else if rest.hasPrefix("?") { return Parts(path: "/", query: rest.dropFirst(), authority: authority) }
        }
        if let q = rest.firstIndex(of: "?") {
            return Parts(path: rest[..<q], query: rest[rest.index(after: q)...], authority: authority)
        }
        return Parts(path: rest, query: nil, authority: authority)
    }

    /// True when the path has a "." or ".." segment, raw or percent-encoded. Such paths are
    /// refused (400) rather than normalised: a prefix route must not be escaped with "/a/../b".
    public static func hasDotSegment(_ path: Substring) -> Bool {
        var segmentStart = path.startIndex
        var i = path.startIndex
        /// "." or "..", each dot raw or as %2e (either case), without allocating.
        func isDot(_ s: Substring) -> Bool {
            var u = s.utf8[...]
            var dots = 0
            while let c = u.first {
                if c == UInt8(ascii: ".") {
                    u = u.dropFirst()
                } else if c == UInt8(ascii: "%"), u.count >= 3,
                          u[u.index(u.startIndex, offsetBy: 1)] == UInt8(ascii: "2"),
                          u[u.index(u.startIndex, offsetBy: 2)] | 0x20 == UInt8(ascii: "e") {
                    u = u.dropFirst(3)
                } else {
                    return false
                }
                dots += 1
                if dots > 2 { return false }
            }
            return dots == 1 || dots == 2
        }
        while i < path.endIndex {
            if path[i] == "/" {
                if isDot(path[segmentStart..<i]) { return true }
                segmentStart = path.index(after: i)
            }
            i = path.index(after: i)
        }
        return isDot(path[segmentStart...])
    }

    /// The upstream target: base path + (path with the route prefix stripped when asked) + query.
    public static func upstreamTarget(path: Substring, query: Substring?, route: RouteConfig) -> String {
        var p = path
        if route.stripPrefix {
            var prefix = Substring(route.match)
            if prefix.hasSuffix("/") { prefix = prefix.dropLast() }
            p = p.dropFirst(prefix.count)
        }
        var out = route.upstream.basePath
        if p.isEmpty || !p.hasPrefix("/") { out += "/" }
        out += p
        if let query {
            out += "?"
            out += query
        }
        return out
    }

    static func hostWithoutPort(_ host: Substring) -> Substring {
        if host.hasPrefix("[") {
            if let close = host.firstIndex(of: "]") { return host[host.index(after: host.startIndex)..<close] }
            return host
        }
        if let colon = host.lastIndex(of: ":") { return host[..<colon] }
        return host
    }
}

/// Header rewriting for both directions (DESIGN §5). Pure functions.
public enum ProxyHeaders {
    public static let viaToken = "1.1 bearerd"

    /// Builds the upstream request head from the client's head.
    /// - Hop-by-hop fields removed (RFC 9110 §7.6.1), `Expect` removed (bearerd answers 100-continue itself).
    /// - `Host` set to the upstream authority; `X-Forwarded-For/-Proto/-Host` and `Via` added.
    /// - Body framing re-declared from the parsed framing.
    public static func upstreamRequest(client head: HTTPRequestHead, framing: HTTP1BodyFraming, target: String,
                                       route: RouteConfig, clientAddress: String, originalHost: Substring?) -> HTTPRequestHead {
        var h = head.headers
        HTTPHeaderRules.removeHopByHop(&h)
        h.remove("Expect")
        h.remove("Content-Length")
        h.remove("Host")
        h.remove("X-Forwarded-Proto")
        var fields: [HTTPField] = []
        fields.reserveCapacity(h.count + 6)
        fields.append(HTTPField(name: "Host", value: route.upstream.authority))
        fields.append(contentsOf: h.fields)
        var out = HTTPHeaders(fields)
        if let prior = out["X-Forwarded-For"] {
            out.set("X-Forwarded-For", prior + ", " + clientAddress)
        } else {
            out.add("X-Forwarded-For", clientAddress)
        }
        out.add("X-Forwarded-Proto", "http")
        if let originalHost, !out.contains("X-Forwarded-Host") { out.add("X-Forwarded-Host", String(originalHost)) }
        appendVia(&out, version: head.version)
        switch framing {
        case .none, .closeDelimited: break
        case .contentLength(let n): out.add("Content-Length", String(n))
        case .chunked: out.add("Transfer-Encoding", "chunked")
        }
        return HTTPRequestHead(method: head.method, target: target, version: .http1_1, headers: out)
    }

    /// How the response body is sent to the client.
    public enum ClientFraming: Equatable {
        case none
        case contentLength(UInt64)
        case chunked
        /// HTTP/1.0 client and no length known: the body ends with the connection.
        case untilClose
    }

    /// Builds the client response head from the upstream's.
    public static func clientResponse(upstream head: HTTPResponseHead, framing: HTTP1BodyFraming, requestMethod: String,
                                      clientVersion: HTTPVersion, keepAlive: Bool) -> (HTTPResponseHead, ClientFraming) {
        var h = head.headers
        HTTPHeaderRules.removeHopByHop(&h)
        let bodyless = requestMethod == "HEAD" || head.status == 204 || head.status == 304 || head.isInformational
        var clientFraming: ClientFraming
        if bodyless {
            clientFraming = .none  // Content-Length of a HEAD/304 answer is kept as sent
        } else {
            h.remove("Content-Length")
            switch framing {
            case .none: clientFraming = .contentLength(0)
            case .contentLength(let n): clientFraming = .contentLength(n)
            case .chunked, .closeDelimited: clientFraming = clientVersion == .http1_1 ? .chunked : .untilClose
            }
            switch clientFraming {
            case .contentLength(let n): h.add("Content-Length", String(n))
            case .chunked: h.add("Transfer-Encoding", "chunked")
            default: break
            }
        }
        appendVia(&h, version: head.version)
        if !head.isInformational {
            let persistent = keepAlive && clientFraming != .untilClose
            if !persistent {
                h.add("Connection", "close")
            } else if clientVersion == .http1_0 {
                h.add("Connection", "keep-alive")
            }
        }
        return (HTTPResponseHead(status: head.status, reason: head.reason, version: .http1_1, headers: h), clientFraming)
    }

    static func appendVia(_ h: inout HTTPHeaders, version: HTTPVersion) {
        let token = version == .http1_0 ? "1.0 bearerd" : viaToken
        if let prior = h["Via"] {
            h.set("Via", prior + ", " + token)
        } else {
            h.add("Via", token)
        }
    }
}
