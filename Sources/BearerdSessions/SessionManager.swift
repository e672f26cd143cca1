import BearerdIO
import BearerdOAuth
import Logging
import BearerdConfig

/// All token sessions of a configuration (docs/architecture.md §2.5, §6): one `TokenSessionDriver` per
/// `sessions:` entry, each on its own serial queue.
///
/// Owns the drivers by name and the configuration they were built from. `drivers` is guarded
/// by `lock` (read by `session(named:)` from any thread; replaced by `reload` on SIGHUP).
/// Drivers survive a reload under the same name (the proxy may hold them): their settings are
/// replaced in place. A removed session's driver is stopped.
public final class SessionManager: @unchecked Sendable {  // @unchecked: mutable state guarded by `lock`
    private let lock = Lock()
    private var drivers: [String: TokenSessionDriver] = [:]
    private var config: BearerdConfig
    private var started = false
    private let logger: Logger
    private let tunePolicy: (@Sendable (inout TokenSession.Policy) -> Void)?
    /// The clocks and timers of every session (tests pass one they advance).
    private let clock: any SessionClock
    private var nextQueueIndex = 0
    /// `shared_cache:` (docs/architecture.md §6), built once at start-up (a change needs a restart).
    private var sharedCache: SharedTokenCache?
    /// Routes' `caller_jwt:` guards by configuration (docs/architecture.md §6.16), kept across
    /// reloads while a route still names the same settings (its keys stay loaded). Under `lock`.
    private var routeGuards: [String: CallerJWTGuard] = [:]
    /// `tracing:` (docs/architecture.md §2.9), built once at start-up (a change needs a restart);
    /// nil when traces are off. The proxy's exchanges and every session's token requests use it.
    public private(set) var tracer: Tracer?
    private var tracingAtStart: TracingConfig?

    /// Resolves every session's secrets, builds its TLS context and opens the state store of
    /// refresh_token sessions (`state_dir` created 0700). Throws every problem found.
    public convenience init(config: BearerdConfig, logger: Logger, environment: [String: String]) throws(ConfigErrors) {
        try self.init(config: config, logger: logger, environment: environment, tunePolicy: nil)
    }

    /// `tunePolicy` adjusts the docs/architecture.md §6 defaults (tests use shorter delays); `clock` is what
    /// the sessions read time from and arm their timers with (tests advance their own).
    init(config: BearerdConfig, logger: Logger, environment: [String: String],
         tunePolicy: (@Sendable (inout TokenSession.Policy) -> Void)?,
         clock: any SessionClock = SystemSessionClock()) throws(ConfigErrors) {
        self.config = config
        self.logger = logger
        self.tunePolicy = tunePolicy
        self.clock = clock
        var errors: [ConfigError] = []
        var built: [String: TokenSessionDriver] = [:]
        // An existing state_dir someone else owns or can write to is refused at start (a missing
        // one is created 0700 when first needed).
        if let dir = config.stateDir {
            do throws(StateStoreError) {
                try StateStore.checkDirectory(dir)
            } catch {
                errors.append(ConfigError(file: config.file, line: 0, key: "state_dir", message: error.description))
            }
        }
        if let shared = config.sharedCache {
            do throws(ConfigErrors) {
                sharedCache = try SharedTokenCache.make(shared, file: config.file, environment: environment, logger: logger)
            } catch {
                errors += error.errors
            }
        }
        tracingAtStart = config.tracing
        if let tracing = config.tracing {
            do throws(ConfigErrors) {
                tracer = try Tracer(config: tracing, logger: logger)
            } catch {
                errors += error.errors.map { var e = $0; e.file = config.file; return e }
            }
        }
        for session in config.sessions {
            do throws(ConfigErrors) {
                built[session.name] = try makeDriver(session, in: config, environment: environment)
            } catch {
                errors += error.errors
            }
        }
        guard errors.isEmpty else { throw ConfigErrors(errors) }
        drivers = built
    }

