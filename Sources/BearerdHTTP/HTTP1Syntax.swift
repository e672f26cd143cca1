// Byte classes and small grammar helpers of RFC 9110 / RFC 9112 / RFC 3986, shared by the
// parser, the serializer and the header rules. Pure functions over bytes; no state.

@usableFromInline let asciiCR: UInt8 = 0x0D
@usableFromInline let asciiLF: UInt8 = 0x0A
@usableFromInline let asciiSP: UInt8 = 0x20
@usableFromInline let asciiHTAB: UInt8 = 0x09

enum HTTP1Syntax {
    /// RFC 9110 §5.6.2: tchar = "!" / "#" / "$" / "%" / "&" / "'" / "*" / "+" / "-" / "." /
    /// "^" / "_" / "`" / "|" / "~" / DIGIT / ALPHA
    @inline(__always)
    static func isTchar(_ c: UInt8) -> Bool {
        // Bitmaps of the tchar set for bytes 0-63 and 64-127 (checked against the list above
        // by HTTP1SyntaxTests.tcharBitmapMatchesTheRFC).
        let low: UInt64 = 0x03FF_6CFA_0000_0000
        let high: UInt64 = 0x57FF_FFFF_C7FF_FFFE
        if c < 64 { return (low >> UInt64(c)) & 1 != 0 }
        if c < 128 { return (high >> UInt64(c - 64)) & 1 != 0 }
        return false
    }

    /// The tchar set spelled out, for tests of the bitmap.
    static let tcharList: [UInt8] = Array("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ".utf8)

    /// True when none of the 8 bytes of `x` is a CTL (< 0x20 or 0x7F) or >= 0x80, i.e. all are
    /// SP or VCHAR. Classic SWAR "has less than" / "has value" tests, exact for "any byte".
    @inline(__always)
    static func allVisibleOrSpace(_ x: UInt64) -> Bool {
        let ones: UInt64 = 0x0101_0101_0101_0101
        let highs: UInt64 = 0x8080_8080_8080_8080
        let below20 = (x &- 0x20 &* ones) & ~x & highs
        let y = x ^ (0x7F &* ones)
        let del = (y &- ones) & ~y & highs
        return (below20 | del | (x & highs)) == 0
    }

    /// RFC 9110 §5.6.3: OWS = *( SP / HTAB )
    @inline(__always)
    static func isOWS(_ c: UInt8) -> Bool { c == asciiSP || c == asciiHTAB }

    @inline(__always)
    static func isDigit(_ c: UInt8) -> Bool { c >= 0x30 && c <= 0x39 }

    /// HEXDIG value, or nil.
    @inline(__always)
    static func hexValue(_ c: UInt8) -> UInt8? {
        switch c {
        case 0x30...0x39: return c - 0x30
        case 0x41...0x46: return c - 0x41 + 10
        case 0x61...0x66: return c - 0x61 + 10
        default: return nil
        }
    }

    /// True when `bytes` equals the lowercase ASCII `lower`, ignoring ASCII case.
    /// `lower` must consist of lowercase letters, digits and "-" only.
    @inline(__always)
    static func equalsLowercase<C: Collection>(_ bytes: C, _ lower: StaticString) -> Bool where C.Element == UInt8 {
        guard bytes.count == lower.utf8CodeUnitCount else { return false }
        var p = lower.utf8Start
        for c in bytes {
            // For a-z, c | 0x20 equals the letter only for the letter itself or its upper case;
            // digits and "-" already have bit 5 set.
            if c | 0x20 != p.pointee { return false }
            p += 1
        }
        return true
    }

    /// Splits a comma-separated list (RFC 9110 §5.6.1) into OWS-trimmed elements, empty ones
    /// included, so callers can decide how strict to be about them.
    static func listElements(_ bytes: some Collection<UInt8>) -> [ArraySlice<UInt8>] {
        let array = Array(bytes)
        var out: [ArraySlice<UInt8>] = []
        var start = 0
        var i = 0
        while i <= array.count {
            if i == array.count || array[i] == UInt8(ascii: ",") {
                var a = start, b = i
                while a < b && isOWS(array[a]) { a += 1 }
                while b > a && isOWS(array[b - 1]) { b -= 1 }
                out.append(array[a..<b])
                start = i + 1
            }
            i += 1
        }
        return out
    }

    /// RFC 9112 §3.2 / RFC 3986 §3.2.2: `uri-host [ ":" port ]` where uri-host is a reg-name,
    /// an IPv4 address or a bracketed IP literal. Strict: the host must be non-empty and a port,
    /// when present, must be 1 to 5 digits not above 65535. `requirePort` is for the
    /// authority-form of CONNECT (RFC 9112 §3.2.3), where the port is mandatory.
    static func isValidAuthority(_ s: String, requirePort: Bool) -> Bool {
        var s = s
        return s.withUTF8 { isValidAuthority($0, requirePort: requirePort) }
    }

    static func isValidAuthority(_ b: UnsafeBufferPointer<UInt8>, requirePort: Bool) -> Bool {
        let n = b.count
        var i = 0
        if n == 0 { return false }
        if b[0] == UInt8(ascii: "[") {
            // IP-literal (RFC 3986 §3.2.2): IPv6address; IPvFuture is not accepted.
            i = 1
            var colons = 0
            while i < n && b[i] != UInt8(ascii: "]") {
                let c = b[i]
                if c == UInt8(ascii: ":") {
                    colons += 1
                } else if hexValue(c) == nil && c != UInt8(ascii: ".") {
                    return false
                }
                i += 1
            }
            guard i < n, colons >= 2, i > 2 else { return false }
            i += 1  // past "]"
        } else {
            // reg-name = *( unreserved / pct-encoded / sub-delims ); IPv4address is a subset.
            while i < n && b[i] != UInt8(ascii: ":") {
                let c = b[i]
                switch c {
                case 0x30...0x39, 0x41...0x5A, 0x61...0x7A,
                     UInt8(ascii: "-"), UInt8(ascii: "."), UInt8(ascii: "_"), UInt8(ascii: "~"),
                     UInt8(ascii: "!"), UInt8(ascii: "$"), UInt8(ascii: "&"), UInt8(ascii: "'"),
                     UInt8(ascii: "("), UInt8(ascii: ")"), UInt8(ascii: "*"), UInt8(ascii: "+"),
                     UInt8(ascii: ","), UInt8(ascii: ";"), UInt8(ascii: "="):
                    i += 1
                case UInt8(ascii: "%"):
                    guard i + 2 < n, hexValue(b[i + 1]) != nil, hexValue(b[i + 2]) != nil else { return false }
                    i += 3
                default:
                    return false
                }
            }
            if i == 0 { return false }
        }
        if i == n { return !requirePort }
        guard b[i] == UInt8(ascii: ":") else { return false }
        i += 1
        let digits = n - i
        guard digits >= 1 && digits <= 5 else { return false }
        var port = 0
        while i < n {
            guard isDigit(b[i]) else { return false }
            port = port * 10 + Int(b[i] - 0x30)
            i += 1
        }
        return port <= 65535
    }
}
