@testable import BearerdOAuth

typealias Machine = TokenSession.StateMachine
typealias Action = TokenSession.StateMachine.Action
typealias WaiterID = TokenSession.WaiterID

func makeMachine(_ grant: TokenSession.GrantKind = .clientCredentials, seed: UInt64 = 42,
                 configure: (inout TokenSession.Policy) -> Void = { _ in }) -> Machine {
    var policy = TokenSession.Policy(grant: grant)
    configure(&policy)
    return Machine(policy: policy, random: SeededRandom(seed: seed))
}

func tokenGrant(_ value: String, lifetime: Int64, refreshIn: Int64? = nil) -> TokenGrant {
    TokenGrant(accessToken: OAuthSecret(value), lifetime: .seconds(lifetime), refreshIn: refreshIn.map { .seconds($0) })
}

extension Array where Element == Action {
    var fetches: [TokenSession.FetchRequest] {
        compactMap { if case .startFetch(let r) = $0 { return r }; return nil }
    }
    /// (waiter, result) for every resumed waiter, in order.
    var resumed: [(WaiterID, TokenSession.WaiterResult)] {
        flatMap { a -> [(WaiterID, TokenSession.WaiterResult)] in
            if case .resumeWaiters(let ws, let r) = a { return ws.map { ($0, r) } }
            return []
        }
    }
    var resumedTokens: [TokenSession.CurrentToken] {
        resumed.compactMap { if case .token(let t) = $0.1 { return t }; return nil }
    }
    var resumedFailures: [TokenSession.TokenUnavailable] {
        resumed.compactMap { if case .failure(let f) = $0.1 { return f }; return nil }
    }
    /// Rejections to relay (`.passThrough`), in order.
    var resumedPassThroughs: [TokenSession.TokenUnavailable] {
        resumed.compactMap { if case .passThrough(let f) = $0.1 { return f }; return nil }
    }
    var refreshAt: MonotonicInstant? {
        compactMap { if case .scheduleRefresh(let at) = $0 { return at }; return nil }.last
    }
    var retryAt: MonotonicInstant? {
        compactMap { if case .scheduleRetry(let at) = $0 { return at }; return nil }.last
    }
    var waiterTimeouts: [(WaiterID, MonotonicInstant)] {
        compactMap { if case .scheduleWaiterTimeout(let w, let at) = $0 { return (w, at) }; return nil }
    }
    var published: [TokenSession.CurrentToken?] {
        compactMap { if case .publish(let t) = $0 { return .some(t) }; return nil }
    }
}

func failure(_ status: Int, _ body: String = "", headers: [(name: String, value: String)] = []) -> TokenEndpointFailure {
    guard case .failure(let f) = TokenResponseParser().parse(status: status, headers: headers, body: Array(body.utf8), wallClockNow: 0) else {
        preconditionFailure("test fixture must be a failure")  // Fixtures are chosen to fail.
    }
    return f
}

/// A machine holding token "A" (generation 1, L = `lifetime`) obtained by a request sent at t(0).
func readyMachine(_ grant: TokenSession.GrantKind = .clientCredentials, lifetime: Int64 = 3600, seed: UInt64 = 42,
                  configure: (inout TokenSession.Policy) -> Void = { _ in }) -> (Machine, [Action]) {
    var m = makeMachine(grant, seed: seed, configure: configure)
    _ = m.start(now: t(0))
    let actions = m.fetchSucceeded(tokenGrant("A", lifetime: lifetime), sentAt: t(0), now: t(0.2))
    return (m, actions)
}
