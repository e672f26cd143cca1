import Testing
@testable import BearerdOAuth

/// Plays the driver: carries out actions, fires timers, and checks the invariants of
/// `TokenSession.StateMachine` after every step.
struct FakeDriver {
    var machine: Machine
    var now = t(0)
    var inFlight = false
    var fetchSentAt = t(0)
    var fetchCount = 0
    var nextWaiter: UInt64 = 0
    var outstanding: Set<WaiterID> = []
    var resumeCount: [WaiterID: Int] = [:]
    var timeouts: [WaiterID: MonotonicInstant] = [:]
    var timer: (retry: Bool, at: MonotonicInstant)?
    var tokensByGeneration: [UInt64: OAuthSecret] = [:]
    var maxGeneration: UInt64 = 0
    var issuedTokens = 0
    var violations: [String] = []

    init(machine: Machine) { self.machine = machine }

    mutating func apply(_ actions: [Action]) {
        for action in actions {
            switch action {
            case .startFetch:
                if inFlight { violations.append("second fetch started while one is in flight") }
                inFlight = true
                fetchSentAt = now
                fetchCount += 1
            case .resumeWaiters(let ws, let result):
                for w in ws {
                    resumeCount[w, default: 0] += 1
                    if outstanding.remove(w) == nil { violations.append("\(w) resumed but not outstanding") }
                    timeouts[w] = nil
                }
                if case .token(let tok) = result { check(tok) }
            case .scheduleWaiterTimeout(let w, let at):
                if !outstanding.contains(w) { violations.append("timeout for a resumed waiter") }
                timeouts[w] = at
            case .scheduleRefresh(let at): timer = (false, at)
            case .scheduleRetry(let at): timer = (true, at)
            case .cancelTimer: timer = nil
            case .publish(let tok): if let tok { check(tok) }
            case .reportBreakerTripped, .reportNeedsReauthentication, .reportNegativeCached: break
            }
        }
        if inFlight != machine.isFetchInFlight { violations.append("driver and machine disagree on the in-flight fetch") }
    }

    mutating func check(_ tok: TokenSession.CurrentToken) {
        if let known = tokensByGeneration[tok.generation] {
            if known != tok.accessToken { violations.append("generation \(tok.generation) names two tokens") }
        } else {
            if tok.generation <= maxGeneration { violations.append("new token with non-increasing generation \(tok.generation)") }
            tokensByGeneration[tok.generation] = tok.accessToken
            maxGeneration = tok.generation
        }
        if tok.usableWithoutWaitingUntil > tok.expiresAt { violations.append("fast path beyond expiry") }
    }

    mutating func request() {
        nextWaiter += 1
        let w = WaiterID(nextWaiter)
        outstanding.insert(w)
        apply(machine.tokenRequested(waiter: w, now: now))
    }

    mutating func succeed<R: RandomNumberGenerator>(_ rng: inout R) {
        guard inFlight else { return }
        inFlight = false
        let reuse = Int.random(in: 0..<10, using: &rng) == 0 && machine.currentToken != nil
        let value = reuse ? machine.currentToken!.accessToken : OAuthSecret("tok-\(issuedTokens)")  // reuse implies a token
        if !reuse { issuedTokens += 1 }
        let lifetime = Int64([5, 60, 100, 600, 3600, 9000].randomElement(using: &rng)!)  // non-empty literal
        apply(machine.fetchSucceeded(tokenGrant(value.exposedValue, lifetime: lifetime), sentAt: fetchSentAt, now: now))
    }

