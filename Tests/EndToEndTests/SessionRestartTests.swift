import Foundation
import Testing
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

/// A refresh_token session whose server rotates refresh tokens with no grace window: every
/// rotated token must be persisted before use, or a restart after kill -9 loses the session
/// (the server would answer `invalid_grant`). Runs the real `bearerd` binary.
@Suite("Refresh-token rotation across kill -9", .serialized, .enabled(if: Prerequisite.runs(AuthServerFixture.isAvailable), "\(AuthServerFixture.unavailableReason ?? "")"))
struct SessionRestartTests {
    @Test func rotationSurvivesKill9AndBearerdTokenSharesTheState() throws {
        let auth = try AuthServerFixture.start(tokenLifetime: 3600, rotateRefreshTokens: true, graceSeconds: 0)
        defer { auth.stop() }
        let seed = try auth.issueRefreshToken(clientID: "cli", user: "alice")
        let dir = FileManager.default.temporaryDirectory.appendingPathComponent("bearerd-rot-\(UUID().uuidString)").path
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        let seedFile = dir + "/me.refresh"
        try (seed + "\n").write(toFile: seedFile, atomically: true, encoding: .utf8)
        let probe = try TestOrigin { _ in .close }
        let port = probe.port
        probe.stop()
        let config = dir + "/bearerd.yaml"
        try """
        listen: [127.0.0.1:\(port)]
        loops: 1
        state_dir: \(dir)/state
        sessions:
          me:
            grant: refresh_token
            token_url: http://127.0.0.1:\(auth.port)/oauth/token
            client_id: cli
            client_auth: none
            refresh_token_file: \(seedFile)
        routes:
          - match: /
            upstream: http://127.0.0.1:\(auth.port)/api
            session: me
        """.write(toFile: config, atomically: true, encoding: .utf8)

        var logs = ""
        for round in 0..<3 {
            let p = Process()
            p.executableURL = URL(fileURLWithPath: CommandLineTests.binary)
            p.arguments = ["run", "-c", config]
            let err = Pipe()
            p.standardError = err
            try p.run()
            var ok = false
            for _ in 0..<100 {
                if let r = try? TestClient.get(port: port, path: "/round/\(round)"), r.status == 200 { ok = true; break }
                Thread.sleep(forTimeInterval: 0.1)
            }
            #expect(ok, "round \(round): no 200 through bearerd")
            if round < 2 {
                // Invalidate every access token: the next run must refresh with the newest refresh token.
                try auth.revokeAll()
            }
            kill(p.processIdentifier, SIGKILL)
            p.waitUntilExit()
            logs += String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        }
        let stats = try auth.stats()
        let errors = stats["token_errors"] as? [String: Any] ?? [:]
        #expect(errors["invalid_grant"] == nil, "a rotated refresh token was lost: \(stats)")
        #expect(((stats["by_grant"] as? [String: Any])?["refresh_token"] as? Int ?? 0) >= 3)

        // Files: directory 0700, state file 0600, no token in the logs.
        var st = stat()
        #expect(stat(dir + "/state", &st) == 0 && (st.st_mode & 0o777) == 0o700)
        let files = try FileManager.default.contentsOfDirectory(atPath: dir + "/state").filter { $0.hasSuffix(".json") }
        #expect(!files.isEmpty)
        for f in files {
            #expect(stat(dir + "/state/" + f, &st) == 0 && (st.st_mode & 0o777) == 0o600)
        }
        #expect(!logs.contains(seed))

        // `bearerd token` prints a working access token and nothing else.
        let out = try CommandLineTests.run(["token", "-c", config, "me"])
        #expect(out.status == 0, "\(out.stderr)")
        let token = out.stdout.trimmingCharacters(in: .newlines)
        #expect(!token.isEmpty && !token.contains("\n") && !token.contains(" "))
        let api = try auth.request("GET", "/api/direct", headers: [("Authorization", "Bearer \(token)")])
        #expect(api.status == 200)
        let unknown = try CommandLineTests.run(["token", "-c", config, "nope"])
        #expect(unknown.status != 0)
        #expect(unknown.stderr.contains("me"))
    }
}
