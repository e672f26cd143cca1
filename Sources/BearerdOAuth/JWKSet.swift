/// A public key ready to verify JWS signatures: OpenSSL's `EVP_PKEY` in the shell
/// (`BearerdTLS.JWKPublicKey`), so this module stays free of any crypto library.
public protocol CallerJWTPublicKey: AnyObject, Sendable {
    /// True when `signature` is a valid `algorithm` signature of `signingInput` under this key.
    /// ECDSA signatures arrive in the JOSE `r || s` form (RFC 7518 §3.4).
    func verify(_ algorithm: CallerJWT.Algorithm, signingInput: [UInt8], signature: [UInt8]) -> Bool
}

/// Turns the numbers of a JWK into a `CallerJWTPublicKey` (the shell's OpenSSL import).
public protocol CallerJWTCrypto: Sendable {
    /// The key, or why this build cannot use it (the reason is logged and the key skipped).
    func publicKey(for jwk: JWK) -> Result<any CallerJWTPublicKey, JWKSet.Skip>
}

/// One public signing key of a JWK Set (RFC 7517 §4, RFC 7518 §6), the members bearerd uses.
/// Immutable value; the numbers are big-endian bytes.
public struct JWK: Sendable, Equatable {
    public enum Curve: String, Sendable, Equatable {
        case p256 = "P-256", p384 = "P-384"

        /// Bytes of one coordinate (RFC 7518 §6.2.1.2: full length).
        public var coordinateLength: Int { self == .p256 ? 32 : 48 }
    }

    public enum Material: Sendable, Equatable {
        /// Modulus (leading zero bytes stripped) and public exponent.
        case rsa(n: [UInt8], e: [UInt8])
        case ec(curve: Curve, x: [UInt8], y: [UInt8])
        /// RFC 8037 §2: `kty: OKP`, `crv: Ed25519`, the 32-byte public key.
        case ed25519(x: [UInt8])
    }

    public var keyID: String?
    /// The key's own `alg`, when it names one; a token must then use exactly that algorithm.
    public var algorithm: CallerJWT.Algorithm?
    public var material: Material

    public init(keyID: String?, algorithm: CallerJWT.Algorithm? = nil, material: Material) {
        self.keyID = keyID
        self.algorithm = algorithm
        self.material = material
    }

    /// Whether a token signed with `alg` may be checked with this key: the key type follows
    /// the algorithm (RS*/PS* ↔ RSA, ES256 ↔ P-256, ES384 ↔ P-384, EdDSA ↔ Ed25519) and the
    /// key's own `alg`, when present, must be `alg`.
    public func accepts(_ alg: CallerJWT.Algorithm) -> Bool {
        if let own = algorithm, own != alg { return false }
        switch (material, alg) {
        case (.rsa, .RS256), (.rsa, .RS384), (.rsa, .RS512), (.rsa, .PS256), (.rsa, .PS384), (.rsa, .PS512): return true
        case (.ec(.p256, _, _), .ES256), (.ec(.p384, _, _), .ES384): return true
        case (.ed25519, .EdDSA): return true
        default: return false
        }
    }

    /// Bits of the RSA modulus (0 for other keys).
    public var rsaModulusBits: Int {
        guard case .rsa(let n, _) = material, let first = n.first else { return 0 }
        return (n.count - 1) * 8 + (8 - first.leadingZeroBitCount)
    }
}

/// The keys of a caller IdP (`caller_jwt`'s `jwks_url` or `jwks_file`): a parsed JWK Set
/// (RFC 7517 §5) and the keys the shell imported from it. Immutable value.
///
/// Bounds: the document at most `maxDocumentBytes` (64 KiB), at most `maxKeys` (100) keys;
/// beyond either the whole document is refused. Keys bearerd cannot use are skipped, each with
/// a `Skip` reason for the log: another `kty` or curve, `use` other than `sig`, `key_ops`
/// without `verify`, an `alg` bearerd does not verify or that does not fit the key, private
/// members (`d`, ...: a JWKS that publishes a private key is refused key by key), an RSA modulus
/// under 2048 or over 16384 bits, coordinates of the wrong length, a repeated `kid`.
public struct JWKSet: Sendable {
    public static let maxDocumentBytes = 64 * 1024
    public static let maxKeys = 100
    public static let minimumRSABits = 2048
    public static let maximumRSABits = 16384

    /// A key skipped, and why (log-safe: the `kid` is sanitised, no key material).
    public struct Skip: Error, Sendable, Equatable, CustomStringConvertible {
        /// Position in the document's `keys` array.
        public var index: Int
        public var keyID: String?
        public var reason: String

