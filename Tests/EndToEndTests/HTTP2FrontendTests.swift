import Foundation
import Testing
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdHTTP2

/// curl, as users run it against bearerd (HTTP/2 clients, docs/architecture.md §2.3).
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

@Suite("HTTP/2 clients", .serialized)
struct HTTP2FrontendTests {
    func sessionRoute(_ origin: UInt16, tokens: ScriptedTokenEndpoint) -> ([RouteConfig], [SessionConfig]) {
        var r = route("/api/", origin: origin, strip: true)
        r.session = "s"
        let s = scriptedSession(tokens)
        return ([r], [s])
    }

    @Test(.enabled(if: Prerequisite.runs(Curl.available))) func priorKnowledgeH2CThroughToAnHTTP1Upstream() throws {
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

    @Test(.enabled(if: Prerequisite.runs(Curl.available))) func httpsListenerNegotiatesH2WithALPN() throws {
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

    @Test(.enabled(if: Prerequisite.runs(Curl.available))) func refusalsAndErrorsAreAnsweredOnTheStream() throws {
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

@Suite("HTTP/2 clients: deadlines", .serialized)
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

@Suite("HTTP/2 clients: 401 replay per stream", .serialized)
struct HTTP2ReplayTests {
    /// docs/architecture.md §6 for an HTTP/2 client: the first token is rejected, the POST body kept and
    /// replayed with the refreshed token on the same stream.
    @Test(.enabled(if: Prerequisite.runs(Curl.available))) func aRejectedH2RequestIsReplayedWithItsBody() throws {
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

/// Raw HTTP/2 frames over a blocking socket (RFC 9113 §4.1), for what no client library sends:
/// resets in bulk, streams over the limit, lower stream ids. HPACK blocks use the static table
/// and never-indexed literals only, so any number of them can be sent.
final class RawH2Client {
    let socket: TestClient
    private(set) var received: [UInt8] = []
    private(set) var sawEOF = false

    struct Frame {
        var type: UInt8
        var flags: UInt8
        var stream: UInt32
        var payload: [UInt8]
        /// GOAWAY and RST_STREAM: the error code.
        var errorCode: UInt32? {
            let at = type == 0x7 ? 4 : type == 0x3 ? 0 : -1
            guard at >= 0, payload.count >= at + 4 else { return nil }
            return payload[at..<at + 4].reduce(0) { $0 << 8 | UInt32($1) }
        }
        func setting(_ id: UInt16) -> UInt32? {
            guard type == 0x4 else { return nil }
            var i = 0
            while i + 6 <= payload.count {
                if UInt16(payload[i]) << 8 | UInt16(payload[i + 1]) == id { return payload[i + 2..<i + 6].reduce(0) { $0 << 8 | UInt32($1) } }
                i += 6
            }
            return nil
        }
    }

    init(port: UInt16) throws {
        socket = try TestClient(port: port, timeout: 5)
    }

    static let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

    static func frame(type: UInt8, flags: UInt8, stream: UInt32, _ payload: [UInt8]) -> [UInt8] {
        let n = payload.count
        return [UInt8(truncatingIfNeeded: n >> 16), UInt8(truncatingIfNeeded: n >> 8), UInt8(truncatingIfNeeded: n), type, flags,
                UInt8(truncatingIfNeeded: stream >> 24), UInt8(truncatingIfNeeded: stream >> 16),
                UInt8(truncatingIfNeeded: stream >> 8), UInt8(truncatingIfNeeded: stream)] + payload
    }

    static func settings(_ entries: [(UInt16, UInt32)] = []) -> [UInt8] {
        var p: [UInt8] = []
        for (id, v) in entries { p += [UInt8(id >> 8), UInt8(id & 0xFF), UInt8(v >> 24), UInt8((v >> 16) & 0xFF), UInt8((v >> 8) & 0xFF), UInt8(v & 0xFF)] }
        return frame(type: 0x4, flags: 0, stream: 0, p)
    }

    static let settingsAck = frame(type: 0x4, flags: 0x1, stream: 0, [])

    static func headers(stream: UInt32, path: String = "/", endStream: Bool = true) -> [UInt8] {
        func literal(_ v: String) -> [UInt8] { [UInt8(v.utf8.count)] + Array(v.utf8) }
        let block: [UInt8] = [0x82, 0x86, 0x04] + literal(path) + [0x01] + literal("localhost")
        return frame(type: 0x1, flags: 0x4 | (endStream ? 0x1 : 0), stream: stream, block)
    }

    static func rst(stream: UInt32, code: UInt32 = 8) -> [UInt8] {
        frame(type: 0x3, flags: 0, stream: stream, [UInt8(code >> 24), UInt8((code >> 16) & 0xFF), UInt8((code >> 8) & 0xFF), UInt8(code & 0xFF)])
    }

    /// Sends what it can; a peer that closed meanwhile ends the sending, not the test.
    func send(_ bytes: [UInt8]) {
        try? socket.send(bytes)
    }

    var frames: [Frame] {
        var out: [Frame] = []
        var i = 0
        let b = received
        while i + 9 <= b.count {
            let len = Int(b[i]) << 16 | Int(b[i + 1]) << 8 | Int(b[i + 2])
            guard i + 9 + len <= b.count else { break }
            let stream = UInt32(b[i + 5] & 0x7F) << 24 | UInt32(b[i + 6]) << 16 | UInt32(b[i + 7]) << 8 | UInt32(b[i + 8])
            out.append(Frame(type: b[i + 3], flags: b[i + 4], stream: stream, payload: Array(b[i + 9..<i + 9 + len])))
            i += 9 + len
        }
        return out
    }

    var goAway: Frame? { frames.first { $0.type == 0x7 } }

    /// Reads until `done` holds for the frames so far, EOF, or `seconds`; returns `done`'s verdict.
    @discardableResult
    func read(seconds: Double = 10, until done: ([Frame]) -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        var buf = [UInt8](repeating: 0, count: 65536)
        socket.setTimeout(0.1)
        while !done(frames) {
            if sawEOF || Date() > deadline { return false }
            let n = buf.withUnsafeMutableBytes { recv(socket.fd, $0.baseAddress, $0.count, 0) }
            if n > 0 { received += buf[0..<n] } else if n == 0 { sawEOF = true } else if errno != EAGAIN && errno != EINTR { sawEOF = true }
        }
        return true
    }
}

@Suite("HTTP/2 clients: hostile frames (RFC 9113 §5.1, §10.5)", .serialized)
struct HTTP2HostileFrameTests {
    /// Rapid reset: 10,000 HEADERS + RST_STREAM pairs. No stream reset before its request was
    /// written reaches for the upstream; the client is closed with ENHANCE_YOUR_CALM.
    @Test func rapidResetOpensNoUpstreamConnectionAndEndsWithEnhanceYourCalm() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try RawH2Client(port: proxy.port)
        var bytes = RawH2Client.preface + RawH2Client.settings()
        for i in 0..<UInt32(10_000) {
            bytes += RawH2Client.headers(stream: 1 + 2 * i) + RawH2Client.rst(stream: 1 + 2 * i)
        }
        c.send(bytes)
        #expect(c.read { $0.contains { $0.type == 0x7 } }, "no GOAWAY; frames: \(c.frames.map(\.type))")
        #expect(c.goAway?.errorCode == HTTP2ErrorCode.enhanceYourCalm.rawValue)
        #expect(c.read { _ in false } == false && c.sawEOF, "the connection is closed")
        // One ordinary request afterwards: the only upstream connection is its own (attempts
        // started for reset streams would have been accepted by now).
        let r = try TestClient.get(port: proxy.port, path: "/after")
        #expect(r.status == 200)
        #expect(origin.requests.count == 1)
        #expect(origin.connectionCount == 1)
    }

    /// h2spec http2/5.1.1/2: HEADERS on stream 3 after stream 5 → GOAWAY PROTOCOL_ERROR, with
    /// the offending frame header split over two writes.
    @Test func headersOnALowerUnusedStreamIsAProtocolError() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try RawH2Client(port: proxy.port)
        c.send(RawH2Client.preface + RawH2Client.settings() + RawH2Client.headers(stream: 5))
        #expect(c.read { $0.contains { $0.type == 0x1 && $0.stream == 5 } }, "stream 5 answered")
        let lower = RawH2Client.headers(stream: 3)
        c.send(Array(lower[..<4]))
        Thread.sleep(forTimeInterval: 0.05)  // two reads on the proxy's side (not a timing assertion)
        c.send(Array(lower[4...]))
        #expect(c.read { $0.contains { $0.type == 0x7 } }, "no GOAWAY; frames: \(c.frames.map(\.type))")
        #expect(c.goAway?.errorCode == HTTP2ErrorCode.protocolError.rawValue)
        #expect(origin.requests.count == 1)
    }

    /// RFC 9113 §5.1.2: stream 129 with 128 allowed (and acknowledged) is refused alone with
    /// REFUSED_STREAM; the 128 in flight complete.
    @Test func oneStreamTooManyIsRefusedAlone() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try RawH2Client(port: proxy.port)
        // Window 0: the responses cannot end, so the 128 streams stay open (as h2spec does).
        c.send(RawH2Client.preface + RawH2Client.settings([(0x4, 0)]))
        #expect(c.read { $0.contains { $0.type == 0x4 && $0.flags == 0 } })
        let limit = try #require(c.frames.first { $0.type == 0x4 && $0.flags == 0 }?.setting(0x3))
        #expect(limit == 128)
        var bytes = RawH2Client.settingsAck
        for i in 0..<UInt32(limit) { bytes += RawH2Client.headers(stream: 1 + 2 * i, path: "/s\(i)") }
        c.send(bytes)
        #expect(eventually { origin.requests.count >= Int(limit) }, "the 128 requests reached the origin: \(origin.requests.count)")
        let extra = 1 + 2 * limit
        c.send(RawH2Client.headers(stream: extra))
        #expect(c.read { $0.contains { $0.type == 0x3 && $0.stream == extra } || $0.contains { $0.type == 0x7 } })
        #expect(c.goAway == nil, "GOAWAY \(String(describing: c.goAway?.errorCode))")
        #expect(c.frames.first { $0.type == 0x3 && $0.stream == extra }?.errorCode == HTTP2ErrorCode.refusedStream.rawValue)
        // Open the windows: all 128 complete.
        c.send(RawH2Client.settings([(0x4, 65535)]))
        let ended = c.read { frames in
            Set(frames.filter { $0.type == 0x0 && $0.flags & 0x1 != 0 }.map(\.stream)).count == Int(limit)
        }
        #expect(ended, "streams ended: \(Set(c.frames.filter { $0.type == 0x0 && $0.flags & 0x1 != 0 }.map(\.stream)).count)")
        #expect(c.goAway == nil)
    }

    /// h2spec http2/5.1 "closed": DATA or HEADERS on a stream the client finished, after the
    /// response ended it both ways or after the client's own RST_STREAM, ends the connection with
    /// GOAWAY STREAM_CLOSED (the server session frees closed streams, so bearerd remembers the
    /// recently finished ones itself).
    @Test func framesOnAStreamTheClientFinishedAreStreamClosed() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let lateFrames: [(String, [UInt8])] = [
            ("DATA", RawH2Client.frame(type: 0x0, flags: 0x1, stream: 1, Array("test".utf8))),
            ("HEADERS", RawH2Client.headers(stream: 1)),
        ]
        for (name, late) in lateFrames {
            // Ended both ways: the whole response came back first.
            let c = try RawH2Client(port: proxy.port)
            c.send(RawH2Client.preface + RawH2Client.settings() + RawH2Client.headers(stream: 1, path: "/closed"))
            #expect(c.read { $0.contains { $0.stream == 1 && ($0.type == 0x0 || $0.type == 0x1) && $0.flags & 0x1 != 0 } }, "\(name): stream 1 answered")
            c.send(late)
            #expect(c.read { $0.contains { $0.type == 0x7 } }, "\(name) after the response: no GOAWAY; frames \(c.frames.map(\.type))")
            #expect(c.goAway?.errorCode == HTTP2ErrorCode.streamClosed.rawValue, "\(name) after the response")
            #expect(c.read { _ in false } == false && c.sawEOF, "\(name) after the response: the connection is closed")

            // Reset by the client, in one write with the frame after it.
            let r = try RawH2Client(port: proxy.port)
            r.send(RawH2Client.preface + RawH2Client.settings() + RawH2Client.headers(stream: 1, path: "/reset", endStream: false)
                   + RawH2Client.rst(stream: 1) + late)
            #expect(r.read { $0.contains { $0.type == 0x7 } }, "\(name) after RST_STREAM: no GOAWAY; frames \(r.frames.map(\.type))")
            #expect(r.goAway?.errorCode == HTTP2ErrorCode.streamClosed.rawValue, "\(name) after RST_STREAM")
        }
        // The listener is unharmed.
        #expect(try TestClient.get(port: proxy.port, path: "/after").status == 200)
    }

    /// The listener's header count limit applies to HTTP/2 as to HTTP/1.1: 431 and the JSON error.
    @Test(.enabled(if: Prerequisite.runs(Curl.available))) func tooManyHeaderFieldsAre431OnBothProtocols() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let fields = (0..<156).flatMap { ["-H", "x-f\($0): v"] }
        let h2 = try Curl.run(["--http2-prior-knowledge", "-i"] + fields + ["http://127.0.0.1:\(proxy.port)/many"])
        #expect(h2.stdout.hasPrefix("HTTP/2 431"), "\(h2.stdout.prefix(300)) \(h2.stderr)")
        #expect(h2.stdout.contains("application/json"))
        #expect(h2.stdout.contains(#""error":"h2.too_many_headers""#))
        let h1 = try Curl.run(["--http1.1", "-i"] + fields + ["http://127.0.0.1:\(proxy.port)/many"])
        #expect(h1.stdout.hasPrefix("HTTP/1.1 431"), "\(h1.stdout.prefix(300))")
        #expect(origin.requests.count == 0)
        // Under the limit, both go through.
        let few = (0..<90).flatMap { ["-H", "x-f\($0): v"] }
        let ok = try Curl.run(["--http2-prior-knowledge"] + few + ["http://127.0.0.1:\(proxy.port)/few"])
        #expect(ok.body.contains("x-f89: v"))
    }
}

/// Polls `condition` every 10 ms for up to `seconds`.
func eventually(seconds: Double = 10, _ condition: () -> Bool) -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while !condition() {
        if Date() > deadline { return false }
        Thread.sleep(forTimeInterval: 0.01)
    }
    return true
}

