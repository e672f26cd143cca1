import Foundation
import Testing
import BearerdTLS
import BearerdTestSupport

/// `outbound_proxy:` (docs/architecture.md §4) through a real forward proxy on 127.0.0.1
/// (`Tests/Fixtures/forward_proxy.py`): the token endpoint over plain HTTP in absolute form, an
/// https upstream through a CONNECT tunnel with TLS inside, Basic proxy credentials never logged;
/// `env` honours HTTPS_PROXY / http_proxy / NO_PROXY like curl.
@Suite("outbound_proxy", .serialized)
struct OutboundProxyTests {
    struct Seen: Decodable, Equatable {
        var method: String
        var target: String
        var authorized: Bool
    }

    static func seen(_ log: String) -> [Seen] {
        ((try? String(contentsOfFile: log, encoding: .utf8)) ?? "").split(separator: "\n").compactMap {
            try? JSONDecoder().decode(Seen.self, from: Data($0.utf8))
        }
    }

    @Test func tokenEndpointAndHTTPSUpstreamThroughTheProxy() throws {
        let dir = try RunningBearerd.tempDir("proxy")
        let log = dir + "/proxy.log"
        let proxy = try PythonFixture(script: "forward_proxy.py", arguments: ["--port", "0", "--log", log, "--user", "px:s3cret-pw"])
        defer { proxy.stop() }
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let origin = try TestOrigin(tls: try pki.serverContext()) { r in
            .response(status: 200, headers: [], body: Array((r.head.headers["Authorization"] ?? "none").utf8))
        }
        defer { origin.stop() }
        let port = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: """
            listen: 127.0.0.1:\(port)
            outbound_proxy: http://px:s3cret-pw@127.0.0.1:\(proxy.port)
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
            """, dir: dir)
        defer { _ = b.stop() }
        let r = b.waitServing(port: port, path: "/via-proxy")
        #expect(r?.status == 200, "\(b.logs)")
        #expect(r?.bodyText == "Bearer \(tokens.latest ?? "?")")
        let seen = Self.seen(log)
        #expect(seen.contains(Seen(method: "POST", target: "http://127.0.0.1:\(tokens.port)/token", authorized: true)), "\(seen)")
        #expect(seen.contains(Seen(method: "CONNECT", target: "localhost:\(origin.port)", authorized: true)), "\(seen)")
        #expect(!b.logs.contains("s3cret-pw"))
    }

    @Test func envHonoursNoProxyAndAWrongPasswordIsAClearError() throws {
        let dir = try RunningBearerd.tempDir("proxy")
        let log = dir + "/proxy.log"
        let proxy = try PythonFixture(script: "forward_proxy.py", arguments: ["--port", "0", "--log", log, "--user", "px:right"])
        defer { proxy.stop() }
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let origin = try TestOrigin { _ in .response(status: 200, headers: [], body: Array("direct".utf8)) }
        defer { origin.stop() }
        let config = """
            outbound_proxy: env
            sessions:
              s:
                grant: client_credentials
                token_url: \(tokens.tokenURL)
                client_id: c
                client_secret: x
            routes:
              - match: /
                upstream: http://127.0.0.1:\(origin.port)
                session: s
            """
        // NO_PROXY covers 127.0.0.1: everything goes direct.
        let direct = try CommandLineTests.tempFile("bearerd.yaml", config)
        let ok = try CommandLineTests.run(["token", "-c", direct, "s"],
                                          env: ["http_proxy": "http://px:right@127.0.0.1:\(proxy.port)", "NO_PROXY": "localhost,127.0.0.1"])
        #expect(ok.status == 0, "\(ok.stderr)")
        #expect(Self.seen(log).isEmpty)
        // Without NO_PROXY, http_proxy with a wrong password: the proxy's 407 is the error.
        let refused = try CommandLineTests.run(["token", "-c", direct, "s"],
                                               env: ["http_proxy": "http://px:wrong@127.0.0.1:\(proxy.port)", "NO_PROXY": ""])
        #expect(refused.status != 0)
        #expect(refused.stderr.contains("407"), "\(refused.stderr)")
        // The same words as a routed request's answer.
        #expect(refused.stderr.contains("outbound_proxy_auth_required: the outbound proxy http://127.0.0.1:\(proxy.port) answered 407"),
                "\(refused.stderr)")
        #expect(!refused.stderr.contains("wrong"))
        #expect(Self.seen(log).first?.authorized == false)
    }
}
