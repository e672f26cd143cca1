/// An access token kept in `state_dir` for `bearerd token` (docs/architecture.md §3), so that a script
/// calling it in a loop costs one token request per token lifetime, not one per call. For
/// sessions without a refresh token (client_credentials, password, exec); refresh_token sessions
/// keep theirs in `PersistedSessionState`.
///
/// Owns the token, its wall-clock expiry (Unix seconds; already short of the session's refresh
/// margin) and a `binding`: a fingerprint of what the token was issued for (grant, token URL,
/// client id, scope), so a token cached under another configuration is never handed out.
///
/// Format (JSON object, version 1), file mode 0600:
///
///     {"format":1,"access_token":"…","expires_at":1700000000,"binding":"1a2b3c4d","token_expires_at":1700000060}
///
/// `token_expires_at` (the token's own expiry, for `bearerd token --format json|exec-credential`)
/// is optional: files written before it was recorded lack it.
public struct CachedAccessToken: Sendable, Equatable, CustomStringConvertible {
    public static let formatVersion: Int64 = 1
    /// A cached token is handed out only with at least this much life left.
    public static let minimumRemainingSeconds: Int64 = 5

    public var token: OAuthSecret
    public var expiresAt: Int64
    public var binding: String
    /// The token's own expiry (Unix seconds, ≥ `expiresAt` in practice); nil when not recorded.
    public var tokenExpiresAt: Int64?

    public init(token: OAuthSecret, expiresAt: Int64, binding: String, tokenExpiresAt: Int64? = nil) {
        self.token = token
        self.expiresAt = expiresAt
        self.binding = binding
        self.tokenExpiresAt = tokenExpiresAt
    }

    public var description: String { "CachedAccessToken(\(token.fingerprint), expiresAt: \(expiresAt))" }

    /// The fingerprint of a session's identity: a token issued for one never serves another.
    public static func binding(grant: String, tokenURL: String, clientID: String, scope: String?) -> String {
        BearerdOAuth.fingerprint(grant + "\n" + tokenURL + "\n" + clientID + "\n" + (scope ?? ""))
    }

    /// The token if it belongs to `binding` and has at least `minimumRemainingSeconds` left.
    public func reusable(binding expected: String, wallClockNow: Int64) -> OAuthSecret? {
        guard binding == expected else { return nil }
        let (remaining, overflow) = expiresAt.subtractingReportingOverflow(wallClockNow)
        guard !overflow, remaining >= Self.minimumRemainingSeconds else { return nil }
        return token
    }

    public func encode() -> [UInt8] {
        Array(("{\"format\":\(Self.formatVersion),\"access_token\":" + JSONWriter.quote(token.exposedValue)
               + ",\"expires_at\":\(expiresAt),\"binding\":" + JSONWriter.quote(binding)
               + (tokenExpiresAt.map { ",\"token_expires_at\":\($0)" } ?? "") + "}\n").utf8)
    }

    /// Nil for anything but a well-formed version-1 file (a cache: when in doubt, fetch anew).
    public static func decode(_ bytes: [UInt8]) -> CachedAccessToken? {
        guard let value = try? JSONParser(maxDepth: 2, maxBytes: PersistedSessionState.maxFileBytes).parse(bytes),
              let o = value.objectValue, o.keys.count == (o["token_expires_at"] == nil ? 4 : 5),
              o["format"]?.int64Value == formatVersion,
              let token = o["access_token"]?.stringValue, !token.isEmpty,
              let expiresAt = o["expires_at"]?.int64Value,
              let binding = o["binding"]?.stringValue else { return nil }
        var tokenExpiresAt: Int64?
        if let e = o["token_expires_at"] {
            guard let seconds = e.int64Value else { return nil }
            tokenExpiresAt = seconds
        }
        return CachedAccessToken(token: OAuthSecret(token), expiresAt: expiresAt, binding: binding, tokenExpiresAt: tokenExpiresAt)
    }
}
