import BearerdHTTP
import BearerdIO
import Dispatch
import Foundation
import BearerdTestSupport
import Testing
@testable import BearerdProxy
@testable import BearerdConfig

/// The pool's shell over real loopback sockets: what `BackendPool.StateMachine` decides is
/// carried out on real connections to a `TestOrigin`.
@Suite("BackendPool shell over loopback", .serialized)
struct BackendPoolShellTests {
    /// Records one exchange's upstream events; `done` is signalled at its end or failure.
    final class Exchange: BackendConnectionDelegate, @unchecked Sendable {  // @unchecked: touched on the loop, read after `done`
        var status = 0
        var body: [UInt8] = []
        var ended = false
        var failure: ChannelError?
        let done = DispatchSemaphore(value: 0)

        func backendResponseHead(_ head: HTTPResponseHead, framing: HTTP1BodyFraming, endStream: Bool) { status = head.status }
        func backendBody(_ bytes: UnsafeRawBufferPointer) { body += bytes }
        func backendEnd(trailers: HTTPHeaders?) { ended = true; done.signal() }
        func backendReadComplete() {}
        func backendFailed(_ error: ChannelError, reused: Bool, responseBytesSeen: Bool, unprocessed: Bool) { failure = error; done.signal() }
        func backendWritable() {}
        func backendTunnelBytes(_ raw: UnsafeRawBufferPointer) {}
        func backendTunnelEnded() {}
    }

    let loop = EventLoop(index: 90)

    func onLoop<T>(_ body: @escaping () -> T) -> T {
        let sem = DispatchSemaphore(value: 0)
        nonisolated(unsafe) var result: T?
        loop.execute {
            result = body()
            sem.signal()
        }
        _ = sem.wait(timeout: .now() + 10)
        return result!
    }

    /// Polls `condition` on the loop until it holds (at most 5 s, 500 tries).
    func eventually(_ condition: @escaping () -> Bool) -> Bool {
        for _ in 0..<500 {
            if onLoop(condition) { return true }
            usleep(10_000)
        }
        return false
    }

    func target(host: String = "127.0.0.1", port: UInt16, idle: Duration = .seconds(60), maxIdle: Int = 64) throws -> UpstreamTarget {
        var timeouts = RouteTimeouts()
        timeouts.idle = idle
        let t = try UpstreamTarget(url: UpstreamURL(scheme: "http", host: host, port: port, basePath: ""), tls: nil,
                                   timeouts: timeouts, http2: .off)
        t.maxIdle = maxIdle
        return t
    }

    func origin() throws -> TestOrigin {
        try TestOrigin { _ in .response(status: 200, headers: [], body: Array("ok".utf8)) }
    }

    /// Acquires a stream for `target`, sends a GET on it and returns the stream once the
    /// response ended (not yet released).
    func exchange(_ pool: BackendPool, _ target: UpstreamTarget) -> (UpstreamStream?, Exchange) {
        let ex = Exchange()
        nonisolated(unsafe) var stream: UpstreamStream?
        loop.execute {
            pool.acquire(target) { result in
                switch result {
                case .success(let s):
                    stream = s
                    s.assign(to: ex)
                    var head = HTTPRequestHead(method: "GET", target: "/")
                    head.headers.add("Host", "127.0.0.1")
                    s.sendHead(head, body: .none, upgrade: false, teTrailers: false, credential: nil)
                case .failure(let e):
                    ex.failure = e
                    ex.done.signal()
                }
            }
        }
        #expect(ex.done.wait(timeout: .now() + 10) == .success)
        return (onLoop { stream }, ex)
    }

    @Test func aReleasedConnectionCarriesTheNextRequest() throws {
        let o = try origin()
        defer { o.stop() }
        let pool = onLoop { BackendPool(loop: loop) }
        let t = try target(port: o.port)
        let (first, ex1) = exchange(pool, t)
        #expect(ex1.status == 200 && ex1.ended)
        let firstConn = try #require(first as? BackendConnection)
        #expect(!firstConn.reused)
        onLoop { firstConn.release() }
        #expect(onLoop { pool.idleCount } == 1)
        let (second, ex2) = exchange(pool, t)
        #expect(ex2.status == 200 && ex2.ended)
        #expect(second === firstConn)
        #expect(onLoop { firstConn.reused })
        #expect(o.connectionCount == 1)
        onLoop { pool.closeAll() }
    }

