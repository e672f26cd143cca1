import Testing
import BearerdHTTP
@testable import BearerdProxyCore

/// The caller's bearer token as on-behalf-of routes take it (docs/architecture.md §6.16).
@Suite struct CallerCredentialTests {
    func token(_ fields: [(String, String)]) -> String? {
        CallerCredential.bearerToken(HTTPHeaders(fields.map { HTTPField(name: $0.0, value: $0.1) }))
    }

    @Test func oneBearerToken68() {
        #expect(token([("Authorization", "Bearer abc.DEF-_~+/9==")]) == "abc.DEF-_~+/9==")
        #expect(token([("authorization", "bearer   xyz  ")]) == "xyz")  // scheme case-insensitive, spaces around
        #expect(token([("Authorization", "BEARER eyJhbGciOi.eyJzdWIi.sig")]) == "eyJhbGciOi.eyJzdWIi.sig")
    }

    @Test func everythingElseIsNoToken() {
        #expect(token([]) == nil)
        #expect(token([("Authorization", "Basic dXNlcjpwYXNz")]) == nil)
        #expect(token([("Authorization", "DPoP abc")]) == nil)
        #expect(token([("Authorization", "Bearer")]) == nil)
        #expect(token([("Authorization", "Bearer ")]) == nil)
        #expect(token([("Authorization", "Bearerabc")]) == nil)
        #expect(token([("Authorization", "Bearer a b")]) == nil)      // two tokens
        #expect(token([("Authorization", "Bearer a,b")]) == nil)
        #expect(token([("Authorization", "Bearer ==")]) == nil)       // padding alone
        #expect(token([("Authorization", "Bearer a=b")]) == nil)      // '=' only at the end
        #expect(token([("Authorization", "Bearer caf\u{e9}")]) == nil)
        // Two Authorization fields: which one would the upstream have trusted? Neither.
        #expect(token([("Authorization", "Bearer a"), ("Authorization", "Bearer b")]) == nil)
    }
}
