import BearerdTLS
import BearerdIO
import Dispatch
import BearerdOAuth
import Logging
import Synchronization
import BearerdConfig
import BearerdProxyCore

/// One token session's driver (docs/architecture.md §2.5, §6): carries out `TokenSession.StateMachine`'s
/// actions on the session's own serial queue (an `EventLoop`, which also runs the token
/// request's socket), publishes the current token for the loops' fast path, and keeps the
/// persisted state of refresh_token sessions.
///
/// Owns, on `queue`: the state machine, the waiters (each a caller's loop and completion),
/// the session timer, the token request in flight, the settings and the state store.
/// Publishes, through `TokenPublication`: the current token for the loops' lock-free fast path,
/// and what the admin endpoints read: status, expiry, waiter count, last failure, counters.
///
/// Time is an argument (STYLE "Three rings"): every reading of the monotonic or the wall clock
/// and every timer goes through `clock` (`SystemSessionClock` but in tests).
///
/// Invariants: every waiter handed to the machine is completed exactly once, with
/// `loop.execute` on its own loop; at most one token request in flight (the machine's rule);
/// a rotated refresh token is persisted before `fetchSucceeded` hands the access token out;
/// no token, refresh token or secret is ever logged (only `fingerprint`s).
public final class TokenSessionDriver: @unchecked Sendable {  // @unchecked: state confined to `queue`; what others read is in `publication`
    public let name: String
    let grant: GrantType
    /// `dpop: true`: the session's DPoP key, nonces and skew (RFC 9449), for the loops' proofs.
    /// Fixed for the driver's life: a reload that changes the key makes a new driver.
    public let dpop: DPoPProofer?
    let stateDirectory: String?
    let queue: EventLoop
    /// Every reading of time and every timer of the session (the real clocks but in tests).
    let clock: any SessionClock
    private let logger: Logger

    /// The token and the facts other threads read (any thread; written on `queue` only).
    private let publication = TokenPublication()
    /// Sink files and token API hand-outs (docs/architecture.md §4); writes run on its own queue.
    public let outlets: TokenOutlets
    /// A signing session's clock offset and counters, shared with the loops (nil for tokens).
    /// Fixed for the driver's life (docs/architecture.md §6.15).
    public let signing: SigningState?

    // Session queue only.
    private var settings: SessionSettings
    private var machine: TokenSession.StateMachine
    private let store: StateStore?
    /// refresh_token sessions: the state our refresh token comes from (the state file's
    /// content as we last wrote or adopted it, or the operator file's token).
    private var own: PersistedSessionState?
    private var waiters: [TokenSession.WaiterID: Waiter] = [:]
    private var nextWaiterID: UInt64 = 0
    private var timerSerial: UInt64 = 0
    /// The one session timer (refresh or retry) while armed.
    private var sessionTimer: SessionTimer?
    private var inFlight: TokenEndpointClient?
    private var fetchSerial: UInt64 = 0
    private var stopped = false
    private var lastConverted: PublishedToken?
    /// Whether `own` is on disk (docs/architecture.md §6.7). While `.failing`, a retry is scheduled.
    private enum Persistence {
        case persisted
        /// `attempt` failed writes in a row; `serial` identifies the scheduled retry.
        case failing(attempt: Int, serial: UInt64)
    }
    private var persistence: Persistence = .persisted
    /// Where the state file's `flock` is waited for, off the session queue.
    private lazy var stateQueue = DispatchQueue(label: "bearerd.session-state." + name)
    private var persistSerial: UInt64 = 0

    private enum Waiter {
        case token(EventLoop, (Result<PublishedToken, TokenUnavailable>) -> Void)
        /// `reportedAt`: when the session learned of the rejection (the instant given to the machine).
        case rejection(EventLoop, generation: UInt64, reportedAt: MonotonicInstant, route: String, (RejectionOutcome) -> Void)
    }

    /// The highest generation an upstream is known to have accepted (any thread, lock-free):
    /// only the first acceptance per generation crosses to the session queue.
    private let provenGeneration = Atomic<UInt64>(0)
    /// `subject_session:` lookup (token_exchange sessions that chain): set once by the
    /// `SessionManager` before `start()`, read on the session queue.
    var sessionLookup: (@Sendable (String) -> TokenSessionDriver?)?

    /// `shared_cache:` (docs/architecture.md §6.13): set once by the `SessionManager` before
    /// `start()`; used on the session queue (see the extension at the end of this file).
    var shared: SharedTokenSession?
    /// Session queue: where an adopted token handed to `finishFetch` comes from.
    private enum AdoptionSource { case stateFile, sharedCache }
    private var adoptionSource: AdoptionSource = .stateFile

    /// Signing sessions with a `state_dir` (docs/architecture.md §6.15): the keys kept in
    /// `<state_dir>/<session>.token.json` (0600, `bearerd token`'s cache, same binding), written
    /// after every fetch and adopted by the first fetch after a restart while they last. Session
    /// queue only.
    private let credentialCache: TokenCache?

    /// `subject: caller` / `assertion: caller` (docs/architecture.md §6.16): the per-caller
    /// exchanges. Such a session has no token of its own: its state machine never runs. Set
    /// once by the `SessionManager` before `start()`; fixed for the driver's life (a reload that
    /// changes `caller_cache` or `caller_jwt` makes a new driver).
    public internal(set) var caller: CallerSessionDriver?

    /// Session queue: the routes whose rejections were already logged while the breaker is
    /// open (one error line per breaker streak and route; the rest only counted).
    private var breakerLoggedRoutes: Set<String> = []

    /// Token-request spans (docs/architecture.md §2.9); set once by the `SessionManager` before
    /// `start()`, then session queue only.
    var tracing = SessionTracing(tracer: nil)

    init(settings: SessionSettings, policy: TokenSession.Policy, store: StateStore?, logger: Logger, queueIndex: Int,
         clock: any SessionClock = SystemSessionClock(), credentialCache: TokenCache? = nil) {
        name = settings.config.name
        self.credentialCache = settings.config.grant.isSigning ? credentialCache : nil
        self.clock = clock
        grant = settings.config.grant
        signing = settings.config.grant.isSigning ? SigningState() : nil
        dpop = settings.dpop
        stateDirectory = store?.directory
        self.settings = settings
        self.store = store
        self.machine = TokenSession.StateMachine(policy: policy, random: SystemRandomNumberGenerator())
        var l = logger
        l[metadataKey: "session"] = "\(settings.config.name)"
        self.logger = l
        outlets = TokenOutlets(plan: settings.sinkPlan ?? TokenSinkPlan(session: settings.config.name, sinks: settings.config.sinks), logger: l, clock: clock)
        queue = EventLoop(index: queueIndex, readBufferSize: 64 * 1024)
        if grant.usesRefreshToken {
            // Read once without the lock: the state is replaced by rename, never torn.
            own = chooseStartingState(stored: readStoredState())
        }
    }

    // MARK: Public API

    /// The published token if it may be used now without asking the session (before its hard
    /// point, not rejected). Hot path: a lock held for a copy, no hop.
    public func usableToken(now: UInt64) -> PublishedToken? {
        let p = publishedToken
        guard let p, now < p.usableUntil else { return nil }
        return p
    }

    /// Slow path: the token once the session has one (joining the one fetch in flight), or why
    /// none can be had. `completion` runs exactly once, with `loop.execute`.
    /// `trace`: the waiting exchange's span, parent of the token request it may wait for.
    public func requestToken(on loop: EventLoop, trace: TraceContext? = nil,
                             completion: @escaping (Result<PublishedToken, TokenUnavailable>) -> Void) {
        queue.execute { [self] in
            guard !stopped else {
                loop.execute { completion(.failure(TokenUnavailable(session: self.name, retryAfterSeconds: 1, detail: "token.session_stopped"))) }
                return
            }
            tracing.join(trace)
            adoptNewSignInIfAny(throttled: true)
            let id = allocateWaiter(.token(loop, completion))
            run(machine.tokenRequested(waiter: id, now: now()))
        }
    }

    /// When a person's session waits for `bearerd login` (no refresh token yet, or the server
    /// refused it): a state file written by `login` since is adopted at once, so "login, then
    /// curl" works against a running bearerd without SIGHUP. Requests check at most once a
    /// second; SIGHUP checks always. Session queue.
    private var lastSignInCheck: UInt64 = 0
    private func adoptNewSignInIfAny(throttled: Bool) {
        guard grant.isPersonal, machine.status == .needsReauthentication || own == nil else { return }
        let t = now().nanoseconds
        if throttled && t &- lastSignInCheck < 1_000_000_000 && lastSignInCheck != 0 { return }
        lastSignInCheck = t
        guard let stored = readStoredState(), stored.refreshToken != own?.refreshToken else { return }
        own = stored
        logger.info("new sign-in found in the state file", metadata: ["session": "\(name)",
                                                                        "refresh_token.fingerprint": "\(stored.refreshToken.fingerprint)"])
        run(machine.credentialsChanged(now: now(), reissue: true))
    }

