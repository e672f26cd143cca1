/// A token issued by the token endpoint (RFC 6749 §5.1), with its lifetime already resolved.
///
/// Invariants: `accessToken` is non-empty visible ASCII (safe to put in a header field);
/// `0 < lifetime ≤ maximumLifetime`; `refreshIn`, when present, is `> 0` and `≤ maximumLifetime`
/// (the parser and `PersistedSessionState` guarantee it; the session machine clamps again).
public struct TokenGrant: Sendable, Equatable {
    /// Where `lifetime` came from (logged; tests check it).
    public enum LifetimeSource: String, Sendable, Equatable {
        case expiresIn = "expires_in"
        case jwtExpiry = "jwt_exp"
        case defaultLifetime = "default_lifetime"
    }

    public var accessToken: OAuthSecret
    /// As sent, e.g. `Bearer` or `bearer`.
    public var tokenType: String
    /// `L` of docs/architecture.md §6, counted from the moment the request was sent.
    public var lifetime: Duration
    public var lifetimeSource: LifetimeSource
    /// The server's `refresh_in` hint (seconds after issue at which to refresh), if any.
    public var refreshIn: Duration?
    /// A new (rotated) refresh token, if the response carried one.
    public var refreshToken: OAuthSecret?
    public var scope: String?
    /// RFC 8693 §2.2.1 `issued_token_type`, when the response carried one.
    public var issuedTokenType: String?

    public init(accessToken: OAuthSecret, tokenType: String = "Bearer", lifetime: Duration,
                lifetimeSource: LifetimeSource = .expiresIn, refreshIn: Duration? = nil,
                refreshToken: OAuthSecret? = nil, scope: String? = nil) {
        self.accessToken = accessToken
        self.tokenType = tokenType
        self.lifetime = lifetime
        self.lifetimeSource = lifetimeSource
        self.refreshIn = refreshIn
        self.refreshToken = refreshToken
        self.scope = scope
    }

    /// The longest lifetime (and `refresh_in`) bearerd believes: 10 years (3650 days). A larger
    /// `expires_in`, JWT `exp` or `default_lifetime` is clamped to it, so the schedule arithmetic
    /// downstream (monotonic instants, margins, jitter) stays far from any overflow, and a token
    /// the server calls eternal is still refreshed once a decade (a 401 refreshes it sooner).
    public static let maximumLifetime: Duration = .seconds(3650 * 86_400)

    /// RFC 6749 §6: a refresh response without `refresh_token` keeps the old one.
    public func keepingRefreshToken(_ old: OAuthSecret?) -> TokenGrant {
        var copy = self
        if copy.refreshToken == nil { copy.refreshToken = old }
        return copy
    }
}

/// A failed token request, classified for the retry policy of docs/architecture.md §6.
///
/// Carries the server's RFC 6749 §5.2 fields for logs and for the 503 `detail`; never a
/// token or secret.
public struct TokenEndpointFailure: Error, Sendable, Equatable, CustomStringConvertible {
    public enum Classification: String, Sendable, Equatable {
        /// Everything that is not about the client's own credentials or grant: transport
        /// errors, 408, 429, 5xx, `temporarily_unavailable`, `server_error`, other error codes
        /// and statuses, and any malformed, non-JSON or unusable response whatever its status
        /// (a maintenance page, a misconfigured gateway): retried (3 attempts per round,
        /// backoff between rounds), never negative-cached.
        case retryable
        /// `invalid_client`, `unauthorized_client`, `invalid_scope`, `unsupported_grant_type`
        /// (RFC 6749 §5.2: the server refuses the client's own credentials): no retry,
        /// negative-cached. Also local configuration errors (a request that cannot be encoded).
        case permanent
        /// `invalid_grant`: the refresh token (or password) is dead.
        case invalidGrant = "invalid_grant"
    }

    public var classification: Classification
    /// Stable dotted reason, e.g. `token.invalid_client`, `token.http_503`, `token.transport`.
    public var reason: String
    /// HTTP status, nil for a transport failure.
    public var status: Int?
    /// RFC 6749 §5.2 `error`, `error_description`, `error_uri` (sanitised, bounded).
    public var oauthError: String?
    public var errorDescription: String?
    public var errorURI: String?
    /// Server-requested delay (`Retry-After`, capped), or the 5 s default on 429/503.
    public var retryAfter: Duration?

