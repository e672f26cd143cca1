// A unix listener's socket file: created with its mode (fchmod on the socket before bind, not a
// chmod by path afterwards), changed later only on the very file bound, and never in a
// directory another uid can write (`DirectoryTrust`).

import Testing
import Foundation
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

/// The mode the socket file had when `bind` returned, seen from inside the bind.
final class ModeAtBind: @unchecked Sendable {  // @unchecked: guarded by `lock`
    private let lock = Lock()
    private var value: UInt32?
    func set(_ v: UInt32?) { lock.withLock { value = v } }
    var mode: UInt32? { lock.withLock { value } }
}

@Suite("Unix socket files")
struct UnixSocketFileTests {
    /// A fresh 0700 directory of our own under /tmp.
    static func privateDir() throws -> String {
        let dir = "/tmp/bearerd-usf-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o700])
        return dir
    }

    static func mode(_ path: String) -> UInt32? {
        var st = stat()
        guard lstat(path, &st) == 0 else { return nil }
        return UInt32(st.st_mode & 0o7777)
    }

    /// The file is born with its mode: right after bind(2) returns (before any later step could
    /// set it by path) it already has 0640, whatever the process's umask.
    @Test func theSocketFileHasItsModeFromTheBind() throws {
        let dir = try Self.privateDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/api.sock"
        let seen = ModeAtBind()
        let sys = Syscalls(bind: { fd, address, length in
            let rc = Syscalls.System.bind(fd, address, length)
            seen.set(Self.mode(path))
            return rc
        })
        let group = EventLoopGroup(count: 1, ioMode: .loopPoller, syscalls: sys)
        let l = try Listener.bindUnix(path: path, mode: 0o640, group: group) { fd, _, _ in close(fd) }
        defer { l.stop() }
        #expect(seen.mode == 0o640, "mode at bind: \(seen.mode.map { String($0, radix: 8) } ?? "none")")
        #expect(Self.mode(path) == 0o640)
        // A mode wider than the usual umask allows is exact too.
        let wide = dir + "/wide.sock"
        let w = try Listener.bindUnix(path: wide, mode: 0o666, group: EventLoopGroup(count: 1, ioMode: .loopPoller)) { fd, _, _ in close(fd) }
        defer { w.stop() }
        #expect(Self.mode(wide) == 0o666)
    }

    /// A reload's new mode goes to the socket bound, never to whatever now has its name: with
    /// another socket moved into its place, the change is refused and that socket keeps its mode.
    @Test func aChangedModeReachesOnlyTheFileBound() throws {
        let dir = try Self.privateDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let path = dir + "/api.sock"
        let group = EventLoopGroup(count: 1, ioMode: .loopPoller)
        let l = try Listener.bindUnix(path: path, mode: 0o600, group: group) { fd, _, _ in close(fd) }
        defer { l.stop() }
        try l.applyUnixPermissions(mode: 0o660, owner: nil, group: nil)
        #expect(Self.mode(path) == 0o660)

        // Another socket file takes the name (moved there by rename).
        let other = dir + "/other.sock"
        let o = try Listener.bindUnix(path: other, mode: 0o600, group: group) { fd, _, _ in close(fd) }
        defer { o.stop() }
        #expect(rename(other, path) == 0)
        #expect(throws: IOError.self) { try l.applyUnixPermissions(mode: 0o666, owner: nil, group: nil) }
        #expect(Self.mode(path) == 0o600, "the other socket's mode is untouched")

        // A symlink in its place: not followed.
        let victim = dir + "/victim"
        FileManager.default.createFile(atPath: victim, contents: Data("x".utf8), attributes: [.posixPermissions: 0o600])
        #expect(unlink(path) == 0)
        #expect(symlink(victim, path) == 0)
        #expect(throws: IOError.self) { try l.applyUnixPermissions(mode: 0o666, owner: nil, group: nil) }
        #expect(Self.mode(victim) == 0o600)
    }

