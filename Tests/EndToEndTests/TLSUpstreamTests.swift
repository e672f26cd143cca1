import Foundation
import Testing
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport
import BearerdTLS
import BearerdConfig
import BearerdSessions
import BearerdService

@Suite("TLS upstreams over real sockets", .serialized)
struct TLSUpstreamTests {
    static let pki: TestPKI = try! TestPKI.generate(serverNames: ["localhost", "127.0.0.1"])

    @Test func verifiesWithCAFileAndSendsSNI() throws {
        let pki = Self.pki
        let origin = try TestOrigin(tls: try pki.serverContext(), handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port, scheme: "https", host: "localhost", tls: TLSSettings(caFile: pki.caFile))])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        for i in 0..<3 {
            try c.send("GET /t/\(i) HTTP/1.1\r\nHost: x\r\n\r\n")
            let r = try c.readResponse()
            #expect(r.status == 200)
            #expect(r.bodyText.contains("host: localhost:\(origin.port)"))
        }
        // Pooled TLS connection reused.
        #expect(origin.connectionCount == 1)
    }

    @Test func failsWithout502WhenTheCAIsUnknown() throws {
        let origin = try TestOrigin(tls: try Self.pki.serverContext(), handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port, scheme: "https", host: "localhost")])
        defer { proxy.stop() }
        let r = try TestClient.get(port: proxy.port, path: "/")
        #expect(r.status == 502)
        #expect(r.bodyText.contains("\"error\":\"upstream_tls\""))
        #expect(r.bodyText.contains("unable to get local issuer certificate"))
        #expect(origin.requests.isEmpty)
    }

    @Test func wrongHostNameFails() throws {
        let pki = Self.pki
        let (cert, key) = try pki.issueServerCertificate(names: ["other.example"], label: "other")
        let ctx = try TLSContext.server(certificateChainFile: cert, privateKeyFile: key, clientCAFile: nil, requireClientCertificate: false, alpn: [])
        let origin = try TestOrigin(tls: ctx, handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port, scheme: "https", host: "localhost", tls: TLSSettings(caFile: pki.caFile))])
        defer { proxy.stop() }
        let r = try TestClient.get(port: proxy.port, path: "/")
        #expect(r.status == 502)
        #expect(r.bodyText.contains("upstream_tls"))
        #expect(r.bodyText.contains("hostname mismatch"))
    }

    @Test func presentsTheClientCertificateWhenConfigured() throws {
        let pki = Self.pki
        let origin = try TestOrigin(tls: try pki.serverContext(requireClientCertificate: true), handler: echoHandler)
        defer { origin.stop() }
        let withCert = try TestProxy(routes: [route(origin: origin.port, scheme: "https", host: "127.0.0.1",
                                                    tls: TLSSettings(caFile: pki.caFile, clientCert: pki.clientCertFile, clientKey: pki.clientKeyFile))])
        defer { withCert.stop() }
        let ok = try TestClient.get(port: withCert.port, path: "/m")
        #expect(ok.status == 200)
        #expect(origin.requests.first?.clientCertificateSubject?.contains(TestPKI.clientCommonName) == true)

        let withoutCert = try TestProxy(routes: [route(origin: origin.port, scheme: "https", host: "127.0.0.1", tls: TLSSettings(caFile: pki.caFile))])
        defer { withoutCert.stop() }
        let refused = try TestClient.get(port: withoutCert.port, path: "/m")
        #expect(refused.status == 502)
        #expect(origin.requests.count == 1)
    }
}
