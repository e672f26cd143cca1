import Foundation
import Testing
import BearerdTestSupport
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
#if canImport(Glibc)
import Glibc
#endif

/// Signing sessions through the real binary (docs/architecture.md §6.15) against moto's STS
/// (Tests/Fixtures/sts_server.py, which counts the calls): `bearerd token` prints the keys as
/// `credential_process` JSON by default and as `--format json`, reuses them from `state_dir`;
/// `bearerd run` adopts them without a new STS call, also after a restart, and shows the
/// signing metrics; `bearerd check` fetches the keys and says from where without the secret;
/// formats that do not fit a session's kind are errors.
@Suite("Signing sessions end to end", .serialized,
       .enabled(if: Prerequisite.runs(PythonFixture.unavailable(modules: ["moto", "flask_cors"]) == nil),
                "\(PythonFixture.unavailable(modules: ["moto", "flask_cors"]) ?? "")"))
struct SigningCredentialsEndToEndTests {
    static func jwt() -> String {
        func b64(_ s: String) -> String {
            Data(s.utf8).base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
                .replacingOccurrences(of: "=", with: "")
        }
        return b64("{\"alg\":\"RS256\"}") + "." + b64("{\"sub\":\"app\",\"exp\":\(Int(Date().timeIntervalSince1970) + 3600)}") + ".c2ln"
    }

    static func freePort() throws -> UInt16 {
        let probe = try TestOrigin { _ in .close }
        defer { probe.stop() }
        return probe.port
    }

    static func stsCalls(_ sts: PythonFixture) throws -> Int {
        let data = try Data(contentsOf: URL(string: "http://127.0.0.1:\(sts.port)/_calls")!)
        return (try JSONSerialization.jsonObject(with: data) as? [Any])?.count ?? -1
    }

