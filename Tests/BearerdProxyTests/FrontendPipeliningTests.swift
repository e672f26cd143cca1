import BearerdHTTP
import BearerdIO
import Dispatch
import Foundation
import BearerdTestSupport
import Testing
@testable import BearerdProxy
@testable import BearerdConfig

/// HTTP/1.1 pipelining through `FrontendConnection` (RFC 9112 §9.3.2): requests that arrive
/// before the previous response was sent are answered in order, each over a connection the
/// upstream pool hands out as the previous exchange releases it.
@Suite("Frontend HTTP/1.1 pipelining", .serialized)
struct FrontendPipeliningTests {
    final class Proxy {
        let server: BearerdServer
        let logs = CapturedLogs()
        var port: UInt16 { server.boundAddresses[0].port }

        init(origin: UInt16, io: IOModeSetting? = nil) throws {
            let route = RouteConfig(match: "/", host: nil, stripPrefix: false,
                                    upstream: UpstreamURL(scheme: "http", host: "127.0.0.1", port: origin, basePath: ""),
                                    tls: nil, timeouts: RouteTimeouts())
            var config = BearerdConfig(file: "<test>", listen: [.tcp(host: "127.0.0.1", port: 0)], admin: nil, loops: 1,
                                       limits: HTTP1Limits(), frontendTimeouts: FrontendTimeouts(), sessions: [], routes: [route])
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

    @Sendable static func echo(_ r: TestOrigin.Request) -> TestOrigin.Reply {
        .response(status: 200, headers: [("Content-Type", "text/plain")], body: Array("\(r.head.method) \(r.head.target) \(r.bodyCount)".utf8))
    }

    static let pipeline = "GET /1 HTTP/1.1\r\nHost: x\r\n\r\n"
        + "HEAD /2 HTTP/1.1\r\nHost: x\r\n\r\n"
        + "POST /3 HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
        + "POST /4 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        + "GET /5 HTTP/1.1\r\nHost: x\r\n\r\n"

    func readAll(_ c: TestClient) throws -> [TestClient.Response] {
        let methods = ["GET", "HEAD", "POST", "POST", "GET"]
        return try methods.map { try c.readResponse(method: $0) }
    }

    func checkAnswers(_ responses: [TestClient.Response]) {
        #expect(responses.map(\.status) == [200, 200, 200, 200, 200])
        #expect(responses[0].bodyText == "GET /1 0")
        #expect(responses[1].body.isEmpty)
        #expect(responses[2].bodyText == "POST /3 5")
        #expect(responses[3].bodyText == "POST /4 3")
        #expect(responses[4].bodyText == "GET /5 0")
    }

    @Test func pipelinedRequestsInOneWriteShareOneUpstreamConnection() throws {
        let origin = try TestOrigin { r in
            // The first answer is slow: the others wait behind it, in order.
            r.head.target == "/1" ? .delayed(0.1, Self.echo(r)) : Self.echo(r)
        }
        defer { origin.stop() }
        let proxy = try Proxy(origin: origin.port)
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send(Self.pipeline)
        checkAnswers(try readAll(c))
        #expect(origin.requests.map(\.head.target) == ["/1", "/2", "/3", "/4", "/5"])
        #expect(origin.requests[3].body == Array("abc".utf8))
        // Each exchange released the connection before the next one took it from the pool.
        #expect(origin.connectionCount == 1)
    }

    @Test func pipelinedRequestsSplitAtEveryBoundaryAreAnsweredInOrder() throws {
        let origin = try TestOrigin(handler: Self.echo)
        defer { origin.stop() }
        let proxy = try Proxy(origin: origin.port)
        defer { proxy.stop() }
        let bytes = Array(Self.pipeline.utf8)
        for piece in [1, 7, 64] {
            let c = try TestClient(port: proxy.port)
            var i = 0
            while i < bytes.count {
                try c.send(Array(bytes[i..<min(i + piece, bytes.count)]))
                i += piece
            }
            checkAnswers(try readAll(c))
        }
        #expect(origin.requests.count == 15)
        #expect(origin.connectionCount == 1)
    }

    @Test func aResponseThatClosesItsConnectionGivesTheNextPipelinedRequestANewOne() throws {
        let origin = try TestOrigin { r in
            .response(status: 200, headers: [("Connection", "close")], body: Array("\(r.head.method) \(r.head.target) \(r.bodyCount)".utf8))
        }
        defer { origin.stop() }
        let proxy = try Proxy(origin: origin.port)
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send(Self.pipeline)
        checkAnswers(try readAll(c))
        // Not reusable: the pool closed each connection instead of parking it.
        #expect(origin.connectionCount == 5)
    }
}
