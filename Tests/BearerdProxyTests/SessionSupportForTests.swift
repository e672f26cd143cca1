import BearerdHTTP
import BearerdIO
import Dispatch
import Foundation
import Logging
import BearerdTestSupport
@testable import BearerdProxy
#if canImport(Glibc)
import Glibc
#endif

// Test-local helpers for the session tests. BearerdProxyTests does not depend on
// BearerdTestSupport, so the token endpoint here is a small blocking HTTP/1.1 server of its own
// (the same shape as TestOrigin: a thread per connection, scripted replies, recorded requests).

/// A scripted OAuth token endpoint on 127.0.0.1: every request is recorded (head, body, form)
/// and answered by `handler` (replaceable at any time). Mutable state guarded by `lock`.
final class ScriptedTokenEndpoint: @unchecked Sendable {  // @unchecked: state guarded by `lock`
    struct Received: Sendable {
        var head: HTTPRequestHead
        var body: String
        var form: [String: String]
        var authorization: String? { head.headers["authorization"] }
    }

    enum Reply: Sendable {
        case json(status: Int, body: String, headers: [(String, String)] = [])
        case raw([UInt8])
        indirect case delayed(Double, Reply)
        case close
    }

    typealias Handler = @Sendable (Received, Int) -> Reply

    let port: UInt16
    private let listenFD: Int32
    private let lock = NSLock()
    private var _handler: Handler
    private var _received: [Received] = []
    private var stopped = false
    private var clientFDs: [Int32] = []

    private let tls: TLSContext?

    /// `port` 0 picks a free one; a fixed port lets a test bring an endpoint "back".
    /// With `tls`, connections are served over TLS (`url` is then `https`).
    init(port: UInt16 = 0, tls: TLSContext? = nil, handler: @escaping Handler) throws {
        _handler = handler
        self.tls = tls
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        addr.sin_port = port.bigEndian
        let rc = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard rc == 0, listen(fd, 256) == 0 else { close(fd); throw IOError("bind token endpoint", errno) }
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
        self.port = UInt16(bigEndian: addr.sin_port)
        listenFD = fd
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    deinit { stop() }

    var handler: Handler {
        get { lock.withLock { _handler } }
        set { lock.withLock { _handler = newValue } }
    }
    var received: [Received] { lock.withLock { _received } }
    var count: Int { lock.withLock { _received.count } }

    var url: UpstreamURL {
        UpstreamURL(scheme: tls == nil ? "http" : "https", host: "127.0.0.1", port: port, basePath: "/oauth/token")
    }

    func stop() {
        let first: Bool = lock.withLock {
            if stopped { return false }
            stopped = true
            for c in clientFDs { shutdown(c, Int32(SHUT_RDWR)) }
            return true
        }
        guard first else { return }
        shutdown(listenFD, Int32(SHUT_RDWR))
        close(listenFD)
    }

    private func acceptLoop() {
        while true {
            let c = accept(listenFD, nil, nil)
            if c < 0 {
                if errno == EINTR { continue }
                return
            }
            lock.withLock { clientFDs.append(c) }
            Thread.detachNewThread { [self] in serve(c) }
        }
    }

    private func serve(_ fd: Int32) {
        defer {
            lock.withLock {
                clientFDs.removeAll { $0 == fd }
                close(fd)
            }
        }
        let conn = BlockingConnection(fd: fd, engine: tls.flatMap { try? TLSEngine(server: $0) })
        if tls != nil && conn.engine == nil { return }
        guard conn.handshake() else { return }
        var parser = HTTP1Parser(role: .server)
        var head: HTTPRequestHead?
        var body: [UInt8] = []
        while true {
            let event: HTTP1Event?
            do { event = try parser.next() } catch { return }
            guard let event else {
                guard let bytes = conn.read() else { return }
                bytes.withUnsafeBytes { parser.feed($0) }
                continue
            }
            switch event {
            case .requestHead(let h, _):
                head = h
                body = []
            case .body(let b):
                body.append(contentsOf: b)
            case .end:
                let text = String(decoding: body, as: UTF8.self)
                let r = Received(head: head!, body: text, form: Self.decodeForm(text))  // .end follows a head
                let (handler, index): (Handler, Int) = lock.withLock {
                    _received.append(r)
                    return (_handler, _received.count)
                }
                if !send(handler(r, index), conn) { return }
            case .responseHead:
                return
            }
        }
    }

    private func send(_ reply: Reply, _ conn: BlockingConnection) -> Bool {
        switch reply {
        case .close:
            return false
        case .delayed(let s, let r):
            Thread.sleep(forTimeInterval: s)
            return send(r, conn)
        case .raw(let bytes):
            return conn.write(bytes)
        case .json(let status, let body, let headers):
            var h = "HTTP/1.1 \(status) X\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\n"
            for (k, v) in headers { h += "\(k): \(v)\r\n" }
            h += "\r\n"
            return conn.write(Array((h + body).utf8))
        }
    }

    static func decodeForm(_ text: String) -> [String: String] {
        var out: [String: String] = [:]
        for pair in text.split(separator: "&") {
            let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            func dec(_ s: Substring) -> String {
                (String(s).replacingOccurrences(of: "+", with: " ").removingPercentEncoding) ?? String(s)
            }
            out[dec(kv[0])] = kv.count > 1 ? dec(kv[1]) : ""
        }
        return out
    }

    /// A successful token response.
    static func token(_ access: String, expiresIn: Int = 3600, refresh: String? = nil) -> Reply {
        var body = "{\"access_token\":\"\(access)\",\"token_type\":\"Bearer\",\"expires_in\":\(expiresIn)"
        if let refresh { body += ",\"refresh_token\":\"\(refresh)\"" }
        return .json(status: 200, body: body + "}")
    }

    /// An RFC 6749 §5.2 error response.
    static func error(_ status: Int, _ code: String, _ description: String, headers: [(String, String)] = []) -> Reply {
        .json(status: status, body: "{\"error\":\"\(code)\",\"error_description\":\"\(description)\"}", headers: headers)
    }
}

/// Blocking byte transport of the scripted endpoint, through a server `TLSEngine` when given
/// (as TestOrigin's). Used by one connection thread only.
final class BlockingConnection {
    let fd: Int32
    let engine: TLSEngine?
    private var plain = [UInt8](repeating: 0, count: 65536)
    private var net = [UInt8](repeating: 0, count: 65536)

