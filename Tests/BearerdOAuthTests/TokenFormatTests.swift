import Testing
@testable import BearerdOAuth

@Suite struct TokenFormatTests {
    // Expected values from `date -u -d @N +%FT%TZ` / Python's datetime.
    @Test(arguments: [
        (Int64(0), "1970-01-01T00:00:00Z"),
        (1_764_090_000, "2025-11-25T17:00:00Z"),
        (-1, "1969-12-31T23:59:59Z"),
        (951_782_400, "2000-02-29T00:00:00Z"),
        (1_709_164_800, "2024-02-29T00:00:00Z"),
        (4_102_444_799, "2099-12-31T23:59:59Z"),
        (-62_135_596_800, "0001-01-01T00:00:00Z"),
        (253_402_300_799, "9999-12-31T23:59:59Z"),
        // Outside years 1…9999: clamped, never a trap.
        (Int64.max, "9999-12-31T23:59:59Z"),
        (Int64.min, "0001-01-01T00:00:00Z"),
    ])
    func rfc3339(seconds: Int64, expected: String) {
        #expect(TokenFormat.rfc3339(unixSeconds: seconds) == expected)
    }

    @Test func jsonKeysInOrderAndEscaped() {
        let odd = "a\"b\\c\nd\u{01}e\u{7f}é\u{2028}"
        let out = TokenFormat.json(token: odd, tokenType: "DPoP", expiresAt: 1_764_090_000, session: "p\"q")
        #expect(out == "{\"access_token\":\"a\\\"b\\\\c\\nd\\u0001e\u{7f}é\u{2028}\",\"token_type\":\"DPoP\","
                + "\"expires_at\":\"2025-11-25T17:00:00Z\",\"session\":\"p\\\"q\"}")
        // It parses back to the same strings.
        let parsed = try? JSONParser(maxDepth: 2, maxBytes: 4096).parse(Array(out.utf8))
        #expect(parsed?.objectValue?["access_token"]?.stringValue == odd)
        #expect(parsed?.objectValue?["session"]?.stringValue == "p\"q")
        #expect(!out.contains("\n"))
    }

    @Test func execCredential() {
        let out = TokenFormat.execCredential(token: "t\"1", expiresAt: 0)
        #expect(out == "{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\","
                + "\"status\":{\"token\":\"t\\\"1\",\"expirationTimestamp\":\"1970-01-01T00:00:00Z\"}}")
    }

    @Test func header() {
        #expect(TokenFormat.header(name: "Authorization", prefix: "Bearer ", token: "abc", suffix: "") == "Authorization: Bearer abc")
        #expect(TokenFormat.header(name: "X-Api-Key", prefix: "k=", token: "abc", suffix: ";") == "X-Api-Key: k=abc;")
    }

    @Test func formatNames() {
        #expect(TokenOutputFormat.names == ["token", "header", "json", "exec-credential", "credential-process"])
        #expect(TokenOutputFormat(rawValue: "exec-credential") == .execCredential)
        #expect(TokenOutputFormat(rawValue: "yaml") == nil)
    }
}
