import Foundation
import Testing
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

/// The real `bearerd run` process with a config file: stderr goes to a file (a pipe could fill
/// up and block bearerd), signals are sent with kill(2).
final class RunningBearerd {
    let process = Process()
    let logPath: String
    let configPath: String

    /// `wrapper`: a command that runs bearerd (e.g. `setpriv --reuid=65534 …`), its last argument the binary.
    init(config: String, dir: String, env: [String: String] = [:], args: [String] = [], wrapper: [String] = []) throws {
        configPath = dir + "/bearerd.yaml"
        try config.write(toFile: configPath, atomically: true, encoding: .utf8)
        logPath = dir + "/stderr.log"
        FileManager.default.createFile(atPath: logPath, contents: nil)
        process.executableURL = URL(fileURLWithPath: wrapper.first ?? CommandLineTests.binary)
        process.arguments = Array(wrapper.dropFirst()) + (wrapper.isEmpty ? [] : [CommandLineTests.binary]) + ["run", "-c", configPath] + args
        var e = ProcessInfo.processInfo.environment
        for (k, v) in env { e[k] = v }
        process.environment = e
        process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: logPath))
        process.standardOutput = FileHandle.nullDevice
        try process.run()
    }

    var logs: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    func rewrite(_ config: String) throws {
        try config.write(toFile: configPath, atomically: true, encoding: .utf8)
    }

    func signal(_ sig: Int32) { kill(process.processIdentifier, sig) }

    /// Waits until a GET through `port` answers (any status), up to `seconds`.
    @discardableResult
    func waitServing(port: UInt16, path: String = "/", seconds: Double = 10) -> TestClient.Response? {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if let r = try? TestClient.get(port: port, path: path) { return r }
            Thread.sleep(forTimeInterval: 0.05)
        }
        return nil
    }

    /// Waits for the log to contain `text`.
    func waitLog(_ text: String, seconds: Double = 10) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if logs.contains(text) { return true }
            Thread.sleep(forTimeInterval: 0.05)
        }
        return false
    }

    /// SIGTERM (if still running) and the exit status, waiting at most `seconds`.
    func stop(seconds: Double = 15) -> Int32? {
        if process.isRunning { signal(SIGTERM) }
        let deadline = Date().addingTimeInterval(seconds)
        while process.isRunning && Date() < deadline { Thread.sleep(forTimeInterval: 0.05) }
        if process.isRunning { kill(process.processIdentifier, SIGKILL); process.waitUntilExit(); return nil }
        return process.terminationStatus
    }

    static func tempDir(_ tag: String) throws -> String {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("bearerd-\(tag)-\(UUID().uuidString.prefix(8))").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return dir
    }

    static func freePort() throws -> UInt16 {
        let probe = try TestOrigin { _ in .close }
        let port = probe.port
        probe.stop()
        return port
    }
}

/// Operations with the real binary (docs/architecture.md §3, §5): SIGHUP (changed secret file, sessions kept),
/// SIGTERM while slow requests are in flight, JSON logs with credentials redacted at trace level.
@Suite("Operations: signals and logs", .serialized, .enabled(if: Prerequisite.runs(AuthServerFixture.isAvailable), "\(AuthServerFixture.unavailableReason ?? "")"))
struct OperationsTests {
    /// The origin echoes the Authorization it received, so the test learns the injected token.
    static func echoAuthorization(_ r: TestOrigin.Request) -> TestOrigin.Reply {
        .response(status: 200, headers: [("Content-Type", "text/plain"), ("Set-Cookie", "sid=origin-cookie-SECRET; HttpOnly")],
                  body: Array((r.head.headers["Authorization"] ?? "none").utf8))
    }