    private func makeDriver(_ session: SessionConfig, in config: BearerdConfig,
                            environment: [String: String]) throws(ConfigErrors) -> TokenSessionDriver {
        let settings = try SessionSettings.resolve(session, in: config, environment: environment)
        var store: StateStore?
        if session.grant.usesRefreshToken {
            guard let dir = config.stateDir else {
                throw ConfigErrors([ConfigError(file: config.file, line: session.line, key: "state_dir",
                                                message: "missing: session '\(session.name)' uses grant refresh_token, whose rotated refresh tokens are kept in state_dir")])
            }
            do throws(StateStoreError) {
                store = try StateStore(directory: dir, session: session.name)
            } catch {
                throw ConfigErrors([ConfigError(file: config.file, line: 0, key: "state_dir", message: error.description)])
            }
        }
        // Signing sessions keep their keys in state_dir for restarts and `bearerd token` (docs/architecture.md §6.15).
        var credentialCache: TokenCache?
        if session.grant.isSigning, let dir = config.stateDir {
            do throws(StateStoreError) {
                credentialCache = try TokenCache(stateDir: dir, session: session)
            } catch {
                throw ConfigErrors([ConfigError(file: config.file, line: 0, key: "state_dir", message: error.description)])
            }
        }
        var policy = settings.policy
        tunePolicy?(&policy)
        nextQueueIndex += 1
        let driver = TokenSessionDriver(settings: settings, policy: policy, store: store, logger: logger,
                                        queueIndex: 10_000 + nextQueueIndex, clock: clock, credentialCache: credentialCache)
        // `subject_session:` chains: the subject is looked up at each exchange (a reload may replace it).
        driver.sessionLookup = { [weak self] name in self?.session(named: name) }
        driver.tracing = SessionTracing(tracer: tracer)
        if let onBehalfOf = session.onBehalfOf {
            // docs/architecture.md §6.16: one exchanged token per caller; no token of its own,
            // so no shared cache record either.
            var l = logger
            l[metadataKey: "session"] = "\(session.name)"
            nextQueueIndex += 1
            let guardian = try onBehalfOf.callerJWT.map { (c: CallerJWTConfig) throws(ConfigErrors) -> CallerJWTGuard in
                try CallerJWTGuard(config: c, owner: "session \(session.name)", logger: l, outboundProxy: config.outboundProxy, clock: clock,
                                   queueIndex: 10_000 + nextQueueIndex)
            }
            driver.caller = CallerSessionDriver(session: driver, config: onBehalfOf, callerJWT: guardian, clock: clock, logger: l)
            return driver
        }
        if let sharedCache {
            let identity = SharedTokenCache.identity(of: session, dpopThumbprint: settings.dpop?.thumbprint)
            let shared = SharedTokenSession(cache: sharedCache, identity: identity, sessionName: session.name, queue: driver.queue,
                                            keepsRefreshToken: session.grant.usesRefreshToken, requestTimeout: session.requestTimeout,
                                            clock: driver.clock)
            shared.onOutcome = { [weak driver] outcome in driver?.countSharedCache(outcome) }
            shared.onNotice = { [weak driver] notice in driver?.countSharedCache(notice) }
            driver.shared = shared
        }
        return driver
    }

    /// The session of that name, nil if the configuration has none.
    public func session(named name: String) -> TokenSessionDriver? {
        lock.withLock { drivers[name] }
    }

    /// Names of the configured sessions, in file order.
    public var sessionNames: [String] {
        lock.withLock { config.sessions.map(\.name) }
    }

    /// Every session begins its initial fetch (reason `start`) in the background.
    public func start() {
        let all: [TokenSessionDriver] = lock.withLock {
            started = true
            return Array(drivers.values)
        }
        tracer?.exporter.start()
        for d in all { d.start() }
    }

    /// SIGHUP: re-reads secrets and `refresh_token_file`s; sessions whose credentials or
    /// settings changed get `credentialsChanged` (lifting a dead refresh token, the negative
    /// cache and backoff); new sessions are added (and started), removed ones stopped. On any
    /// error nothing changes and every problem is thrown.
    ///
    /// Note: `refresh_before` and `wait_timeout` of an existing session apply from its next
    /// restart; every other setting applies to the next token request.
    public func reload(_ newConfig: BearerdConfig, environment: [String: String]) throws(ConfigErrors) {
        var errors: [ConfigError] = []
        var settings: [String: SessionSettings] = [:]
        for session in newConfig.sessions {
            do throws(ConfigErrors) {
                settings[session.name] = try SessionSettings.resolve(session, in: newConfig, environment: environment)
            } catch {
                errors += error.errors
            }
        }
        guard errors.isEmpty else { throw ConfigErrors(errors) }

        let existing: [String: TokenSessionDriver] = lock.withLock { drivers }
        var next: [String: TokenSessionDriver] = [:]
        var added: [TokenSessionDriver] = []
        for session in newConfig.sessions {
            if let driver = existing[session.name], driver.grant == session.grant,
               driver.dpop?.thumbprint == settings[session.name]?.dpop?.thumbprint,
               driver.caller?.config == session.onBehalfOf,
               driver.stateDirectory == (session.grant.usesRefreshToken ? newConfig.stateDir : nil) {
                // Resolved above, so present.
                driver.update(settings[session.name]!)
                next[session.name] = driver
            } else {
                let driver = try makeDriver(session, in: newConfig, environment: environment)
                next[session.name] = driver
                added.append(driver)
            }
        }
        let removed = existing.filter { next[$0.key] !== $0.value }.map(\.value)
        let start: Bool = lock.withLock {
            drivers = next
            config = newConfig
            return started
        }
        for d in removed { d.stop() }
        if start { for d in added { d.start() } }
        if newConfig.tracing != tracingAtStart {
            logger.warning("tracing: changed; the change takes effect at the next restart")
        }
        // Route guards no route names any more stop; new ones are made by the next runtime.
        let wanted = Set(newConfig.routes.compactMap { $0.callerJWT.map(Self.guardKey) })
        let dropped: [CallerJWTGuard] = lock.withLock {
            let gone = routeGuards.filter { !wanted.contains($0.key) }
            for k in gone.keys { routeGuards[k] = nil }
            return Array(gone.values)
        }
        for g in dropped { g.stop() }
    }

