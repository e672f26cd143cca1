import BearerdConfig
import BearerdIO
import BearerdOAuth
import BearerdTLS
import Logging
import Synchronization

/// One `caller_jwt:` (a route's or an on-behalf-of session's; docs/architecture.md §6.16): the
/// caller IdP's keys and the validation of callers' tokens against them.
///
/// Owns the key set (`CallerJWTKeySet`: keys, fetch bookkeeping) and the requests waiting for a
/// fetch, both behind `state` (a `Mutex`): the loops validate on their own thread against a copy
/// of the keys (a signature check never holds the lock), and only a token whose key is unknown
/// takes the lock to ask for a fetch. The fetch itself, its timers and the file reads run on
/// `queue`. Invariants: at most one fetch in flight (the key set's rule); every waiter is resumed
/// exactly once, on its own loop, when the fetch it waited for ends (or the guard stops).
public final class CallerJWTGuard: @unchecked Sendable {  // @unchecked: mutable state in `state` or confined to `queue`
    public let config: CallerJWTConfig
    /// Names the guard in logs and metrics: `route /api/` or `session caller`.
    public let owner: String
    let queue: EventLoop
    private let clock: any SessionClock
    private let logger: Logger
    private let proxy: OutboundProxy.Endpoint?
    private let tls: TLSContext?
    private let crypto = OpenSSLCallerJWTCrypto()

    private struct State {
        var keys = CallerJWTKeySet()
        var waiters: [(EventLoop, () -> Void)] = []
        var stopped = false
        var lastProblem: String?
        /// Tokens already verified against the current keys, by the hash of the token, until their
        /// `exp` (plus leeway): a caller's next request skips the signature check. Emptied when the
        /// keys change and when it reaches `verifiedLimit` (a bound, not an LRU: refilling costs
        /// one signature check per caller).
        var verified: [CallerKey: CallerJWT.Validated] = [:]
        /// 401s of routes guarded by this `caller_jwt` alone, by reason.
        var refusals: [String: UInt64] = [:]
        var fetches: [String: UInt64] = [:]
    }
    private let state = Mutex(State())
    static let verifiedLimit = 10_000
    /// Queue only.
    private var refreshTimer: SessionTimer?
    private var inFlight: TokenEndpointClient?

    /// What `validate` answers.
    public enum Verdict: Sendable {
        case valid(CallerJWT.Validated)
        /// 401 `invalid_token` with this reason class; nothing is exchanged or forwarded.
        case invalid(CallerJWT.Failure)
        /// bearerd has never obtained the keys (the IdP is down): 503, not the caller's fault.
        case keysUnavailable(detail: String)
    }

    public init(config: CallerJWTConfig, owner: String, logger: Logger, outboundProxy: OutboundProxy,
                clock: any SessionClock = SystemSessionClock(), queueIndex: Int) throws(ConfigErrors) {
        self.config = config
        self.owner = owner
        self.clock = clock
        if case .url(let u) = config.keys {
            proxy = outboundProxy.endpoint(scheme: u.scheme, host: u.host, port: u.port)
        } else {
            proxy = nil
        }
        var l = logger
        l[metadataKey: "caller_jwt"] = "\(owner)"
        self.logger = l
        do throws(TLSError) {
            tls = try Self.tlsContext(config)
        } catch {
            throw ConfigErrors([ConfigError(file: "", line: config.line, key: "\(owner).caller_jwt.ca_file", message: "\(error)")])
        }
        queue = EventLoop(index: queueIndex, readBufferSize: 16 * 1024)
        Self.registry.withLock { list in
            list.removeAll { $0.guardian == nil }
            list.append(Weak(guardian: self))
        }
    }

    private struct Weak { weak var guardian: CallerJWTGuard? }
    private static let registry = Mutex<[Weak]>([])

