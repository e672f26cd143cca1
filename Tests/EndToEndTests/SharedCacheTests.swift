import Foundation
import Testing
import BearerdTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// docs/architecture.md §6.13: several bearerd processes (replicas) share one token per session
/// through a real redis-server, against the real Authlib server (which counts token requests).
@Suite("Shared token cache across replicas", .serialized,
       .enabled(if: Prerequisite.runs(AuthServerFixture.isAvailable) && Prerequisite.runs(RedisServer.isAvailable), "\(AuthServerFixture.unavailableReason ?? "redis-server missing")"))
struct SharedCacheTests {
    /// One `bearerd run` process with its own listener, admin port and state_dir.
    final class Replica {
        let port: UInt16
        let admin: UInt16
        let dir: String
        let process = Process()
        let logFile: String

        init(dir: String, sessionYAML: String, redisURL: String, keyFile: String, name: String) throws {
            self.dir = dir + "/" + name
            try FileManager.default.createDirectory(atPath: self.dir + "/state", withIntermediateDirectories: true)
            port = NginxOrigin.freePort()
            admin = NginxOrigin.freePort()
            let config = self.dir + "/bearerd.yaml"
            try """
            listen: [127.0.0.1:\(port)]
            admin: 127.0.0.1:\(admin)
            loops: 1
            state_dir: \(self.dir)/state
            shared_cache:
              url: \(redisURL)
              key_file: \(keyFile)
              prefix: "test:"
            sessions:
            \(sessionYAML)
            routes:
              - match: /
                upstream: API
                session: s
            """.replacingOccurrences(of: "API", with: sessionYAML.components(separatedBy: "#api ").last!.components(separatedBy: "\n").first!)
                .write(toFile: config, atomically: true, encoding: .utf8)
            logFile = self.dir + "/stderr.log"
            FileManager.default.createFile(atPath: logFile, contents: nil)
            process.executableURL = URL(fileURLWithPath: CommandLineTests.binary)
            process.arguments = ["run", "-c", config]
            process.standardError = try FileHandle(forWritingTo: URL(fileURLWithPath: logFile))
            process.standardOutput = FileHandle.nullDevice
            try process.run()
        }

        /// Until the listener accepts (bounded).
        func waitListening() -> Bool {
            for _ in 0..<200 {
                if RedisServer.accepts(port) { return true }
                usleep(25_000)
            }
            return false
        }

        func get(_ path: String) -> Int {
            (try? TestClient.get(port: port, path: path))?.status ?? 0
        }

        func adminGet(_ path: String) -> String {
            guard let r = try? TestClient.get(port: admin, path: path) else { return "" }
            return String(decoding: r.body, as: UTF8.self)
        }

        func kill9() {
            if process.isRunning {
                kill(process.processIdentifier, SIGKILL)
                process.waitUntilExit()
            }
        }

        var log: String { (try? String(contentsOfFile: logFile, encoding: .utf8)) ?? "" }
    }

    static func tempDir() throws -> String {
        let dir = NSTemporaryDirectory() + "bearerd-shared-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        return dir
    }

    static func keyFile(_ dir: String, _ name: String = "key") throws -> String {
        var bytes = [UInt8](repeating: 0, count: 32)
        for i in 0..<32 { bytes[i] = UInt8.random(in: 0...255) }
        let path = dir + "/" + name
        try (Data(bytes).base64EncodedString() + "\n").write(toFile: path, atomically: true, encoding: .utf8)
        return path
    }

    static func clientCredentials(_ auth: AuthServerFixture) -> String {
        """
          s:
            grant: client_credentials
            token_url: \(auth.tokenURL)
            client_id: svc
            client_secret: svc-secret
            #api \(auth.apiURL)
        """
    }

    static func tokenRequests(_ auth: AuthServerFixture) throws -> Int {
        try auth.stats()["token_requests"] as? Int ?? -1
    }

    /// A replica's shared-cache counters for session `s` (-1: the sample is missing).
    struct Counts: CustomStringConvertible {
        var hits = 0, misses = 0, lockWaits = 0, fallbacks = 0, staleLocks = 0, olderRecords = 0
        var description: String {
            "hits \(hits) misses \(misses) lock_waits \(lockWaits) fallbacks \(fallbacks) stale_locks \(staleLocks) older_records \(olderRecords)"
        }
    }

    static func sharedCacheCounts(_ replica: Replica) -> Counts {
        let text = replica.adminGet("/metrics")
        func value(_ family: String) -> Int {
            TokenSinkTests.metric(text, "bearerd_shared_cache_\(family)_total{session=\"s\"}").map { Int($0) } ?? -1
        }
        return Counts(hits: value("hits"), misses: value("misses"), lockWaits: value("lock_waits"), fallbacks: value("fallbacks"),
                      staleLocks: value("stale_locks"), olderRecords: value("older_records"))
    }

