import Testing
@testable import BearerdOAuth

/// The per-caller cache of on-behalf-of sessions: isolation by the caller token's hash, LRU bound,
/// expiry at the earlier of the two tokens' ends, coalescing, remembered refusals, counters.
@Suite struct CallerTokenCacheTests {
    typealias Cache = CallerTokenCache<Int>

    static func at(_ s: Double) -> MonotonicInstant { .seconds(s) }
    static func key(_ caller: String) -> CallerKey { CallerKey(callerToken: caller)! }

    /// Runs one exchange for `caller` to completion with `token`, valid for `life` seconds.
    static func fill(_ cache: inout Cache, _ caller: String, token: String, now: Double, life: Double = 300) {
        let k = key(caller)
        guard case .exchange = cache.lookup(k, now: at(now), waiter: 0) else { Issue.record("\(caller): no exchange"); return }
        _ = cache.finish(k, outcome: .token(OAuthSecret(token), expiresAt: at(now + life)), now: at(now))
    }

    @Test func theKeyIsTheHashOfTheCallerTokenNeverTheToken() {
        let token = "eyJhbGciOiJSUzI1NiJ9.caller-one.sig"
        let k = Self.key(token)
        #expect(k.fingerprint == OAuthSecret(token).fingerprint)
        #expect(!k.description.contains("caller-one"))
        #expect(CallerKey(callerToken: "") == nil)   // no token, no entry to share
        #expect(CallerKey(sha256Digest: SHA256.hash(Array(token.utf8))) == k)
        #expect(CallerKey(sha256Digest: [1, 2, 3]) == nil)
        #expect(Self.key("a") != Self.key("b") && Self.key("a") == Self.key("a"))
        // Only the 32 bytes are kept, inline.
        #expect(MemoryLayout<CallerKey>.size == 32)
    }

    @Test func callersNeverShareAnEntry() {
        var cache = Cache(maxEntries: 10)
        Self.fill(&cache, "caller-a", token: "exchanged-for-a", now: 0)
        Self.fill(&cache, "caller-b", token: "exchanged-for-b", now: 0)
        guard case .hit(let a) = cache.lookup(Self.key("caller-a"), now: Self.at(1), waiter: 1),
              case .hit(let b) = cache.lookup(Self.key("caller-b"), now: Self.at(1), waiter: 2) else {
            Issue.record("miss"); return
        }
        #expect(a.exposedValue == "exchanged-for-a" && b.exposedValue == "exchanged-for-b")
        guard case .exchange = cache.lookup(Self.key("caller-c"), now: Self.at(1), waiter: 3) else { Issue.record("c got a token"); return }
        #expect(cache.counters.hits == 2 && cache.counters.exchanges == 3)
    }

    /// The fast path the loops take before validating a caller: live entries answer and count,
    /// anything else queues nothing and counts nothing.
    @Test func theFastPathAnswersOnlyLiveEntries() {
        var cache = Cache(maxEntries: 10)
        #expect(cache.cached(Self.key("a"), now: Self.at(0)) == nil)
        #expect(cache.counters == CallerCacheCounters())
        Self.fill(&cache, "a", token: "for-a", now: 0, life: 10)
        guard case .hit(let t)? = cache.cached(Self.key("a"), now: Self.at(5)) else { Issue.record("no hit"); return }
        #expect(t.exposedValue == "for-a" && cache.counters.hits == 1)
        #expect(cache.liveToken(Self.key("a"), now: Self.at(5))?.exposedValue == "for-a")
        #expect(cache.cached(Self.key("a"), now: Self.at(10)) == nil)   // expired: the slow path decides
        #expect(cache.liveToken(Self.key("a"), now: Self.at(10)) == nil)
        #expect(cache.inFlightCount == 0 && cache.counters.hits == 1)
        let k = Self.key("bad")
        _ = cache.lookup(k, now: Self.at(0), waiter: 1)
        _ = cache.finish(k, outcome: .refused(error: "invalid_grant", description: nil), now: Self.at(0))
        guard case .refused(let e, _)? = cache.cached(k, now: Self.at(4)) else { Issue.record("refusal not remembered"); return }
        #expect(e == "invalid_grant" && cache.counters.refusalHits == 1)
        #expect(cache.liveToken(k, now: Self.at(4)) == nil)
        #expect(cache.cached(k, now: Self.at(5)) == nil)
    }

