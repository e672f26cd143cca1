import BearerdOAuth
import Foundation
import BearerdProxyCore

/// Parsers for the scalar syntaxes of the configuration (docs/architecture.md §4): durations, sizes,
/// listen addresses and upstream URLs, plus the "did you mean" helper.
///
/// Each parser takes the raw scalar text and either returns the value or throws a `Problem`
/// whose text completes `FILE:LINE: key: …`. Problems quote the offending text (shortened)
/// except where it may carry a credential: URL user info and queries are never repeated.
enum ConfigValues {
    /// A user-facing description of what is wrong with one value.
    struct Problem: Error, Equatable {
        var message: String
        init(_ message: String) { self.message = message }
    }

    // MARK: Durations

    /// Units of a duration and their length in milliseconds.
    static let durationUnits: [(unit: String, milliseconds: Int64)] = [
        ("ms", 1), ("s", 1000), ("m", 60_000), ("h", 3_600_000),
    ]

    /// Longest timeout: `timeouts.header_read`, `timeouts.idle`, `shutdown_grace`,
    /// `startup_timeout`, a route's `timeouts.connect`/`response`/`idle` and a session's
    /// `request_timeout`/`wait_timeout`. 24 h: a longer wait is indistinguishable from a hang,
    /// and every deadline stays far below what a nanosecond `Int64` or `DispatchTime` holds.
    static let maximumTimeout: Duration = .seconds(24 * 3600)
    /// Longest `refresh_before` and `default_lifetime`: 365 days (`8760h`).
    static let maximumLifetime: Duration = .seconds(365 * 24 * 3600)

    /// `500ms`, `30s`, `5m`, `1h`: a whole positive number and a unit, at most `maximum`.
    /// Checked arithmetic: a number too large for any type is refused like one above `maximum`.
    static func duration(_ text: String, maximum: Duration = maximumTimeout) throws(Problem) -> Duration {
        let example = "such as 500ms, 30s, 5m or 1h"
        let digits = text.prefix(while: { $0.isASCII && $0.isNumber })
        let unit = text.dropFirst(digits.count)
        if text.hasPrefix("-") {
            throw Problem("must be positive, got \(quoted(text))")
        }
        guard !digits.isEmpty else {
            throw Problem("expected a duration \(example), got \(quoted(text))")
        }
        if unit.isEmpty {
            throw Problem("missing unit in \(quoted(text)): write \(digits)s for seconds (units: ms, s, m, h)")
        }
        if unit.hasPrefix(".") || unit.hasPrefix(",") {
            throw Problem("expected a whole number with a unit, got \(quoted(text)) (write 1500ms rather than 1.5s)")
        }
        guard let factor = durationUnits.first(where: { $0.unit == unit })?.milliseconds else {
            if let total = compoundMilliseconds(text) {
                let better = total % 1000 == 0 ? "\(total / 1000)s" : "\(total)ms"
                throw Problem("use a single unit: write \(better) for \(quoted(text))")
            }
            throw Problem("unknown unit '\(unit)' in \(quoted(text)) (use ms, s, m or h)")
        }
        let tooLarge = Problem("must be at most \(describe(maximum)), got \(quoted(text))")
        guard let n = Int64(digits) else { throw tooLarge }
        if n == 0 { throw Problem("must be greater than zero, got \(quoted(text))") }
        let (milliseconds, overflow) = n.multipliedReportingOverflow(by: factor)
        guard !overflow, Duration.milliseconds(milliseconds) <= maximum else { throw tooLarge }
        return .milliseconds(milliseconds)
    }

    /// A limit as the user would write it: `24h`, `8760h`, `90s`, `1500ms`.
    static func describe(_ duration: Duration) -> String {
        let (seconds, attoseconds) = duration.components
        let ms = seconds * 1000 + attoseconds / 1_000_000_000_000_000  // Only our own limits: small.
        for (unit, factor) in durationUnits.reversed() where ms % factor == 0 { return "\(ms / factor)\(unit)" }
        return "\(ms)ms"
    }

