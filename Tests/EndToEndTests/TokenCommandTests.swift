import Foundation
import Testing
import BearerdTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// `bearerd token` reuses a still-valid token through `state_dir` (docs/architecture.md §3): scripts
/// that call it in a loop cost one token request per token lifetime.
@Suite("bearerd token: reuse through state_dir", .serialized)
struct TokenCommandTests {
    static func config(tokens: ScriptedTokenEndpoint, stateDir: String?, scope: String = "read") throws -> String {
        try CommandLineTests.tempFile("bearerd.yaml", """
            \(stateDir.map { "state_dir: \($0)" } ?? "")
            sessions:
              svc:
                grant: client_credentials
                token_url: \(tokens.tokenURL)
                client_id: c
                client_secret: s
                scope: \(scope)
            routes:
              - match: /
                upstream: http://127.0.0.1:9
                session: svc
            """)
    }

    @Test func fiftyCallsMakeOneTokenRequest() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let state = NSTemporaryDirectory() + "bearerd-token-\(UUID().uuidString)"
        let cfg = try Self.config(tokens: tokens, stateDir: state)
        var printed = Set<String>()
        for _ in 0..<50 {
            let out = try CommandLineTests.run(["token", "-c", cfg, "svc"])
            #expect(out.status == 0, "\(out.stderr)")
            #expect(out.stderr.isEmpty, "quiet by default: \(out.stderr)")
            printed.insert(out.stdout)
        }
        #expect(tokens.calls.count == 1)
        #expect(printed == ["\(try #require(tokens.latest))\n"])
        var st = stat()
        #expect(stat(state + "/svc.token.json", &st) == 0 && (st.st_mode & 0o777) == 0o600)
        let cache = try String(contentsOfFile: state + "/svc.token.json", encoding: .utf8)
        #expect(cache.contains("\"binding\""))

        // -v says what it did, and still prints the token alone on stdout.
        let verbose = try CommandLineTests.run(["token", "-v", "-c", cfg, "svc"])
        #expect(verbose.stderr.contains("reusing the cached token"))
        #expect(!verbose.stderr.contains(try #require(tokens.latest)))
        #expect(verbose.stdout == "\(try #require(tokens.latest))\n")

        // A changed configuration (another scope) never gets the old token.
        let other = try Self.config(tokens: tokens, stateDir: state, scope: "write")
        let fresh = try CommandLineTests.run(["token", "-c", other, "svc"])
        #expect(fresh.status == 0)
        #expect(tokens.calls.count == 2)
        #expect(fresh.stdout == "\(try #require(tokens.latest))\n")
    }

    @Test func concurrentCallsShareOneRequestAndExpiredTokensAreRenewed() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let state = NSTemporaryDirectory() + "bearerd-token-\(UUID().uuidString)"
        let cfg = try Self.config(tokens: tokens, stateDir: state)
        let group = DispatchGroup()
        for _ in 0..<8 {
            group.enter()
            Thread {
                _ = try? CommandLineTests.run(["token", "-c", cfg, "svc"])
                group.leave()
            }.start()
        }
        #expect(group.wait(timeout: .now() + 30) == .success)
        #expect(tokens.calls.count == 1)
        // A token with less than the minimum life left (5 s) is renewed, and the new one cached.
        let path = state + "/svc.token.json"
        let cached = try String(contentsOfFile: path, encoding: .utf8)
        let soon = Int(Date().timeIntervalSince1970) + 2
        let edited = cached.replacingOccurrences(of: #""expires_at":\d+"#, with: "\"expires_at\":\(soon)", options: .regularExpression)
        #expect(edited != cached)
        try edited.write(toFile: path, atomically: true, encoding: .utf8)
        _ = try CommandLineTests.run(["token", "-c", cfg, "svc"])
        #expect(tokens.calls.count == 2)
        _ = try CommandLineTests.run(["token", "-c", cfg, "svc"])
        #expect(tokens.calls.count == 2)
    }

    @Test func withoutStateDirEveryCallAsks() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let cfg = try Self.config(tokens: tokens, stateDir: nil)
        for _ in 0..<3 { #expect(try CommandLineTests.run(["token", "-c", cfg, "svc"]).status == 0) }
        #expect(tokens.calls.count == 3)
    }
}

/// The shipped configurations pass `check` (docs/architecture.md §3): `config.example.yaml` and
/// `deploy/examples/*` with `--example` (what this machine lacks becomes notes), the sidecar as
/// is once its secret variable is set.
@Suite("Shipped configurations pass check")
struct ShippedConfigTests {
    static var root: String { AuthServerFixture.repositoryRoot.path }

    @Test(arguments: ["config.example.yaml", "deploy/examples/sidecar.yaml", "deploy/examples/curl-as-me.yaml", "deploy/examples/grpc-service.yaml",
                            "deploy/examples/on-behalf-of.yaml"])
    func checkExample(file: String) throws {
        let out = try CommandLineTests.run(["check", "--example", "-c", Self.root + "/" + file], env: ["HOME": "/tmp"])
        #expect(out.status == 0, "\(out.stdout)\(out.stderr)")
        #expect(out.stdout.contains(": OK ("))
    }

    @Test func theSidecarPassesPlainCheckWithItsSecret() throws {
        let bare = try CommandLineTests.run(["check", "-c", Self.root + "/deploy/examples/sidecar.yaml"], env: ["PARTNER_CLIENT_SECRET": ""])
        #expect(bare.status != 0)
        #expect((bare.stdout + bare.stderr).contains("PARTNER_CLIENT_SECRET"))
        let ok = try CommandLineTests.run(["check", "-c", Self.root + "/deploy/examples/sidecar.yaml"], env: ["PARTNER_CLIENT_SECRET": "s3cret"])
        #expect(ok.status == 0, "\(ok.stdout)\(ok.stderr)")
    }

    @Test func aStructuralErrorIsStillAnErrorWithExample() throws {
        let bad = try CommandLineTests.tempFile("bearerd.yaml", "routes:\n  - match: nope\n    upstream: http://127.0.0.1:1\n")
        let out = try CommandLineTests.run(["check", "--example", "-c", bad])
        #expect(out.status != 0)
    }
}