    /// Every running guard's counters (`/metrics`), by owner; route guards and session guards.
    public static var snapshots: [(owner: String, refusals: [String: UInt64], fetches: [String: UInt64], keys: Int)] {
        let live = registry.withLock { $0.compactMap(\.guardian) }
        return live.map { g in
            let c = g.counters
            return (g.owner, c.refusals, c.fetches, c.keys)
        }.sorted { $0.owner < $1.owner }
    }

    /// Loads the keys (the first read of `jwks_file` or fetch of `jwks_url`) and arms the hourly
    /// refresh.
    public func start() {
        queue.execute { [self] in
            let start = state.withLock { $0.keys.startScheduledFetch(now: clock.now()) }
            if start { fetch() }
            scheduleRefresh()
        }
    }

    public func stop() {
        queue.execute { [self] in
            refreshTimer?.cancel()
            inFlight?.cancel(detail: "caller_jwt stopped")
            inFlight = nil
            let waiters = state.withLock { s in
                s.stopped = true
                defer { s.waiters = [] }
                return s.waiters
            }
            for (loop, resume) in waiters { loop.execute(resume) }
        }
    }

    /// Counts a 401 of a route this guard protects (without an on-behalf-of session).
    public func countRefusal(_ reason: String) {
        state.withLock { $0.refusals[reason, default: 0] &+= 1 }
    }

    /// For `/metrics`: refusals by reason, key set loads by outcome, keys loaded.
    public var counters: (refusals: [String: UInt64], fetches: [String: UInt64], keys: Int) {
        state.withLock { ($0.refusals, $0.fetches, $0.keys.keys.keys.count) }
    }

    /// The TLS context of an https `jwks_url` (system trust store plus `ca_file`); nil otherwise.
    static func tlsContext(_ config: CallerJWTConfig) throws(TLSError) -> TLSContext? {
        guard case .url(let url) = config.keys, url.isTLS else { return nil }
        return try TLSContext.client(caFile: config.caFile, clientCert: nil, clientKey: nil, alpn: [])
    }

    static let acceptKeySet: [(name: String, value: String)] = [("Accept", "application/jwk-set+json, application/json")]

    /// Whether keys were ever obtained (readiness).
    public var hasKeys: Bool { state.withLock { $0.keys.hasKeys } }
    /// The last fetch or file problem, for readiness and `bearerd check`.
    public var lastProblem: String? { state.withLock { $0.lastProblem } }

    /// Judges a caller's bearer token (`key`: its hash); `completion` runs exactly once on `loop`
    /// (at once, on the calling thread, when no fetch is needed: the caller is on `loop` already).
    public func validate(_ token: String, key: CallerKey, on loop: EventLoop, completion: @escaping (Verdict) -> Void) {
        let policy = config.policy
        let wall = clock.wallClockSeconds()
        // A token verified before against these keys, still within its `exp`: no signature check.
        // A copy of the keys otherwise: the signature is checked without the lock.
        let (known, snapshot) = state.withLock { s -> (CallerJWT.Validated?, CallerJWTKeySet?) in
            if let v = s.verified[key] {
                if v.expiresAt.addingReportingOverflow(policy.leewaySeconds).partialValue > wall { return (v, nil) }
                s.verified[key] = nil
            }
            return (nil, s.keys)
        }
        if let known {
            completion(.valid(known))
            return
        }
        guard var copy = snapshot else { return }
        let first = copy.validate(token, policy: policy, now: clock.now(), wallClockNow: wall)
        if let settled = settled(first) {
            if case .valid(let v) = settled { remember(v, key: key, against: copy) }
            completion(settled)
            return
        }
        // The decision again, on the shared set this time (it records a fetch it starts).
        let now = clock.now()
        let (verdict, mustFetch): (CallerJWTKeySet.Verdict, Bool) = state.withLock { s in
            let v = s.keys.validate(token, policy: policy, now: now, wallClockNow: clock.wallClockSeconds())
            switch v {
            case .fetchKeysAndRetry, .waitForKeysAndRetry:
                if s.stopped { return (.keysUnavailable, false) }
                s.waiters.append((loop, { [self] in completion(finalVerdict(token, policy: policy)) }))
                if case .fetchKeysAndRetry = v { return (v, true) }
                return (v, false)
            default:
                return (v, false)
            }
        }
        if mustFetch {
            logger.info("caller token signed with an unknown key; fetching the caller IdP's keys again", metadata: ["caller": "\(key.fingerprint)"])
            queue.execute { [self] in fetch() }
        }
        if let settled = settled(verdict) { completion(settled) }  // else queued
    }

