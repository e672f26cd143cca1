import BearerdHTTP

/// The caller's own credential on routes that act on its behalf or validate it
/// (docs/architecture.md §6.16). Pure.
public enum CallerCredential {
    /// The token of the request's one `Authorization: Bearer <token>` field (RFC 6750 §2.1:
    /// scheme case-insensitive, then one or more spaces and a token68, RFC 9110 §11.2). nil when
    /// there is no such field, when `Authorization` appears more than once (which one would the
    /// upstream have trusted?), for another scheme, or for anything that is not a token68 (a
    /// header value with spaces or commas inside the token is refused, not guessed at).
    public static func bearerToken(_ headers: HTTPHeaders) -> String? {
        var found: String?
        for f in headers.fields where asciiCaseInsensitiveEquals(f.name, "Authorization") {
            if found != nil { return nil }
            found = f.value
        }
        guard var value = found else { return nil }
        // Over the field's own UTF-8 (no copy: this runs for every request on such routes).
        return value.withUTF8 { bytes -> String? in
            guard bytes.count > 7 else { return nil }
            let scheme: StaticString = "bearer"
            for i in 0..<6 where bytes[i] | 0x20 != scheme.utf8Start[i] { return nil }
            var i = 6
            guard bytes[i] == 0x20 else { return nil }
            while i < bytes.count && bytes[i] == 0x20 { i += 1 }
            var end = bytes.count
            while end > i && bytes[end - 1] == 0x20 { end -= 1 }
            guard i < end, bytes[i] != 0x3D else { return nil }
            var sawPadding = false
            for j in i..<end {
                let b = bytes[j]
                if b == 0x3D {  // '=' only as trailing padding
                    sawPadding = true
                    continue
                }
                if sawPadding { return nil }
                let ok = (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || (b >= 0x30 && b <= 0x39)
                    || b == 0x2D || b == 0x2E || b == 0x5F || b == 0x7E || b == 0x2B || b == 0x2F
                if !ok { return nil }
            }
            return String(decoding: UnsafeBufferPointer(rebasing: bytes[i..<end]), as: UTF8.self)
        }
    }
}
