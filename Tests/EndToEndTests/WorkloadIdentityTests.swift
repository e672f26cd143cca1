import Foundation
import Testing
import BearerdTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// Keyless workload identity (docs/architecture.md §4 `jwt_bearer`, `token_exchange`, `client_assertion`,
/// `audience`, `resource`; docs/architecture.md §6.10) with the real `bearerd`
/// against the Authlib fixture: its RFC 7523 JWT bearer grant, its RFC 8693 exchange grant
/// (subject and actor JWTs verified against the trusted cluster JWKS) and federated client
/// assertions. The JWTs are signed by the fixture's test "cluster" key, as Kubernetes' API
/// server signs projected service-account tokens.
@Suite("workload identity", .serialized, .enabled(if: Prerequisite.runs(AuthServerFixture.isAvailable), "\(AuthServerFixture.unavailableReason ?? "")"))
struct WorkloadIdentityTests {
    static let serviceAccount = "system:serviceaccount:default:bearerd"

    /// A JWT of the cluster issuer (`POST /_test/workload/mint`).
    static func mint(_ auth: AuthServerFixture, sub: String = serviceAccount, jti: String, expiresIn: Int = 600,
                     audience: String? = nil) throws -> String {
        let body = try JSONSerialization.data(withJSONObject: ["sub": sub, "jti": jti, "exp_in": expiresIn,
                                                               "aud": audience ?? auth.tokenURL])
        let r = try auth.request("POST", "/_test/workload/mint", headers: [("Content-Type", "application/json")], body: Array(body))
        let obj = try JSONSerialization.jsonObject(with: Data(r.body)) as? [String: Any]
        return try #require(obj?["jwt"] as? String)
    }

    /// Every workload token request the fixture saw (`GET /_test/workload/log`).
    static func log(_ auth: AuthServerFixture) throws -> [[String: Any]] {
        let r = try auth.request("GET", "/_test/workload/log")
        return (try JSONSerialization.jsonObject(with: Data(r.body)) as? [[String: Any]]) ?? []
    }

    /// Kubernetes' projected volume layout: `token -> ..data/token`, `..data -> ..TIMESTAMP/`;
    /// an update writes a new timestamped directory and renames a new `..data` link over the
    /// old one (atomic), as the kubelet's AtomicWriter does.
    struct ProjectedVolume {
        let dir: String
        var serial = 0
        var tokenPath: String { dir + "/token" }

        init(dir: String, token: String) throws {
            self.dir = dir
            try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
            try rotate(to: token)
            #expect(symlink("..data/token", dir + "/token") == 0)
        }

        mutating func rotate(to token: String) throws {
            serial += 1
            let stamp = "..2026_01_01_00_00_0\(serial).\(UUID().uuidString.prefix(6))"
            try FileManager.default.createDirectory(atPath: dir + "/" + stamp, withIntermediateDirectories: false)
            try (token + "\n").write(toFile: dir + "/" + stamp + "/token", atomically: false, encoding: .utf8)
            unlink(dir + "/..data_tmp")
            #expect(symlink(stamp, dir + "/..data_tmp") == 0)
            #expect(rename(dir + "/..data_tmp", dir + "/..data") == 0)
        }
    }

    final class Statuses: @unchecked Sendable {  // @unchecked: guarded by `lock`
        let lock = NSLock()
        var values: [Int] = []
        var stop = false
    }

