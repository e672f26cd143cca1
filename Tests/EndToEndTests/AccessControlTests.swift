import Foundation
import Logging
import Testing
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

/// Access control of listeners (docs/architecture.md §4 `listen:`) over real sockets: the Host allowlist of
/// loopback listeners (421), unix socket file mode and owner, and SO_PEERCRED (403) checked by
/// running the client as another user with `setpriv` (the tests run as root here and in CI).
@Suite("Access control", .serialized)
struct AccessControlTests {
    // MARK: Host allowlist

    @Test func hostAllowlistAdmitsLocalNamesRouteHostsAndAllowedHosts() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route("/p/", origin: origin.port, matchHost: "partner.example"), route(origin: origin.port)],
                                  allowedHosts: ["api.internal"])
        defer { proxy.stop() }
        let port = proxy.port
        let c = try TestClient(port: port)
        for host in ["localhost:\(port)", "127.0.0.1:\(port)", "LocalHost", "app.localhost:\(port)", "[::1]:\(port)",
                     "partner.example", "Partner.Example:\(port)", "api.internal", "api.internal:\(port)"] {
            try c.send("GET /p/x HTTP/1.1\r\nHost: \(host)\r\n\r\n")
            let r = try c.readResponse()
            #expect(r.status == 200, "Host: \(host)")
        }
        #expect(origin.requests.count == 9)
        // Absolute-form with an allowed authority passes too (and keeps the connection).
        try c.send("GET http://localhost:\(port)/y HTTP/1.1\r\nHost: localhost\r\n\r\n")
        #expect(try c.readResponse().status == 200)
        #expect(origin.requests.count == 10)
    }

    @Test func foreignHostGets421AndNothingIsForwarded() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)], allowedHosts: [])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /x HTTP/1.1\r\nHost: evil.example:\(proxy.port)\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 421)
        #expect(r.head.reason == "Misdirected Request")
        #expect(r["Content-Type"] == "application/json")
        #expect(r["Connection"] == "close")
        #expect(r.bodyText.hasPrefix("{\"error\":\"host_not_allowed\",\"host\":\"evil.example\",\"detail\":\""))
        #expect(r.bodyText.contains("allowed_hosts"))
        #expect(c.isClosedByPeer())
        #expect(origin.requests.isEmpty)
        #expect(proxy.logs.text.contains("host refused"))
        #expect(proxy.logs.text.contains("evil.example"))

        // RFC 9112 §3.2.2: an absolute-form target is judged by its authority, not by Host.
        let c2 = try TestClient(port: proxy.port)
        try c2.send("GET http://evil.example/x HTTP/1.1\r\nHost: localhost\r\n\r\n")
        let r2 = try c2.readResponse()
        #expect(r2.status == 421)
        #expect(r2.bodyText.contains("\"host\":\"evil.example\""))
        #expect(origin.requests.isEmpty)

        // An HTTP/1.0 request without Host (a legacy client; browsers always send Host) is served.
        let c3 = try TestClient(port: proxy.port)
        try c3.send("GET /legacy HTTP/1.0\r\n\r\n")
        #expect(try c3.readResponse().status == 200)
        #expect(origin.requests.map(\.head.target) == ["/legacy"])

        // Counted in the request metrics like other local errors.
        let counted = DispatchSemaphore(value: 0)
        let box = MetricsCapture()
        proxy.server.collectMetrics { m in box.requests = m.routes.reduce(into: [:]) { acc, r in for (s, n) in r.statuses { acc[s, default: 0] += n } }; counted.signal() }
        #expect(counted.wait(timeout: .now() + 5) == .success)
        #expect(box.requests[421] == 2)
    }

    @Test func reloadedRouteHostsAreAllowed() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)], allowedHosts: [])
        defer { proxy.stop() }
        #expect(try TestClient.get(port: proxy.port, path: "/", headers: [("Host", "new.example")]).status == 421)
        var next = proxy.server.runtime.config
        next.routes = [route("/n/", origin: origin.port, matchHost: "new.example"), route(origin: origin.port)]
        try proxy.server.reload(next)
        var status = 0
        for _ in 0..<30 {
            status = try TestClient.get(port: proxy.port, path: "/", headers: [("Host", "new.example")]).status
            if status == 200 { break }
            Thread.sleep(forTimeInterval: 0.05)
        }
        #expect(status == 200)
    }

    // MARK: unix sockets

    @Test func unixSocketFileGetsModeOwnerAndGroup() throws {
        let dir = try Self.tempDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/api.sock"
        let listener = ListenerConfig(address: .unix(path: path), mode: 0o640, owner: 65534, group: 65534)
        let server = try Self.server(listener, origin: nil)
        var st = stat()
        #expect(lstat(path, &st) == 0)
        #expect(st.st_mode & S_IFMT == S_IFSOCK)
        #expect(st.st_mode & 0o7777 == 0o640)
        #expect(st.st_uid == 65534)
        #expect(st.st_gid == 65534)
        Self.stop(server)
        #expect(lstat(path, &st) != 0)  // removed on stop

        // Default mode 0660, owner unchanged.
        let server2 = try Self.server(ListenerConfig(address: .unix(path: path)), origin: nil)
        defer { Self.stop(server2) }
        #expect(lstat(path, &st) == 0)
        #expect(st.st_mode & 0o7777 == 0o660)
        #expect(st.st_uid == getuid())
    }

    @Test func unixBindErrorsNameThePath() throws {
        let dir = try Self.tempDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let missing = dir + "/no-such-dir/api.sock"
        let e1 = Self.startError(ListenerConfig(address: .unix(path: missing)))
        #expect(e1?.contains("unix:\(missing)") == true)
        #expect(e1?.contains("the directory \(dir)/no-such-dir does not exist") == true)

        let plain = dir + "/plain"
        try "x".write(toFile: plain, atomically: false, encoding: .utf8)
        let e2 = Self.startError(ListenerConfig(address: .unix(path: plain)))
        #expect(e2?.contains("\(plain) exists and is not a socket") == true)
        #expect(FileManager.default.fileExists(atPath: plain))

        // A live socket is not stolen; a stale one (nobody accepting) is replaced.
        let live = dir + "/live.sock"
        let first = try Self.server(ListenerConfig(address: .unix(path: live)), origin: nil)
        let e3 = Self.startError(ListenerConfig(address: .unix(path: live)))
        #expect(e3?.contains("another process is listening on \(live)") == true)
        Self.stop(first)
        let stale = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        #expect(Self.withUnixAddress(live) { bind(stale, $0, $1) } == 0)
        close(stale)
        let second = try Self.server(ListenerConfig(address: .unix(path: live)), origin: nil)
        Self.stop(second)
    }

    @Test(.enabled(if: Prerequisite.runs(Prerequisite.isRoot && AccessControlTests.tools), "needs root, /usr/bin/setpriv and /usr/bin/python3"))
    func peerNotInAllowUIDsGets403() throws {
        try Prerequisite.require(Prerequisite.isRoot && AccessControlTests.tools, "root, /usr/bin/setpriv and /usr/bin/python3 (a client run as uid 65534)")
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let dir = try Self.tempDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/api.sock"
        // 0666 in a 0755 directory: the file mode lets uid 65534 connect, so SO_PEERCRED refuses it.
        let logs = CapturedLogs()
        let server = try Self.server(ListenerConfig(address: .unix(path: path), mode: 0o666, allowUIDs: [0]), origin: origin, logs: logs)
        defer { Self.stop(server) }
        let out = try Self.requestAsNobody(path)
        #expect(out.hasPrefix("HTTP/1.1 403 Forbidden\r\n"), "\(out)")
        #expect(out.contains("Content-Type: application/json\r\n"))
        #expect(out.contains("Connection: close\r\n"))
        #expect(out.contains("{\"error\":\"peer_not_allowed\",\"detail\":\"uid 65534 gid 65534 is not in allow_uids/allow_gids of unix:\(path)\"}"))
        #expect(origin.requests.isEmpty)
        #expect(logs.text.contains("peer refused"))
        #expect(logs.text.contains("peer.uid=65534"))
        #expect(logs.text.contains("peer.gid=65534"))
        #expect(logs.text.contains("peer.pid="))
        // Root is in allow_uids: served.
        let ok = try Self.unixRequest(path)
        #expect(ok.hasPrefix("HTTP/1.1 200"), "\(ok)")
        #expect(origin.requests.count == 1)
    }

    @Test(.enabled(if: Prerequisite.runs(Prerequisite.isRoot && AccessControlTests.tools), "needs root, /usr/bin/setpriv and /usr/bin/python3"))
    func peerInAllowUIDsIsServedAndOthersAreNot() throws {
        try Prerequisite.require(Prerequisite.isRoot && AccessControlTests.tools, "root, /usr/bin/setpriv and /usr/bin/python3 (a client run as uid 65534)")
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let dir = try Self.tempDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/api.sock"
        let server = try Self.server(ListenerConfig(address: .unix(path: path), mode: 0o666, allowUIDs: [65534]), origin: origin)
        defer { Self.stop(server) }
        let out = try Self.requestAsNobody(path)
        #expect(out.hasPrefix("HTTP/1.1 200"), "\(out)")
        #expect(out.contains("x-forwarded-for: unix"))
        #expect(origin.requests.count == 1)
        // Root (uid 0, gid 0) is in neither list: refused, although root may open any file.
        let refused = try Self.unixRequest(path)
        #expect(refused.hasPrefix("HTTP/1.1 403"))
        #expect(refused.contains("uid 0 gid 0 is not in allow_uids/allow_gids"))
        #expect(origin.requests.count == 1)
    }

    @Test func allowGIDsAdmitsByPrimaryGroup() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let dir = try Self.tempDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/api.sock"
        let server = try Self.server(ListenerConfig(address: .unix(path: path), allowUIDs: [], allowGIDs: [getgid()]), origin: origin)
        defer { Self.stop(server) }
        #expect(try Self.unixRequest(path).hasPrefix("HTTP/1.1 200"))
        #expect(origin.requests.count == 1)
    }

    @Test(.enabled(if: Prerequisite.runs(Prerequisite.isRoot && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv")), "needs root and /usr/bin/setpriv"))
    func unprivilegedStartErrorsNameThePath() throws {
        try Prerequisite.require(Prerequisite.isRoot && FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv"), "root and /usr/bin/setpriv (bearerd run as uid 65534)")
        // `bearerd run` as uid 65534: first in a directory it may not write, then in its own
        // directory but asked to give the socket to root.
        let dir = try Self.tempDirectory()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let binary = dir + "/bearerd"
        try FileManager.default.copyItem(atPath: CommandLineTests.binary, toPath: binary)
        let socketDir = dir + "/run"
        try FileManager.default.createDirectory(atPath: socketDir, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o755])
        let path = socketDir + "/api.sock"
        let config = dir + "/bearerd.yaml"
        try """
        listen:
          - address: unix:\(path)
            owner: 0
        loops: 1
        routes:
          - match: /
            upstream: http://127.0.0.1:9
        """.write(toFile: config, atomically: false, encoding: .utf8)
        #expect(chmod(config, 0o644) == 0)

        let denied = try Self.runAsNobody([binary, "run", "-c", config])
        #expect(denied.status != 0)
        #expect(denied.stderr.contains("bind unix:\(path): Permission denied (uid 65534 may not create files in \(socketDir))"), "\(denied.stderr)")

        #expect(chown(socketDir, 65534, 65534) == 0)
        let chownRefused = try Self.runAsNobody([binary, "run", "-c", config])
        #expect(chownRefused.status != 0)
        #expect(chownRefused.stderr.contains("chown unix:\(path) to owner uid 0: Operation not permitted"), "\(chownRefused.stderr)")
        #expect(chownRefused.stderr.contains("only root (CAP_CHOWN) may give a file away"))
        #expect(!FileManager.default.fileExists(atPath: path))  // not left behind
    }

    // MARK: helpers

    /// Runs `command` as uid 65534 gid 65534 (no supplementary groups); killed after 10 s.
    static func runAsNobody(_ command: [String]) throws -> (status: Int32, stderr: String) {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        p.arguments = ["--reuid=65534", "--regid=65534", "--clear-groups"] + command
        p.environment = ["PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"]
        p.currentDirectoryURL = URL(fileURLWithPath: "/")
        let err = Pipe()
        p.standardOutput = FileHandle.nullDevice
        p.standardError = err
        try p.run()
        let killer = DispatchWorkItem { if p.isRunning { p.terminate() } }
        DispatchQueue.global().asyncAfter(deadline: .now() + 10, execute: killer)
        let text = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        killer.cancel()
        return (p.terminationStatus, text)
    }

    static let tools = FileManager.default.isExecutableFile(atPath: "/usr/bin/setpriv") && FileManager.default.isExecutableFile(atPath: "/usr/bin/python3")

    /// A fresh 0755 directory under /tmp (reachable by uid 65534).
    static func tempDirectory() throws -> String {
        let dir = "/tmp/bearerd-ac-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o755])
        return dir
    }

    static func server(_ listener: ListenerConfig, origin: TestOrigin?, logs: CapturedLogs = CapturedLogs()) throws -> BearerdServer {
        var config = BearerdConfig(file: "<test>", listen: [], loops: 1, routes: origin.map { [route(origin: $0.port)] } ?? [])
        config.listeners = [listener]
        let server = try BearerdServer(config: config, logger: logs.logger)
        try server.start()
        return server
    }

    static func stop(_ server: BearerdServer) {
        let d = DispatchSemaphore(value: 0)
        server.shutdown(grace: .seconds(1)) { d.signal() }
        d.wait()
    }

    /// The description of the error `start()` throws, or nil when it starts.
    static func startError(_ listener: ListenerConfig) -> String? {
        var config = BearerdConfig(file: "<test>", listen: [], loops: 1)
        config.listeners = [listener]
        guard let server = try? BearerdServer(config: config, logger: CapturedLogs().logger) else { return "config refused" }
        do {
            try server.start()
        } catch {
            return error.description
        }
        stop(server)
        return nil
    }

    static func withUnixAddress<R>(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> R) -> R {
        SocketAddress.unix(path)!.withSockAddr(body)  // test paths are short
    }

    /// One `Connection: close` request over the unix socket from this process (root); the raw answer.
    static func unixRequest(_ path: String) throws -> String {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var tv = timeval(tv_sec: 5, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        guard withUnixAddress(path, { connect(fd, $0, $1) }) == 0 else { throw IOError("connect \(path)", errno) }
        let req = Array("GET /u HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".utf8)
        _ = req.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        var buf = [UInt8](repeating: 0, count: 65536)
        var got: [UInt8] = []
        while true {
            let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            got += buf[0..<n]
        }
        return String(decoding: got, as: UTF8.self)
    }

    /// The same request made by `python3` running as uid 65534 gid 65534 without supplementary
    /// groups (`setpriv`); its stdout is the raw answer.
    static func requestAsNobody(_ path: String) throws -> String {
        let script = """
        import socket, sys
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(sys.argv[1])
        s.sendall(b"GET /u HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n")
        out = b""
        while True:
            d = s.recv(65536)
            if not d:
                break
            out += d
        sys.stdout.buffer.write(out)
        """
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/setpriv")
        p.arguments = ["--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-I", "-c", script, path]
        p.environment = ["PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"]
        p.currentDirectoryURL = URL(fileURLWithPath: "/")
        let out = Pipe(), err = Pipe()
        p.standardOutput = out
        p.standardError = err
        try p.run()
        let data = out.fileHandleForReading.readDataToEndOfFile()
        let errText = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        p.waitUntilExit()
        guard p.terminationStatus == 0 else {
            throw ClientFailed(description: "client as uid 65534 failed (\(p.terminationStatus)): \(errText)")
        }
        return String(decoding: data, as: UTF8.self)
    }
}

/// Carries the metrics snapshot out of `collectMetrics`' completion.
final class MetricsCapture: @unchecked Sendable {  // @unchecked: written once before the semaphore is signalled, read after
    var requests: [Int: UInt64] = [:]
}

struct ClientFailed: Error, CustomStringConvertible {
    var description: String
}
