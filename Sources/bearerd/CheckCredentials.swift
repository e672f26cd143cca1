import BearerdConfig
import BearerdIO
import BearerdOAuth
import BearerdService
import BearerdSessions
import Dispatch
import Logging

/// `bearerd check` for signing sessions (`grant: aws`, `grant: aliyun`; docs/architecture.md
/// §6.15): fetches each session's keys once, from its configured source, and says from where,
/// whose key (a fingerprint of the key id) and until when; never the secret or the session
/// token. Nothing is written: no `state_dir`, no shared cache, no sink files. Holds no state.
enum CheckCredentials {
    struct Outcome {
        var lines: [String] = []
        var problems: [ConfigError] = []
    }

    static func run(_ config: BearerdConfig, environment: [String: String]) -> Outcome {
        var out = Outcome()
        let signing = config.sessions.filter { $0.grant.isSigning }
        guard !signing.isEmpty else { return out }
        var single = config
        single.sessions = signing.map { s in
            var s = s
            s.sinks = []
            return s
        }
        single.routes = []
        single.stateDir = nil
        single.sharedCache = nil
        let logger = Logger(label: "bearerd.check") { BearerdLogHandler(label: $0, level: .critical, format: .text) }
        let manager: SessionManager
        do throws(ConfigErrors) {
            manager = try SessionManager(config: single, logger: logger, environment: environment)
        } catch {
            out.problems += error.errors
            return out
        }
        defer { manager.stop() }
        let loop = EventLoop(index: 0, readBufferSize: 4096)
        for s in signing {
            guard let driver = manager.session(named: s.name), let source = s.signing else { continue }
            final class Box: @unchecked Sendable { var result: Result<PublishedToken, TokenUnavailable>? }  // @unchecked: written before `done` signals
            let box = Box()
            let done = DispatchSemaphore(value: 0)
            driver.requestToken(on: loop) { result in
                box.result = result
                done.signal()
            }
            let bound = s.waitTimeout + s.requestTimeout + .seconds(5)
            _ = done.wait(timeout: .now() + .milliseconds(Int(clamping: bound.components.seconds * 1000)))
            let whence = source.source.name + (endpoint(source).map { " (\($0))" } ?? "")
            switch box.result {
            case .success(let token)?:
                guard let keys = token.signingKeys else { continue }
                let expiry = keys.expiresAt.map { at in
                    "expire " + ISO8601Timestamp.format(at) + " (in \(max(0, at - wallClockSeconds())) s)"
                } ?? "do not expire (read again every \(s.defaultLifetime))"
                out.lines.append("sessions.\(s.name): credentials from \(whence): key \(token.fingerprint)"
                                 + (keys.sessionToken == nil ? " (no session token)" : " with a session token") + ", \(expiry)")
            case .failure(let u)?:
                out.problems.append(ConfigError(file: config.file, line: s.line, key: "sessions.\(s.name).credentials",
                                                message: "cannot fetch credentials from \(whence): \(u.detail)"))
            case nil:
                out.problems.append(ConfigError(file: config.file, line: s.line, key: "sessions.\(s.name).credentials",
                                                message: "no credentials from \(whence) within \(bound)"))
            }
        }
        return out
    }

    /// Where the keys come from over HTTP, for the message.
    static func endpoint(_ s: SigningCredentialsConfig) -> String? {
        switch s.source {
        case .webIdentity, .assumeRole, .oidcRole: return s.stsURL.description
        case .url(let v): return v.url.description
        case .exec(let argv): return argv.first
        case .staticKeys: return nil
        }
    }
}
