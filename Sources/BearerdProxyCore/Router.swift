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

/// How one signing route (`sign:`) signs its requests (docs/architecture.md §6.15): the scheme
/// with its scope, taken from the route's `sign:` and its session's `grant:` and `region:`, and
/// what stands for the body. Immutable, built once per configuration (`plan`); pure data.
public struct RouteSigning: Sendable, Equatable {
    public let scheme: RequestSigning.Scheme
    /// `.unsignedPayload` or `.signedPayload` (never `.none`).
    public let payload: ProxyExchange.Signing

    /// Whose signature: the session's `grant:`.
    public enum Provider: Sendable, Equatable {
        /// AWS Signature V4 (`grant: aws`).
        case aws
        /// Alibaba Cloud OSS V4 (`grant: aliyun`).
        case aliyun
    }

    public init(scheme: RequestSigning.Scheme, payload: ProxyExchange.Signing) {
        self.scheme = scheme
        self.payload = payload
    }

    /// The plan of a route. `service`: `sign.service` (SigV4; nil means `s3`); `bucket`:
    /// `sign.bucket` (OSS; nil: read from an upstream host `BUCKET.oss-REGION.aliyuncs.com`, else a
    /// path-style request without one); `signedPayload`: `payload: signed`.
    public static func plan(provider: Provider, region: String, service: String?, bucket: String?,
                            signedPayload: Bool, upstreamHost: String) -> RouteSigning {
        let scheme: RequestSigning.Scheme
        switch provider {
        case .aws:
            scheme = .awsV4(region: region, service: service ?? "s3")
        case .aliyun:
            scheme = .ossV4(region: region, bucket: bucket ?? ossBucket(fromHost: upstreamHost))
        }
        return RouteSigning(scheme: scheme, payload: signedPayload ? .signedPayload : .unsignedPayload)
    }

    /// The bucket of a virtual-hosted OSS host `BUCKET.oss-REGION.aliyuncs.com` (also
    /// `oss-REGION-internal`), ASCII case-insensitive; nil for any other host (path-style or an
    /// endpoint without a bucket). A bucket name is 3–63 of `a–z 0–9 -`.
    public static func ossBucket(fromHost host: String) -> String? {
        let labels = host.utf8.split(separator: UInt8(ascii: "."), omittingEmptySubsequences: false)
            .map { String(decoding: $0.map { $0 >= 0x41 && $0 <= 0x5A ? $0 + 0x20 : $0 }, as: UTF8.self) }
        guard labels.count == 4, labels[2] == "aliyuncs", labels[3] == "com",
              labels[1].hasPrefix("oss-"), labels[1].utf8.count > 4 else { return nil }
        let bucket = labels[0]
        guard (3...63).contains(bucket.utf8.count),
              bucket.utf8.allSatisfy({ ($0 >= 0x61 && $0 <= 0x7A) || ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2D }) else { return nil }
        return bucket
    }
}
