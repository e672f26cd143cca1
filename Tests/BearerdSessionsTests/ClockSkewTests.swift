import Testing
import BearerdOAuth
import BearerdSessions

/// docs/architecture.md §6.12: the token endpoint's `Date` against the local clock.
@Suite struct ClockSkewTests {
    // Sun, 06 Nov 1994 08:49:37 GMT (RFC 9110 §5.6.7's example) = 784111777.
    static let date = "Sun, 06 Nov 1994 08:49:37 GMT"
    static let server: Int64 = 784_111_777

    @Test func aSkewOverFiveSecondsIsAppliedAndReportedOnce() {
        let skew = ClockSkew()
        #expect(skew.observe(dateHeader: Self.date, localNow: Self.server + 42) == 42)
        #expect(skew.seconds == 42)
        #expect(skew.issuedAt(localNow: Self.server + 100) == Self.server + 58)
        // Measured again: applied, not reported again.
        #expect(skew.observe(dateHeader: Self.date, localNow: Self.server + 40) == nil)
        #expect(skew.seconds == 40)
        // A local clock behind the server's: iat moves forward.
        #expect(skew.observe(dateHeader: Self.date, localNow: Self.server - 30) == nil)
        #expect(skew.issuedAt(localNow: Self.server - 30) == Self.server)
    }

    @Test func smallDifferencesAndBadDatesAreIgnored() {
        let skew = ClockSkew()
        #expect(skew.observe(dateHeader: Self.date, localNow: Self.server + 5) == nil)
        #expect(skew.seconds == 0)
        #expect(skew.lastMeasured == 5)
        for bad in ["", "yesterday", "Sun, 06 Nov 1994 08:49:37 UTC", "Sun, 36 Nov 1994 08:49:37 GMT", "Sun, 06 Nov 99999999999999999999 08:49:37 GMT"] {
            #expect(skew.observe(dateHeader: bad, localNow: Int64.max) == nil)
        }
        #expect(skew.seconds == 0)
        // Extreme clocks saturate instead of trapping.
        #expect(skew.observe(dateHeader: Self.date, localNow: Int64.min) != nil)
        #expect(skew.issuedAt(localNow: Int64.max) <= Int64.max)
    }

    /// RFC 9449 §5: a DPoP session refuses a Bearer token (the server did not bind it).
    @Test func aDPoPSessionNeedsTokenTypeDPoP() throws {
        var parser = TokenResponseParser()
        parser.requiresDPoP = true
        let bearer = parser.parse(status: 200, headers: [], body: Array(#"{"access_token":"a","token_type":"Bearer","expires_in":60}"#.utf8), wallClockNow: 0)
        guard case .failure(let f) = bearer else { Issue.record("accepted a Bearer token"); return }
        #expect(f.reason == "token.dpop_not_bound")
        #expect(f.classification == .permanent)
        let dpop = parser.parse(status: 200, headers: [], body: Array(#"{"access_token":"a","token_type":"DPoP","expires_in":60}"#.utf8), wallClockNow: 0)
        #expect((try? dpop.get())?.tokenType == "DPoP")
        #expect(TokenEndpointFailure.oauthErrorCode(Array(#"{"error":"use_dpop_nonce"}"#.utf8)) == "use_dpop_nonce")
    }
}
