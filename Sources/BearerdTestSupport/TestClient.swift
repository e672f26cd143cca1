import Foundation
import BearerdHTTP
import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

/// A blocking HTTP/1.1 client over a real socket, for end-to-end tests: sends exact bytes
/// (so tests control framing and pipelining) and parses responses with the strict parser.
/// Not thread-safe; one per test.
public final class TestClient {
    public struct Response {
        public var head: HTTPResponseHead
        public var body: [UInt8]
        /// Informational responses seen before the final one.
        public var informational: [HTTPResponseHead]
        public var bodyText: String { String(decoding: body, as: UTF8.self) }
        public var status: Int { head.status }
        public subscript(_ name: String) -> String? { head.headers[name] }
    }

    public struct Failure: Error, CustomStringConvertible {
        public var description: String
    }

    public let fd: Int32
    private var parser = HTTP1Parser(role: .client, limits: HTTP1Limits(maxHeaderBytes: 1 << 20, maxRequestTarget: 1 << 16, maxHeaderCount: 1000))
    private var buf = [UInt8](repeating: 0, count: 65536)
    public private(set) var sawEOF = false

    public init(port: UInt16, host: String = "127.0.0.1", timeout: Double = 10) throws {
        fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr(host)
        addr.sin_port = port.bigEndian
        let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        if rc != 0 {
            // No close here: a class whose stored properties are all set runs `deinit` when its
            // init throws, and deinit closes `fd`. Closing twice could close a descriptor another
            // thread has just been given the same number (seen: a bearerd listener under test).
            throw IOError("connect", errno)
        }
        setTimeout(timeout)
    }

    public func setTimeout(_ seconds: Double) {
        var tv = timeval(tv_sec: Int(seconds), tv_usec: Int((seconds - Double(Int(seconds))) * 1e6))
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
    }

    deinit { close(fd) }

    public func send(_ s: String) throws { try send(Array(s.utf8)) }

    public func send(_ bytes: [UInt8]) throws {
        var off = 0
        while off < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + off, bytes.count - off, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { throw Failure(description: "send failed: \(String(cString: strerror(errno)))") }
            off += n
        }
    }

    public func shutdownWrite() { shutdown(fd, Int32(SHUT_WR)) }

    /// Reads one response to a request with `method` (1xx collected on the way).
    /// `bodySink` receives body pieces instead of keeping them when given.
    public func readResponse(method: String = "GET", bodySink: ((ArraySlice<UInt8>) -> Void)? = nil) throws -> Response {
        parser.expectResponse(to: method)
        var head: HTTPResponseHead?
        var infos: [HTTPResponseHead] = []
        var body: [UInt8] = []
        while true {
            let event: HTTP1Event?
            do { event = try parser.next() } catch { throw Failure(description: "invalid response: \(error)") }
            guard let event else {
                if sawEOF { throw Failure(description: "connection closed before the response was complete") }
                let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                if n < 0 { throw Failure(description: "recv: \(String(cString: strerror(errno)))") }
                if n == 0 {
                    sawEOF = true
                    parser.feedEOF()
                } else {
                    buf.withUnsafeBytes { parser.feed(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
                }
                continue
            }
            switch event {
            case .responseHead(let h, _):
                if h.isInformational { infos.append(h) } else { head = h }
            case .body(let b):
                if let bodySink { bodySink(b) } else { body.append(contentsOf: b) }
            case .end:
                guard let head else { throw Failure(description: "end without head") }
                return Response(head: head, body: body, informational: infos)
            case .requestHead:
                throw Failure(description: "unexpected request")
            }
        }
    }

    /// Raw bytes up to and including the first blank line (for interim responses read by hand).
    public func readRawHead() throws -> String {
        var out: [UInt8] = []
        var b: UInt8 = 0
        while !(out.count >= 4 && out.suffix(4) == [13, 10, 13, 10]) {
            let n = recv(fd, &b, 1, 0)
            if n <= 0 { throw Failure(description: "closed while reading a head") }
            out.append(b)
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Everything until the peer closes (or the timeout), raw.
    public func readUntilClose() -> [UInt8] {
        var out: [UInt8] = []
        while true {
            let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            out.append(contentsOf: buf[0..<n])
        }
        sawEOF = true
        return out
    }

    /// True when the server closed the connection (EOF within `within` seconds).
    public func isClosedByPeer(within seconds: Double = 3) -> Bool {
        setTimeout(seconds)
        var b = [UInt8](repeating: 0, count: 1024)
        while true {
            let n = b.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n == 0 { return true }
            if n < 0 { return errno == ECONNRESET }
        }
    }

    /// One-shot GET on a fresh connection.
    public static func get(port: UInt16, path: String, headers: [(String, String)] = []) throws -> Response {
        let c = try TestClient(port: port)
        var req = "GET \(path) HTTP/1.1\r\n"
        if !headers.contains(where: { $0.0.lowercased() == "host" }) { req += "Host: localhost\r\n" }
        for (k, v) in headers { req += "\(k): \(v)\r\n" }
        req += "\r\n"
        try c.send(req)
        return try c.readResponse()
    }
}

/// Resident set size of this process in bytes (from /proc/self/statm).
public func currentRSS() -> Int {
    guard let s = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let parts = s.split(separator: " ")
    guard parts.count > 1, let pages = Int(parts[1]) else { return 0 }
    return pages * Int(sysconf(Int32(_SC_PAGESIZE)))
}
