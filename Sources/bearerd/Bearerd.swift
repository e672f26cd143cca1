import ArgumentParser
import BearerdProxy
import BearerdIO
import Dispatch
import Foundation
import Logging
import BearerdOAuth
import BearerdConfig
import BearerdSessions
import BearerdService

@main
struct Bearerd: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "bearerd",
        abstract: "An authenticating reverse proxy: forwards plain HTTP upstream with credentials attached (an OAuth 2.0 token, or a request signature).",
        version: BearerdVersion.string,
        subcommands: [Run.self, Check.self, Token.self, Login.self, Demo.self, ConfigCommand.self]
    )
}

/// Options shared by the commands that read a configuration file.
struct ConfigOption: ParsableArguments {
    @Option(name: [.short, .customLong("config")], help: "Configuration file (default: $BEARERD_CONFIG, then ./bearerd.yaml).")
    var config: String?

    var path: String {
        config ?? ProcessInfo.processInfo.environment["BEARERD_CONFIG"] ?? "bearerd.yaml"
    }

    /// Loads and validates the file, then reads the metadata of every `issuer:` (discovery);
    /// on errors prints them (`FILE:LINE: key: …`) and exits with `code`. `useDiscoveryCache`:
    /// fall back to metadata kept in state_dir when an issuer is unreachable (not for `check`).
    func load(orExit code: Int32, useDiscoveryCache: Bool = true) throws -> BearerdConfig {
        do {
            return try loadResolved(path: path, useDiscoveryCache: useDiscoveryCache)
        } catch {
            printErrors(error)
            throw ExitCode(code)
        }
    }
}

/// `ConfigLoader.load` plus discovery of `issuer:` sessions (blocking; never on a loop).
func loadResolved(path: String, useDiscoveryCache: Bool = true) throws(ConfigErrors) -> BearerdConfig {
    let config = try ConfigLoader.load(path: path)
    guard config.sessions.contains(where: { $0.issuerSource != nil }) else { return config }
    let logger = Logger(label: "bearerd.discovery") { BearerdLogHandler(label: $0, level: .warning, format: config.log.format) }
    return try Discovery.resolve(config, logger: logger, useCache: useDiscoveryCache).get()
}

struct LogOptions: ParsableArguments {
    @Option(help: "Log level: trace, debug, info, notice, warning, error, critical (default: $BEARERD_LOG_LEVEL, then the config's log.level, then info).")
    var logLevel: String?

    @Option(help: "Log format: text or json (default: $BEARERD_LOG_FORMAT, then the config's log.format, then text).")
    var logFormat: String?

    @Flag(help: "Do not write one line per request (overrides the config's log.access).")
    var noAccessLog = false

    private var env: [String: String] { ProcessInfo.processInfo.environment }

    /// The level set outside the config file (flag, then environment), if any.
    var levelOverride: Logger.Level? { (logLevel ?? env["BEARERD_LOG_LEVEL"]).flatMap { Logger.Level(rawValue: $0) } }
    var formatOverride: LogFormat? { (logFormat ?? env["BEARERD_LOG_FORMAT"]).flatMap { LogFormat(rawValue: $0) } }

    func validate() throws {
        if let l = logLevel ?? env["BEARERD_LOG_LEVEL"], Logger.Level(rawValue: l) == nil {
            throw ValidationError("unknown log level '\(l)' (trace, debug, info, notice, warning, error, critical)")
        }
        if let f = logFormat ?? env["BEARERD_LOG_FORMAT"], LogFormat(rawValue: f) == nil {
            throw ValidationError("unknown log format '\(f)' (text or json)")
        }
    }

    /// Shared settings: the command line and environment win over the config's `log:`.
    func settings(for config: BearerdConfig?) -> LogSettings {
        LogSettings(level: levelOverride ?? config?.log.level ?? .info, format: formatOverride ?? config?.log.format ?? .text)
    }

    /// Applies a reloaded config's `log:` where nothing outside the file overrides it.
    func apply(_ config: BearerdConfig, to settings: LogSettings) {
        if levelOverride == nil { settings.level = config.log.level }
        if formatOverride == nil { settings.format = config.log.format }
    }

