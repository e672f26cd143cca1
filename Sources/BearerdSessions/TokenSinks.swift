import BearerdConfig
import BearerdIO
import BearerdOAuth
import Dispatch
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// What a session's sink files are written from (docs/architecture.md §4 `sinks:`): the files, and how the
/// `header` and `json` forms look for this session (`BearerdConfig.tokenHeader(for:)`, the
/// same decision as `bearerd token --format header`). Computed from the whole configuration
/// (routes decide the header), so a reload recomputes it.
public struct TokenSinkPlan: Sendable, Equatable {
    public var session: String
    public var sinks: [SinkConfig]
    public var header: InjectConfig
    public var tokenType: String
    /// A signing session (docs/architecture.md §6.15): `token` sinks hold its keys as
    /// `credential_process` JSON (the stored token as is), `json` sinks as `CredentialFormat.json`;
    /// `header` sinks are refused (`refusal(for:)`).
    public var signing: Bool

    public init(session: String, sinks: [SinkConfig], header: InjectConfig = .bearer, tokenType: String = "Bearer", signing: Bool = false) {
        self.session = session
        self.sinks = sinks
        self.header = header
        self.tokenType = tokenType
        self.signing = signing
    }

    public init(_ session: SessionConfig, in config: BearerdConfig) {
        self.init(session: session.name, sinks: session.sinks, header: config.tokenHeader(for: session),
                  tokenType: BearerdConfig.tokenType(for: session), signing: session.grant.isSigning)
    }

    /// Why a sink of `format` is not written for this session, or nil.
    public func refusal(for format: SinkFormat) -> String? {
        guard signing, format == .header else { return nil }
        return "format \(format.rawValue) does not apply to session \(session), which holds signing keys, not a token: use format: token (credential_process JSON) or json"
    }

    /// The file content for `format`; `expiresAt` in Unix seconds. `token` is exactly the token,
    /// without a line ending (as Vault Agent's file sink and Kubernetes' projected token files):
    /// programs read the file straight into a header value, and a trailing newline there makes
    /// it invalid (RFC 9110 §5.5). `header` and `json` are one newline-terminated line.
    public func render(_ format: SinkFormat, token: String, expiresAt: Int64) -> [UInt8] {
        if signing, format == .json, let keys = TemporaryCredentials(encodedToken: OAuthSecret(token)) {
            // The keys, one line (`token` writes the stored credential_process JSON as is).
            return Array((CredentialFormat.json(keys, session: session) + "\n").utf8)
        }
        switch format {
        case .token: return Array(token.utf8)
        case .header: return Array((TokenFormat.header(name: header.header, prefix: header.prefix, token: token, suffix: header.suffix) + "\n").utf8)
        case .json: return Array((TokenFormat.json(token: token, tokenType: tokenType, expiresAt: expiresAt, session: session) + "\n").utf8)
        }
    }
}

/// One sink file as `/readyz` and `/metrics` see it. Carries no token.
public struct SinkStatus: Sendable, Equatable {
    public var path: String
    /// Why the last write failed (step and errno); nil while the file holds the current token.
    public var failure: String?
    /// Failed writes since start (each retry counts).
    public var failures: UInt64 = 0
    /// Successful writes since start.
    public var writes: UInt64 = 0
}

/// The token as the sinks need it: the value, its generation and fingerprint (for logs), and
/// its real expiry in wall-clock Unix seconds (for `json`).
struct SinkToken: Sendable {
    var value: String
    var generation: UInt64
    var fingerprint: String
    var expiresAt: Int64
}

/// Why a sink file could not be replaced. `step`: `sink.mkdir`, `sink.not_a_directory`,
/// `sink.open`, `sink.write`, `sink.fsync`, `sink.rename`, `sink.fsync_dir`. Never carries a token.
struct SinkWriteError: Error, Sendable, CustomStringConvertible {
    var step: String
    var path: String
    var errno: Int32
    var description: String {
        "\(step): \(path): \(errno == 0 ? "failed" : String(cString: strerror(errno)))"
    }
}

