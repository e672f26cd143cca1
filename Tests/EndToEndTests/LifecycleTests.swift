import Foundation
import Logging
import Testing
import BearerdHTTP
import BearerdIO
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

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

    @Test func reloadAddsAndRemovesListenersWithoutDroppingConnections() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let first = proxy.port
        let kept = try TestClient(port: first)
        try kept.send("GET /1 HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try kept.readResponse().status == 200)

        // Add a second listener.
        let second = try RunningBearerd.freePort()
        var next = proxy.server.runtime.config
        next.listeners.append(ListenerConfig(address: .tcp(host: "127.0.0.1", port: second)))
        try proxy.server.reload(next)
        #expect(proxy.server.boundAddresses.map(\.port) == [first, second])
        do { #expect(try TestClient.get(port: second, path: "/2").status == 200) } catch { print("LOGS:\n" + proxy.logs.text); throw error }
        try kept.send("GET /3 HTTP/1.1\r\nHost: x\r\n\r\n")
        #expect(try kept.readResponse().status == 200)

        // Remove the first: it stops accepting, its open connection keeps working.
        next.listeners.removeFirst()
        try proxy.server.reload(next)
        #expect(proxy.server.boundAddresses.map(\.port) == [second])
        Thread.sleep(forTimeInterval: 0.1)
        #expect((try? TestClient.get(port: first, path: "/gone")) == nil)
        try kept.send("GET /4 HTTP/1.1\r\nHost: x\r\n\r\n")
        let r = try kept.readResponse()
        #expect(r.status == 200)
        #expect(r.bodyText.contains("target=/4"))
        #expect(try TestClient.get(port: second, path: "/5").status == 200)
    }

    @Test func reloadThatCannotBindChangesNothing() throws {
        let a = try TestOrigin { _ in .response(status: 200, headers: [], body: Array("a".utf8)) }
        let b = try TestOrigin { _ in .response(status: 200, headers: [], body: Array("b".utf8)) }
        defer { a.stop(); b.stop() }
        let proxy = try TestProxy(routes: [route(origin: a.port)])
        defer { proxy.stop() }
        var next = proxy.server.runtime.config
        next.routes = [route(origin: b.port)]
        // The origin's port is taken: binding it fails.
        next.listeners.append(ListenerConfig(address: .tcp(host: "127.0.0.1", port: a.port), line: 7))
        #expect {
            try proxy.server.reload(next)
        } throws: { e in
            let errors = (e as? ConfigErrors)?.errors ?? []
            return errors.count == 1 && errors[0].key == "listen[1]" && errors[0].line == 7
                && errors[0].description.contains("cannot listen on 127.0.0.1:\(a.port)")
        }
        // The old routes and listeners are in force.
        #expect(try TestClient.get(port: proxy.port, path: "/").bodyText == "a")
        #expect(proxy.server.boundAddresses.count == 1)
    }

    @Test func reloadChangesAKeptListenersAccessControl() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])  // allowed_hosts: ["*"]
        defer { proxy.stop() }
        #expect(try TestClient.get(port: proxy.port, path: "/", headers: [("Host", "intranet.example")]).status == 200)
        var next = proxy.server.runtime.config
        next.listeners[0].allowedHosts = []
        try proxy.server.reload(next)
        // The same listener now checks Host on new connections.
        #expect(try TestClient.get(port: proxy.port, path: "/", headers: [("Host", "intranet.example")]).status == 421)
        #expect(try TestClient.get(port: proxy.port, path: "/", headers: [("Host", "localhost")]).status == 200)
    }

    @Test func reloadAppliesANewSocketFileMode() throws {
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let path = try RunningBearerd.tempDir("sock") + "/api.sock"  // a directory of its own: never one others can write
        let config = BearerdConfig(file: "<test>", listen: [.unix(path: path)], loops: 1, routes: [route(origin: origin.port)])
        let server = try BearerdServer(config: config, logger: .init(label: "t") { _ in SwiftLogNoOpLogHandler() })
        try server.start()
        defer {
            let d = DispatchSemaphore(value: 0)
            server.shutdown(grace: .seconds(1)) { d.signal() }
            d.wait()
        }
        func mode() -> UInt32 {
            var st = stat()
            return lstat(path, &st) == 0 ? UInt32(st.st_mode) & 0o777 : 0
        }
        #expect(mode() == 0o660)
        var next = config
        next.listeners[0].mode = 0o600
        try server.reload(next)
        #expect(mode() == 0o600)
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
        let path = try RunningBearerd.tempDir("sock") + "/api.sock"  // a directory of its own: never one others can write
        let config = BearerdConfig(file: "<test>", listen: [.unix(path: path)], loops: 1, routes: [route(origin: origin.port)])
        let server = try BearerdServer(config: config, logger: .init(label: "t") { _ in SwiftLogNoOpLogHandler() })
        try server.start()
        defer {
            let d = DispatchSemaphore(value: 0)
            server.shutdown(grace: .seconds(1)) { d.signal() }
            d.wait()
        }
        let text = try AccessControlTests.unixRequest(path)
        #expect(text.hasPrefix("HTTP/1.1 200"))
        #expect(text.contains("x-forwarded-for: unix"))
    }
}