    @Test func anIdleConnectionClosesAtTheIdleTimeout() throws {
        let o = try origin()
        defer { o.stop() }
        let pool = onLoop { BackendPool(loop: loop) }
        let t = try target(port: o.port, idle: .milliseconds(200))
        let (first, _) = exchange(pool, t)
        let conn = try #require(first as? BackendConnection)
        onLoop { conn.release() }
        #expect(onLoop { pool.idleCount } == 1)
        #expect(eventually { pool.idleCount == 0 }, "the idle connection never closed")
        #expect(onLoop { conn.channel?.isClosed ?? true })
        // The next request opens a new connection.
        let (second, ex) = exchange(pool, t)
        #expect(ex.ended && second !== conn)
        #expect(o.connectionCount == 2)
        onLoop { pool.closeAll() }
    }

    @Test func idleConnectionsBeyondMaxIdleAreClosed() throws {
        let o = try TestOrigin { _ in .delayed(0.2, .response(status: 200, headers: [], body: [])) }
        defer { o.stop() }
        let pool = onLoop { BackendPool(loop: loop) }
        let t = try target(port: o.port, maxIdle: 1)
        // Two requests at once: two connections (HTTP/1.1, no pipelining).
        nonisolated(unsafe) var results: [(UpstreamStream?, Exchange)] = []
        let group = DispatchGroup()
        for _ in 0..<2 {
            group.enter()
            DispatchQueue.global().async {
                let r = exchange(pool, t)
                onLoop { results.append(r) }
                group.leave()
            }
        }
        #expect(group.wait(timeout: .now() + 10) == .success)
        let conns = onLoop { results.compactMap { $0.0 as? BackendConnection } }
        #expect(conns.count == 2 && conns[0] !== conns[1])
        onLoop { for c in conns { c.release() } }
        #expect(onLoop { pool.idleCount } == 1)
        #expect(onLoop { conns.filter { $0.channel?.isClosed ?? true }.count } == 1)
        onLoop { pool.closeAll() }
    }

    /// `http2: prior_knowledge` on https and a server whose ALPN picks HTTP/1.1: the request
    /// fails at once (it must not wait forever for a connection that closed while connecting).
    @Test func aPriorKnowledgeRouteWhoseServerRefusesH2FailsTheRequest() throws {
        let pki = try TestPKI.generate()
        defer { pki.remove() }
        let o = try TestOrigin(tls: try pki.serverContext(alpn: ["http/1.1"])) { _ in .response(status: 200, headers: [], body: []) }
        defer { o.stop() }
        let pool = onLoop { BackendPool(loop: loop) }
        let t = try UpstreamTarget(url: UpstreamURL(scheme: "https", host: "127.0.0.1", port: o.port, basePath: ""),
                                   tls: TLSSettings(caFile: pki.caFile), timeouts: RouteTimeouts(), http2: .priorKnowledge)
        let (stream, ex) = exchange(pool, t)
        #expect(stream == nil)
        #expect("\(ex.failure.map { "\($0)" } ?? "none")".contains("did not select h2"))
        #expect(onLoop { pool.pending(t) } == (0, 0))
    }

    @Test func aCancelledWaiterOpensNothingAndIsNeverResumed() throws {
        let o = try origin()
        defer { o.stop() }
        let pool = onLoop { BackendPool(loop: loop) }
        // A name (not in the resolver's cache: the port is new), so it resolves off the loop and
        // the cancel comes first; a numeric address resolves at once.
        let t = try target(host: "localhost", port: o.port)
        nonisolated(unsafe) var resumed = 0
        onLoop {
            let ticket = pool.acquire(t) { result in
                resumed += 1
                if case .success(let s) = result { s.close() }
            }
            #expect(ticket != nil)
            ticket?.cancel()
        }
        // The name resolves off the loop; then the machine says nobody wants the connection.
        #expect(eventually { pool.pending(t).attempts == 0 }, "the attempt was never dropped")
        #expect(onLoop { resumed } == 0)
        #expect(o.connectionCount == 0)
        // The pool still serves the next request.
        let (_, ex) = exchange(pool, t)
        #expect(ex.ended && ex.status == 200)
        #expect(o.connectionCount == 1)
        onLoop { pool.closeAll() }
    }

    // MARK: - Body bytes relayed from the read buffer (BackendConnection.channelRead)

