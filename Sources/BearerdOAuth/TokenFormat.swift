/// What `bearerd token --format` prints (docs/architecture.md §3): the token alone, a ready-made header line,
/// a JSON object, or a Kubernetes `client.authentication.k8s.io/v1` ExecCredential.
public enum TokenOutputFormat: String, CaseIterable, Sendable {
    case token
    case header
    case json
    case execCredential = "exec-credential"
    /// A signing session's keys as AWS `credential_process` JSON (docs/architecture.md §6.15).
    case credentialProcess = "credential-process"

    /// Whether the format is one of a signing session's (`credential-process`, `json`).
    public func fits(signing: Bool) -> Bool {
        switch self {
        case .json: return true
        case .credentialProcess: return signing
        case .token, .header, .execCredential: return !signing
        }
    }

    /// The valid names, for `--help` and argument errors.
    public static var names: [String] { allCases.map(\.rawValue) }
}

/// Pure rendering of `bearerd token`'s output formats: JSON escaping (RFC 8259 §7) and
/// RFC 3339 §5.6 UTC timestamps from Unix seconds. Holds no state.
public enum TokenFormat {
    /// The earliest and latest instants RFC 3339 can write with a four-digit year
    /// (0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z); anything outside is clamped.
    public static let earliestRenderable: Int64 = -62_135_596_800
    public static let latestRenderable: Int64 = 253_402_300_799

    /// `unixSeconds` as `YYYY-MM-DDTHH:MM:SSZ` (RFC 3339 §5.6, UTC), proleptic Gregorian,
    /// clamped to years 1…9999 (so an "expires never" of `Int64.max` renders as 9999-12-31T23:59:59Z).
    public static func rfc3339(unixSeconds: Int64) -> String {
        CivilTime(epochSeconds: unixSeconds, earliest: earliestRenderable).rfc3339
    }

    /// `Authorization: Bearer <token>` (or the header and format given), one line, no newline.
    public static func header(name: String, prefix: String, token: String, suffix: String) -> String {
        name + ": " + prefix + token + suffix
    }

    /// `{"access_token":…,"token_type":…,"expires_at":"<RFC 3339>","session":…}`, one line, keys in that order.
    public static func json(token: String, tokenType: String, expiresAt: Int64, session: String) -> String {
        "{\"access_token\":" + JSONWriter.quote(token) + ",\"token_type\":" + JSONWriter.quote(tokenType)
            + ",\"expires_at\":" + JSONWriter.quote(rfc3339(unixSeconds: expiresAt))
            + ",\"session\":" + JSONWriter.quote(session) + "}"
    }

    /// A `client.authentication.k8s.io/v1` ExecCredential whose status carries the token and
    /// its expiry (kubectl caches the token until `expirationTimestamp`).
    public static func execCredential(token: String, expiresAt: Int64) -> String {
        "{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{\"token\":"
            + JSONWriter.quote(token) + ",\"expirationTimestamp\":" + JSONWriter.quote(rfc3339(unixSeconds: expiresAt)) + "}}"
    }
}
