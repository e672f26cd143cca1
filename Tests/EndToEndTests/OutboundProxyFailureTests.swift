import Foundation
import Testing
import BearerdHTTP
import BearerdTLS
import BearerdConfig
import BearerdTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// How each way an outbound proxy can fail a CONNECT tunnel is answered (docs/guides/outbound-proxy.md,
/// "Behind a forward proxy"): a proxy that refuses the TCP connection → 502 `upstream_unreachable` naming the proxy;
/// one that never answers within `timeouts.connect` → 504 `upstream_timeout`; 407 → 502
/// `outbound_proxy_auth_required`; any other refusal → 502 `upstream_unreachable` with the proxy's
/// status in `detail`. Each case runs against the hand-written proxy
/// (`Tests/Fixtures/forward_proxy.py`) and against Debian's tinyproxy (`TinyProxy`). A request
/// whose client resets before the tunnel is up sends nothing through it.
@Suite("outbound_proxy CONNECT failures, answered", .serialized,
       .enabled(if: TinyProxy.isAvailable || ProcessInfo.processInfo.environment["CI"] != nil, "tinyproxy is not installed"))
struct OutboundProxyFailureTests {
    enum Peer: String, CaseIterable, CustomTestStringConvertible, Sendable {
        case fixture, tinyproxy
        var testDescription: String { rawValue }
    }

    /// What the proxy is made to do with a CONNECT.
    enum Behaviour {
        case tunnel
        /// Demands credentials bearerd does not have (407).
        case demandCredentials
        /// Refuses the target by policy (403).
        case forbid
        /// Never answers.
        case silent
        /// Answers 200 only after `seconds` (the hand-written proxy; tinyproxy chains to it).
        case delay(Double)
    }

    /// A running proxy of either kind and the hand-written proxy's log (its JSON lines), if one runs.
    final class Proxy {
        let port: UInt16
        let fixtureLog: String?
        private let fixtures: [PythonFixture]
        private let tiny: TinyProxy?

        init(_ peer: Peer, _ behaviour: Behaviour, dir: String) throws {
            let log = dir + "/forward-proxy.log"
            var started: [PythonFixture] = []
            func fixture(_ mode: [String]) throws -> PythonFixture {
                let f = try PythonFixture(script: "forward_proxy.py", arguments: ["--port", "0", "--log", log] + mode)
                started.append(f)
                return f
            }
            let mode: [String]
            switch behaviour {
            case .tunnel: mode = []
            case .demandCredentials: mode = ["--mode", "407"]
            case .forbid: mode = ["--mode", "403"]
            case .silent: mode = ["--mode", "silent"]
            case .delay(let s): mode = ["--mode", "delay", "--delay", "\(s)"]
            }
            var fixturePort: UInt16 = 0
            switch (peer, behaviour) {
            case (.fixture, _):
                fixturePort = try fixture(mode).port
                tiny = nil
            case (.tinyproxy, .tunnel):
                tiny = try TinyProxy()
            case (.tinyproxy, .demandCredentials):
                tiny = try TinyProxy(basicAuth: ("px", "right"))
            case (.tinyproxy, .forbid):
                // Our origins never listen on 443: CONNECT to them is an access violation.
                tiny = try TinyProxy(connectPorts: [443])
            case (.tinyproxy, .silent), (.tinyproxy, .delay):
                // tinyproxy relays CONNECT to the hand-written proxy, whose answer (none, or a
                // late one) is tinyproxy's.
                tiny = try TinyProxy(upstream: try fixture(mode).port)
            }
            port = tiny?.port ?? fixturePort
            fixtures = started
            fixtureLog = started.isEmpty ? nil : log
        }

        func stop() {
            tiny?.stop()
            for f in fixtures { f.stop() }
        }

        /// The hand-written proxy's JSON lines (CONNECTs it received, tunnels that ended).
        var records: [[String: Any]] {
            guard let fixtureLog else { return [] }
            return ((try? String(contentsOfFile: fixtureLog, encoding: .utf8)) ?? "").split(separator: "\n").compactMap {
                (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any]
            }
        }

        /// CONNECTs received: tinyproxy's log, else the hand-written proxy's.
        var connects: [String] {
            if let tiny { return tiny.connectTargets }
            return records.filter { $0["method"] as? String == "CONNECT" }.compactMap { $0["target"] as? String }
        }

        var log: String { tiny?.log ?? "" }
    }

