import Foundation
import BearerdHTTP
import BearerdIO
#if canImport(Glibc)
import Glibc
import BearerdTLS
#endif

/// A real HTTP/1.1 origin for end-to-end tests: blocking sockets on 127.0.0.1, one thread per
/// connection, optional TLS through `TLSEngine` in server mode. Handlers see each parsed request
/// and answer with a scripted reply (structured, streamed, raw bytes, delayed, or a close).
/// Records what it received (guarded by `lock`) so tests can assert on it.
public final class TestOrigin: @unchecked Sendable {  // @unchecked: mutable state guarded by `lock`
    public struct Request: Sendable {
        public var head: HTTPRequestHead
        public var body: [UInt8]
        /// Body bytes received (also counted when `storeBodies` is false).
        public var bodyCount: Int
        /// Which accepted connection carried it (keep-alive reuse checks).
        public var connection: Int
        /// Subject of the client certificate, on TLS connections that presented one.
        public var clientCertificateSubject: String?
    }

    public enum Reply: Sendable {
        /// A response with Content-Length (or chunked when `chunked`).
        case response(status: Int, headers: [(String, String)], body: [UInt8], chunked: Bool = false)
        /// `length` bytes of pattern data streamed in 64 KiB pieces with Content-Length.
        case stream(status: Int, length: Int)
        /// Exactly these bytes, then keep reading requests.
        case raw([UInt8])
        /// These bytes, then close the connection.
        case rawThenClose([UInt8])
        /// Sleep, then answer.
        indirect case delayed(Double, Reply)
        /// Close without answering.
        case close
    }

    public typealias Handler = @Sendable (Request) -> Reply

    public let port: UInt16
    private let listenFD: Int32
    private let handler: Handler
    private let tls: TLSContext?
    private let lock = NSLock()
    private var _requests: [Request] = []
    private var _connections = 0
    private var stopped = false
    private var clientFDs: [Int32] = []
    /// Keep request bodies (false for huge uploads; only counts and a checksum are kept).
    public let storeBodies: Bool
    private var _checksums: [UInt64] = []

