import BearerdOAuth

/// What an upstream's answer to a SIGNED request says about the signature and its credentials
/// (AWS SigV4, OSS V4). Pure and bounded: it reads the status, a few header fields and the held
/// body (at most `maxBodyBytes`), and never traps on what the server sends.
///
/// Contract. A credentials rejection (`ExpiredToken`, `InvalidAccessKeyId`, … with status 400 or
/// 403) refreshes the credentials once and replays once; a clock-skew answer
/// (`RequestTimeTooSkewed`, `RequestExpired`, `RequestInTheFuture`) adopts the server's clock and
/// re-signs once; a signature mismatch is never replayed (the bytes signed are wrong, not the keys
/// or the time), and its log line names the canonical request's hash the server computed.
///
/// Where the code comes from (in this order, as botocore's parsers read it):
/// - the body, sniffed by its first byte (`<` XML, `{` JSON), not by Content-Type (moto labels its
///   query-API XML errors `text/html`):
///   - XML: `<Error><Code>` (S3, OSS), `<ErrorResponse><Error><Code>` (query APIs),
///     `<ErrorResponse><Errors><Error><Code>` (moto's query errors), `<Response><Errors><Error>`
///     (EC2). A strict, bounded reader: no DTD, the five predefined entities and numeric
///     references only, depth ≤ `maxDepth`; a malformed document yields no code.
///   - JSON: the top-level `__type`, else `code`, else `Code` (`"…#ExpiredTokenException"` keeps
///     what follows the last `#`).
/// - header fields: `x-amzn-query-error` (`Code;Sender`), `x-amzn-ErrorType`
///   (`ExpiredTokenException:http://internal.amazon.com/…`: what precedes `:`), `x-amz-error-code`,
///   and OSS's `x-oss-ec` (the numeric EC of a body-less HEAD answer; two are known here).
/// A code is kept only if it is 1–128 bytes of `A–Z a–z 0–9 . _ -`, so a log line never carries
/// what a server made up.
///
/// A HEAD answer has no body; S3 (and moto) send no error-code field with it, so a body-less 403
/// without one of the fields above is `.otherError(code: nil)`: the caller cannot tell an expired
/// token from a denied key there, and must not guess.
public enum SignedResponseVerdict: Sendable, Equatable {
    /// Status below 400: whatever the body says, it is not an error answer.
    case notAnError
    /// The credentials are no longer good (status 400 or 403): refresh once, replay once.
    case credentialsRejected(code: String)
    /// The request's time is too far from the server's: re-sign once with the server's clock,
    /// from the body's `<ServerTime>` or else the `Date` field; nil if neither is readable.
    case clockSkew(code: String, serverEpochSeconds: Int64?)
    /// The server computed another signature: never replayed. `serverCanonicalRequestHash` is the
    /// last line of the body's `<StringToSign>` (64 lower-case hex digits), to compare with the
    /// hash of the canonical request bearerd signed. Nothing else of the body is kept (S3's
    /// `<CanonicalRequest>` holds the session token).
    case signatureMismatch(code: String, serverCanonicalRequestHash: String?)
    /// Any other error answer, with its code when one was readable.
    case otherError(code: String?)

    /// The most of a rejection's body the caller needs to hold; a longer body is not read.
    public static let maxBodyBytes = 64 * 1024
    /// Element or JSON nesting beyond this makes the body unreadable.
    public static let maxDepth = 16

