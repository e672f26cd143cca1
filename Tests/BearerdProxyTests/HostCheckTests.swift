import BearerdIO
import BearerdTestSupport
import Testing
@testable import BearerdProxy
@testable import BearerdProxyCore
@testable import BearerdConfig

/// The Host check of loopback listeners (docs/architecture.md §4 `listen:`) remembers, per loop and
/// listener, the last Host it admitted, so a new connection's first request skips the check.
/// What one connection had admitted must never let another's foreign Host in, on the same
/// listener, on another listener, or after a reload took the name away.
@Suite struct HostCheckTests {
    private static let up = UpstreamURL(scheme: "http", host: "127.0.0.1", port: 9, basePath: "")

    private func runtime(listeners: [ListenerConfig], routeHost: String?) throws -> ProxyRuntime {
        var config = BearerdConfig(file: "t", listen: [], routes: [RouteConfig(match: "/", host: routeHost, upstream: Self.up)])
        config.listeners = listeners
        return try ProxyRuntime(config: config, logger: CapturedLogs().logger)
    }

    private func admitted(_ ctx: LoopContext, _ target: String, _ host: String?, _ policy: ListenerPolicy) -> Bool {
        if case .admitted = ctx.checkHost(target: target, hostField: host, policy: policy) { return true }
        return false
    }

    @Test func anAdmittedHostNeverLetsAForeignOneIn() throws {
        let plain = ListenerConfig(address: .tcp(host: "127.0.0.1", port: 18001))
        let extra = ListenerConfig(address: .tcp(host: "127.0.0.1", port: 18002), allowedHosts: ["a.test"])
        let ctx = LoopContext(loop: EventLoop(index: 951, readBufferSize: 4096),
                              runtime: try runtime(listeners: [plain, extra], routeHost: "api.test"))
        let p = ListenerPolicy(plain)
        let q = ListenerPolicy(extra)
        #expect(p.checksHost && q.checksHost)

        #expect(admitted(ctx, "/x", "localhost:18001", p))
        #expect(admitted(ctx, "/x", "localhost:18001", p))  // the remembered answer
        // Another connection of the same loop and listener.
        #expect(!admitted(ctx, "/x", "evil.example", p))
        #expect(admitted(ctx, "/x", "localhost:18001", p))
        // An absolute-form target's authority counts, whatever Host says (RFC 9112 §3.2.2).
        #expect(!admitted(ctx, "http://evil.example/x", "localhost:18001", p))
        if case .refused(let authority) = ctx.checkHost(target: "/x", hostField: "evil.example:80", policy: p) {
            #expect(authority == "evil.example:80")
        } else {
            Issue.record("evil.example admitted")
        }
        // A route's host and a listener's own allowed_hosts.
        #expect(admitted(ctx, "/x", "api.test", p))
        #expect(admitted(ctx, "/x", "a.test", q))
        #expect(!admitted(ctx, "/x", "a.test", p))  // q's name is not p's
        #expect(admitted(ctx, "/x", "a.test", q))
    }

    @Test func aReloadForgetsWhatTheOldConfigurationAdmitted() throws {
        let plain = ListenerConfig(address: .tcp(host: "127.0.0.1", port: 18003))
        let ctx = LoopContext(loop: EventLoop(index: 952, readBufferSize: 4096),
                              runtime: try runtime(listeners: [plain], routeHost: "api.test"))
        let p = ListenerPolicy(plain)
        #expect(admitted(ctx, "/x", "api.test", p))
        ctx.runtime = try runtime(listeners: [plain], routeHost: "other.test")
        #expect(!admitted(ctx, "/x", "api.test", p))  // the route naming it is gone
        #expect(admitted(ctx, "/x", "other.test", p))
    }
}
