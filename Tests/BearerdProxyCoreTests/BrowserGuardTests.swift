import Testing
import BearerdHTTP
@testable import BearerdConfig
@testable import BearerdProxyCore

/// The browser guard's decision (docs/architecture.md §5) as a table: request head in,
/// admit or refuse (with its stable reason) out. No sockets.
@Suite("Browser guard")
struct BrowserGuardTests {
    static let guardian = BrowserGuard(scheme: .http, allowedOrigins: ["https://App.Example.com:443", "http://localhost:3000"])

    struct Case: CustomTestStringConvertible, Sendable {
        let name: String
        let method: String
        let target: String
        let headers: [(String, String)]
        /// nil: admitted; else the refusal's reason.
        let refusal: String?
        var testDescription: String { name }

        init(_ name: String, _ headers: [(String, String)], refused: String? = nil) {
            self.init(name, "GET", "/api/x", headers, refused: refused)
        }

        init(_ name: String, _ method: String, _ target: String, _ headers: [(String, String)], refused: String? = nil) {
            self.name = name
            self.method = method
            self.target = target
            self.headers = headers
            refusal = refused
        }
    }

    static let cases: [Case] = [
        // Programs: no browser fields.
        Case("curl (Host only)", [("Host", "127.0.0.1:8080"), ("User-Agent", "curl/8.5.0"), ("Accept", "*/*")]),
        Case("HTTP/1.0 without Host", []),
        // The attack of the issue: a cross-site simple POST that needs no CORS preflight.
        Case("cross-site text/plain POST", "POST", "/api/upload", [("Host", "127.0.0.1:8080"), ("Origin", "https://evil.example"),
              ("Sec-Fetch-Site", "cross-site"), ("Content-Type", "text/plain")], refused: "browser.foreign_origin"),
        Case("cross-site GET without Origin (img, navigation)", [("Host", "localhost:8080"), ("Sec-Fetch-Site", "cross-site"),
              ("Sec-Fetch-Mode", "no-cors")], refused: "browser.cross_site"),
        Case("same-site page on another port, no Origin", [("Host", "localhost:8080"), ("Sec-Fetch-Site", "same-site")], refused: "browser.cross_site"),
        Case("CORS preflight from a cross-site page", "OPTIONS", "/api/x", [("Host", "127.0.0.1:8080"), ("Origin", "https://evil.example"),
              ("Access-Control-Request-Method", "PUT"), ("Sec-Fetch-Site", "cross-site"), ("Sec-Fetch-Mode", "cors")], refused: "browser.foreign_origin"),
        Case("Origin alone, foreign", "POST", "/x", [("Host", "127.0.0.1:8080"), ("Origin", "http://evil.example:8080")], refused: "browser.foreign_origin"),
        Case("DNS-rebound page (same host name, other port)", "POST", "/x", [("Host", "evil.example:8080"), ("Origin", "http://evil.example:9999")],
             refused: "browser.foreign_origin"),
        Case("Origin: null", "POST", "/x", [("Host", "127.0.0.1:8080"), ("Origin", "null")], refused: "browser.origin_null"),
        Case("Origin: NULL", "POST", "/x", [("Host", "127.0.0.1:8080"), ("Origin", " NULL ")], refused: "browser.origin_null"),
        Case("two Origin fields", "POST", "/x", [("Host", "127.0.0.1:8080"), ("Origin", "http://127.0.0.1:8080"), ("origin", "http://127.0.0.1:8080")],
             refused: "browser.multiple_origin"),
        Case("Origin with a path", "POST", "/x", [("Host", "127.0.0.1:8080"), ("Origin", "http://127.0.0.1:8080/")], refused: "browser.malformed_origin"),
        Case("Origin that is not one", "POST", "/x", [("Host", "127.0.0.1:8080"), ("Origin", "127.0.0.1:8080")], refused: "browser.malformed_origin"),
        Case("https page, http listener", "POST", "/x", [("Host", "localhost:8080"), ("Origin", "https://localhost:8080")], refused: "browser.foreign_origin"),
        Case("Origin without Host (HTTP/1.0)", "POST", "/x", [("Origin", "http://127.0.0.1:8080")], refused: "browser.foreign_origin"),
        Case("unknown Sec-Fetch-Site", [("Host", "localhost:8080"), ("Sec-Fetch-Site", "cross-origin")], refused: "browser.fetch_site_invalid"),
        Case("two Sec-Fetch-Site fields", [("Host", "localhost:8080"), ("Sec-Fetch-Site", "none"), ("Sec-Fetch-Site", "none")],
             refused: "browser.fetch_site_invalid"),
        Case("own Origin but Sec-Fetch-Site cross-site", "POST", "/x", [("Host", "localhost:8080"), ("Origin", "http://localhost:8080"),
              ("Sec-Fetch-Site", "cross-site")], refused: "browser.cross_site"),
        // A page served by bearerd itself, and the developer typing the URL.
        Case("same-origin fetch from a page bearerd serves", "POST", "/api/x", [("Host", "localhost:8080"), ("Origin", "http://localhost:8080"),
              ("Sec-Fetch-Site", "same-origin"), ("Sec-Fetch-Mode", "cors")]),
        Case("navigation typed in the address bar", [("Host", "localhost:8080"), ("Sec-Fetch-Site", "none"), ("Sec-Fetch-Mode", "navigate")]),
        Case("same-origin GET without Origin", [("Host", "127.0.0.1:8080"), ("Sec-Fetch-Site", "same-origin")]),
        // Normalisation (RFC 6454 §6.1): case, default port, leading zeros.
        Case("case of scheme and host", "POST", "/x", [("Host", "LocalHost:8080"), ("Origin", "HTTP://localHOST:8080")]),
        Case("default port written in Host", "POST", "/x", [("Host", "localhost:80"), ("Origin", "http://localhost")]),
        Case("default port written in Origin", "POST", "/x", [("Host", "localhost"), ("Origin", "http://localhost:80")]),
        Case("port with leading zeros", "POST", "/x", [("Host", "localhost:08080"), ("Origin", "http://localhost:8080")]),
        Case("IPv6 literal", "POST", "/x", [("Host", "[::1]:8080"), ("Origin", "http://[::1]:8080"), ("Sec-Fetch-Site", "same-origin")]),
        Case("absolute-form target wins over Host", "POST", "http://localhost:8080/x", [("Host", "evil.example"), ("Origin", "http://localhost:8080")]),
        Case("absolute-form target elsewhere", "POST", "http://evil.example/x", [("Host", "localhost:8080"), ("Origin", "http://localhost:8080")],
             refused: "browser.foreign_origin"),
        // allowed_origins: named web apps, cross-site included.
        Case("allowed origin, cross-site", "POST", "/api/x", [("Host", "127.0.0.1:8080"), ("Origin", "http://localhost:3000"),
              ("Sec-Fetch-Site", "same-site"), ("Content-Type", "application/json")]),
        Case("allowed origin, preflight", "OPTIONS", "/api/x", [("Host", "127.0.0.1:8080"), ("Origin", "https://app.example.com"),
              ("Access-Control-Request-Method", "PUT"), ("Sec-Fetch-Site", "cross-site")]),
        Case("allowed origin, other case and explicit default port", "POST", "/x", [("Host", "127.0.0.1:8080"),
              ("Origin", "HTTPS://APP.EXAMPLE.COM:443"), ("Sec-Fetch-Site", "cross-site")]),
        Case("allowed host, other port", "POST", "/x", [("Host", "127.0.0.1:8080"), ("Origin", "http://localhost:3001"),
              ("Sec-Fetch-Site", "same-site")], refused: "browser.foreign_origin"),
        Case("allowed host, other scheme", "POST", "/x", [("Host", "127.0.0.1:8080"), ("Origin", "http://app.example.com"),
              ("Sec-Fetch-Site", "cross-site")], refused: "browser.foreign_origin"),
        Case("suffix of an allowed origin", "POST", "/x", [("Host", "127.0.0.1:8080"), ("Origin", "https://app.example.com.evil.example"),
              ("Sec-Fetch-Site", "cross-site")], refused: "browser.foreign_origin"),
    ]

