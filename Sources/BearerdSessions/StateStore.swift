import BearerdIO
import BearerdTLS
import BearerdOAuth
#if canImport(Glibc)
import Glibc
import BearerdConfig
#endif

/// Why the state store could not do what was asked. Never carries a token.
public struct StateStoreError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Stable dotted reason: `state.mkdir`, `state.not_a_directory`, `state.unsafe_directory`,
    /// `state.open`, `state.write`, `state.fsync`, `state.rename`, `state.lock`, `state.read`,
    /// `state.too_large`.
    public let reason: String
    public let path: String
    public let errno: Int32
    /// A sentence for the operator, when the reason alone does not say what to do.
    public let detail: String?

    public init(reason: String, path: String, errno: Int32, detail: String? = nil) {
        self.reason = reason
        self.path = path
        self.errno = errno
        self.detail = detail
    }

    public var description: String {
        if let detail { return "\(reason): \(path): \(detail)" }
        return errno == 0 ? "\(reason): \(path)" : "\(reason): \(path): \(String(cString: strerror(errno)))"
    }
}

/// The persisted state of one refresh_token session (docs/architecture.md §6.7):
/// `<state_dir>/<session>.json` (mode 0600) holding a `PersistedSessionState`, and
/// `<state_dir>/<session>.lock`, the `flock` that serialises refresh-and-persist between every
/// process sharing the directory (`bearerd run`, `bearerd token`), and, while the server calls
/// the refresh token dead, `<state_dir>/<session>.reauth` (fingerprints only) so that
/// `bearerd check` can say a new refresh token is needed.
///
/// Owns the lock file descriptor while the lock is held. Blocking file I/O: use it only on a
/// session queue or a command's own thread, never on a proxy loop. Not thread-safe; its owner
/// (one `TokenSessionDriver`) touches it only on its session queue.
///
/// Invariants: the state file is only ever replaced whole (temp file in the same directory,
/// write, fsync, rename, fsync the directory), so a reader sees the old or the new state, never
/// a torn one; `lockFD >= 0` exactly while the lock is held.
final class StateStore {
    let directory: String
    let session: String
    let statePath: String
    let lockPath: String
    let reauthPath: String
    private var lockFD: Int32 = -1
    private let fdLock = Lock()

    /// Creates `directory` (0700) if it does not exist. Session names are restricted by the
    /// config loader to letters, digits, `.`, `_`, `-` (no leading `.`), so they are safe file names.
    init(directory: String, session: String) throws(StateStoreError) {
        self.directory = directory
        self.session = session
        statePath = directory + "/" + session + ".json"
        lockPath = directory + "/" + session + ".lock"
        reauthPath = StateStore.reauthPath(directory: directory, session: session)
        try StateStore.ensureDirectory(directory)
    }

    deinit { unlock() }

    /// `path` exists as a safe directory (`checkDirectory`), or is created 0700.
    static func ensureDirectory(_ path: String) throws(StateStoreError) {
        if try checkDirectory(path) { return }
        guard mkdir(path, 0o700) == 0 || errno == EEXIST else {
            throw StateStoreError(reason: "state.mkdir", path: path, errno: errno)
        }
        // mkdir is subject to the umask; make sure of 0700.
        _ = chmod(path, 0o700)
        _ = try checkDirectory(path)
    }

    /// True when `path` is a directory bearerd may keep secrets in; false when it does not
    /// exist. Refused: not a directory, not owned by the effective uid, or writable by group or
    /// others — whoever else can write there can plant a symlink or a file under a name bearerd
    /// writes or reads (refresh tokens, the DPoP private key) or replace what it wrote. `stat`
    /// follows a symlinked `state_dir` itself: the directory it names is checked.
    @discardableResult
    static func checkDirectory(_ path: String) throws(StateStoreError) -> Bool {
        var st = stat()
        guard stat(path, &st) == 0 else {
            if errno == ENOENT { return false }
            throw StateStoreError(reason: "state.open", path: path, errno: errno)
        }
        guard (st.st_mode & S_IFMT) == S_IFDIR else {
            throw StateStoreError(reason: "state.not_a_directory", path: path, errno: 0)
        }
        let mode = "0" + String(st.st_mode & 0o7777, radix: 8)
        let uid = geteuid()
        guard st.st_uid == uid else {
            throw StateStoreError(reason: "state.unsafe_directory", path: path, errno: 0,
                                  detail: "state_dir is owned by uid \(st.st_uid) (mode \(mode)), not by bearerd's effective uid \(uid); "
                                      + "it holds refresh tokens and keys: chown it to uid \(uid) or choose another state_dir")
        }
        guard st.st_mode & 0o022 == 0 else {
            throw StateStoreError(reason: "state.unsafe_directory", path: path, errno: 0,
                                  detail: "state_dir has mode \(mode): group or others can write there (and plant symlinks where "
                                      + "bearerd writes refresh tokens and keys); chmod 0700 \(path)")
        }
        return true
    }