    /// The upstream rejected a request sent with `generation` on `route` (docs/architecture.md §6 "401 →
    /// refresh → replay"). An older generation gets `.replay(current, refreshed: false)` at once while the
    /// current token is in service; the current one is marked rejected (compare-and-swap in the
    /// state machine) and the one forced refresh is joined or started; `.passThrough` when the
    /// breaker is open, `.unavailable` when no newer token could be had within the wait bound.
    public func reportRejected(generation: UInt64, route: String = "", on loop: EventLoop, trace: TraceContext? = nil,
                               completion: @escaping (RejectionOutcome) -> Void) {
        if let current = publication.token, generation < current.generation, now().nanoseconds < current.usableUntil {
            loop.execute { completion(.replay(current, refreshed: false)) }
            return
        }
        queue.execute { [self] in
            guard !stopped else {
                loop.execute { completion(.passThrough(reason: "token.session_stopped")) }
                return
            }
            let reportedAt = now()
            tracing.join(trace)
            let id = allocateWaiter(.rejection(loop, generation: generation, reportedAt: reportedAt, route: route, completion))
            run(machine.upstreamRejected(generation: generation, waiter: id, now: reportedAt))
        }
    }

    /// A rejection that is relayed anyway (its body was not kept, or its method is not
    /// replayed): the session refreshes for later requests; nobody waits for the outcome.
    public func reportRejectedWithoutReplay(generation: UInt64) {
        queue.execute { [self] in
            guard !stopped else { return }
            run(machine.upstreamRejected(generation: generation, waiter: nil, now: now()))
        }
    }

    /// An upstream answered a request carrying `generation` with a status that is not a
    /// rejection: the token is proven (docs/architecture.md §6.9). Hot path: one relaxed atomic load
    /// per response; only the first acceptance of each generation hops to the session queue.
    @inline(__always)
    public func noteAccepted(generation: UInt64) {
        if provenGeneration.load(ordering: .relaxed) >= generation { return }
        noteFirstAcceptance(generation)
    }

    private func noteFirstAcceptance(_ generation: UInt64) {
        var seen = provenGeneration.load(ordering: .relaxed)
        while seen < generation {
            let (exchanged, original) = provenGeneration.compareExchange(expected: seen, desired: generation, ordering: .relaxed)
            if exchanged {
                queue.execute { [self] in
                    guard !stopped else { return }
                    run(machine.upstreamAccepted(generation: generation, now: now()))
                }
                return
            }
            seen = original
        }
    }

    /// A signing session (`grant: aws`, `grant: aliyun`): its "token" is its keys. Thread-safe.
    public var isSigning: Bool { grant.isSigning }

    /// The generation of the published token (0 before the first). Thread-safe.
    public var currentGeneration: UInt64 {
        publication.read { $0.generation }
    }

    /// The session's coarse state as of its last event (for `/readyz` and `bearerd check`:
    /// `.needsReauthentication` means a new refresh token is needed). Thread-safe.
    public var status: TokenSession.Status {
        publication.read { $0.status }
    }

    /// The session's counters (for `/metrics`). Thread-safe.
    public var metrics: SessionMetrics {
        publication.read { $0.counters }
    }

    /// Counters, gauges and readiness facts in one consistent read (for `/metrics` and
    /// `/readyz`). Thread-safe; carries no token.
    public var snapshot: SessionSnapshot {
        var s = publication.read { p in
            SessionSnapshot(name: name, counters: p.counters, status: p.status, generation: p.generation,
                            expiresAt: p.expiresAt, waiters: p.waiters, lastFailure: p.failure,
                            persistFailure: p.persistFailure)
        }
        if let dpop { s.dpopNonceRetries = (dpop.nonceRetries(.tokenEndpoint), dpop.nonceRetries(.upstream)) }
        s.sinks = outlets.sinkStatuses
        s.apiHandouts = outlets.apiHandouts
        s.signing = signing?.counters
        if let shared { s.sharedCacheDegraded = shared.cache.isDegraded }
        if let caller {
            let c = caller.snapshot
            s.caller = c
            if !c.keysReady { s.lastFailure = "caller_jwt: the caller IdP's keys are not loaded" + (c.keysProblem.map { ": " + $0 } ?? "") }
        }
        return s
    }

    private func count(_ body: (inout SessionMetrics) -> Void) {
        publication.update { body(&$0.counters) }
    }

    func start() {
        if let caller {
            caller.start()
            return
        }
        queue.execute { [self] in
            guard !stopped else { return }
            run(machine.start(now: now()))
        }
    }

    func update(_ newSettings: SessionSettings) {
        queue.execute { [self] in
            guard !stopped else { return }
            var newSettings = newSettings
            // The key is the same (else a new driver): keep its nonces and the measured skew.
            newSettings.dpop = settings.dpop
            newSettings.clockSkew = settings.clockSkew
            let changed = newSettings.credentialsDiffer(from: settings)
            let reissue = newSettings.identityDiffers(from: settings)
            let operatorChanged = newSettings.operatorFingerprint != settings.operatorFingerprint
            settings = newSettings
            outlets.configure(newSettings.sinkPlan ?? TokenSinkPlan(session: name, sinks: newSettings.config.sinks))
            if grant.usesRefreshToken, operatorChanged {
                // A refresh in flight keeps the lock and finishes with the old lineage; the
                // next one starts from the new file (its fingerprint differs from the state's).
                own = chooseStartingState(stored: readStoredState())
            }
            adoptNewSignInIfAny(throttled: false)
            if caller != nil {
                // Callers' exchanges read the settings at each exchange; there is no token to renew.
                if changed { logger.info("session credentials reloaded") }
                return
            }
            // Re-sending a refresh token the server called dead, unchanged, would be pointless.
            if changed || machine.status != .needsReauthentication {
                if changed { logger.info("session credentials reloaded", metadata: ["token.reissue": "\(reissue)"]) }
                run(machine.credentialsChanged(now: now(), reissue: reissue))
            }
        }
    }

    func stop() {
        caller?.stop()
        queue.execute { [self] in
            guard !stopped else { return }
            stopped = true
            outlets.stop()
            cancelSessionTimer()
            let pending = waiters
            waiters = [:]
            publication.update { $0.waiters = 0 }
            inFlight?.cancel(detail: "session stopped")
            inFlight = nil
            shared?.shutdown()
            store?.unlock()
            for (_, w) in pending {
                switch w {
                case .token(let loop, let completion):
                    let failure = TokenUnavailable(session: name, retryAfterSeconds: 1, detail: "token.session_stopped")
                    loop.execute { completion(.failure(failure)) }
                case .rejection(let loop, _, _, _, let completion):
                    loop.execute { completion(.passThrough(reason: "token.session_stopped")) }
                }
            }
        }
    }

    // MARK: Carrying out actions (session queue)

    private func now() -> MonotonicInstant { clock.now() }

    private func allocateWaiter(_ w: Waiter) -> TokenSession.WaiterID {
        nextWaiterID &+= 1
        let id = TokenSession.WaiterID(nextWaiterID)
        waiters[id] = w
        return id
    }