    mutating func fail<R: RandomNumberGenerator>(_ rng: inout R) {
        guard inFlight else { return }
        inFlight = false
        let f: TokenEndpointFailure
        switch Int.random(in: 0..<10, using: &rng) {
        case 0: f = failure(400, #"{"error":"invalid_client"}"#)
        case 1: f = failure(400, #"{"error":"invalid_grant"}"#)
        case 2: f = failure(429, headers: [("Retry-After", "20")])
        case 3, 4: f = failure(503)
        default: f = .transport("reset")
        }
        apply(machine.fetchFailed(f, requestSent: Bool.random(using: &rng), now: now))
    }

    mutating func fireTimeout<R: RandomNumberGenerator>(_ rng: inout R) {
        guard let (w, at) = timeouts.randomElement(using: &rng) else { return }
        timeouts[w] = nil
        now = max(now, at)
        apply(machine.waiterTimedOut(waiter: w, now: now))
    }

    mutating func fireTimer() {
        guard let (retry, at) = timer else { return }
        timer = nil
        now = max(now, at)
        apply(retry ? machine.retryTimerFired(now: now) : machine.refreshTimerFired(now: now))
    }

    mutating func reject<R: RandomNumberGenerator>(_ rng: inout R) {
        let current = machine.currentGeneration
        let generation = Bool.random(using: &rng) || current == 0 ? current : current - 1
        var waiter: WaiterID? = nil
        if Bool.random(using: &rng) {
            nextWaiter += 1
            waiter = WaiterID(nextWaiter)
            outstanding.insert(waiter!)  // Just assigned.
        }
        apply(machine.upstreamRejected(generation: generation, waiter: waiter, now: now))
    }

    /// Drives everything to rest: all timeouts fire, any fetch succeeds.
    mutating func drain() {
        var rounds = 0
        while (!outstanding.isEmpty || inFlight) && rounds < 10_000 {
            rounds += 1
            if inFlight {
                inFlight = false
                issuedTokens += 1
                apply(machine.fetchSucceeded(tokenGrant("final-\(issuedTokens)", lifetime: 3600), sentAt: fetchSentAt, now: now))
            } else if let (w, at) = timeouts.min(by: { $0.value < $1.value }) {
                timeouts[w] = nil
                now = max(now, at)
                apply(machine.waiterTimedOut(waiter: w, now: now))
            } else {
                violations.append("waiters \(outstanding.sorted()) outstanding with no timeout and no fetch")
                return
            }
        }
    }
}

@Suite struct TokenSessionPropertyTests {
    @Test func randomInterleavingsKeepTheInvariants() {
        var totalFetches = 0, totalWaiters = 0
        for run in 0..<500 {
            var rng = SeededRandom(seed: UInt64(run) &* 7919 &+ 1)
            let grant: TokenSession.GrantKind = [.clientCredentials, .refreshToken, .password][run % 3]
            var d = FakeDriver(machine: makeMachine(grant, seed: UInt64(run)))
            if Bool.random(using: &rng) { d.apply(d.machine.start(now: d.now)) }
            for _ in 0..<200 {
                switch Int.random(in: 0..<100, using: &rng) {
                case 0..<15: d.now = d.now + .milliseconds(Int64.random(in: 0...20_000, using: &rng))
                case 15..<17: d.now = d.now + .seconds(Int64.random(in: 0...4000, using: &rng))
                case 17..<42: d.request()
                case 42..<54: d.succeed(&rng)
                case 54..<64: d.fail(&rng)
                case 64..<74: d.fireTimeout(&rng)
                case 74..<84: d.fireTimer()
                case 84..<92: d.reject(&rng)
                case 92..<94: d.apply(d.machine.credentialsChanged(now: d.now))
                case 94..<97:
                    // A stale or early timer firing must be harmless.
                    d.apply(d.machine.refreshTimerFired(now: d.now))
                    d.apply(d.machine.retryTimerFired(now: d.now))
                default:
                    // Duplicate timeout for some waiter, possibly already resumed.
                    if d.nextWaiter > 0 {
                        d.apply(d.machine.waiterTimedOut(waiter: WaiterID(UInt64.random(in: 1...d.nextWaiter, using: &rng)), now: d.now))
                    }
                }
                if !d.violations.isEmpty { break }
            }
            d.drain()
            #expect(d.violations.isEmpty, "run \(run): \(d.violations)")
            #expect(d.outstanding.isEmpty, "run \(run)")
            #expect(d.resumeCount.values.allSatisfy { $0 == 1 }, "run \(run)")
            // Every waiter id handed to the machine was resumed (ids are taken only for real waiters).
            #expect(d.resumeCount.count == Int(d.nextWaiter), "run \(run)")
            totalFetches += d.fetchCount
            totalWaiters += d.resumeCount.count
            if !d.violations.isEmpty { break }
        }
        // The runs exercised something.
        #expect(totalFetches > 1000)
        #expect(totalWaiters > 5000)
    }
}
