// libFuzzer entry for the on-behalf-of parsers and the per-caller cache (compiled by
// Tests/Fuzz/run.sh together with Sources/BearerdOAuth): caller JWTs (compact JWS, claims with
// extreme clocks), JWK Sets, RFC 9728 protected resource metadata, resource URLs and
// `resource_metadata` challenges. Oracle: no crash, no trap, no hang; and for the cache, driven by
// the input as a sequence of operations, its invariants against a plain model: the size never
// exceeds max_entries, the LRU list holds exactly the entries, and a hit only ever returns the
// token stored for that very caller.

/// Verifies nothing: lets validation reach the claim checks for any signature of 64 bytes.
final class FuzzKey: CallerJWTPublicKey {
    func verify(_ algorithm: CallerJWT.Algorithm, signingInput: [UInt8], signature: [UInt8]) -> Bool { signature.count == 64 }
}

struct FuzzCrypto: CallerJWTCrypto {
    func publicKey(for jwk: JWK) -> Result<any CallerJWTPublicKey, JWKSet.Skip> { .success(FuzzKey()) }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzCaller(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size >= 1 else { return 0 }
    let control = data[0]
    let bytes = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    let text = String(decoding: bytes, as: UTF8.self)
    let now: Int64 = [1_800_000_000, .max, .min, 0][Int(control >> 3) % 4]
    switch control % 5 {
    case 0:
        // A token; when it parses, its claims against a policy with an extreme leeway too.
        _ = CallerJWT.algorithmForLog(text)
        _ = CallerJWT.allowedLifetime(token: text, wallClockNow: now)
        if let jws = try? CallerJWT.parse(text) {
            let leeway: Int64 = control & 0x80 != 0 ? .max : 60
            let policy = CallerJWT.Policy(issuer: "https://login.example.com", audience: "bearerd", leewaySeconds: leeway)
            _ = try? CallerJWT.checkClaims(jws.claims, policy: policy, wallClockNow: now)
            let key = JWKSet.Key(jwk: JWK(keyID: jws.keyID, material: .ed25519(x: [UInt8](repeating: 1, count: 32))), publicKey: FuzzKey())
            _ = try? CallerJWT.verify(jws, candidates: [key], policy: policy, wallClockNow: now)
        }
    case 1:
        // A JWK Set; when it parses, every key against every algorithm.
        if let doc = try? JWKSet.parse(bytes) {
            precondition(doc.keys.count <= JWKSet.maxKeys)
            for key in doc.keys {
                for alg in CallerJWT.Algorithm.allCases { _ = key.accepts(alg) }
                _ = key.rsaModulusBits
            }
            if let set = try? JWKSet(document: doc, crypto: FuzzCrypto()) {
                for alg in CallerJWT.Algorithm.allCases { _ = set.candidates(keyID: doc.keys.first?.keyID, algorithm: alg) }
            }
        }
    case 2:
        // Protected resource metadata, checked against a fixed upstream and allow-list.
        if let meta = try? ProtectedResourceMetadata.parse(bytes) {
            _ = try? meta.check(expectedResource: "https://resource.example.com/api", allowedIssuers: ["https://auth.example.com"])
            _ = ProtectedResourceMetadata.wellKnownURL(resource: meta.resource)
        }
    case 3:
        // URLs and challenges.
        _ = ProtectedResourceMetadata.wellKnownURL(resource: text)
        _ = ProtectedResourceMetadata.resourceMatches(text, expected: "https://Resource.example.com:443/api")
        if let challenges = try? WWWAuthenticate.parse(text) {
            _ = try? ProtectedResourceMetadata.metadataURL(challenges: challenges, resource: "http://127.0.0.1:9000/api")
        }
    default:
        fuzzCache(bytes, maxEntries: Int(control >> 5) + 1)
    }
    return 0
}

/// The 16 callers of `fuzzCache` (hashed once: SHA-256 in plain Swift is slow under ASan).
let fuzzCallers: [CallerKey] = (0..<16).map { CallerKey(callerToken: "caller-\($0)")! }

/// Each byte is one operation on one of 16 callers at a clock that only moves forward. The list
/// walk (O(entries)) runs after every operation for short inputs, once at the end for long ones.
func fuzzCache(_ ops: [UInt8], maxEntries: Int) {
    var cache = CallerTokenCache<Int>(maxEntries: maxEntries)
    var issued: [CallerKey: String] = [:]   // the last token finished for each caller
    var clock: UInt64 = 1_000_000_000
    var serial = 0
    for (n, op) in ops.enumerated() {
        let caller = fuzzCallers[Int(op & 0x0F)]
        clock &+= UInt64(op >> 6) * 2_000_000_000
        let now = MonotonicInstant(nanoseconds: clock)
        switch (op >> 4) & 0x3 {
        case 0, 1:
            switch cache.lookup(caller, now: now, waiter: n) {
            case .hit(let token):
                precondition(issued[caller] == token.exposedValue, "a hit returned another caller's token")
            case .exchange, .joined, .refused:
                break
            }
        case 2:
            serial += 1
            let token = "token-\(op & 0x0F)-\(serial)"
            let outcome: CallerTokenCache<Int>.Outcome = op & 0x80 != 0
                ? .refused(error: "invalid_grant", description: nil)
                : .token(OAuthSecret(token), expiresAt: now + .seconds(Int64(op & 0x07) * 3))
            if case .token = outcome, op & 0x07 != 0 { issued[caller] = token }  // a token dead on arrival is not stored
            _ = cache.finish(caller, outcome: outcome, now: now)
        default:
            if op & 0x80 != 0 { cache.removeExpired(now: now) } else if let t = issued[caller] { cache.invalidate(caller, token: OAuthSecret(t)) }
        }
        precondition(cache.count <= cache.maxEntries, "over max_entries")
        precondition(cache.counters.size == cache.count)
        precondition(cache.slots.count <= cache.maxEntries)
        if ops.count <= 256 { precondition(cache.orderFromMostRecent.count == cache.count, "the LRU list and the index disagree") }
    }
    let order = cache.orderFromMostRecent
    precondition(order.count == cache.count && Set(order).count == order.count && order.allSatisfy(cache.contains), "the LRU list and the index disagree")
}