    /// - Parameter afterWaiterTimeout: the actions answer `waiterTimedOut` (a token given to a
    ///   waiter then is counted as a `wait_timeout` stale serve).
    private func run(_ actions: [TokenSession.StateMachine.Action], afterWaiterTimeout: Bool = false) {
        guard !stopped else { return }
        defer {
            let s = machine.status
            let w = waiters.count
            publication.update {
                $0.status = s
                $0.waiters = w
            }
        }
        for action in actions {
            switch action {
            case .startFetch(let request):
                // Asynchronously, so the rest of this batch is carried out first (a fetch may
                // be answered at once from the state file).
                queue.execute { [self] in
                    guard !stopped else { return }
                    performFetch(request)
                }
            case .resumeWaiters(let ids, let result):
                for id in ids { resume(id, result, afterWaiterTimeout: afterWaiterTimeout) }
            case .scheduleWaiterTimeout(let id, let at):
                // Only a waiter that is kept waiting gets a timeout: one who waits for the shared fetch.
                count { $0.waits += 1 }
                clock.schedule(at: at, on: queue) { [weak self] in
                    guard let self, !self.stopped, self.waiters[id] != nil else { return }
                    self.run(self.machine.waiterTimedOut(waiter: id, now: self.now()), afterWaiterTimeout: true)
                }
            case .scheduleRefresh(let at):
                armTimer(at: at, retry: false)
            case .scheduleRetry(let at):
                armTimer(at: at, retry: true)
            case .cancelTimer:
                cancelSessionTimer()
            case .publish(let token):
                publish(token)
            case .reportBreakerTripped(let until):
                count { $0.breakerTrips += 1 }
                breakerLoggedRoutes = []  // A new streak: each route's first rejection is logged again.
                logger.error("upstream rejections are not about our token: forced refreshes stop for a while and the rejections go to the clients", metadata: [
                    "breaker.open_for_s": "\(Int((until - now()).secondsDouble.rounded(.up)))",
                ])
            case .reportNeedsReauthentication(let failure):
                store?.markNeedsReauthentication(.of(failure), operatorFingerprint: settings.operatorFingerprint)
                if settings.config.grant.isPersonal {
                    logger.error("session \(name) needs a new sign-in: run `bearerd login \(name)`", metadata: failureMetadata(failure))
                } else {
                    let file = settings.config.refreshTokenFile ?? "refresh_token_file"
                    logger.error("session \(name) needs a new refresh token: put one in \(file) and send SIGHUP", metadata: failureMetadata(failure))
                }
            case .reportNegativeCached(let failure, let until):
                var m = failureMetadata(failure)
                m["retry_in_s"] = "\(Int((until - now()).secondsDouble.rounded(.up)))"
                logger.error("token endpoint refused the session's credentials; not retried for a while", metadata: m)
            }
        }
    }

    /// One session timer: a new schedule replaces the old (a serial number makes older firings
    /// no-ops). A firing that comes early (clock rounding) re-arms for the rest.
    private func armTimer(at: MonotonicInstant, retry: Bool) {
        cancelSessionTimer()
        arm(serial: timerSerial, at: at, retry: retry)
    }

    private func cancelSessionTimer() {
        timerSerial &+= 1
        sessionTimer?.cancel()
        sessionTimer = nil
    }

    private func arm(serial: UInt64, at: MonotonicInstant, retry: Bool) {
        sessionTimer = clock.schedule(at: at, on: queue) { [weak self] in
            guard let self, !self.stopped, self.timerSerial == serial else { return }
            let n = self.now()
            if n < at { self.arm(serial: serial, at: at, retry: retry); return }
            self.run(retry ? self.machine.retryTimerFired(now: n) : self.machine.refreshTimerFired(now: n))
        }
    }

    private func publish(_ token: TokenSession.CurrentToken?) {
        let p = token.map(convert)
        let expiresAt = token?.expiresAt.nanoseconds
        publication.publish(p, expiresAt: expiresAt)
        if let token, let p { outlets.tokenPublished(token, published: p) }
    }

    /// The published token, usable or not (loops cache it per version).
    public var publishedToken: PublishedToken? { publication.token }

    /// The version of the published token (`TokenPublication`). Any thread, lock-free.
    @inline(__always)
    public var publishedVersion: UInt64 { publication.currentVersion }

    private func convert(_ t: TokenSession.CurrentToken) -> PublishedToken {
        let until = t.usableWithoutWaitingUntil.nanoseconds
        if let last = lastConverted, last.generation == t.generation, last.usableUntil == until {
            return last
        }
        let same = lastConverted.flatMap { $0.generation == t.generation ? $0 : nil }
        // A signing session's keys: decoded once per generation; the fingerprint names the key id.
        let keys = grant.isSigning ? (same?.signingKeys ?? TemporaryCredentials(encodedToken: t.accessToken)) : nil
        let fp = same?.fingerprint ?? keys.map { BearerdOAuth.fingerprint($0.accessKeyID) } ?? t.accessToken.fingerprint
        let p = PublishedToken(value: t.accessToken.exposedValue, generation: t.generation, fingerprint: fp, usableUntil: until,
                               signingKeys: keys)
        lastConverted = p
        return p
    }

    private func resume(_ id: TokenSession.WaiterID, _ result: TokenSession.WaiterResult, afterWaiterTimeout: Bool) {
        guard let w = waiters.removeValue(forKey: id) else { return }
        // Before the completion runs, so a caller that has its answer never sees itself counted.
        let remaining = waiters.count
        publication.update { $0.waiters = remaining }
        switch w {
        case .token(let loop, let completion):
            switch result {
            case .token(let t):
                if !t.isUsableWithoutWaiting(at: now()) {
                    // Past its hard point or rejected, still before expiry (docs/architecture.md §6.3).
                    let reason: StaleTokenReason = afterWaiterTimeout ? .waitTimeout
                        : (machine.status == .ready ? .noProgress : .refreshFailed)
                    count { $0.staleServes[reason.rawValue] += 1 }
                }
                let p = convert(t)
                loop.execute { completion(.success(p)) }
            case .failure(let u), .passThrough(let u):  // `.passThrough` is only for rejections.
                let failure = TokenUnavailable(session: name, retryAfterSeconds: u.retryAfterSeconds, detail: u.detail)
                loop.execute { completion(.failure(failure)) }
            }
        case .rejection(let loop, let generation, let reportedAt, let route, let completion):
            switch result {
            case .token(let t) where t.generation > generation:
                let p = convert(t)
                // Requested before we learned of the rejection (the current token for an older
                // generation, or a fetch already in flight): the same revocation may have killed it.
                let refreshed = t.wasRequested(atOrAfter: reportedAt)
                loop.execute { completion(.replay(p, refreshed: refreshed)) }
            case .token:
                // No newer token (the machine hands out no rejected one; this is a safety net):
                // never relay the upstream's rejection for a token we could not renew.
                countNotReplayed("refresh_failed")
                let failure = TokenUnavailable(session: name, retryAfterSeconds: 1, detail: "token.refresh_failed")
                loop.execute { completion(.unavailable(failure)) }
            case .failure(let u):
                countNotReplayed(Self.label(u.reason))
                let failure = TokenUnavailable(session: name, retryAfterSeconds: u.retryAfterSeconds, detail: u.detail)
                loop.execute { completion(.unavailable(failure)) }
            case .passThrough(let u):
                countNotReplayed(Self.label(u.reason))
                if breakerLoggedRoutes.insert(route).inserted {
                    logger.error("upstream rejections go to the clients while the breaker is open (logged once per route and breaker streak; see bearerd_rejections_not_replayed_total)", metadata: [
                        "route": "\(route)", "reason": "\(u.reason)", "breaker.open_for_s": "\(u.retryAfterSeconds)",
                    ])
                }
                let reason = u.reason
                loop.execute { completion(.passThrough(reason: reason)) }
            }
        }
    }

    /// `token.breaker_open` → `breaker_open`: the `reason` label (a bounded vocabulary: the
    /// state machine's reasons).
    static func label(_ reason: String) -> String {
        reason.hasPrefix("token.") ? String(reason.dropFirst(6)) : reason
    }

    private func countNotReplayed(_ reason: String) {
        count { $0.rejectionsNotReplayed[reason, default: 0] &+= 1 }
    }

    // MARK: Fetching (session queue)

    private func performFetch(_ request: TokenSession.FetchRequest) {
        let startedAt = now().nanoseconds
        tracing.begin(grant: grant.rawValue, reason: request.reason.rawValue, attempt: request.attempt)
        if request.reason == .rejected && request.attempt == 1 && request.round == 1 && !request.isSameTokenRetry {
            count { $0.forcedRefreshes += 1 }
        }
        if let shared, !request.isSameTokenRetry {
            fetchThroughSharedCache(shared, request, startedAt: startedAt)
            return
        }
        performLocalFetch(request, startedAt: startedAt)
    }

    /// The fetch itself (no shared cache, or the cache said to fetch).
    private func performLocalFetch(_ request: TokenSession.FetchRequest, startedAt: UInt64) {
        if grant.usesRefreshToken {
            performRefreshFetch(request, startedAt: startedAt)
            return
        }
        if grant == .exec {
            runCommand(request, startedAt: startedAt)
            return
        }
        if grant.isSigning {
            fetchCredentials(request, startedAt: startedAt)
            return
        }
        if let subject = settings.config.exchange?.subjectSession {
            performChainedExchange(request, subject: subject, startedAt: startedAt)
            return
        }
        send(settings.preparedRequest(refreshToken: nil), request) { [self] sentAt, result, requestSent in
            finishFetch(request, startedAt: startedAt, sentAt: sentAt, result: result, requestSent: requestSent, adopted: false)
        }
    }

