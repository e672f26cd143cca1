import ArgumentParser
import BearerdIO
import BearerdOAuth
import Dispatch
import Foundation
import Logging
import BearerdProxyCore
import BearerdConfig
import BearerdSessions
import BearerdService

/// `bearerd token -c FILE SESSION` (docs/architecture.md §3): prints a current access token of one session
/// on stdout, and nothing else, for scripts (`curl -H "Authorization: Bearer $(bearerd token …)"`).
///
/// Shares the state file and its lock with a running `bearerd run`: a refresh_token session
/// adopts a persisted access token with enough life left, or refreshes and persists the
/// rotated refresh token exactly as the proxy does. Other sessions reuse the token an earlier
/// call cached in `state_dir` (`TokenCache`), so a script calling this in a loop costs one token
/// request per token lifetime. Errors go to stderr, exit status non-zero; log lines only with
/// `-v` (or `--log-level`).
///
/// `--format` (docs/architecture.md §3): `token` (default: the token alone), `header` (the header line the
/// proxy would send: `Authorization: DPoP` for a DPoP session, else the `inject:` of the
/// first route using the session, else `Authorization: Bearer`), `json`, or `exec-credential` (a Kubernetes
/// `client.authentication.k8s.io/v1` ExecCredential). Expiries are the token's own, in wall-clock
/// RFC 3339 UTC.
///
/// A signing session (`grant: aws`, `grant: aliyun`; docs/architecture.md §6.15) prints its keys:
/// `credential-process` (its default: AWS `credential_process` JSON, as the session stores them,
/// so the AWS CLI and SDKs can run `bearerd token` as their credential helper) or `json`
/// (`CredentialFormat.json`). A token format for a signing session, or `credential-process` for
/// a token session, is an error (exit 2).
struct Token: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print a current access token of a session on stdout (shares the persisted state with a running proxy).")
    @OptionGroup var configOption: ConfigOption
    @OptionGroup var logOptions: LogOptions
    @Argument(help: "The session name, as in the configuration's `sessions:`.") var session: String
    @Flag(name: .shortAndLong, help: "Log what happens (info level) on stderr; by default only warnings and errors.") var verbose = false
    @Option(help: ArgumentHelp("Output: token (the token alone; the default for token sessions), header (the header line, e.g. `Authorization: Bearer <token>`; "
                               + "a DPoP session's is `Authorization: DPoP <token>`; else the first route using the session decides, by its `inject:`), json "
                               + "({access_token, token_type, expires_at, session}), or exec-credential (a Kubernetes "
                               + "client.authentication.k8s.io/v1 ExecCredential, for a kubeconfig `exec:` user). "
                               + "A signing session (grant aws or aliyun) prints its keys: credential-process (the default: AWS credential_process JSON "
                               + "{Version, AccessKeyId, SecretAccessKey, SessionToken, Expiration}, for `credential_process = bearerd token ...` in ~/.aws/config) "
                               + "or json ({access_key_id, secret_access_key, session_token, expiration, session}; session_token and expiration null when absent).",
                               valueName: "format"))
    var format: String?

    func validate() throws {
        if let format, TokenOutputFormat(rawValue: format) == nil {
            throw ValidationError("unknown format '\(format)' (valid: \(TokenOutputFormat.names.joined(separator: ", ")))")
        }
    }

    func run() throws {
        var stderr = FileHandle.standardError
        let config = try configOption.load(orExit: 2)
        guard let sessionConfig = config.session(named: session) else {
            let known = config.sessions.map(\.name)
            print("\(configOption.path): no session named '\(session)'"
                  + (known.isEmpty ? " (the file defines none)" : " (known: \(known.joined(separator: ", ")))"), to: &stderr)
            throw ExitCode(2)
        }
        if sessionConfig.onBehalfOf != nil {
            // docs/architecture.md §6.16: such a session only exchanges tokens callers bring.
            print("bearerd token: session \(session) acts on behalf of each caller (\(sessionConfig.grant == .jwtBearer ? "assertion" : "subject"): caller) "
                  + "and has no token of its own; send your request through bearerd with Authorization: Bearer <your token>", to: &stderr)
            throw ExitCode(2)
        }
        let signing = sessionConfig.grant.isSigning
        let outputFormat = format.flatMap(TokenOutputFormat.init(rawValue:)) ?? (signing ? .credentialProcess : .token)
        guard outputFormat.fits(signing: signing) else {
            print(signing
                  ? "bearerd token: session \(session) holds signing keys (grant \(sessionConfig.grant.rawValue)), not a token: --format \(outputFormat.rawValue) does not apply; use credential-process (the default) or json"
                  : "bearerd token: session \(session) holds a token, not signing keys: --format \(outputFormat.rawValue) is for grant aws or aliyun sessions",
                  to: &stderr)
            throw ExitCode(2)
        }
        // Only this session is built: others may need secrets this shell does not have.
        var single = config
        // A token_exchange session that chains (`subject_session:`) needs its subjects too.
        var needed: Set<String> = [session]
        var next = sessionConfig.exchange?.subjectSession
        while let n = next, !needed.contains(n) {
            needed.insert(n)
            next = config.session(named: n)?.exchange?.subjectSession
        }
        single.sessions = config.sessions.filter { needed.contains($0.name) }
        single.routes = []
        var settings = logOptions.settings(for: config)
        settings.level = logOptions.levelOverride ?? (verbose ? .info : .warning)
        let logger = logOptions.makeLogger(label: "bearerd.token", settings: settings)
        // A token cached by an earlier call, while it lasts (held under the session's lock, so
        // concurrent calls wait for the one that fetches).
        var cache: TokenCache?
        do {
            cache = try TokenCache(stateDir: config.stateDir, session: sessionConfig)
            try cache?.lock()
        } catch {
            logger.warning("token cache unavailable; asking the token endpoint", metadata: ["error": "\(error)"])
            cache = nil
        }
        defer { cache?.unlock() }
        if let cached = cache?.reusableWithExpiry() {
            logger.info("reusing the cached token", metadata: ["session": "\(session)", "token.fingerprint": "\(BearerdOAuth.fingerprint(cached.token))"])
            LogSink.stderr.flush()
            FileHandle.standardOutput.write(render(outputFormat, token: cached.token, expiresAt: cached.expiresAt, config: config, sessionConfig: sessionConfig) + "\n")
            return
        }
        if cache == nil && config.stateDir == nil && !sessionConfig.grant.usesRefreshToken {
            logger.info("no state_dir: every call asks the token endpoint")
        }
        let manager: SessionManager
        do {
            manager = try SessionManager(config: single, logger: logger, environment: ProcessInfo.processInfo.environment)
        } catch {
            printErrors(error)
            throw ExitCode(2)
        }
        guard let driver = manager.session(named: session) else { throw ExitCode(2) }  // built just above

        let loop = EventLoop(index: 0, readBufferSize: 4096)
        let done = DispatchSemaphore(value: 0)
        let box = ResultBox()
        driver.requestToken(on: loop) { result in
            box.result = result
            done.signal()
        }
        done.wait()
        // The token's own expiry (monotonic), read while the driver still publishes it.
        let published = driver.snapshot
        manager.stop()
        LogSink.stderr.flush()
        switch box.result {
        case .success(let token)?:
            let monotonicNow = monotonicNanos(), wallNow = wallClockSeconds()
            let expiry = published.generation == token.generation ? published.expiresAt : nil
            do {
                try cache?.store(token, monotonicNow: monotonicNow, expiresAt: expiry, wallClockNow: wallNow)
            } catch {
                logger.warning("cannot cache the token", metadata: ["error": "\(error)"])
            }
            // Without the token's expiry (not expected), the end of its use without asking again.
            let expiresAt = TokenCache.wallClock(ofMonotonic: expiry ?? token.usableUntil, monotonicNow: monotonicNow, wallClockNow: wallNow)
            FileHandle.standardOutput.write(render(outputFormat, token: token.value, expiresAt: expiresAt, config: config, sessionConfig: sessionConfig) + "\n")
        case .failure(let unavailable)?:
            print("bearerd token: session \(session): no token: \(unavailable.detail) (retry in \(unavailable.retryAfterSeconds)s)", to: &stderr)
            throw ExitCode(1)
        case nil:
            throw ExitCode(1)
        }
    }
}

