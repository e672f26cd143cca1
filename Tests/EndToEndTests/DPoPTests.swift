import Foundation
import Testing
import BearerdOAuth
import BearerdTestSupport

/// DPoP (RFC 9449, docs/architecture.md §6.11) end to end: the real `bearerd` binary between a client and
/// `Tests/Fixtures/dpop_origin.py` (a resource server that checks every proof: signature with
/// the embedded key, htm/htu, ath, jti uniqueness, the key against the token's cnf.jkt, and a
/// nonce it demands on first contact), with its tokens from the Authlib fixture's DPoP token
/// endpoint (which demands its own nonce and binds tokens with cnf.jkt).
@Suite("DPoP", .serialized, .enabled(if: Prerequisite.runs(AuthServerFixture.isAvailable), "\(AuthServerFixture.unavailableReason ?? "")"))
struct DPoPEndToEndTests {
    static func json(_ r: TestClient.Response) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(r.body))) as? [String: Any] ?? [:]
    }

    static func raw(_ port: UInt16, _ request: String, method: String) throws -> TestClient.Response {
        let c = try TestClient(port: port)
        try c.send(request)
        return try c.readResponse(method: method)
    }

    static func originStats(_ origin: PythonFixture) throws -> [String: Any] {
        json(try TestClient.get(port: origin.port, path: "/_test/stats"))
    }

    static func config(port: UInt16, auth: AuthServerFixture, origin: UInt16, stateDir: String, admin: UInt16? = nil) -> String {
        """
        listen: [127.0.0.1:\(port)]\(admin.map { "\nadmin: 127.0.0.1:\($0)" } ?? "")
        loops: 2
        state_dir: \(stateDir)
        sessions:
          d:
            grant: client_credentials
            token_url: \(auth.tokenURL)
            client_id: svc
            client_secret: svc-secret
            scope: read
            dpop: true
        routes:
          - match: /
            upstream: http://127.0.0.1:\(origin)
            session: d
        """
    }

    @Test func proofsNoncesBindingAndAGeneratedKeyThatSurvivesARestart() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        #expect(try auth.request("POST", "/_test/dpop?enable=1&nonce=1").status == 200)
        let origin = try PythonFixture(script: "dpop_origin.py", arguments: ["--port", "0"])
        defer { origin.stop() }
        let dir = try RunningBearerd.tempDir("dpop")
        let port = try RunningBearerd.freePort()
        let admin = try RunningBearerd.freePort()
        let cfg = Self.config(port: port, auth: auth, origin: origin.port, stateDir: dir + "/state", admin: admin)

        var b = try RunningBearerd(config: cfg, dir: dir)
        let first = try #require(b.waitServing(port: port, path: "/a?q=1"))
        #expect(first.status == 200, "\(String(decoding: first.body, as: UTF8.self)) \(b.logs)")
        let jkt = try #require(Self.json(first)["jkt"] as? String)
        // The token endpoint demanded its nonce once; the origin once (first contact).
        let asStats = json(try auth.request("GET", "/_test/dpop-stats"))
        #expect(asStats["nonce_demands"] as? Int == 1, "\(asStats)")
        #expect(asStats["bound"] as? Int == 1)
        #expect((asStats["failures"] as? [Any])?.isEmpty == true, "\(asStats)")
        var stats = try Self.originStats(origin)
        #expect(stats["nonce_demands"] as? Int == 1, "\(stats)")
        #expect((stats["failures"] as? [Any])?.isEmpty == true, "\(stats)")
        // The generated key: 0600 in state_dir; its thumbprint, not the key, is logged.
        let keyPath = dir + "/state/d.dpop.pem"
        let attributes = try FileManager.default.attributesOfItem(atPath: keyPath)
        #expect((attributes[.posixPermissions] as? NSNumber)?.intValue == 0o600)
        let pem = try String(contentsOfFile: keyPath, encoding: .utf8)
        #expect(pem.contains("PRIVATE KEY"))
        #expect(!b.logs.contains(String(pem.split(separator: "\n")[1])))

        // A POST with a body, a PUT: each its own proof (htm, htu, jti) with the same token.
        let post = try Self.raw(port, "POST /p/x?y=2 HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nContent-Type: text/plain\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello", method: "POST")
        #expect(post.status == 200)
        #expect(Self.json(post)["body_length"] as? Int == 5)
        #expect(Self.json(post)["method"] as? String == "POST")

        // The origin changes its nonce: 100 concurrent requests, each retried at most once with
        // the new nonce, none refreshes the token.
        let tokenRequests = try auth.stats()["token_requests"] as? Int
        _ = try Self.raw(origin.port, "POST /_test/rotate-nonce HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", method: "POST")
        let before = try Self.originStats(origin)["nonce_demands"] as? Int ?? 0
        final class Results: @unchecked Sendable {  // @unchecked: guarded by `lock`
            let lock = NSLock()
            var statuses: [Int] = []
        }
        let results = Results()
        DispatchQueue.concurrentPerform(iterations: 100) { i in
            let status = (try? TestClient.get(port: port, path: "/c/\(i)").status) ?? 0
            results.lock.withLock { results.statuses.append(status) }
        }
        #expect(results.statuses.count == 100)
        #expect(results.statuses.allSatisfy { $0 == 200 }, "\(results.statuses.filter { $0 != 200 })")
        stats = try Self.originStats(origin)
        let demands = (stats["nonce_demands"] as? Int ?? 0) - before
        #expect(demands >= 1 && demands <= 100, "\(stats)")
        #expect((stats["failures"] as? [Any])?.isEmpty == true, "\(stats)")
        #expect(try auth.stats()["token_requests"] as? Int == tokenRequests, "no refresh for a nonce demand")
        // Every nonce demand was retried once: the metrics count them per side.
        let metrics = String(decoding: try TestClient.get(port: admin, path: "/metrics").body, as: UTF8.self)
        #expect(metrics.contains("bearerd_dpop_nonce_retries_total{session=\"d\",side=\"token_endpoint\"} 1"), "\(metrics)")
        #expect(metrics.contains("bearerd_dpop_nonce_retries_total{session=\"d\",side=\"upstream\"} \(demands + 1)"), "\(metrics)")

        // A restart keeps the key (same jkt): tokens bound to it stay usable.
        #expect(b.stop() == 0)
        b = try RunningBearerd(config: cfg, dir: dir)
        defer { _ = b.stop() }
        let again = try #require(b.waitServing(port: port, path: "/after-restart"))
        #expect(again.status == 200, "\(b.logs)")
        #expect(Self.json(again)["jkt"] as? String == jkt)

        // bearerd check prints the key's thumbprint.
        let check = try CommandLineTests.run(["check", "-c", b.configPath])
        #expect(check.status == 0, "\(check.stderr)")
        #expect(check.stdout.contains("jkt \(jkt)"), "\(check.stdout)")
    }

    private func json(_ r: TestClient.Response) -> [String: Any] { Self.json(r) }

    /// A token endpoint that answers `token_type: Bearer` to a DPoP session: no token, the
    /// client gets 503 naming the session, the upstream is not called.
    @Test func aBearerAnswerIsRefused() throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        #expect(try auth.request("POST", "/_test/dpop?enable=1&answer_bearer=1").status == 200)
        let origin = try PythonFixture(script: "dpop_origin.py", arguments: ["--port", "0"])
        defer { origin.stop() }
        let dir = try RunningBearerd.tempDir("dpop-bearer")
        let port = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: Self.config(port: port, auth: auth, origin: origin.port, stateDir: dir + "/state"), dir: dir)
        defer { _ = b.stop() }
        let r = try #require(b.waitServing(port: port, path: "/x"))
        #expect(r.status == 503)
        let body = String(decoding: r.body, as: UTF8.self)
        #expect(body.contains("\"session\":\"d\""), "\(body)")
        #expect(body.contains("DPoP"), "\(body)")
        #expect(try Self.originStats(origin)["ok"] as? Int == 0)
    }

    /// `dpop: true` without `dpop_key_file` and without `state_dir` is a check error.
    @Test func aGeneratedKeyNeedsStateDir() throws {
        let cfg = try CommandLineTests.tempFile("bearerd.yaml", """
            sessions:
              d:
                grant: client_credentials
                token_url: http://127.0.0.1:9/token
                client_id: svc
                client_secret: s
                dpop: true
            routes:
              - match: /
                upstream: http://127.0.0.1:9
                session: d
            """)
        let out = try CommandLineTests.run(["check", "-c", cfg])
        #expect(out.status != 0)
        #expect(out.stderr.contains("state_dir") && out.stderr.contains("dpop"), "\(out.stderr)")
    }

    /// gRPC over h2c: every call (unary, server streaming, bidirectional), each its own HTTP/2
    /// stream, carries its own proof (a jti never seen before, htu the call's URL, ath), checked
    /// by the grpcio server against the token's cnf.jkt.
    @Test func everyGRPCStreamGetsItsOwnProof() throws {
        try #require(PythonFixture.unavailable(modules: ["grpc"]) == nil, "\(PythonFixture.unavailable(modules: ["grpc"]) ?? "")")
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        #expect(try auth.request("POST", "/_test/dpop?enable=1").status == 200)
        let server = try PythonFixture(script: "grpc_echo.py", arguments: ["server", "--port", "0", "--dpop"])
        defer { server.stop() }
        let dir = try RunningBearerd.tempDir("dpop-grpc")
        let port = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: """
            listen: [127.0.0.1:\(port)]
            state_dir: \(dir)/state
            sessions:
              d:
                grant: client_credentials
                token_url: \(auth.tokenURL)
                client_id: svc
                client_secret: svc-secret
                dpop: true
            routes:
              - match: /bearerd.test.Echo/
                upstream: http://127.0.0.1:\(server.port)
                http2: prior_knowledge
                session: d
            """, dir: dir)
        defer { _ = b.stop() }
        #expect(b.waitServing(port: port) != nil)
        var jtis: Set<String> = []
        var jkts: Set<String> = []
        for (kind, expected) in [("unary", ["hello"]), ("server_stream", (0..<3).map { "msg-\($0)" }), ("bidi", (0..<3).map { "b\($0)" }), ("unary", ["hello"])] {
            let call = try GRPCTests.call(port, kind)
            #expect(call.ok, "\(kind): \(call) \(server.log.suffix(2000))")
            #expect(call.messages == expected)
            if let jti = call.trailers["x-dpop-jti"] { jtis.insert(jti) }
            if let jkt = call.trailers["x-dpop-jkt"] { jkts.insert(jkt) }
            #expect(call.trailers["x-seen-authorization"]?.hasPrefix("DPoP ") == true)
        }
        #expect(jtis.count == 4, "a fresh proof per stream")
        #expect(jkts.count == 1)
    }

    /// Plain HTTP/2 (not gRPC) on both sides: curl multiplexes concurrent streams over one
    /// prior-knowledge connection to bearerd, and bearerd's `http2: prior_knowledge` route to a
    /// Hypercorn h2c origin that checks each stream's proof (signature, htm/htu, ath, cnf.jkt,
    /// its nonce demanded on first contact): every upstream stream carries its own proof.
    @Test func plainHTTP2StreamsEachCarryTheirOwnProof() throws {
        try #require(Curl.available, "curl is not installed")
        try #require(PythonFixture.unavailable(modules: ["hypercorn"]) == nil, "\(PythonFixture.unavailable(modules: ["hypercorn"]) ?? "")")
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        #expect(try auth.request("POST", "/_test/dpop?enable=1&nonce=1").status == 200)
        let origin = try PythonFixture(script: "dpop_origin.py", arguments: ["--port", "0", "--h2c"])
        defer { origin.stop() }
        let dir = try RunningBearerd.tempDir("dpop-h2")
        let port = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: """
            listen: [127.0.0.1:\(port)]
            state_dir: \(dir)/state
            sessions:
              d:
                grant: client_credentials
                token_url: \(auth.tokenURL)
                client_id: svc
                client_secret: svc-secret
                dpop: true
            routes:
              - match: /
                upstream: http://127.0.0.1:\(origin.port)
                http2: prior_knowledge
                session: d
            """, dir: dir)
        defer { _ = b.stop() }
        let first = try #require(b.waitServing(port: port, path: "/warm"))
        #expect(first.status == 200, "\(String(decoding: first.body, as: UTF8.self)) \(b.logs)")
        #expect(Self.json(first)["http_version"] as? String == "2")

        // Eight streams at once on one HTTP/2 connection (h2c_client.py: curl 7.88's --parallel
        // with prior knowledge breaks on any server), then a POST with a body from curl.
        let count = 8
        let out = try PythonFixture.runClient(script: "h2c_client.py", arguments: ["--port", "\(port)"]
                                              + (0..<count).flatMap { ["--path", "/s/\($0)?q=\($0)"] }, timeout: 25)
        let responses = try #require((try JSONSerialization.jsonObject(with: Data(out.utf8)) as? [String: Any])?["responses"] as? [[String: Any]])
        #expect(responses.count == count)
        #expect(responses.allSatisfy { $0["status"] as? Int == 200 && ($0["body"] as? String)?.contains("\"http_version\": \"2\"") == true },
                "\(responses) \(b.logs)")
        let post = try Curl.run(["--http2-prior-knowledge", "--data-binary", "@-", "http://127.0.0.1:\(port)/upload"], stdin: Data("hello h2".utf8))
        #expect(post.status == 0 && post.httpVersion == "2", "\(post.stderr)")
        #expect(post.body.contains("\"method\": \"POST\"") && post.body.contains("\"body_length\": 8"), "\(post.body)")

        let stats = try Self.originStats(origin)
        #expect((stats["failures"] as? [Any])?.isEmpty == true, "\(stats)")
        #expect(stats["nonce_demands"] as? Int == 1, "first contact only: \(stats)")
        let accepted = try #require(stats["accepted"] as? [[String: Any]])
        #expect(accepted.count == count + 2, "\(accepted)")
        #expect(accepted.allSatisfy { $0["http_version"] as? String == "2" }, "\(accepted)")
        let jtis = Set(accepted.compactMap { $0["jti"] as? String })
        #expect(jtis.count == accepted.count, "a fresh jti per stream: \(accepted)")
        let paths = Set(accepted.compactMap { $0["path"] as? String })
        #expect(paths.isSuperset(of: (0..<count).map { "/s/\($0)" }), "\(paths)")

        // The origin changes its nonce: 20 concurrent streams, each replayed at most once with
        // the new nonce and a fresh proof, no refresh.
        let tokenRequests = try auth.stats()["token_requests"] as? Int
        _ = try Self.raw(origin.port, "POST /_test/rotate-nonce HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", method: "POST")
        let many = 20
        let again = try PythonFixture.runClient(script: "h2c_client.py", arguments: ["--port", "\(port)"]
                                                + (0..<many).flatMap { ["--path", "/n/\($0)"] }, timeout: 25)
        let answers = try #require((try JSONSerialization.jsonObject(with: Data(again.utf8)) as? [String: Any])?["responses"] as? [[String: Any]])
        #expect(answers.count == many && answers.allSatisfy { $0["status"] as? Int == 200 }, "\(answers) \(b.logs)")
        let after = try Self.originStats(origin)
        let demands = (after["nonce_demands"] as? Int ?? 0) - 1
        #expect(demands >= 1 && demands <= many, "\(after)")
        #expect((after["failures"] as? [Any])?.isEmpty == true, "\(after)")
        let all = after["accepted"] as? [[String: Any]] ?? []
        #expect(Set(all.compactMap { $0["jti"] as? String }).count == all.count && all.count == count + 2 + many)
        #expect(try auth.stats()["token_requests"] as? Int == tokenRequests, "no refresh for a nonce demand")
    }

    /// The `cnf.jkt` of a fixture token (a JWT; its payload read without verification).
    static func boundJKT(_ token: String) -> String? {
        let parts = token.split(separator: ".")
        guard parts.count == 3, let payload = Base64.decodeURL(String(parts[1])),
              let claims = try? JSONSerialization.jsonObject(with: Data(payload)) as? [String: Any] else { return nil }
        return (claims["cnf"] as? [String: Any])?["jkt"] as? String
    }

    /// `bearerd token` for a DPoP session prints the bound token (its cnf.jkt is the thumbprint
    /// `bearerd check` prints), reuses it from `state_dir` while it lasts, and never hands out a
    /// token bound to another key: a new `dpop_key_file` (P-256 → ES256, RSA 2048 → RS256)
    /// means a new token.
    @Test(arguments: ["ec", "rsa"]) func tokenCommandPrintsABoundTokenAndCachesItPerKey(keyKind: String) throws {
        let auth = try AuthServerFixture.start()
        defer { auth.stop() }
        #expect(try auth.request("POST", "/_test/dpop?enable=1&nonce=1").status == 200)
        let dir = try RunningBearerd.tempDir("dpop-token")
        func config(keyFile: String?) throws -> String {
            try CommandLineTests.tempFile("bearerd.yaml", """
                state_dir: \(dir)/state
                sessions:
                  d:
                    grant: client_credentials
                    token_url: \(auth.tokenURL)
                    client_id: svc
                    client_secret: svc-secret
                    dpop: true\(keyFile.map { "\n    dpop_key_file: \($0)" } ?? "")
                routes:
                  - match: /
                    upstream: http://127.0.0.1:9
                    session: d
                """)
        }
        func jktOfCheck(_ cfg: String) throws -> String? {
            let check = try CommandLineTests.run(["check", "-c", cfg])
            #expect(check.status == 0, "\(check.stderr)")
            guard let range = check.stdout.range(of: "jkt ") else { return nil }
            return String(check.stdout[range.upperBound...].prefix { $0.isLetter || $0.isNumber || $0 == "-" || $0 == "_" })
        }
        let generated = try config(keyFile: nil)
        let first = try CommandLineTests.run(["token", "-c", generated, "d"])
        #expect(first.status == 0, "\(first.stderr)")
        let token = first.stdout.trimmingCharacters(in: .newlines)
        let jkt = try #require(Self.boundJKT(token), "\(first.stdout)")
        #expect(try jktOfCheck(generated) == jkt)
        let requests = try auth.stats()["token_requests"] as? Int
        let again = try CommandLineTests.run(["token", "-c", generated, "d"])
        #expect(again.stdout == first.stdout, "the cached token")
        #expect(try auth.stats()["token_requests"] as? Int == requests)
        // The other formats name the DPoP scheme and type (same cached token, no new request).
        let header = try CommandLineTests.run(["token", "-c", generated, "--format", "header", "d"])
        #expect(header.stdout == "Authorization: DPoP \(token)\n", "\(header.stdout)\(header.stderr)")
        let asJSON = try CommandLineTests.run(["token", "-c", generated, "--format", "json", "d"])
        let object = try JSONSerialization.jsonObject(with: Data(asJSON.stdout.utf8)) as? [String: Any]
        #expect(object?["token_type"] as? String == "DPoP", "\(asJSON.stdout)")
        #expect(object?["access_token"] as? String == token)
        #expect(object?["session"] as? String == "d")
        #expect(try auth.stats()["token_requests"] as? Int == requests)

        // Another key (same session, same token endpoint): a token bound to it, not the cached one.
        let (key, _) = try PrivateKeyJWTTests.keyPair(keyKind, dir: dir)
        let withFile = try config(keyFile: key)
        let other = try CommandLineTests.run(["token", "-c", withFile, "d"])
        #expect(other.status == 0, "\(other.stderr)")
        let otherJKT = try #require(Self.boundJKT(other.stdout.trimmingCharacters(in: .newlines)))
        #expect(otherJKT != jkt)
        #expect(try jktOfCheck(withFile) == otherJKT)
        let failures = json(try auth.request("GET", "/_test/dpop-stats"))["failures"] as? [Any]
        #expect(failures?.isEmpty == true, "\(failures ?? [])")
    }
}