    @Test func tokenRunCheckAndRestartShareTheKeysWithOneSTSCall() throws {
        let sts = try PythonFixture(script: "sts_server.py", arguments: [], readyTimeout: 60)
        defer { sts.stop() }
        let dir = NSTemporaryDirectory() + "bearerd-signing-\(UUID().uuidString)"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let token = Self.jwt()
        try (token + "\n").write(toFile: dir + "/token", atomically: true, encoding: .utf8)
        let port = try Self.freePort(), admin = try Self.freePort()
        let config = try CommandLineTests.tempFile("bearerd.yaml", """
            listen: [127.0.0.1:\(port)]
            admin: 127.0.0.1:\(admin)
            loops: 1
            state_dir: \(dir)/state
            sessions:
              store:
                grant: aws
                region: us-east-1
                sts_url: http://127.0.0.1:\(sts.port)/
                credentials:
                  web_identity: { role_arn: "arn:aws:iam::123456789012:role/app", token_file: \(dir)/token, session_name: bearerd }
            routes:
              - match: /
                upstream: http://127.0.0.1:9
                session: store
                sign: { service: s3 }
            """)

        // Default for a signing session: credential_process JSON (what the AWS CLI reads).
        let first = try CommandLineTests.run(["token", "-c", config, "store"])
        #expect(first.status == 0, "\(first.stderr)")
        let process = try #require(try JSONSerialization.jsonObject(with: Data(first.stdout.utf8)) as? [String: Any])
        #expect(process["Version"] as? Int == 1)
        let keyID = try #require(process["AccessKeyId"] as? String)
        let secret = try #require(process["SecretAccessKey"] as? String)
        #expect(keyID.hasPrefix("ASIA") && process["SessionToken"] is String && process["Expiration"] is String)
        #expect(try Self.stsCalls(sts) == 1)

        // --format json: the same keys, reused from state_dir (no second STS call).
        let json = try CommandLineTests.run(["token", "--format", "json", "-c", config, "store"])
        #expect(json.status == 0, "\(json.stderr)")
        let o = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
        #expect(o["access_key_id"] as? String == keyID && o["secret_access_key"] as? String == secret)
        #expect(o["session_token"] as? String == process["SessionToken"] as? String)
        #expect(o["expiration"] as? String != nil && o["session"] as? String == "store")
        #expect(try Self.stsCalls(sts) == 1)

        // Token formats are errors for a signing session, and say what to use.
        for format in ["header", "token", "exec-credential"] {
            let wrong = try CommandLineTests.run(["token", "--format", format, "-c", config, "store"])
            #expect(wrong.status == 2 && wrong.stdout.isEmpty, "\(format): \(wrong.stdout)")
            #expect(wrong.stderr.contains("signing keys") && wrong.stderr.contains("credential-process"), "\(wrong.stderr)")
        }
        let help = try CommandLineTests.run(["token", "--help"])
        #expect(help.stdout.contains("credential-process") && help.stdout.contains("access_key_id"))

        // `bearerd run` adopts the persisted keys (no STS call), twice (a restart), and shows the metrics.
        var logs = ""
        for round in 0..<2 {
            let p = Process()
            p.executableURL = URL(fileURLWithPath: CommandLineTests.binary)
            p.arguments = ["run", "-c", config]
            let err = Pipe()
            p.standardError = err
            try p.run()
            var metrics = ""
            for _ in 0..<100 {
                if let r = try? TestClient.get(port: admin, path: "/readyz"), r.status == 200 {
                    metrics = (try? TestClient.get(port: admin, path: "/metrics"))?.bodyText ?? ""
                    break
                }
                Thread.sleep(forTimeInterval: 0.1)
            }
            for name in ["bearerd_signed_requests_total{session=\"store\"}", "bearerd_signing_credential_rejections_total{session=\"store\"}",
                         "bearerd_signing_skew_adoptions_total{session=\"store\"}", "bearerd_signing_signature_mismatches_total{session=\"store\"}",
                         "bearerd_signing_clock_offset_seconds{session=\"store\"}", "bearerd_token_expiry_seconds{session=\"store\"}",
                         "bearerd_session_ready{session=\"store\"} 1"] {
                #expect(metrics.contains(name), "round \(round): \(name) in \(metrics.prefix(300))")
            }
            kill(p.processIdentifier, SIGTERM)
            p.waitUntilExit()
            logs += String(decoding: err.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        }
        #expect(try Self.stsCalls(sts) == 1, "adopted from state_dir: \(logs)")
        #expect(logs.contains("credentials adopted from the state file"), "\(logs)")
        for s in [secret, token, process["SessionToken"] as? String ?? "-", keyID] { #expect(!logs.contains(s)) }

        // `bearerd check` fetches the keys and says from where, without the secret.
        let check = try CommandLineTests.run(["check", "-c", config])
        #expect(check.status == 0, "\(check.stdout)\(check.stderr)")
        #expect(check.stdout.contains("sessions.store: credentials from web_identity (http://127.0.0.1:\(sts.port)/)"), "\(check.stdout)")
        #expect(check.stdout.contains("expire "), "\(check.stdout)")
        #expect(!check.stdout.contains(secret) && !check.stderr.contains(secret))
        #expect(try Self.stsCalls(sts) == 2, "check asked the STS itself")

        // A role the STS refuses is a check error naming the session.
        try "not-a-jwt\n".write(toFile: dir + "/token", atomically: true, encoding: .utf8)
        let broken = try CommandLineTests.run(["check", "-c", config])
        #expect(broken.status == 1 && (broken.stdout + broken.stderr).contains("sessions.store.credentials"), "\(broken.stdout)\(broken.stderr)")
    }

    @Test func credentialFormatsAreErrorsForTokenSessions() throws {
        let config = try CommandLineTests.tempFile("bearerd.yaml", """
            sessions:
              svc:
                grant: client_credentials
                token_url: http://127.0.0.1:9/token
                client_id: c
                client_secret: s
            routes:
              - match: /
                upstream: http://127.0.0.1:9
                session: svc
            """)
        let out = try CommandLineTests.run(["token", "--format", "credential-process", "-c", config, "svc"])
        #expect(out.status == 2 && out.stdout.isEmpty)
        #expect(out.stderr.contains("holds a token, not signing keys"), "\(out.stderr)")
    }
}