    func accessLog(for config: BearerdConfig) -> Bool { !noAccessLog && config.log.access }

    func makeLogger(label: String = "bearerd", settings: LogSettings) -> Logger {
        Logger(label: label) { l in BearerdLogHandler(label: l, settings: settings) }
    }

    func makeLogger(label: String = "bearerd") -> Logger {
        makeLogger(label: label, settings: settings(for: nil))
    }
}

func printErrors(_ errors: ConfigErrors) {
    var stderr = FileHandle.standardError
    for e in errors.errors { print(e.description, to: &stderr) }
}

extension FileHandle: @retroactive TextOutputStream {
    public func write(_ string: String) { write(string.data(using: .utf8)!) }
}

struct Run: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run the proxy.")
    @OptionGroup var configOption: ConfigOption
    @OptionGroup var logOptions: LogOptions

    func run() throws {
        ProcessSignals.block()  // first: a SIGTERM at any later moment of the start waits for `serve`
        let config = try configOption.load(orExit: 2)
        let settings = logOptions.settings(for: config)
        let logger = logOptions.makeLogger(settings: settings)
        try serve(config: config, logger: logger, logOptions: logOptions, logSettings: settings, reloadPath: configOption.path)
    }
}

/// Runs a server until SIGTERM/SIGINT; SIGHUP re-reads `reloadPath` when given (and applies its
/// `log:` to `logSettings` unless the command line or environment set them).
///
/// Signals: the caller blocked them (`ProcessSignals.block()`) before anything started, so one
/// sent during the start waits; once started, this thread (the server's controlling thread)
/// takes them one by one and never returns. A SIGTERM or SIGINT begins the shutdown; repeats
/// and SIGHUPs after it are logged and ignored. The process exits when the drain completes.
///
/// Under systemd: listeners come from socket activation when LISTEN_FDS is set, and
/// $NOTIFY_SOCKET hears READY=1, RELOADING=1, STOPPING=1, STATUS= and WATCHDOG=1 (Systemd.swift).
func serve(config: BearerdConfig, logger: Logger, logOptions: LogOptions, logSettings: LogSettings, reloadPath: String?,
           before: (() throws -> Void)? = nil) throws -> Never {
    ProcessSignals.block()  // normally done by the command already; harmless twice
    let systemd = SystemdService(logger: logger)
    let inherited = SocketActivation.takeFromEnvironment(logger: logger)
    let server: BearerdServer
    do {
        server = try BearerdServer(config: config, logger: logger, accessLog: logOptions.accessLog(for: config))
        try server.start(inheriting: inherited)
    } catch let e as ConfigErrors {
        systemd?.startFailed(firstError(e))
        printErrors(e)
        throw ExitCode(2)
    } catch {
        systemd?.startFailed("\(error)")
        logger.critical("cannot start", metadata: ["error": "\(error)"])
        LogSink.stderr.flush()
        throw ExitCode(1)
    }
    try before?()
    systemd?.started(probe: SystemdService.Probe(server: server), startupTimeout: config.startupTimeout)
    ProcessMemory.releaseStartupCode()  // start-up's code pages leave the resident set (ProcessMemory)
    var phase = ServePhase.serving
    while true {
        let sig = ProcessSignals.next()
        switch (sig, phase) {
        case (SIGHUP, .serving):
            guard let reloadPath else { continue }
            systemd?.reloading()
            do throws(ConfigErrors) {
                let next = try loadResolved(path: reloadPath)
                try server.reload(next, accessLog: logOptions.accessLog(for: next))
                logOptions.apply(next, to: logSettings)
                systemd?.reloaded(failure: nil)
            } catch {
                logger.error("reload failed; keeping the running configuration", metadata: ["errors": "\(error.description)"])
                systemd?.reloaded(failure: firstError(error))
            }
        case (_, .serving):
            phase = .stopping
            let grace = server.runtime.config.frontendTimeouts.shutdownGrace  // a reload may have changed it
            systemd?.stopping(grace: grace)
            logger.info("shutting down", metadata: ["signal": "\(sig)", "grace": "\(grace)"])
            server.shutdown(grace: grace) {
                logger.info("stopped")
                LogSink.stderr.flush()
                exit(0)
            }
        case (_, .stopping):
            logger.notice("already shutting down; signal ignored", metadata: ["signal": "\(sig)"])
        }
    }
}

