import Testing
@testable import BearerdOAuth

/// `Redaction.scrub` compares markers eight bytes at a time; it must redact exactly what the
/// byte-by-byte version did (kept here as the reference) on every line, including markers cut
/// off at the end of a line, mixed case, word boundaries and values already redacted.
@Suite struct RedactionScrubDifferentialTests {
    /// The byte-by-byte scan `scrub` used before (same rules).
    enum Reference {
        static func firstCredential(in bytes: UnsafeBufferPointer<UInt8>, from: Int) -> (Int, Int)? {
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
                for m in Redaction.markers where i + m.count <= bytes.count {
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
                if spaced {  // `Bearer Bearer X`: the value is X
                    var again = true
                    while again {
                        again = false
                        for scheme in ["bearer ", "basic "].map({ Array($0.utf8) }) where j + scheme.count <= bytes.count
                            && (0..<scheme.count).allSatisfy({ scheme[$0] == 0x20 ? bytes[j + $0] == 0x20 : bytes[j + $0] | 0x20 == scheme[$0] }) {
                            j += scheme.count
                            while j < bytes.count, bytes[j] == 0x20 { j += 1 }
                            again = true
                            break
                        }
                    }
                }
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

        static func scrub(_ line: String) -> String {
            String(decoding: scrub(bytes: Array(line.utf8)), as: UTF8.self)
        }

        static func scrub(bytes: [UInt8]) -> [UInt8] {
            var bytes = bytes
            var from = 0
            while let (start, end) = bytes.withUnsafeBufferPointer({ firstCredential(in: $0, from: from) }) {
                bytes.replaceSubrange(start..<end, with: Array("<redacted>".utf8))
                from = start + "<redacted>".utf8.count
            }
            return bytes
        }
    }

    static let pieces = [
        "bearer ", "Bearer ", "BEARER ", "basic ", "Basic", "access_token", "ACCESS_TOKEN", "refresh_token", "id_token",
        "client_secret", "password", "Password", "password_hint", "cookie:", "Cookie: ", "set-cookie:", "Set-Cookie:",
        "=", ":", "\"", "'", " ", "\\", "&", ",", "}", ";", "\n", ".", "_", "x", "eyJhbGciOi", "<redacted>", "<fp 1a2b>",
        "status", "path", "route", "session", "bytes", "protocol", "/small", "abc123", "a", "b", "p", "s", "c", "r", "i",
        "bearer", "passwor", "access_toke", "cookie", "é", "\u{1F600}",
    ]

    @Test func sameRedactionsAsTheByteByByteScan() {
        var rng = SeededRandom(seed: 0x5EED_0001)  // a failure names a reproducible line
        var lines = [
            "", "bearer", "bearer ", "bearer x", "Bearer eyJ.abc", "password=hunter2", "password_hint=x", "a.password=x",
            "{\"access_token\":\"abc\",\"refresh_token\":\"def\"}", "cookie:a=b; c=d", "id_token = 'q'", "client_secret:<redacted>",
            "{\"ts\":\"2026-11-26T03:39:38.123Z\",\"level\":\"info\",\"msg\":\"request\",\"method\":\"GET\",\"path\":\"/small\"}",
        ]
        for _ in 0..<20_000 {
            var line = ""
            for _ in 0..<Int.random(in: 1...12, using: &rng) { line += Self.pieces[Int.random(in: 0..<Self.pieces.count, using: &rng)] }
            lines.append(line)
        }
        var differing: [String] = []
        for line in lines where Redaction.scrub(line) != Reference.scrub(line) {
            differing.append(line)
        }
        let differingCount = differing.count  // a count: a failure prints one line, not all
        #expect(differingCount == 0, "first: \(differing.first ?? "")")
        // The bytes form too.
        for line in lines.prefix(2_000) {
            var bytes = Array(line.utf8)
            Redaction.scrub(bytes: &bytes)
            #expect(String(decoding: bytes, as: UTF8.self) == Reference.scrub(line))
        }
    }

    /// Raw bytes, not only UTF-8: the scan classifies eight bytes at a time, and bytes from 0x80
    /// up whose low seven bits are a letter, a digit, `_` or `.` (0xC1, 0xB0, 0xDF, 0xAE) must
    /// count as neither, nor may the bytes that case folding moves next to the letters
    /// (`@` `[` `` ` `` `{`) count as letters. Markers land at every offset within a word.
    @Test func sameRedactionsOnRawBytes() {
        var rng = SeededRandom(seed: 0x5EED_0002)
        let edges: [UInt8] = [0x00, 0x2D, 0x2E, 0x2F, 0x30, 0x39, 0x3A, 0x3D, 0x40, 0x41, 0x5A, 0x5B, 0x5F, 0x60, 0x61, 0x7A, 0x7B,
                              0x7F, 0x80, 0xAE, 0xB0, 0xC1, 0xDF, 0xE1, 0xFA, 0xFF, 0x20, 0x22, 0x3C]
        let markers = Self.pieces.prefix(18).map { Array($0.utf8) }
        var differing = 0
        var first: [UInt8] = []
        for _ in 0..<20_000 {
            var bytes: [UInt8] = []
            for _ in 0..<Int.random(in: 0...10, using: &rng) {
                switch Int.random(in: 0..<4, using: &rng) {
                case 0: bytes += markers[Int.random(in: 0..<markers.count, using: &rng)]
                case 1: bytes.append(edges[Int.random(in: 0..<edges.count, using: &rng)])
                case 2: bytes.append(UInt8.random(in: 0...255, using: &rng))
                default: bytes += Array(Self.pieces[Int.random(in: 0..<Self.pieces.count, using: &rng)].utf8)
                }
            }
            var scrubbed = bytes
            Redaction.scrub(bytes: &scrubbed)
            let contains = bytes.withUnsafeBufferPointer { Redaction.containsCredential($0) }
            if scrubbed != Reference.scrub(bytes: bytes) || contains != (scrubbed != bytes) {
                differing += 1
                if first.isEmpty { first = bytes }
            }
        }
        #expect(differing == 0, "first: \(first)")
    }

    /// A token that carried its scheme already (`Bearer Bearer X`, a common misconfiguration):
    /// the credential is X, not the second scheme word.
    @Test func aRepeatedSchemeWordIsNotTheCredential() {
        #expect(Redaction.scrub("upstream said Authorization: Bearer Bearer eyJ.abc end") == "upstream said Authorization: Bearer Bearer <redacted> end")
        #expect(Redaction.scrub("basic  BASIC bearer dXNlcjpw") == "basic  BASIC bearer <redacted>")
        #expect(Redaction.scrub("Bearer Bearer ") == "Bearer Bearer ", "nothing after the schemes: nothing to redact")
        #expect(Redaction.scrub("Bearer bearerish") == "Bearer <redacted>", "a word that only starts like a scheme is the value")
    }

    /// `containsCredential` answers no for lines shorter than this without scanning them.
    @Test func noCredentialIsShorterThanTheShortestMarkerAndOneByte() {
        #expect(Redaction.shortestCredential == Redaction.markers.map(\.count).min()! + 1)
        var shortest = Array("basic x".utf8)
        #expect(shortest.count == Redaction.shortestCredential)
        #expect(shortest.withUnsafeBufferPointer { Redaction.containsCredential($0) })
        Redaction.scrub(bytes: &shortest)
        #expect(String(decoding: shortest, as: UTF8.self) == "basic <redacted>")
    }

    /// The letters of every byte value at every position of a word.
    @Test func lettersOfEveryByte() {
        for b in 0...255 {
            let byte = UInt8(b)
            let l = byte | 0x20
            let letter = l >= 0x61 && l <= 0x7A
            for k in 0..<8 {
                // The other bytes are letters, so a borrow into or out of byte k would show.
                let others = 0x8080_8080_8080_8080 & ~(UInt64(0x80) << UInt64(8 * k))
                var w: UInt64 = 0x6161_6161_6161_6161
                w &= ~(UInt64(0xFF) << UInt64(8 * k))
                w |= UInt64(byte) << UInt64(8 * k)
                let found = Redaction.letters(w)
                #expect((found >> UInt64(8 * k + 7)) & 1 == (letter ? 1 : 0), "byte \(b) at \(k)")
                #expect(found & others == others, "byte \(b) at \(k)")
                #expect(found & ~0x8080_8080_8080_8080 == 0, "byte \(b) at \(k)")
            }
        }
    }
}
