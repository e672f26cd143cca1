import Foundation
import Testing
import BearerdTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// Why the peers cannot run (PyJWT or cryptography missing from the tests' venv), or nil.
let onBehalfOfPeersMissing = PythonFixture.unavailable(modules: ["jwt", "cryptography"])

/// On behalf of callers (docs/architecture.md §6.16) with the real `bearerd` binary against real
/// peers independent of bearerd's code: `exchange_sts.py` (a strict RFC 8693 / RFC 7523
/// on-behalf-of STS that verifies every caller JWT with PyJWT, and the callers' IdP with its JWKS,
/// forgeries and key rotation) and `identity_origin.py` (an upstream that accepts only STS tokens,
/// answers with the token's `sub` and records every header it saw). Counts are taken at the
/// peers; bearerd's /metrics is the second check.
@Suite("On behalf of callers", .serialized,
       .enabled(if: Prerequisite.runs(onBehalfOfPeersMissing == nil), "\(onBehalfOfPeersMissing ?? "")"))
struct OnBehalfOfTests {
    static var missing: String? { onBehalfOfPeersMissing }

    struct Failure: Error, CustomStringConvertible { var description: String }

    // MARK: - Peers

    /// The STS with its IdP, and the identity origin. Owns the two children.
    final class Peers {
        let sts: PythonFixture
        let origin: PythonFixture
        let idpPort: UInt16
        var stsPort: UInt16 { sts.port }
        var originPort: UInt16 { origin.port }
        var issuer: String { "http://127.0.0.1:\(idpPort)/" }
        var tokenURL: String { "http://127.0.0.1:\(stsPort)/token" }
        var jwksURL: String { "http://127.0.0.1:\(idpPort)/jwks" }
        var upstream: String { "http://127.0.0.1:\(originPort)" }

        init() throws {
            try Prerequisite.require(OnBehalfOfTests.missing == nil, "PyJWT and cryptography in the tests' venv (Tests/Fixtures/requirements.txt)")
            sts = try PythonFixture(script: "exchange_sts.py", arguments: [])
            idpPort = try #require(sts.extraPorts.first, "exchange_sts.py announced no IdP port")
            origin = try PythonFixture(script: "identity_origin.py",
                                       arguments: ["--sts-jwks", "http://127.0.0.1:\(sts.port)/jwks", "--caller-issuer", "http://127.0.0.1:\(idpPort)/"])
        }

        func stop() {
            origin.stop()
            sts.stop()
        }

        /// One request to a peer's control surface, `Connection: close`.
        static func call(_ port: UInt16, _ method: String, _ target: String) throws -> TestClient.Response {
            let c = try TestClient(port: port)
            try c.send("\(method) \(target) HTTP/1.1\r\nHost: peer\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            return try c.readResponse(method: method)
        }

        static func json(_ r: TestClient.Response) -> Any? { try? JSONSerialization.jsonObject(with: Data(r.body)) }

        /// A caller JWT from the IdP (`/control/mint`; `query` adds kid, aud, iss, exp_in, pad, forge).
        func mint(_ sub: String, _ query: String = "") throws -> String {
            let r = try Self.call(idpPort, "GET", "/control/mint?sub=\(sub)" + (query.isEmpty ? "" : "&" + query))
            guard r.status == 200 else { throw Failure(description: "mint \(sub) \(query): \(r.status) \(r.bodyText)") }
            return r.bodyText
        }

        func mintMany(prefix: String, count: Int, pad: Int) throws -> [String] {
            let r = try Self.call(idpPort, "GET", "/control/mint_many?prefix=\(prefix)&count=\(count)&pad=\(pad)")
            return (Self.json(r) as? [String]) ?? []
        }

        func stsControl(_ what: String) throws {
            let r = try Self.call(stsPort, "POST", "/control/" + what)
            guard r.status == 200 else { throw Failure(description: "STS control \(what): \(r.status)") }
        }

        func idpControl(_ what: String) throws -> [String: Any] {
            let r = try Self.call(idpPort, what.hasPrefix("stats") ? "GET" : "POST", "/control/" + what)
            return (Self.json(r) as? [String: Any]) ?? [:]
        }

        /// The STS's counts: every /token request, exchanges per caller `sub`, the log.
        struct STSStats {
            var requests: Int
            var exchanges: [String: Int]
            var log: [[String: Any]]
        }

        func stsStats() throws -> STSStats {
            let obj = (Self.json(try Self.call(stsPort, "GET", "/control/stats")) as? [String: Any]) ?? [:]
            return STSStats(requests: obj["requests"] as? Int ?? -1, exchanges: obj["exchanges"] as? [String: Int] ?? [:],
                            log: obj["log"] as? [[String: Any]] ?? [])
        }

        func jwksFetches() throws -> Int { try idpControl("stats")["jwks_fetches"] as? Int ?? -1 }

        /// What the origin saw: every request (path, status, sub, jti, headers) and how many carried a caller's own token.
        struct OriginLog {
            var requests: [[String: Any]]
            var callerTokensSeen: Int
            var bySub: [String: Int]

            /// Every header value the origin received, joined.
            var allHeaderText: String {
                requests.flatMap { ($0["headers"] as? [[String]]) ?? [] }.map { $0.joined(separator: ": ") }.joined(separator: "\n")
            }
        }

        func originLog() throws -> OriginLog {
            let obj = (Self.json(try Self.call(originPort, "GET", "/control/log")) as? [String: Any]) ?? [:]
            return OriginLog(requests: obj["requests"] as? [[String: Any]] ?? [], callerTokensSeen: obj["caller_tokens_seen"] as? Int ?? -1,
                             bySub: obj["by_sub"] as? [String: Int] ?? [:])
        }

        func revokeAtOrigin(sub: String) throws {
            _ = try Self.call(originPort, "POST", "/control/revoke?sub=\(sub)")
        }

        /// The `caller_jwt:` block (flow style) validating callers of this IdP.
        var callerJWT: String { "{ issuer: \"\(issuer)\", jwks_url: \"\(jwksURL)\", audience: bearerd }" }
    }