    public init(classification: Classification, reason: String, status: Int? = nil, oauthError: String? = nil,
                errorDescription: String? = nil, errorURI: String? = nil, retryAfter: Duration? = nil) {
        self.classification = classification
        self.reason = reason
        self.status = status
        self.oauthError = oauthError
        self.errorDescription = errorDescription
        self.errorURI = errorURI
        self.retryAfter = retryAfter
    }

    /// A transport failure (connect, TLS, reset, timeout): always retryable. `detail` must not
    /// carry secrets.
    public static func transport(_ detail: String) -> TokenEndpointFailure {
        TokenEndpointFailure(classification: .retryable, reason: "token.transport", errorDescription: detail)
    }

    /// A transport failure (no HTTP response at all).
    public var isTransport: Bool { reason == "token.transport" && status == nil }

    /// One line for logs and the 503 body's `detail`: `error: error_description`, else the reason.
    public var detail: String {
        var parts: [String] = []
        if let oauthError { parts.append(oauthError) } else { parts.append(reason) }
        if let status { parts.append("(HTTP \(status))") }
        var text = parts.joined(separator: " ")
        if let errorDescription { text += ": " + errorDescription }
        return text
    }

    public var description: String { "TokenEndpointFailure(\(classification.rawValue), \(detail))" }
}

/// Token endpoint response codec (RFC 6749 §5.1, §5.2) with the rules of docs/architecture.md §6.
///
/// Pure: the wall clock (for a JWT `exp` and an HTTP-date `Retry-After`) is a parameter.
extension TokenEndpointFailure {
    /// The RFC 6749 §5.2 `error` of a JSON body, if it has one (e.g. RFC 9449 §8's
    /// `use_dpop_nonce`, which is retried before the response is classified).
    public static func oauthErrorCode(_ body: [UInt8]) -> String? {
        guard body.count <= 1 << 20, let json = try? JSONParser(maxBytes: 1 << 20).parse(body) else { return nil }
        return json.objectValue?["error"]?.stringValue
    }
}

public struct TokenResponseParser: Sendable {
    /// Lifetime assumed without `expires_in` and without a JWT `exp` (`default_lifetime`, 300 s).
    public var defaultLifetime: Duration
    /// Larger bodies are refused (docs/architecture.md §6: 1 MiB).
    public var maxBodyBytes: Int
    /// `Retry-After` is capped at this (1 h).
    public var retryAfterCap: Duration
    /// Delay assumed on 429/503 without `Retry-After` (5 s).
    public var defaultRetryAfter: Duration
    /// RFC 8693 §2.2.1: an exchanged token that is not an OAuth access token has `token_type`
    /// `N_A`; accepted only for token exchange sessions (the driver decides whether it can be sent).
    public var acceptsNotApplicableTokenType = false
    /// `dpop: true` (RFC 9449 §5): `token_type` must be `DPoP`; a `Bearer` answer is a
    /// permanent failure (`token.dpop_not_bound`), not a token.
    public var requiresDPoP = false

    public init(defaultLifetime: Duration = .seconds(300), maxBodyBytes: Int = 1 << 20,
                retryAfterCap: Duration = .seconds(3600), defaultRetryAfter: Duration = .seconds(5)) {
        self.defaultLifetime = defaultLifetime
        self.maxBodyBytes = maxBodyBytes
        self.retryAfterCap = retryAfterCap
        self.defaultRetryAfter = defaultRetryAfter
    }

    /// RFC 8693 §2.2.1 `token_type` of an issued token that is not an access token.
    public static let notApplicableTokenType = "N_A"

    /// `error` codes that end retries and are negative-cached (docs/architecture.md §6).
    public static let permanentErrors: Set<String> = ["invalid_client", "unauthorized_client", "invalid_scope", "unsupported_grant_type"]
    /// `error` codes that are retried.
    public static let retryableErrors: Set<String> = ["temporarily_unavailable", "server_error"]

