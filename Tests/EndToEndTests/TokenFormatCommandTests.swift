import Foundation
import Testing
import BearerdTestSupport

/// `bearerd token --format token|header|json|exec-credential` (docs/architecture.md §3): the real binary
/// against a scripted token endpoint (tokens of 3600 s).
@Suite("bearerd token --format", .serialized)
struct TokenFormatCommandTests {
    static func config(tokens: ScriptedTokenEndpoint, stateDir: String?, inject: String? = nil) throws -> String {
        try CommandLineTests.tempFile("bearerd.yaml", """
            \(stateDir.map { "state_dir: \($0)" } ?? "")
            sessions:
              svc:
                grant: client_credentials
                token_url: \(tokens.tokenURL)
                client_id: c
                client_secret: s
            routes:
              - match: /a/
                upstream: http://127.0.0.1:9
                session: svc
                \(inject.map { "inject: \($0)" } ?? "")
              - match: /b/
                upstream: http://127.0.0.1:9
                session: svc
            """)
    }

    static func object(_ line: String) throws -> [String: Any] {
        #expect(line.hasSuffix("\n") && line.filter { $0 == "\n" }.count == 1, "one line: \(line)")
        return try #require(try JSONSerialization.jsonObject(with: Data(line.utf8)) as? [String: Any])
    }

    /// RFC 3339 `YYYY-MM-DDTHH:MM:SSZ` (UTC) to Unix seconds.
    static func seconds(_ rfc3339: String) throws -> Int64 {
        #expect(rfc3339.range(of: #"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$"#, options: .regularExpression) != nil, "\(rfc3339)")
        let f = ISO8601DateFormatter()
        f.formatOptions = [.withInternetDateTime]
        return Int64(try #require(f.date(from: rfc3339)).timeIntervalSince1970)
    }

    static var now: Int64 { Int64(Date().timeIntervalSince1970) }

    @Test func jsonCarriesTheTokensOwnExpiryFreshAndCached() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let state = NSTemporaryDirectory() + "bearerd-format-\(UUID().uuidString)"
        let cfg = try Self.config(tokens: tokens, stateDir: state)
        var expiries: [Int64] = []
        // The token is issued during the first command; the second one prints it from the cache,
        // so both expiries lie in the first command's window (the second may run seconds later
        // on a loaded machine).
        var issued: (before: Int64, after: Int64)?
        for _ in 0..<2 {  // fetched, then from the cache
            let start = Self.now
            let out = try CommandLineTests.run(["token", "-c", cfg, "--format", "json", "svc"])
            let window = issued ?? (start, Self.now)
            issued = window
            let (before, after) = window
            #expect(out.status == 0, "\(out.stderr)")
            #expect(out.stderr.isEmpty)
            let o = try Self.object(out.stdout)
            #expect(out.stdout.hasPrefix("{\"access_token\":"))
            #expect(o.count == 4)
            #expect(o["access_token"] as? String == tokens.latest)
            #expect(o["token_type"] as? String == "Bearer")
            #expect(o["session"] as? String == "svc")
            let expiresAt = try Self.seconds(try #require(o["expires_at"] as? String))
            // The token's own expiry: issued within [before, after] for 3600 s (1 s of rounding).
            #expect(expiresAt >= before + 3600 - 1 && expiresAt <= after + 3600, "\(expiresAt) vs \(before)…\(after)")
            expiries.append(expiresAt)
        }
        #expect(tokens.calls.count == 1)
        #expect(abs(expiries[0] - expiries[1]) <= 1, "the cached token keeps its expiry: \(expiries)")
    }

    @Test func execCredentialFollowsTheK8sV1Schema() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let cfg = try Self.config(tokens: tokens, stateDir: nil)
        let before = Self.now
        let out = try CommandLineTests.run(["token", "-c", cfg, "--format", "exec-credential", "svc"])
        let after = Self.now
        #expect(out.status == 0, "\(out.stderr)")
        let o = try Self.object(out.stdout)
        #expect(Set(o.keys) == ["apiVersion", "kind", "status"])
        #expect(o["apiVersion"] as? String == "client.authentication.k8s.io/v1")
        #expect(o["kind"] as? String == "ExecCredential")
        let status = try #require(o["status"] as? [String: Any])
        #expect(Set(status.keys) == ["token", "expirationTimestamp"])
        #expect(status["token"] as? String == tokens.latest)
        let exp = try Self.seconds(try #require(status["expirationTimestamp"] as? String))
        #expect(exp >= before + 3600 - 1 && exp <= after + 3600)
    }

    @Test func headerForABearerSessionAndAnInjectRoute() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let plain = try CommandLineTests.run(["token", "-c", try Self.config(tokens: tokens, stateDir: nil), "--format", "header", "svc"])
        #expect(plain.status == 0, "\(plain.stderr)")
        #expect(plain.stdout == "Authorization: Bearer \(try #require(tokens.latest))\n")
        // The first route using the session decides (the second has the default).
        let injected = try Self.config(tokens: tokens, stateDir: nil, inject: #"{ header: X-Api-Key, format: "key={token};v=1" }"#)
        let custom = try CommandLineTests.run(["token", "-c", injected, "--format", "header", "svc"])
        #expect(custom.status == 0, "\(custom.stderr)")
        #expect(custom.stdout == "X-Api-Key: key=\(try #require(tokens.latest));v=1\n")
        // The default format is the token alone.
        let bare = try CommandLineTests.run(["token", "-c", injected, "--format", "token", "svc"])
        #expect(bare.stdout == "\(try #require(tokens.latest))\n")
    }

    @Test func anUnknownFormatIsAnArgumentError() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let out = try CommandLineTests.run(["token", "-c", try Self.config(tokens: tokens, stateDir: nil), "--format", "yaml", "svc"])
        #expect(out.status != 0)
        #expect(out.stdout.isEmpty)
        #expect(out.stderr.contains("unknown format 'yaml'"), "\(out.stderr)")
        #expect(out.stderr.contains("token, header, json, exec-credential"), "\(out.stderr)")
        #expect(tokens.calls.isEmpty)
    }
}