    /// A projected token rotated (symlink swap) while requests flow through the proxy: no
    /// request fails, and the token endpoint sees the new assertion (its `jti`) once the old
    /// tokens are due; every token request carries both audiences and the resource.
    @Test func jwtBearerFollowsARotatingProjectedToken() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        try auth.configure(tokenLifetime: 2)  // a refresh about every second
        let dir = try RunningBearerd.tempDir("k8s")
        let firstJWT = try Self.mint(auth, jti: "first")
        var volume = try ProjectedVolume(dir: dir + "/tokens", token: firstJWT)
        let port = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: """
            listen: 127.0.0.1:\(port)
            sessions:
              k8s:
                grant: jwt_bearer
                token_url: \(auth.tokenURL)
                assertion_file: \(volume.tokenPath)
                audience: [https://api.one.test, https://api.two.test]
                resource: https://api.one.test/
            routes:
              - match: /
                upstream: \(auth.apiURL)
                session: k8s
            """, dir: dir)
        defer { _ = b.stop() }
        #expect(b.waitServing(port: port, path: "/warm")?.status == 200, "\(b.logs)")
        let statuses = Statuses()
        let done = DispatchSemaphore(value: 0)
        Thread {
            while !statuses.lock.withLock({ statuses.stop }) {
                let status = (try? TestClient.get(port: port, path: "/flow"))?.status ?? 0
                statuses.lock.withLock { statuses.values.append(status) }
            }
            done.signal()
        }.start()
        // Let some refreshes happen with the first token, then swap in the second.
        var deadline = Date().addingTimeInterval(15)
        while try Self.log(auth).filter({ $0["jti"] as? String == "first" }).count < 3, Date() < deadline {
            Thread.sleep(forTimeInterval: 0.1)
        }
        try volume.rotate(to: try Self.mint(auth, jti: "second"))
        deadline = Date().addingTimeInterval(15)
        while try !Self.log(auth).contains(where: { $0["jti"] as? String == "second" }), Date() < deadline {
            Thread.sleep(forTimeInterval: 0.1)
        }
        statuses.lock.withLock { statuses.stop = true }
        #expect(done.wait(timeout: .now() + 10) == .success)
        let all = statuses.lock.withLock { statuses.values }
        #expect(!all.isEmpty)
        #expect(all.allSatisfy { $0 == 200 }, "statuses: \(Dictionary(grouping: all, by: { $0 }).mapValues(\.count))")
        let log = try Self.log(auth).filter { $0["grant"] as? String == "jwt_bearer" }
        #expect(log.contains { $0["jti"] as? String == "second" }, "\(log)")
        // After the swap the old assertion is never sent again.
        if let firstSecond = log.firstIndex(where: { $0["jti"] as? String == "second" }) {
            #expect(log[firstSecond...].allSatisfy { $0["jti"] as? String == "second" })
        }
        #expect(log.allSatisfy { $0["outcome"] as? String == "ok" })
        #expect(log.allSatisfy { ($0["audience"] as? [String]) == ["https://api.one.test", "https://api.two.test"] }, "\(log.first ?? [:])")
        #expect(log.allSatisfy { ($0["resource"] as? [String]) == ["https://api.one.test/"] })
        #expect(!b.logs.contains(String(firstJWT.split(separator: ".").last ?? "")), "an assertion was logged")
    }

    /// An expired projected token is reported (logs, 503 detail, /readyz: the file and why)
    /// and not sent; a valid one in the file is used at the next attempt (no negative cache).
    @Test func anExpiredAssertionIsReportedNotSentAndRecovers() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("k8s")
        var volume = try ProjectedVolume(dir: dir + "/tokens", token: try Self.mint(auth, jti: "old", expiresIn: -30))
        let port = try RunningBearerd.freePort(), admin = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: """
            listen: 127.0.0.1:\(port)
            admin: 127.0.0.1:\(admin)
            sessions:
              k8s:
                grant: jwt_bearer
                token_url: \(auth.tokenURL)
                assertion_file: \(volume.tokenPath)
            routes:
              - match: /
                upstream: \(auth.apiURL)
                session: k8s
            """, dir: dir)
        defer { _ = b.stop() }
        let first = b.waitServing(port: port, path: "/x")
        #expect(first?.status == 503)
        #expect(first?.bodyText.contains("credential.expired") == true, "\(first?.bodyText ?? "")")
        #expect(first?.bodyText.contains("assertion_file") == true && first?.bodyText.contains(volume.tokenPath) == true, "\(first?.bodyText ?? "")")
        #expect(b.waitLog("credential.expired"))
        #expect(b.logs.contains(volume.tokenPath))
        let ready = try TestClient.get(port: admin, path: "/readyz")
        #expect(ready.status == 503)
        #expect(ready.bodyText.contains("assertion_file"), "\(ready.bodyText)")
        #expect(try Self.log(auth).isEmpty, "an expired assertion was sent")
        try volume.rotate(to: try Self.mint(auth, jti: "fresh"))
        var status = 0
        let deadline = Date().addingTimeInterval(20)
        while status != 200 && Date() < deadline {
            status = (try? TestClient.get(port: port, path: "/y"))?.status ?? 0
            if status != 200 { Thread.sleep(forTimeInterval: 0.2) }
        }
        #expect(status == 200)
        #expect(try Self.log(auth).allSatisfy { $0["jti"] as? String == "fresh" })
    }

    static func chainConfig(_ auth: AuthServerFixture, volume: ProjectedVolume, actor: String, listen: String) -> String {
        """
        \(listen)
        sessions:
          k8s:
            grant: jwt_bearer
            token_url: \(auth.tokenURL)
            assertion_file: \(volume.tokenPath)
          federation:
            grant: token_exchange
            token_url: \(auth.tokenURL)
            subject_session: k8s
          impersonation:
            grant: token_exchange
            token_url: \(auth.tokenURL)
            subject_session: federation
            actor_token_file: \(actor)
            requested_token_type: urn:ietf:params:oauth:token-type:access_token
            audience: https://api.test
        routes:
          - match: /
            upstream: \(auth.apiURL)
            session: impersonation
        """
    }

    /// jwt_bearer → exchange → exchange through the proxy; after every token is revoked, the
    /// upstream's 401 costs one refresh per link (each exchange first refused for its
    /// subject, whose session refreshes once) and one replay.
    @Test func aChainedExchangeIsServedAndRenewsLinkByLinkAfterRevocation() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let dir = try RunningBearerd.tempDir("chain")
        let volume = try ProjectedVolume(dir: dir + "/tokens", token: try Self.mint(auth, jti: "sa"))
        let actor = dir + "/actor.jwt"
        try (try Self.mint(auth, sub: "system:serviceaccount:default:gateway", jti: "actor")).write(toFile: actor, atomically: true, encoding: .utf8)
        let port = try RunningBearerd.freePort(), admin = try RunningBearerd.freePort()
        let text = Self.chainConfig(auth, volume: volume, actor: actor, listen: "listen: 127.0.0.1:\(port)\nadmin: 127.0.0.1:\(admin)")
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", text)
        let check = try CommandLineTests.run(["check", "-c", cfg])
        #expect(check.status == 0, "\(check.stdout)\(check.stderr)")

        let b = try RunningBearerd(config: text, dir: dir)
        defer { _ = b.stop() }
        let first = b.waitServing(port: port, path: "/chain")
        #expect(first?.status == 200, "\(first?.bodyText ?? "")\n\(b.logs)")
        #expect(first?.bodyText.contains(Self.serviceAccount) == true, "\(first?.bodyText ?? "")")
        let exchanges = try Self.log(auth).filter { $0["grant"] as? String == "token_exchange" }
        #expect(exchanges.contains { $0["actor_sub"] as? String == "system:serviceaccount:default:gateway"
            && $0["requested_token_type"] as? String == "urn:ietf:params:oauth:token-type:access_token"
            && ($0["audience"] as? [String]) == ["https://api.test"] }, "\(exchanges)")

        try auth.resetStats()
        try auth.revokeAll()
        let after = try TestClient.get(port: port, path: "/after-revocation")
        #expect(after.status == 200, "\(after.bodyText)\n\(b.logs)")
        let stats = try auth.stats()
        let byGrant = stats["by_grant"] as? [String: Int] ?? [:]
        #expect(byGrant["urn:ietf:params:oauth:grant-type:jwt-bearer"] == 1, "\(byGrant)")
        // impersonation refused (its subject revoked), federation refused, then both succeed.
        #expect(byGrant["urn:ietf:params:oauth:grant-type:token-exchange"] == 4, "\(byGrant)")
        #expect(stats["api_requests"] as? Int == 2)  // the request and its one replay
        #expect(stats["api_rejected"] as? Int == 1)
        let metrics = try TestClient.get(port: admin, path: "/metrics").bodyText
        #expect(metrics.contains("bearerd_token_exchanges_total{session=\"impersonation\",outcome=\"subject_rejected\"} 1"), "\(metrics)")
        #expect(metrics.contains("bearerd_token_exchanges_total{session=\"federation\",outcome=\"subject_rejected\"} 1"))

        // `bearerd token` runs the whole chain for the last link.
        let token = try CommandLineTests.run(["token", "-c", cfg, "impersonation"])
        #expect(token.status == 0, "\(token.stderr)")
        let api = try auth.request("GET", "/api/x", headers: [("Authorization", "Bearer \(token.stdout.trimmingCharacters(in: .newlines))")])
        #expect(api.status == 200)
    }

    /// `client_auth: client_assertion`: a projected token accepted by the IdP as the client's
    /// federated credential; an expired one is reported with its file and not sent.
    @Test func aFederatedClientAssertionAuthenticatesTheClient() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        let body = try JSONSerialization.data(withJSONObject: ["client_id": "federated-app", "subject": Self.serviceAccount])
        #expect(try auth.request("POST", "/_test/workload/federated-client", headers: [("Content-Type", "application/json")], body: Array(body)).status == 200)
        let dir = try RunningBearerd.tempDir("fed")
        let file = dir + "/azure-identity-token"
        try (try Self.mint(auth, jti: "fed-1")).write(toFile: file, atomically: true, encoding: .utf8)
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", """
            sessions:
              federated:
                grant: client_credentials
                token_url: \(auth.tokenURL)
                client_id: federated-app
                client_auth: client_assertion
                client_assertion_file: \(file)
                scope: read
            routes:
              - match: /
                upstream: \(auth.apiURL)
                session: federated
            """)
        #expect(try CommandLineTests.run(["check", "-c", cfg]).status == 0)
        let out = try CommandLineTests.run(["token", "-c", cfg, "federated"])
        #expect(out.status == 0, "\(out.stderr)")
        let api = try auth.request("GET", "/api/x", headers: [("Authorization", "Bearer \(out.stdout.trimmingCharacters(in: .newlines))")])
        #expect(api.status == 200)
        #expect(api.bodyText.contains("\"client_id\":\"federated-app\""), "\(api.bodyText)")
        #expect(try Self.log(auth).contains { $0["grant"] as? String == "client_assertion" && $0["jti"] as? String == "fed-1" })

        try (try Self.mint(auth, jti: "fed-old", expiresIn: -5)).write(toFile: file, atomically: true, encoding: .utf8)
        let expired = try CommandLineTests.run(["token", "-c", cfg, "federated"])
        #expect(expired.status != 0)
        #expect(expired.stderr.contains("client_assertion_file \(file)") && expired.stderr.contains("expired"), "\(expired.stderr)")
        #expect(try !Self.log(auth).contains { $0["jti"] as? String == "fed-old" })
    }
}