    // MARK: - bearerd

    /// The real binary with a listener and an admin listener. Owns the process and its directory.
    final class Proxy {
        let bearerd: RunningBearerd
        let port: UInt16
        let admin: UInt16

        /// `sessions` and `routes` are the YAML bodies (indented by 2) of those blocks.
        init(sessions: String, routes: String) throws {
            port = try RunningBearerd.freePort()
            admin = try RunningBearerd.freePort()
            let dir = try RunningBearerd.tempDir("obo")
            bearerd = try RunningBearerd(config: """
                listen: 127.0.0.1:\(port)
                admin: 127.0.0.1:\(admin)
                sessions:
                \(sessions)
                routes:
                \(routes)
                """, dir: dir)
            let deadline = Date().addingTimeInterval(10)
            while (try? TestClient.get(port: port, path: "/warm")) == nil {
                guard bearerd.process.isRunning, Date() < deadline else {
                    _ = bearerd.stop()
                    throw Failure(description: "bearerd did not serve: \(bearerd.logs)")
                }
                Thread.sleep(forTimeInterval: 0.05)
            }
        }

        func stop() { _ = bearerd.stop() }

        func get(_ path: String, bearer: String?) throws -> TestClient.Response {
            try TestClient.get(port: port, path: path, headers: bearer.map { [("Authorization", "Bearer \($0)")] } ?? [])
        }

        var pid: Int32 { bearerd.process.processIdentifier }

        /// VmRSS of the bearerd process, in bytes.
        func rss() throws -> Int {
            let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
            guard let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
                  let kib = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") else {
                throw Failure(description: "no VmRSS for \(pid)")
            }
            return kib * 1024
        }

        func metrics() throws -> PrometheusParser {
            try PrometheusParser.parse(try TestClient.get(port: admin, path: "/metrics").bodyText)
        }
    }

    /// The sum of the samples of `name` whose labels include `labels` (0 when there are none).
    static func sum(_ m: PrometheusParser, _ name: String, _ labels: [String: String]) -> Double {
        m.samples(name, labels).reduce(0) { $0 + $1.value }
    }

    static func json(_ r: TestClient.Response) -> [String: Any] {
        (try? JSONSerialization.jsonObject(with: Data(r.body)) as? [String: Any]) ?? [:]
    }

    /// The token exchange session `caller` (client_secret_basic) and a route /api/ to the origin.
    static func exchangeSession(_ peers: Peers, maxEntries: Int = 100, callerJWT: Bool = false) -> String {
        """
          caller:
            grant: token_exchange
            token_url: \(peers.tokenURL)
            client_id: sidecar
            client_secret: sidecar-secret
            subject: caller
            audience: https://orders.internal
            caller_cache: { max_entries: \(maxEntries) }
        """ + (callerJWT ? "\n    caller_jwt: \(peers.callerJWT)" : "")
    }

    static func apiRoute(_ peers: Peers, session: String = "caller") -> String {
        "  - { match: /api/, upstream: \"\(peers.upstream)\", session: \(session) }"
    }

    /// A signature part of a JWT: unique to that token, and what must never reach the origin.
    static func signature(_ token: String) -> String { String(token.split(separator: ".", omittingEmptySubsequences: false).last ?? "") }

