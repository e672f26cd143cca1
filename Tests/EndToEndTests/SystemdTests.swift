import Foundation
import Testing
import BearerdIO
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

/// The real `bearerd run` under systemd's protocols: launched by `systemd-socket-activate`
/// (Debian's systemd package) with inherited listening sockets, and with $NOTIFY_SOCKET pointed
/// at a test datagram socket (READY=1, STATUS=, RELOADING=1, WATCHDOG=1, STOPPING=1).
@Suite("systemd", .serialized)
struct SystemdTests {
    static let socketActivate = "/usr/bin/systemd-socket-activate"
    static var haveSocketActivate: Bool {
        FileManager.default.isExecutableFile(atPath: socketActivate) || ProcessInfo.processInfo.environment["CI"] != nil
    }

    static func freePort() throws -> UInt16 {
        let probe = try TestOrigin { _ in .close }
        defer { probe.stop() }
        return probe.port
    }

    /// A running process with its stderr collected in the background.
    final class Running {
        let process = Process()
        private let err = Pipe()
        private let lock = NSLock()
        private var collected = Data()
        private let done = DispatchSemaphore(value: 0)

        init(_ executable: String, _ args: [String], env: [String: String]) throws {
            process.executableURL = URL(fileURLWithPath: executable)
            process.arguments = args
            var e = ProcessInfo.processInfo.environment
            for k in ["NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES"] { e[k] = nil }
            for (k, v) in env { e[k] = v }
            process.environment = e
            process.standardError = err
            process.standardOutput = FileHandle.nullDevice
            try process.run()
            let handle = err.fileHandleForReading
            Thread.detachNewThread { [self] in
                let data = handle.readDataToEndOfFile()
                lock.withLock { collected = data }
                done.signal()
            }
        }

        var pid: Int32 { process.processIdentifier }

        func signal(_ sig: Int32) { kill(process.processIdentifier, sig) }

        /// Waits for exit (at most 20 s, then SIGKILL: a test never hangs on a stuck process);
        /// returns the status and everything written to stderr.
        func finish() -> (Int32, String) {
            let deadline = Date().addingTimeInterval(20)
            while process.isRunning && Date() < deadline { Thread.sleep(forTimeInterval: 0.02) }
            if process.isRunning {
                Issue.record("process \(pid) did not exit within 20 s; killed")
                kill(pid, SIGKILL)
            }
            process.waitUntilExit()
            _ = done.wait(timeout: .now() + 5)
            return (process.terminationStatus, lock.withLock { String(decoding: collected, as: UTF8.self) })
        }

        deinit { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
    }

    /// A GET that retries while nothing listens yet (systemd-socket-activate binds after it starts).
    static func getOnceListening(port: UInt16, path: String) throws -> TestClient.Response {
        for _ in 0..<50 {
            if let c = try? TestClient(port: port) {
                try c.send("GET \(path) HTTP/1.1\r\nHost: localhost\r\n\r\n")
                return try c.readResponse()
            }
            Thread.sleep(forTimeInterval: 0.1)
        }
        return try TestClient.get(port: port, path: path)
    }

    static func config(_ text: String) throws -> String {
        try CommandLineTests.tempFile("bearerd.yaml", text)
    }

    // MARK: Socket activation

