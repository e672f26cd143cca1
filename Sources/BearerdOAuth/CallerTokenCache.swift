/// The identity of one caller in a session's cache: the SHA-256 of the caller's bearer token
/// (never the token), 32 bytes held inline. Combined with the cache, which belongs to exactly one
/// session, it is the (session, SHA-256 of the caller's token) key
/// (docs/architecture.md §6.16). An empty token has no key: callers without a token never share an
/// entry.
public struct CallerKey: Sendable, Hashable, CustomStringConvertible {
    let w0: UInt64, w1: UInt64, w2: UInt64, w3: UInt64

    /// Hashes `token` (the pure SHA-256 of this module). nil for an empty token.
    public init?(callerToken token: String) {
        guard !token.isEmpty else { return nil }
        self.init(sha256Digest: SHA256.hash(token.utf8))
    }

    /// From a digest computed elsewhere (OpenSSL's, in the shell). nil unless 32 bytes.
    public init?(sha256Digest d: [UInt8]) {
        guard d.count == 32 else { return nil }
        func word(_ i: Int) -> UInt64 {
            var w: UInt64 = 0
            for j in 0..<8 { w = w << 8 | UInt64(d[i * 8 + j]) }
            return w
        }
        w0 = word(0); w1 = word(1); w2 = word(2); w3 = word(3)
    }

    /// The first 8 hex digits of the digest: what logs show (the same as
    /// `OAuthSecret(token).fingerprint`).
    public var fingerprint: String {
        let hex = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        for shift in stride(from: 60, through: 32, by: -4) { out.append(hex[Int(w0 >> UInt64(shift) & 0xf)]) }
        return String(decoding: out, as: UTF8.self)
    }

    public var description: String { "caller \(fingerprint)" }
}

/// The exchanged tokens of one on-behalf-of session (`subject: caller`, `assertion: caller`;
/// docs/architecture.md §6.16): one entry per caller, never reused across
/// callers; bounded by `maxEntries` with least-recently-used eviction; an entry expires at
/// min(exchanged token's expiry, caller token's `exp`) (`entryExpiry`). Concurrent requests of
/// one caller share one exchange (`lookup` → `.exchange` for the first, `.joined` for the rest;
/// `finish` hands back every waiter). A caller the token endpoint refused (`invalid_grant`,
/// `invalid_request`) is remembered for `refusalMemory` (5 s) so one bad caller cannot storm it.
///
/// Owns the entries (a slot array with an intrusive doubly linked LRU list over slot indices and
/// a free list: O(1) lookup, touch, insert and eviction, no allocation per access once the
/// dictionary and slots are at capacity), the in-flight exchanges and their `Waiter`s, and the
/// counters. Pure: time is an argument; one owner (the session's queue) mutates it.
/// Invariants: `index.count == entries == number of slots on the LRU list <= maxEntries`; a key is
/// never both cached and in flight; `head` is the most recently used, `tail` the least.
///
/// Memory ceiling (per session): `maxEntries × entryBytes(tokenBytes:)`. A cached entry is one
/// slot (`MemoryLayout<Slot>.stride`: 88 bytes on 64-bit; the slot array never grows past
/// `maxEntries`), one free-list index (4 bytes, the list's capacity at most `maxEntries`), its
/// share of the index dictionary (the 32-byte key and an `Int32` per bucket, at most 8/3 buckets
/// per entry since the dictionary doubles at 3/4 load: 96 bytes, plus its bit in the occupancy
/// map) and the exchanged token's string (no heap for 15 bytes or fewer, else its UTF-8 bytes
/// rounded up to 16 plus a 32-byte header). For a 1 KiB token that is 1,245 bytes, so
/// `max_entries: 10000` holds at most about 11.9 MiB. A remembered refusal keeps the endpoint's
/// `error` (at most 64 bytes) and a description cut to `maxDescriptionBytes` instead of a token.
/// In-flight exchanges are bounded by concurrent requests, not by `maxEntries`, and are not
/// counted here.
public struct CallerTokenCache<Waiter> {
    /// How long a refusal is remembered.
    public static var refusalMemory: Duration { .seconds(5) }

    /// What a lookup tells the request.
    public enum Lookup {
        /// Use this exchanged token.
        case hit(OAuthSecret)
        /// The token endpoint refused this caller less than `refusalMemory` ago: answer 401 with
        /// this RFC 6749 §5.2 `error` (and description), no exchange.
        case refused(error: String, description: String?)
        /// No entry: run the exchange for this caller, then call `finish`; the waiter is queued.
        case exchange
        /// An exchange for this caller is under way; the waiter is queued.
        case joined
    }

