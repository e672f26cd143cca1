import Foundation
import Testing
import BearerdTLS
import BearerdTestSupport

/// `outbound_proxy:` CONNECT refusals end to end (docs/architecture.md §4): bearerd behind a real forward proxy
/// (`Tests/Fixtures/forward_proxy.py`) that refuses the tunnel to an https upstream; the client
/// gets a 502 and the log names the proxy's answer, never the password.
@Suite("outbound_proxy CONNECT refusals", .serialized)
struct OutboundProxyTunnelTests {
    @Test func wrongProxyPasswordOnConnectIsA502NamingThe407() throws {
        let dir = try RunningBearerd.tempDir("proxy-connect")
        let log = dir + "/proxy.log"
        let proxy = try PythonFixture(script: "forward_proxy.py", arguments: ["--port", "0", "--log", log, "--user", "px:right"])
        defer { proxy.stop() }
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let origin = try TestOrigin(tls: try pki.serverContext()) { _ in .response(status: 200, headers: [], body: Array("reached".utf8)) }
        defer { origin.stop() }
        let port = try RunningBearerd.freePort()
        // https_proxy only: the (http) token endpoint is reached directly, the https upstream
        // through the proxy, with the wrong password.
        let b = try RunningBearerd(config: """
            listen: 127.0.0.1:\(port)
            outbound_proxy: env
            sessions:
              s:
                grant: client_credentials
                token_url: \(tokens.tokenURL)
                client_id: c
                client_secret: x
            routes:
              - match: /
                upstream: https://localhost:\(origin.port)
                session: s
                tls: { ca_file: \(pki.caFile) }
            """, dir: dir, env: ["https_proxy": "http://px:wr0ng-pw@127.0.0.1:\(proxy.port)", "http_proxy": "", "NO_PROXY": ""])
        defer { _ = b.stop() }
        let r = b.waitServing(port: port, path: "/via-proxy")
        #expect(r?.status == 502, "\(b.logs)")
        #expect(b.waitLog("407"), "\(b.logs)")
        #expect(b.logs.contains("the outbound proxy http://127.0.0.1:\(proxy.port) refused the tunnel to localhost:\(origin.port)"), "\(b.logs)")
        #expect(b.logs.contains("error=outbound_proxy_auth_required"), "\(b.logs)")
        #expect(!b.logs.contains("wr0ng-pw"))
        let seen = OutboundProxyTests.seen(log)
        #expect(seen == [OutboundProxyTests.Seen(method: "CONNECT", target: "localhost:\(origin.port)", authorized: false)], "\(seen)")
    }
}
