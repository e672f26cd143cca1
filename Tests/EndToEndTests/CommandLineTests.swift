import Foundation
import Testing
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

/// The `bearerd` executable itself: `check`, `--version`, `run` with a config file, SIGTERM.
@Suite("Command line", .serialized)
struct CommandLineTests {
    /// The binary built next to the test bundle (EndToEndTests depends on the executable target).
    static var binary: String {
        let dir = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        var candidates = [dir.appendingPathComponent("bearerd").path]
        // The test bundle may sit one level deeper (…/bearerdPackageTests.xctest/…).
        candidates.append(dir.deletingLastPathComponent().appendingPathComponent("bearerd").path)
        return candidates.first { FileManager.default.isExecutableFile(atPath: $0) } ?? candidates[0]
    }

    struct Output {
        var status: Int32
        var stdout: String
        var stderr: String
    }

    static func run(_ args: [String], env: [String: String] = [:]) throws -> Output {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: binary)
        p.arguments = args
        var e = ProcessInfo.processInfo.environment
        for (k, v) in env { e[k] = v }
        p.environment = e
        let out = Pipe(), err = Pipe()
        p.standardOutput = out
        p.standardError = err
        try p.run()
        let o = out.fileHandleForReading.readDataToEndOfFile()
        let r = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return Output(status: p.terminationStatus, stdout: String(decoding: o, as: UTF8.self), stderr: String(decoding: r, as: UTF8.self))
    }

    static func tempFile(_ name: String, _ contents: String) throws -> String {
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("bearerd-cli-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: dir, withIntermediateDirectories: true)
        let path = dir.appendingPathComponent(name).path
        try contents.write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    @Test func versionAndHelp() throws {
        let v = try Self.run(["--version"])
        #expect(v.status == 0)
        #expect(v.stdout.trimmingCharacters(in: .whitespacesAndNewlines).split(separator: ".").count == 3)
        for sub in ["run", "check", "token", "demo"] {
            let h = try Self.run([sub, "--help"])
            #expect(h.status == 0, "\(sub) --help")
            #expect(h.stdout.contains("USAGE: bearerd \(sub)"))
        }
    }

    @Test func checkReportsFileLineAndKey() throws {
        let path = try Self.tempFile("bearerd.yaml", """
        listen: [127.0.0.1:8080]
        routes:
          - match: /
            upstream: ftp://example.com
            strip_prefx: true
        """)
        let r = try Self.run(["check", "-c", path])
        #expect(r.status != 0)
        #expect(r.stderr.contains("\(path):4: routes[0].upstream:"))
        #expect(r.stderr.contains("\(path):5: routes[0].strip_prefx: unknown key (did you mean 'strip_prefix'?)"))
    }

    /// docs/architecture.md §2.7: durations and sizes that used to pass `check` and wrap at run time.
    @Test func checkRefusesDurationsAndSizesAboveTheirMaximum() throws {
        let path = try Self.tempFile("bearerd.yaml", """
        listen: [127.0.0.1:8080]
        shutdown_grace: 3000000h
        timeouts:
          header_read: 307445734m
        routes:
          - match: /
            upstream: http://127.0.0.1:9000
            timeouts: { connect: 307445734m, response: 3000000h }
            replay_body_limit: 99999999999999999999GiB
        """)
        let r = try Self.run(["check", "-c", path])
        #expect(r.status != 0)
        #expect(r.stderr.contains("\(path):2: shutdown_grace: must be at most 24h, got \"3000000h\""))
        #expect(r.stderr.contains("\(path):4: timeouts.header_read: must be at most 24h, got \"307445734m\""))
        #expect(r.stderr.contains("\(path):8: routes[0].timeouts.connect: must be at most 24h, got \"307445734m\""))
        #expect(r.stderr.contains("\(path):8: routes[0].timeouts.response: must be at most 24h, got \"3000000h\""))
        #expect(r.stderr.contains("\(path):9: routes[0].replay_body_limit: must be at most 1GiB, got \"99999999999999999999GiB\""))
    }

    @Test func checkFailsOnAMissingSecretFile() throws {
        let path = try Self.tempFile("bearerd.yaml", """
        sessions:
          partner:
            grant: client_credentials
            token_url: https://auth.example.com/token
            client_id: svc
            client_secret_file: /nonexistent/secret
        routes:
          - match: /
            upstream: https://api.example.com
            session: partner
        """)
        let r = try Self.run(["check", "-c", path])
        #expect(r.status != 0)
        #expect(r.stderr.contains("\(path):6: sessions.partner.client_secret_file:"))
        #expect(r.stderr.contains("/nonexistent/secret"))
    }

    @Test func checkAcceptsAValidFile() throws {
        let path = try Self.tempFile("bearerd.yaml", """
        listen: [127.0.0.1:18999]
        routes:
          - match: /
            upstream: http://127.0.0.1:9
        """)
        let r = try Self.run(["check", "-c", path])
        #expect(r.status == 0, "\(r.stderr)")
        #expect(r.stdout.contains("OK"))
    }

    @Test func runServesAndStopsGracefullyOnSIGTERM() throws {
        let origin = try TestOrigin { _ in .response(status: 200, headers: [], body: Array("from origin".utf8)) }
        defer { origin.stop() }
        // Pick a free port for bearerd.
        let probe = try TestOrigin { _ in .close }
        let port = probe.port
        probe.stop()
        let path = try Self.tempFile("bearerd.yaml", """
        listen: [127.0.0.1:\(port)]
        loops: 1
        routes:
          - match: /
            upstream: http://127.0.0.1:\(origin.port)
        """)
        let p = Process()
        p.executableURL = URL(fileURLWithPath: Self.binary)
        p.arguments = ["run", "-c", path]
        let err = Pipe()
        p.standardError = err
        try p.run()
        defer { if p.isRunning { p.terminate() } }
        var response: TestClient.Response?
        for _ in 0..<50 {
            if let r = try? TestClient.get(port: port, path: "/x") { response = r; break }
            Thread.sleep(forTimeInterval: 0.1)
        }
        #expect(response?.bodyText == "from origin")
        kill(p.processIdentifier, SIGTERM)
        p.waitUntilExit()
        #expect(p.terminationStatus == 0)
        let logs = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(logs.contains("request"))
        #expect(logs.contains("path=/x"))
        #expect(logs.contains("stopped"))
    }

    @Test func sighupReloadsAndABadConfigKeepsTheRunningOne() throws {
        let a = try TestOrigin { _ in .response(status: 200, headers: [], body: Array("a".utf8)) }
        let b = try TestOrigin { _ in .response(status: 200, headers: [], body: Array("b".utf8)) }
        defer { a.stop(); b.stop() }
        let probe = try TestOrigin { _ in .close }
        let port = probe.port
        probe.stop()
        func yaml(_ upstream: UInt16) -> String {
            "listen: [127.0.0.1:\(port)]\nloops: 1\nroutes:\n  - match: /\n    upstream: http://127.0.0.1:\(upstream)\n"
        }
        let path = try Self.tempFile("bearerd.yaml", yaml(a.port))
        let p = Process()
        p.executableURL = URL(fileURLWithPath: Self.binary)
        p.arguments = ["run", "-c", path]
        let err = Pipe()
        p.standardError = err
        try p.run()
        defer { if p.isRunning { p.terminate() } }
        var first: String?
        for _ in 0..<50 {
            if let r = try? TestClient.get(port: port, path: "/") { first = r.bodyText; break }
            Thread.sleep(forTimeInterval: 0.1)
        }
        #expect(first == "a")
        // A broken file: reported, the running configuration stays.
        try "routes: [oops".write(toFile: path, atomically: true, encoding: .utf8)
        kill(p.processIdentifier, SIGHUP)
        Thread.sleep(forTimeInterval: 0.5)
        #expect(try TestClient.get(port: port, path: "/").bodyText == "a")
        // A good file: the new route is used.
        try yaml(b.port).write(toFile: path, atomically: true, encoding: .utf8)
        kill(p.processIdentifier, SIGHUP)
        var switched = false
        for _ in 0..<30 {
            if (try? TestClient.get(port: port, path: "/"))?.bodyText == "b" { switched = true; break }
            Thread.sleep(forTimeInterval: 0.1)
        }
        #expect(switched)
        kill(p.processIdentifier, SIGTERM)
        p.waitUntilExit()
        let logs = String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        #expect(logs.contains("reload failed; keeping the running configuration"))
        #expect(logs.contains("configuration reloaded"))
    }
}