    /// Credentials rejections, by the code of the S3, STS/query, JSON and OSS APIs.
    static let credentialCodes: Set<String> = [
        "ExpiredToken", "ExpiredTokenException", "InvalidAccessKeyId", "InvalidToken",
        "TokenRefreshRequired", "InvalidClientTokenId", "UnrecognizedClientException",
        "SecurityTokenExpired", "InvalidSecurityToken",
    ]
    /// Clock skew: the unambiguous members of the AWS SDKs' clock-skew list
    /// (aws-sdk-js-v3 `CLOCK_SKEW_ERROR_CODES`: AuthFailure, InvalidSignatureException,
    /// RequestExpired, RequestInTheFuture, RequestTimeTooSkewed, SignatureDoesNotMatch). The SDKs
    /// retry the other three only after comparing clocks; here they are mismatches, never replayed.
    static let skewCodes: Set<String> = ["RequestTimeTooSkewed", "RequestExpired", "RequestInTheFuture"]
    static let mismatchCodes: Set<String> = ["SignatureDoesNotMatch", "InvalidSignatureException", "AuthFailure", "IncompleteSignature"]
    /// OSS `x-oss-ec` values of body-less answers (help.aliyun.com/en/oss/user-guide/0002-00000007:
    /// the STS credentials have expired; …/0002-00000504 and …/0002-00000501: request time too
    /// far from the server's; …/0002-00000006 and …/0002-00000008: the security token is invalid,
    /// which a token from another STS answer than the keys' is, e.g. after a rotation).
    static let ossECCodes: [String: String] = [
        "0002-00000007": "SecurityTokenExpired",
        "0002-00000006": "InvalidSecurityToken",
        "0002-00000008": "InvalidSecurityToken",
        "0002-00000504": "RequestTimeTooSkewed",
        "0002-00000501": "RequestTimeTooSkewed",
    ]

    /// Classifies an answer. `headers`: the response's fields (names in any case); `body`: the held
    /// body (empty for HEAD or when nothing was held).
    public static func classify(status: Int, headers: [(name: String, value: String)], body: [UInt8]) -> SignedResponseVerdict {
        guard status >= 400 else { return .notAnError }
        let doc = body.count <= maxBodyBytes ? ErrorDocument.read(body) : ErrorDocument()
        let code = doc.code.flatMap(normalizedCode) ?? headerCode(headers)
        guard let code else { return .otherError(code: nil) }
        let authStatus = status == 400 || status == 401 || status == 403
        if credentialCodes.contains(code) {
            return status == 400 || status == 403 ? .credentialsRejected(code: code) : .otherError(code: code)
        }
        if skewCodes.contains(code), authStatus {
            let server = doc.serverTime.flatMap(HTTPTime.parseISO8601) ?? field("date", headers).flatMap(HTTPTime.parseIMFFixdate)
            return .clockSkew(code: code, serverEpochSeconds: server)
        }
        if mismatchCodes.contains(code), authStatus {
            return .signatureMismatch(code: code, serverCanonicalRequestHash: doc.stringToSign.flatMap(canonicalRequestHash))
        }
        return .otherError(code: code)
    }

    static func field(_ name: String, _ headers: [(name: String, value: String)]) -> String? {
        headers.first { asciiLowercased($0.name) == name }?.value
    }

    static func asciiLowercased(_ s: String) -> String {
        String(decoding: s.utf8.map { $0 >= 0x41 && $0 <= 0x5A ? $0 + 0x20 : $0 }, as: UTF8.self)
    }

    static func headerCode(_ headers: [(name: String, value: String)]) -> String? {
        if let q = field("x-amzn-query-error", headers), let c = normalizedCode(String(q.split(separator: ";", omittingEmptySubsequences: false)[0])) { return c }
        if let t = field("x-amzn-errortype", headers), let c = normalizedCode(t) { return c }
        if let a = field("x-amz-error-code", headers), let c = normalizedCode(a) { return c }
        if let ec = field("x-oss-ec", headers), let c = ossECCodes[trimmed(ec)] { return c }
        return nil
    }

    /// `prefix#Code:suffix` → `Code`, surrounding white space removed; nil unless 1–128 bytes of
    /// `A–Z a–z 0–9 . _ -`.
    static func normalizedCode(_ raw: String) -> String? {
        var s = Substring(trimmed(raw))
        if let colon = s.firstIndex(of: ":") { s = s[..<colon] }
        if let hash = s.lastIndex(of: "#") { s = s[s.index(after: hash)...] }
        let bytes = Array(s.utf8)
        guard !bytes.isEmpty, bytes.count <= 128, bytes.allSatisfy(isCodeByte) else { return nil }
        return String(decoding: bytes, as: UTF8.self)
    }