    // MARK: - Load helpers

    final class Results: @unchecked Sendable {  // @unchecked: guarded by `lock`
        let lock = NSLock()
        var wrong: [String] = []
        var jtis: [String: Set<String>] = [:]
        var count = 0
        var next = 0
    }

    /// Sends `jobs` (path, caller sub, caller token) from `workers` threads, each on its own
    /// keep-alive connection (reopened if bearerd closes it), and checks that every answer is
    /// 200 with the sub of the caller who sent it and the path sent.
    static func run(_ jobs: [(path: String, sub: String, token: String)], port: UInt16, workers: Int) -> Results {
        let results = Results()
        let group = DispatchGroup()
        for _ in 0..<workers {
            group.enter()
            Thread {
                defer { group.leave() }
                var client: TestClient?
                while true {
                    let i: Int = results.lock.withLock { defer { results.next += 1 }; return results.next }
                    if i >= jobs.count { return }
                    let job = jobs[i]
                    var verdict: String?
                    for attempt in 0..<2 {
                        do {
                            if client == nil || client?.sawEOF == true { client = try TestClient(port: port) }
                            try client!.send("GET \(job.path) HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer \(job.token)\r\n\r\n")
                            let r = try client!.readResponse()
                            if r["Connection"]?.lowercased() == "close" { client = nil }
                            let body = json(r)
                            if r.status != 200 {
                                verdict = "\(job.path) as \(job.sub): \(r.status) \(r.bodyText.prefix(200))"
                            } else if body["sub"] as? String != job.sub || body["path"] as? String != job.path {
                                verdict = "\(job.path) as \(job.sub): answered for \(body["sub"] ?? "nil") at \(body["path"] ?? "nil")"
                            } else {
                                verdict = nil
                                results.lock.withLock { results.jtis[job.sub, default: []].insert(body["jti"] as? String ?? "") }
                            }
                            break
                        } catch {
                            client = nil
                            verdict = "\(job.path) as \(job.sub): \(error)"
                            if attempt == 1 { break }
                        }
                    }
                    results.lock.withLock {
                        results.count += 1
                        if let verdict { results.wrong.append(verdict) }
                    }
                }
            }.start()
        }
        group.wait()
        return results
    }

    // MARK: - Tests

