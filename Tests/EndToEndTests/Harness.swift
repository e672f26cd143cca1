import Foundation
import Logging
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport

/// Collects log lines in memory so tests can assert on them (and scan them for secrets).
final class CapturedLogs: @unchecked Sendable {  // @unchecked: guarded by `lock`
    private let lock = NSLock()
    private var _lines: [String] = []
    func append(_ s: String) { lock.withLock { _lines.append(s) } }
    var lines: [String] { lock.withLock { _lines } }
    var text: String { lines.joined(separator: "\n") }
}

struct CapturingLogHandler: LogHandler {
    let sink: CapturedLogs
    var logLevel: Logger.Level = .trace
    var metadata: Logger.Metadata = [:]
    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }
    func log(level: Logger.Level, message: Logger.Message, metadata explicit: Logger.Metadata?, source: String, file: String, function: String, line: UInt) {
        var all = metadata
        if let explicit { all.merge(explicit) { $1 } }
        sink.append("\(level) \(message) " + all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " "))
    }
}

/// bearerd running in-process on 127.0.0.1 with an ephemeral port.
final class TestProxy {
    let server: BearerdServer
    let logs = CapturedLogs()
    var port: UInt16 { server.boundAddresses[0].port }

    init(routes: [RouteConfig], sessions: [SessionConfig] = [], loops: Int = 1,
         limits: HTTP1Limits = HTTP1Limits(), timeouts: FrontendTimeouts = FrontendTimeouts(), admin: Bool = false) throws {
        let config = BearerdConfig(file: "<test>", listen: [.tcp(host: "127.0.0.1", port: 0)],
                                   admin: admin ? .tcp(host: "127.0.0.1", port: 0) : nil, loops: loops,
                                   limits: limits, frontendTimeouts: timeouts, sessions: sessions, routes: routes)
        let logs = self.logs
        let logger = Logger(label: "test") { _ in CapturingLogHandler(sink: logs) }
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

@Sendable func echoHandler(_ r: TestOrigin.Request) -> TestOrigin.Reply {
    var lines = "method=\(r.head.method)\ntarget=\(r.head.target)\nbody=\(r.bodyCount)\n"
    for f in r.head.headers { lines += "\(f.name.lowercased()): \(f.value)\n" }
    return .response(status: 200, headers: [("Content-Type", "text/plain")], body: Array(lines.utf8))
}
