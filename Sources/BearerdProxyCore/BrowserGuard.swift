import BearerdHTTP

/// The browser guard of one proxy listener (docs/architecture.md §5): refuses requests that a web page makes
/// on its own, so that a page the developer happens to visit cannot make the local bearerd
/// spend its tokens (a cross-site `fetch(…, {method: "POST", mode: "no-cors"})` needs no CORS
/// approval to be *sent*, and bearerd would inject the token into it).
///
/// Theory of operation. Browsers mark what they send: `Origin` (RFC 6454 §7, sent on every
/// cross-origin request other than a plain GET/HEAD navigation or subresource, and on every
/// POST) and `Sec-Fetch-Site` (W3C Fetch Metadata: `cross-site`, `same-site`, `same-origin`,
/// `none` for user-initiated navigations). Programs (curl, services, SDKs) send neither. So:
/// - more than one `Origin` field: refused (no browser sends two);
/// - `Origin: null` (sandboxed frames, `data:` pages, redirects across origins; RFC 6454 §7.3):
///   refused, it is cross-site by construction and cannot be named in `allowed_origins`;
/// - an `Origin` in `allowed_origins`: admitted, whatever `Sec-Fetch-Site` says;
/// - any other `Origin` must be the listener's own, `scheme://authority` with the authority of
///   the request (absolute-form target, else Host), both serialised as RFC 6454 §6.1 says
///   (lower-case scheme and host, default port omitted); otherwise refused;
/// - `Sec-Fetch-Site: same-origin` or `none` passes; `cross-site` or `same-site` is refused
///   (unless the origin was allowed above); any other value or a repeated field is refused.
/// Requests without either field pass: nothing about them says a browser sent them.
///
/// Immutable, built once per listener per configuration (`ListenerPolicy`). A request without
/// `Origin` and `Sec-Fetch-Site` is decided without allocating. Pure: no I/O, no clock.
public struct BrowserGuard: Sendable, Equatable {
    /// The scheme clients reach the listener with (a TLS listener is `https`).
    public enum Scheme: String, Sendable {
        case http, https
    }

    /// Why a request was refused: a stable reason (`browser.cross_site`, …), a sentence for the
    /// client, and the Origin as received (shortened; never a credential) for the log.
    public struct Refusal: Sendable, Equatable {
        public let reason: String
        public let detail: String
        public let origin: String?
    }

    public enum Decision: Sendable, Equatable {
        case admit
        case refuse(Refusal)
    }

    public let scheme: Scheme
    /// `allowed_origins`, each RFC 6454 serialised (`normalizedOrigin`).
    public let allowedOrigins: Set<String>

    /// - Parameter allowedOrigins: exact origins; entries that are not origins are ignored (the
    ///   configuration loader has refused them already, with their line).
    public init(scheme: Scheme = .http, allowedOrigins: [String] = []) {
        self.scheme = scheme
        self.allowedOrigins = Set(allowedOrigins.compactMap { BrowserGuard.normalizedOrigin(Substring($0)) })
    }

    /// Longest Origin text echoed in a refusal or a log line.
    static let shownLimit = 128

    /// Decides one request from its head.
    public func check(_ head: HTTPRequestHead) -> Decision {
        var originField: String?
        var siteField: String?
        var origins = 0
        var sites = 0
        // By kind and index: no name comparison and no copy of the fields that are neither.
        let fields = head.headers.fields
        for i in fields.indices {
            switch fields[i].known {
            case .origin:
                origins += 1
                originField = fields[i].value
            case .secFetchSite:
                sites += 1
                siteField = fields[i].value
            default:
                break
            }
        }
        if origins == 0 && sites == 0 { return .admit }
        let advice = "bearerd refuses requests that web pages make on their own; to let a web app use it, add the app's origin to allowed_origins"
        var shown: String?
        var originAllowed = false
        if origins > 1 {
            return .refuse(Refusal(reason: "browser.multiple_origin", detail: "the request has \(origins) Origin fields; \(advice)", origin: nil))
        }
        if let raw = originField {
            let value = Self.trimmed(Substring(raw))
            shown = Self.shown(value)
            if Self.asciiLowerEquals(value, "null") {
                return .refuse(Refusal(reason: "browser.origin_null",
                                       detail: "Origin: null (a sandboxed page, a data: or file: page, or a redirect across sites) is cross-site; \(advice)",
                                       origin: shown))
            }
            guard let origin = Self.normalizedOrigin(value) else {
                return .refuse(Refusal(reason: "browser.malformed_origin",
                                       detail: "the Origin \(Self.quoted(shown)) is not an origin (scheme://host[:port])", origin: shown))
            }
            if allowedOrigins.contains(origin) {
                originAllowed = true
            } else {
                let own = HostAllowlist.requestAuthority(target: head.target, hostField: head.headers.first(.host))
                    .flatMap { Self.normalizedOrigin(scheme: scheme.rawValue[...], authority: $0) }
                if own != origin {
                    let listener = own.map { "this listener's own origin \($0)" } ?? "this listener's own origin (the request names no host)"
                    return .refuse(Refusal(reason: "browser.foreign_origin",
                                           detail: "the request comes from a web page at \(origin), not from \(listener); \(advice)",
                                           origin: shown))
                }
            }
        }
        if sites > 1 {
            return .refuse(Refusal(reason: "browser.fetch_site_invalid", detail: "the request has \(sites) Sec-Fetch-Site fields; \(advice)", origin: shown))
        }
        if let raw = siteField, !originAllowed {
            let site = Self.trimmed(Substring(raw))
            if Self.asciiLowerEquals(site, "same-origin") || Self.asciiLowerEquals(site, "none") { return .admit }
            if Self.asciiLowerEquals(site, "cross-site") || Self.asciiLowerEquals(site, "same-site") {
                let from = shown.map { " from \(Self.quoted($0))" } ?? " without an Origin"
                return .refuse(Refusal(reason: "browser.cross_site",
                                       detail: "Sec-Fetch-Site: \(site.lowercased())\(from): a web page on another site sent it; \(advice)",
                                       origin: shown))
            }
            return .refuse(Refusal(reason: "browser.fetch_site_invalid",
                                   detail: "Sec-Fetch-Site \(Self.quoted(Self.shown(site))) is none of same-origin, same-site, cross-site, none; \(advice)",
                                   origin: shown))
        }
        return .admit
    }