    @Test func aSocketInADirectoryOthersCanWriteIsRefused() throws {
        let dir = try Self.privateDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let group = EventLoopGroup(count: 1, ioMode: .loopPoller)
        // /tmp itself: sticky, but anyone may create the name first.
        let inTmp = "/tmp/bearerd-usf-\(UUID().uuidString.prefix(8)).sock"
        do {
            let l = try Listener.bindUnix(path: inTmp, group: group) { fd, _, _ in close(fd) }
            l.stop()
            Issue.record("bound a socket directly in /tmp")
        } catch {
            #expect(error.errno == EPERM)
            #expect("\(error)".contains("/tmp is writable by every user (mode 1777)"), "\(error)")
        }
        #expect(access(inTmp, F_OK) != 0, "nothing was created")
        let shared = dir + "/shared"
        #expect(mkdir(shared, 0o700) == 0 && chmod(shared, 0o770) == 0)
        #expect(throws: IOError.self) { try Listener.bindUnix(path: shared + "/api.sock", group: group) { fd, _, _ in close(fd) } }
        #expect(chmod(shared, 0o755) == 0)
        let ok = try Listener.bindUnix(path: shared + "/api.sock", group: group) { fd, _, _ in close(fd) }
        ok.stop()
    }
}

@Suite("Directory trust")
struct DirectoryTrustTests {
    @Test func directoriesOnlyBearerdsUidOrRootCanWriteAreTrusted() throws {
        let dir = try UnixSocketFileTests.privateDir()
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let me = geteuid()
        #expect(DirectoryTrust.problem(dir) == nil)
        #expect(DirectoryTrust.problem("/") == nil)
        #expect(DirectoryTrust.problem(dir + "/missing") == nil, "a missing directory fails later, with its own message")

        // The directory itself: no group or world write, sticky or not.
        for mode: mode_t in [0o777, 0o1777, 0o770, 0o730, 0o702] {
            #expect(chmod(dir, mode) == 0)
            let p = DirectoryTrust.problem(dir)
            #expect(p != nil, "mode \(String(mode, radix: 8))")
        }
        #expect(chmod(dir, 0o755) == 0)
        #expect(DirectoryTrust.problem(dir) == nil)

        // Above it: writable by others only with the sticky bit (/tmp is 1777).
        let below = dir + "/below"
        #expect(mkdir(below, 0o700) == 0)
        #expect(chmod(dir, 0o1777) == 0)
        #expect(DirectoryTrust.problem(below) == nil)
        #expect(chmod(dir, 0o777) == 0)
        let p = DirectoryTrust.problem(below)
        #expect(p?.contains("without the sticky bit") == true, "\(p ?? "nil")")
        #expect(chmod(dir, 0o755) == 0)

        // Reached through a symlink: the directory it leads to is checked.
        let link = dir + "/link"
        let open = dir + "/open"
        #expect(mkdir(open, 0o700) == 0 && chmod(open, 0o777) == 0)
        #expect(symlink(open, link) == 0)
        #expect(DirectoryTrust.problem(link) != nil)

        // Another uid's directory (the owner can swap what bearerd puts there).
        if me == 0 {
            #expect(DirectoryTrust.problem(below, euid: 65534) == nil, "root's directories are trusted by every uid")
            #expect(chown(below, 65534, 65534) == 0)
            let q = DirectoryTrust.problem(below)
            #expect(q?.contains("belongs to uid 65534") == true, "\(q ?? "nil")")
            #expect(DirectoryTrust.problem(below, euid: 65534) == nil)
        } else if ProcessInfo.processInfo.environment["CI"] != nil {
            Issue.record("the other-owner case needs root (chown)")
        }
        #expect(DirectoryTrust.directory(of: "/run/x.sock") == "/run")
        #expect(DirectoryTrust.directory(of: "/x.sock") == "/")
        #expect(DirectoryTrust.directory(of: "x.sock") == ".")
    }
}
