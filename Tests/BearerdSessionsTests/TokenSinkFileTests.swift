import Foundation
import Testing
import BearerdIO
import BearerdOAuth
import Logging
@testable import BearerdConfig
@testable import BearerdSessions

/// The sink writer's file handling (atomic replace, exact mode, 0750 directories) and its retry backoff.
@Suite struct TokenSinkFileTests {
    @Test func sinkFilesAreReplacedWithTheExactModeInANew0750Directory() throws {
        let root = NSTemporaryDirectory() + "bearerd-sink-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let path = root + "/a/b/t.token"
        let old = umask(0o077)
        defer { umask(old) }
        try TokenOutlets.replaceAtomically(path, with: Array("one\n".utf8), mode: 0o644)
        try TokenOutlets.replaceAtomically(path, with: Array("two\n".utf8), mode: 0o644)
        #expect(try String(contentsOfFile: path, encoding: .utf8) == "two\n")
        func mode(_ p: String) throws -> Int { try FileManager.default.attributesOfItem(atPath: p)[.posixPermissions] as? Int ?? -1 }
        #expect(try mode(path) == 0o644, "fchmod, not the umask")
        #expect(try mode(root + "/a") == 0o750)
        #expect(try mode(root + "/a/b") == 0o750)
        #expect(try FileManager.default.contentsOfDirectory(atPath: root + "/a/b") == ["t.token"])
        // A path whose directory is a file: a clear error, nothing written.
        #expect(throws: SinkWriteError.self) { try TokenOutlets.replaceAtomically(path + "/x", with: [1], mode: 0o600) }
    }

    /// Clocks that read fixed instants, far from the real ones.
    struct FixedClock: SessionClock {
        func now() -> MonotonicInstant { MonotonicInstant(nanoseconds: 5_000 * 1_000_000_000) }
        func wallClockSeconds() -> Int64 { 1_000_000_000 }
        func schedule(at deadline: MonotonicInstant, on loop: EventLoop, _ work: @escaping () -> Void) -> SessionTimer {
            SystemSessionClock().schedule(at: deadline, on: loop, work)
        }
    }

    @Test func aJsonSinkReadsTheExpiryThroughTheSessionClock() throws {
        let root = NSTemporaryDirectory() + "bearerd-sink-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let plan = TokenSinkPlan(session: "s", sinks: [SinkConfig(path: root + "/t.json", format: .json)])
        let clock = FixedClock()
        let outlets = TokenOutlets(plan: plan, logger: Logger(label: "test"), clock: clock)
        defer { outlets.stop() }
        // Expires 600 s after the session clock's now: 600 s after its wall clock's now.
        let token = TokenSession.CurrentToken(accessToken: OAuthSecret("tok"), generation: 1, expiresAt: clock.now() + .seconds(600),
                                              usableWithoutWaitingUntil: clock.now() + .seconds(500))
        outlets.tokenPublished(token, published: PublishedToken(value: "tok", generation: 1, fingerprint: "fp", usableUntil: 0))
        var written: [UInt8]?
        for _ in 0..<500 where written == nil {
            if outlets.sinkStatuses.first?.writes == 1 { written = FileManager.default.contents(atPath: root + "/t.json").map { Array($0) } }
            else { usleep(10_000) }
        }
        #expect(written == plan.render(.json, token: "tok", expiresAt: 1_000_000_600))
    }

    /// A `format: token` sink holds exactly the token (no line ending): a consumer that reads
    /// the file into a header value (Go's os.ReadFile, Python's requests) gets a valid one.
    /// `header` and `json` stay newline-terminated lines.
    @Test func aTokenSinkHoldsExactlyTheToken() throws {
        let root = NSTemporaryDirectory() + "bearerd-sink-\(UUID().uuidString)"
        defer { try? FileManager.default.removeItem(atPath: root) }
        let plan = TokenSinkPlan(session: "s", sinks: [SinkConfig(path: root + "/t.token", format: .token),
                                                       SinkConfig(path: root + "/t.header", format: .header)])
        let clock = FixedClock()
        let outlets = TokenOutlets(plan: plan, logger: Logger(label: "test"), clock: clock)
        defer { outlets.stop() }
        let token = TokenSession.CurrentToken(accessToken: OAuthSecret("tok-123"), generation: 1, expiresAt: clock.now() + .seconds(600),
                                              usableWithoutWaitingUntil: clock.now() + .seconds(500))
        outlets.tokenPublished(token, published: PublishedToken(value: "tok-123", generation: 1, fingerprint: "fp", usableUntil: 0))
        for _ in 0..<500 where !outlets.sinkStatuses.allSatisfy({ $0.writes == 1 }) { usleep(10_000) }
        #expect(FileManager.default.contents(atPath: root + "/t.token").map { Array($0) } == Array("tok-123".utf8))
        #expect(FileManager.default.contents(atPath: root + "/t.header").map { Array($0) } == Array("Authorization: Bearer tok-123\n".utf8))
    }

    @Test func sinkRetryBackoffIsBoundedAndJittered() {
        #expect(TokenOutlets.retryDelay(attempt: 1, random: 1) == 1_000_000_000)
        #expect(TokenOutlets.retryDelay(attempt: 3, random: 1) == 4_000_000_000)
        #expect(TokenOutlets.retryDelay(attempt: 6, random: 1) == 30_000_000_000)
        #expect(TokenOutlets.retryDelay(attempt: Int.max, random: 1.2) == 36_000_000_000)
        #expect(TokenOutlets.retryDelay(attempt: 0, random: 0.8) == 800_000_000)
        #expect(TokenOutlets.retryDelay(attempt: 2, random: 5) == 2_400_000_000)
    }
}
