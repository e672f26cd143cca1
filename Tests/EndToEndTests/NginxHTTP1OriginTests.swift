import Foundation
import Testing
import BearerdHTTP
import BearerdConfig
import BearerdTestSupport

/// The core proxying scenarios with nginx as the HTTP/1.1 origin (its `h1Port`), so the bytes
/// bearerd writes upstream are parsed by a parser that is not bearerd's own, and the responses it
/// relays are framed by nginx: Content-Length and chunked request bodies (small and large, stored
/// byte for byte by nginx's DAV module), HEAD, 204 and 304 without bodies, keep-alive reuse of the
/// upstream connection, pipelining, `Expect: 100-continue`, and 401 → refresh → replay. Where it
/// makes sense the client is curl rather than `TestClient` (whose parser is bearerd's).
@Suite("Proxying to nginx as the HTTP/1.1 origin", .serialized,
       .enabled(if: NginxOrigin.isAvailable || ProcessInfo.processInfo.environment["CI"] != nil, "nginx is not installed"))
struct NginxHTTP1OriginTests {
    /// nginx, a token endpoint (its first token, `at-1`, is the one nginx's `/reject/` refuses)
    /// and bearerd routing `/` to nginx's HTTP/1.1 port with that session.
    final class Rig {
        let pki: TestPKI
        let nginx: NginxOrigin
        let tokens: ScriptedTokenEndpoint
        let bearerd: TestProxy
        init() throws {
            pki = try TestPKI.generate()
            nginx = try NginxOrigin(pki: pki, rejectToken: "Bearer at-1")
            tokens = try ScriptedTokenEndpoint()
            bearerd = try TestProxy(routes: [withSession(route(origin: nginx.h1Port))], sessions: [scriptedSession(tokens)])
        }
        func stop() {
            bearerd.stop()
            nginx.stop()
            tokens.stop()
            pki.remove()
        }
        func client() throws -> TestClient { try TestClient(port: bearerd.port, timeout: 10) }
        func stored(_ name: String) -> [UInt8] {
            (try? Data(contentsOf: URL(fileURLWithPath: nginx.documentRoot + "/put/" + name))).map { Array($0) } ?? []
        }
        var url: String { "http://127.0.0.1:\(bearerd.port)" }
    }

    enum Framing: String, CaseIterable, Sendable { case contentLength, chunked }

    /// `body` as the request's body bytes in `framing` (chunks of 64 KiB, as a streaming client sends).
    static func framed(_ body: [UInt8], _ framing: Framing) -> (header: String, bytes: [UInt8]) {
        switch framing {
        case .contentLength:
            return ("Content-Length: \(body.count)\r\n", body)
        case .chunked:
            var out: [UInt8] = []
            var i = 0
            while i < body.count {
                let n = min(65536, body.count - i)
                out += Array("\(String(n, radix: 16))\r\n".utf8) + body[i..<(i + n)] + [13, 10]
                i += n
            }
            return ("Transfer-Encoding: chunked\r\n", out + Array("0\r\n\r\n".utf8))
        }
    }

    /// `key=value` words of nginx's answer line.
    static func seen(_ body: String) -> [String: String] { HTTP2UpstreamTests.seen(body) }

