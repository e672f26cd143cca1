import Testing
@testable import BearerdOAuth

/// A stand-in for OpenSSL in the pure core's tests: a "signature" is SHA-256(tag || input) twice
/// (64 bytes, the ECDSA/EdDSA length), so a test can sign for one key and not another. The real
/// verification is checked against PyJWT's signatures in BearerdSessionsTests/CallerJWTVectorTests.
final class DigestKey: CallerJWTPublicKey {
    let tag: UInt8
    init(_ tag: UInt8) { self.tag = tag }

    static func sign(_ input: [UInt8], tag: UInt8) -> [UInt8] {
        SHA256.hash([tag] + input) + SHA256.hash([tag, 1] + input)
    }

    func verify(_ algorithm: CallerJWT.Algorithm, signingInput: [UInt8], signature: [UInt8]) -> Bool {
        signature == Self.sign(signingInput, tag: tag)
    }
}

/// Imports every JWK as a `DigestKey` tagged with the first byte of its numbers.
struct DigestCrypto: CallerJWTCrypto {
    func publicKey(for jwk: JWK) -> Result<any CallerJWTPublicKey, JWKSet.Skip> {
        switch jwk.material {
        case .rsa(let n, _): .success(DigestKey(n[n.count - 1]))
        case .ec(_, let x, _): .success(DigestKey(x[0]))
        case .ed25519(let x): .success(DigestKey(x[0]))
        }
    }
}

enum TestJWT {
    static func part(_ json: String) -> String { Base64.encodeURL(Array(json.utf8)) }

    /// A compact JWS with `header` and `claims` (JSON text) signed by the `DigestKey` `tag`.
    static func token(header: String, claims: String, tag: UInt8) -> String {
        let input = part(header) + "." + part(claims)
        return input + "." + Base64.encodeURL(DigestKey.sign(Array(input.utf8), tag: tag))
    }