extension Token {
    /// One line of output (without the newline) in `format`; `expiresAt` in Unix seconds.
    func render(_ format: TokenOutputFormat, token: String, expiresAt: Int64, config: BearerdConfig, sessionConfig: SessionConfig) -> String {
        if sessionConfig.grant.isSigning {
            // The stored token is the keys' credential_process JSON (docs/architecture.md §6.15).
            guard format == .json, let keys = TemporaryCredentials(encodedToken: OAuthSecret(token)) else { return token }
            return CredentialFormat.json(keys, session: sessionConfig.name)
        }
        switch format {
        case .token:
            return token
        case .header:
            let inject = config.tokenHeader(for: sessionConfig)
            return TokenFormat.header(name: inject.header, prefix: inject.prefix, token: token, suffix: inject.suffix)
        case .json:
            return TokenFormat.json(token: token, tokenType: BearerdConfig.tokenType(for: sessionConfig), expiresAt: expiresAt, session: sessionConfig.name)
        case .execCredential:
            return TokenFormat.execCredential(token: token, expiresAt: expiresAt)
        case .credentialProcess:
            return token  // refused for token sessions before anything is fetched
        }
    }

}

/// Hands the completion's result from the event loop to the waiting main thread.
private final class ResultBox: @unchecked Sendable {  // @unchecked: written before the semaphore is signalled, read after
    var result: Result<PublishedToken, TokenUnavailable>?
}
