import BearerdHTTP
import BearerdIO
import Dispatch
import Foundation
import BearerdTestSupport
import Testing
@testable import BearerdProxy
@testable import BearerdConfig

/// How a client connection ends after an answer that closes it (RFC 9112 §9.6): at once when the
/// client sent its request whole and nothing after it, lingering for the client's FIN otherwise.
@Suite("Frontend close after the last answer", .serialized)
struct FrontendCloseTests {
    @Test func theCloseModeLingersOnlyWhileTheClientMayStillBeSending() {
        #expect(FrontendConnection.closeMode(requestComplete: true, bufferedBytes: 0) == .lingerIfInputPending)
        // A body still on its way (an early answer), or more requests pipelined behind this one.
        #expect(FrontendConnection.closeMode(requestComplete: false, bufferedBytes: 0) == .linger)
        #expect(FrontendConnection.closeMode(requestComplete: true, bufferedBytes: 1) == .linger)
    }

    /// `bearerd_open_connections` (the loop's frontends), read on the loops.
    static func openConnections(_ server: BearerdServer) -> Int {
        let done = DispatchSemaphore(value: 0)
        let box = Box()
        server.collectMetrics { m in
            box.set(m.openConnections)
            done.signal()
        }
        done.wait()
        return box.value
    }

    final class Box: @unchecked Sendable {  // @unchecked: under `lock`
        private let lock = NSLock()
        private var n = 0
        func set(_ v: Int) { lock.withLock { n = v } }
        var value: Int { lock.withLock { n } }
    }

    /// The client reads its `Connection: close` answer and keeps its socket open (no FIN): the
    /// server closes its socket at once, it does not half-close and wait up to 2 s for the
    /// client's FIN. A byte the client sends afterwards meets a closed socket (a reset).
    @Test(arguments: [IOModeSetting.poller, .sources])
    func aCompleteRequestsCloseAnswerClosesWithoutWaitingForTheClientsFIN(io: IOModeSetting) throws {
        let origin = try TestOrigin { _ in .response(status: 200, headers: [("Content-Type", "text/plain")], body: Array("ok".utf8)) }
        defer { origin.stop() }
        let proxy = try FrontendPipeliningTests.Proxy(origin: origin.port, io: io)
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r.bodyText == "ok")
        // Well within the 2 s a lingering close would wait for the client's FIN.
        var open = Self.openConnections(proxy.server)
        for _ in 0..<100 where open != 0 {
            usleep(10_000)
            open = Self.openConnections(proxy.server)
        }
        #expect(open == 0, "the connection closed without the client's FIN")
        #expect(c.isClosedByPeer(within: 1))
    }

    /// A request with `Connection: close` followed by a pipelined one: the client may still be
    /// sending, so the server half-closes and lingers; the client reads the whole answer, and
    /// the bytes it sends meanwhile are read and dropped (no reset), until its FIN.
    @Test(arguments: [IOModeSetting.poller, .sources])
    func anAnswerWithInputBehindItLingersUntilTheClientsFIN(io: IOModeSetting) throws {
        let origin = try TestOrigin { _ in .response(status: 200, headers: [("Content-Type", "text/plain")], body: Array("ok".utf8)) }
        defer { origin.stop() }
        let proxy = try FrontendPipeliningTests.Proxy(origin: origin.port, io: io)
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(c.isClosedByPeer(within: 2), "half-closed: the client sees the EOF")
        try c.send("more bytes the server drops while lingering")
        #expect(Self.openConnections(proxy.server) == 1, "lingering for the client's FIN")
        c.shutdownWrite()
        var open = 1
        for _ in 0..<100 where open != 0 {
            usleep(10_000)
            open = Self.openConnections(proxy.server)
        }
        #expect(open == 0)
        #expect(origin.requests.map(\.head.target) == ["/a"])
    }
}
