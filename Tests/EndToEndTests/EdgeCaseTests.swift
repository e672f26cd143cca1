import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Testing
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

@Suite("Malformed input, limits, timeouts and upstream failures", .serialized)
struct EdgeCaseTests {
    /// Each malformed request gets its 4xx, the connection is closed, and the origin never sees it.
    @Test(arguments: [
        ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 5\r\n\r\nabcd", 400),
        ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n", 400),
        ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
        ("GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n", 400),
        ("GET / HTTP/1.1\nHost: x\n\n", 400),
        ("GET / HTTP/1.1\r\nHost : x\r\n\r\n", 400),
        ("GET / HTTP/1.1\r\n\r\n", 400),
        ("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        ("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        ("GET / HTTP/2.0\r\nHost: x\r\n\r\n", 505),
        ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400),
        ("GET /a/../b HTTP/1.1\r\nHost: x\r\n\r\n", 400),
        ("CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\n\r\n", 405),
    ])
    func malformedRequestsAreRejected(input: String, status: Int) throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send(input)
        let r = try c.readResponse()
        #expect(r.status == status)
        #expect(r["Connection"] == "close")
        #expect(r["Content-Type"] == "application/json")
        #expect(c.isClosedByPeer())
        #expect(origin.requests.isEmpty)
    }

    @Test func oversizedHeadersAndTargetsGet431And414() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)],
                                  limits: HTTP1Limits(maxHeaderBytes: 4096, maxRequestTarget: 1024, maxHeaderCount: 10))
        defer { proxy.stop() }
        let big = try TestClient(port: proxy.port)
        try big.send("GET / HTTP/1.1\r\nHost: x\r\nX-Big: \(String(repeating: "a", count: 5000))\r\n\r\n")
        #expect(try big.readResponse().status == 431)
        let many = try TestClient(port: proxy.port)
        try many.send("GET / HTTP/1.1\r\nHost: x\r\n" + (0..<11).map { "X-\($0): v\r\n" }.joined() + "\r\n")
        #expect(try many.readResponse().status == 431)
        let long = try TestClient(port: proxy.port)
        try long.send("GET /\(String(repeating: "p", count: 2000)) HTTP/1.1\r\n")  // rejected before the line ends
        #expect(try long.readResponse().status == 414)
        #expect(origin.requests.isEmpty)
    }

    @Test func slowHeadersGet408AndIdleConnectionsAreClosed() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        var t = FrontendTimeouts()
        t.headerRead = .milliseconds(300)
        t.idle = .milliseconds(400)
        let proxy = try TestProxy(routes: [route(origin: origin.port)], timeouts: t)
        defer { proxy.stop() }
        let slow = try TestClient(port: proxy.port)
        try slow.send("GET / HTTP/1.1\r\nHost: x\r\n")
        let r = try slow.readResponse()
        #expect(r.status == 408)
        let idle = try TestClient(port: proxy.port)
        try idle.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try idle.readResponse().status == 200)
        let start = Date()
        #expect(idle.isClosedByPeer(within: 3))
        #expect(Date().timeIntervalSince(start) < 2)
    }

    @Test func unreachableUpstreamIs502Json() throws {
        // A port bound but not listening: connects are refused, and no other test can take it.
        let dead = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(dead) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(dead, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(dead, $0, &len) } }
        let deadPort = UInt16(bigEndian: addr.sin_port)
        let proxy = try TestProxy(routes: [route("/", origin: deadPort)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /x HTTP/1.1\r\nHost: x\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 502)
        #expect(r["Content-Type"] == "application/json")
        #expect(r.bodyText.contains("\"error\":\"upstream_unreachable\""))
        #expect(r.bodyText.contains("\"route\":\"/\""))
        // The client connection survives a 502 for a bodiless request.
        try c.send("GET /y HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try c.readResponse().status == 502)
    }

    @Test func slowUpstreamIs504() throws {
        let origin = try TestOrigin { r in .delayed(1.5, echoHandler(r)) }
        defer { origin.stop() }
        var rt = RouteTimeouts()
        rt.response = .milliseconds(300)
        let proxy = try TestProxy(routes: [route(origin: origin.port, timeouts: rt)])
        defer { proxy.stop() }
        let start = Date()
        let r = try TestClient.get(port: proxy.port, path: "/slow")
        #expect(r.status == 504)
        #expect(r.bodyText.contains("\"error\":\"upstream_timeout\""))
        #expect(Date().timeIntervalSince(start) < 1.45)  // before the origin (1.5 s) would have answered; the 504 itself proves the timeout
    }

    @Test(arguments: [
        "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        "HTTP/1.1 200 OK\r\nBad Header\r\n\r\n",
        "HTTP/1.1 200 OK\nContent-Length: 0\n\n",
        "NOT HTTP AT ALL\r\n\r\n",
    ])
    func invalidUpstreamResponsesAre502(raw: String) throws {
        let origin = try TestOrigin { _ in .rawThenClose(Array(raw.utf8)) }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let r = try TestClient.get(port: proxy.port, path: "/")
        #expect(r.status == 502)
        #expect(r.bodyText.contains("upstream_invalid_response"))
    }

    @Test func upstreamClosingAnIdlePooledConnectionIsRetriedForBodilessRequests() throws {
        // The origin answers, then closes every connection after its first response.
        let origin = try TestOrigin { _ in .rawThenClose(Array("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".utf8)) }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        for _ in 0..<5 {
            try c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(try c.readResponse().bodyText == "ok")
            Thread.sleep(forTimeInterval: 0.05)
        }
    }

    @Test func adminEndpointsAnswer() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)], admin: true)
        defer { proxy.stop() }
        _ = try TestClient.get(port: proxy.port, path: "/one")
        let adminPort = try #require(proxy.server.adminAddress).port
        #expect(try TestClient.get(port: adminPort, path: "/healthz").status == 200)
        #expect(try TestClient.get(port: adminPort, path: "/readyz").status == 200)
        let m = try TestClient.get(port: adminPort, path: "/metrics")
        #expect(m.status == 200)
        #expect(m.bodyText.contains("bearerd_requests_total{route=\"/\",status=\"200\"} 1"))
    }
}
