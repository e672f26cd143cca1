import BearerdHTTP
#if canImport(Glibc)
import Glibc
import Synchronization
#endif
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
        public var proxy: OutboundProxy.Endpoint?
    }
    public let key: Key
    /// `key` interned as a small integer: equal keys, equal ids (the pools' index).
    let poolID: Int
    public let url: UpstreamURL
    public let tlsContext: TLSContext?
    public let connectTimeout: UInt64
    public let responseTimeout: UInt64
    public let idleTimeout: UInt64
    public var maxIdle = 64
    /// `http2:` of the route: whether and how HTTP/2 is used towards this upstream.
    public let http2: HTTP2Mode
    /// `auto` on https: a context offering only `http/1.1`, for requests that need HTTP/1.1
    /// (WebSocket upgrades).
    public let http1TLSContext: TLSContext?

    /// Every key seen so far and its id. Grows by one entry per distinct upstream across reloads.
    private static let interned = Mutex<[Key: Int]>([:])

    private static func intern(_ key: Key) -> Int {
        interned.withLock { ids in
            if let id = ids[key] { return id }
            let id = ids.count
            ids[key] = id
            return id
        }
    }

    /// Whether a new connection may turn out to speak HTTP/2 (so concurrent requests wait for it
    /// instead of opening their own).
    var mayUseHTTP2: Bool {
        switch http2 {
        case .priorKnowledge: return true
        case .auto: return url.isTLS
        case .off: return false
        }
    }

    /// `outbound_proxy:` for this upstream (CONNECT for https, absolute form for http), or nil.
    public let proxy: OutboundProxy.Endpoint?

    public init(url: UpstreamURL, tls: TLSSettings?, timeouts: RouteTimeouts, http2: HTTP2Mode = .auto,
                outboundProxy: OutboundProxy = .direct) throws(TLSError) {
        self.url = url
        self.http2 = http2
        proxy = outboundProxy.endpoint(scheme: url.scheme, host: url.host, port: url.port)
        key = Key(scheme: url.scheme, host: url.host, port: url.port, tls: url.isTLS ? tls : nil, http2: http2, proxy: proxy)
        poolID = UpstreamTarget.intern(key)
        if url.isTLS {
            // DESIGN §2.3: ALPN h2,http/1.1 where HTTP/2 is enabled.
            let alpn: [String]
            switch http2 {
            case .auto: alpn = ["h2", "http/1.1"]
            case .priorKnowledge: alpn = ["h2"]
            case .off: alpn = ["http/1.1"]
            }
            tlsContext = try TLSContext.client(caFile: tls?.caFile, clientCert: tls?.clientCert, clientKey: tls?.clientKey, alpn: alpn)
            http1TLSContext = http2 == .auto
                ? try TLSContext.client(caFile: tls?.caFile, clientCert: tls?.clientCert, clientKey: tls?.clientKey, alpn: ["http/1.1"])
                : nil
        } else {
            http1TLSContext = nil
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
    /// response to this request arrived (both decide whether a retry on a fresh connection is safe);
    /// `unprocessed`: the upstream said it did not act on the request (an HTTP/2 stream refused,
    /// or above a GOAWAY's last-stream-id), so any method may be retried.
    func backendFailed(_ error: ChannelError, reused: Bool, responseBytesSeen: Bool, unprocessed: Bool)
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
    /// Strong: the loop's pool outlives its connections (no `unowned` check per access).
    let pool: BackendPool
    var channel: SocketChannel?
    @exclusivity(unchecked) private(set) var state: State = .connecting
    private var parser: HTTP1Parser
    /// Strong, and cleared whenever the connection goes idle or closes (the invariant above), so
    /// the exchange lives as long as it uses the connection; no weak reference on the request
    /// path (a weak one moves the exchange's reference count to a side table: issue 10). Safe
    /// because nothing an exchange reaches is `unowned`: its client (an HTTP/1.1 connection, or
    /// an HTTP/2 stream holding its connection strongly) outlives it.
    var delegate: BackendConnectionDelegate?
    /// What a new connection turned out to be: HTTP/1.1 (this object) or HTTP/2 (ALPN `h2`, or
    /// prior knowledge), in which case the channel moved to a `BackendH2Connection`.
    enum ConnectOutcome {
        case http1(BackendConnection)
        case http2(BackendH2Connection)
    }
    private var connectCompletion: ((Result<ConnectOutcome, ChannelError>) -> Void)?
    /// Speak HTTP/1.1 whatever the route's `http2:` (a WebSocket upgrade).
    @exclusivity(unchecked) private var http1Only = false
    /// Taken from the pool (not fresh): a failure before any response byte may be retried.
    @exclusivity(unchecked) var reused = false
    @exclusivity(unchecked) var receivedResponseBytes = false
    /// The response ended and the connection can carry another request.
    @exclusivity(unchecked) private(set) var reusable = false
    @exclusivity(unchecked) var deadline: UInt64 = 0
    @exclusivity(unchecked) var idleSince: UInt64 = 0
    /// The request body in flight is chunked (RFC 9112 §7.1): `writeBody` frames each piece.
    @exclusivity(unchecked) private var requestChunked = false
    /// Scratch for chunk framing, reused.
    private var scratch: [UInt8] = []
    var protocolName: String { "h1" }

    init(target: UpstreamTarget, pool: BackendPool) {
        self.target = target
        self.pool = pool
        parser = HTTP1Parser(role: .client)
    }

    func connect(addresses: [SocketAddress], http1Only: Bool, completion: @escaping (Result<ConnectOutcome, ChannelError>) -> Void) {
        connectCompletion = completion
        self.http1Only = http1Only
        deadline = monotonicNanos() + target.connectTimeout
        pool.loop.register(self)
        attempt(addresses: addresses[...])
    }

    private var remainingAddresses: ArraySlice<SocketAddress> = []

    /// The client TLS engine for this connection (https upstreams): the HTTP/1.1-only context
    /// for an upgrade on an `http2: auto` route, else the route's.
    private func tlsEngine() throws(TLSError) -> TLSEngine? {
        guard let ctx = http1Only ? (target.http1TLSContext ?? target.tlsContext) : target.tlsContext else { return nil }
        return try TLSEngine(client: ctx, serverName: target.url.host)
    }

    /// The connection is a CONNECT tunnel through the outbound proxy (`ProxyTunnel`), already
    /// open: only TLS (and the protocol) remain, on the same channel.
    func connectThroughTunnel(_ tunnel: ProxyTunnel.Established, http1Only: Bool,
                              completion: @escaping (Result<ConnectOutcome, ChannelError>) -> Void) {
        connectCompletion = completion
        self.http1Only = http1Only
        deadline = monotonicNanos() + target.connectTimeout
        pool.loop.register(self)
        do {
            channel = tunnel.start(delegate: self, tls: try tlsEngine())
        } catch let e as TLSError {
            tunnel.channel.close()
            finishConnect(.failure(.tls(e)))
        } catch {
            tunnel.channel.close()
            finishConnect(.failure(.protocolError("\(error)")))
        }
    }

    private func attempt(addresses: ArraySlice<SocketAddress>) {
        guard let address = addresses.first else { return }
        remainingAddresses = addresses.dropFirst()
        do {
            channel = try SocketChannel.connect(to: address, loop: pool.loop, tls: try tlsEngine(), delegate: self)
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

    private func finishConnect(_ result: Result<ConnectOutcome, ChannelError>) {
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
    func sendHead(_ head: HTTPRequestHead, body: HTTP1BodyFraming, upgrade: Bool, teTrailers: Bool, credential: HTTPField?) {
        parser.expectResponse(to: head.method, upgrade: upgrade)
        requestChunked = body == .chunked
        if let proxy = target.proxy, !target.url.isTLS {
            var buf: [UInt8] = []
            buf.reserveCapacity(512)
            // Through a forward proxy: the absolute form (RFC 9112 §3.2.2) and the proxy's credentials.
            let h = ForwardProxyRequest.absoluteForm(head, authority: target.url.authority, proxyAuthorization: proxy.proxyAuthorization)
            HTTP1Serializer.writeRequestHead(h, setting: credential, into: &buf)
            channel?.write(taking: &buf)
            touch()
            return
        }
        channel?.writeDirect { HTTP1Serializer.writeRequestHead(head, setting: credential, into: &$0) }
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
        deadline = pool.loop.now &+ target.responseTimeout
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
        deadline = 0
        let h2 = !http1Only && (channel.negotiatedALPN == "h2" || (target.http2 == .priorKnowledge && !target.url.isTLS))
        if h2 {
            // The channel moves to an HTTP/2 connection; this object is done.
            state = .closed
            pool.loop.unregister(self)
            self.channel = nil
            do {
                let conn = try BackendH2Connection(channel: channel, target: target, pool: pool)
                finishConnect(.success(.http2(conn)))
            } catch {
                channel.close()
                finishConnect(.failure(.protocolError("cannot start an HTTP/2 session: \(error)")))
            }
            return
        }
        if target.http2 == .priorKnowledge && !http1Only {
            // ALPN did not select h2 on a route that requires HTTP/2.
            state = .closed
            pool.loop.unregister(self)
            channel.close()
            finishConnect(.failure(.protocolError("the upstream did not select h2 in ALPN (route http2: prior_knowledge)")))
            return
        }
        state = .idle
        finishConnect(.success(.http1(self)))
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
                d.backendFailed(.protocolError("upstream connection closed"), reused: reused, responseBytesSeen: receivedResponseBytes, unprocessed: false)
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
        d?.backendFailed(error, reused: reused, responseBytesSeen: receivedResponseBytes, unprocessed: false)
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
        idleSince = pool.loop.now
        deadline = idleSince &+ target.idleTimeout
    }
}

/// One request waiting for an upstream connection (`BackendPool.acquire`). Lives on the pool's
/// loop. Invariant: `completion` runs at most once, and never once `cancel()` was called (the
/// exchange went away: its client reset the stream or closed), so the pool opens nothing and
/// opens no stream for it.
final class AcquireTicket {
    let http1Only: Bool
    private var completion: BackendPool.Completion?
    private(set) var isCancelled = false

    init(http1Only: Bool, completion: @escaping BackendPool.Completion) {
        self.http1Only = http1Only
        self.completion = completion
    }

    func cancel() {
        isCancelled = true
        completion = nil
    }

    fileprivate func resume(_ result: Result<UpstreamStream, ChannelError>) {
        guard let c = completion else {
            if case .success(let s) = result { s.close() }
            return
        }
        completion = nil
        c(result)
    }
}

/// An HTTP/1.1 connection being opened and the request it is for (nil or cancelled: taken over
/// by the next request that needs one). Lives on the pool's loop.
final class PendingConnect {
    var ticket: AcquireTicket?
    let http1Only: Bool
    init(ticket: AcquireTicket, http1Only: Bool) {
        self.ticket = ticket
        self.http1Only = http1Only
    }
}

/// Keep-alive pools of upstream connections, one per loop, keyed by (scheme, host, port, TLS
/// settings, http2 mode). Lives on `loop`; no locking.
///
/// HTTP/1.1: at most `maxIdle` idle connections per key (LIFO, so the warmest connection is
/// reused first). HTTP/2: every open connection of a key multiplexes streams up to the server's
/// SETTINGS_MAX_CONCURRENT_STREAMS; a new connection opens only when all are full or going away.
/// While a connection that may turn out to speak HTTP/2 is being opened, other requests for the
/// same key wait for it (`connecting`) instead of opening their own, so a burst of requests to
/// an h2 upstream shares one connection. Once a key is known to answer HTTP/1.1 (`knownHTTP1`),
/// requests no longer wait. A waiting request that goes away cancels its `AcquireTicket`: no
/// stream is opened for it, a connection still being resolved is not opened, and an HTTP/1.1
/// connection already on its way serves the next request (or idles in the pool).
final class BackendPool {
    let loop: EventLoop
    typealias Completion = (Result<UpstreamStream, ChannelError>) -> Void

    /// The connections of one key. Mutated in place through its reference, so taking or
    /// returning a connection never copies a list (a copy per request retained every pooled
    /// connection: a third of the request path's user time at 64 connections, issue 10).
    private final class Slot {
        /// Idle HTTP/1.1 connections, the most recently used last.
        var idle: [BackendConnection] = []
        /// Open HTTP/2 connections.
        var http2: [BackendH2Connection] = []
        /// Requests waiting for a connection being opened that may speak HTTP/2; nil when none
        /// is being opened.
        var connecting: [AcquireTicket]?
        /// HTTP/1.1 connections being opened, one per waiting request (or none, once that
        /// request went away: a new request then takes the attempt over).
        var pendingHTTP1: [PendingConnect] = []
        /// The key answered HTTP/1.1 on an `auto` route: requests no longer wait for it.
        var knownHTTP1 = false
    }
    /// Indexed by `UpstreamTarget.poolID` (interned keys are small dense integers from 0): an
    /// array index per request instead of hashing (nil: no connection to that key yet).
    private var slots: [Slot?] = []

    init(loop: EventLoop) {
        self.loop = loop
    }

    private func slot(_ target: UpstreamTarget) -> Slot {
        let id = target.poolID
        if id < slots.count, let s = slots[id] { return s }
        if id >= slots.count { slots.append(contentsOf: repeatElement(nil, count: id - slots.count + 1)) }
        let s = Slot()
        slots[id] = s
        return s
    }

    /// The slot of `id` if one was made.
    private func existingSlot(_ id: Int) -> Slot? {
        id >= 0 && id < slots.count ? slots[id] : nil
    }

    /// A stream for `target`: on an open HTTP/2 connection with room, an idle HTTP/1.1 connection,
    /// or a new connection (resolve off-loop, connect, TLS handshake). `http1Only`: a WebSocket
    /// upgrade, which needs HTTP/1.1. Returns nil when served at once, else the ticket of the
    /// waiting request: cancel it when the request goes away.
    @discardableResult
    func acquire(_ target: UpstreamTarget, http1Only: Bool = false, completion: @escaping Completion) -> AcquireTicket? {
        if let stream = takeReady(target, http1Only: http1Only) {
            completion(.success(stream))
            return nil
        }
        let ticket = AcquireTicket(http1Only: http1Only, completion: completion)
        wait(ticket, for: target)
        return ticket
    }

    /// The synchronous part of `acquire`: a stream on an open HTTP/2 connection with room, or an
    /// idle HTTP/1.1 connection; nil when the request must wait for a connection being opened
    /// or open one (then call `acquire`). Lets the common case skip the completion closure.
    func takeReady(_ target: UpstreamTarget, http1Only: Bool = false) -> UpstreamStream? {
        let slot = slot(target)
        if !http1Only {
            if !slot.http2.isEmpty, let conn = slot.http2.first(where: { $0.canOpenStream }) {
                return conn.newStream(reused: true)
            }
            if slot.connecting != nil { return nil }
        }
        while let conn = slot.idle.popLast() {
            guard conn.state == .idle, let ch = conn.channel, !ch.isClosed else { continue }
            // Stray bytes or a close that the loop has not read yet: never reuse (issue 8 item 7).
            if ch.hasUnreadInput(recentlyActive: loop.now &- conn.idleSince < 1_000_000_000) {
                conn.close()
                continue
            }
            conn.reused = true
            return conn
        }
        return nil
    }

    /// A new connection for `target`, never a pooled one (an HTTP/1.1 connection opened for a
    /// request that went away meanwhile counts as new: it never carried a request).
    @discardableResult
    func connectNew(_ target: UpstreamTarget, http1Only: Bool = false, completion: @escaping Completion) -> AcquireTicket {
        let ticket = AcquireTicket(http1Only: http1Only, completion: completion)
        wait(ticket, for: target)
        return ticket
    }

    /// Queues `ticket` for a connection being opened, opening one only when none in flight can
    /// serve it.
    private func wait(_ ticket: AcquireTicket, for target: UpstreamTarget) {
        let http1Only = ticket.http1Only
        if http1Only && target.http2 == .priorKnowledge && !target.url.isTLS {
            ticket.resume(.failure(.protocolError("a WebSocket upgrade needs HTTP/1.1 towards the upstream; this route has http2: prior_knowledge")))
            return
        }
        let slot = slot(target)
        if !http1Only && target.mayUseHTTP2 && !slot.knownHTTP1 {
            // One connection that may speak HTTP/2 for every request that arrives meanwhile: this
            // request takes a stream on it, or opens its own if it turns out full or HTTP/1.1.
            if slot.connecting != nil {
                slot.connecting?.append(ticket)
                return
            }
            slot.connecting = [ticket]
            open(target, http1Only: false, stillWanted: { [weak slot] in
                slot?.connecting?.contains { !$0.isCancelled } ?? false
            }, abandoned: { [weak slot] in
                // Nobody waits any more: forget the attempt (a later request opens its own).
                slot?.connecting = nil
            }, done: { [self] result in finishShared(target, result) })
            return
        }
        // HTTP/1.1: one connection per request, but an attempt in flight whose request went away
        // is taken over instead of opening another (RFC 9113 §10.5: resets must not multiply
        // upstream connections).
        let equivalent: (PendingConnect) -> Bool = { $0.http1Only == http1Only || !target.mayUseHTTP2 }
        if let orphan = slot.pendingHTTP1.first(where: { equivalent($0) && ($0.ticket?.isCancelled ?? true) }) {
            orphan.ticket = ticket
            return
        }
        let attempt = PendingConnect(ticket: ticket, http1Only: http1Only)
        slot.pendingHTTP1.append(attempt)
        open(target, http1Only: http1Only, stillWanted: { [weak attempt] in
            attempt?.ticket.map { !$0.isCancelled } ?? false
        }, abandoned: { [weak slot, weak attempt] in
            guard let slot, let attempt else { return }
            slot.pendingHTTP1.removeAll { $0 === attempt }
        }, done: { [self] result in finishHTTP1(target, attempt, result) })
    }

    /// Resolves and connects. `stillWanted` is asked once the address is known: when no request
    /// waits any more, nothing is opened (`abandoned`), so a request cancelled while its name
    /// resolved costs the upstream nothing.
    private func open(_ target: UpstreamTarget, http1Only: Bool, stillWanted: @escaping () -> Bool, abandoned: @escaping () -> Void,
                      done: @escaping (Result<BackendConnection.ConnectOutcome, ChannelError>) -> Void) {
        let connected: (Result<BackendConnection.ConnectOutcome, ChannelError>) -> Void = { r in
            if case .success(.http1(let c)) = r { c.reused = false }
            done(r)
        }
        if let proxy = target.proxy, target.url.isTLS || target.http2 == .priorKnowledge {
            // `outbound_proxy:` for https: a CONNECT tunnel, TLS to the upstream inside it.
            ProxyTunnel.open(through: proxy, to: target.url.host, port: target.url.port,
                             timeout: .nanoseconds(Int64(clamping: target.connectTimeout)), on: loop) { [self] result in
                switch result {
                case .failure(let f):
                    connected(.failure(.connect(IOError("proxy \(proxy)", ECONNREFUSED, hint: f.message))))
                case .success(let tunnel):
                    BackendConnection(target: target, pool: self).connectThroughTunnel(tunnel, http1Only: http1Only, completion: connected)
                }
            }
            return
        }
        // http through a proxy: connect to the proxy, requests in absolute form.
        let (host, port) = target.proxy.map { ($0.host, $0.port) } ?? (target.url.host, target.url.port)
        Resolver.shared.resolve(host: host, port: port, on: loop) { [self] result in
            switch result {
            case .failure(let e):
                connected(.failure(.connect(e)))
            case .success(let addrs):
                guard stillWanted() else {
                    abandoned()
                    return
                }
                BackendConnection(target: target, pool: self).connect(addresses: addrs, http1Only: http1Only, completion: connected)
            }
        }
    }

    /// The shared attempt (that may speak HTTP/2) ended: streams on it, or the connection, for
    /// the requests that still wait.
    private func finishShared(_ target: UpstreamTarget, _ result: Result<BackendConnection.ConnectOutcome, ChannelError>) {
        let slot = slot(target)
        let waiters = (slot.connecting ?? []).filter { !$0.isCancelled }
        slot.connecting = nil
        switch result {
        case .failure(let e):
            for w in waiters { w.resume(.failure(e)) }
        case .success(.http1(let c)):
            if target.http2 == .auto { slot.knownHTTP1 = true }
            guard let first = waiters.first else {
                parkFresh(c)
                return
            }
            first.resume(.success(c))
            // The others open (or reuse) HTTP/1.1 connections of their own.
            for w in waiters.dropFirst() { retry(w, target) }
        case .success(.http2(let h2)):
            slot.http2.append(h2)
            var rest = waiters[...]
            while let w = rest.first, h2.canOpenStream {
                rest = rest.dropFirst()
                w.resume(.success(h2.newStream(reused: false)))
            }
            // Over the server's limit: another connection for the rest.
            for w in rest { retry(w, target) }
        }
    }

    /// An HTTP/1.1 attempt ended: the connection goes to the request that waits for it, or to the
    /// idle pool when that request went away (it is new and carried nothing).
    private func finishHTTP1(_ target: UpstreamTarget, _ attempt: PendingConnect, _ result: Result<BackendConnection.ConnectOutcome, ChannelError>) {
        let slot = slot(target)
        slot.pendingHTTP1.removeAll { $0 === attempt }
        let waiter = attempt.ticket.flatMap { $0.isCancelled ? nil : $0 }
        attempt.ticket = nil
        switch result {
        case .failure(let e):
            waiter?.resume(.failure(e))
        case .success(.http1(let c)):
            guard let waiter else {
                parkFresh(c)
                return
            }
            waiter.resume(.success(c))
        case .success(.http2(let h2)):
            // A key known to answer HTTP/1.1 negotiated h2 after all.
            slot.http2.append(h2)
            guard let waiter else { return }
            if !waiter.http1Only && h2.canOpenStream {
                waiter.resume(.success(h2.newStream(reused: false)))
            } else {
                retry(waiter, target)
            }
        }
    }

    /// A waiting request whose attempt could not serve it tries again.
    private func retry(_ ticket: AcquireTicket, _ target: UpstreamTarget) {
        if let stream = takeReady(target, http1Only: ticket.http1Only) {
            ticket.resume(.success(stream))
            return
        }
        wait(ticket, for: target)
    }

    /// A new HTTP/1.1 connection whose request went away: idle in the pool (it carried nothing),
    /// or closed when the pool is full.
    private func parkFresh(_ conn: BackendConnection) {
        let slot = slot(conn.target)
        guard conn.state == .idle, let ch = conn.channel, !ch.isClosed, slot.idle.count < conn.target.maxIdle else {
            conn.close()
            return
        }
        conn.parkIdle()
        slot.idle.append(conn)
    }

    /// Returns a connection after a complete exchange; closes it when not reusable or the pool is full.
    func release(_ conn: BackendConnection) {
        // Bytes after a complete response (a second response, a body on 204/304/HEAD) mean the
        // connection's framing cannot be trusted: close it, never pool it (DESIGN §5).
        guard conn.state == .busy, conn.reusable, !conn.hasBufferedInput, let ch = conn.channel, !ch.isClosed else {
            conn.close()
            return
        }
        let slot = slot(conn.target)
        if slot.idle.count >= conn.target.maxIdle {
            conn.close()
            return
        }
        conn.parkIdle()
        slot.idle.append(conn)
    }

    func forget(_ conn: BackendConnection) {
        guard let slot = existingSlot(conn.target.poolID), let i = slot.idle.firstIndex(where: { $0 === conn }) else { return }
        slot.idle.remove(at: i)
    }

    /// An HTTP/2 connection closed: it takes no more streams.
    func forget(_ conn: BackendH2Connection) {
        guard let slot = existingSlot(conn.target.poolID), let i = slot.http2.firstIndex(where: { $0 === conn }) else { return }
        slot.http2.remove(at: i)
    }

    func closeAll() {
        for case let slot? in slots {
            let idle = slot.idle, h2 = slot.http2
            slot.idle.removeAll()
            slot.http2.removeAll()
            for c in idle { c.close() }
            for c in h2 { c.close() }
        }
    }

    var idleCount: Int { slots.reduce(0) { $0 + ($1.map { $0.idle.count + $0.http2.filter(\.isIdle).count } ?? 0) } }

    /// Open HTTP/2 connections (for tests and metrics).
    var http2ConnectionCount: Int { slots.reduce(0) { $0 + ($1?.http2.count ?? 0) } }
}
