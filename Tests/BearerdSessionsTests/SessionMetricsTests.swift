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
        async let all = withTaskGroup(of: Bool.self) { group in
            for i in 0..<5 { group.addTask { (try? await requestToken(driver, on: testLoops[i % 4]).get()) != nil } }
            var ok = 0
            for await r in group where r { ok += 1 }
            return ok
        }
        let sawFive = await eventually(8) { driver.snapshot.waiters == 5 }
        gate.signal()
        #expect(sawFive)
        #expect(await all == 5)
        let s = driver.snapshot
        #expect(s.waiters == 0)
        #expect(s.counters.waits == 5)
        #expect(s.counters.refreshes == [TokenRefreshKey(reason: "start", outcome: "success", error: ""): 1])
        #expect(s.generation == 1)
        let left = Double((s.expiresAt ?? 0) &- monotonicNanos()) / 1e9
        #expect(left > 3500 && left <= 3600)
        #expect(s.counters.staleServes.allSatisfy { $0 == 0 })
    }

    /// DESIGN §6: a rejected token is never served again, not even while the session is
    /// negative-cached: the rejection and later callers get the failure (a 503), counted.
    @Test func aFailedRefreshAfterARejectionServesNobodyTheRejectedToken() async throws {
        let endpoint = try ScriptedTokenEndpoint { _, n in
            n == 1 ? ScriptedTokenEndpoint.token("access-M-1") : ScriptedTokenEndpoint.error(401, "invalid_client", "client metrics-secret unknown")
        }
        defer { endpoint.stop() }
        let manager = try SessionManager(config: sessionConfig(session(endpoint.url)), logger: CapturedLogs().logger, environment: [:])
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
        // L = 12 s: hard margin 3 s, the soft refresh after 5.4–6 s. That refresh is slow (12 s),
        // so a caller inside the hard window (9–12 s) waits, times out (300 ms) and gets the valid
        // token. The window is wide enough for a loaded machine (with L = 4 s its 1 s window was
        // missed under parallel test load and the token had expired by the time the wait ended).
        let endpoint = try ScriptedTokenEndpoint { _, n in
            n == 1 ? ScriptedTokenEndpoint.token("access-M-1", expiresIn: 12) : .delayed(12, ScriptedTokenEndpoint.token("access-M-\(n)"))
        }
        defer { endpoint.stop() }
        let manager = try SessionManager(config: sessionConfig(session(endpoint.url, waitTimeout: .milliseconds(300))),
                                         logger: CapturedLogs().logger, environment: [:])
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "partner"))
        let first = try await requestToken(driver).get()
        // Wait (bounded) for the hard window: the fast path no longer serves the token.
        var inHardWindow = false
        for _ in 0..<300 {
            if driver.usableToken(now: monotonicNanos()) == nil { inHardWindow = true; break }
            try await Task.sleep(for: .milliseconds(50))
        }
        #expect(inHardWindow)
        #expect(try await requestToken(driver).get().generation == first.generation)
        let s = driver.snapshot
        #expect(s.counters.staleServes[StaleTokenReason.waitTimeout.rawValue] == 1)
        #expect(s.waiters == 0)
    }
}
