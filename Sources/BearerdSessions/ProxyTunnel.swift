import BearerdHTTP
import BearerdIO
import BearerdTLS
import BearerdConfig

/// A tunnel through a forward proxy (`outbound_proxy:`, docs/architecture.md §4) as the first phase of a
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
        /// What went wrong, which decides the answer to the request that waited (`channelError`).
        public enum Kind: Sendable, Equatable {
            /// The proxy's name did not resolve, it refused or reset the TCP connection, or it
            /// closed the connection without answering CONNECT.
            case proxyUnreachable
            /// No connection to the proxy, or no answer to CONNECT, within the timeout.
            case timeout
            /// A final non-2xx answer to CONNECT (407: the proxy wants other credentials).
            case refused(status: Int)
            /// The answer is not HTTP/1.1, or its head is over `maxAnswerBytes`.
            case invalidAnswer
            /// Nobody wanted the tunnel any more (`stillWanted` said so); nothing was handed over.
            case abandoned
        }

        public var kind: Kind
        public var message: String
        /// For a timeout: what timed out, for `ChannelError.timeout` ("… timed out").
        var timedOut: String

        public init(kind: Kind, message: String) {
            self.kind = kind
            self.message = message
            timedOut = message
        }

        init(timeout what: String, message: String) {
            kind = .timeout
            self.message = message
            timedOut = what
        }

        public var description: String { message }

        /// The proxy wants (other) credentials: 407, or 401 (tinyproxy's answer to wrong ones;
        /// to CONNECT only the proxy can answer so). The same rule as the data path's
        /// (`ProxyExchange.UpstreamFailure(outboundProxyRefusal:)`).
        public var wantsCredentials: Bool { kind == .refused(status: 407) || kind == .refused(status: 401) }

        /// `outbound_proxy_auth_required: ` when the proxy wants credentials (the error code a
        /// routed request gets), else empty: for messages that are not JSON answers (the token
        /// endpoint's).
        public var codePrefix: String { wantsCredentials ? "outbound_proxy_auth_required: " : "" }

        /// The failure as the data path's connect error: a timeout is a timeout (504 for the
        /// request), a refusal carries the proxy's status (407 and others answered apart), an
        /// answer that is not HTTP is a protocol error, anything else an unreachable proxy.
        public var channelError: ChannelError {
            switch kind {
            case .timeout: .timeout(timedOut)
            case .refused(let status): .proxyTunnel(status: status, message)
            case .invalidAnswer: .protocolError(message)
            case .proxyUnreachable, .abandoned: .proxyTunnel(status: nil, message)
            }
        }
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
    /// Asked before connecting, before sending CONNECT and before handing over an open tunnel:
    /// false when the request it was for went away (the tunnel is then abandoned, unopened).
    private let stillWanted: () -> Bool
    private var retainedSelf: ProxyTunnel?
    public private(set) var deadline: UInt64

    private init(loop: EventLoop, proxy: OutboundProxy.Endpoint, targetHost: String, targetPort: UInt16, timeout: Duration,
                 stillWanted: @escaping () -> Bool, completion: @escaping (Result<Established, Failure>) -> Void) {
        self.loop = loop
        self.stillWanted = stillWanted
        self.proxy = proxy
        self.targetHost = targetHost
        self.targetPort = targetPort
        self.completion = completion
        let (sum, overflow) = loop.now.addingReportingOverflow(timeout.nanoseconds)
        deadline = overflow ? UInt64.max : sum
    }

    /// Opens a tunnel through `proxy` to `targetHost:targetPort`; `completion` runs once on
    /// `loop` with the open tunnel or why not. Call on `loop`. The returned handle cancels.
    /// `stillWanted` is asked at each step that would commit more (connecting, sending CONNECT,
    /// handing over the open tunnel); once it says no, the tunnel ends `abandoned`: a request
    /// whose client went away meanwhile opens no tunnel and sends nothing through one.
    @discardableResult
    public static func open(through proxy: OutboundProxy.Endpoint, to targetHost: String, port targetPort: UInt16, timeout: Duration,
                            on loop: EventLoop, stillWanted: @escaping () -> Bool = { true },
                            completion: @escaping (Result<Established, Failure>) -> Void) -> ProxyTunnel {
        let tunnel = ProxyTunnel(loop: loop, proxy: proxy, targetHost: targetHost, targetPort: targetPort, timeout: timeout,
                                 stillWanted: stillWanted, completion: completion)
        tunnel.retainedSelf = tunnel
        loop.register(tunnel)
        Resolver.shared.resolve(host: proxy.host, port: proxy.port, on: loop) { [tunnel] result in
            switch result {
            case .success(let addresses): tunnel.attempt(addresses[...])
            case .failure: tunnel.fail(.proxyUnreachable, "cannot resolve the outbound proxy \(proxy.host)")
            }
        }
        return tunnel
    }

    /// `host:port` as in the CONNECT line, for messages.
    private var target: String { ForwardProxyRequest.authority(host: targetHost, port: targetPort) }

    /// Gives up now without calling `completion` (its owner went away). Call on `loop`.
    public func cancel() {
        guard completion != nil else { return }
        completion = nil
        end(closing: true)
    }

    private func attempt(_ addresses: ArraySlice<SocketAddress>) {
        guard case .resolving = phase else { return }
        guard stillWanted() else {
            fail(.abandoned, "no request waits for the tunnel to \(target) any more")
            return
        }
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
        fail(.proxyUnreachable, "cannot connect to the outbound proxy \(proxy): \(lastConnectError)")
    }

    // MARK: LoopTimeoutable

    public func deadlineExpired(now: UInt64) {
        switch phase {
        case .resolving, .connecting:
            fail(Failure(timeout: "connecting to the outbound proxy \(proxy)",
                         message: "cannot connect to the outbound proxy \(proxy): timed out"))
        case .awaitingAnswer:
            fail(Failure(timeout: "the outbound proxy \(proxy)'s answer to CONNECT \(target)",
                         message: "the outbound proxy \(proxy) did not answer CONNECT \(target) in time"))
        case .done:
            break
        }
    }

    // MARK: ChannelDelegate

    public func channelActive(_ channel: SocketChannel) {
        guard case .connecting(let c, _) = phase, c === channel else { return }
        phase = .awaitingAnswer(channel)
        guard stillWanted() else {
            fail(.abandoned, "no request waits for the tunnel to \(target) any more; CONNECT not sent")
            return
        }
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
        fail(.proxyUnreachable, "the outbound proxy \(proxy) closed the connection instead of answering CONNECT")
    }

    public func channelError(_ channel: SocketChannel, _ error: ChannelError) {
        switch phase {
        case .connecting(let c, let remaining) where c === channel:
            if case .connect(let e) = error { lastConnectError = "\(e)" } else { lastConnectError = "\(error)" }
            // The failed channel closes itself after this call; try the next address.
            phase = .resolving
            loop.execute { [self] in
                if remaining.isEmpty {
                    fail(.proxyUnreachable, "cannot connect to the outbound proxy \(proxy): \(lastConnectError)")
                } else {
                    attempt(remaining)
                }
            }
        case .awaitingAnswer(let c) where c === channel:
            fail(.proxyUnreachable, "reading the outbound proxy \(proxy)'s answer to CONNECT: \(error)")
        default:
            break
        }
    }

    public func channelClosed(_ channel: SocketChannel) {
        guard case .awaitingAnswer(let c) = phase, c === channel else { return }
        fail(.proxyUnreachable, "the outbound proxy \(proxy) closed the connection instead of answering CONNECT")
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
                    fail(.invalidAnswer, "the outbound proxy \(proxy)'s answer to CONNECT is too long")
                } else {
                    let line = String(decoding: answerStart.prefix { $0 != 13 && $0 != 10 }.prefix(80), as: UTF8.self)
                    fail(.invalidAnswer, "the outbound proxy \(proxy)'s answer to CONNECT is not HTTP: \(line) (\(error.message))")
                }
                return
            }
            guard let event else { return }
            guard case .responseHead(let head, _) = event else { continue }  // none precedes a final head
            if head.isInformational { continue }
            let statusLine = "\(head.version) \(head.status) \(head.reason)".prefix(120)
            guard head.status >= 200 && head.status <= 299 else {
                let hint = head.status == 407 || head.status == 401
                    ? " (the proxy wants credentials: http://user:password@host:port; "
                        + (proxy.credentials == nil ? "none were given)" : "the ones given were not accepted)")
                    : ""
                fail(.refused(status: head.status), "the outbound proxy \(proxy) refused the tunnel to \(target): \(statusLine)\(hint)")
                return
            }
            // The tunnel is up; a request that went away meanwhile sends nothing through it.
            guard stillWanted() else {
                fail(.abandoned, "no request waits for the tunnel to \(target) any more; closed unused")
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

    private func fail(_ kind: Failure.Kind, _ message: String) {
        fail(Failure(kind: kind, message: message))
    }

    private func fail(_ failure: Failure) {
        if case .done = phase { return }
        end(closing: true)
        let c = completion
        completion = nil
        c?(.failure(failure))
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
