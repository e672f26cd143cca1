/// Validation of a caller's JWT (`caller_jwt: { issuer, audience, jwks_url | jwks_file, leeway }`,
/// docs/architecture.md §6.16): a compact JWS (RFC 7515 §7.1) whose
/// signature is checked against the caller IdP's keys (`JWKSet`, `CallerJWTKeySet`) and whose
/// claims (RFC 7519 §4.1) are checked against the configuration, before any exchange.
///
/// Pure: the wall clock is an argument and the signature check comes in through
/// `CallerJWTPublicKey` (OpenSSL's, in the shell). A failure is one of a few reason classes
/// (`CallerJWT.Failure`) whose stable strings go into the 401's `error_description` and the log;
/// nothing of the token itself ever appears in them (not even the `alg` unless it is a
/// registered JWA name).
public enum CallerJWT {
    /// The signature algorithms bearerd verifies (RFC 7518 §3.3–3.5, RFC 8037 §3.1). `none`,
    /// every HMAC algorithm (HS256/384/512: the key would be public, the classic confusion
    /// attack) and everything else is refused before a key is looked at.
    public enum Algorithm: String, Sendable, CaseIterable, Hashable {
        case RS256, RS384, RS512, PS256, PS384, PS512, ES256, ES384, EdDSA

        /// The hash of the signature (EdDSA hashes internally: nil).
        public enum Hash: Sendable, Equatable { case sha256, sha384, sha512 }

        public var hash: Hash? {
            switch self {
            case .RS256, .PS256, .ES256: .sha256
            case .RS384, .PS384, .ES384: .sha384
            case .RS512, .PS512: .sha512
            case .EdDSA: nil
            }
        }

        /// True for RSASSA-PSS (salt length = hash length, MGF1 with the same hash, RFC 7518 §3.5).
        public var isPSS: Bool { self == .PS256 || self == .PS384 || self == .PS512 }

        /// The length of a valid signature when fixed by the algorithm (ECDSA `r || s`, Ed25519),
        /// nil for RSA (the modulus length).
        public var fixedSignatureLength: Int? {
            switch self {
            case .ES256: 64
            case .ES384: 96
            case .EdDSA: 64
            default: nil
            }
        }
    }

    /// Why a caller's token was refused: the reason classes of the 401.
    public enum Failure: Error, Sendable, Equatable, CaseIterable, CustomStringConvertible {
        /// Not a compact JWS: parts, Base64url, JSON, a `crit` header, a missing or ill-typed claim.
        case malformed
        /// `alg` is `none`, an HMAC or anything bearerd does not verify.
        case unsupportedAlgorithm
        /// No key of the caller IdP's key set matches the `kid` (and algorithm).
        case unknownKey
        case badSignature
        case wrongIssuer
        case wrongAudience
        /// `exp` has passed (beyond the leeway), or the token has no `exp`.
        case expired
        /// `nbf` or `iat` lies ahead (beyond the leeway).
        case notYetValid

        /// Stable reason, for logs and metrics labels: `caller_jwt.bad_signature`, ...
        public var reason: String {
            switch self {
            case .malformed: "caller_jwt.malformed"
            case .unsupportedAlgorithm: "caller_jwt.unsupported_algorithm"
            case .unknownKey: "caller_jwt.unknown_key"
            case .badSignature: "caller_jwt.bad_signature"
            case .wrongIssuer: "caller_jwt.wrong_issuer"
            case .wrongAudience: "caller_jwt.wrong_audience"
            case .expired: "caller_jwt.expired"
            case .notYetValid: "caller_jwt.not_yet_valid"
            }
        }

        /// The 401's `error_description` (RFC 6750 §3: printable ASCII, no `"` or `\`).
        public var description: String {
            switch self {
            case .malformed: "the bearer token is not a well-formed JWT"
            case .unsupportedAlgorithm: "the bearer token's signature algorithm is not accepted"
            case .unknownKey: "the bearer token is signed with an unknown key"
            case .badSignature: "the bearer token's signature is invalid"
            case .wrongIssuer: "the bearer token is from another issuer"
            case .wrongAudience: "the bearer token is for another audience"
            case .expired: "the bearer token has expired"
            case .notYetValid: "the bearer token is not valid yet"
            }
        }
    }

    /// What `caller_jwt` requires of a token.
    public struct Policy: Sendable, Equatable {
        /// `iss` must equal this exactly (RFC 7519 §4.1.1; no normalisation).
        public var issuer: String
        /// `aud` (a string, or an array of strings) must contain this exactly (RFC 7519 §4.1.3).
        public var audience: String
        /// Clock-skew allowance for `exp`, `nbf` and `iat`, in seconds. Default 60.
        public var leewaySeconds: Int64