    @Test func jsonTraceLogsNeverHoldCredentials() throws {
        let auth = try AuthServerFixture.start(tokenLifetime: 3600)
        defer { auth.stop() }
        let origin = try TestOrigin(handler: Self.echoAuthorization)
        defer { origin.stop() }
        let dir = try RunningBearerd.tempDir("jsonlog")
        try "svc-secret\n".write(toFile: dir + "/secret", atomically: true, encoding: .utf8)
        let port = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: """
            listen: [127.0.0.1:\(port)]
            loops: 1
            log: { format: json, level: trace }
            sessions:
              partner:
                grant: client_credentials
                token_url: http://127.0.0.1:\(auth.port)/oauth/token
                client_id: svc
                client_secret_file: \(dir)/secret
            routes:
              - match: /
                upstream: http://127.0.0.1:\(origin.port)
                session: partner
            """, dir: dir)
        defer { _ = b.stop() }
        let first = try #require(b.waitServing(port: port, path: "/x?access_token=client-query-SECRET&page=2"))
        #expect(first.status == 200)
        let r = try TestClient.get(port: port, path: "/y", headers: [
            ("Authorization", "Basic Y2xpZW50LWF1dGgtU0VDUkVU"), ("Cookie", "sid=client-cookie-SECRET")])
        #expect(r.status == 200)
        let injected = r.bodyText
        #expect(injected.hasPrefix("Bearer "))
        let token = String(injected.dropFirst(7))
        #expect(token.count >= 8)
        #expect(b.stop() == 0)

