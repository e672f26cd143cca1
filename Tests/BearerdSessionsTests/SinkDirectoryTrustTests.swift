import Foundation
import Testing
import BearerdIO
@testable import BearerdSessions

/// A sink file is never written into a directory other uids can write (`DirectoryTrust`): there
/// another user could squat the name (a symlink placed first in a sticky /tmp) or swap it.
@Suite struct SinkDirectoryTrustTests {
    @Test func aSinkInADirectoryOthersCanWriteIsRefused() throws {
        let root = NSTemporaryDirectory() + "bearerd-sinktrust-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: false, attributes: [.posixPermissions: 0o755])
        defer { try? FileManager.default.removeItem(atPath: root) }
        let open = root + "/open"
        #expect(mkdir(open, 0o700) == 0 && chmod(open, 0o1777) == 0)  // as /tmp
        // What another user placed first: a symlink to a file of its choosing.
        let victim = root + "/victim"
        FileManager.default.createFile(atPath: victim, contents: Data("keep\n".utf8))
        #expect(symlink(victim, open + "/t.token") == 0)
        do {
            try TokenOutlets.replaceAtomically(open + "/t.token", with: Array("token\n".utf8), mode: 0o600)
            Issue.record("wrote a sink into a world-writable directory")
        } catch {
            #expect(error.step == "sink.untrusted_directory", "\(error)")
            #expect(error.path == open)
        }
        #expect(try String(contentsOfFile: victim, encoding: .utf8) == "keep\n")
        #expect(try FileManager.default.contentsOfDirectory(atPath: open) == ["t.token"], "no temp file left there")
        // The same directory made private: written.
        #expect(chmod(open, 0o755) == 0 && unlink(open + "/t.token") == 0)
        try TokenOutlets.replaceAtomically(open + "/t.token", with: Array("token\n".utf8), mode: 0o600)
        #expect(try String(contentsOfFile: open + "/t.token", encoding: .utf8) == "token\n")
    }
}
