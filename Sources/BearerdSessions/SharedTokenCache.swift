import BearerdIO
import BearerdOAuth
import BearerdProxyCore
import BearerdTLS
import BearerdConfig
import Logging
import Dispatch

/// The shared token cache of a configuration (docs/architecture.md §4 `shared_cache:`, §6 "Shared cache"):
/// replicas share one token per session through Redis (or Valkey). Never a dependency: every
/// failure falls back to the session's own token requests.
///
/// Owns the resolved connection options, the record sealer (AES-256-GCM, key from `key_file`),
/// the key prefix, and the health shared by all sessions (`degraded`, guarded by `lock`; read
/// by `/readyz` from any thread). Each session gets its own `SharedTokenSession` (and Redis
/// connection) on its own queue.
public final class SharedTokenCache: @unchecked Sendable {  // @unchecked: immutable after init except `lock`-guarded health
    let options: RedisOptions
    let sealer: RecordSealer
    let prefix: String
    let logger: Logger
    private let lock = Lock()
    /// Failures in the current streak (0: healthy).
    private var failureStreak: UInt64 = 0

    init(options: RedisOptions, sealer: RecordSealer, prefix: String, logger: Logger) {
        self.options = options
        self.sealer = sealer
        self.prefix = prefix
        self.logger = logger
    }

    /// Reads the key file and the password, builds the TLS context of `rediss://`. Errors are
    /// `FILE:LINE: shared_cache.KEY: …`, never showing a secret.
    public static func make(_ config: SharedCacheConfig, file: String, environment: [String: String],
                            logger: Logger) throws(ConfigErrors) -> SharedTokenCache {
        var errors: [ConfigError] = []
        func problem(_ key: String, _ message: String) {
            errors.append(ConfigError(file: file, line: config.line, key: "shared_cache." + key, message: message))
        }
        var sealer: RecordSealer?
        switch config.readKey() {  // SharedCacheKey: base64 or raw, text refused
        case .success(let key):
            do throws(RecordSealer.KeyError) {
                sealer = try RecordSealer(key: key.bytes)
                logger.info("shared_cache key_file read", metadata: ["key_file": "\(config.keyFile)", "key_file.form": "\(key.form.rawValue)"])
            } catch {
                problem("key_file", "\(config.keyFile): \(error.description)")
            }
        case .failure(let f):
            problem("key_file", f.message)
        }
        var password: OAuthSecret?
        if let source = config.password {
            do throws(ConfigError) {
                password = OAuthSecret(try ConfigLoader.resolveSecret(source, environment: environment, file: file, line: config.line,
                                                                      key: "shared_cache.password_file").value)
            } catch let e {
                errors.append(e)
            }
        }
        var tlsContext: TLSContext?
        if case .tcp(_, _, true) = config.endpoint {
            do throws(TLSError) {
                tlsContext = try TLSContext.client(caFile: config.tls?.caFile, clientCert: config.tls?.clientCert,
                                                   clientKey: config.tls?.clientKey, alpn: [])
            } catch {
                problem("tls", error.message)
            }
        }
        guard errors.isEmpty, let sealer else { throw ConfigErrors(errors) }
        let options = RedisOptions(endpoint: config.endpoint, database: config.database, username: config.username,
                                   password: password, tlsContext: tlsContext)
        return SharedTokenCache(options: options, sealer: sealer, prefix: config.prefix, logger: logger)
    }

    /// Whether the last Redis operation of any session failed (`/readyz` says
    /// `shared_cache_degraded`; readiness is not affected). Thread-safe.
    public var isDegraded: Bool { lock.withLock { failureStreak > 0 } }

    /// A failure: the first of a streak is logged (warning), the rest only counted.
    func noteFailure(_ failure: RedisFailure, session: String) {
        let first: Bool = lock.withLock {
            failureStreak &+= 1
            return failureStreak == 1
        }
        if first {
            logger.warning("shared cache unavailable: sessions use their own token requests until it answers again", metadata: [
                "shared_cache": "\(options.endpoint)", "error.kind": "\(failure.kind)", "error": "\(failure.detail)", "session": "\(session)",
            ])
        }
    }

    /// An answer: ends a failure streak (logged once).
    func noteSuccess() {
        let streak: UInt64 = lock.withLock {
            let s = failureStreak
            failureStreak = 0
            return s
        }
        if streak > 0 {
            logger.notice("shared cache answers again", metadata: ["shared_cache": "\(options.endpoint)", "failures": "\(streak)"])
        }
    }

