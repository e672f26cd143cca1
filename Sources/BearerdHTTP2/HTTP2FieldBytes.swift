import BearerdHTTP

/// Byte-level helpers for header fields on their way into and out of nghttp2: copying a
/// field's UTF-8 into a buffer (lower-cased for names, RFC 9113 §8.2.1), spotting the credential
/// fields that are sent never-indexed (STYLE 9, RFC 7541 §7.1.3) without making a `String`, and
/// the literals received names and values are given when they are common. Stateless.
enum HTTP2FieldBytes {
    /// Copies `s`'s UTF-8 into `buffer` from `at` (the caller sized it; bytes past its end are
    /// not written); returns the end.
    @inline(__always)
    static func copy(_ s: String, lowercased: Bool, into buffer: UnsafeMutableBufferPointer<UInt8>, at: Int) -> Int {
        guard let base = buffer.baseAddress, at >= 0, at <= buffer.count else { return at }
        let dst = base + at
        let room = buffer.count - at
        let done: Int? = s.utf8.withContiguousStorageIfAvailable { src in
            let n = min(src.count, room)
            guard n > 0, let from = src.baseAddress else { return at }
            if lowercased {
                for k in 0..<n {
                    let b = from[k]
                    dst[k] = b &- 0x41 < 26 ? b | 0x20 : b  // A-Z
                }
            } else {
                dst.update(from: from, count: n)
            }
            return at + n
        }
        if let done { return done }
        var j = 0
        for b in s.utf8 where j < room {
            dst[j] = lowercased && b &- 0x41 < 26 ? b | 0x20 : b
            j += 1
        }
        return at + j
    }

    /// Whether `b` (lower-case) is `s` exactly.
    @inline(__always)
    static func equals(_ b: UnsafeBufferPointer<UInt8>, _ s: StaticString) -> Bool {
        guard b.count == s.utf8CodeUnitCount else { return false }
        let p = s.utf8Start
        for i in 0..<b.count where b[i] != p[i] { return false }
        return true
    }

    /// ASCII case-insensitive equality of two byte strings.
    static func equalsIgnoringCase(_ a: UnsafeBufferPointer<UInt8>, _ b: UnsafeBufferPointer<UInt8>) -> Bool {
        guard a.count == b.count else { return false }
        for i in 0..<a.count {
            let x = a[i], y = b[i]
            if x == y { continue }
            let lx = x >= 0x41 && x <= 0x5A ? x | 0x20 : x
            let ly = y >= 0x41 && y <= 0x5A ? y | 0x20 : y
            if lx != ly { return false }
        }
        return true
    }

    /// A lower-cased field name that carries a credential: sent never-indexed.
    static func isCredential(_ name: UnsafeBufferPointer<UInt8>) -> Bool {
        switch name.count {
        case 4: return equals(name, "dpop")
        case 6: return equals(name, "cookie")
        case 10: return equals(name, "set-cookie")
        case 13: return equals(name, "authorization")
        case 19: return equals(name, "proxy-authorization")
        default: return false
        }
    }

    /// The name as a `String`: a literal for the common ones (no decoding, no allocation),
    /// otherwise decoded. Equal to `String(decoding: b, as: UTF8.self)` either way.
    static func name(_ b: UnsafeBufferPointer<UInt8>) -> String {
        @inline(__always) func eq(_ s: StaticString) -> Bool { equals(b, s) }
        switch b.count {
        case 2: if eq("te") { return "te" }
        case 4: if eq("date") { return "date" }
        case 5: if eq(":path") { return ":path" }
        case 6:
            if eq("accept") { return "accept" }
            if eq("server") { return "server" }
            if eq("cookie") { return "cookie" }
        case 7:
            if eq(":method") { return ":method" }
            if eq(":scheme") { return ":scheme" }
            if eq(":status") { return ":status" }
        case 10:
            if eq(":authority") { return ":authority" }
            if eq("user-agent") { return "user-agent" }
        case 11: if eq("grpc-status") { return "grpc-status" }
        case 12:
            if eq("content-type") { return "content-type" }
            if eq("grpc-message") { return "grpc-message" }
        case 13: if eq("authorization") { return "authorization" }
        case 14: if eq("content-length") { return "content-length" }
        case 15:
            if eq("accept-encoding") { return "accept-encoding" }
            if eq("accept-language") { return "accept-language" }
        default: break
        }
        return String(decoding: b, as: UTF8.self)
    }

    /// The value as a `String`: a literal for a few common ones, otherwise decoded.
    static func value(_ b: UnsafeBufferPointer<UInt8>) -> String {
        @inline(__always) func eq(_ s: StaticString) -> Bool { equals(b, s) }
        switch b.count {
        case 1: if eq("/") { return "/" }
        case 3:
            if eq("GET") { return "GET" }
            if eq("200") { return "200" }
            if eq("*/*") { return "*/*" }
        case 4:
            if eq("http") { return "http" }
            if eq("POST") { return "POST" }
        case 5: if eq("https") { return "https" }
        case 8: if eq("trailers") { return "trailers" }
        case 16: if eq("application/grpc") { return "application/grpc" }
        default: break
        }
        return String(decoding: b, as: UTF8.self)
    }
}
