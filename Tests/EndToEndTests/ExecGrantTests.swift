import Foundation
import Testing
import BearerdTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// `grant: exec` (docs/architecture.md §4) with the real `bearerd run`: a helper script mints tokens,
/// counted per invocation; coalesced like any refresh; failures are 503s, then recovery.
@Suite("grant: exec", .serialized)
struct ExecGrantTests {
    /// A helper that counts its runs in `dir/count`, records its signal state in `dir/signals`,
    /// sleeps `delay` seconds, and prints a token response (or fails while `dir/fail` exists).
    static func helper(dir: String, delay: Double = 0.5) throws -> String {
        let path = dir + "/get-token"
        try """
            #!/bin/sh
            n=$(cat "\(dir)/count" 2>/dev/null || echo 0); n=$((n + 1)); echo $n > "\(dir)/count"
            grep -E '^Sig(Blk|Ign):' /proc/self/status > "\(dir)/signals"
            sleep \(delay)
            if [ -e "\(dir)/fail" ]; then echo "helper: cannot reach the STS (client_secret=hunter2)" >&2; exit 3; fi
            echo "{\\"access_token\\":\\"exec-token-$n\\",\\"token_type\\":\\"Bearer\\",\\"expires_in\\":3600}"
            """.write(toFile: path, atomically: true, encoding: .utf8)
        chmod(path, 0o755)
        return path
    }

    static func count(_ dir: String) -> Int {
        Int((try? String(contentsOfFile: dir + "/count", encoding: .utf8))?.trimmingCharacters(in: .whitespacesAndNewlines) ?? "") ?? 0
    }

    @Test func oneHelperRunServesAHundredConcurrentRequests() throws {
        let dir = try RunningBearerd.tempDir("exec")
        let helper = try Self.helper(dir: dir)
        let origin = try TestOrigin { r in .response(status: 200, headers: [], body: Array((r.head.headers["Authorization"] ?? "none").utf8)) }
        defer { origin.stop() }
        let port = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: """
            listen: 127.0.0.1:\(port)
            sessions:
              sts:
                grant: exec
                command: [\(helper), --audience, api]
                timeout: 5s
            routes:
              - match: /
                upstream: http://127.0.0.1:\(origin.port)
                session: sts
            """, dir: dir)
        defer { _ = b.stop() }
        #expect(b.waitServing(port: port, path: "/warm") != nil, "\(b.logs)")
        #expect(Self.count(dir) == 1)
        let group = DispatchGroup()
        final class Bodies: @unchecked Sendable {  // @unchecked: guarded by `lock`
            let lock = NSLock()
            var values: [String] = []
        }
        let bodies = Bodies()
        for i in 0..<100 {
            group.enter()
            Thread {
                let body = (try? TestClient.get(port: port, path: "/c\(i)"))?.bodyText ?? "failed"
                bodies.lock.withLock { bodies.values.append(body) }
                group.leave()
            }.start()
        }
        #expect(group.wait(timeout: .now() + 30) == .success)
        #expect(Set(bodies.lock.withLock { bodies.values }) == ["Bearer exec-token-1"])
        #expect(Self.count(dir) == 1)
        // The helper started as if from a shell: nothing blocked, SIGPIPE not ignored.
        let signals = try String(contentsOfFile: dir + "/signals", encoding: .utf8)
        #expect(signals.contains("SigBlk:\t0000000000000000"), "\(signals)")
        let ign = signals.split(separator: "\n").first { $0.hasPrefix("SigIgn:") }.map { String($0.dropFirst(7)).trimmingCharacters(in: .whitespaces) } ?? ""
        #expect((UInt64(ign, radix: 16) ?? 0) & (1 << (13 - 1)) == 0, "SIGPIPE ignored in the helper: \(ign)")
    }

    @Test func aFailingHelperIsA503ThenRecovers() throws {
        let dir = try RunningBearerd.tempDir("exec")
        let helper = try Self.helper(dir: dir, delay: 0)
        FileManager.default.createFile(atPath: dir + "/fail", contents: nil)
        let origin = try TestOrigin { _ in .response(status: 200, headers: [], body: Array("ok".utf8)) }
        defer { origin.stop() }
        let port = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: """
            listen: 127.0.0.1:\(port)
            sessions:
              sts:
                grant: exec
                command: [\(helper)]
                wait_timeout: 300ms
            routes:
              - match: /
                upstream: http://127.0.0.1:\(origin.port)
                session: sts
            """, dir: dir)
        defer { _ = b.stop() }
        // Every request is a 503; one that waits while the helper runs may time out before it
        // exits (a slow spawn on a loaded machine: no failure known yet), but once it has failed,
        // the 503 says why. Requests until one does (bounded), with a short wait_timeout.
        var first = b.waitServing(port: port, path: "/x", seconds: 30)
        var saw503s = 0
        let failDeadline = Date().addingTimeInterval(30)
        while let r = first, r.status == 503, r.bodyText.contains("token_unavailable"),
              !r.bodyText.contains("exited with status 3"), saw503s < 200, Date() < failDeadline {
            saw503s += 1
            Thread.sleep(forTimeInterval: 0.05)
            first = try? TestClient.get(port: port, path: "/x")
        }
        #expect(first?.status == 503)
        #expect(first?.bodyText.contains("token_unavailable") == true)
        #expect(first?.bodyText.contains("exited with status 3") == true, "\(first?.bodyText ?? "")")
        #expect(b.waitLog("token command wrote to stderr"))
        #expect(!b.logs.contains("hunter2"))
        // The helper works again: a later request gets through (backoff 1 s, 2 s, …).
        try FileManager.default.removeItem(atPath: dir + "/fail")
        var status = 0
        let deadline = Date().addingTimeInterval(60)
        while status != 200 && Date() < deadline {
            status = (try? TestClient.get(port: port, path: "/y"))?.status ?? 0
            if status != 200 { Thread.sleep(forTimeInterval: 0.5) }
        }
        #expect(status == 200)
    }
}
