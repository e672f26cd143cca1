import BearerdIO
import BearerdOAuth
import Foundation
import BearerdTestSupport
import Testing
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdSessions
@testable import BearerdService

/// refresh_token sessions (docs/architecture.md §6.7): the endpoint rotates refresh
/// tokens and accepts only the newest; the state file must hold the newest before the access
/// token is handed out, survive a restart, be shared by two managers (two processes), and a
/// dead refresh token must stop all traffic until the operator file changes.
@Suite(.serialized)
struct SessionRefreshTokenTests {
    /// A rotating authorization server: `refresh-RRR-<n>` is valid until used once; using it
    /// issues `access-AAA-<n+1>` and `refresh-RRR-<n+1>`. Anything else is `invalid_grant`.
    final class RotatingServer: @unchecked Sendable {  // @unchecked: `valid`/`issued` guarded by `lock`
        private let lock = NSLock()
        private var valid: String
        private var issued = 0
        let expiresIn: Int
        /// Bytes of padding appended to every issued refresh token (servers with large tokens).
        let padding: Int
        init(first: String = "refresh-RRR-0", expiresIn: Int = 3600, padding: Int = 0) {
            valid = first
            self.expiresIn = expiresIn
            self.padding = padding
        }
        /// Makes `token` the valid refresh token (the operator got a new one).
        func accept(_ token: String) { lock.withLock { valid = token } }
        var handler: ScriptedTokenEndpoint.Handler {
            { [self] request, _ in
                lock.withLock {
                    guard request.form["grant_type"] == "refresh_token", request.form["refresh_token"] == valid else {
                        return ScriptedTokenEndpoint.error(400, "invalid_grant", "refresh token expired or revoked")
                    }
                    issued += 1
                    valid = "refresh-RRR-\(issued)" + String(repeating: "p", count: padding)
                    return ScriptedTokenEndpoint.token("access-AAA-\(issued)", expiresIn: expiresIn, refresh: valid)
                }
            }
        }
    }

    struct Fixture {
        let root: String
        let stateDir: String
        let refreshFile: String
        let config: BearerdConfig
        var statePath: String { stateDir + "/me.json" }

        init(endpoint: ScriptedTokenEndpoint, initialRefreshToken: String = "refresh-RRR-0") {
            root = temporaryDirectory()
            stateDir = root + "/state"
            refreshFile = root + "/me.refresh"
            writeFile(refreshFile, initialRefreshToken + "\n")
            let session = SessionConfig(name: "me", grant: .refreshToken, tokenURL: endpoint.url, clientID: "cli",
                                        clientAuth: .none, refreshTokenFile: refreshFile)
            config = sessionConfig(session, stateDir: stateDir)
        }

        /// The same files with another configuration.
        init(endpoint: ScriptedTokenEndpoint, config: BearerdConfig, from other: Fixture) {
            root = other.root
            stateDir = other.stateDir
            refreshFile = other.refreshFile
            self.config = config
        }

        func stored() throws -> PersistedSessionState {
            let bytes = try #require(FileManager.default.contents(atPath: statePath))
            return try PersistedSessionState.decode(Array(bytes))
        }
    }

    static let secrets = ["access-AAA-", "refresh-RRR-"]

