/// Signing keys as a session carries them (docs/architecture.md §6.15).
///
/// A signing session (`grant: aws`, `grant: aliyun`) is a token session whose "access token" is
/// its temporary credentials written as `credential_process` JSON (Version 1: `AccessKeyId`,
/// `SecretAccessKey`, `SessionToken`, `Expiration`). Everything a token session does for a token
/// (lifetime and margins, coalescing, retries, the breaker, persistence in `state_dir`, the
/// sealed shared cache, generations for the replay rule) then holds for the keys unchanged, and
/// `bearerd token NAME` prints what the AWS CLI reads from a `credential_process` helper.
extension TemporaryCredentials {
    /// The credentials as `credential_process` JSON (one line, members in a fixed order).
    public var encodedAsToken: OAuthSecret {
        var out = "{\"Version\":1,\"AccessKeyId\":" + JSONWriter.quote(accessKeyID)
            + ",\"SecretAccessKey\":" + JSONWriter.quote(secret.exposedValue)
        if let sessionToken { out += ",\"SessionToken\":" + JSONWriter.quote(sessionToken.exposedValue) }
        if let expiresAt { out += ",\"Expiration\":" + JSONWriter.quote(ISO8601Timestamp.format(expiresAt)) }
        return OAuthSecret(out + "}")
    }

    /// The credentials a signing session published (`encodedAsToken`); nil for anything else.
    public init?(encodedToken token: OAuthSecret) {
        guard token.exposedValue.utf8.first == UInt8(ascii: "{"),
              let c = try? TemporaryCredentials.fromCredentialProcessJSON(Array(token.exposedValue.utf8)) else { return nil }
        self = c
    }
}
