// The shared cache's per-session protocol (docs/architecture.md §6.13) against a real redis-server:
// adopt, lock and wait, fencing, rejection marks, corrupt records, Redis down, records rolled
// back in Redis, locks without expiry.

import Foundation
import Testing
import Logging
import BearerdTestSupport
import BearerdProxyCore
import BearerdConfig
import BearerdIO
import BearerdTLS
import BearerdOAuth
@testable import BearerdSessions

@Suite(.serialized) struct SharedTokenSessionTests {
    let loop = EventLoop(index: 961, readBufferSize: 4096)

    func cache(port: UInt16, key: [UInt8] = [UInt8](repeating: 7, count: 32)) throws -> SharedTokenCache {
        let options = RedisOptions(endpoint: .tcp(host: "127.0.0.1", port: port, tls: false), database: 0,
                                   commandTimeout: .seconds(1))
        return SharedTokenCache(options: options, sealer: try RecordSealer(key: key), prefix: "t:", logger: Logger(label: "test"))
    }

    func session(_ cache: SharedTokenCache, identity: String = "id", clock: any SessionClock = SystemSessionClock(),
                 requestTimeout: Duration = .seconds(2)) -> SharedTokenSession {
        let s = SharedTokenSession(cache: cache, identity: identity, sessionName: "s", queue: loop, keepsRefreshToken: true,
                                   requestTimeout: requestTimeout, clock: clock)
        s.pollInterval = .milliseconds(20)
        return s
    }

    func before(_ s: SharedTokenSession, current: String? = nil, rejected: Bool = false,
                bound: Duration = .seconds(3)) async -> SharedTokenSession.Decision {
        await withCheckedContinuation { k in
            loop.execute { s.beforeFetch(current: current, rejected: rejected, waitBound: bound) { k.resume(returning: $0) } }
        }
    }

    func onLoop(_ body: @escaping () -> Void) async {
        await withCheckedContinuation { (k: CheckedContinuation<Void, Never>) in loop.execute { body(); k.resume() } }
    }

    /// Until `condition` holds (bounded: 10 s and 1000 tries).
    func eventually(_ condition: () throws -> Bool) throws -> Bool {
        let deadline = Date().addingTimeInterval(10)
        for _ in 0..<1000 where Date() < deadline {
            if try condition() { return true }
            usleep(10_000)
        }
        return try condition()
    }