/// Where `serve`'s signal loop is: serving (SIGHUP reloads), or draining after SIGTERM/SIGINT.
enum ServePhase {
    case serving
    case stopping
}

/// The first of several configuration errors, with how many more there are (for STATUS=).
func firstError(_ errors: ConfigErrors) -> String {
    guard let first = errors.errors.first else { return "invalid configuration" }
    return first.description + (errors.errors.count > 1 ? " (and \(errors.errors.count - 1) more)" : "")
}

struct Check: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Validate a configuration file and the secrets it names; exit non-zero on any error.")
    @OptionGroup var configOption: ConfigOption
    @Flag(help: "Check an example or template: secrets, key files and issuers that this machine does not have are notes, not errors.")
    var example = false

    func run() throws {
        let config: BearerdConfig
        if example {
            config = try checkExample()
        } else {
            config = try configOption.load(orExit: 1, useDiscoveryCache: false)
        }
        // Everything a start would refuse, without starting anything (no state_dir is created).
        var problems: [ConfigError] = []
        for (i, r) in config.routes.enumerated() {
            do {
                _ = try UpstreamTarget(url: r.upstream, tls: r.tls, timeouts: r.timeouts)
            } catch {
                problems.append(ConfigError(file: config.file, line: r.line, key: "routes[\(i)].tls", message: error.message))
            }
        }
        // state_dir: a start refuses one owned by someone else or writable by group or others.
        if let dir = config.stateDir, !example {
            do throws(StateStoreError) {
                try StateDirectory.check(dir)
            } catch {
                problems.append(ConfigError(file: config.file, line: 0, key: "state_dir", message: error.description))
            }
        }
        problems += SessionManager.reauthenticationProblems(config: config, environment: ProcessInfo.processInfo.environment)
        // DPoP keys: readable, P-256 or RSA ≥ 2048 (RFC 9449); their jkt is printed below.
        var dpopKeys: [(String, DPoPKeyDescription)] = []
        for s in config.sessions {
            switch DPoPKeyDescription.of(s, stateDir: config.stateDir) {
            case .success(let d)?: dpopKeys.append((s.name, d))
            case .failure(let problem)?:
                let key: String
                if case .unusable(let k, _) = problem, k == "dpop_key_file" { key = "sessions.\(s.name).dpop_key_file" } else { key = "state_dir" }
                problems.append(ConfigError(file: config.file, line: s.line, key: key, message: problem.description))
            case nil: break
            }
        }
        // shared_cache: the connection (AUTH, SELECT) and the key (a sealed probe written, read back and opened).
        var sharedCacheNote: String?
        if let shared = config.sharedCache, !example {
            let logger = Logger(label: "bearerd.check") { BearerdLogHandler(label: $0, level: .critical, format: .text) }
            switch SharedTokenCache.check(shared, file: config.file, environment: ProcessInfo.processInfo.environment, logger: logger) {
            case .success(let note): sharedCacheNote = note
            case .failure(let e): problems += e.errors
            }
        }
        // Signing sessions: their keys fetched once, from where and until when (never the secret).
        var credentialLines: [String] = []
        if !example && problems.isEmpty {
            let checked = CheckCredentials.run(config, environment: ProcessInfo.processInfo.environment)
            problems += checked.problems
            credentialLines = checked.lines
        }
        if example {
            // The same missing files again, from the TLS set-up: already noted.
            problems.removeAll()
        }
        // Secrets others can read, credentials in clear: warnings, not errors; printed (to stderr)
        // whether or not there are errors.
        let warnings = example ? [] : CheckWarnings.all(config)
        func printWarnings() {
            var stderr = FileHandle.standardError
            for w in warnings { print("warning: \(w.description)", to: &stderr) }
        }
        if !problems.isEmpty {
            printErrors(ConfigErrors(problems))
            printWarnings()
            throw ExitCode(1)
        }
        print("\(configOption.path): OK (\(config.listen.count) listener(s), \(config.sessions.count) session(s), \(config.routes.count) route(s))")
        if let sharedCacheNote { print("shared_cache: \(sharedCacheNote)") }
        if let shared = config.sharedCache, !example, case .success(let key) = shared.readKey() {
            print("shared_cache: key_file \(shared.keyFile) holds " + (key.form == .base64 ? "the base64 of a 32-byte key" : "a raw 32-byte key"))
        }
        // A person's session nobody has signed in to yet: not a configuration error (exit 0);
        // `bearerd login` needs this very configuration to be valid first.
        if !example {
            for name in SessionManager.pendingSignIns(config: config) {
                print("sessions.\(name): nobody has signed in yet: run `bearerd login \(name)`")
            }
        }
        printWarnings()
        for line in credentialLines { print(line) }
        // private_key_jwt: the kid bearerd sends and the public key to register with the server.
        for s in config.sessions {
            guard case .success(let key)? = ClientKeyDescription.of(s) else { continue }
            print("sessions.\(s.name): private_key_jwt kid \(key.kid)" + (s.clientKeyID == nil ? " (RFC 7638 thumbprint of client_key_file)" : " (client_key_id; RFC 7638 thumbprint \(key.thumbprint))"))
            print("sessions.\(s.name): public JWK to register: \(key.publicJWK)")
        }
        // issuer: from_upstream: which authorization server the upstream named, and how (RFC 9728).
        for s in config.sessions {
            guard let found = s.issuerSource?.fromUpstream?.resolved else { continue }
            print("sessions.\(s.name): authorization server \(found.issuer) (in allowed_issuers), named by the upstream \(found.upstream) "
                  + "in its protected resource metadata \(found.metadataURL) (\(found.foundBy == .challenge ? "from its 401's resource_metadata" : "at the well-known URL")); "
                  + "token endpoint \(s.tokenURL); resource \(s.resources.joined(separator: " "))")
        }
        // On behalf of callers (docs/architecture.md §6.16): what each caller's token meets.
        for s in config.sessions {
            guard let obo = s.onBehalfOf else { continue }
            let ceiling = Double(obo.maxEntries * CallerTokenCache<Int>.entryBytes(tokenBytes: 1024)) / 1_048_576
            print("sessions.\(s.name): acts on behalf of each caller (\(s.grant == .jwtBearer ? "assertion" : "subject"): caller); "
                  + "caller_cache max_entries \(obo.maxEntries) (at most \(String(format: "%.1f", ceiling)) MiB for 1 KiB tokens)"
                  + (obo.callerJWT == nil ? "; callers' tokens are judged by the token endpoint only (no caller_jwt)" : ""))
        }
        if !example {
            var guards: [(String, CallerJWTConfig)] = config.sessions.compactMap { s in s.onBehalfOf?.callerJWT.map { ("sessions.\(s.name).caller_jwt", $0) } }
            guards += config.routes.enumerated().compactMap { i, r in r.callerJWT.map { ("routes[\(i)].caller_jwt", $0) } }
            for (key, c) in guards {
                switch CallerJWTGuard.probe(c, outboundProxy: config.outboundProxy) {
                case .success(let found):
                    print("\(key): iss \(c.issuer), aud \(c.audience): \(found.keyIDs.count) key(s) (\(found.keyIDs.joined(separator: ", ")))"
                          + (found.skipped.isEmpty ? "" : "; skipped: " + found.skipped.joined(separator: "; ")))
                case .failure(let e):
                    var stderr = FileHandle.standardError
                    print("warning: \(config.file):\(e.line): \(key): \(e.message) (callers get 503 until the keys load)", to: &stderr)
                }
            }
        }
        for (name, d) in dpopKeys {
            switch d {
            case .key(let path, let alg, let jkt): print("sessions.\(name): DPoP key \(path) (\(alg)), jkt \(jkt)")
            case .toBeGenerated(let path): print("sessions.\(name): DPoP key \(path) is generated (P-256, ES256) on first start")
            }
        }
    }

    /// `--example`: the file must be valid as written; what it names that this machine lacks
    /// (secret files and variables, key and certificate files, reachable issuers) is listed as
    /// notes. A structural error is still an error.
    private func checkExample() throws -> BearerdConfig {
        let path = configOption.path
        let config: BearerdConfig
        do {
            config = try ConfigLoader.load(path: path, checkFiles: false)
        } catch {
            printErrors(error)
            throw ExitCode(1)
        }
        var notes: [String] = []
        do throws(ConfigErrors) {
            _ = try ConfigLoader.load(path: path)
        } catch {
            notes += error.errors.map(\.description)
        }
        if config.sessions.contains(where: { $0.issuerSource != nil }) {
            let logger = Logger(label: "bearerd.discovery") { BearerdLogHandler(label: $0, level: .critical, format: .text) }
            if case .failure(let e) = Discovery.resolve(config, logger: logger, useCache: false) {
                notes += e.errors.map(\.description)
            }
        }
        for n in notes { print("note: \(n)") }
        if !notes.isEmpty {
            print("(\(notes.count) note(s): things this machine does not have; a real deployment provides them)")
        }
        return config
    }
}

