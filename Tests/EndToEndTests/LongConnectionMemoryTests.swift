import Foundation
import Testing
import BearerdHTTP
import BearerdHTTP2
import BearerdTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// The memory of the real `bearerd run` process while one client connection carries hundreds of
/// thousands of requests (a gRPC channel or a keep-alive pool lives for days): after a warm-up,
/// the process's anonymous resident memory must stay flat, whatever the number of requests on
/// the connection. Before the fix every finished HTTP/2 stream stayed allocated in the server's
/// nghttp2 session until the connection closed (~250 bytes per request).
///
/// bearerd runs as a child process (its `/proc/<pid>/status` is measured, not the test's), in
/// the I/O mode `$BEARERD_IO` selects, as every end-to-end test (CI runs the suites once more
/// with `BEARERD_IO=sources`). The origin is nginx over HTTP/1.1.
@Suite("Memory on one long-lived client connection", .serialized,
       .enabled(if: NginxOrigin.isAvailable || ProcessInfo.processInfo.environment["CI"] != nil, "nginx is not installed"))
struct LongConnectionMemoryTests {
    /// Requests before the first measurement: buffers, pools and code paths reach their size.
    static let warmUp = 10_000
    /// Requests between the two measurements, all on the same client connection.
    static let measured = 200_000
    /// Most growth of the anonymous resident memory allowed over `measured` requests. Before the
    /// fix an HTTP/2 connection grew by ~50 MiB here.
    static let boundKiB = 4 * 1024

    struct Memory: CustomStringConvertible {
        var anonKiB: Int
        var rssKiB: Int
        var description: String { "RssAnon \(anonKiB) KiB, VmRSS \(rssKiB) KiB" }
    }

    /// `RssAnon` and `VmRSS` of process `pid` (KiB).
    static func memory(of pid: Int32) throws -> Memory {
        let text = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        func field(_ name: String) -> Int? {
            for line in text.split(separator: "\n") where line.hasPrefix(name + ":") {
                return line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first.flatMap { Int($0) }
            }
            return nil
        }
        guard let anon = field("RssAnon"), let rss = field("VmRSS") else {
            throw NginxOrigin.Failure(description: "no RssAnon/VmRSS in /proc/\(pid)/status")
        }
        return Memory(anonKiB: anon, rssKiB: rss)
    }

    /// nginx (HTTP/1.1) behind a `bearerd run` child; `body` gets bearerd's port and pid.
    static func withProxy(_ tag: String, _ body: (UInt16, Int32) throws -> Void) throws {
        let pki = try TestPKI.generate()
        let nginx = try NginxOrigin(pki: pki)
        defer { nginx.stop() }
        let dir = try RunningBearerd.tempDir(tag)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let port = try RunningBearerd.freePort()
        // One loop: the connection and its upstream connections share it. No access log: a line per
        // request would only slow the test down.
        let b = try RunningBearerd(config: """
            listen: [127.0.0.1:\(port)]
            loops: 1
            log: { level: warning, access: false }
            routes:
              - match: /
                upstream: http://127.0.0.1:\(nginx.h1Port)
            """, dir: dir)
        defer { _ = b.stop() }
        let first = try #require(b.waitServing(port: port, path: "/ready"), "bearerd did not serve: \(b.logs)")
        #expect(first.status == 200)
        try body(port, b.process.processIdentifier)
        #expect(b.process.isRunning, "bearerd exited: \(b.logs)")
    }

    static var ioMode: String { ProcessInfo.processInfo.environment["BEARERD_IO"] ?? "default" }