    /// The Redis key stem of a session: the prefix and the hex SHA-256 of its identity (what
    /// makes two sessions interchangeable: endpoint, client, grant, scope, audience, resource,
    /// parameters), so a differently configured session never reads it and no name shows.
    static func identity(of session: SessionConfig, dpopThumbprint: String?) -> String {
        var parts: [String] = []
        parts.append("v1")
        parts.append("grant=" + session.grant.rawValue)
        parts.append("token_url=" + (session.issuer.map { "issuer:" + $0.description } ?? session.tokenURL.description))
        parts.append("client_id=" + session.clientID)
        parts.append("client_auth=" + session.clientAuth.rawValue)
        parts.append("scope=" + (session.scope ?? ""))
        parts.append("username=" + (session.username ?? ""))
        for a in session.audiences { parts.append("audience=" + a) }
        for r in session.resources { parts.append("resource=" + r) }
        for (k, v) in session.params { parts.append("param:" + k + "=" + v) }
        if let command = session.command { parts.append("command=" + command.joined(separator: "\u{0}")) }
        if let e = session.exchange { parts.append("exchange=\(e)") }
        // Signing sessions: the whole credentials source (role, files, vending URL; docs/architecture.md §6.15).
        if let signing = session.signingIdentity { parts.append("signing=" + signing) }
        // DPoP-bound tokens are usable only with their key: replicas share them only when they share the key.
        if let dpopThumbprint { parts.append("dpop_jkt=" + dpopThumbprint) }
        // Length-prefixed, so no choice of values makes two identities collide.
        var bytes: [UInt8] = []
        for p in parts {
            bytes.append(contentsOf: Array(String(p.utf8.count).utf8))
            bytes.append(0x3A)
            bytes.append(contentsOf: Array(p.utf8))
        }
        return BearerdOAuth.hex(SHA256.hash(bytes))
    }
}

/// What one shared record holds (sealed with AES-256-GCM under the record's key). The tokens
/// are `OAuthSecret`s: a record printed or logged by mistake shows `<redacted>`.
struct SharedTokenRecord: Equatable {
    var accessToken: OAuthSecret
    var tokenType: String
    /// Wall clock (Unix seconds) when the access token expires.
    var expiresAt: Int64
    /// Its lifetime as issued, in seconds (for the adoption margin).
    var lifetimeSeconds: Int64
    /// Increases with every record published; a rejection marks one (the fencing of docs/architecture.md §6);
    /// a session refuses records below the generation its lineage came from (`SharedRecordFence`).
    var generation: UInt64
    /// refresh_token sessions: the current refresh token of the shared lineage.
    var refreshToken: OAuthSecret?

    static let version: UInt8 = 1
    /// Largest field accepted when decoding (a record is a few KiB at most).
    static let maxField = 256 * 1024

    func encoded() -> [UInt8] {
        var out: [UInt8] = [Self.version]
        func u64(_ v: UInt64) { for i in (0..<8).reversed() { out.append(UInt8(truncatingIfNeeded: v >> (UInt64(i) * 8))) } }
        func field(_ s: String) {
            let b = Array(s.utf8)
            u64(UInt64(b.count))
            out.append(contentsOf: b)
        }
        u64(generation)
        u64(UInt64(bitPattern: expiresAt))
        u64(UInt64(bitPattern: lifetimeSeconds))
        field(accessToken.exposedValue)
        field(tokenType)
        if let refreshToken {
            out.append(1)
            field(refreshToken.exposedValue)
        } else {
            out.append(0)
        }
        return out
    }

    /// Nil for anything but a well-formed record of this version (bounds-checked throughout).
    static func decode(_ b: [UInt8]) -> SharedTokenRecord? {
        var i = 0
        func u64() -> UInt64? {
            guard b.count - i >= 8 else { return nil }
            var v: UInt64 = 0
            for _ in 0..<8 { v = v << 8 | UInt64(b[i]); i += 1 }
            return v
        }
        func field() -> String? {
            guard let n = u64(), n <= UInt64(maxField), b.count - i >= Int(n) else { return nil }
            let s = String(decoding: b[i..<(i + Int(n))], as: UTF8.self)
            i += Int(n)
            return s
        }
        guard b.first == version else { return nil }
        i = 1
        guard let generation = u64(), let expires = u64(), let lifetime = u64(),
              let access = field(), !access.isEmpty, let type = field() else { return nil }
        guard i < b.count else { return nil }
        let hasRefresh = b[i]
        i += 1
        var refresh: String?
        if hasRefresh == 1 {
            guard let r = field(), !r.isEmpty else { return nil }
            refresh = r
        } else if hasRefresh != 0 {
            return nil
        }
        guard i == b.count else { return nil }
        // Tokens go into header fields and forms: visible ASCII only (RFC 6750 §2.1 b64token and more), never CR/LF.
        func visible(_ t: String) -> Bool { t.utf8.allSatisfy { $0 > 0x20 && $0 < 0x7F } }
        guard visible(access), visible(type), refresh.map(visible) ?? true else { return nil }
        return SharedTokenRecord(accessToken: OAuthSecret(access), tokenType: type, expiresAt: Int64(bitPattern: expires),
                                 lifetimeSeconds: Int64(bitPattern: lifetime), generation: generation, refreshToken: refresh.map(OAuthSecret.init))
    }

    /// Seconds of life left at `now` (saturating), 0 when expired.
    func remaining(wallClockNow now: Int64) -> Int64 {
        let (d, o) = expiresAt.subtractingReportingOverflow(now)
        return o ? (expiresAt > now ? .max : 0) : max(d, 0)
    }

    /// Worth adopting instead of asking the IdP: outside its hard margin `min(60 s, L/4)`
    /// (docs/architecture.md §6), so the adopter does not have to refresh at once.
    func isFresh(wallClockNow now: Int64) -> Bool {
        let lifetime = max(lifetimeSeconds, 1)
        let hard = min(60, lifetime / 4)
        return remaining(wallClockNow: now) > max(hard, 1)
    }
}

