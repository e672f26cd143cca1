// The `String`s of the byte sequences most message heads carry (common field names, a few
// field values, methods, reason phrases), as literals. The parser asks here before it builds a
// `String` from the bytes: a literal is an immortal constant (no UTF-8 validation, no small-string
// assembly, no allocation or reference counting), where `String(decoding:as:)` costs ~180
// instructions per string, about a dozen times per proxied request (measured, bench/RESULTS.md).
// A hit is exact (same bytes, case included), so the result equals `String(decoding:as:)` of
// the bytes; a miss returns nil after a length switch and at most a few byte compares.

enum CommonStrings {
    /// True when `b` is exactly the bytes of `s` (case-sensitive).
    @inline(__always)
    static func equalsExactly(_ b: UnsafeBufferPointer<UInt8>, _ s: StaticString) -> Bool {
        guard b.count == s.utf8CodeUnitCount else { return false }
        let p = s.utf8Start
        var i = 0
        while i < b.count {
            if b[i] != p[i] { return false }
            i += 1
        }
        return true
    }

    /// A literal equal to the field name `b`, or nil.
    static func fieldName(_ b: UnsafeBufferPointer<UInt8>) -> String? {
        @inline(__always) func eq(_ s: StaticString) -> Bool { equalsExactly(b, s) }
        switch b.count {
        case 3: return eq("Via") ? "Via" : eq("Age") ? "Age" : nil
        case 4:
            if eq("Host") { return "Host" }
            if eq("Date") { return "Date" }
            if eq("ETag") { return "ETag" }
            if eq("Vary") { return "Vary" }
            if eq("host") { return "host" }
            return nil
        case 6:
            if eq("Server") { return "Server" }
            if eq("Accept") { return "Accept" }
            if eq("Cookie") { return "Cookie" }
            if eq("Origin") { return "Origin" }
            if eq("Expect") { return "Expect" }
            if eq("Pragma") { return "Pragma" }
            return nil
        case 7:
            if eq("Referer") { return "Referer" }
            if eq("Expires") { return "Expires" }
            if eq("Upgrade") { return "Upgrade" }
            return nil
        case 8: return eq("Location") ? "Location" : nil
        case 10:
            if eq("Connection") { return "Connection" }
            if eq("User-Agent") { return "User-Agent" }
            if eq("Set-Cookie") { return "Set-Cookie" }
            if eq("Keep-Alive") { return "Keep-Alive" }
            if eq("connection") { return "connection" }
            return nil
        case 12:
            if eq("Content-Type") { return "Content-Type" }
            if eq("content-type") { return "content-type" }
            return nil
        case 13:
            if eq("Cache-Control") { return "Cache-Control" }
            if eq("Last-Modified") { return "Last-Modified" }
            if eq("Authorization") { return "Authorization" }
            if eq("Accept-Ranges") { return "Accept-Ranges" }
            return nil
        case 14:
            if eq("Content-Length") { return "Content-Length" }
            if eq("content-length") { return "content-length" }
            return nil
        case 15:
            if eq("Accept-Encoding") { return "Accept-Encoding" }
            if eq("Accept-Language") { return "Accept-Language" }
            if eq("X-Forwarded-For") { return "X-Forwarded-For" }
            return nil
        case 16: return eq("Content-Encoding") ? "Content-Encoding" : nil
        case 17:
            if eq("Transfer-Encoding") { return "Transfer-Encoding" }
            if eq("X-Forwarded-Proto") { return "X-Forwarded-Proto" }
            if eq("If-Modified-Since") { return "If-Modified-Since" }
            return nil
        default: return nil
        }
    }

    /// A literal equal to the field value `b`, or nil (values that recur across messages:
    /// connection options, codings, media types).
    static func fieldValue(_ b: UnsafeBufferPointer<UInt8>) -> String? {
        @inline(__always) func eq(_ s: StaticString) -> Bool { equalsExactly(b, s) }
        switch b.count {
        case 3: return eq("*/*") ? "*/*" : nil
        case 4: return eq("gzip") ? "gzip" : nil
        case 5: return eq("close") ? "close" : eq("bytes") ? "bytes" : nil
        case 7: return eq("chunked") ? "chunked" : nil
        case 8: return eq("no-cache") ? "no-cache" : eq("no-store") ? "no-store" : nil
        case 9: return eq("text/html") ? "text/html" : nil
        case 10:
            if eq("keep-alive") { return "keep-alive" }
            if eq("text/plain") { return "text/plain" }
            if eq("Keep-Alive") { return "Keep-Alive" }
            return nil
        case 16: return eq("application/json") ? "application/json" : nil
        case 24: return eq("text/html; charset=utf-8") ? "text/html; charset=utf-8" : nil
        case 31: return eq("application/json; charset=utf-8") ? "application/json; charset=utf-8" : nil
        default: return nil
        }
    }

    /// A literal equal to the method `b` (RFC 9110 §9.3 methods), or nil.
    static func method(_ b: UnsafeBufferPointer<UInt8>) -> String? {
        @inline(__always) func eq(_ s: StaticString) -> Bool { equalsExactly(b, s) }
        switch b.count {
        case 3: return eq("GET") ? "GET" : eq("PUT") ? "PUT" : nil
        case 4: return eq("POST") ? "POST" : eq("HEAD") ? "HEAD" : nil
        case 5: return eq("PATCH") ? "PATCH" : eq("TRACE") ? "TRACE" : nil
        case 6: return eq("DELETE") ? "DELETE" : nil
        case 7: return eq("OPTIONS") ? "OPTIONS" : eq("CONNECT") ? "CONNECT" : nil
        default: return nil
        }
    }

    /// A literal equal to the reason phrase `b` (the common RFC 9110 §15 phrases), or nil.
    static func reason(_ b: UnsafeBufferPointer<UInt8>) -> String? {
        @inline(__always) func eq(_ s: StaticString) -> Bool { equalsExactly(b, s) }
        switch b.count {
        case 2: return eq("OK") ? "OK" : nil
        case 5: return eq("Found") ? "Found" : nil
        case 7: return eq("Created") ? "Created" : nil
        case 9: return eq("Not Found") ? "Not Found" : nil
        case 10: return eq("No Content") ? "No Content" : nil
        case 11: return eq("Bad Request") ? "Bad Request" : nil
        case 12: return eq("Not Modified") ? "Not Modified" : nil
        default: return nil
        }
    }
}
