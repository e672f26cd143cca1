import Testing
@testable import BearerdOAuth

/// JWK Set parsing (RFC 7517 §5, RFC 7518 §6, RFC 8037 §2): what is kept, what is skipped and
/// why, the bounds; and `CallerJWTKeySet`'s re-fetch rule.
@Suite struct JWKSetTests {
    /// RFC 7517 Appendix A.1, plus RFC 8037 §A.2's Ed25519 public key.
    static let rfcExample = #"""
    {"keys":
      [
        {"kty":"EC","crv":"P-256","x":"MKBCTNIcKUSDii11ySs3526iDZ8AiTo7Tu6KPAqv7D4","y":"4Etl6SRW2YiLUrN5vfvVHuhp7x8PxltmWWlbbM4IFyM","use":"enc","kid":"1"},
        {"kty":"RSA","n":"0vx7agoebGcQSuuPiLJXZptN9nndrQmbXEps2aiAFbWhM78LhWx4cbbfAAtVT86zwu1RK7aPFFxuhDR1L6tSoc_BJECPebWKRXjBZCiFV4n3oknjhMstn64tZ_2W-5JsGY4Hc5n9yBXArwl93lqt7_RN5w6Cf0h4QyQ5v-65YGjQR0_FDW2QvzqY368QQMicAtaSqzs8KJZgnYb9c7d0zgdAZHzu6qMQvRL5hajrn1n91CbOpbISD08qNLyrdkt-bFTWhAI4vMQFh6WeZu0fM4lFd2NcRwr3XPksINHaQ-G_xBniIqbw0Ls1jF44-csFCur-kEgU8awapJzKnqDKgw","e":"AQAB","alg":"RS256","kid":"2011-04-29"},
        {"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}
      ]
    }
    """#

    static func parse(_ text: String) throws -> JWKSet.Document { try JWKSet.parse(Array(text.utf8)) }

    @Test func theRFCExampleKeepsTheSigningKeys() throws {
        let doc = try Self.parse(Self.rfcExample)
        #expect(doc.keys.count == 2)
        #expect(doc.skipped == [JWKSet.Skip(index: 0, keyID: "1", reason: "use enc, not sig")])
        let rsa = doc.keys[0]
        #expect(rsa.keyID == "2011-04-29")
        #expect(rsa.algorithm == .RS256)
        #expect(rsa.rsaModulusBits == 2048)
        #expect(rsa.accepts(.RS256) && !rsa.accepts(.PS256) && !rsa.accepts(.ES256))
        guard case .rsa(let n, let e) = rsa.material else { Issue.record("not RSA"); return }
        #expect(n.count == 256 && n.first == 0xD2 && e == [1, 0, 1])
        let ed = doc.keys[1]
        #expect(ed.keyID == nil)
        guard case .ed25519(let x) = ed.material else { Issue.record("not Ed25519"); return }
        #expect(x.count == 32 && x.first == 0xD7)
        #expect(ed.accepts(.EdDSA) && !ed.accepts(.ES256))
    }

    @Test func keysBearerdCannotUseAreSkippedWithAReason() throws {
        let n2048 = Base64.encodeURL([UInt8](repeating: 0xC1, count: 256))
        let n1024 = Base64.encodeURL([UInt8](repeating: 0xC1, count: 128))
        let n2048Padded = Base64.encodeURL([0, 0] + [UInt8](repeating: 0xC1, count: 256))
        let x32 = Base64.encodeURL([UInt8](repeating: 5, count: 32)), x48 = Base64.encodeURL([UInt8](repeating: 5, count: 48))
        let cases: [(String, String?)] = [
            (#"{"kty":"RSA","n":"\#(n2048)","e":"AQAB"}"#, nil),
            (#"{"kty":"RSA","n":"\#(n2048Padded)","e":"AQAB"}"#, nil),  // leading zeros stripped
            (#"{"kty":"RSA","n":"\#(n1024)","e":"AQAB"}"#, "RSA modulus of 1024 bits, under 2048"),
            (#"{"kty":"RSA","n":"\#(n2048)","e":"AAAA"}"#, "RSA public exponent is not usable"),
            (#"{"kty":"RSA","n":"\#(n2048)","e":"AQAA"}"#, "RSA public exponent is not usable"),  // even
            (#"{"kty":"RSA","n":"\#(n2048)"}"#, "RSA key without valid n and e"),
            (#"{"kty":"RSA","n":"\#(n2048)=","e":"AQAB"}"#, "RSA key without valid n and e"),
            (#"{"kty":"RSA","n":"\#(n2048)","e":"AQAB","d":"AQAB"}"#, "holds private key members; only public keys are accepted"),
            (#"{"kty":"oct","k":"c2VjcmV0"}"#, "a symmetric key"),
            (#"{"kty":"RSA","n":"\#(n2048)","e":"AQAB","use":"enc"}"#, "use enc, not sig"),
            (#"{"kty":"RSA","n":"\#(n2048)","e":"AQAB","use":"sig","key_ops":["sign"]}"#, "key_ops without verify"),
            (#"{"kty":"RSA","n":"\#(n2048)","e":"AQAB","key_ops":["verify"]}"#, nil),
            (#"{"kty":"RSA","n":"\#(n2048)","e":"AQAB","alg":"RSA-OAEP"}"#, "alg RSA-OAEP is not verified by bearerd"),
            (#"{"kty":"RSA","n":"\#(n2048)","e":"AQAB","alg":"ES256"}"#, "alg ES256 does not fit the key"),
            (#"{"kty":"RSA","n":"\#(n2048)","e":"AQAB","alg":"HS256"}"#, "alg HS256 is not verified by bearerd"),
            (#"{"kty":"EC","crv":"P-256","x":"\#(x32)","y":"\#(x32)"}"#, nil),
            (#"{"kty":"EC","crv":"P-384","x":"\#(x48)","y":"\#(x48)"}"#, nil),
            (#"{"kty":"EC","crv":"P-384","x":"\#(x32)","y":"\#(x32)"}"#, "EC coordinates are not 48 bytes each"),
            (#"{"kty":"EC","crv":"P-521","x":"\#(x32)","y":"\#(x32)"}"#, "curve P-521 is not supported (P-256, P-384)"),
            (#"{"kty":"EC","crv":"secp256k1","x":"\#(x32)","y":"\#(x32)"}"#, "curve secp256k1 is not supported (P-256, P-384)"),
            (#"{"kty":"EC","x":"\#(x32)","y":"\#(x32)"}"#, "EC key without crv"),
            (#"{"kty":"OKP","crv":"Ed448","x":"\#(x32)"}"#, "curve Ed448 is not supported (Ed25519)"),
            (#"{"kty":"OKP","crv":"X25519","x":"\#(x32)"}"#, "curve X25519 is not supported (Ed25519)"),
            (#"{"kty":"OKP","crv":"Ed25519","x":"\#(x48)"}"#, "Ed25519 public key is not 32 bytes"),
            (#"{"kty":"PQC","x":"\#(x32)"}"#, "kty PQC is not supported (RSA, EC, OKP)"),
            (#"{"n":"\#(n2048)","e":"AQAB"}"#, "no kty"),
            (#"{"kty":"RSA","kid":5,"n":"\#(n2048)","e":"AQAB"}"#, "kid is not a string"),
            (#""a string""#, "not a JSON object"),
        ]
        for (key, reason) in cases {
            let doc = try Self.parse(#"{"keys":[\#(key)]}"#)
            if let reason {
                #expect(doc.keys.isEmpty, "\(key)")
                #expect(doc.skipped.first?.reason == reason, "\(key)")
            } else {
                #expect(doc.keys.count == 1 && doc.skipped.isEmpty, "\(key): \(doc.skipped)")
            }
        }
        // 16384 bits is the ceiling.
        let huge = Base64.encodeURL([UInt8](repeating: 0xC1, count: 2049))
        #expect(try Self.parse(#"{"keys":[{"kty":"RSA","n":"\#(huge)","e":"AQAB"}]}"#).skipped.first?.reason == "RSA modulus of 16392 bits, over 16384")
    }

    @Test func aRepeatedKidKeepsTheFirstKey() throws {
        let doc = try Self.parse(#"{"keys":[\#(TestJWT.rsa(kid: "a", tag: 1)),\#(TestJWT.ec(kid: "a", tag: 2)),\#(TestJWT.ec(kid: "b", tag: 3))]}"#)
        #expect(doc.keys.map(\.keyID) == ["a", "b"])
        #expect(doc.skipped == [JWKSet.Skip(index: 1, keyID: "a", reason: "repeats an earlier kid")])
    }

    @Test func documentsAreBounded() throws {
        func problem(_ text: String) -> String? {
            do { _ = try JWKSet.parse(Array(text.utf8)); return nil } catch { return error.reason }
        }
        let key = TestJWT.ec(kid: "k", tag: 1)
        let hundred = (0..<100).map { TestJWT.ec(kid: "k\($0)", tag: UInt8($0)) }.joined(separator: ",")
        #expect(problem(#"{"keys":[\#(hundred)]}"#) == nil)
        #expect(try Self.parse(#"{"keys":[\#(hundred)]}"#).keys.count == 100)
        #expect(problem(#"{"keys":[\#(hundred),\#(key)]}"#) == "jwks.too_many_keys")
        let padded = #"{"keys":[\#(key)]}"# + String(repeating: " ", count: JWKSet.maxDocumentBytes)
        #expect(problem(padded) == "jwks.too_large")
        #expect(problem(#"{"keys":{}}"#) == "jwks.malformed")
        #expect(problem(#"[]"#) == "jwks.malformed")
        #expect(problem(#"{"keys":[]"#) == "jwks.malformed")
        #expect(problem(#"{"keys":[],"keys":[]}"#) == "jwks.malformed")
        #expect(problem(String(repeating: "[", count: 20) + String(repeating: "]", count: 20)) == "jwks.malformed")
        // A document without one usable key does not make a key set.
        #expect(throws: JWKSet.Problem.self) { try JWKSet(parsing: Array(#"{"keys":[]}"#.utf8), crypto: DigestCrypto()) }
        #expect(throws: JWKSet.Problem.self) {
            try JWKSet(parsing: Array(#"{"keys":[{"kty":"oct","k":"AA"}]}"#.utf8), crypto: DigestCrypto())
        }
    }

    @Test func importFailuresAreSkippedToo() throws {
        struct PickyCrypto: CallerJWTCrypto {
            func publicKey(for jwk: JWK) -> Result<any CallerJWTPublicKey, JWKSet.Skip> {
                if case .ec = jwk.material { return .failure(JWKSet.Skip(index: 0, keyID: jwk.keyID, reason: "point not on the curve")) }
                return DigestCrypto().publicKey(for: jwk)
            }
        }
        let set = try JWKSet(parsing: Array(#"{"keys":[\#(TestJWT.ec(kid: "e", tag: 1)),\#(TestJWT.rsa(kid: "r", tag: 2))]}"#.utf8),
                             crypto: PickyCrypto())
        #expect(set.keys.map(\.jwk.keyID) == ["r"])
        #expect(set.skipped == [JWKSet.Skip(index: 0, keyID: "e", reason: "point not on the curve")])
        #expect(!set.contains(keyID: "e") && set.contains(keyID: "r"))
        // Skip reasons are log-safe even for a hostile kid.
        let skip = JWKSet.Skip(index: 3, keyID: "a\u{1B}[31m\n" + String(repeating: "x", count: 100), reason: "r")
        #expect(skip.keyID?.count == 64)
        #expect(skip.description.unicodeScalars.allSatisfy { $0.value >= 0x20 && $0.value < 0x7F })
    }

    // MARK: - Re-fetch rule

    static func at(_ seconds: Double) -> MonotonicInstant { .seconds(seconds) }

    static func keys(_ kids: String...) throws -> JWKSet {
        try JWKSet(parsing: Array(#"{"keys":[\#(kids.enumerated().map { TestJWT.rsa(kid: $1, tag: UInt8($0)) }.joined(separator: ","))]}"#.utf8),
                   crypto: DigestCrypto())
    }

    static func advice(_ selection: CallerJWTKeySet.Selection) -> CallerJWTKeySet.FetchAdvice? {
        if case .unknown(let advice) = selection { return advice }
        return nil
    }

    @Test func anUnknownKidFetchesAtMostOnceEveryThirtySeconds() throws {
        var set = CallerJWTKeySet()
        #expect(!set.hasKeys)
        // Start-up: the scheduled fetch.
        #expect(set.startScheduledFetch(now: Self.at(100)) == true)
        #expect(set.isFetching)
        #expect(Self.advice(set.select(keyID: "k1", algorithm: .RS256, now: Self.at(100))) == .waitForFetch)
        set.fetchSucceeded(try Self.keys("k1"), now: Self.at(101))
        guard case .keys(let found) = set.select(keyID: "k1", algorithm: .RS256, now: Self.at(102)) else {
            Issue.record("k1 not found"); return
        }
        #expect(found.count == 1)
        // A rotated kid within 30 s of the last fetch start: refused, no fetch.
        #expect(Self.advice(set.select(keyID: "k2", algorithm: .RS256, now: Self.at(110))) == .refuse(until: Self.at(130)))
        #expect(!set.isFetching)
        // From 30 s on: one fetch; everyone else waits for it.
        #expect(Self.advice(set.select(keyID: "k2", algorithm: .RS256, now: Self.at(130))) == .fetchNow)
        #expect(Self.advice(set.select(keyID: "k2", algorithm: .RS256, now: Self.at(130.5))) == .waitForFetch)
        #expect(Self.advice(set.select(keyID: "random", algorithm: .RS256, now: Self.at(131))) == .waitForFetch)
        set.fetchSucceeded(try Self.keys("k1", "k2"), now: Self.at(132))
        guard case .keys = set.select(keyID: "k2", algorithm: .RS256, now: Self.at(132)) else { Issue.record("k2 not found"); return }
        // A storm of random kids costs one fetch per 30 s.
        var fetches = 0
        for i in 0..<600 {
            let now = Self.at(132 + Double(i) * 0.5)
            if Self.advice(set.select(keyID: "attacker-\(i)", algorithm: .RS256, now: now)) == .fetchNow {
                fetches += 1
                set.fetchSucceeded(try Self.keys("k1", "k2"), now: now)
            }
        }
        #expect(fetches == 10)  // 300 s from t=132: at 160, 190, ..., 430
        // A known kid bound to another algorithm is no rotation: refused without a fetch.
        let far = Self.at(10_000)
        #expect(Self.advice(set.select(keyID: "k1", algorithm: .ES256, now: far)) == .refuse(until: far))
        #expect(!set.isFetching)
    }

    @Test func aFailedFetchKeepsTheOldKeys() throws {
        var set = CallerJWTKeySet()
        #expect(set.startScheduledFetch(now: Self.at(0)) == true)
        set.fetchFailed(now: Self.at(1))
        #expect(!set.hasKeys && set.consecutiveFailures == 1)
        // Nothing yet, and no new fetch before 30 s.
        #expect(set.startScheduledFetch(now: Self.at(10)) == false)
        #expect(Self.advice(set.select(keyID: nil, algorithm: .RS256, now: Self.at(10))) == .refuse(until: Self.at(30)))
        #expect(set.startScheduledFetch(now: Self.at(30)) == true)
        set.fetchSucceeded(try Self.keys("k1"), now: Self.at(31))
        #expect(set.hasKeys && set.consecutiveFailures == 0)
        // A later fetch fails (IdP down, or a document without a usable key): k1 still verifies.
        #expect(Self.advice(set.select(keyID: "k9", algorithm: .RS256, now: Self.at(100))) == .fetchNow)
        set.fetchFailed(now: Self.at(101))
        guard case .keys = set.select(keyID: "k1", algorithm: .RS256, now: Self.at(102)) else { Issue.record("k1 lost"); return }
        #expect(set.loadedAt == Self.at(31))
    }

    @Test func theKeysAreRefreshedOnSchedule() throws {
        var set = CallerJWTKeySet(refreshInterval: .seconds(600))
        #expect(set.startScheduledFetch(now: Self.at(0)) == true)
        #expect(set.startScheduledFetch(now: Self.at(0)) == false)   // one in flight
        set.fetchSucceeded(try Self.keys("k1"), now: Self.at(1))
        #expect(set.startScheduledFetch(now: Self.at(600)) == false)
        #expect(set.startScheduledFetch(now: Self.at(601)) == true)
        set.fetchSucceeded(try Self.keys("k2"), now: Self.at(602))
        #expect(Self.advice(set.select(keyID: "k1", algorithm: .RS256, now: Self.at(603))) == .refuse(until: Self.at(631)))
        // The interval has a floor of 30 s.
        #expect(CallerJWTKeySet(refreshInterval: .seconds(1)).refreshInterval == .seconds(30))
    }

    @Test func theVerdictTellsTheDriverWhatToDo() throws {
        let policy = CallerJWTTests.policy, wall = CallerJWTTests.now
        let k1 = TestJWT.token(header: #"{"alg":"RS256","kid":"k1"}"#, claims: CallerJWTTests.claims(), tag: 1)
        let k2 = TestJWT.token(header: #"{"alg":"RS256","kid":"k2"}"#, claims: CallerJWTTests.claims(), tag: 2)
        var set = CallerJWTKeySet()
        // First request before any key: fetch, and a second one waits for that fetch.
        #expect(set.validate(k1, policy: policy, now: Self.at(0), wallClockNow: wall) == .fetchKeysAndRetry)
        #expect(set.validate(k1, policy: policy, now: Self.at(0), wallClockNow: wall) == .waitForKeysAndRetry)
        set.fetchFailed(now: Self.at(1))
        // The IdP is down and no key was ever obtained: not the caller's fault.
        #expect(set.validate(k1, policy: policy, now: Self.at(2), wallClockNow: wall) == .keysUnavailable)
        #expect(set.validate(k1, policy: policy, now: Self.at(30), wallClockNow: wall) == .fetchKeysAndRetry)
        set.fetchSucceeded(try TestJWT.set(TestJWT.rsa(kid: "k1", tag: 1)), now: Self.at(31))
        guard case .valid(let v) = set.validate(k1, policy: policy, now: Self.at(31), wallClockNow: wall) else { Issue.record("k1"); return }
        #expect(v.keyID == "k1")
        // Rotation: k2 appears at the IdP; one fetch, then the retry succeeds.
        #expect(set.validate(k2, policy: policy, now: Self.at(60), wallClockNow: wall) == .fetchKeysAndRetry)
        set.fetchSucceeded(try TestJWT.set(TestJWT.rsa(kid: "k1", tag: 1), TestJWT.rsa(kid: "k2", tag: 2)), now: Self.at(61))
        guard case .valid = set.validate(k2, policy: policy, now: Self.at(61), wallClockNow: wall) else { Issue.record("k2"); return }
        // A kid the IdP does not have: after the retry the answer is final (no second fetch).
        let k3 = TestJWT.token(header: #"{"alg":"RS256","kid":"k3"}"#, claims: CallerJWTTests.claims(), tag: 3)
        #expect(set.validate(k3, policy: policy, now: Self.at(100), wallClockNow: wall) == .fetchKeysAndRetry)
        set.fetchSucceeded(try TestJWT.set(TestJWT.rsa(kid: "k1", tag: 1), TestJWT.rsa(kid: "k2", tag: 2)), now: Self.at(101))
        #expect(set.validate(k3, policy: policy, now: Self.at(101), wallClockNow: wall) == .invalid(.unknownKey))
        // Failures that are not about keys never fetch.
        #expect(set.validate("not-a-jwt", policy: policy, now: Self.at(200), wallClockNow: wall) == .invalid(.malformed))
        let forged = TestJWT.token(header: #"{"alg":"RS256","kid":"k1"}"#, claims: CallerJWTTests.claims(), tag: 2)
        #expect(set.validate(forged, policy: policy, now: Self.at(200), wallClockNow: wall) == .invalid(.badSignature))
        #expect(!set.isFetching)
    }

    @Test func aFetchedKeySetValidatesThroughSelectAndVerify() throws {
        var set = CallerJWTKeySet()
        _ = set.startScheduledFetch(now: Self.at(0))
        set.fetchSucceeded(try TestJWT.set(TestJWT.rsa(kid: "k1", tag: 1)), now: Self.at(0))
        let token = TestJWT.token(header: #"{"alg":"RS256","kid":"k1"}"#, claims: CallerJWTTests.claims(), tag: 1)
        let jws = try CallerJWT.parse(token)
        guard case .keys(let candidates) = set.select(keyID: jws.keyID, algorithm: jws.algorithm, now: Self.at(1)) else {
            Issue.record("no keys"); return
        }
        let validated = try CallerJWT.verify(jws, candidates: candidates, policy: CallerJWTTests.policy, wallClockNow: CallerJWTTests.now)
        #expect(validated.expiresAt == 1_800_000_600)
    }
}