    // MARK: Lock

    /// Takes the exclusive lock, blocking until any other holder (another process, or another
    /// store object on the same files) releases it. Re-entrant calls are no-ops.
    func lock() throws(StateStoreError) {
        guard !isLocked else { return }
        let fd = try Self.takeLock(lockPath)
        fdLock.withLock { lockFD = fd }
    }

    /// Opens (creating it 0600, never through a symlink) and `flock`s `path`, blocking until
    /// other holders release it; returns the descriptor (closing it releases the lock).
    static func takeLock(_ path: String) throws(StateStoreError) -> Int32 {
        let fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0o600)
        guard fd >= 0 else { throw StateStoreError(reason: "state.open", path: path, errno: errno) }
        while flock(fd, LOCK_EX) != 0 {
            if errno == EINTR { continue }
            let e = errno
            close(fd)
            throw StateStoreError(reason: "state.lock", path: path, errno: e)
        }
        return fd
    }

    /// Releases the lock (closing the descriptor releases the `flock`).
    func unlock() {
        let fd: Int32 = fdLock.withLock {
            let fd = lockFD
            lockFD = -1
            return fd
        }
        guard fd >= 0 else { return }
        _ = flock(fd, LOCK_UN)
        close(fd)
    }

    /// The flock is taken on the session's state queue and released on its session queue:
    /// `lockFD` is read and written under `fdLock`.
    var isLocked: Bool { fdLock.withLock { lockFD >= 0 } }

    // MARK: Read / write

    /// What was found on disk.
    enum ReadResult {
        case missing
        case state(PersistedSessionState)
        /// The file exists but could not be read or decoded (`state.*` reason).
        case unreadable(String)
    }

    /// Reads and decodes the state file.
    func read() -> ReadResult {
        let fd = open(statePath, O_RDONLY | O_CLOEXEC)
        if fd < 0 {
            return errno == ENOENT ? .missing : .unreadable("state.read: \(String(cString: strerror(errno)))")
        }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let n = chunk.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                return .unreadable("state.read: \(String(cString: strerror(errno)))")
            }
            if n == 0 { break }
            bytes.append(contentsOf: chunk[0..<n])
            if bytes.count > PersistedSessionState.maxFileBytes { return .unreadable("state.too_large") }
        }
        do throws(PersistedSessionState.DecodingError) {
            return .state(try PersistedSessionState.decode(bytes))
        } catch {
            return .unreadable(error.field.map { "\(error.reason) (\($0))" } ?? error.reason)
        }
    }

    /// The decoded state, nil when missing or unreadable.
    func readState() -> PersistedSessionState? {
        if case .state(let s) = read() { return s }
        return nil
    }

    /// Replaces the state file durably: temp file (0600) in the same directory, write, fsync,
    /// rename over the state file, fsync the directory.
    func write(_ state: PersistedSessionState) throws(StateStoreError) {
        // Never write what `read` would refuse (one limit both ways).
        guard let bytes = state.encodeForFile() else {
            throw StateStoreError(reason: "state.too_large", path: statePath, errno: 0)
        }
        try writeDurably(bytes, to: statePath)
    }

    /// `<state_dir>/<session>.token.json`: `bearerd token`'s cached access token (sessions
    /// without a refresh token), under the same lock.
    var tokenCachePath: String { directory + "/" + session + ".token.json" }

    func readTokenCache() -> CachedAccessToken? {
        guard let bytes = Self.readSmallFile(tokenCachePath) else { return nil }
        return CachedAccessToken.decode(bytes)
    }

    func writeTokenCache(_ token: CachedAccessToken) throws(StateStoreError) {
        try writeDurably(token.encode(), to: tokenCachePath)
    }

    /// A regular file's bytes, at most `PersistedSessionState.maxFileBytes`; nil otherwise.
    static func readSmallFile(_ path: String) -> [UInt8]? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var out: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 16 * 1024)
        while true {
            let n = buf.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
            if n < 0 {
                if errno == EINTR { continue }
                return nil
            }
            if n == 0 { return out }
            out.append(contentsOf: buf[0..<n])
            if out.count > PersistedSessionState.maxFileBytes { return nil }
        }
    }

    /// A fresh name for a temp file next to `path`: `.<name>.tmp-<pid>-<64 random bits>`. The
    /// random part keeps two writers apart that share a pid (two containers that are both pid 1
    /// on one shared `state_dir`, or two threads of one process).
    static func tempPath(for path: String) -> String {
        let slash = path.lastIndex(of: "/")
        let dir = slash.map { String(path[...$0]) } ?? ""
        let name = slash.map { String(path[path.index(after: $0)...]) } ?? path
        var g = SystemRandomNumberGenerator()
        let random = String(UInt64.random(in: 0...UInt64.max, using: &g), radix: 16)
        return dir + "." + name + ".tmp-" + String(getpid()) + "-" + random
    }

    /// Writes `bytes` to a new file at `tempPath` and fsyncs it; on failure the file is removed.
    /// The file must not exist (`O_EXCL`: a name someone planted — a file or a symlink — is never
    /// opened, so the secret never lands anywhere else), and its mode is set to 0600 with
    /// `fchmod` (the umask does not matter). The first half of every durable replace (the caller
    /// renames or links it into place, then fsyncs the directory).
    static func writeSynced(_ bytes: [UInt8], toNewFile tempPath: String) throws(StateStoreError) {
        let fd = open(tempPath, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw StateStoreError(reason: "state.open", path: tempPath, errno: errno) }
        var failure: StateStoreError?
        if fchmod(fd, 0o600) != 0 { failure = StateStoreError(reason: "state.write", path: tempPath, errno: errno) }
        var offset = 0
        while failure == nil, offset < bytes.count {
            let n = bytes.withUnsafeBytes { p -> Int in
                guard let base = p.baseAddress else { return 0 }
                return Glibc.write(fd, base + offset, bytes.count - offset)
            }
            if n < 0 {
                if errno == EINTR { continue }
                failure = StateStoreError(reason: "state.write", path: tempPath, errno: errno)
            } else if n == 0 {
                failure = StateStoreError(reason: "state.write", path: tempPath, errno: EIO)
            } else {
                offset += n
            }
        }
        if failure == nil, fsync(fd) != 0 { failure = StateStoreError(reason: "state.fsync", path: tempPath, errno: errno) }
        close(fd)
        if let failure {
            unlink(tempPath)
            throw failure
        }
    }

    /// Replaces `path` durably: a new temp file (0600, `tempPath(for:)`) in the same directory,
    /// write, fsync, rename, fsync the directory. `rename` replaces a symlink at `path` itself,
    /// never what it points to.
    func writeDurably(_ bytes: [UInt8], to path: String) throws(StateStoreError) {
        try Self.writeDurably(bytes, to: path, directory: directory)
    }

    static func writeDurably(_ bytes: [UInt8], to path: String, directory: String) throws(StateStoreError) {
        let tempPath = Self.tempPath(for: path)
        try Self.writeSynced(bytes, toNewFile: tempPath)
        guard rename(tempPath, path) == 0 else {
            let e = errno
            unlink(tempPath)
            throw StateStoreError(reason: "state.rename", path: path, errno: e)
        }
        try syncDirectory(directory)
    }

    static func syncDirectory(_ directory: String) throws(StateStoreError) {
        let dfd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dfd >= 0 else { throw StateStoreError(reason: "state.open", path: directory, errno: errno) }
        defer { close(dfd) }
        guard fsync(dfd) == 0 else { throw StateStoreError(reason: "state.fsync", path: directory, errno: errno) }
    }
}

