import CBearerdShim
import COpenSSL

/// A caller IdP's public key built from a JWK's numbers with OpenSSL 3 (`EVP_PKEY_fromdata`,
/// `EVP_PKEY_new_raw_public_key_ex`), verifying JWS signatures (RFC 7515, RFC 7518 §3, RFC 8037
/// §3.1) for `caller_jwt` (docs/architecture.md §6.16): RS256/384/512
/// (PKCS#1 v1.5), PS256/384/512 (RSASSA-PSS, salt length = hash length, MGF1 with the same hash),
/// ES256/ES384 (the JOSE `r || s` turned into DER), EdDSA (Ed25519).
///
/// Owns the `EVP_PKEY` (freed in `deinit`). Immutable after init; `verify` creates its own digest
/// context per call, so one key may be used from any thread.
public final class JWKPublicKey: @unchecked Sendable {  // @unchecked: the key is only read after init (EVP_DigestVerify on a per-call context)
    /// The numbers of a JWK, big-endian.
    public enum Components: Sendable, Equatable {
        case rsa(n: [UInt8], e: [UInt8])
        /// `curve`: `P-256` or `P-384`; `x`, `y` full-length coordinates.
        case ec(curve: String, x: [UInt8], y: [UInt8])
        case ed25519(x: [UInt8])
    }

    /// RSA keys shorter than this are refused (RFC 7518 §3.3: 2048 bits or larger).
    public static let minimumRSABits: Int32 = 2048

    private let key: OpaquePointer
    private let kind: Kind
    private enum Kind { case rsa, ec(coordinate: Int), ed25519 }

    /// Bits of the key (the modulus for RSA, the curve's for EC, 253 for Ed25519).
    public var bits: Int { Int(EVP_PKEY_get_bits(key)) }

    /// Builds the key. Errors say what is wrong (never key material): too small an RSA modulus,
    /// a point not on the curve, an unsupported curve, OpenSSL's reason.
    public init(_ components: Components) throws(TLSError) {
        ERR_clear_error()
        switch components {
        case .rsa(let n, let e):
            guard let pkey = Self.fromData(type: "RSA", build: { bld, keep in
                guard let nb = keep.bignum(n), let eb = keep.bignum(e) else { return false }
                return OSSL_PARAM_BLD_push_BN(bld, keep.cString("n"), nb) == 1 && OSSL_PARAM_BLD_push_BN(bld, keep.cString("e"), eb) == 1
            }) else { throw .config(OpenSSLErrorQueue.message("cannot build the RSA key")) }
            guard EVP_PKEY_get_bits(pkey) >= Self.minimumRSABits else {
                EVP_PKEY_free(pkey)
                throw .config("an RSA key needs at least \(Self.minimumRSABits) bits")
            }
            key = pkey
            kind = .rsa
        case .ec(let curve, let x, let y):
            let length: Int
            switch curve {
            case "P-256": length = 32
            case "P-384": length = 48
            default: throw .config("the curve \(curve) is not supported (P-256, P-384)")
            }
            guard x.count == length, y.count == length else { throw .config("the \(curve) coordinates must be \(length) bytes each") }
            let point: [UInt8] = [0x04] + x + y
            // EVP_PKEY_fromdata decodes the point and refuses one that is not on the curve.
            guard let pkey = Self.fromData(type: "EC", build: { bld, keep in
                OSSL_PARAM_BLD_push_utf8_string(bld, keep.cString("group"), keep.cString(curve), 0) == 1
                    && OSSL_PARAM_BLD_push_octet_string(bld, keep.cString("pub"), keep.bytes(point), point.count) == 1
            }) else { throw .config(OpenSSLErrorQueue.message("cannot build the \(curve) key (is the point on the curve?)")) }
            // And the full public-key check (on the curve, not the point at infinity, order n).
            let check = EVP_PKEY_CTX_new_from_pkey(nil, pkey, nil)
            defer { EVP_PKEY_CTX_free(check) }
            guard let check, EVP_PKEY_public_check(check) == 1 else {
                EVP_PKEY_free(pkey)
                throw .config(OpenSSLErrorQueue.message("the \(curve) public key is not valid"))
            }
            key = pkey
            kind = .ec(coordinate: length)
        case .ed25519(let x):
            guard x.count == 32 else { throw .config("an Ed25519 public key is 32 bytes") }
            guard let pkey = x.withUnsafeBufferPointer({ EVP_PKEY_new_raw_public_key_ex(nil, "ED25519", nil, $0.baseAddress, $0.count) }) else {
                throw .config(OpenSSLErrorQueue.message("cannot build the Ed25519 key"))
            }
            key = pkey
            kind = .ed25519
        }
    }

    deinit { EVP_PKEY_free(key) }

    /// What `OSSL_PARAM_BLD` points at until `OSSL_PARAM_BLD_to_param` copies it: the builder keeps
    /// the names, strings, octets and big numbers it is given by reference, so they live here
    /// (freed when the import is over), never in a Swift temporary.
    private final class ParamStorage {
        private var memory: [UnsafeMutableRawPointer] = []
        private var bignums: [OpaquePointer] = []

        func cString(_ s: String) -> UnsafePointer<CChar> {
            let utf8 = Array(s.utf8CString)
            let p = UnsafeMutablePointer<CChar>.allocate(capacity: utf8.count)
            p.initialize(from: utf8, count: utf8.count)
            memory.append(UnsafeMutableRawPointer(p))
            return UnsafePointer(p)
        }