    @Test func recordCodecRoundTripAndRejectsMalformed() {
        let r = SharedTokenRecord(accessToken: OAuthSecret("at"), tokenType: "Bearer", expiresAt: 1_900_000_000, lifetimeSeconds: 3600,
                                  generation: 42, refreshToken: OAuthSecret("rt"))
        #expect(SharedTokenRecord.decode(r.encoded()) == r)
        var noRT = r
        noRT.refreshToken = nil
        #expect(SharedTokenRecord.decode(noRT.encoded()) == noRT)
        let bytes = r.encoded()
        for cut in [0, 1, 9, bytes.count - 1] { #expect(SharedTokenRecord.decode(Array(bytes.prefix(cut))) == nil) }
        #expect(SharedTokenRecord.decode(bytes + [0]) == nil)
        var v2 = bytes
        v2[0] = 2
        #expect(SharedTokenRecord.decode(v2) == nil)
        // A huge length field is refused, not allocated.
        var huge = bytes
        for i in 25..<33 { huge[i] = 0xFF }
        #expect(SharedTokenRecord.decode(huge) == nil)
        // A token that would break a header field is refused.
        var crlf = r
        crlf.accessToken = OAuthSecret("at\r\nX-Injected: 1")
        #expect(SharedTokenRecord.decode(crlf.encoded()) == nil)
        // Freshness: outside the hard margin min(60 s, L/4); saturating at extremes.
        #expect(r.isFresh(wallClockNow: 1_900_000_000 - 61))
        #expect(!r.isFresh(wallClockNow: 1_900_000_000 - 59))
        #expect(!r.isFresh(wallClockNow: .max))
        #expect(r.remaining(wallClockNow: .min) == .max)
    }

    @Test func identityDependsOnWhatMakesSessionsInterchangeable() {
        let base = SessionConfig(name: "a", grant: .clientCredentials, tokenURL: EndpointURL(scheme: "https", host: "idp", port: 443, path: "/token"),
                                 clientID: "svc", clientAuth: .clientSecretBasic, scope: "read")
        var renamed = base
        renamed.name = "b"
        var scoped = base
        scoped.scope = "write"
        var audience = base
        audience.audiences = ["api"]
        let id = SharedTokenCache.identity(of: base, dpopThumbprint: nil)
        #expect(id.count == 64 && id.allSatisfy(\.isHexDigit))
        #expect(SharedTokenCache.identity(of: renamed, dpopThumbprint: nil) == id, "the session's name is not part of it")
        #expect(SharedTokenCache.identity(of: scoped, dpopThumbprint: nil) != id)
        #expect(SharedTokenCache.identity(of: audience, dpopThumbprint: nil) != id)
        #expect(SharedTokenCache.identity(of: base, dpopThumbprint: "jkt") != id)
    }

    @Test(.enabled(if: Prerequisite.runs(RedisServer.isAvailable))) func oneFetchesUnderTheLockTheOtherAdoptsItsRecord() async throws {
        let redis = try RedisServer()
        let c = try cache(port: redis.port)
        // a's lock outlives anything a loaded machine does meanwhile (its TTL is no window of this test).
        let a = session(c, requestTimeout: .seconds(120)), b = session(c)
        guard case .fetch(nil) = await before(a) else { Issue.record("a fetches"); return }
        #expect(try redis.cli(["EXISTS", "t:id:lock"]) == "1")
        // b asks from a callback (no child task) and waits for a's record: once it is subscribed, a publishes.
        let waited = OneAnswer<SharedTokenSession.Decision>()
        loop.execute { b.beforeFetch(current: nil, rejected: false, waitBound: .seconds(60)) { waited.put($0) } }
        #expect(try eventually { try redis.cli(["PUBSUB", "NUMSUB", "t:id"]).hasSuffix("1") })
        await onLoop { a.publish(accessToken: "AT1", tokenType: "Bearer", lifetime: .seconds(3600), refreshToken: "RT1") }
        guard case .adopt(let record) = waited.wait(seconds: 30) else { Issue.record("b adopts"); return }
        #expect(record.accessToken.exposedValue == "AT1" && record.refreshToken?.exposedValue == "RT1")
        // Released, sealed, with a TTL; no plaintext token in Redis.
        #expect(try eventually { try redis.cli(["EXISTS", "t:id:lock"]) == "0" })
        #expect(try !redis.cli(["GET", "t:id"]).contains("AT1"))
        #expect(try Int(redis.cli(["PTTL", "t:id"])) ?? 0 > 3_600_000)
        // A third finds the record at once; the holder of that token does not re-adopt it.
        guard case .adopt = await before(session(c)) else { Issue.record("hit"); return }
        guard case .fetch = await before(session(c), current: "AT1", bound: .milliseconds(200)) else { Issue.record("own token is not new"); return }
    }

    @Test(.enabled(if: Prerequisite.runs(RedisServer.isAvailable))) func aHolderThatLostTheLockDoesNotPublish() async throws {
        let redis = try RedisServer()
        let c = try cache(port: redis.port)
        let a = session(c)
        guard case .fetch = await before(a) else { Issue.record("a fetches"); return }
        // Its lock expired and another replica holds it now.
        try redis.cli(["SET", "t:id:lock", "someone-else"])
        await onLoop { a.publish(accessToken: "AT-late", tokenType: "Bearer", lifetime: .seconds(3600), refreshToken: nil) }
        try await Task.sleep(for: .milliseconds(200))
        #expect(try redis.cli(["EXISTS", "t:id"]) == "0", "fencing: no record from a former holder")
        #expect(try redis.cli(["GET", "t:id:lock"]) == "someone-else", "and the other's lock is untouched")
        // Positive control: a holder that does hold the lock publishes within the same 200 ms, so
        // the absence above is the fencing, not a wait too short to see a record.
        try redis.cli(["DEL", "t:id:lock"])
        let d = session(c, requestTimeout: .seconds(120))
        guard case .fetch = await before(d) else { Issue.record("d fetches"); return }
        await onLoop { d.publish(accessToken: "AT-live", tokenType: "Bearer", lifetime: .seconds(3600), refreshToken: nil) }
        try await Task.sleep(for: .milliseconds(200))
        #expect(try redis.cli(["EXISTS", "t:id"]) == "1", "the lock holder's record landed within the window")
    }

    @Test(.enabled(if: Prerequisite.runs(RedisServer.isAvailable))) func aRejectedGenerationIsNotAdopted() async throws {
        let redis = try RedisServer()
        let c = try cache(port: redis.port)
        // a's lock (its request timeout + 1 s) outlives a loaded machine's pauses: an expired
        // lock would fence its publish and no record would appear.
        let a = session(c, requestTimeout: .seconds(120))
        guard case .fetch = await before(a) else { Issue.record("a fetches"); return }
        await onLoop { a.publish(accessToken: "AT1", tokenType: "Bearer", lifetime: .seconds(3600), refreshToken: nil) }
        #expect(try eventually { try redis.cli(["EXISTS", "t:id"]) == "1" })
        // a's token is rejected: it marks the generation, then fetches under the lock.
        guard case .fetch = await before(a, current: "AT1", rejected: true) else { Issue.record("a refreshes"); return }
        #expect(try redis.cli(["EXISTS", "t:id:rejected"]) == "1")
        await onLoop { a.release() }
        // b never saw AT1 as rejected itself, but does not adopt it.
        guard case .fetch = await before(session(c), bound: .milliseconds(300)) else { Issue.record("b must not adopt"); return }
    }

    @Test(.enabled(if: Prerequisite.runs(RedisServer.isAvailable))) func corruptOrForeignRecordsAreIgnored() async throws {
        let redis = try RedisServer()
        let other = session(try cache(port: redis.port, key: [UInt8](repeating: 9, count: 32)))
        guard case .fetch = await before(other) else { Issue.record("fetch"); return }
        await onLoop { other.publish(accessToken: "AT-other", tokenType: "Bearer", lifetime: .seconds(3600), refreshToken: nil) }
        #expect(try eventually { try redis.cli(["EXISTS", "t:id"]) == "1" })
        let c = try cache(port: redis.port)
        guard case .fetch(nil) = await before(session(c)) else { Issue.record("another key's record is not adopted"); return }
        try redis.cli(["DEL", "t:id:lock"])
        try redis.cli(["SET", "t:id", "garbage"])
        guard case .fetch(nil) = await before(session(c)) else { Issue.record("garbage is not adopted"); return }
    }

    @Test(.enabled(if: Prerequisite.runs(RedisServer.isAvailable))) func redisDownMeansAnImmediateLocalFetch() async throws {
        let redis = try RedisServer()
        let c = try cache(port: redis.port)
        redis.stop()
        let s = session(c)
        var outcomes: [SharedTokenSession.Outcome] = []
        await onLoop { s.onOutcome = { outcomes.append($0) } }
        let started = ContinuousClock.now
        guard case .fetch(nil) = await before(s) else { Issue.record("fallback"); return }
        // Refused at once: no wait for the command timeout chain (bound generous for a loaded machine).
        #expect(ContinuousClock.now - started < .seconds(2))
        #expect(c.isDegraded)
        await onLoop { #expect(outcomes == [.fallback]) }
        try redis.start()
        var recovered = false
        for _ in 0..<100 where !recovered {
            _ = await before(session(c), bound: .milliseconds(50))
            recovered = !c.isDegraded
            if !recovered { try await Task.sleep(for: .milliseconds(100)) }
        }
        #expect(recovered)
    }

    @Test(.enabled(if: Prerequisite.runs(RedisServer.isAvailable))) func aFullRedisMeansALocalFetch() async throws {
        let redis = try RedisServer()
        let c = try cache(port: redis.port)
        // Full: every write is refused with an OOM error.
        try redis.cli(["CONFIG", "SET", "maxmemory-policy", "noeviction"])
        try redis.cli(["CONFIG", "SET", "maxmemory", "1"])
        let s = session(c)
        var outcomes: [SharedTokenSession.Outcome] = []
        await onLoop { s.onOutcome = { outcomes.append($0) } }
        guard case .fetch(nil) = await before(s) else { Issue.record("fallback"); return }
        await onLoop { #expect(outcomes == [.fallback]) }
        #expect(c.isDegraded)
        try redis.cli(["CONFIG", "SET", "maxmemory", "0"])
        guard case .fetch = await before(session(c)) else { Issue.record("fetch under the lock"); return }
        #expect(!c.isDegraded)
    }

    @Test(.enabled(if: Prerequisite.runs(RedisServer.isAvailable))) func aWaitersPollsAndBoundRunOnTheSessionClock() async throws {
        let redis = try RedisServer()
        let c = try cache(port: redis.port)
        let clock = FakeSessionClock()
        let a = session(c), b = session(c, clock: clock)
        guard case .fetch = await before(a) else { Issue.record("a fetches"); return }
        // b waits for a's record at most 10 minutes of its clock, polling on it.
        let answer = OneAnswer<SharedTokenSession.Decision>()
        loop.execute { b.beforeFetch(current: nil, rejected: false, waitBound: .seconds(600)) { answer.put($0) } }
        #expect(try eventually { !clock.pendingDeadlines.isEmpty }, "b's poll is a timer of its clock")
        await clock.advance(by: .seconds(601))
        // The poll that came due reads the lock still held, past the bound: b fetches anyway.
        for _ in 0..<100 where answer.wait(seconds: 0.05) == nil { await clock.advance(by: .seconds(1)) }
        guard case .fetch = answer.wait(seconds: 1) else { Issue.record("b stops waiting at its clock's bound"); return }
        #expect(try redis.cli(["GET", "t:id:lock"]).isEmpty == false, "a still holds the lock")
    }

    @Test(.enabled(if: Prerequisite.runs(RedisServer.isAvailable))) func aWaiterIsWokenByThePublishNotNextPoll() async throws {
        let redis = try RedisServer()
        let c = try cache(port: redis.port)
        let a = session(c), b = session(c)
        // No poll within the test's time: only the publish notification can wake b.
        await onLoop { b.pollInterval = .seconds(30) }
        guard case .fetch = await before(a) else { Issue.record("a fetches"); return }
        let started = ContinuousClock.now
        // b asks from a callback (no child task, which may find no free cooperative thread).
        let waited = OneAnswer<SharedTokenSession.Decision>()
        loop.execute { b.beforeFetch(current: nil, rejected: false, waitBound: .seconds(60)) { waited.put($0) } }
        // Once b is subscribed (its SUBSCRIBE shows in PUBSUB NUMSUB), a publishes.
        #expect(try eventually { try redis.cli(["PUBSUB", "NUMSUB", "t:id"]).hasSuffix("1") })
        await onLoop { a.publish(accessToken: "AT1", tokenType: "Bearer", lifetime: .seconds(3600), refreshToken: nil) }
        guard case .adopt(let record) = waited.wait(seconds: 30) else { Issue.record("b adopts"); return }
        #expect(record.accessToken.exposedValue == "AT1")
        #expect(ContinuousClock.now - started < .seconds(20), "woken by the notification, not the 30 s poll")
    }

    // MARK: Rollback through Redis

    @Test func fenceRefusesOlderGenerationsAndPublishesAboveEverySeen() {
        var f = SharedRecordFence()
        // No floor yet (a state file written before generations were kept): the first record is accepted.
        #expect(f.verdict(for: 0) == .accept && f.verdict(for: 5) == .accept)
        f.raise(to: 10)
        #expect(f.verdict(for: 9) == .refuseOlder(floor: 10))
        #expect(f.verdict(for: 10) == .accept, "the same record again")
        #expect(f.verdict(for: 11) == .accept)
        f.raise(to: 5)
        #expect(f.floor == 10, "never lowered")
        // Published above every generation seen, at least the wall clock in ms.
        #expect(f.next(wallClockMilliseconds: 3) == 11 && f.floor == 11)
        #expect(f.next(wallClockMilliseconds: 1_000) == 1_000)
        #expect(f.next(wallClockMilliseconds: -5) == 1_001, "a clock before 1970 is 0")
        #expect(f.verdict(for: 1_000) == .refuseOlder(floor: 1_001))
        // Saturating at the top: no trap, no wrap to 0.
        f.raise(to: .max)
        #expect(f.next(wallClockMilliseconds: .max) == .max)
        #expect(f.verdict(for: .max) == .accept && f.verdict(for: .max - 1) == .refuseOlder(floor: .max))
    }

    @Test(.enabled(if: RedisServer.isAvailable)) func aRecordRolledBackInRedisIsRefused() async throws {
        let redis = try RedisServer()
        let c = try cache(port: redis.port)
        let a = session(c)
        var notices: [SharedTokenSession.Notice] = []
        await onLoop { a.onNotice = { notices.append($0) } }
        guard case .fetch(nil) = await before(a) else { Issue.record("a fetches"); return }
        await onLoop { a.publish(accessToken: "AT1", tokenType: "Bearer", lifetime: .seconds(3600), refreshToken: "RT1") }
        #expect(try eventually { try !redis.getHex("t:id").isEmpty })
        let old = try redis.getHex("t:id")
        // The lineage moves on: a refreshes (RT1 → RT2) and publishes the next record.
        guard case .fetch(let seen?) = await before(a, current: "AT1"), seen.refreshToken?.exposedValue == "RT1" else { Issue.record("a refreshes"); return }
        await onLoop { _ = a.reserveGeneration() }
        await onLoop { a.publish(accessToken: "AT2", tokenType: "Bearer", lifetime: .seconds(3600), refreshToken: "RT2") }
        #expect(try eventually { try redis.getHex("t:id") != old })
        var newer: UInt64 = 0
        await onLoop { newer = a.currentGeneration ?? 0 }
        // Anyone who can write to Redis puts the old record back.
        try redis.setHex("t:id", old)
        // a refuses it: neither adopted nor its refresh token handed to the driver.
        guard case .fetch(nil) = await before(a, current: "AT2") else { Issue.record("the old record is refused"); return }
        await onLoop { #expect(notices == [.olderRecordRefused]) }
        await onLoop { a.release() }
        // So does a restarted replica whose state file names the newer generation…
        let restarted = session(c)
        await onLoop { restarted.raiseFloor(to: newer) }
        guard case .fetch(nil) = await before(restarted, bound: .milliseconds(300)) else { Issue.record("refused after a restart"); return }
        await onLoop { restarted.release() }
        // …while one that never saw the lineage (no state file) cannot tell: that is the limit.
        guard case .adopt(let r) = await before(session(c)), r.refreshToken?.exposedValue == "RT1" else { Issue.record("no floor: accepted"); return }
    }

    // MARK: Locks without expiry

    @Test func lockVerdictFromPTTL() {
        let ttl: Int64 = 3_000
        #expect(SharedLockVerdict.judge(pttl: -1, lockTTLMilliseconds: ttl) == .replace, "no expiry")
        #expect(SharedLockVerdict.judge(pttl: -2, lockTTLMilliseconds: ttl) == .retake, "gone")
        #expect(SharedLockVerdict.judge(pttl: ttl + 1, lockTTLMilliseconds: ttl) == .replace, "longer than any bearerd lock")
        #expect(SharedLockVerdict.judge(pttl: .max, lockTTLMilliseconds: ttl) == .replace)
        #expect(SharedLockVerdict.judge(pttl: ttl, lockTTLMilliseconds: ttl) == .wait)
        #expect(SharedLockVerdict.judge(pttl: 1, lockTTLMilliseconds: ttl) == .wait)
        #expect(SharedLockVerdict.judge(pttl: 0, lockTTLMilliseconds: ttl) == .wait)
        #expect(SharedLockVerdict.judge(pttl: -3, lockTTLMilliseconds: ttl) == .wait, "no such reply: wait, bounded")
        #expect(SharedLockVerdict.judge(pttl: 0, lockTTLMilliseconds: -1) == .replace, "a negative TTL does not trap")
        // A bearerd lock declares its TTL: another replica's longer request_timeout is waited for.
        func v(_ s: String) -> [UInt8] { Array(s.utf8) }
        #expect(SharedLockVerdict.lockValue(ttlMilliseconds: 121_000, random: "ab12") == "121000-ab12")
        #expect(SharedLockVerdict.declaredTTL(ofLockValue: v("121000-ab12")) == 121_000)
        #expect(SharedLockVerdict.declaredTTL(ofLockValue: v("86401000-x")) == 86_401_000)
        for other in ["ab12", "-x", "", "12a-x", "86401001-x", "123456789-x", "99999999999999999999999-x"] {
            #expect(SharedLockVerdict.declaredTTL(ofLockValue: v(other)) == nil, "\(other)")
        }
        #expect(SharedLockVerdict.judge(pttl: 100_000, holder: v("121000-x"), ownLockTTLMilliseconds: ttl) == .wait)
        #expect(SharedLockVerdict.judge(pttl: 121_001, holder: v("121000-x"), ownLockTTLMilliseconds: ttl) == .replace)
        #expect(SharedLockVerdict.judge(pttl: -1, holder: v("121000-x"), ownLockTTLMilliseconds: ttl) == .replace)
        #expect(SharedLockVerdict.judge(pttl: 100_000, holder: v("stuck"), ownLockTTLMilliseconds: ttl) == .replace)
        #expect(SharedLockVerdict.judge(pttl: 2_000, holder: v("stuck"), ownLockTTLMilliseconds: ttl) == .wait)
        typealias Reply = SharedTokenSession.LockReply
        #expect(Reply(.array([.integer(1)])) == .taken)
        #expect(Reply(.array([.integer(0), .bulk(Array("v".utf8)), .integer(-1)])) == .held(value: Array("v".utf8), pttl: -1))
        #expect(Reply(.array([.integer(0), .bulk(nil), .integer(-2)])) == .held(value: nil, pttl: -2))
        #expect(Reply(.array([.integer(0), .bulk(nil)])) == nil)
        #expect(Reply(.array([.integer(0), .bulk(nil), .bulk(nil)])) == nil)
        #expect(Reply(.error("NOSCRIPT")) == nil && Reply(.array(nil)) == nil && Reply(.array([])) == nil)
    }

    @Test(.enabled(if: RedisServer.isAvailable)) func aLockWithoutExpiryOrLongerThanOursIsReplaced() async throws {
        let redis = try RedisServer()
        let c = try cache(port: redis.port)
        // Lock TTL 3 s; the waits below would take 60 s.
        let s = session(c, requestTimeout: .seconds(2))
        var outcomes: [SharedTokenSession.Outcome] = []
        var notices: [SharedTokenSession.Notice] = []
        await onLoop {
            s.onOutcome = { outcomes.append($0) }
            s.onNotice = { notices.append($0) }
        }
        for extra in [[], ["PX", "86400000"]] {
            try redis.cli(["SET", "t:id:lock", "stuck"] + extra)
            let started = ContinuousClock.now
            guard case .fetch = await before(s, bound: .seconds(60)) else { Issue.record("fetch"); return }
            #expect(ContinuousClock.now - started < .seconds(5), "replaced, not waited for (\(extra))")
            let value = try redis.cli(["GET", "t:id:lock"])
            #expect(!value.isEmpty && value != "stuck", "our lock now")
            let pttl = Int(try redis.cli(["PTTL", "t:id:lock"])) ?? -9
            #expect(pttl > 0 && pttl <= 3_000)
            await onLoop { s.release() }
        }
        await onLoop {
            #expect(outcomes == [.miss, .miss])
            #expect(notices == [.staleLockReplaced, .staleLockReplaced])
        }
        // A lock within our TTL is another replica's fetch: waited for (here until the bound)…
        try redis.cli(["SET", "t:id:lock", "live", "PX", "3000"])
        guard case .fetch = await before(s, bound: .milliseconds(300)) else { Issue.record("waits, then fetches"); return }
        #expect(try redis.cli(["GET", "t:id:lock"]) == "live", "left alone")
        // …unless, while waiting, it is replaced by one without expiry: judged again and replaced.
        try redis.cli(["SET", "t:id:lock", "live", "PX", "3000"])
        let started = ContinuousClock.now
        let answer = OneAnswer<SharedTokenSession.Decision>()
        loop.execute { s.beforeFetch(current: nil, rejected: false, waitBound: .seconds(60)) { answer.put($0) } }
        try await Task.sleep(for: .milliseconds(200))
        try redis.cli(["SET", "t:id:lock", "stuck-again"])
        guard case .fetch = answer.wait(seconds: 30) else { Issue.record("fetch after replacing"); return }
        #expect(ContinuousClock.now - started < .seconds(10))
        #expect(try redis.cli(["GET", "t:id:lock"]) != "stuck-again")
        await onLoop { #expect(notices.count == 3) }
    }
}
