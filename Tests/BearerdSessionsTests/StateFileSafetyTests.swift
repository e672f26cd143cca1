import Foundation
import Testing
import BearerdOAuth
import BearerdTestSupport
@testable import BearerdConfig
@testable import BearerdSessions

/// Files bearerd writes into `state_dir` (refresh tokens, cached tokens, the reauthentication
/// marker, the generated DPoP key): never through a planted symlink, never colliding between
/// writers that share a pid, and never into a directory someone else can write to.
@Suite struct StateFileSafetyTests {
    static let secret = "refresh-SECRET-never-elsewhere"

    /// A file outside the state directory that an attacker would like bearerd to write to.
    static func bait(in root: String) -> String {
        let bait = root + "/bait"
        writeFile(bait, "bait\n")
        return bait
    }

    static func contents(_ path: String) -> String? {
        FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) }
    }

    /// A symlink planted where earlier versions put the temp file (`.<name>.tmp.<pid>`, opened
    /// with O_CREAT|O_TRUNC) or under the marker's own name is not followed: the refresh token
    /// and the marker end up in the state directory, the symlinks' target is untouched.
    @Test func plantedSymlinksAreNotFollowed() throws {
        let root = temporaryDirectory()
        defer { removeTree(root) }
        let dir = root + "/state"
        let bait = Self.bait(in: root)
        let store = try StateStore(directory: dir, session: "me")
        // The old predictable temp name of the state file and of the token cache.
        #expect(symlink(bait, dir + "/.me.json.tmp.\(getpid())") == 0)
        #expect(symlink(bait, dir + "/.me.token.json.tmp.\(getpid())") == 0)
        // The marker was opened by its own name with O_CREAT|O_TRUNC.
        #expect(symlink(bait, dir + "/me.reauth") == 0)

        let state = PersistedSessionState(refreshToken: OAuthSecret(Self.secret), updatedAt: 1_700_000_000)
        try store.write(state)
        try store.writeTokenCache(CachedAccessToken(token: OAuthSecret(Self.secret), expiresAt: 1_900_000_000, binding: "b"))
        store.markNeedsReauthentication(.refused, operatorFingerprint: nil)

        #expect(Self.contents(bait) == "bait\n", "a secret went through a planted symlink")
        #expect(store.readState()?.refreshToken == OAuthSecret(Self.secret))
        // The marker replaced the symlink (rename), it did not write through it.
        var st = stat()
        #expect(lstat(dir + "/me.reauth", &st) == 0 && (st.st_mode & S_IFMT) == S_IFREG)
        #expect(StateStore.reauthentication(directory: dir, session: "me", operatorFingerprint: nil) == .refused)
        #expect(fileMode(dir + "/me.json") == 0o600)
        #expect(fileMode(dir + "/me.reauth") == 0o600)
    }

    /// `writeSynced` creates its file or fails: an existing name (a file or a symlink someone
    /// planted, whatever the name) is never opened.
    @Test func aTempFileIsCreatedNeverOpened() throws {
        let root = temporaryDirectory()
        defer { removeTree(root) }
        let bait = Self.bait(in: root)
        let temp = root + "/.x.tmp"
        #expect(symlink(bait, temp) == 0)
        #expect(throws: StateStoreError.self) { try StateStore.writeSynced(Array(Self.secret.utf8), toNewFile: temp) }
        #expect(Self.contents(bait) == "bait\n")
        // Two fresh names for one path differ (a random part, not only the pid).
        let a = StateStore.tempPath(for: root + "/me.json"), b = StateStore.tempPath(for: root + "/me.json")
        #expect(a != b)
        #expect(a.hasPrefix(root + "/.me.json.tmp-\(getpid())-"))
    }

    /// Writers that share a pid (two containers that are both pid 1 on one `state_dir`; here,
    /// threads of this process) each use their own temp file: every write succeeds and the
    /// file always holds one whole state.
    @Test func writersWithTheSamePidDoNotCollide() throws {
        let root = temporaryDirectory()
        defer { removeTree(root) }
        let dir = root + "/state"
        let writers = 4, rounds = 150
        let stores = try (0..<writers).map { _ in try StateStore(directory: dir, session: "me") }
        let failures = Locked<[String]>([])
        DispatchQueue.concurrentPerform(iterations: writers) { w in
            for r in 0..<rounds {
                // Different lengths, so a torn or mixed file does not decode.
                let token = "refresh-\(w)-\(r)-" + String(repeating: "x", count: (w * 37 + r) % 300)
                do throws(StateStoreError) {
                    try stores[w].write(PersistedSessionState(refreshToken: OAuthSecret(token), updatedAt: 1_700_000_000))
                } catch {
                    failures.withLock { $0.append(error.description) }
                }
                if case .unreadable(let why) = stores[w].read() { failures.withLock { $0.append("torn: \(why)") } }
            }
        }
        #expect(failures.withLock { $0 }.isEmpty, "\(failures.withLock { $0.prefix(5) })")
        #expect(try FileManager.default.contentsOfDirectory(atPath: dir).filter { $0.contains(".tmp") }.isEmpty)
    }

    /// Concurrent first loads of a session's generated DPoP key (threads of one process: the
    /// same pid) end with one key: every proofer has the same thumbprint, and it is the file's.
    @Test func theDPoPKeyIsGeneratedOnceUnderTheLock() throws {
        let root = temporaryDirectory()
        defer { removeTree(root) }
        let dir = root + "/state"
        var session = SessionConfig(name: "d", grant: .clientCredentials, tokenURL: EndpointURL(scheme: "https", host: "idp.example", port: 443, path: "/token"),
                                    clientID: "c", clientSecret: .literal(Secret("s")))
        session.dpop = true
        let bait = Self.bait(in: root)
        try StateStore.ensureDirectory(dir)
        #expect(symlink(bait, DPoPProofer.generatedKeyPath(stateDir: dir, session: "d") + ".tmp.\(getpid())") == 0)
        let results = Locked<[Result<String, DPoPProofer.KeyProblem>]>([])
        DispatchQueue.concurrentPerform(iterations: 8) { _ in
            let r: Result<String, DPoPProofer.KeyProblem>
            do throws(DPoPProofer.KeyProblem) {
                r = .success(try DPoPProofer.load(session, stateDir: dir, clockSkew: ClockSkew()).thumbprint)
            } catch {
                r = .failure(error)
            }
            results.withLock { $0.append(r) }
        }
        let thumbprints = Set(results.withLock { $0 }.compactMap { try? $0.get() })
        #expect(results.withLock { $0 }.allSatisfy { (try? $0.get()) != nil }, "\(results.withLock { $0 })")
        #expect(thumbprints.count == 1)
        guard case .success(.key(_, _, let onDisk))? = DPoPKeyDescription.of(session, stateDir: dir) else {
            Issue.record("no key on disk")
            return
        }
        #expect(thumbprints == [onDisk])
        #expect(fileMode(DPoPProofer.generatedKeyPath(stateDir: dir, session: "d")) == 0o600)
        #expect(Self.contents(bait) == "bait\n", "the private key went through a planted symlink")
    }

    /// An existing `state_dir` owned by another uid, or writable by group or others, is refused
    /// (the error names the path and the mode); one that is ours and 0700 or 0755 is fine; a
    /// missing one is created 0700.
    @Test func unsafeStateDirectoriesAreRefused() throws {
        let root = temporaryDirectory()
        defer { removeTree(root) }
        let old = umask(0)
        defer { umask(old) }
        for mode: mode_t in [0o777, 0o770, 0o720, 0o702, 0o1777] {
            let dir = root + "/m\(String(mode, radix: 8))"
            #expect(mkdir(dir, 0o700) == 0 && chmod(dir, mode) == 0)
            do throws(StateStoreError) {
                _ = try StateStore(directory: dir, session: "me")
                Issue.record("mode \(String(mode, radix: 8)) accepted")
            } catch {
                #expect(error.reason == "state.unsafe_directory")
                #expect(error.description.contains(dir) && error.description.contains("mode 0" + String(mode, radix: 8)), "\(error)")
            }
        }
        // Owned by someone else (the tests run as root, so they can chown).
        let foreign = root + "/foreign"
        #expect(mkdir(foreign, 0o700) == 0)
        try #require(chown(foreign, 65534, 65534) == 0, "chown needs root")
        do throws(StateStoreError) {
            _ = try StateStore(directory: foreign, session: "me")
            Issue.record("a foreign state_dir accepted")
        } catch {
            #expect(error.description.contains(foreign) && error.description.contains("uid 65534") && error.description.contains("mode 0700"), "\(error)")
        }
        // The manager refuses at start, as a state_dir configuration error.
        let session = SessionConfig(name: "c", grant: .clientCredentials, tokenURL: EndpointURL(scheme: "https", host: "idp.example", port: 443, path: "/token"),
                                    clientID: "c", clientSecret: .literal(Secret("s")))
        #expect(throws: ConfigErrors.self) { try SessionManager(config: sessionConfig(session, stateDir: foreign), logger: CapturedLogs().logger, environment: [:]) }

        for mode: mode_t in [0o700, 0o755, 0o750] {
            let dir = root + "/ok\(String(mode, radix: 8))"
            #expect(mkdir(dir, 0o700) == 0 && chmod(dir, mode) == 0)
            #expect(throws: Never.self) { _ = try StateStore(directory: dir, session: "me") }
        }
        umask(0o022)
        _ = try StateStore(directory: root + "/fresh", session: "me")
        #expect(fileMode(root + "/fresh") == 0o700)
    }
}

/// A value behind a lock, for collecting results from concurrent threads.
final class Locked<Value>: @unchecked Sendable {  // @unchecked: `value` only under `lock`
    private let lock = NSLock()
    private var value: Value
    init(_ value: Value) { self.value = value }
    func withLock<R>(_ body: (inout Value) -> R) -> R {
        lock.lock()
        defer { lock.unlock() }
        return body(&value)
    }
}
