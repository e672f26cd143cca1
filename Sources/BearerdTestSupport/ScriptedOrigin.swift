import Foundation
import BearerdHTTP
import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

/// A misbehaving HTTP/1.1 origin for hostile-peer tests: raw blocking sockets on 127.0.0.1, an
/// accept thread and one thread per connection. What it does is a script of `Step`s, chosen per
/// connection (`onAccept`, run before anything is read) and per request (`handler`, called with
/// the parsed head): send these exact bytes, wait, read the body (or not), close, reset, flood
/// with 1xx, wait for the test to open a `Gate`. After a request's steps, a connection that is
/// still open reads whatever is left of that body and goes on with the next request.
///
/// Records what it received (guarded by `lock`): every request head with its body byte count,
/// checksum and completeness, the raw bytes of each connection (first 1 MiB), and how many
/// connections it accepted. `stop()` shuts every socket down, which also ends any step that
/// blocks (a flood, a wait for a gate is bounded by its own timeout).
public final class ScriptedOrigin: @unchecked Sendable {  // @unchecked: mutable state guarded by `lock`; fds set once
    /// One thing the origin does on a connection.
    public enum Step: Sendable {
        /// Exactly these bytes, in one `send` where the kernel takes them (a test that needs two
        /// responses "in the same write" puts them in one `.send`).
        case send([UInt8])
        /// Sleep.
        case wait(ms: Int)
        /// Wait until the test opens `gate` (at most `timeoutMs`).
        case await(Gate, timeoutMs: Int)
        /// Open `gate`: tells a test waiting on it that the script got here.
        case open(Gate)
        /// Read the rest of the current request's body (recorded); no-op when already read.
        case readBody
        /// Close the connection (FIN). Ends the script and the connection.
        case close
        /// Close with SO_LINGER 0 so the peer sees a reset (RST). Ends the connection.
        case reset
        /// Send `interim` (a complete 1xx head) over and over for `forMs` milliseconds,
        /// as fast as the peer reads; a blocked send is retried until the time is up.
        case flood1xx(String, forMs: Int)

        /// `text` as UTF-8 bytes.
        public static func text(_ text: String) -> Step { .send(Array(text.utf8)) }

        /// A complete response framed with Content-Length (nothing added for 1xx/204/304).
        public static func respond(status: Int, headers: [(String, String)] = [], body: String = "") -> Step {
            .send(ScriptedOrigin.response(status: status, headers: headers, body: Array(body.utf8)))
        }

        /// `401` with `WWW-Authenticate: Bearer error="invalid_token"` (RFC 6750 §3.1): what an
        /// API answers to a revoked or expired token.
        public static var rejectToken: Step {
            respond(status: 401, headers: [("WWW-Authenticate", "Bearer error=\"invalid_token\"")], body: "stale token")
        }
    }

    /// A one-shot latch the test opens to let a waiting step go on.
    public final class Gate: @unchecked Sendable {  // @unchecked: `isOpen` guarded by `condition`
        private let condition = NSCondition()
        private var isOpen = false
        public init() {}

        public func open() {
            condition.lock()
            isOpen = true
            condition.broadcast()
            condition.unlock()
        }

        /// True when opened within `timeoutMs`.
        public func wait(timeoutMs: Int) -> Bool {
            let deadline = Date().addingTimeInterval(Double(timeoutMs) / 1000)
            condition.lock()
            defer { condition.unlock() }
            while !isOpen {
                if !condition.wait(until: deadline) { return isOpen }
            }
            return true
        }
    }

    /// A request as the handler sees it: the head; the body only with `readsBodyFirst`
    /// (otherwise it has not been read yet).
    public struct Request: Sendable {
        /// 1-based number of the accepted connection that carried it.
        public var connection: Int
        /// 0-based position of the request on its connection (> 0: the connection was reused).
        public var indexOnConnection: Int
        /// 0-based position among every request this origin received.
        public var index: Int
        public var head: HTTPRequestHead
        /// The whole body when the origin `readsBodyFirst` (up to 1 MiB), else empty.
        public var body: [UInt8]
        /// The token of `Authorization: Bearer TOKEN`, if any.
        public var bearerToken: String? { ScriptedOrigin.bearerToken(head) }
        public var path: String { head.target }
    }