/// What a `<session>.reauth` marker says: why the session waits for a person or an operator.
public enum ReauthenticationMarker: Sendable, Equatable {
    /// There never was a refresh token (nobody ran `bearerd login`; an empty
    /// `refresh_token_file`): nothing was refused.
    case noRefreshToken
    /// The token endpoint refused the refresh token (`invalid_grant`). Markers written before
    /// the reason was recorded (one `operator_file=` line) read as this.
    case refused

    /// The marker's `reason=` value.
    var reason: String {
        switch self {
        case .noRefreshToken: "no_refresh_token"
        case .refused: "invalid_grant"
        }
    }

    /// The marker for a failure that put the session in `needsReauthentication`.
    static func of(_ failure: TokenEndpointFailure) -> ReauthenticationMarker {
        failure.reason == "token.no_refresh_token" ? .noRefreshToken : .refused
    }

    /// The file's text: `operator_file=<fingerprint or ->` then `reason=<reason>`.
    static func text(_ marker: ReauthenticationMarker, operatorFingerprint: String?) -> String {
        "operator_file=\(operatorFingerprint ?? "-")\nreason=\(marker.reason)\n"
    }

    /// What `text` says for the operator file with this fingerprint: nil when it names another
    /// file content (that file has been replaced since) or does not parse. An old marker (the
    /// `operator_file=` line alone) is a refusal.
    static func parse(_ text: String, operatorFingerprint: String?) -> ReauthenticationMarker? {
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        guard lines.count >= 2, lines[0] == "operator_file=\(operatorFingerprint ?? "-")" else { return nil }
        switch lines.count {
        case 2 where lines[1].isEmpty: return .refused
        case 3 where lines[2].isEmpty:
            switch lines[1] {
            case "reason=no_refresh_token": return .noRefreshToken
            case "reason=invalid_grant": return .refused
            default: return nil
            }
        default: return nil
        }
    }
}