    /// The record's Redis key (the one session's), not its lock or rejection mark.
    static func recordKey(_ redis: RedisServer) throws -> String {
        try redis.cli(["KEYS", "test:*"]).split(separator: "\n").map(String.init)
            .first { !$0.hasSuffix(":lock") && !$0.hasSuffix(":rejected") } ?? ""
    }

    /// The refresh token in a replica's state file for session `s`.
    static func stateRefreshToken(_ replica: Replica) -> String {
        guard let data = FileManager.default.contents(atPath: replica.dir + "/state/s.json"),
              let object = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] else { return "" }
        return object["refresh_token"] as? String ?? ""
    }

    static func refreshTokenSession(_ auth: AuthServerFixture, seedFile: String, extra: String = "") -> String {
        """
          s:
            grant: refresh_token
            token_url: \(auth.tokenURL)
            client_id: cli
            client_auth: none
            refresh_token_file: \(seedFile)
            request_timeout: 2s\(extra)
            #api \(auth.apiURL)
        """
    }

    /// Runs `count` GETs at once (threads), returns the statuses.
    static func concurrently(_ count: Int, _ body: @escaping @Sendable (Int) -> Int) -> [Int] {
        final class Box: @unchecked Sendable {  // @unchecked: guarded by `lock`
            let lock = NSLock()
            var statuses: [Int] = []
        }
        let box = Box()
        let group = DispatchGroup()
        for i in 0..<count {
            DispatchQueue.global().async(group: group) {
                let s = body(i)
                box.lock.withLock { box.statuses.append(s) }
            }
        }
        _ = group.wait(timeout: .now() + 120)
        return box.lock.withLock { box.statuses }
    }

    @Test func fiveReplicasTwoHundredRequestsEachOneTokenRequest() throws {
        let redis = try RedisServer()
        let auth = try AuthServerFixture.start(tokenLifetime: 3600)
        defer { auth.stop() }
        let dir = try Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let key = try Self.keyFile(dir)
        let replicas = try (0..<5).map { try Replica(dir: dir, sessionYAML: Self.clientCredentials(auth), redisURL: redis.url, keyFile: key, name: "r\($0)") }
        defer { replicas.forEach { $0.kill9() } }
        for r in replicas { #expect(r.waitListening()) }
        let statuses = Self.concurrently(1000) { i in replicas[i % 5].get("/api/x\(i)") }
        #expect(statuses.count == 1000)
        #expect(statuses.allSatisfy { $0 == 200 }, "\(Dictionary(grouping: statuses, by: { $0 }).mapValues(\.count))")
        #expect(try Self.tokenRequests(auth) == 1, "one token request across five replicas")
        // The record is sealed: no token in Redis, and its key shows no session name or URL.
        let keys = try redis.cli(["KEYS", "test:*"])
        #expect(!keys.isEmpty && !keys.contains("svc") && !keys.contains("s:"))
        // One replica fetched under the lock; the four others adopted its record (at once or
        // after waiting for the lock); nobody fell back to a fetch of its own.
        let counts = replicas.map { Self.sharedCacheCounts($0) }
        #expect(counts.map(\.misses).reduce(0, +) == 1, "\(counts)")
        #expect(counts.map { $0.hits + $0.lockWaits }.reduce(0, +) == 4, "\(counts)")
        #expect(counts.map(\.fallbacks).reduce(0, +) == 0, "\(counts)")
        for r in replicas { #expect(!r.log.contains("svc-secret")) }
        #expect(replicas.filter { $0.log.contains("token adopted from the shared cache") }.count == 4, "\(replicas.map(\.log))")
    }

    @Test func revocationSeenByOneReplicaRefreshesOnceInTotal() throws {
        let redis = try RedisServer()
        let auth = try AuthServerFixture.start(tokenLifetime: 3600)
        defer { auth.stop() }
        let dir = try Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let key = try Self.keyFile(dir)
        let replicas = try (0..<3).map { try Replica(dir: dir, sessionYAML: Self.clientCredentials(auth), redisURL: redis.url, keyFile: key, name: "r\($0)") }
        defer { replicas.forEach { $0.kill9() } }
        for r in replicas {
            #expect(r.waitListening())
            #expect(r.get("/api/before") == 200)
        }
        #expect(try Self.tokenRequests(auth) == 1)
        try auth.revokeAll()
        // One replica sees the revocation: it refreshes and replays.
        #expect(replicas[0].get("/api/after") == 200)
        #expect(try Self.tokenRequests(auth) == 2)
        // The others, rejected too, adopt the new record: no further token request.
        #expect(replicas[1].get("/api/after") == 200)
        #expect(replicas[2].get("/api/after") == 200)
        #expect(try Self.tokenRequests(auth) == 2, "one refresh in total")
    }

    @Test func redisStoppedMidRunEveryRequestServedAndRecovery() throws {
        let redis = try RedisServer()
        // Short tokens: refreshes keep happening while Redis is away and after it returns.
        let auth = try AuthServerFixture.start(tokenLifetime: 4)
        defer { auth.stop() }
        let dir = try Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let key = try Self.keyFile(dir)
        let replicas = try (0..<2).map { try Replica(dir: dir, sessionYAML: Self.clientCredentials(auth), redisURL: redis.url, keyFile: key, name: "r\($0)") }
        defer { replicas.forEach { $0.kill9() } }
        for r in replicas { #expect(r.waitListening()) }
        func traffic(seconds: Double) -> [Int] {
            var statuses: [Int] = []
            let end = Date().addingTimeInterval(seconds)
            var i = 0
            while Date() < end && i < 10_000 {
                statuses.append(replicas[i % 2].get("/api/\(i)"))
                i += 1
                usleep(20_000)
            }
            return statuses
        }
        var statuses = traffic(seconds: 2)
        redis.stop()
        statuses += traffic(seconds: 6)
        // Degraded while Redis is away, still ready.
        let ready = replicas.map { $0.adminGet("/readyz") }
        #expect(ready.contains { $0.contains("shared_cache_degraded") && $0.contains("\"ready\"") }, "\(ready)")
        try redis.start()
        statuses += traffic(seconds: 8)
        #expect(statuses.allSatisfy { $0 == 200 }, "\(Dictionary(grouping: statuses, by: { $0 }).mapValues(\.count))")
        // Recovered: a record is published again and /readyz is plain ready.
        #expect(try !redis.cli(["KEYS", "test:*"]).isEmpty)
        let after = replicas.map { $0.adminGet("/readyz") }
        #expect(after.allSatisfy { !$0.contains("shared_cache_degraded") }, "\(after)")
        #expect(replicas.contains { $0.log.contains("shared cache unavailable") })
        #expect(replicas.contains { $0.log.contains("shared cache answers again") })
        // Each replica refreshed while Redis was away (4 s tokens, 6 s away): local fetches,
        // counted as fallbacks; after it returned, fetches went through the lock again. Every
        // fetch under the lock or as a fallback is one token request.
        let counts = replicas.map { Self.sharedCacheCounts($0) }
        #expect(counts.allSatisfy { $0.fallbacks >= 1 }, "\(counts)")
        #expect(counts.map(\.misses).reduce(0, +) >= 1, "\(counts)")
        #expect(counts.map { $0.misses + $0.fallbacks }.reduce(0, +) <= (try Self.tokenRequests(auth)), "\(counts)")
    }

    @Test func recordWrittenWithAnotherKeyIsIgnoredAndOverwritten() throws {
        let redis = try RedisServer()
        let auth = try AuthServerFixture.start(tokenLifetime: 3600)
        defer { auth.stop() }
        let dir = try Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let first = try Replica(dir: dir, sessionYAML: Self.clientCredentials(auth), redisURL: redis.url, keyFile: try Self.keyFile(dir, "k1"), name: "a")
        #expect(first.waitListening())
        #expect(first.get("/api/a") == 200)
        first.kill9()
        let before = try redis.cli(["KEYS", "test:*"])
        #expect(!before.isEmpty)
        let recordKey = before.split(separator: "\n").map(String.init).first { !$0.contains(":lock") && !$0.contains(":rejected") } ?? ""
        let sealedBefore = try redis.cli(["GET", recordKey])
        // Another key: the record does not open; this replica fetches its own token and overwrites it.
        let second = try Replica(dir: dir, sessionYAML: Self.clientCredentials(auth), redisURL: redis.url, keyFile: try Self.keyFile(dir, "k2"), name: "b")
        defer { second.kill9() }
        #expect(second.waitListening())
        #expect(second.get("/api/b") == 200)
        #expect(try Self.tokenRequests(auth) == 2)
        #expect(second.log.contains("does not open with key_file"))
        var overwritten = false
        for _ in 0..<100 where !overwritten {
            overwritten = try redis.cli(["GET", recordKey]) != sealedBefore
            if !overwritten { usleep(20_000) }
        }
        #expect(overwritten)
    }

    @Test func refreshTokenRotationAcrossReplicasWithTheLockHolderKilled() throws {
        let redis = try RedisServer()
        let auth = try AuthServerFixture.start(tokenLifetime: 3600, rotateRefreshTokens: true, graceSeconds: 0)
        defer { auth.stop() }
        let dir = try Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let key = try Self.keyFile(dir)
        let seed = try auth.issueRefreshToken(clientID: "cli", user: "alice")
        try (seed + "\n").write(toFile: dir + "/seed", atomically: true, encoding: .utf8)
        let yaml = """
          s:
            grant: refresh_token
            token_url: \(auth.tokenURL)
            client_id: cli
            client_auth: none
            refresh_token_file: \(dir)/seed
            request_timeout: 2s
            #api \(auth.apiURL)
        """
        let replicas = try (0..<3).map { try Replica(dir: dir, sessionYAML: yaml, redisURL: redis.url, keyFile: key, name: "r\($0)") }
        defer { replicas.forEach { $0.kill9() } }
        for r in replicas {
            #expect(r.waitListening())
            #expect(r.get("/api/start") == 200)
        }
        // One rotation at start, shared: the others adopted it instead of presenting the used seed.
        #expect(try Self.tokenRequests(auth) == 1)
        try auth.revokeAll()
        // The next refresh hangs at the token endpoint (a 503 after 3 s: the refresh token is not consumed)…
        try auth.failNextTokenRequests(count: 1, status: 503, delay: 3)
        let holder = replicas[0]
        let pending = Thread { _ = holder.get("/api/holder") }
        pending.start()
        // …and its lock holder dies mid-refresh.
        var locked = false
        for _ in 0..<200 where !locked {
            locked = try redis.cli(["KEYS", "test:*:lock"]).contains(":lock")
            if !locked { usleep(10_000) }
        }
        #expect(locked, "the holder took the lock")
        holder.kill9()
        // The survivors are rejected too; they wait for the lock to expire, one rotates, both serve.
        let statuses = Self.concurrently(20) { i in replicas[1 + i % 2].get("/api/after\(i)") }
        #expect(statuses.allSatisfy { $0 == 200 }, "\(statuses)")
        let stats = try auth.stats()
        let errors = stats["token_errors"] as? [String: Any] ?? [:]
        #expect(errors["invalid_grant"] == nil, "a used refresh token was presented: \(stats)")
        #expect(stats["grace_replays"] as? Int == 0)
        #expect((stats["by_grant"] as? [String: Any])?["refresh_token"] as? Int == 3, "start, the killed holder's, one rotation: \(stats)")
        for r in replicas { #expect(!r.log.contains(seed)) }
    }

    /// Issue 31 (7): an old sealed record put back in Redis opens (its additional data is only
    /// the key) and carries a refresh token the server has rotated since. Adopting it would make
    /// the replica present a used refresh token (reuse detection revokes the whole lineage).
    /// Records carry a generation that only goes up; the session (and its state file) refuses
    /// any below the lineage it came from.
    @Test func aRecordRolledBackInRedisIsRefusedAlsoAfterARestart() throws {
        let redis = try RedisServer()
        let auth = try AuthServerFixture.start(tokenLifetime: 3600, rotateRefreshTokens: true, graceSeconds: 0)
        defer { auth.stop() }
        let dir = try Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let key = try Self.keyFile(dir)
        let seed = try auth.issueRefreshToken(clientID: "cli", user: "alice")
        try (seed + "\n").write(toFile: dir + "/seed", atomically: true, encoding: .utf8)
        let yaml = Self.refreshTokenSession(auth, seedFile: dir + "/seed")
        var replica = try Replica(dir: dir, sessionYAML: yaml, redisURL: redis.url, keyFile: key, name: "r")
        defer { replica.kill9() }
        #expect(replica.waitListening())
        // Rotation 1 (seed → RT1): record N-1, captured as an attacker with Redis access would.
        #expect(replica.get("/api/start") == 200)
        let recordKey = try Self.recordKey(redis)
        #expect(try Self.eventually { try !redis.getHex(recordKey).isEmpty })
        let recordN1 = try redis.getHex(recordKey)
        let rt1 = Self.stateRefreshToken(replica)
        // Rotation 2 (RT1 → RT2, the upstream rejected the token): record N.
        try auth.revokeAll()
        #expect(replica.get("/api/rotate") == 200)
        #expect(try Self.eventually { try redis.getHex(recordKey) != recordN1 })
        let recordN = try redis.getHex(recordKey)
        let rt2 = Self.stateRefreshToken(replica)
        #expect(!rt1.isEmpty && rt2 != rt1)
        // Record N-1 put back (and the rejection mark that would have hidden its access token gone).
        try redis.setHex(recordKey, recordN1)
        try redis.cli(["DEL", recordKey + ":rejected"])
        // A refresh (rejected again): from RT2, never from RT1 in the old record.
        try auth.revokeAll()
        #expect(replica.get("/api/after-rollback") == 200)
        #expect(replica.get("/api/again") == 200, "the token from RT2's refresh serves on")
        let rt3 = Self.stateRefreshToken(replica)
        #expect(![rt1, rt2].contains(rt3), "the state file holds the lineage's newest refresh token")
        #expect(replica.log.contains("older than one this session already came from"))
        #expect(Self.sharedCacheCounts(replica).olderRecords == 1)
        // Restarted: the state file names the generation its refresh token belongs to, so record N
        // put back now is refused as well (the session's own token in the state file is used).
        #expect(try Self.eventually { try redis.getHex(recordKey) != recordN })
        replica.kill9()
        try redis.setHex(recordKey, recordN)
        try redis.cli(["DEL", recordKey + ":rejected"])
        replica = try Replica(dir: dir, sessionYAML: yaml, redisURL: redis.url, keyFile: key, name: "r")
        #expect(replica.waitListening())
        #expect(replica.get("/api/restarted") == 200)
        #expect(replica.get("/api/restarted-again") == 200)
        #expect(Self.stateRefreshToken(replica) == rt3, "the state file still holds refresh token N")
        let stats = try auth.stats()
        #expect(stats["refresh_token_reuses"] as? Int == 0, "no used refresh token reached the server: \(stats)")
        #expect((stats["token_errors"] as? [String: Any] ?? [:])["invalid_grant"] == nil, "\(stats)")
        #expect((stats["by_grant"] as? [String: Any])?["refresh_token"] as? Int == 3, "seed, rotation, after the rollback: \(stats)")
        let log = replica.log
        #expect(![seed, rt1, rt2, rt3].contains { !$0.isEmpty && log.contains($0) }, "no refresh token in the log")
    }

    /// Issue 31 (8): a `<key>:lock` without expiry (or with one longer than bearerd's lock TTL)
    /// is no lock bearerd took: it is replaced at once, so a refresh completes within the
    /// clients' `wait_timeout` (a refresh_token session otherwise waits up to its lock TTL + 1 s,
    /// here 4 s, past the 2 s wait_timeout: 503).
    @Test func aLockWithoutExpiryIsReplacedWithinWaitTimeout() throws {
        let redis = try RedisServer()
        let auth = try AuthServerFixture.start(tokenLifetime: 3600, rotateRefreshTokens: true, graceSeconds: 0)
        defer { auth.stop() }
        let dir = try Self.tempDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let key = try Self.keyFile(dir)
        let seed = try auth.issueRefreshToken(clientID: "cli", user: "alice")
        try (seed + "\n").write(toFile: dir + "/seed", atomically: true, encoding: .utf8)
        let yaml = Self.refreshTokenSession(auth, seedFile: dir + "/seed", extra: "\n    wait_timeout: 2s")
        let replica = try Replica(dir: dir, sessionYAML: yaml, redisURL: redis.url, keyFile: key, name: "r")
        defer { replica.kill9() }
        #expect(replica.waitListening())
        #expect(replica.get("/api/start") == 200)
        let lockKey = try Self.recordKey(redis) + ":lock"
        for (i, ttl) in [[], ["PX", "86400000"]].enumerated() {
            try redis.cli(["SET", lockKey, "stuck"] + ttl)
            try auth.revokeAll()
            #expect(replica.get("/api/after\(i)") == 200, "refreshed within wait_timeout despite the lock \(ttl)")
            #expect(try redis.cli(["GET", lockKey]) != "stuck", "replaced (and released after the publish)")
        }
        #expect(replica.log.contains("shared cache lock without expiry"))
        let counts = Self.sharedCacheCounts(replica)
        #expect(counts.staleLocks == 2 && counts.fallbacks == 0, "\(counts)")
        let stats = try auth.stats()
        #expect((stats["by_grant"] as? [String: Any])?["refresh_token"] as? Int == 3, "\(stats)")
        #expect(stats["refresh_token_reuses"] as? Int == 0, "\(stats)")
    }

    /// Until `condition` holds (bounded: 5 s).
    static func eventually(_ condition: () throws -> Bool) throws -> Bool {
        for _ in 0..<250 {
            if try condition() { return true }
            usleep(20_000)
        }
        return try condition()
    }
}
