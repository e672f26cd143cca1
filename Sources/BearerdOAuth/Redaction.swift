/// What may be shown of credentials in logs (docs/architecture.md §5): header values that carry credentials
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

    /// Whether `scrub` would change this line (a line without one is written as it is).
    public static func containsCredential(_ line: UnsafeBufferPointer<UInt8>) -> Bool {
        line.count >= shortestCredential && firstCredential(in: line, from: 0) != nil
    }

    /// No credential fits in fewer bytes: the shortest marker (`basic `) and one byte of value
    /// (a test checks it against `markers`).
    package static let shortestCredential = 7

    /// The markers as 16-byte comparisons (every marker has at most 16 bytes): for marker `n`,
    /// `markerWords[6n ..< 6n+6]` = its bytes little-endian in two words, 0x20 in two `fold`
    /// words where a letter is matched case-insensitively (the line's byte is OR-ed with it, as
    /// the byte-by-byte comparison did), 0xFF in two `mask` words where the marker has a byte.
    /// Plain integers, so the scan touches no reference count.
    private static let markerWords: [UInt64] = markers.flatMap { m -> [UInt64] in
        precondition(m.count <= 16, "a redaction marker longer than 16 bytes")
        var w = [UInt64](repeating: 0, count: 6)
        for (k, b) in m.enumerated() {
            let word = k / 8, shift = UInt64(8 * (k % 8))
            w[word] |= UInt64(b) << shift
            if b >= 0x61 && b <= 0x7A { w[2 + word] |= 0x20 << shift }
            w[4 + word] |= 0xFF << shift
        }
        return w
    }
    private static let markerCounts: [Int] = markers.map(\.count)
    /// For every byte value: bit `n` set when marker `n` may start with that byte (its first
    /// letter in either case); 0 for the bytes no marker starts with, so the scan tests each
    /// byte with one table load and compares only the markers that can match.
    private static let markersStartingWith: [UInt16] = (0...255).map { b in
        var bits: UInt16 = 0
        for (n, m) in markers.enumerated() where UInt8(b) | 0x20 == m[0] { bits |= 1 << UInt16(n) }
        return bits
    }

    /// The length of the scheme marker (`bearer `, `basic `, any case) at `at`, if one is there.
    static func schemeWord(at: Int, in bytes: UnsafeBufferPointer<UInt8>) -> Int? {
        for scheme in schemeMarkers where at + scheme.count <= bytes.count {
            var k = 0
            while k < scheme.count, (scheme[k] == 0x20 ? bytes[at + k] : bytes[at + k] | 0x20) == scheme[k] { k += 1 }
            if k == scheme.count { return k }
        }
        return nil
    }
    private static let schemeMarkers: [[UInt8]] = markers.filter { $0.last == 0x20 }

    /// For eight bytes as a little-endian word, the high bit of each byte that is an ASCII letter.
    /// Every byte is handled as `0x80 | (b & 0x7F)`, so the subtractions never borrow from the
    /// next byte; bytes from 0x80 up are masked out at the end.
    @inline(__always)
    static func letters(_ w: UInt64) -> UInt64 {
        let hi: UInt64 = 0x8080_8080_8080_8080, ones: UInt64 = 0x0101_0101_0101_0101
        // A-Z onto a-z (0x40-0x5F onto 0x60-0x7F: `@`, `[`, `_` and the like stay out of range).
        let folded = w | hi | 0x2020_2020_2020_2020
        let atLeastA = (folded &- 0x61 &* ones) & hi, pastZ = (folded &- 0x7B &* ones) & hi
        return atLeastA & ~pastZ & ~w
    }

    /// The byte range of the first credential value at or after `from`. A marker counts only
    /// where a word starts (not after a letter, digit, `_` or `.`), is not followed by a word
    /// byte (`password_hint`) unless it ends in a space, and is followed by `=`/`:` (after
    /// quotes, spaces or backslashes) unless it ends in a space or colon; the value runs to the
    /// next delimiter, and one already redacted (`<…>`) is skipped.
    ///
    /// Eight bytes at a time: `letters` finds the letters not preceded by a letter, and only
    /// those are looked up as a marker's first letter and checked for a word start. A 250-byte
    /// access-log line has about 25 of them; the byte-at-a-time loop before cost 11 instructions
    /// per byte, this one about 8 (bench/RESULTS.md).
    private static func firstCredential(in bytes: UnsafeBufferPointer<UInt8>, from: Int) -> (Int, Int)? {
        func isLetter(_ b: UInt8) -> Bool { let l = b | 0x20; return l >= 0x61 && l <= 0x7A }
        func isWord(_ b: UInt8) -> Bool { isLetter(b) || (b >= 0x30 && b <= 0x39) || b == 0x5F }
        guard let base = bytes.baseAddress else { return nil }
        let count = bytes.count
        /// What a word start at `i` holds: nothing, a credential's range, or a marker whose value
        /// was refused (the scan goes on after it, at `skipTo`).
        enum Found { case nothing, credential(Int, Int), skipTo(Int) }
        return markerWords.withUnsafeBufferPointer { words in
            markerCounts.withUnsafeBufferPointer { counts in
              markersStartingWith.withUnsafeBufferPointer { startingWith in
                /// The 8 bytes at `at` as a little-endian word; zeros past the end (no marker has
                /// a zero byte, a zero is not a letter, and a marker longer than what is left is
                /// never compared).
                @inline(__always) func word(_ at: Int) -> UInt64 {
                    if at + 8 <= count { return UInt64(littleEndian: UnsafeRawPointer(base + at).loadUnaligned(as: UInt64.self)) }
                    return tail(at)
                }
                /// `word` for the last bytes of the line.
                @inline(never) func tail(_ at: Int) -> UInt64 {
                    var w: UInt64 = 0
                    var k = 0
                    while at + k < count && k < 8 {
                        w |= UInt64(base[at + k]) << UInt64(8 * k)
                        k += 1
                    }
                    return w
                }
                /// A marker at the word start `i`, and what follows it.
                func examine(_ i: Int) -> Found {
                    var candidates = startingWith[Int(base[i])]
                    guard candidates != 0 else { return .nothing }
                    let w0 = word(i)
                    var w1: UInt64?
                    var matched = -1
                    while candidates != 0 {
                        let n = candidates.trailingZeroBitCount  // markers in their order: the first that matches wins
                        candidates &= candidates &- 1
                        guard i + counts[n] <= count else { continue }
                        let k = 6 * n
                        guard (w0 | words[k + 2]) & words[k + 4] == words[k] else { continue }
                        if counts[n] > 8 {
                            let second = w1 ?? word(i + 8)
                            w1 = second
                            guard (second | words[k + 3]) & words[k + 5] == words[k + 1] else { continue }
                        }
                        matched = n
                        break
                    }
                    guard matched >= 0 else { return .nothing }
                    let marker = markers[matched]
                    var j = i + marker.count
                    let spaced = marker.last == 0x20
                    if !spaced, j < count, isWord(base[j]) { return .skipTo(j) }  // e.g. `password_hint`
                    var assigned = spaced || marker.last == 0x3A
                    while j < count, base[j] == 0x22 || base[j] == 0x27 || base[j] == 0x3A || base[j] == 0x3D || base[j] == 0x20 || base[j] == 0x5C {
                        if base[j] == 0x3A || base[j] == 0x3D { assigned = true }
                        j += 1
                    }
                    guard assigned else { return .skipTo(j) }
                    if spaced {
                        // `Bearer Bearer X` (a token that carried its scheme already): the value
                        // is X, not the second scheme word.
                        while let n = schemeWord(at: j, in: bytes) {
                            j += n
                            while j < count, base[j] == 0x20 { j += 1 }
                        }
                    }
                    let start = j
                    if start < count, base[start] == 0x3C { return .skipTo(start) }  // already `<redacted…>`
                    while j < count {
                        let b = base[j]
                        if b == 0x22 || b == 0x27 || b == 0x26 || b == 0x2C || b == 0x20 || b == 0x7D || b == 0x3B || b == 0x5C || b == 10 || b == 13 { break }
                        j += 1
                    }
                    return j > start ? .credential(start, j) : .skipTo(j)
                }
                /// Whether byte `i - 1` keeps a marker from starting at `i`.
                func blockedAt(_ i: Int) -> Bool { i > 0 && (isWord(base[i - 1]) || base[i - 1] == 0x2E) }
                var i = max(0, from)
                var afterLetter = i > 0 && i < count && isLetter(base[i - 1])
                scan: while i < count {
                    let found = letters(word(i))
                    // Letters after a non-letter (in this word, or the last byte of the one
                    // before): every word start is one; a digit, `_` or `.` before it is checked
                    // below.
                    var starts = found & ~((found << 8) | (afterLetter ? 0x80 : 0))
                    while starts != 0 {
                        let at = i + starts.trailingZeroBitCount >> 3
                        starts &= starts &- 1
                        guard startingWith[Int(base[at])] != 0, !blockedAt(at) else { continue }
                        switch examine(at) {
                        case .nothing:
                            continue
                        case .credential(let start, let end):
                            return (start, end)
                        case .skipTo(let j):  // after the marker (j > at): positions in between are not starts
                            i = j
                            afterLetter = isLetter(base[j - 1])
                            continue scan
                        }
                    }
                    afterLetter = found >> 63 != 0
                    i += 8
                }
                return nil
              }
            }
        }
    }
}
