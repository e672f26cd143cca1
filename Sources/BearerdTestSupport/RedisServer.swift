import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A real Redis for the shared token cache's tests: Debian's redis-server on a loopback port
/// (and a unix socket) in a temporary directory, without persistence. CI installs it (`.ci/run`).
///
/// Owns the child process and the directory. `stop()` ends the server (the port is kept, so
/// `start()` brings it back on the same address: "Redis returns"); `cli` runs commands through
/// redis-cli for assertions. Thread-safe: `process` is guarded by `lock`.
public final class RedisServer: @unchecked Sendable {  // @unchecked: `process` guarded by `lock`
    public static let binary = "/usr/bin/redis-server"
    public static var isAvailable: Bool { FileManager.default.isExecutableFile(atPath: binary) }

    public let port: UInt16
    public let directory: String
    public var socketPath: String { directory + "/redis.sock" }
    public let password: String?
    /// With `tls:`: a TLS port too (certificate, key, and the CA that client certificates must
    /// chain to; `requireClientCert` demands one).
    public let tlsPort: UInt16?
    private let tls: (cert: String, key: String, ca: String, requireClientCert: Bool)?
    private let lock = NSLock()
    private var process: Process?

    public init(password: String? = nil, tls: (cert: String, key: String, ca: String, requireClientCert: Bool)? = nil) throws {
        directory = NSTemporaryDirectory() + "bearerd-redis-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        port = NginxOrigin.freePort()
        self.password = password
        self.tls = tls
        tlsPort = tls == nil ? nil : NginxOrigin.freePort()
        try start()
    }

    deinit {
        stop()
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// Whether something accepts TCP connections on 127.0.0.1:`port` now.
    public static func accepts(_ port: UInt16) -> Bool { NginxOrigin.accepts(port) }

    /// `redis://127.0.0.1:PORT/0`
    public var url: String { "redis://127.0.0.1:\(port)/0" }

    public func start() throws {
        var args = ["--port", "\(port)", "--bind", "127.0.0.1", "--unixsocket", socketPath, "--unixsocketperm", "700",
                    "--save", "", "--appendonly", "no", "--dir", directory, "--daemonize", "no", "--loglevel", "warning", "--enable-debug-command", "local"]
        if let password { args += ["--requirepass", password] }
        if let tls, let tlsPort {
            args += ["--tls-port", "\(tlsPort)", "--tls-cert-file", tls.cert, "--tls-key-file", tls.key,
                     "--tls-ca-cert-file", tls.ca, "--tls-auth-clients", tls.requireClientCert ? "yes" : "no"]
        }
        let p = Process()
        p.executableURL = URL(fileURLWithPath: Self.binary)
        p.arguments = args
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try p.run()
        lock.withLock { process = p }
        let deadline = Date().addingTimeInterval(10)
        while !NginxOrigin.accepts(port) {
            if Date() > deadline || !p.isRunning {
                stop()
                throw NginxOrigin.Failure(description: "redis-server did not start on port \(port)")
            }
            usleep(10_000)
        }
    }

    /// Kills the server (SIGKILL: as abrupt as a crash) and waits for it to exit.
    public func stop() {
        guard let p = lock.withLock({ () -> Process? in defer { process = nil }; return process }) else { return }
        if p.isRunning {
            kill(p.processIdentifier, SIGKILL)
            p.waitUntilExit()
        }
    }

    /// Runs one command through redis-cli; its stdout, trimmed.
    @discardableResult
    public func cli(_ args: [String]) throws -> String {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/redis-cli")
        var a = ["-h", "127.0.0.1", "-p", "\(port)"]
        if let password { a += ["--no-auth-warning", "-a", password] }
        p.arguments = a + args
        let out = Pipe()
        p.standardOutput = out
        p.standardError = FileHandle.nullDevice
        try p.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
    }

    /// `GET key` of a binary value (a sealed record), as lowercase hex (a Lua script encodes it:
    /// redis-cli's output is text); empty when the key is missing.
    public func getHex(_ key: String) throws -> String {
        try cli(["EVAL", "local v = redis.call('get', KEYS[1]); if not v then return '' end; "
                 + "return (string.gsub(v, '.', function(c) return string.format('%02x', string.byte(c)) end))", "1", key])
    }

    /// `SET key` to the bytes of `hex` (as `getHex` gave them), without a TTL: what anyone who
    /// can write to Redis can do.
    public func setHex(_ key: String, _ hex: String) throws {
        let reply = try cli(["EVAL", "return redis.call('set', KEYS[1], (string.gsub(ARGV[1], '..', "
                             + "function(h) return string.char(tonumber(h, 16)) end)))", "1", key, hex])
        guard reply == "OK" else { throw NginxOrigin.Failure(description: "SET \(key) answered \(reply)") }
    }
}
