import Foundation
import Testing
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdHTTP2

/// curl, as users run it against bearerd (HTTP/2 clients, issue 9).
enum Curl {
    static var available: Bool { FileManager.default.isExecutableFile(atPath: "/usr/bin/curl") }

    struct Result {
        var status: Int32
        var stdout: String
        var stderr: String
        /// `%{http_version}` written after the body on its own line.
        var httpVersion: String { String(stdout.split(separator: "\n").last ?? "") }
        var body: String {
            var lines = stdout.split(separator: "\n", omittingEmptySubsequences: false)
            lines.removeLast()
            return lines.joined(separator: "\n")
        }
    }

    static func run(_ args: [String], stdin: Data? = nil) throws -> Result {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/curl")
        p.arguments = ["-sS", "--max-time", "20", "-w", "\n%{http_version}"] + args
        let out = Pipe(), err = Pipe(), inp = Pipe()
        p.standardOutput = out
        p.standardError = err
        p.standardInput = inp
        try p.run()
        if let stdin { inp.fileHandleForWriting.write(stdin) }
        try? inp.fileHandleForWriting.close()
        let o = out.fileHandleForReading.readDataToEndOfFile()
        let e = err.fileHandleForReading.readDataToEndOfFile()
        p.waitUntilExit()
        return Result(status: p.terminationStatus, stdout: String(decoding: o, as: UTF8.self), stderr: String(decoding: e, as: UTF8.self))
    }
}

@Suite("HTTP/2 clients (issue 9)", .serialized)
struct HTTP2FrontendTests {
    func sessionRoute(_ origin: UInt16, tokens: ScriptedTokenEndpoint) -> ([RouteConfig], [SessionConfig]) {
        var r = route("/api/", origin: origin, strip: true)
        r.session = "s"
        let s = scriptedSession(tokens)
        return ([r], [s])
    }

