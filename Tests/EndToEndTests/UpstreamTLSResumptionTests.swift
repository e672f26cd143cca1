import Foundation
import Testing
import BearerdConfig
import BearerdTestSupport

/// TLS session resumption towards upstreams (docs/architecture.md §2.3), against nginx as the TLS
/// origin: its `/close/` location closes the connection after every answer, so every request needs a
/// new upstream TLS connection, and it says whether that connection resumed a session
/// (`$ssl_session_reused`) — the server's view, independent of bearerd's own count, which
/// `/metrics` shows as `bearerd_tls_handshakes_total{peer, resumed}`.
@Suite("Upstream TLS session resumption", .serialized,
       .enabled(if: NginxOrigin.isAvailable || ProcessInfo.processInfo.environment["CI"] != nil, "nginx is not installed"))
struct UpstreamTLSResumptionTests {
    /// HTTP/1.1 upstream (`http2: off`): nginx keeps an HTTP/2 connection open whatever
    /// `keepalive_timeout` says, so only HTTP/1.1 gives a new TLS connection per request here;
    /// the resumption code is the same for both (the TLS context's session cache).
    @Test func newUpstreamConnectionsResumeTheSession() throws {
        let http2 = HTTP2Mode.off
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let nginx = try NginxOrigin(pki: pki)
        defer { nginx.stop() }
        var r = RouteConfig(match: "/", upstream: UpstreamURL(scheme: "https", host: "localhost", port: nginx.tlsPort, basePath: ""),
                            tls: TLSSettings(caFile: pki.caFile))
        r.http2 = http2
        let proxy = try TestProxy(routes: [r], admin: true)
        defer { proxy.stop() }
        var reused: [String] = []
        for i in 0..<8 {
            let answer = try TestClient.get(port: proxy.port, path: "/close/\(i)")
            #expect(answer.status == 200, "\(answer.bodyText)")
            reused.append(HTTP2UpstreamTests.seen(answer.bodyText)["reused"] ?? "?")
        }
        // The first connection is a full handshake; every later one resumes (nginx prints "r").
        #expect(reused.first == ".", "\(reused)")
        #expect(reused.dropFirst().allSatisfy { $0 == "r" }, "reused: \(reused)")
        let admin = try #require(proxy.server.adminAddress).port
        let metrics = try TestClient.get(port: admin, path: "/metrics").bodyText
        let peer = "localhost:\(nginx.tlsPort)"
        #expect(metrics.contains("bearerd_tls_handshakes_total{peer=\"\(peer)\",resumed=\"true\"} 7"), "\(metrics.split(separator: "\n").filter { $0.contains("tls_handshakes") })")
        #expect(metrics.contains("bearerd_tls_handshakes_total{peer=\"\(peer)\",resumed=\"false\"} 1"))
    }
}
