import Testing
@testable import BearerdOAuth

/// The trap audit of BearerdOAuth (docs/architecture.md §2.7): values from the token endpoint, the state
/// file and the clock at the edges of their types must never trap (a trap is an outage), and
/// lifetimes are clamped to `TokenGrant.maximumLifetime`.
@Suite struct ExtremeTokenResponseTests {
    let parser = TokenResponseParser(defaultLifetime: .seconds(300))
    let now: Int64 = 1_700_000_000

    /// An unsigned JWT (`alg: none`) whose payload is `{"exp":<exp>}` written as given.
    static func jwt(exp: String) -> String {
        "eyJhbGciOiJub25lIn0." + base64url(Array("{\"exp\":\(exp)}".utf8)) + ".sig"
    }

    static func base64url(_ bytes: [UInt8]) -> String {
        var s = Base64.encode(bytes)
        while s.hasSuffix("=") { s.removeLast() }
        return String(s.map { $0 == "+" ? "-" : $0 == "/" ? "_" : $0 })
    }

    func grant(_ body: String, wallClockNow: Int64? = nil) throws -> TokenGrant {
        try parser.parse(status: 200, headers: [], body: Array(body.utf8), wallClockNow: wallClockNow ?? now).get()
    }

    @Test(arguments: [
        "-9223372036854775808", "-9223372036854775807", "-1", "0", "-1e308", "-1e999", "-99999999999999999999999",
    ])
    func jwtExpInThePastOrAbsurdFallsBackToTheDefaultLifetime(exp: String) throws {
        let g = try grant(#"{"access_token":"\#(Self.jwt(exp: exp))","token_type":"Bearer"}"#)
        #expect(g.lifetimeSource == .defaultLifetime)
        #expect(g.lifetime == .seconds(300))
    }

    @Test(arguments: ["9223372036854775807", "1e308", "1e999", "99999999999999999999999", "4102444800000"])
    func jwtExpFarInTheFutureIsClamped(exp: String) throws {
        let g = try grant(#"{"access_token":"\#(Self.jwt(exp: exp))","token_type":"Bearer","expires_in":null}"#)
        #expect(g.lifetimeSource == .jwtExpiry)
        #expect(g.lifetime == TokenGrant.maximumLifetime)
    }

    @Test func jwtExpWithAnExtremeWallClock() throws {
        // A clock at the very bottom of Int64 must not make `exp - now` overflow.
        let far = try grant(#"{"access_token":"\#(Self.jwt(exp: "9223372036854775807"))","token_type":"Bearer"}"#,
                            wallClockNow: .min)
        #expect(far.lifetime == TokenGrant.maximumLifetime)
        let past = try grant(#"{"access_token":"\#(Self.jwt(exp: "-9223372036854775808"))","token_type":"Bearer"}"#,
                             wallClockNow: .max)
        #expect(past.lifetimeSource == .defaultLifetime)
    }

    @Test(arguments: [
        "9223372036854775807", "1e308", "1e999", "99999999999999999999999999", "\"9223372036854775807\"",
        "\"1e308\"", "\"99999999999999999999999999\"", "315360001",
    ])
    func hugeExpiresInIsClamped(value: String) throws {
        let g = try grant(#"{"access_token":"opaque","token_type":"Bearer","expires_in":\#(value),"refresh_in":\#(value)}"#)
        #expect(g.lifetimeSource == .expiresIn)
        #expect(g.lifetime == TokenGrant.maximumLifetime)
        #expect(g.refreshIn == TokenGrant.maximumLifetime)
    }

    @Test(arguments: ["-9223372036854775808", "-1", "-1e308", "-1e999", "\"-99999999999999999999\"", "0.5", "\"nan\"",
                      "\"inf\"", "\"0x10\"", "\"1e\"", "true", "[]"])
    func unusableExpiresInFallsBack(value: String) throws {
        let g = try grant(#"{"access_token":"opaque","token_type":"Bearer","expires_in":\#(value),"refresh_in":\#(value)}"#)
        #expect(g.lifetimeSource == .defaultLifetime)
        #expect(g.lifetime == .seconds(300))
        #expect(g.refreshIn == nil)
    }

    @Test func aHugeDefaultLifetimeIsClampedToo() throws {
        let p = TokenResponseParser(defaultLifetime: .seconds(Int64.max))
        let g = try p.parse(status: 200, headers: [], body: Array(#"{"access_token":"a","token_type":"Bearer"}"#.utf8),
                            wallClockNow: now).get()
        #expect(g.lifetime == TokenGrant.maximumLifetime)
    }

    @Test func saturatingIntegers() {
        #expect(TokenResponseParser.saturatingInteger("12") == 12)
        #expect(TokenResponseParser.saturatingInteger("12.9") == 12)
        #expect(TokenResponseParser.saturatingInteger("-12.9") == -12)
        #expect(TokenResponseParser.saturatingInteger("9223372036854775808") == .max)
        #expect(TokenResponseParser.saturatingInteger("-9223372036854775809") == .min)
        #expect(TokenResponseParser.saturatingInteger("1e999") == .max)
        #expect(TokenResponseParser.saturatingInteger("-1e999") == .min)
        #expect(TokenResponseParser.saturatingInteger("9.223372036854775807e18") == .max)
        #expect(TokenResponseParser.saturatingInteger("nan") == nil)
    }

    @Test(arguments: ["99999999999999999999999", "9223372036854775807", "18446744073709551616"])
    func retryAfterHugeIsCapped(value: String) throws {
        let r = parser.parse(status: 503, headers: [("Retry-After", value)], body: [], wallClockNow: now)
        guard case .failure(let f) = r else { Issue.record("expected a failure"); return }
        #expect(f.retryAfter == .seconds(3600))
    }

    @Test func retryAfterDateWithAnExtremeClock() {
        let date = "Sun, 06 Nov 1994 08:49:37 GMT"
        #expect(RetryAfter.parse(date, wallClockNow: .max) == .zero)
        #expect(RetryAfter.parse(date, wallClockNow: .min) == .seconds(Int64.max))
    }
}

@Suite struct ExtremeClockArithmeticTests {
    @Test func scaledSaturates() {
        #expect(Duration.seconds(Int64.max).scaled(by: 1.0) == .nanoseconds(Int64.max))
        #expect(Duration.nanoseconds(Int64.max).scaled(by: 1.0) == .nanoseconds(Int64.max))
        #expect(Duration.nanoseconds(Int64.max).scaled(by: 2.0) == .nanoseconds(Int64.max))
        #expect(Duration.nanoseconds(Int64.min).scaled(by: 1.0) == .nanoseconds(Int64.min))
        #expect(Duration.seconds(10).scaled(by: .nan) == .zero)
        #expect(Duration.seconds(10).scaled(by: 0.5) == .seconds(5))
    }

    @Test func retryAfterSecondsNeverOverflows() {
        let far = TokenSession.TokenUnavailable(reason: "x", retryAfter: .seconds(Int64.max))
        #expect(far.retryAfterSeconds == Int(Int64.max / 1_000_000_000) + 1)
        #expect(TokenSession.TokenUnavailable(reason: "x", retryAfter: .nanoseconds(Int64.max)).retryAfterSeconds
                == Int(Int64.max / 1_000_000_000) + 1)
        #expect(TokenSession.TokenUnavailable(reason: "x", retryAfter: .milliseconds(1)).retryAfterSeconds == 1)
        #expect(TokenSession.TokenUnavailable(reason: "x", retryAfter: .seconds(2)).retryAfterSeconds == 2)
        #expect(TokenSession.TokenUnavailable(reason: "x", retryAfter: .milliseconds(2001)).retryAfterSeconds == 3)
    }

    @Test func monotonicInstantsSaturate() {
        #expect(MonotonicInstant.seconds(-5).nanoseconds == 0)
        #expect(MonotonicInstant.seconds(.nan).nanoseconds == 0)
        #expect(MonotonicInstant.seconds(1e300).nanoseconds == .max)
        #expect(MonotonicInstant.seconds(.infinity).nanoseconds == .max)
        let top = MonotonicInstant(nanoseconds: .max)
        #expect(top + .seconds(Int64.max) == top)
        #expect(MonotonicInstant(nanoseconds: 0) - .seconds(Int64.max) == MonotonicInstant(nanoseconds: 0))
        #expect(top - MonotonicInstant(nanoseconds: 0) == .nanoseconds(Int64.max))
        #expect(MonotonicInstant(nanoseconds: 0) - top == .zero - .nanoseconds(Int64.max))
    }

    @Test func persistedStateWithAbsurdExpiry() {
        func state(_ expiresAt: Int64) -> PersistedSessionState {
            PersistedSessionState(refreshToken: OAuthSecret("r"),
                                  accessToken: .init(token: OAuthSecret("a"), expiresAt: expiresAt, generation: 1),
                                  updatedAt: 0)
        }
        #expect(state(.min).adoptableGrant(wallClockNow: .max) == nil)
        #expect(state(.min).adoptableGrant(wallClockNow: 1_700_000_000) == nil)
        #expect(state(.max).adoptableGrant(wallClockNow: .min)?.lifetime == TokenGrant.maximumLifetime)
        #expect(state(.max).adoptableGrant(wallClockNow: 1_700_000_000)?.lifetime == TokenGrant.maximumLifetime)
        #expect(state(1_700_003_600).adoptableGrant(wallClockNow: 1_700_000_000)?.lifetime == .seconds(3600))
    }

    @Test func persistedUpdatedAtIsClampedSoTheNextStampCannotOverflow() throws {
        func decode(_ updatedAt: String) throws -> PersistedSessionState {
            try PersistedSessionState.decode(Array(#"{"format":1,"refresh_token":"r","updated_at":\#(updatedAt)}"#.utf8))
        }
        let top = try decode("9223372036854775807")
        #expect(top.updatedAt == PersistedSessionState.latestTimestamp)
        #expect(top.updatedAt + 1 > top.updatedAt)
        #expect(try decode("-9223372036854775808").updatedAt == 0)
        #expect(try decode("1700000000").updatedAt == 1_700_000_000)
    }
}

/// The whole session machine fed grants with extreme lifetimes: no trap, sane schedules.
@Suite struct ExtremeSessionMachineTests {
    static let bodies = [
        #"{"access_token":"opaque","token_type":"Bearer","expires_in":9223372036854775807}"#,
        #"{"access_token":"opaque","token_type":"Bearer","expires_in":"99999999999999999999999"}"#,
        #"{"access_token":"opaque","token_type":"Bearer","expires_in":1e308,"refresh_in":1e308}"#,
        #"{"access_token":"opaque","token_type":"Bearer","expires_in":-9223372036854775808}"#,
        #"{"access_token":"\#(ExtremeTokenResponseTests.jwt(exp: "-9223372036854775808"))","token_type":"Bearer"}"#,
        #"{"access_token":"\#(ExtremeTokenResponseTests.jwt(exp: "9223372036854775807"))","token_type":"Bearer"}"#,
        #"{"access_token":"\#(ExtremeTokenResponseTests.jwt(exp: "1e999"))","token_type":"Bearer","expires_in":0}"#,
    ]

    @Test(arguments: bodies)
    func fetchSucceededWithAnExtremeResponse(body: String) throws {
        let grant = try TokenResponseParser().parse(status: 200, headers: [], body: Array(body.utf8),
                                                    wallClockNow: 1_700_000_000).get()
        var m = makeMachine()
        _ = m.start(now: t(0))
        _ = m.tokenRequested(waiter: WaiterID(1), now: t(0.1))
        let actions = m.fetchSucceeded(grant, sentAt: t(0), now: t(0.2))
        let published = try #require(actions.published.first ?? nil)
        #expect(actions.resumedTokens.map(\.generation) == [1])
        #expect(published.expiresAt > t(0) && published.expiresAt <= t(0) + TokenGrant.maximumLifetime)
        let refreshAt = try #require(actions.refreshAt)
        #expect(refreshAt >= t(1.2) && refreshAt < published.expiresAt)
        // The same token again (no progress), a rejection, a failure: every path stays trap-free.
        _ = m.refreshTimerFired(now: refreshAt)
        let again = m.fetchSucceeded(grant, sentAt: refreshAt, now: refreshAt)
        #expect(again.refreshAt != nil)
        let rejected = m.upstreamRejected(generation: 1, waiter: WaiterID(2), now: refreshAt + .seconds(1))
        for f in rejected.resumedFailures { #expect(f.retryAfterSeconds >= 1) }
        _ = m.tokenRequested(waiter: WaiterID(3), now: published.expiresAt)
        for f in m.fetchFailed(failure(503), requestSent: true, now: published.expiresAt).resumedFailures {
            #expect(f.retryAfterSeconds >= 1)
        }
    }

    @Test func aGrantBuiltWithAnAbsurdLifetimeIsClampedByTheMachine() throws {
        var m = makeMachine { $0.refreshBefore = .seconds(Int64.max) }
        _ = m.start(now: t(0))
        let grant = TokenGrant(accessToken: OAuthSecret("A"), lifetime: .seconds(Int64.max), refreshIn: .seconds(Int64.max))
        let actions = m.fetchSucceeded(grant, sentAt: t(0), now: t(0))
        let published = try #require(actions.published.first ?? nil)
        #expect(published.expiresAt == t(0) + TokenGrant.maximumLifetime)
        #expect(actions.refreshAt != nil)
        // A negative lifetime is the shortest possible one, not a trap.
        var n = makeMachine()
        _ = n.start(now: t(0))
        let short = n.fetchSucceeded(TokenGrant(accessToken: OAuthSecret("B"), lifetime: .seconds(Int64.min)), sentAt: t(0), now: t(0))
        #expect(short.published.first??.expiresAt == t(0) + .nanoseconds(1))
    }
}