    /// Classifies one response. `wallClockNow` is Unix seconds.
    ///
    /// docs/architecture.md §6: only the RFC 6749 §5.2 errors that name the client's own credentials or grant
    /// end retries (`permanentErrors` → `.permanent`, `invalid_grant` → `.invalidGrant`). Any other
    /// failure, an unparseable or non-JSON body (any status) included, is `.retryable`: a token
    /// endpoint answering `200` with an HTML page is down, not refusing us, and must not lock the
    /// session out after it recovers.
    public func parse(status: Int, headers: [(name: String, value: String)], body: [UInt8],
                      wallClockNow: Int64) -> Result<TokenGrant, TokenEndpointFailure> {
        let retryAfter = headers.first { $0.name.lowercased() == "retry-after" }
            .flatMap { RetryAfter.parse($0.value, wallClockNow: wallClockNow) }
            .map { min($0, retryAfterCap) }
        let statusRetryable = status == 408 || status == 429 || (500...599).contains(status)

        func failure(_ cls: TokenEndpointFailure.Classification, _ reason: String, oauth: [String: JSONValue]? = nil) -> Result<TokenGrant, TokenEndpointFailure> {
            var f = TokenEndpointFailure(classification: cls, reason: reason, status: status)
            if let oauth {
                f.oauthError = oauth["error"]?.stringValue.map { sanitise($0, limit: 64) }
                f.errorDescription = oauth["error_description"]?.stringValue.map { sanitise($0, limit: 256) }
                f.errorURI = oauth["error_uri"]?.stringValue.map { sanitise($0, limit: 256) }
            }
            if cls == .retryable {
                f.retryAfter = retryAfter ?? ((status == 429 || status == 503) ? defaultRetryAfter : nil)
            }
            return .failure(f)
        }

        guard body.count <= maxBodyBytes else {
            return failure(.retryable, "token.response_too_large")
        }
        let json = try? JSONParser(maxBytes: maxBodyBytes).parse(body)
        let object = json?.objectValue

        // An `error` member decides, whatever the status (a 200 with `error` is a failure).
        if let object, let code = object["error"] {
            guard let code = code.stringValue else { return failure(.retryable, "token.malformed_error", oauth: object) }
            let safe = sanitise(code, limit: 64)
            if code == "invalid_grant" { return failure(.invalidGrant, "token.invalid_grant", oauth: object) }
            if Self.permanentErrors.contains(code) { return failure(.permanent, "token.\(safe)", oauth: object) }
            if Self.retryableErrors.contains(code) { return failure(.retryable, "token.\(safe)", oauth: object) }
            if statusRetryable { return failure(.retryable, "token.http_\(status)", oauth: object) }
            return failure(.retryable, "token.\(safe)", oauth: object)
        }
        guard (200...299).contains(status) else {
            return failure(.retryable, "token.http_\(status)")
        }
        guard let object else {
            return failure(.retryable, json == nil ? "token.malformed_json" : "token.not_an_object")
        }
        guard let access = object["access_token"]?.stringValue, !access.isEmpty else {
            return failure(.retryable, "token.missing_access_token")
        }
        guard access.utf8.allSatisfy({ $0 >= 0x21 && $0 <= 0x7E }) else {
            return failure(.retryable, "token.invalid_access_token")
        }
        if requiresDPoP {
            // RFC 9449 §5: a DPoP session's token must be bound (`token_type: DPoP`); a Bearer
            // token would be sent with a proof the server ignores, or refused by the resource.
            guard let tokenType = object["token_type"]?.stringValue, tokenType.lowercased() == "dpop" else {
                var f = TokenEndpointFailure(classification: .permanent, reason: "token.dpop_not_bound", status: status)
                f.errorDescription = "dpop: true, but the token endpoint answered token_type "
                    + sanitise(object["token_type"]?.stringValue ?? "(none)", limit: 32) + ", not DPoP: the token is not bound to the session's key"
                return .failure(f)
            }
        } else {
            guard let tokenType = object["token_type"]?.stringValue, tokenType.lowercased() == "bearer" || (acceptsNotApplicableTokenType && tokenType == Self.notApplicableTokenType) else {
                return failure(.retryable, "token.unsupported_token_type")
            }
        }
        let tokenType = object["token_type"]?.stringValue ?? "Bearer"

        // docs/architecture.md §6.1: `expires_in` > 0, else the JWT `exp` if it lies ahead, else
        // `default_lifetime`. An `exp` at or before `wallClockNow` (an expired token, or clocks
        // that disagree) is treated like a missing one: `default_lifetime`, not "expired", which
        // would refresh every second; an upstream 401 still refreshes at once. Every source is
        // clamped to `TokenGrant.maximumLifetime`; all arithmetic here saturates.
        var lifetime: Duration
        var source: TokenGrant.LifetimeSource
        if let seconds = Self.seconds(object["expires_in"]), seconds > 0 {
            lifetime = Self.clampedLifetime(seconds: seconds); source = .expiresIn
        } else if let exp = Self.jwtExpiry(access), let remaining = Self.secondsUntil(exp, from: wallClockNow), remaining > 0 {
            lifetime = Self.clampedLifetime(seconds: remaining); source = .jwtExpiry
        } else {
            lifetime = min(defaultLifetime, TokenGrant.maximumLifetime); source = .defaultLifetime
        }
        if lifetime <= .zero { lifetime = .seconds(1) }
        var refreshIn: Duration? = nil
        if let seconds = Self.seconds(object["refresh_in"]), seconds > 0 { refreshIn = Self.clampedLifetime(seconds: seconds) }
        var refreshToken: OAuthSecret? = nil
        if let rt = object["refresh_token"]?.stringValue, !rt.isEmpty { refreshToken = OAuthSecret(rt) }
        var grant = TokenGrant(accessToken: OAuthSecret(access), tokenType: tokenType, lifetime: lifetime,
                               lifetimeSource: source, refreshIn: refreshIn, refreshToken: refreshToken,
                               scope: object["scope"]?.stringValue)
        grant.issuedTokenType = object["issued_token_type"]?.stringValue.map { sanitise($0, limit: 256) }
        return .success(grant)
    }

