import COpenSSL

/// Signs JWS inputs with a client's private key (RFC 7515), for `client_auth: private_key_jwt`
/// (RFC 7523 §2.2): RS256 for RSA keys, ES256 for P-256 keys (the algorithm follows the key).
///
/// Owns the `EVP_PKEY` (freed in `deinit`). Immutable after init; `sign` creates its own digest
/// context per call, so one signer may be used from any thread.
public final class JWTSigner: @unchecked Sendable {  // @unchecked: the key is only read after init (EVP_DigestSign on a per-call context)
    private let key: OpaquePointer
    /// `RS256` or `ES256`.
    public let algorithm: String

    /// Reads a PEM private key (PKCS#8 or traditional). Errors name the file and what is wrong.
    public init(pemFile path: String) throws(TLSError) {
        ERR_clear_error()
        guard let bio = BIO_new_file(path, "r") else {
            throw .config(OpenSSLErrorQueue.message("cannot read the client key \(path)"))
        }
        defer { BIO_free(bio) }
        guard let pkey = PEM_read_bio_PrivateKey(bio, nil, nil, nil) else {
            throw .config(OpenSSLErrorQueue.message("\(path) holds no PEM private key"))
        }
        switch EVP_PKEY_get_base_id(pkey) {
        case EVP_PKEY_RSA:
            guard EVP_PKEY_get_bits(pkey) >= 2048 else {
                EVP_PKEY_free(pkey)
                throw .config("\(path): an RSA key for RS256 needs at least 2048 bits")
            }
            algorithm = "RS256"
        case EVP_PKEY_EC:
            guard EVP_PKEY_get_bits(pkey) == 256 else {
                EVP_PKEY_free(pkey)
                throw .config("\(path): an EC key must be P-256 for ES256")
            }
            algorithm = "ES256"
        default:
            EVP_PKEY_free(pkey)
            throw .config("\(path): only RSA (RS256) and P-256 EC (ES256) keys are supported")
        }
        key = pkey
    }

    deinit { EVP_PKEY_free(key) }

    /// The JWS signature of `input` (SHA-256): PKCS#1 v1.5 for RS256; for ES256 the raw
    /// `r || s` (64 bytes) JWS requires (RFC 7518 §3.4), not OpenSSL's DER.
    public func sign(_ input: [UInt8]) throws(TLSError) -> [UInt8] {
        ERR_clear_error()
        guard let ctx = EVP_MD_CTX_new() else { throw .config("out of memory") }
        defer { EVP_MD_CTX_free(ctx) }
        guard EVP_DigestSignInit(ctx, nil, EVP_sha256(), nil, key) == 1 else {
            throw .config(OpenSSLErrorQueue.message("cannot start signing"))
        }
        var length = 0
        let sized = input.withUnsafeBufferPointer { EVP_DigestSign(ctx, nil, &length, $0.baseAddress, $0.count) }
        guard sized == 1, length > 0 else { throw .config(OpenSSLErrorQueue.message("cannot size the signature")) }
        var signature = [UInt8](repeating: 0, count: length)
        let signed = signature.withUnsafeMutableBufferPointer { out in
            input.withUnsafeBufferPointer { EVP_DigestSign(ctx, out.baseAddress, &length, $0.baseAddress, $0.count) }
        }
        guard signed == 1 else { throw .config(OpenSSLErrorQueue.message("cannot sign")) }
        signature.removeSubrange(min(length, signature.count)...)
        guard algorithm == "ES256" else { return signature }
        // DER ECDSA-Sig-Value → r || s, each left-padded to 32 bytes.
        var p: UnsafePointer<UInt8>? = nil
        let sig: OpaquePointer? = signature.withUnsafeBufferPointer { buf in
            p = buf.baseAddress
            return d2i_ECDSA_SIG(nil, &p, buf.count)
        }
        guard let sig else { throw .config("cannot decode the ECDSA signature") }
        defer { ECDSA_SIG_free(sig) }
        var raw = [UInt8](repeating: 0, count: 64)
        let ok = raw.withUnsafeMutableBufferPointer { out -> Bool in
            guard let base = out.baseAddress else { return false }
            return BN_bn2binpad(ECDSA_SIG_get0_r(sig), base, 32) == 32 && BN_bn2binpad(ECDSA_SIG_get0_s(sig), base + 32, 32) == 32
        }
        guard ok else { throw .config("cannot encode the ECDSA signature") }
        return raw
    }
}