    static func isCodeByte(_ b: UInt8) -> Bool {
        (b >= 0x30 && b <= 0x39) || (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || b == 0x2E || b == 0x5F || b == 0x2D
    }

    static func trimmed(_ s: String) -> String {
        let u = Array(s.utf8)
        guard let first = u.firstIndex(where: { !isSpace($0) }), let last = u.lastIndex(where: { !isSpace($0) }) else { return "" }
        return String(decoding: u[first...last], as: UTF8.self)
    }

    static func isSpace(_ b: UInt8) -> Bool { b == 0x20 || b == 0x09 || b == 0x0A || b == 0x0D }

    /// The last line of a SigV4/OSS V4 string to sign is the hex SHA-256 of the canonical request.
    static func canonicalRequestHash(_ stringToSign: String) -> String? {
        let lines = Array(stringToSign.utf8).split(separator: 0x0A, omittingEmptySubsequences: false)
        guard lines.count == 4, let last = lines.last else { return nil }
        let hex = Array(last.filter { $0 != 0x0D })
        guard hex.count == 64, hex.allSatisfy({ ($0 >= 0x30 && $0 <= 0x39) || ($0 >= 0x61 && $0 <= 0x66) }) else { return nil }
        return String(decoding: hex, as: UTF8.self)
    }
}

/// The few fields of an error body the verdict needs, read once from the held bytes. Owns
/// nothing beyond the extracted strings; a body that is not a well-formed, bounded XML or JSON
/// document leaves every field nil.
struct ErrorDocument: Equatable {
    var code: String?
    var serverTime: String?
    var stringToSign: String?

    static func read(_ body: [UInt8]) -> ErrorDocument {
        var i = 0
        if body.starts(with: [0xEF, 0xBB, 0xBF]) { i = 3 }
        while i < body.count, SignedResponseVerdict.isSpace(body[i]) { i += 1 }
        guard i < body.count else { return ErrorDocument() }
        switch body[i] {
        case UInt8(ascii: "<"):
            var r = ErrorXMLReader(bytes: body, at: i)
            return r.read() ?? ErrorDocument()
        case UInt8(ascii: "{"):
            var r = ErrorJSONReader(bytes: body, at: i)
            return r.read() ?? ErrorDocument()
        default:
            return ErrorDocument()
        }
    }
}

/// A strict, bounded XML reader for AWS/OSS error documents: one pass over the held bytes, a stack
/// of open element names no deeper than `SignedResponseVerdict.maxDepth`. Reads the `Code`,
/// `ServerTime` and `StringToSign` children of the error element only; refuses a DTD, an unknown
/// entity, a mismatched end tag or a truncated document (returns nil).
struct ErrorXMLReader {
    let bytes: [UInt8]
    var i: Int
    init(bytes: [UInt8], at start: Int) { self.bytes = bytes; self.i = start }

    private struct Frame { var name: [UInt8]; var text: [UInt8] = []; var hasChild = false }

    static let errorPaths: [[[UInt8]]] = [["Error"], ["ErrorResponse", "Error"], ["ErrorResponse", "Errors", "Error"], ["Response", "Errors", "Error"]]
        .map { $0.map { Array($0.utf8) } }

    private func at(_ s: StaticString) -> Bool {
        let n = s.utf8CodeUnitCount
        guard bytes.count - i >= n else { return false }
        return s.withUTF8Buffer { buf in (0..<n).allSatisfy { bytes[i + $0] == buf[$0] } }
    }

    /// Advances past the first occurrence of `end`; false if it never comes.
    private mutating func skip(past end: StaticString) -> Bool {
        while i < bytes.count {
            if at(end) { i += end.utf8CodeUnitCount; return true }
            i += 1
        }
        return false
    }

    private static func isNameByte(_ b: UInt8) -> Bool {
        !(SignedResponseVerdict.isSpace(b) || b == 0x3C || b == 0x3E || b == 0x2F || b == 0x3D || b == 0x22 || b == 0x27 || b == 0x26)
    }

    private mutating func name() -> [UInt8]? {
        let start = i
        while i < bytes.count, Self.isNameByte(bytes[i]) { i += 1 }
        return i > start ? Array(bytes[start..<i]) : nil
    }

    private mutating func spaces() { while i < bytes.count, SignedResponseVerdict.isSpace(bytes[i]) { i += 1 } }