    /// An integer number of seconds from a JSON number or a numeric string (`"3600"`, or any
    /// text in the JSON number grammar, RFC 8259 §6); a fractional value is truncated toward
    /// zero and a value beyond `Int64` saturates (`1e308`, `"99999999999999999999"`). Nil for
    /// anything else (`"soon"`, `"0x10"`, `"inf"`, `true`).
    static func seconds(_ value: JSONValue?) -> Int64? {
        switch value {
        case .number(let text)?:
            return saturatingInteger(text)
        case .string(let text)?:
            let trimmed = text.trimmingASCIISpaces()
            if let i = Int64(trimmed) { return i }
            guard case .number(let number)? = try? JSONParser(maxDepth: 1).parse(trimmed) else { return nil }
            return saturatingInteger(number)
        default:
            return nil
        }
    }

    /// A JSON number literal as a whole `Int64`: truncated toward zero, saturating at
    /// `Int64.min`/`Int64.max` (also for magnitudes beyond `Double`, which parse as infinity).
    static func saturatingInteger(_ text: String) -> Int64? {
        if let i = Int64(text) { return i }
        guard let d = Double(text), !d.isNaN else { return nil }
        if d >= 0x1p63 { return .max }
        if d < -0x1p63 { return .min }
        return Int64(d)  // |d| < 2^63 here, so the conversion cannot trap.
    }

    /// `exp - now` in seconds; on overflow, `Int64.max` when `exp` lies ahead and nil when it
    /// lies behind.
    static func secondsUntil(_ exp: Int64, from now: Int64) -> Int64? {
        let (remaining, overflow) = exp.subtractingReportingOverflow(now)
        if overflow { return exp > now ? .max : nil }
        return remaining
    }

    /// `seconds` (> 0) as a lifetime, at most `TokenGrant.maximumLifetime`.
    static func clampedLifetime(seconds: Int64) -> Duration {
        min(.seconds(seconds), TokenGrant.maximumLifetime)
    }