    /// How an exchange ended.
    public enum Outcome: Sendable {
        /// The exchanged token, usable until `expiresAt` (see `entryExpiry`).
        case token(OAuthSecret, expiresAt: MonotonicInstant)
        /// The endpoint refused the caller's token: remembered for `refusalMemory`.
        case refused(error: String, description: String?)
        /// Anything else (outage, timeout, a 5xx): nothing is remembered.
        case failed
    }

    public typealias Counters = CallerCacheCounters

    enum Value: Sendable {
        case token(OAuthSecret, expiresAt: MonotonicInstant)
        case refused(error: String, description: String?, until: MonotonicInstant)
    }

    struct Slot {
        var key: CallerKey
        var value: Value
        var prev: Int32
        var next: Int32
    }

    static var none: Int32 { -1 }

    public let maxEntries: Int
    public private(set) var counters = Counters()
    var slots: [Slot] = []
    var free: [Int32] = []
    var index: [CallerKey: Int32]
    var head: Int32 = CallerTokenCache.none
    var tail: Int32 = CallerTokenCache.none
    var inFlight: [CallerKey: [Waiter]] = [:]

    /// `maxEntries` at least 1 (the configuration requires it; a smaller value is taken as 1) and
    /// at most `Int32.max`.
    public init(maxEntries: Int) {
        self.maxEntries = min(max(1, maxEntries), Int(Int32.max))
        index = [:]
    }

    /// Entries (tokens and remembered refusals).
    public var count: Int { index.count }
    /// Callers with an exchange under way.
    public var inFlightCount: Int { inFlight.count }

    /// When an exchanged token obtained at `now` stops being handed out: `tokenLifetime` (the
    /// exchanged token's usable life, already short of the session's margin) bounded by
    /// `callerLifetime` (the caller JWT's `exp - now`: `CallerJWT.Validated.expiresAt` or
    /// `CallerJWT.allowedLifetime`), so it never outlasts the caller's own token.
    public static func entryExpiry(now: MonotonicInstant, tokenLifetime: Duration, callerLifetime: Duration?) -> MonotonicInstant {
        guard let callerLifetime else { return now + tokenLifetime }
        return now + min(tokenLifetime, callerLifetime)
    }

    /// The bytes one cached entry may take with an exchanged token of `tokenBytes` UTF-8 bytes
    /// (see the type's comment).
    public static func entryBytes(tokenBytes: Int) -> Int {
        let bucket = MemoryLayout<CallerKey>.stride + MemoryLayout<Int32>.stride
        let string = tokenBytes <= 15 ? 0 : 32 + (tokenBytes + 15) / 16 * 16
        return MemoryLayout<Slot>.stride + MemoryLayout<Int32>.stride + (bucket * 8 + 2) / 3 + 1 + string
    }

    /// A remembered refusal keeps at most this much of the endpoint's `error_description`.
    public static var maxDescriptionBytes: Int { 200 }

    /// The fast path: `.hit` or `.refused` when `key` has a live entry (counted like `lookup`'s),
    /// nil otherwise, with nothing queued or counted (the caller then validates the token and
    /// calls `lookup`). An expired entry stays until `lookup` or `removeExpired` drops it.
    public mutating func cached(_ key: CallerKey, now: MonotonicInstant) -> Lookup? {
        guard let i = index[key] else { return nil }
        switch slots[Int(i)].value {
        case .token(let token, let expiresAt) where now < expiresAt:
            touch(i)
            counters.hits &+= 1
            return .hit(token)
        case .refused(let error, let description, let until) where now < until:
            counters.refusalHits &+= 1
            return .refused(error: error, description: description)
        default:
            return nil
        }
    }

    /// The token cached for `key` if live, without touching the LRU order or counters (the
    /// rejection path compares it with the rejected token).
    public func liveToken(_ key: CallerKey, now: MonotonicInstant) -> OAuthSecret? {
        guard let i = index[key], case .token(let token, let expiresAt) = slots[Int(i)].value, now < expiresAt else { return nil }
        return token
    }

    /// The answer for `key` at `now`; queues `waiter` for `.exchange` and `.joined`.
    public mutating func lookup(_ key: CallerKey, now: MonotonicInstant, waiter: Waiter) -> Lookup {
        if let live = cached(key, now: now) { return live }
        if let i = index[key] { remove(i) }  // expired
        // hits, misses, coalesced and refusalHits partition the lookups (one `result` label each).
        if inFlight[key] != nil {
            inFlight[key]?.append(waiter)
            counters.coalesced &+= 1
            return .joined
        }
        inFlight[key] = [waiter]
        counters.misses &+= 1
        counters.exchanges &+= 1
        return .exchange
    }

