import BearerdHTTP
import Dispatch
import BearerdIO
import BearerdOAuth
import BearerdTLS
import BearerdConfig

/// What one token request produced, before RFC 6749 classification.
enum TokenEndpointOutcome {
    /// A complete HTTP response (status, fields, body ≤ `TokenEndpointClient.maxBodyBytes`).
    case response(status: Int, headers: [(name: String, value: String)], body: [UInt8])
    /// The response body was larger than `maxBodyBytes`: refused unread (docs/architecture.md §6).
    case tooLarge(status: Int)
    /// No (complete) response: connect, TLS, reset, malformed response or timeout.
    /// `requestSent`: the request was handed to the socket, so the server may have acted on it
    /// (the same-token retry rule of docs/architecture.md §6.7).
    case transportFailure(detail: String, requestSent: Bool)
}

/// Sends one HTTP/1.1 `POST` of an encoded token request (RFC 6749 §3.2) and reads the answer.
///
/// Uses bearerd's own `SocketChannel` (plus `TLSEngine` for `https` token URLs, verified like
/// upstreams: system trust store or `ca_file`, host name, SNI, optional client certificate),
/// `Resolver` for DNS and the strict `HTTP1Parser(role: .client)` for the response. Behind
/// `outbound_proxy:`, an https endpoint is reached through a `ProxyTunnel` (CONNECT) and an http
/// one in absolute form (`ForwardProxyRequest`). One connection per request
/// (`Connection: close`). Bodies over 1 MiB are refused.
///
/// Owns the connection of the request in progress and itself until it completes (a self
/// reference kept in `retainedSelf`). Lives on `loop` (the session queue): every method and
/// every channel callback runs there. Invariants: `completion` is called exactly once, on
/// `loop`; after it the channel is closed and nothing else happens.
final class TokenEndpointClient: ChannelDelegate {
    static let maxBodyBytes = 1 << 20

    private let loop: EventLoop
    private let url: EndpointURL
    private let tlsContext: TLSContext?
    private let requestBytes: [UInt8]
    private var completion: ((TokenEndpointOutcome) -> Void)?
    private var retainedSelf: TokenEndpointClient?
    private var channel: SocketChannel?
    private var parser = HTTP1Parser(role: .client)
    private var requestSent = false
    private var head: HTTPResponseHead?
    private var body: [UInt8] = []
    private var remainingAddresses: ArraySlice<SocketAddress> = []
    private var lastConnectError = ""
    /// The CONNECT phase through `outbound_proxy:` while it runs (cancelled with the request).
    private var tunnel: ProxyTunnel?

    /// `outbound_proxy:` for this URL, if any.
    private let proxy: OutboundProxy.Endpoint?

    private init(loop: EventLoop, url: EndpointURL, tlsContext: TLSContext?, request: EncodedTokenRequest?, proxy: OutboundProxy.Endpoint?,
                 getHeaders: [(name: String, value: String)] = []) {
        self.loop = loop
        self.url = url
        self.tlsContext = tlsContext
        self.proxy = proxy
        // docs/architecture.md §5: the endpoint's path and query byte for byte (a trailing slash kept).
        let target = url.requestTarget
        var headers = HTTPHeaders()
        headers.add("Host", url.authority)
        let method = request == nil ? "GET" : "POST"
        if let request {
            for field in request.headers { headers.add(field.name, field.value) }
            headers.add("Content-Length", String(request.body.count))
        } else {
            headers.add("Accept", "application/json")
            for field in getHeaders { headers.add(field.name, field.value) }
        }
        headers.add("User-Agent", "bearerd/\(BearerdVersion.string)")
        headers.add("Connection", "close")
        var head = HTTPRequestHead(method: method, target: target, headers: headers)
        if let proxy, !url.isTLS {
            // Through a forward proxy: the absolute form (RFC 9112 §3.2.2) and the proxy's credentials.
            head = ForwardProxyRequest.absoluteForm(head, authority: url.authority, proxyAuthorization: proxy.proxyAuthorization)
        }
        var bytes: [UInt8] = []
        HTTP1Serializer.writeRequestHead(head, into: &bytes)
        if let request { bytes.append(contentsOf: request.body) }
        requestBytes = bytes
        parser.expectResponse(to: method)
    }

