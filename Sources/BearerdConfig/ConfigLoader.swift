import BearerdOAuth
import Foundation
import Yams
import BearerdProxyCore

/// Reads `bearerd.yaml` (docs/architecture.md §4) into a validated `BearerdConfig`.
///
/// Every problem found is reported, not just the first, each as `FILE:LINE: key: what is wrong`
/// with the key as a dotted path (`sessions.partner.client_secret_file`, `routes[1].timeouts.connect`).
/// Secret values never appear in errors. Used by `bearerd run`, `bearerd check` and on SIGHUP;
/// it blocks on file reads, so call it off the event loops.
public enum ConfigLoader {
    /// Largest configuration file read (a guard against pointing `-c` at the wrong file).
    static let maxConfigBytes = 16 << 20
    /// Largest secret or refresh-token file read.
    static let maxSecretBytes = 1 << 20

    /// Reads and validates a file. Throws `ConfigErrors` holding every error found, each
    /// `FILE:LINE: key: what is wrong`. Relative paths in the file are taken relative to its directory.
    public static func load(path: String, environment: [String: String] = ProcessInfo.processInfo.environment,
                            checkFiles: Bool = true) throws(ConfigErrors) -> BearerdConfig {
        let bytes: [UInt8]
        do throws(ConfigFiles.Failure) {
            bytes = try ConfigFiles.readAll(path, limit: maxConfigBytes, credential: false)
        } catch {
            throw ConfigErrors([ConfigError(file: path, line: 0, key: "", message: "cannot read: \(error.reason)")])
        }
        switch ConfigFiles.decodeUTF8(bytes) {
        case .invalid(let line):
            throw ConfigErrors([ConfigError(file: path, line: line, key: ConfigBuilder.syntaxKey, message: "the file is not valid UTF-8")])
        case .text(let text):
            return try parse(yaml: text, file: path, environment: environment, checkFiles: checkFiles)
        }
    }

    /// Same as `load(path:)` from text; `file` names the source in messages and anchors relative paths.
    public static func parse(yaml: String, file: String, environment: [String: String] = ProcessInfo.processInfo.environment,
                             checkFiles: Bool = true) throws(ConfigErrors) -> BearerdConfig {
        let builder = ConfigBuilder(file: file, environment: environment, checkFiles: checkFiles)
        let config = builder.build(yaml)
        if let config, builder.errors.isEmpty { return config }
        var errors = builder.errors
        if errors.isEmpty {  // cannot happen: a nil config always records why; kept as a safety net
            errors.append(ConfigError(file: file, line: 0, key: "", message: "invalid configuration"))
        }
        throw ConfigErrors(errors.enumerated().sorted { ($0.element.line, $0.offset) < ($1.element.line, $1.offset) }.map(\.element))
    }

    /// Reads a secret now: a file's contents with one trailing newline removed, an environment
    /// variable, or the literal. The error names the source (path or variable), never the value.
    public static func resolveSecret(_ source: SecretSource, environment: [String: String]) throws(ConfigError) -> Secret {
        try resolveSecret(source, environment: environment, file: "", line: 0, key: "")
    }

    /// `resolveSecret(_:environment:)` with the location used in the error, e.g.
    /// `file: config.file, line: session.line, key: "sessions.partner.client_secret_file"`.
    public static func resolveSecret(_ source: SecretSource, environment: [String: String],
                                     file: String, line: Int, key: String) throws(ConfigError) -> Secret {
        func failure(_ message: String) -> ConfigError {
            ConfigError(file: file, line: line, key: key, message: message)
        }
        switch source {
        case .literal(let secret):
            guard !secret.value.isEmpty else { throw failure("the secret is empty") }
            return secret
        case .env(let name):
            guard let value = environment[name] else { throw failure("environment variable \(name) is not set") }
            guard !value.isEmpty else { throw failure("environment variable \(name) is empty") }
            return Secret(value)
        case .file(let path):
            var bytes: [UInt8]
            do throws(ConfigFiles.Failure) {
                bytes = try ConfigFiles.readAll(path, limit: maxSecretBytes)
            } catch {
                throw failure("cannot read \(path): \(error.reason)")
            }
            if bytes.last == 0x0A {
                bytes.removeLast()
                if bytes.last == 0x0D { bytes.removeLast() }
            }
            guard !bytes.isEmpty else { throw failure("\(path) is empty") }
            if bytes.contains(0x0A) || bytes.contains(0x0D) {
                throw failure("\(path) holds more than one line (only one trailing newline is removed)")
            }
            guard case .text(let text) = ConfigFiles.decodeUTF8(bytes) else {
                throw failure("\(path) is not valid UTF-8")
            }
            return Secret(text)
        }
    }