/// The rollback fence of one session's shared records. Pure (no I/O), a value owned by its
/// `SharedTokenSession` on the session's queue.
///
/// Anyone who can write to Redis can put an old sealed record back (it opens: the AEAD's
/// additional data is only the key). Adopting it would make this replica present a refresh
/// token the server has already rotated, and servers with reuse detection then revoke the whole
/// lineage. Every record carries a generation that only goes up (the publisher picks one above
/// every generation it has seen), inside the sealed bytes, so it cannot be changed without the
/// key. Invariant: `floor` is the highest generation this session's lineage has come from (read,
/// adopted, published, or restored from the state file); a record below it is refused.
///
/// Migration: records always carried a generation; a state file written before this fence has
/// none, so the floor starts at 0 and the first record read is accepted (as before), then the
/// floor is persisted with the next state write.
struct SharedRecordFence: Equatable {
    private(set) var floor: UInt64 = 0

    enum Verdict: Equatable {
        case accept
        /// Older than a record this lineage already came from: rolled back (or a very late
        /// write), never adopted.
        case refuseOlder(floor: UInt64)
    }

    /// Same generation is accepted: only a holder of the key can seal a record, so an equal one
    /// is the record already seen.
    func verdict(for generation: UInt64) -> Verdict {
        generation < floor ? .refuseOlder(floor: floor) : .accept
    }

    /// A record was accepted (or a state file names the lineage's generation): never go below it.
    mutating func raise(to generation: UInt64) {
        floor = max(floor, generation)
    }

    /// The generation of a record about to be published: above every one seen (saturating), and
    /// at least the wall clock in milliseconds, so a replica that has not read the latest record
    /// (or restarted without a state file) still publishes above what earlier replicas wrote.
    mutating func next(wallClockMilliseconds: Int64) -> UInt64 {
        let above = floor == .max ? .max : floor + 1
        let g = max(above, UInt64(clamping: wallClockMilliseconds))
        floor = g
        return g
    }
}

/// What to do about a `<key>:lock` another client holds. Pure.
///
/// A lock set without a TTL (or with one longer than bearerd's) would keep every replica
/// waiting for a publish that never comes, longer than its clients' `wait_timeout`: such a lock is
/// not one bearerd took (every bearerd lock is `PX` its lock TTL), so it is replaced at once.
/// A bearerd lock's value starts with the TTL it was taken with (`<ms>-<random hex>`), so a
/// replica with a longer `request_timeout` (a rollout changing it) is waited for, not replaced.
enum SharedLockVerdict: Equatable {
    /// A live lock within the lock TTL: another replica is fetching; wait for its record.
    case wait
    /// No expiry (PTTL -1) or longer than any lock bearerd takes: replace it (compare-and-set).
    case replace
    /// Gone meanwhile (PTTL -2): try to take it again.
    case retake

    /// The longest lock TTL bearerd takes: `request_timeout` (at most 24 h) + 1 s.
    static let longestLockTTLMilliseconds: Int64 = 86_401_000

    /// The value of a lock taken with `ttl` milliseconds.
    static func lockValue(ttlMilliseconds ttl: Int64, random: String) -> String {
        "\(ttl)-\(random)"
    }

    /// The TTL a bearerd lock value declares (`<ms>-…`, at most `longestLockTTLMilliseconds`);
    /// nil for any other value (a hand-set lock, or an older bearerd's plain hex).
    static func declaredTTL(ofLockValue value: [UInt8]) -> Int64? {
        guard let dash = value.firstIndex(of: 0x2D), dash > 0, dash <= 8 else { return nil }
        var ms: Int64 = 0
        for b in value[..<dash] {
            guard b >= 0x30, b <= 0x39 else { return nil }
            ms = ms * 10 + Int64(b - 0x30)  // at most 8 digits: no overflow
        }
        return ms <= longestLockTTLMilliseconds ? ms : nil
    }

    /// `judge` of the lock `holder` holds: its declared TTL bounds it, else this replica's own.
    static func judge(pttl: Int64, holder: [UInt8], ownLockTTLMilliseconds own: Int64) -> SharedLockVerdict {
        judge(pttl: pttl, lockTTLMilliseconds: declaredTTL(ofLockValue: holder) ?? own)
    }

    /// - Parameters:
    ///   - pttl: the lock's `PTTL` reply (milliseconds; -1: no expiry; -2: no key).
    ///   - lockTTLMilliseconds: the longest TTL the lock may have (its declared one, or this
    ///     replica's own).
    static func judge(pttl: Int64, lockTTLMilliseconds: Int64) -> SharedLockVerdict {
        switch pttl {
        case -2: return .retake
        case -1: return .replace
        case let t where t > lockTTLMilliseconds: return .replace
        // 0...lockTTL: a lock bearerd took. No other negative reply exists; should one come,
        // wait (the wait stays bounded).
        default: return .wait
        }
    }
}