    /// A `GET` of a JSON document (authorization server metadata, a credentials vending
    /// endpoint), same transport and limits. `headers` are added as given (a vending endpoint's
    /// `url_headers:` and `Authorization`, docs/architecture.md §6.15).
    @discardableResult
    static func get(_ url: EndpointURL, headers: [(name: String, value: String)] = [], tls: TLSContext?,
                    proxy: OutboundProxy.Endpoint? = nil, on loop: EventLoop,
                    completion: @escaping (TokenEndpointOutcome) -> Void) -> TokenEndpointClient {
        let client = TokenEndpointClient(loop: loop, url: url, tlsContext: tls, request: nil, proxy: proxy, getHeaders: headers)
        client.completion = completion
        client.retainedSelf = client
        loop.execute { client.resolve() }
        return client
    }

    /// Runs one request on a private loop and waits for it (at most `timeout`): for commands
    /// and start-up work on their own thread, never on a proxy loop.
    static func blocking(timeout: Duration, _ start: (EventLoop, @escaping (TokenEndpointOutcome) -> Void) -> TokenEndpointClient) -> TokenEndpointOutcome {
        let loop = EventLoop(index: 0, readBufferSize: 16 * 1024)
        final class Box: @unchecked Sendable { var outcome: TokenEndpointOutcome? }  // @unchecked: written before `done` signals
        let box = Box()
        let done = DispatchSemaphore(value: 0)
        let client = start(loop) { outcome in
            box.outcome = outcome
            done.signal()
        }
        if done.wait(timeout: .now() + .milliseconds(Int(clamping: timeout.nanosecondsClamped / 1_000_000))) == .timedOut {
            loop.execute { client.cancel(detail: "no answer within \(timeout)") }
            done.wait()
        }
        return box.outcome ?? .transportFailure(detail: "no answer", requestSent: true)
    }

    /// Starts the request; `completion` runs once on `loop`. The returned handle cancels it
    /// (as a transport failure with `detail`), e.g. when the fetch's own timeout fires.
    @discardableResult
    static func post(_ request: EncodedTokenRequest, to url: EndpointURL, tls: TLSContext?, proxy: OutboundProxy.Endpoint? = nil,
                     on loop: EventLoop, completion: @escaping (TokenEndpointOutcome) -> Void) -> TokenEndpointClient {
        let client = TokenEndpointClient(loop: loop, url: url, tlsContext: tls, request: request, proxy: proxy)
        client.completion = completion
        client.retainedSelf = client
        loop.execute { client.resolve() }
        return client
    }

    /// Ends the request now with a transport failure (no-op once finished). Call on `loop`.
    func cancel(detail: String) {
        finish(.transportFailure(detail: detail, requestSent: requestSent))
    }

    private func resolve() {
        guard completion != nil else { return }
        if let proxy, url.isTLS {
            // https through `outbound_proxy:`: a CONNECT tunnel, TLS to the token endpoint inside it.
            tunnel = ProxyTunnel.open(through: proxy, to: url.host, port: url.port, timeout: .seconds(10), on: loop) { [self] result in
                tunnel = nil
                guard completion != nil else {
                    if case .success(let t) = result { t.channel.close() }
                    return
                }
                switch result {
                case .failure(let f):
                    // The same words as a routed request's answer (`outbound_proxy_auth_required` for a 407).
                    finish(.transportFailure(detail: f.codePrefix + f.message, requestSent: false))
                case .success(let t):
                    do {
                        var engine: TLSEngine?
                        if let tlsContext { engine = try TLSEngine(client: tlsContext, serverName: url.host, port: url.port) }
                        channel = t.start(delegate: self, tls: engine)
                    } catch {
                        t.channel.close()
                        finish(.transportFailure(detail: "\(error)", requestSent: false))
                    }
                }
            }
            return
        }
        let (host, port) = proxy.map { ($0.host, $0.port) } ?? (url.host, url.port)
        Resolver.shared.resolve(host: host, port: port, on: loop) { [self] result in
            switch result {
            case .success(let addresses):
                attempt(addresses[...])
            case .failure(let error):
                finish(.transportFailure(detail: "cannot resolve \(url.host): \(error)", requestSent: false))
            }
        }
    }

