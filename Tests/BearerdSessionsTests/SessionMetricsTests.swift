import BearerdHTTP
import BearerdIO
import BearerdOAuth
import Foundation
import BearerdTestSupport
import Testing
@testable import BearerdProxyCore
@testable import BearerdConfig
@testable import BearerdSessions

/// The session driver's counters (waits, waiters, stale serves, refreshes) against a real token
/// endpoint on 127.0.0.1.
@Suite(.serialized)
struct SessionMetricsTests {
    func session(_ url: EndpointURL, waitTimeout: Duration = .seconds(10)) -> SessionConfig {
        SessionConfig(name: "partner", grant: .clientCredentials, tokenURL: url, clientID: "svc",
                      clientSecret: .literal(Secret("metrics-secret")), waitTimeout: waitTimeout)
    }

    @Test func coalescedWaitersAreCountedAndVisibleWhileWaiting() async throws {
        // The token endpoint answers only once the five waiters were seen (a gate, not a delay: a
        // loaded machine may take longer than any fixed delay to start five requests), or after
        // 9 s, within the session's 10 s wait and 15 s request timeouts.
        let gate = DispatchSemaphore(value: 0)
        let endpoint = try ScriptedTokenEndpoint { _, n in
            _ = gate.wait(timeout: .now() + 9)
            return ScriptedTokenEndpoint.token("access-M-\(n)")
        }
        defer { endpoint.stop() }
        let manager = try SessionManager(config: sessionConfig(session(endpoint.url)), logger: CapturedLogs().logger, environment: [:])
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "partner"))
        #expect(driver.snapshot.expiresAt == nil)
        // Five callers through the driver's completion API, from this thread: no child task that
        // needs a free cooperative thread (end-to-end tests may hold both on a 2-core machine).
        let answers = (0..<5).map { _ in OneAnswer<Result<PublishedToken, TokenUnavailable>>() }
        for (i, answer) in answers.enumerated() { driver.requestToken(on: testLoops[i % 4]) { answer.put($0) } }
        var sawFive = false
        let seeDeadline = Date().addingTimeInterval(8)
        while !sawFive && Date() < seeDeadline {
            sawFive = driver.snapshot.waiters == 5
            if !sawFive { usleep(10_000) }
        }
        gate.signal()
        #expect(sawFive)
        let ok = answers.filter { (try? $0.wait(seconds: 30)?.get()) != nil }.count
        #expect(ok == 5)
        let s = driver.snapshot
        #expect(s.waiters == 0)
        #expect(s.counters.waits == 5)
        #expect(s.counters.refreshes == [TokenRefreshKey(reason: "start", outcome: "success", error: ""): 1])
        #expect(s.generation == 1)
        let left = Double((s.expiresAt ?? 0) &- monotonicNanos()) / 1e9
        #expect(left > 3500 && left <= 3600)
        #expect(s.counters.staleServes.allSatisfy { $0 == 0 })
    }

    /// docs/architecture.md §6: a rejected token is never served again, not even while the session is
    /// negative-cached: the rejection and later callers get the failure (a 503), counted.
    @Test func aFailedRefreshAfterARejectionServesNobodyTheRejectedToken() async throws {
        let endpoint = try ScriptedTokenEndpoint { _, n in
            n == 1 ? ScriptedTokenEndpoint.token("access-M-1") : ScriptedTokenEndpoint.error(401, "invalid_client", "client metrics-secret unknown")
        }
        defer { endpoint.stop() }
        // A clock that stands still: the negative cache cannot expire before the last request,
        // however slow the machine (a real one did under a loaded parallel run: a third wait).
        let manager = try SessionManager(config: sessionConfig(session(endpoint.url)), logger: CapturedLogs().logger, environment: [:],
                                         tunePolicy: nil, clock: FakeSessionClock())
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "partner"))
        let first = try await requestToken(driver).get()
        guard case .unavailable(let u) = await reportRejected(driver, generation: first.generation) else {
            Issue.record("expected unavailable")
            return
        }
        #expect(!u.detail.contains("metrics-secret"))
        guard case .failure = await requestToken(driver) else {
            Issue.record("the rejected token was served")
            return
        }
        let s = driver.snapshot
        #expect(s.counters.staleServes.allSatisfy { $0 == 0 })
        #expect(s.counters.rejectionsNotReplayed == ["negative_cached": 1])
        #expect(s.counters.refreshes[TokenRefreshKey(reason: "start", outcome: "success", error: "")] == 1)
        #expect(s.counters.refreshes[TokenRefreshKey(reason: "rejected", outcome: "failure", error: "invalid_client")] == 1)
        #expect(s.counters.forcedRefreshes == 1)
        #expect(s.counters.waits == 2)  // the first caller waited for the start fetch, the rejected one for the forced refresh
        // The detail is the scrubbed failure: the echoed secret is gone.
        #expect(s.lastFailure?.contains("invalid_client") == true)
        #expect(s.lastFailure?.contains("metrics-secret") == false)
        if case .negativeCached = s.status {} else { Issue.record("expected negativeCached, got \(s.status)") }
    }

    @Test func aWaitTimeoutServesTheValidTokenAsStale() async throws {
        // L = 12 s: hard margin 3 s, the soft refresh after 5.4–6 s. That refresh hangs at the
        // endpoint (a gate the test opens at the end), so a caller inside the hard window (9–12 s)
        // waits, times out (300 ms) and gets the valid token. The session's clock is a fake one
        // the test moves: no window of real time to hit on a loaded machine.
        let gate = DispatchSemaphore(value: 0)
        let endpoint = try ScriptedTokenEndpoint { _, n in
            if n == 1 { return ScriptedTokenEndpoint.token("access-M-1", expiresIn: 12) }
            _ = gate.wait(timeout: .now() + 30)
            return ScriptedTokenEndpoint.token("access-M-\(n)")
        }
        defer { endpoint.stop() }
        defer { for _ in 0..<4 { gate.signal() } }
        let clock = FakeSessionClock()
        let manager = try SessionManager(config: sessionConfig(session(endpoint.url, waitTimeout: .milliseconds(300))),
                                         logger: CapturedLogs().logger, environment: [:], tunePolicy: nil, clock: clock)
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "partner"))
        let first = try await requestToken(driver).get()
        // Into the hard window: the soft refresh has started (and hangs), the fast path no longer serves the token.
        await clock.advance(by: .seconds(10))
        var refreshing = false
        for _ in 0..<1000 where !refreshing {
            refreshing = endpoint.count == 2
            if !refreshing { usleep(10_000) }
        }
        #expect(refreshing)
        #expect(driver.usableToken(now: clock.now().nanoseconds) == nil)
        let answer = OneAnswer<Result<PublishedToken, TokenUnavailable>>()
        driver.requestToken(on: testLoops[0]) { answer.put($0) }
        await FakeSessionClock.settle(driver.queue)  // the waiter is in, its timeout armed
        #expect(driver.snapshot.waiters == 1)
        await clock.advance(by: .milliseconds(300))
        let served = try #require(answer.wait(seconds: 30))
        #expect(try served.get().generation == first.generation)
        let s = driver.snapshot
        #expect(s.counters.staleServes[StaleTokenReason.waitTimeout.rawValue] == 1)
        #expect(s.waiters == 0)
    }
}
