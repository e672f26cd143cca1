import Testing
@testable import BearerdOAuth

@Suite struct CoalescingTests {
    @Test func thousandConcurrentWaitersOneFetch() throws {
        var m = makeMachine()
        var all: [Action] = []
        for i in 0..<1000 { all += m.tokenRequested(waiter: WaiterID(UInt64(i)), now: t(Double(i) / 1000)) }
        #expect(all.fetches.count == 1)
        #expect(all.fetches.first?.reason == .start)
        #expect(all.resumed.isEmpty)
        #expect(all.waiterTimeouts.count == 1000)
        #expect(m.waiterCount == 1000)
        let done = m.fetchSucceeded(tokenGrant("A", lifetime: 3600), sentAt: t(0), now: t(1))
        let resumed = done.resumed
        #expect(resumed.count == 1000)
        #expect(Set(resumed.map(\.0)).count == 1000)
        #expect(done.resumedTokens.allSatisfy { $0.accessToken == OAuthSecret("A") && $0.generation == 1 })
        #expect(done.fetches.isEmpty)
        #expect(m.waiterCount == 0)
        // Timeouts arriving later are ignored: each waiter is resumed exactly once.
        for i in 0..<1000 { #expect(m.waiterTimedOut(waiter: WaiterID(UInt64(i)), now: t(11)).isEmpty) }
    }

    @Test func startFetchesEagerlyOnce() {
        var m = makeMachine()
        #expect(m.start(now: t(0)).fetches.map(\.reason) == [.start])
        #expect(m.start(now: t(0)).isEmpty)
        #expect(m.tokenRequested(waiter: WaiterID(1), now: t(0.1)).fetches.isEmpty)
        #expect(m.isFetchInFlight)
    }
}

@Suite struct LifetimeTests {
    @Test func softRefreshNeverDelaysARequest() throws {
        var (m, ready) = readyMachine(lifetime: 3600)
        // L = 3600 s < 2 h: soft margin min(300, 1800) × [0.9, 1.0]; expiry counted from the send.
        let at = try #require(ready.refreshAt)
        #expect(at >= t(3600 - 300) && at <= t(3600 - 270))
        #expect(ready.published.first??.usableWithoutWaitingUntil == t(3540))
        #expect(ready.published.first??.expiresAt == t(3600))

        let soft = m.refreshTimerFired(now: at)
        #expect(soft.fetches.map(\.reason) == [.soft])
        // While the soft refresh runs, requests get the current token at once and start nothing.
        for i in 0..<10 {
            let a = m.tokenRequested(waiter: WaiterID(UInt64(i)), now: at + .seconds(i))
            #expect(a.resumedTokens.map(\.generation) == [1])
            #expect(a.fetches.isEmpty)
            #expect(a.waiterTimeouts.isEmpty)
        }
        let next = m.fetchSucceeded(tokenGrant("B", lifetime: 3600), sentAt: at, now: at + .seconds(1))
        #expect(next.published.first??.generation == 2)
        #expect(next.resumed.isEmpty)
    }

    @Test func longLifetimeUsesHalf() throws {
        let (_, ready) = readyMachine(lifetime: 8 * 3600)
        let at = try #require(ready.refreshAt)
        #expect(at >= t(8 * 3600 - 4 * 3600) && at <= t(8 * 3600 - 0.9 * 4 * 3600))
    }

    @Test func refreshBeforeAndRefreshIn() throws {
        var m = makeMachine { $0.refreshBefore = .seconds(600) }
        _ = m.start(now: t(0))
        let a = try #require(m.fetchSucceeded(tokenGrant("A", lifetime: 3600), sentAt: t(0), now: t(0)).refreshAt)
        #expect(a >= t(3000) && a <= t(3060))
        var n = makeMachine { $0.refreshBefore = .seconds(600) }
        _ = n.start(now: t(0))
        // refresh_in = 1000 s: margin L − 1000 = 2600 s (× [0.9, 1.0]), it wins over refresh_before.
        let b = try #require(n.fetchSucceeded(tokenGrant("A", lifetime: 3600, refreshIn: 1000), sentAt: t(0), now: t(0)).refreshAt)
        #expect(b >= t(1000) && b <= t(1260))
    }

    @Test func shortLifetimeMargins() throws {
        // L = 100 s: hard margin min(60, 25) = 25; soft margin min(300, 50) × [0.9, 1] ≥ 45.
        let (_, ready) = readyMachine(lifetime: 100)
        #expect(ready.published.first??.usableWithoutWaitingUntil == t(75))
        let at = try #require(ready.refreshAt)
        #expect(at >= t(50) && at <= t(55))
    }

    @Test func hardWindowWaitsForTheOneFetchAndTimesOutAtTheBound() throws {
        var (m, _) = readyMachine(lifetime: 3600) { $0.serveValidTokenOnWaitTimeout = false }
        // The soft timer was missed; a request inside the hard window waits for a hard fetch.
        let a = m.tokenRequested(waiter: WaiterID(1), now: t(3550))
        #expect(a.fetches.map(\.reason) == [.hard])
        #expect(a.resumed.isEmpty)
        #expect(a.waiterTimeouts.map(\.1) == [t(3560)])
        let b = m.tokenRequested(waiter: WaiterID(2), now: t(3551))
        #expect(b.fetches.isEmpty && b.resumed.isEmpty)
        let timeout = m.waiterTimedOut(waiter: WaiterID(1), now: t(3560))
        #expect(timeout.resumedFailures.map(\.reason) == ["token.wait_timeout"])
        #expect(m.waiterTimedOut(waiter: WaiterID(1), now: t(3560)).isEmpty)
        // The fetch completes for the remaining waiter only.
        let done = m.fetchSucceeded(tokenGrant("B", lifetime: 3600), sentAt: t(3550), now: t(3562))
        #expect(done.resumed.map(\.0) == [WaiterID(2)])
    }

