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
    // MARK: Upgrade (RFC 9110 §7.8, docs/architecture.md §5)

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

    // MARK: Half-closing clients (RFC 9112 §9.6, docs/architecture.md §5)

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

    // MARK: Forbidden trailers (RFC 9110 §6.5.1)

    struct EdgeFailure: Error, CustomStringConvertible {
        var description: String
        init(_ description: String) { self.description = description }
    }

    /// A response read on `c` with its trailers; `onHead` runs when the head is parsed.
    struct ResponseWithTrailers {
        var status: Int
        var body: [UInt8]
        var trailers: HTTPHeaders?
    }

    static func readWithTrailers(_ c: TestClient, onHead: () -> Void = {}) throws -> ResponseWithTrailers {
        var parser = HTTP1Parser(role: .client)
        parser.expectResponse(to: "GET")
        var status = 0
        var body: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 65536)
        for _ in 0..<10_000 {
            while let event = try parser.next() {
                switch event {
                case .responseHead(let h, _):
                    status = h.status
                    onHead()
                case .body(let b): body += b
                case .end(let t): return ResponseWithTrailers(status: status, body: body, trailers: t)
                case .requestHead: throw EdgeFailure("a request from bearerd")
                }
            }
            let n = buf.withUnsafeMutableBytes { recv(c.fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 {
                throw EdgeFailure("closed (\(n)) after \(status == 0 ? "nothing" : "status \(status), \(body.count) body bytes")")
            }
            buf.withUnsafeBytes { parser.feed(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        }
        throw EdgeFailure("no complete response")
    }

    /// How the scripted origin writes its chunked response.
    enum Delivery: String, CaseIterable, CustomTestStringConvertible {
        /// Head, body and trailer section in one write.
        case oneWrite
        /// The head first; body and trailer section once the client has the head.
        case headThenRest
        var testDescription: String { rawValue }
    }

    /// An upstream whose chunked response ends with a field a trailer section must not carry:
    /// the client gets the whole response (head, body, the allowed trailers) and the connection
    /// goes on; the forbidden field is dropped, never relayed and never an empty close.
    @Test(arguments: ["Host: x", "Content-Length: 5", "Transfer-Encoding: chunked", "Authorization: Bearer upstream", "Set-Cookie: a=b"],
          Delivery.allCases)
    func forbiddenUpstreamTrailerIsDroppedAndTheResponseRelayed(field: String, delivery: Delivery) throws {
        let gate = ScriptedOrigin.Gate()
        let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n"
        let rest = "5\r\nhello\r\n0\r\n\(field)\r\nX-Ok: 1\r\n\r\n"
        let origin = try ScriptedOrigin { r in
            if r.path == "/next" { return [.respond(status: 200, body: "next")] }
            switch delivery {
            case .oneWrite: return [.text(head + rest)]
            case .headThenRest: return [.text(head), .await(gate, timeoutMs: 5000), .text(rest)]
            }
        }
        defer { origin.stop() }
        let proxy = try EdgeProxy(routes: [route(origin: origin.port)], io: .poller)
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /t HTTP/1.1\r\nHost: x\r\nTE: trailers\r\n\r\n")
        let r = try Self.readWithTrailers(c, onHead: { gate.open() })
        #expect(r.status == 200)
        #expect(r.body == Array("hello".utf8))
        #expect(r.trailers?["X-Ok"] == "1")
        let name = String(field.split(separator: ":")[0])
        #expect(r.trailers?[name] == nil, "\(name) must not be relayed in a trailer")
        try c.send("GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try c.readResponse().bodyText == "next")
    }

    /// The same for an HTTP/2 client: the trailers HEADERS frame carries the allowed fields only.
    @Test func forbiddenUpstreamTrailerNeverReachesAnH2Client() throws {
        let origin = try ScriptedOrigin { _ in
            [.text("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nHost: x\r\nAuthorization: Bearer u\r\nX-Ok: 1\r\n\r\n")]
        }
        defer { origin.stop() }
        let proxy = try EdgeProxy(routes: [route(origin: origin.port)], io: .poller)
        defer { proxy.stop() }
        let c = try H2TestClient(port: proxy.port)
        let id = try c.session.submitRequest([
            HTTPField(name: ":method", value: "GET"), HTTPField(name: ":scheme", value: "http"),
            HTTPField(name: ":authority", value: "localhost"), HTTPField(name: ":path", value: "/t"),
            HTTPField(name: "te", value: "trailers"),
        ], endStream: true)
        try c.pump { $0.contains { if case .streamClosed(id, _) = $0 { return true }; return false } }
        #expect(c.events.contains { if case .headers(id, let f, .response, _) = $0 { return f.first?.value == "200" }; return false })
        let data = c.events.flatMap { e -> [UInt8] in if case .data(id, let b, _) = e { return b }; return [] }
        #expect(data == Array("hello".utf8))
        let trailers = c.events.compactMap { e -> [HTTPField]? in if case .headers(id, let f, .trailers, _) = e { return f }; return nil }
        #expect(trailers.count == 1)
        #expect(trailers.first?.contains { $0.name == "x-ok" && $0.value == "1" } == true)
        #expect(trailers.first?.contains { $0.name == "host" || $0.name == "authorization" } == false)
        #expect(c.events.contains { if case .streamClosed(id, 0) = $0 { return true }; return false })
    }

    /// A client's trailer section never carries its own credentials (or other fields a trailer
    /// must not carry) to the upstream; the allowed fields pass.
    @Test func forbiddenClientTrailerFieldsNeverReachTheUpstream() throws {
        let origin = try ScriptedOrigin(keepBodiesUpTo: 1024) { _ in [.readBody, .respond(status: 200, body: "ok")] }
        defer { origin.stop() }
        let proxy = try EdgeProxy(routes: [route(origin: origin.port)], io: .poller)
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("POST /u HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n"
                   + "Authorization: Bearer client-secret\r\nCookie: s=1\r\nX-Checksum: 42\r\n\r\n")
        let r = try c.readResponse(method: "POST")
        #expect(r.status == 200)
        let raw = String(decoding: origin.allRaw, as: UTF8.self)
        #expect(raw.contains("X-Checksum: 42\r\n"))
        #expect(!raw.contains("client-secret"))
        #expect(!raw.contains("Cookie"))
    }

    /// An upstream response that turns malformed after its head and some body, all in one read
    /// (here a trailer line with whitespace before the colon): the client gets what was relayed
    /// and then a close it can tell from a complete response (no last chunk), never an empty
    /// close on its keep-alive connection, which clients mistake for an idle close and retry.
    @Test(arguments: [IOModeSetting.poller, .sources])
    func aResponseBrokenAfterItsHeadIsCutShortNotEmpty(io: IOModeSetting) throws {
        let origin = try ScriptedOrigin { _ in
            [.text("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nA : 1\r\n\r\n")]
        }
        defer { origin.stop() }
        let proxy = try EdgeProxy(routes: [route(origin: origin.port)], io: io)
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /t HTTP/1.1\r\nHost: x\r\n\r\n")
        do {
            let r = try Self.readWithTrailers(c)
            Issue.record("a broken response was relayed as complete: \(r.status)")
        } catch {
            #expect("\(error)".contains("after status 200, 5 body bytes"), "\(error)")
        }
    }
}
