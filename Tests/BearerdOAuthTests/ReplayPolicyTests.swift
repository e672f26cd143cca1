import Testing
@testable import BearerdOAuth

@Suite struct WWWAuthenticateTests {
    @Test func bearerWithParams() throws {
        let c = try WWWAuthenticate.parse(#"Bearer realm="example", error="invalid_token", error_description="The access token expired""#)
        #expect(c.count == 1)
        #expect(c[0].isBearer)
        #expect(c[0].parameter("realm") == "example")
        #expect(c[0].parameter("ERROR") == "invalid_token")
        #expect(c[0].parameter("error_description") == "The access token expired")
    }

    @Test func severalChallengesInOneField() throws {
        let c = try WWWAuthenticate.parse(#"Newauth realm="apps", type=1, title="Login to \"apps\"", Basic realm="simple""#)
        #expect(c.map(\.scheme) == ["Newauth", "Basic"])
        #expect(c[0].parameters.map(\.name) == ["realm", "type", "title"])
        #expect(c[0].parameter("title") == #"Login to "apps""#)
        #expect(c[1].parameter("realm") == "simple")
    }

    @Test func bareSchemesAndToken68() throws {
        let c = try WWWAuthenticate.parse("Negotiate, Bearer, NTLM abc+/d==, Basic realm=x")
        #expect(c.map(\.scheme) == ["Negotiate", "Bearer", "NTLM", "Basic"])
        #expect(c[2].token68 == "abc+/d==")
        #expect(c[3].parameter("realm") == "x")
        let single = try WWWAuthenticate.parse("Negotiate YIIB=")
        #expect(single == [AuthenticationChallenge(scheme: "Negotiate", token68: "YIIB=")])
        // RFC 9110's grammar reads `error=` with nothing after it as a token68.
        #expect(try WWWAuthenticate.parse("Bearer error=") == [AuthenticationChallenge(scheme: "Bearer", token68: "error=")])
    }

    @Test func severalFieldsAndSpacing() throws {
        let c = try WWWAuthenticate.parse(["Basic realm=a", #"bearer   error = "insufficient_scope" , scope="read write""#, ""])
        #expect(c.count == 2)
        #expect(c[1].isBearer)
        #expect(c[1].parameter("error") == "insufficient_scope")
        #expect(c[1].parameter("scope") == "read write")
        #expect(try WWWAuthenticate.parse(" , ,Bearer ,").map(\.scheme) == ["Bearer"])
    }

    @Test(arguments: [
        #"Bearer error="invalid_token"#, "Bearer realm=\"a\" error=x", "=x", #"Bearer a="1", a="2""#, "Bearer x y",
        "Basic realm=a b", "Bearer error=\"a\u{1}\"",
    ])
    func malformed(_ value: String) {
        #expect(throws: WWWAuthenticate.ParseError.self) { try WWWAuthenticate.parse(value) }
    }
}

@Suite struct ReplayDecisionTests {
    func decide(status: Int = 401, reject: [Int] = [401], www: [String] = [], replayable: Bool = true, method: Bool = true,
                replayed: Bool = false) -> ReplayPolicy.Decision {
        ReplayPolicy.decide(.init(status: status, rejectStatuses: reject, wwwAuthenticate: www, bodyReplayable: replayable,
                                  methodAllowed: method, alreadyReplayed: replayed))
    }

    @Test func table() {
        #expect(decide() == .replay)
        #expect(decide(www: [#"Bearer realm="x""#]) == .replay)
        #expect(decide(www: [#"Bearer error="invalid_token""#]) == .replay)
        #expect(decide(www: ["Basic realm=x"]) == .replay)
        #expect(decide(www: [#"Bearer error="insufficient_scope""#]) == .passThrough(.notTokenError))
        #expect(decide(www: [#"Bearer error="invalid_token""#, #"Bearer error="insufficient_scope""#]) == .passThrough(.notTokenError))
        #expect(decide(www: [#"Bearer error="invalid_request""#]) == .passThrough(.notTokenError))
        #expect(decide(www: ["Bearer \"garbage"]) == .replay)  // unparsable: no information
        #expect(decide(status: 403) == .notRejected)
        #expect(decide(status: 403, reject: [401, 403]) == .replay)
        #expect(decide(status: 200) == .notRejected)
        #expect(decide(replayed: true) == .passThrough(.rejectedAgain))
        #expect(decide(replayable: false) == .refreshOnlyPassThrough(.notReplayable))
        #expect(decide(method: false) == .refreshOnlyPassThrough(.methodNotAllowed))
        #expect(decide(www: [#"Bearer error="insufficient_scope""#], replayable: false) == .passThrough(.notTokenError))
        #expect(decide(replayable: false, replayed: true) == .passThrough(.rejectedAgain))
    }
}

@Suite struct PersistedSessionStateTests {
    let full = PersistedSessionState(
        refreshToken: OAuthSecret("rt-\"1\"\\é"),
        accessToken: .init(token: OAuthSecret("at-1"), expiresAt: 1_700_003_600, generation: 4),
        updatedAt: 1_700_000_000, sourceFingerprint: "1a2b3c4d")

    @Test func roundTrip() throws {
        let bytes = full.encode()
        #expect(try PersistedSessionState.decode(bytes) == full)
        let minimal = PersistedSessionState(refreshToken: OAuthSecret("r"), updatedAt: 5)
        #expect(String(decoding: minimal.encode(), as: UTF8.self) == "{\"format\":1,\"refresh_token\":\"r\",\"updated_at\":5}\n")
        #expect(try PersistedSessionState.decode(minimal.encode()) == minimal)
        #expect(!full.description.contains("rt-") && !full.description.contains("at-1"))
    }

    /// The shared-cache generation of the lineage (issue 31, rollback through Redis): written
    /// only when known, so a file without it (every file before it existed) reads as nil.
    @Test func sharedGenerationRoundTripAndOlderFiles() throws {
        var withGeneration = full
        withGeneration.sharedGeneration = 1_700_000_000_123
        let text = String(decoding: withGeneration.encode(), as: UTF8.self)
        #expect(text.hasSuffix(",\"shared_generation\":1700000000123}\n"))
        #expect(try PersistedSessionState.decode(withGeneration.encode()) == withGeneration)
        #expect(try PersistedSessionState.decode(full.encode()).sharedGeneration == nil)
        #expect(!String(decoding: full.encode(), as: UTF8.self).contains("shared_generation"))
        // Kept when the access token is left out for size.
        var lean = withGeneration
        lean.accessToken = .init(token: OAuthSecret(String(repeating: "a", count: PersistedSessionState.maxFileBytes)), expiresAt: 9, generation: 2)
        #expect(try PersistedSessionState.decode(#require(lean.encodeForFile())).sharedGeneration == 1_700_000_000_123)
        // A generation beyond Int64 (only a key holder could seal one) is written clamped, still readable.
        withGeneration.sharedGeneration = .max
        #expect(try PersistedSessionState.decode(withGeneration.encode()).sharedGeneration == UInt64(Int64.max))
        for bad in [#""1""#, "-1", "1.5"] {
            #expect(throws: PersistedSessionState.DecodingError.self) {
                try PersistedSessionState.decode(Array(#"{"format":1,"refresh_token":"r","updated_at":1,"shared_generation":"#.utf8) + Array(bad.utf8) + [0x7D])
            }
        }
    }

    /// Whatever is written is read back; what cannot fit is never written.
    @Test func oneSizeLimitForWritingAndReading() throws {
        let large = PersistedSessionState(refreshToken: OAuthSecret(String(repeating: "r", count: 100 * 1024)), updatedAt: 1)
        let bytes = try #require(large.encodeForFile())
        #expect(try PersistedSessionState.decode(bytes) == large)
        // An access token that does not fit beside the refresh token is left out, not the file.
        let crowded = PersistedSessionState(
            refreshToken: OAuthSecret(String(repeating: "r", count: 600 * 1024)),
            accessToken: .init(token: OAuthSecret(String(repeating: "a", count: 600 * 1024)), expiresAt: 9, generation: 2),
            updatedAt: 1)
        let lean = try #require(crowded.encodeForFile())
        #expect(lean.count <= PersistedSessionState.maxFileBytes)
        let back = try PersistedSessionState.decode(lean)
        #expect(back.refreshToken == crowded.refreshToken)
        #expect(back.accessToken == nil)
        let tooLarge = PersistedSessionState(refreshToken: OAuthSecret(String(repeating: "r", count: PersistedSessionState.maxFileBytes)), updatedAt: 1)
        #expect(tooLarge.encodeForFile() == nil)
    }

    @Test(arguments: [
        ("", "state.malformed_json"), ("[]", "state.malformed_json"),
        (#"{"format":2,"refresh_token":"r","updated_at":1}"#, "state.unsupported_format"),
        (#"{"refresh_token":"r","updated_at":1}"#, "state.missing_field"),
        (#"{"format":1,"updated_at":1}"#, "state.missing_field"),
        (#"{"format":1,"refresh_token":"","updated_at":1}"#, "state.invalid_field"),
        (#"{"format":1,"refresh_token":"r","updated_at":"1"}"#, "state.invalid_field"),
        (#"{"format":1,"refresh_token":"r","updated_at":1,"access_token":"a"}"#, "state.invalid_field"),
        (#"{"format":1,"refresh_token":"r","updated_at":1,"extra":1}"#, "state.unknown_field"),
    ])
    func rejects(text: String, reason: String) {
        do {
            _ = try PersistedSessionState.decode(Array(text.utf8))
            Issue.record("accepted \(text)")
        } catch {
            #expect(error.reason == reason)
        }
    }

    @Test func adoptableGrant() throws {
        let g = try #require(full.adoptableGrant(wallClockNow: 1_700_000_600))
        #expect(g.lifetime == .seconds(3000))
        #expect(g.accessToken == OAuthSecret("at-1"))
        #expect(g.refreshToken == full.refreshToken)
        #expect(full.adoptableGrant(wallClockNow: 1_700_003_560) == nil)  // less than a minute left
    }

    @Test func startingSource() {
        let fp = "1a2b3c4d"
        #expect(RefreshTokenAdoption.startingSource(operatorFileFingerprint: nil, stored: nil) == .none)
        #expect(RefreshTokenAdoption.startingSource(operatorFileFingerprint: fp, stored: nil) == .operatorFile)
        #expect(RefreshTokenAdoption.startingSource(operatorFileFingerprint: nil, stored: full) == .stateFile)
        #expect(RefreshTokenAdoption.startingSource(operatorFileFingerprint: fp, stored: full) == .stateFile)
        // The operator put a new file in place: it wins over our rotations of the old one.
        #expect(RefreshTokenAdoption.startingSource(operatorFileFingerprint: "ffffffff", stored: full) == .operatorFile)
    }

    @Test func underLock() {
        var own = full
        #expect(RefreshTokenAdoption.underLock(stored: nil, own: own) == .refreshWithOwn)
        #expect(RefreshTokenAdoption.underLock(stored: own, own: own) == .refreshWithOwn)
        var rotated = full
        rotated.refreshToken = OAuthSecret("rt-2")
        rotated.updatedAt += 10
        #expect(RefreshTokenAdoption.underLock(stored: rotated, own: own) == .adoptStored)
        var older = rotated
        older.updatedAt = own.updatedAt - 10
        #expect(RefreshTokenAdoption.underLock(stored: older, own: own) == .refreshWithOwn)
        var refreshedNoRotation = full
        refreshedNoRotation.accessToken = .init(token: OAuthSecret("at-2"), expiresAt: 1_700_007_200, generation: 5)
        #expect(RefreshTokenAdoption.underLock(stored: refreshedNoRotation, own: own) == .adoptStored)
        var otherLineage = rotated
        otherLineage.sourceFingerprint = "ffffffff"
        #expect(RefreshTokenAdoption.underLock(stored: otherLineage, own: own) == .refreshWithOwn)
        own.accessToken = nil
        #expect(RefreshTokenAdoption.underLock(stored: full, own: own) == .adoptStored)
    }
}