    /// Prolog and epilog: white space, comments, processing instructions; no DTD.
    private mutating func misc() -> Bool {
        while true {
            spaces()
            if at("<!--") { i += 4; guard skip(past: "-->") else { return false } }
            else if at("<?") { i += 2; guard skip(past: "?>") else { return false } }
            else if at("<!") { return false }
            else { return true }
        }
    }

    /// `&…;` at `i` (past the `&`): one of the five predefined entities or a numeric reference.
    private mutating func entity() -> [UInt8]? {
        let start = i
        while i < bytes.count, bytes[i] != 0x3B, i - start < 12 { i += 1 }
        guard i < bytes.count, bytes[i] == 0x3B else { return nil }
        let ref = Array(bytes[start..<i]); i += 1
        switch String(decoding: ref, as: UTF8.self) {
        case "lt": return [0x3C]
        case "gt": return [0x3E]
        case "amp": return [0x26]
        case "quot": return [0x22]
        case "apos": return [0x27]
        default: break
        }
        guard ref.count >= 2, ref[0] == 0x23 else { return nil }
        var value: UInt32 = 0
        let hex = ref[1] == 0x78
        let digits = ref.dropFirst(hex ? 2 : 1)
        guard !digits.isEmpty, digits.count <= 8 else { return nil }
        for d in digits {
            let v: UInt32
            switch d {
            case 0x30...0x39: v = UInt32(d - 0x30)
            case 0x61...0x66 where hex: v = UInt32(d - 0x61 + 10)
            case 0x41...0x46 where hex: v = UInt32(d - 0x41 + 10)
            default: return nil
            }
            let (m, o1) = value.multipliedReportingOverflow(by: hex ? 16 : 10)
            let (s, o2) = m.addingReportingOverflow(v)
            guard !o1, !o2 else { return nil }
            value = s
        }
        // XML 1.0 Char: no NUL and no other C0 control but tab, LF, CR.
        guard value >= 0x20 || value == 0x09 || value == 0x0A || value == 0x0D, let scalar = Unicode.Scalar(value) else { return nil }
        return Array(String(Character(scalar)).utf8)
    }

    mutating func read() -> ErrorDocument? {
        var doc = ErrorDocument()
        guard misc(), at("<") else { return nil }
        var stack: [Frame] = []
        var done = false
        while !done {
            guard i < bytes.count else { return nil }
            let b = bytes[i]
            if b == 0x3C {
                if at("<!--") { i += 4; guard skip(past: "-->") else { return nil }; continue }
                if at("<![CDATA[") {
                    guard !stack.isEmpty else { return nil }
                    i += 9
                    let start = i
                    guard skip(past: "]]>") else { return nil }
                    if stack.count <= 4 { stack[stack.count - 1].text += bytes[start..<(i - 3)] }
                    continue
                }
                if at("<?") { i += 2; guard skip(past: "?>") else { return nil }; continue }
                if at("<!") { return nil }
                i += 1
                if i < bytes.count, bytes[i] == 0x2F {
                    i += 1
                    guard let n = name(), let top = stack.popLast(), top.name == n else { return nil }
                    spaces()
                    guard i < bytes.count, bytes[i] == 0x3E else { return nil }
                    i += 1
                    record(top, under: stack, into: &doc)
                    if stack.isEmpty { done = true }
                    continue
                }
                guard let n = name() else { return nil }
                // Attributes: name = "value" | 'value', skipped (no `<` inside a value).
                var selfClosing = false
                while true {
                    let hadSpace = i < bytes.count && SignedResponseVerdict.isSpace(bytes[i])
                    spaces()
                    guard i < bytes.count else { return nil }
                    if bytes[i] == 0x3E { i += 1; break }
                    if at("/>") { i += 2; selfClosing = true; break }
                    guard hadSpace, name() != nil else { return nil }
                    spaces()
                    guard i < bytes.count, bytes[i] == 0x3D else { return nil }
                    i += 1
                    spaces()
                    guard i < bytes.count, bytes[i] == 0x22 || bytes[i] == 0x27 else { return nil }
                    let quote = bytes[i]
                    i += 1
                    while i < bytes.count, bytes[i] != quote { guard bytes[i] != 0x3C else { return nil }; i += 1 }
                    guard i < bytes.count else { return nil }
                    i += 1
                }
                guard stack.count < SignedResponseVerdict.maxDepth else { return nil }
                if !stack.isEmpty { stack[stack.count - 1].hasChild = true }
                let frame = Frame(name: n)
                if selfClosing {
                    record(frame, under: stack, into: &doc)
                    if stack.isEmpty { done = true }
                } else {
                    stack.append(frame)
                }
            } else if b == 0x26 {
                i += 1
                guard let decoded = entity() else { return nil }
                guard !stack.isEmpty else { return nil }
                if stack.count <= 4 { stack[stack.count - 1].text += decoded }
            } else {
                guard !stack.isEmpty else { return nil }
                let start = i
                while i < bytes.count, bytes[i] != 0x3C, bytes[i] != 0x26 { i += 1 }
                if stack.count <= 4 { stack[stack.count - 1].text += bytes[start..<i] }
            }
        }
        guard misc(), i == bytes.count else { return nil }
        return doc
    }

