import Foundation
import Logging
import Testing
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

/// `bearerd demo`'s parts: the demo authority as token endpoint and protected API, bearerd in
/// front with a client_credentials session; revoking shows refresh and replay.
@Suite("Demo")
struct DemoTests {
    @Test func demoFlowInjectsRefreshesAndReplays() throws {
        let upstreamConfig = BearerdConfig(file: "<demo>", listen: [.tcp(host: "127.0.0.1", port: 0)], loops: 1, routes: [])
        let authority = try BearerdServer(config: upstreamConfig, logger: .init(label: "t") { _ in SwiftLogNoOpLogHandler() },
                                          accessLog: false, responder: DemoAuthority())
        try authority.start()
        defer {
            let d = DispatchSemaphore(value: 0)
            authority.shutdown(grace: .seconds(1)) { d.signal() }
            d.wait()
        }
        let port = authority.boundAddresses[0].port
        let session = SessionConfig(name: "demo", grant: .clientCredentials,
                                    tokenURL: EndpointURL(scheme: "http", host: "127.0.0.1", port: port, path: "/oauth/token"),
                                    clientID: DemoAuthority.clientID, clientSecret: .literal(Secret(DemoAuthority.clientSecret)))
        var r = route(origin: port, basePath: "/api")
        r.session = "demo"
        let proxy = try TestProxy(routes: [r], sessions: [session])
        defer { proxy.stop() }
        // Without bearerd the API refuses.
        #expect(try TestClient.get(port: port, path: "/api/hello").status == 401)
        let first = try TestClient.get(port: proxy.port, path: "/hello")
        #expect(first.status == 200)
        #expect(first.bodyText.contains("fingerprint"))
        let c = try TestClient(port: port)
        try c.send("POST /demo/revoke HTTP/1.1\r\nHost: localhost\r\nContent-Length: 0\r\n\r\n")
        #expect(try c.readResponse(method: "POST").status == 200)
        let second = try TestClient.get(port: proxy.port, path: "/hello")
        #expect(second.status == 200)
        #expect(proxy.logs.text.contains("replaying rejected request"))
    }
}