/// One session's use of the shared cache, on the session's queue (docs/architecture.md §6.13).
///
/// Before a token request: read the record (adopt a fresh one: no IdP call); else take the
/// lock (`SET NX PX` with a random value), read again, and fetch; or, when another replica
/// holds it, wait until its record is published (woken by the publish notification on the
/// record's channel, or a poll every 50 ms), the lock is freed (take it), or the wait bound
/// passes (fetch anyway). After the request: publish the sealed record only
/// while still the lock holder (a Lua compare of the lock value: fencing), release the lock
/// with compare-and-delete. A rejection marks the record's generation as rejected so no replica
/// adopts it again. A record older than the session's `fence` is refused (rollback through
/// Redis); a lock without expiry, or longer than it declares (else than `lockTTL`), is replaced
/// instead of waited for.
///
/// Owns, on `queue`: the Redis connection and the subscriber connection, the lock value held
/// (nil: none), the wait in progress, the generation of the record the session's current
/// token came from, the rollback fence and a generation reserved for the next publish.
/// Invariants: every `beforeFetch`
/// completion runs exactly once, on `queue`; any Redis failure means a local fetch (counted as
/// a fallback) and never a failed request.
final class SharedTokenSession {
    enum Decision {
        /// A fresh record another replica published: use it, no token request.
        case adopt(SharedTokenRecord)
        /// Fetch locally; `record`: the current record (its refresh token is the lineage's newest).
        case fetch(record: SharedTokenRecord?)
    }

    /// How the `beforeFetch` went, for the session's counters.
    enum Outcome: Equatable { case hit, miss, lockWait, fallback }

    /// Things refused along the way, for the session's counters (besides the outcome).
    enum Notice: Equatable {
        /// A lock without expiry, or longer than any bearerd lock, was replaced.
        case staleLockReplaced
        /// A record older than the fence was refused (counted once per generation).
        case olderRecordRefused
    }

    let cache: SharedTokenCache
    let sessionName: String
    let queue: EventLoop
    /// The session's clocks (the driver's `SessionClock`): wait deadlines, polls, record expiry.
    let clock: any SessionClock
    let connection: RedisConnection
    let recordKey: String
    let lockKey: String
    let rejectedKey: String
    /// Keeps refresh-token lineages this long after the access token expired.
    let keepsRefreshToken: Bool
    /// Poll interval while another replica holds the lock.
    var pollInterval: Duration = .milliseconds(50)
    /// How long the lock is held at most (a holder that dies frees it then).
    var lockTTL: Duration
    private var heldLock: String?
    /// The generation of the record the current token came from (adopted or published).
    private(set) var currentGeneration: UInt64?
    /// Refuses records older than the lineage this session came from.
    private(set) var fence = SharedRecordFence()
    /// The generation `reserveGeneration()` chose for the next publish (persisted before it).
    private var reservedGeneration: UInt64?
    /// The last older generation refused (logged and counted once each).
    private var lastRefusedGeneration: UInt64?
    private var loggedCorrupt = false
    /// The wait in progress for another replica's record, if any.
    private var wait: Wait?
    /// The connection subscribed to the record's channel (RESP2: it can do nothing else).
    private var subscriber: RedisConnection?
    private enum Subscription { case unsubscribed, subscribing, subscribed }
    private var subscription: Subscription = .unsubscribed
    private var serial: UInt64 = 0
    /// Counts each outcome (the driver adds them to its metrics).
    var onOutcome: ((Outcome) -> Void)?
    /// Counts each notice (the driver adds them to its metrics).
    var onNotice: ((Notice) -> Void)?

    init(cache: SharedTokenCache, identity: String, sessionName: String, queue: EventLoop, keepsRefreshToken: Bool,
         requestTimeout: Duration, clock: any SessionClock = SystemSessionClock()) {
        self.cache = cache
        self.clock = clock
        self.sessionName = sessionName
        self.queue = queue
        self.connection = RedisConnection(options: cache.options, loop: queue)
        recordKey = cache.prefix + identity
        lockKey = recordKey + ":lock"
        rejectedKey = recordKey + ":rejected"
        self.keepsRefreshToken = keepsRefreshToken
        lockTTL = requestTimeout + .seconds(1)
    }

    // MARK: The rollback fence

    /// The generation the state file names for its refresh token's lineage (nil: a file
    /// written before generations were kept): records below it are refused from now on.
    func raiseFloor(to generation: UInt64?) {
        if let generation { fence.raise(to: generation) }
    }

    /// Chooses the generation of the record the next `publish` writes, so the state file can
    /// name it before the token is handed out (a restarted replica then refuses every older
    /// record, including the one this refresh superseded).
    func reserveGeneration() -> UInt64 {
        let g = fence.next(wallClockMilliseconds: clock.wallClockSeconds().multipliedSaturating(1000))
        reservedGeneration = g
        return g
    }

    // MARK: Before a token request

    /// Decides between adopting a published record and fetching locally; `done` runs once on `queue`.
    /// - Parameters:
    ///   - current: the session's current access token (a record holding it is not "new").
    ///   - rejected: the fetch is for a rejection of the current token (docs/architecture.md §6 CAS rule).
    ///   - waitBound: how long to wait for another replica's fetch before fetching anyway.
    func beforeFetch(current: String?, rejected: Bool, waitBound: Duration, done: @escaping (Decision) -> Void) {
        serial &+= 1
        if rejected, let generation = currentGeneration {
            // Others must not adopt the token we were refused: mark its generation.
            let ttl = max(lockTTL, .seconds(600))
            connection.send(["SET", rejectedKey, String(generation), "PX", String(ttl.wholeMilliseconds)]) { [weak self] r in
                self?.observe(r)
            }
        }
        let deadline = clock.now() + waitBound
        var finished = false
        let finish: (Decision, Outcome) -> Void = { [weak self] decision, outcome in
            guard !finished else { return }
            finished = true
            self?.onOutcome?(outcome)
            done(decision)
        }
        read { [self] result in
            switch result {
            case .failure:
                finish(.fetch(record: nil), .fallback)
            case .success(let (record, rejectedGeneration)):
                if let record, adoptable(record, current: current, rejectedGeneration: rejectedGeneration) {
                    finish(.adopt(record), .hit)
                    return
                }
                tryLock(current: current, deadline: deadline, waited: false, lastRecord: record, finish: finish)
            }
        }
    }