        public init(index: Int, keyID: String?, reason: String) {
            self.index = index
            self.keyID = keyID.map { sanitise($0, limit: 64) }
            self.reason = reason
        }

        public var description: String { "key \(index)\(keyID.map { " (kid \($0))" } ?? ""): \(reason)" }
    }

    /// Why a whole document was refused.
    public struct Problem: Error, Sendable, Equatable, CustomStringConvertible {
        /// `jwks.too_large`, `jwks.malformed`, `jwks.too_many_keys`, `jwks.no_usable_key`.
        public var reason: String
        public var message: String
        public var description: String { message }
    }

    /// A parsed document: the usable keys' numbers and the skipped ones.
    public struct Document: Sendable, Equatable {
        public var keys: [JWK]
        public var skipped: [Skip]
    }

    /// An imported key.
    public struct Key: Sendable {
        public var jwk: JWK
        public var publicKey: any CallerJWTPublicKey

        public init(jwk: JWK, publicKey: any CallerJWTPublicKey) {
            self.jwk = jwk
            self.publicKey = publicKey
        }
    }

    public private(set) var keys: [Key]
    /// Keys skipped at parse or import time.
    public private(set) var skipped: [Skip]
    private var byKeyID: [String: Int]

    /// An empty set (no key: every token is `unknownKey`).
    public init() {
        keys = []
        skipped = []
        byKeyID = [:]
    }

    /// Imports every key of `document` through `crypto`; keys the crypto refuses join `skipped`.
    /// Throws `jwks.no_usable_key` when none is left (a key set that verifies nothing is a broken
    /// document, not a rotation: the holder keeps its old keys).
    public init(document: Document, crypto: any CallerJWTCrypto) throws(Problem) {
        var keys: [Key] = []
        var skipped = document.skipped
        var byKeyID: [String: Int] = [:]
        for (i, jwk) in document.keys.enumerated() {
            switch crypto.publicKey(for: jwk) {
            case .success(let key):
                if let kid = jwk.keyID { byKeyID[kid] = keys.count }
                keys.append(Key(jwk: jwk, publicKey: key))
            case .failure(var skip):
                skip.index = i
                skipped.append(skip)
            }
        }
        guard !keys.isEmpty else {
            throw Problem(reason: "jwks.no_usable_key", message: "the key set holds no key bearerd can use"
                          + (skipped.isEmpty ? "" : " (" + skipped.map(\.description).joined(separator: "; ") + ")"))
        }
        self.keys = keys
        self.skipped = skipped
        self.byKeyID = byKeyID
    }

    /// Parses and imports `bytes` in one step.
    public init(parsing bytes: [UInt8], crypto: any CallerJWTCrypto) throws(Problem) {
        try self.init(document: try JWKSet.parse(bytes), crypto: crypto)
    }

    /// The keys a token with `keyID` and `algorithm` may be checked with: the key with that
    /// `kid` if it accepts the algorithm; for a `kid` the set does not have, the keys without a
    /// `kid` of their own that accept it (an IdP that publishes its keys without kids); without
    /// a `kid`, every key that accepts it.
    public func candidates(keyID: String?, algorithm: CallerJWT.Algorithm) -> [Key] {
        if let keyID {
            if let i = byKeyID[keyID] { return keys[i].jwk.accepts(algorithm) ? [keys[i]] : [] }
            return keys.filter { $0.jwk.keyID == nil && $0.jwk.accepts(algorithm) }
        }
        return keys.filter { $0.jwk.accepts(algorithm) }
    }

    /// True when a key with this `kid` is in the set (whatever its algorithm).
    public func contains(keyID: String) -> Bool { byKeyID[keyID] != nil }

    /// The parser for the document: JSON depth 8 and the 64 KiB bound.
    static let parser = JSONParser(maxDepth: 8, maxBytes: maxDocumentBytes)

    /// Parses a JWK Set document (RFC 7517 §5): a JSON object with a `keys` array. Pure.
    public static func parse(_ bytes: [UInt8]) throws(Problem) -> Document {
        guard bytes.count <= maxDocumentBytes else {
            throw Problem(reason: "jwks.too_large", message: "the key set is larger than \(maxDocumentBytes / 1024) KiB")
        }
        let value: JSONValue
        do { value = try parser.parse(bytes) } catch {
            throw Problem(reason: "jwks.malformed", message: "the key set is not JSON (\(error.reason) at byte \(error.offset))")
        }
        guard case .array(let items)? = value["keys"] else {
            throw Problem(reason: "jwks.malformed", message: "the key set is not an object with a keys array (RFC 7517 §5)")
        }
        guard items.count <= maxKeys else {
            throw Problem(reason: "jwks.too_many_keys", message: "the key set has \(items.count) keys, more than \(maxKeys)")
        }
        var keys: [JWK] = []
        var skipped: [Skip] = []
        var seen: Set<String> = []
        for (i, item) in items.enumerated() {
            switch key(item, index: i) {
            case .success(let jwk):
                if let kid = jwk.keyID {
                    guard seen.insert(kid).inserted else {
                        skipped.append(Skip(index: i, keyID: kid, reason: "repeats an earlier kid"))
                        continue
                    }
                }
                keys.append(jwk)
            case .failure(let skip):
                skipped.append(skip)
            }
        }
        return Document(keys: keys, skipped: skipped)
    }

