import BearerdHTTP
import BearerdIO
import BearerdTLS
import BearerdProxyCore
import BearerdConfig
import BearerdSessions
import BearerdService

/// Where a route's requests go: everything needed to open or reuse a connection, precomputed
/// once per configuration (the TLS context is shared by all loops).
public final class UpstreamTarget: @unchecked Sendable {  // @unchecked: immutable after init
    public struct Key: Hashable, Sendable {
        public var scheme: String
        public var host: String
        public var port: UInt16
        public var tls: TLSSettings?
        public var http2: HTTP2Mode
    }
    public let key: Key
    public let url: UpstreamURL
    public let tlsContext: TLSContext?
    public let connectTimeout: UInt64
    public let responseTimeout: UInt64
    public let idleTimeout: UInt64
    public var maxIdle = 64
    /// `http2:` of the route: whether and how HTTP/2 is used towards this upstream.
    public let http2: HTTP2Mode

    public init(url: UpstreamURL, tls: TLSSettings?, timeouts: RouteTimeouts, http2: HTTP2Mode = .auto) throws(TLSError) {
        self.url = url
        self.http2 = http2
        key = Key(scheme: url.scheme, host: url.host, port: url.port, tls: url.isTLS ? tls : nil, http2: http2)
        if url.isTLS {
            // DESIGN §2.3: ALPN h2,http/1.1 where HTTP/2 is enabled.
            let alpn: [String]
            switch http2 {
            case .auto: alpn = ["h2", "http/1.1"]
            case .priorKnowledge: alpn = ["h2"]
            case .off: alpn = ["http/1.1"]
            }
            tlsContext = try TLSContext.client(caFile: tls?.caFile, clientCert: tls?.clientCert, clientKey: tls?.clientKey, alpn: alpn)
        } else {
            tlsContext = nil
        }
        connectTimeout = timeouts.connect.nanoseconds
        responseTimeout = timeouts.response.nanoseconds
        idleTimeout = timeouts.idle.nanoseconds
    }
}

/// What an upstream stream reports to the exchange using it. Calls arrive on the loop.
protocol BackendConnectionDelegate: AnyObject {
    /// `endStream`: the head is the whole response (an HTTP/2 HEADERS frame with END_STREAM).
    func backendResponseHead(_ head: HTTPResponseHead, framing: HTTP1BodyFraming, endStream: Bool)
    func backendBody(_ bytes: ArraySlice<UInt8>)
    func backendEnd(trailers: HTTPHeaders?)
    /// Everything one read produced has been delivered (a response head still held back goes out now).
    func backendReadComplete()
    /// The connection failed. `reused`: it came from the pool; `responseBytesSeen`: a byte of the
    /// response to this request arrived (both decide whether a retry on a fresh connection is safe).
    func backendFailed(_ error: ChannelError, reused: Bool, responseBytesSeen: Bool)
    func backendWritable()
    /// After `switchProtocols()`: raw bytes from the upstream, and its end.
    func backendTunnelBytes(_ raw: UnsafeRawBufferPointer)
    func backendTunnelEnded()
}

/// One HTTP/1.1 connection to an upstream, used by one exchange at a time (no upstream pipelining).
/// Lives on its loop; owned by the exchange while busy and by the pool while idle.
/// Invariant: `delegate` is non-nil exactly while busy or tunnelling; an idle connection that
/// receives bytes or EOF is closed and leaves the pool. A tunnelling connection (after a 101)
/// never goes back to the pool.
final class BackendConnection: ChannelDelegate, LoopTimeoutable, UpstreamStream {
    enum State { case connecting, idle, busy, tunnelling, closed }