    private func adoptable(_ record: SharedTokenRecord, current: String?, rejectedGeneration: UInt64?) -> Bool {
        if record.generation == rejectedGeneration { return false }
        if let current, record.accessToken.exposedValue == current { return false }
        return record.isFresh(wallClockNow: clock.wallClockSeconds())
    }

    /// Takes the lock (`SET NX PX`), or answers who holds it and its PTTL, in one atomic step
    /// (so the PTTL is the holder's): `{1}` taken; `{0, value, pttl}` held by another.
    static let takeLockScript = "if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1} end; "
        + "return {0, redis.call('get', KEYS[1]), redis.call('pttl', KEYS[1])}"
    /// Replaces the lock only while it still holds the value judged stale (another replica may
    /// have replaced it meanwhile): 1 replaced, 0 not.
    static let replaceLockScript = "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('set', KEYS[1], ARGV[2], 'PX', ARGV[3]); return 1 else return 0 end"

    /// The answer of `takeLockScript`.
    enum LockReply: Equatable {
        case taken
        /// Another holder: its value (nil if gone) and the `PTTL` reply.
        case held(value: [UInt8]?, pttl: Int64)

        init?(_ value: RESPValue) {
            guard case .array(let items?) = value, let first = items.first else { return nil }
            switch (first, items.count) {
            case (.integer(1), 1):
                self = .taken
            case (.integer(0), 3):
                guard case .integer(let pttl) = items[2] else { return nil }
                self = .held(value: items[1].bytes, pttl: pttl)
            default:
                return nil
            }
        }
    }

    private func tryLock(current: String?, deadline: MonotonicInstant, waited: Bool, lastRecord: SharedTokenRecord?,
                         finish: @escaping (Decision, Outcome) -> Void) {
        let ttl = lockTTL.wholeMilliseconds
        let value = SharedLockVerdict.lockValue(ttlMilliseconds: ttl, random: BearerdOAuth.hex((0..<16).map { _ in UInt8.random(in: 0...255) }))
        connection.send(["EVAL", Self.takeLockScript, "1", lockKey, value, String(ttl)]) { [self] r in
            observe(r)
            guard case .success(let reply) = r else {
                finish(.fetch(record: lastRecord), .fallback)
                return
            }
            switch LockReply(reply) {
            case .taken?:
                locked(value, current: current, waited: waited, lastRecord: lastRecord, finish: finish)
            case .held(let holder?, let pttl)?:
                switch SharedLockVerdict.judge(pttl: pttl, holder: holder, ownLockTTLMilliseconds: ttl) {
                case .wait:
                    // Another replica fetches: wait for its record.
                    poll(current: current, deadline: deadline, lastRecord: lastRecord, judgedLock: holder, finish: finish)
                case .retake:
                    poll(current: current, deadline: deadline, lastRecord: lastRecord, judgedLock: nil, finish: finish)
                case .replace:
                    replaceStaleLock(holder, pttl: pttl, with: value, current: current, deadline: deadline, lastRecord: lastRecord, finish: finish)
                }
            case .held(nil, _)?:
                // Gone meanwhile: the next poll takes it.
                poll(current: current, deadline: deadline, lastRecord: lastRecord, judgedLock: nil, finish: finish)
            case nil:
                // An error reply (e.g. OOM, read-only replica, scripts refused): fall back.
                cache.noteFailure(RedisFailure(kind: "server_error", detail: "taking the lock was refused"), session: sessionName)
                finish(.fetch(record: lastRecord), .fallback)
            }
        }
    }

    /// A lock no bearerd took (no expiry, or longer than any bearerd lock): replaced by ours, so
    /// nobody waits out a holder that will never publish.
    private func replaceStaleLock(_ holder: [UInt8], pttl: Int64, with value: String, current: String?, deadline: MonotonicInstant,
                                  lastRecord: SharedTokenRecord?, finish: @escaping (Decision, Outcome) -> Void) {
        let ttl = lockTTL.wholeMilliseconds
        connection.send([Array("EVAL".utf8), Array(Self.replaceLockScript.utf8), Array("1".utf8), Array(lockKey.utf8),
                         holder, Array(value.utf8), Array(String(ttl).utf8)]) { [self] r in
            observe(r)
            switch r {
            case .success(.integer(1)):
                cache.logger.warning("shared cache lock without expiry (or longer than bearerd's lock lifetime) replaced", metadata: [
                    "session": "\(sessionName)", "lock.pttl_ms": "\(pttl)", "lock.ttl_ms": "\(ttl)",
                ])
                onNotice?(.staleLockReplaced)
                locked(value, current: current, waited: false, lastRecord: lastRecord, finish: finish)
            case .success(.integer):
                // Replaced by someone else meanwhile: judge the new holder at the next poll.
                poll(current: current, deadline: deadline, lastRecord: lastRecord, judgedLock: nil, finish: finish)
            case .success, .failure:
                finish(.fetch(record: lastRecord), .fallback)
            }
        }
    }