extension StateStore {
    static func reauthPath(directory: String, session: String) -> String {
        directory + "/" + session + ".reauth"
    }

    /// Records why the session needs a (new) refresh token, for the refresh token descending
    /// from the operator file with fingerprint `operatorFingerprint` (`-` when none). Best
    /// effort; written as the state file is (new temp file, rename), never through a symlink.
    func markNeedsReauthentication(_ marker: ReauthenticationMarker, operatorFingerprint: String?) {
        let text = ReauthenticationMarker.text(marker, operatorFingerprint: operatorFingerprint)
        try? writeDurably(Array(text.utf8), to: reauthPath)
    }

    /// True when `<directory>/<session>.json` does not exist (nobody signed in, nothing stored).
    static func stateFileIsMissing(directory: String, session: String) -> Bool {
        var st = stat()
        return lstat(directory + "/" + session + ".json", &st) != 0 && errno == ENOENT
    }

    func clearNeedsReauthentication() {
        unlink(reauthPath)
    }

    /// What `<directory>/<session>.reauth` says about the refresh token descending from the
    /// operator file with this fingerprint (nil: nothing is pending for it). Reads only;
    /// creates nothing.
    static func reauthentication(directory: String, session: String, operatorFingerprint: String?) -> ReauthenticationMarker? {
        let fd = open(reauthPath(directory: directory, session: session), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var st = stat()
        guard fstat(fd, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { return nil }
        var buf = [UInt8](repeating: 0, count: 256)
        let n = buf.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { return nil }
        return ReauthenticationMarker.parse(String(decoding: buf[0..<n], as: UTF8.self), operatorFingerprint: operatorFingerprint)
    }
}

/// `state_dir` as a whole, for the commands (`bearerd check`).
public enum StateDirectory {
    /// Throws when an existing `path` is not a directory bearerd may keep secrets in
    /// (`StateStore.checkDirectory`); a missing one is fine (it is created 0700 when needed).
    public static func check(_ path: String) throws(StateStoreError) {
        try StateStore.checkDirectory(path)
    }
}

/// Wall-clock Unix seconds (persisted expiry times only; every deadline uses the monotonic clock).
public func wallClockSeconds() -> Int64 {
    Int64(time(nil))
}

/// `bearerd token`'s reuse of a still-valid access token through `state_dir` (docs/architecture.md §3, `bearerd token`):
/// for sessions without a refresh token, the token printed is cached in
/// `<state_dir>/<session>.token.json` (0600) and handed out again while it lasts, under the
/// session's `flock`, so concurrent calls make one token request between them. Refresh_token
/// sessions already keep their access token in the session's state file.
///
/// Owns a `StateStore` (and its lock while held). Blocking file I/O on the command's thread.
/// For `dpop: true` the token is bound to a key (RFC 9449 §6): the key's RFC 7638 thumbprint,
/// read when the cache is consulted or written (under the lock, after the key may have been
/// generated), is part of the binding, so a token bound to another key is never handed out.
public final class TokenCache {
    private let store: StateStore
    private let configBinding: String
    private let session: SessionConfig
    private let stateDir: String

    /// Nil when there is no `state_dir` or the session keeps its own state (refresh_token).
    public init?(stateDir: String?, session: SessionConfig) throws(StateStoreError) {
        guard let stateDir, !session.grant.usesRefreshToken else { return nil }
        store = try StateStore(directory: stateDir, session: session.name)
        // exec sessions have no token URL: the command is what the token was minted by.
        // Signing sessions: the whole credentials source (docs/architecture.md §6.15).
        let source = session.grant == .exec ? "exec:" + (session.command ?? []).joined(separator: "\u{1F}")
            : session.signingIdentity.map { "signing:" + $0 } ?? session.tokenURL.description
        // Audience, resource and the credential source are part of what the token is for.
        let workload = SessionSettings.workloadIdentity(session)
        configBinding = CachedAccessToken.binding(grant: session.grant.rawValue, tokenURL: workload.isEmpty ? source : source + "\n" + workload,
                                                  clientID: session.clientID, scope: session.scope)
        self.session = session
        self.stateDir = stateDir
    }

    /// What a cached token must have been issued for: the configuration, and for DPoP the key.
    private var binding: String {
        switch DPoPKeyDescription.of(session, stateDir: stateDir) {
        case nil: configBinding
        case .success(.key(_, _, let thumbprint))?: configBinding + "\ndpop_jkt=" + thumbprint
        // No key yet (or an unreadable one): nothing cached can be bound to it.
        case .success(.toBeGenerated)?, .failure?: configBinding + "\ndpop_jkt=?"
        }
    }

    /// Blocks until no other process holds the session's lock.
    public func lock() throws(StateStoreError) { try store.lock() }
    public func unlock() { store.unlock() }

    /// The cached token, if it was issued for this session's configuration and lasts long enough.
    public func reusable(wallClockNow: Int64 = wallClockSeconds()) -> String? {
        reusableWithExpiry(wallClockNow: wallClockNow)?.token
    }

    /// The cached token and its own expiry (Unix seconds; the end of its reuse window for
    /// files that did not record it), if it was issued for this configuration and lasts.
    public func reusableWithExpiry(wallClockNow: Int64 = wallClockSeconds()) -> (token: String, expiresAt: Int64)? {
        guard let cached = store.readTokenCache(), let token = cached.reusable(binding: binding, wallClockNow: wallClockNow) else { return nil }
        return (token.exposedValue, cached.tokenExpiresAt ?? cached.expiresAt)
    }

    /// Caches `token`, usable until `usableUntil` (monotonic nanoseconds, as published);
    /// `expiresAt` (monotonic nanoseconds) is the token's own expiry, when known.
    public func store(_ token: PublishedToken, monotonicNow: UInt64, expiresAt tokenExpiry: UInt64? = nil,
                      wallClockNow: Int64 = wallClockSeconds()) throws(StateStoreError) {
        let expiresAt = Self.wallClock(ofMonotonic: token.usableUntil, monotonicNow: monotonicNow, wallClockNow: wallClockNow)
        try store.writeTokenCache(CachedAccessToken(token: OAuthSecret(token.value), expiresAt: expiresAt, binding: binding,
                                                    tokenExpiresAt: tokenExpiry.map { Self.wallClock(ofMonotonic: $0, monotonicNow: monotonicNow, wallClockNow: wallClockNow) }))
    }

    /// The Unix second of a monotonic instant (nanoseconds), by the distance from now; saturating.
    public static func wallClock(ofMonotonic instant: UInt64, monotonicNow: UInt64, wallClockNow: Int64) -> Int64 {
        let left = instant > monotonicNow ? (instant - monotonicNow) / 1_000_000_000 : 0
        let (at, overflow) = wallClockNow.addingReportingOverflow(Int64(clamping: left))
        return overflow ? .max : at
    }
}