    let target: UpstreamTarget
    unowned let pool: BackendPool
    var channel: SocketChannel?
    private(set) var state: State = .connecting
    private var parser: HTTP1Parser
    weak var delegate: BackendConnectionDelegate?
    private var connectCompletion: ((Result<BackendConnection, ChannelError>) -> Void)?
    /// Taken from the pool (not fresh): a failure before any response byte may be retried.
    var reused = false
    var receivedResponseBytes = false
    /// The response ended and the connection can carry another request.
    private(set) var reusable = false
    var deadline: UInt64 = 0
    var idleSince: UInt64 = 0
    /// The request body in flight is chunked (RFC 9112 §7.1): `writeBody` frames each piece.
    private var requestChunked = false
    /// Scratch for chunk framing, reused.
    private var scratch: [UInt8] = []
    var protocolName: String { "h1" }

    init(target: UpstreamTarget, pool: BackendPool) {
        self.target = target
        self.pool = pool
        parser = HTTP1Parser(role: .client)
    }

    func connect(addresses: [SocketAddress], completion: @escaping (Result<BackendConnection, ChannelError>) -> Void) {
        connectCompletion = completion
        deadline = monotonicNanos() + target.connectTimeout
        pool.loop.register(self)
        attempt(addresses: addresses[...])
    }

    private var remainingAddresses: ArraySlice<SocketAddress> = []

    private func attempt(addresses: ArraySlice<SocketAddress>) {
        guard let address = addresses.first else { return }
        remainingAddresses = addresses.dropFirst()
        do {
            var engine: TLSEngine?
            if let ctx = target.tlsContext {
                engine = try TLSEngine(client: ctx, serverName: target.url.host)
            }
            channel = try SocketChannel.connect(to: address, loop: pool.loop, tls: engine, delegate: self)
        } catch let e as TLSError {
            finishConnect(.failure(.tls(e)))
        } catch let e as IOError {
            tryNextOrFail(.connect(e))
        } catch {
            finishConnect(.failure(.protocolError("\(error)")))
        }
    }

    private func tryNextOrFail(_ error: ChannelError) {
        if !remainingAddresses.isEmpty {
            attempt(addresses: remainingAddresses)
        } else {
            finishConnect(.failure(error))
        }
    }

    private func finishConnect(_ result: Result<BackendConnection, ChannelError>) {
        guard let c = connectCompletion else { return }
        connectCompletion = nil
        if case .failure = result {
            state = .closed
            deadline = 0
            pool.loop.unregister(self)
        }
        c(result)
    }

    /// Hands the connection to an exchange. Every read pause of the previous exchange is lifted: a
    /// connection parked while its client was slow must not stay deaf (issue 8 item 8).
    func assign(to delegate: BackendConnectionDelegate) {
        self.delegate = delegate
        state = .busy
        receivedResponseBytes = false
        reusable = false
        channel?.resumeReading(.owner)
        channel?.resumeReading(.peerBackpressure)
    }

    /// Sends a request head (and whatever body bytes the exchange writes after it).
    func sendHead(_ head: HTTPRequestHead, body: HTTP1BodyFraming, upgrade: Bool) {
        parser.expectResponse(to: head.method, upgrade: upgrade)
        requestChunked = body == .chunked
        var buf: [UInt8] = []
        buf.reserveCapacity(512)
        HTTP1Serializer.writeRequestHead(head, into: &buf)
        channel?.write(taking: &buf)
        touch()
    }

    func writeBody(_ raw: UnsafeRawBufferPointer) {
        guard raw.count > 0 else { return }
        if requestChunked {
            scratch.removeAll(keepingCapacity: true)
            HTTP1Serializer.writeChunk(raw, into: &scratch)
            channel?.write(scratch)
        } else {
            channel?.write(raw)
        }
    }

    func endBody(trailers: HTTPHeaders?) {
        guard requestChunked else { return }
        scratch.removeAll(keepingCapacity: true)
        HTTP1Serializer.writeLastChunk(trailers: trailers, into: &scratch)
        channel?.write(scratch)
    }

    func release() { pool.release(self) }

    /// After a 101 (RFC 9110 §15.2.2): the connection is a byte pipe from now on; no deadline
    /// (WebSockets idle for long), never pooled.
    func switchProtocols() -> [UInt8] {
        state = .tunnelling
        deadline = 0
        return parser.switchProtocols()
    }