    @Test func hardWindowTimeoutServesStillValidTokenByDefault() throws {
        var (m, _) = readyMachine(lifetime: 3600)
        _ = m.tokenRequested(waiter: WaiterID(1), now: t(3550))
        let timeout = m.waiterTimedOut(waiter: WaiterID(1), now: t(3560))
        #expect(timeout.resumedTokens.map(\.generation) == [1])
    }

    @Test func noTokenWaitTimesOut() {
        var m = makeMachine()
        _ = m.tokenRequested(waiter: WaiterID(1), now: t(0))
        let a = m.waiterTimedOut(waiter: WaiterID(1), now: t(10))
        #expect(a.resumedFailures.map(\.reason) == ["token.wait_timeout"])
        #expect(a.resumedFailures.first?.retryAfterSeconds == 1)
    }

    @Test func transientFailureInHardWindowKeepsOldTokenUntilExpiry() throws {
        var (m, _) = readyMachine(lifetime: 3600)
        _ = m.tokenRequested(waiter: WaiterID(1), now: t(3550))
        let failed = m.fetchFailed(failure(503), requestSent: true, now: t(3551))
        #expect(failed.resumedTokens.map(\.generation) == [1])
        let retryAt = try #require(failed.retryAt)
        #expect(retryAt == t(3556))  // 503 without Retry-After: 5 s, more than the 1 s ± 10 %.
        // Still valid: requests get the old token at once, no new fetch.
        let b = m.tokenRequested(waiter: WaiterID(2), now: t(3552))
        #expect(b.resumedTokens.map(\.generation) == [1])
        #expect(b.fetches.isEmpty)
        // The retry goes ahead and fails again; at expiry the token is no longer served.
        #expect(m.retryTimerFired(now: t(3556)).fetches.map(\.attempt) == [2])
        let f2 = m.fetchFailed(failure(429, headers: [("Retry-After", "120")]), requestSent: true, now: t(3557))
        #expect(f2.retryAt == t(3677))
        let c = m.tokenRequested(waiter: WaiterID(3), now: t(3599.5))
        #expect(c.resumedTokens.map(\.generation) == [1])
        let d = m.tokenRequested(waiter: WaiterID(4), now: t(3600))
        let fail = try #require(d.resumedFailures.first)
        #expect(fail.reason == "token.unavailable")
        #expect(fail.retryAfter == .seconds(77))
        #expect(fail.retryAfterSeconds == 77)
        #expect(fail.lastFailure?.status == 429)
        #expect(d.fetches.isEmpty)
    }

    /// docs/architecture.md §6: a caller without a token waits for the next attempt when it starts within
    /// `wait_timeout`, between rounds too (it used to be failed at a round's end although the
    /// next round began a second later); its own timeout still bounds the wait.
    @Test func withoutTokenCallersWaitAcrossRoundsForAnAttemptWithinTheBound() throws {
        var m = makeMachine()
        _ = m.tokenRequested(waiter: WaiterID(1), now: t(0))
        var now = 0.0
        var a = m.fetchFailed(failure(500), requestSent: true, now: t(now))
        #expect(a.resumed.isEmpty)
        for _ in 0..<2 {
            now = (try #require(a.retryAt)).nanoseconds.secondsSinceOrigin
            #expect(m.retryTimerFired(now: t(now)).fetches.count == 1)
            a = m.fetchFailed(failure(500), requestSent: true, now: t(now))
        }
        // Third attempt failed: round over, the next round starts in 1 s ± 20 %: keep waiting.
        #expect(a.resumed.isEmpty)
        let retryAt = try #require(a.retryAt)
        #expect(retryAt - t(now) >= .milliseconds(800) && retryAt - t(now) <= .milliseconds(1200))
        let late = m.tokenRequested(waiter: WaiterID(2), now: t(now))
        #expect(late.resumed.isEmpty && late.fetches.isEmpty && late.waiterTimeouts.count == 1)
        #expect(m.retryTimerFired(now: retryAt).fetches.map(\.round) == [2])
        let done = m.fetchSucceeded(tokenGrant("A", lifetime: 3600), sentAt: retryAt, now: retryAt + .milliseconds(10))
        #expect(done.resumed.map(\.0) == [WaiterID(1), WaiterID(2)])
    }

    /// Only when no attempt starts within `wait_timeout` does the caller get the failure, with the
    /// delay as `retryAfter`; a waiter whose own bound runs out first gets `token.wait_timeout`.
    @Test func withoutTokenCallersFailWhenTheNextAttemptIsBeyondTheBound() throws {
        var m = makeMachine()
        _ = m.tokenRequested(waiter: WaiterID(1), now: t(0))
        let a = m.fetchFailed(failure(503, headers: [("Retry-After", "30")]), requestSent: true, now: t(0))
        let fail = try #require(a.resumedFailures.first)
        #expect(fail.reason == "token.unavailable")
        #expect(fail.retryAfterSeconds == 30)
        let late = m.tokenRequested(waiter: WaiterID(2), now: t(25))
        #expect(late.resumed.isEmpty, "the attempt at t+30 s is within the 10 s bound")
        let timedOut = m.waiterTimedOut(waiter: WaiterID(2), now: t(29.5))
        #expect(timedOut.resumedFailures.map(\.reason) == ["token.wait_timeout"])
    }
}

extension UInt64 {
    /// Seconds since the `t(_:)` origin.
    var secondsSinceOrigin: Double { Double(self) / 1e9 - 1000 }
}

@Suite struct RetryTests {
    @Test func attemptsAndBackoffSequence() throws {
        for seed in [1, 2, 3, 99] as [UInt64] {
            var m = makeMachine(seed: seed)
            var now = t(0)
            var startActions = m.start(now: now)
            var rounds: [Int] = []
            var delaysInRound: [Double] = []
            for round in 1...8 {
                for attempt in 1...3 {
                    let req = try #require(startActions.fetches.first)
                    #expect(req.attempt == attempt && req.round == round)
                    #expect(req.timeout == .seconds(15))
                    let f = m.fetchFailed(.transport("connect refused"), requestSent: false, now: now)
                    let at = try #require(f.retryAt)
                    let delay = (at - now).seconds
                    if attempt < 3 {
                        delaysInRound.append(delay)
                        let base = attempt == 1 ? 1.0 : 2.0
                        #expect(delay >= base * 0.9 - 1e-9 && delay <= base * 1.1 + 1e-9, "attempt delay \(delay)")
                    } else {
                        let base = min(30.0, pow2(round - 1))
                        #expect(delay >= base * 0.8 - 1e-9 && delay <= base * 1.2 + 1e-9, "round \(round) backoff \(delay)")
                        rounds.append(round)
                    }
                    #expect(m.retryTimerFired(now: at - .milliseconds(1)).isEmpty)  // early firing ignored
                    now = at
                    startActions = m.retryTimerFired(now: now)
                }
            }
            #expect(rounds == Array(1...8))
            #expect(Set(delaysInRound).count > 2)  // jitter actually varies
        }
    }