    /// Records a 101 and every byte after it: those the parser held, then the tunnel's.
    final class UpgradeExchange: BackendConnectionDelegate, @unchecked Sendable {  // @unchecked: touched on the loop, read after `done`
        weak var connection: BackendConnection?
        var status = 0
        var tunnel: [UInt8] = []
        var bodyBytes = 0
        let done = DispatchSemaphore(value: 0)

        func backendResponseHead(_ head: HTTPResponseHead, framing: HTTP1BodyFraming, endStream: Bool) {
            status = head.status
            if head.status == 101, let c = connection { tunnel += c.switchProtocols() }
        }
        func backendBody(_ bytes: UnsafeRawBufferPointer) { bodyBytes += bytes.count }
        func backendEnd(trailers: HTTPHeaders?) {}
        func backendReadComplete() {}
        func backendFailed(_ error: ChannelError, reused: Bool, responseBytesSeen: Bool, unprocessed: Bool) { done.signal() }
        func backendWritable() {}
        func backendTunnelBytes(_ raw: UnsafeRawBufferPointer) { tunnel += raw }
        func backendTunnelEnded() { done.signal() }
    }

    static let payload: [UInt8] = (0..<40_000).map { UInt8(truncatingIfNeeded: $0 &* 13 &+ 1) }

    /// A 101 and 40 KB of tunnel bytes in one write: the bytes past the parser's first piece
    /// reach the tunnel, in order, none lost or doubled.
    @Test func bytesAfterA101InTheSameReadGoToTheTunnel() throws {
        let o = try ScriptedOrigin(handler: { _ in
            [.send(Array("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n".utf8) + Self.payload), .close]
        })
        defer { o.stop() }
        let pool = onLoop { BackendPool(loop: loop) }
        let t = try target(port: o.port)
        let ex = UpgradeExchange()
        loop.execute {
            pool.acquire(t) { result in
                guard case .success(let s) = result, let conn = s as? BackendConnection else {
                    ex.done.signal()
                    return
                }
                ex.connection = conn
                s.assign(to: ex)
                var head = HTTPRequestHead(method: "GET", target: "/ws")
                head.headers.add("Host", "127.0.0.1")
                head.headers.add("Upgrade", "websocket")
                head.headers.add("Connection", "Upgrade")
                s.sendHead(head, body: .none, upgrade: true, teTrailers: false, credential: nil)
            }
        }
        #expect(ex.done.wait(timeout: .now() + 10) == .success)
        #expect(onLoop { ex.status } == 101)
        #expect(onLoop { ex.bodyBytes } == 0)
        let tunnel = onLoop { ex.tunnel }
        #expect(tunnel.count == Self.payload.count)
        #expect(tunnel == Self.payload ? true : false, "the tunnel bytes differ from what the upstream sent")
        onLoop { pool.closeAll() }
    }

    /// Content-Length and chunked bodies sent with their head in one write come out whole.
    @Test func bodiesAfterAHeadInTheSameReadArriveWhole() throws {
        var chunkedBytes = Array("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".utf8)
        for (from, to) in [(0, 9_000), (9_000, 9_001), (9_001, 40_000)] {
            chunkedBytes += Array("\(String(to - from, radix: 16))\r\n".utf8) + Self.payload[from..<to] + Array("\r\n".utf8)
        }
        chunkedBytes += Array("0\r\n\r\n".utf8)
        let chunked = chunkedBytes
        let fixed = ScriptedOrigin.response(status: 200, body: Self.payload)
        let o = try ScriptedOrigin(handler: { r in [.send(r.indexOnConnection == 0 ? fixed : chunked)] })
        defer { o.stop() }
        let pool = onLoop { BackendPool(loop: loop) }
        let t = try target(port: o.port)
        let (first, ex1) = exchange(pool, t)
        #expect(ex1.status == 200 && ex1.ended && ex1.body.count == Self.payload.count)
        #expect(ex1.body == Self.payload ? true : false, "the Content-Length body differs")
        let conn = try #require(first as? BackendConnection)
        onLoop { conn.release() }
        let (second, ex2) = exchange(pool, t)
        #expect(second === conn, "the connection was not reused after a direct body")
        #expect(ex2.status == 200 && ex2.ended && ex2.body.count == Self.payload.count)
        #expect(ex2.body == Self.payload ? true : false, "the chunked body differs")
        onLoop { pool.closeAll() }
    }
}
