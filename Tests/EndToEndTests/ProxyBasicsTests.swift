import Foundation
import Testing
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

@Suite("Proxying over 127.0.0.1", .serialized)
struct ProxyBasicsTests {
    @Test func forwardsAGetWithRewrittenHeaders() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route("/api/", origin: origin.port, basePath: "/v2", strip: true)])
        defer { proxy.stop() }

        let c = try TestClient(port: proxy.port)
        try c.send("GET /api/users?id=7 HTTP/1.1\r\nHost: client.example\r\nConnection: keep-alive, X-Secret-Hop\r\nX-Secret-Hop: 1\r\nTE: trailers\r\nAuthorization: Basic Zm9vOmJhcg==\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r["Via"] == "1.1 bearerd")
        let seen = try #require(origin.requests.first)
        #expect(seen.head.target == "/v2/users?id=7")
        #expect(seen.head.headers["Host"] == "127.0.0.1:\(origin.port)")
        #expect(seen.head.headers["X-Forwarded-For"] == "127.0.0.1")
        #expect(seen.head.headers["X-Forwarded-Proto"] == "http")
        #expect(seen.head.headers["X-Forwarded-Host"] == "client.example")
        #expect(seen.head.headers["Via"] == "1.1 bearerd")
        #expect(seen.head.headers["X-Secret-Hop"] == nil)
        #expect(seen.head.headers["TE"] == nil)
        #expect(seen.head.headers["Connection"] == nil)
        // A route without a session passes the client's own Authorization through unchanged.
        #expect(seen.head.headers["Authorization"] == "Basic Zm9vOmJhcg==")
        #expect(proxy.logs.text.contains("path=/api/users"))
        #expect(!proxy.logs.text.contains("id=7"))
    }

    @Test func keepAliveReusesOneUpstreamConnection() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        for i in 0..<20 {
            try c.send("GET /n/\(i) HTTP/1.1\r\nHost: x\r\n\r\n")
            let r = try c.readResponse()
            #expect(r.status == 200)
            #expect(r.bodyText.contains("target=/n/\(i)"))
        }
        // A second client connection reuses the pooled upstream connection too.
        let r2 = try TestClient.get(port: proxy.port, path: "/again")
        #expect(r2.status == 200)
        #expect(origin.requests.count == 21)
        #expect(origin.connectionCount == 1)
    }

    @Test func pipelinedRequestsAreAnsweredInOrder() throws {
        let origin = try TestOrigin { r in
            // The first answer is slow so a wrong order would show.
            r.head.target == "/1" ? .delayed(0.2, echoHandler(r)) : echoHandler(r)
        }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /1 HTTP/1.1\r\nHost: x\r\n\r\nPOST /2 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhelloGET /3 HTTP/1.1\r\nHost: x\r\n\r\n")
        for i in 1...3 {
            let r = try c.readResponse(method: i == 2 ? "POST" : "GET")
            #expect(r.bodyText.contains("target=/\(i)\n"))
        }
        #expect(origin.requests.map(\.head.target) == ["/1", "/2", "/3"])
        #expect(origin.requests[1].body == Array("hello".utf8))
    }

    @Test func chunkedRequestAndResponseBodiesAreRelayed() throws {
        let origin = try TestOrigin { r in
            .response(status: 200, headers: [], body: r.body.reversed(), chunked: true)
        }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n")
        let r = try c.readResponse(method: "POST")
        #expect(r.status == 200)
        #expect(r.bodyText == "dlrow olleh")
        #expect(r["Transfer-Encoding"] == "chunked")
        #expect(origin.requests.first?.body == Array("hello world".utf8))
    }

    @Test func headAnd204And304HaveNoBody() throws {
        let origin = try TestOrigin { r in
            switch r.head.target {
            case "/204": return .response(status: 204, headers: [], body: [])
            case "/304": return .response(status: 304, headers: [("ETag", "\"a\"")], body: [])
            default: return .response(status: 200, headers: [("Content-Length", "11")], body: Array("hello world".utf8))
            }
        }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("HEAD /h HTTP/1.1\r\nHost: x\r\n\r\nGET /204 HTTP/1.1\r\nHost: x\r\n\r\nGET /304 HTTP/1.1\r\nHost: x\r\n\r\nGET /ok HTTP/1.1\r\nHost: x\r\n\r\n")
        let h = try c.readResponse(method: "HEAD")
        #expect(h.status == 200 && h.body.isEmpty && h["Content-Length"] == "11")
        let n = try c.readResponse()
        #expect(n.status == 204 && n.body.isEmpty)
        let nm = try c.readResponse()
        #expect(nm.status == 304 && nm.body.isEmpty && nm["ETag"] == "\"a\"")
        let ok = try c.readResponse()
        #expect(ok.bodyText == "hello world")
    }

    @Test func expectContinueIsAnsweredAndInformationalResponsesRelayed() throws {
        let origin = try TestOrigin { r in
            .raw(Array("HTTP/1.1 103 Early Hints\r\nLink: </s.css>; rel=preload\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok".utf8))
        }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("PUT /u HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n")
        // bearerd asks for the body itself, once the upstream connection is ready.
        #expect(try c.readRawHead() == "HTTP/1.1 100 Continue\r\n\r\n")
        try c.send("data")
        let r = try c.readResponse(method: "PUT")
        #expect(r.status == 201)
        #expect(r.informational.map(\.status) == [103])
        #expect(r.informational.first?.headers["Link"] == "</s.css>; rel=preload")
        #expect(origin.requests.first?.head.headers["Expect"] == nil)
        #expect(origin.requests.first?.body == Array("data".utf8))
    }

    @Test func closeDelimitedResponseBecomesChunked() throws {
        let origin = try TestOrigin { _ in .rawThenClose(Array("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the end".utf8)) }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.bodyText == "until the end")
        #expect(r["Transfer-Encoding"] == "chunked")
        // The connection stays usable.
        try c.send("GET /again HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try c.readResponse().bodyText == "until the end")
    }

    @Test func routesMatchByPrefixAndHostAndUnmatchedIs404() throws {
        let a = try TestOrigin { _ in .response(status: 200, headers: [], body: Array("a".utf8)) }
        let b = try TestOrigin { _ in .response(status: 200, headers: [], body: Array("b".utf8)) }
        defer { a.stop(); b.stop() }
        let proxy = try TestProxy(routes: [
            route("/x/", origin: a.port, matchHost: "api.example"),
            route("/x/", origin: b.port),
        ])
        defer { proxy.stop() }
        #expect(try TestClient.get(port: proxy.port, path: "/x/1", headers: [("Host", "API.example:8080")]).bodyText == "a")
        let c = try TestClient(port: proxy.port)
        try c.send("GET /x/1 HTTP/1.1\r\nHost: other\r\n\r\n")
        #expect(try c.readResponse().bodyText == "b")
        try c.send("GET /nope HTTP/1.1\r\nHost: other\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 404)
        #expect(r["Content-Type"] == "application/json")
        #expect(r.bodyText.contains("\"error\":\"no_route\""))
    }
}