    /// The answer for a key set's verdict; nil when it asks for a fetch (the token waits).
    private func settled(_ v: CallerJWTKeySet.Verdict) -> Verdict? {
        switch v {
        case .valid(let validated): return .valid(validated)
        case .invalid(let f): return .invalid(f)
        case .keysUnavailable: return .keysUnavailable(detail: unavailableDetail)
        case .fetchKeysAndRetry, .waitForKeysAndRetry: return nil
        }
    }

    /// Keeps `v` for its token's next requests, unless the keys changed since `copy` was taken.
    private func remember(_ v: CallerJWT.Validated, key: CallerKey, against copy: CallerJWTKeySet) {
        state.withLock { s in
            guard s.keys.loadedAt == copy.loadedAt else { return }
            if s.verified.count >= Self.verifiedLimit { s.verified.removeAll(keepingCapacity: true) }
            s.verified[key] = v
        }
    }

    /// After the fetch a token waited for: no second fetch is allowed now, so this is final.
    private func finalVerdict(_ token: String, policy: CallerJWT.Policy) -> Verdict {
        var copy = state.withLock { $0.keys }
        let v = copy.validate(token, policy: policy, now: clock.now(), wallClockNow: clock.wallClockSeconds())
        return settled(v) ?? (copy.hasKeys ? .invalid(.unknownKey) : .keysUnavailable(detail: unavailableDetail))
    }

    private var unavailableDetail: String {
        "the caller IdP's keys could not be obtained" + (lastProblem.map { ": " + $0 } ?? "")
    }

    /// `bearerd check`: loads the key set once, blocking (a command's thread, never a loop):
    /// the usable keys' ids and what was skipped, or why nothing could be loaded.
    public static func probe(_ config: CallerJWTConfig, outboundProxy: OutboundProxy) -> Result<(keyIDs: [String], skipped: [String]), ConfigError> {
        func fail(_ m: String) -> Result<(keyIDs: [String], skipped: [String]), ConfigError> {
            .failure(ConfigError(file: "", line: config.line, key: "caller_jwt", message: m))
        }
        let bytes: [UInt8]
        switch config.keys {
        case .file(let path):
            switch RegularFile.read(path, limit: JWKSet.maxDocumentBytes) {
            case .failure(let f): return fail("cannot read jwks_file \(path): \(f.reason)")
            case .success(let b): bytes = b
            }
        case .url(let url):
            let tls: TLSContext?
            do throws(TLSError) {
                tls = try tlsContext(config)
            } catch {
                return fail("\(error)")
            }
            let proxy = outboundProxy.endpoint(scheme: url.scheme, host: url.host, port: url.port)
            switch TokenEndpointClient.blocking(timeout: .seconds(10), { loop, done in
                TokenEndpointClient.get(url, headers: acceptKeySet, tls: tls, proxy: proxy,
                                        on: loop, completion: done)
            }) {
            case .response(200, _, let body): bytes = body
            case .response(let status, _, _): return fail("jwks_url \(url) answered \(status)")
            case .tooLarge(let status): return fail("jwks_url \(url) answered \(status) with a body over the limit")
            case .transportFailure(let detail, _): return fail("jwks_url \(url): \(detail)")
            }
        }
        do throws(JWKSet.Problem) {
            let set = try JWKSet(parsing: bytes, crypto: OpenSSLCallerJWTCrypto())
            return .success((set.keys.map { $0.jwk.keyID ?? "(no kid)" }, set.skipped.map(\.description)))
        } catch {
            return fail("the key set: \(error)")
        }
    }