    /// The exchange for `key` ended: records the outcome and returns every waiter (the first
    /// included) to resume with it. Empty when no exchange was under way for `key`.
    public mutating func finish(_ key: CallerKey, outcome: Outcome, now: MonotonicInstant) -> [Waiter] {
        let waiters = inFlight.removeValue(forKey: key) ?? []
        switch outcome {
        case .token(let token, let expiresAt):
            if now < expiresAt { store(key, .token(token, expiresAt: expiresAt)) }
        case .refused(let error, let description):
            counters.refusals &+= 1
            store(key, .refused(error: sanitise(error, limit: 64), description: description.map { sanitise($0, limit: Self.maxDescriptionBytes) },
                                until: now + Self.refusalMemory))
        case .failed:
            break
        }
        return waiters
    }

    /// The upstream rejected `token` for `key`: drop the entry if it still holds that token (a
    /// newer exchange's token stays), so the next lookup exchanges again.
    public mutating func invalidate(_ key: CallerKey, token: OAuthSecret) {
        guard let i = index[key], case .token(let held, _) = slots[Int(i)].value, held == token else { return }
        remove(i)
    }

    /// Drops every expired entry (O(entries); for a periodic sweep, so expired tokens do not
    /// wait for eviction to be released). Returns how many went.
    @discardableResult
    public mutating func removeExpired(now: MonotonicInstant) -> Int {
        var removed = 0
        var i = tail
        while i != Self.none {
            let prev = slots[Int(i)].prev
            let expired: Bool
            switch slots[Int(i)].value {
            case .token(_, let at): expired = now >= at
            case .refused(_, _, let until): expired = now >= until
            }
            if expired { remove(i); removed += 1 }
            i = prev
        }
        return removed
    }

    /// Whether `key` has an entry (of either kind, expired or not); for tests and the admin view.
    public func contains(_ key: CallerKey) -> Bool { index[key] != nil }

    /// Keys from most to least recently used (O(entries); tests).
    var orderFromMostRecent: [CallerKey] {
        var out: [CallerKey] = []
        var i = head
        while i != Self.none { out.append(slots[Int(i)].key); i = slots[Int(i)].next }
        return out
    }

    // MARK: - The list

    private mutating func store(_ key: CallerKey, _ value: Value) {
        if let i = index[key] {
            slots[Int(i)].value = value
            touch(i)
            return
        }
        if index.count >= maxEntries, tail != Self.none {
            remove(tail)
            counters.evictions &+= 1
        }
        let i: Int32
        if free.isEmpty, slots.count == slots.capacity {
            // Grow by doubling but never past `maxEntries` (the memory ceiling counts one slot per entry).
            slots.reserveCapacity(min(maxEntries, max(16, slots.capacity * 2)))
        }
        if let reused = free.popLast() {
            i = reused
            slots[Int(i)] = Slot(key: key, value: value, prev: Self.none, next: head)
        } else {
            i = Int32(truncatingIfNeeded: slots.count)
            slots.append(Slot(key: key, value: value, prev: Self.none, next: head))
        }
        if head != Self.none { slots[Int(head)].prev = i }
        head = i
        if tail == Self.none { tail = i }
        index[key] = i
        counters.size = index.count
    }

    /// Moves slot `i` to the front.
    private mutating func touch(_ i: Int32) {
        guard head != i else { return }
        unlink(i)
        slots[Int(i)].prev = Self.none
        slots[Int(i)].next = head
        if head != Self.none { slots[Int(head)].prev = i }
        head = i
        if tail == Self.none { tail = i }
    }

    private mutating func unlink(_ i: Int32) {
        let s = slots[Int(i)]
        if s.prev != Self.none { slots[Int(s.prev)].next = s.next } else { head = s.next }
        if s.next != Self.none { slots[Int(s.next)].prev = s.prev } else { tail = s.prev }
    }

    private mutating func remove(_ i: Int32) {
        unlink(i)
        index.removeValue(forKey: slots[Int(i)].key)
        // Release the token now; the slot keeps only the (public) key until reused.
        slots[Int(i)].value = .refused(error: "", description: nil, until: MonotonicInstant(nanoseconds: 0))
        slots[Int(i)].prev = Self.none
        slots[Int(i)].next = Self.none
        free.append(i)
        counters.size = index.count
    }
}

extension CallerTokenCache: Sendable where Waiter: Sendable {}

/// Counters of one session's `CallerTokenCache`, for /metrics. Monotonic except `size`.
public struct CallerCacheCounters: Sendable, Equatable {
    public var size = 0
    public var hits: UInt64 = 0
    /// Lookups that found nothing usable and started an exchange (not those that joined one).
    public var misses: UInt64 = 0
    /// Exchanges started (`.exchange` answers).
    public var exchanges: UInt64 = 0
    /// Requests that joined an exchange under way.
    public var coalesced: UInt64 = 0
    public var evictions: UInt64 = 0
    /// Exchanges the token endpoint refused (`finish(.refused)`).
    public var refusals: UInt64 = 0
    /// Requests answered from a remembered refusal.
    public var refusalHits: UInt64 = 0
}
