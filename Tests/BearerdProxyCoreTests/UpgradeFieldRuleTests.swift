import Testing
import BearerdHTTP
@testable import BearerdProxyCore

/// RFC 9110 §7.8 and docs/architecture.md §5: which requests are upgrade requests at all.
@Suite("Upgrade field without the upgrade connection option")
struct UpgradeFieldRuleTests {
    func head(_ fields: [(String, String)], method: String = "GET", version: HTTPVersion = .http1_1) -> HTTPRequestHead {
        HTTPRequestHead(method: method, target: "/", version: version, headers: HTTPHeaders([("Host", "a")] + fields))
    }

    @Test func upgradeNotNamedInConnectionIsNoUpgradeRequest() {
        #expect(ProxyHeaders.upgradeRequest(head([("Upgrade", "foo/1")])) == .none)
        #expect(ProxyHeaders.upgradeRequest(head([("Upgrade", "websocket")])) == .none)
        #expect(ProxyHeaders.upgradeRequest(head([("Connection", "keep-alive"), ("Upgrade", "foo/1")])) == .none)
        #expect(ProxyHeaders.upgradeRequest(head([("Upgrade", "websocket")], method: "POST")) == .none)
        // A server must ignore Upgrade in an HTTP/1.0 request.
        #expect(ProxyHeaders.upgradeRequest(head([("Connection", "upgrade"), ("Upgrade", "foo/1")], version: .http1_0)) == .none)
    }

    @Test func realUpgradeRequestsKeepTheirDecision() {
        #expect(ProxyHeaders.upgradeRequest(head([("Connection", "upgrade"), ("Upgrade", "websocket")])) == .websocket)
        #expect(ProxyHeaders.upgradeRequest(head([("Connection", "close, Upgrade"), ("Upgrade", "h2c")])) == .ignoredH2C)
        if case .unsupported = ProxyHeaders.upgradeRequest(head([("Connection", "upgrade"), ("Upgrade", "foo/1")])) {} else {
            Issue.record("an upgrade to an unknown protocol must stay refused")
        }
        if case .unsupported = ProxyHeaders.upgradeRequest(head([("Connection", "Upgrade"), ("Upgrade", "websocket")], method: "POST")) {} else {
            Issue.record("a WebSocket upgrade by POST must stay refused")
        }
    }

    /// The forwarded head carries neither `Upgrade` nor the `Connection` option.
    @Test func upstreamHeadDropsTheUpgradeField() {
        let rule = RouteRule(match: "/", upstreamAuthority: "u:1")
        let up = ProxyHeaders.upstreamRequest(client: head([("Upgrade", "foo/1"), ("X-A", "1")]), framing: .none, target: "/",
                                              route: rule, clientAddress: "127.0.0.1", originalHost: "a")
        #expect(up.headers["Upgrade"] == nil)
        #expect(up.headers["X-A"] == "1")
    }
}