    /// `subject_session:` (RFC 8693 chains): the subject session's current access token,
    /// asked for asynchronously (its answer comes back on this queue, nothing blocks), is
    /// exchanged. When the server refuses that token (`invalid_grant`), the subject session is
    /// told through its rejection path (the generation that was sent: a newer token is used at
    /// once, else it refreshes once), and the exchange is retried once with the new token.
    private func performChainedExchange(_ request: TokenSession.FetchRequest, subject: String, startedAt: UInt64) {
        guard let driver = sessionLookup?(subject) else {
            finishFetch(request, startedAt: startedAt, sentAt: now(), result: .failure(TokenEndpointFailure(
                classification: .retryable, reason: "credential.subject_unavailable",
                errorDescription: "subject_session \(subject) is not running")), requestSent: false, adopted: false)
            return
        }
        let serial = fetchSerial
        driver.requestToken(on: queue) { [self] result in
            guard !stopped, fetchSerial == serial else { return }
            switch result {
            case .failure(let unavailable):
                finishFetch(request, startedAt: startedAt, sentAt: now(), result: .failure(TokenEndpointFailure(
                    classification: .retryable, reason: "credential.subject_unavailable",
                    errorDescription: "subject_session \(subject): \(unavailable.detail)")), requestSent: false, adopted: false)
            case .success(let token):
                sendExchange(request, subject: driver, token: token, retried: false, startedAt: startedAt)
            }
        }
    }

    private func sendExchange(_ request: TokenSession.FetchRequest, subject driver: TokenSessionDriver, token: PublishedToken,
                              retried: Bool, startedAt: UInt64) {
        send(settings.preparedRequest(refreshToken: nil, subjectToken: OAuthSecret(token.value)), request) { [self] sentAt, result, requestSent in
            switch result {
            case .success:
                driver.noteAccepted(generation: token.generation)  // the STS took it: proven
            case .failure(let f) where f.classification == .invalidGrant && !retried:
                count { $0.tokenExchanges["subject_rejected", default: 0] &+= 1 }
                logger.warning("the token endpoint refused the subject session's token; refreshing that session and retrying once", metadata: [
                    "subject_session": "\(driver.name)", "subject.generation": "\(token.generation)",
                    "subject.fingerprint": "\(token.fingerprint)",
                ])
                let serial = fetchSerial
                driver.reportRejected(generation: token.generation, route: "subject_session of \(name)", on: queue) { [self] outcome in
                    guard !stopped, fetchSerial == serial else { return }
                    switch outcome {
                    case .replay(let newer, _):
                        sendExchange(request, subject: driver, token: newer, retried: true, startedAt: startedAt)
                    case .passThrough(let reason):
                        var failure = f
                        failure.classification = .retryable
                        failure.errorDescription = (f.errorDescription.map { $0 + "; " } ?? "") + "subject_session \(driver.name) not refreshed (\(reason))"
                        finishFetch(request, startedAt: startedAt, sentAt: sentAt, result: .failure(failure), requestSent: requestSent, adopted: false)
                    case .unavailable(let u):
                        var failure = f
                        failure.classification = .retryable
                        failure.errorDescription = (f.errorDescription.map { $0 + "; " } ?? "") + "subject_session \(driver.name): \(u.detail)"
                        finishFetch(request, startedAt: startedAt, sentAt: sentAt, result: .failure(failure), requestSent: requestSent, adopted: false)
                    }
                }
                return
            case .failure(var f):
                // Retried once already: the chain's failure is transient (the subject renews).
                if f.classification == .invalidGrant { f.classification = .retryable }
                finishFetch(request, startedAt: startedAt, sentAt: sentAt, result: .failure(f), requestSent: requestSent, adopted: false)
                return
            }
            finishFetch(request, startedAt: startedAt, sentAt: sentAt, result: result, requestSent: requestSent, adopted: false)
        }
    }

    /// `grant: exec`: runs the helper on a global queue (it blocks), then classifies its outcome
    /// on the session queue like a token response: exit 0 with RFC 6749 §5.1 JSON on stdout is a
    /// token; a non-zero exit or a timeout is a transient failure (same retries and backoff); a
    /// program that cannot start or output over 1 MiB is permanent. The helper's stderr is
    /// logged scrubbed (first 512 bytes).
    private func runCommand(_ request: TokenSession.FetchRequest, startedAt: UInt64) {
        let argv = settings.config.command ?? []
        fetchSerial &+= 1
        let serial = fetchSerial
        count { $0.tokenRequests += 1 }
        let sentAt = now()
        let timeout = settings.config.commandTimeout
        let parser = settings.responseParser
        let program = argv.first ?? "?"
        DispatchQueue.global().async { [self] in
            let outcome = CommandRunner.run(argv, timeout: timeout)
            queue.execute { [self] in
                guard !stopped, fetchSerial == serial else { return }
                Self.logHelperStderr(outcome, program: program, what: "token command", logger: logger)
                let result: Result<TokenGrant, TokenEndpointFailure>
                switch CommandRunner.judged(outcome, program: program, timeout: timeout, kind: "token") {
                case .failure(let f): result = .failure(f)
                case .success(let o): result = parser.parse(status: 200, headers: [], body: o.stdout, wallClockNow: clock.wallClockSeconds())
                }
                finishFetch(request, startedAt: startedAt, sentAt: sentAt, result: result, requestSent: true, adopted: false)
            }
        }
    }

    /// `grant: aws` / `grant: aliyun` (docs/architecture.md §6.15): the keys from the session's
    /// `credentials:` source (`CredentialFetch`), as a token grant. The first fetch of a session
    /// without keys adopts the keys persisted in `state_dir` while they last (a restart, or
    /// `bearerd token`, makes no new STS call).
    private func fetchCredentials(_ request: TokenSession.FetchRequest, startedAt: UInt64) {
        if let adopted = persistedCredentials(request) {
            finishFetch(request, startedAt: startedAt, sentAt: now(), result: .success(adopted), requestSent: false, adopted: true)
            return
        }
        guard let fetch = CredentialFetch(settings: settings, queue: queue, clock: clock, logger: logger) else {
            finishFetch(request, startedAt: startedAt, sentAt: now(), result: .failure(TokenEndpointFailure(
                classification: .permanent, reason: "credentials.not_configured",
                errorDescription: "grant \(grant.rawValue) without credentials:")), requestSent: false, adopted: false)
            return
        }
        fetchSerial &+= 1
        let serial = fetchSerial
        if fetch.sendsRequest { count { $0.tokenRequests += 1 } }
        let sentAt = now()
        var finished = false
        let client = fetch.start { [self] result, requestSent in
            finished = true
            if fetchSerial == serial { inFlight = nil }
            guard !stopped else { return }
            finishFetch(request, startedAt: startedAt, sentAt: sentAt, result: result, requestSent: requestSent, adopted: false)
        }
        // A source that answered at once (static files, a file that cannot be read) has already finished.
        if !finished, let client { inFlight = client }
    }

    /// The keys persisted by an earlier run or `bearerd token` (same binding), when the session
    /// holds none yet and the fetch is not about a rejection; nil otherwise.
    private func persistedCredentials(_ request: TokenSession.FetchRequest) -> TokenGrant? {
        guard let credentialCache, request.reason != .rejected, machine.currentToken == nil else { return nil }
        let wallNow = clock.wallClockSeconds()
        guard let cached = credentialCache.reusableWithExpiry(wallClockNow: wallNow),
              let keys = TemporaryCredentials(encodedToken: OAuthSecret(cached.token)) else { return nil }
        let (remaining, overflow) = cached.expiresAt.subtractingReportingOverflow(wallNow)
        guard !overflow, remaining > 0 else { return nil }
        return TokenGrant(accessToken: keys.encodedAsToken, lifetime: min(.seconds(remaining), TokenGrant.maximumLifetime),
                          lifetimeSource: keys.expiresAt == nil ? .defaultLifetime : .expiresIn)
    }

    /// After keys were obtained: kept in `state_dir` for restarts and `bearerd token` (a failure
    /// to write is logged; the session keeps serving).
    private func persistCredentials() {
        guard let credentialCache, let p = publication.token else { return }
        let expiry = publication.read { $0.expiresAt }
        do throws(StateStoreError) {
            try credentialCache.store(p, monotonicNow: clock.now().nanoseconds, expiresAt: expiry, wallClockNow: clock.wallClockSeconds())
        } catch {
            logger.warning("cannot keep the credentials in state_dir; a restart will fetch new ones", metadata: ["error": "\(error.description)"])
        }
    }

    /// A helper's stderr (`grant: exec`, `credentials: { exec: … }`), logged scrubbed (first 512 bytes).
    static func logHelperStderr(_ outcome: Result<CommandRunner.Outcome, CommandRunner.StartFailure>, program: String, what: String,
                                logger: Logger) {
        guard case .success(let o) = outcome else { return }
        let stderr = Redaction.scrub(String(decoding: o.stderr.prefix(512), as: UTF8.self))
        if !stderr.isEmpty {
            logger.warning("\(what) wrote to stderr", metadata: ["command": "\(program)", "stderr": "\(stderr)"])
        }
    }