/// A session's outlets for other programs (docs/architecture.md §4): its sink files, rewritten atomically on
/// every new token (temp file in the same directory, fsync, rename, fsync of the directory), and
/// the count of tokens the token API handed out.
///
/// Owns, on `queue` (a private serial queue: file writes never run on an event loop or the
/// session's queue): the plan, the newest token, and each sink's phase. Publishes under `lock`
/// the `SinkStatus` of every sink for `/readyz` and `/metrics`.
///
/// Invariants: a sink file is only ever replaced by rename, so a reader sees the old or the new
/// complete file, never a partial one; a failed write keeps the old file and is retried with
/// bounded, jittered backoff until it succeeds, a newer token is written, or the sink is removed;
/// a removed sink's file is left as it is; tokens are never logged (fingerprints only).
public final class TokenOutlets: @unchecked Sendable {  // @unchecked: state confined to `queue`; `statuses` under `lock`
    private let queue: DispatchQueue
    private let logger: Logger
    /// The session's clocks (the driver's `SessionClock`): a published token's expiry in wall-clock seconds.
    let clock: any SessionClock

    /// What a sink has had written.
    private enum Phase {
        /// Nothing written yet (no token since the sink was configured).
        case pending
        /// Holds `generation` rendered with `rendered` (the sink's config and the plan's header and type).
        case written(generation: UInt64, rendered: Rendered)
        /// `attempt` writes failed in a row; a retry identified by `serial` is scheduled.
        case failing(attempt: Int, serial: UInt64)
        /// Its format does not apply to the session (a token format for signing keys): never written.
        case refused
    }
    private struct Rendered: Equatable {
        var sink: SinkConfig
        var header: InjectConfig
        var tokenType: String
    }

    // queue only
    private var plan: TokenSinkPlan
    private var token: SinkToken?
    private var phases: [String: Phase] = [:]
    private var serial: UInt64 = 0
    private var stopped = false

    private let lock = Lock()
    private var statuses: [SinkStatus] = []
    private let handouts = Atomic<UInt64>(0)

    init(plan: TokenSinkPlan, logger: Logger, clock: any SessionClock = SystemSessionClock()) {
        self.plan = plan
        self.logger = logger
        self.clock = clock
        queue = DispatchQueue(label: "bearerd.sinks." + plan.session)
        statuses = plan.sinks.map { SinkStatus(path: $0.path) }
        for s in plan.sinks { phases[s.path] = .pending }
    }

    /// Every sink's status, in configuration order. Any thread.
    public var sinkStatuses: [SinkStatus] { lock.withLock { statuses } }

    /// Tokens handed out by the token API. Any thread.
    public var apiHandouts: UInt64 { handouts.load(ordering: .relaxed) }

    /// Counts one token API hand-out. Any thread.
    public func noteHandout() { handouts.wrappingAdd(1, ordering: .relaxed) }

    /// A new token was published: every sink is rewritten with it.
    func tokenPublished(_ t: SinkToken) {
        queue.async { [self] in
            guard !stopped else { return }
            token = t
            for sink in plan.sinks { writeIfNeeded(sink) }
        }
    }

    /// SIGHUP: removed sinks stop being written (their files are left); new and changed ones
    /// are written with the current token.
    func configure(_ newPlan: TokenSinkPlan) {
        queue.async { [self] in
            guard !stopped else { return }
            let removed = plan.sinks.filter { old in !newPlan.sinks.contains { $0.path == old.path } }
            for r in removed {
                phases[r.path] = nil
                logger.info("sink removed; its file is left as it is", metadata: ["sink.path": "\(r.path)"])
            }
            plan = newPlan
            for s in newPlan.sinks where phases[s.path] == nil { phases[s.path] = .pending }
            // A changed format (or session kind) is looked at again.
            for s in newPlan.sinks where newPlan.refusal(for: s.format) == nil {
                if case .refused? = phases[s.path] { phases[s.path] = .pending }
            }
            lock.withLock {
                let old = statuses
                statuses = newPlan.sinks.map { s in old.first { $0.path == s.path } ?? SinkStatus(path: s.path) }
            }
            for sink in newPlan.sinks { writeIfNeeded(sink) }
        }
    }