    /// Members that only a private or symmetric key has (RFC 7518 §6.3.2, §6.2.2, §6.4, RFC 8037 §2).
    static let privateMembers = ["d", "p", "q", "dp", "dq", "qi", "oth", "k"]

    static func key(_ item: JSONValue, index: Int) -> Result<JWK, Skip> {
        guard case .object(let o) = item else { return .failure(Skip(index: index, keyID: nil, reason: "not a JSON object")) }
        var keyID: String?
        switch o["kid"] {
        case nil: keyID = nil
        case .string(let k)?: keyID = k
        default: return .failure(Skip(index: index, keyID: nil, reason: "kid is not a string"))
        }
        func skip(_ reason: String) -> Result<JWK, Skip> { .failure(Skip(index: index, keyID: keyID, reason: reason)) }
        guard case .string(let kty)? = o["kty"] else { return skip("no kty") }
        switch o["use"] {
        case nil, .string("sig")?: break
        case .string(let use)?: return skip("use \(sanitise(use, limit: 16)), not sig")
        default: return skip("use is not a string")
        }
        if let ops = o["key_ops"] {
            guard case .array(let list) = ops, list.contains(.string("verify")) else { return skip("key_ops without verify") }
        }
        if privateMembers.contains(where: { o[$0] != nil }) {
            return skip(kty == "oct" ? "a symmetric key" : "holds private key members; only public keys are accepted")
        }
        var algorithm: CallerJWT.Algorithm?
        switch o["alg"] {
        case nil: algorithm = nil
        case .string(let a)?:
            guard let known = CallerJWT.Algorithm(rawValue: a) else { return skip("alg \(sanitise(a, limit: 16)) is not verified by bearerd") }
            algorithm = known
        default: return skip("alg is not a string")
        }
        func bytes(_ name: String) -> [UInt8]? {
            guard case .string(let s)? = o[name] else { return nil }
            return CallerJWT.strictBase64URL(Array(s.utf8))
        }
        let material: JWK.Material
        switch kty {
        case "RSA":
            guard let rawN = bytes("n"), let rawE = bytes("e") else { return skip("RSA key without valid n and e") }
            let n = Array(rawN.drop(while: { $0 == 0 })), e = Array(rawE.drop(while: { $0 == 0 }))
            guard !e.isEmpty, e.count <= 8, e.last.map({ $0 & 1 == 1 }) == true else { return skip("RSA public exponent is not usable") }
            material = .rsa(n: n, e: e)
            let bits = JWK(keyID: nil, material: material).rsaModulusBits
            guard bits >= minimumRSABits else { return skip("RSA modulus of \(bits) bits, under \(minimumRSABits)") }
            guard bits <= maximumRSABits else { return skip("RSA modulus of \(bits) bits, over \(maximumRSABits)") }
        case "EC":
            guard case .string(let crv)? = o["crv"] else { return skip("EC key without crv") }
            guard let curve = JWK.Curve(rawValue: crv) else { return skip("curve \(sanitise(crv, limit: 16)) is not supported (P-256, P-384)") }
            guard let x = bytes("x"), let y = bytes("y"), x.count == curve.coordinateLength, y.count == curve.coordinateLength else {
                return skip("EC coordinates are not \(curve.coordinateLength) bytes each")
            }
            material = .ec(curve: curve, x: x, y: y)
        case "OKP":
            guard case .string(let crv)? = o["crv"] else { return skip("OKP key without crv") }
            guard crv == "Ed25519" else { return skip("curve \(sanitise(crv, limit: 16)) is not supported (Ed25519)") }
            guard let x = bytes("x"), x.count == 32 else { return skip("Ed25519 public key is not 32 bytes") }
            material = .ed25519(x: x)
        default:
            return skip("kty \(sanitise(kty, limit: 16)) is not supported (RSA, EC, OKP)")
        }
        let jwk = JWK(keyID: keyID, algorithm: algorithm, material: material)
        if let algorithm, !jwk.accepts(algorithm) { return skip("alg \(algorithm.rawValue) does not fit the key") }
        return .success(jwk)
    }
}