    /// Why a token request is sent again at once (each at most once per fetch).
    enum Resend: Hashable {
        /// RFC 9449 §8: the token endpoint demanded its DPoP nonce.
        case dpopNonce
        /// docs/architecture.md §6.12: the refusal's `Date` put a new skew into effect.
        case clockSkew
    }

    /// Sends one token request; `done` gets the instant it was handed to the transport, the
    /// classified result and whether it was (possibly) received.
    ///
    /// `dpop: true`: the request carries a fresh proof (RFC 9449 §5); a `400 use_dpop_nonce`
    /// with a `DPoP-Nonce` is retried once at once with the nonce and a new proof (§8), and
    /// any `DPoP-Nonce` is remembered for the next request. Every response's `Date` feeds the
    /// session's clock skew (docs/architecture.md §6); when a refusal (`invalid_client`, `invalid_dpop_proof`)
    /// of a request whose assertion or proof bearerd signed is the answer that put a new skew
    /// into effect, the request is signed again with the server's time and sent once more at
    /// once (the `iat` was wrong, not the credentials). Every resend signs a new client
    /// assertion (a `jti` is used once, RFC 7523 §3).
    private func send(_ prepared: Result<TokenRequest, TokenEndpointFailure>, _ request: TokenSession.FetchRequest,
                      resent: Set<Resend> = [],
                      done: @escaping (MonotonicInstant, Result<TokenGrant, TokenEndpointFailure>, Bool) -> Void) {
        let tokenRequest: TokenRequest
        switch prepared {
        case .success(let r): tokenRequest = r
        case .failure(let f):
            // A credential file that cannot be sent (docs/architecture.md §6): reported, not sent.
            done(now(), .failure(f), false)
            return
        }
        var encoded: EncodedTokenRequest
        do throws(TokenRequest.EncodingError) {
            encoded = try tokenRequest.encode()
        } catch {
            done(now(), .failure(TokenEndpointFailure(classification: .permanent, reason: error.reason,
                                                      errorDescription: error.detail)), false)
            return
        }
        let dpop = settings.dpop
        let tokenURL = settings.config.tokenURL
        if let dpop {
            guard let signed = dpop.signedTokenRequest(encoded, url: tokenURL.description) else {
                done(now(), .failure(TokenEndpointFailure(classification: .permanent, reason: "token.dpop_sign_failed",
                                                          errorDescription: "cannot sign a DPoP proof with \(dpop.keyPath)")), false)
                return
            }
            encoded = signed
        }
        encoded = tracing.propagated(encoded, url: tokenURL.description)
        fetchSerial &+= 1
        let serial = fetchSerial
        count { $0.tokenRequests += 1 }
        let sentAt = now()
        let parser = settings.responseParser
        let timeout = settings.config.requestTimeout
        let skew = settings.clockSkew
        let client = TokenEndpointClient.post(encoded, to: tokenURL, tls: settings.tlsContext, proxy: settings.proxy, on: queue) { [self] outcome in
            if fetchSerial == serial { inFlight = nil }
            guard !stopped else { return }
            switch outcome {
            case .response(let status, let headers, let body):
                let skewBefore = skew.seconds
                observeClock(headers, skew)
                if let dpop, dpop.tokenEndpointAsksForNonce(url: tokenURL.description, status: status, headers: headers, body: body),
                   !resent.contains(.dpopNonce) {
                    // RFC 9449 §8: the server wants its nonce in the proof. Once, at once.
                    dpop.countNonceRetry(.tokenEndpoint)
                    tracing.event("dpop.nonce_retry")
                    logger.info("token endpoint asked for a DPoP nonce; retrying with it", metadata: ["dpop.jkt": "\(dpop.thumbprint)"])
                    send(.success(settings.resigned(tokenRequest)), request, resent: resent.union([.dpopNonce]), done: done)
                    return
                }
                var result = checkedGrant(parser.parse(status: status, headers: headers, body: body, wallClockNow: clock.wallClockSeconds()))
                if case .failure(let f) = result, skew.seconds != skewBefore, !resent.contains(.clockSkew),
                   dpop != nil || tokenRequest.clientAssertion != nil && settings.signer != nil,
                   f.oauthError == "invalid_client" || f.oauthError == "invalid_dpop_proof" {
                    logger.info("token endpoint refused what bearerd signed with its own clock; signing again with the server's time",
                                metadata: ["clock_skew_s": "\(skew.seconds)", "oauth.error": "\(f.oauthError ?? "")"])
                    send(.success(settings.resigned(tokenRequest)), request, resent: resent.union([.clockSkew]), done: done)
                    return
                }
                if case .failure(var f) = result, let detail = skewDetail(f, skew) {
                    f.errorDescription = (f.errorDescription.map { $0 + "; " } ?? "") + detail
                    result = .failure(f)
                }
                done(sentAt, result, true)
            case .tooLarge(let status):
                // A malformed answer (docs/architecture.md §6): transient, never negative-cached.
                done(sentAt, .failure(TokenEndpointFailure(classification: .retryable,
                                                           reason: "token.response_too_large", status: status)), true)
            case .transportFailure(let detail, let requestSent):
                done(sentAt, .failure(.transport(detail)), requestSent)
            }
        }
        inFlight = client
        clock.schedule(after: timeout, on: queue) { [weak client] in
            client?.cancel(detail: "token request timed out after \(timeout)")
        }
    }

    /// Session queue: the settings the next token request uses (on-behalf-of exchanges read them
    /// per exchange, so a reload applies at once).
    var currentSettings: SessionSettings { settings }

    /// One on-behalf-of exchange (docs/architecture.md §6.16): `prepared` carries the caller's
    /// token. Several may be in flight at once (one per caller), so none is the session's
    /// `inFlight` and none moves its state machine. DPoP proofs, the nonce retry and the clock
    /// skew are the session's, as for `send`. `done` runs on the session queue.
    func sendCallerExchange(_ prepared: Result<TokenRequest, TokenEndpointFailure>, resent: Set<Resend> = [], traceparent: String? = nil,
                            done: @escaping (MonotonicInstant, Result<TokenGrant, TokenEndpointFailure>) -> Void) {
        let tokenRequest: TokenRequest
        switch prepared {
        case .success(let r): tokenRequest = r
        case .failure(let f):
            done(now(), .failure(f))
            return
        }
        var encoded: EncodedTokenRequest
        do throws(TokenRequest.EncodingError) {
            encoded = try tokenRequest.encode()
        } catch {
            done(now(), .failure(TokenEndpointFailure(classification: .permanent, reason: error.reason, errorDescription: error.detail)))
            return
        }
        let dpop = settings.dpop
        let tokenURL = settings.config.tokenURL
        if let dpop {
            guard let signed = dpop.signedTokenRequest(encoded, url: tokenURL.description) else {
                done(now(), .failure(TokenEndpointFailure(classification: .permanent, reason: "token.dpop_sign_failed",
                                                          errorDescription: "cannot sign a DPoP proof with \(dpop.keyPath)")))
                return
            }
            encoded = signed
        }
        if let traceparent { encoded = EncodedTokenRequest(body: encoded.body, headers: encoded.headers + [("traceparent", traceparent)]) }
        count { $0.tokenRequests += 1 }
        let sentAt = now()
        let parser = settings.responseParser
        let timeout = settings.config.requestTimeout
        let skew = settings.clockSkew
        let client = TokenEndpointClient.post(encoded, to: tokenURL, tls: settings.tlsContext, proxy: settings.proxy, on: queue) { [self] outcome in
            switch outcome {
            case .response(let status, let headers, let body):
                observeClock(headers, skew)
                if let dpop, dpop.tokenEndpointAsksForNonce(url: tokenURL.description, status: status, headers: headers, body: body),
                   !resent.contains(.dpopNonce) {
                    dpop.countNonceRetry(.tokenEndpoint)
                    sendCallerExchange(.success(settings.resigned(tokenRequest)), resent: resent.union([.dpopNonce]), traceparent: traceparent, done: done)
                    return
                }
                var result = parser.parse(status: status, headers: headers, body: body, wallClockNow: clock.wallClockSeconds())
                if case .success(let grant) = result, let problem = settings.exchangeProblem(grant) { result = .failure(problem) }
                done(sentAt, result)
            case .tooLarge(let status):
                done(sentAt, .failure(TokenEndpointFailure(classification: .retryable, reason: "token.response_too_large", status: status)))
            case .transportFailure(let detail, _):
                done(sentAt, .failure(.transport(detail)))
            }
        }
        clock.schedule(after: timeout, on: queue) { [weak client] in
            client?.cancel(detail: "token exchange timed out after \(timeout)")
        }
    }

