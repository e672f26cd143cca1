import BearerdOAuth
import BearerdTLS
import BearerdTestSupport
import Foundation
import Testing
@testable import BearerdSessions

/// Caller JWT validation with OpenSSL against tokens signed by an independent implementation:
/// `Tests/Fixtures/caller_jwt_vectors.py` (PyJWT on pyca/cryptography, keys generated per run)
/// emits a JWK Set and tokens for every algorithm bearerd verifies, forgeries (tampered claims and
/// signatures, `alg: none`, HS256 keyed with the RSA public key, a PSS signature under an RS256
/// header, DER instead of `r || s`), wrong `iss`/`aud`, expiry and unknown keys; every verdict
/// must match. Plus the RFCs' own known answers (RFC 8037 §A.4, RFC 7515 §A.3).
@Suite struct CallerJWTVectorTests {
    static let missing = PythonFixture.unavailable(modules: ["jwt", "cryptography"])

    struct Vectors {
        var now: Int64
        var policy: CallerJWT.Policy
        var jwks: [UInt8]
        var vectors: [(name: String, token: String, expect: String, exp: Int64?)]
    }

    static func loadVectors() throws -> Vectors {
        let output = try PythonFixture.runClient(script: "caller_jwt_vectors.py", arguments: [])
        let object = try #require(try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: Any])
        let now = try #require((object["now"] as? NSNumber)?.int64Value)
        let policy = CallerJWT.Policy(issuer: try #require(object["issuer"] as? String), audience: try #require(object["audience"] as? String),
                                      leewaySeconds: try #require((object["leeway"] as? NSNumber)?.int64Value))
        let jwks = try JSONSerialization.data(withJSONObject: try #require(object["jwks"]))
        let list = try #require(object["vectors"] as? [[String: Any]])
        let vectors = try list.map { v in
            (name: try #require(v["name"] as? String), token: try #require(v["token"] as? String),
             expect: try #require(v["expect"] as? String), exp: (v["exp"] as? NSNumber)?.int64Value)
        }
        return Vectors(now: now, policy: policy, jwks: Array(jwks), vectors: vectors)
    }

    @Test(.enabled(if: Prerequisite.runs(missing == nil), "PyJWT and cryptography in the tests' venv"))
    func everyVerdictMatchesPyJWTsVectors() throws {
        try Prerequisite.require(Self.missing == nil, "PyJWT and cryptography in the tests' venv (Tests/Fixtures/requirements.txt)")
        let v = try Self.loadVectors()
        let keys = try JWKSet(parsing: v.jwks, crypto: OpenSSLCallerJWTCrypto())
        #expect(keys.keys.compactMap(\.jwk.keyID) == ["rsa1", "rsa3072", "ec256", "ec384", "ed1"])
        #expect(keys.skipped.map(\.keyID) == ["weak", "enc1", "hmac1"])
        #expect(keys.skipped.map(\.reason) == ["RSA modulus of 1024 bits, under 2048", "use enc, not sig", "a symmetric key"])
        #expect(v.vectors.count >= 50)
        var accepted = 0
        for vector in v.vectors {
            let verdict: String
            do {
                let validated = try CallerJWT.validate(vector.token, keys: keys, policy: v.policy, wallClockNow: v.now)
                verdict = "ok"
                #expect(validated.expiresAt == vector.exp, "\(vector.name)")
                #expect(validated.subject == "alice", "\(vector.name)")
                accepted += 1
            } catch {
                verdict = error.reason
            }
            #expect(verdict == vector.expect, "\(vector.name)")
        }
        #expect(accepted == v.vectors.filter { $0.expect == "ok" }.count)
        #expect(accepted == 13)
    }

    @Test(.enabled(if: Prerequisite.runs(missing == nil), "PyJWT and cryptography in the tests' venv"))
    func theSameTokensThroughAFetchedKeySet() throws {
        try Prerequisite.require(Self.missing == nil, "PyJWT and cryptography in the tests' venv (Tests/Fixtures/requirements.txt)")
        let v = try Self.loadVectors()
        var set = CallerJWTKeySet()
        let t0 = MonotonicInstant.seconds(1000)
        #expect(set.startScheduledFetch(now: t0) == true)
        set.fetchSucceeded(try JWKSet(parsing: v.jwks, crypto: OpenSSLCallerJWTCrypto()), now: t0)
        for vector in v.vectors where vector.expect == "ok" {
            let jws = try CallerJWT.parse(vector.token)
            guard case .keys(let candidates) = set.select(keyID: jws.keyID, algorithm: jws.algorithm, now: t0) else {
                Issue.record("\(vector.name): no key"); continue
            }
            #expect(throws: Never.self, "\(vector.name)") {
                try CallerJWT.verify(jws, candidates: candidates, policy: v.policy, wallClockNow: v.now)
            }
        }
        // The unknown kid asks for a re-fetch (the IdP rotated), once.
        let rotated = try #require(v.vectors.first { $0.name == "kid not in the set" })
        let jws = try CallerJWT.parse(rotated.token)
        guard case .unknown(.fetchNow) = set.select(keyID: jws.keyID, algorithm: jws.algorithm, now: t0 + .seconds(30)) else {
            Issue.record("no re-fetch"); return
        }
        guard case .unknown(.waitForFetch) = set.select(keyID: jws.keyID, algorithm: jws.algorithm, now: t0 + .seconds(31)) else {
            Issue.record("a second fetch"); return
        }
    }

    /// RFC 8037 §A.2–A.4: the Ed25519 public key and the signature of "Example of Ed25519 signing".
    @Test func rfc8037Ed25519KnownAnswer() throws {
        let jwks = #"{"keys":[{"kty":"OKP","crv":"Ed25519","x":"11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]}"#
        let keys = try JWKSet(parsing: Array(jwks.utf8), crypto: OpenSSLCallerJWTCrypto())
        let input = "eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc"
        let signature = try #require(Base64.decodeURL("hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg"))
        let key = try #require(keys.keys.first).publicKey
        #expect(key.verify(.EdDSA, signingInput: Array(input.utf8), signature: signature))
        var flipped = signature
        flipped[0] ^= 1
        #expect(!key.verify(.EdDSA, signingInput: Array(input.utf8), signature: flipped))
        #expect(!key.verify(.EdDSA, signingInput: Array((input + "x").utf8), signature: signature))
        #expect(!key.verify(.ES256, signingInput: Array(input.utf8), signature: signature))
    }

    /// RFC 7515 §A.3: ES256 with the JOSE `r || s` signature.
    @Test func rfc7515ES256KnownAnswer() throws {
        let key = try JWKPublicKey(.ec(curve: "P-256", x: try #require(Base64.decodeURL("f83OJ3D2xF1Bg8vub9tLe1gHMzV76e8Tus9uPHvRVEU")),
                                       y: try #require(Base64.decodeURL("x_FEzRu9m36HLN_tue659LNpXW6pCyStikYjKIWI5a0"))))
        let input = "eyJhbGciOiJFUzI1NiJ9.eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFtcGxlLmNvbS9pc19yb290Ijp0cnVlfQ"
        let signature = try #require(Base64.decodeURL("DtEhU3ljbEg8L38VWAfUAqOyKAM6-Xx-F4GawxaepmXFCgfTjDxw5djxLa8ISlSApmWQxfKTUJqPP3-Kg6NU1Q"))
        #expect(key.verify(algorithm: "ES256", signingInput: Array(input.utf8), signature: signature))
        #expect(!key.verify(algorithm: "ES384", signingInput: Array(input.utf8), signature: signature))
        #expect(!key.verify(algorithm: "ES256", signingInput: Array(input.utf8), signature: Array(signature.prefix(63))))
        // s replaced by n - s (the other valid-looking half) must fail: only the exact signature verifies.
        var swapped = Array(signature[32...]) + Array(signature[..<32])
        #expect(!key.verify(algorithm: "ES256", signingInput: Array(input.utf8), signature: swapped))
        swapped = [UInt8](repeating: 0, count: 64)
        #expect(!key.verify(algorithm: "ES256", signingInput: Array(input.utf8), signature: swapped))
        #expect(key.bits == 256)
    }

    @Test func keysOpenSSLMustRefuse() throws {
        // An RSA modulus under 2048 bits.
        #expect(throws: TLSError.self) { try JWKPublicKey(.rsa(n: [UInt8](repeating: 0xC1, count: 128), e: [1, 0, 1])) }
        let rsa = try JWKPublicKey(.rsa(n: [UInt8](repeating: 0xC1, count: 256), e: [1, 0, 1]))
        #expect(rsa.bits == 2048)
        #expect(!rsa.verify(algorithm: "RS256", signingInput: [1], signature: [UInt8](repeating: 1, count: 256)))
        #expect(!rsa.verify(algorithm: "ES256", signingInput: [1], signature: [UInt8](repeating: 1, count: 64)))
        #expect(!rsa.verify(algorithm: "HS256", signingInput: [1], signature: [UInt8](repeating: 1, count: 32)))
        #expect(!rsa.verify(algorithm: "RS256", signingInput: [1], signature: []))
        // A point that is not on the curve (invalid-curve attacks start here).
        #expect(throws: TLSError.self) { try JWKPublicKey(.ec(curve: "P-256", x: [UInt8](repeating: 5, count: 32), y: [UInt8](repeating: 5, count: 32))) }
        #expect(throws: TLSError.self) { try JWKPublicKey(.ec(curve: "P-521", x: [UInt8](repeating: 5, count: 66), y: [UInt8](repeating: 5, count: 66))) }
        #expect(throws: TLSError.self) { try JWKPublicKey(.ec(curve: "P-256", x: [5], y: [5])) }
        #expect(throws: TLSError.self) { try JWKPublicKey(.ed25519(x: [1, 2, 3])) }
        // Through the crypto adapter the refusal becomes a skip with OpenSSL's reason.
        let skip = OpenSSLCallerJWTCrypto().publicKey(for: JWK(keyID: "bad", material: .ec(curve: .p256, x: [UInt8](repeating: 5, count: 32),
                                                                                          y: [UInt8](repeating: 5, count: 32))))
        guard case .failure(let why) = skip else { Issue.record("accepted a point off the curve"); return }
        #expect(why.keyID == "bad" && !why.reason.isEmpty)
    }
}
