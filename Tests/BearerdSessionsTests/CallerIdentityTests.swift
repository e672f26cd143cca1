import Testing
import BearerdOAuth
@testable import BearerdSessions

/// The caller's side of an on-behalf-of request (docs/architecture.md §6.16): its cache key and
/// the 401 bearerd answers for it.
@Suite struct CallerIdentityTests {
    @Test func theKeyIsTheSameHashAsThePureCache() throws {
        for token in ["a", "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2ln", String(repeating: "x", count: 4096)] {
            let id = try #require(CallerIdentity(token: token))
            #expect(id.key == CallerKey(callerToken: token))
            #expect(id.key.fingerprint == OAuthSecret(token).fingerprint)
        }
        #expect(CallerIdentity(token: "") == nil)
    }

    @Test func theChallengeFollowsRFC6750() {
        #expect(CallerRefusal.missingToken.challenge == "Bearer realm=\"bearerd\"")   // no error code without a token (§3.1)
        let invalid = CallerRefusal.invalid(.expired)
        #expect(invalid.challenge == "Bearer realm=\"bearerd\", error=\"invalid_token\", error_description=\"the bearer token has expired\"")
        #expect(invalid.error == "invalid_token" && invalid.reason == "caller_jwt.expired")
        // A server's description cannot break out of the quoted string (§3: no '"' or '\', printable ASCII).
        let odd = CallerRefusal(error: "invalid_grant", detail: "bad \"token\" \\ caf\u{e9}\r\nX-Injected: 1", reason: "sts_refused", challengeError: "invalid_token")
        let value = odd.challenge
        #expect(!value.contains("\r") && !value.contains("\n") && !value.contains("\\"))
        #expect(value.hasSuffix("error_description=\"bad  token    caf    X-Injected: 1\""), "\(value)")
    }
}