    /// bearerd, a TLS origin that answers with the Authorization it got, and a token endpoint.
    final class Rig {
        let pki: TestPKI
        let origin: TestOrigin
        let tokens: ScriptedTokenEndpoint
        let bearerd: TestProxy
        init(proxyPort: UInt16, credentials: String?, connectTimeout: Duration = .seconds(5)) throws {
            pki = try TestPKI.generate()
            origin = try TestOrigin(tls: try pki.serverContext()) { r in
                .response(status: 200, headers: [], body: Array((r.head.headers["Authorization"] ?? "none").utf8))
            }
            tokens = try ScriptedTokenEndpoint()
            var timeouts = RouteTimeouts()
            timeouts.connect = connectTimeout
            // The https upstream goes through the proxy; the (http) token endpoint directly.
            let outbound = OutboundProxy(https: OutboundProxy.Endpoint(host: "127.0.0.1", port: proxyPort, credentials: credentials))
            bearerd = try TestProxy(routes: [withSession(route(origin: origin.port, scheme: "https", host: "localhost",
                                                               tls: TLSSettings(caFile: pki.caFile), timeouts: timeouts))],
                                    sessions: [scriptedSession(tokens)], outboundProxy: outbound)
        }
        func stop() {
            bearerd.stop()
            origin.stop()
            tokens.stop()
            pki.remove()
        }
    }

    /// The JSON error body's fields.
    static func json(_ r: TestClient.Response) -> [String: String] {
        ((try? JSONSerialization.jsonObject(with: Data(r.body))) as? [String: String]) ?? [:]
    }

    @Test(arguments: Peer.allCases)
    func anOpenTunnelCarriesTheRequest(peer: Peer) throws {
        let dir = try RunningBearerd.tempDir("proxy-ok")
        let proxy = try Proxy(peer, .tunnel, dir: dir)
        defer { proxy.stop() }
        let rig = try Rig(proxyPort: proxy.port, credentials: nil)
        defer { rig.stop() }
        let r = try TestClient.get(port: rig.bearerd.port, path: "/through")
        #expect(r.status == 200, "\(r.bodyText) \(rig.bearerd.logs.text)")
        #expect(r.bodyText == "Bearer \(rig.tokens.issued.last ?? "?")")
        #expect(proxy.connects == ["localhost:\(rig.origin.port)"], "\(proxy.connects) \(proxy.log)")
    }

