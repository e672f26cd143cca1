import Testing
@testable import BearerdOAuth

@Suite("CachedAccessToken (bearerd token's cache)")
struct CachedAccessTokenTests {
    let binding = CachedAccessToken.binding(grant: "client_credentials", tokenURL: "https://a/t", clientID: "c", scope: "read")

    @Test func theTokensOwnExpiryRoundTripsAndOldFilesStillDecode() {
        let t = CachedAccessToken(token: OAuthSecret("at"), expiresAt: 1_000, binding: binding, tokenExpiresAt: 1_060)
        #expect(String(decoding: t.encode(), as: UTF8.self).contains("\"token_expires_at\":1060"))
        #expect(CachedAccessToken.decode(t.encode()) == t)
        let old = #"{"format":1,"access_token":"at","expires_at":1000,"binding":"\#(binding)"}"#
        #expect(CachedAccessToken.decode(Array(old.utf8))?.tokenExpiresAt == nil)
        #expect(CachedAccessToken.decode(Array(old.utf8))?.expiresAt == 1_000)
        let bad = #"{"format":1,"access_token":"at","expires_at":1000,"binding":"b","token_expires_at":"soon"}"#
        #expect(CachedAccessToken.decode(Array(bad.utf8)) == nil)
        let extra = #"{"format":1,"access_token":"at","expires_at":1000,"binding":"b","other":1}"#
        #expect(CachedAccessToken.decode(Array(extra.utf8)) == nil)
    }

    @Test func roundTripAndReuseRules() {
        let t = CachedAccessToken(token: OAuthSecret("at-\"1\""), expiresAt: 1_000, binding: binding)
        #expect(CachedAccessToken.decode(t.encode()) == t)
        #expect(t.reusable(binding: binding, wallClockNow: 900)?.exposedValue == "at-\"1\"")
        #expect(t.reusable(binding: binding, wallClockNow: 995)?.exposedValue == "at-\"1\"")
        #expect(t.reusable(binding: binding, wallClockNow: 996) == nil)  // under the 5 s minimum
        #expect(t.reusable(binding: binding, wallClockNow: 2_000) == nil)
        let other = CachedAccessToken.binding(grant: "client_credentials", tokenURL: "https://a/t", clientID: "c", scope: "write")
        #expect(other != binding)
        #expect(t.reusable(binding: other, wallClockNow: 900) == nil)
        // Extreme clocks and expiries never trap.
        let far = CachedAccessToken(token: OAuthSecret("x"), expiresAt: .max, binding: binding)
        #expect(far.reusable(binding: binding, wallClockNow: .min) == nil)
        #expect(far.reusable(binding: binding, wallClockNow: 0) != nil)
        #expect(!t.description.contains("at-"))
    }

    @Test func anythingMalformedIsNoCache() {
        for bad in ["", "{}", "[1]", #"{"format":2,"access_token":"a","expires_at":1,"binding":"b"}"#,
                    #"{"format":1,"access_token":"","expires_at":1,"binding":"b"}"#,
                    #"{"format":1,"access_token":"a","expires_at":"1","binding":"b"}"#,
                    #"{"format":1,"access_token":"a","expires_at":1,"binding":"b","extra":1}"#,
                    #"{"format":1,"access_token":"a","expires_at":1}"#] {
            #expect(CachedAccessToken.decode(Array(bad.utf8)) == nil, "\(bad)")
        }
    }
}
