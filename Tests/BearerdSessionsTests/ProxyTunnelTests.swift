import Foundation
import Testing
import BearerdHTTP
import BearerdIO
import BearerdTLS
import BearerdConfig
import BearerdTestSupport
@testable import BearerdSessions

/// `ProxyTunnel` (docs/architecture.md §4, `outbound_proxy:`): CONNECT on the loop over a `SocketChannel`
/// against a scripted proxy on 127.0.0.1 — what it sends, the channel it hands over, and the
/// error for each way a proxy can fail it (refusal, garbage, early close, an oversized head,
/// silence, nothing listening).
@Suite("ProxyTunnel", .serialized)
struct ProxyTunnelTests {
    static let loop = EventLoop(index: 970, readBufferSize: 4096)

    /// Collects what a handed-over channel delivers; touched on `loop` only, read after `done`.
    final class Recorder: ChannelDelegate, @unchecked Sendable {  // @unchecked: written on the loop, read after `done` signals
        var events: [String] = []
        var bytes: [UInt8] = []
        let done = DispatchSemaphore(value: 0)
        let wantBytes: Int
        init(wantBytes: Int) { self.wantBytes = wantBytes }
        func channelActive(_ channel: SocketChannel) { events.append("active") }
        func channelRead(_ channel: SocketChannel, _ b: UnsafeRawBufferPointer) {
            bytes.append(contentsOf: b)
            if bytes.count >= wantBytes {
                events.append("read")
                channel.close()
            }
        }
        func channelEOF(_ channel: SocketChannel) { events.append("eof") }
        func channelError(_ channel: SocketChannel, _ error: ChannelError) { events.append("error \(error)") }
        func channelClosed(_ channel: SocketChannel) { done.signal() }
    }

    final class Box: @unchecked Sendable {  // @unchecked: written on the loop before `done` signals
        var result: Result<ProxyTunnel.Established, ProxyTunnel.Failure>?
        let done = DispatchSemaphore(value: 0)
    }

    /// Opens a tunnel through 127.0.0.1:`port` and waits for its outcome (at most 10 s).
    /// `then` runs on the loop with a success, before anything else can happen to the channel.
    static func open(port: UInt16, credentials: String? = "px:pw", timeout: Duration = .seconds(5),
                     stillWanted: @escaping @Sendable () -> Bool = { true },
                     then: @escaping @Sendable (ProxyTunnel.Established) -> Void = { $0.channel.close() }) -> Result<ProxyTunnel.Established, ProxyTunnel.Failure>? {
        let box = Box()
        loop.execute {
            ProxyTunnel.open(through: OutboundProxy.Endpoint(host: "127.0.0.1", port: port, credentials: credentials),
                             to: "api.example.test", port: 443, timeout: timeout, on: loop, stillWanted: stillWanted) { result in
                if case .success(let t) = result { then(t) }
                box.result = result
                box.done.signal()
            }
        }
        guard box.done.wait(timeout: .now() + 10) == .success else { return nil }
        return box.result
    }

    static func failure(_ result: Result<ProxyTunnel.Established, ProxyTunnel.Failure>?) -> String {
        switch result {
        case .failure(let f)?: return f.message
        case .success?: return "(the tunnel opened)"
        case nil: return "(no outcome within 10 s)"
        }
    }

    /// The failure's kind and its connect error as the data path sees it (which fixes the answer).
    static func classified(_ result: Result<ProxyTunnel.Established, ProxyTunnel.Failure>?) -> (kind: ProxyTunnel.Failure.Kind, error: String)? {
        guard case .failure(let f)? = result else { return nil }
        return (f.kind, "\(f.channelError)")
    }

    static func isTimeout(_ e: ChannelError) -> Bool { if case .timeout = e { return true } else { return false } }