        public static let defaultLeewaySeconds: Int64 = 60

        public init(issuer: String, audience: String, leewaySeconds: Int64 = Policy.defaultLeewaySeconds) {
            self.issuer = issuer
            self.audience = audience
            self.leewaySeconds = max(0, leewaySeconds)
        }
    }

    /// A token that passed every check.
    public struct Validated: Sendable, Equatable {
        public var algorithm: Algorithm
        public var keyID: String?
        /// `sub`, when it is a string (for logs: bearerd logs the caller's fingerprint, and the
        /// subject only where the configuration asks for it).
        public var subject: String?
        /// `exp` (Unix seconds): an exchanged token is never cached beyond it.
        public var expiresAt: Int64
    }

    /// A compact JWS taken apart, its signature not yet checked.
    public struct Parsed: Sendable, Equatable {
        public var algorithm: Algorithm
        /// `kid` of the protected header, when a string.
        public var keyID: String?
        public var claims: [String: JSONValue]
        /// `BASE64URL(header) '.' BASE64URL(payload)` as received: what the signature covers.
        public var signingInput: [UInt8]
        public var signature: [UInt8]
    }

    /// Tokens longer than this are malformed (a header line of that size is refused earlier by
    /// the HTTP limits anyway).
    public static let maxTokenBytes = 16 * 1024

    /// The JSON header parameters bearerd understands in `crit` (RFC 7515 §4.1.11): none. A token
    /// that lists any critical extension (`b64`, ...) is refused.
    static let parser = JSONParser(maxDepth: 16, maxBytes: maxTokenBytes)

    /// Splits and decodes `token`: three parts, strict Base64url (no padding, no characters
    /// outside the alphabet, no non-zero trailing bits), header and claims JSON objects, `alg`
    /// one of `Algorithm`, no `crit`. Only the decoding: no signature, no claim is checked.
    public static func parse(_ token: String) throws(Failure) -> Parsed {
        let bytes = Array(token.utf8)
        guard !bytes.isEmpty, bytes.count <= maxTokenBytes else { throw .malformed }
        let dot = UInt8(ascii: ".")
        guard let first = bytes.firstIndex(of: dot),
              let second = bytes[(first + 1)...].firstIndex(of: dot),
              !bytes[(second + 1)...].contains(dot) else { throw .malformed }
        let headerPart = bytes[..<first], claimsPart = bytes[(first + 1)..<second], signaturePart = bytes[(second + 1)...]
        guard let headerBytes = strictBase64URL(headerPart),
              case .object(let header)? = try? parser.parse(headerBytes) else { throw .malformed }
        guard case .string(let alg)? = header["alg"] else { throw .malformed }
        guard let algorithm = Algorithm(rawValue: alg) else { throw .unsupportedAlgorithm }
        if header["crit"] != nil { throw .malformed }
        let keyID: String?
        switch header["kid"] {
        case nil: keyID = nil
        case .string(let k)?: keyID = k
        default: throw .malformed
        }
        guard let claimsBytes = strictBase64URL(claimsPart),
              case .object(let claims)? = try? parser.parse(claimsBytes) else { throw .malformed }
        guard let signature = strictBase64URL(signaturePart), !signature.isEmpty else { throw .malformed }
        return Parsed(algorithm: algorithm, keyID: keyID, claims: claims,
                      signingInput: Array(bytes[..<second]), signature: signature)
    }

    /// The `alg` of a refused token for a log line: the name when it is a registered JWA
    /// signature or MAC algorithm (RFC 7518 §3.1, RFC 8037), else `other`. Never more of the token.
    public static func algorithmForLog(_ token: String) -> String {
        let parts = token.split(separator: ".", maxSplits: 2, omittingEmptySubsequences: false)
        guard parts.count >= 2, let h = strictBase64URL(Array(parts[0].utf8)),
              let alg = (try? parser.parse(h))?["alg"]?.stringValue else { return "absent" }
        let registered: Set<String> = ["none", "HS256", "HS384", "HS512", "RS256", "RS384", "RS512", "ES256", "ES384",
                                       "ES512", "PS256", "PS384", "PS512", "EdDSA", "Ed25519", "Ed448", "ES256K"]
        return registered.contains(alg) ? alg : "other"
    }