    func pow2(_ n: Int) -> Double { var v = 1.0; for _ in 0..<n { v *= 2 }; return v }

    @Test func retryAfterObeyedAndCapped() throws {
        var m = makeMachine()
        _ = m.start(now: t(0))
        let a = m.fetchFailed(failure(429, headers: [("Retry-After", "7")]), requestSent: true, now: t(0))
        #expect(a.retryAt == t(7))
        _ = m.retryTimerFired(now: t(7))
        var huge = failure(503)
        huge.retryAfter = .seconds(86_400)  // a failure built elsewhere, not capped by the parser
        let b = m.fetchFailed(huge, requestSent: true, now: t(7))
        #expect(b.retryAt == t(7 + 3600))
    }

    @Test func negativeCacheForInvalidClient() throws {
        var m = makeMachine()
        _ = m.tokenRequested(waiter: WaiterID(1), now: t(0))
        let f = failure(401, #"{"error":"invalid_client","error_description":"bad secret"}"#)
        let a = m.fetchFailed(f, requestSent: true, now: t(1))
        #expect(a.contains(.reportNegativeCached(f, until: t(61))))
        #expect(a.resumedFailures.map(\.reason) == ["token.negative_cached"])
        #expect(a.resumedFailures.first?.detail == "token.negative_cached: invalid_client (HTTP 401): bad secret")
        #expect(a.retryAt == nil && a.fetches.isEmpty)
        #expect(m.status == .negativeCached(until: t(61)))
        for s in stride(from: 2.0, to: 61, by: 5) {
            let r = m.tokenRequested(waiter: WaiterID(UInt64(s * 10)), now: t(s))
            #expect(r.fetches.isEmpty)
            #expect(r.resumedFailures.first?.retryAfter == t(61) - t(s))
        }
        #expect(m.retryTimerFired(now: t(30)).isEmpty && m.refreshTimerFired(now: t(30)).isEmpty)
        let after = m.tokenRequested(waiter: WaiterID(9999), now: t(61))
        #expect(after.fetches.map(\.reason) == [.start])
        #expect(after.resumed.isEmpty)
    }

    /// docs/architecture.md §6: a `200` maintenance page (or an empty body) is a transient failure: the
    /// session backs off and retries, the waiting caller gets the token of the next attempt.
    @Test(arguments: ["", "<html><body>Down for maintenance</body></html>"])
    func malformedTokenResponseIsRetriedNotNegativeCached(body: String) throws {
        var m = makeMachine()
        _ = m.tokenRequested(waiter: WaiterID(1), now: t(0))
        let a = m.fetchFailed(failure(200, body), requestSent: true, now: t(0.1))
        #expect(!a.contains { if case .reportNegativeCached = $0 { return true }; return false })
        #expect(a.resumed.isEmpty, "the caller waits for the next attempt (≤ 1.1 s away)")
        let retryAt = try #require(a.retryAt)
        #expect(retryAt <= t(1.2))
        if case .backingOff = m.status {} else { Issue.record("expected backingOff, got \(m.status)") }
        #expect(m.retryTimerFired(now: retryAt).fetches.map(\.attempt) == [2])
        let done = m.fetchSucceeded(tokenGrant("A", lifetime: 3600), sentAt: retryAt, now: retryAt + .milliseconds(50))
        #expect(done.resumedTokens.map(\.generation) == [1])
    }

    @Test func negativeCacheKeepsServingValidToken() {
        var (m, _) = readyMachine(lifetime: 3600)
        #expect(m.refreshTimerFired(now: t(3560)).fetches.map(\.reason) == [.hard])
        _ = m.fetchFailed(failure(400, #"{"error":"invalid_scope"}"#), requestSent: true, now: t(3560))
        #expect(m.tokenRequested(waiter: WaiterID(1), now: t(3570)).resumedTokens.map(\.generation) == [1])
        #expect(m.tokenRequested(waiter: WaiterID(2), now: t(3600)).resumedFailures.map(\.reason) == ["token.negative_cached"])
    }

    @Test func noProgressSameToken() throws {
        // L = 100: hard point 75. A refresh at 80 returns the same token, expiring no later.
        var (m, _) = readyMachine(lifetime: 100)
        _ = m.refreshTimerFired(now: t(80))
        let a = m.fetchSucceeded(tokenGrant("A", lifetime: 20), sentAt: t(80), now: t(80))
        #expect(a.published.first??.generation == 1)  // same token, same generation
        #expect(a.refreshAt == t(110))                  // max(now + 30 s, hard point)
        let inHard = m.tokenRequested(waiter: WaiterID(1), now: t(85))
        #expect(inHard.resumedTokens.map(\.generation) == [1])
        #expect(inHard.fetches.isEmpty)
        let expired = m.tokenRequested(waiter: WaiterID(2), now: t(101))
        #expect(expired.resumedFailures.map(\.reason) == ["token.no_progress"])
        #expect(expired.resumedFailures.first?.retryAfter == .seconds(9))
        #expect(m.refreshTimerFired(now: t(100)).isEmpty)
        #expect(m.refreshTimerFired(now: t(110)).fetches.count == 1)
    }

    @Test func newTokenExpiringSoonerIsProgress() throws {
        var (m, _) = readyMachine(lifetime: 3600)
        #expect(m.refreshTimerFired(now: t(3331)).fetches.count == 1)
        let a = m.fetchSucceeded(tokenGrant("B", lifetime: 200), sentAt: t(3331), now: t(3332))
        #expect(a.published.first??.generation == 2)
        // B expires at 3531, sooner than A (3600), but it is a new token: the usual soft point
        // (3531 − [90, 100] s), no 30 s guard. Its hard point (3481) makes callers wait for a refresh.
        let refreshAt = try #require(a.refreshAt)
        #expect(refreshAt >= t(3431) && refreshAt <= t(3441))
        #expect(m.tokenRequested(waiter: WaiterID(2), now: t(3482)).fetches.map(\.reason) == [.hard])
    }

    /// docs/architecture.md §6.6: a server that shortens lifetimes (60 s, then 5 s) gives new tokens each
    /// time; none of them is "no progress", so no client gets `token.no_progress`.
    @Test func shorteningLifetimesNeverCountAsNoProgress() throws {
        var (m, _) = readyMachine(lifetime: 60)
        var now = 31.0
        var waiter: UInt64 = 100
        for i in 0..<6 {
            let fired = m.refreshTimerFired(now: t(now))
            if fired.fetches.isEmpty {
                // Not due yet: a caller past the hard point starts the refresh.
                now += 5
                waiter += 1
                let asked = m.tokenRequested(waiter: WaiterID(waiter), now: t(now))
                #expect(asked.resumedFailures.isEmpty, "round \(i): \(asked)")
                if asked.fetches.isEmpty { continue }
            }
            let done = m.fetchSucceeded(tokenGrant("T\(i)", lifetime: 5), sentAt: t(now), now: t(now))
            #expect(done.resumedFailures.isEmpty)
            now += 4.9  // inside the new token's hard margin, before its expiry
            waiter += 1
            let a = m.tokenRequested(waiter: WaiterID(waiter), now: t(now))
            #expect(!a.resumedFailures.contains { $0.reason == "token.no_progress" }, "round \(i): \(a)")
            #expect(a.fetches.count == 1 || !a.resumedTokens.isEmpty, "round \(i): a refresh or a token, never a refusal")
            if !a.fetches.isEmpty {
                _ = m.fetchSucceeded(tokenGrant("U\(i)", lifetime: 5), sentAt: t(now), now: t(now))
            }
            now += 0.05
        }
    }

    @Test func invalidGrantNeedsReauthentication() throws {
        var (m, _) = readyMachine(.refreshToken, lifetime: 600)
        #expect(m.refreshTimerFired(now: t(331)).fetches.map(\.reason) == [.soft])
        let f = failure(400, #"{"error":"invalid_grant"}"#)
        let a = m.fetchFailed(f, requestSent: true, now: t(301))
        #expect(a.contains(.reportNeedsReauthentication(f)))
        #expect(m.status == .needsReauthentication)
        #expect(a.fetches.isEmpty && a.retryAt == nil)
        // The access token is still served until it expires; then requests fail fast.
        #expect(m.tokenRequested(waiter: WaiterID(1), now: t(590)).resumedTokens.count == 1)
        let fail = m.tokenRequested(waiter: WaiterID(2), now: t(600))
        #expect(fail.resumedFailures.map(\.reason) == ["token.needs_reauthentication"])
        #expect(fail.resumedFailures.first?.retryAfter == .seconds(60))
        // No traffic to the server, whatever happens, until the credentials change.
        for s in [601.0, 700, 5000] {
            #expect(m.tokenRequested(waiter: WaiterID(UInt64(s)), now: t(s)).fetches.isEmpty)
            #expect(m.refreshTimerFired(now: t(s)).isEmpty)
            #expect(m.retryTimerFired(now: t(s)).isEmpty)
            #expect(m.upstreamRejected(generation: 1, waiter: nil, now: t(s)).fetches.isEmpty)
        }
        let reset = m.credentialsChanged(now: t(6000))
        #expect(reset.fetches.map(\.reason) == [.start])
    }

    @Test func invalidGrantOnClientCredentialsIsNegativeCached() {
        var m = makeMachine(.clientCredentials)
        _ = m.start(now: t(0))
        _ = m.fetchFailed(failure(400, #"{"error":"invalid_grant"}"#), requestSent: true, now: t(0))
        #expect(m.status == .negativeCached(until: t(60)))
    }

    @Test func sameTokenRetryOnceAfterAmbiguousTransportFailure() throws {
        var m = makeMachine(.refreshToken)
        _ = m.start(now: t(0))
        let a = m.fetchFailed(.transport("connection reset"), requestSent: true, now: t(1))
        let retry = try #require(a.fetches.first)
        #expect(retry.isSameTokenRetry && retry.attempt == 1)
        #expect(m.isFetchInFlight)
        let b = m.fetchFailed(.transport("connection reset"), requestSent: true, now: t(2))
        #expect(b.fetches.isEmpty && b.retryAt != nil)
        // Not sent: no same-token retry; client_credentials: never.
        var n = makeMachine(.refreshToken)
        _ = n.start(now: t(0))
        #expect(n.fetchFailed(.transport("connect refused"), requestSent: false, now: t(1)).fetches.isEmpty)
        var c = makeMachine(.clientCredentials)
        _ = c.start(now: t(0))
        #expect(c.fetchFailed(.transport("connection reset"), requestSent: true, now: t(1)).fetches.isEmpty)
    }

    @Test func credentialsChangedDuringFetchRetriesWithNewCredentials() {
        var m = makeMachine()
        _ = m.tokenRequested(waiter: WaiterID(1), now: t(0))
        #expect(m.credentialsChanged(now: t(1)).isEmpty)
        let a = m.fetchFailed(failure(401, #"{"error":"invalid_client"}"#), requestSent: true, now: t(2))
        #expect(a.fetches.map(\.reason) == [.start])
        #expect(a.resumed.isEmpty)
        #expect(m.waiterCount == 1)
    }

    @Test func reloadKeepsAValidTokenUnlessWhatItIsForChanged() throws {
        // A rotated secret: the held token stays, no request to the server.
        var (m, _) = readyMachine(lifetime: 3600)
        #expect(m.credentialsChanged(now: t(10)).isEmpty)
        #expect(m.tokenRequested(waiter: WaiterID(1), now: t(11)).resumedTokens.first?.generation == 1)
        // A new scope or token URL: fetch at once, and the current token serves meanwhile.
        let a = m.credentialsChanged(now: t(12), reissue: true)
        #expect(a.fetches.map(\.reason) == [.start])
        #expect(m.tokenRequested(waiter: WaiterID(2), now: t(13)).resumedTokens.first?.generation == 1)
        _ = m.fetchSucceeded(tokenGrant("B", lifetime: 3600), sentAt: t(12), now: t(14))
        #expect(m.tokenRequested(waiter: WaiterID(3), now: t(15)).resumedTokens.first?.generation == 2)
    }

    @Test func backoffLiftedByCredentialsChange() {
        var m = makeMachine()
        _ = m.start(now: t(0))
        _ = m.fetchFailed(failure(503, headers: [("Retry-After", "600")]), requestSent: true, now: t(0))
        #expect(m.credentialsChanged(now: t(5)).fetches.count == 1)
    }
}

@Suite struct RejectionTests {
    @Test func staleGenerationReplaysWithoutRefresh() throws {
        var (m, _) = readyMachine(lifetime: 3600)
        _ = m.refreshTimerFired(now: t(3400))
        _ = m.fetchSucceeded(tokenGrant("B", lifetime: 3600), sentAt: t(3400), now: t(3401))
        // The policy only says "replay"; which token the replay carries is the session's decision.
        #expect(ReplayPolicy.decide(.init(status: 401)) == .replay)
        let a = m.upstreamRejected(generation: 1, waiter: WaiterID(7), now: t(3402))
        #expect(a.fetches.isEmpty)
        #expect(a.resumedTokens.map(\.generation) == [2])
    }

    @Test func hundredRejectionsOfCurrentGenerationOneRefresh() throws {
        var (m, _) = readyMachine(lifetime: 3600)
        var all: [Action] = []
        for i in 0..<100 {
            let d = ReplayPolicy.decide(.init(status: 401, wwwAuthenticate: [#"Bearer error="invalid_token""#]))
            #expect(d == .replay)
            all += m.upstreamRejected(generation: 1, waiter: WaiterID(UInt64(i)), now: t(100 + Double(i) / 100))
        }
        #expect(all.fetches.map(\.reason) == [.rejected])
        #expect(all.resumed.isEmpty)
        // The rejected generation is no longer served from the fast path.
        #expect(all.published.first??.usableWithoutWaitingUntil == t(100))
        let other = m.tokenRequested(waiter: WaiterID(500), now: t(101.5))
        #expect(other.resumed.isEmpty && other.fetches.isEmpty)
        let done = m.fetchSucceeded(tokenGrant("B", lifetime: 3600), sentAt: t(100), now: t(102))
        #expect(done.resumed.count == 101)
        #expect(done.resumedTokens.allSatisfy { $0.generation == 2 })
    }

    @Test func breakerTripsAfterFiveForcedRefreshesAndRecovers() throws {
        var (m, _) = readyMachine(lifetime: 3600)
        var now = 10.0
        for i in 0..<5 {
            let gen = m.currentGeneration
            let a = m.upstreamRejected(generation: gen, waiter: WaiterID(UInt64(i)), now: t(now))
            #expect(a.fetches.map(\.reason) == [.rejected], "forced refresh \(i + 1)")
            _ = m.fetchSucceeded(tokenGrant("T\(i)", lifetime: 3600), sentAt: t(now), now: t(now + 0.5))
            now += 2
        }
        let tripped = m.upstreamRejected(generation: m.currentGeneration, waiter: WaiterID(100), now: t(now))
        #expect(tripped.fetches.isEmpty)
        #expect(tripped.contains(.reportBreakerTripped(until: t(now + 30))))
        #expect(tripped.resumedPassThroughs.map(\.reason) == ["token.breaker_open"])
        // Open: rejections pass through (relayed, not a 503) and the token is not marked.
        let open = m.upstreamRejected(generation: m.currentGeneration, waiter: WaiterID(101), now: t(now + 29))
        #expect(open.fetches.isEmpty && open.resumedPassThroughs.map(\.reason) == ["token.breaker_open"])
        #expect(open.resumedFailures.isEmpty)
        #expect(m.tokenRequested(waiter: WaiterID(102), now: t(now + 29)).resumedTokens.count == 1)
        // Recovered after 30 s.
        let again = m.upstreamRejected(generation: m.currentGeneration, waiter: WaiterID(103), now: t(now + 30))
        #expect(again.fetches.map(\.reason) == [.rejected])
    }

    @Test func breakerAlone() {
        var b = RejectionBreaker()
        for i in 0..<5 { #expect(b.admitForcedRefresh(at: t(Double(i))) == .allowed) }
        #expect(b.admitForcedRefresh(at: t(5)) == .tripped(until: t(35)))
        #expect(b.isOpen(at: t(34.9)))
        #expect(b.admitForcedRefresh(at: t(20)) == .open(until: t(35)))
        #expect(b.admitForcedRefresh(at: t(35)) == .allowed)
        // Spread out over more than the window: never trips.
        var c = RejectionBreaker()
        for i in 0..<50 { #expect(c.admitForcedRefresh(at: t(Double(i) * 7)) == .allowed) }
    }

    @Test func rejectionWithoutWaiterRefreshesForLaterRequests() {
        var (m, _) = readyMachine(lifetime: 3600)
        let a = m.upstreamRejected(generation: 1, waiter: nil, now: t(50))
        #expect(a.fetches.map(\.reason) == [.rejected])
        #expect(a.resumed.isEmpty && a.waiterTimeouts.isEmpty)
    }

    /// docs/architecture.md §6: a rejection while the session backs off waits for the next attempt (within
    /// the bound); the rejected token is served to nobody meanwhile (it used to be relayed:
    /// `reason=token.unavailable`, the upstream's 401 to the client).
    @Test func rejectionDuringBackoffWaitsForTheNextAttempt() throws {
        var (m, _) = readyMachine(lifetime: 3600)
        _ = m.refreshTimerFired(now: t(3400))
        let failed = m.fetchFailed(failure(500), requestSent: true, now: t(3401))
        let retryAt = try #require(failed.retryAt)
        let a = m.upstreamRejected(generation: 1, waiter: WaiterID(1), now: t(3401.5))
        #expect(a.fetches.isEmpty && a.resumed.isEmpty)
        #expect(a.published.first??.usableWithoutWaitingUntil == t(3401.5))
        // Another request does not get the rejected token: it waits too.
        let other = m.tokenRequested(waiter: WaiterID(2), now: t(3401.6))
        #expect(other.resumed.isEmpty && other.waiterTimeouts.count == 1)
        #expect(m.retryTimerFired(now: retryAt).fetches.count == 1)
        let done = m.fetchSucceeded(tokenGrant("B", lifetime: 3600), sentAt: retryAt, now: retryAt + .milliseconds(10))
        #expect(done.resumedTokens.map(\.generation) == [2, 2])
    }

    /// docs/architecture.md §6 (corrected), the identity-provider blip: a proven token is revoked while the
    /// token endpoint answers 500 for 3 s. The held rejection and every later request wait for
    /// the attempt that succeeds; nobody gets the rejected token or a failure.
    @Test func revocationDuringATokenEndpointOutageFailsNobody() throws {
        var (m, _) = readyMachine(lifetime: 8)
        _ = m.upstreamAccepted(generation: 1, now: t(0.3))
        var all = m.upstreamRejected(generation: 1, waiter: WaiterID(1), now: t(1))
        #expect(all.fetches.map(\.reason) == [.rejected])
        var now = 1.0
        var waiter: UInt64 = 2
        // The endpoint fails until t(4); requests keep arriving every 100 ms.
        while true {
            let f = m.fetchFailed(failure(500), requestSent: true, now: t(now + 0.05))
            all += f
            let at = try #require(f.retryAt)
            while t(now) < at {
                all += m.tokenRequested(waiter: WaiterID(waiter), now: t(now))
                all += m.upstreamRejected(generation: 1, waiter: WaiterID(waiter + 1000), now: t(now))
                waiter += 1
                now += 0.1
            }
            all += m.retryTimerFired(now: at)
            if now >= 4 { break }
        }
        all += m.fetchSucceeded(tokenGrant("B", lifetime: 8), sentAt: t(now), now: t(now + 0.05))
        #expect(all.resumedFailures.isEmpty && all.resumedPassThroughs.isEmpty)
        #expect(all.resumedTokens.allSatisfy { $0.generation == 2 })
        #expect(all.resumed.count == 1 + 2 * Int(waiter - 2))
        #expect(all.waiterTimeouts.allSatisfy { $0.1 >= t(now) })
    }

    /// docs/architecture.md §6.9: a proven token's rejection always gets its refresh and replay, however
    /// often: 20 revocations in 10 s give 20 replays with new tokens and never trip the breaker
    /// (the sixth used to pass the upstream's 401 through, `token.breaker_open`).
    @Test func twentyRevocationsOfProvenTokensInTenSecondsAreAllReplayed() throws {
        var (m, _) = readyMachine(lifetime: 3600)
        var replays = 0
        var clock = 0.5
        for i in 0..<20 {
            // A revocation every 0.5 s, each after the previous POST was answered.
            let now = max(0.5 + Double(i) * 0.5, clock)
            let gen = m.currentGeneration
            _ = m.upstreamAccepted(generation: gen, now: t(now))  // the GET the token served
            var a = m.upstreamRejected(generation: gen, waiter: WaiterID(UInt64(i)), now: t(now + 0.1))
            #expect(!a.contains { if case .reportBreakerTripped = $0 { return true }; return false })
            #expect(a.resumedPassThroughs.isEmpty && a.resumedFailures.isEmpty)
            var fetchAt = t(now + 0.1)
            if a.fetches.isEmpty {
                // Paced: the previous forced refresh was less than a second ago.
                let at = try #require(a.retryAt)
                #expect(at - t(now + 0.1) <= .seconds(1))
                a = m.retryTimerFired(now: at)
                fetchAt = at
            }
            #expect(a.fetches.map(\.reason) == [.rejected], "revocation \(i + 1)")
            let done = m.fetchSucceeded(tokenGrant("T\(i)", lifetime: 3600), sentAt: fetchAt, now: fetchAt + .milliseconds(100))
            if done.resumed.map(\.0) == [WaiterID(UInt64(i))], done.resumedTokens.first?.generation == gen + 1 { replays += 1 }
            clock = (fetchAt + .milliseconds(150)).nanoseconds.secondsSinceOrigin
        }
        #expect(replays == 20)
        #expect(m.rejectionBreaker.countedRefreshes == 0)
    }

    /// docs/architecture.md §6, the soak's lost request: one revoke-all kills every token issued before it,
    /// the current one too. A token handed to a rejection was requested either after the session
    /// learned of the rejection (its replay is final) or before (the current token for an older
    /// generation, a fetch already in flight: its replay is provisional, `wasRequested(atOrAfter:)`
    /// false). Before the fix the machine gave no way to tell them apart (every replay was final,
    /// and the 401 of a revoked current token went to the client).
    @Test func tokensHandedToRejectionsTellWhetherTheyWereRequestedAfterIt() throws {
        var (m, _) = readyMachine(lifetime: 3600)
        _ = m.upstreamAccepted(generation: 1, now: t(1))
        // A background refresh sent at t(3400) returns B (generation 2) just before a revoke-all.
        #expect(m.refreshTimerFired(now: t(3400)).fetches.map(\.reason) == [.soft])
        _ = m.fetchSucceeded(tokenGrant("B", lifetime: 3600), sentAt: t(3400), now: t(3400.05))
        #expect(m.currentToken?.requestedAt == t(3400))
        // A request that carried A is rejected: it gets B at once, requested before the rejection.
        let older = m.upstreamRejected(generation: 1, waiter: WaiterID(1), now: t(3400.2))
        let b = try #require(older.resumedTokens.first)
        #expect(b.generation == 2 && older.fetches.isEmpty)
        #expect(!b.wasRequested(atOrAfter: t(3400.2)), "provisional: the revoke-all may have killed B too")
        // B's own rejection forces a refresh: C is requested after it, so its replay is final.
        let own = m.upstreamRejected(generation: 2, waiter: WaiterID(2), now: t(3400.3))
        #expect(own.fetches.map(\.reason) == [.rejected])
        let c = try #require(m.fetchSucceeded(tokenGrant("C", lifetime: 3600), sentAt: t(3400.31), now: t(3400.4)).resumedTokens.first)
        #expect(c.generation == 3 && c.wasRequested(atOrAfter: t(3400.3)))
        // A rejection that joins a fetch already in flight gets a token requested before it.
        _ = m.upstreamAccepted(generation: 3, now: t(3400.5))
        #expect(m.refreshTimerFired(now: t(6800)).fetches.map(\.reason) == [.soft])
        #expect(m.upstreamRejected(generation: 3, waiter: WaiterID(3), now: t(6800.1)).fetches.isEmpty)
        let d = try #require(m.fetchSucceeded(tokenGrant("D", lifetime: 3600), sentAt: t(6800), now: t(6800.2)).resumedTokens.first)
        #expect(d.generation == 4 && !d.wasRequested(atOrAfter: t(6800.1)))
        // The same token returned again (no progress) keeps the instant it was first requested.
        #expect(m.refreshTimerFired(now: t(10200)).fetches.count == 1)
        _ = m.fetchSucceeded(tokenGrant("D", lifetime: 3600), sentAt: t(10200), now: t(10200.1))
        #expect(m.currentToken?.generation == 4 && m.currentToken?.requestedAt == t(6800))
    }

    /// The rejection of an older generation replays at once with the current token only while
    /// that token may be used without waiting. Here the current token B has expired while its
    /// refresh is still in flight (a slow token endpoint), and a request that carried A is
    /// rejected: it used to be replayed at once with the expired B (a certain second rejection,
    /// relayed to the client); it now waits for the refresh like any request that needs a token.
    @Test func anOlderGenerationsReplayWaitsWhenTheCurrentTokenHasExpired() throws {
        var (m, _) = readyMachine(lifetime: 8)
        _ = m.upstreamAccepted(generation: 1, now: t(1))
        #expect(m.refreshTimerFired(now: t(4.5)).fetches.count == 1)
        _ = m.fetchSucceeded(tokenGrant("B", lifetime: 8), sentAt: t(4.5), now: t(4.6))  // B expires at t(12.5).
        #expect(m.refreshTimerFired(now: t(9)).fetches.count == 1)  // Not answered before t(13).
        let rejected = m.upstreamRejected(generation: 1, waiter: WaiterID(1), now: t(12.7))
        #expect(rejected.resumed.isEmpty, "replayed at once with the expired B: \(rejected)")
        #expect(rejected.fetches.isEmpty && rejected.waiterTimeouts.map(\.0) == [WaiterID(1)])
        let done = m.fetchSucceeded(tokenGrant("C", lifetime: 8), sentAt: t(9), now: t(13))
        #expect(done.resumed.map(\.0) == [WaiterID(1)] && done.resumedTokens.map(\.generation) == [3])
        // Before its hard point, the current token is still handed over at once.
        let early = m.upstreamRejected(generation: 2, waiter: WaiterID(2), now: t(13.5))
        #expect(early.resumedTokens.map(\.generation) == [3])
    }

    /// At most one forced refresh per second per session: a rejection inside the second waits
    /// (with the others) for the next one instead of starting its own.
    @Test func forcedRefreshesArePacedToOnePerSecond() throws {
        var (m, _) = readyMachine(lifetime: 3600)
        _ = m.upstreamAccepted(generation: 1, now: t(1))
        #expect(m.upstreamRejected(generation: 1, waiter: WaiterID(1), now: t(2)).fetches.count == 1)
        _ = m.fetchSucceeded(tokenGrant("B", lifetime: 3600), sentAt: t(2), now: t(2.1))
        _ = m.upstreamAccepted(generation: 2, now: t(2.2))
        let paced = m.upstreamRejected(generation: 2, waiter: WaiterID(2), now: t(2.3))
        #expect(paced.fetches.isEmpty && paced.resumed.isEmpty)
        #expect(paced.retryAt == t(3))
        let joined = m.upstreamRejected(generation: 2, waiter: WaiterID(3), now: t(2.5))
        let asked = m.tokenRequested(waiter: WaiterID(4), now: t(2.6))
        #expect(joined.fetches.isEmpty && asked.fetches.isEmpty && asked.resumed.isEmpty)
        #expect(m.retryTimerFired(now: t(2.9)).isEmpty)
        #expect(m.retryTimerFired(now: t(3)).fetches.map(\.reason) == [.rejected])
        let done = m.fetchSucceeded(tokenGrant("C", lifetime: 3600), sentAt: t(3), now: t(3.1))
        #expect(done.resumed.map(\.0) == [WaiterID(2), WaiterID(3), WaiterID(4)])
    }

    /// An upstream that rejects every token: none is ever proven, the breaker opens after 5
    /// forced refreshes and the token endpoint sees at most 6 requests in 30 s, however many
    /// rejections arrive (one every 10 ms here).
    @Test func anUpstreamRejectingEveryTokenTripsTheBreakerAfterFiveRefreshes() throws {
        var m = makeMachine()
        var fetches = m.start(now: t(0)).fetches.count
        var inFlight = true
        var pendingRetry: MonotonicInstant?
        var trips = 0
        var relayed = 0
        for step in 0..<3000 {
            let now = t(0.1 + Double(step) * 0.01)
            var a: [Action] = []
            if inFlight {  // the fetch started in the previous step returns a new (never proven) token
                a += m.fetchSucceeded(tokenGrant("T\(step)", lifetime: 3600), sentAt: now, now: now)
                inFlight = false
            }
            if let at = pendingRetry, at <= now {
                a += m.retryTimerFired(now: now)
                pendingRetry = nil
            }
            a += m.upstreamRejected(generation: m.currentGeneration, waiter: WaiterID(UInt64(step)), now: now)
            if let at = a.retryAt { pendingRetry = at }
            fetches += a.fetches.count
            if !a.fetches.isEmpty { inFlight = true }
            trips += a.filter { if case .reportBreakerTripped = $0 { return true }; return false }.count
            relayed += a.resumedPassThroughs.count
            #expect(a.resumedFailures.isEmpty)
        }
        #expect(fetches <= 6, "\(fetches) token requests in 30 s")
        #expect(trips == 1)
        #expect(relayed > 2000)
    }

    /// A success reported after the rejection it preceded (the two raced to the session queue)
    /// still proves the token: the breaker forgets that refresh.
    @Test func lateProofForgivesACountedRefresh() {
        var (m, _) = readyMachine(lifetime: 3600)
        #expect(m.upstreamRejected(generation: 1, waiter: nil, now: t(1)).fetches.count == 1)
        #expect(m.rejectionBreaker.countedRefreshes == 1)
        _ = m.upstreamAccepted(generation: 1, now: t(1.1))
        #expect(m.rejectionBreaker.countedRefreshes == 0)
    }
}
