import BearerdOAuth

/// Request signing for object stores and cloud APIs with temporary keys: AWS Signature Version 4
/// (`AWS4-HMAC-SHA256`) and Alibaba Cloud OSS V4 (`OSS4-HMAC-SHA256`). Pure: the hash and the
/// HMAC come in through `RequestSigning.Crypto` (OpenSSL's, `BearerdTLS.Digest`, in the shell),
/// the time as seconds since the epoch.
///
/// Theory of operation. A proxy signs what it sends, so the signer does not trust the client's
/// spelling of the target: it decodes the path segment by segment and the query pair by pair
/// (RFC 3986 §2.1), re-encodes each with the one encoding both schemes define (every byte but
/// `A–Z a–z 0–9 - . _ ~` as `%XX`, upper-case hex), and hands back that target to send. What the
/// server decodes is then exactly what was signed, whichever spelling the client used (`%7e` or
/// `~`, a raw space, `+`). A `+` is a literal plus (RFC 3986 has no form encoding; S3 and OSS read
/// `%2B` as `+`), and a `%` not followed by two hex digits is refused (400), not guessed at.
///
/// - SigV4 (the AWS "Create a canonical request" rules, as botocore's `SigV4Auth` implements them):
///   canonical URI = the re-encoded path, encoded once more for every service but S3, with dot
///   segments and empty segments removed for those services (S3 keys keep `//` and `.`);
///   canonical query = `key=value` pairs sorted by encoded key, then value, `key=` for a key
///   without a value; canonical headers = lower-case names, values trimmed with inner runs of
///   white space made one space, repeated fields joined with `,`; signed: `host`, `content-type`,
///   `content-md5` and every `x-amz-*` field.
/// - OSS V4 (the OSS SDKs' `SignerV4`): canonical URI = `/BUCKET/KEY` encoded except `/` (the
///   bucket from the configuration, since a virtual-hosted request's path does not hold it);
///   canonical query as above but a key without a value stays `key`; canonical headers =
///   `x-oss-*`, `content-type`, `content-md5`, values trimmed; no additional headers; the
///   signing key from `aliyun_v4` + secret, date, region, `oss`, `aliyun_v4_request`.
/// - Fields removed from the client's request first: `Authorization`, and the date, token,
///   content-hash and signature fields of both schemes. The signer adds its own.
public enum RequestSigning {
    /// The hash and MAC the signature is made of. The shell supplies OpenSSL's.
    public protocol Crypto {
        func sha256(_ bytes: [UInt8]) -> [UInt8]
        func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8]
        /// The signing key: HMAC(prefix + secret, date), then HMAC with each of `scope` in turn
        /// (SigV4: region, service, `aws4_request`; OSS V4: region, `oss`, `aliyun_v4_request`).
        /// It changes only with the secret, the day and the scope, so a shell may keep it
        /// (`SigningKeyCache`); the default derives it every time (four HMACs).
        func signingKey(secret: String, prefix: String, date: String, scope: [String]) -> [UInt8]
    }

    /// Which signature, and its scope.
    public enum Scheme: Sendable, Equatable {
        /// AWS Signature Version 4 for `service` (`s3`, `sts`, `execute-api`, `bedrock`, …) in `region`.
        case awsV4(region: String, service: String)
        /// OSS V4 in `region` (`cn-hangzhou`; no `oss-` prefix). `bucket`: the bucket of a
        /// virtual-hosted request (`BUCKET.oss-REGION.aliyuncs.com`), nil for path-style or
        /// service-level requests.
        case ossV4(region: String, bucket: String?)

        var isS3: Bool { if case .awsV4(_, "s3") = self { return true } else { return false } }
    }

    /// Temporary (or long-term) keys. `description` never shows the secret or the session token.
    public struct Credentials: Sendable, Equatable, CustomStringConvertible {
        public var accessKeyID: String
        public var secretAccessKey: String
        public var sessionToken: String?
        public init(accessKeyID: String, secretAccessKey: String, sessionToken: String?) {
            self.accessKeyID = accessKeyID
            self.secretAccessKey = secretAccessKey
            self.sessionToken = sessionToken
        }
        public var description: String { "Credentials(accessKeyID: \(accessKeyID), secret: <redacted>, sessionToken: \(sessionToken == nil ? "none" : "<redacted>"))" }
    }

    /// What stands for the body in the signature.
    public enum Payload: Sendable, Equatable {
        /// `UNSIGNED-PAYLOAD`: the body streams unhashed (S3 and OSS only; TLS protects it).
        case unsigned
        /// The lower-case hex SHA-256 of the whole body (`Payload.emptyHash` for no body).
        case hashed(String)

        public static let emptyHash = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        var text: String {
            switch self {
            case .unsigned: return "UNSIGNED-PAYLOAD"
            case .hashed(let hex): return hex
            }
        }
    }

    /// Why a request cannot be signed: the client's fault (a 400), or the configuration's.
    public enum Failure: Error, Sendable, Equatable {
        /// A `%` in the path or query not followed by two hex digits (`offset` in the target).
        case invalidPercentEncoding(offset: Int)
        /// `UNSIGNED-PAYLOAD` for a service that needs the body's hash (all but S3 and OSS).
        case payloadMustBeSigned(service: String)
        /// The target is not origin-form (`/path?query`).
        case targetNotOriginForm
        /// A `.` or `..` path segment appears once the path is decoded (`%2E%2E`, or `..` between
        /// encoded slashes of an object key): sent as it decodes, it would climb out of the
        /// route's base path at any server or intermediary that normalises paths (another
        /// bucket, in path style), which bearerd's own check of the raw target cannot see.
        case dotSegment

        public var reason: String {
            switch self {
            case .dotSegment: return "sign.dot_segment"
            case .invalidPercentEncoding(let offset): return "sign.invalid_percent_encoding at offset \(offset)"
            case .payloadMustBeSigned(let service): return "sign.payload_must_be_signed: service \(service) needs the body's SHA-256 (payload: signed)"
            case .targetNotOriginForm: return "sign.target_not_origin_form"
            }
        }
    }

    /// What to change on the request before it leaves.
    public struct Signed: Sendable, Equatable {
        /// The target to send: path and query as signed.
        public var target: String
        /// Fields to remove from the request first (lower-case names).
        public var remove: [String]
        /// Fields to add, in this order (`Authorization` last).
        public var add: [(name: String, value: String)]
        /// The canonical request: its SHA-256 may be logged to compare with a server's
        /// `SignatureDoesNotMatch` answer (it holds no secret, but the session token may be in it:
        /// never log the text itself).
        public var canonicalRequest: String
        /// The string to sign.
        public var stringToSign: String

        public static func == (a: Signed, b: Signed) -> Bool {
            a.target == b.target && a.remove == b.remove && a.canonicalRequest == b.canonicalRequest
                && a.stringToSign == b.stringToSign && a.add.map { "\($0.name):\($0.value)" } == b.add.map { "\($0.name):\($0.value)" }
        }
    }

    /// Client fields that never reach the upstream of a signing route (lower-case).
    public static let removedFields: [String] = [
        "authorization", "x-amz-date", "x-amz-security-token", "x-amz-content-sha256",
        "x-oss-date", "x-oss-security-token", "x-oss-content-sha256", "x-oss-signature",
        "x-oss-signature-version", "x-oss-credential", "x-oss-additional-headers",
    ]

    /// Signs one request.
    /// - Parameters:
    ///   - method: the request method as sent.
    ///   - target: origin-form target as the client sent it (`/key?query`).
    ///   - host: the `Host` the upstream request carries (the upstream authority).
    ///   - headers: the upstream request's fields (before the removal above); `Host` among them
    ///     is ignored in favour of `host`.
    ///   - epochSeconds: the signing time (the clock, adjusted by an adopted server skew).
    public static func sign(method: String, target: String, host: String, headers: [(name: String, value: String)],
                            scheme: Scheme, credentials: Credentials, payload: Payload, epochSeconds: Int64,
                            crypto: some Crypto) -> Result<Signed, Failure> {
        guard target.utf8.first == UInt8(ascii: "/") else { return .failure(.targetNotOriginForm) }
        let utf8 = Array(target.utf8)
        let q = utf8.firstIndex(of: UInt8(ascii: "?"))
        let pathBytes = utf8[..<(q ?? utf8.count)]
        let queryBytes = q.map { utf8[($0 + 1)...] } ?? []
        // Path: segment by segment, so an encoded `/` (%2F) inside a key stays one segment.
        var segments: [[UInt8]] = []
        var start = pathBytes.startIndex
        for i in pathBytes.indices.dropFirst() where pathBytes[i] == UInt8(ascii: "/") {
            guard let seg = percentDecode(pathBytes[(start + 1)..<i]) else { return .failure(.invalidPercentEncoding(offset: firstBadPercent(pathBytes[(start + 1)..<i]) ?? start)) }
            segments.append(seg)
            start = i
        }
        guard let last = percentDecode(pathBytes[(start + 1)...]) else {
            return .failure(.invalidPercentEncoding(offset: firstBadPercent(pathBytes[(start + 1)...]) ?? start))
        }
        segments.append(last)
        // S3 and OSS name an object by its whole decoded key, in which an encoded `/` is a `/`:
        // encoded with `/` kept. Other services route by path segments: each encoded alone.
        let byKey: Bool
        switch scheme {
        case .awsV4: byKey = scheme.isS3
        case .ossV4: byKey = true
        }
        // Dot segments that only decoding reveals (raw ones are refused before routing, and the
        // canonical path of other services removes them): a segment that decodes to `.` or `..`
        // (`%2E%2E`) is sent as a real dot segment (dots are unreserved); in an S3 or OSS key,
        // whose encoded slashes are sent as slashes, also `..` between them (`x%2F..%2Fy`).
        let dot = UInt8(ascii: "."), slash = UInt8(ascii: "/")
        func isDot(_ part: ArraySlice<UInt8>) -> Bool { (part.count == 1 || part.count == 2) && part.allSatisfy { $0 == dot } }
        if pathBytes.contains(UInt8(ascii: "%")) {
            let raws = pathBytes.dropFirst().split(separator: slash, omittingEmptySubsequences: false)
            for (raw, segment) in zip(raws, segments) where raw.contains(UInt8(ascii: "%")) {
                if isDot(segment[...]) { return .failure(.dotSegment) }
                if byKey, segment.contains(slash), segment.split(separator: slash, omittingEmptySubsequences: false).contains(where: isDot) {
                    return .failure(.dotSegment)
                }
            }
        }
        let wirePath = byKey ? encode(Array(([UInt8(ascii: "/")] + segments.joined(separator: [UInt8(ascii: "/")]))), keepSlash: true)
                             : "/" + segments.map { encode($0) }.joined(separator: "/")

        // Query: pair by pair.
        var pairs: [(key: String, value: String, hasValue: Bool)] = []
        if !queryBytes.isEmpty {
            var from = queryBytes.startIndex
            var i = queryBytes.startIndex
            while i <= queryBytes.endIndex {
                if i == queryBytes.endIndex || queryBytes[i] == UInt8(ascii: "&") {
                    let part = queryBytes[from..<i]
                    if !part.isEmpty {
                        let eq = part.firstIndex(of: UInt8(ascii: "="))
                        let k = part[..<(eq ?? part.endIndex)]
                        let v = eq.map { part[($0 + 1)...] } ?? []
                        guard let dk = percentDecode(k), let dv = percentDecode(v) else {
                            return .failure(.invalidPercentEncoding(offset: firstBadPercent(part) ?? from))
                        }
                        pairs.append((encode(dk), encode(dv), eq != nil))
                    }
                    from = i + 1
                }
                i += 1
            }
        }
        pairs.sort { a, b in a.key != b.key ? a.key.utf8.lexicographicallyPrecedes(b.key.utf8) : a.value.utf8.lexicographicallyPrecedes(b.value.utf8) }

        let stamp = SigningTime.iso8601Basic(epochSeconds: epochSeconds)
        let date = String(stamp.prefix(8))
        switch scheme {
        case .awsV4(let region, let service):
            if payload == .unsigned && !scheme.isS3 { return .failure(.payloadMustBeSigned(service: service)) }
            let query = pairs.map { "\($0.key)=\($0.value)" }.joined(separator: "&")
            let wireTarget = query.isEmpty ? wirePath : wirePath + "?" + query  // a bare `?` is no query
            let canonicalURI: String
            if scheme.isS3 {
                canonicalURI = wirePath
            } else {
                // Every other service: dot and empty segments removed, then encoded once more.
                canonicalURI = encode(Array(normalizedPath(segments: segments.map { encode($0) }).utf8), keepSlash: true)
            }
            var add: [(name: String, value: String)] = [("X-Amz-Date", stamp)]
            if scheme.isS3 { add.append(("X-Amz-Content-SHA256", payload.text)) }
            if let token = credentials.sessionToken { add.append(("X-Amz-Security-Token", token)) }
            var fields = signedFields(headers, host: host, removing: removedFields) { n in
                n == "content-type" || n == "content-md5" || n.hasPrefix("x-amz-")
            }
            for f in add { fields.append((lowercase(f.name), f.value)) }
            let (canonicalHeaders, signedNames) = canonicalize(fields, trimInner: true)
            let canonical = [method, canonicalURI, query, canonicalHeaders, signedNames, payload.text].joined(separator: "\n")
            let scope = "\(date)/\(region)/\(service)/aws4_request"
            let toSign = "AWS4-HMAC-SHA256\n\(stamp)\n\(scope)\n\(hex(crypto.sha256(Array(canonical.utf8))))"
            let key = crypto.signingKey(secret: credentials.secretAccessKey, prefix: "AWS4", date: date, scope: [region, service, "aws4_request"])
            let signature = hex(crypto.hmacSHA256(key: key, message: Array(toSign.utf8)))
            add.append(("Authorization", "AWS4-HMAC-SHA256 Credential=\(credentials.accessKeyID)/\(scope), SignedHeaders=\(signedNames), Signature=\(signature)"))
            return .success(Signed(target: wireTarget, remove: removedFields, add: add, canonicalRequest: canonical, stringToSign: toSign))

        case .ossV4(let region, let bucket):
            let query = pairs.map { $0.value.isEmpty ? $0.key : "\($0.key)=\($0.value)" }.joined(separator: "&")
            let wireQuery = pairs.map { $0.hasValue ? "\($0.key)=\($0.value)" : $0.key }.joined(separator: "&")
            let wireTarget = wireQuery.isEmpty ? wirePath : wirePath + "?" + wireQuery
            var resource: [UInt8] = [UInt8(ascii: "/")]
            if let bucket, !bucket.isEmpty {
                resource += Array(bucket.utf8)
                resource.append(UInt8(ascii: "/"))
            }
            // The object key: the decoded path without its leading `/`.
            resource += Array(segments.joined(separator: [UInt8(ascii: "/")]))
            let canonicalURI = encode(resource, keepSlash: true)
            var add: [(name: String, value: String)] = [("x-oss-date", stamp), ("x-oss-content-sha256", payload.text)]
            if let token = credentials.sessionToken { add.append(("x-oss-security-token", token)) }
            var fields = signedFields(headers, host: nil, removing: removedFields) { n in
                n == "content-type" || n == "content-md5" || n.hasPrefix("x-oss-")
            }
            for f in add { fields.append((f.name, f.value)) }
            let (canonicalHeaders, _) = canonicalize(fields, trimInner: false)
            let canonical = [method, canonicalURI, query, canonicalHeaders, "", payload.text].joined(separator: "\n")
            let scope = "\(date)/\(region)/oss/aliyun_v4_request"
            let toSign = "OSS4-HMAC-SHA256\n\(stamp)\n\(scope)\n\(hex(crypto.sha256(Array(canonical.utf8))))"
            let key = crypto.signingKey(secret: credentials.secretAccessKey, prefix: "aliyun_v4", date: date, scope: [region, "oss", "aliyun_v4_request"])
            let signature = hex(crypto.hmacSHA256(key: key, message: Array(toSign.utf8)))
            add.append(("Authorization", "OSS4-HMAC-SHA256 Credential=\(credentials.accessKeyID)/\(scope),Signature=\(signature)"))
            return .success(Signed(target: wireTarget, remove: removedFields, add: add, canonicalRequest: canonical, stringToSign: toSign))
        }
    }

    // MARK: Pieces (internal for tests)

    /// The fields that take part in the signature: `host` (when given) and those `include` picks,
    /// lower-case names, minus `removing`.
    static func signedFields(_ headers: [(name: String, value: String)], host: String?, removing: [String],
                             include: (String) -> Bool) -> [(String, String)] {
        var out: [(String, String)] = []
        if let host { out.append(("host", host)) }
        for h in headers {
            let n = lowercase(h.name)
            if n == "host" || removing.contains(n) || !include(n) { continue }
            out.append((n, h.value))
        }
        return out
    }

    /// Canonical header lines (`name:value\n` sorted by name, repeated names joined with `,` in
    /// their order) and the `;`-joined names. `trimInner`: runs of white space inside a value
    /// become one space (SigV4's Trimall); both schemes trim the ends.
    static func canonicalize(_ fields: [(String, String)], trimInner: Bool) -> (String, String) {
        var names: [String] = []
        var values: [String: [String]] = [:]
        for (n, v) in fields {
            if values[n] == nil { names.append(n) }
            values[n, default: []].append(trimInner ? trimAll(v) : trimEnds(v))
        }
        names.sort { $0.utf8.lexicographicallyPrecedes($1.utf8) }
        var text = ""
        for n in names { text += n + ":" + (values[n] ?? []).joined(separator: ",") + "\n" }
        return (text, names.joined(separator: ";"))
    }

    /// RFC 3986 §5.2.4-style removal of `.` and `..` segments, and of empty segments (as AWS's
    /// services other than S3 normalise), keeping a trailing `/` after a non-empty path.
    /// Segments arrive encoded.
    static func normalizedPath(segments: [String]) -> String {
        var out: [String] = []
        for s in segments {
            switch s {
            case "", ".": continue
            case "..": if !out.isEmpty { out.removeLast() }
            default: out.append(s)
            }
        }
        // As botocore's remove_dot_segments: a trailing `/` stays when something is left.
        let trailing = segments.count > 1 && segments.last == "" && !out.isEmpty
        return "/" + out.joined(separator: "/") + (trailing ? "/" : "")
    }

    static func isUnreserved(_ b: UInt8) -> Bool {
        (b >= 0x41 && b <= 0x5A) || (b >= 0x61 && b <= 0x7A) || (b >= 0x30 && b <= 0x39)
            || b == 0x2D || b == 0x2E || b == 0x5F || b == 0x7E
    }

    private static let hexDigits: [UInt8] = Array("0123456789ABCDEF".utf8)

    /// `%XX` (upper-case) for every byte but the unreserved ones (and `/` when `keepSlash`).
    static func encode(_ bytes: [UInt8], keepSlash: Bool = false) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        for b in bytes {
            if isUnreserved(b) || (keepSlash && b == 0x2F) {
                out.append(b)
            } else {
                out.append(0x25)
                out.append(hexDigits[Int(b >> 4)])
                out.append(hexDigits[Int(b & 0x0F)])
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    private static func hexValue(_ b: UInt8) -> UInt8? {
        switch b {
        case 0x30...0x39: return b - 0x30
        case 0x41...0x46: return b - 0x41 + 10
        case 0x61...0x66: return b - 0x61 + 10
        default: return nil
        }
    }

    /// Decodes `%XX`; nil when a `%` is not followed by two hex digits. `+` stays `+`.
    static func percentDecode(_ bytes: ArraySlice<UInt8>) -> [UInt8]? {
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count)
        var i = bytes.startIndex
        while i < bytes.endIndex {
            let b = bytes[i]
            if b == 0x25 {
                guard bytes.distance(from: i, to: bytes.endIndex) >= 3,
                      let hi = hexValue(bytes[i + 1]), let lo = hexValue(bytes[i + 2]) else { return nil }
                out.append(hi << 4 | lo)
                i += 3
            } else {
                out.append(b)
                i += 1
            }
        }
        return out
    }

    private static func firstBadPercent(_ bytes: ArraySlice<UInt8>) -> Int? {
        var i = bytes.startIndex
        while i < bytes.endIndex {
            if bytes[i] == 0x25 {
                if bytes.distance(from: i, to: bytes.endIndex) < 3 || hexValue(bytes[i + 1]) == nil || hexValue(bytes[i + 2]) == nil { return i }
                i += 3
            } else {
                i += 1
            }
        }
        return nil
    }

    static func lowercase(_ s: String) -> String {
        if !s.utf8.contains(where: { $0 >= 0x41 && $0 <= 0x5A }) { return s }
        return String(decoding: s.utf8.map { $0 >= 0x41 && $0 <= 0x5A ? $0 + 0x20 : $0 }, as: UTF8.self)
    }

    private static func isSpace(_ b: UInt8) -> Bool { b == 0x20 || b == 0x09 || b == 0x0A || b == 0x0D || b == 0x0B || b == 0x0C }

    /// Ends trimmed, inner runs of white space made one space.
    static func trimAll(_ s: String) -> String {
        var out: [UInt8] = []
        var pendingSpace = false
        for b in s.utf8 {
            if isSpace(b) {
                pendingSpace = !out.isEmpty
            } else {
                if pendingSpace { out.append(0x20); pendingSpace = false }
                out.append(b)
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    static func trimEnds(_ s: String) -> String {
        let u = Array(s.utf8)
        guard let first = u.firstIndex(where: { !isSpace($0) }), let last = u.lastIndex(where: { !isSpace($0) }) else { return "" }
        return String(decoding: u[first...last], as: UTF8.self)
    }

    /// Lower-case hex.
    public static func hex(_ bytes: [UInt8]) -> String {
        let digits: [UInt8] = Array("0123456789abcdef".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(bytes.count * 2)
        for b in bytes {
            out.append(digits[Int(b >> 4)])
            out.append(digits[Int(b & 0x0F)])
        }
        return String(decoding: out, as: UTF8.self)
    }
}

/// `YYYYMMDDTHHMMSSZ` (ISO 8601 basic, UTC) from seconds since the epoch, without a calendar
/// library (Howard Hinnant's days-from-civil inverse). Out-of-range inputs are clamped to
/// 0000-01-01 … 9999-12-31 so the result always has 16 characters.
public enum SigningTime {
    public static func iso8601Basic(epochSeconds: Int64) -> String {
        CivilTime(epochSeconds: epochSeconds).iso8601Basic
    }
}

extension RequestSigning.Crypto {
    public func signingKey(secret: String, prefix: String, date: String, scope: [String]) -> [UInt8] {
        RequestSigning.deriveSigningKey(secret: secret, prefix: prefix, date: date, scope: scope, crypto: self)
    }
}

extension RequestSigning {
    /// The signing key derived from scratch (four HMACs).
    public static func deriveSigningKey(secret: String, prefix: String, date: String, scope: [String], crypto: some Crypto) -> [UInt8] {
        var key = crypto.hmacSHA256(key: Array((prefix + secret).utf8), message: Array(date.utf8))
        for part in scope { key = crypto.hmacSHA256(key: key, message: Array(part.utf8)) }
        return key
    }

    /// The last few signing keys, so a request signs with one HMAC instead of five: a key is
    /// found by its secret, prefix, day and scope, so new keys, a new day or another region or
    /// service derive afresh. Holds at most `capacity` keys (the oldest replaced first); the
    /// secrets it compares are those the session already holds in memory.
    ///
    /// A value type; the shell keeps one per route behind a lock (loops share routes).
    public struct SigningKeyCache: Sendable {
        struct Entry: Sendable {
            var secret: String
            var prefix: String
            var date: String
            var scope: [String]
            var key: [UInt8]
        }
        private var entries: [Entry] = []
        private var next = 0
        public let capacity: Int

        public init(capacity: Int = 4) { self.capacity = max(1, capacity) }

        public func key(secret: String, prefix: String, date: String, scope: [String]) -> [UInt8]? {
            entries.first { $0.date == date && $0.secret == secret && $0.prefix == prefix && $0.scope == scope }?.key
        }

        public mutating func insert(_ key: [UInt8], secret: String, prefix: String, date: String, scope: [String]) {
            let e = Entry(secret: secret, prefix: prefix, date: date, scope: scope, key: key)
            if entries.count < capacity {
                entries.append(e)
            } else {
                entries[next] = e
                next = (next + 1) % capacity
            }
        }

        public var count: Int { entries.count }
    }
}