    func stop() {
        queue.async { [self] in
            stopped = true
            serial &+= 1
        }
    }

    // MARK: queue

    private func writeIfNeeded(_ sink: SinkConfig) {
        guard let token else { return }
        if let why = plan.refusal(for: sink.format) {
            // Never written: said once per sink (until the configuration changes), shown in /readyz.
            if case .refused? = phases[sink.path] { return }
            phases[sink.path] = .refused
            update(sink.path) { $0.failure = "sink.format_not_applicable: " + why }
            logger.error("sink not written: \(why)", metadata: ["sink.path": "\(sink.path)", "sink.format": "\(sink.format.rawValue)"])
            return
        }
        let rendered = Rendered(sink: sink, header: plan.header, tokenType: plan.tokenType)
        switch phases[sink.path] {
        case .written(let g, let r)? where g == token.generation && r == rendered:
            return
        case .failing(let attempt, _)?:
            // A newer token or a changed sink: try at once (the scheduled retry is superseded).
            write(sink, token, rendered, failedBefore: attempt)
        default:
            write(sink, token, rendered, failedBefore: 0)
        }
    }

    private func write(_ sink: SinkConfig, _ token: SinkToken, _ rendered: Rendered, failedBefore: Int) {
        let bytes = plan.render(sink.format, token: token.value, expiresAt: token.expiresAt)
        do throws(SinkWriteError) {
            try Self.replaceAtomically(sink.path, with: bytes, mode: sink.mode)
            phases[sink.path] = .written(generation: token.generation, rendered: rendered)
            update(sink.path) {
                $0.failure = nil
                $0.writes &+= 1
            }
            var meta: Logger.Metadata = ["sink.path": "\(sink.path)", "sink.format": "\(sink.format.rawValue)",
                                         "token.fingerprint": "\(token.fingerprint)", "token.generation": "\(token.generation)"]
            if failedBefore > 0 {
                meta["sink.failed_attempts"] = "\(failedBefore)"
                logger.info("sink written again after failures", metadata: meta)
            } else {
                logger.debug("sink written", metadata: meta)
            }
        } catch {
            let attempt = failedBefore &+ 1
            serial &+= 1
            let mySerial = serial
            phases[sink.path] = .failing(attempt: attempt, serial: mySerial)
            update(sink.path) {
                $0.failure = error.description
                $0.failures &+= 1
            }
            let delay = Self.retryDelay(attempt: attempt)
            logger.warning("cannot write a sink file; the proxy keeps serving, retrying", metadata: [
                "sink.path": "\(sink.path)", "error": "\(error)", "attempt": "\(attempt)",
                "retry_in_ms": "\(delay / 1_000_000)", "token.fingerprint": "\(token.fingerprint)",
            ])
            queue.asyncAfter(deadline: .now() + .nanoseconds(Int(delay))) { [weak self] in
                self?.retry(path: sink.path, serial: mySerial)
            }
        }
    }

    private func retry(path: String, serial s: UInt64) {
        guard !stopped, case .failing(let attempt, let current)? = phases[path], current == s,
              let sink = plan.sinks.first(where: { $0.path == path }), let token else { return }
        write(sink, token, Rendered(sink: sink, header: plan.header, tokenType: plan.tokenType), failedBefore: attempt)
    }

    private func update(_ path: String, _ body: (inout SinkStatus) -> Void) {
        lock.withLock {
            if let i = statuses.firstIndex(where: { $0.path == path }) { body(&statuses[i]) }
        }
    }

    /// Backoff before retry `attempt` (1-based), nanoseconds: 1 s, 2 s, 4 s … capped at 30 s,
    /// ±20 % jitter (as the token endpoint's rounds, docs/architecture.md §6).
    static func retryDelay(attempt: Int, random: Double = Double.random(in: 0.8...1.2)) -> UInt64 {
        let exponent = min(max(attempt - 1, 0), 5)
        let base = min(UInt64(1) << UInt64(exponent), 30)
        return UInt64(Double(base) * 1e9 * min(max(random, 0.8), 1.2))
    }

    // MARK: files