    /// A closed element `child` whose parents are `parents`: kept if its parent is the error
    /// element and it is one of the three fields (first occurrence wins, text-only content).
    private func record(_ child: Frame, under parents: [Frame], into doc: inout ErrorDocument) {
        guard !child.hasChild, Self.errorPaths.contains(where: { $0.count == parents.count && zip($0, parents).allSatisfy { $0 == $1.name } }) else { return }
        let text = SignedResponseVerdict.trimmed(String(decoding: child.text, as: UTF8.self))
        switch String(decoding: child.name, as: UTF8.self) {
        case "Code": if doc.code == nil { doc.code = text }
        case "ServerTime": if doc.serverTime == nil { doc.serverTime = text }
        case "StringToSign": if doc.stringToSign == nil { doc.stringToSign = text }
        default: break
        }
    }
}

/// A strict, bounded JSON reader (RFC 8259) for AWS JSON error bodies: one pass, nesting no deeper
/// than `SignedResponseVerdict.maxDepth`; keeps the top-level `__type`, `code` and `Code` strings.
struct ErrorJSONReader {
    let bytes: [UInt8]
    var i: Int
    init(bytes: [UInt8], at start: Int) { self.bytes = bytes; self.i = start }

    private mutating func ws() { while i < bytes.count, bytes[i] == 0x20 || bytes[i] == 0x09 || bytes[i] == 0x0A || bytes[i] == 0x0D { i += 1 } }

    private mutating func hex4() -> UInt32? {
        guard bytes.count - i >= 4 else { return nil }
        var v: UInt32 = 0
        for _ in 0..<4 {
            let d = bytes[i]; i += 1
            switch d {
            case 0x30...0x39: v = v << 4 | UInt32(d - 0x30)
            case 0x61...0x66: v = v << 4 | UInt32(d - 0x61 + 10)
            case 0x41...0x46: v = v << 4 | UInt32(d - 0x41 + 10)
            default: return nil
            }
        }
        return v
    }

    /// A string at `i` (the opening quote), decoded.
    private mutating func string() -> [UInt8]? {
        guard i < bytes.count, bytes[i] == 0x22 else { return nil }
        i += 1
        var out: [UInt8] = []
        while i < bytes.count {
            let b = bytes[i]
            if b == 0x22 { i += 1; return out }
            guard b >= 0x20 else { return nil }
            if b != 0x5C { out.append(b); i += 1; continue }
            i += 1
            guard i < bytes.count else { return nil }
            let e = bytes[i]; i += 1
            switch e {
            case 0x22, 0x5C, 0x2F: out.append(e)
            case 0x62: out.append(0x08)
            case 0x66: out.append(0x0C)
            case 0x6E: out.append(0x0A)
            case 0x72: out.append(0x0D)
            case 0x74: out.append(0x09)
            case 0x75:
                guard var u = hex4() else { return nil }
                if u >= 0xD800 && u < 0xDC00 {
                    guard bytes.count - i >= 2, bytes[i] == 0x5C, bytes[i + 1] == 0x75 else { return nil }
                    i += 2
                    guard let low = hex4(), low >= 0xDC00 && low < 0xE000 else { return nil }
                    u = 0x10000 + ((u - 0xD800) << 10) + (low - 0xDC00)
                }
                guard let scalar = Unicode.Scalar(u) else { return nil }
                out += Array(String(Character(scalar)).utf8)
            default: return nil
            }
        }
        return nil
    }

