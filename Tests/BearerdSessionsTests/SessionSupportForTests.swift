import BearerdHTTP
import BearerdIO
import Dispatch
import Foundation
import Logging
import BearerdTestSupport
#if canImport(Glibc)
import Glibc
import BearerdTLS
@testable import BearerdConfig
@testable import BearerdProxyCore
@testable import BearerdSessions
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
        /// monotonicNanos() when the request was complete at the endpoint.
        var receivedAt: UInt64 = 0
        var authorization: String? { head.headers["authorization"] }
    }

    enum Reply: Sendable {
        case json(status: Int, body: String, headers: [(String, String)] = [])
        case raw([UInt8])
        indirect case delayed(Double, Reply)
        case close

        /// The same reply in TestOrigin's terms.
        var originReply: TestOrigin.Reply {
            switch self {
            case .json(let status, let body, let headers):
                return .response(status: status, headers: [("Content-Type", "application/json")] + headers, body: Array(body.utf8))
            case .raw(let bytes): return .raw(bytes)
            case .delayed(let s, let r): return .delayed(s, r.originReply)
            case .close: return .close
            }
        }
    }

    typealias Handler = @Sendable (Received, Int) -> Reply

    /// What the origin's connection threads share with the test: the script and the log.
    private final class State: @unchecked Sendable {  // @unchecked: guarded by `lock`
        let lock = NSLock()
        var handler: Handler
        var received: [Received] = []
        init(handler: @escaping Handler) { self.handler = handler }
    }

    private let state: State
    private let origin: TestOrigin
    private let tls: TLSContext?
    var port: UInt16 { origin.port }

    /// `port` 0 picks a free one; a fixed port lets a test bring an endpoint "back".
    /// With `tls`, connections are served over TLS (`url` is then `https`).
    init(port: UInt16 = 0, tls: TLSContext? = nil, handler: @escaping Handler) throws {
        let state = State(handler: handler)
        self.state = state
        self.tls = tls
        origin = try TestOrigin(port: port, tls: tls) { request in
            let text = String(decoding: request.body, as: UTF8.self)
            let r = Received(head: request.head, body: text, form: ScriptedTokenEndpoint.decodeForm(text), receivedAt: monotonicNanos())
            let (handler, index): (Handler, Int) = state.lock.withLock {
                state.received.append(r)
                return (state.handler, state.received.count)
            }
            return handler(r, index).originReply
        }
    }

    deinit { stop() }

    var handler: Handler {
        get { state.lock.withLock { state.handler } }
        set { state.lock.withLock { state.handler = newValue } }
    }
    var received: [Received] { state.lock.withLock { state.received } }
    var count: Int { state.lock.withLock { state.received.count } }

    var url: EndpointURL {
        EndpointURL(scheme: tls == nil ? "http" : "https", host: "127.0.0.1", port: port, path: "/oauth/token")
    }

    func stop() { origin.stop() }

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
    await boundedAnswer(or: .failure(TokenUnavailable(session: driver.name, retryAfterSeconds: 0, detail: noAnswer))) { answer in
        driver.requestToken(on: loop) { result in
            loop.assertInEventLoop()
            answer(result)
        }
    }
}

func reportRejected(_ driver: TokenSessionDriver, generation: UInt64, on loop: EventLoop = testLoops[0]) async -> RejectionOutcome {
    await boundedAnswer(or: .passThrough(reason: noAnswer)) { answer in
        driver.reportRejected(generation: generation, on: loop) { answer($0) }
    }
}

/// What the helpers above return when the session never answers (a waiter nobody times out,
/// e.g. under a `FakeSessionClock` the test did not advance): the test fails instead of hanging.
let noAnswer = "test: the session did not answer within 30 s"

/// The first of the answer `start` delivers and `fallback` after 30 s (each resumes once).
private func boundedAnswer<T: Sendable>(or fallback: T, _ start: (@escaping @Sendable (T) -> Void) -> Void) async -> T {
    await withCheckedContinuation { (c: CheckedContinuation<T, Never>) in
        let once = ResumeOnce(c)
        DispatchQueue.global().asyncAfter(deadline: .now() + 30) { once.resume(fallback) }
        start { once.resume($0) }
    }
}

/// A continuation resumed at most once, from any thread.
private final class ResumeOnce<T: Sendable>: @unchecked Sendable {  // @unchecked: `continuation` guarded by `lock`
    private let lock = NSLock()
    private var continuation: CheckedContinuation<T, Never>?
    init(_ c: CheckedContinuation<T, Never>) { continuation = c }
    func resume(_ value: T) {
        let c: CheckedContinuation<T, Never>? = lock.withLock {
            defer { continuation = nil }
            return continuation
        }
        c?.resume(returning: value)
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
