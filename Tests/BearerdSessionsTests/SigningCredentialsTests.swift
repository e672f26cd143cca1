import BearerdHTTP
import BearerdIO
import BearerdOAuth
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import BearerdTestSupport
import Testing
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdService
@testable import BearerdSessions

/// Signing sessions (`grant: aws`, `grant: aliyun`; docs/architecture.md §6.15) obtain their keys
/// through the real session driver from real peers: moto's STS (Tests/Fixtures/sts_server.py:
/// AssumeRoleWithWebIdentity, and AssumeRole with moto's SigV4 verification enforced), the
/// vending endpoints and the Alibaba STS of Tests/Fixtures/credential_vendor.py (which checks
/// the requests as the vendors document them), a helper script, and key files.
@Suite("Signing sessions obtain their keys", .serialized,
       .enabled(if: Prerequisite.runs(PythonFixture.unavailable(modules: ["moto", "flask_cors"]) == nil),
                "\(PythonFixture.unavailable(modules: ["moto", "flask_cors"]) ?? "")"))
struct SigningCredentialsTests {
    static let role = "arn:aws:iam::123456789012:role/app"

    /// An unsigned JWT with `exp` an hour ahead (STS reads it; bearerd checks only its shape and expiry).
    static func jwt(_ subject: String) -> String {
        func b64(_ s: String) -> String { Base64.encodeURL(Array(s.utf8)) }
        let exp = Int(Date().timeIntervalSince1970) + 3600
        return b64("{\"alg\":\"RS256\",\"kid\":\"k\"}") + "." + b64("{\"sub\":\"\(subject)\",\"aud\":\"sts.amazonaws.com\",\"exp\":\(exp)}") + ".c2ln"
    }

    static func calls(_ fixture: PythonFixture) throws -> [[String: Any]] {
        let data = try Data(contentsOf: URL(string: "http://127.0.0.1:\(fixture.port)/_calls")!)
        return try #require(try JSONSerialization.jsonObject(with: data) as? [[String: Any]])
    }

    static func url(_ fixture: PythonFixture, _ path: String) -> EndpointURL {
        EndpointURL(scheme: "http", host: "127.0.0.1", port: fixture.port, path: path)
    }

    static func session(_ name: String = "store", grant: GrantType = .aws, region: String = "us-east-1", sts: EndpointURL,
                        _ source: CredentialSourceConfig, waitTimeout: Duration = .seconds(10)) -> SessionConfig {
        var s = SessionConfig(name: name, grant: grant, tokenURL: sts, clientID: "", clientAuth: .none, requestTimeout: .seconds(10),
                              waitTimeout: waitTimeout)
        s.signing = SigningCredentialsConfig(region: region, stsURL: sts, source: source)
        if case .exec(let argv) = source { s.command = argv }
        return s
    }

    /// Kubernetes' projected token layout: `token` → `..data/token`, `..data` → a timestamped directory.
    static func projectedToken(_ dir: String, _ value: String, generation: Int) throws {
        let real = dir + "/..\(generation)"
        try FileManager.default.createDirectory(atPath: real, withIntermediateDirectories: true)
        writeFile(real + "/token", value + "\n")
        try? FileManager.default.removeItem(atPath: dir + "/..data_tmp")
        try FileManager.default.createSymbolicLink(atPath: dir + "/..data_tmp", withDestinationPath: "..\(generation)")
        #expect(rename(dir + "/..data_tmp", dir + "/..data") == 0)
        if !FileManager.default.fileExists(atPath: dir + "/token") {
            try FileManager.default.createSymbolicLink(atPath: dir + "/token", withDestinationPath: "..data/token")
        }
    }

    static func keys(_ token: PublishedToken) throws -> TemporaryCredentials {
        try #require(token.signingKeys)
    }