    func tunnelWrite(_ raw: UnsafeRawBufferPointer) { channel?.write(raw) }

    func endTunnel() {
        guard state != .closed else { return }
        state = .closed
        delegate = nil
        channel?.closeAfterFlush()
    }

    var isOverHighWater: Bool { channel?.isOverHighWater ?? false }

    @inline(__always)
    func touch() {
        deadline = monotonicNanos() &+ target.responseTimeout
    }

    /// The parser holds bytes beyond the response it delivered.
    var hasBufferedInput: Bool { parser.bufferedByteCount > 0 }

    func pauseReading() { channel?.pauseReading(.peerBackpressure) }
    func resumeReading() { channel?.resumeReading(.peerBackpressure) }

    func close() {
        guard state != .closed else { return }
        state = .closed
        delegate = nil
        channel?.close()
    }

    // MARK: ChannelDelegate

    func channelActive(_ channel: SocketChannel) {
        state = .idle
        deadline = 0
        finishConnect(.success(self))
    }

    func channelRead(_ channel: SocketChannel, _ bytes: UnsafeRawBufferPointer) {
        if state == .tunnelling {
            delegate?.backendTunnelBytes(bytes)
            return
        }
        guard state == .busy else {
            // Bytes on an idle connection: the upstream is misbehaving or closing; drop it.
            close()
            return
        }
        receivedResponseBytes = true
        touch()
        parser.feed(bytes)
        drive()
        if state == .busy { delegate?.backendReadComplete() }
    }

    func channelEOF(_ channel: SocketChannel) {
        if state == .tunnelling {
            let d = delegate
            delegate = nil
            d?.backendTunnelEnded()
            return
        }
        guard state == .busy else {
            close()
            return
        }
        parser.feedEOF()
        drive()
        if state == .busy {
            fail(.protocolError("upstream closed the connection before the response was complete"))
        }
    }

    func channelError(_ channel: SocketChannel, _ error: ChannelError) {
        if connectCompletion != nil {
            if case .connect = error, !remainingAddresses.isEmpty {
                self.channel = nil
                attempt(addresses: remainingAddresses)
                return
            }
            finishConnect(.failure(error))
            return
        }
        if state == .tunnelling {
            let d = delegate
            delegate = nil
            state = .closed
            channel.close()
            d?.backendTunnelEnded()
            return
        }
        fail(error)
    }

    func channelWritable(_ channel: SocketChannel) {
        delegate?.backendWritable()
    }

    func channelClosed(_ channel: SocketChannel) {
        if self.channel !== channel { return }  // an abandoned attempt
        let was = state
        state = .closed
        deadline = 0
        pool.loop.unregister(self)
        pool.forget(self)
        if let d = delegate {
            delegate = nil
            if was == .busy {
                d.backendFailed(.protocolError("upstream connection closed"), reused: reused, responseBytesSeen: receivedResponseBytes)
            } else if was == .tunnelling {
                d.backendTunnelEnded()
            }
        }
    }

    func deadlineExpired(now: UInt64) {
        switch state {
        case .connecting:
            let c = channel
            channel = nil
            c?.close()
            finishConnect(.failure(.timeout("connect")))
        case .busy:
            fail(.timeout("upstream response"))
        case .idle:
            close()
        case .tunnelling, .closed:
            break
        }
    }

    private func fail(_ error: ChannelError) {
        guard state == .busy else { close(); return }
        let d = delegate
        delegate = nil
        state = .closed
        channel?.close()
        d?.backendFailed(error, reused: reused, responseBytesSeen: receivedResponseBytes)
    }

