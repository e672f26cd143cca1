// libFuzzer entry for the OAuth core's parsers of untrusted input (compiled by Tests/Fuzz/run.sh
// together with Sources/BearerdOAuth): token endpoint responses (JSON, RFC 6749 §5.1/§5.2),
// WWW-Authenticate (RFC 6750 §3), Retry-After, credential files' JWTs (unverified claims, extreme
// `exp` values) and DPoP nonces. Oracle: no crash, no trap, no hang.

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzOAuth(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size >= 1 else { return 0 }
    let control = data[0]
    let bytes = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    let text = String(decoding: bytes, as: UTF8.self)
    switch control % 5 {
    case 0:
        _ = try? JSONParser().parse(bytes)
    case 1:
        let status = [200, 400, 401, 429, 503][Int(control >> 2) % 5]
        _ = TokenResponseParser(defaultLifetime: .seconds(300)).parse(status: status, headers: [(name: "Retry-After", value: "7")], body: bytes,
                                                           wallClockNow: 1_800_000_000)
    case 2:
        _ = try? WWWAuthenticate.parse(text)
        _ = ReplayPolicy.challengesBlameToken([text])
    case 3:
        _ = RetryAfter.parse(text, wallClockNow: 1_800_000_000)
    default:
        // Clock extremes as well as a plausible now: the expiry arithmetic must saturate.
        let now: Int64 = [1_800_000_000, .max, .min, 0][Int(control >> 3) % 4]
        _ = CredentialJWT.problem(content: text, wallClockNow: now)
        _ = DPoP.acceptableNonce(text)
        if let challenges = try? WWWAuthenticate.parse(text) { _ = DPoP.asksForNonce(challenges) }
    }
    return 0
}
