import Testing
import BearerdHTTP
@testable import BearerdConfig
@testable import BearerdProxyCore

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

    /// What lets routing pass an origin-form target through unchanged when the route neither
    /// strips nor prefixes: the rebuilt target is byte-for-byte the one received.
    @Test(arguments: ["/", "/a", "/a/b/", "/a?b=c", "/a?", "/a?b?c", "/%2Fx?y=%20", "/a//b?"])
    func anUnchangedOriginFormTargetRebuildsToItself(target: String) {
        guard let parts = RequestTarget.split(target) else {
            Issue.record("\(target) did not split")
            return
        }
        #expect(parts.authority == nil)
        #expect(RequestTarget.upstreamTarget(path: parts.path, query: parts.query, route: r("/").rule) == target)
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

    /// The one-pass rewrite keeps the exact field order and RFC 9110 §7.6.1: fields a
    /// `Connection` names go whether they come before or after it, duplicates of
    /// X-Forwarded-For and Via are merged into the first, names match whatever their case.
    @Test func oneRewritePassKeepsOrderAndConnectionNames() {
        let head = HTTPRequestHead(method: "GET", target: "/x", headers: HTTPHeaders([
            ("x-early", "1"), ("host", "client"), ("accept", "*/*"), ("X-FORWARDED-FOR", "10.0.0.1"), ("TE", "trailers"),
            ("connection", "X-Early, x-late"), ("x-forwarded-for", "10.0.0.2"), ("via", "1.0 a"), ("Via", "1.1 b"),
            ("X-Forwarded-Proto", "https"), ("x-late", "2"), ("Proxy-Authorization", "Basic y"), ("X-Forwarded-Host", "orig"),
        ]))
        let up = ProxyHeaders.upstreamRequest(client: head, framing: .none, target: "/y", route: r("/").rule,
                                              clientAddress: "127.0.0.1", originalHost: "client")
        #expect(up.headers.fields.map { "\($0.name): \($0.value)" } == [
            "Host: u", "accept: */*", "X-FORWARDED-FOR: 10.0.0.1, 127.0.0.1", "via: 1.0 a, 1.1 bearerd",
            "X-Forwarded-Host: orig", "X-Forwarded-Proto: http",
        ])
        let (resp, framing) = ProxyHeaders.clientResponse(
            upstream: HTTPResponseHead(status: 200, headers: HTTPHeaders([
                ("Server", "o"), ("content-length", "100"), ("Keep-Alive", "timeout=5"), ("Connection", "keep-alive"),
            ])),
            framing: .contentLength(100), requestMethod: "GET", clientVersion: .http1_1, keepAlive: true)
        #expect(framing == .contentLength(100))
        #expect(resp.headers.fields.map { "\($0.name): \($0.value)" } == ["Server: o", "Content-Length: 100", "Via: 1.1 bearerd"])
        let (head304, _) = ProxyHeaders.clientResponse(
            upstream: HTTPResponseHead(status: 304, headers: HTTPHeaders([("Content-Length", "7"), ("ETag", "\"e\"")])),
            framing: .none, requestMethod: "GET", clientVersion: .http1_0, keepAlive: true)
        #expect(head304.headers.fields.map { "\($0.name): \($0.value)" } == ["Content-Length: 7", "ETag: \"e\"", "Via: 1.1 bearerd", "Connection: keep-alive"])
    }

    /// The direct writer of HTTP/1.1 responses gives the bytes of `clientResponse` serialised.
    @Test func directClientResponseEqualsRewriteThenSerialise() {
        let heads: [HTTPResponseHead] = [
            HTTPResponseHead(status: 200, reason: "OK", headers: HTTPHeaders([("Server", "o"), ("Content-Length", "100"), ("Connection", "keep-alive")])),
            HTTPResponseHead(status: 200, reason: "", version: .http1_0, headers: HTTPHeaders([("via", "1.0 a"), ("Via", "1.1 b"), ("X-A", "1")])),
            HTTPResponseHead(status: 304, reason: "Not Modified", headers: HTTPHeaders([("Content-Length", "7"), ("ETag", "\"e\"")])),
            HTTPResponseHead(status: 204, headers: HTTPHeaders([("Connection", "X-Secret, close"), ("x-secret", "s"), ("Keep-Alive", "5")])),
            HTTPResponseHead(status: 103, reason: "Early Hints", headers: HTTPHeaders([("Link", "</a>; rel=preload")])),
            HTTPResponseHead(status: 502, headers: HTTPHeaders([("X-Forwarded-For", "1"), ("X-Forwarded-For", "2"), ("Transfer-Encoding", "chunked"), ("Trailer", "x")])),
        ]
        let framings: [HTTP1BodyFraming] = [.none, .contentLength(100), .chunked, .closeDelimited]
        for head in heads {
            for framing in framings {
                for method in ["GET", "HEAD"] {
                    for version in [HTTPVersion.http1_1, .http1_0] {
                        for keepAlive in [true, false] {
                            let (h, cf) = ProxyHeaders.clientResponse(upstream: head, framing: framing, requestMethod: method,
                                                                      clientVersion: version, keepAlive: keepAlive)
                            var expected: [UInt8] = []
                            HTTP1Serializer.writeResponseHead(h, into: &expected)
                            var direct: [UInt8] = Array("prefix".utf8)
                            let dcf = ProxyHeaders.writeClientResponse(upstream: head, framing: framing, requestMethod: method,
                                                                       clientVersion: version, keepAlive: keepAlive, into: &direct)
                            #expect(dcf == cf)
                            #expect(String(decoding: direct.dropFirst(6), as: UTF8.self) == String(decoding: expected, as: UTF8.self),
                                    "\(head.status) \(framing) \(method) \(version) \(keepAlive)")
                        }
                    }
                }
            }
        }
    }

    @Test func knownFieldsAreRecognisedInAnyCase() {
        let names: [(String, KnownField)] = [
            ("TE", .te), ("via", .via), ("HOST", .host), ("Expect", .expect), ("upgrade", .upgrade), ("Trailer", .trailer),
            ("Connection", .connection), ("keep-alive", .keepAlive), ("Content-Length", .contentLength),
            ("x-forwarded-for", .xForwardedFor), ("Proxy-Connection", .proxyConnection), ("X-Forwarded-Host", .xForwardedHost),
            ("Transfer-Encoding", .transferEncoding), ("x-forwarded-proto", .xForwardedProto),
            ("Proxy-Authenticate", .proxyAuthenticate), ("proxy-authorization", .proxyAuthorization),
            ("Origin", .origin), ("sec-fetch-site", .secFetchSite), ("Content-Type", .contentType),
            ("Origins", .other), ("Sec-Fetch-Mode", .other),
            ("tf", .other), ("hosts", .other), ("Connectiom", .other), ("content-lengtH", .contentLength), ("", .other),
        ]
        for (name, kind) in names { #expect(KnownField(name) == kind, "\(name)") }
        // The classification a field carries: from the parser's bytes, from init, after a rename.
        // (Framing fields need values of their own: one Content-Length, no Transfer-Encoding.)
        let framing: Set<KnownField> = [.contentLength, .transferEncoding]
        let inRequest = names.filter { !$0.0.isEmpty && !framing.contains($0.1) } + [("Content-Length", .contentLength)]
        var request = "GET / HTTP/1.1\r\n"
        for (name, kind) in inRequest { request += "\(name): \(kind == .contentLength ? "0" : "v")\r\n" }
        var parser = HTTP1Parser(role: .server)
        parser.feed(Array((request + "\r\n").utf8))
        guard case .requestHead(let head, _)? = try? parser.next() else {
            Issue.record("the request did not parse")
            return
        }
        let parsed = head.headers.fields
        #expect(parsed.map(\.name) == inRequest.map(\.0))
        for f in parsed { #expect(f.known == KnownField(f.name), "parsed \(f.name)") }
        for (name, kind) in names { #expect(HTTPField(name: name, value: "v").known == kind, "init \(name)") }
        let made: [HTTPField] = [.host("h"), .xForwardedFor("a"), .xForwardedProto("http"), .xForwardedHost("h"),
                                 .contentLength("1"), .transferEncoding("chunked"), .connection("close"), .via("1.1 x")]
        for f in made { #expect(f.known == KnownField(f.name) && f.known != .other, "factory \(f.name)") }
        var renamed = HTTPField(name: "Via", value: "1.1 x")
        renamed.name = "X-Forwarded-For"
        #expect(renamed.known == .xForwardedFor)
        renamed.name = "X-Other"
        #expect(renamed.known == .other)
        var h = HTTPHeaders([("Host", "a"), ("upgrade", "websocket")])
        #expect(h.first(.host) == "a" && h.contains(.upgrade) && !h.contains(.connection))
        h.fields[0].name = "X-Host"
        #expect(h.first(.host) == nil)
        #expect(asciiCaseInsensitiveEquals("Content-Type", "content-type"))
        #expect(!asciiCaseInsensitiveEquals("Content-Type", "content-typ"))
        #expect(!asciiCaseInsensitiveEquals("a-b", "a_b"))
    }
}