    @Test func getHeadAnd204KeepTheConnectionFramed() throws {
        let rig = try Rig()
        defer { rig.stop() }
        let c = try rig.client()
        try c.send("GET /a/b?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        let get = try c.readResponse()
        #expect(get.status == 200)
        let words = Self.seen(get.bodyText)
        #expect(words["proto"] == "HTTP/1.1")
        #expect(words["uri"] == "/a/b?x=1")
        #expect(get.bodyText.contains("auth=Bearer at-1"), "\(get.bodyText)")
        // HEAD: the length of the GET's body, no body bytes; the next answer on the same connection
        // is read where it starts.
        try c.send("HEAD /a/b?x=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        let head = try c.readResponse(method: "HEAD")
        #expect(head.status == 200)
        #expect(head.body.isEmpty)
        #expect(head["Content-Length"] == String(get.body.count))
        try c.send("GET /nocontent HTTP/1.1\r\nHost: x\r\n\r\n")
        let none = try c.readResponse()
        #expect(none.status == 204)
        #expect(none.body.isEmpty)
        try c.send("GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
        let after = try c.readResponse()
        #expect(Self.seen(after.bodyText)["uri"] == "/after")
        // Every request went over one upstream connection (nginx's connection serial).
        #expect(Self.seen(after.bodyText)["conn"] == words["conn"], "\(after.bodyText) vs \(get.bodyText)")
    }

    @Test func pipelinedRequestsAreAnsweredInOrderOverOneUpstreamConnection() throws {
        let rig = try Rig()
        defer { rig.stop() }
        let c = try rig.client()
        try c.send((1...4).map { "GET /p\($0) HTTP/1.1\r\nHost: x\r\n\r\n" }.joined())
        var conns = Set<String>()
        for i in 1...4 {
            let r = try c.readResponse()
            #expect(Self.seen(r.bodyText)["uri"] == "/p\(i)", "\(r.bodyText)")
            conns.insert(Self.seen(r.bodyText)["conn"] ?? "?")
        }
        #expect(conns.count == 1, "\(conns)")
        // A new client connection reuses the pooled upstream connection too.
        let r = try TestClient.get(port: rig.bearerd.port, path: "/again")
        #expect(conns.contains(Self.seen(r.bodyText)["conn"] ?? "-"), "\(r.bodyText)")
    }

    /// PUT bodies as nginx stores them, byte for byte: 201 for a new file, 204 (no body) when it
    /// replaces one; the file comes back whole (nginx's Content-Length), and a conditional GET
    /// gets a 304 without a body; the connection stays usable after each.
    @Test(arguments: Framing.allCases, [1000, 3 << 20])
    func putBodiesArriveWholeAndComeBack(framing: Framing, size: Int) throws {
        let rig = try Rig()
        defer { rig.stop() }
        let c = try rig.client()
        let body = TestOrigin.pattern(size, seed: 7)
        let (header, bytes) = Self.framed(body, framing)
        try c.send("PUT /put/f HTTP/1.1\r\nHost: x\r\n\(header)\r\n")
        try c.send(bytes)
        let created = try c.readResponse()
        #expect(created.status == 201, "\(created.bodyText)")
        #expect(rig.stored("f") == body, "nginx stored \(rig.stored("f").count) of \(body.count) bytes")
        let replacement = TestOrigin.pattern(size, seed: 9)
        let (header2, bytes2) = Self.framed(replacement, framing)
        try c.send("PUT /put/f HTTP/1.1\r\nHost: x\r\n\(header2)\r\n")
        try c.send(bytes2)
        let replaced = try c.readResponse()
        #expect(replaced.status == 204)
        #expect(replaced.body.isEmpty)
        #expect(rig.stored("f") == replacement)
        try c.send("GET /put/f HTTP/1.1\r\nHost: x\r\n\r\n")
        let back = try c.readResponse()
        #expect(back.status == 200)
        #expect(back.body == replacement, "got \(back.body.count) bytes")
        let etag = try #require(back["ETag"])
        try c.send("GET /put/f HTTP/1.1\r\nHost: x\r\nIf-None-Match: \(etag)\r\n\r\n")
        let notModified = try c.readResponse()
        #expect(notModified.status == 304)
        #expect(notModified.body.isEmpty)
        try c.send("GET /last HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(Self.seen(try c.readResponse().bodyText)["uri"] == "/last")
    }

    /// A POST body in either framing, read whole by nginx (it proxies it on with the length it counted).
    @Test(arguments: Framing.allCases)
    func postBodyIsReadWhole(framing: Framing) throws {
        let rig = try Rig()
        defer { rig.stop() }
        let c = try rig.client()
        let body = TestOrigin.pattern(200_000, seed: 3)
        let (header, bytes) = Self.framed(body, framing)
        try c.send("POST /post HTTP/1.1\r\nHost: x\r\n\(header)\r\n")
        try c.send(bytes)
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r.bodyText == "posted length=200000 auth=Bearer at-1\n", "\(r.bodyText)")
    }

    /// bearerd answers `100 Continue` itself; the body then reaches nginx whole.
    @Test func expect100ContinueBodyArrives() throws {
        let rig = try Rig()
        defer { rig.stop() }
        let c = try rig.client()
        let body = TestOrigin.pattern(70_000, seed: 5)
        try c.send("PUT /put/e HTTP/1.1\r\nHost: x\r\nContent-Length: \(body.count)\r\nExpect: 100-continue\r\n\r\n")
        let interim = try c.readRawHead()
        #expect(interim.hasPrefix("HTTP/1.1 100 "), "\(interim)")
        try c.send(body)
        let r = try c.readResponse()
        #expect(r.status == 201)
        #expect(rig.stored("e") == body)
    }

    /// nginx refuses `at-1` on `/reject/`: bearerd refreshes and replays with `at-2`, the body
    /// too, and the client sees only the replay's answer.
    @Test func rejectionIsRefreshedAndReplayed() throws {
        let rig = try Rig()
        defer { rig.stop() }
        let c = try rig.client()
        try c.send("POST /reject/x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        let r = try c.readResponse()
        #expect(r.status == 200, "\(r.bodyText)")
        #expect(r.bodyText.contains("auth=Bearer at-2"), "\(r.bodyText)")
        #expect(rig.tokens.issued == ["at-1", "at-2"], "\(rig.tokens.issued)")
        try c.send("GET /reject/y HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try c.readResponse().bodyText.contains("auth=Bearer at-2"))
    }

    /// curl on both ends of the framing bearerd parses: a chunked upload from stdin, a large file
    /// back with nginx's Content-Length, the same file gzip-compressed (nginx sends it chunked),
    /// HEAD, and two requests on one curl connection.
    @Test func curlThroughBearerdToNginx() throws {
        let rig = try Rig()
        defer { rig.stop() }
        let body = Data(TestOrigin.pattern(2 << 20, seed: 11))
        let up = try Curl.run(["-o", "/dev/null", "-H", "Transfer-Encoding: chunked", "-T", "-", rig.url + "/put/c"], stdin: body)
        #expect(up.status == 0, "\(up.stderr)")
        #expect(rig.stored("c") == Array(body), "nginx stored \(rig.stored("c").count) bytes")
        let dir = try RunningBearerd.tempDir("curl-nginx")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let plain = try Curl.run(["-o", dir + "/plain", rig.url + "/put/c"])
        #expect(plain.status == 0, "\(plain.stderr)")
        #expect((try? Data(contentsOf: URL(fileURLWithPath: dir + "/plain"))) == body)
        let gz = try Curl.run(["--compressed", "-D", dir + "/gz-head", "-o", dir + "/gz", rig.url + "/gz/put/c"])
        #expect(gz.status == 0, "\(gz.stderr)")
        let gzHead = ((try? String(contentsOfFile: dir + "/gz-head", encoding: .utf8)) ?? "").lowercased()
        #expect(gzHead.contains("content-encoding: gzip") && gzHead.contains("transfer-encoding: chunked"), "\(gzHead)")
        #expect((try? Data(contentsOf: URL(fileURLWithPath: dir + "/gz"))) == body)
        let head = try Curl.run(["-I", rig.url + "/put/c"])
        #expect(head.body.lowercased().contains("content-length: \(body.count)"), "\(head.body)")
        // Both answers (curl writes its `-w` line after each), over one upstream connection.
        let two = try Curl.run([rig.url + "/one", rig.url + "/two"])
        let words = two.stdout.split(whereSeparator: { $0 == " " || $0 == "\n" })
        #expect(words.filter { $0.hasPrefix("uri=") } == ["uri=/one", "uri=/two"], "\(two.stdout)")
        let conns = Set(words.filter { $0.hasPrefix("conn=") })
        #expect(conns.count == 1, "one upstream connection for both: \(two.stdout)")
    }
}
