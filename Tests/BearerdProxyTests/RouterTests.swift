import Testing
import BearerdHTTP
@testable import BearerdProxy
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdSessions
@testable import BearerdService

@Suite("Routing and target rewriting (pure)")
struct RouterTests {
    func r(_ match: String, host: String? = nil, strip: Bool = false, base: String = "") -> RouteConfig {
        RouteConfig(match: match, host: host, stripPrefix: strip, upstream: UpstreamURL(scheme: "http", host: "u", port: 80, basePath: base))
    }

    @Test func firstMatchWinsWithHost() {
        let router = Router(rules: [r("/a/", host: "api.example"), r("/a/"), r("/")].map(\.rule))
        #expect(router.match(path: "/a/x", host: "API.EXAMPLE:8080") == 0)
        #expect(router.match(path: "/a/x", host: "other") == 1)
        #expect(router.match(path: "/b", host: nil) == 2)
        #expect(Router(rules: [r("/a/").rule]).match(path: "/b", host: nil) == nil)
        #expect(router.match(path: "/a/x", host: "[::1]:80") == 1)
    }

    @Test(arguments: [
        ("/partner/", true, "/v2", "/partner/x/y", "q=1", "/v2/x/y?q=1"),
        ("/partner/", true, "", "/partner/", nil, "/"),
        ("/partner", true, "/base", "/partner", nil, "/base/"),
        ("/partner/", false, "/v2", "/partner/x", nil, "/v2/partner/x"),
        ("/", false, "", "/", nil, "/"),
    ] as [(String, Bool, String, String, String?, String)])
    func upstreamTargets(match: String, strip: Bool, base: String, path: String, query: String?, expected: String) {
        let target = RequestTarget.upstreamTarget(path: Substring(path), query: query.map { Substring($0) }, route: r(match, strip: strip, base: base).rule)
        #expect(target == expected)
    }

    @Test func splitsOriginAndAbsoluteForm() {
        #expect(RequestTarget.split("/a?b=c") == .init(path: "/a", query: "b=c", authority: nil))
        #expect(RequestTarget.split("http://Host:81/p") == .init(path: "/p", query: nil, authority: "Host:81"))
        #expect(RequestTarget.split("HTTPS://h?x") == .init(path: "/", query: "x", authority: "h"))
        #expect(RequestTarget.split("http://user@h/") == nil)
        #expect(RequestTarget.split("*") == nil)
        #expect(RequestTarget.split("example.com:443") == nil)
    }

    @Test(arguments: ["/a/../b", "/..", "/a/./b", "/a/%2e%2E/b", "/a/.%2e", "/%2E", "/a/.."])
    func dotSegmentsAreFound(path: String) {
        #expect(RequestTarget.hasDotSegment(Substring(path)))
    }

    @Test(arguments: ["/a/b", "/a/...", "/.well-known/x", "/a/..b", "/a/%2e%2e%2e", "/", "/a/b."])
    func ordinaryPathsPass(path: String) {
        #expect(!RequestTarget.hasDotSegment(Substring(path)))
    }

    @Test func headersAreRewrittenBothWays() {
        let head = HTTPRequestHead(method: "POST", target: "/x", headers: HTTPHeaders([
            ("Host", "client"), ("Connection", "x-hop"), ("X-Hop", "1"), ("Keep-Alive", "5"), ("Expect", "100-continue"),
            ("X-Forwarded-For", "10.0.0.1"), ("Via", "1.0 first"), ("Content-Length", "3"), ("Authorization", "Basic x"),
        ]))
        let up = ProxyHeaders.upstreamRequest(client: head, framing: .contentLength(3), target: "/y", route: r("/").rule,
                                              clientAddress: "127.0.0.1", originalHost: "client")
        #expect(up.headers["Host"] == "u")
        #expect(up.headers["X-Hop"] == nil && up.headers["Keep-Alive"] == nil && up.headers["Connection"] == nil)
        #expect(up.headers["Expect"] == nil)
        #expect(up.headers["X-Forwarded-For"] == "10.0.0.1, 127.0.0.1")
        #expect(up.headers["Via"] == "1.0 first, 1.1 bearerd")
        #expect(up.headers.values("Content-Length") == ["3"])
        #expect(up.headers["Authorization"] == "Basic x")
        let (resp, framing) = ProxyHeaders.clientResponse(
            upstream: HTTPResponseHead(status: 200, headers: HTTPHeaders([("Transfer-Encoding", "chunked"), ("Connection", "close")])),
            framing: .chunked, requestMethod: "GET", clientVersion: .http1_0, keepAlive: true)
        #expect(framing == .untilClose)
        #expect(resp.headers["Transfer-Encoding"] == nil)
        #expect(resp.headers["Connection"] == "close")
    }
}