        func bytes(_ b: [UInt8]) -> UnsafeRawPointer {
            let p = UnsafeMutablePointer<UInt8>.allocate(capacity: max(b.count, 1))
            p.initialize(from: b, count: b.count)
            memory.append(UnsafeMutableRawPointer(p))
            return UnsafeRawPointer(p)
        }

        func bignum(_ b: [UInt8]) -> OpaquePointer? {
            guard let bn = b.withUnsafeBufferPointer({ BN_bin2bn($0.baseAddress, Int32(clamping: $0.count), nil) }) else { return nil }
            bignums.append(bn)
            return bn
        }

        deinit {
            for p in memory { p.deallocate() }
            for b in bignums { BN_free(b) }
        }
    }

    /// `EVP_PKEY_fromdata` of a public key of `type` with the parameters `build` pushes.
    private static func fromData(type: String, build: (OpaquePointer, ParamStorage) -> Bool) -> OpaquePointer? {
        let keep = ParamStorage()
        guard let bld = OSSL_PARAM_BLD_new() else { return nil }
        defer { OSSL_PARAM_BLD_free(bld) }
        guard build(bld, keep), let params = OSSL_PARAM_BLD_to_param(bld) else { return nil }
        defer { OSSL_PARAM_free(params) }
        guard let ctx = EVP_PKEY_CTX_new_from_name(nil, type, nil) else { return nil }
        defer { EVP_PKEY_CTX_free(ctx) }
        var pkey: OpaquePointer?
        let imported = withExtendedLifetime(keep) {
            EVP_PKEY_fromdata_init(ctx) == 1 && EVP_PKEY_fromdata(ctx, &pkey, bearerd_EVP_PKEY_PUBLIC_KEY(), params) == 1
        }
        guard imported else {
            if let pkey { EVP_PKEY_free(pkey) }
            return nil
        }
        return pkey
    }

    /// True when `signature` is a valid `algorithm` (a JWA name) signature of `signingInput`
    /// under this key. An algorithm that does not fit the key, or any OpenSSL failure, is false.
    public func verify(algorithm: String, signingInput: [UInt8], signature: [UInt8]) -> Bool {
        defer { ERR_clear_error() }
        switch (kind, algorithm) {
        case (.rsa, "RS256"), (.rsa, "PS256"): return digestVerify(EVP_sha256(), pss: algorithm.hasPrefix("PS"), signingInput, signature)
        case (.rsa, "RS384"), (.rsa, "PS384"): return digestVerify(EVP_sha384(), pss: algorithm.hasPrefix("PS"), signingInput, signature)
        case (.rsa, "RS512"), (.rsa, "PS512"): return digestVerify(EVP_sha512(), pss: algorithm.hasPrefix("PS"), signingInput, signature)
        case (.ec(32), "ES256"), (.ec(48), "ES384"):
            guard case .ec(let length) = kind, let der = Self.derSignature(raw: signature, coordinate: length) else { return false }
            return digestVerify(length == 32 ? EVP_sha256() : EVP_sha384(), pss: false, signingInput, der)
        case (.ed25519, "EdDSA"):
            return signature.count == 64 && digestVerify(nil, pss: false, signingInput, signature)
        default:
            return false
        }
    }

    private func digestVerify(_ md: OpaquePointer?, pss: Bool, _ input: [UInt8], _ signature: [UInt8]) -> Bool {
        guard let ctx = EVP_MD_CTX_new() else { return false }
        defer { EVP_MD_CTX_free(ctx) }
        var pctx: OpaquePointer?
        guard EVP_DigestVerifyInit(ctx, &pctx, md, nil, key) == 1 else { return false }
        if pss {
            // RFC 7518 §3.5: salt as long as the hash, MGF1 with the same hash.
            guard let pctx, EVP_PKEY_CTX_set_rsa_padding(pctx, RSA_PKCS1_PSS_PADDING) == 1,
                  EVP_PKEY_CTX_set_rsa_pss_saltlen(pctx, RSA_PSS_SALTLEN_DIGEST) == 1,
                  EVP_PKEY_CTX_set_rsa_mgf1_md(pctx, md) == 1 else { return false }
        }
        let result = signature.withUnsafeBufferPointer { sig in
            input.withUnsafeBufferPointer { EVP_DigestVerify(ctx, sig.baseAddress, sig.count, $0.baseAddress, $0.count) }
        }
        return result == 1
    }

    /// JOSE `r || s` (RFC 7518 §3.4, each `coordinate` bytes) as a DER ECDSA-Sig-Value; nil when
    /// the length is wrong.
    static func derSignature(raw: [UInt8], coordinate: Int) -> [UInt8]? {
        guard raw.count == 2 * coordinate, let sig = ECDSA_SIG_new() else { return nil }
        defer { ECDSA_SIG_free(sig) }
        let r = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress, Int32(coordinate), nil) }
        let s = raw.withUnsafeBufferPointer { BN_bin2bn($0.baseAddress.map { $0 + coordinate }, Int32(coordinate), nil) }
        guard let r, let s else { BN_free(r); BN_free(s); return nil }
        guard ECDSA_SIG_set0(sig, r, s) == 1 else { BN_free(r); BN_free(s); return nil }  // on success sig owns r and s
        let length = i2d_ECDSA_SIG(sig, nil)
        guard length > 0 else { return nil }
        var der = [UInt8](repeating: 0, count: Int(length))
        let written = der.withUnsafeMutableBufferPointer { buffer -> Int32 in
            var p = buffer.baseAddress
            return i2d_ECDSA_SIG(sig, &p)
        }
        return written == length ? der : nil
    }
}
