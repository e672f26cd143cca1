import Testing
@testable import BearerdHTTP

/// The parser takes literals from `CommonStrings` in place of decoding the bytes: a hit must be
/// exactly the bytes (case included), and the spellings listed are hits.
@Suite struct CommonStringsTests {
    static let names = ["Via", "Age", "Host", "Date", "ETag", "Vary", "host", "Server", "Accept", "Cookie", "Origin",
                        "Expect", "Pragma", "Referer", "Expires", "Upgrade", "Location", "Connection", "User-Agent",
                        "Set-Cookie", "Keep-Alive", "connection", "Content-Type", "content-type", "Cache-Control",
                        "Last-Modified", "Authorization", "Accept-Ranges", "Content-Length", "content-length",
                        "Accept-Encoding", "Accept-Language", "X-Forwarded-For", "Content-Encoding",
                        "Transfer-Encoding", "X-Forwarded-Proto", "If-Modified-Since"]
    static let values = ["*/*", "gzip", "close", "bytes", "chunked", "no-cache", "no-store", "text/html", "keep-alive",
                         "text/plain", "Keep-Alive", "application/json", "text/html; charset=utf-8",
                         "application/json; charset=utf-8"]
    static let methods = ["GET", "PUT", "POST", "HEAD", "PATCH", "TRACE", "DELETE", "OPTIONS", "CONNECT"]
    static let reasons = ["OK", "Found", "Created", "Not Found", "No Content", "Bad Request", "Not Modified"]

    /// Each listed spelling, its case variants and one-byte changes (near misses).
    static func variants(_ s: String) -> [[UInt8]] {
        let b = Array(s.utf8)
        var out = [b, b.map { $0 >= 0x61 && $0 <= 0x7A ? $0 - 0x20 : $0 }, b.map { $0 >= 0x41 && $0 <= 0x5A ? $0 + 0x20 : $0 }]
        for i in b.indices {
            var c = b
            c[i] ^= 0x01
            out.append(c)
        }
        out.append(b + [0x78])
        out.append(Array(b.dropLast()))
        return out
    }

    func check(_ list: [String], _ lookup: (UnsafeBufferPointer<UInt8>) -> String?) {
        for s in list {
            let hit = Array(s.utf8).withUnsafeBufferPointer(lookup)
            #expect(hit == s, "\(s) is listed")
            for v in Self.variants(s) {
                let r = v.withUnsafeBufferPointer(lookup)
                if let r { #expect(Array(r.utf8) == v, "a hit is exactly the bytes: \(v)") }
            }
        }
    }

    @Test func fieldNames() { check(Self.names, CommonStrings.fieldName) }
    @Test func fieldValues() { check(Self.values, CommonStrings.fieldValue) }
    @Test func methods() { check(Self.methods, CommonStrings.method) }
    @Test func reasons() { check(Self.reasons, CommonStrings.reason) }

    @Test func parsedHeadKeepsTheBytesSpellings() throws {
        var p = HTTP1Parser(role: .server)
        p.feed(Array("GET / HTTP/1.1\r\nHOST: a\r\nhost-x: keep-alive\r\nConnection: Keep-alive\r\nX-Forwarded-For: 1.2.3.4\r\n\r\n".utf8))
        guard case .requestHead(let head, _)? = try p.next() else {
            Issue.record("no head")
            return
        }
        #expect(head.method == "GET")
        #expect(head.headers.fields.map(\.name) == ["HOST", "host-x", "Connection", "X-Forwarded-For"])
        #expect(head.headers.fields.map(\.value) == ["a", "keep-alive", "Keep-alive", "1.2.3.4"])
        #expect(head.headers.fields.map(\.known) == [.host, .other, .connection, .xForwardedFor])
    }
}
