import Foundation
import Testing
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdHTTP2
#if canImport(Glibc)
import Glibc
#endif

/// An origin that answers every handshake with a 101 (or, per `reject`, a 401 first) and then
/// echoes every byte back until the peer closes: the upstream side of a WebSocket tunnel, at the
/// byte level (framing is the endpoints' business, not the proxy's). Records each handshake head.
final class TunnelEchoOrigin: @unchecked Sendable {  // @unchecked: `heads` guarded by `lock`
    let fd: Int32
    let port: UInt16
    private let lock = NSLock()
    private var _heads: [String] = []
    var heads: [String] { lock.withLock { _heads } }
    /// Answers a handshake carrying this Authorization value with 401 invalid_token.
    let reject: String?

    init(reject: String? = nil) throws {
        self.reject = reject
        let s = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(s, $0, len) } }
        listen(s, 16)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(s, $0, &len) } }
        fd = s
        port = UInt16(bigEndian: addr.sin_port)
        let t = Thread { [self] in acceptLoop() }
        t.start()
    }

    func stop() { shutdown(fd, Int32(SHUT_RDWR)); close(fd) }

    private func acceptLoop() {
        while true {
            let c = accept(fd, nil, nil)
            if c < 0 { return }
            Thread { [self] in serve(c) }.start()
        }
    }

    private func serve(_ c: Int32) {
        defer { close(c) }
        var buf = [UInt8](repeating: 0, count: 65536)
        while true {
            // One handshake head.
            var head: [UInt8] = []
            var rest: [UInt8] = []
            while true {
                let n = buf.withUnsafeMutableBytes { recv(c, $0.baseAddress, $0.count, 0) }
                if n <= 0 { return }
                head.append(contentsOf: buf[0..<n])
                if let r = head.firstRange(of: [13, 10, 13, 10]) {
                    rest = Array(head[r.upperBound...])
                    head = Array(head[..<r.upperBound])
                    break
                }
            }
            let text = String(decoding: head, as: UTF8.self)
            lock.withLock { _heads.append(text) }
            if let reject, text.contains("Authorization: \(reject)\r\n") {
                let body = "stale"
                let resp = "HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer error=\"invalid_token\"\r\nContent-Length: \(body.utf8.count)\r\n\r\n\(body)"
                _ = resp.withCString { send(c, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
                continue
            }
            let resp = "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: test\r\n\r\n"
            _ = resp.withCString { send(c, $0, strlen($0), Int32(MSG_NOSIGNAL)) }
            if !rest.isEmpty { _ = rest.withUnsafeBytes { send(c, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) } }
            while true {
                let n = buf.withUnsafeMutableBytes { recv(c, $0.baseAddress, $0.count, 0) }
                if n <= 0 { return }
                var off = 0
                while off < n {
                    let m = buf[off..<n].withUnsafeBytes { send(c, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                    if m <= 0 { return }
                    off += m
                }
            }
        }
    }
}

@Suite("WebSocket tunnels (docs/architecture.md §5)", .serialized)
struct WebSocketTunnelTests {
    static let handshake = "GET /ws/chat HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"

    /// Sends `payload` from one thread while reading the same number of bytes back.
    static func echo(_ c: TestClient, _ payload: [UInt8]) throws -> [UInt8] {
        let writer = Thread {
            var off = 0
            while off < payload.count {
                let n = payload[off...].withUnsafeBytes { send(c.fd, $0.baseAddress, min($0.count, 65536), Int32(MSG_NOSIGNAL)) }
                if n <= 0 { return }
                off += n
            }
        }
        writer.start()
        var got: [UInt8] = []
        got.reserveCapacity(payload.count)
        var buf = [UInt8](repeating: 0, count: 65536)
        while got.count < payload.count {
            let n = buf.withUnsafeMutableBytes { recv(c.fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            got.append(contentsOf: buf[0..<n])
        }
        return got
    }

    @Test func tunnelsBothWaysWithTheTokenInTheHandshake() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let origin = try TunnelEchoOrigin()
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [withSession(route("/ws/", origin: origin.port))], sessions: [scriptedSession(tokens)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send(Self.handshake)
        let head = try c.readRawHead()
        #expect(head.hasPrefix("HTTP/1.1 101"))
        #expect(head.contains("Upgrade: websocket"))
        #expect(head.contains("Connection: Upgrade"))
        #expect(head.contains("Sec-WebSocket-Accept: test"))
        // 4 MiB through the tunnel and back: backpressure both ways, nothing lost or reordered.
        var payload = [UInt8](repeating: 0, count: 4 << 20)
        for i in payload.indices { payload[i] = UInt8(truncatingIfNeeded: i &* 31 &+ i >> 9) }
        let back = try Self.echo(c, payload)
        #expect(back.count == payload.count)
        #expect(back == payload)
        let seen = try #require(origin.heads.first)
        #expect(seen.contains("Upgrade: websocket\r\n"))
        #expect(seen.contains("Connection: Upgrade\r\n"))
        #expect(seen.contains("Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"))
        #expect(seen.contains("Authorization: Bearer \(try #require(tokens.latest))\r\n"))
        // The client closing ends the tunnel (and the upstream side with it).
        c.shutdownWrite()
        #expect(c.isClosedByPeer(within: 5))
    }

    @Test func aRejectedHandshakeIsReplayedWithAFreshToken() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        // The first token issued is rejected by the origin.
        let origin = try TunnelEchoOrigin(reject: "Bearer at-1")
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [withSession(route("/ws/", origin: origin.port))], sessions: [scriptedSession(tokens)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send(Self.handshake)
        let head = try c.readRawHead()
        #expect(head.hasPrefix("HTTP/1.1 101"))
        #expect(try Self.echo(c, Array("ping".utf8)) == Array("ping".utf8))
        let heads = origin.heads
        #expect(heads.count == 2)
        #expect(heads.last?.contains("Authorization: Bearer at-2\r\n") == true)
    }

    @Test func otherUpgradesAreRefusedAndH2CUpgradeIsIgnored() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /x HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: TLS/1.2\r\n\r\n")
        let refused = try c.readResponse()
        #expect(refused.status == 400)
        #expect(refused.bodyText.contains("unsupported_upgrade"))
        #expect(origin.requests.isEmpty)
        // RFC 9113 §3.1: the h2c upgrade is deprecated; the request is served in HTTP/1.1.
        let d = try TestClient(port: proxy.port)
        try d.send("GET /y HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n")
        let served = try d.readResponse()
        #expect(served.status == 200)
        #expect(origin.requests.first?.head.headers["Upgrade"] == nil)
        #expect(origin.requests.first?.head.headers["HTTP2-Settings"] == nil)
        // A WebSocket handshake that is not a GET is refused too.
        let e = try TestClient(port: proxy.port)
        try e.send("POST /z HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nContent-Length: 0\r\n\r\n")
        #expect(try e.readResponse(method: "POST").status == 400)
    }
}

/// A real WebSocket client and server (`Tests/Fixtures/ws_echo.py`, the `websockets` package)
/// through bearerd: a 10 MiB message each way, the token injected into the handshake.
@Suite("WebSocket with real peers", .serialized,
       .enabled(if: PythonFixture.unavailable(modules: ["websockets"]) == nil || ProcessInfo.processInfo.environment["CI"] != nil,
                "\(PythonFixture.unavailable(modules: ["websockets"]) ?? "")"))
struct WebSocketEchoTests {
    struct Echo: Decodable {
        var ok: Bool
        var echoed_bytes: Int
        var whoami: String
    }

    @Test func tenMiBEachWayThroughBearerd() throws {
        let server = try PythonFixture(script: "ws_echo.py", arguments: ["server", "--port", "0"])
        defer { server.stop() }
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let proxy = try TestProxy(routes: [withSession(route("/ws/", origin: server.port, strip: true))], sessions: [scriptedSession(tokens)])
        defer { proxy.stop() }
        let out = try PythonFixture.runClient(script: "ws_echo.py", arguments: ["client", "--url", "ws://127.0.0.1:\(proxy.port)/ws/echo", "--bytes", String(10 << 20)])
        let echo = try JSONDecoder().decode(Echo.self, from: Data(out.utf8))
        #expect(echo.ok)
        #expect(echo.echoed_bytes == 10 << 20)
        #expect(echo.whoami == "Bearer \(try #require(tokens.latest))")
    }
}

/// RFC 8441: a WebSocket from an HTTP/2 client (extended CONNECT), tunnelled to an HTTP/1.1
/// upgrade upstream. The client is an nghttp2 session (`HTTP2Session`) over a blocking socket.
@Suite("WebSocket over HTTP/2", .serialized)
struct ExtendedConnectTests {
    @Test func extendedConnectBecomesAnHTTP11Upgrade() throws {
        let tokens = try ScriptedTokenEndpoint()
        defer { tokens.stop() }
        let origin = try TunnelEchoOrigin()
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [withSession(route("/ws/", origin: origin.port))], sessions: [scriptedSession(tokens)])
        defer { proxy.stop() }

        let client = try H2TestClient(port: proxy.port)
        let h2 = client.session
        func pump(until done: ([HTTP2Event]) -> Bool) throws { try client.pump(until: done) }
        var events: [HTTP2Event] { client.events }
        try pump { $0.contains { if case .remoteSettings(_, true) = $0 { return true }; return false } }
        let id = try h2.submitRequest([
            HTTPField(name: ":method", value: "CONNECT"), HTTPField(name: ":protocol", value: "websocket"),
            HTTPField(name: ":scheme", value: "http"), HTTPField(name: ":authority", value: "localhost"),
            HTTPField(name: ":path", value: "/ws/chat"), HTTPField(name: "sec-websocket-version", value: "13"),
        ], endStream: false)
        try pump { $0.contains { if case .headers(id, _, .response, _) = $0 { return true }; return false } }
        let head = events.compactMap { e -> [HTTPField]? in if case .headers(id, let f, .response, _) = e { return f }; return nil }.first
        #expect(head?.first == HTTPField(name: ":status", value: "200"))
        let payload = Array("frames both ways".utf8)
        payload.withUnsafeBytes { h2.sendData(stream: id, $0) }
        try pump { evs in
            var got: [UInt8] = []
            for case .data(id, let b, _) in evs { got += b }
            return got.count >= payload.count
        }
        var got: [UInt8] = []
        for case .data(id, let b, _) in events { got += b }
        #expect(got == payload)
        let seen = try #require(origin.heads.first)
        #expect(seen.hasPrefix("GET /ws/chat HTTP/1.1\r\n"))
        #expect(seen.contains("Upgrade: websocket\r\n"))
        #expect(seen.contains("Sec-WebSocket-Key: "))
        #expect(seen.lowercased().contains("sec-websocket-version: 13\r\n"))
        #expect(seen.contains("Authorization: Bearer \(try #require(tokens.latest))\r\n"))
        // The client ending its stream ends the tunnel.
        h2.endStream(stream: id, trailers: nil)
        try pump { $0.contains { if case .streamClosed(id, _) = $0 { return true }; return false } }
    }
}
