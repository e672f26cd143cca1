/// What may be shown of credentials in logs (DESIGN §5): header values that carry credentials
/// become a scheme and a fingerprint, credential query parameters are cut, and every log line
/// passes `scrub` as a last line of defence, at every level and in both formats. Here (not in
/// BearerdProxyCore) so the session shell scrubs without the proxy core; the header-section
/// form, `describe`, is an extension in BearerdProxyCore. Stateless.
public enum Redaction {
    /// Header fields whose values are credentials (lower-case).
    package static let sensitiveHeaders: Set<String> = [
        "authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key",
        "x-auth-token", "x-access-token", "x-amz-security-token", "x-csrf-token", "x-xsrf-token",
    ]

    public static func isSensitive(headerName name: String) -> Bool {
        let n = name.lowercased()
        return sensitiveHeaders.contains(n) || n.contains("token") || n.contains("secret") || n.contains("password")
    }

    /// `Bearer eyJ…` → `Bearer <fp 1a2b3c4d>`; other sensitive values → `<redacted fp 1a2b3c4d>`.
    public static func redactedValue(name: String, value: String) -> String {
        guard isSensitive(headerName: name) else { return value }
        let lower = name.lowercased()
        if lower == "authorization" || lower == "proxy-authorization",
           let space = value.firstIndex(of: " ") {
            let scheme = value[..<space]
            let credential = value[value.index(after: space)...].drop { $0 == " " }
            return "\(scheme) <fp \(BearerdOAuth.fingerprint(String(credential)))>"
        }
        return "<redacted fp \(BearerdOAuth.fingerprint(value))>"
    }

    /// A request target with every query value replaced by `<redacted>` (names kept): queries
    /// carry credentials and personal data as often as not.
    public static func target(_ target: String) -> String {
        guard let q = target.firstIndex(of: "?") else { return target }
        let path = target[..<q]
        let params = target[target.index(after: q)...].split(separator: "&", omittingEmptySubsequences: false).map { p -> String in
            guard let eq = p.firstIndex(of: "=") else { return String(p) }
            return "\(p[..<eq])=<redacted>"
        }
        return path + "?" + params.joined(separator: "&")
    }

    /// Markers after which a credential follows in free text (lower-case), e.g. a server's error
    /// description echoing a header or a form body.
    package static let markers: [[UInt8]] = [
        "bearer ", "basic ", "access_token", "refresh_token", "id_token", "client_secret", "password", "cookie:", "set-cookie:",
    ].map { Array($0.utf8) }

    /// Replaces the value after each credential marker with `<redacted>`: `bearer X`, `basic X`,
    /// and `access_token`/`refresh_token`/`id_token`/`client_secret`/`password`/`cookie` followed
    /// by `=` or `:` (logfmt, JSON, form bodies, headers). Markers count only at a word start.
    /// No allocation when nothing matches; values already redacted (`<…>`) are left alone.
    public static func scrub(_ line: String) -> String {
        var line = line
        let found = line.withUTF8 { firstCredential(in: $0, from: 0) != nil }
        guard found else { return line }
        var bytes = Array(line.utf8)
        var from = 0
        while let (start, end) = bytes.withUnsafeBufferPointer({ firstCredential(in: $0, from: from) }) {
            bytes.replaceSubrange(start..<end, with: redactedBytes)
            from = start + redactedBytes.count
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// `scrub` on a line in bytes, in place (no copy unless a credential is found).
    public static func scrub(bytes: inout [UInt8]) {
        var from = 0
        while let (start, end) = bytes.withUnsafeBufferPointer({ firstCredential(in: $0, from: from) }) {
            bytes.replaceSubrange(start..<end, with: redactedBytes)
            from = start + redactedBytes.count
        }
    }

    private static let redactedBytes = Array("<redacted>".utf8)

    /// The byte range of the first credential value at or after `from`.
    private static func firstCredential(in bytes: UnsafeBufferPointer<UInt8>, from: Int) -> (Int, Int)? {
        func isWord(_ b: UInt8) -> Bool {
            let l = b | 0x20
            return (l >= 0x61 && l <= 0x7A) || (b >= 0x30 && b <= 0x39) || b == 0x5F
        }
        var i = from
        while i < bytes.count {
            let c = bytes[i] | 0x20
            guard c == 0x62 || c == 0x61 || c == 0x72 || c == 0x69 || c == 0x63 || c == 0x70 || c == 0x73,
                  i == 0 || !(isWord(bytes[i - 1]) || bytes[i - 1] == 0x2E) else { i += 1; continue }  // not inside a word or a dotted key
            var matched: [UInt8]?
            for m in markers where i + m.count <= bytes.count {
                var ok = true
                for k in 0..<m.count {
                    let b = m[k] >= 0x61 && m[k] <= 0x7A ? bytes[i + k] | 0x20 : bytes[i + k]
                    if b != m[k] { ok = false; break }
                }
                if ok { matched = m; break }
            }
            guard let m = matched else { i += 1; continue }
            var j = i + m.count
            let spaced = m.last == 0x20
            if !spaced, j < bytes.count, isWord(bytes[j]) { i = j; continue }  // e.g. `password_hint`
            var assigned = spaced || m.last == 0x3A
            while j < bytes.count, bytes[j] == 0x22 || bytes[j] == 0x27 || bytes[j] == 0x3A || bytes[j] == 0x3D || bytes[j] == 0x20 || bytes[j] == 0x5C {
                if bytes[j] == 0x3A || bytes[j] == 0x3D { assigned = true }
                j += 1
            }
            guard assigned else { i = j; continue }
            let start = j
            if start < bytes.count, bytes[start] == 0x3C { i = start; continue }  // already `<redacted…>`
            while j < bytes.count {
                let b = bytes[j]
                if b == 0x22 || b == 0x27 || b == 0x26 || b == 0x2C || b == 0x20 || b == 0x7D || b == 0x3B || b == 0x5C || b == 10 || b == 13 { break }
                j += 1
            }
            if j > start { return (start, j) }
            i = j
        }
        return nil
    }
}