struct Demo: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run bearerd on a built-in example: a local token endpoint and protected API on 127.0.0.1:9000 behind bearerd on 127.0.0.1:8080 (admin on 9901).")
    @Option(help: "Port for bearerd.") var port: UInt16 = 8080
    @Option(help: "Port for the demo authorization server and API.") var upstreamPort: UInt16 = 9000
    @Option(help: "Port for bearerd's admin listener (/healthz, /readyz, /metrics); 0: none.") var adminPort: UInt16 = 9901
    @OptionGroup var logOptions: LogOptions

    func run() throws {
        ProcessSignals.block()  // first: a SIGTERM at any later moment of the start waits for `serve`
        let settings = logOptions.settings(for: nil)
        let logger = logOptions.makeLogger(settings: settings)
        let upstreamConfig = BearerdConfig(file: "<demo>", listen: [.tcp(host: "127.0.0.1", port: upstreamPort)], loops: 1, routes: [])
        let upstream = try BearerdServer(config: upstreamConfig, logger: logOptions.makeLogger(label: "demo-upstream"),
                                         accessLog: false, responder: DemoAuthority())
        try upstream.start()
        let yaml = """
        listen: [127.0.0.1:\(port)]
        \(adminPort == 0 ? "" : "admin: 127.0.0.1:\(adminPort)")
        loops: 1
        sessions:
          demo:
            grant: client_credentials
            token_url: http://127.0.0.1:\(upstreamPort)/oauth/token
            client_id: \(DemoAuthority.clientID)
            client_secret: \(DemoAuthority.clientSecret)
        routes:
          - match: /
            upstream: http://127.0.0.1:\(upstreamPort)/api
            session: demo
        """
        let config: BearerdConfig
        do {
            config = try ConfigLoader.parse(yaml: yaml, file: "<demo>", environment: [:], checkFiles: false)
        } catch {
            printErrors(error)
            throw ExitCode(2)
        }
        try serve(config: config, logger: logger, logOptions: logOptions, logSettings: settings, reloadPath: nil) {
            print("""
            bearerd demo is running: bearerd on 127.0.0.1:\(port), a demo token endpoint and protected API on 127.0.0.1:\(upstreamPort).
              try:    curl -s http://127.0.0.1:\(port)/hello          (bearerd fetched a token and injected it)
              revoke: curl -s -X POST http://127.0.0.1:\(upstreamPort)/demo/revoke   then the first curl again:
                      the API answers 401, bearerd refreshes once and replays the request
              admin:  \(adminPort == 0 ? "(off)" : "curl -s http://127.0.0.1:\(adminPort)/readyz ; curl -s http://127.0.0.1:\(adminPort)/metrics")
              stop:   Ctrl-C
            """)
            fflush(stdout)
        }
    }
}
