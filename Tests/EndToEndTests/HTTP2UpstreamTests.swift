import Foundation
import Testing
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions

/// HTTP/2 towards upstreams (docs/architecture.md §2.3, §4 `http2:`), against a real nginx: ALPN on https, prior knowledge on
/// h2c, one connection for concurrent requests, 401 → refresh → replay per stream.
@Suite("HTTP/2 upstreams against nginx", .serialized,
       .enabled(if: NginxOrigin.isAvailable || ProcessInfo.processInfo.environment["CI"] != nil, "nginx is not installed"))
struct HTTP2UpstreamTests {
    /// nginx with a fresh PKI, and a token endpoint (its first token is the one nginx rejects).
    final class Rig {
        let pki: TestPKI
        let nginx: NginxOrigin
        let tokens: ScriptedTokenEndpoint
        init() throws {
            pki = try TestPKI.generate()
            nginx = try NginxOrigin(pki: pki, rejectToken: "Bearer at-1")
            tokens = try ScriptedTokenEndpoint()
        }
        func stop() {
            nginx.stop()
            tokens.stop()
            pki.remove()
        }
    }

    /// One route with a client_credentials session to `upstream`.
    func proxy(_ upstream: UpstreamURL, http2: HTTP2Mode, rig: Rig) throws -> TestProxy {
        var r = RouteConfig(match: "/", upstream: upstream, tls: upstream.isTLS ? TLSSettings(caFile: rig.pki.caFile) : nil)
        r.http2 = http2
        return try TestProxy(routes: [withSession(r)], sessions: [scriptedSession(rig.tokens)])
    }

    /// `key=value` words of nginx's answer line.
    static func seen(_ body: String) -> [String: String] {
        var out: [String: String] = [:]
        for word in body.split(whereSeparator: { $0 == " " || $0 == "\n" }) {
            let kv = word.split(separator: "=", maxSplits: 1)
            if kv.count == 2 { out[String(kv[0])] = String(kv[1]) }
        }
        return out
    }

    @Test func httpsUpstreamNegotiatesH2WithALPN() throws {
        let rig = try Rig()
        defer { rig.stop() }
        let (nginx, tokens) = (rig.nginx, rig.tokens)
        let p = try proxy(UpstreamURL(scheme: "https", host: "localhost", port: nginx.tlsPort, basePath: ""), http2: .auto, rig: rig)
        defer { p.stop() }
        let r = try TestClient.get(port: p.port, path: "/v1/items?x=1")
        #expect(r.status == 200)
        let seen = Self.seen(r.bodyText)
        #expect(seen["proto"] == "HTTP/2.0")
        #expect(r.bodyText.contains("auth=Bearer \(try #require(tokens.latest))"))
        #expect(seen["uri"] == "/v1/items?x=1")
        #expect(p.logs.text.contains("upstream_protocol=h2"))
        // http2: off keeps HTTP/1.1 on the same server.
        let off = try proxy(UpstreamURL(scheme: "https", host: "localhost", port: nginx.tlsPort, basePath: ""), http2: .off, rig: rig)
        defer { off.stop() }
        #expect(Self.seen(try TestClient.get(port: off.port, path: "/").bodyText)["proto"] == "HTTP/1.1")
    }

    @Test func priorKnowledgeSpeaksH2CToACleartextUpstream() throws {
        let rig = try Rig()
        defer { rig.stop() }
        let nginx = rig.nginx
        let p = try proxy(UpstreamURL(scheme: "http", host: "127.0.0.1", port: nginx.h2cPort, basePath: ""), http2: .priorKnowledge, rig: rig)
        defer { p.stop() }
        let r = try TestClient.get(port: p.port, path: "/grpc-like")
        #expect(r.status == 200)
        #expect(Self.seen(r.bodyText)["proto"] == "HTTP/2.0")
        // An HTTP/2 client end to end: h2c in, h2c out.
        if Curl.available {
            let c = try Curl.run(["--http2-prior-knowledge", "http://127.0.0.1:\(p.port)/both"])
            #expect(c.httpVersion == "2")
            #expect(Self.seen(c.body)["proto"] == "HTTP/2.0")
        }
    }

    /// 100 requests released at once share one upstream connection (streams multiplexed up to
    /// the server's SETTINGS_MAX_CONCURRENT_STREAMS, 128 here).
    @Test func concurrentRequestsShareOneConnection() throws {
        let rig = try Rig()
        defer { rig.stop() }
        let nginx = rig.nginx
        let p = try proxy(UpstreamURL(scheme: "https", host: "localhost", port: nginx.tlsPort, basePath: ""), http2: .auto, rig: rig)
        defer { p.stop() }
        _ = try TestClient.get(port: p.port, path: "/warm-token")  // the token first, so the burst meets a ready session
        let n = 100
        let clients = try (0..<n).map { _ in try TestClient(port: p.port) }
        let start = DispatchSemaphore(value: 0)
        let done = DispatchGroup()
        final class Seen: @unchecked Sendable {  // @unchecked: guarded by `lock`
            let lock = NSLock()
            var conns: [String] = []
            var failures = 0
        }
        let seen = Seen()
        for (i, c) in clients.enumerated() {
            done.enter()
            Thread {
                defer { done.leave() }
                start.wait()
                do {
                    try c.send("GET /burst/\(i) HTTP/1.1\r\nHost: x\r\n\r\n")
                    let r = try c.readResponse()
                    let conn = Self.seen(r.bodyText)["conn"] ?? "?"
                    seen.lock.withLock { seen.conns.append(conn + (Self.seen(r.bodyText)["proto"] == "HTTP/2.0" ? "" : "-h1")) }
                } catch {
                    seen.lock.withLock { seen.failures += 1 }
                }
            }.start()
        }
        for _ in 0..<n { start.signal() }
        #expect(done.wait(timeout: .now() + 30) == .success)
        let (conns, failures) = seen.lock.withLock { (seen.conns, seen.failures) }
        #expect(failures == 0)
        #expect(conns.count == n)
        #expect(Set(conns).count == 1, "connections used: \(Set(conns))")
    }

    @Test func aRejectedStreamIsRefreshedAndReplayed() throws {
        let rig = try Rig()
        defer { rig.stop() }
        let (nginx, tokens) = (rig.nginx, rig.tokens)
        let p = try proxy(UpstreamURL(scheme: "https", host: "localhost", port: nginx.tlsPort, basePath: ""), http2: .auto, rig: rig)
        defer { p.stop() }
        let r = try TestClient.get(port: p.port, path: "/reject/me")
        #expect(r.status == 200)
        #expect(r.bodyText.contains("auth=Bearer at-2"))
        #expect(Self.seen(r.bodyText)["proto"] == "HTTP/2.0")
        #expect(tokens.calls.count == 2)
        #expect(p.logs.text.contains("replaying rejected request"))
    }
}
