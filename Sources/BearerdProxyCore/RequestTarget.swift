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
    /// Works on the UTF-8 bytes (the delimiters are ASCII; targets are visible ASCII after the
    /// parsers), never on `Character`s: this runs for every request.
    public static func split(_ target: String) -> Parts? {
        var rest = Substring(target)
        var authority: Substring?
        if rest.utf8.first != UInt8(ascii: "/") {
            let u = rest.utf8
            let schemeLength: Int
            if HTTPSyntaxBytes.hasPrefixIgnoringCase(u, "http://") {
                schemeLength = 7
            } else if HTTPSyntaxBytes.hasPrefixIgnoringCase(u, "https://") {
                schemeLength = 8
            } else {
                return nil
            }
            rest = rest[u.index(u.startIndex, offsetBy: schemeLength)...]
            let ru = rest.utf8
            let end = ru.firstIndex(where: { $0 == UInt8(ascii: "/") || $0 == UInt8(ascii: "?") }) ?? ru.endIndex
            let a = rest[..<end]
            if a.isEmpty || a.utf8.contains(UInt8(ascii: "@")) { return nil }
            authority = a
            rest = rest[end...]
            if rest.isEmpty { rest = "/" } else if rest.utf8.first == UInt8(ascii: "?") { return Parts(path: "/", query: rest.dropFirst(), authority: authority) }
        }
        if let q = HTTPSyntaxBytes.firstOffset(of: UInt8(ascii: "?"), in: rest) {
            let u = rest.utf8
            let qi = u.index(u.startIndex, offsetBy: q)
            return Parts(path: rest[..<qi], query: rest[u.index(after: qi)...], authority: authority)
        }
        return Parts(path: rest, query: nil, authority: authority)
    }

    /// True when the path has a "." or ".." segment, raw or percent-encoded. Such paths are
    /// refused (400) rather than normalised: a prefix route must not be escaped with "/a/../b".
    public static func hasDotSegment(_ path: Substring) -> Bool {
        if let r = path.utf8.withContiguousStorageIfAvailable(hasDotSegment) { return r }
        var copy = String(path)  // native, so contiguous
        return copy.withUTF8(hasDotSegment)
    }

    /// `hasDotSegment` over contiguous bytes (the common case: one pass with a pointer).
    static func hasDotSegment(_ b: UnsafeBufferPointer<UInt8>) -> Bool {
        /// "." or "..", each dot raw or as %2e (either case).
        func isDot(_ lo: Int, _ hi: Int) -> Bool {
            var i = lo
            var dots = 0
            while i < hi {
                if b[i] == UInt8(ascii: ".") {
                    i += 1
                } else if b[i] == UInt8(ascii: "%"), hi - i >= 3, b[i + 1] == UInt8(ascii: "2"), b[i + 2] | 0x20 == UInt8(ascii: "e") {
                    i += 3
                } else {
                    return false
                }
                dots += 1
                if dots > 2 { return false }
            }
            return dots == 1 || dots == 2
        }
        var segmentStart = 0
        for i in 0..<b.count where b[i] == UInt8(ascii: "/") {
            if isDot(segmentStart, i) { return true }
            segmentStart = i + 1
        }
        return isDot(segmentStart, b.count)
    }


    package static func hostWithoutPort(_ host: Substring) -> Substring {
        let u = host.utf8
        if u.first == UInt8(ascii: "[") {
            if let close = u.firstIndex(of: UInt8(ascii: "]")) { return host[u.index(after: u.startIndex)..<close] }
            return host
        }
        if let colon = u.lastIndex(of: UInt8(ascii: ":")) { return host[..<colon] }
        return host
    }
}

extension HTTPSyntaxBytes {
    /// Offset in UTF-8 bytes of the first `byte` in `s` (a pointer scan of contiguous storage).
    static func firstOffset(of byte: UInt8, in s: Substring) -> Int? {
        let found: Int?? = s.utf8.withContiguousStorageIfAvailable { b in b.firstIndex(of: byte) }
        if let found { return found }
        return s.utf8.firstIndex(of: byte).map { s.utf8.distance(from: s.utf8.startIndex, to: $0) }
    }
}

/// Byte helpers for request targets.
enum HTTPSyntaxBytes {
    /// Whether `u` starts with the lowercase ASCII `lower`, ignoring ASCII case.
    static func hasPrefixIgnoringCase(_ u: Substring.UTF8View, _ lower: StaticString) -> Bool {
        var p = lower.utf8Start
        var n = lower.utf8CodeUnitCount
        var i = u.startIndex
        while n > 0 {
            guard i < u.endIndex else { return false }
            let c = u[i]
            let lc = (c >= 65 && c <= 90) ? c | 0x20 : c
            if lc != p.pointee { return false }
            p += 1
            n -= 1
            i = u.index(after: i)
        }
        return true
    }
}