    @Test(.enabled(if: haveSocketActivate))
    func servesThroughSocketsInheritedFromSystemdSocketActivate() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let (api, admin, own) = (try Self.freePort(), try Self.freePort(), try Self.freePort())
        let stray = try Self.freePort()
        let path = try Self.config("""
        listen:
          - {address: 127.0.0.1:\(api), name: api}
          - 127.0.0.1:\(own)
        admin: 127.0.0.1:\(admin)
        loops: 2
        routes:
          - match: /
            upstream: http://127.0.0.1:\(origin.port)
        """)
        let notify = try NotifyReceiver()
        // Three sockets: `api` (by name), `admin` (by name), and one nothing in the config wants.
        let p = try Running(Self.socketActivate, [
            "-l", "127.0.0.1:\(api)", "-l", "127.0.0.1:\(admin)", "-l", "127.0.0.1:\(stray)",
            "--fdname=api:admin:extra", "-E", "NOTIFY_SOCKET=\(notify.address)",
            CommandLineTests.binary, "run", "-c", path,
        ], env: [:])
        // systemd-socket-activate holds the sockets and execs bearerd on the first connection:
        // this request waits in the backlog and is answered by bearerd through the inherited fd.
        let first = try Self.getOnceListening(port: api, path: "/activated")
        #expect(first.status == 200)
        #expect(first.bodyText.contains("target=/activated"))
        // READY=1 once started (no sessions: nothing to wait for).
        let ready = notify.receive(until: { $0.hasPrefix("READY=1") })
        #expect(ready.last?.contains("STATUS=Serving: listening on 127.0.0.1:\(api), 127.0.0.1:\(own), admin 127.0.0.1:\(admin)") == true, "\(ready)")
        // The admin listener through its inherited fd, the unmatched listener bound by bearerd.
        #expect(try TestClient.get(port: admin, path: "/healthz").status == 200)
        #expect(try TestClient.get(port: own, path: "/own").bodyText.contains("target=/own"))
        // The stray socket was closed: nobody accepts on it any more.
        var refusedOrClosed = false
        if let c = try? TestClient(port: stray) {
            try? c.send("GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            refusedOrClosed = c.isClosedByPeer(within: 2)
        } else {
            refusedOrClosed = true
        }
        #expect(refusedOrClosed)

        p.signal(SIGTERM)
        let stopping = notify.receive(until: { $0.hasPrefix("STOPPING=1") })
        #expect(stopping.last?.hasPrefix("STOPPING=1") == true)
        let (status, logs) = p.finish()
        #expect(status == 0)
        #expect(logs.contains("using a socket-activated listener fd=3 listen=127.0.0.1:\(api)"))
        #expect(logs.contains("using a socket-activated listener fd=4 listen=127.0.0.1:\(admin)"))
        #expect(logs.contains("closing an inherited socket that matches no configured listener socket=\"fd 5 'extra' (127.0.0.1:\(stray))\""))
    }

    @Test(.enabled(if: haveSocketActivate))
    func matchesAnUnnamedInheritedSocketByAddress() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let port = try Self.freePort()
        let path = try Self.config("""
        listen: ["[::1]:\(port)", 127.0.0.1:\(port)]
        loops: 1
        routes:
          - match: /
            upstream: http://127.0.0.1:\(origin.port)
        """)
        // Only the IPv4 socket is inherited; [::1] is bound by bearerd itself.
        let p = try Running(Self.socketActivate, ["-l", "127.0.0.1:\(port)", CommandLineTests.binary, "run", "-c", path], env: [:])
        #expect(try Self.getOnceListening(port: port, path: "/by-address").status == 200)
        p.signal(SIGTERM)
        let (status, logs) = p.finish()
        #expect(status == 0)
        #expect(logs.contains("using a socket-activated listener fd=3 listen=127.0.0.1:\(port)"))
        #expect(!logs.contains("closing an inherited socket"))
    }

    // MARK: Notifications

    /// A token endpoint that answers after `delay` seconds and records when it answered.
    final class SlowTokenEndpoint: @unchecked Sendable {  // @unchecked: `servedAt` guarded by `lock`
        let origin: TestOrigin
        private let lock = NSLock()
        private var _servedAt: [UInt64] = []
        var servedAt: [UInt64] { lock.withLock { _servedAt } }

        init(delay: Double) throws {
            let box = Box()
            origin = try TestOrigin { _ in
                Thread.sleep(forTimeInterval: delay)
                box.record?()
                let body = #"{"access_token":"at-systemd-1","token_type":"Bearer","expires_in":3600}"#
                return .response(status: 200, headers: [("Content-Type", "application/json")], body: Array(body.utf8))
            }
            box.record = { [weak self] in
                guard let self else { return }
                let now = monotonicNanos()
                self.lock.withLock { self._servedAt.append(now) }
            }
        }

        final class Box: @unchecked Sendable {  // @unchecked: set once before the first request
            var record: (() -> Void)?
        }
    }

    static func sessionConfig(listen: UInt16, tokenPort: UInt16, origin: UInt16, extra: String = "") -> String {
        """
        listen: [127.0.0.1:\(listen)]
        loops: 2
        \(extra)
        sessions:
          partner:
            grant: client_credentials
            token_url: http://127.0.0.1:\(tokenPort)/token
            client_id: svc
            client_secret: not-a-real-secret
        routes:
          - match: /
            upstream: http://127.0.0.1:\(origin)
            session: partner
        """
    }

