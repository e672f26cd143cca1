import COpenSSL

/// SHA-256 and HMAC-SHA-256 from OpenSSL, for request signatures (SigV4, OSS V4) and payload
/// hashes. Safe from any thread.
///
/// The algorithm objects are fetched from the provider once (`EVP_MD_fetch`, `EVP_MAC_fetch`) and
/// shared read-only (OpenSSL 3 allows that); each call builds only its own context. The one-shot
/// `EVP_Digest`/`HMAC()` fetch the algorithms on every call, which cost a SigV4 signature about
/// 22,000 instructions per HMAC (bench/RESULTS.md, "Cost of signing").
public enum Digest {
    /// OpenSSL's SHA-256, fetched once (never freed: it lives as long as the process).
    nonisolated(unsafe) private static let md: OpaquePointer = {
        guard let md = EVP_MD_fetch(nil, "SHA256", nil) else { fatalError("OpenSSL has no SHA-256") }
        return md
    }()
    /// OpenSSL's HMAC, fetched once.
    nonisolated(unsafe) private static let mac: OpaquePointer = {
        guard let mac = EVP_MAC_fetch(nil, "HMAC", nil) else { fatalError("OpenSSL has no HMAC") }
        return mac
    }()

    /// SHA-256 of `bytes` (32 bytes).
    public static func sha256(_ bytes: [UInt8]) -> [UInt8] {
        bytes.withUnsafeBytes { sha256($0) }
    }

    /// SHA-256 of raw bytes (32 bytes).
    public static func sha256(_ bytes: UnsafeRawBufferPointer) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let ok = out.withUnsafeMutableBufferPointer { o -> Int32 in
            guard let ctx = EVP_MD_CTX_new() else { return 0 }
            defer { EVP_MD_CTX_free(ctx) }
            guard EVP_DigestInit_ex2(ctx, md, nil) == 1, EVP_DigestUpdate(ctx, bytes.baseAddress, bytes.count) == 1 else { return 0 }
            return EVP_DigestFinal_ex(ctx, o.baseAddress, &length)
        }
        // SHA-256 fails only when OpenSSL cannot allocate a context.
        precondition(ok == 1 && length == 32, "SHA-256 failed: out of memory in OpenSSL")
        return out
    }

    /// HMAC-SHA-256 of `message` under `key` (32 bytes).
    public static func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        var length = 0
        let ok = key.withUnsafeBufferPointer { k in
            message.withUnsafeBufferPointer { m in
                out.withUnsafeMutableBufferPointer { o -> Int32 in
                    guard let ctx = EVP_MAC_CTX_new(mac) else { return 0 }
                    defer { EVP_MAC_CTX_free(ctx) }
                    var params = [OSSL_PARAM_construct_utf8_string("digest", UnsafeMutablePointer(mutating: sha256Name), 0),
                                  OSSL_PARAM_construct_end()]
                    // An empty key is valid HMAC input; OpenSSL wants a non-null pointer for it.
                    let keyPointer = k.baseAddress ?? UnsafePointer(emptyKey)
                    guard EVP_MAC_init(ctx, keyPointer, k.count, &params) == 1,
                          EVP_MAC_update(ctx, m.baseAddress, m.count) == 1 else { return 0 }
                    return EVP_MAC_final(ctx, o.baseAddress, &length, 32)
                }
            }
        }
        // HMAC fails only when OpenSSL cannot allocate a context.
        precondition(ok == 1 && length == 32, "HMAC(SHA-256) failed: out of memory in OpenSSL")
        return out
    }

    /// "SHA256" as a C string for the HMAC's digest parameter (static, never freed).
    nonisolated(unsafe) private static let sha256Name: UnsafePointer<CChar> = {
        let bytes = Array("SHA256".utf8CString)
        let p = UnsafeMutablePointer<CChar>.allocate(capacity: bytes.count)
        p.initialize(from: bytes, count: bytes.count)
        return UnsafePointer(p)
    }()
    nonisolated(unsafe) private static let emptyKey: UnsafeMutablePointer<UInt8> = .allocate(capacity: 1)
}