    /// The lock is ours: read again under it (a record may have been published since the first read).
    private func locked(_ value: String, current: String?, waited: Bool, lastRecord: SharedTokenRecord?,
                        finish: @escaping (Decision, Outcome) -> Void) {
        heldLock = value
        read { [self] result in
            switch result {
            case .failure:
                finish(.fetch(record: lastRecord), .fallback)
            case .success(let (record, rejectedGeneration)):
                if let record, adoptable(record, current: current, rejectedGeneration: rejectedGeneration) {
                    release()
                    finish(.adopt(record), waited ? .lockWait : .hit)
                } else {
                    finish(.fetch(record: record), waited ? .lockWait : .miss)
                }
            }
        }
    }

    /// One wait for another replica's record: woken by its publish notification (SUBSCRIBE on
    /// the record's channel) or, as a fallback, every `pollInterval`.
    private final class Wait {
        enum Step {
            /// A poll is scheduled; `serial` tells the current schedule from older ones.
            case sleeping(serial: UInt64)
            /// An MGET is in flight (a wake-up then changes nothing).
            case reading
        }
        let current: String?
        let deadline: MonotonicInstant
        /// The newest record read (its refresh token is the lineage's newest known).
        var lastRecord: SharedTokenRecord?
        /// The holder's lock value judged live (nil: none judged yet); another value is judged again.
        let judgedLock: [UInt8]?
        let finish: (Decision, Outcome) -> Void
        var step: Step = .sleeping(serial: 0)
        var serial: UInt64 = 0
        init(current: String?, deadline: MonotonicInstant, lastRecord: SharedTokenRecord?, judgedLock: [UInt8]?,
             finish: @escaping (Decision, Outcome) -> Void) {
            self.current = current
            self.deadline = deadline
            self.lastRecord = lastRecord
            self.judgedLock = judgedLock
            self.finish = finish
        }
    }

    private func poll(current: String?, deadline: MonotonicInstant, lastRecord: SharedTokenRecord?, judgedLock: [UInt8]?,
                      finish: @escaping (Decision, Outcome) -> Void) {
        let w = Wait(current: current, deadline: deadline, lastRecord: lastRecord, judgedLock: judgedLock, finish: finish)
        wait = w
        subscribe()
        sleep(w)
    }

    private func sleep(_ w: Wait) {
        guard clock.now() < w.deadline else {
            // Waited long enough: fetch anyway (the lock holder may be stuck).
            if wait === w { wait = nil }
            w.finish(.fetch(record: w.lastRecord), .fallback)
            return
        }
        w.serial &+= 1
        let serial = w.serial
        w.step = .sleeping(serial: serial)
        clock.schedule(after: pollInterval, on: queue) { [weak self, weak w] in
            guard let self, let w, self.wait === w, case .sleeping(let s) = w.step, s == serial else { return }
            self.readOnce(w)
        }
    }

    /// A publish notification: read now instead of at the next poll.
    private func wake() {
        guard let w = wait, case .sleeping = w.step else { return }
        readOnce(w)
    }

    private func readOnce(_ w: Wait) {
        w.step = .reading
        connection.send(["MGET", recordKey, rejectedKey, lockKey]) { [self] r in
            guard wait === w else { return }
            observe(r)
            guard case .success(.array(let items?)) = r, items.count == 3 else {
                wait = nil
                w.finish(.fetch(record: w.lastRecord), .fallback)
                return
            }
            let record = decodeRecord(items[0])
            if let record { w.lastRecord = record }
            let rejectedGeneration = items[1].bytes.flatMap { UInt64(String(decoding: $0, as: UTF8.self)) }
            if let record, adoptable(record, current: w.current, rejectedGeneration: rejectedGeneration) {
                wait = nil
                w.finish(.adopt(record), .lockWait)
                return
            }
            switch items[2] {
            case .bulk(nil):
                // The holder released (or died and its lock expired) without a usable record.
                wait = nil
                tryLock(current: w.current, deadline: w.deadline, waited: true, lastRecord: w.lastRecord, finish: w.finish)
            case .bulk(let holder?) where holder != w.judgedLock:
                // Another holder than the one judged live (it may have set no expiry): judge it.
                wait = nil
                tryLock(current: w.current, deadline: w.deadline, waited: true, lastRecord: w.lastRecord, finish: w.finish)
            default:
                sleep(w)
            }
        }
    }

    /// Subscribes (once per subscriber connection) to the record's channel, where the lock
    /// holder's publish script announces a new record. Best effort: the poll covers a lost one.
    private func subscribe() {
        guard case .unsubscribed = subscription else { return }
        let subscriber = self.subscriber ?? {
            let c = RedisConnection(options: cache.options, loop: queue)
            c.onPush = { [weak self] value in
                if case .array(let items?) = value, items.first?.bytes == Array("message".utf8) { self?.wake() }
            }
            c.onFailure = { [weak self] in self?.subscription = .unsubscribed }
            self.subscriber = c
            return c
        }()
        subscription = .subscribing
        subscriber.send(["SUBSCRIBE", recordKey], timeout: .milliseconds(200)) { [weak self] r in
            guard let self else { return }
            if case .success(.array) = r { self.subscription = .subscribed } else { self.subscription = .unsubscribed }
        }
    }

