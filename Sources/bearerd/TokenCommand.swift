import ArgumentParser
import BearerdIO
import BearerdOAuth
import BearerdProxy
import Dispatch
import Foundation
import Logging
import BearerdProxyCore
import BearerdConfig
import BearerdSessions
import BearerdService

/// `bearerd token -c FILE SESSION` (DESIGN §3): prints a current access token of one session
/// on stdout, and nothing else, for scripts (`curl -H "Authorization: Bearer $(bearerd token …)"`).
///
/// Shares the state file and its lock with a running `bearerd run`: a refresh_token session
/// adopts a persisted access token with enough life left, or refreshes and persists the
/// rotated refresh token exactly as the proxy does. Other sessions reuse the token an earlier
/// call cached in `state_dir` (`TokenCache`), so a script calling this in a loop costs one token
/// request per token lifetime. Errors go to stderr, exit status non-zero; log lines only with
/// `-v` (or `--log-level`).
struct Token: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print a current access token of a session on stdout (shares the persisted state with a running proxy).")
    @OptionGroup var configOption: ConfigOption
    @OptionGroup var logOptions: LogOptions
    @Argument(help: "The session name, as in the configuration's `sessions:`.") var session: String
    @Flag(name: .shortAndLong, help: "Log what happens (info level) on stderr; by default only warnings and errors.") var verbose = false

    func run() throws {
        var stderr = FileHandle.standardError
        let config = try configOption.load(orExit: 2)
        guard let sessionConfig = config.session(named: session) else {
            let known = config.sessions.map(\.name)
            print("\(configOption.path): no session named '\(session)'"
                  + (known.isEmpty ? " (the file defines none)" : " (known: \(known.joined(separator: ", ")))"), to: &stderr)
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
        if let cached = cache?.reusable() {
            logger.info("reusing the cached token", metadata: ["session": "\(session)", "token.fingerprint": "\(BearerdOAuth.fingerprint(cached))"])
            LogSink.stderr.flush()
            FileHandle.standardOutput.write(cached + "\n")
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
        manager.stop()
        LogSink.stderr.flush()
        switch box.result {
        case .success(let token)?:
            do {
                try cache?.store(token, monotonicNow: monotonicNanos())
            } catch {
                logger.warning("cannot cache the token", metadata: ["error": "\(error)"])
            }
            FileHandle.standardOutput.write(token.value + "\n")
        case .failure(let unavailable)?:
            print("bearerd token: session \(session): no token: \(unavailable.detail) (retry in \(unavailable.retryAfterSeconds)s)", to: &stderr)
            throw ExitCode(1)
        case nil:
            throw ExitCode(1)
        }
    }
}

/// Hands the completion's result from the event loop to the waiting main thread.
private final class ResultBox: @unchecked Sendable {  // @unchecked: written before the semaphore is signalled, read after
    var result: Result<PublishedToken, TokenUnavailable>?
}
