import Foundation
#if canImport(Glibc)
import Glibc
#endif
import Testing
import BearerdHTTP
import BearerdProxy
import BearerdTestSupport
import BearerdConfig
import BearerdSessions
import BearerdService

/// An origin that answers as soon as it has the request head (as servers do with an early 413 or
/// a streaming echo), then keeps reading: one connection, raw sockets, on its own thread.
final class EarlyAnsweringOrigin: @unchecked Sendable {  // @unchecked: fds set once in init; `received` guarded by `lock`
    let port: UInt16
    private let listenFD: Int32
    private let lock = NSLock()
    private var _received: [UInt8] = []
    var received: [UInt8] { lock.lock(); defer { lock.unlock() }; return _received }

    init(answer: String) throws {
        let listenFD = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        self.listenFD = listenFD
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = 0
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(listenFD, $0, len) } }
        listen(listenFD, 4)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listenFD, $0, &len) } }
        port = UInt16(bigEndian: addr.sin_port)
        let fd = listenFD
        Thread.detachNewThread { [self] in
            self.serve(fd: fd, answer: answer)
        }
    }

    private func serve(fd: Int32, answer: String) {
        do {
            let c = accept(fd, nil, nil)
            guard c >= 0 else { return }
            defer { close(c) }
            var buf = [UInt8](repeating: 0, count: 65536)
            var answered = false
            while true {
                let n = buf.withUnsafeMutableBytes { recv(c, $0.baseAddress, $0.count, 0) }
                if n <= 0 { return }
                lock.lock(); _received += buf[0..<n]; let seen = _received; lock.unlock()
                if !answered, seen.count >= 4, String(decoding: seen, as: UTF8.self).contains("\r\n\r\n") {
                    answered = true
                    let bytes = Array(answer.utf8)
                    _ = bytes.withUnsafeBytes { send(c, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
                }
            }
        }
    }

    func stop() { shutdown(listenFD, Int32(SHUT_RDWR)); close(listenFD) }
}

@Suite("Early upstream responses", .serialized)
struct EarlyResponseTests {
    /// The upstream started answering; then the client's chunked body turns out malformed. A 400
    /// written now would land inside the response stream: bearerd closes the connection instead.
    @Test func clientFramingErrorAfterTheResponseStartedClosesTheConnection() throws {
        let origin = try EarlyAnsweringOrigin(answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
        defer { origin.stop() }
        let proxy = try TestProxy(routes: [route(origin: origin.port)])
        defer { proxy.stop() }
        let c = try TestClient(port: proxy.port)
        try c.send("POST /upload HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n4\r\nabcd\r\n")
        // The response head and the first piece arrive while the request body is still open.
        let head = try c.readRawHead()
        #expect(head.hasPrefix("HTTP/1.1 200"))
        // Now a malformed chunk size.
        try c.send("zz\r\n")
        let rest = String(decoding: c.readUntilClose(), as: UTF8.self)
        #expect(c.sawEOF)
        #expect(rest.contains("hello"))
        #expect(!rest.contains("HTTP/1.1 400"), "a 400 was written into the response stream: \(rest)")
        // The origin got the head and the first chunk, never the bad bytes.
        let seen = String(decoding: origin.received, as: UTF8.self)
        #expect(seen.contains("POST /upload"))
        #expect(!seen.contains("zz"))
    }
}