    /// After `invalid_grant` on a refresh (docs/architecture.md §6.7): the current record
    /// (nil when there is none, it does not open, or Redis does not answer) and whether its access
    /// token may be adopted (fresh, not rejected, not `current`). `done` runs once on `queue`.
    func reread(current: String?, done: @escaping (SharedTokenRecord?, Bool) -> Void) {
        read { [self] result in
            switch result {
            case .failure:
                done(nil, false)
            case .success(let (record, rejectedGeneration)):
                done(record, record.map { adoptable($0, current: current, rejectedGeneration: rejectedGeneration) } ?? false)
            }
        }
    }

    /// MGET record, rejection mark.
    private func read(_ done: @escaping (Result<(SharedTokenRecord?, UInt64?), RedisFailure>) -> Void) {
        connection.send(["MGET", recordKey, rejectedKey]) { [self] r in
            observe(r)
            switch r {
            case .failure(let f):
                done(.failure(f))
            case .success(.array(let items?)) where items.count == 2:
                let rejectedGeneration = items[1].bytes.flatMap { UInt64(String(decoding: $0, as: UTF8.self)) }
                done(.success((decodeRecord(items[0]), rejectedGeneration)))
            case .success:
                done(.failure(RedisFailure(kind: "server_error", detail: "unexpected reply to MGET")))
            }
        }
    }

    private func decodeRecord(_ value: RESPValue) -> SharedTokenRecord? {
        guard case .bulk(let sealed?) = value else { return nil }
        guard let plain = cache.sealer.open(sealed, aad: Array(recordKey.utf8)), let record = SharedTokenRecord.decode(plain) else {
            // Another key, tampering, or garbage: ignored, and overwritten by our next publish.
            if !loggedCorrupt {
                loggedCorrupt = true
                cache.logger.warning("shared cache record does not open with key_file (another key, or corrupt): ignored and overwritten",
                                     metadata: ["session": "\(sessionName)"])
            }
            return nil
        }
        switch fence.verdict(for: record.generation) {
        case .accept:
            fence.raise(to: record.generation)
            return record
        case .refuseOlder(let floor):
            // Put back in Redis (or written very late): its refresh token may be one the server
            // has rotated already. Ignored, and overwritten by our next publish.
            if lastRefusedGeneration != record.generation {
                lastRefusedGeneration = record.generation
                cache.logger.warning("shared cache record older than one this session already came from (rolled back in Redis?): ignored and overwritten",
                                     metadata: ["session": "\(sessionName)", "record.generation": "\(record.generation)", "fence.generation": "\(floor)"])
                onNotice?(.olderRecordRefused)
            }
            return nil
        }
    }

    private func observe(_ r: Result<RESPValue, RedisFailure>) {
        switch r {
        case .failure(let f): cache.noteFailure(f, session: sessionName)
        case .success(.error(let message)):
            cache.noteFailure(RedisFailure(kind: "server_error", detail: String(message.prefix(80))), session: sessionName)
        case .success: cache.noteSuccess()
        }
    }

    // MARK: After a token request

    /// A token was adopted from `record`: its generation is the current one.
    func adopted(_ record: SharedTokenRecord) {
        currentGeneration = record.generation
    }

    /// A token obtained locally: publish it (as lock holder, or when nobody holds the lock),
    /// then release the lock.
    func publish(accessToken: String, tokenType: String, lifetime: Duration, refreshToken: String?) {
        let now = clock.wallClockSeconds()
        let seconds = Int64(clamping: lifetime.components.seconds)
        // Above every generation seen, and (through the wall clock in ms) unlikely to repeat one
        // another replica published without this one reading it. The one reserved for this
        // refresh (and persisted with its refresh token) unless a newer record was seen since.
        let generation: UInt64
        if let reserved = reservedGeneration, reserved >= fence.floor {
            generation = reserved
        } else {
            generation = fence.next(wallClockMilliseconds: now.multipliedSaturating(1000))
        }
        reservedGeneration = nil
        currentGeneration = generation
        let record = SharedTokenRecord(accessToken: OAuthSecret(accessToken), tokenType: tokenType, expiresAt: now.addingSaturating(seconds),
                                       lifetimeSeconds: seconds, generation: generation,
                                       refreshToken: keepsRefreshToken ? refreshToken.map(OAuthSecret.init) : nil)
        guard let sealed = cache.sealer.seal(record.encoded(), aad: Array(recordKey.utf8)) else {
            release()
            return
        }
        // The record lives until its token expires; a refresh-token lineage a week longer.
        var ttlMs = max(seconds, 1).multipliedSaturating(1000)
        if keepsRefreshToken { ttlMs = ttlMs.addingSaturating(7 * 86_400_000) }
        let script: String
        var args: [[UInt8]]
        if let held = heldLock {
            // Fencing: only the lock holder publishes, and releases in the same step.
            script = "if redis.call('get', KEYS[1]) == ARGV[1] then redis.call('set', KEYS[2], ARGV[2], 'PX', ARGV[3]); redis.call('del', KEYS[1]); redis.call('publish', KEYS[2], '1'); return 1 else return 0 end"
            args = [Array(held.utf8)]
        } else {
            // Without the lock (Redis was down when the fetch began): only when nobody holds it.
            script = "if redis.call('exists', KEYS[1]) == 0 then redis.call('set', KEYS[2], ARGV[2], 'PX', ARGV[3]); redis.call('publish', KEYS[2], '1'); return 1 else return 0 end"
            args = [Array("-".utf8)]
        }
        args.append(sealed)
        args.append(Array(String(ttlMs).utf8))
        heldLock = nil
        connection.send([Array("EVAL".utf8), Array(script.utf8), Array("2".utf8), Array(lockKey.utf8), Array(recordKey.utf8)] + args,
                        timeout: .milliseconds(200)) { [weak self] r in
            self?.observe(r)
        }
    }

