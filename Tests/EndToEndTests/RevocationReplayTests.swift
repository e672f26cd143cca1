import Foundation
import Testing
import BearerdTestSupport

/// docs/architecture.md §6.8, end to end: one revocation can kill the session's
/// current token along with the older one a request carried. The lost request of the session
/// soak (`SessionSoakTests`), made deterministic with a gate at the origin.
@Suite("Replays after a revocation that also killed the current token", .serialized)
struct RevocationReplayTests {
    /// A request carrying generation 1 is held at the origin; meanwhile generation 1 is revoked,
    /// another request's rejection brings generation 2, and generation 2 is revoked too. When the
    /// held request is rejected, the session replays it at once with generation 2 (no refresh: the
    /// session does not know generation 2 is dead). That replay's rejection is the first news
    /// about generation 2: the request is replayed once more with a token requested after it, and
    /// the client gets the 200. It used to get the upstream's 401.
    @Test func aReplayWithTheCurrentTokenRejectedToIsReplayedAgain() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let gate = DispatchSemaphore(value: 0)
        let origin = try TestOrigin { r in
            // Only the first attempt (carrying generation 1) waits for the gate.
            if r.head.target == "/hold", Self.bearer(r) == tokens.issued.first { _ = gate.wait(timeout: .now() + 10) }
            return tokens.isValid(Self.bearer(r)) ? .response(status: 200, headers: [], body: Array("ok".utf8))
                : .response(status: 401, headers: [("WWW-Authenticate", "Bearer error=\"invalid_token\"")], body: Array("no".utf8))
        }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [withSession(route(origin: origin.port))], sessions: [scriptedSession(tokens)])
        defer { proxy.stop() }

        #expect(try TestClient.get(port: proxy.port, path: "/first").status == 200)
        let held = try TestClient(port: proxy.port, timeout: 20)
        try held.send("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n")
        let deadline = Date().addingTimeInterval(10)
        while !origin.requests.contains(where: { $0.head.target == "/hold" }), Date() < deadline { Thread.sleep(forTimeInterval: 0.01) }
        try #require(origin.requests.contains { $0.head.target == "/hold" }, "the held request never reached the origin")

        tokens.revokeAll()  // Generation 1.
        let other = try TestClient.get(port: proxy.port, path: "/other")
        #expect(other.status == 200, "replayed after a forced refresh: \(other.status)")
        #expect(tokens.issued.count == 2)
        tokens.revokeAll()  // Generation 2, which the session does not know yet.
        gate.signal()

        let r = try held.readResponse()
        #expect(r.status == 200, "\(r.status) \(r.bodyText)")
        let holds = origin.requests.filter { $0.head.target == "/hold" }.map { Self.bearer($0) }
        #expect(holds == Array(tokens.issued.prefix(3)), "carried generations 1, 2 (provisional replay), 3")
        #expect(proxy.logs.text.contains("replay.provisional=true"))
    }

    static func bearer(_ r: TestOrigin.Request) -> String? {
        r.head.headers["Authorization"].map { String($0.dropFirst("Bearer ".count)) }
    }
}