    /// A 1xx, then 200 with the target's first bytes in the same write: the CONNECT carries Host
    /// and the credentials, the channel goes to its owner, and those bytes reach it after
    /// `channelActive`.
    @Test func connectOpensTheTunnelAndHandsOverTheChannel() throws {
        let proxy = try ScriptedOrigin { _ in
            [.text("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 Connection established\r\n\r\nfrom-target"), .readBody]
        }
        defer { proxy.stop() }
        let recorder = Recorder(wantBytes: 11)
        let result = Self.open(port: proxy.port) { t in t.start(delegate: recorder, tls: nil) }
        guard case .success? = result else {
            Issue.record("tunnel failed: \(Self.failure(result))")
            return
        }
        #expect(recorder.done.wait(timeout: .now() + 10) == .success)
        #expect(recorder.events == ["active", "read"])
        #expect(String(decoding: recorder.bytes, as: UTF8.self) == "from-target")
        let seen = proxy.requests.first?.head
        #expect(seen?.method == "CONNECT")
        #expect(seen?.target == "api.example.test:443")
        #expect(seen?.headers["Host"] == "api.example.test:443")
        #expect(seen?.headers["Proxy-Authorization"] == "Basic " + Base64Check.encode("px:pw"))
    }

    @Test func proxyAskingForCredentialsIsNamed() throws {
        let proxy = try ScriptedOrigin { _ in
            [.send(ScriptedOrigin.response(status: 407, reason: "Proxy Authentication Required",
                                           headers: [("Proxy-Authenticate", "Basic realm=\"p\"")], body: Array("denied".utf8))), .close]
        }
        defer { proxy.stop() }
        let result = Self.open(port: proxy.port, credentials: nil)
        let message = Self.failure(result)
        #expect(message == "the outbound proxy http://127.0.0.1:\(proxy.port) refused the tunnel to api.example.test:443: "
            + "HTTP/1.1 407 Proxy Authentication Required (the proxy wants credentials: http://user:password@host:port; none were given)")
        // Classified apart: the data path answers `outbound_proxy_auth_required` from the status.
        #expect(Self.classified(result)?.kind == .refused(status: 407))
        guard case .failure(let f)? = result, case .proxyTunnel(let status, _) = f.channelError else {
            Issue.record("not a tunnel refusal: \(String(describing: Self.classified(result)))")
            return
        }
        #expect(status == 407)
        #expect(f.codePrefix == "outbound_proxy_auth_required: ")
    }

    @Test(arguments: [(403, "Forbidden"), (502, "Bad Gateway")])
    func proxyRefusingTheTunnelIsNamed(status: Int, reason: String) throws {
        let proxy = try ScriptedOrigin { _ in [.send(ScriptedOrigin.response(status: status, reason: reason)), .close] }
        defer { proxy.stop() }
        let result = Self.open(port: proxy.port)
        #expect(Self.failure(result) == "the outbound proxy http://127.0.0.1:\(proxy.port) refused the tunnel to api.example.test:443: HTTP/1.1 \(status) \(reason)")
        #expect(Self.classified(result)?.kind == .refused(status: status))
        guard case .failure(let f)? = result, case .proxyTunnel(let seen, _) = f.channelError else {
            Issue.record("not a tunnel refusal")
            return
        }
        #expect(seen == status)
        #expect(f.codePrefix == "")
    }

    @Test func malformedStatusLineIsNotHTTP() throws {
        let proxy = try ScriptedOrigin { _ in [.text("SSH-2.0-OpenSSH_9.6\r\n\r\n"), .readBody] }
        defer { proxy.stop() }
        let result = Self.open(port: proxy.port)
        let message = Self.failure(result)
        #expect(message.hasPrefix("the outbound proxy http://127.0.0.1:\(proxy.port)'s answer to CONNECT is not HTTP: SSH-2.0-OpenSSH_9.6"), "\(message)")
        #expect(Self.classified(result)?.kind == .invalidAnswer)
        guard case .failure(let f)? = result, case .protocolError = f.channelError else {
            Issue.record("not a protocol error")
            return
        }
    }

    @Test func proxyClosingBeforeAnsweringIsNamed() throws {
        let proxy = try ScriptedOrigin { _ in [.close] }
        defer { proxy.stop() }
        let result = Self.open(port: proxy.port)
        #expect(Self.failure(result) == "the outbound proxy http://127.0.0.1:\(proxy.port) closed the connection instead of answering CONNECT")
        #expect(Self.classified(result)?.kind == .proxyUnreachable)
    }

    @Test func oversizedAnswerHeadIsRefused() throws {
        let pad = String(repeating: "a", count: 20 * 1024)
        let proxy = try ScriptedOrigin { _ in [.text("HTTP/1.1 200 OK\r\nX-Pad: \(pad)\r\n\r\n"), .readBody] }
        defer { proxy.stop() }
        let result = Self.open(port: proxy.port)
        #expect(Self.failure(result) == "the outbound proxy http://127.0.0.1:\(proxy.port)'s answer to CONNECT is too long")
        #expect(Self.classified(result)?.kind == .invalidAnswer)
    }

    @Test func silentProxyTimesOut() throws {
        let gate = ScriptedOrigin.Gate()
        let proxy = try ScriptedOrigin { _ in [.await(gate, timeoutMs: 10_000), .close] }
        defer {
            gate.open()
            proxy.stop()
        }
        let result = Self.open(port: proxy.port, timeout: .milliseconds(300))
        #expect(Self.failure(result) == "the outbound proxy http://127.0.0.1:\(proxy.port) did not answer CONNECT api.example.test:443 in time")
        #expect(proxy.waitForRequests(1))  // the CONNECT did arrive: the silence was the proxy's
        // A timeout for the data path (504), not an unreachable upstream.
        #expect(Self.classified(result)?.kind == .timeout)
        guard case .failure(let f)? = result else { return }
        #expect(Self.isTimeout(f.channelError))
        #expect("\(f.channelError)" == "the outbound proxy http://127.0.0.1:\(proxy.port)'s answer to CONNECT api.example.test:443 timed out")
    }

    @Test func nothingListeningIsAConnectError() throws {
        let port = NginxOrigin.freePort()
        let result = Self.open(port: port)
        let message = Self.failure(result)
        #expect(message.hasPrefix("cannot connect to the outbound proxy http://127.0.0.1:\(port): "), "\(message)")
        #expect(message.contains("refused"), "\(message)")
        #expect(Self.classified(result)?.kind == .proxyUnreachable)
        guard case .failure(let f)? = result, case .proxyTunnel(nil, _) = f.channelError else {
            Issue.record("not an unreachable proxy")
            return
        }
    }

    /// Nobody wants the tunnel before it starts: no connection to the proxy at all.
    @Test func unwantedBeforeConnectingOpensNothing() throws {
        let proxy = try ScriptedOrigin { _ in [.send(ScriptedOrigin.response(status: 200, reason: "Connection established")), .readBody] }
        defer { proxy.stop() }
        let result = Self.open(port: proxy.port, stillWanted: { false })
        #expect(Self.classified(result)?.kind == .abandoned)
        Thread.sleep(forTimeInterval: 0.2)
        #expect(proxy.connectionsAccepted == 0)
    }

    /// The request went away while the proxy held its answer: the 200 comes, the tunnel is
    /// closed unused (not handed over, nothing sent through it).
    @Test func unwantedWhenTheAnswerComesIsClosedUnused() throws {
        let gate = ScriptedOrigin.Gate()
        let proxy = try ScriptedOrigin { _ in
            [.await(gate, timeoutMs: 10_000), .send(ScriptedOrigin.response(status: 200, reason: "Connection established")), .readBody]
        }
        defer {
            gate.open()
            proxy.stop()
        }
        let wanted = Flag(true)
        let box = Box()
        Self.loop.execute {
            ProxyTunnel.open(through: OutboundProxy.Endpoint(host: "127.0.0.1", port: proxy.port), to: "api.example.test", port: 443,
                             timeout: .seconds(5), on: Self.loop, stillWanted: { wanted.value }) { result in
                if case .success(let t) = result { t.channel.close() }
                box.result = result
                box.done.signal()
            }
        }
        #expect(proxy.waitForRequests(1), "the CONNECT went out while wanted")
        wanted.value = false
        gate.open()
        #expect(box.done.wait(timeout: .now() + 10) == .success)
        #expect(Self.classified(box.result)?.kind == .abandoned)
        #expect(String(decoding: proxy.allRaw, as: UTF8.self).hasSuffix("\r\n\r\n"), "nothing but the CONNECT head was sent")
    }
}

/// A Bool read on the loop and set from the test (ordered by the gate that follows the write).
final class Flag: @unchecked Sendable {  // @unchecked: guarded by `lock`
    private let lock = NSLock()
    private var _value: Bool
    init(_ v: Bool) { _value = v }
    var value: Bool {
        get { lock.withLock { _value } }
        set { lock.withLock { _value = newValue } }
    }
}

/// Basic credentials as the proxy expects them (RFC 7617), independent of bearerd's encoder.
enum Base64Check {
    static func encode(_ s: String) -> String { Data(s.utf8).base64EncodedString() }
}
