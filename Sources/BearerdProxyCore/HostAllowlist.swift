/// The Host names one loopback TCP listener answers under one configuration: the guard against
/// DNS rebinding (a web page whose name the attacker re-points at 127.0.0.1 must not reach
/// bearerd, whose every request spends a token).
///
/// Allowed, ASCII case-insensitively and whatever the port: `localhost` and any `*.localhost`
/// (RFC 6761 §6.3), any IPv4 loopback `127.x.y.z`, `::1` (bracketed in a Host, RFC 9110 §7.2),
/// the listener's own address host, the `host:` of every route, and the listener's
/// `allowed_hosts` (`*` allows any name). One trailing dot (`localhost.`) is ignored.
///
/// Immutable, built once per listener per configuration (`ProxyRuntime.hostAllowlist(for:)`):
/// the per-request check scans the name's bytes once and does at most one set lookup, without
/// allocating. Pure: no I/O, no clock.
public struct HostAllowlist: Sendable {
    /// Allowed names besides the built-in patterns, lower-case, without port or brackets.
    private let names: Set<HostKey>
    /// `allowed_hosts` held `*`: every Host passes.
    public let allowsAny: Bool


    /// An allowlist of the built-in names plus `names` (`*` among them allows any Host).
    public init(names: [String]) {
        var set = Set<HostKey>()
        var any = false
        for raw in names {
            if raw == "*" { any = true; continue }
            guard let host = HostAllowlist.hostPart(Substring(raw.lowercased())) else { continue }
            set.insert(HostKey(String(host)[...]))
        }
        self.names = set
        allowsAny = any
    }

    /// Whether a request whose Host (or absolute-form authority) is `authority` may be served.
    /// A malformed authority is refused. A missing one (only HTTP/1.0 may omit Host; the parser
    /// refuses HTTP/1.1 without it) is admitted: browsers, the only DNS-rebinding vector, always
    /// send Host, and legacy HTTP/1.0 clients are the users bearerd is for.
    public func admits(_ authority: Substring?) -> Bool {
        if allowsAny { return true }
        guard let authority else { return true }
        // The name's bytes scanned in place (a parsed field is contiguous UTF-8): a built-in
        // loopback name, what a new connection to a loopback listener usually sends, is
        // admitted with no Substring work (that cost ~2 k instructions per new connection).
        if let builtIn = authority.utf8.withContiguousStorageIfAvailable({ b -> Bool? in
            guard let r = HostAllowlist.hostRange(b) else { return nil }
            return HostAllowlist.isBuiltInLoopbackName(UnsafeBufferPointer(rebasing: b[r]))
        }) {
            guard let builtIn else { return false }  // malformed
            if builtIn { return true }
        }
        return admitsByName(authority)
    }

    /// `admits` on the Substring alone (the path for names that are not built in).
    func admitsByName(_ authority: Substring) -> Bool {
        if allowsAny { return true }
        guard let host = HostAllowlist.hostPart(authority) else { return false }
        return HostAllowlist.isBuiltInLoopbackName(host) || names.contains(HostKey(host))
    }

    /// `hostPart` on bytes: the host's range in `b`, nil when malformed (same rules).
    static func hostRange(_ b: UnsafeBufferPointer<UInt8>) -> Range<Int>? {
        var start = 0
        var end = b.count
        var rest = b.count
        if b.first == UInt8(ascii: "[") {
            guard let close = b.firstIndex(of: UInt8(ascii: "]")) else { return nil }
            start = 1
            end = close
            rest = close + 1
            if rest < b.count {
                guard b[rest] == UInt8(ascii: ":") else { return nil }
                rest += 1
            }
        } else if let colon = b.firstIndex(of: UInt8(ascii: ":")) {
            end = colon
            rest = colon + 1
        }
        var i = rest
        while i < b.count {
            if b[i] < UInt8(ascii: "0") || b[i] > UInt8(ascii: "9") { return nil }
            i += 1
        }
        if end > start && b[end - 1] == UInt8(ascii: ".") { end -= 1 }
        return end > start ? start..<end : nil
    }

    /// `isBuiltInLoopbackName` on bytes (same rules).
    static func isBuiltInLoopbackName(_ u: UnsafeBufferPointer<UInt8>) -> Bool {
        if lowerEquals(u, "localhost") { return true }
        if u.count > 10 && lowerEquals(UnsafeBufferPointer(rebasing: u[(u.count - 10)...]), ".localhost") { return true }
        if isIPv4Loopback(u) { return true }
        if lowerEquals(u, "::1") || lowerEquals(u, "0:0:0:0:0:0:0:1") { return true }
        if u.count > 7 && lowerEquals(UnsafeBufferPointer(rebasing: u[..<7]), "::ffff:") {
            return isIPv4Loopback(UnsafeBufferPointer(rebasing: u[7...]))
        }
        return false
    }