    /// Replaces `path` so that no reader ever sees a partial file: a new temp file in the same
    /// directory (O_EXCL, mode applied with fchmod, so the umask does not matter), write, fsync,
    /// rename over `path`, fsync the directory. A missing directory is created 0750 (its missing
    /// parents too); the file's owner and group are the process's.
    static func replaceAtomically(_ path: String, with bytes: [UInt8], mode: UInt32) throws(SinkWriteError) {
        let slash = path.lastIndex(of: "/")
        let dir = slash.map { $0 == path.startIndex ? "/" : String(path[..<$0]) } ?? "."
        let base = slash.map { String(path[path.index(after: $0)...]) } ?? path
        try ensureDirectory(dir)
        if DirectoryTrust.problem(dir) != nil { throw SinkWriteError(step: "sink.untrusted_directory", path: dir, errno: EPERM) }
        var suffix = ""
        for _ in 0..<4 { suffix += String(UInt16.random(in: 0...UInt16.max), radix: 16) }
        let temp = (dir == "/" ? "" : dir) + "/." + base + ".tmp-" + String(getpid()) + "-" + suffix
        let fd = open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw SinkWriteError(step: "sink.open", path: temp, errno: errno) }
        var failure: SinkWriteError?
        if fchmod(fd, mode_t(mode & 0o777)) != 0 { failure = SinkWriteError(step: "sink.chmod", path: temp, errno: errno) }
        var offset = 0
        while failure == nil, offset < bytes.count {
            let n = bytes.withUnsafeBytes { p -> Int in
                guard let base = p.baseAddress else { return 0 }
                return Glibc.write(fd, base + offset, bytes.count - offset)
            }
            if n < 0 {
                if errno == EINTR { continue }
                failure = SinkWriteError(step: "sink.write", path: temp, errno: errno)
            } else if n == 0 {
                failure = SinkWriteError(step: "sink.write", path: temp, errno: EIO)
            } else {
                offset += n
            }
        }
        if failure == nil, fsync(fd) != 0 { failure = SinkWriteError(step: "sink.fsync", path: temp, errno: errno) }
        close(fd)
        if failure == nil, rename(temp, path) != 0 { failure = SinkWriteError(step: "sink.rename", path: path, errno: errno) }
        if let failure {
            unlink(temp)
            throw failure
        }
        let dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dfd >= 0 else { throw SinkWriteError(step: "sink.fsync_dir", path: dir, errno: errno) }
        defer { close(dfd) }
        guard fsync(dfd) == 0 else { throw SinkWriteError(step: "sink.fsync_dir", path: dir, errno: errno) }
    }

    /// `dir` exists as a directory, or is created 0750 (missing parents too), never world-writable.
    static func ensureDirectory(_ dir: String) throws(SinkWriteError) {
        var st = stat()
        if stat(dir, &st) == 0 {
            guard st.st_mode & S_IFMT == S_IFDIR else { throw SinkWriteError(step: "sink.not_a_directory", path: dir, errno: ENOTDIR) }
            return
        }
        guard errno == ENOENT else { throw SinkWriteError(step: "sink.mkdir", path: dir, errno: errno) }
        if let slash = dir.lastIndex(of: "/"), slash != dir.startIndex {
            try ensureDirectory(String(dir[..<slash]))
        }
        if mkdir(dir, 0o750) == 0 {
            // mkdir is subject to the umask; make sure of 0750 (never group- or world-writable).
            _ = chmod(dir, 0o750)
        } else if errno != EEXIST {
            throw SinkWriteError(step: "sink.mkdir", path: dir, errno: errno)
        }
    }
}

extension TokenOutlets {
    /// The session driver's hook (`publish`): the published token with its real expiry, turned
    /// into wall-clock seconds now (monotonic distance added to the wall clock).
    func tokenPublished(_ token: TokenSession.CurrentToken, published p: PublishedToken) {
        let expiresAt = TokenCache.wallClock(ofMonotonic: token.expiresAt.nanoseconds, monotonicNow: clock.now().nanoseconds,
                                             wallClockNow: clock.wallClockSeconds())
        tokenPublished(SinkToken(value: p.value, generation: p.generation, fingerprint: p.fingerprint, expiresAt: expiresAt))
    }
}