@Suite("Upgrades the origin does not switch (RFC 9110 §7.8, RFC 8441 §5)", .serialized)
struct UnswitchedUpgradeTests {
    /// An origin that answers every WebSocket handshake with 200 and a body.
    func origin() throws -> TestOrigin {
        try TestOrigin { _ in .response(status: 200, headers: [("Content-Type", "text/plain")], body: Array("not a websocket".utf8)) }
    }

    /// To an HTTP/2 client a 200 to extended CONNECT means the tunnel is open: it gets 502 with
    /// the JSON error instead, and the stream ends.
    @Test func extendedConnectAnswered200Is502() throws {
        let origin = try origin()
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route("/ws/", origin: origin.port)])
        defer { proxy.stop() }
        let client = try H2TestClient(port: proxy.port)
        try client.pump { $0.contains { if case .remoteSettings(_, true) = $0 { return true }; return false } }
        let id = try client.session.submitRequest([
            HTTPField(name: ":method", value: "CONNECT"), HTTPField(name: ":protocol", value: "websocket"),
            HTTPField(name: ":scheme", value: "http"), HTTPField(name: ":authority", value: "localhost"),
            HTTPField(name: ":path", value: "/ws/chat"), HTTPField(name: "sec-websocket-version", value: "13"),
        ], endStream: false)
        try client.pump { $0.contains { if case .streamClosed(id, _) = $0 { return true }; return false } }
        let head = client.events.compactMap { e -> [HTTPField]? in if case .headers(id, let f, .response, _) = e { return f }; return nil }.first
        #expect(head?.first == HTTPField(name: ":status", value: "502"))
        #expect(head?.contains(HTTPField(name: "content-type", value: "application/json")) == true)
        var body: [UInt8] = []
        for case .data(id, let b, _) in client.events { body += b }
        let text = String(decoding: body, as: UTF8.self)
        #expect(text.contains(#""error":"upstream_"#), "\(text)")
        #expect(!text.contains("not a websocket"))
        #expect(origin.requests.count == 1)
    }

    static let handshake = "Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"

    /// RFC 9110 §7.8: a server may ignore `Upgrade` and answer normally. Over HTTP/1.1 that
    /// answer is the client's: 200 with its body, 426 with its body, and the connection stays
    /// HTTP/1.1 and serves the next request.
    @Test func http1UpgradeDeclinedIsRelayedAndTheConnectionStays() throws {
        let origin = try TestOrigin { r in
            switch r.head.target {
            case "/ws/required":
                return .response(status: 426, headers: [("Content-Type", "text/plain")], body: Array("upgrade required".utf8))
            case "/ws/chat":
                return .response(status: 200, headers: [("Content-Type", "text/plain")], body: Array("not a websocket".utf8))
            default:
                return echoHandler(r)
            }
        }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route("/", origin: origin.port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /ws/chat HTTP/1.1\r\nHost: x\r\n" + Self.handshake)
        let declined = try c.readResponse()
        #expect(declined.status == 200)
        #expect(declined.bodyText == "not a websocket")
        try c.send("GET /ws/required HTTP/1.1\r\nHost: x\r\n" + Self.handshake)
        let required = try c.readResponse()
        #expect(required.status == 426)
        #expect(required.bodyText == "upgrade required")
        // The same connection, still HTTP/1.1, serves a plain request.
        try c.send("GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
        let next = try c.readResponse()
        #expect(next.status == 200)
        #expect(next.bodyText.contains("target=/next"))
        #expect(origin.requests.count == 3)
        #expect(origin.requests.first?.head.headers["Upgrade"] == "websocket")
        #expect(!proxy.logs.text.contains("upstream failed"))
    }

    /// The same with a real origin: nginx ignores `Upgrade` on a plain location and answers 200.
    @Test(.enabled(if: NginxOrigin.isAvailable || ProcessInfo.processInfo.environment["CI"] != nil, "nginx is not installed"))
    func http1UpgradeIgnoredByNginxIsRelayed() throws {
        let nginx = try NginxOrigin(pki: try TestPKI.generate())
        defer { nginx.stop() }
        let proxy = try TestProxy(routes: [route("/", origin: nginx.h1Port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /ws/chat HTTP/1.1\r\nHost: x\r\n" + Self.handshake)
        let declined = try c.readResponse()
        #expect(declined.status == 200)
        #expect(declined.bodyText.hasPrefix("proto=HTTP/1.1 "), "\(declined.bodyText)")
        #expect(declined.bodyText.contains("uri=/ws/chat"))
        try c.send("GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
        let next = try c.readResponse()
        #expect(next.status == 200)
        #expect(next.bodyText.contains("uri=/after"))
    }

    /// A 401 to an upgrade is still a rejection: the token is refreshed and the handshake
    /// replayed; the replay declined with 200 reaches the client, whose connection stays.
    @Test func http1UpgradeRejectedIsReplayedThenItsDeclineRelayed() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let origin = try TestOrigin { r in
            if r.head.headers["Authorization"] == "Bearer at-1" {
                return .response(status: 401, headers: [("WWW-Authenticate", #"Bearer error="invalid_token""#)], body: Array("stale".utf8))
            }
            if r.head.target == "/ws/chat" {
                return .response(status: 200, headers: [("Content-Type", "text/plain")], body: Array("not a websocket".utf8))
            }
            return echoHandler(r)
        }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [withSession(route("/", origin: origin.port))], sessions: [scriptedSession(tokens)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /ws/chat HTTP/1.1\r\nHost: x\r\n" + Self.handshake)
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r.bodyText == "not a websocket")
        let seen = origin.requests
        #expect(seen.count == 2)
        #expect(seen.first?.head.headers["Authorization"] == "Bearer at-1")
        #expect(seen.last?.head.headers["Authorization"] == "Bearer at-2")
        #expect(seen.last?.head.headers["Upgrade"] == "websocket")
        #expect(proxy.logs.text.contains("replaying rejected request"))
        try c.send("GET /next HTTP/1.1\r\nHost: x\r\n\r\n")
        let next = try c.readResponse()
        #expect(next.status == 200)
        #expect(next.bodyText.contains("authorization: Bearer at-2"))
    }
}