    @Test func rotatedRefreshTokenIsPersistedBeforeTheAccessTokenIsHandedOut() async throws {
        let server = RotatingServer()
        let endpoint = try ScriptedTokenEndpoint(handler: server.handler)
        defer { endpoint.stop() }
        let f = Fixture(endpoint: endpoint)
        defer { removeTree(f.root) }
        let logs = CapturedLogs()
        let manager = try SessionManager(config: f.config, logger: logs.logger, environment: [:])
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "me"))
        #expect(fileMode(f.stateDir) == 0o700)

        // Read the state file at the very moment the token is delivered.
        let statePath = f.statePath
        let (result, storedAtDelivery) = await withCheckedContinuation { c in
            driver.requestToken(on: testLoops[1]) { result in
                let bytes = FileManager.default.contents(atPath: statePath).map { Array($0) }
                c.resume(returning: (result, bytes.flatMap { try? PersistedSessionState.decode($0) }))
            }
        }
        let token = try result.get()
        #expect(token.value == "access-AAA-1")
        let stored = try #require(storedAtDelivery)
        #expect(stored.refreshToken.exposedValue == "refresh-RRR-1")
        #expect(stored.accessToken?.token.exposedValue == "access-AAA-1")
        #expect(stored.sourceFingerprint == OAuthSecret("refresh-RRR-0").fingerprint)
        #expect(fileMode(f.statePath) == 0o600)
        #expect(fileMode(f.stateDir) == 0o700)
        #expect(endpoint.received.first?.body == "grant_type=refresh_token&refresh_token=refresh-RRR-0&client_id=cli")

        // A forced refresh rotates again, and the file follows.
        guard case .replay(let second, _) = await reportRejected(driver, generation: token.generation) else {
            Issue.record("expected replay")
            return
        }
        #expect(second.value == "access-AAA-2")
        #expect(try f.stored().refreshToken.exposedValue == "refresh-RRR-2")
        #expect(endpoint.received.last?.form["refresh_token"] == "refresh-RRR-1")
        #expect(logs.lines(containingAnyOf: Self.secrets).isEmpty)
    }

    @Test func restartAdoptsAValidPersistedAccessTokenWithoutCallingTheServer() async throws {
        let server = RotatingServer()
        let endpoint = try ScriptedTokenEndpoint(handler: server.handler)
        defer { endpoint.stop() }
        let f = Fixture(endpoint: endpoint)
        defer { removeTree(f.root) }
        let logs = CapturedLogs()

        let first = try SessionManager(config: f.config, logger: logs.logger, environment: [:])
        let t1 = try await requestToken(try #require(first.session(named: "me"))).get()
        first.stop()
        #expect(endpoint.count == 1)

        let second = try SessionManager(config: f.config, logger: logs.logger, environment: [:])
        defer { second.stop() }
        let d2 = try #require(second.session(named: "me"))
        let t2 = try await requestToken(d2).get()
        #expect(t2.value == t1.value)
        #expect(endpoint.count == 1)
        #expect(d2.metrics.tokensAdopted == 1)
        #expect(d2.metrics.tokenRequests == 0)
        #expect(logs.lines.contains { $0.contains("token adopted from the state file") && $0.contains("outcome=adopted") })
        #expect(logs.lines(containingAnyOf: Self.secrets).isEmpty)
    }

    @Test func restartWithAnExpiringAccessTokenRefreshesWithTheNewestRefreshToken() async throws {
        let server = RotatingServer(expiresIn: 50)  // less than the 60 s an adopted token must have left
        let endpoint = try ScriptedTokenEndpoint(handler: server.handler)
        defer { endpoint.stop() }
        let base = Fixture(endpoint: endpoint)
        defer { removeTree(base.root) }
        // The background refresh starts 2 s before expiry (48 s after each token), so a test
        // thread that stalls under a loaded parallel run does not see a third, soft refresh
        // (with 30 s tokens and the default margin it came 13.5–15 s after the second).
        var config = base.config
        config.sessions[0].refreshBefore = .seconds(2)
        let f = Fixture(endpoint: endpoint, config: config, from: base)
        let logs = CapturedLogs()

        let first = try SessionManager(config: f.config, logger: logs.logger, environment: [:])
        _ = try await requestToken(try #require(first.session(named: "me"))).get()
        first.stop()

        let second = try SessionManager(config: f.config, logger: logs.logger, environment: [:])
        defer { second.stop() }
        let t = try await requestToken(try #require(second.session(named: "me"))).get()
        #expect(t.value == "access-AAA-2")
        #expect(endpoint.count == 2)
        #expect(endpoint.received.last?.form["refresh_token"] == "refresh-RRR-1")
        #expect(try f.stored().refreshToken.exposedValue == "refresh-RRR-2")
        #expect(logs.lines(containingAnyOf: Self.secrets).isEmpty)
    }

    /// The state file's `flock` may be held by another process for its whole refresh;
    /// waiting for it must not stall the session queue, whose waiter timeouts keep firing.
    @Test func waitingForTheStateLockDoesNotStallTheSessionQueue() async throws {
        let server = RotatingServer()
        let endpoint = try ScriptedTokenEndpoint(handler: server.handler)
        defer { endpoint.stop() }
        var f = Fixture(endpoint: endpoint)
        defer { removeTree(f.root) }
        var config = f.config
        config.sessions[0].waitTimeout = .milliseconds(300)
        f = Fixture(endpoint: endpoint, config: config, from: f)
        // Another process holds the lock.
        try FileManager.default.createDirectory(atPath: f.stateDir, withIntermediateDirectories: true)
        let lockFD = open(f.stateDir + "/me.lock", O_RDWR | O_CREAT, 0o600)
        #expect(flock(lockFD, LOCK_EX) == 0)
        // Only a guard against a hang if the session queue blocks in flock (the bug this test is
        // about): the "other process" gives the lock up after 60 s at the latest, and says so.
        let held = Latch()
        let guardFD = dup(lockFD)
        DispatchQueue.global().asyncAfter(deadline: .now() + 60) {
            held.open()
            flock(guardFD, LOCK_UN)
            close(guardFD)
        }
        let clock = FakeSessionClock()
        let manager = try SessionManager(config: f.config, logger: CapturedLogs().logger, environment: [:],
                                         tunePolicy: nil, clock: clock)
        defer { manager.stop() }
        // The "other process" holds the lock until the test lets it go (no real-time window); on
        // every way out, before the manager stops, so a queue blocked in flock cannot hang the test.
        defer {
            flock(lockFD, LOCK_UN)
            close(lockFD)
        }
        let driver = try #require(manager.session(named: "me"))
        let answer = OneAnswer<Result<PublishedToken, TokenUnavailable>>()
        driver.requestToken(on: testLoops[0]) { answer.put($0) }
        await FakeSessionClock.settle(driver.queue)  // the waiter is in, its timeout armed
        #expect(driver.snapshot.waiters == 1)
        // The waiter's timeout comes due: it must run on the session queue while the lock is held.
        await clock.advance(by: .milliseconds(300))
        let result = try #require(answer.wait(seconds: 30), "the waiter's timeout did not fire while the lock was held")
        #expect(!held.isOpen, "the waiter's timeout fired while the lock was held")
        guard case .failure(let u) = result else { Issue.record("expected a wait timeout, got \(result)"); return }
        #expect(u.detail.contains("wait_timeout"), "\(u.detail)")
        // The other process finishes: the refresh goes on and later callers get a token.
        flock(lockFD, LOCK_UN)
        #expect(await eventually(30) { driver.currentGeneration == 1 }, "the refresh went on once the lock was free")
        #expect(try await requestToken(driver).get().value == "access-AAA-1")
    }

    /// docs/architecture.md §6.7: a rotated refresh token that cannot be written (here the state file's
    /// path is taken by a directory, so the rename fails) is still served, kept in memory, and
    /// retried until the write succeeds; meanwhile it is loud (error log, counter, /readyz).
    @Test func aFailedStateWriteKeepsServingAndRetriesUntilItSucceeds() async throws {
        let server = RotatingServer()
        let endpoint = try ScriptedTokenEndpoint(handler: server.handler)
        defer { endpoint.stop() }
        let f = Fixture(endpoint: endpoint)
        defer { removeTree(f.root) }
        let logs = CapturedLogs()
        let clock = FakeSessionClock()
        let manager = try SessionManager(config: f.config, logger: logs.logger, environment: [:], tunePolicy: nil, clock: clock)
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "me"))
        let first = try await requestToken(driver).get()
        #expect(try f.stored().refreshToken.exposedValue == "refresh-RRR-1")

        try FileManager.default.removeItem(atPath: f.statePath)
        try FileManager.default.createDirectory(atPath: f.statePath, withIntermediateDirectories: false)
        guard case .replay(let second, _) = await reportRejected(driver, generation: first.generation) else {
            Issue.record("expected replay")
            return
        }
        #expect(second.value == "access-AAA-2", "the new token is served although it could not be written")
        let failing = driver.snapshot
        #expect(failing.persistFailure != nil)
        #expect(failing.counters.statePersistFailures >= 1)
        let ready = AdminResponder.readiness(phase: .serving, sessions: [failing], now: clock.now().nanoseconds)
        #expect(ready.status == 503)
        #expect(ready.body.contains("\"state\":\"state_not_persisted\""))
        #expect(logs.lines.contains { $0.contains("cannot persist the session state") })

        // The next refresh must use the rotated token kept in memory, not the one on disk.
        try FileManager.default.removeItem(atPath: f.statePath)
        // The first retry is 1 s after the failure; nothing is written before it.
        await clock.advance(by: .milliseconds(999))
        #expect(driver.snapshot.persistFailure != nil, "no write before the retry")
        #expect(!FileManager.default.fileExists(atPath: f.statePath))
        await clock.advance(by: .milliseconds(1))
        #expect(driver.snapshot.persistFailure == nil, "the write was retried and succeeded")
        #expect(try f.stored().refreshToken.exposedValue == "refresh-RRR-2")
        #expect(AdminResponder.readiness(phase: .serving, sessions: [driver.snapshot], now: clock.now().nanoseconds).status == 200)
        #expect(logs.lines(containingAnyOf: Self.secrets).isEmpty)
    }

    /// A rotated refresh token over 64 KiB was written but refused on read, so a
    /// restart sent the already-rotated initial token. One limit (1 MiB) both ways now.
    @Test func aLargeRotatedRefreshTokenSurvivesARestart() async throws {
        let server = RotatingServer(expiresIn: 30, padding: 100 * 1024)
        let endpoint = try ScriptedTokenEndpoint(handler: server.handler)
        defer { endpoint.stop() }
        let f = Fixture(endpoint: endpoint)
        defer { removeTree(f.root) }
        let logs = CapturedLogs()

        let first = try SessionManager(config: f.config, logger: logs.logger, environment: [:])
        _ = try await requestToken(try #require(first.session(named: "me"))).get()
        first.stop()
        let big = "refresh-RRR-1" + String(repeating: "p", count: 100 * 1024)
        #expect(try f.stored().refreshToken.exposedValue == big)

        let second = try SessionManager(config: f.config, logger: logs.logger, environment: [:])
        defer { second.stop() }
        let t = try await requestToken(try #require(second.session(named: "me"))).get()
        #expect(t.value == "access-AAA-2", "the restart used the persisted (large) refresh token")
        #expect(endpoint.received.last?.form["refresh_token"] == big)
        #expect(!logs.text.contains("state.too_large"))
    }

    @Test func twoProcessesShareTheStateUnderTheLock() async throws {
        let server = RotatingServer()
        let endpoint = try ScriptedTokenEndpoint(handler: server.handler)
        defer { endpoint.stop() }
        let f = Fixture(endpoint: endpoint)
        defer { removeTree(f.root) }
        let logs = CapturedLogs()
        let a = try SessionManager(config: f.config, logger: logs.logger, environment: [:])
        let b = try SessionManager(config: f.config, logger: logs.logger, environment: [:])
        defer { a.stop(); b.stop() }
        let da = try #require(a.session(named: "me")), db = try #require(b.session(named: "me"))

        // A refreshes first (refresh-RRR-0 → 1); B, which also started from the operator file,
        // finds the rotation under the lock and adopts it instead of sending a dead token.
        let ta = try await requestToken(da).get()
        let tb = try await requestToken(db).get()
        #expect(ta.value == "access-AAA-1")
        #expect(tb.value == "access-AAA-1")
        #expect(endpoint.count == 1)

        // B is forced to refresh (rotating to refresh-RRR-2); then A's forced refresh adopts
        // B's newer access token from the state file without calling the server.
        guard case .replay(let tb2, _) = await reportRejected(db, generation: tb.generation) else { Issue.record("expected replay"); return }
        #expect(tb2.value == "access-AAA-2")
        #expect(endpoint.count == 2)
        guard case .replay(let ta2, _) = await reportRejected(da, generation: ta.generation) else { Issue.record("expected replay"); return }
        #expect(ta2.value == "access-AAA-2")
        #expect(endpoint.count == 2)
        #expect(endpoint.received.map { $0.form["refresh_token"] ?? "" } == ["refresh-RRR-0", "refresh-RRR-1"])
        #expect(logs.lines(containingAnyOf: Self.secrets).isEmpty)
    }

    @Test func transportFailureAfterSendingRetriesOnceAtOnceWithTheSameRefreshToken() async throws {
        let server = RotatingServer()
        let rotating = server.handler
        // The first request is read, then the connection drops without an answer (the server
        // may or may not have rotated: it did not here).
        let endpoint = try ScriptedTokenEndpoint { request, n in n == 1 ? .close : rotating(request, n) }
        defer { endpoint.stop() }
        let f = Fixture(endpoint: endpoint)
        defer { removeTree(f.root) }
        let logs = CapturedLogs()
        let manager = try SessionManager(config: f.config, logger: logs.logger, environment: [:])
        defer { manager.stop() }
        let token = try await requestToken(try #require(manager.session(named: "me"))).get()
        #expect(token.value == "access-AAA-1")
        // No backoff before the same-token retry (a backoff would be at least 0.9 s): measured
        // between the two requests at the endpoint, so a loaded machine's start-up does not count.
        let times = endpoint.received.map(\.receivedAt)
        #expect(times.count == 2 && times[1] - times[0] < 850_000_000)
        #expect(endpoint.received.map { $0.form["refresh_token"] ?? "" } == ["refresh-RRR-0", "refresh-RRR-0"])
        #expect(logs.lines.contains { $0.contains("error.reason=token.transport") && $0.contains("request_sent=true") })
        #expect(try f.stored().refreshToken.exposedValue == "refresh-RRR-1")
        #expect(logs.lines(containingAnyOf: Self.secrets).isEmpty)
    }

    @Test func invalidGrantNeedsReauthenticationAndStopsTrafficUntilTheFileChanges() async throws {
        let server = RotatingServer(first: "refresh-RRR-valid-only-later")
        let endpoint = try ScriptedTokenEndpoint(handler: server.handler)
        defer { endpoint.stop() }
        let f = Fixture(endpoint: endpoint, initialRefreshToken: "refresh-RRR-dead")
        defer { removeTree(f.root) }
        let logs = CapturedLogs()
        let clock = FakeSessionClock()
        let manager = try SessionManager(config: f.config, logger: logs.logger, environment: [:], tunePolicy: nil, clock: clock)
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "me"))
        manager.start()

        let failed = await eventually(5) { endpoint.count >= 1 }
        #expect(failed)
        guard case .failure(let u) = await requestToken(driver) else { Issue.record("expected TokenUnavailable"); return }
        #expect(u.detail.contains("token.needs_reauthentication"))
        #expect(u.detail.contains("invalid_grant"))
        #expect(u.detail.contains("refresh token expired or revoked"))
        guard case .failure = await requestToken(driver, on: testLoops[2]) else { Issue.record("expected TokenUnavailable"); return }
        #expect(driver.status == .needsReauthentication)
        #expect(driver.metrics.failuresInvalidGrant == 1)
        #expect(driver.metrics.tokenRequests == 1)
        // No timer revives a dead refresh token, however long the session waits.
        await clock.advance(by: .seconds(3 * 3600))
        #expect(driver.status == .needsReauthentication)
        #expect(driver.metrics.tokenRequests == 1)
        #expect(endpoint.count == 1)
        #expect(logs.lines.contains { $0.hasPrefix("[error]") && $0.contains("session me needs a new refresh token: put one in \(f.refreshFile) and send SIGHUP") })

        let problems = SessionManager.reauthenticationProblems(config: f.config, environment: [:])
        #expect(problems.map(\.key) == ["sessions.me.refresh_token_file"])
        #expect(problems.first?.message.contains("put a new one in \(f.refreshFile)") == true)

        // A SIGHUP with the file unchanged sends nothing.
        try manager.reload(f.config, environment: [:])
        await clock.advance(by: .seconds(3 * 3600))  // also settles the reload on the session queue
        #expect(driver.status == .needsReauthentication)
        #expect(driver.metrics.tokenRequests == 1)
        #expect(endpoint.count == 1)

        // The operator puts a new refresh token in the file and sends SIGHUP.
        server.accept("refresh-RRR-new")
        writeFile(f.refreshFile, "refresh-RRR-new\n")
        try manager.reload(f.config, environment: [:])
        let recovered = await eventually(5) {
            if case .success = await requestToken(driver) { return true }
            return false
        }
        #expect(recovered)
        #expect(endpoint.received.last?.form["refresh_token"] == "refresh-RRR-new")
        #expect(try f.stored().sourceFingerprint == OAuthSecret("refresh-RRR-new").fingerprint)
        #expect(SessionManager.reauthenticationProblems(config: f.config, environment: [:]).isEmpty)
        #expect(logs.lines(containingAnyOf: Self.secrets).isEmpty)
    }
}