    /// What was received for one request.
    public struct Received: Sendable {
        public var connection: Int
        public var indexOnConnection: Int
        public var head: HTTPRequestHead
        /// Body bytes read so far (all of them when `bodyComplete`).
        public var bodyBytes: Int
        /// FNV-1a of the body bytes read (compare with `TestOrigin.fnv1a`).
        public var bodyChecksum: UInt64
        public var bodyComplete: Bool
        public var bearerToken: String? { ScriptedOrigin.bearerToken(head) }
    }

    public typealias Handler = @Sendable (Request) -> [Step]

    public let port: UInt16
    private let listenFD: Int32
    private let handler: Handler
    private let onAccept: @Sendable (Int) -> [Step]
    private let lock = NSLock()
    private var stopped = false
    private var clientFDs: [Int32] = []
    private var _connections = 0
    private var _received: [Received] = []
    private var _raw: [Int: [UInt8]] = [:]
    private var _bodies: [Int: [UInt8]] = [:]
    /// Bodies kept whole (`bodyOf(_:)`) up to this many bytes each; 0 keeps none.
    private let keepBodiesUpTo: Int
    /// Each body is read (and kept) before the handler is called (a token endpoint reads its form).
    private let readsBodyFirst: Bool
    private static let rawCap = 1 << 20

    /// - Parameters:
    ///   - keepBodiesUpTo: keep each request body (up to this size) for `bodyOf(_:)`.
    ///   - readsBodyFirst: read each body before calling `handler` (`Request.body`).
    ///   - onAccept: steps run when a connection is accepted, before anything is read
    ///     (e.g. a response before any request).
    ///   - handler: the steps for each request, given its head.
    public init(keepBodiesUpTo: Int = 0, readsBodyFirst: Bool = false, onAccept: @escaping @Sendable (Int) -> [Step] = { _ in [] },
                handler: @escaping Handler) throws {
        self.handler = handler
        self.onAccept = onAccept
        self.readsBodyFirst = readsBodyFirst
        self.keepBodiesUpTo = readsBodyFirst ? max(keepBodiesUpTo, 1 << 20) : keepBodiesUpTo
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw IOError("socket", errno) }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = 0
        let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard rc == 0, listen(fd, 256) == 0 else {
            let e = errno
            close(fd)
            throw IOError("bind scripted origin", e)
        }
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
        port = UInt16(bigEndian: addr.sin_port)
        listenFD = fd
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    deinit { stop() }

    // MARK: - What was received

    /// Connections accepted so far.
    public var connectionsAccepted: Int { lock.withLock { _connections } }
    /// Every request received, in arrival order.
    public var requests: [Received] { lock.withLock { _received } }
    /// The raw bytes received on connection `id` (1-based; first 1 MiB).
    public func raw(connection id: Int) -> [UInt8] { lock.withLock { _raw[id] ?? [] } }
    /// Every raw byte received, all connections in order of their number.
    public var allRaw: [UInt8] { lock.withLock { _raw.keys.sorted().flatMap { _raw[$0]! } } }  // key from keys
    /// The kept body of request `index` (see `keepBodiesUpTo`).
    public func bodyOf(_ index: Int) -> [UInt8] { lock.withLock { _bodies[index] ?? [] } }

