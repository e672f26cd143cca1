import Foundation
import Testing
import BearerdHTTP
import BearerdIO
import BearerdTLS
import BearerdConfig
import BearerdTestSupport
@testable import BearerdSessions

/// `ProxyTunnel` (DESIGN §4, `outbound_proxy:`): CONNECT on the loop over a `SocketChannel`
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
                     then: @escaping @Sendable (ProxyTunnel.Established) -> Void = { $0.channel.close() }) -> Result<ProxyTunnel.Established, ProxyTunnel.Failure>? {
        let box = Box()
        loop.execute {
            ProxyTunnel.open(through: OutboundProxy.Endpoint(host: "127.0.0.1", port: port, credentials: credentials),
                             to: "api.example.test", port: 443, timeout: timeout, on: loop) { result in
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
        let message = Self.failure(Self.open(port: proxy.port, credentials: nil))
        #expect(message == "the proxy refused the tunnel: HTTP/1.1 407 Proxy Authentication Required"
            + " (the proxy wants credentials: http://user:password@host:port)")
    }

    @Test(arguments: [(403, "Forbidden"), (502, "Bad Gateway")])
    func proxyRefusingTheTunnelIsNamed(status: Int, reason: String) throws {
        let proxy = try ScriptedOrigin { _ in [.send(ScriptedOrigin.response(status: status, reason: reason)), .close] }
        defer { proxy.stop() }
        let message = Self.failure(Self.open(port: proxy.port))
        #expect(message == "the proxy refused the tunnel: HTTP/1.1 \(status) \(reason)")
    }

    @Test func malformedStatusLineIsNotHTTP() throws {
        let proxy = try ScriptedOrigin { _ in [.text("SSH-2.0-OpenSSH_9.6\r\n\r\n"), .readBody] }
        defer { proxy.stop() }
        let message = Self.failure(Self.open(port: proxy.port))
        #expect(message.hasPrefix("the proxy's answer to CONNECT is not HTTP: SSH-2.0-OpenSSH_9.6"), "\(message)")
    }

    @Test func proxyClosingBeforeAnsweringIsNamed() throws {
        let proxy = try ScriptedOrigin { _ in [.close] }
        defer { proxy.stop() }
        #expect(Self.failure(Self.open(port: proxy.port)) == "the proxy closed the connection instead of answering CONNECT")
    }

    @Test func oversizedAnswerHeadIsRefused() throws {
        let pad = String(repeating: "a", count: 20 * 1024)
        let proxy = try ScriptedOrigin { _ in [.text("HTTP/1.1 200 OK\r\nX-Pad: \(pad)\r\n\r\n"), .readBody] }
        defer { proxy.stop() }
        #expect(Self.failure(Self.open(port: proxy.port)) == "the proxy's answer to CONNECT is too long")
    }

    @Test func silentProxyTimesOut() throws {
        let gate = ScriptedOrigin.Gate()
        let proxy = try ScriptedOrigin { _ in [.await(gate, timeoutMs: 10_000), .close] }
        defer {
            gate.open()
            proxy.stop()
        }
        let message = Self.failure(Self.open(port: proxy.port, timeout: .milliseconds(300)))
        #expect(message == "the proxy did not answer CONNECT in time")
        #expect(proxy.waitForRequests(1))  // the CONNECT did arrive: the silence was the proxy's
    }

    @Test func nothingListeningIsAConnectError() throws {
        let port = NginxOrigin.freePort()
        let message = Self.failure(Self.open(port: port))
        #expect(message.hasPrefix("cannot connect to the proxy http://127.0.0.1:\(port): "), "\(message)")
    }
}

/// Basic credentials as the proxy expects them (RFC 7617), independent of bearerd's encoder.
enum Base64Check {
    static func encode(_ s: String) -> String { Data(s.utf8).base64EncodedString() }
}