    @Test(arguments: cases)
    func decision(_ c: Case) {
        let head = HTTPRequestHead(method: c.method, target: c.target, version: c.headers.isEmpty ? .http1_0 : .http1_1,
                                   headers: HTTPHeaders(c.headers))
        switch Self.guardian.check(head) {
        case .admit:
            #expect(c.refusal == nil, "admitted, expected \(c.refusal ?? "")")
        case .refuse(let r):
            #expect(r.reason == c.refusal, "refused with \(r.reason): \(r.detail)")
            #expect(r.detail.contains("allowed_origins") || r.reason == "browser.malformed_origin")
        }
    }

    @Test func refusalShowsTheOriginShortened() {
        let long = "https://" + String(repeating: "a", count: 300) + ".example"
        let head = HTTPRequestHead(method: "POST", target: "/", headers: ["Host": "localhost", "Origin": long])
        guard case .refuse(let r) = Self.guardian.check(head) else {
            Issue.record("admitted")
            return
        }
        #expect(r.origin?.hasPrefix("https://aaa") == true)
        #expect((r.origin?.utf8.count ?? 0) <= BrowserGuard.shownLimit + 3)
    }

    @Test func withoutAllowedOriginsOnlyTheListenersOwnOriginPasses() {
        let plain = BrowserGuard()
        let own = HTTPRequestHead(method: "POST", target: "/", headers: ["Host": "127.0.0.1:8080", "Origin": "http://127.0.0.1:8080"])
        #expect(plain.check(own) == .admit)
        let app = HTTPRequestHead(method: "POST", target: "/", headers: ["Host": "127.0.0.1:8080", "Origin": "http://localhost:3000"])
        #expect(plain.check(app) != .admit)
        // A TLS listener's own origin is https.
        let tls = BrowserGuard(scheme: .https)
        let secure = HTTPRequestHead(method: "POST", target: "/", headers: ["Host": "localhost:443", "Origin": "https://localhost"])
        #expect(tls.check(secure) == .admit)
        #expect(plain.check(secure) != .admit)
    }