    /// Without credentials, or with wrong ones. The fixture answers 407 either way; tinyproxy 1.11
    /// answers missing credentials with 407 and wrong ones with 401, which to a CONNECT can only
    /// be the proxy's own demand too.
    @Test(arguments: Peer.allCases, [false, true])
    func proxyDemandingCredentialsIs502OutboundProxyAuthRequired(peer: Peer, wrongCredentials: Bool) throws {
        let dir = try RunningBearerd.tempDir("proxy-407")
        let proxy = try Proxy(peer, .demandCredentials, dir: dir)
        defer { proxy.stop() }
        let rig = try Rig(proxyPort: proxy.port, credentials: wrongCredentials ? "px:wr0ng-pw" : nil)
        defer { rig.stop() }
        let r = try TestClient.get(port: rig.bearerd.port, path: "/x")
        let body = Self.json(r)
        #expect(r.status == 502, "\(r.bodyText)")
        #expect(body["error"] == "outbound_proxy_auth_required", "\(r.bodyText)")
        let answer = switch (peer, wrongCredentials) {
        case (.fixture, _): "HTTP/1.1 407 Proxy Authentication Required"
        case (.tinyproxy, false): "HTTP/1.0 407 Proxy Authentication Required"
        case (.tinyproxy, true): "HTTP/1.0 401 Unauthorized"
        }
        let hint = wrongCredentials ? "the ones given were not accepted" : "none were given"
        #expect(body["detail"] == "the outbound proxy http://127.0.0.1:\(proxy.port) refused the tunnel to localhost:\(rig.origin.port): "
                + "\(answer) (the proxy wants credentials: http://user:password@host:port; \(hint))", "\(r.bodyText)")
        #expect(!r.bodyText.contains("wr0ng-pw") && !rig.bearerd.logs.text.contains("wr0ng-pw"))
        #expect(rig.origin.requests.isEmpty)
        #expect(proxy.connects == ["localhost:\(rig.origin.port)"], "\(proxy.connects) \(proxy.log)")
    }

    @Test(arguments: Peer.allCases)
    func proxyRefusingTheTargetIs502NamingItsStatus(peer: Peer) throws {
        let dir = try RunningBearerd.tempDir("proxy-403")
        let proxy = try Proxy(peer, .forbid, dir: dir)
        defer { proxy.stop() }
        let rig = try Rig(proxyPort: proxy.port, credentials: nil)
        defer { rig.stop() }
        let r = try TestClient.get(port: rig.bearerd.port, path: "/x")
        let body = Self.json(r)
        #expect(r.status == 502, "\(r.bodyText)")
        #expect(body["error"] == "upstream_unreachable", "\(r.bodyText)")
        // The fixture says "403 Forbidden", tinyproxy "403 Access violation".
        #expect(body["detail"]?.contains("refused the tunnel to localhost:\(rig.origin.port): HTTP/1.1 403 ") == true, "\(r.bodyText)")
        #expect(rig.origin.requests.isEmpty)
    }

    @Test(arguments: Peer.allCases)
    func proxyThatNeverAnswersIs504(peer: Peer) throws {
        let dir = try RunningBearerd.tempDir("proxy-silent")
        let proxy = try Proxy(peer, .silent, dir: dir)
        defer { proxy.stop() }
        let rig = try Rig(proxyPort: proxy.port, credentials: nil, connectTimeout: .milliseconds(800))
        defer { rig.stop() }
        let started = Date()
        let r = try TestClient.get(port: rig.bearerd.port, path: "/x")
        let body = Self.json(r)
        #expect(r.status == 504, "\(r.bodyText)")
        #expect(body["error"] == "upstream_timeout", "\(r.bodyText)")
        #expect(body["detail"]?.contains("the outbound proxy http://127.0.0.1:\(proxy.port)'s answer to CONNECT localhost:\(rig.origin.port) timed out") == true,
                "\(r.bodyText)")
        #expect(Date().timeIntervalSince(started) < 5, "bounded by timeouts.connect")
        #expect(proxy.connects == ["localhost:\(rig.origin.port)"], "\(proxy.connects)")
    }

    /// Not the proxy's answer: nothing listens where it should be.
    @Test func proxyRefusingTheConnectionIs502Unreachable() throws {
        let port = NginxOrigin.freePort()
        let rig = try Rig(proxyPort: port, credentials: nil)
        defer { rig.stop() }
        let r = try TestClient.get(port: rig.bearerd.port, path: "/x")
        let body = Self.json(r)
        #expect(r.status == 502, "\(r.bodyText)")
        #expect(body["error"] == "upstream_unreachable", "\(r.bodyText)")
        #expect(body["detail"]?.contains("cannot connect to the outbound proxy http://127.0.0.1:\(port): ") == true, "\(r.bodyText)")
        #expect(body["detail"]?.contains("refused") == true, "\(r.bodyText)")
    }

    /// The client resets while the proxy holds its answer to CONNECT: when the 200 comes, bearerd
    /// closes the tunnel unused (no TLS handshake, no request through it), instead of opening a
    /// connection to the upstream for nobody. Observable at the hand-written proxy: the tunnel
    /// ends having carried 0 bytes towards the target.
    @Test(arguments: Peer.allCases)
    func aClientGoneBeforeTheTunnelIsUpOpensNone(peer: Peer) throws {
        let dir = try RunningBearerd.tempDir("proxy-gone")
        let proxy = try Proxy(peer, .delay(1.0), dir: dir)
        defer { proxy.stop() }
        let rig = try Rig(proxyPort: proxy.port, credentials: nil)
        defer { rig.stop() }
        var client: TestClient? = try TestClient(port: rig.bearerd.port, timeout: 5)
        try client?.send("GET /gone HTTP/1.1\r\nHost: x\r\n\r\n")
        // The CONNECT reached the proxy that answers last; the client resets meanwhile.
        #expect(eventually(seconds: 5) { proxy.records.contains { $0["method"] as? String == "CONNECT" } }, "\(proxy.records)")
        if let fd = client?.fd {
            var l = linger(l_onoff: 1, l_linger: 0)
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, socklen_t(MemoryLayout<linger>.size))
        }
        client = nil
        #expect(eventually(seconds: 8) { proxy.records.contains { $0["tunnel"] != nil } }, "the tunnel ended: \(proxy.records)")
        let tunnel = proxy.records.first { $0["tunnel"] != nil }
        #expect(tunnel?["bytes_to_target"] as? Int == 0, "nothing went through the tunnel: \(proxy.records)")
        #expect(rig.origin.requests.isEmpty)
        // The next request is served as usual (its own tunnel, after the proxy's delay).
        let r = try TestClient.get(port: rig.bearerd.port, path: "/after")
        #expect(r.status == 200, "\(r.bodyText)")
    }
}
