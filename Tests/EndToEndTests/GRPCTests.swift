import Foundation
import Testing
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions

/// gRPC through bearerd (docs/architecture.md §5): a real grpcio server behind bearerd, a real grpcio client in
/// front (`Tests/Fixtures/grpc_echo.py`), h2c on both sides.
@Suite("gRPC through bearerd", .serialized,
       .enabled(if: PythonFixture.unavailable(modules: ["grpc"]) == nil || ProcessInfo.processInfo.environment["CI"] != nil,
                "\(PythonFixture.unavailable(modules: ["grpc"]) ?? "")"))
struct GRPCTests {
    struct Call: Decodable {
        var ok: Bool
        var code: String
        var details: String
        var messages: [String]
        var trailers: [String: String]
    }

    static func call(_ port: UInt16, _ kind: String, count: Int = 3) throws -> Call {
        let out = try PythonFixture.runClient(script: "grpc_echo.py",
                                              arguments: ["client", "--target", "127.0.0.1:\(port)", "--call", kind, "--count", String(count)])
        return try JSONDecoder().decode(Call.self, from: Data(out.utf8))
    }

    func proxy(upstreamPort: UInt16, tokens: ScriptedTokenEndpoint) throws -> TestProxy {
        var r = RouteConfig(match: "/bearerd.test.Echo/", upstream: UpstreamURL(scheme: "http", host: "127.0.0.1", port: upstreamPort, basePath: ""))
        r.http2 = .priorKnowledge
        r.session = "s"
        let s = scriptedSession(tokens)
        return try TestProxy(routes: [r], sessions: [s])
    }

    @Test func allFourCallKindsWithTrailersAndTheInjectedToken() throws {
        let server = try PythonFixture(script: "grpc_echo.py", arguments: ["server", "--port", "0"])
        defer { server.stop() }
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let p = try proxy(upstreamPort: server.port, tokens: tokens)
        defer { p.stop() }

        let unary = try Self.call(p.port, "unary")
        #expect(unary.ok, "\(unary)")
        #expect(unary.messages == ["hello"])
        let token = try #require(tokens.latest)
        #expect(unary.trailers["x-seen-authorization"] == "Bearer \(token)")

        let ss = try Self.call(p.port, "server_stream", count: 5)
        #expect(ss.ok, "\(ss)")
        #expect(ss.messages == (0..<5).map { "msg-\($0)" })
        #expect(ss.trailers["x-seen-authorization"] == "Bearer \(token)")

        let cs = try Self.call(p.port, "client_stream", count: 4)
        #expect(cs.ok, "\(cs)")
        #expect(cs.messages == ["m0,m1,m2,m3"])

        let bidi = try Self.call(p.port, "bidi", count: 6)
        #expect(bidi.ok, "\(bidi)")
        #expect(bidi.messages == (0..<6).map { "b\($0)" })
        #expect(bidi.trailers["x-call-count"] != nil)

        // grpc-status and grpc-message of an error pass through.
        let fail = try Self.call(p.port, "fail")
        #expect(fail.code == "PERMISSION_DENIED")
        #expect(fail.details == "nope")
        #expect(p.logs.text.contains("grpc_status=7"))
        #expect(p.logs.text.contains("protocol=h2"))
    }

    /// A trailers-only UNAUTHENTICATED on a unary call: one refresh, one replay, the call succeeds.
    @Test func unauthenticatedIsRefreshedAndReplayed() throws {
        let server = try PythonFixture(script: "grpc_echo.py", arguments: ["server", "--port", "0", "--reject-token", "at-1"])
        defer { server.stop() }
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let p = try proxy(upstreamPort: server.port, tokens: tokens)
        defer { p.stop() }
        let unary = try Self.call(p.port, "unary")
        #expect(unary.ok, "\(unary)")
        #expect(unary.trailers["x-seen-authorization"] == "Bearer at-2")
        #expect(tokens.calls.count == 2)
        #expect(p.logs.text.contains("replaying rejected request"))
        // Later calls carry the new token at once.
        let again = try Self.call(p.port, "server_stream", count: 2)
        #expect(again.ok)
        #expect(again.trailers["x-seen-authorization"] == "Bearer at-2")
        #expect(tokens.calls.count == 2)
    }

    /// No upstream: the gRPC client gets a trailers-only UNAVAILABLE naming the cause, not JSON.
    @Test func anUnreachableUpstreamIsAGRPCError() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let p = try proxy(upstreamPort: NginxOrigin.freePort(), tokens: tokens)
        defer { p.stop() }
        let unary = try Self.call(p.port, "unary")
        #expect(unary.code == "UNAVAILABLE")
        #expect(unary.details.contains("upstream_unreachable"))
        let denied = try ScriptedTokenEndpoint { _ in .json(status: 401, body: #"{"error":"invalid_client"}"#) }
        defer { denied.stop() }
        let q = try proxy(upstreamPort: NginxOrigin.freePort(), tokens: denied)
        defer { q.stop() }
        let noToken = try Self.call(q.port, "unary")
        #expect(noToken.code == "UNAVAILABLE")
        #expect(noToken.details.contains("token_unavailable"))
    }
}