    /// `1m30s` as milliseconds, for the hint only; `nil` unless every part is a number and a unit.
    static func compoundMilliseconds(_ text: String) -> Int64? {
        var rest = Substring(text), total: Int64 = 0
        while !rest.isEmpty {
            let digits = rest.prefix(while: { $0.isASCII && $0.isNumber })
            rest = rest.dropFirst(digits.count)
            let unit = rest.prefix(while: { !($0.isASCII && $0.isNumber) })
            rest = rest.dropFirst(unit.count)
            guard let n = Int64(digits), n < 1_000_000,
                  let factor = durationUnits.first(where: { $0.unit == unit })?.milliseconds else { return nil }
            let (sum, overflow) = total.addingReportingOverflow(n * factor)  // n * factor < 3.6e12.
            guard !overflow else { return nil }
            total = sum
        }
        return total
    }

    // MARK: Sizes

    static let sizeUnits: [(unit: String, bytes: Int)] = [
        ("", 1), ("B", 1), ("KiB", 1 << 10), ("MiB", 1 << 20), ("GiB", 1 << 30),
    ]

    /// Largest size any key accepts (1 TiB); keys with a meaningful bound of their own pass a smaller one.
    static let maximumSize = 1 << 40
    /// Largest `limits.header_bytes` and `limits.request_target`: 16 MiB.
    static let maximumHeaderBytes = 16 << 20
    /// Largest `replay_body_limit`: 1 GiB (the body is kept in memory, per request).
    static let maximumReplayBody = 1 << 30

    /// `65536`, `512B`, `64KiB`, `1MiB`, `1GiB`: a whole number of bytes, optionally with a binary
    /// unit, at most `maximum`. Checked arithmetic: an overflowing value is refused.
    static func size(_ text: String, maximum: Int = maximumSize) throws(Problem) -> Int {
        let digits = text.prefix(while: { $0.isASCII && $0.isNumber })
        let unit = String(text.dropFirst(digits.count))
        if text.hasPrefix("-") { throw Problem("must not be negative, got \(quoted(text))") }
        guard !digits.isEmpty else {
            throw Problem("expected a size such as 65536, 64KiB or 1MiB, got \(quoted(text))")
        }
        if unit.hasPrefix(".") || unit.hasPrefix(",") {
            throw Problem("expected a whole number, got \(quoted(text)) (write 1536KiB rather than 1.5MiB)")
        }
        guard let factor = sizeUnits.first(where: { $0.unit == unit })?.bytes else {
            var hint = ""
            let map = ["k": "KiB", "kb": "KiB", "kib": "KiB", "m": "MiB", "mb": "MiB", "mib": "MiB",
                       "g": "GiB", "gb": "GiB", "gib": "GiB", "b": "B", "bytes": "B"]
            if let better = map[unit.lowercased()] { hint = "; did you mean \(digits)\(better)?" }
            throw Problem("unknown unit '\(unit)' in \(quoted(text)) (use B, KiB, MiB or GiB\(hint))")
        }
        let tooLarge = Problem("must be at most \(describe(bytes: maximum)), got \(quoted(text))")
        guard let n = Int(digits) else { throw tooLarge }
        let (product, overflow) = n.multipliedReportingOverflow(by: factor)
        guard !overflow, product <= maximum else { throw tooLarge }
        return product
    }

    /// A size as the user would write it, in the largest unit that divides it: `16MiB`, `1024GiB`.
    static func describe(bytes: Int) -> String {
        for (unit, factor) in sizeUnits.reversed() where factor > 1 && bytes % factor == 0 { return "\(bytes / factor)\(unit)" }
        return "\(bytes)"
    }

    // MARK: Addresses

    /// Longest `sun_path` a Unix socket path may use (108 bytes with the terminating NUL on Linux).
    static let maxUnixPathBytes = 107

