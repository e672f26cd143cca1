import BearerdHTTP

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


    package static func hostWithoutPort(_ host: Substring) -> Substring {
        if host.hasPrefix("[") {
            if let close = host.firstIndex(of: "]") { return host[host.index(after: host.startIndex)..<close] }
            return host
        }
        if let colon = host.lastIndex(of: ":") { return host[..<colon] }
        return host
    }
}
