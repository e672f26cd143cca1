import Foundation
import Testing
import BearerdHTTP
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

/// The browser guard over real sockets (docs/architecture.md §5): a web page the developer
/// visits must not make the local bearerd act for it. Requests a browser marks as cross-site get
/// 403 JSON and reach no upstream; programs (no Origin, no Sec-Fetch-Site), the listener's own
/// origin and `allowed_origins` are served.
@Suite("Browser guard end to end", .serialized)
struct BrowserGuardEndToEndTests {
    /// The request of the issue: a cross-site "simple" POST (no CORS preflight needed to send it).
    static func attack(port: UInt16, origin: String = "https://evil.example") -> String {
        let body = "{\"delete\":\"everything\"}"
        return "POST /api/upload HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nOrigin: \(origin)\r\nSec-Fetch-Site: cross-site\r\n"
            + "Sec-Fetch-Mode: no-cors\r\nContent-Type: text/plain\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
    }

    @Test func crossSitePostGets403AndReachesNoUpstream() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)], admin: true, allowedHosts: [])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send(Self.attack(port: proxy.port))
        let r = try c.readResponse(method: "POST")
        #expect(r.status == 403)
        #expect(r["Content-Type"] == "application/json")
        #expect(r["Connection"] == "close")
        #expect(r.bodyText.hasPrefix("{\"error\":\"cross_site_request\",\"detail\":\""))
        #expect(r.bodyText.contains("https://evil.example"))
        #expect(r.bodyText.contains("allowed_origins"))
        #expect(c.isClosedByPeer())
        #expect(origin.requests.isEmpty)
        #expect(proxy.logs.text.contains("cross-site request refused"))
        #expect(proxy.logs.text.contains("browser.foreign_origin"))

        // A cross-site GET (an <img>, a link) carries no Origin: Sec-Fetch-Site alone refuses it.
        let c2 = try TestClient(port: proxy.port)
        try c2.send("GET /api/items HTTP/1.1\r\nHost: localhost:\(proxy.port)\r\nSec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: no-cors\r\n\r\n")
        #expect(try c2.readResponse().status == 403)
        // A sandboxed frame's Origin: null.
        let c3 = try TestClient(port: proxy.port)
        try c3.send("POST /api/x HTTP/1.1\r\nHost: localhost:\(proxy.port)\r\nOrigin: null\r\nContent-Length: 0\r\n\r\n")
        #expect(try c3.readResponse(method: "POST").status == 403)
        // A CORS preflight from the page is refused too, so the browser sends nothing after it.
        let c4 = try TestClient(port: proxy.port)
        try c4.send("OPTIONS /api/x HTTP/1.1\r\nHost: localhost:\(proxy.port)\r\nOrigin: https://evil.example\r\n"
                    + "Access-Control-Request-Method: PUT\r\nSec-Fetch-Site: cross-site\r\nSec-Fetch-Mode: cors\r\n\r\n")
        #expect(try c4.readResponse(method: "OPTIONS").status == 403)
        #expect(origin.requests.isEmpty)

        // Counted like the other refusals: route="none", status 403. The admin listener has no guard.
        let adminPort = try #require(proxy.server.adminAddress).port
        let m = try TestClient.get(port: adminPort, path: "/metrics", headers: [("Origin", "https://evil.example")])
        #expect(m.status == 200)
        #expect(m.bodyText.contains("bearerd_requests_total{route=\"none\",status=\"403\"} 4"))
    }

    @Test func programsTheListenersOwnOriginAndAllowedOriginsAreServed() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)], allowedHosts: [], allowedOrigins: ["http://localhost:3000"])
        defer { proxy.stop() }
        let port = proxy.port
        let c = try TestClient(port: port)
        // curl: no Origin, no Sec-Fetch-Site.
        try c.send("POST /api/upload HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nUser-Agent: curl/8.5.0\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nhi")
        #expect(try c.readResponse(method: "POST").status == 200)
        // A page bearerd itself serves, fetching on the same origin.
        try c.send("POST /api/x HTTP/1.1\r\nHost: localhost:\(port)\r\nOrigin: http://LOCALHOST:\(port)\r\nSec-Fetch-Site: same-origin\r\n"
                   + "Sec-Fetch-Mode: cors\r\nContent-Length: 0\r\n\r\n")
        #expect(try c.readResponse(method: "POST").status == 200)
        // The developer typing the URL.
        try c.send("GET /api/x HTTP/1.1\r\nHost: localhost:\(port)\r\nSec-Fetch-Site: none\r\nSec-Fetch-Mode: navigate\r\n\r\n")
        #expect(try c.readResponse().status == 200)
        // The web app named in allowed_origins, on another port (same-site for the browser).
        try c.send("POST /api/x HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nOrigin: http://localhost:3000\r\nSec-Fetch-Site: same-site\r\n"
                   + "Content-Type: application/json\r\nContent-Length: 2\r\n\r\n{}")
        let allowed = try c.readResponse(method: "POST")
        #expect(allowed.status == 200)
        #expect(allowed.bodyText.contains("origin: http://localhost:3000"))  // forwarded as sent
        #expect(origin.requests.count == 4)
        // The same app on another port is another origin.
        try c.send(Self.attack(port: port, origin: "http://localhost:3001"))
        #expect(try c.readResponse(method: "POST").status == 403)
        #expect(origin.requests.count == 4)
    }

    @Test func aReloadChangesAllowedOrigins() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let app = "https://app.example.com"
        let first = try TestClient(port: proxy.port)
        try first.send(Self.attack(port: proxy.port, origin: app))
        #expect(try first.readResponse(method: "POST").status == 403)

        var config = proxy.server.runtime.config
        let bound = proxy.server.boundAddresses[0].port
        config.listeners = [ListenerConfig(address: .tcp(host: "127.0.0.1", port: 0), allowedHosts: ["*"], allowedOrigins: [app])]
        try proxy.server.reload(config)
        #expect(proxy.server.boundAddresses[0].port == bound)
        let second = try TestClient(port: proxy.port)
        try second.send(Self.attack(port: proxy.port, origin: app))
        #expect(try second.readResponse(method: "POST").status == 200)
        #expect(origin.requests.count == 1)
    }
}