    /// AssumeRoleWithWebIdentity against moto: 100 concurrent first requests from four loops make
    /// exactly one STS call (counted at the STS); the projected token is read per call (swapped
    /// by symlink between calls, the second call presents the new one); the keys' Expiration
    /// drives the lifetime; logs name the source and the key id's fingerprint, never a secret.
    @Test func webIdentityOneCallForAHundredWaitersAndTheTokenFileReadPerCall() async throws {
        let sts = try PythonFixture(script: "sts_server.py", arguments: ["--delay", "0.5"], readyTimeout: 60)
        defer { sts.stop() }
        let dir = temporaryDirectory()
        defer { removeTree(dir) }
        let first = Self.jwt("first"), second = Self.jwt("second")
        try Self.projectedToken(dir, first, generation: 1)
        let logs = CapturedLogs()
        let config = Self.session(sts: Self.url(sts, "/"), .webIdentity(.init(roleARN: Self.role, tokenFile: dir + "/token",
                                                                               sessionName: "bearerd-test", durationSeconds: 900)))
        let manager = try SessionManager(config: sessionConfig(config), logger: logs.logger, environment: [:])
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "store"))

        let results = await withTaskGroup(of: Result<PublishedToken, TokenUnavailable>.self) { group in
            for i in 0..<100 { group.addTask { await requestToken(driver, on: testLoops[i % testLoops.count]) } }
            var all: [Result<PublishedToken, TokenUnavailable>] = []
            for await r in group { all.append(r) }
            return all
        }
        let tokens = try results.map { try $0.get() }
        #expect(Set(tokens.map(\.generation)) == [1])
        var calls = try Self.calls(sts)
        #expect(calls.count == 1, "\(calls)")
        #expect(calls.first?["action"] as? String == "AssumeRoleWithWebIdentity")
        #expect(calls.first?["web_identity_token"] as? String == first)
        #expect(calls.first?["session_name"] as? String == "bearerd-test")
        #expect(calls.first?["duration"] as? String == "900")
        let keys = try Self.keys(tokens[0])
        #expect(keys.accessKeyID.hasPrefix("ASIA"))
        #expect(keys.sessionToken != nil)
        let expiresAt = try #require(keys.expiresAt)
        let now = Int64(Date().timeIntervalSince1970)
        #expect(abs(expiresAt - (now + 900)) < 60, "moto's Expiration: DurationSeconds 900 from now")
        // The published expiry is the keys' own (monotonic), not a default lifetime.
        let left = Double((driver.snapshot.expiresAt ?? 0) &- monotonicNanos()) / 1e9
        #expect(left > 800 && left <= 900, "\(left)")
        #expect(tokens[0].fingerprint == BearerdOAuth.fingerprint(keys.accessKeyID))

        // The kubelet swaps the projected token; the next fetch presents the new one.
        try Self.projectedToken(dir, second, generation: 2)
        let outcome = await reportRejected(driver, generation: 1)
        guard case .replay(let renewed, _) = outcome else { Issue.record("\(outcome)"); return }
        #expect(renewed.generation == 2)
        #expect(try Self.keys(renewed).accessKeyID != keys.accessKeyID)
        calls = try Self.calls(sts)
        #expect(calls.count == 2)
        #expect(calls.last?["web_identity_token"] as? String == second)

        let text = logs.text
        #expect(text.contains("credentials obtained"), "\(text)")
        #expect(text.contains("web_identity"), "the source is named: \(text)")
        #expect(text.contains(BearerdOAuth.fingerprint(keys.accessKeyID)))
        for secret in [keys.secret.exposedValue, keys.sessionToken?.exposedValue ?? "-", keys.accessKeyID, first, second] {
            #expect(!text.contains(secret), "a secret in the logs")
        }
        // /metrics: the fetches, expiry and the signing families.
        let metrics = AdminResponder.renderMetrics(LoopMetrics(), sessions: [driver.snapshot], now: monotonicNanos())
        for name in ["bearerd_token_requests_total{session=\"store\"} 2", "bearerd_token_expiry_seconds{session=\"store\"}",
                     "bearerd_signed_requests_total{session=\"store\"} 0", "bearerd_signing_credential_rejections_total{session=\"store\"} 0",
                     "bearerd_signing_skew_adoptions_total{session=\"store\"} 0", "bearerd_signing_signature_mismatches_total{session=\"store\"} 0",
                     "bearerd_signing_clock_offset_seconds{session=\"store\"} 0"] {
            #expect(metrics.contains(name), "\(name) in \(metrics)")
        }
    }

    /// AssumeRole signed with SigV4 (service sts) with base keys read from files, checked by
    /// moto's own verifier: the right keys get credentials, a wrong secret is refused by the STS
    /// (SignatureDoesNotMatch: permanent, the session says so), so a pass means the signature held.
    @Test func assumeRoleIsSignedWithTheBaseKeysAndMotoVerifiesIt() async throws {
        let dir = temporaryDirectory()
        defer { removeTree(dir) }
        let sts = try PythonFixture(script: "sts_server.py", arguments: ["--auth", dir + "/base.json"], readyTimeout: 60)
        defer { sts.stop() }
        let base = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: dir + "/base.json"))) as? [String: String])
        writeFile(dir + "/id", try #require(base["access_key_id"]) + "\n")
        writeFile(dir + "/secret", try #require(base["secret_access_key"]) + "\n")
        writeFile(dir + "/wrong", "not-the-secret\n")
        let keys = CredentialSourceConfig.StaticKeys(accessKeyIDFile: dir + "/id", secretAccessKeyFile: dir + "/secret")
        let good = Self.session(sts: Self.url(sts, "/"), .assumeRole(.init(roleARN: Self.role, keys: keys, externalID: "ext-4711")))
        var wrongKeys = keys
        wrongKeys.secretAccessKeyFile = dir + "/wrong"
        let bad = Self.session("bad", sts: Self.url(sts, "/"), .assumeRole(.init(roleARN: Self.role, keys: wrongKeys)), waitTimeout: .seconds(3))
        let logs = CapturedLogs()
        var config = sessionConfig(good)
        config.sessions.append(bad)
        let manager = try SessionManager(config: config, logger: logs.logger, environment: [:])
        defer { manager.stop() }

        let token = try await requestToken(try #require(manager.session(named: "store"))).get()
        let k = try Self.keys(token)
        #expect(k.accessKeyID.hasPrefix("ASIA") && k.sessionToken != nil && k.expiresAt != nil)
        var calls = try Self.calls(sts)
        #expect(calls.count == 1)
        #expect(calls.first?["action"] as? String == "AssumeRole")
        #expect(calls.first?["signed_with"] as? String == base["access_key_id"])
        #expect(calls.first?["external_id"] as? String == "ext-4711")

        let refused = await requestToken(try #require(manager.session(named: "bad")))
        guard case .failure(let u) = refused else { Issue.record("a wrong secret got keys"); return }
        #expect(u.detail.contains("SignatureDoesNotMatch"), "\(u.detail)")
        calls = try Self.calls(sts)
        #expect(calls.count == 2, "permanent: not retried at once (\(calls.count))")
        #expect(!logs.text.contains(try #require(base["secret_access_key"])))
    }

    /// A vending endpoint in both shapes: the container-credentials JSON with `url_headers` and
    /// `url_token_file` (the server checks both; the file is read per call, so a rotated token
    /// is sent on the next fetch) and seed 004's `distribute-token.json` for an aliyun session.
    @Test func vendingEndpointsInBothShapesWithHeadersAndATokenFileReadPerCall() async throws {
        let dir = temporaryDirectory()
        defer { removeTree(dir) }
        writeFile(dir + "/auth", "token-one\n")
        let vendor = try PythonFixture(script: "credential_vendor.py", arguments: ["--token-file", dir + "/auth", "--header", "X-Vendor=abc"])
        defer { vendor.stop() }
        let container = Self.session(sts: Self.url(vendor, "/"), .url(.init(url: Self.url(vendor, "/container"), headers: [.init(name: "X-Vendor", value: "abc")],
                                                                          tokenFile: dir + "/auth")))
        let seed = Self.session("oss", grant: .aliyun, region: "cn-hangzhou", sts: Self.url(vendor, "/"),
                                .url(.init(url: Self.url(vendor, "/seed004"), headers: [.init(name: "X-Vendor", value: "abc")], tokenFile: dir + "/auth")))
        let missing = Self.session("noheader", sts: Self.url(vendor, "/"), .url(.init(url: Self.url(vendor, "/container"), tokenFile: dir + "/auth")),
                                   waitTimeout: .milliseconds(800))
        var config = sessionConfig(container)
        config.sessions += [seed, missing]
        let logs = CapturedLogs()
        let manager = try SessionManager(config: config, logger: logs.logger, environment: [:])
        defer { manager.stop() }

        let driver = try #require(manager.session(named: "store"))
        let a = try Self.keys(try await requestToken(driver).get())
        #expect(a.accessKeyID.hasPrefix("ASIAVENDOR") && a.secret.exposedValue.hasPrefix("secret/") && a.sessionToken != nil)
        let b = try Self.keys(try await requestToken(try #require(manager.session(named: "oss"))).get())
        #expect(b.accessKeyID != a.accessKeyID && b.sessionToken?.exposedValue.hasPrefix("session-token-") == true)

        writeFile(dir + "/auth", "token-two\n")
        guard case .replay(let renewed, _) = await reportRejected(driver, generation: 1) else { Issue.record("not renewed"); return }
        #expect(try Self.keys(renewed).accessKeyID != a.accessKeyID)
        let calls = try Self.calls(vendor)
        #expect(calls.map { $0["authorization"] as? String } .prefix(2).allSatisfy { $0 == "token-one" })
        #expect(calls.last(where: { ($0["path"] as? String) == "/container" && ($0["authorization"] as? String) == "token-two" }) != nil)

        // Without the header the vendor answers 401: the session has no keys and says why.
        let refused = await requestToken(try #require(manager.session(named: "noheader")))
        guard case .failure(let u) = refused else { Issue.record("keys without the vendor's header"); return }
        #expect(u.detail.contains("401"), "\(u.detail)")
        #expect(!logs.text.contains("token-one") && !logs.text.contains("token-two") && !logs.text.contains(a.secret.exposedValue))
    }

    /// `exec`: a helper printing credential_process JSON (no Expiration: re-run every
    /// `default_lifetime`), and `static`: key files (a trailing newline removed, session token
    /// optional), read again on the next fetch.
    @Test func execHelperAndStaticKeyFiles() async throws {
        let dir = temporaryDirectory()
        defer { removeTree(dir) }
        let script = dir + "/creds.sh"
        writeFile(script, "#!/bin/sh\nprintf '{\"Version\": 1, \"AccessKeyId\": \"AKIDEXEC\", \"SecretAccessKey\": \"exec/secret\", \"SessionToken\": \"exec-token\"}'\n")
        chmod(script, 0o755)
        writeFile(dir + "/id", "AKIDSTATIC1\n")
        writeFile(dir + "/secret", "static+secret/1\n")
        var exec = Self.session("exec", sts: .execPlaceholder, .exec([script]))
        exec.defaultLifetime = .seconds(120)
        let statik = Self.session("static", sts: .execPlaceholder, .staticKeys(.init(accessKeyIDFile: dir + "/id", secretAccessKeyFile: dir + "/secret")))
        var config = sessionConfig(exec)
        config.sessions.append(statik)
        let manager = try SessionManager(config: config, logger: CapturedLogs().logger, environment: [:])
        defer { manager.stop() }

        let execDriver = try #require(manager.session(named: "exec"))
        let e = try Self.keys(try await requestToken(execDriver).get())
        #expect(e.accessKeyID == "AKIDEXEC" && e.secret.exposedValue == "exec/secret" && e.sessionToken?.exposedValue == "exec-token" && e.expiresAt == nil)
        let left = Double((execDriver.snapshot.expiresAt ?? 0) &- monotonicNanos()) / 1e9
        #expect(left > 100 && left <= 120, "default_lifetime for keys without Expiration: \(left)")

        let staticDriver = try #require(manager.session(named: "static"))
        let s = try Self.keys(try await requestToken(staticDriver).get())
        #expect(s.accessKeyID == "AKIDSTATIC1" && s.secret.exposedValue == "static+secret/1" && s.sessionToken == nil)
        #expect(staticDriver.metrics.tokenRequests == 0, "reading files is not a request")
        writeFile(dir + "/id", "AKIDSTATIC2\n")
        guard case .replay(let again, _) = await reportRejected(staticDriver, generation: 1) else { Issue.record("not read again"); return }
        #expect(try Self.keys(again).accessKeyID == "AKIDSTATIC2")
    }

    /// Alibaba Cloud STS AssumeRoleWithOIDC: the fixture refuses anything but the documented
    /// call (common parameters in the query, the operation's in the form body, anonymous). Its
    /// errors are classified: an expired OIDC token is transient (retried), NoPermission is
    /// permanent (negative-cached: no immediate retries).
    @Test func oidcRoleAsAlibabaDocumentsIt() async throws {
        let dir = temporaryDirectory()
        defer { removeTree(dir) }
        let oidc = Self.jwt("system:serviceaccount:default:app")
        try Self.projectedToken(dir, oidc, generation: 1)
        let vendor = try PythonFixture(script: "credential_vendor.py", arguments: ["--oidc-token-file", dir + "/..1/token"])
        defer { vendor.stop() }
        let source = CredentialSourceConfig.oidcRole(.init(roleARN: "acs:ram::1234567890123456:role/app",
                                                           oidcProviderARN: "acs:ram::1234567890123456:oidc-provider/ack-rrsa",
                                                           tokenFile: dir + "/token", sessionName: "bearerd", durationSeconds: 3600))
        let logs = CapturedLogs()
        let manager = try SessionManager(config: sessionConfig(Self.session("oss", grant: .aliyun, region: "cn-hangzhou",
                                                                            sts: Self.url(vendor, "/aliyun-sts"), source, waitTimeout: .seconds(2))),
                                         logger: logs.logger, environment: [:])
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "oss"))
        let k = try Self.keys(try await requestToken(driver).get())
        #expect(k.accessKeyID.hasPrefix("ASIAVENDOR") && k.sessionToken != nil && k.expiresAt != nil)
        var calls = try Self.calls(vendor)
        let call = try #require(calls.first)
        #expect(call["method"] as? String == "POST")
        #expect(Set((call["query"] as? [String: String] ?? [:]).keys) == ["Action", "Format", "Version", "Timestamp"])
        let form = call["form"] as? [String: String] ?? [:]
        #expect(Set(form.keys) == ["RoleArn", "OIDCProviderArn", "OIDCToken", "RoleSessionName", "DurationSeconds"])
        #expect(form["OIDCToken"] == oidc && form["DurationSeconds"] == "3600")
        #expect(call["authorization"] is NSNull)

        // An expired OIDC token (the kubelet is about to rotate it): transient, retried.
        try postJSON(vendor, "/_fail", ["path": "/aliyun-sts", "status": 400, "count": 1,
                                        "body": ["Code": "AuthenticationFail.OIDCToken.Expired", "Message": "expired", "RequestId": "r"]])
        guard case .replay(let renewed, _) = await reportRejected(driver, generation: 1) else { Issue.record("no retry after a transient error"); return }
        #expect(renewed.generation == 2)
        calls = try Self.calls(vendor)
        #expect(calls.count == 3, "one refused, one retried: \(calls.count)")
        #expect(logs.text.contains("sts.AuthenticationFail.OIDCToken.Expired"), "\(logs.text)")

        // NoPermission: permanent, one call, the session says so.
        try postJSON(vendor, "/_fail", ["path": "/aliyun-sts", "status": 403, "count": 5,
                                        "body": ["Code": "NoPermission", "Message": "You are not authorized", "RequestId": "r"]])
        let outcome = await reportRejected(driver, generation: 2)
        guard case .unavailable(let u) = outcome else { Issue.record("\(outcome)"); return }
        #expect(u.detail.contains("NoPermission"), "\(u.detail)")
        #expect(try Self.calls(vendor).count == 4)
        #expect(!logs.text.contains(oidc))
    }

    /// Keys persist in state_dir (0600): a new process (a second manager) adopts them without
    /// a new STS call, and a new STS call happens only once they are gone.
    @Test func keysPersistAcrossARestart() async throws {
        let sts = try PythonFixture(script: "sts_server.py", arguments: [], readyTimeout: 60)
        defer { sts.stop() }
        let dir = temporaryDirectory()
        defer { removeTree(dir) }
        try Self.projectedToken(dir + "/tok", Self.jwt("p"), generation: 1)
        let state = dir + "/state"
        let config = sessionConfig(Self.session(sts: Self.url(sts, "/"), .webIdentity(.init(roleARN: Self.role, tokenFile: dir + "/tok/token"))),
                                   stateDir: state)
        let firstLogs = CapturedLogs()
        let first = try SessionManager(config: config, logger: firstLogs.logger, environment: [:])
        let k1 = try Self.keys(try await requestToken(try #require(first.session(named: "store"))).get())
        // Written on the session queue right after the waiters were answered.
        #expect(await eventually { fileMode(state + "/store.token.json") == 0o600 })
        first.stop()
        #expect(!firstLogs.text.contains("cannot keep"), "\(firstLogs.text)")
        let logs = CapturedLogs()
        let second = try SessionManager(config: config, logger: logs.logger, environment: [:])
        defer { second.stop() }
        let k2 = try Self.keys(try await requestToken(try #require(second.session(named: "store"))).get())
        #expect(k2 == k1)
        #expect(try Self.calls(sts).count == 1, "adopted, no new STS call")
        #expect(logs.text.contains("credentials adopted from the state file"), "\(logs.text)")
    }

    /// `GET /v1/credentials/NAME` for an AWS SDK: the container-credentials shape, with and
    /// without the configured authorization token; `/v1/token/` of a signing session and
    /// `/v1/credentials/` of a token session point to the right path.
    @Test func tokenAPIServesCredentials() async throws {
        let dir = temporaryDirectory()
        defer { removeTree(dir) }
        writeFile(dir + "/id", "AKIDAPI\n")
        writeFile(dir + "/secret", "api/secret\n")
        writeFile(dir + "/auth", "sdk-token-123\n")
        let signing = Self.session(sts: .execPlaceholder, .staticKeys(.init(accessKeyIDFile: dir + "/id", secretAccessKeyFile: dir + "/secret")))
        let endpoint = try ScriptedTokenEndpoint(handler: { _, n in ScriptedTokenEndpoint.token("tok-\(n)") })
        defer { endpoint.stop() }
        let plain = SessionConfig(name: "plain", grant: .clientCredentials, tokenURL: endpoint.url, clientID: "c", clientSecret: .literal(Secret("s")))
        var config = sessionConfig(signing)
        config.sessions.append(plain)
        let manager = try SessionManager(config: config, logger: CapturedLogs().logger, environment: [:])
        defer { manager.stop() }
        func ask(_ target: String, _ headers: [(String, String)], authFile: String?) async -> (Int, String) {
            let api = TokenAPIConfig(listen: .tcp(host: "127.0.0.1", port: 0), sessions: ["store", "plain"], authorizationTokenFile: authFile)
            let responder = TokenAPIResponder(caller: TokenAPICaller(.tcp(address: "127.0.0.1:5555")), settings: TokenAPISettings(api),
                                              sessions: manager, logger: CapturedLogs().logger)
            return await withCheckedContinuation { c in
                responder.respond(to: HTTPRequestHead(method: "GET", target: target, headers: HTTPHeaders(headers)), body: [], loop: testLoops[0]) { h, b in
                    c.resume(returning: (h.status, String(decoding: b, as: UTF8.self)))
                }
            }
        }
        var (status, body) = await ask("/v1/credentials/store", [], authFile: dir + "/auth")
        #expect(status == 401, "\(body)")
        (status, body) = await ask("/v1/credentials/store", [("Authorization", "sdk-token-12")], authFile: dir + "/auth")
        #expect(status == 403, "\(body)")
        (status, body) = await ask("/v1/credentials/store", [("Authorization", "sdk-token-123")], authFile: dir + "/auth")
        #expect(status == 200, "\(body)")
        let o = try #require(try JSONSerialization.jsonObject(with: Data(body.utf8)) as? [String: String])
        #expect(o["AccessKeyId"] == "AKIDAPI" && o["SecretAccessKey"] == "api/secret" && o["Token"] == nil)
        #expect((try? ISO8601Timestamp.parse(o["Expiration"] ?? "")) != nil, "an Expiration the SDK can read: \(body)")
        // Without authorization_token_file: the TCP header rule of /v1/token/.
        (status, body) = await ask("/v1/credentials/store", [], authFile: nil)
        #expect(status == 403 && body.contains("Bearerd-Token-Request"), "\(body)")
        (status, body) = await ask("/v1/credentials/store", [("Bearerd-Token-Request", "1")], authFile: nil)
        #expect(status == 200, "\(body)")
        (status, body) = await ask("/v1/token/store", [("Bearerd-Token-Request", "1")], authFile: nil)
        #expect(status == 400 && body.contains("/v1/credentials/store"), "\(body)")
        (status, body) = await ask("/v1/credentials/plain", [("Bearerd-Token-Request", "1")], authFile: nil)
        #expect(status == 400 && body.contains("/v1/token/plain"), "\(body)")
        (status, body) = await ask("/v1/token/plain", [("Bearerd-Token-Request", "1")], authFile: nil)
        #expect(status == 200 && body.contains("tok-1"), "\(body)")
    }

    /// Replicas share keys only for the same source: two sessions that differ only in the role
    /// (or the vending URL) never share a shared-cache record or a `bearerd token` cache entry.
    @Test func theSourceIsPartOfTheSharedAndCachedIdentity() throws {
        let sts = EndpointURL(scheme: "https", host: "sts.us-east-1.amazonaws.com", port: 443, path: "/")
        let a = Self.session(sts: sts, .webIdentity(.init(roleARN: Self.role, tokenFile: "/t")))
        let b = Self.session(sts: sts, .webIdentity(.init(roleARN: Self.role + "-admin", tokenFile: "/t")))
        let c = Self.session(sts: sts, .url(.init(url: EndpointURL(scheme: "http", host: "127.0.0.1", port: 1, path: "/a"))))
        let d = Self.session(sts: sts, .url(.init(url: EndpointURL(scheme: "http", host: "127.0.0.1", port: 1, path: "/b"))))
        #expect(SharedTokenCache.identity(of: a, dpopThumbprint: nil) != SharedTokenCache.identity(of: b, dpopThumbprint: nil))
        #expect(SharedTokenCache.identity(of: c, dpopThumbprint: nil) != SharedTokenCache.identity(of: d, dpopThumbprint: nil))
        #expect(a.signingIdentity != b.signingIdentity && c.signingIdentity != d.signingIdentity)
    }

    /// STS answers classified without a server (the cases the fixtures cannot make): throttling
    /// and 5xx retryable with a delay, an invalid projected token transient, AccessDenied
    /// permanent, an unknown 4xx code permanent, an unusable 200 retryable, expired keys refused.
    @Test func stsErrorsAreClassified() {
        func xml(_ code: String) -> [UInt8] {
            Array("<ErrorResponse><Error><Type>Sender</Type><Code>\(code)</Code><Message>m</Message></Error></ErrorResponse>".utf8)
        }
        func classify(_ status: Int, _ body: [UInt8]) -> TokenEndpointFailure? {
            if case .failure(let f) = CredentialFetch.classify(status: status, headers: [], wallClockNow: 0, decode: { () throws(CredentialsError) in
                try TemporaryCredentials.fromSTSXML(body, action: .assumeRoleWithWebIdentity)
            }) { return f }
            return nil
        }
        #expect(classify(400, xml("Throttling"))?.classification == .retryable)
        #expect(classify(400, xml("Throttling"))?.retryAfter == .seconds(5))
        #expect(classify(400, xml("InvalidIdentityToken"))?.classification == .retryable)
        #expect(classify(400, xml("ExpiredTokenException"))?.classification == .retryable)
        #expect(classify(403, xml("AccessDenied"))?.classification == .permanent)
        #expect(classify(400, xml("SomethingNew"))?.classification == .permanent)
        #expect(classify(503, xml("SomethingNew"))?.classification == .retryable)
        #expect(classify(200, Array("<html>maintenance</html>".utf8))?.classification == .retryable)
        #expect(TokenRefreshKey.errorLabel(for: classify(403, xml("AccessDenied"))!) == "sts_AccessDenied")
        #expect(TokenRefreshKey.errorLabel(for: classify(400, xml("Made-Up"))!) == "sts_other", "a server cannot make up label values")
        let stale = TemporaryCredentials(accessKeyID: "AKID", secret: OAuthSecret("s"), sessionToken: nil, expiresAt: 100)
        guard case .failure(let f) = CredentialFetch.grant(stale, wallClockNow: 100, defaultLifetime: .seconds(300)) else {
            Issue.record("expired keys accepted"); return
        }
        #expect(f.reason == "credentials.expired" && f.classification == .retryable)
    }
}

/// POSTs a JSON object to a fixture.
func postJSON(_ fixture: PythonFixture, _ path: String, _ object: [String: Any]) throws {
    var request = URLRequest(url: URL(string: "http://127.0.0.1:\(fixture.port)\(path)")!)
    request.httpMethod = "POST"
    request.httpBody = try JSONSerialization.data(withJSONObject: object)
    let done = DispatchSemaphore(value: 0)
    URLSession.shared.dataTask(with: request) { _, _, _ in done.signal() }.resume()
    _ = done.wait(timeout: .now() + 10)
}