    /// Reads the client secret and password of a loaded session now (at start-up or SIGHUP),
    /// with errors located like the loader's. `nil` where the session has no such source.
    public static func resolveSecrets(of session: SessionConfig, in config: BearerdConfig,
                                      environment: [String: String] = ProcessInfo.processInfo.environment)
        throws(ConfigErrors) -> (clientSecret: Secret?, password: Secret?) {
        var errors: [ConfigError] = []
        func resolve(_ source: SecretSource?, _ stem: String) -> Secret? {
            guard let source else { return nil }
            let key: String
            switch source {
            case .file: key = stem + "_file"
            case .env: key = stem + "_env"
            case .literal: key = stem
            }
            do throws(ConfigError) {
                return try resolveSecret(source, environment: environment, file: config.file, line: session.line,
                                         key: "sessions.\(session.name).\(key)")
            } catch {
                errors.append(error)
                return nil
            }
        }
        let clientSecret = resolve(session.clientSecret, "client_secret")
        let password = resolve(session.password, "password")
        guard errors.isEmpty else { throw ConfigErrors(errors) }
        return (clientSecret, password)
    }
}

/// The keys each section of the file accepts, exactly as docs/architecture.md §4 spells them (plus the
/// documented extensions). The loader rejects any other key; the example-file test checks
/// that every key listed here is documented in `config.example.yaml`.
enum ConfigKeys {
    static let top = ["listen", "admin", "allow_remote", "allowed_hosts", "allowed_origins", "state_dir", "loops", "io", "limits", "timeouts",
                      "shutdown_grace", "startup_timeout", "log", "sessions", "routes", "outbound_proxy", "token_api", "shared_cache", "tracing"]
    static let listener = ["address", "unix", "name", "mode", "owner", "group", "allow_uids", "allow_gids", "allow_remote", "allowed_hosts", "allowed_origins", "tls"]
    static let listenerTLS = ["cert", "key"]
    static let log = ["format", "level", "access"]
    static let limits = ["header_bytes", "request_target", "headers"]
    static let frontendTimeouts = ["header_read", "idle", "shutdown_grace"]
    static let session = [
        "grant", "token_url", "client_id", "client_secret_file", "client_secret_env", "client_secret",
        "client_auth", "scope", "params", "refresh_before", "default_lifetime", "refresh_token_file",
        "username", "password", "password_file", "password_env", "tls", "request_timeout", "wait_timeout",
        "command", "timeout", "issuer", "allowed_issuers", "client_key_file", "client_key_id",
        "authorization_url", "device_authorization_url", "redirect_uri",
        "assertion_file", "audience", "resource", "subject_token_file", "subject_session", "subject_token_type",
        "actor_token_file", "actor_token_type", "requested_token_type", "client_assertion_file",
        "dpop", "dpop_key_file", "sinks", "region", "sts_url", "credentials",
        "subject", "assertion", "caller_cache", "caller_jwt",
    ]
    static let sink = ["path", "mode", "format"]
    static let tokenAPI = ["listen", "sessions", "allowed_uids", "authorization_token_file"]
    static let tls = ["ca_file", "client_cert", "client_key"]
    static let route = [
        "match", "host", "strip_prefix", "upstream", "session", "tls", "timeouts", "replay_body_limit",
        "reject_statuses", "replay_methods", "http2", "inject", "sign", "caller_jwt",
    ]
    static let callerJWT = ["issuer", "audience", "jwks_url", "jwks_file", "leeway", "ca_file"]
    static let callerCache = ["max_entries"]
    static let sign = ["service", "bucket", "payload"]
    static let credentials = ["web_identity", "assume_role", "url", "url_headers", "url_token_file", "exec", "static", "oidc_role"]
    static let webIdentity = ["role_arn", "token_file", "session_name", "duration"]
    static let assumeRole = ["role_arn", "access_key_id_file", "secret_access_key_file", "session_token_file", "external_id", "session_name", "duration"]
    static let staticKeys = ["access_key_id_file", "secret_access_key_file", "session_token_file"]
    static let oidcRole = ["role_arn", "oidc_provider_arn", "token_file", "session_name", "duration"]
    static let inject = ["header", "format"]
    static let routeTimeouts = ["connect", "response", "idle"]
    static let sharedCache = ["url", "key_file", "prefix", "password_file", "tls"]
    static let tracing = ["otlp_endpoint", "sample_ratio", "headers_file"]

    /// Every section with its dotted location pattern, for documentation checks.
    static let sections: [(section: String, keys: [String])] = [
        ("(top level)", top), ("listen[N]", listener), ("listen[N].tls", listenerTLS), ("log", log), ("limits", limits), ("timeouts", frontendTimeouts), ("sessions.NAME", session),
        ("sessions.NAME.caller_cache", callerCache), ("caller_jwt", callerJWT),
        ("sessions.NAME.tls", tls), ("routes[N]", route), ("routes[N].tls", tls), ("routes[N].timeouts", routeTimeouts), ("routes[N].inject", inject), ("routes[N].sign", sign),
        ("sessions.NAME.credentials", credentials), ("sessions.NAME.credentials.web_identity", webIdentity),
        ("sessions.NAME.credentials.assume_role", assumeRole), ("sessions.NAME.credentials.static", staticKeys),
        ("sessions.NAME.credentials.oidc_role", oidcRole),
        ("sessions.NAME.sinks[N]", sink), ("token_api", tokenAPI),
        ("shared_cache", sharedCache), ("shared_cache.tls", tls),
        ("tracing", tracing),
    ]

    /// Form parameters bearerd sets itself; `params` may not override them.
    static let reservedParams: Set<String> = [
        "grant_type", "client_id", "client_secret", "scope", "refresh_token", "username", "password",
    ]
}