    init(fd: Int32, engine: TLSEngine?) {
        self.fd = fd
        self.engine = engine
    }

    private func sendAll(_ bytes: [UInt8]) -> Bool {
        var off = 0
        while off < bytes.count {
            let n = bytes.withUnsafeBytes { Glibc.send(fd, $0.baseAddress! + off, bytes.count - off, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return false }
            off += n
        }
        return true
    }

    private func flushTLS() -> Bool {
        guard let engine else { return true }
        var out: [UInt8] = []
        engine.drainCiphertext(into: &out)
        return sendAll(out)
    }

    private func receiveCiphertext() -> Bool {
        let n = net.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if n <= 0 { engine?.feedEOF(); return false }
        net.withUnsafeBytes { engine?.feedCiphertext(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
        return true
    }

    func handshake() -> Bool {
        guard let engine else { return true }
        while true {
            guard let state = try? engine.handshake() else { _ = flushTLS(); return false }
            if !flushTLS() { return false }
            if state == .complete { return true }
            if !receiveCiphertext() { return false }
        }
    }

    /// Plaintext bytes, or nil at EOF or on an error.
    func read() -> [UInt8]? {
        guard let engine else {
            let n = plain.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            return n > 0 ? Array(plain[0..<n]) : nil
        }
        while true {
            switch try? plain.withUnsafeMutableBytes({ try engine.readPlaintext(into: $0) }) {
            case .bytes(let n)?: return Array(plain[0..<n])
            case .closed?, nil: return nil
            case .wantMore?:
                _ = flushTLS()
                if !receiveCiphertext() { return nil }
            }
        }
    }

    func write(_ bytes: [UInt8]) -> Bool {
        guard let engine else { return sendAll(bytes) }
        do { try bytes.withUnsafeBytes { try engine.writePlaintext($0) } } catch { return false }
        return flushTLS()
    }
}

/// A CA and a server certificate for `localhost` and `127.0.0.1`, made with the openssl CLI in
/// a temporary directory.
struct TestCertificates {
    let directory: String
    var caFile: String { directory + "/ca.pem" }
    var serverCert: String { directory + "/server.pem" }
    var serverKey: String { directory + "/server.key" }

    init() throws {
        directory = temporaryDirectory()
        writeFile(directory + "/ext.cnf", "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n")
        let steps: [[String]] = [
            ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "ca.key",
             "-out", "ca.pem", "-days", "2", "-subj", "/CN=bearerd-session-test-ca"],
            ["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "server.key",
             "-out", "server.csr", "-subj", "/CN=localhost"],
            ["x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "server.pem", "-days", "2", "-extfile", "ext.cnf"],
        ]
        for args in steps {
            let p = Process()
            p.executableURL = URL(fileURLWithPath: "/usr/bin/openssl")
            p.arguments = args
            p.currentDirectoryURL = URL(fileURLWithPath: directory)
            p.standardOutput = FileHandle.nullDevice
            p.standardError = FileHandle.nullDevice
            try p.run()
            p.waitUntilExit()
            guard p.terminationStatus == 0 else { throw IOError("openssl \(args[0])", EIO) }
        }
    }

    func serverContext() throws -> TLSContext {
        try TLSContext.server(certificateChainFile: serverCert, privateKeyFile: serverKey, clientCAFile: nil,
                              requireClientCertificate: false, alpn: ["http/1.1"])
    }
}

/// A port with nothing listening (bound, then closed): connecting is refused.
func unusedPort() -> UInt16 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    addr.sin_port = 0
    _ = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    var len = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
    return UInt16(bigEndian: addr.sin_port)
}

/// Loops standing in for the proxy's event loops.
let testLoops: [EventLoop] = (0..<4).map { EventLoop(index: 900 + $0, readBufferSize: 4096) }

func requestToken(_ driver: TokenSessionDriver, on loop: EventLoop = testLoops[0]) async -> Result<PublishedToken, TokenUnavailable> {
    await withCheckedContinuation { c in
        driver.requestToken(on: loop) { result in
            loop.assertInEventLoop()
            c.resume(returning: result)
        }
    }
}

func reportRejected(_ driver: TokenSessionDriver, generation: UInt64, on loop: EventLoop = testLoops[0]) async -> RejectionOutcome {
    await withCheckedContinuation { c in
        driver.reportRejected(generation: generation, on: loop) { c.resume(returning: $0) }
    }
}

/// Polls `condition` every 50 ms until it holds or `seconds` pass.
func eventually(_ seconds: Double = 10, _ condition: () async -> Bool) async -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if await condition() { return true }
        try? await Task.sleep(nanoseconds: 50_000_000)
    }
    return await condition()
}

/// A fresh temporary directory (removed by the caller with `removeTree`).
func temporaryDirectory() -> String {
    var template = Array("/tmp/bearerd-session-test-XXXXXX".utf8CString)
    let p = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
    return String(cString: p!)  // mkdtemp only fails when /tmp is unusable
}

func removeTree(_ path: String) {
    try? FileManager.default.removeItem(atPath: path)
}

func writeFile(_ path: String, _ text: String) {
    FileManager.default.createFile(atPath: path, contents: Data(text.utf8))
}

func fileMode(_ path: String) -> mode_t {
    var st = stat()
    stat(path, &st)
    return st.st_mode & 0o777
}

/// A one-session configuration against `url`.
func sessionConfig(_ session: SessionConfig, stateDir: String? = nil) -> BearerdConfig {
    BearerdConfig(file: "test.yaml", listen: [.tcp(host: "127.0.0.1", port: 0)], stateDir: stateDir, sessions: [session])
}
