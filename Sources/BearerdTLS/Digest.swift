import COpenSSL

/// SHA-256 and HMAC-SHA-256 from OpenSSL (one-shot `EVP_Digest` and `HMAC`), for request
/// signatures (SigV4, OSS V4) and payload hashes. Stateless; safe from any thread.
public enum Digest {
    /// SHA-256 of `bytes` (32 bytes).
    public static func sha256(_ bytes: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let ok = bytes.withUnsafeBufferPointer { input in
            out.withUnsafeMutableBufferPointer { EVP_Digest(input.baseAddress, input.count, $0.baseAddress, &length, EVP_sha256(), nil) }
        }
        // EVP_Digest with SHA-256 fails only when OpenSSL cannot allocate a context.
        precondition(ok == 1 && length == 32, "EVP_Digest(SHA-256) failed: out of memory in OpenSSL")
        return out
    }

    /// HMAC-SHA-256 of `message` under `key` (32 bytes).
    public static func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] {
        var out = [UInt8](repeating: 0, count: 32)
        var length: UInt32 = 0
        let result = key.withUnsafeBufferPointer { k in
            message.withUnsafeBufferPointer { m in
                out.withUnsafeMutableBufferPointer { o in
                    HMAC(EVP_sha256(), k.baseAddress, Int32(clamping: k.count), m.baseAddress, m.count, o.baseAddress, &length)
                }
            }
        }
        // HMAC fails only when OpenSSL cannot allocate a context (the key length is clamped above,
        // and signing keys are 32 bytes or a short secret).
        precondition(result != nil && length == 32, "HMAC(SHA-256) failed: out of memory in OpenSSL")
        return out
    }
}