    /// Two callers interleaved in random order, 200 requests from 8 concurrent keep-alive
    /// connections (each connection carries both callers), then one batch of streams of both
    /// callers on one h2c connection: every answer carries the identity of the caller who sent it,
    /// each caller's requests all use one exchanged token of their own (one exchange each), and no
    /// caller token reaches the upstream. A cache shared across callers (or keyed by session or by
    /// connection) fails the identity check.
    @Test func twoCallersInterleavedUnderLoadKeepTheirOwnIdentity() throws {
        let peers = try Peers()
        defer { peers.stop() }
        let b = try Proxy(sessions: Self.exchangeSession(peers), routes: Self.apiRoute(peers))
        defer { b.stop() }
        let alice = try peers.mint("alice"), bob = try peers.mint("bob")
        var jobs: [(path: String, sub: String, token: String)] = (0..<200).map { i in
            i % 2 == 0 ? ("/api/req/\(i)", "alice", alice) : ("/api/req/\(i)", "bob", bob)
        }
        jobs.shuffle()
        let results = Self.run(jobs, port: b.port, workers: 8)
        #expect(results.count == 200)
        #expect(results.wrong.isEmpty, "\(results.wrong.count) wrong: \(results.wrong.prefix(5)) \(b.bearerd.logs.suffix(2000))")
        // One exchanged token per caller, and never the other's.
        #expect(results.jtis["alice"]?.count == 1 && results.jtis["bob"]?.count == 1, "\(results.jtis)")
        #expect(results.jtis["alice"]?.isDisjoint(with: results.jtis["bob"] ?? []) == true)
        let stats = try peers.stsStats()
        #expect(stats.exchanges == ["alice": 1, "bob": 1], "\(stats.exchanges)")
        #expect(stats.log.allSatisfy { $0["auth"] as? String == "client_secret_basic" && ($0["audience"] as? [String]) == ["https://orders.internal"]
                                        && $0["subject_token_type"] as? String == "urn:ietf:params:oauth:token-type:access_token" },
                "\(stats.log)")

        // One h2c batch: 16 streams of both callers at once on one connection.
        let h2Paths = (0..<16).map { "/api/h2/\($0)" }
        let h2Callers = (0..<16).map { $0 % 3 == 0 ? ("alice", alice) : ("bob", bob) }
        var args = ["--port", "\(b.port)"]
        for (i, p) in h2Paths.enumerated() { args += ["--path", p, "--bearer", h2Callers[i].1] }
        let out = try PythonFixture.runClient(script: "h2c_client.py", arguments: args)
        let h2 = (try JSONSerialization.jsonObject(with: Data(out.utf8)) as? [String: Any])?["responses"] as? [[String: Any]] ?? []
        #expect(h2.count == 16, "\(out)")
        for (i, r) in h2.enumerated() {
            let body = (try? JSONSerialization.jsonObject(with: Data((r["body"] as? String ?? "").utf8))) as? [String: Any] ?? [:]
            #expect(r["status"] as? Int == 200 && body["sub"] as? String == h2Callers[i].0 && body["path"] as? String == h2Paths[i],
                    "h2 stream \(i): \(r)")
        }
        #expect(try peers.stsStats().exchanges == ["alice": 1, "bob": 1], "h2c re-exchanged")

        let log = try peers.originLog()
        #expect(log.callerTokensSeen == 0, "a caller's own token reached the origin")
        let seen = log.allHeaderText
        #expect(!seen.contains(Self.signature(alice)) && !seen.contains(Self.signature(bob)), "a caller token reached the origin")
        #expect(log.bySub["alice", default: 0] + log.bySub["bob", default: 0] == 216, "\(log.bySub)")
        #expect(!b.bearerd.logs.contains(Self.signature(alice)), "a caller token was logged")

        let m = try b.metrics()
        #expect(Self.sum(m, "bearerd_caller_exchanges_total", ["session": "caller", "outcome": "ok"]) == 2)
        #expect(Self.sum(m, "bearerd_caller_cache_entries", ["session": "caller"]) == 2)
        #expect(Self.sum(m, "bearerd_caller_cache_lookups_total", ["session": "caller", "result": "hit"]) >= 200)
    }

    /// 50 concurrent first requests of one caller while the STS answers slowly: exactly one
    /// exchange; every request answered with that caller's identity.
    @Test func concurrentFirstRequestsOfOneCallerShareOneExchange() throws {
        let peers = try Peers()
        defer { peers.stop() }
        let b = try Proxy(sessions: Self.exchangeSession(peers), routes: Self.apiRoute(peers))
        defer { b.stop() }
        try peers.stsControl("delay?seconds=1")
        let carol = try peers.mint("carol")
        // All 50 connect first, then send together.
        final class Box: @unchecked Sendable { let lock = NSLock(); var answers: [(Int, String?)] = [] }  // @unchecked: guarded by `lock`
        let box = Box()
        let start = DispatchSemaphore(value: 0), connected = DispatchSemaphore(value: 0), group = DispatchGroup()
        let port = b.port
        for i in 0..<50 {
            group.enter()
            Thread {
                defer { group.leave() }
                let c = try? TestClient(port: port, timeout: 20)
                connected.signal()
                start.wait()
                let r = try? { () throws -> TestClient.Response in
                    guard let c else { throw Failure(description: "connect") }
                    try c.send("GET /api/first/\(i) HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer \(carol)\r\nConnection: close\r\n\r\n")
                    return try c.readResponse()
                }()
                box.lock.withLock { box.answers.append((r?.status ?? 0, r.flatMap { Self.json($0)["sub"] as? String })) }
            }.start()
        }
        for _ in 0..<50 { connected.wait() }
        for _ in 0..<50 { start.signal() }
        #expect(group.wait(timeout: .now() + 60) == .success)
        #expect(box.answers.count == 50)
        #expect(box.answers.allSatisfy { $0.0 == 200 && $0.1 == "carol" }, "\(box.answers.filter { $0.0 != 200 || $0.1 != "carol" }.prefix(5))")
        let stats = try peers.stsStats()
        #expect(stats.requests == 1, "\(stats.requests) token requests for one caller")
        #expect(stats.exchanges == ["carol": 1])
        let m = try b.metrics()
        #expect(Self.sum(m, "bearerd_caller_exchanges_total", ["session": "caller", "outcome": "ok"]) == 1)
        #expect(Self.sum(m, "bearerd_caller_cache_lookups_total", ["session": "caller", "result": "miss"]) == 1)
        #expect(Self.sum(m, "bearerd_caller_cache_lookups_total", ["session": "caller", "result": "coalesced"])
                + Self.sum(m, "bearerd_caller_cache_lookups_total", ["session": "caller", "result": "hit"]) == 49)
    }

    /// 1,000 distinct callers through a cache of 100 entries, with ~1 KiB caller tokens and
    /// ~10.7 KiB exchanged tokens (an 8,000-character claim), so an unbounded cache would hold
    /// ~10.5 MiB more: bearerd's RSS grows less than 6 MiB (the cache's ceiling is 100 entries ×
    /// ~10.9 KiB ≈ 1.1 MiB; the rest is allocator and connection slack), the cache holds at
    /// most 100, and an early (evicted) caller re-exchanges while the most recent one is still
    /// served from the cache.
    @Test func thousandCallersStayWithinTheCacheBound() throws {
        let peers = try Peers()
        defer { peers.stop() }
        let b = try Proxy(sessions: Self.exchangeSession(peers, maxEntries: 100), routes: Self.apiRoute(peers))
        defer { b.stop() }
        try peers.stsControl("pad?bytes=8000")
        let warm = try peers.mintMany(prefix: "w", count: 200, pad: 340)
        let callers = try peers.mintMany(prefix: "u", count: 1000, pad: 340)
        #expect(callers.count == 1000 && callers.allSatisfy { $0.utf8.count >= 1000 }, "caller tokens of ~1 KiB: \(callers.first?.utf8.count ?? 0)")
        // Fill the cache and warm the allocator and connections before the baseline.
        let warmResults = Self.run(warm.enumerated().map { ("/api/warm/\($0.offset)", "w\($0.offset)", $0.element) }, port: b.port, workers: 8)
        #expect(warmResults.wrong.isEmpty, "\(warmResults.wrong.prefix(3))")
        let before = try b.rss()
        let results = Self.run(callers.enumerated().map { ("/api/u/\($0.offset)", "u\($0.offset)", $0.element) }, port: b.port, workers: 8)
        #expect(results.count == 1000)
        #expect(results.wrong.isEmpty, "\(results.wrong.count) wrong: \(results.wrong.prefix(3))")
        let after = try b.rss()
        let growth = after - before
        #expect(growth < 6 << 20, "RSS grew \(growth / 1024) KiB (from \(before / 1024) KiB) over 1,000 callers with max_entries 100")
        let m = try b.metrics()
        #expect(Self.sum(m, "bearerd_caller_cache_entries", ["session": "caller"]) <= 100)
        #expect(Self.sum(m, "bearerd_caller_cache_evictions_total", ["session": "caller"]) >= 1100)
        var stats = try peers.stsStats()
        #expect(stats.exchanges["u0"] == 1 && stats.exchanges["u999"] == 1)
        // u999 was the last: still cached. u0 was evicted long ago: exchanged again.
        let last = try b.get("/api/again", bearer: callers[999])
        #expect(last.status == 200 && Self.json(last)["sub"] as? String == "u999")
        let first = try b.get("/api/again", bearer: callers[0])
        #expect(first.status == 200 && Self.json(first)["sub"] as? String == "u0")
        stats = try peers.stsStats()
        #expect(stats.exchanges["u999"] == 1, "a cached caller re-exchanged")
        #expect(stats.exchanges["u0"] == 2, "an evicted caller was served without a new exchange")
        let log = try peers.originLog()
        #expect(log.callerTokensSeen == 0)
    }

    /// With `caller_jwt`: a forged or foreign caller token is a 401 naming the reason class, and
    /// nothing reaches the STS or the upstream; no token at all is `caller_token_required`; a valid
    /// caller still passes (so the refusals are not a blanket refusal).
    @Test func forgedOrForeignCallersAreRefusedBeforeAnyExchange() throws {
        let peers = try Peers()
        defer { peers.stop() }
        let b = try Proxy(sessions: Self.exchangeSession(peers, callerJWT: true), routes: Self.apiRoute(peers))
        defer { b.stop() }
        let none = try b.get("/api/x", bearer: nil)
        #expect(none.status == 401, "\(none.bodyText)")
        #expect(none["WWW-Authenticate"]?.hasPrefix("Bearer realm=\"bearerd\"") == true, "\(none["WWW-Authenticate"] ?? "none")")
        #expect(Self.json(none)["error"] as? String == "caller_token_required", "\(none.bodyText)")
        let cases: [(String, String, String)] = [
            ("bad signature", "forge=bad_signature", "caller_jwt.bad_signature"),
            ("wrong issuer", "iss=https://login.evil.example/", "caller_jwt.wrong_issuer"),
            ("wrong audience", "aud=orders", "caller_jwt.wrong_audience"),
            ("expired", "exp_in=-600", "caller_jwt.expired"),
            ("alg none", "forge=none", "caller_jwt.unsupported_algorithm"),
            ("HS256 keyed with the public key", "forge=hs256", "caller_jwt.unsupported_algorithm"),
        ]
        for (name, query, reason) in cases {
            let token = try peers.mint("mallory", query)
            let r = try b.get("/api/x", bearer: token)
            #expect(r.status == 401, "\(name): \(r.status) \(r.bodyText)")
            let challenge = r["WWW-Authenticate"] ?? ""
            #expect(challenge.hasPrefix("Bearer realm=\"bearerd\"") && challenge.contains("error=\"invalid_token\"")
                    && challenge.contains("error_description="), "\(name): \(challenge)")
            let body = Self.json(r)
            #expect(body["error"] as? String == "invalid_token" && body["reason"] as? String == reason, "\(name): \(r.bodyText)")
            #expect(!b.bearerd.logs.contains(Self.signature(token)), "\(name): the token was logged")
        }
        let stats = try peers.stsStats()
        #expect(stats.requests == 0, "a refused caller was exchanged: \(stats.log)")
        #expect(try peers.originLog().requests.isEmpty, "a refused caller reached the upstream")
        let good = try b.get("/api/x", bearer: try peers.mint("alice"))
        #expect(good.status == 200 && Self.json(good)["sub"] as? String == "alice", "\(good.status) \(good.bodyText)")
        #expect(try peers.stsStats().exchanges == ["alice": 1])
        let m = try b.metrics()
        #expect(Self.sum(m, "bearerd_caller_rejections_total", ["session": "caller", "reason": "caller_token_required"]) == 1)
        #expect(Self.sum(m, "bearerd_caller_rejections_total", ["session": "caller", "reason": "caller_jwt.unsupported_algorithm"]) == 2)
        #expect(Self.sum(m, "bearerd_caller_rejections_total", ["session": "caller", "reason": "caller_jwt.bad_signature"]) == 1)
    }

    /// The caller's IdP rotates its key: bearerd fetched the JWKS at start; the first token with
    /// the new `kid` triggers exactly one re-fetch (also under 10 concurrent requests) and is
    /// served; an unknown `kid` within the next 30 s triggers no further fetch. (bearerd counts
    /// its start-up fetch toward the 30 s, so the rotation comes 31 s after it.)
    @Test func keyRotationAtTheCallersIdPRefetchesOnce() throws {
        let peers = try Peers()
        defer { peers.stop() }
        let b = try Proxy(sessions: Self.exchangeSession(peers, callerJWT: true), routes: Self.apiRoute(peers))
        defer { b.stop() }
        _ = TokenSinkTests.wait(seconds: 5) { (try? peers.jwksFetches()) == 1 }
        let fetchedAt = Date()
        #expect(try peers.jwksFetches() == 1, "the JWKS was not fetched once at start")
        let old = try peers.mint("alice")
        #expect(try b.get("/api/x", bearer: old).status == 200)
        #expect(try peers.jwksFetches() == 1, "a known kid re-fetched the JWKS")
        Thread.sleep(until: fetchedAt.addingTimeInterval(31))
        #expect(try peers.jwksFetches() == 1, "fetched again without a reason")
        let kid = try peers.idpControl("rotate")["kid"] as? String
        #expect(kid == "k2")
        let fresh = try peers.mint("bob")
        let results = Self.run((0..<10).map { ("/api/rot/\($0)", "bob", fresh) }, port: b.port, workers: 10)
        #expect(results.wrong.isEmpty, "\(results.wrong.prefix(3))")
        #expect(try peers.jwksFetches() == 2, "rotation: not exactly one JWKS re-fetch")
        // The old key still published and the old token still good, without a fetch.
        #expect(try b.get("/api/x", bearer: old).status == 200)
        let stranger = try b.get("/api/x", bearer: try peers.mint("mallory", "forge=unknown_kid"))
        #expect(stranger.status == 401 && Self.json(stranger)["reason"] as? String == "caller_jwt.unknown_key", "\(stranger.bodyText)")
        #expect(try peers.jwksFetches() == 2, "an unknown kid re-fetched within 30 s")
        #expect(try peers.stsStats().exchanges == ["alice": 1, "bob": 1])
    }

    /// The STS refuses a caller (`invalid_grant`, then another with `invalid_request`): 401 with
    /// that error, remembered 5 s (no second call), asked again after; an STS outage is a 503
    /// `token_unavailable` with Retry-After, and the caller is served once the STS is back.
    @Test func stsRefusalIsTheCallersAndAnOutageIsA503() throws {
        let peers = try Peers()
        defer { peers.stop() }
        let b = try Proxy(sessions: Self.exchangeSession(peers), routes: Self.apiRoute(peers))
        defer { b.stop() }
        try peers.stsControl("refuse?sub=dave&error=invalid_grant")
        try peers.stsControl("refuse?sub=erin&error=invalid_request")
        let dave = try peers.mint("dave"), erin = try peers.mint("erin")
        for (token, error) in [(dave, "invalid_grant"), (erin, "invalid_request")] {
            for attempt in 0..<3 {
                let r = try b.get("/api/x", bearer: token)
                #expect(r.status == 401, "\(error) #\(attempt): \(r.status) \(r.bodyText)")
                #expect(r["WWW-Authenticate"]?.contains("error=\"invalid_token\"") == true, "\(r["WWW-Authenticate"] ?? "none")")
                #expect(Self.json(r)["error"] as? String == error, "\(r.bodyText)")
            }
        }
        var stats = try peers.stsStats()
        #expect(stats.requests == 2, "a refused caller was asked for again within 5 s: \(stats.log)")
        #expect(try peers.originLog().requests.isEmpty)
        // After the 5 s, and now accepted by the STS: asked again and served.
        try peers.stsControl("refuse?sub=dave&on=0")
        Thread.sleep(forTimeInterval: 5.5)
        let back = try b.get("/api/x", bearer: dave)
        #expect(back.status == 200 && Self.json(back)["sub"] as? String == "dave", "\(back.status) \(back.bodyText)")
        stats = try peers.stsStats()
        #expect(stats.requests == 3)

        try peers.stsControl("outage?on=1")
        let frank = try peers.mint("frank")
        let down = try b.get("/api/x", bearer: frank)
        #expect(down.status == 503, "\(down.status) \(down.bodyText)")
        #expect(down["Retry-After"] != nil)
        #expect(Self.json(down)["error"] as? String == "token_unavailable", "\(down.bodyText)")
        try peers.stsControl("outage?on=0")
        var served: TestClient.Response?
        _ = TokenSinkTests.wait(seconds: 10) {
            served = try? b.get("/api/x", bearer: frank)
            return served?.status == 200
        }
        #expect(served?.status == 200 && served.flatMap { Self.json($0)["sub"] as? String } == "frank", "\(served?.bodyText ?? "nil")")
        let m = try b.metrics()
        #expect(Self.sum(m, "bearerd_caller_exchanges_total", ["session": "caller", "outcome": "refused"]) == 2)
        #expect(Self.sum(m, "bearerd_caller_exchanges_total", ["session": "caller", "outcome": "failed"]) >= 1)
        #expect(Self.sum(m, "bearerd_caller_rejections_total", ["session": "caller", "reason": "sts_refused"]) == 6)
        #expect(Self.sum(m, "bearerd_caller_cache_lookups_total", ["session": "caller", "result": "refused"]) == 4)
    }

    /// An exchanged token (valid 300 s) is not used past the caller's own JWT `exp` (3 s): after
    /// it (and the STS's 5 s leeway) the same caller token is not served from the cache; the STS,
    /// if asked, refuses the expired caller, and the client gets 401.
    @Test func anExchangedTokenDoesNotOutliveTheCallersToken() throws {
        let peers = try Peers()
        defer { peers.stop() }
        let b = try Proxy(sessions: Self.exchangeSession(peers), routes: Self.apiRoute(peers))
        defer { b.stop() }
        let short = try peers.mint("kate", "exp_in=3")
        let first = try b.get("/api/e", bearer: short)
        #expect(first.status == 200 && Self.json(first)["sub"] as? String == "kate", "\(first.status) \(first.bodyText)")
        let again = try b.get("/api/e", bearer: short)
        #expect(again.status == 200 && Self.json(again)["jti"] as? String == Self.json(first)["jti"] as? String, "cached while valid")
        Thread.sleep(forTimeInterval: 10)
        let late = try b.get("/api/e", bearer: short)
        #expect(late.status == 401, "served after the caller's token expired: \(late.status) \(late.bodyText)")
        #expect(try peers.originLog().requests.count == 2, "the upstream got a request after the caller's token expired")
        #expect(try peers.stsStats().exchanges == ["kate": 1])
    }

    /// The upstream revokes a caller's exchanged token: bearerd re-exchanges once and replays
    /// once, the client sees 200 with the new token; the next request uses it without another exchange.
    @Test func upstreamRevocationReExchangesOnceAndReplays() throws {
        let peers = try Peers()
        defer { peers.stop() }
        let b = try Proxy(sessions: Self.exchangeSession(peers), routes: Self.apiRoute(peers))
        defer { b.stop() }
        let gina = try peers.mint("gina")
        let first = try b.get("/api/r", bearer: gina)
        #expect(first.status == 200)
        let jti1 = Self.json(first)["jti"] as? String
        try peers.revokeAtOrigin(sub: "gina")
        let second = try b.get("/api/r", bearer: gina)
        #expect(second.status == 200, "\(second.status) \(second.bodyText)")
        let jti2 = Self.json(second)["jti"] as? String
        #expect(jti2 != nil && jti2 != jti1)
        #expect(try peers.stsStats().exchanges == ["gina": 2])
        let statuses = try peers.originLog().requests.map { $0["status"] as? Int ?? 0 }
        #expect(statuses == [200, 401, 200], "\(statuses)")
        let third = try b.get("/api/r", bearer: gina)
        #expect(third.status == 200 && Self.json(third)["jti"] as? String == jti2)
        #expect(try peers.stsStats().exchanges == ["gina": 2])
    }

    /// Entra-style on-behalf-of: `grant: jwt_bearer` with `assertion: caller` and
    /// `requested_token_use=on_behalf_of`, client_secret_post: the caller's token is the
    /// assertion, the upstream sees the caller's identity and never the caller's token.
    @Test func jwtBearerOnBehalfOf() throws {
        let peers = try Peers()
        defer { peers.stop() }
        let b = try Proxy(sessions: """
              obo:
                grant: jwt_bearer
                token_url: \(peers.tokenURL)
                client_id: sidecar
                client_secret: sidecar-secret
                client_auth: client_secret_post
                assertion: caller
                scope: orders.read
                params: { requested_token_use: on_behalf_of }
            """, routes: Self.apiRoute(peers, session: "obo"))
        defer { b.stop() }
        let harry = try peers.mint("harry"), ivy = try peers.mint("ivy")
        for (sub, token) in [("harry", harry), ("ivy", ivy), ("harry", harry)] {
            let r = try b.get("/api/obo", bearer: token)
            #expect(r.status == 200 && Self.json(r)["sub"] as? String == sub, "\(r.status) \(r.bodyText)")
            #expect((Self.json(r)["act"] as? [String: Any])?["sub"] as? String == "sidecar")
        }
        let stats = try peers.stsStats()
        #expect(stats.exchanges == ["harry": 1, "ivy": 1], "\(stats.log)")
        #expect(stats.log.allSatisfy { $0["grant"] as? String == "urn:ietf:params:oauth:grant-type:jwt-bearer"
                                        && $0["requested_token_use"] as? String == "on_behalf_of"
                                        && $0["auth"] as? String == "client_secret_post" && $0["scope"] as? String == "orders.read" },
                "\(stats.log)")
        let log = try peers.originLog()
        #expect(log.callerTokensSeen == 0)
        #expect(!log.allHeaderText.contains(Self.signature(harry)))
        #expect(try b.get("/api/obo", bearer: nil).status == 401)
        #expect(try peers.stsStats().requests == 2)
    }

    /// `caller_jwt` on a route with an ordinary client_credentials session: a valid caller gets
    /// through and the upstream sees the SERVICE token (not the caller's); an invalid caller or
    /// none gets 401 and nothing reaches the upstream.
    @Test func routeLevelCallerJWTGuardsAServiceToken() throws {
        let peers = try Peers()
        defer { peers.stop() }
        let b = try Proxy(sessions: """
              svc:
                grant: client_credentials
                token_url: \(peers.tokenURL)
                client_id: svc
                client_secret: svc-secret
            """, routes: """
              - match: /guarded/
                upstream: "\(peers.upstream)"
                session: svc
                caller_jwt: \(peers.callerJWT)
            """)
        defer { b.stop() }
        let alice = try peers.mint("alice")
        let ok = try b.get("/guarded/a", bearer: alice)
        #expect(ok.status == 200 && Self.json(ok)["sub"] as? String == "svc", "\(ok.status) \(ok.bodyText)")
        let forged = try b.get("/guarded/a", bearer: try peers.mint("alice", "forge=bad_signature"))
        #expect(forged.status == 401 && Self.json(forged)["reason"] as? String == "caller_jwt.bad_signature", "\(forged.bodyText)")
        let expired = try b.get("/guarded/a", bearer: try peers.mint("alice", "exp_in=-600"))
        #expect(expired.status == 401 && Self.json(expired)["reason"] as? String == "caller_jwt.expired", "\(expired.bodyText)")
        let none = try b.get("/guarded/a", bearer: nil)
        #expect(none.status == 401 && Self.json(none)["error"] as? String == "caller_token_required", "\(none.bodyText)")
        let log = try peers.originLog()
        #expect(log.requests.count == 1, "a refused caller reached the upstream: \(log.requests.count)")
        #expect(log.callerTokensSeen == 0 && !log.allHeaderText.contains(Self.signature(alice)), "the caller's token reached the upstream")
        // Only the service's own token was ever asked for.
        #expect(try peers.stsStats().log.allSatisfy { $0["grant"] as? String == "client_credentials" })
    }
}