    // MARK: queue

    private func scheduleRefresh() {
        refreshTimer?.cancel()
        refreshTimer = clock.schedule(after: CallerJWTKeySet.minimumRefetchInterval, on: queue) { [self] in
            let start = state.withLock { s in s.stopped ? false : s.keys.startScheduledFetch(now: clock.now()) }
            if start { fetch() }
            if !state.withLock({ $0.stopped }) { scheduleRefresh() }
        }
    }

    private func loadFile(_ path: String) {
        let now = clock.now()
        switch RegularFile.read(path, limit: JWKSet.maxDocumentBytes) {
        case .failure(let f):
            finishFetch(.failure("cannot read \(path): \(f.reason)"), now: now)
        case .success(let bytes):
            do throws(JWKSet.Problem) {
                finishFetch(.success(try JWKSet(parsing: bytes, crypto: crypto)), now: now)
            } catch {
                finishFetch(.failure("\(path): \(error)"), now: now)
            }
        }
    }

    /// One fetch of `jwks_url`, or one read of `jwks_file` (a mounted file rotates too); the key
    /// set recorded it as started.
    private func fetch() {
        let url: EndpointURL
        switch config.keys {
        case .file(let path):
            loadFile(path)
            return
        case .url(let u):
            url = u
        }
        guard inFlight == nil else { return }
        let client = TokenEndpointClient.get(url, headers: Self.acceptKeySet, tls: tls,
                                             proxy: proxy, on: queue) { [self] outcome in
            inFlight = nil
            let now = clock.now()
            switch outcome {
            case .response(let status, _, let body) where status == 200:
                do throws(JWKSet.Problem) {
                    finishFetch(.success(try JWKSet(parsing: body, crypto: crypto)), now: now)
                } catch {
                    finishFetch(.failure("\(url): \(error)"), now: now)
                }
            case .response(let status, _, _):
                finishFetch(.failure("\(url) answered \(status)"), now: now)
            case .tooLarge(let status):
                finishFetch(.failure("\(url) answered \(status) with a body over the limit"), now: now)
            case .transportFailure(let detail, _):
                finishFetch(.failure("\(url): \(detail)"), now: now)
            }
        }
        inFlight = client
        clock.schedule(after: .seconds(10), on: queue) { [weak client] in client?.cancel(detail: "the key set fetch timed out after 10s") }
    }

    private enum FetchResult { case success(JWKSet), failure(String) }

    private func finishFetch(_ result: FetchResult, now: MonotonicInstant) {
        let waiters: [(EventLoop, () -> Void)] = state.withLock { s in
            switch result {
            case .success(let set):
                s.keys.fetchSucceeded(set, now: now)
                s.lastProblem = nil
                s.verified.removeAll()  // a key the IdP withdrew verifies nothing from now on
                s.fetches["ok", default: 0] &+= 1
            case .failure(let why):
                s.keys.fetchFailed(now: now)
                s.lastProblem = why
                s.fetches["failed", default: 0] &+= 1
            }
            defer { s.waiters = [] }
            return s.waiters
        }
        switch result {
        case .success(let set):
            logger.info("caller IdP keys loaded", metadata: ["keys": "\(set.keys.count)", "skipped": "\(set.skipped.count)"])
            for skip in set.skipped { logger.notice("caller IdP key skipped", metadata: ["reason": "\(skip)"]) }
        case .failure(let why):
            logger.warning("cannot load the caller IdP's keys; the keys there were stay in use", metadata: ["error": "\(why)"])
        }
        for (loop, resume) in waiters { loop.execute(resume) }
    }
}