    /// A token request failed (or a record was adopted under the lock): free the lock if we hold it.
    func release() {
        guard let held = heldLock else { return }
        heldLock = nil
        let script = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end"
        connection.send(["EVAL", script, "1", lockKey, held], timeout: .milliseconds(200)) { [weak self] r in
            self?.observe(r)
        }
    }

    /// A token that did not come through the cache (no record names it).
    func forgetGeneration() { currentGeneration = nil }

    func shutdown() {
        release()
        wait = nil
        subscriber?.shutdown()
        queue.schedule(after: .milliseconds(250)) { [connection] in connection.shutdown() }
    }
}

extension Duration {
    /// Whole milliseconds, saturating, never negative.
    var wholeMilliseconds: Int64 {
        let (s, a) = components
        guard s >= 0 else { return 0 }
        return s.multipliedSaturating(1000).addingSaturating(a / 1_000_000_000_000_000)
    }
}

extension Int64 {
    func addingSaturating(_ o: Int64) -> Int64 {
        let (r, v) = addingReportingOverflow(o)
        return v ? (o > 0 ? .max : .min) : r
    }
    func multipliedSaturating(_ o: Int64) -> Int64 {
        let (r, v) = multipliedReportingOverflow(by: o)
        return v ? ((self < 0) != (o < 0) ? .min : .max) : r
    }
}

extension SharedTokenCache {
    /// `bearerd check`: reads the key file and the password, connects (AUTH, SELECT), and writes,
    /// reads back, opens and deletes a sealed probe record under the prefix. Blocks (at most
    /// about 5 s): for the command line, never a loop. The answer names the server, never a secret.
    public static func check(_ config: SharedCacheConfig, file: String, environment: [String: String],
                             logger: Logger) -> Result<String, ConfigErrors> {
        let cache: SharedTokenCache
        do throws(ConfigErrors) {
            cache = try make(config, file: file, environment: environment, logger: logger)
        } catch {
            return .failure(error)
        }
        var options = cache.options
        options.commandTimeout = .seconds(2)
        options.connectTimeout = .seconds(2)
        let loop = EventLoop(index: 0, readBufferSize: 16 * 1024)
        let connection = RedisConnection(options: options, loop: loop)
        final class Box: @unchecked Sendable { var outcome: Result<String, ConfigValueError>? }  // @unchecked: written before `done` signals
        let box = Box()
        let done = DispatchSemaphore(value: 0)
        let probeKey = cache.prefix + "check:" + BearerdOAuth.hex((0..<8).map { _ in UInt8.random(in: 0...255) })
        let probe = Array("bearerd check".utf8)
        func finish(_ r: Result<String, ConfigValueError>) {
            box.outcome = r
            connection.shutdown()
            done.signal()
        }
        loop.execute {
            guard let sealed = cache.sealer.seal(probe, aad: Array(probeKey.utf8)) else {
                finish(.failure(ConfigValueError("cannot seal with key_file")))
                return
            }
            connection.send([Array("SET".utf8), Array(probeKey.utf8), sealed, Array("PX".utf8), Array("10000".utf8)]) { r in
                guard case .success(.simple("OK")) = r else {
                    finish(.failure(ConfigValueError(Self.describe(r))))
                    return
                }
                connection.send(["GET", probeKey]) { r in
                    // The probe is deleted before the answer (it also expires in 10 s).
                    connection.send(["DEL", probeKey]) { _ in
                        guard case .success(.bulk(let back?)) = r else {
                            finish(.failure(ConfigValueError(Self.describe(r))))
                            return
                        }
                        guard cache.sealer.open(back, aad: Array(probeKey.utf8)) == probe else {
                            finish(.failure(ConfigValueError("the probe record read back does not open with key_file")))
                            return
                        }
                        finish(.success("\(cache.options.endpoint) answers; key_file seals and opens records (prefix \(cache.prefix))"))
                    }
                }
            }
        }
        if done.wait(timeout: .now() + .seconds(5)) == .timedOut {
            return .failure(ConfigErrors([ConfigError(file: file, line: config.line, key: "shared_cache.url",
                                                      message: "\(config.endpoint): no answer within 5 s")]))
        }
        switch box.outcome {
        case .success(let s)?: return .success(s)
        case .failure(let why)?:
            return .failure(ConfigErrors([ConfigError(file: file, line: config.line, key: "shared_cache.url", message: "\(config.endpoint): \(why.message)")]))
        case nil:
            return .failure(ConfigErrors([ConfigError(file: file, line: config.line, key: "shared_cache.url", message: "no answer")]))
        }
    }

    private static func describe(_ r: Result<RESPValue, RedisFailure>) -> String {
        switch r {
        case .failure(let f): return f.description
        case .success(.error(let m)): return "the server answered an error (\(m.prefix(80)))"
        case .success(let v): return "unexpected reply \(v)"
        }
    }
}
