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

/// bearerd in-process like `TestProxy`, with the I/O mode chosen by the test (both modes are
/// checked here whatever `$BEARERD_IO` says).
final class EdgeProxy {
    let server: BearerdServer
    let logs = CapturedLogs()
    var port: UInt16 { server.boundAddresses[0].port }

    init(routes: [RouteConfig], sessions: [SessionConfig] = [], io: IOModeSetting) throws {
        var config = BearerdConfig(file: "<test>", listen: [.tcp(host: "127.0.0.1", port: 0)], admin: nil, loops: 1,
                                   limits: HTTP1Limits(), frontendTimeouts: FrontendTimeouts(), sessions: sessions, routes: routes)
        config.listeners = [ListenerConfig(address: .tcp(host: "127.0.0.1", port: 0), allowedHosts: ["*"], allowedOrigins: [])]
        config.ioMode = io
        server = try BearerdServer(config: config, logger: logs.logger)
        try server.start()
    }

    func stop() {
        let done = DispatchSemaphore(value: 0)
        server.shutdown(grace: .seconds(1)) { done.signal() }
        done.wait()
    }
}

@Suite("HTTP/1.1 edges: Upgrade without Connection, half-closing clients, forbidden trailers", .serialized)
struct HTTP1EdgeTests {
    // MARK: Upgrade (RFC 9110 §7.8, DESIGN §5)

    /// An `Upgrade` field that `Connection` does not name (or on HTTP/1.0) makes no upgrade
    /// request: it is dropped like any hop-by-hop field and the request is forwarded.
    @Test(arguments: [
        "GET /a HTTP/1.1\r\nHost: x\r\nUpgrade: foo/1\r\n\r\n",
        "GET /a HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        "GET /a HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nUpgrade: foo/1, websocket\r\n\r\n",
        "GET /a HTTP/1.0\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: foo/1\r\n\r\n",
    ])
    func upgradeNotNamedInConnectionIsForwardedWithoutIt(request: String) throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try EdgeProxy(routes: [route(origin: origin.port)], io: .poller)
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send(request)
        let r = try c.readResponse()
        #expect(r.status == 200, "\(r.bodyText)")
        #expect(r.bodyText.contains("target=/a"))
        let seen = try #require(origin.requests.first)
        #expect(seen.head.headers["Upgrade"] == nil)
        #expect(!(seen.head.headers["Connection"] ?? "").lowercased().contains("upgrade"))
        #expect(r["Upgrade"] == nil)
        if request.contains("HTTP/1.1") {
            // A plain request: the connection carries another one.
            try c.send("GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(try c.readResponse().bodyText.contains("target=/b"))
        }
    }

    /// A real upgrade request (Connection: upgrade) for a protocol bearerd does not tunnel is
    /// still refused, never silently downgraded.
    @Test func realUpgradeToAnUnknownProtocolIsStillRefused() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try EdgeProxy(routes: [route(origin: origin.port)], io: .poller)
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /a HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: foo/1\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 400)
        #expect(r.bodyText.contains("proxy.unsupported_upgrade"))
        #expect(origin.requests.isEmpty)
    }
}