    /// Four decimal parts, each 0–255, the first 127 (the field's bytes or a host name's UTF-8).
    static func isIPv4Loopback<Bytes: Sequence<UInt8>>(_ u: Bytes) -> Bool {
        var part = 0
        var value = 0
        var digits = 0
        var first = -1
        for c in u {
            if c == UInt8(ascii: ".") {
                guard digits > 0, part < 3 else { return false }
                if part == 0 { first = value }
                part += 1
                value = 0
                digits = 0
            } else if c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9") {
                digits += 1
                value = value * 10 + Int(c - UInt8(ascii: "0"))
                guard digits <= 3, value <= 255 else { return false }
            } else {
                return false
            }
        }
        return part == 3 && digits > 0 && first == 127
    }

    static func lowerEquals(_ u: UnsafeBufferPointer<UInt8>, _ lower: StaticString) -> Bool {
        guard u.count == lower.utf8CodeUnitCount else { return false }
        return lower.withUTF8Buffer { l in
            for i in 0..<u.count where HostKey.fold(u[i]) != l[i] { return false }
            return true
        }
    }

    /// The authority a request names: the absolute-form target's authority, which wins over
    /// Host (RFC 9112 §3.2.2), else the Host field.
    public static func requestAuthority(target: String, hostField: String?) -> Substring? {
        let u = target.utf8
        if let first = u.first, first != UInt8(ascii: "/"), let parts = RequestTarget.split(target), let a = parts.authority {
            return a
        }
        return hostField.map { Substring($0) }
    }

    /// The host of `authority` (RFC 3986 §3.2.2): brackets of an IP literal removed, the port
    /// (digits after one colon) removed, one trailing dot removed. nil when malformed (empty
    /// host, a second colon outside brackets, a non-digit port, text after `]`).
    public static func hostPart(_ authority: Substring) -> Substring? {
        let u = authority.utf8
        var host: Substring
        var rest: Substring.UTF8View.SubSequence
        if u.first == UInt8(ascii: "[") {
            guard let close = u.firstIndex(of: UInt8(ascii: "]")) else { return nil }
            host = authority[authority.index(after: authority.startIndex)..<close]
            rest = u[u.index(after: close)...]
            if let c = rest.first {
                guard c == UInt8(ascii: ":") else { return nil }
                rest = rest.dropFirst()
            }
        } else if let colon = u.firstIndex(of: UInt8(ascii: ":")) {
            host = authority[..<colon]
            rest = u[u.index(after: colon)...]
        } else {
            host = authority
            rest = u[u.endIndex...]
        }
        for c in rest where c < UInt8(ascii: "0") || c > UInt8(ascii: "9") { return nil }
        if host.utf8.last == UInt8(ascii: ".") { host = host.dropLast() }
        return host.isEmpty ? nil : host
    }

    /// `localhost`, `*.localhost`, `127.x.y.z`, `::1`, `0:0:0:0:0:0:0:1`, `::ffff:127.x.y.z`.
    public static func isBuiltInLoopbackName(_ host: Substring) -> Bool {
        let u = host.utf8
        if asciiLowerEquals(u, "localhost") { return true }
        let suffix = ".localhost".utf8
        if u.count > suffix.count && asciiLowerEquals(u.suffix(suffix.count), ".localhost") { return true }
        if isIPv4Loopback(u) { return true }
        if asciiLowerEquals(u, "::1") || asciiLowerEquals(u, "0:0:0:0:0:0:0:1") { return true }
        let mapped = "::ffff:".utf8
        if u.count > mapped.count && asciiLowerEquals(u.prefix(mapped.count), "::ffff:") {
            return isIPv4Loopback(u.dropFirst(mapped.count))
        }
        return false
    }

    static func asciiLowerEquals(_ u: Substring.UTF8View.SubSequence, _ lower: StaticString) -> Bool {
        guard u.count == lower.utf8CodeUnitCount else { return false }
        return lower.withUTF8Buffer { l in
            var i = 0
            for c in u {
                if HostKey.fold(c) != l[i] { return false }
                i += 1
            }
            return true
        }
    }
}

/// A host name compared and hashed ASCII case-insensitively, so a Host field's own bytes can be
/// looked up without lower-casing them into a new string.
struct HostKey: Hashable, Sendable {
    let text: Substring
    init(_ text: Substring) { self.text = text }

    @inline(__always)
    static func fold(_ c: UInt8) -> UInt8 {
        c >= UInt8(ascii: "A") && c <= UInt8(ascii: "Z") ? c | 0x20 : c
    }

    func hash(into hasher: inout Hasher) {
        for c in text.utf8 { hasher.combine(HostKey.fold(c)) }
        hasher.combine(text.utf8.count)
    }

    static func == (a: HostKey, b: HostKey) -> Bool {
        guard a.text.utf8.count == b.text.utf8.count else { return false }
        return a.text.utf8.elementsEqual(b.text.utf8) { fold($0) == fold($1) }
    }
}