    @Test func concurrentRequestsOfOneCallerShareOneExchange() {
        var cache = Cache(maxEntries: 10)
        let k = Self.key("caller")
        var starts = 0
        for waiter in 0..<50 {
            switch cache.lookup(k, now: Self.at(0), waiter: waiter) {
            case .exchange: starts += 1
            case .joined: break
            default: Issue.record("unexpected answer for waiter \(waiter)")
            }
        }
        #expect(starts == 1)
        #expect(cache.inFlightCount == 1 && cache.count == 0)
        // Another caller is not held up by it.
        guard case .exchange = cache.lookup(Self.key("other"), now: Self.at(0), waiter: 99) else { Issue.record("other joined"); return }
        let resumed = cache.finish(k, outcome: .token(OAuthSecret("t"), expiresAt: Self.at(300)), now: Self.at(1))
        #expect(resumed == Array(0..<50))
        #expect(cache.counters.exchanges == 2 && cache.counters.coalesced == 49)
        // Each lookup is counted under one result: the 49 that joined are not misses too.
        #expect(cache.counters.misses == 2 && cache.counters.hits == 0)
        guard case .hit = cache.lookup(k, now: Self.at(2), waiter: 0) else { Issue.record("not cached"); return }
        // A finish without an exchange under way resumes nobody.
        #expect(cache.finish(Self.key("nobody"), outcome: .failed, now: Self.at(2)).isEmpty)
    }

    @Test func anOutageIsNotRememberedButARefusalIsForFiveSeconds() {
        var cache = Cache(maxEntries: 10)
        let k = Self.key("caller")
        _ = cache.lookup(k, now: Self.at(0), waiter: 1)
        _ = cache.lookup(k, now: Self.at(0), waiter: 2)
        #expect(cache.finish(k, outcome: .failed, now: Self.at(1)) == [1, 2])
        guard case .exchange = cache.lookup(k, now: Self.at(1), waiter: 3) else { Issue.record("outage remembered"); return }
        let long = String(repeating: "d", count: 5000)
        #expect(cache.finish(k, outcome: .refused(error: "invalid_grant", description: long + "\n"), now: Self.at(2)) == [3])
        for t in [2.0, 4.0, 6.999] {
            guard case .refused(let error, let description) = cache.lookup(k, now: Self.at(t), waiter: 4) else {
                Issue.record("refusal forgotten at \(t)"); return
            }
            #expect(error == "invalid_grant")
            #expect(description?.count == Cache.maxDescriptionBytes)
        }
        guard case .exchange = cache.lookup(k, now: Self.at(7), waiter: 5) else { Issue.record("refusal kept past 5 s"); return }
        #expect(cache.counters.refusals == 1 && cache.counters.refusalHits == 3)
    }

    @Test func anEntryNeverOutlivesEitherToken() {
        // min(exchanged token, caller JWT exp).
        #expect(Cache.entryExpiry(now: Self.at(100), tokenLifetime: .seconds(3600), callerLifetime: .seconds(60)) == Self.at(160))
        #expect(Cache.entryExpiry(now: Self.at(100), tokenLifetime: .seconds(30), callerLifetime: .seconds(60)) == Self.at(130))
        #expect(Cache.entryExpiry(now: Self.at(100), tokenLifetime: .seconds(30), callerLifetime: nil) == Self.at(130))
        #expect(Cache.entryExpiry(now: Self.at(100), tokenLifetime: .seconds(30), callerLifetime: .zero) == Self.at(100))
        var cache = Cache(maxEntries: 10)
        let k = Self.key("caller")
        _ = cache.lookup(k, now: Self.at(0), waiter: 0)
        let expiry = Cache.entryExpiry(now: Self.at(0), tokenLifetime: .seconds(3600), callerLifetime: .seconds(60))
        _ = cache.finish(k, outcome: .token(OAuthSecret("t"), expiresAt: expiry), now: Self.at(0))
        guard case .hit = cache.lookup(k, now: Self.at(59.9), waiter: 0) else { Issue.record("expired early"); return }
        guard case .exchange = cache.lookup(k, now: Self.at(60), waiter: 0) else { Issue.record("outlived the caller token"); return }
        #expect(cache.count == 0)
        // A token already expired when it arrives is handed to the waiters but not kept.
        _ = cache.finish(k, outcome: .token(OAuthSecret("t"), expiresAt: Self.at(60)), now: Self.at(61))
        #expect(cache.count == 0)
    }

    @Test func anUpstreamRejectionDropsOnlyThatToken() {
        var cache = Cache(maxEntries: 10)
        Self.fill(&cache, "caller", token: "first", now: 0)
        let k = Self.key("caller")
        cache.invalidate(k, token: OAuthSecret("someone-elses"))
        guard case .hit = cache.lookup(k, now: Self.at(1), waiter: 0) else { Issue.record("dropped for another token"); return }
        cache.invalidate(k, token: OAuthSecret("first"))
        guard case .exchange = cache.lookup(k, now: Self.at(2), waiter: 0) else { Issue.record("not dropped"); return }
        _ = cache.finish(k, outcome: .token(OAuthSecret("second"), expiresAt: Self.at(300)), now: Self.at(3))
        cache.invalidate(k, token: OAuthSecret("first"))   // a late report about the old token
        guard case .hit(let t) = cache.lookup(k, now: Self.at(4), waiter: 0) else { Issue.record("new token dropped"); return }
        #expect(t.exposedValue == "second")
    }