    /// The grant-specific checks of a parsed answer: RFC 8693 §2.2.1 for exchanges; and for
    /// token grants (jwt_bearer, token_exchange) an `invalid_grant` is about the presented
    /// token, which rotates (a projected token, another session's token): transient, never a
    /// negative cache.
    private func checkedGrant(_ result: Result<TokenGrant, TokenEndpointFailure>) -> Result<TokenGrant, TokenEndpointFailure> {
        switch result {
        case .success(let grant):
            if let problem = settings.exchangeProblem(grant) { return .failure(problem) }
            return result
        case .failure(var f):
            if f.classification == .invalidGrant, grant.isTokenGrant, settings.config.exchange?.subjectSession == nil {
                f.classification = .retryable
            }
            return .failure(f)
        }
    }

    /// docs/architecture.md §6.12: the token endpoint's `Date` against the local clock; a skew over
    /// 5 s is logged once at warning level and applied to the `iat` of what bearerd signs.
    private func observeClock(_ headers: [(name: String, value: String)], _ skew: ClockSkew) {
        let date = headers.first { $0.name.lowercased() == "date" }?.value
        if let measured = skew.observe(dateHeader: date, localNow: clock.wallClockSeconds()) {
            logger.warning("clock skew against the token endpoint; signed assertions and DPoP proofs use the server's time",
                           metadata: ["clock_skew_s": "\(measured)", "token_url": "\(settings.config.tokenURL)"])
        }
    }

    /// An `invalid_client` or `invalid_dpop_proof` whose description mentions time is reported
    /// with the measured skew (docs/architecture.md §6).
    private func skewDetail(_ f: TokenEndpointFailure, _ skew: ClockSkew) -> String? {
        guard let code = f.oauthError, code == "invalid_client" || code == "invalid_dpop_proof" else { return nil }
        let text = (f.errorDescription ?? "").lowercased()
        guard ["time", "iat", "exp", "clock", "expired", "future", "nbf", "skew", "stale"].contains(where: { text.contains($0) }) else { return nil }
        return "local clock minus the token endpoint's Date: \(skew.lastMeasured)s (applied: \(skew.seconds)s)"
    }

    private func finishFetch(_ request: TokenSession.FetchRequest, startedAt: UInt64, sentAt: MonotonicInstant,
                             result: Result<TokenGrant, TokenEndpointFailure>, requestSent: Bool, adopted: Bool) {
        guard !stopped else { return }
        // The span ends when the answer came, not after the waiters were resumed below: an
        // exchange may finish on its loop before this queue reaches the `defer`.
        let answeredAt = monotonicNanos()
        defer { tracing.end(result, adopted: adopted, generation: machine.currentGeneration, at: answeredAt,
                            url: grant.isSigning || grant == .exec ? "" : settings.config.tokenURL.description) }
        sharedCacheAfterFetch(result, adopted: adopted)
        if grant == .tokenExchange {
            let outcome: String
            if case .success = result { outcome = "success" } else { outcome = "failure" }
            count { $0.tokenExchanges[outcome, default: 0] &+= 1 }
        }
        let durationMs = (now().nanoseconds &- startedAt) / 1_000_000
        switch result {
        case .success(let grant):
            count {
                if adopted { $0.tokensAdopted += 1 } else { $0.tokensObtained += 1 }
                $0.refreshes[TokenRefreshKey(reason: request.reason.rawValue, outcome: adopted ? "adopted" : "success", error: ""), default: 0] += 1
            }
            publication.update { $0.failure = nil }
            if self.grant.usesRefreshToken { store?.clearNeedsReauthentication() }
            // Logged before the actions run, so the line precedes the token's delivery.
            let actions = machine.fetchSucceeded(grant, sentAt: sentAt, now: now())
            let what = self.grant.isSigning ? "credentials" : "token"
            var m: Logger.Metadata = [
                "token.reason": "\(request.reason.rawValue)",
                "token.fingerprint": "\(grant.accessToken.fingerprint)",
                "token.generation": "\(machine.currentGeneration)",
                "token.lifetime_s": "\(Int(grant.lifetime.secondsDouble))",
                "token.lifetime_source": "\(grant.lifetimeSource.rawValue)",
                "duration_ms": "\(durationMs)",
                "outcome": adopted ? "adopted" : "ok",
            ]
            if self.grant.isSigning {
                // The key id only as a fingerprint; never the secret or the session token.
                m["credentials.source"] = "\(settings.config.signing?.source.name ?? "-")"
                if let keys = TemporaryCredentials(encodedToken: grant.accessToken) {
                    m["token.fingerprint"] = "\(BearerdOAuth.fingerprint(keys.accessKeyID))"
                    m["credentials.expiration"] = "\(keys.expiresAt.map(ISO8601Timestamp.format) ?? "none")"
                }
            }
            logger.info(adopted ? (adoptionSource == .sharedCache ? "\(what) adopted from the shared cache" : "\(what) adopted from the state file") : "\(what) obtained", metadata: m)
            run(actions)
            if self.grant.isSigning && !adopted { persistCredentials() }
        case .failure(let serverFailure):
            let failure = scrubbed(serverFailure)
            let key = TokenRefreshKey(reason: request.reason.rawValue, outcome: "failure",
                                      error: TokenRefreshKey.errorLabel(for: failure))
            publication.update { p in
                switch failure.classification {
                case .retryable: p.counters.failuresRetryable += 1
                case .permanent: p.counters.failuresPermanent += 1
                case .invalidGrant: p.counters.failuresInvalidGrant += 1
                }
                p.counters.refreshes[key, default: 0] += 1
                p.failure = failure.detail
            }
            var m = failureMetadata(failure)
            m["token.reason"] = "\(request.reason.rawValue)"
            m["attempt"] = "\(request.attempt)"
            m["round"] = "\(request.round)"
            m["request_sent"] = "\(requestSent)"
            m["duration_ms"] = "\(durationMs)"
            m["outcome"] = "failed"
            let what = grant.isSigning ? "credentials request failed" : "token request failed"
            if let source = settings.config.signing?.source.name { m["credentials.source"] = "\(source)" }
            if failure.classification == .retryable {
                logger.warning("\(what)", metadata: m)
            } else {
                logger.error("\(what)", metadata: m)
            }
            run(machine.fetchFailed(failure, requestSent: requestSent, now: now()))
        }
    }

    /// The failure with any secret of this session that the server echoed back (in `error`,
    /// `error_description` or `error_uri`) replaced by `<redacted>`: that text goes to logs and
    /// to clients' 503 bodies.
    private func scrubbed(_ failure: TokenEndpointFailure) -> TokenEndpointFailure {
        let secrets = [settings.clientSecret, settings.password, settings.operatorRefreshToken, own?.refreshToken,
                       machine.currentToken?.accessToken].compactMap { $0?.exposedValue }.filter { $0.count >= 4 }
        guard !secrets.isEmpty else { return failure }
        func scrub(_ text: String?) -> String? {
            guard var text else { return nil }
            for s in secrets where text.contains(s) { text = text.replacingAll(s, with: "<redacted>") }
            return text
        }
        var f = failure
        f.oauthError = scrub(f.oauthError)
        f.errorDescription = scrub(f.errorDescription)
        f.errorURI = scrub(f.errorURI)
        return f
    }

    private func failureMetadata(_ f: TokenEndpointFailure) -> Logger.Metadata {
        var m: Logger.Metadata = ["error.reason": "\(f.reason)", "error.class": "\(f.classification.rawValue)"]
        if let s = f.status { m["http.status"] = "\(s)" }
        if let e = f.oauthError { m["oauth.error"] = "\(e)" }
        if let d = f.errorDescription { m["oauth.error_description"] = "\(d)" }
        if let r = f.retryAfter { m["retry_after_s"] = "\(Int(r.secondsDouble.rounded(.up)))" }
        return m
    }

    // MARK: Refresh tokens and the state file (session queue)

    /// The state file's content; an unreadable file is logged and treated as absent (the
    /// operator file is used instead).
    private func readStoredState() -> PersistedSessionState? {
        guard let store else { return nil }
        switch store.read() {
        case .missing: return nil
        case .state(let s): return s
        case .unreadable(let why):
            logger.warning("ignoring an unreadable state file", metadata: ["path": "\(store.statePath)", "error": "\(why)"])
            return nil
        }
    }

