import ArgumentParser
import BearerdIO
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
/// rotated refresh token exactly as the proxy does. Errors go to stderr, exit status non-zero.
struct Token: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print a current access token of a session on stdout (shares the persisted state with a running proxy).")
    @OptionGroup var configOption: ConfigOption
    @OptionGroup var logOptions: LogOptions
    @Argument(help: "The session name, as in the configuration's `sessions:`.") var session: String

    func run() throws {
        var stderr = FileHandle.standardError
        let config = try configOption.load(orExit: 2)
        guard config.session(named: session) != nil else {
            let known = config.sessions.map(\.name)
            print("\(configOption.path): no session named '\(session)'"
                  + (known.isEmpty ? " (the file defines none)" : " (known: \(known.joined(separator: ", ")))"), to: &stderr)
            throw ExitCode(2)
        }
        // Only this session is built: others may need secrets this shell does not have.
        var single = config
        single.sessions = config.sessions.filter { $0.name == session }
        single.routes = []
        let manager: SessionManager
        do {
            manager = try SessionManager(config: single, logger: logOptions.makeLogger(label: "bearerd.token", settings: logOptions.settings(for: config)),
                                         environment: ProcessInfo.processInfo.environment)
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
