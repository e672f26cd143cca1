import BearerdHTTP
import BearerdIO
import BearerdTLS
import BearerdConfig

/// A tunnel through a forward proxy (`outbound_proxy:`, DESIGN §4) as the first phase of a
/// connection, for the token endpoint client and for upstream connections: resolve the proxy,
/// connect a non-blocking `SocketChannel` to it, send `CONNECT host:port` (RFC 9110 §9.3.6;
/// the head from `ForwardProxyRequest`, with `Proxy-Authorization` when the proxy URL carried
/// credentials) and read the answer with `HTTP1Parser` in client role. A 2xx opens the tunnel
/// (RFC 9110 §15.3, RFC 9112 §6.3 rule 2); the same channel then goes to its owner
/// (`Established.start`), which starts TLS to the target inside it.
///
/// Owns the channel until it completes, and itself meanwhile (`retainedSelf`; the loop also
/// holds it through `register` for the deadline). Lives on `loop`: every method and channel
/// callback runs there. Invariants: `completion` runs exactly once, on `loop`; after a failure
/// the channel is closed; after success the tunnel is no longer the channel's delegate and
/// touches it no more. The whole phase (resolve, connect, answer) is bounded by `timeout`.
public final class ProxyTunnel: ChannelDelegate, LoopTimeoutable {
    /// Why the tunnel did not open; `message` is for the operator (never holds the credentials).
    public struct Failure: Error, Sendable, CustomStringConvertible {
        public var message: String
        public init(message: String) { self.message = message }
        public var description: String { message }
    }

    /// An open tunnel: the channel (plaintext, reading on, delegate the tunnel until `start`)
    /// and the bytes the proxy already relayed from the target after its answer.
    public struct Established {
        public let channel: SocketChannel
        let pending: [UInt8]

        /// Hands the channel to `delegate`, starting the client TLS handshake when `tls` is
        /// given; `channelActive` follows as after `SocketChannel.connect`.
        @discardableResult
        public func start(delegate: ChannelDelegate, tls: TLSEngine?) -> SocketChannel {
            channel.handOver(to: delegate, startingTLS: tls, pending: pending)
            return channel
        }
    }

    /// The bound on the proxy's answer head (status line and fields), as before the parser.
    static let maxAnswerBytes = 16 * 1024

    /// Where the tunnel is.
    enum Phase {
        /// The proxy's name is being resolved.
        case resolving
        /// connect(2) to one of the proxy's addresses; the rest are tried in turn.
        case connecting(SocketChannel, remaining: ArraySlice<SocketAddress>)
        /// CONNECT sent (or queued); the answer head is being read.
        case awaitingAnswer(SocketChannel)
        /// Completed (either way) or cancelled; nothing more happens.
        case done
    }

    private let loop: EventLoop
    private let proxy: OutboundProxy.Endpoint
    private let targetHost: String
    private let targetPort: UInt16
    private var phase = Phase.resolving
    private var parser = HTTP1Parser(role: .client, limits: HTTP1Limits(maxHeaderBytes: ProxyTunnel.maxAnswerBytes,
                                                                      maxRequestTarget: 8 * 1024, maxHeaderCount: 100))
    /// The first bytes of the answer, for the message when they are not HTTP.
    private var answerStart: [UInt8] = []
    private var lastConnectError = "no address"
    private var completion: ((Result<Established, Failure>) -> Void)?
    private var retainedSelf: ProxyTunnel?
    public private(set) var deadline: UInt64

    private init(loop: EventLoop, proxy: OutboundProxy.Endpoint, targetHost: String, targetPort: UInt16, timeout: Duration,
                 completion: @escaping (Result<Established, Failure>) -> Void) {
        self.loop = loop
        self.proxy = proxy
        self.targetHost = targetHost
        self.targetPort = targetPort
        self.completion = completion
        let (sum, overflow) = loop.now.addingReportingOverflow(timeout.nanoseconds)
        deadline = overflow ? UInt64.max : sum
    }

    /// Opens a tunnel through `proxy` to `targetHost:targetPort`; `completion` runs once on
    /// `loop` with the open tunnel or why not. Call on `loop`. The returned handle cancels.
    @discardableResult
    public static func open(through proxy: OutboundProxy.Endpoint, to targetHost: String, port targetPort: UInt16, timeout: Duration,
                            on loop: EventLoop, completion: @escaping (Result<Established, Failure>) -> Void) -> ProxyTunnel {
        let tunnel = ProxyTunnel(loop: loop, proxy: proxy, targetHost: targetHost, targetPort: targetPort, timeout: timeout,
                                 completion: completion)
        tunnel.retainedSelf = tunnel
        loop.register(tunnel)
        Resolver.shared.resolve(host: proxy.host, port: proxy.port, on: loop) { [tunnel] result in
            switch result {
            case .success(let addresses): tunnel.attempt(addresses[...])
            case .failure: tunnel.fail("cannot resolve the proxy \(proxy.host)")
            }
        }
        return tunnel
    }