    @Test func readyOnlyAfterTheFirstTokenThenWatchdogReloadAndStopping() throws {
        let token = try SlowTokenEndpoint(delay: 0.8)
        defer { token.origin.stop() }
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let port = try Self.freePort()
        let path = try Self.config(Self.sessionConfig(listen: port, tokenPort: token.origin.port, origin: origin.port))
        let notify = try NotifyReceiver()
        let p = try Running(CommandLineTests.binary, ["run", "-c", path],
                            env: ["NOTIFY_SOCKET": notify.address, "WATCHDOG_USEC": "200000"])

        let untilReady = notify.receive(until: { $0.hasPrefix("READY=1") }, timeout: .seconds(10))
        let readyAt = monotonicNanos()
        let served = try #require(token.servedAt.first, "the token endpoint was called")
        #expect(untilReady.last?.hasPrefix("READY=1") == true, "\(untilReady)")
        #expect(readyAt > served, "READY=1 only after the token endpoint served the first token")
        #expect(untilReady.contains { $0.hasPrefix("STATUS=Starting: listening on 127.0.0.1:\(port); waiting for the first token of: partner") })
        #expect(untilReady.last == "READY=1\nSTATUS=Serving: listening on 127.0.0.1:\(port); the session holds a token")
        // Watchdog pings while waiting (bearerd does not let systemd kill it for a slow token endpoint).
        #expect(untilReady.filter { $0 == "WATCHDOG=1" }.count >= 3, "\(untilReady)")

        // Keeps pinging every ~100 ms while serving.
        let later = notify.receive(until: { _ in false }, timeout: .milliseconds(600))
        #expect(later.filter { $0 == "WATCHDOG=1" }.count >= 3, "\(later)")
        #expect(try TestClient.get(port: port, path: "/x").bodyText.contains("authorization: Bearer at-systemd-1"))

        // SIGHUP: RELOADING=1 … READY=1.
        p.signal(SIGHUP)
        let reload = notify.receive(until: { $0.hasPrefix("READY=1") })
        #expect(reload.contains { $0.hasPrefix("RELOADING=1\nMONOTONIC_USEC=") })
        #expect(reload.last?.hasPrefix("READY=1\nSTATUS=Serving:") == true)
        // A broken file: READY=1 (still serving) with the error in STATUS=.
        try "routes: [oops".write(toFile: path, atomically: true, encoding: .utf8)
        p.signal(SIGHUP)
        let failed = notify.receive(until: { $0.hasPrefix("READY=1") })
        #expect(failed.last?.hasPrefix("READY=1\nSTATUS=Reload failed, still running the previous configuration: \(path):") == true, "\(failed)")

        p.signal(SIGTERM)
        let stopping = notify.receive(until: { $0.hasPrefix("STOPPING=1") })
        #expect(stopping.last?.hasPrefix("STOPPING=1\nSTATUS=Stopping") == true)
        let (status, logs) = p.finish()
        #expect(status == 0)
        #expect(logs.contains("systemd watchdog enabled"))
        #expect(!logs.contains("at-systemd-1"), "no token in the logs")
    }

    @Test func startupTimeoutReportsReadyNamingTheSessionWithoutAToken() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let port = try Self.freePort()
        let deadTokenPort = try Self.freePort()  // nothing listens there
        let path = try Self.config(Self.sessionConfig(listen: port, tokenPort: deadTokenPort, origin: origin.port,
                                                      extra: "startup_timeout: 1500ms"))
        let notify = try NotifyReceiver()
        let started = monotonicNanos()
        let p = try Running(CommandLineTests.binary, ["run", "-c", path], env: ["NOTIFY_SOCKET": notify.address])
        let messages = notify.receive(until: { $0.hasPrefix("READY=1") }, timeout: .seconds(10))
        let elapsed = Double(monotonicNanos() - started) / 1e9
        let ready = try #require(messages.last)
        #expect(ready.hasPrefix("READY=1\nSTATUS=Serving: listening on 127.0.0.1:\(port); startup timeout; no token for: partner (token.transport"), "\(ready)")
        #expect(!ready.contains("not-a-real-secret"))
        #expect(elapsed >= 1.5 && elapsed < 8, "READY=1 after startup_timeout, not before (\(elapsed) s)")
        // The proxy serves meanwhile: the session's routes answer 503 token_unavailable.
        let r = try TestClient.get(port: port, path: "/x")
        #expect(r.status == 503)
        p.signal(SIGTERM)
        let (status, _) = p.finish()
        #expect(status == 0)
    }

    @Test func startFailureIsReportedInStatus() throws {
        let busy = try TestOrigin { _ in .close }
        defer { busy.stop() }
        let path = try Self.config("listen: [127.0.0.1:\(busy.port)]\nroutes:\n  - match: /\n    upstream: http://127.0.0.1:9\n")
        let notify = try NotifyReceiver()
        let p = try Running(CommandLineTests.binary, ["run", "-c", path], env: ["NOTIFY_SOCKET": notify.address])
        let (status, _) = p.finish()
        #expect(status != 0)
        let m = notify.receive(timeout: .seconds(2))
        #expect(m?.hasPrefix("STATUS=Failed to start: bind 127.0.0.1:\(busy.port)") == true, "\(String(describing: m))")
    }
}
