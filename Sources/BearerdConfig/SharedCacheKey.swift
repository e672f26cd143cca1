import BearerdOAuth

/// The AES-256-GCM key of `shared_cache.key_file`, and which of the two accepted forms the
/// file held. Pure: decodes bytes already read.
///
/// Accepted: the standard base64 (RFC 4648 §4, padded) of 32 bytes on one line, a trailing
/// line ending allowed (`openssl rand -base64 32`); or exactly 32 raw bytes that are not text.
/// A file of 32 printable characters (a passphrase, 32 hex digits, base64 of 24 bytes) is
/// refused rather than taken as a raw key: it would be a key of far less than 256 bits, and
/// 32 random bytes are all printable with a probability of about 10⁻¹⁴.
public struct SharedCacheKey: Sendable, Equatable {
    public enum Form: String, Sendable, Equatable {
        /// Base64 text of 32 bytes.
        case base64
        /// 32 raw (binary) bytes.
        case raw
    }

    public static let byteCount = 32
    public let bytes: [UInt8]
    public let form: Form

    /// How to make a good key file, quoted in every refusal.
    static let advice = "put 32 random bytes in it as base64: openssl rand -base64 32 > FILE"

    /// The key `content` holds, or why it holds none (never quoting the content).
    public static func parse(_ content: [UInt8]) -> Result<SharedCacheKey, ConfigValueError> {
        var text = content[...]
        if text.last == 0x0A { text = text.dropLast() }
        if text.last == 0x0D { text = text.dropLast() }
        if text.count == 2 * byteCount, text.allSatisfy(isHexDigit) {
            return .failure(ConfigValueError("it holds 64 hex digits; bearerd reads base64 (or 32 raw bytes): \(advice)"))
        }
        if let decoded = standardBase64(text) {
            if decoded.count == byteCount { return .success(SharedCacheKey(bytes: decoded, form: .base64)) }
            if content.count != byteCount {
                return .failure(ConfigValueError("its base64 decodes to \(decoded.count) bytes, not \(byteCount): \(advice)"))
            }
        }
        if content.count == byteCount {
            if looksLikeText(content) {
                return .failure(ConfigValueError("it holds 32 characters of text (a passphrase, hex digits?), not 32 random bytes: \(advice)"))
            }
            return .success(SharedCacheKey(bytes: content, form: .raw))
        }
        return .failure(ConfigValueError("expected the base64 of 32 random bytes on one line (or exactly 32 raw bytes), got \(content.count) bytes: \(advice)"))
    }

    /// Printable ASCII, tab, CR and LF only.
    static func looksLikeText(_ bytes: [UInt8]) -> Bool {
        bytes.allSatisfy { ($0 >= 0x20 && $0 < 0x7F) || $0 == 0x09 || $0 == 0x0A || $0 == 0x0D }
    }

    static func isHexDigit(_ c: UInt8) -> Bool {
        (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x46) || (c >= 0x61 && c <= 0x66)
    }

    /// Standard-alphabet base64 with its padding (length a multiple of 4); nil otherwise.
    static func standardBase64(_ text: ArraySlice<UInt8>) -> [UInt8]? {
        guard !text.isEmpty, text.count % 4 == 0 else { return nil }
        var url: [UInt8] = []
        url.reserveCapacity(text.count)
        for c in text {
            switch c {
            case 0x41...0x5A, 0x61...0x7A, 0x30...0x39, 0x3D: url.append(c)
            case 0x2B: url.append(0x2D)  // + → -
            case 0x2F: url.append(0x5F)  // / → _
            default: return nil
            }
        }
        return Base64.decodeURL(String(decoding: url, as: UTF8.self))
    }
}