    private mutating func literal(_ s: StaticString) -> Bool {
        let n = s.utf8CodeUnitCount
        guard bytes.count - i >= n, s.withUTF8Buffer({ buf in (0..<n).allSatisfy { bytes[i + $0] == buf[$0] } }) else { return false }
        i += n
        return true
    }

    /// Skips one value at `i`; nested containers count against the depth bound.
    private mutating func value(depth: Int) -> Bool {
        guard depth <= SignedResponseVerdict.maxDepth, i < bytes.count else { return false }
        switch bytes[i] {
        case 0x22: return string() != nil
        case 0x7B:
            i += 1; ws()
            if i < bytes.count, bytes[i] == 0x7D { i += 1; return true }
            while true {
                ws()
                guard string() != nil else { return false }
                ws()
                guard i < bytes.count, bytes[i] == 0x3A else { return false }
                i += 1; ws()
                guard value(depth: depth + 1) else { return false }
                ws()
                guard i < bytes.count else { return false }
                if bytes[i] == 0x2C { i += 1; continue }
                if bytes[i] == 0x7D { i += 1; return true }
                return false
            }
        case 0x5B:
            i += 1; ws()
            if i < bytes.count, bytes[i] == 0x5D { i += 1; return true }
            while true {
                ws()
                guard value(depth: depth + 1) else { return false }
                ws()
                guard i < bytes.count else { return false }
                if bytes[i] == 0x2C { i += 1; continue }
                if bytes[i] == 0x5D { i += 1; return true }
                return false
            }
        case 0x74: return literal("true")
        case 0x66: return literal("false")
        case 0x6E: return literal("null")
        default:
            let start = i
            while i < bytes.count, (bytes[i] >= 0x30 && bytes[i] <= 0x39) || bytes[i] == 0x2D || bytes[i] == 0x2B || bytes[i] == 0x2E || bytes[i] == 0x65 || bytes[i] == 0x45 { i += 1 }
            return i > start
        }
    }

    mutating func read() -> ErrorDocument? {
        guard i < bytes.count, bytes[i] == 0x7B else { return nil }
        i += 1
        var type: String?, lower: String?, upper: String?
        ws()
        if i < bytes.count, bytes[i] == 0x7D { i += 1 } else {
            while true {
                ws()
                guard let key = string() else { return nil }
                ws()
                guard i < bytes.count, bytes[i] == 0x3A else { return nil }
                i += 1; ws()
                let start = i
                if i < bytes.count, bytes[i] == 0x22 {
                    guard let s = string() else { return nil }
                    let text = String(decoding: s, as: UTF8.self)
                    switch String(decoding: key, as: UTF8.self) {
                    case "__type": if type == nil { type = text }
                    case "code": if lower == nil { lower = text }
                    case "Code": if upper == nil { upper = text }
                    default: break
                    }
                } else {
                    i = start
                    guard value(depth: 2) else { return nil }
                }
                ws()
                guard i < bytes.count else { return nil }
                if bytes[i] == 0x2C { i += 1; continue }
                if bytes[i] == 0x7D { i += 1; break }
                return nil
            }
        }
        ws()
        guard i == bytes.count else { return nil }
        return ErrorDocument(code: type ?? lower ?? upper, serverTime: nil, stringToSign: nil)
    }
}

/// Times servers send, as seconds since the epoch, without Foundation: the IMF-fixdate of a `Date`
/// field (RFC 9110 §5.6.7) and the ISO 8601 forms of an error body's `<ServerTime>`. Every field is
/// range-checked before any arithmetic, so nothing a server sends can overflow.
enum HTTPTime {
    static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    static let weekdays = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]