    /// Where a refresh_token session starts from (start-up, or the operator file changed):
    /// the state file if it descends from the current operator file, else the operator file.
    private func chooseStartingState(stored: PersistedSessionState?) -> PersistedSessionState? {
        switch RefreshTokenAdoption.startingSource(operatorFileFingerprint: settings.operatorFingerprint, stored: stored) {
        case .stateFile:
            return stored
        case .operatorFile:
            // Only reached with an operator token (its fingerprint was non-nil).
            guard let token = settings.operatorRefreshToken else { return stored }
            if stored != nil { logger.info("refresh_token_file changed since the state was written: using it") }
            return PersistedSessionState(refreshToken: token, updatedAt: 0, sourceFingerprint: token.fingerprint)
        case .none:
            return nil
        }
    }

    /// docs/architecture.md §6.7: under the `flock`, re-read the state; adopt what
    /// another process already rotated (without calling the server when its access token is
    /// still good); else refresh, persist the new refresh token, then hand the token out.
    ///
    /// The `flock` may wait for another process's whole refresh: it is taken on `stateQueue`,
    /// so the session queue's timers and waiter timeouts keep running meanwhile.
    private func performRefreshFetch(_ request: TokenSession.FetchRequest, startedAt: UInt64) {
        guard let store else {
            continueRefreshFetch(request, startedAt: startedAt)
            return
        }
        stateQueue.async { [self] in
            let locked: Result<PersistedSessionState?, StateStoreError>
            do throws(StateStoreError) {
                try store.lock()
                locked = .success(store.readState())
            } catch {
                locked = .failure(error)
            }
            queue.execute { [self] in
                switch locked {
                case .failure(let error):
                    finishFetch(request, startedAt: startedAt, sentAt: now(), result: .failure(TokenEndpointFailure(
                        classification: .retryable, reason: error.reason, errorDescription: error.description)),
                        requestSent: false, adopted: false)
                case .success(let stored):
                    if stopped {
                        store.unlock()
                        return
                    }
                    adoptNewerStoredState(stored)
                    continueRefreshFetch(request, startedAt: startedAt)
                }
            }
        }
    }

    /// `performRefreshFetch` under the lock (when there is a store), on the session queue.
    private func continueRefreshFetch(_ request: TokenSession.FetchRequest, startedAt: UInt64) {
        guard let state = own else {
            store?.unlock()
            let problem = settings.operatorFileProblem.map { ": \($0)" } ?? ""
            let detail = settings.config.grant.isPersonal
                ? "nobody has signed in yet: run `bearerd login \(name)`"
                : "no refresh token in refresh_token_file or the state file\(problem)"
            finishFetch(request, startedAt: startedAt, sentAt: now(), result: .failure(TokenEndpointFailure(
                classification: .invalidGrant, reason: "token.no_refresh_token", errorDescription: detail)),
                requestSent: false, adopted: false)
            return
        }
        if let grant = adoptableGrant(state) {
            store?.unlock()
            finishFetch(request, startedAt: startedAt, sentAt: now(), result: .success(grant), requestSent: false, adopted: true)
            return
        }
        sendRefresh(using: state, request, startedAt: startedAt, rereadOnInvalidGrant: true)
    }

    /// The state's access token, if it is not the one we already have and has enough life left.
    private func adoptableGrant(_ state: PersistedSessionState) -> TokenGrant? {
        guard let grant = state.adoptableGrant(wallClockNow: clock.wallClockSeconds()) else { return nil }
        if let current = machine.currentToken, current.accessToken == grant.accessToken { return nil }
        return grant
    }

    private func adoptNewerStoredState(_ stored: PersistedSessionState?) {
        guard let own, let stored else { return }
        if RefreshTokenAdoption.underLock(stored: stored, own: own) == .adoptStored {
            logger.info("adopting the state another process rotated", metadata: [
                "refresh_token.fingerprint": "\(stored.refreshToken.fingerprint)",
            ])
            self.own = stored
        }
    }

    private func sendRefresh(using state: PersistedSessionState, _ request: TokenSession.FetchRequest,
                             startedAt: UInt64, rereadOnInvalidGrant: Bool) {
        let usedRefreshToken = state.refreshToken
        let wallAtSend = clock.wallClockSeconds()
        send(settings.preparedRequest(refreshToken: usedRefreshToken), request) { [self] sentAt, result, requestSent in
            switch result {
            case .success(var grant):
                grant = grant.keepingRefreshToken(usedRefreshToken)
                let lifetimeSeconds = Int64(grant.lifetime.secondsDouble)
                let newState = PersistedSessionState(
                    refreshToken: grant.refreshToken ?? usedRefreshToken,
                    accessToken: .init(token: grant.accessToken, expiresAt: wallAtSend + lifetimeSeconds,
                                       generation: machine.currentGeneration + 1),
                    updatedAt: max(clock.wallClockSeconds(), (own?.updatedAt ?? 0) + 1),
                    sourceFingerprint: state.sourceFingerprint,
                    // The generation of the record this result will be published as: a restart refuses older ones.
                    sharedGeneration: shared?.reserveGeneration() ?? state.sharedGeneration)
                persist(newState, rotated: grant.refreshToken != usedRefreshToken)
                own = newState
                store?.unlock()
                finishFetch(request, startedAt: startedAt, sentAt: sentAt, result: .success(grant),
                            requestSent: requestSent, adopted: false)

            case .failure(let failure) where failure.classification == .invalidGrant && rereadOnInvalidGrant:
                // Re-read once: another process may have rotated the token we just used.
                if let store, let stored = store.readState(), stored.refreshToken != usedRefreshToken {
                    logger.info("refresh token refused; adopting the newer one in the state file", metadata: [
                        "refresh_token.fingerprint": "\(stored.refreshToken.fingerprint)",
                    ])
                    own = stored
                    if let grant = adoptableGrant(stored) {
                        store.unlock()
                        finishFetch(request, startedAt: startedAt, sentAt: now(), result: .success(grant),
                                    requestSent: false, adopted: true)
                    } else {
                        sendRefresh(using: stored, request, startedAt: startedAt, rereadOnInvalidGrant: false)
                    }
                    return
                }
                if let shared {
                    // Or another replica rotated it and published the lineage's newest refresh token.
                    rereadSharedLineage(shared, refused: usedRefreshToken, request, startedAt: startedAt) { [self] in
                        store?.unlock()
                        finishFetch(request, startedAt: startedAt, sentAt: sentAt, result: result, requestSent: requestSent, adopted: false)
                    }
                    return
                }
                store?.unlock()
                finishFetch(request, startedAt: startedAt, sentAt: sentAt, result: result, requestSent: requestSent, adopted: false)

            case .failure:
                store?.unlock()
                finishFetch(request, startedAt: startedAt, sentAt: sentAt, result: result, requestSent: requestSent, adopted: false)
            }
        }
    }

    /// Writes the state durably before the token is handed out (the caller holds the lock).
    ///
    /// A failure (disk full, directory gone) does not stop the session (docs/architecture.md §6.7): the
    /// server has already consumed the old refresh token, so failing closed gains nothing. The new
    /// tokens are served and kept in memory (`own`), the write is retried with backoff (1 s,
    /// 2 s, … 60 s), and it is loud: one error line per failure streak, a counter
    /// (`bearerd_token_state_persist_failures_total`), and `/readyz` reports `state_not_persisted`
    /// for this session until a write succeeds.
    private func persist(_ state: PersistedSessionState, rotated: Bool) {
        guard let store else { return }
        do throws(StateStoreError) {
            try store.write(state)
            logger.debug("state persisted", metadata: [
                "refresh_token.fingerprint": "\(state.refreshToken.fingerprint)",
                "refresh_token.rotated": "\(rotated)",
            ])
            persistSucceeded()
        } catch {
            persistFailed(error, fingerprint: state.refreshToken.fingerprint)
        }
    }

    private func persistSucceeded() {
        guard case .failing = persistence else { return }
        persistence = .persisted
        publication.update { $0.persistFailure = nil }
        logger.notice("session state persisted again", metadata: ["path": "\(store?.statePath ?? "")"])
    }

    private func persistFailed(_ error: StateStoreError, fingerprint: String) {
        let attempt: Int
        switch persistence {
        case .persisted:
            attempt = 1
            logger.error("cannot persist the session state; serving the new tokens from memory and retrying (a restart before a write succeeds needs a new refresh token)", metadata: [
                "error": "\(error.description)", "refresh_token.fingerprint": "\(fingerprint)",
            ])
        case .failing(let previous, _):
            attempt = previous &+ 1
        }
        persistSerial &+= 1
        let serial = persistSerial
        persistence = .failing(attempt: attempt, serial: serial)
        publication.update {
            $0.counters.statePersistFailures &+= 1
            $0.persistFailure = error.description
        }
        let delay = Self.persistRetryDelay(attempt: attempt)
        clock.schedule(after: delay, on: queue) { [weak self] in self?.retryPersist(serial: serial) }
    }

