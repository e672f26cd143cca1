/// The wire form of Alibaba Cloud STS `AssumeRoleWithOIDC` as bearerd sends it
/// (docs/architecture.md §6.15). Stateless.
extension STSRequestForm {
    /// Alibaba Cloud `AssumeRoleWithOIDC` split as Alibaba's credentials SDK for Go sends it
    /// (`OIDCCredentialsProvider.getCredentials`): a `POST` whose query holds the RPC common
    /// parameters (`Action`, `Format`, `Version`, `Timestamp`) and whose form body holds the
    /// operation's parameters (`RoleArn`, `OIDCProviderArn`, `OIDCToken`, `RoleSessionName`,
    /// `DurationSeconds`). Alibaba's RPC gateway reads parameters from either place; keeping the
    /// OIDC token in the body keeps it out of every URL a proxy or server may log. The call is
    /// anonymous: no `AccessKeyId`, no `Signature*`. Checks as `aliyunAssumeRoleWithOIDC`.
    public static func aliyunAssumeRoleWithOIDCSplit(roleARN: String, oidcProviderARN: String, oidcToken: OAuthSecret,
                                                     sessionName: String, durationSeconds: Int? = nil,
                                                     timestamp: Int64) throws(CredentialsError) -> (query: String, request: EncodedTokenRequest) {
        // The one set of checks (ARNs, token, session name, duration).
        _ = try aliyunAssumeRoleWithOIDC(roleARN: roleARN, oidcProviderARN: oidcProviderARN, oidcToken: oidcToken,
                                         sessionName: sessionName, durationSeconds: durationSeconds, timestamp: timestamp)
        let query = FormURLEncoding.encode([("Action", "AssumeRoleWithOIDC"), ("Format", "JSON"), ("Version", aliyunVersion),
                                            ("Timestamp", ISO8601Timestamp.format(timestamp))])
        var body = [("RoleArn", roleARN), ("OIDCProviderArn", oidcProviderARN), ("OIDCToken", oidcToken.exposedValue),
                    ("RoleSessionName", sessionName)]
        if let durationSeconds { body.append(("DurationSeconds", String(durationSeconds))) }
        return (query, encoded(body, accept: "application/json"))
    }
}

/// The forms in which bearerd hands a signing session's keys to other programs
/// (docs/architecture.md §6.15): `bearerd token --format json`, sink files of `format: json`,
/// and the token API's `/v1/credentials/NAME`. Pure; stateless. Each is one line of JSON
/// without a line ending.
public enum CredentialFormat {
    /// `bearerd token --format json` and `format: json` sinks: `{"access_key_id",
    /// "secret_access_key", "session_token", "expiration", "session"}`; `session_token` is null
    /// for keys without one, `expiration` (RFC 3339 UTC) null for keys that do not expire.
    public static func json(_ c: TemporaryCredentials, session: String) -> String {
        "{\"access_key_id\":" + JSONWriter.quote(c.accessKeyID)
            + ",\"secret_access_key\":" + JSONWriter.quote(c.secret.exposedValue)
            + ",\"session_token\":" + (c.sessionToken.map { JSONWriter.quote($0.exposedValue) } ?? "null")
            + ",\"expiration\":" + (c.expiresAt.map { JSONWriter.quote(ISO8601Timestamp.format($0)) } ?? "null")
            + ",\"session\":" + JSONWriter.quote(session) + "}"
    }

    /// The container-credentials shape the AWS SDKs read from `AWS_CONTAINER_CREDENTIALS_FULL_URI`:
    /// `AccessKeyId`, `SecretAccessKey`, `Token` (left out for keys without a session token),
    /// `Expiration` (RFC 3339 UTC). `expiresAt`: the keys' own expiration, or for keys that do not
    /// expire the moment the session reads them again (an SDK needs one to know when to ask again).
    public static func containerCredentials(_ c: TemporaryCredentials, expiresAt: Int64) -> String {
        var out = "{\"AccessKeyId\":" + JSONWriter.quote(c.accessKeyID)
            + ",\"SecretAccessKey\":" + JSONWriter.quote(c.secret.exposedValue)
        if let token = c.sessionToken { out += ",\"Token\":" + JSONWriter.quote(token.exposedValue) }
        return out + ",\"Expiration\":" + JSONWriter.quote(ISO8601Timestamp.format(c.expiresAt ?? expiresAt)) + "}"
    }
}
