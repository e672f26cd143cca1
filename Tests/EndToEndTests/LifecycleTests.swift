import Foundation
import Logging
import Testing
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport

@Suite("Reload, shutdown and listeners", .serialized)
struct LifecycleTests {
    @Test func reloadSwapsRoutesWithoutDroppingConnections() throws {
        let a = try TestOrigin { _ in .response(status: 200, headers: [], body: Array("a".utf8)) }
        let b = try TestOrigin { _ in .response(status: 200, headers: [], body: Array("b".utf8)) }
        defer { a.stop(); b.stop() }
        let proxy = try TestProxy(routes: [route(origin: a.port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try c.readResponse().bodyText == "a")
        var next = proxy.server.runtime.config
        next.routes = [route(origin: b.port)]
        try proxy.server.reload(next)
        Thread.sleep(forTimeInterval: 0.1)
        // The same client connection now reaches the new route.
        try c.send("GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try c.readResponse().bodyText == "b")
    }

    @Test func shutdownFinishesInFlightRequestsAndStopsAccepting() throws {
        let origin = try TestOrigin { r in .delayed(0.5, echoHandler(r)) }
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        let port = proxy.port
        let c = try TestClient(port: port)
        try c.send("GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        Thread.sleep(forTimeInterval: 0.1)
        let done = DispatchSemaphore(value: 0)
        proxy.server.shutdown(grace: .seconds(5)) { done.signal() }
        let r = try c.readResponse()
        #expect(r.status == 200)
        #expect(r["Connection"] == "close")
        #expect(done.wait(timeout: .now() + 5) == .success)
        #expect((try? TestClient(port: port)) == nil)
    }

    @Test func unixSocketListener() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("bearerd-\(UUID().uuidString.prefix(8)).sock").path
        let config = BearerdConfig(file: "<test>", listen: [.unix(path: path)], loops: 1, routes: [route(origin: origin.port)])
        let server = try BearerdServer(config: config, logger: .init(label: "t") { _ in SwiftLogNoOpLogHandler() })
        try server.start()
        defer {
            let d = DispatchSemaphore(value: 0)
            server.shutdown(grace: .seconds(1)) { d.signal() }
            d.wait()
        }
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var sun = sockaddr_un()
        sun.sun_family = sa_family_t(AF_UNIX)
        withUnsafeMutableBytes(of: &sun.sun_path) { dst in
            let b = Array(path.utf8)
            dst.copyBytes(from: b)
            dst[b.count] = 0
        }
        let rc = withUnsafePointer(to: &sun) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) } }
        #expect(rc == 0)
        let req = Array("GET /u HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".utf8)
        _ = req.withUnsafeBytes { send(fd, $0.baseAddress, $0.count, 0) }
        var buf = [UInt8](repeating: 0, count: 65536)
        var got: [UInt8] = []
        while true {
            let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            got += buf[0..<n]
        }
        let text = String(decoding: got, as: UTF8.self)
        #expect(text.hasPrefix("HTTP/1.1 200"))
        #expect(text.contains("x-forwarded-for: unix"))
    }
}

