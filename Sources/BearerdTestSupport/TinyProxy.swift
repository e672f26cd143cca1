import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A real forward proxy for the `outbound_proxy:` end-to-end tests: Debian's tinyproxy, started
/// in the foreground (`tinyproxy -d -c FILE`) as a child process on a free loopback port with a
/// generated configuration in a temporary directory (CI installs it, `.ci/run`), as `NginxOrigin`
/// starts nginx.
///
/// Configurable to produce each answer bearerd must classify: `basicAuth` makes a CONNECT without
/// (or with other) credentials get tinyproxy's `407 Proxy Authentication Required`; `connectPorts`
/// limits CONNECT to those ports (any other gets `403 Access violation`); `upstream` chains every
/// request to another proxy (a silent one makes tinyproxy silent too).
///
/// Owns the child and the directory; `stop()` (or deinit) ends both. Thread-safe: `stopped` is
/// guarded by `lock`.
public final class TinyProxy: @unchecked Sendable {  // @unchecked: `stopped` guarded by `lock`
    public static let binary = "/usr/bin/tinyproxy"
    public static var isAvailable: Bool { FileManager.default.isExecutableFile(atPath: binary) }

    public let port: UInt16
    private let process: Process
    private let directory: String
    private let lock = NSLock()
    private var stopped = false

    /// `basicAuth`: `(user, password)` the proxy demands. `connectPorts`: the only ports CONNECT
    /// may reach (empty: any). `upstream`: a proxy on 127.0.0.1 every request goes through.
    public init(basicAuth: (user: String, password: String)? = nil, connectPorts: [UInt16] = [], upstream: UInt16? = nil) throws {
        directory = NSTemporaryDirectory() + "bearerd-tinyproxy-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        chmod(directory, 0o777)
        port = NginxOrigin.freePort()
        var conf = """
        Port \(port)
        Listen 127.0.0.1
        Timeout 30
        MaxClients 50
        LogLevel Connect
        LogFile "\(directory)/tinyproxy.log"
        PidFile "\(directory)/tinyproxy.pid"

        """
        if getuid() == 0 { conf += "User nobody\nGroup nogroup\n" }
        if let basicAuth { conf += "BasicAuth \(basicAuth.user) \(basicAuth.password)\n" }
        for p in connectPorts { conf += "ConnectPort \(p)\n" }
        if let upstream { conf += "Upstream http 127.0.0.1:\(upstream)\n" }
        try conf.write(toFile: directory + "/tinyproxy.conf", atomically: true, encoding: .utf8)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: Self.binary)
        p.arguments = ["-d", "-c", directory + "/tinyproxy.conf"]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try p.run()
        process = p
        let deadline = Date().addingTimeInterval(10)
        while !NginxOrigin.accepts(port) {
            if Date() > deadline || !p.isRunning {
                let log = self.log
                stop()
                throw NginxOrigin.Failure(description: "tinyproxy did not start: \(log)")
            }
            usleep(20_000)
        }
    }

    deinit { stop() }

    /// What tinyproxy logged (`LogLevel Connect`: one line per request, e.g. `CONNECT … Request …: CONNECT host:port HTTP/1.1`).
    public var log: String { (try? String(contentsOfFile: directory + "/tinyproxy.log", encoding: .utf8)) ?? "" }

    /// The CONNECT request lines tinyproxy received, as `host:port` targets, in order.
    public var connectTargets: [String] {
        log.split(separator: "\n").compactMap { line in
            guard let r = line.range(of: "): CONNECT ") else { return nil }
            return line[r.upperBound...].split(separator: " ").first.map(String.init)
        }
    }

    public func stop() {
        let wasStopped = lock.withLock { () -> Bool in
            defer { stopped = true }
            return stopped
        }
        if wasStopped { return }
        if process.isRunning {
            kill(process.processIdentifier, SIGTERM)
            let deadline = Date().addingTimeInterval(5)
            while process.isRunning && Date() < deadline { usleep(20_000) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        }
        try? FileManager.default.removeItem(atPath: directory)
    }
}