    /// An RSA JWK of 2048 bits whose modulus ends in `tag`.
    static func rsa(kid: String?, tag: UInt8, alg: String? = nil) -> String {
        var n = [UInt8](repeating: 0xC3, count: 256)
        n[255] = tag
        var members = [#""kty":"RSA""#, #""e":"AQAB""#, #""n":"\#(Base64.encodeURL(n))""#]
        if let kid { members.append(#""kid":"\#(kid)""#) }
        if let alg { members.append(#""alg":"\#(alg)""#) }
        return "{" + members.joined(separator: ",") + "}"
    }

    static func ec(kid: String, tag: UInt8, crv: String = "P-256") -> String {
        let length = crv == "P-384" ? 48 : 32
        var x = [UInt8](repeating: 7, count: length)
        x[0] = tag
        let y = [UInt8](repeating: 9, count: length)
        return #"{"kty":"EC","crv":"\#(crv)","kid":"\#(kid)","x":"\#(Base64.encodeURL(x))","y":"\#(Base64.encodeURL(y))"}"#
    }

    static func set(_ keys: String...) throws -> JWKSet {
        try JWKSet(parsing: Array(#"{"keys":[\#(keys.joined(separator: ","))]}"#.utf8), crypto: DigestCrypto())
    }
}

@Suite struct CallerJWTTests {
    static let now: Int64 = 1_800_000_000
    static let policy = CallerJWT.Policy(issuer: "https://login.example.com", audience: "bearerd")

    static func claims(iss: String = "https://login.example.com", aud: String = #""bearerd""#, exp: String? = "1800000600",
                       extra: String = "") -> String {
        var members = [#""iss":"\#(iss)""#, #""aud":\#(aud)"#, #""sub":"alice""#]
        if let exp { members.append(#""exp":\#(exp)"#) }
        if !extra.isEmpty { members.append(extra) }
        return "{" + members.joined(separator: ",") + "}"
    }

    static func validate(_ token: String, keys: JWKSet, policy: CallerJWT.Policy = policy, now: Int64 = now) -> Result<CallerJWT.Validated, CallerJWT.Failure> {
        do { return .success(try CallerJWT.validate(token, keys: keys, policy: policy, wallClockNow: now)) } catch { return .failure(error) }
    }

    static func verdict(_ token: String, keys: JWKSet, policy: CallerJWT.Policy = policy, now: Int64 = now) -> String {
        switch validate(token, keys: keys, policy: policy, now: now) {
        case .success: "ok"
        case .failure(let f): f.reason
        }
    }

    @Test func aValidTokenPassesAndReportsItsExpiry() throws {
        let keys = try TestJWT.set(TestJWT.rsa(kid: "k1", tag: 1))
        let token = TestJWT.token(header: #"{"alg":"RS256","kid":"k1"}"#, claims: Self.claims(), tag: 1)
        let validated = try Self.validate(token, keys: keys).get()
        #expect(validated.expiresAt == 1_800_000_600)
        #expect(validated.subject == "alice")
        #expect(validated.keyID == "k1")
        #expect(validated.algorithm == .RS256)
    }

    @Test func theIssuerMustBeIdentical() throws {
        let keys = try TestJWT.set(TestJWT.rsa(kid: "k1", tag: 1))
        for iss in ["https://login.example.com/", "https://LOGIN.example.com", "https://login.example.co", ""] {
            let token = TestJWT.token(header: #"{"alg":"RS256","kid":"k1"}"#, claims: Self.claims(iss: iss), tag: 1)
            #expect(Self.verdict(token, keys: keys) == "caller_jwt.wrong_issuer", "\(iss)")
        }
        let noIss = TestJWT.token(header: #"{"alg":"RS256","kid":"k1"}"#, claims: #"{"aud":"bearerd","exp":1800000600}"#, tag: 1)
        #expect(Self.verdict(noIss, keys: keys) == "caller_jwt.wrong_issuer")
        let numericIss = TestJWT.token(header: #"{"alg":"RS256","kid":"k1"}"#, claims: #"{"iss":1,"aud":"bearerd","exp":1800000600}"#, tag: 1)
        #expect(Self.verdict(numericIss, keys: keys) == "caller_jwt.wrong_issuer")
    }

    @Test func theAudienceIsAStringOrAnArrayThatContainsIt() throws {
        let keys = try TestJWT.set(TestJWT.rsa(kid: "k1", tag: 1))
        let cases: [(String, String)] = [
            (#""bearerd""#, "ok"), (#"["x","bearerd"]"#, "ok"), (#""Bearerd""#, "caller_jwt.wrong_audience"),
            (#"["x","y"]"#, "caller_jwt.wrong_audience"), (#"[]"#, "caller_jwt.wrong_audience"),
            (#"[["bearerd"]]"#, "caller_jwt.wrong_audience"), (#"null"#, "caller_jwt.wrong_audience"),
            (#""bearerd ""#, "caller_jwt.wrong_audience"),
        ]
        for (aud, expected) in cases {
            let token = TestJWT.token(header: #"{"alg":"RS256","kid":"k1"}"#, claims: Self.claims(aud: aud), tag: 1)
            #expect(Self.verdict(token, keys: keys) == expected, "aud \(aud)")
        }
    }

    @Test func expiryNotBeforeAndIssuedAtUseTheLeeway() throws {
        let keys = try TestJWT.set(TestJWT.rsa(kid: "k1", tag: 1))
        func verdict(_ claims: String, leeway: Int64 = 60) -> String {
            let token = TestJWT.token(header: #"{"alg":"RS256","kid":"k1"}"#, claims: claims, tag: 1)
            let policy = CallerJWT.Policy(issuer: Self.policy.issuer, audience: Self.policy.audience, leewaySeconds: leeway)
            return Self.verdict(token, keys: keys, policy: policy)
        }
        // exp: refused on or after exp + leeway (RFC 7519 §4.1.4).
        #expect(verdict(Self.claims(exp: "1799999941")) == "ok")
        #expect(verdict(Self.claims(exp: "1799999940")) == "caller_jwt.expired")
        #expect(verdict(Self.claims(exp: "1800000000"), leeway: 0) == "caller_jwt.expired")
        #expect(verdict(Self.claims(exp: "1800000001"), leeway: 0) == "ok")
        #expect(verdict(Self.claims(exp: nil)) == "caller_jwt.expired")
        #expect(verdict(Self.claims(exp: "1800000600.75")) == "ok")
        #expect(verdict(Self.claims(exp: "1.8000006e9")) == "ok")
        #expect(verdict(Self.claims(exp: "-1")) == "caller_jwt.expired")
        #expect(verdict(Self.claims(exp: "1e400")) == "ok")  // saturates at Int64.max
        #expect(verdict(Self.claims(exp: #""1800000600""#)) == "caller_jwt.malformed")
        #expect(verdict(Self.claims(exp: "true")) == "caller_jwt.malformed")
        // nbf and iat: refused when beyond now + leeway.
        #expect(verdict(Self.claims(extra: #""nbf":1800000060"#)) == "ok")
        #expect(verdict(Self.claims(extra: #""nbf":1800000061"#)) == "caller_jwt.not_yet_valid")
        #expect(verdict(Self.claims(extra: #""iat":1800000060"#)) == "ok")
        #expect(verdict(Self.claims(extra: #""iat":1800000061"#)) == "caller_jwt.not_yet_valid")
        #expect(verdict(Self.claims(extra: #""nbf":"soon""#)) == "caller_jwt.malformed")
        // A negative leeway is taken as zero.
        #expect(CallerJWT.Policy(issuer: "i", audience: "a", leewaySeconds: -5).leewaySeconds == 0)
        // Extreme clocks saturate instead of trapping.
        let token = TestJWT.token(header: #"{"alg":"RS256","kid":"k1"}"#, claims: Self.claims(exp: "9223372036854775807"), tag: 1)
        #expect(Self.verdict(token, keys: keys, now: .max) == "caller_jwt.expired")
        #expect(Self.verdict(token, keys: keys, now: .min) == "ok")
    }

    @Test func onlyTheAsymmetricAlgorithmsAreAccepted() throws {
        let keys = try TestJWT.set(TestJWT.rsa(kid: "k1", tag: 1))
        for alg in ["none", "None", "HS256", "HS384", "HS512", "ES512", "RS1", "rs256", "", "ES256K", "Ed25519"] {
            let token = TestJWT.token(header: #"{"alg":"\#(alg)","kid":"k1"}"#, claims: Self.claims(), tag: 1)
            #expect(Self.verdict(token, keys: keys) == "caller_jwt.unsupported_algorithm", "\(alg)")
        }
        // alg none with an empty signature is refused for its algorithm, not its form.
        let none = TestJWT.part(#"{"alg":"none"}"#) + "." + TestJWT.part(Self.claims()) + "."
        #expect(Self.verdict(none, keys: keys) == "caller_jwt.unsupported_algorithm")
        // The log line names registered algorithms only.
        #expect(CallerJWT.algorithmForLog(none) == "none")
        #expect(CallerJWT.algorithmForLog(TestJWT.token(header: #"{"alg":"HS256"}"#, claims: "{}", tag: 1)) == "HS256")
        #expect(CallerJWT.algorithmForLog(TestJWT.token(header: #"{"alg":"secret-ish"}"#, claims: "{}", tag: 1)) == "other")
        #expect(CallerJWT.algorithmForLog("garbage") == "absent")
        // A missing or non-string alg is malformed.
        #expect(Self.verdict(TestJWT.token(header: #"{"kid":"k1"}"#, claims: Self.claims(), tag: 1), keys: keys) == "caller_jwt.malformed")
        #expect(Self.verdict(TestJWT.token(header: #"{"alg":["RS256"]}"#, claims: Self.claims(), tag: 1), keys: keys) == "caller_jwt.malformed")
    }

    @Test func theCompactFormIsReadStrictly() throws {
        let keys = try TestJWT.set(TestJWT.rsa(kid: "k1", tag: 1))
        let good = TestJWT.token(header: #"{"alg":"RS256","kid":"k1"}"#, claims: Self.claims(), tag: 1)
        #expect(Self.verdict(good, keys: keys) == "ok")
        let parts = good.split(separator: ".").map(String.init)
        let malformed = [
            "", ".", "..", "a.b", parts[0] + "." + parts[1], good + ".x.y", good + ".",
            parts[0] + "=." + parts[1] + "." + parts[2],            // padding
            parts[0] + "." + parts[1] + "." + parts[2] + "=",
            parts[0] + "." + parts[1] + "." + parts[2].dropLast() + "+",  // standard alphabet
            " " + good, good + " ", good + "\n",
            parts[0] + ".." + parts[2],
            TestJWT.part("[]") + "." + parts[1] + "." + parts[2],     // header not an object
            parts[0] + "." + TestJWT.part("\"claims\"") + "." + parts[2],
            parts[0] + "." + TestJWT.part("{\"iss\":1,}") + "." + parts[2],  // not JSON
            TestJWT.token(header: #"{"alg":"RS256","kid":"k1","crit":["b64"],"b64":false}"#, claims: Self.claims(), tag: 1),
            TestJWT.token(header: #"{"alg":"RS256","kid":7}"#, claims: Self.claims(), tag: 1),
            TestJWT.token(header: #"{"alg":"RS256","alg":"RS256"}"#, claims: Self.claims(), tag: 1),  // duplicate member
            String(repeating: "a", count: CallerJWT.maxTokenBytes + 1),
        ]
        for token in malformed {
            #expect(Self.verdict(token, keys: keys) == "caller_jwt.malformed", "\(token.prefix(80))")
        }
        // A non-canonical last character (non-zero trailing bits) is not the same signature.
        let last = parts[2].last!
        let twin = parts[2].dropLast() + String(last == "A" ? "B" : "A")
        #expect(Self.verdict(parts[0] + "." + parts[1] + "." + twin, keys: keys) != "ok")
    }

    @Test func signaturesAndKeysAreMatchedByKidAndAlgorithm() throws {
        let keys = try TestJWT.set(TestJWT.rsa(kid: "r1", tag: 1), TestJWT.rsa(kid: "r2", tag: 2, alg: "PS256"),
                                   TestJWT.ec(kid: "e1", tag: 3), TestJWT.ec(kid: "e384", tag: 4, crv: "P-384"))
        func verdict(_ header: String, _ tag: UInt8) -> String {
            Self.verdict(TestJWT.token(header: header, claims: Self.claims(), tag: tag), keys: keys)
        }
        #expect(verdict(#"{"alg":"RS256","kid":"r1"}"#, 1) == "ok")
        #expect(verdict(#"{"alg":"RS256","kid":"r1"}"#, 2) == "caller_jwt.bad_signature")
        #expect(verdict(#"{"alg":"RS256","kid":"r2"}"#, 2) == "caller_jwt.unknown_key")   // r2 is PS256 only
        #expect(verdict(#"{"alg":"PS256","kid":"r2"}"#, 2) == "ok")
        #expect(verdict(#"{"alg":"ES256","kid":"e1"}"#, 3) == "ok")
        #expect(verdict(#"{"alg":"ES384","kid":"e1"}"#, 3) == "caller_jwt.unknown_key")   // P-256 key
        #expect(verdict(#"{"alg":"ES384","kid":"e384"}"#, 4) == "caller_jwt.bad_signature")  // 64 bytes, not 96
        #expect(verdict(#"{"alg":"ES256","kid":"r1"}"#, 3) == "caller_jwt.unknown_key")   // RSA key
        #expect(verdict(#"{"alg":"RS256","kid":"nope"}"#, 1) == "caller_jwt.unknown_key")
        #expect(verdict(#"{"alg":"EdDSA","kid":"e1"}"#, 3) == "caller_jwt.unknown_key")
        // Without kid: every key that accepts the algorithm is tried.
        #expect(verdict(#"{"alg":"RS256"}"#, 1) == "ok")
        #expect(verdict(#"{"alg":"PS256"}"#, 2) == "ok")
        #expect(verdict(#"{"alg":"PS256"}"#, 1) == "ok")   // r1 has no alg of its own: PS256 too
        #expect(verdict(#"{"alg":"ES256"}"#, 4) == "caller_jwt.bad_signature")
        #expect(verdict(#"{"alg":"EdDSA"}"#, 3) == "caller_jwt.unknown_key")
        // A kid the set does not have falls back to the set's keys without a kid (IdPs that
        // publish none), never to keys that have another kid.
        let kidless = try TestJWT.set(TestJWT.rsa(kid: nil, tag: 5), TestJWT.rsa(kid: "r1", tag: 1))
        #expect(Self.verdict(TestJWT.token(header: #"{"alg":"RS256","kid":"any"}"#, claims: Self.claims(), tag: 5), keys: kidless) == "ok")
        #expect(Self.verdict(TestJWT.token(header: #"{"alg":"RS256","kid":"any"}"#, claims: Self.claims(), tag: 1), keys: kidless)
                == "caller_jwt.bad_signature")
        #expect(Self.verdict(TestJWT.token(header: #"{"alg":"RS256","kid":"any"}"#, claims: Self.claims(), tag: 1), keys: keys)
                == "caller_jwt.unknown_key")
        // The signature is checked before the claims: a forged token learns nothing about them.
        let forged = TestJWT.token(header: #"{"alg":"RS256","kid":"r1"}"#, claims: Self.claims(iss: "x", exp: "1"), tag: 9)
        #expect(Self.verdict(forged, keys: keys) == "caller_jwt.bad_signature")
        #expect(Self.verdict(TestJWT.token(header: #"{"alg":"RS256"}"#, claims: Self.claims(), tag: 1), keys: JWKSet())
                == "caller_jwt.unknown_key")
    }

    @Test func failureTextsAreStableAndSafeInAHeader() {
        var reasons: Set<String> = []
        for failure in CallerJWT.Failure.allCases {
            reasons.insert(failure.reason)
            #expect(failure.reason.hasPrefix("caller_jwt."))
            // RFC 6750 §3: error_description is %x20-21 / %x23-5B / %x5D-7E.
            #expect(failure.description.unicodeScalars.allSatisfy { $0.value >= 0x20 && $0.value < 0x7F && $0 != "\"" && $0 != "\\" })
        }
        #expect(reasons.count == 8)
    }

    @Test func theCallerTokenBoundsTheLifeOfWhatIsExchangedForIt() {
        let token = TestJWT.token(header: #"{"alg":"RS256"}"#, claims: #"{"exp":1800000300}"#, tag: 1)
        #expect(CallerJWT.allowedLifetime(token: token, wallClockNow: Self.now) == .seconds(300))
        #expect(CallerJWT.allowedLifetime(token: token, wallClockNow: Self.now + 400) == .zero)
        #expect(CallerJWT.allowedLifetime(token: "opaque-token", wallClockNow: Self.now) == nil)
        #expect(CallerJWT.allowedLifetime(token: TestJWT.token(header: #"{"alg":"RS256"}"#, claims: "{}", tag: 1), wallClockNow: Self.now) == nil)
        #expect(CallerJWT.lifetime(until: .max, wallClockNow: .min) == .seconds(Int64.max))
        #expect(CallerJWT.lifetime(until: .min, wallClockNow: .max) == .zero)
    }
}
