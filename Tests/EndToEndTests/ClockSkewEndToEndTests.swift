import Foundation
import Testing
import BearerdTestSupport

/// docs/architecture.md §6.12 end to end: the Authlib fixture's clock runs ahead of the host's
/// (`/_test/clock`: its `Date` headers, and the `iat` window it checks private_key_jwt
/// assertions and DPoP proofs against). bearerd measures the skew from the first answer, logs it
/// once at warning level, and what it signs afterwards carries the server's time.
@Suite("Clock skew", .serialized, .enabled(if: Prerequisite.runs(AuthServerFixture.isAvailable), "\(AuthServerFixture.unavailableReason ?? "")"))
struct ClockSkewEndToEndTests {
    static func warnings(_ logs: String) -> [Substring] {
        logs.split(separator: "\n").filter { $0.contains("clock skew against the token endpoint") }
    }

    /// `clock_skew_s=-120` give or take the one-second granularity of `Date`.
    static func mentionsSkew(_ text: Substring, around seconds: Int) -> Bool {
        (seconds - 2...seconds + 2).contains { text.contains("clock_skew_s=\($0)") || text.contains("\"clock_skew_s\":\"\($0)\"") }
    }

    static func pkjwtConfig(port: UInt16, auth: AuthServerFixture, key: String) -> String {
        """
        listen: [127.0.0.1:\(port)]
        sessions:
          wl:
            grant: client_credentials
            token_url: \(auth.tokenURL)
            client_id: skewed
            client_auth: private_key_jwt
            client_key_file: \(key)
            scope: read
        routes:
          - match: /
            upstream: \(auth.apiURL)
            session: wl
        """
    }

    /// private_key_jwt against a server 120 s ahead: the first assertion (local iat) is refused
    /// as out of its window; the answer's `Date` gives the skew, which is logged once and applied
    /// at once, so the client's request succeeds; later token requests succeed on the first try.
    @Test func privateKeyJWTFollowsTheServersClock() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("skew-pkjwt")
        let (key, pub) = try PrivateKeyJWTTests.keyPair("ec", dir: dir)
        try PrivateKeyJWTTests.register(auth, clientID: "skewed", publicPEM: pub)
        #expect(try auth.request("POST", "/_test/clock?skew=120").status == 200)
        let port = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: Self.pkjwtConfig(port: port, auth: auth, key: key), dir: dir)
        defer { _ = b.stop() }
        let first = try #require(b.waitServing(port: port, path: "/x"))
        #expect(first.status == 200, "\(first.bodyText) \(b.logs)")
        #expect((try auth.stats()["token_errors"] as? [String: Any])?["assertion_time"] as? Int == 1)

        // Revoked tokens: two more token requests, each accepted at once.
        for i in 0..<2 {
            #expect(try auth.request("POST", "/_test/revoke-all").status == 200)
            let r = try TestClient.get(port: port, path: "/again/\(i)")
            #expect(r.status == 200, "\(r.bodyText) \(b.logs)")
        }
        let stats = try auth.stats()
        #expect((stats["token_errors"] as? [String: Any])?["assertion_time"] as? Int == 1, "\(stats)")
        let warnings = Self.warnings(b.logs)
        #expect(warnings.count == 1, "\(b.logs)")
        #expect(warnings.first.map { Self.mentionsSkew($0, around: -120) } == true, "\(warnings)")
    }

    /// DPoP against a server (and a resource server) 120 s ahead: the first proof is refused as
    /// out of the token endpoint's window, the next one carries its time; the upstream's proofs
    /// too.
    @Test func dpopProofsFollowTheServersClock() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        #expect(try auth.request("POST", "/_test/dpop?enable=1&nonce=1").status == 200)
        #expect(try auth.request("POST", "/_test/clock?skew=120").status == 200)
        let origin = try PythonFixture(script: "dpop_origin.py", arguments: ["--port", "0", "--clock-skew", "120"])
        defer { origin.stop() }
        let dir = try RunningBearerd.tempDir("skew-dpop")
        let port = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: DPoPEndToEndTests.config(port: port, auth: auth, origin: origin.port, stateDir: dir + "/state"), dir: dir)
        defer { _ = b.stop() }
        let first = try #require(b.waitServing(port: port, path: "/x"))
        #expect(first.status == 200, "\(first.bodyText) \(b.logs)")
        let r = try TestClient.get(port: port, path: "/y")
        #expect(r.status == 200)
        let asStats = DPoPEndToEndTests.json(try auth.request("GET", "/_test/dpop-stats"))
        let failures = asStats["failures"] as? [String] ?? []
        #expect(failures.count == 1 && failures[0].contains("iat"), "\(asStats)")
        #expect(asStats["bound"] as? Int == 1, "\(asStats)")
        let originStats = try DPoPEndToEndTests.originStats(origin)
        #expect((originStats["failures"] as? [Any])?.isEmpty == true, "\(originStats)")
        #expect(Self.warnings(b.logs).count == 1, "\(b.logs)")
    }

    /// An `invalid_client` that mentions time, from a server whose skew is under the 5 s bearerd
    /// applies but over its own 2 s window: the 503 and the log report the measured skew.
    @Test func aTimeComplaintIsReportedWithTheMeasuredSkew() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("skew-report")
        let (key, pub) = try PrivateKeyJWTTests.keyPair("ec", dir: dir)
        try PrivateKeyJWTTests.register(auth, clientID: "skewed", publicPEM: pub)
        #expect(try auth.request("POST", "/_test/clock?skew=3&window=1").status == 200)
        let port = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: Self.pkjwtConfig(port: port, auth: auth, key: key), dir: dir)
        defer { _ = b.stop() }
        let r = try #require(b.waitServing(port: port, path: "/x"))
        #expect(r.status == 503)
        #expect(r.bodyText.contains("invalid_client"), "\(r.bodyText)")
        #expect(r.bodyText.contains("local clock minus the token endpoint's Date: -"), "\(r.bodyText)")
        #expect(r.bodyText.contains("(applied: 0s)"), "\(r.bodyText)")
        #expect(b.waitLog("local clock minus the token endpoint's Date"), "\(b.logs)")
        #expect(Self.warnings(b.logs).isEmpty, "under the threshold: no skew warning")
    }
}
