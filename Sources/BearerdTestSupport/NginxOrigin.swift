import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A real HTTP/2 upstream for end-to-end tests: Debian's nginx, started as a child process with a
/// generated configuration in a temporary directory (CI installs it, `.ci/run`).
///
/// Listeners: `tlsPort` (HTTPS, ALPN h2 and http/1.1, certificate from a `TestPKI`), `h2cPort`
/// (prior-knowledge h2c) and `h1Port` (HTTP/1.1). Every location answers with one text line that
/// tells what nginx saw: `proto=$server_protocol conn=$connection auth=$http_authorization
/// uri=$request_uri`, so a test learns the protocol, which TCP connection carried the request
/// (nginx's connection serial number) and the injected token. `/reject/…` answers 401 with
/// `WWW-Authenticate: Bearer error="invalid_token"` when the Authorization equals `rejectToken`.
///
/// For HTTP/1.1 framing against a parser that is not bearerd's (`NginxHTTP1OriginTests`):
/// `/put/…` stores a PUT body as a file under `documentRoot` (nginx's DAV module: 201 Created,
/// 204 No Content when it replaces one) and serves it back as a static file (ETag, so
/// `If-None-Match` gets a 304; `/gz/put/…` the same gzip-compressed, which nginx sends chunked);
/// `/post` reads a POST body (any framing) and proxies it on with a Content-Length to `/_posted`,
/// which answers `posted length=<n> auth=<Authorization>`; `/nocontent` answers 204.
/// `/close/…` closes the connection after its answer, which tells whether the TLS session was
/// resumed (`reused=r`, nginx's `$ssl_session_reused`).
///
/// Owns the child and the directory; `stop()` (or deinit) ends both. Thread-safe: `stopped` is
/// guarded by `lock`.
public final class NginxOrigin: @unchecked Sendable {  // @unchecked: `stopped` guarded by `lock`
    public static let binary = "/usr/sbin/nginx"
    public static var isAvailable: Bool { FileManager.default.isExecutableFile(atPath: binary) }

    public let tlsPort: UInt16
    public let h2cPort: UInt16
    public let h1Port: UInt16
    /// Where `/put/…` bodies land (`documentRoot + "/put/NAME"`).
    public var documentRoot: String { directory + "/www" }
    private let process: Process
    private let directory: String
    private let lock = NSLock()
    private var stopped = false

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
        public init(description: String) { self.description = description }
    }

    /// A port that was free a moment ago (bind to 0, read it, close).
    public static func freePort() -> UInt16 {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) } }
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
        return UInt16(bigEndian: addr.sin_port)
    }

    public init(pki: TestPKI, rejectToken: String = "Bearer at-1", maxConcurrentStreams: Int = 128) throws {
        directory = NSTemporaryDirectory() + "bearerd-nginx-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: directory + "/tmp", withIntermediateDirectories: true)
        try FileManager.default.createDirectory(atPath: directory + "/www/put", withIntermediateDirectories: true)
        chmod(directory, 0o755)
        chmod(directory + "/tmp", 0o777)
        chmod(directory + "/www", 0o755)
        chmod(directory + "/www/put", 0o777)
        tlsPort = Self.freePort()
        h2cPort = Self.freePort()
        h1Port = Self.freePort()
        let user = getuid() == 0 ? "user nobody nogroup;" : ""
        let answer = #"return 200 "proto=$server_protocol conn=$connection auth=$http_authorization uri=$request_uri\n";"#
        let conf = """
        \(user)
        pid \(directory)/nginx.pid;
        error_log \(directory)/error.log warn;
        worker_processes 1;
        events { worker_connections 1024; }
        http {
            access_log off;
            client_body_temp_path \(directory)/tmp/body;
            proxy_temp_path \(directory)/tmp/proxy;
            fastcgi_temp_path \(directory)/tmp/fastcgi;
            uwsgi_temp_path \(directory)/tmp/uwsgi;
            scgi_temp_path \(directory)/tmp/scgi;
            http2_max_concurrent_streams \(maxConcurrentStreams);
            default_type text/plain;
            server {
                listen 127.0.0.1:\(tlsPort) ssl http2;
                listen 127.0.0.1:\(h2cPort) http2;
                listen 127.0.0.1:\(h1Port);
                ssl_certificate \(pki.serverCertFile);
                ssl_certificate_key \(pki.serverKeyFile);
                location /reject/ {
                    if ($http_authorization = "\(rejectToken)") {
                        add_header WWW-Authenticate 'Bearer error="invalid_token"' always;
                        return 401 "rejected\\n";
                    }
                    \(answer)
                }
                location /put/ {
                    root \(directory)/www;
                    dav_methods PUT;
                    client_max_body_size 64m;
                }
                location /gz/put/ {
                    alias \(directory)/www/put/;
                    gzip on;
                    gzip_types application/octet-stream text/plain;
                    gzip_min_length 0;
                    gzip_proxied any;
                }
                location = /post {
                    client_max_body_size 64m;
                    proxy_pass http://127.0.0.1:\(h1Port)/_posted;
                }
                location = /_posted { return 200 "posted length=$http_content_length auth=$http_authorization\n"; }
                location = /nocontent { return 204; }
                location /close/ {
                    keepalive_timeout 0;
                    return 200 "proto=$server_protocol conn=$connection reused=$ssl_session_reused uri=$request_uri\n";
                }
                location / { \(answer) }
            }
        }
        """
        try conf.write(toFile: directory + "/nginx.conf", atomically: true, encoding: .utf8)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: Self.binary)
        p.arguments = ["-p", directory, "-e", directory + "/error.log", "-c", directory + "/nginx.conf", "-g", "daemon off;"]
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        try p.run()
        process = p
        // Ready when every port accepts.
        let deadline = Date().addingTimeInterval(10)
        for port in [tlsPort, h2cPort, h1Port] {
            while !Self.accepts(port) {
                if Date() > deadline || !p.isRunning {
                    let log = (try? String(contentsOfFile: directory + "/error.log", encoding: .utf8)) ?? ""
                    stop()
                    throw Failure(description: "nginx did not start: \(log)")
                }
                usleep(20_000)
            }
        }
    }

    deinit { stop() }

    static func accepts(_ port: UInt16) -> Bool {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = port.bigEndian
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        return withUnsafePointer(to: &addr) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) }
        } == 0
    }

    public func stop() {
        let wasStopped = lock.withLock { () -> Bool in
            defer { stopped = true }
            return stopped
        }
        if wasStopped { return }
        if process.isRunning {
            kill(process.processIdentifier, SIGQUIT)
            let deadline = Date().addingTimeInterval(5)
            while process.isRunning && Date() < deadline { usleep(20_000) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        }
        try? FileManager.default.removeItem(atPath: directory)
    }
}
