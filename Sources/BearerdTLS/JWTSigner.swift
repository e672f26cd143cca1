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

    /// The public key's numbers, big-endian (for its JWK and RFC 7638 thumbprint).
    public enum PublicNumbers: Sendable, Equatable {
        /// Modulus and public exponent, without leading zero bytes.
        case rsa(n: [UInt8], e: [UInt8])
        /// The P-256 point; each coordinate left-padded to 32 bytes.
        case p256(x: [UInt8], y: [UInt8])
    }
    public let publicNumbers: PublicNumbers

    /// Reads a PEM private key (PKCS#8 or traditional). Errors name the file and what is wrong.
    public init(pemFile path: String) throws(TLSError) {
        let pem: [UInt8]
        switch RegularFile.read(path) {
        case .success(let bytes): pem = bytes
        case .failure(let why): throw .config("cannot read the key \(path): \(why.reason)")
        }
        ERR_clear_error()
        // The memory BIO reads `pem` in place: used and freed within the closure.
        let read: OpaquePointer? = pem.withUnsafeBytes { buffer in
            guard let base = buffer.baseAddress, let bio = BIO_new_mem_buf(base, Int32(clamping: buffer.count)) else { return nil }
            defer { BIO_free(bio) }
            return PEM_read_bio_PrivateKey(bio, nil, nil, nil)
        }
        guard let pkey = read else {
            throw .config(OpenSSLErrorQueue.message("\(path) holds no PEM private key"))
        }
        switch EVP_PKEY_get_base_id(pkey) {
        case EVP_PKEY_RSA:
            guard EVP_PKEY_get_bits(pkey) >= 2048 else {
                EVP_PKEY_free(pkey)
                throw .config("\(path): an RSA key for RS256 needs at least 2048 bits")
            }
            guard let n = Self.bignum(pkey, "n", pad: 0), let e = Self.bignum(pkey, "e", pad: 0) else {
                EVP_PKEY_free(pkey)
                throw .config(OpenSSLErrorQueue.message("\(path): cannot read the RSA public key"))
            }
            algorithm = "RS256"
            publicNumbers = .rsa(n: n, e: e)
        case EVP_PKEY_EC:
            guard EVP_PKEY_get_bits(pkey) == 256 else {
                EVP_PKEY_free(pkey)
                throw .config("\(path): an EC key must be P-256 for ES256")
            }
            guard let x = Self.bignum(pkey, "qx", pad: 32), let y = Self.bignum(pkey, "qy", pad: 32) else {
                EVP_PKEY_free(pkey)
                throw .config(OpenSSLErrorQueue.message("\(path): cannot read the EC public key"))
            }
            algorithm = "ES256"
            publicNumbers = .p256(x: x, y: y)
        default:
            EVP_PKEY_free(pkey)
            throw .config("\(path): only RSA (RS256) and P-256 EC (ES256) keys are supported")
        }
        key = pkey
    }

    deinit { EVP_PKEY_free(key) }

    /// A big-number parameter of `pkey` (OpenSSL 3 names: "n", "e", "qx", "qy"), big-endian;
    /// `pad` > 0: left-padded to that many bytes (nil if longer).
    private static func bignum(_ pkey: OpaquePointer, _ name: String, pad: Int) -> [UInt8]? {
        var bn: OpaquePointer?
        guard EVP_PKEY_get_bn_param(pkey, name, &bn) == 1, let bn else { return nil }
        defer { BN_free(bn) }
        let size = (Int(BN_num_bits(bn)) + 7) / 8
        if pad > 0 {
            guard size <= pad else { return nil }
            var out = [UInt8](repeating: 0, count: pad)
            let written = out.withUnsafeMutableBufferPointer { BN_bn2binpad(bn, $0.baseAddress, Int32(pad)) }
            return written == Int32(pad) ? out : nil
        }
        var out = [UInt8](repeating: 0, count: max(size, 1))
        let written = out.withUnsafeMutableBufferPointer { BN_bn2bin(bn, $0.baseAddress) }
        return written == Int32(size) ? Array(out.prefix(size)) : nil
    }

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

extension JWTSigner {
    /// A new P-256 private key (OpenSSL `EVP_PKEY` keygen), as PKCS#8 PEM: the DPoP key bearerd
    /// generates once for a session without `dpop_key_file` (RFC 9449, docs/architecture.md §6.11).
    /// The caller writes it 0600; it never appears in logs.
    public static func generateP256PrivateKeyPEM() throws(TLSError) -> [UInt8] {
        ERR_clear_error()
        guard let ctx = EVP_PKEY_CTX_new_from_name(nil, "EC", nil) else {
            throw .config(OpenSSLErrorQueue.message("cannot create an EC key context"))
        }
        defer { EVP_PKEY_CTX_free(ctx) }
        guard EVP_PKEY_keygen_init(ctx) == 1, EVP_PKEY_CTX_set_group_name(ctx, "P-256") == 1 else {
            throw .config(OpenSSLErrorQueue.message("cannot set up P-256 key generation"))
        }
        var pkey: OpaquePointer?
        guard EVP_PKEY_generate(ctx, &pkey) == 1, let pkey else {
            throw .config(OpenSSLErrorQueue.message("cannot generate a P-256 key"))
        }
        defer { EVP_PKEY_free(pkey) }
        guard let bio = BIO_new(BIO_s_mem()) else { throw .config("out of memory") }
        defer { BIO_free(bio) }
        guard PEM_write_bio_PrivateKey(bio, pkey, nil, nil, 0, nil, nil) == 1 else {
            throw .config(OpenSSLErrorQueue.message("cannot encode the P-256 key"))
        }
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 1024)
        while true {
            let n = chunk.withUnsafeMutableBytes { BIO_read(bio, $0.baseAddress, Int32($0.count)) }
            if n <= 0 { break }
            out.append(contentsOf: chunk[0..<Int(n)])
        }
        guard !out.isEmpty else { throw .config("cannot encode the P-256 key") }
        return out
    }
}