    // MARK: origins (RFC 6454)

    /// The RFC 6454 §6.1 serialisation of an origin written `scheme://host[:port]`: scheme and
    /// host lower-cased, the port in decimal without leading zeros and omitted when it is the
    /// scheme's default (80 for http, 443 for https). nil when `text` is not exactly that: a
    /// path (even `/`), query, fragment or userinfo, an empty or malformed host, a port that is
    /// not 0–65535.
    public static func normalizedOrigin(_ text: Substring) -> String? {
        let u = text.utf8
        guard let colon = u.firstIndex(of: UInt8(ascii: ":")) else { return nil }
        let scheme = text[..<colon]
        let rest = text[colon...]
        guard rest.utf8.starts(with: "://".utf8) else { return nil }
        return normalizedOrigin(scheme: scheme, authority: rest.dropFirst(3))
    }

    /// `scheme://authority` serialised as `normalizedOrigin(_:)` does; nil when malformed.
    public static func normalizedOrigin(scheme: Substring, authority: Substring) -> String? {
        guard let first = scheme.utf8.first, isAlpha(first),
              scheme.utf8.allSatisfy({ isAlpha($0) || isDigit($0) || $0 == UInt8(ascii: "+") || $0 == UInt8(ascii: "-") || $0 == UInt8(ascii: ".") })
        else { return nil }
        let a = authority.utf8
        var host: Substring
        var portText: Substring.UTF8View.SubSequence
        if a.first == UInt8(ascii: "[") {
            guard let close = a.firstIndex(of: UInt8(ascii: "]")) else { return nil }
            host = authority[...close]
            let inner = authority.utf8[a.index(after: a.startIndex)..<close]
            guard !inner.isEmpty,
                  inner.allSatisfy({ isHexDigit($0) || $0 == UInt8(ascii: ":") || $0 == UInt8(ascii: ".") }) else { return nil }
            portText = a[a.index(after: close)...]
            if let c = portText.first {
                guard c == UInt8(ascii: ":") else { return nil }
                portText = portText.dropFirst()
            } else {
                portText = a[a.endIndex...]
            }
        } else {
            if let colon = a.firstIndex(of: UInt8(ascii: ":")) {
                host = authority[..<colon]
                portText = a[a.index(after: colon)...]
            } else {
                host = authority
                portText = a[a.endIndex...]
            }
            // reg-name or IPv4 (RFC 3986 §3.2.2), without percent-encoding: what browsers send.
            guard !host.isEmpty, host.utf8.allSatisfy({ isAlpha($0) || isDigit($0) || $0 == UInt8(ascii: "-")
                    || $0 == UInt8(ascii: ".") || $0 == UInt8(ascii: "_") || $0 == UInt8(ascii: "~") }) else { return nil }
        }
        var port: Int?
        if !portText.isEmpty {
            var value = 0
            for c in portText {
                guard isDigit(c) else { return nil }
                value = value * 10 + Int(c - UInt8(ascii: "0"))
                guard value <= 65535 else { return nil }  // bounded before it can grow: no overflow
            }
            port = value
        }
        let lowerScheme = scheme.lowercased()
        if let p = port, (lowerScheme == "http" && p == 80) || (lowerScheme == "https" && p == 443) { port = nil }
        var out = lowerScheme + "://" + host.lowercased()
        if let port { out += ":" + String(port) }
        return out
    }

    // MARK: helpers

    /// Optional whitespace (RFC 9110 §5.6.3) removed from both ends.
    static func trimmed(_ s: Substring) -> Substring {
        var s = s
        while let c = s.utf8.first, c == UInt8(ascii: " ") || c == UInt8(ascii: "\t") { s = s.dropFirst() }
        while let c = s.utf8.last, c == UInt8(ascii: " ") || c == UInt8(ascii: "\t") { s = s.dropLast() }
        return s
    }

    /// At most `shownLimit` bytes of a field value, for messages.
    static func shown(_ s: Substring) -> String {
        if s.utf8.count <= shownLimit { return String(s) }
        return String(decoding: s.utf8.prefix(shownLimit), as: UTF8.self) + "…"
    }

    static func quoted(_ s: String?) -> String { "\"" + (s ?? "") + "\"" }

    static func asciiLowerEquals(_ s: Substring, _ lower: String) -> Bool {
        s.utf8.elementsEqual(lower.utf8) { HostKey.fold($0) == $1 }
    }

    private static func isAlpha(_ c: UInt8) -> Bool { HostKey.fold(c) >= UInt8(ascii: "a") && HostKey.fold(c) <= UInt8(ascii: "z") }
    private static func isDigit(_ c: UInt8) -> Bool { c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9") }
    private static func isHexDigit(_ c: UInt8) -> Bool { isDigit(c) || (HostKey.fold(c) >= UInt8(ascii: "a") && HostKey.fold(c) <= UInt8(ascii: "f")) }
}