    /// Pulls parser events and hands them to the exchange, stopping if it is detached.
    private func drive() {
        while state == .busy, let d = delegate {
            let event: HTTP1Event?
            do {
                event = try parser.next()
            } catch {
                fail(.protocolError("invalid upstream response: \(error.reason) (\(error.message))"))
                return
            }
            guard let event else { return }
            switch event {
            case .responseHead(let head, let framing):
                if !head.isInformational {
                    reusable = framing != .closeDelimited && HTTPHeaderRules.keepAlive(version: head.version, headers: head.headers)
                }
                d.backendResponseHead(head, framing: framing, endStream: false)
                if head.status == 101 { return }  // the exchange switched (or refused) the connection
            case .body(let slice):
                d.backendBody(slice)
            case .end(let trailers):
                // The exchange decides (via `pool.release`) whether the connection goes back.
                d.backendEnd(trailers: trailers)
            case .requestHead:
                fail(.protocolError("unexpected request from upstream"))
                return
            }
        }
    }

    /// Called by the pool when the connection goes idle. Reads stay on, so a close or stray bytes
    /// while idle are noticed (and the connection dropped).
    func parkIdle() {
        channel?.resumeReading(.peerBackpressure)
        delegate = nil
        state = .idle
        idleSince = monotonicNanos()
        deadline = idleSince &+ target.idleTimeout
    }
}

/// Keep-alive pools of upstream connections, one per loop, keyed by (scheme, host, port, TLS
/// settings). Lives on `loop`; no locking. Bounded: at most `maxIdle` idle connections per key
/// (LIFO, so the warmest connection is reused first).
final class BackendPool {
    let loop: EventLoop
    private var idle: [UpstreamTarget.Key: [BackendConnection]] = [:]

    init(loop: EventLoop) {
        self.loop = loop
    }

    /// An idle connection for `target`, or a new one (resolve off-loop, connect, TLS handshake).
    func acquire(_ target: UpstreamTarget, completion: @escaping (Result<UpstreamStream, ChannelError>) -> Void) {
        while var list = idle[target.key], let conn = list.popLast() {
            idle[target.key] = list
            guard conn.state == .idle, let ch = conn.channel, !ch.isClosed else { continue }
            // Stray bytes or a close that the loop has not read yet: never reuse (issue 8 item 7).
            if ch.hasUnreadInput {
                conn.close()
                continue
            }
            conn.reused = true
            completion(.success(conn))
            return
        }
        connectNew(target, completion: completion)
    }

    /// A new connection for `target`, never a pooled one (resolve off-loop, connect, TLS handshake).
    func connectNew(_ target: UpstreamTarget, completion: @escaping (Result<UpstreamStream, ChannelError>) -> Void) {
        Resolver.shared.resolve(host: target.url.host, port: target.url.port, on: loop) { [self] result in
            switch result {
            case .failure(let e):
                completion(.failure(.connect(e)))
            case .success(let addrs):
                let conn = BackendConnection(target: target, pool: self)
                conn.connect(addresses: addrs) { r in
                    switch r {
                    case .success(let c):
                        c.reused = false
                        completion(.success(c))
                    case .failure(let e):
                        completion(.failure(e))
                    }
                }
            }
        }
    }

    /// Returns a connection after a complete exchange; closes it when not reusable or the pool is full.
    func release(_ conn: BackendConnection) {
        // Bytes after a complete response (a second response, a body on 204/304/HEAD) mean the
        // connection's framing cannot be trusted: close it, never pool it (DESIGN §5).
        guard conn.state == .busy, conn.reusable, !conn.hasBufferedInput, let ch = conn.channel, !ch.isClosed else {
            conn.close()
            return
        }
        var list = idle[conn.target.key] ?? []
        if list.count >= conn.target.maxIdle {
            conn.close()
            return
        }
        conn.parkIdle()
        list.append(conn)
        idle[conn.target.key] = list
    }

    func forget(_ conn: BackendConnection) {
        guard var list = idle[conn.target.key], let i = list.firstIndex(where: { $0 === conn }) else { return }
        list.remove(at: i)
        idle[conn.target.key] = list
    }

    func closeAll() {
        for (_, list) in idle { for c in list { c.close() } }
        idle.removeAll()
    }

    var idleCount: Int { idle.values.reduce(0) { $0 + $1.count } }
}