    /// Checks the growth between the two measurements against `boundKiB`.
    static func expectFlat(_ before: Memory, _ after: Memory, _ what: String) {
        let grown = after.anonKiB - before.anonKiB
        print("\(what) (io: \(ioMode)): \(measured) requests on one connection, anonymous memory \(before.anonKiB) → \(after.anonKiB) KiB")
        #expect(grown <= boundKiB, """
            \(what) (io: \(ioMode)): anonymous memory grew by \(grown) KiB over \(measured) requests \
            (\(grown * 1024 / measured) bytes per request): before \(before), after \(after)
            """)
    }

    // MARK: HTTP/1.1 keep-alive

    /// Pipelined GETs on one keep-alive connection, `batch` at a time; every answer must be 200.
    static func h1Requests(_ c: TestClient, count: Int, batch: Int = 32) throws {
        let one = Array("GET /m HTTP/1.1\r\nHost: localhost\r\n\r\n".utf8)
        var done = 0
        while done < count {
            let n = min(batch, count - done)
            var bytes: [UInt8] = []
            bytes.reserveCapacity(one.count * n)
            for _ in 0..<n { bytes += one }
            try c.send(bytes)
            for _ in 0..<n {
                let r = try c.readResponse()
                if r.status != 200 {
                    throw NginxOrigin.Failure(description: "request \(done) answered \(r.status): \(r.bodyText)")
                }
                done += 1
            }
        }
    }

    @Test func http11KeepAliveConnectionStaysFlat() throws {
        try Self.withProxy("mem-h1") { port, pid in
            let c = try TestClient(port: port, timeout: 30)
            try Self.h1Requests(c, count: Self.warmUp)
            let before = try Self.memory(of: pid)
            try Self.h1Requests(c, count: Self.measured)
            let after = try Self.memory(of: pid)
            Self.expectFlat(before, after, "HTTP/1.1 keep-alive")
            // The same connection still serves.
            try Self.h1Requests(c, count: 1)
        }
    }

    // MARK: HTTP/2 (prior-knowledge h2c)

    /// An HTTP/2 client over a blocking socket that keeps `inFlight` streams open on its one
    /// connection, a new GET for every stream that closes, until `count` completed; every answer
    /// must be 200 and every stream must close cleanly.
    final class H2Load {
        let socket: TestClient
        let session: HTTP2Session
        private var buf = [UInt8](repeating: 0, count: 256 * 1024)
        private var out: [UInt8] = []
        let inFlight: Int

        init(port: UInt16, inFlight: Int = 64) throws {
            socket = try TestClient(port: port, timeout: 30)
            session = try HTTP2Session(role: .client)
            self.inFlight = inFlight
        }

        private static let request = [
            HTTPField(name: ":method", value: "GET"), HTTPField(name: ":scheme", value: "http"),
            HTTPField(name: ":authority", value: "localhost"), HTTPField(name: ":path", value: "/m"),
        ]

        func run(count: Int) throws {
            var submitted = 0
            var completed = 0
            var open = 0
            while completed < count {
                while open < inFlight && submitted < count {
                    _ = try session.submitRequest(Self.request, endStream: true)
                    submitted += 1
                    open += 1
                }
                out.removeAll(keepingCapacity: true)
                try session.produce(into: &out)
                if !out.isEmpty { try socket.send(out) }
                let n = buf.withUnsafeMutableBytes { recv(socket.fd, $0.baseAddress, $0.count, 0) }
                if n <= 0 {
                    throw NginxOrigin.Failure(description: "connection \(n == 0 ? "closed" : "failed") after \(completed) responses")
                }
                try buf.withUnsafeBytes { try session.receive(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
                for event in session.takeEvents() {
                    switch event {
                    case .headers(_, let fields, .response, _):
                        if fields.first?.value != "200" {
                            throw NginxOrigin.Failure(description: "response \(completed) answered \(fields)")
                        }
                    case .data(let stream, let bytes, _):
                        session.consumed(stream: stream, count: bytes.count)
                    case .streamClosed(let stream, let code):
                        if code != 0 { throw NginxOrigin.Failure(description: "stream \(stream) closed with error \(code)") }
                        open -= 1
                        completed += 1
                    case .goAway(_, let code):
                        throw NginxOrigin.Failure(description: "GOAWAY \(code) after \(completed) responses")
                    default:
                        break
                    }
                }
            }
        }
    }

    @Test func http2ConnectionStaysFlat() throws {
        try Self.withProxy("mem-h2") { port, pid in
            let load = try H2Load(port: port)
            try load.run(count: Self.warmUp)
            let before = try Self.memory(of: pid)
            try load.run(count: Self.measured)
            let after = try Self.memory(of: pid)
            Self.expectFlat(before, after, "HTTP/2 connection")
            // The same connection still serves.
            try load.run(count: 1)
        }
    }
}