    private static func guardKey(_ c: CallerJWTConfig) -> String {
        var copy = c
        copy.line = 0
        return String(describing: copy)
    }

    /// The guard of a route's `caller_jwt:` (docs/architecture.md §6.16): the running one for the same
    /// settings, else a new one, started at once. Routes with equal settings share it.
    public func routeGuard(for config: CallerJWTConfig, route: String) throws(ConfigErrors) -> CallerJWTGuard {
        let key = Self.guardKey(config)
        if let g = lock.withLock({ routeGuards[key] }) { return g }
        let index: Int = lock.withLock {
            nextQueueIndex += 1
            return nextQueueIndex
        }
        let g = try CallerJWTGuard(config: config, owner: "route \(route)", logger: logger, outboundProxy: self.config.outboundProxy,
                                   clock: clock, queueIndex: 10_000 + index)
        let (winner, fresh): (CallerJWTGuard, Bool) = lock.withLock {
            if let existing = routeGuards[key] { return (existing, false) }
            routeGuards[key] = g
            return (g, true)
        }
        if fresh { winner.start() }
        return winner
    }

    /// For `bearerd check` (docs/architecture.md §6): refresh_token sessions whose refresh token the server
    /// refused (`invalid_grant`) while their `refresh_token_file` still holds the same content,
    /// or that have none at all, as `FILE:LINE: sessions.NAME.refresh_token_file: …` errors; and
    /// people's sessions whose stored sign-in the server refused. A person's session nobody has
    /// signed in to yet is not among them (`pendingSignIns`). Reads only: creates nothing.
    public static func reauthenticationProblems(config: BearerdConfig,
                                                environment: [String: String]) -> [ConfigError] {
        guard let dir = config.stateDir else { return [] }
        var problems: [ConfigError] = []
        for session in config.sessions where session.grant.usesRefreshToken {
            if session.grant.isPersonal {
                if StateStore.reauthentication(directory: dir, session: session.name, operatorFingerprint: nil) == .refused {
                    problems.append(ConfigError(file: config.file, line: session.line, key: "sessions.\(session.name)",
                                                message: "the token endpoint refused the stored sign-in (invalid_grant): run `bearerd login \(session.name)`"))
                }
                continue
            }
            let fingerprint = session.refreshTokenFile.flatMap { path in
                try? ConfigLoader.resolveSecret(.file(path), environment: environment)
            }.map { OAuthSecret($0.value).fingerprint }
            let file = session.refreshTokenFile ?? "refresh_token_file"
            switch StateStore.reauthentication(directory: dir, session: session.name, operatorFingerprint: fingerprint) {
            case .refused?:
                problems.append(ConfigError(file: config.file, line: session.line, key: "sessions.\(session.name).refresh_token_file",
                                            message: "the token endpoint refused the refresh token (invalid_grant): put a new one in \(file) and send SIGHUP"))
            case .noRefreshToken?:
                problems.append(ConfigError(file: config.file, line: session.line, key: "sessions.\(session.name).refresh_token_file",
                                            message: "no refresh token in \(file) or the state file: put one in \(file) and send SIGHUP"))
            case nil:
                break
            }
        }
        return problems
    }

    /// For `bearerd check`: the people's sessions (`authorization_code`, `device_code`) nobody has
    /// signed in to yet — a running bearerd found no refresh token for them, or there is no state
    /// file at all. Not an error: the configuration is fine, a person still has to run
    /// `bearerd login NAME`. Reads only: creates nothing.
    public static func pendingSignIns(config: BearerdConfig) -> [String] {
        guard let dir = config.stateDir else { return [] }
        return config.sessions.filter { session in
            guard session.grant.isPersonal else { return false }
            switch StateStore.reauthentication(directory: dir, session: session.name, operatorFingerprint: nil) {
            case .noRefreshToken?: return true
            case .refused?: return false
            case nil: return StateStore.stateFileIsMissing(directory: dir, session: session.name)
            }
        }.map(\.name)
    }

    /// Stops every session: timers disarmed, the request in flight abandoned, waiters failed.
    public func stop() {
        let guards: [CallerJWTGuard] = lock.withLock {
            defer { routeGuards = [:] }
            return Array(routeGuards.values)
        }
        for g in guards { g.stop() }
        let all: [TokenSessionDriver] = lock.withLock {
            started = false
            return Array(drivers.values)
        }
        tracer?.exporter.stop()
        for d in all { d.stop() }
    }
}