    /// Waits until `count` requests were received (heads), at most `seconds`.
    @discardableResult
    public func waitForRequests(_ count: Int, seconds: Double = 5) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if requests.count >= count { return true }
            usleep(5_000)
        }
        return requests.count >= count
    }

    /// Waits until `predicate` holds for the received requests, at most `seconds`.
    @discardableResult
    public func waitUntil(seconds: Double = 5, _ predicate: ([Received]) -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if predicate(requests) { return true }
            usleep(5_000)
        }
        return predicate(requests)
    }

    /// Stops accepting and shuts down every open connection. Idempotent.
    public func stop() {
        let first: Bool = lock.withLock {
            if stopped { return false }
            stopped = true
            for c in clientFDs { shutdown(c, Int32(SHUT_RDWR)) }
            return true
        }
        guard first else { return }
        // Shut down only; the accept thread closes the fd (see TestOrigin.stop for why).
        shutdown(listenFD, Int32(SHUT_RDWR))
    }

    // MARK: - Helpers for scripts

    /// The token of an `Authorization: Bearer TOKEN` header.
    public static func bearerToken(_ head: HTTPRequestHead) -> String? {
        guard let value = head.headers["Authorization"], value.lowercased().hasPrefix("bearer ") else { return nil }
        return String(value.dropFirst(7))
    }

    /// A response framed with Content-Length (none for 1xx, 204 and 304).
    public static func response(status: Int, reason: String = "X", headers: [(String, String)] = [], body: [UInt8] = []) -> [UInt8] {
        var h = "HTTP/1.1 \(status) \(reason)\r\n"
        for (k, v) in headers { h += "\(k): \(v)\r\n" }
        let bodyless = status < 200 || status == 204 || status == 304
        if !bodyless, !headers.contains(where: { $0.0.lowercased() == "content-length" }) {
            h += "Content-Length: \(body.count)\r\n"
        }
        h += "\r\n"
        return Array(h.utf8) + body
    }

    // MARK: - Serving

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
            // Bounded blocking: a stuck peer never holds a thread for long.
            var tv = timeval(tv_sec: 10, tv_usec: 0)
            setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            Thread.detachNewThread { [self] in serve(fd: c, id: id) }
        }
    }

    /// One connection: its state while being served (on its own thread only).
    private final class Conn {
        let fd: Int32
        let id: Int
        var parser = HTTP1Parser(role: .server, limits: HTTP1Limits(maxHeaderBytes: 1 << 20, maxRequestTarget: 1 << 16, maxHeaderCount: 1000))
        var buf = [UInt8](repeating: 0, count: 65536)
        var peerClosed = false
        /// Index into `_received` of the request whose body is being read, if any.
        var current: Int?
        var currentBodyDone = true
        var closed = false
        init(fd: Int32, id: Int) {
            self.fd = fd
            self.id = id
        }
    }

    private func serve(fd: Int32, id: Int) {
        let conn = Conn(fd: fd, id: id)
        defer {
            if !conn.closed { finish(conn, reset: false) }
        }
        if !run(onAccept(id), on: conn) { return }
        var requestsOnConnection = 0
        while true {
            guard let head = nextHead(conn) else { return }
            let index: Int = lock.withLock {
                _received.append(Received(connection: id, indexOnConnection: requestsOnConnection, head: head,
                                          bodyBytes: 0, bodyChecksum: 0xcbf29ce484222325, bodyComplete: false))
                return _received.count - 1
            }
            conn.current = index
            conn.currentBodyDone = false
            var body: [UInt8] = []
            if readsBodyFirst {
                if !readBody(conn) { return }
                body = bodyOf(index)
            }
            let request = Request(connection: id, indexOnConnection: requestsOnConnection, index: index, head: head, body: body)
            requestsOnConnection += 1
            if !run(handler(request), on: conn) { return }
            if !conn.currentBodyDone, !readBody(conn) { return }
        }
    }

    /// Runs steps; false when the connection ended.
    private func run(_ steps: [Step], on conn: Conn) -> Bool {
        for step in steps {
            switch step {
            case .send(let bytes):
                if !sendAll(conn.fd, bytes) { return false }
            case .wait(let ms):
                Thread.sleep(forTimeInterval: Double(max(0, ms)) / 1000)
            case .await(let gate, let timeoutMs):
                _ = gate.wait(timeoutMs: timeoutMs)
            case .open(let gate):
                gate.open()
            case .readBody:
                if !conn.currentBodyDone, !readBody(conn) { return false }
            case .close:
                finish(conn, reset: false)
                return false
            case .reset:
                finish(conn, reset: true)
                return false
            case .flood1xx(let interim, let ms):
                if !flood(conn.fd, interim: interim, ms: ms) { return false }
            }
        }
        return true
    }

    private func finish(_ conn: Conn, reset: Bool) {
        guard !conn.closed else { return }
        conn.closed = true
        if reset {
            var l = linger(l_onoff: 1, l_linger: 0)
            setsockopt(conn.fd, SOL_SOCKET, SO_LINGER, &l, socklen_t(MemoryLayout<linger>.size))
        }
        lock.withLock {
            clientFDs.removeAll { $0 == conn.fd }
            close(conn.fd)
        }
    }

    /// Reads until the next request head; nil at EOF, error or a malformed request.
    private func nextHead(_ conn: Conn) -> HTTPRequestHead? {
        while true {
            guard let event = nextEvent(conn) else { return nil }
            switch event {
            case .requestHead(let h, _): return h
            case .body, .end: continue  // leftovers of a body nobody read (cannot happen: bodies are read)
            case .responseHead: return nil
            }
        }
    }

    /// Reads the rest of the current body, recording it; false at EOF or error.
    private func readBody(_ conn: Conn) -> Bool {
        guard let index = conn.current else { conn.currentBodyDone = true; return true }
        while true {
            guard let event = nextEvent(conn) else { return false }
            switch event {
            case .body(let b):
                lock.withLock {
                    _received[index].bodyBytes += b.count
                    var sum = _received[index].bodyChecksum
                    for byte in b { sum = (sum ^ UInt64(byte)) &* 0x100000001b3 }
                    _received[index].bodyChecksum = sum
                    if keepBodiesUpTo > 0, (_bodies[index]?.count ?? 0) + b.count <= keepBodiesUpTo {
                        _bodies[index, default: []].append(contentsOf: b)
                    }
                }
            case .end:
                lock.withLock { _received[index].bodyComplete = true }
                conn.currentBodyDone = true
                return true
            case .requestHead, .responseHead:
                return false
            }
        }
    }

    /// The next parser event, reading from the socket as needed; nil at EOF, error or bad input.
    private func nextEvent(_ conn: Conn) -> HTTP1Event? {
        while true {
            let event: HTTP1Event?
            do { event = try conn.parser.next() } catch { return nil }
            if let event { return event }
            if conn.peerClosed || conn.closed { return nil }
            let n = conn.buf.withUnsafeMutableBytes { recv(conn.fd, $0.baseAddress, $0.count, 0) }
            if n < 0, errno == EINTR { continue }
            if n <= 0 {
                conn.peerClosed = true
                conn.parser.feedEOF()
                continue
            }
            lock.withLock {
                if (_raw[conn.id]?.count ?? 0) < Self.rawCap { _raw[conn.id, default: []].append(contentsOf: conn.buf[0..<n]) }
            }
            conn.buf.withUnsafeBytes { conn.parser.feed(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        }
    }

    private func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
        var off = 0
        while off < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + off, bytes.count - off, Int32(MSG_NOSIGNAL)) }  // non-empty: off < count
            if n < 0, errno == EINTR { continue }
            if n <= 0 { return false }
            off += n
        }
        return true
    }

    /// Sends `interim` repeatedly for `ms` milliseconds; false when the peer went away.
    private func flood(_ fd: Int32, interim: String, ms: Int) -> Bool {
        let one = Array(interim.utf8)
        guard !one.isEmpty else { return true }
        // A whole number of interim responses, so a partial send resumes mid-stream correctly.
        let piece = Array((0..<max(1, 65536 / one.count)).map { _ in one }.joined())
        var tv = timeval(tv_sec: 0, tv_usec: 100_000)
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        defer {
            var none = timeval(tv_sec: 0, tv_usec: 0)
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, socklen_t(MemoryLayout<timeval>.size))
        }
        let deadline = Date().addingTimeInterval(Double(ms) / 1000)
        var off = 0
        while Date() < deadline {
            let n = piece.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + off, piece.count - off, Int32(MSG_NOSIGNAL)) }  // non-empty piece
            if n < 0 {
                if errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR { continue }
                return false
            }
            if n == 0 { return false }
            off = (off + n) % piece.count
        }
        // Finish the interim response cut by the last partial send, so the stream stays valid.
        if off % one.count != 0 {
            let rest = one.count - off % one.count
            return sendAll(fd, Array(one.suffix(rest)))
        }
        return true
    }
}