    /// Gives up now without calling `completion` (its owner went away). Call on `loop`.
    public func cancel() {
        guard completion != nil else { return }
        completion = nil
        end(closing: true)
    }

    private func attempt(_ addresses: ArraySlice<SocketAddress>) {
        guard case .resolving = phase else { return }
        var rest = addresses
        while let address = rest.popFirst() {
            do {
                let channel = try SocketChannel.connect(to: address, loop: loop, tls: nil, delegate: self)
                phase = .connecting(channel, remaining: rest)
                return
            } catch {
                lastConnectError = "\(error)"
            }
        }
        fail("cannot connect to the proxy \(proxy): \(lastConnectError)")
    }

    // MARK: LoopTimeoutable

    public func deadlineExpired(now: UInt64) {
        switch phase {
        case .resolving, .connecting:
            fail("cannot connect to the proxy \(proxy): timed out")
        case .awaitingAnswer:
            fail("the proxy did not answer CONNECT in time")
        case .done:
            break
        }
    }

    // MARK: ChannelDelegate

    public func channelActive(_ channel: SocketChannel) {
        guard case .connecting(let c, _) = phase, c === channel else { return }
        phase = .awaitingAnswer(channel)
        parser.expectResponse(to: "CONNECT")
        channel.write(ForwardProxyRequest.connectBytes(host: targetHost, port: targetPort, proxyAuthorization: proxy.proxyAuthorization))
    }

    public func channelRead(_ channel: SocketChannel, _ bytes: UnsafeRawBufferPointer) {
        guard case .awaitingAnswer(let c) = phase, c === channel else { return }
        if answerStart.count < 120 { answerStart.append(contentsOf: bytes.prefix(120 - answerStart.count)) }
        parser.feed(bytes)
        readAnswer()
    }

    public func channelEOF(_ channel: SocketChannel) {
        guard case .awaitingAnswer(let c) = phase, c === channel else { return }
        fail("the proxy closed the connection instead of answering CONNECT")
    }

    public func channelError(_ channel: SocketChannel, _ error: ChannelError) {
        switch phase {
        case .connecting(let c, let remaining) where c === channel:
            if case .connect(let e) = error { lastConnectError = "\(e)" } else { lastConnectError = "\(error)" }
            // The failed channel closes itself after this call; try the next address.
            phase = .resolving
            loop.execute { [self] in
                if remaining.isEmpty {
                    fail("cannot connect to the proxy \(proxy): \(lastConnectError)")
                } else {
                    attempt(remaining)
                }
            }
        case .awaitingAnswer(let c) where c === channel:
            fail("reading the proxy's answer to CONNECT: \(error)")
        default:
            break
        }
    }

    public func channelClosed(_ channel: SocketChannel) {
        guard case .awaitingAnswer(let c) = phase, c === channel else { return }
        fail("the proxy closed the connection instead of answering CONNECT")
    }

    /// Reads the answer's events: 1xx are skipped, a 2xx opens the tunnel, any other final
    /// status refuses it, a parse error means the proxy does not speak HTTP/1.1.
    private func readAnswer() {
        while case .awaitingAnswer(let channel) = phase {
            let event: HTTP1Event?
            do {
                event = try parser.next()
            } catch {
                if error.reason == "http1.header_too_large" {
                    fail("the proxy's answer to CONNECT is too long")
                } else {
                    let line = String(decoding: answerStart.prefix { $0 != 13 && $0 != 10 }.prefix(80), as: UTF8.self)
                    fail("the proxy's answer to CONNECT is not HTTP: \(line) (\(error.message))")
                }
                return
            }
            guard let event else { return }
            guard case .responseHead(let head, _) = event else { continue }  // none precedes a final head
            if head.isInformational { continue }
            let statusLine = "\(head.version) \(head.status) \(head.reason)".prefix(120)
            guard head.status >= 200 && head.status <= 299 else {
                let hint = head.status == 407 ? " (the proxy wants credentials: http://user:password@host:port)" : ""
                fail("the proxy refused the tunnel: \(statusLine)\(hint)")
                return
            }
            let established = Established(channel: channel, pending: parser.switchProtocols())
            phase = .done
            end(closing: false)
            let c = completion
            completion = nil
            c?(.success(established))
            return
        }
    }

    private func fail(_ message: String) {
        if case .done = phase { return }
        end(closing: true)
        let c = completion
        completion = nil
        c?(.failure(Failure(message: message)))
    }

    /// Leaves the phase: the deadline is dropped, the channel closed on failure, the self
    /// reference released.
    private func end(closing: Bool) {
        let channel: SocketChannel?
        switch phase {
        case .connecting(let c, _), .awaitingAnswer(let c): channel = c
        case .resolving, .done: channel = nil
        }
        phase = .done
        deadline = 0
        loop.unregister(self)
        if closing, let channel {
            channel.delegate = nil
            channel.close()
        }
        retainedSelf = nil
    }
}
