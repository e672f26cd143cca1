import BearerdIO
import BearerdOAuth
import Dispatch
import Foundation
import BearerdTestSupport
import Testing
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdSessions

/// refresh_token sessions of two replicas sharing one lineage through Redis (docs/architecture.md §6
/// "Rotation durability", "Shared cache"), each with its own state file, against a real
/// redis-server and a rotating token endpoint.
@Suite(.serialized)
struct SharedRefreshTokenTests {
    /// One replica's request in flight through the driver's completion API (no child task).
    final class Pending: @unchecked Sendable {  // @unchecked: `result` written once before `done` signals
        private let done = DispatchSemaphore(value: 0)
        private var result: Result<PublishedToken, TokenUnavailable>?
        init(_ driver: TokenSessionDriver) {
            driver.requestToken(on: testLoops[2]) { [self] r in
                result = r
                done.signal()
            }
        }
        /// The answer, or nil when none came within 30 s.
        func answer() -> Result<PublishedToken, TokenUnavailable>? {
            done.wait(timeout: .now() + 30) == .success ? result : nil
        }
    }

    /// Until `condition` holds, at most 10 s (every 20 ms).
    func eventually(_ condition: () throws -> Bool) rethrows -> Bool {
        for _ in 0..<500 {
            if try condition() { return true }
            usleep(20_000)
        }
        return try condition()
    }

    @Test(.enabled(if: Prerequisite.runs(RedisServer.isAvailable)))
    func invalidGrantAdoptsTheRefreshTokenAnotherReplicaRotated() async throws {
        let redis = try RedisServer()
        let server = SessionRefreshTokenTests.RotatingServer()
        // The first request (replica a's) is held at the endpoint until the test opens the gate.
        let arrived = DispatchSemaphore(value: 0), gate = DispatchSemaphore(value: 0)
        let rotate = server.handler
        let endpoint = try ScriptedTokenEndpoint { request, index in
            if index == 1 {
                arrived.signal()
                _ = gate.wait(timeout: .now() + 30)
            }
            return rotate(request, index)
        }
        defer { endpoint.stop() }
        let root = temporaryDirectory()
        defer { removeTree(root) }
        writeFile(root + "/cache-key", Data(repeating: 0x6B, count: 32).base64EncodedString() + "\n")
        writeFile(root + "/me.refresh", "refresh-RRR-0\n")
        let session = SessionConfig(name: "me", grant: .refreshToken, tokenURL: endpoint.url, clientID: "cli",
                                    clientAuth: .none, refreshTokenFile: root + "/me.refresh")
        func replica(_ name: String) throws -> SessionManager {
            var config = sessionConfig(session, stateDir: root + "/" + name)
            config.sharedCache = SharedCacheConfig(endpoint: .tcp(host: "127.0.0.1", port: redis.port, tls: false),
                                                   keyFile: root + "/cache-key", prefix: "t:")
            return try SessionManager(config: config, logger: CapturedLogs().logger, environment: [:])
        }
        let managerA = try replica("a"), managerB = try replica("b")
        defer { managerA.stop(); managerB.stop() }
        let a = try #require(managerA.session(named: "me")), b = try #require(managerB.session(named: "me"))
        let recordKey = "t:" + SharedTokenCache.identity(of: session, dpopThumbprint: nil)

        // a takes the lock and presents refresh-RRR-0; its request stalls past the lock's TTL.
        let first = Pending(a)
        #expect(arrived.wait(timeout: .now() + 30) == .success)
        #expect(try redis.cli(["EXISTS", recordKey + ":lock"]) == "1")
        try redis.cli(["DEL", recordKey + ":lock"])
        // b takes the lock, rotates refresh-RRR-0 and publishes the lineage.
        let second = try #require(Pending(b).answer())
        #expect(try second.get().value == "access-AAA-1")
        #expect(try eventually { try redis.cli(["EXISTS", recordKey]) == "1" })
        // a's refresh-RRR-0 is refused now: it re-reads the record and adopts b's lineage.
        gate.signal()
        let adopted = try #require(first.answer())
        #expect(try adopted.get().value == "access-AAA-1", "adopted, not 'needs a new refresh token'")
        #expect(endpoint.count == 2)
        let stored = try PersistedSessionState.decode(Array(try #require(FileManager.default.contents(atPath: root + "/a/me.json"))))
        #expect(stored.refreshToken.exposedValue == "refresh-RRR-1")
        // And a carries on with that lineage: a forced refresh presents refresh-RRR-1.
        guard case .replay(let next, _) = await reportRejected(a, generation: try adopted.get().generation) else {
            Issue.record("a refreshes")
            return
        }
        #expect(next.value == "access-AAA-2")
        #expect(endpoint.received.last?.form["refresh_token"] == "refresh-RRR-1")
    }
}