    static func digits(_ b: ArraySlice<UInt8>) -> Int? {
        guard !b.isEmpty, b.count <= 4 else { return nil }
        var v = 0
        for d in b { guard d >= 0x30 && d <= 0x39 else { return nil }; v = v * 10 + Int(d - 0x30) }
        return v
    }

    static func isLeap(_ y: Int) -> Bool { (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 }

    /// Unix seconds of a UTC date and time, range-checked (year 1–9999), else nil.
    static func epochSeconds(year: Int, month: Int, day: Int, hour: Int, minute: Int, second: Int) -> Int64? {
        guard (1...9999).contains(year), (1...12).contains(month), (0...23).contains(hour), (0...59).contains(minute), (0...60).contains(second) else { return nil }
        let monthDays = [31, isLeap(year) ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        guard day >= 1, day <= monthDays[month - 1] else { return nil }
        let days = CivilTime.daysFromCivil(year: Int64(year), month: Int64(month), day: Int64(day))
        return days * 86_400 + Int64(hour * 3600 + minute * 60 + second)
    }

    /// `Sun, 06 Nov 1994 08:49:37 GMT`, exactly.
    static func parseIMFFixdate(_ s: String) -> Int64? {
        let b = Array(SignedResponseVerdict.trimmed(s).utf8)
        guard b.count == 29, b[3] == 0x2C, b[4] == 0x20, b[7] == 0x20, b[11] == 0x20, b[16] == 0x20,
              b[19] == 0x3A, b[22] == 0x3A, b[25] == 0x20, String(decoding: b[26..<29], as: UTF8.self) == "GMT",
              weekdays.contains(String(decoding: b[0..<3], as: UTF8.self)),
              let monthIndex = months.firstIndex(of: String(decoding: b[8..<11], as: UTF8.self)),
              let day = digits(b[5..<7]), let year = digits(b[12..<16]),
              let hour = digits(b[17..<19]), let minute = digits(b[20..<22]), let second = digits(b[23..<25]) else { return nil }
        return epochSeconds(year: year, month: monthIndex + 1, day: day, hour: hour, minute: minute, second: second)
    }

    /// `2026-11-29T08:00:00Z`, `2026-11-29T08:00:00.123Z`, `20261129T080000Z`, and a `±HH:MM` /
    /// `±HHMM` offset instead of `Z` (`20180424T13:15:18+03:00`, as one S3-compatible server sends).
    static func parseISO8601(_ s: String) -> Int64? {
        let b = Array(SignedResponseVerdict.trimmed(s).utf8)
        guard b.count <= 40 else { return nil }
        var i = 0
        func number(_ n: Int) -> Int? {
            guard b.count - i >= n, let v = digits(b[i..<(i + n)]) else { return nil }
            i += n
            return v
        }
        func optional(_ c: UInt8) -> Bool { if i < b.count, b[i] == c { i += 1; return true }; return false }
        guard let year = number(4) else { return nil }
        let dashed = optional(0x2D)
        guard let month = number(2) else { return nil }
        if dashed { guard optional(0x2D) else { return nil } }
        guard let day = number(2), optional(0x54) || optional(0x74), let hour = number(2) else { return nil }
        let colons = optional(0x3A)
        guard let minute = number(2) else { return nil }
        if colons { guard optional(0x3A) else { return nil } }
        guard let second = number(2) else { return nil }
        if optional(0x2E) {
            let start = i
            while i < b.count, b[i] >= 0x30 && b[i] <= 0x39, i - start < 9 { i += 1 }
            guard i > start else { return nil }
        }
        var offset = 0
        if optional(0x5A) || optional(0x7A) {
        } else if i < b.count, b[i] == 0x2B || b[i] == 0x2D {
            let sign = b[i] == 0x2D ? -1 : 1
            i += 1
            guard let oh = number(2) else { return nil }
            _ = optional(0x3A)
            guard let om = number(2), oh <= 23, om <= 59 else { return nil }
            offset = sign * (oh * 3600 + om * 60)
        } else {
            return nil
        }
        guard i == b.count, let local = epochSeconds(year: year, month: month, day: day, hour: hour, minute: minute, second: second) else { return nil }
        return local - Int64(offset)
    }
}
