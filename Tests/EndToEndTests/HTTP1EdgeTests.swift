import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Testing
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

/// bearerd in-process like `TestProxy`, with the I/O mode chosen by the test (both modes are
/// checked here whatever `$BEARERD_IO` says).
final class EdgeProxy {
    let server: BearerdServer
    let logs = CapturedLogs()
    var port: UInt16 { server.boundAddresses[0].port }

    init(routes: [RouteConfig], sessions: [SessionConfig] = [], io: IOModeSetting) throws {
        var config = BearerdConfig(file: "<test>", listen: [.tcp(host: "127.0.0.1", port: 0)], admin: nil, loops: 1,
                                   limits: HTTP1Limits(), frontendTimeouts: FrontendTimeouts(), sessions: sessions, routes: routes)
        config.listeners = [ListenerConfig(address: .tcp(host: "127.0.0.1", port: 0), allowedHosts: ["*"], allowedOrigins: [])]
        config.ioMode = io
        server = try BearerdServer(config: config, logger: logs.logger)
        try server.start()
    }

    func stop() {
        let done = DispatchSemaphore(value: 0)
        server.shutdown(grace: .seconds(1)) { done.signal() }
        done.wait()
    }
}

@Suite("HTTP/1.1 edges: Upgrade without Connection, half-closing clients, forbidden trailers", .serialized)
struct HTTP1EdgeTests {
    // MARK: Upgrade (RFC 9110 §7.8, DESIGN §5)

    /// An `Upgrade` field that `Connection` does not name (or on HTTP/1.0) makes no upgrade
    /// request: it is dropped like any hop-by-hop field and the request is forwarded.
    @Test(arguments: [
        "GET /a HTTP/1.1\r\nHost: x\r\nUpgrade: foo/1\r\n\r\n",
        "GET /a HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        "GET /a HTTP/1.1\r\nHost: x\r\nConnection: keep-alive\r\nUpgrade: foo/1, websocket\r\n\r\n",
        "GET /a HTTP/1.0\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: foo/1\r\n\r\n",
    ])
    func upgradeNotNamedInConnectionIsForwardedWithoutIt(request: String) throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try EdgeProxy(routes: [route(origin: origin.port)], io: .poller)
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send(request)
        let r = try c.readResponse()
        #expect(r.status == 200, "\(r.bodyText)")
        #expect(r.bodyText.contains("target=/a"))
        let seen = try #require(origin.requests.first)
        #expect(seen.head.headers["Upgrade"] == nil)
        #expect(!(seen.head.headers["Connection"] ?? "").lowercased().contains("upgrade"))
        #expect(r["Upgrade"] == nil)
        if request.contains("HTTP/1.1") {
            // A plain request: the connection carries another one.
            try c.send("GET /b HTTP/1.1\r\nHost: x\r\n\r\n")
            #expect(try c.readResponse().bodyText.contains("target=/b"))
        }
    }

    /// A real upgrade request (Connection: upgrade) for a protocol bearerd does not tunnel is
    /// still refused, never silently downgraded.
    @Test func realUpgradeToAnUnknownProtocolIsStillRefused() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try EdgeProxy(routes: [route(origin: origin.port)], io: .poller)
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /a HTTP/1.1\r\nHost: x\r\nConnection: upgrade\r\nUpgrade: foo/1\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 400)
        #expect(r.bodyText.contains("proxy.unsupported_upgrade"))
        #expect(origin.requests.isEmpty)
    }

    // MARK: Half-closing clients (RFC 9112 §9.6, DESIGN §5)

    /// Which kind of route the half-closing client talks to.
    enum SessionKind: String, CaseIterable, CustomTestStringConvertible {
        /// A route without a session.
        case none
        /// A session whose token is at hand.
        case ready
        /// A session whose first token is held back until the client has half-closed.
        case gated
        var testDescription: String { rawValue }
    }

    /// A client that sends (part of) a request and then `shutdown(SHUT_WR)` gets the answer it
    /// is owed before the connection closes: 400 for a malformed or unfinished request, the
    /// upstream's response for a complete one; in both I/O modes, with and without a session.
    @Test(arguments: [IOModeSetting.poller, .sources], SessionKind.allCases)
    func halfClosingClientStillGetsItsAnswer(io: IOModeSetting, kind: SessionKind) throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let gate = ScriptedOrigin.Gate()
        let tokenJSON = #"{"access_token":"at-gated","token_type":"Bearer","expires_in":3600}"#
        let tokens = try ScriptedTokenEndpoint { call in
            guard kind == .gated, call.index == 0 else { return .token(lifetime: 3600) }
            return .steps([.await(gate, timeoutMs: 5000), .respond(status: 200, headers: [("Content-Type", "application/json")], body: tokenJSON)])
        }
        defer { tokens.stop() }
        let r = route(origin: origin.port)
        let proxy = try EdgeProxy(routes: [kind == .none ? r : withSession(r)], sessions: kind == .none ? [] : [scriptedSession(tokens)], io: io)
        defer { proxy.stop() }

        // (what the client sends before its FIN, the status it is owed, the error it names)
        let cases: [(String, Int, String?)] = [
            ("POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nabc", 400, "http1.chunk_size_too_large"),
            ("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 18446744073709551615\r\n\r\nabc", 400, "http1.invalid_content_length"),
            ("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc", 400, "http1.truncated"),
            ("POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n", 400, "http1.truncated"),
            ("GET /x HTTP/1.1\r\nHost: x\r\nX-Half: ", 400, "http1.truncated"),
            ("POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", 200, nil),
            ("GET /x HTTP/1.1\r\nHost: x\r\n\r\n", 200, nil),
        ]
        for (i, (input, status, error)) in cases.enumerated() {
            let c = try TestClient(port: proxy.port)
            try c.send(input)
            c.shutdownWrite()
            if i == 0 { gate.open() }
            let method = input.hasPrefix("GET") ? "GET" : "POST"
            let answer: TestClient.Response
            do {
                answer = try c.readResponse(method: method)
            } catch {
                Issue.record("\(io) \(kind) case \(i): no answer after the client's FIN: \(error)")
                continue
            }
            #expect(answer.status == status, "\(io) \(kind) case \(i): \(answer.bodyText)")
            if let error {
                #expect(answer["Content-Type"] == "application/json")
                #expect(answer.bodyText.contains("\"error\":\"\(error)\""), "\(io) \(kind) case \(i): \(answer.bodyText)")
            } else {
                #expect(answer.bodyText.contains("target=/x"))
                #expect(answer.bodyText.contains("body=\(method == "POST" ? 3 : 0)"))
                if kind != .none { #expect(answer.bodyText.contains("authorization: Bearer at-")) }
            }
            #expect(c.isClosedByPeer(), "\(io) \(kind) case \(i): the connection closes after the answer")
        }
    }

    /// Pipelined requests followed by the client's FIN are all answered, in order, then the
    /// connection closes.
    @Test(arguments: [IOModeSetting.poller, .sources])
    func pipelinedRequestsBeforeAFinAreAllAnswered(io: IOModeSetting) throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try EdgeProxy(routes: [route(origin: origin.port)], io: io)
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /1 HTTP/1.1\r\nHost: x\r\n\r\nPOST /2 HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhiGET /3 HTTP/1.1\r\nHost: x\r\n\r\n")
        c.shutdownWrite()
        for (n, method) in [(1, "GET"), (2, "POST"), (3, "GET")] {
            let r = try c.readResponse(method: method)
            #expect(r.status == 200)
            #expect(r.bodyText.contains("target=/\(n)"))
        }
        #expect(c.isClosedByPeer())
    }
}
