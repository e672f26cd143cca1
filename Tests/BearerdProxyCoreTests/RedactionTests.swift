import BearerdHTTP
import BearerdOAuth
import Testing
@testable import BearerdProxyCore

/// docs/architecture.md §5: credentials never reach a log line, whatever the level or format.
@Suite struct RedactionTests {
    @Test func headerValuesBecomeFingerprints() {
        var h = HTTPHeaders()
        h.add("Authorization", "Bearer tok-SECRET-1")
        h.add("Cookie", "session=abc-SECRET-2")
        h.add("X-Api-Key", "SECRET-3")
        h.add("X-Upstream-Token", "SECRET-4")
        h.add("Accept", "application/json")
        let text = Redaction.describe(h)
        for s in ["SECRET-1", "SECRET-2", "SECRET-3", "SECRET-4"] { #expect(!text.contains(s), "\(s) in \(text)") }
        #expect(text.contains("Authorization: Bearer <fp \(BearerdOAuth.fingerprint("tok-SECRET-1"))>"))
        #expect(text.contains("Accept: application/json"))
        #expect(text.contains("Cookie: <redacted fp "))
    }

    @Test func queryValuesAreCut() {
        #expect(Redaction.target("/cb?code=SECRET&state=ok&access_token=T2&flag") == "/cb?code=<redacted>&state=<redacted>&access_token=<redacted>&flag")
        #expect(Redaction.target("/plain") == "/plain")
        #expect(Redaction.target("/a?x=1") == "/a?x=<redacted>")
    }

    @Test func scrubCatchesCredentialsInFreeText() {
        let cases: [(String, String)] = [
            ("detail=\"invalid token Bearer abc.def.ghi given\"", "detail=\"invalid token Bearer <redacted> given\""),
            ("{\"msg\":\"x\",\"body\":\"grant_type=refresh_token&refresh_token=RT-1&client_secret=CS-2\"}",
             "{\"msg\":\"x\",\"body\":\"grant_type=refresh_token&refresh_token=<redacted>&client_secret=<redacted>\"}"),
            ("{\"access_token\":\"AT-9\",\"token_type\":\"Bearer\"}", "{\"access_token\":\"<redacted>\",\"token_type\":\"Bearer\"}"),
            ("echo: Authorization: Basic dXNlcjpwYXNz", "echo: Authorization: Basic <redacted>"),
            ("password=hunter2 user=bob", "password=<redacted> user=bob"),
            ("Cookie: sid=1; other=2", "Cookie: <redacted>; other=2"),
        ]
        for (input, expected) in cases { #expect(Redaction.scrub(input) == expected) }
    }

    @Test func scrubLeavesOrdinaryLinesAlone() {
        let lines = [
            "2026-01-01T00:00:00.000Z info token obtained session=partner token.fingerprint=1a2b3c4d token.generation=3 token.grant=password",
            "info bearerd started listen=127.0.0.1:8080 client_auth=client_secret_basic",
            "info session needs a new refresh token (invalid_grant) password_file=/etc/x",
            "Authorization: Bearer <fp 1a2b3c4d>",
            "method=GET path=/v1/users route=/ status=200 upstream_ms=1.200 total_ms=1.500 bytes=12",
            // Configuration errors in a reload-failure line name keys, never values.
            "error reload failed errors=\"bearerd.yaml:12: sessions.partner.client_secret: must not be empty\"",
            "error reload failed errors=\"bearerd.yaml:14: sessions.legacy.password: expected a string, got a list\"",
        ]
        for l in lines { #expect(Redaction.scrub(l) == l) }
    }
}