    @Test func aThousandCallersInAHundredEntriesEvictTheLeastRecentlyUsed() {
        var cache = Cache(maxEntries: 100)
        for i in 0..<1000 {
            Self.fill(&cache, "caller-\(i)", token: "token-\(i)", now: Double(i), life: 100_000)
            #expect(cache.count == min(i + 1, 100))
            // Keep caller-0 in use: it is touched on every round and must survive.
            if i > 0 { guard case .hit = cache.lookup(Self.key("caller-0"), now: Self.at(Double(i)), waiter: 0) else {
                Issue.record("caller-0 evicted at \(i)"); return
            } }
        }
        #expect(cache.count == 100)
        #expect(cache.counters.size == 100)
        #expect(cache.counters.evictions == 900)
        #expect(cache.slots.count == 100)   // slots are reused, never more than max_entries
        // The survivors: caller-0 and the 99 most recent; the order is by use.
        let order = cache.orderFromMostRecent
        #expect(order.first == Self.key("caller-0"))
        #expect(order.dropFirst().elementsEqual((901..<1000).reversed().map { Self.key("caller-\($0)") }))
        #expect(cache.contains(Self.key("caller-999")) && !cache.contains(Self.key("caller-900")))
        // An evicted caller exchanges again, and the least recently used (caller-901) goes.
        guard case .exchange = cache.lookup(Self.key("caller-500"), now: Self.at(2000), waiter: 0) else { Issue.record("500 still cached"); return }
        _ = cache.finish(Self.key("caller-500"), outcome: .token(OAuthSecret("again"), expiresAt: Self.at(3000)), now: Self.at(2000))
        #expect(!cache.contains(Self.key("caller-901")) && cache.contains(Self.key("caller-902")))
        // A hit moves an entry to the front: caller-902 survives the next insertion, 903 does not.
        _ = cache.lookup(Self.key("caller-902"), now: Self.at(2001), waiter: 0)
        Self.fill(&cache, "caller-new", token: "n", now: 2001)
        #expect(cache.contains(Self.key("caller-902")) && !cache.contains(Self.key("caller-903")))
        #expect(cache.count == 100)
    }

    @Test func expiredEntriesCanBeSweptAndSlotsAreReused() {
        var cache = Cache(maxEntries: 5)
        for i in 0..<5 { Self.fill(&cache, "c\(i)", token: "t\(i)", now: 0, life: Double(10 * (i + 1))) }
        #expect(cache.removeExpired(now: Self.at(25)) == 2)
        #expect(cache.count == 3 && !cache.contains(Self.key("c0")) && cache.contains(Self.key("c2")))
        Self.fill(&cache, "c5", token: "t5", now: 25)
        Self.fill(&cache, "c6", token: "t6", now: 25)
        #expect(cache.count == 5 && cache.slots.count == 5 && cache.counters.evictions == 0)
        Self.fill(&cache, "c7", token: "t7", now: 25)
        #expect(cache.counters.evictions == 1 && !cache.contains(Self.key("c2")))
        // A degenerate size still holds one entry.
        var one = Cache(maxEntries: 0)
        Self.fill(&one, "a", token: "ta", now: 0)
        Self.fill(&one, "b", token: "tb", now: 0)
        #expect(one.maxEntries == 1 && one.count == 1 && one.contains(Self.key("b")))
    }

    @Test func theStatedMemoryCeilingMatchesTheLayout() {
        // The doc comment's figures, from the real layouts (64-bit).
        #expect(MemoryLayout<Cache.Slot>.stride == 88)
        let bucket = MemoryLayout<CallerKey>.stride + MemoryLayout<Int32>.stride
        #expect(bucket == 36)
        #expect(Cache.entryBytes(tokenBytes: 1024) == 88 + 4 + 96 + 1 + 32 + 1024)
        #expect(Cache.entryBytes(tokenBytes: 1024) == 1245)
        #expect(Cache.entryBytes(tokenBytes: 10) == 88 + 4 + 96 + 1)
        #expect(Cache.entryBytes(tokenBytes: 17) == 88 + 4 + 96 + 1 + 32 + 32)
        // 10,000 entries of 1 KiB tokens: about 11.9 MiB, as the doc comment says.
        let ceiling = 10_000 * Cache.entryBytes(tokenBytes: 1024)
        #expect(ceiling == 12_450_000)
        // Full, the structures hold exactly max_entries slots and entries.
        var cache = Cache(maxEntries: 64)
        for i in 0..<200 { Self.fill(&cache, "c\(i)", token: String(repeating: "t", count: 1024), now: 0) }
        #expect(cache.slots.count == 64 && cache.slots.capacity <= 64 + 16 && cache.count == 64)
    }
}