    @Test func normalizedOrigin() {
        let ok: [(String, String)] = [
            ("https://App.Example.com", "https://app.example.com"),
            ("https://app.example.com:443", "https://app.example.com"),
            ("http://localhost:3000", "http://localhost:3000"),
            ("HTTP://LOCALHOST:80", "http://localhost"),
            ("http://localhost:", "http://localhost"),
            ("http://localhost:0080", "http://localhost"),
            ("https://localhost:80", "https://localhost:80"),
            ("http://[::1]:8080", "http://[::1]:8080"),
            ("http://[FE80::1]", "http://[fe80::1]"),
            ("chrome-extension://abcdef", "chrome-extension://abcdef"),
            ("http://127.0.0.1:65535", "http://127.0.0.1:65535"),
        ]
        for (text, expected) in ok {
            #expect(BrowserGuard.normalizedOrigin(Substring(text)) == expected, "\(text)")
        }
        let bad = ["", "null", "localhost:3000", "http:/localhost", "http://", "http://:80", "http://a/", "http://a/b", "http://a?x",
                   "http://a#x", "http://user@a", "http://a:b", "http://a:1:2", "http://a:65536", "http://a:99999999999999999999999",
                   "http://[::1", "http://[::1]x", "http://[]", "http://[zz]", "1http://a", "ht tp://a", "http://a b", "*", "http://*"]
        for text in bad {
            #expect(BrowserGuard.normalizedOrigin(Substring(text)) == nil, "\(text)")
        }
    }
}