        let text = b.logs
        let lines = text.split(separator: "\n")
        #expect(lines.count >= 6)
        var sawAccess = false, sawUpstreamTrace = false
        for line in lines {
            // Every line is one JSON object with the stable keys.
            let object = try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any]
            let o = try #require(object, "not a JSON object: \(line)")
            #expect(o["ts"] is String && o["level"] is String && o["msg"] is String)
            if o["msg"] as? String == "request" {
                sawAccess = true
                for key in ["method", "path", "route", "status", "upstream_ms", "total_ms", "bytes"] {
                    #expect(o[key] != nil, "access line without \(key): \(line)")
                }
            }
            if o["msg"] as? String == "upstream request" { sawUpstreamTrace = true }
        }
        #expect(sawAccess && sawUpstreamTrace)
        for secret in [token, "svc-secret", "client-query-SECRET", "Y2xpZW50LWF1dGgtU0VDUkVU", "client-cookie-SECRET", "origin-cookie-SECRET"] {
            #expect(!text.contains(secret), "\(secret.prefix(12))… appears in the log")
        }
        #expect(text.contains("<fp "))
    }

    @Test func sighupRereadsARotatedSecretFileAndKeepsUnchangedSessions() throws {
        let auth = try AuthServerFixture.start(tokenLifetime: 3600)
        defer { auth.stop() }
        let origin = try TestOrigin(handler: Self.echoAuthorization)
        defer { origin.stop() }
        let dir = try RunningBearerd.tempDir("rotate")
        // `partner` starts with a wrong secret; `steady` is right from the start.
        try "wrong-secret\n".write(toFile: dir + "/partner", atomically: true, encoding: .utf8)
        try "post-secret\n".write(toFile: dir + "/steady", atomically: true, encoding: .utf8)
        let port = try RunningBearerd.freePort()
        let yaml = """
            listen: [127.0.0.1:\(port)]
            loops: 1
            sessions:
              partner:
                grant: client_credentials
                token_url: http://127.0.0.1:\(auth.port)/oauth/token
                client_id: svc
                client_secret_file: \(dir)/partner
              steady:
                grant: client_credentials
                token_url: http://127.0.0.1:\(auth.port)/oauth/token
                client_id: svc-post
                client_auth: client_secret_post
                client_secret_file: \(dir)/steady
            routes:
              - match: /steady/
                upstream: http://127.0.0.1:\(origin.port)
                session: steady
              - match: /
                upstream: http://127.0.0.1:\(origin.port)
                session: partner
            """
        let b = try RunningBearerd(config: yaml, dir: dir)
        defer { _ = b.stop() }
        let refused = try #require(b.waitServing(port: port))
        #expect(refused.status == 503)
        #expect(refused.bodyText.contains("\"error\":\"token_unavailable\""))
        #expect(refused.bodyText.contains("invalid_client"))
        let steadyBefore = try TestClient.get(port: port, path: "/steady/a").bodyText
        #expect(steadyBefore.hasPrefix("Bearer "))

        // The operator rotates the secret file and sends SIGHUP.
        try "svc-secret\n".write(toFile: dir + "/partner", atomically: true, encoding: .utf8)
        b.signal(SIGHUP)
        #expect(b.waitLog("configuration reloaded"))
        var fixed: TestClient.Response?
        for _ in 0..<100 {
            if let r = try? TestClient.get(port: port, path: "/p"), r.status == 200 { fixed = r; break }
            Thread.sleep(forTimeInterval: 0.05)
        }
        #expect(fixed?.bodyText.hasPrefix("Bearer ") == true)
        // The unchanged session kept its token through the reload.
        #expect(try TestClient.get(port: port, path: "/steady/b").bodyText == steadyBefore)
        #expect(b.stop() == 0)
        #expect(b.logs.contains("invalid_client"))
    }

    @Test func sighupMovesTheListenerWithoutDroppingOpenConnections() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let dir = try RunningBearerd.tempDir("relisten")
        let first = try RunningBearerd.freePort(), second = try RunningBearerd.freePort()
        func yaml(_ ports: [UInt16]) -> String {
            "listen: [\(ports.map { "127.0.0.1:\($0)" }.joined(separator: ", "))]\nloops: 1\nroutes:\n  - match: /\n    upstream: http://127.0.0.1:\(origin.port)\n"
        }
        let b = try RunningBearerd(config: yaml([first]), dir: dir)
        defer { _ = b.stop() }
        #expect(b.waitServing(port: first)?.status == 200)
        let open = try TestClient(port: first)
        try open.send("GET /a HTTP/1.1\r\nHost: localhost\r\n\r\n")
        #expect(try open.readResponse().status == 200)

        try b.rewrite(yaml([second]))
        b.signal(SIGHUP)
        #expect(b.waitLog("listener removed"))
        #expect(b.waitServing(port: second)?.status == 200)
        #expect((try? TestClient.get(port: first, path: "/gone")) == nil)
        // The connection accepted on the removed listener still works.
        try open.send("GET /b HTTP/1.1\r\nHost: localhost\r\n\r\n")
        let r = try open.readResponse()
        #expect(r.status == 200 && r.bodyText.contains("target=/b"))
        #expect(b.stop() == 0)
    }

    @Test func sigtermLetsSlowRequestsInFlightFinish() throws {
        let origin = try TestOrigin { r in .delayed(1.0, .response(status: 200, headers: [], body: Array("slow \(r.head.target)".utf8))) }
        defer { origin.stop() }
        let dir = try RunningBearerd.tempDir("drain")
        let port = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: """
            listen: [127.0.0.1:\(port)]
            loops: 2
            shutdown_grace: 8s
            routes:
              - match: /
                upstream: http://127.0.0.1:\(origin.port)
            """, dir: dir)
        defer { _ = b.stop() }
        #expect(b.waitServing(port: port, path: "/warmup") != nil)
        // Five slow requests in flight on separate connections, then SIGTERM.
        var clients: [TestClient] = []
        for i in 0..<5 {
            let c = try TestClient(port: port)
            try c.send("GET /slow/\(i) HTTP/1.1\r\nHost: localhost\r\n\r\n")
            clients.append(c)
        }
        Thread.sleep(forTimeInterval: 0.3)
        let sent = Date()
        b.signal(SIGTERM)
        Thread.sleep(forTimeInterval: 0.2)
        // Accepting stopped at once.
        #expect((try? TestClient.get(port: port, path: "/late")) == nil)
        for (i, c) in clients.enumerated() {
            let r = try c.readResponse()
            #expect(r.status == 200)
            #expect(r.bodyText == "slow /slow/\(i)")
            #expect(r["Connection"] == "close")
        }
        #expect(b.stop() == 0)
        #expect(Date().timeIntervalSince(sent) < 6)
        #expect(b.logs.contains("stopped"))
    }

    @Test func sigtermGraceIsBounded() throws {
        let origin = try TestOrigin { _ in .delayed(30, .response(status: 200, headers: [], body: [])) }
        defer { origin.stop() }
        let dir = try RunningBearerd.tempDir("grace")
        let port = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: """
            listen: [127.0.0.1:\(port)]
            loops: 1
            shutdown_grace: 1s
            routes:
              - match: /
                upstream: http://127.0.0.1:\(origin.port)
            """, dir: dir)
        defer { _ = b.stop() }
        #expect(b.waitLog("bearerd started"))
        let c = try TestClient(port: port)
        try c.send("GET /forever HTTP/1.1\r\nHost: localhost\r\n\r\n")
        Thread.sleep(forTimeInterval: 0.3)
        let sent = Date()
        let status = b.stop(seconds: 10)
        #expect(status == 0)
        let took = Date().timeIntervalSince(sent)
        #expect(took >= 0.9 && took < 5, "took \(took) s")
    }
}