@Suite("Half-closed clients")
struct HalfCloseTests {
    @Test func clientHalfCloseStillGetsTheResponse() throws {
        let origin = try TestOrigin { r in .delayed(0.3, echoHandler(r)) }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /h HTTP/1.1\r\nHost: x\r\n\r\n")
        c.shutdownWrite()
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(c.isClosedByPeer())
    }
}

/// `inject:` (docs/architecture.md §4): an API-key style header instead of Authorization; the client's
/// own copy replaced, never added to; the value redacted in trace logs.
@Suite("inject: custom credential headers", .serialized)
struct InjectTests {
    @Test func theTokenGoesIntoTheConfiguredHeader() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        var r = withSession(route("/api/", origin: origin.port, strip: true))
        r.inject = InjectConfig(header: "X-Api-Key", prefix: "key=", suffix: "")
        let proxy = try TestProxy(routes: [r], sessions: [scriptedSession(tokens)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /api/x HTTP/1.1\r\nHost: x\r\nX-Api-Key: client-own\r\nx-api-key: second\r\nAuthorization: Basic Zm9v\r\n\r\n")
        let resp = try c.readResponse()
        #expect(resp.status == 200)
        let token = try #require(tokens.latest)
        let seen = try #require(origin.requests.first)
        #expect(seen.head.headers.values("X-Api-Key") == ["key=\(token)"])
        // Authorization is not bearerd's on this route: the client's passes as on a route without a session.
        #expect(seen.head.headers["Authorization"] == "Basic Zm9v")
        #expect(!proxy.logs.text.contains(token))
        #expect(proxy.logs.text.contains("X-Api-Key: <redacted fp "))
    }
}