    /// Checks the signature of `jws` with the first of `candidates` that verifies it (their
    /// number is bounded by the key set: at most `JWKSet.maxKeys`), then the claims.
    public static func verify(_ jws: Parsed, candidates: [JWKSet.Key], policy: Policy,
                              wallClockNow: Int64) throws(Failure) -> Validated {
        let usable = candidates.filter { $0.jwk.accepts(jws.algorithm) }
        guard !usable.isEmpty else { throw .unknownKey }
        if let fixed = jws.algorithm.fixedSignatureLength, jws.signature.count != fixed { throw .badSignature }
        var verified: JWKSet.Key?
        for key in usable where key.publicKey.verify(jws.algorithm, signingInput: jws.signingInput, signature: jws.signature) {
            verified = key
            break
        }
        guard let key = verified else { throw .badSignature }
        let exp = try checkClaims(jws.claims, policy: policy, wallClockNow: wallClockNow)
        return Validated(algorithm: jws.algorithm, keyID: key.jwk.keyID ?? jws.keyID,
                         subject: jws.claims["sub"]?.stringValue, expiresAt: exp)
    }

    /// Parse, key selection from a fixed key set (`jwks_file`), signature and claims in one call.
    /// With a fetched key set use `CallerJWTKeySet.select` between `parse` and `verify` instead,
    /// so an unknown `kid` can trigger a re-fetch.
    public static func validate(_ token: String, keys: JWKSet, policy: Policy, wallClockNow: Int64) throws(Failure) -> Validated {
        let jws = try parse(token)
        return try verify(jws, candidates: keys.candidates(keyID: jws.keyID, algorithm: jws.algorithm),
                          policy: policy, wallClockNow: wallClockNow)
    }

    /// The claim rules (RFC 7519 §4.1), in this order: `iss` equal; `aud` (string or array of
    /// strings) containing the audience; `exp` present and `now < exp + leeway`; `nbf` absent
    /// or `nbf <= now + leeway`; `iat` absent or `iat <= now + leeway`. NumericDates may carry a
    /// fraction (truncated) and saturate at the `Int64` bounds. Returns `exp`.
    public static func checkClaims(_ claims: [String: JSONValue], policy: Policy, wallClockNow now: Int64) throws(Failure) -> Int64 {
        guard case .string(let iss)? = claims["iss"], iss == policy.issuer else { throw .wrongIssuer }
        switch claims["aud"] {
        case .string(let aud)?:
            guard aud == policy.audience else { throw .wrongAudience }
        case .array(let items)?:
            guard items.contains(where: { $0.stringValue == policy.audience }) else { throw .wrongAudience }
        default:
            throw .wrongAudience
        }
        guard let expValue = claims["exp"] else { throw .expired }
        guard let exp = numericDate(expValue) else { throw .malformed }
        let leeway = policy.leewaySeconds
        guard now < add(exp, leeway) else { throw .expired }
        if let nbfValue = claims["nbf"] {
            guard let nbf = numericDate(nbfValue) else { throw .malformed }
            guard nbf <= add(now, leeway) else { throw .notYetValid }
        }
        if let iatValue = claims["iat"] {
            guard let iat = numericDate(iatValue) else { throw .malformed }
            guard iat <= add(now, leeway) else { throw .notYetValid }
        }
        return exp
    }

    /// A NumericDate (RFC 7519 §2): a JSON number, fraction truncated, saturating.
    static func numericDate(_ value: JSONValue) -> Int64? {
        guard case .number(let text) = value else { return nil }
        return TokenResponseParser.saturatingInteger(text)
    }

    /// How long an exchanged token obtained for `token` may be kept: until the caller's own
    /// `exp` (read without verification: a forged, shorter `exp` only shortens the forger's own
    /// cache life). nil when `token` is not a JWT with a numeric `exp` (then only the exchanged
    /// token's expiry bounds it); `.zero` when `exp` has passed. No leeway is added.
    public static func allowedLifetime(token: String, wallClockNow: Int64) -> Duration? {
        guard let exp = TokenResponseParser.jwtExpiry(token) else { return nil }
        return lifetime(until: exp, wallClockNow: wallClockNow)
    }

    /// `exp - now` as a duration, `.zero` when it has passed, saturating.
    public static func lifetime(until exp: Int64, wallClockNow: Int64) -> Duration {
        guard let remaining = TokenResponseParser.secondsUntil(exp, from: wallClockNow), remaining > 0 else { return .zero }
        return .seconds(remaining)
    }

    /// `a + b`, clamped to the `Int64` bounds.
    static func add(_ a: Int64, _ b: Int64) -> Int64 {
        let (sum, overflow) = a.addingReportingOverflow(b)
        return overflow ? (b > 0 ? .max : .min) : sum
    }

    /// Base64url without padding (RFC 7515 §2, §C): `=` anywhere is refused.
    static func strictBase64URL<Bytes: Collection>(_ part: Bytes) -> [UInt8]? where Bytes.Element == UInt8 {
        guard !part.isEmpty, !part.contains(UInt8(ascii: "=")) else { return nil }
        return Base64.decodeURL(String(decoding: part, as: UTF8.self))
    }
}