    /// The `exp` claim (RFC 7519 §4.1.4) of a JWS compact serialisation, unverified: used only
    /// to know when to refresh. Saturates like `saturatingInteger`.
    public static func jwtExpiry(_ token: String) -> Int64? {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let payload = Base64.decodeURL(String(parts[1])),
              let claims = try? JSONParser(maxDepth: 16, maxBytes: 64 * 1024).parse(payload),
              case .number(let text)? = claims["exp"] else { return nil }
        return saturatingInteger(text)
    }
}

/// Keeps server-supplied text log-safe: printable ASCII only (RFC 6749 §5.2 allows no
/// more for `error_description`), bounded length.
func sanitise(_ text: String, limit: Int) -> String {
    var out = ""
    for scalar in text.unicodeScalars.prefix(limit) {
        out.unicodeScalars.append(scalar.value >= 0x20 && scalar.value < 0x7F ? scalar : "?")
    }
    return out
}

extension String {
    func trimmingASCIISpaces() -> String {
        var s = Substring(self)
        while let f = s.first, f == " " || f == "\t" { s.removeFirst() }
        while let l = s.last, l == " " || l == "\t" { s.removeLast() }
        return String(s)
    }
}

/// `Retry-After` (RFC 9110 §10.2.3): delta-seconds or an HTTP-date.
public enum RetryAfter {
    /// The delay, relative to `wallClockNow` (Unix seconds) for a date; a date in the past is
    /// zero. Nil when the value is neither form. Accepts IMF-fixdate only (RFC 9110 §5.6.7).
    public static func parse(_ value: String, wallClockNow: Int64) -> Duration? {
        let text = value.trimmingASCIISpaces()
        if !text.isEmpty, text.utf8.allSatisfy({ $0 >= UInt8(ascii: "0") && $0 <= UInt8(ascii: "9") }) {
            guard let seconds = Int64(text) else { return .seconds(Int64.max / 2_000_000_000) }
            return .seconds(seconds)
        }
        guard let date = HTTPDate.parseIMFFixdate(text) else { return nil }
        // Saturating: a wall clock at the edge of Int64 must not make the difference overflow.
        return .seconds(max(0, TokenResponseParser.secondsUntil(date, from: wallClockNow) ?? 0))
    }
}

/// HTTP-date (RFC 9110 §5.6.7), IMF-fixdate form: `Sun, 06 Nov 1994 08:49:37 GMT`.
public enum HTTPDate {
    static let days = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
    static let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]

    /// Unix seconds, or nil if malformed (including a day-name that does not match the date).
    public static func parseIMFFixdate(_ text: String) -> Int64? {
        let b = Array(text.utf8)
        guard b.count == 29, b[3] == UInt8(ascii: ","), b[4] == 0x20, b[7] == 0x20, b[11] == 0x20,
              b[16] == 0x20, b[19] == UInt8(ascii: ":"), b[22] == UInt8(ascii: ":"), b[25] == 0x20,
              String(decoding: b[26..<29], as: UTF8.self) == "GMT" else { return nil }
        func number(_ range: Range<Int>) -> Int64? {
            var v: Int64 = 0
            for i in range {
                guard b[i] >= UInt8(ascii: "0"), b[i] <= UInt8(ascii: "9") else { return nil }
                v = v * 10 + Int64(b[i] - UInt8(ascii: "0"))
            }
            return v
        }
        let dayName = String(decoding: b[0..<3], as: UTF8.self)
        let monthName = String(decoding: b[8..<11], as: UTF8.self)
        guard let weekday = days.firstIndex(of: dayName), let monthIndex = months.firstIndex(of: monthName),
              let day = number(5..<7), let year = number(12..<16), let hour = number(17..<19),
              let minute = number(20..<22), let second = number(23..<25),
              hour < 24, minute < 60, second < 61, day >= 1 else { return nil }
        let month = Int64(monthIndex + 1)
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
        let monthDays: [Int64] = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        guard day <= monthDays[monthIndex] else { return nil }
        let epochDay = CivilTime.daysFromCivil(year: year, month: month, day: day)
        // 1970-01-01 was a Thursday (index 3 with Monday = 0).
        guard Int(((epochDay % 7) + 7 + 3) % 7) == weekday else { return nil }
        return epochDay * 86_400 + hour * 3_600 + minute * 60 + min(second, 59)
    }
}