    private func attempt(_ addresses: ArraySlice<SocketAddress>) {
        guard completion != nil else { return }
        guard let address = addresses.first else {
            finish(.transportFailure(detail: "cannot connect to \(url.authority): \(lastConnectError)", requestSent: false))
            return
        }
        remainingAddresses = addresses.dropFirst()
        do {
            var engine: TLSEngine?
            if let tlsContext { engine = try TLSEngine(client: tlsContext, serverName: url.host, port: url.port) }
            channel = try SocketChannel.connect(to: address, loop: loop, tls: engine, delegate: self)
        } catch let error as TLSError {
            finish(.transportFailure(detail: "\(error)", requestSent: false))
        } catch {
            lastConnectError = "\(error)"
            attempt(remainingAddresses)
        }
    }

    // MARK: ChannelDelegate

    func channelActive(_ channel: SocketChannel) {
        guard completion != nil else { return }
        channel.write(requestBytes)
        // The write happens at the end of this event; if the socket took it (or holds it for
        // a write source), the server may act on it. A refused connection fails that write
        // first (channelError), and then nothing was sent.
        loop.deferToEndOfEvent { [self] in
            if completion != nil, !channel.isClosed { requestSent = true }
        }
    }

    func channelRead(_ channel: SocketChannel, _ bytes: UnsafeRawBufferPointer) {
        guard completion != nil else { return }
        requestSent = true
        parser.feed(bytes)
        pump()
    }

    func channelEOF(_ channel: SocketChannel) {
        guard completion != nil else { return }
        parser.feedEOF()
        pump()
        if completion != nil {
            finish(.transportFailure(detail: "connection closed before a complete response", requestSent: requestSent))
        }
    }

    func channelError(_ channel: SocketChannel, _ error: ChannelError) {
        guard completion != nil else { return }
        if case .connect(let e) = error, !requestSent, !remainingAddresses.isEmpty {
            // Try the next address of the name; the failed channel closes itself.
            self.channel = nil
            lastConnectError = "\(e)"
            let rest = remainingAddresses
            loop.execute { [self] in attempt(rest) }
            return
        }
        finish(.transportFailure(detail: "\(error)", requestSent: requestSent))
    }

    func channelClosed(_ channel: SocketChannel) {
        guard completion != nil, channel === self.channel else { return }
        finish(.transportFailure(detail: "connection closed before a complete response", requestSent: requestSent))
    }

    private func pump() {
        while completion != nil {
            let event: HTTP1Event?
            do {
                event = try parser.next()
            } catch {
                finish(.transportFailure(detail: "malformed token endpoint response: \(error.reason)", requestSent: requestSent))
                return
            }
            guard let event else { return }
            switch event {
            case .responseHead(let h, let framing):
                if h.isInformational { continue }
                if h.status == 407, let proxy, !url.isTLS {
                    // The absolute-form request stopped at the outbound proxy (RFC 9110 §15.5.8):
                    // the token endpoint never saw it.
                    let reason = "\(h.status) \(h.reason)".prefix(80)
                    finish(.transportFailure(detail: "outbound_proxy_auth_required: the outbound proxy \(proxy) answered \(reason)"
                                             + (proxy.credentials == nil ? " (it wants credentials: http://user:password@host:port)"
                                                                         : " (the credentials given were not accepted)"),
                                             requestSent: false))
                    return
                }
                head = h
                if case .contentLength(let n) = framing, n > UInt64(Self.maxBodyBytes) {
                    finish(.tooLarge(status: h.status))
                    return
                }
            case .body(let slice):
                body.append(contentsOf: slice)
                if body.count > Self.maxBodyBytes {
                    finish(.tooLarge(status: head?.status ?? 0))
                    return
                }
            case .end:
                guard let head else { continue }
                finish(.response(status: head.status, headers: head.headers.fields.map { ($0.name, $0.value) }, body: body))
                return
            case .requestHead:
                finish(.transportFailure(detail: "malformed token endpoint response", requestSent: requestSent))
                return
            }
        }
    }

    private func finish(_ outcome: TokenEndpointOutcome) {
        guard let completion else { return }
        self.completion = nil
        tunnel?.cancel()
        tunnel = nil
        let ch = channel
        channel = nil
        ch?.delegate = nil
        ch?.close()
        completion(outcome)
        retainedSelf = nil
    }
}