    @Test(.enabled(if: Curl.available)) func priorKnowledgeH2CThroughToAnHTTP1Upstream() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let (routes, sessions) = sessionRoute(origin.port, tokens: tokens)
        let proxy = try TestProxy(routes: routes, sessions: sessions)
        defer { proxy.stop() }
        let r = try Curl.run(["--http2-prior-knowledge", "-H", "Cookie: a=1", "-H", "Cookie: b=2", "-H", "Authorization: Basic bm8=",
                              "http://127.0.0.1:\(proxy.port)/api/x?q=1"])
        #expect(r.status == 0, "\(r.stderr)")
        #expect(r.httpVersion == "2")
        #expect(r.body.contains("method=GET"))
        #expect(r.body.contains("target=/x?q=1"))
        #expect(r.body.contains("authorization: Bearer \(try #require(tokens.latest))"))
        #expect(r.body.contains("cookie: a=1; b=2"))
        #expect(r.body.contains("x-forwarded-proto: http"))
        // A POST body through, and the HTTP/1.1 clients still served on the same port.
        let body = String(repeating: "z", count: 300_000)
        let post = try Curl.run(["--http2-prior-knowledge", "--data-binary", "@-", "http://127.0.0.1:\(proxy.port)/api/upload"], stdin: Data(body.utf8))
        #expect(post.status == 0, "\(post.stderr)")
        #expect(post.body.contains("body=300000"))
        let h1 = try TestClient.get(port: proxy.port, path: "/api/h1")
        #expect(h1.status == 200)
        #expect(proxy.logs.text.contains("protocol=h2"))
    }

    @Test(.enabled(if: Curl.available)) func httpsListenerNegotiatesH2WithALPN() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route("/", origin: origin.port)], tls: ListenerTLS(cert: pki.serverCertFile, key: pki.serverKeyFile))
        defer { proxy.stop() }
        let h2 = try Curl.run(["--http2", "--cacert", pki.caFile, "https://localhost:\(proxy.port)/tls"])
        #expect(h2.status == 0, "\(h2.stderr)")
        #expect(h2.httpVersion == "2")
        #expect(h2.body.contains("x-forwarded-proto: https"))
        let h1 = try Curl.run(["--http1.1", "--cacert", pki.caFile, "https://localhost:\(proxy.port)/tls1"])
        #expect(h1.status == 0, "\(h1.stderr)")
        #expect(h1.httpVersion == "1.1")
        #expect(h1.body.contains("target=/tls1"))
    }

    @Test(.enabled(if: Curl.available)) func refusalsAndErrorsAreAnsweredOnTheStream() throws {
        let tokens = try ScriptedTokenEndpoint { _ in .json(status: 400, body: #"{"error":"invalid_client","error_description":"nope"}"#) }
        defer { tokens.stop() }
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let (routes, sessions) = sessionRoute(origin.port, tokens: tokens)
        let proxy = try TestProxy(routes: routes, sessions: sessions)
        defer { proxy.stop() }
        let none = try Curl.run(["--http2-prior-knowledge", "-i", "http://127.0.0.1:\(proxy.port)/nothing-here"])
        #expect(none.stdout.hasPrefix("HTTP/2 404"))
        #expect(none.stdout.contains("no_route"))
        let unavailable = try Curl.run(["--http2-prior-knowledge", "-i", "http://127.0.0.1:\(proxy.port)/api/x"])
        #expect(unavailable.stdout.hasPrefix("HTTP/2 503"))
        #expect(unavailable.stdout.contains("token_unavailable"))
        #expect(origin.requests.isEmpty)
    }
}

/// An HTTP/2 client over a blocking socket, driven by an nghttp2 session (`HTTP2Session`): for
/// what curl cannot do (stalling an upload, extended CONNECT).
final class H2TestClient {
    let socket: TestClient
    let session: HTTP2Session
    var events: [HTTP2Event] = []

    init(port: UInt16) throws {
        socket = try TestClient(port: port)
        session = try HTTP2Session(role: .client)
    }

    /// Moves bytes both ways until `done` holds for the events seen so far (or `seconds` pass).
    func pump(seconds: Double = 10, until done: ([HTTP2Event]) -> Bool) throws {
        let deadline = Date().addingTimeInterval(seconds)
        var buf = [UInt8](repeating: 0, count: 65536)
        socket.setTimeout(0.1)
        while !done(events) {
            var out: [UInt8] = []
            try session.produce(into: &out)
            if !out.isEmpty { try socket.send(out) }
            let n = buf.withUnsafeMutableBytes { recv(socket.fd, $0.baseAddress, $0.count, 0) }
            if n > 0 { try session.receive(Array(buf[0..<n])) }
            if n == 0 { throw NginxOrigin.Failure(description: "closed by bearerd; events: \(events)") }
            events += session.takeEvents()
            if Date() > deadline { throw NginxOrigin.Failure(description: "timed out; events: \(events)") }
        }
    }
}

@Suite("HTTP/2 clients: deadlines (issue 9)", .serialized)
struct HTTP2DeadlineTests {
    /// A stream whose upload stalls is reset after `idle`, like an HTTP/1.1 body; the connection
    /// and its other streams go on.
    @Test func aStalledUploadIsResetAndTheConnectionLives() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        var timeouts = FrontendTimeouts()
        timeouts.idle = .milliseconds(500)
        let proxy = try TestProxy(routes: [route(origin: origin.port)], timeouts: timeouts)
        defer { proxy.stop() }
        let c = try H2TestClient(port: proxy.port)
        let post = try c.session.submitRequest([
            HTTPField(name: ":method", value: "POST"), HTTPField(name: ":scheme", value: "http"),
            HTTPField(name: ":authority", value: "localhost"), HTTPField(name: ":path", value: "/upload"),
            HTTPField(name: "content-length", value: "100"),
        ], endStream: false)
        Array(repeating: UInt8(0x61), count: 10).withUnsafeBytes { c.session.sendData(stream: post, $0) }
        try c.pump { $0.contains { if case .streamClosed(post, HTTP2ErrorCode.cancel.rawValue) = $0 { return true }; return false } }
        // The same connection still serves a new stream.
        let get = try c.session.submitRequest([
            HTTPField(name: ":method", value: "GET"), HTTPField(name: ":scheme", value: "http"),
            HTTPField(name: ":authority", value: "localhost"), HTTPField(name: ":path", value: "/after"),
        ], endStream: true)
        try c.pump { $0.contains { if case .headers(get, _, .response, _) = $0 { return true }; return false } }
        #expect(c.events.contains { if case .headers(get, let f, .response, _) = $0 { return f.first?.value == "200" }; return false })
    }
}

@Suite("HTTP/2 clients: 401 replay per stream (issue 9)", .serialized)
struct HTTP2ReplayTests {
    /// DESIGN §6 for an HTTP/2 client: the first token is rejected, the POST body kept and
    /// replayed with the refreshed token on the same stream.
    @Test(.enabled(if: Curl.available)) func aRejectedH2RequestIsReplayedWithItsBody() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let origin = try TestOrigin { r in
            if r.head.headers["Authorization"] == "Bearer at-1" {
                return .response(status: 401, headers: [("WWW-Authenticate", #"Bearer error="invalid_token""#)], body: Array("stale".utf8))
            }
            return echoHandler(r)
        }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [withSession(route("/api/", origin: origin.port, strip: true))], sessions: [scriptedSession(tokens)])
        defer { proxy.stop() }
        let body = String(repeating: "b", count: 50_000)
        let post = try Curl.run(["--http2-prior-knowledge", "--data-binary", "@-", "http://127.0.0.1:\(proxy.port)/api/orders"], stdin: Data(body.utf8))
        #expect(post.status == 0, "\(post.stderr)")
        #expect(post.httpVersion == "2")
        #expect(post.body.contains("body=50000"))
        #expect(post.body.contains("authorization: Bearer at-2"))
        #expect(origin.requests.count == 2)
        #expect(proxy.logs.text.contains("replaying rejected request"))
    }
}
