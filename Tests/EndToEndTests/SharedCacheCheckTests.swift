import Foundation
import Testing
import BearerdTestSupport

/// `bearerd check` with `shared_cache:` (docs/architecture.md §6.13): the connection (AUTH,
/// SELECT) and the key are tested; failures are FILE:LINE: key errors without the password.
@Suite("bearerd check: shared_cache", .serialized, .enabled(if: Prerequisite.runs(RedisServer.isAvailable)))
struct SharedCacheCheckTests {
    @Test func checkTestsTheConnectionAndTheKey() throws {
        let redis = try RedisServer(password: "pw-secret-1")
        let dir = NSTemporaryDirectory() + "bearerd-check-\(UUID().uuidString.prefix(8))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        try "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=\n".write(toFile: dir + "/key", atomically: true, encoding: .utf8)
        func config(password: String) throws -> String {
            try "\(password)\n".write(toFile: dir + "/pw", atomically: true, encoding: .utf8)
            let path = dir + "/bearerd.yaml"
            try """
            shared_cache:
              url: redis://127.0.0.1:\(redis.port)/1
              key_file: key
              password_file: pw
            routes:
              - { match: /, upstream: "http://127.0.0.1:9000" }
            """.write(toFile: path, atomically: true, encoding: .utf8)
            return path
        }
        let ok = try CommandLineTests.run(["check", "-c", try config(password: "pw-secret-1")])
        #expect(ok.status == 0, "\(ok.stderr)")
        #expect(ok.stdout.contains("shared_cache: redis://127.0.0.1:\(redis.port) answers; key_file seals and opens records"))
        // The probe record is gone.
        #expect(try redis.cli(["-n", "1", "DBSIZE"]) == "0")

        let wrong = try CommandLineTests.run(["check", "-c", try config(password: "pw-wrong-2")])
        #expect(wrong.status == 1)
        #expect(wrong.stderr.contains("bearerd.yaml:1: shared_cache.url:") && wrong.stderr.contains("WRONGPASS"), "\(wrong.stderr)")
        #expect(!(wrong.stderr + wrong.stdout).contains("pw-wrong-2"))

        redis.stop()
        let down = try CommandLineTests.run(["check", "-c", try config(password: "pw-secret-1")])
        #expect(down.status == 1)
        #expect(down.stderr.contains("shared_cache.url") && down.stderr.contains("onnection refused"), "\(down.stderr)")
    }
}