    /// 1 s, 2 s, 4 s … capped at 60 s.
    static func persistRetryDelay(attempt: Int) -> Duration {
        let exponent = min(max(attempt - 1, 0), 6)
        return .seconds(min(1 << exponent, 60))
    }

    private func retryPersist(serial: UInt64) {
        guard !stopped, case .failing(_, let current) = persistence, current == serial, let store, let own else { return }
        if machine.status == .fetching {
            // A refresh holds (or is waiting for) the lock and will persist its own result; this
            // retry must not take or release that lock underneath it.
            clock.schedule(after: .seconds(1), on: queue) { [weak self] in self?.retryPersist(serial: serial) }
            return
        }
        do throws(StateStoreError) {
            try store.lock()
        } catch {
            persistFailed(error, fingerprint: own.refreshToken.fingerprint)
            return
        }
        defer { store.unlock() }
        // Another process may have written a newer state meanwhile: then the disk is current.
        if let stored = store.readState(), RefreshTokenAdoption.underLock(stored: stored, own: own) == .adoptStored {
            self.own = stored
            persistSucceeded()
            return
        }
        persist(own, rotated: false)
    }
}

// MARK: - Shared cache (docs/architecture.md §6.13; session queue)

extension TokenSessionDriver {
    /// Asks the shared cache first: a fresh record another replica published is adopted (no
    /// token request); else this replica fetches under the lock (or after waiting for it), and
    /// `sharedCacheAfterFetch` publishes. Redis trouble always ends in a local fetch.
    private func fetchThroughSharedCache(_ shared: SharedTokenSession, _ request: TokenSession.FetchRequest, startedAt: UInt64) {
        fetchSerial &+= 1
        let serial = fetchSerial
        // refresh_token lineages: wait out a holder's lock (presenting the refresh token it may be rotating would be refused).
        var bound = settings.config.waitTimeout
        if grant.usesRefreshToken { bound = max(bound, shared.lockTTL + .seconds(1)) }
        // Records older than the lineage our refresh token belongs to are refused (rollback).
        shared.raiseFloor(to: own?.sharedGeneration)
        shared.beforeFetch(current: machine.currentToken?.accessToken.exposedValue, rejected: request.reason == .rejected,
                           waitBound: bound) { [self] decision in
            guard !stopped, fetchSerial == serial else {
                shared.release()
                return
            }
            switch decision {
            case .adopt(let record):
                let grant = grant(from: record)
                shared.adopted(record)
                if self.grant.usesRefreshToken, let rt = record.refreshToken, rt != own?.refreshToken {
                    // The lineage moved on elsewhere: persist its refresh token before handing the token out.
                    let state = sharedLineage(record, refreshToken: rt)
                    persistAdoptedLineage(state) { [self] in
                        adoptionSource = .sharedCache
                        finishFetch(request, startedAt: startedAt, sentAt: now(), result: .success(grant), requestSent: false, adopted: true)
                        adoptionSource = .stateFile
                    }
                    return
                }
                adoptionSource = .sharedCache
                finishFetch(request, startedAt: startedAt, sentAt: now(), result: .success(grant), requestSent: false, adopted: true)
                adoptionSource = .stateFile
            case .fetch(let record):
                if self.grant.usesRefreshToken, let record, let rt = record.refreshToken, rt != own?.refreshToken {
                    // Refresh from the shared lineage's newest refresh token (persisted after the refresh).
                    logger.info("using the refresh token another replica rotated", metadata: ["refresh_token.fingerprint": "\(rt.fingerprint)"])
                    own = sharedLineage(record, refreshToken: rt)
                }
                performLocalFetch(request, startedAt: startedAt)
            }
        }
    }

    private func grant(from record: SharedTokenRecord) -> TokenGrant {
        let remaining = record.remaining(wallClockNow: clock.wallClockSeconds())
        return TokenGrant(accessToken: record.accessToken, tokenType: record.tokenType,
                          lifetime: min(.seconds(remaining), TokenGrant.maximumLifetime), lifetimeSource: .expiresIn,
                          refreshToken: record.refreshToken)
    }

    /// `invalid_grant` on a refresh with a shared cache (docs/architecture.md §6.7), the
    /// state file holding nothing newer, the state file's lock held: re-read the shared record
    /// once. When it holds another refresh token (another replica rotated the one this replica
    /// presented), that lineage is persisted and adopted: its access token when it is fresh,
    /// else one refresh with its refresh token (no further re-read). Else, or when Redis does not
    /// answer, `refused` runs: the session needs a new refresh token.
    private func rereadSharedLineage(_ shared: SharedTokenSession, refused usedRefreshToken: OAuthSecret,
                                     _ request: TokenSession.FetchRequest, startedAt: UInt64, refused: @escaping () -> Void) {
        shared.raiseFloor(to: own?.sharedGeneration)
        shared.reread(current: machine.currentToken?.accessToken.exposedValue) { [self] record, adoptable in
            guard !stopped else {
                store?.unlock()
                return
            }
            guard let record, let rt = record.refreshToken, rt != usedRefreshToken else {
                refused()
                return
            }
            logger.info("refresh token refused; adopting the newer one another replica published in the shared cache", metadata: [
                "refresh_token.fingerprint": "\(rt.fingerprint)",
            ])
            let state = sharedLineage(record, refreshToken: rt)
            own = state
            // Before its access token is handed out (the state file's lock is still held).
            persist(state, rotated: true)
            guard adoptable else {
                sendRefresh(using: state, request, startedAt: startedAt, rereadOnInvalidGrant: false)
                return
            }
            store?.unlock()
            shared.release()
            shared.adopted(record)
            adoptionSource = .sharedCache
            finishFetch(request, startedAt: startedAt, sentAt: now(), result: .success(grant(from: record)), requestSent: false, adopted: true)
            adoptionSource = .stateFile
        }
    }

    private func sharedLineage(_ record: SharedTokenRecord, refreshToken: OAuthSecret) -> PersistedSessionState {
        PersistedSessionState(refreshToken: refreshToken,
                              accessToken: .init(token: record.accessToken, expiresAt: record.expiresAt,
                                                 generation: machine.currentGeneration &+ 1),
                              updatedAt: max(clock.wallClockSeconds(), (own?.updatedAt ?? 0) &+ 1),
                              sourceFingerprint: own?.sourceFingerprint ?? settings.operatorFingerprint,
                              sharedGeneration: record.generation)
    }

    /// Writes an adopted lineage under the state file's `flock` (taken off the session queue), then `then` on the queue.
    private func persistAdoptedLineage(_ state: PersistedSessionState, then: @escaping () -> Void) {
        own = state
        guard let store else {
            then()
            return
        }
        stateQueue.async { [self] in
            let locked: Bool
            do throws(StateStoreError) {
                try store.lock()
                locked = true
            } catch {
                locked = false
            }
            queue.execute { [self] in
                guard !stopped else {
                    if locked { store.unlock() }
                    return
                }
                if locked {
                    persist(state, rotated: true)
                    store.unlock()
                }
                then()
            }
        }
    }

    /// After a fetch: a token obtained here is published (by the lock holder), a failure frees the lock.
    private func sharedCacheAfterFetch(_ result: Result<TokenGrant, TokenEndpointFailure>, adopted: Bool) {
        guard let shared else { return }
        switch result {
        case .success(let g) where !adopted:
            shared.publish(accessToken: g.accessToken.exposedValue, tokenType: g.tokenType, lifetime: g.lifetime,
                           refreshToken: grant.usesRefreshToken ? (g.refreshToken ?? own?.refreshToken)?.exposedValue : nil)
        case .success:
            if adoptionSource == .stateFile {
                // Adopted from the state file: not a record of the cache.
                shared.forgetGeneration()
                shared.release()
            }
        case .failure:
            shared.release()
        }
    }

    func countSharedCache(_ outcome: SharedTokenSession.Outcome) {
        count {
            switch outcome {
            case .hit: $0.sharedCacheHits &+= 1
            case .miss: $0.sharedCacheMisses &+= 1
            case .lockWait: $0.sharedCacheLockWaits &+= 1
            case .fallback: $0.sharedCacheFallbacks &+= 1
            }
        }
    }

    func countSharedCache(_ notice: SharedTokenSession.Notice) {
        count {
            switch notice {
            case .staleLockReplaced: $0.sharedCacheStaleLocks &+= 1
            case .olderRecordRefused: $0.sharedCacheOlderRecords &+= 1
            }
        }
    }
}
