import COpenSSL

/// AES-256-GCM sealing of the shared token cache's records (docs/architecture.md §6.13: Redis is
/// not trusted with plaintext tokens). A sealed record is `nonce (12) ‖ ciphertext ‖ tag (16)`;
/// the nonce is random per record (RAND_bytes), the additional authenticated data is the
/// record's Redis key, so a record copied under another key does not open.
///
/// Owns the 32-byte key (immutable after init). Each call makes its own `EVP_CIPHER_CTX`, so one
/// sealer may be used from any thread.
public final class RecordSealer: @unchecked Sendable {  // @unchecked: the key is only read after init
    public static let keyBytes = 32
    public static let nonceBytes = 12
    public static let tagBytes = 16
    private let key: [UInt8]

    /// Why a key file cannot be used (never shows its content).
    public struct KeyError: Error, Equatable, CustomStringConvertible {
        public let description: String
    }

    public init(key: [UInt8]) throws(KeyError) {
        guard key.count == Self.keyBytes else {
            throw KeyError(description: "the key must be \(Self.keyBytes) bytes, got \(key.count)")
        }
        self.key = key
    }

    /// `nonce ‖ ciphertext ‖ tag` of `plaintext`, authenticated together with `aad`. Nil only
    /// if OpenSSL fails (no randomness).
    public func seal(_ plaintext: [UInt8], aad: [UInt8]) -> [UInt8]? {
        var nonce = [UInt8](repeating: 0, count: Self.nonceBytes)
        guard RAND_bytes(&nonce, Int32(Self.nonceBytes)) == 1 else { return nil }
        return seal(plaintext, aad: aad, nonce: nonce)
    }

    /// `seal` with a given nonce (tests; a nonce must never repeat under one key).
    func seal(_ plaintext: [UInt8], aad: [UInt8], nonce: [UInt8]) -> [UInt8]? {
        guard nonce.count == Self.nonceBytes, plaintext.count < Int(Int32.max) - 64, aad.count < Int(Int32.max) else { return nil }
        guard let ctx = EVP_CIPHER_CTX_new() else { return nil }
        defer { EVP_CIPHER_CTX_free(ctx) }
        guard EVP_EncryptInit_ex(ctx, EVP_aes_256_gcm(), nil, key, nonce) == 1 else { return nil }
        var length: Int32 = 0
        if !aad.isEmpty {
            guard EVP_EncryptUpdate(ctx, nil, &length, aad, Int32(aad.count)) == 1 else { return nil }
        }
        var cipher = [UInt8](repeating: 0, count: plaintext.count + 16)
        var written: Int32 = 0
        if !plaintext.isEmpty {
            guard EVP_EncryptUpdate(ctx, &cipher, &written, plaintext, Int32(plaintext.count)) == 1 else { return nil }
        }
        var final: Int32 = 0
        let ok = cipher.withUnsafeMutableBufferPointer { b in
            EVP_EncryptFinal_ex(ctx, b.baseAddress! + Int(written), &final)
        }
        guard ok == 1 else { return nil }
        var tag = [UInt8](repeating: 0, count: Self.tagBytes)
        guard EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, Int32(Self.tagBytes), &tag) == 1 else { return nil }
        return nonce + cipher.prefix(Int(written + final)) + tag
    }

    /// The plaintext of a sealed record, or nil when it does not open: too short, tampered
    /// with, sealed under another key, or under another `aad`.
    public func open(_ sealed: [UInt8], aad: [UInt8]) -> [UInt8]? {
        guard sealed.count >= Self.nonceBytes + Self.tagBytes, sealed.count < Int(Int32.max) - 64, aad.count < Int(Int32.max) else { return nil }
        let nonce = Array(sealed.prefix(Self.nonceBytes))
        let cipher = Array(sealed[Self.nonceBytes..<(sealed.count - Self.tagBytes)])
        var tag = Array(sealed.suffix(Self.tagBytes))
        guard let ctx = EVP_CIPHER_CTX_new() else { return nil }
        defer { EVP_CIPHER_CTX_free(ctx) }
        guard EVP_DecryptInit_ex(ctx, EVP_aes_256_gcm(), nil, key, nonce) == 1 else { return nil }
        var length: Int32 = 0
        if !aad.isEmpty {
            guard EVP_DecryptUpdate(ctx, nil, &length, aad, Int32(aad.count)) == 1 else { return nil }
        }
        var plain = [UInt8](repeating: 0, count: cipher.count + 16)
        var written: Int32 = 0
        if !cipher.isEmpty {
            guard EVP_DecryptUpdate(ctx, &plain, &written, cipher, Int32(cipher.count)) == 1 else { return nil }
        }
        guard EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, Int32(Self.tagBytes), &tag) == 1 else { return nil }
        var final: Int32 = 0
        let ok = plain.withUnsafeMutableBufferPointer { b in
            EVP_DecryptFinal_ex(ctx, b.baseAddress! + Int(written), &final)
        }
        guard ok == 1 else { return nil }
        return Array(plain.prefix(Int(written + final)))
    }
}