    /// `port` 0 picks a free one; a fixed port lets a test bring a server "back" where it was.
    public init(port: UInt16 = 0, tls: TLSContext? = nil, storeBodies: Bool = true, handler: @escaping Handler) throws {
        self.handler = handler
        self.tls = tls
        self.storeBodies = storeBodies
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = port.bigEndian
        let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard rc == 0, listen(fd, 256) == 0 else {
            let e = errno
            close(fd)
            throw IOError("bind test origin", e)
        }
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
        self.port = UInt16(bigEndian: addr.sin_port)
        listenFD = fd
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    public var requests: [Request] { lock.withLock { _requests } }
    /// Body bytes handed to the kernel by `.stream` replies so far (all connections).
    public var streamedBytes: Int { lock.withLock { _streamedBytes } }
    private var _streamedBytes = 0
    public var connectionCount: Int { lock.withLock { _connections } }
    /// FNV-1a checksums of each request body, in arrival order.
    public var bodyChecksums: [UInt64] { lock.withLock { _checksums } }

    /// Stops accepting and shuts down open connections. Idempotent (a second close of the
    /// listening fd could close an unrelated descriptor that reused the number).
    public func stop() {
        let first: Bool = lock.withLock {
            if stopped { return false }
            stopped = true
            for c in clientFDs { shutdown(c, Int32(SHUT_RDWR)) }
            return true
        }
        guard first else { return }
        // Shut down only: the accept thread closes the fd when accept fails. Closing it here
        // could let that thread, if it had not reached accept yet, accept on whatever socket
        // reuses the number next (seen: it took a connection meant for a bearerd listener).
        shutdown(listenFD, Int32(SHUT_RDWR))
    }

    deinit { stop() }

    private func acceptLoop() {
        while true {
            let c = accept(listenFD, nil, nil)
            if c < 0 {
                if errno == EINTR { continue }
                close(listenFD)
                return
            }
            let id: Int? = lock.withLock {
                if stopped { return nil }
                _connections += 1
                clientFDs.append(c)
                return _connections
            }
            guard let id else { close(c); continue }
            Thread.detachNewThread { [self] in serve(fd: c, id: id) }
        }
    }

    /// Blocking byte transport, with TLS when configured.
    final class Conn {
        let fd: Int32
        let engine: TLSEngine?
        var plainBuf = [UInt8](repeating: 0, count: 65536)
        var netBuf = [UInt8](repeating: 0, count: 65536)
        init(fd: Int32, engine: TLSEngine?) {
            self.fd = fd
            self.engine = engine
        }
        func flushTLS() -> Bool {
            guard let engine else { return true }
            var out: [UInt8] = []
            engine.drainCiphertext(into: &out)
            return sendAll(out)
        }
        func sendAll(_ bytes: [UInt8]) -> Bool {
            var off = 0
            while off < bytes.count {
                let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + off, bytes.count - off, Int32(MSG_NOSIGNAL)) }
                if n <= 0 { return false }
                off += n
            }
            return true
        }
        func handshake() -> Bool {
            guard let engine else { return true }
            while true {
                guard let state = try? engine.handshake() else { _ = flushTLS(); return false }
                if !flushTLS() { return false }
                if state == .complete { return true }
                let n = netBuf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                if n <= 0 { return false }
                netBuf.withUnsafeBytes { engine.feedCiphertext(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
            }
        }
        /// Plaintext bytes, or nil at EOF/error.
        func read() -> ArraySlice<UInt8>? {
            guard let engine else {
                let n = plainBuf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                return n > 0 ? plainBuf[0..<n] : nil
            }
            while true {
                let r = try? plainBuf.withUnsafeMutableBytes { try engine.readPlaintext(into: $0) }
                switch r {
                case .bytes(let n)?: return plainBuf[0..<n]
                case .closed?, nil: return nil
                case .wantMore?:
                    _ = flushTLS()
                    let n = netBuf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                    if n <= 0 { engine.feedEOF(); continue }
                    netBuf.withUnsafeBytes { engine.feedCiphertext(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
                }
            }
        }
        func write(_ bytes: [UInt8]) -> Bool {
            guard let engine else { return sendAll(bytes) }
            do { try bytes.withUnsafeBytes { try engine.writePlaintext($0) } } catch { return false }
            return flushTLS()
        }
    }

    private func serve(fd: Int32, id: Int) {
        defer {
            lock.withLock {
                clientFDs.removeAll { $0 == fd }
                close(fd)
            }
        }
        var engine: TLSEngine?
        if let tls {
            engine = try? TLSEngine(server: tls)
            if engine == nil { return }
        }
        let conn = Conn(fd: fd, engine: engine)
        guard conn.handshake() else { return }
        var parser = HTTP1Parser(role: .server, limits: HTTP1Limits(maxHeaderBytes: 1 << 20, maxRequestTarget: 1 << 16, maxHeaderCount: 1000))
        var current: HTTPRequestHead?
        var body: [UInt8] = []
        var count = 0
        var sum: UInt64 = 0xcbf29ce484222325
        while true {
            let event: HTTP1Event?
            do { event = try parser.next() } catch { _ = conn.write(Array("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n".utf8)); return }
            guard let event else {
                guard let bytes = conn.read() else { return }
                bytes.withUnsafeBytes { parser.feed($0) }
                continue
            }
            switch event {
            case .requestHead(let h, _):
                current = h
                body = []
                count = 0
                sum = 0xcbf29ce484222325
                if HTTPHeaderRules.expectsContinue(h) { _ = conn.write(Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)) }
            case .body(let b):
                count += b.count
                if storeBodies { body.append(contentsOf: b) }
                for byte in b { sum = (sum ^ UInt64(byte)) &* 0x100000001b3 }
            case .end:
                let req = Request(head: current!, body: body, bodyCount: count, connection: id, clientCertificateSubject: engine?.peerCertificateSubject)
                lock.withLock {
                    _requests.append(req)
                    _checksums.append(sum)
                }
                if !send(handler(req), on: conn, method: current!.method) { return }
            case .responseHead:
                return
            }
        }
    }

    /// Writes a reply; false when the connection should close.
    private func send(_ reply: Reply, on conn: Conn, method: String) -> Bool {
        switch reply {
        case .close:
            return false
        case .delayed(let s, let r):
            Thread.sleep(forTimeInterval: s)
            return send(r, on: conn, method: method)
        case .raw(let bytes):
            return conn.write(bytes)
        case .rawThenClose(let bytes):
            _ = conn.write(bytes)
            return false
        case .response(let status, let headers, let body, let chunked):
            var h = "HTTP/1.1 \(status) X\r\n"
            for (k, v) in headers { h += "\(k): \(v)\r\n" }
            let bodyless = method == "HEAD" || status == 204 || status == 304
            if chunked {
                h += "Transfer-Encoding: chunked\r\n\r\n"
                var out = Array(h.utf8)
                if !bodyless {
                    if !body.isEmpty {
                        out += Array(String(body.count, radix: 16).utf8) + [13, 10] + body + [13, 10]
                    }
                    out += Array("0\r\n\r\n".utf8)
                }
                return conn.write(out)
            }
            if !headers.contains(where: { $0.0.lowercased() == "content-length" }) && status != 204 && status != 304 {
                h += "Content-Length: \(body.count)\r\n"
            }
            h += "\r\n"
            return conn.write(Array(h.utf8) + (bodyless ? [] : body))
        case .stream(let status, let length):
            guard conn.write(Array("HTTP/1.1 \(status) OK\r\nContent-Length: \(length)\r\n\r\n".utf8)) else { return false }
            if method == "HEAD" { return true }
            var sent = 0
            let piece = TestOrigin.pattern(65536)
            while sent < length {
                let n = min(piece.count, length - sent)
                guard conn.write(n == piece.count ? piece : Array(piece[0..<n])) else { return false }
                sent += n
                lock.withLock { _streamedBytes += n }
            }
            return true
        }
    }

    /// Deterministic test data.
    public static func pattern(_ n: Int, seed: UInt8 = 0) -> [UInt8] {
        (0..<n).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ Int(seed)) }
    }

    public static func fnv1a(_ bytes: some Sequence<UInt8>) -> UInt64 {
        var sum: UInt64 = 0xcbf29ce484222325
        for b in bytes { sum = (sum ^ UInt64(b)) &* 0x100000001b3 }
        return sum
    }
}
