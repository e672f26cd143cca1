import BearerdIO
import BearerdOAuth
import Foundation
import BearerdTestSupport
import Testing
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdSessions

/// The session driver against a real token endpoint on 127.0.0.1: grants and client
/// authentication on the wire, coalescing, an endpoint that is down then back, rejections.
@Suite(.serialized)
struct SessionDriverTests {
    static let secret = "s3cr3t:&+client-secret-value"

    func clientCredentials(_ url: EndpointURL, auth: ClientAuthentication = .clientSecretBasic,
                           waitTimeout: Duration = .seconds(10)) -> SessionConfig {
        SessionConfig(name: "partner", grant: .clientCredentials, tokenURL: url, clientID: "my service",
                      clientSecret: .literal(Secret(Self.secret)), clientAuth: auth, scope: "read write",
                      params: [("audience", "https://api.example.com")], waitTimeout: waitTimeout)
    }

    /// Every access token the endpoint issues is distinct: `access-AAA-<n>` for the n-th request.
    static let numbered: ScriptedTokenEndpoint.Handler = { _, n in ScriptedTokenEndpoint.token("access-AAA-\(n)") }

    @Test func clientSecretBasicOnTheWire() async throws {
        let endpoint = try ScriptedTokenEndpoint(handler: Self.numbered)
        defer { endpoint.stop() }
        let logs = CapturedLogs()
        let manager = try SessionManager(config: sessionConfig(clientCredentials(endpoint.url)), logger: logs.logger, environment: [:])
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "partner"))

        let token = try await requestToken(driver).get()
        #expect(token.value == "access-AAA-1")
        #expect(token.generation == 1)
        #expect(token.fingerprint == OAuthSecret("access-AAA-1").fingerprint)
        #expect(driver.currentGeneration == 1)
        #expect(driver.usableToken(now: monotonicNanos()) == token)

        let received = endpoint.received
        #expect(received.count == 1)
        let r = try #require(received.first)
        #expect(r.head.method == "POST")
        #expect(r.head.target == "/oauth/token")
        #expect(r.head.headers["host"] == "127.0.0.1:\(endpoint.port)")
        #expect(r.head.headers["content-type"] == "application/x-www-form-urlencoded")
        let credentials = "my+service:s3cr3t%3A%26%2Bclient-secret-value"  // RFC 6749 §2.3.1: form-encoded, then Basic
        #expect(r.authorization == "Basic " + Data(credentials.utf8).base64EncodedString())
        #expect(r.body == "grant_type=client_credentials&scope=read+write&audience=https%3A%2F%2Fapi.example.com")
        #expect(logs.lines(containingAnyOf: [Self.secret, "access-AAA-1", "s3cr3t"]).isEmpty)
        #expect(logs.lines.contains { $0.contains("token obtained") && $0.contains("token.fingerprint=\(token.fingerprint)") && $0.contains("token.generation=1") })
    }

    @Test func clientSecretPostOnTheWire() async throws {
        let endpoint = try ScriptedTokenEndpoint(handler: Self.numbered)
        defer { endpoint.stop() }
        let logs = CapturedLogs()
        let manager = try SessionManager(config: sessionConfig(clientCredentials(endpoint.url, auth: .clientSecretPost)),
                                         logger: logs.logger, environment: [:])
        defer { manager.stop() }
        let token = try await requestToken(try #require(manager.session(named: "partner"))).get()
        #expect(token.value == "access-AAA-1")
        let r = try #require(endpoint.received.first)
        #expect(r.authorization == nil)
        #expect(r.body == "grant_type=client_credentials&scope=read+write&client_id=my+service"
                + "&client_secret=s3cr3t%3A%26%2Bclient-secret-value&audience=https%3A%2F%2Fapi.example.com")
        #expect(r.form["client_secret"] == Self.secret)
        #expect(logs.lines(containingAnyOf: [Self.secret, "access-AAA-1"]).isEmpty)
    }

    @Test func passwordGrantWithSecretsFromEnvironment() async throws {
        let endpoint = try ScriptedTokenEndpoint(handler: Self.numbered)
        defer { endpoint.stop() }
        let logs = CapturedLogs()
        let session = SessionConfig(name: "legacy", grant: .password, tokenURL: endpoint.url, clientID: "app",
                                    clientSecret: .env("APP_SECRET"), clientAuth: .clientSecretBasic,
                                    username: "svc-user", password: .env("SVC_PASSWORD"))
        let manager = try SessionManager(config: sessionConfig(session), logger: logs.logger,
                                         environment: ["APP_SECRET": "app-secret-XYZ", "SVC_PASSWORD": "p@ss word-PPP"])
        defer { manager.stop() }
        let token = try await requestToken(try #require(manager.session(named: "legacy"))).get()
        #expect(token.value == "access-AAA-1")
        let r = try #require(endpoint.received.first)
        #expect(r.body == "grant_type=password&username=svc-user&password=p%40ss+word-PPP")
        #expect(r.authorization == "Basic " + Data("app:app-secret-XYZ".utf8).base64EncodedString())
        #expect(logs.lines(containingAnyOf: ["app-secret-XYZ", "p@ss word-PPP", "access-AAA-1"]).isEmpty)
    }

    @Test func missingSecretIsAConfigError() throws {
        let session = SessionConfig(name: "legacy", grant: .password, tokenURL: EndpointURL(scheme: "http", host: "127.0.0.1", port: 1, path: "/t"),
                                    clientID: "app", clientSecret: .env("NOPE_SECRET"), username: "u", password: .env("NOPE_PASSWORD"), line: 7)
        do {
            _ = try SessionManager(config: sessionConfig(session), logger: CapturedLogs().logger, environment: [:])
            Issue.record("expected ConfigErrors")
        } catch {
            let text = error.description
            #expect(text.contains("test.yaml:7: sessions.legacy.client_secret_env: environment variable NOPE_SECRET is not set"))
            #expect(text.contains("sessions.legacy.password_env"))
        }
    }

    @Test func concurrentRequestsFromSeveralLoopsShareOneTokenRequest() async throws {
        // The endpoint holds its answer until every caller waits (a gate, bounded at 10 s).
        let release = OneAnswer<Bool>()
        let endpoint = try ScriptedTokenEndpoint { _, n in
            _ = release.wait(seconds: 30)
            return ScriptedTokenEndpoint.token("access-AAA-\(n)")
        }
        defer { endpoint.stop() }
        let logs = CapturedLogs()
        let manager = try SessionManager(config: sessionConfig(clientCredentials(endpoint.url)), logger: logs.logger, environment: [:])
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "partner"))

        // Through the completion API from this thread: no child tasks that need free cooperative threads.
        let answers = (0..<200).map { _ in OneAnswer<Result<PublishedToken, TokenUnavailable>>() }
        for (i, answer) in answers.enumerated() { driver.requestToken(on: testLoops[i % testLoops.count]) { answer.put($0) } }
        #expect(await eventually(20) { driver.snapshot.waiters == 200 }, "all 200 callers wait for the one request")
        #expect(await eventually(20) { endpoint.count == 1 }, "the one request reached the endpoint")
        release.put(true)
        let results = answers.compactMap { $0.wait(seconds: 30) }
        #expect(results.count == 200)
        #expect(results.allSatisfy { (try? $0.get().value) == "access-AAA-1" })
        #expect(endpoint.count == 1)
        // Served from the published token afterwards: still one request.
        #expect(driver.usableToken(now: monotonicNanos())?.value == "access-AAA-1")
        _ = try await requestToken(driver, on: testLoops[3]).get()
        #expect(endpoint.count == 1)
        #expect(driver.metrics.tokenRequests == 1)
        #expect(driver.metrics.tokensObtained == 1)
        #expect(driver.status == .ready)
    }

    @Test func endpoint503WithRetryAfterThenRecovery() async throws {
        let endpoint = try ScriptedTokenEndpoint { _, _ in
            ScriptedTokenEndpoint.error(503, "temporarily_unavailable", "down for maintenance", headers: [("Retry-After", "2")])
        }
        defer { endpoint.stop() }
        let logs = CapturedLogs()
        let clock = FakeSessionClock()
        let manager = try SessionManager(config: sessionConfig(clientCredentials(endpoint.url, waitTimeout: .milliseconds(500))),
                                         logger: logs.logger, environment: [:], tunePolicy: nil, clock: clock)
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "partner"))

        // Answered at once: the retry (after Retry-After, 2 s) is past the wait bound (0.5 s).
        let first = await requestToken(driver)
        guard case .failure(let unavailable) = first else {
            Issue.record("expected TokenUnavailable, got \(first)")
            return
        }
        #expect(unavailable.session == "partner")
        #expect((1...3).contains(unavailable.retryAfterSeconds))
        #expect(unavailable.detail.contains("temporarily_unavailable"))
        #expect(unavailable.detail.contains("down for maintenance"))
        #expect(endpoint.count == 1)
        #expect(logs.lines.contains { $0.contains("[warning] token request failed") && $0.contains("oauth.error=temporarily_unavailable")
            && $0.contains("oauth.error_description=down for maintenance") && $0.contains("http.status=503") })

        // The endpoint comes back: nothing is sent before Retry-After (2 s, over the 1 s backoff),
        // then the retry gets a token.
        endpoint.handler = Self.numbered
        await clock.advance(by: .milliseconds(1999))
        #expect(driver.metrics.tokenRequests == 1, "no retry before Retry-After")
        await clock.advance(by: .milliseconds(1))
        #expect(driver.metrics.tokenRequests == 2, "the retry at Retry-After")
        #expect(await eventually(5) { driver.currentGeneration == 1 }, "the retry got a token")
        #expect(try await requestToken(driver).get().value == "access-AAA-2")
        #expect(endpoint.count == 2)
        #expect(logs.lines(containingAnyOf: [Self.secret, "access-AAA-"]).isEmpty)
    }

    @Test func connectionRefusedThenEndpointComesBack() async throws {
        let port = unusedPort()
        let url = EndpointURL(scheme: "http", host: "127.0.0.1", port: port, path: "/oauth/token")
        let logs = CapturedLogs()
        let clock = FakeSessionClock()
        let manager = try SessionManager(config: sessionConfig(clientCredentials(url, waitTimeout: .milliseconds(500))),
                                         logger: logs.logger, environment: [:], tunePolicy: nil, clock: clock)
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "partner"))
        manager.start()

        let first = await requestToken(driver)
        guard case .failure(let unavailable) = first else {
            Issue.record("expected TokenUnavailable, got \(first)")
            return
        }
        #expect(unavailable.retryAfterSeconds >= 1 && unavailable.retryAfterSeconds <= 30)
        #expect(unavailable.detail.hasPrefix("token."))
        #expect(driver.usableToken(now: clock.now().nanoseconds) == nil)

        // The endpoint comes back; the first retry (1 s ± 10 % after the failure) gets a token.
        let endpoint = try ScriptedTokenEndpoint(port: port, handler: Self.numbered)
        defer { endpoint.stop() }
        #expect(driver.metrics.tokenRequests == 1)
        await clock.advance(by: .milliseconds(1100))
        #expect(driver.metrics.tokenRequests == 2, "the first retry")
        #expect(await eventually(5) { driver.currentGeneration == 1 })
        #expect(try await requestToken(driver).get().value == "access-AAA-1")
        #expect(endpoint.count == 1)
        #expect(logs.lines.contains { $0.contains("error.reason=token.transport") && $0.contains("request_sent=false") })
    }

    @Test func permanentErrorIsNegativeCachedWithTheServersError() async throws {
        let endpoint = try ScriptedTokenEndpoint { _, _ in ScriptedTokenEndpoint.error(401, "invalid_client", "unknown client") }
        defer { endpoint.stop() }
        let logs = CapturedLogs()
        let manager = try SessionManager(config: sessionConfig(clientCredentials(endpoint.url)), logger: logs.logger, environment: [:])
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "partner"))
        guard case .failure(let u) = await requestToken(driver) else { Issue.record("expected a failure"); return }
        #expect(u.detail.contains("invalid_client"))
        #expect(u.detail.contains("unknown client"))
        #expect(u.retryAfterSeconds >= 50)
        guard case .failure = await requestToken(driver) else { Issue.record("expected a failure"); return }
        #expect(endpoint.count == 1)
        #expect(logs.lines.contains { $0.hasPrefix("[error]") && $0.contains("oauth.error=invalid_client") })
    }

    @Test func oversizedResponseIsRefused() async throws {
        let big = String(repeating: "x", count: (1 << 20) + 10)
        let endpoint = try ScriptedTokenEndpoint { _, _ in .json(status: 200, body: "{\"access_token\":\"\(big)\"}") }
        defer { endpoint.stop() }
        let logs = CapturedLogs()
        // A wait bound under the 1 s backoff: the caller gets the failure at once, not at its timeout.
        let manager = try SessionManager(config: sessionConfig(clientCredentials(endpoint.url, waitTimeout: .milliseconds(500))),
                                         logger: logs.logger, environment: [:])
        defer { manager.stop() }
        guard case .failure(let u) = await requestToken(try #require(manager.session(named: "partner"))) else {
            Issue.record("expected a failure")
            return
        }
        #expect(u.detail.contains("token.response_too_large"))
    }

    @Test func backgroundRefreshBeforeExpiryWithoutAnyCaller() async throws {
        // L = 1 h, sent at t0 (the test clock does not move meanwhile): soft point at
        // t0 + L − min(300 s, L/2) × [0.9, 1] = t0 + 3300…3330 s; hard point t0 + L − min(60 s, L/4).
        let endpoint = try ScriptedTokenEndpoint { _, n in ScriptedTokenEndpoint.token("access-AAA-\(n)", expiresIn: 3600) }
        defer { endpoint.stop() }
        let logs = CapturedLogs()
        let clock = FakeSessionClock()
        let t0 = clock.now()
        let manager = try SessionManager(config: sessionConfig(clientCredentials(endpoint.url)), logger: logs.logger,
                                         environment: [:], tunePolicy: nil, clock: clock)
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "partner"))
        manager.start()
        #expect(await eventually(5) { driver.currentGeneration == 1 })
        let first = try #require(driver.usableToken(now: clock.now().nanoseconds))
        #expect(first.value == "access-AAA-1")
        #expect(first.usableUntil == (t0 + .seconds(3540)).nanoseconds, "usable without asking until the hard point")
        await clock.advance(by: .seconds(3299))
        #expect(driver.metrics.tokenRequests == 1, "no refresh before the soft point")
        #expect(driver.usableToken(now: clock.now().nanoseconds)?.value == "access-AAA-1")
        // The next timer is the refresh (the request's timeout went by harmlessly): only that
        // one, so the new request's own timeout (15 s) cannot come due while it is on the wire.
        let refreshAt = try #require(await clock.advanceToNextTimer())
        #expect(refreshAt - t0 >= .seconds(3300) && refreshAt - t0 <= .seconds(3330), "soft point \(refreshAt - t0)")
        #expect(driver.metrics.tokenRequests == 2, "the refresh at the soft point, without any caller")
        #expect(await eventually(5) { driver.currentGeneration == 2 })
        #expect(driver.usableToken(now: clock.now().nanoseconds)?.value == "access-AAA-2")
        #expect(logs.lines.contains { $0.contains("token.reason=soft") && $0.contains("token.generation=2") })
    }

    @Test func reloadAddsAndRemovesSessions() async throws {
        let endpoint = try ScriptedTokenEndpoint(handler: Self.numbered)
        defer { endpoint.stop() }
        let logs = CapturedLogs()
        let partner = clientCredentials(endpoint.url)
        var other = clientCredentials(endpoint.url)
        other.name = "other"
        let manager = try SessionManager(config: sessionConfig(partner), logger: logs.logger, environment: [:])
        defer { manager.stop() }
        let old = try #require(manager.session(named: "partner"))
        _ = try await requestToken(old).get()

        var next = sessionConfig(other)
        try manager.reload(next, environment: [:])
        #expect(manager.session(named: "partner") == nil)
        #expect(manager.sessionNames == ["other"])
        guard case .failure(let u) = await requestToken(old) else { Issue.record("a removed session must not hand out tokens"); return }
        #expect(u.detail == "token.session_stopped")
        let added = try #require(manager.session(named: "other"))
        #expect(try await requestToken(added).get().value == "access-AAA-2")

        // A bad reload changes nothing.
        next.sessions[0].clientSecret = .env("MISSING_SECRET_ENV")
        #expect(throws: ConfigErrors.self) { try manager.reload(next, environment: [:]) }
        #expect(manager.session(named: "other") === added)
        // An unchanged session keeps its driver (the proxy may hold it) and its token.
        try manager.reload(sessionConfig(other), environment: [:])
        #expect(manager.session(named: "other") === added)
        #expect(added.usableToken(now: monotonicNanos())?.value == "access-AAA-2")
    }

    @Test func staleRejectionReplaysAtOnceWithoutARequest() async throws {
        let endpoint = try ScriptedTokenEndpoint(handler: Self.numbered)
        defer { endpoint.stop() }
        let logs = CapturedLogs()
        let manager = try SessionManager(config: sessionConfig(clientCredentials(endpoint.url)), logger: logs.logger, environment: [:])
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "partner"))
        let first = try await requestToken(driver).get()
        #expect(first.generation == 1)

        // Rejection of the current generation: one forced refresh, replay with the new token.
        guard case .replay(let second, _) = await reportRejected(driver, generation: 1) else { Issue.record("expected replay"); return }
        #expect(second.value == "access-AAA-2")
        #expect(second.generation == 2)
        #expect(endpoint.count == 2)
        #expect(driver.currentGeneration == 2)

        // A late rejection of generation 1 is stale: replay with the current token, no request.
        guard case .replay(let again, _) = await reportRejected(driver, generation: 1, on: testLoops[2]) else { Issue.record("expected replay"); return }
        #expect(again == second)
        #expect(endpoint.count == 2)
        #expect(logs.lines.contains { $0.contains("token.reason=rejected") && $0.contains("token.generation=2") })
    }

    /// The loops' lock-free read (docs/architecture.md §2.5): a loop caches the published token with the
    /// publication version and re-reads it under the lock only when the version moved.
    @Test func publicationVersionMovesWithEveryPublishedToken() async throws {
        let endpoint = try ScriptedTokenEndpoint(handler: Self.numbered)
        defer { endpoint.stop() }
        let manager = try SessionManager(config: sessionConfig(clientCredentials(endpoint.url)), logger: CapturedLogs().logger, environment: [:])
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "partner"))
        let first = try await requestToken(driver).get()
        let v1 = driver.publishedVersion
        #expect(driver.publishedToken == first)
        #expect(driver.publishedVersion == v1, "no publication, no new version")
        guard case .replay(let second, _) = await reportRejected(driver, generation: first.generation) else { Issue.record("expected replay"); return }
        // The rejection unpublished the usable window, then the refresh published the new token.
        #expect(driver.publishedVersion > v1)
        #expect(driver.publishedToken == second)
        #expect(driver.usableToken(now: monotonicNanos()) == second)
    }

    @Test func fiftyConcurrentRejectionsOfTheCurrentGenerationShareOneRefresh() async throws {
        // The refresh's answer is held until every rejection waits (a gate, bounded at 10 s).
        let release = OneAnswer<Bool>()
        let endpoint = try ScriptedTokenEndpoint { _, n in
            if n > 1 { _ = release.wait(seconds: 30) }
            return ScriptedTokenEndpoint.token("access-AAA-\(n)")
        }
        defer { endpoint.stop() }
        let logs = CapturedLogs()
        let manager = try SessionManager(config: sessionConfig(clientCredentials(endpoint.url)), logger: logs.logger, environment: [:])
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "partner"))
        let first = try await requestToken(driver).get()

        let answers = (0..<50).map { _ in OneAnswer<RejectionOutcome>() }
        for (i, answer) in answers.enumerated() {
            driver.reportRejected(generation: first.generation, on: testLoops[i % testLoops.count]) { answer.put($0) }
        }
        #expect(await eventually(20) { driver.snapshot.waiters == 50 }, "all 50 rejections wait for the one refresh")
        release.put(true)
        let outcomes = answers.compactMap { $0.wait(seconds: 30) }
        #expect(outcomes.count == 50)
        #expect(endpoint.count == 2)
        for o in outcomes {
            guard case .replay(let t, _) = o else { Issue.record("expected replay, got \(o)"); continue }
            #expect(t.value == "access-AAA-2")
            #expect(t.generation == 2)
        }
        #expect(driver.usableToken(now: monotonicNanos())?.generation == 2)
        #expect(driver.metrics.forcedRefreshes == 1)
    }

    /// docs/architecture.md §6: a held rejection whose refresh fails gets the 503 (`.unavailable`), never the
    /// upstream's rejection: the client's own credentials are not the problem.
    @Test func rejectionGetsTokenUnavailableWhenTheRefreshFails() async throws {
        let endpoint = try ScriptedTokenEndpoint { _, n in
            n == 1 ? ScriptedTokenEndpoint.token("access-AAA-1") : ScriptedTokenEndpoint.error(400, "invalid_scope", "no")
        }
        defer { endpoint.stop() }
        let manager = try SessionManager(config: sessionConfig(clientCredentials(endpoint.url)), logger: CapturedLogs().logger, environment: [:])
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "partner"))
        let first = try await requestToken(driver).get()
        guard case .unavailable(let u) = await reportRejected(driver, generation: first.generation) else {
            Issue.record("expected unavailable")
            return
        }
        #expect(u.detail.hasPrefix("token.negative_cached"))
        #expect(u.detail.contains("invalid_scope"))
        #expect(u.retryAfterSeconds >= 50)
        #expect(endpoint.count == 2)
        #expect(driver.metrics.rejectionsNotReplayed == ["negative_cached": 1])
    }
}
