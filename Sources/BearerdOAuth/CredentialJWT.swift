/// A JWT read from a credential file (`assertion_file`, `subject_token_file`, `actor_token_file`,
/// `client_assertion_file`), looked at without verification: bearerd only needs to know that the
/// file holds a compact JWS (RFC 7515 §7.1) and whether its `exp` (RFC 7519 §4.1.4) has passed,
/// so an expired projected token is reported instead of sent (docs/architecture.md §6 "Files that hold
/// credentials"). Pure: the wall clock is an argument.
public enum CredentialJWT {
    /// What a credential file holds.
    public enum Inspection: Sendable, Equatable {
        /// A compact JWS whose header and claims are JSON objects; `expiresAt` is its `exp`.
        case jwt(expiresAt: Int64?)
        /// Not a JWT; `reason` says why (never quotes the content).
        case notAJWT(reason: String)
    }

    /// Why a credential cannot be sent now.
    public enum Problem: Sendable, Equatable, CustomStringConvertible {
        case empty
        case notAJWT(String)
        /// `exp` passed `secondsAgo` seconds ago (0 = this second).
        case expired(expiresAt: Int64, secondsAgo: Int64)

        /// Stable dotted reason for logs, metrics and /readyz.
        public var reason: String {
            switch self {
            case .empty: "credential.empty"
            case .notAJWT: "credential.not_a_jwt"
            case .expired: "credential.expired"
            }
        }

        public var description: String {
            switch self {
            case .empty: "the file is empty"
            case .notAJWT(let why): "the file holds no JWT (\(why))"
            case .expired(let at, let ago): "the JWT expired \(ago) s ago (exp \(at))"
            }
        }
    }

    /// The compact serialisation, trimmed of surrounding whitespace (files end with a newline).
    public static func trimmed(_ text: String) -> String {
        var s = Substring(text)
        while let f = s.first, f == " " || f == "\t" || f == "\n" || f == "\r" { s.removeFirst() }
        while let l = s.last, l == " " || l == "\t" || l == "\n" || l == "\r" { s.removeLast() }
        return String(s)
    }

    /// Looks at `token` (already trimmed): three base64url parts, header and claims JSON objects.
    public static func inspect(_ token: String) -> Inspection {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3 else {
            return .notAJWT(reason: parts.count == 5 ? "an encrypted JWE, not a signed JWT" : "a JWT has three dot-separated parts, found \(parts.count)")
        }
        guard !parts[0].isEmpty, !parts[1].isEmpty else { return .notAJWT(reason: "an empty header or claims part") }
        let parser = JSONParser(maxDepth: 16, maxBytes: 64 * 1024)
        guard let header = Base64.decodeURL(String(parts[0])), case .object? = try? parser.parse(header) else {
            return .notAJWT(reason: "the header is not base64url JSON")
        }
        guard let payload = Base64.decodeURL(String(parts[1])), let claims = try? parser.parse(payload),
              case .object = claims else {
            return .notAJWT(reason: "the claims are not base64url JSON")
        }
        if case .number(let text)? = claims["exp"] {
            return .jwt(expiresAt: TokenResponseParser.saturatingInteger(text))
        }
        return .jwt(expiresAt: nil)
    }

    /// The problem with sending `content` (the file's text) at `wallClockNow` (Unix seconds), or
    /// nil when it can be sent. A JWT without `exp` is sent (the server decides).
    public static func problem(content: String, wallClockNow: Int64) -> Problem? {
        let token = trimmed(content)
        if token.isEmpty { return .empty }
        switch inspect(token) {
        case .notAJWT(let why):
            return .notAJWT(why)
        case .jwt(let exp):
            guard let exp, exp <= wallClockNow else { return nil }
            let (ago, overflow) = wallClockNow.subtractingReportingOverflow(exp)
            return .expired(expiresAt: exp, secondsAgo: overflow ? .max : ago)
        }
    }
}
