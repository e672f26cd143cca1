import BearerdIO
import BearerdTLS
import BearerdOAuth
#if canImport(Glibc)
import Glibc
import BearerdConfig
#endif

/// Why the state store could not do what was asked. Never carries a token.
public struct StateStoreError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Stable dotted reason: `state.mkdir`, `state.not_a_directory`, `state.open`, `state.write`,
    /// `state.fsync`, `state.rename`, `state.lock`, `state.read`, `state.too_large`.
    public let reason: String
    public let path: String
    public let errno: Int32

    public init(reason: String, path: String, errno: Int32) {
        self.reason = reason
        self.path = path
        self.errno = errno
    }

    public var description: String {
        errno == 0 ? "\(reason): \(path)" : "\(reason): \(path): \(String(cString: strerror(errno)))"
    }
}

/// The persisted state of one refresh_token session (DESIGN §6 "Rotation durability"):
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

    static func ensureDirectory(_ path: String) throws(StateStoreError) {
        var st = stat()
        if stat(path, &st) == 0 {
            guard (st.st_mode & S_IFMT) == S_IFDIR else {
                throw StateStoreError(reason: "state.not_a_directory", path: path, errno: 0)
            }
            return
        }
        guard mkdir(path, 0o700) == 0 || errno == EEXIST else {
            throw StateStoreError(reason: "state.mkdir", path: path, errno: errno)
        }
        // mkdir is subject to the umask; make sure of 0700.
        _ = chmod(path, 0o700)
    }

    // MARK: Lock

    /// Takes the exclusive lock, blocking until any other holder (another process, or another
    /// store object on the same files) releases it. Re-entrant calls are no-ops.
    func lock() throws(StateStoreError) {
        guard !isLocked else { return }
        let fd = open(lockPath, O_RDWR | O_CREAT | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw StateStoreError(reason: "state.open", path: lockPath, errno: errno) }
        while flock(fd, LOCK_EX) != 0 {
            if errno == EINTR { continue }
            let e = errno
            close(fd)
            throw StateStoreError(reason: "state.lock", path: lockPath, errno: e)
        }
        fdLock.withLock { lockFD = fd }
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

    /// Writes `bytes` to a new file at `tempPath` (0600, truncated if it exists) and fsyncs it;
    /// on failure the file is removed. The first half of every durable replace (the caller
    /// renames or links it into place, then fsyncs the directory).
    static func writeSynced(_ bytes: [UInt8], toNewFile tempPath: String) throws(StateStoreError) {
        let fd = open(tempPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { throw StateStoreError(reason: "state.open", path: tempPath, errno: errno) }
        var failure: StateStoreError?
        _ = fchmod(fd, 0o600)
        var offset = 0
        while offset < bytes.count {
            // Non-empty here (offset < count), so the base address exists.
            let n = bytes.withUnsafeBytes { Glibc.write(fd, $0.baseAddress! + offset, bytes.count - offset) }
            if n < 0 {
                if errno == EINTR { continue }
                failure = StateStoreError(reason: "state.write", path: tempPath, errno: errno)
                break
            }
            offset += n
        }
        if failure == nil, fsync(fd) != 0 { failure = StateStoreError(reason: "state.fsync", path: tempPath, errno: errno) }
        close(fd)
        if let failure {
            unlink(tempPath)
            throw failure
        }
    }

    /// Replaces `path` durably: temp file (0600) in the same directory, write, fsync, rename,
    /// fsync the directory.
    func writeDurably(_ bytes: [UInt8], to path: String) throws(StateStoreError) {
        let name = path.split(separator: "/").last.map(String.init) ?? session
        let tempPath = directory + "/." + name + ".tmp." + String(getpid())
        try Self.writeSynced(bytes, toNewFile: tempPath)
        guard rename(tempPath, path) == 0 else {
            let e = errno
            unlink(tempPath)
            throw StateStoreError(reason: "state.rename", path: path, errno: e)
        }
        let dfd = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        guard dfd >= 0 else { throw StateStoreError(reason: "state.open", path: directory, errno: errno) }
        defer { close(dfd) }
        guard fsync(dfd) == 0 else { throw StateStoreError(reason: "state.fsync", path: directory, errno: errno) }
    }
}

extension StateStore {
    static func reauthPath(directory: String, session: String) -> String {
        directory + "/" + session + ".reauth"
    }

    /// Records that the server refused the refresh token descending from the operator file
    /// with fingerprint `operatorFingerprint` (`-` when none). Best effort.
    func markNeedsReauthentication(operatorFingerprint: String?) {
        let text = "operator_file=\(operatorFingerprint ?? "-")\n"
        let fd = open(reauthPath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        guard fd >= 0 else { return }
        _ = text.utf8CString.withUnsafeBufferPointer { Glibc.write(fd, $0.baseAddress, $0.count - 1) }
        close(fd)
    }

    func clearNeedsReauthentication() {
        unlink(reauthPath)
    }

    /// True when `<directory>/<session>.reauth` says the refresh token descending from the
    /// operator file with this fingerprint was refused (so that file still needs replacing).
    /// Reads only; creates nothing.
    static func needsReauthentication(directory: String, session: String, operatorFingerprint: String?) -> Bool {
        let fd = open(reauthPath(directory: directory, session: session), O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return false }
        defer { close(fd) }
        var buf = [UInt8](repeating: 0, count: 256)
        let n = buf.withUnsafeMutableBytes { Glibc.read(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { return false }
        let text = String(decoding: buf[0..<n], as: UTF8.self)
        return text == "operator_file=\(operatorFingerprint ?? "-")\n"
    }
}

/// Wall-clock Unix seconds (persisted expiry times only; every deadline uses the monotonic clock).
public func wallClockSeconds() -> Int64 {
    Int64(time(nil))
}

/// `bearerd token`'s reuse of a still-valid access token through `state_dir` (DESIGN §3, `bearerd token`):
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
        let source = session.grant == .exec ? "exec:" + (session.command ?? []).joined(separator: "\u{1F}") : session.tokenURL.description
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