    /// `host:port`, `[v6]:port` or `unix:/absolute/path`.
    static func address(_ text: String) throws(Problem) -> ListenAddress {
        let forms = "expected host:port, [v6]:port or unix:/absolute/path"
        if text.hasPrefix("unix:") {
            let path = String(text.dropFirst(5))
            guard path.hasPrefix("/") else {
                throw Problem("a Unix socket path must be absolute, got \(quoted(text))")
            }
            guard path.utf8.count <= maxUnixPathBytes else {
                throw Problem("Unix socket path is \(path.utf8.count) bytes, longer than the \(maxUnixPathBytes) the system allows")
            }
            guard !path.utf8.contains(0) else { throw Problem("Unix socket path contains a NUL byte") }
            return .unix(path: path)
        }
        if !text.isEmpty, text.allSatisfy({ $0.isASCII && $0.isNumber }) {
            throw Problem("missing host in \(quoted(text)): write 127.0.0.1:\(text) (or 0.0.0.0:\(text) for every interface)")
        }
        let host: String
        let portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else {
                throw Problem("missing ']' in \(quoted(text)) (\(forms))")
            }
            host = String(text[text.index(after: text.startIndex)..<close])
            let rest = text[text.index(after: close)...]
            guard rest.hasPrefix(":") else { throw Problem("missing port after ']' in \(quoted(text)) (\(forms))") }
            portText = rest.dropFirst()
            guard isIPv6Literal(host) else { throw Problem("\(quoted(host)) is not an IPv6 address") }
        } else {
            guard let colon = text.lastIndex(of: ":") else {
                throw Problem("missing port in \(quoted(text)) (\(forms))")
            }
            host = String(text[..<colon])
            portText = text[text.index(after: colon)...]
            if host.contains(":") {
                throw Problem("put an IPv6 address in brackets, e.g. \"[::1]:8080\", got \(quoted(text))")
            }
            if host.isEmpty {
                throw Problem("missing host in \(quoted(text)): write 127.0.0.1\(text) (or 0.0.0.0\(text) for every interface)")
            }
            guard isHostName(host) else { throw Problem("\(quoted(host)) is not a valid host name or IPv4 address") }
        }
        return .tcp(host: host, port: try port(portText, in: text))
    }

    static func port(_ text: Substring, in whole: String) throws(Problem) -> UInt16 {
        guard !text.isEmpty, text.count <= 5, text.allSatisfy({ $0.isASCII && $0.isNumber }), let n = Int(text) else {
            throw Problem("expected a port number 1–65535, got \(quoted(String(text))) in \(quoted(whole))")
        }
        guard (1...65535).contains(n) else {
            throw Problem("port must be 1–65535, got \(n)")
        }
        return UInt16(n)
    }

    /// Letters, digits, `-`, `.` and `_` (host names and IPv4 literals), at most 253 characters.
    static func isHostName(_ host: String) -> Bool {
        guard !host.isEmpty, host.utf8.count <= 253 else { return false }
        return host.utf8.allSatisfy { c in
            (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || c == 0x2D || c == 0x2E || c == 0x5F
        } && !host.hasPrefix(".") && !host.hasPrefix("-")
    }

    /// Hex digits, `:` and `.` (an embedded IPv4 tail), with at least one `:`; a `%zone` suffix is allowed.
    static func isIPv6Literal(_ host: String) -> Bool {
        let address = host.split(separator: "%", maxSplits: 1, omittingEmptySubsequences: false)
        guard let body = address.first, body.contains(":"), body.count >= 2 else { return false }
        if address.count == 2, address[1].isEmpty { return false }
        return body.allSatisfy { $0 == ":" || $0 == "." || $0.isHexDigit }
    }

    // MARK: URLs

    /// A route's upstream: an absolute `http://` or `https://` URL, host (IPv6 in brackets),
    /// optional port, optional base path (its trailing slashes dropped: request paths are joined
    /// to it). No query, user info or fragment.
    static func url(_ text: String) throws(Problem) -> UpstreamURL {
        var parts = try urlParts(text, allowQuery: false)
        while parts.path.hasSuffix("/") { parts.path.removeLast() }
        return UpstreamURL(scheme: parts.scheme, host: parts.host, port: parts.port, basePath: parts.path)
    }

    /// An authorization server endpoint (token, authorization, device authorization, revocation,
    /// introspection, discovery, issuer): kept exactly as written, path (trailing slash included)
    /// and query byte for byte (docs/architecture.md §5).
    static func endpointURL(_ text: String, allowQuery: Bool) throws(Problem) -> EndpointURL {
        let parts = try urlParts(text, allowQuery: allowQuery)
        return EndpointURL(text: text, scheme: parts.scheme, host: parts.host, port: parts.port, path: parts.path, query: parts.query)
    }

    /// The checked pieces of an http(s) URL; the path exactly as written ("" when there is none).
    private static func urlParts(_ text: String, allowQuery: Bool) throws(Problem)
        -> (scheme: String, host: String, port: UInt16, path: String, query: String?) {
        guard let sep = text.range(of: "://") else {
            throw Problem("expected an http:// or https:// URL, got \(quoted(redactedURL(text)))")
        }
        let scheme = text[..<sep.lowerBound].lowercased()
        guard scheme == "http" || scheme == "https" else {
            throw Problem("expected an http:// or https:// URL, got \(quoted(redactedURL(text)))")
        }
        var rest = text[sep.upperBound...]
        if let hash = rest.firstIndex(of: "#") {
            throw Problem("a URL here must not have a fragment (\(quoted(String(rest[hash...]))))")
        }
        var query: String?
        if let q = rest.firstIndex(of: "?") {
            guard allowQuery else {
                throw Problem("an upstream URL must not have a query (the client's query is forwarded as is)")
            }
            query = String(rest[rest.index(after: q)...])
            rest = rest[..<q]
        }
        let authorityEnd = rest.firstIndex(of: "/") ?? rest.endIndex
        let authority = rest[..<authorityEnd]
        let path = String(rest[authorityEnd...])
        if authority.contains("@") {
            throw Problem("a URL here must not contain user info (user:password@); credentials belong in a session")
        }
        guard !authority.isEmpty else { throw Problem("missing host in \(quoted(redactedURL(text)))") }
        let host: String
        var port: UInt16 = scheme == "https" ? 443 : 80
        if authority.hasPrefix("[") {
            guard let close = authority.firstIndex(of: "]") else {
                throw Problem("missing ']' after the IPv6 address in \(quoted(redactedURL(text)))")
            }
            host = String(authority[authority.index(after: authority.startIndex)..<close])
            guard isIPv6Literal(host) else { throw Problem("\(quoted(host)) is not an IPv6 address") }
            let after = authority[authority.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { throw Problem("unexpected \(quoted(String(after))) after the IPv6 address") }
                port = try self.port(after.dropFirst(), in: redactedURL(text))
            }
        } else {
            var hostPart = authority
            if let colon = authority.lastIndex(of: ":") {
                hostPart = authority[..<colon]
                if hostPart.contains(":") {
                    throw Problem("put an IPv6 address in brackets, e.g. http://[::1]:8080, got \(quoted(redactedURL(text)))")
                }
                port = try self.port(authority[authority.index(after: colon)...], in: redactedURL(text))
            }
            host = hostPart.lowercased()
            guard !host.isEmpty else { throw Problem("missing host in \(quoted(redactedURL(text)))") }
            guard isHostName(host) else { throw Problem("\(quoted(host)) is not a valid host name or IPv4 address") }
        }
        if let bad = path.unicodeScalars.first(where: { $0.value <= 0x20 || $0.value == 0x7F || !$0.isASCII }) {
            throw Problem("the path contains \(bad.value == 0x20 ? "a space" : "a character that must be percent-encoded (U+\(String(bad.value, radix: 16, uppercase: true)))")")
        }
        if let query, let bad = query.unicodeScalars.first(where: { $0.value <= 0x20 || $0.value == 0x7F || !$0.isASCII }) {
            throw Problem("the query contains \(bad.value == 0x20 ? "a space" : "a character that must be percent-encoded (U+\(String(bad.value, radix: 16, uppercase: true)))")")
        }
        return (scheme, host, port, path, query)
    }

    /// The URL with user info and query replaced by `…`, safe to repeat in a message.
    static func redactedURL(_ text: String) -> String {
        var s = Substring(text)
        var result = ""
        if let sep = s.range(of: "://") {
            result += s[..<sep.upperBound]
            s = s[sep.upperBound...]
        }
        let authorityEnd = s.firstIndex(where: { $0 == "/" || $0 == "?" || $0 == "#" }) ?? s.endIndex
        let authority = s[..<authorityEnd]
        if let at = authority.lastIndex(of: "@") {
            result += "…@" + authority[authority.index(after: at)...]
        } else {
            result += authority
        }
        let tail = s[authorityEnd...]
        if let q = tail.firstIndex(of: "?") {
            result += tail[..<q] + "?…"
        } else {
            result += tail
        }
        return result
    }

    // MARK: Text helpers

    /// `"text"` with control characters escaped, shortened to 60 characters.
    static func quoted(_ text: String) -> String {
        var out = ""
        for scalar in text.unicodeScalars {
            switch scalar {
            case "\"": out += "\\\""
            case "\\": out += "\\\\"
            case "\n": out += "\\n"
            case "\t": out += "\\t"
            case "\r": out += "\\r"
            default:
                if scalar.value < 0x20 || scalar.value == 0x7F {
                    out += "\\u{\(String(scalar.value, radix: 16))}"
                } else {
                    out.unicodeScalars.append(scalar)
                }
            }
        }
        if out.count > 60 { out = String(out.prefix(57)) + "…" }
        return "\"\(out)\""
    }

    /// The candidates `word` is a plausible misspelling of, quoted for a message: `'refresh_before'`,
    /// or `'request_timeout' or 'wait_timeout'` when several are equally close; `nil` if none is.
    static func suggestion(for word: String, among candidates: [String]) -> String? {
        let w = word.lowercased()
        let scored = candidates.map { ($0, editDistance(w, $0.lowercased())) }
        var matches: [String] = []
        if let best = scored.map(\.1).min() {
            matches = scored.filter { $0.1 == best && best <= max(1, min(3, $0.0.count / 3)) }.map(\.0)
        }
        if matches.isEmpty, w.count >= 4 {
            // A word that contains a candidate or is contained in one (`secret_file`, `timeout`).
            matches = candidates.filter { $0.lowercased().contains(w) || w.contains($0.lowercased()) }
        }
        guard !matches.isEmpty, matches.count <= 3 else { return nil }
        let quotedMatches = matches.map { "'\($0)'" }
        return quotedMatches.count == 1 ? quotedMatches[0]
            : quotedMatches.dropLast().joined(separator: ", ") + " or " + quotedMatches.last!  // count >= 2 here
    }

    /// Levenshtein distance with adjacent transpositions counted as one edit.
    static func editDistance(_ a: String, _ b: String) -> Int {
        let x = Array(a.unicodeScalars), y = Array(b.unicodeScalars)
        if x.isEmpty { return y.count }
        if y.isEmpty { return x.count }
        var previous2 = [Int](repeating: 0, count: y.count + 1)
        var previous = Array(0...y.count)
        var current = [Int](repeating: 0, count: y.count + 1)
        for i in 1...x.count {
            current[0] = i
            for j in 1...y.count {
                let cost = x[i - 1] == y[j - 1] ? 0 : 1
                current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + cost)
                if i > 1, j > 1, x[i - 1] == y[j - 2], x[i - 2] == y[j - 1] {
                    current[j] = min(current[j], previous2[j - 2] + 1)
                }
            }
            (previous2, previous, current) = (previous, current, previous2)
        }
        return previous[y.count]
    }
}


extension EndpointURL {
    /// Parses an endpoint URL as the configuration does (for endpoints learned at run time from
    /// an issuer's metadata); kept byte for byte. The error says what is wrong.
    public static func parse(_ text: String, allowQuery: Bool = true) -> Result<EndpointURL, ConfigURLError> {
        do throws(ConfigValues.Problem) {
            return .success(try ConfigValues.endpointURL(text, allowQuery: allowQuery))
        } catch {
            return .failure(ConfigURLError(message: error.message))
        }
    }
}

public struct ConfigURLError: Error, Sendable, Equatable {
    public var message: String
}
