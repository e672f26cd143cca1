import Foundation
import Logging
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport
import BearerdTLS
import BearerdConfig
import BearerdSessions
import BearerdService

/// bearerd running in-process on 127.0.0.1 with an ephemeral port.
final class TestProxy {
    let server: BearerdServer
    let logs = CapturedLogs()
    var port: UInt16 { server.boundAddresses[0].port }

    init(routes: [RouteConfig], sessions: [SessionConfig] = [], loops: Int = 1,
         limits: HTTP1Limits = HTTP1Limits(), timeouts: FrontendTimeouts = FrontendTimeouts(), admin: Bool = false,
         allowedHosts: [String] = ["*"], allowedOrigins: [String] = [], tls: ListenerTLS? = nil,
         outboundProxy: OutboundProxy = .direct, tracing: TracingConfig? = nil) throws {
        var config = BearerdConfig(file: "<test>", listen: [.tcp(host: "127.0.0.1", port: 0)],
                                   admin: admin ? .tcp(host: "127.0.0.1", port: 0) : nil, loops: loops,
                                   limits: limits, frontendTimeouts: timeouts, sessions: sessions, routes: routes)
        // Tests send `Host: x`: any Host unless a test checks the allowlist (`allowedHosts: []`).
        config.listeners = [ListenerConfig(address: .tcp(host: "127.0.0.1", port: 0), allowedHosts: allowedHosts, allowedOrigins: allowedOrigins)]
        config.listeners[0].tls = tls
        config.outboundProxy = outboundProxy
        config.tracing = tracing
        let logs = self.logs
        let logger = logs.logger
        server = try BearerdServer(config: config, logger: logger)
        try server.start()
    }

    func stop() {
        let done = DispatchSemaphore(value: 0)
        server.shutdown(grace: .seconds(1)) { done.signal() }
        done.wait()
    }
}

func route(_ match: String = "/", origin: UInt16, scheme: String = "http", host: String = "127.0.0.1", basePath: String = "",
           strip: Bool = false, tls: TLSSettings? = nil, timeouts: RouteTimeouts = RouteTimeouts(), matchHost: String? = nil) -> RouteConfig {
    RouteConfig(match: match, host: matchHost, stripPrefix: strip,
                upstream: UpstreamURL(scheme: scheme, host: host, port: origin, basePath: basePath), tls: tls, timeouts: timeouts)
}

/// A client_credentials session named `name` whose token endpoint is `tokens`.
func scriptedSession(_ tokens: ScriptedTokenEndpoint, name: String = "s") -> SessionConfig {
    SessionConfig(name: name, grant: .clientCredentials,
                  tokenURL: EndpointURL(scheme: "http", host: "127.0.0.1", port: tokens.port, path: "/token"),
                  clientID: "c", clientSecret: .literal(Secret("x")))
}

/// `route` with `session` set.
func withSession(_ route: RouteConfig, _ session: String = "s") -> RouteConfig {
    var r = route
    r.session = session
    return r
}

@Sendable func echoHandler(_ r: TestOrigin.Request) -> TestOrigin.Reply {
    var lines = "method=\(r.head.method)\ntarget=\(r.head.target)\nbody=\(r.bodyCount)\n"
    for f in r.head.headers { lines += "\(f.name.lowercased()): \(f.value)\n" }
    return .response(status: 200, headers: [("Content-Type", "text/plain")], body: Array(lines.utf8))
}
