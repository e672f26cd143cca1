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
            // docs/architecture.md §2.3: ALPN h2,http/1.1 where HTTP/2 is enabled.
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
    /// Body bytes, valid only during the call (often the loop's read buffer itself).
    func backendBody(_ bytes: UnsafeRawBufferPointer)
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
/// never goes back to the pool. The connect completion exists only while connecting, and
/// what a response taught (bytes seen, reusable) only while busy: `Phase`.
final class BackendConnection: ChannelDelegate, LoopTimeoutable, UpstreamStream {
    typealias ConnectCompletion = (Result<ConnectOutcome, ChannelError>) -> Void
    enum Phase {
        /// Resolving, connecting, handshaking; `completion` runs once with the outcome.
        case connecting(completion: ConnectCompletion)
        /// In the pool, between exchanges.
        case idle
        /// Carrying one exchange. `responseSeen`: a byte of its response arrived (a failure is
        /// then no clean retry); `reusable`: the response head allows another request after it.
        case busy(responseSeen: Bool, reusable: Bool)
        /// After a 101: a byte pipe.
        case tunnelling
        case closed
    }

    let target: UpstreamTarget
    /// Strong: the loop's pool outlives its connections (no `unowned` check per access).
    let pool: BackendPool
    /// Its id in the pool's machine (set when the connection is handed to the pool).
    var poolID = BearerdProxyCore.BackendPool.ConnectionID(-1)
    @exclusivity(unchecked) var channel: SocketChannel?
    @exclusivity(unchecked) private(set) var phase: Phase = .closed
    /// Unchecked exclusivity: the parser calls out to nothing, so no access to it can overlap
    /// another (saves a dynamic check per feed, event and query).
    @exclusivity(unchecked) private var parser: HTTP1Parser
    /// Strong, and cleared whenever the connection goes idle or closes (the invariant above), so
    /// the exchange lives as long as it uses the connection; no weak reference on the request
    /// path (a weak one moves the exchange's reference count to a side table, measured in bench/RESULTS.md). Safe
    /// because nothing an exchange reaches is `unowned`: its client (an HTTP/1.1 connection, or
    /// an HTTP/2 stream holding its connection strongly) outlives it.
    @exclusivity(unchecked) var delegate: BackendConnectionDelegate?
    /// What a new connection turned out to be: HTTP/1.1 (this object) or HTTP/2 (ALPN `h2`, or
    /// prior knowledge), in which case the channel moved to a `BackendH2Connection`.
    enum ConnectOutcome {
        case http1(BackendConnection)
        case http2(BackendH2Connection)
    }
    /// Speak HTTP/1.1 whatever the route's `http2:` (a WebSocket upgrade).
    @exclusivity(unchecked) private var http1Only = false
    /// Taken from the pool (not fresh): a failure before any response byte may be retried.
    @exclusivity(unchecked) var reused = false
    @exclusivity(unchecked) var deadline: UInt64 = 0
    /// The request body in flight is chunked (RFC 9112 §7.1): `writeBody` frames each piece.
    @exclusivity(unchecked) private var requestChunked = false
    /// Scratch for chunk framing, reused.
    private var scratch: [UInt8] = []
    var protocolName: String { "h1" }

    init(target: UpstreamTarget, pool: BackendPool) {
        self.target = target
        self.pool = pool
        parser = HTTP1Parser(role: .client)
        parser.lineCache = pool.responseLines
    }

    func connect(addresses: [SocketAddress], http1Only: Bool, completion: @escaping (Result<ConnectOutcome, ChannelError>) -> Void) {
        phase = .connecting(completion: completion)
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
        return try TLSEngine(client: ctx, serverName: target.url.host, port: target.url.port)
    }

    /// The connection is a CONNECT tunnel through the outbound proxy (`ProxyTunnel`), already
    /// open: only TLS (and the protocol) remain, on the same channel.
    func connectThroughTunnel(_ tunnel: ProxyTunnel.Established, http1Only: Bool,
                              completion: @escaping (Result<ConnectOutcome, ChannelError>) -> Void) {
        phase = .connecting(completion: completion)
        self.http1Only = http1Only
        deadline = monotonicNanos() + target.connectTimeout
        pool.loop.register(self)
        do {
            channel = tunnel.start(delegate: self, tls: try tlsEngine())
        } catch {
            tunnel.channel.close()
            finishConnect(.failure(.tls(error)))
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
        guard case .connecting(let c) = phase else { return }
        phase = .closed
        if case .failure = result {
            deadline = 0
            pool.loop.unregister(self)
        }
        c(result)
    }

    /// Hands the connection to an exchange. Every read pause of the previous exchange is lifted: a
    /// connection parked while its client was slow must not stay deaf (docs/architecture.md §2.2 backpressure).
    func assign(to delegate: BackendConnectionDelegate) {
        self.delegate = delegate
        phase = .busy(responseSeen: false, reusable: false)
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
        phase = .tunnelling
        deadline = 0
        return parser.switchProtocols()
    }

    func tunnelWrite(_ raw: UnsafeRawBufferPointer) { channel?.write(raw) }

    func endTunnel() {
        if case .closed = phase { return }
        phase = .closed
        delegate = nil
        pool.forget(self)
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
        switch phase {
        case .closed:
            return
        case .connecting:
            // The attempt fails (its completion runs once); the channel's close is not reported.
            let c = channel
            channel = nil
            c?.close()
            finishConnect(.failure(.protocolError("upstream connection closed while connecting")))
            return
        case .idle, .busy, .tunnelling:
            break
        }
        phase = .closed
        delegate = nil
        pool.forget(self)
        channel?.close()
    }

    /// In the pool, between exchanges.
    var isIdle: Bool {
        if case .idle = phase { return true }
        return false
    }

    /// Busy, and its response allows another request on the connection.
    var isReusable: Bool {
        if case .busy(_, true) = phase { return true }
        return false
    }

    /// Busy, and a byte of the response arrived.
    private var responseSeen: Bool {
        if case .busy(true, _) = phase { return true }
        return false
    }

    private var isBusy: Bool {
        if case .busy = phase { return true }
        return false
    }

    private var isTunnelling: Bool {
        if case .tunnelling = phase { return true }
        return false
    }

    // MARK: ChannelDelegate

    func channelActive(_ channel: SocketChannel) {
        deadline = 0
        let h2 = !http1Only && (channel.negotiatedALPN == "h2" || (target.http2 == .priorKnowledge && !target.url.isTLS))
        if h2 {
            // The channel moves to an HTTP/2 connection; this object is done.
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
            pool.loop.unregister(self)
            self.channel = nil  // closed here: its close is not the connection's to report
            channel.close()
            finishConnect(.failure(.protocolError("the upstream did not select h2 in ALPN (route http2: prior_knowledge)")))
            return
        }
        guard case .connecting(let completion) = phase else { return }
        phase = .idle
        completion(.success(.http1(self)))
    }

    /// Most bytes fed to the parser at once while no body is being relayed (heads, chunk lines).
    static let feedPiece = 8 * 1024

    func channelRead(_ channel: SocketChannel, _ bytes: UnsafeRawBufferPointer) {
        switch phase {
        case .busy(_, let reusable):
            phase = .busy(responseSeen: true, reusable: reusable)
        case .tunnelling:
            delegate?.backendTunnelBytes(bytes)
            return
        default:
            // Bytes on an idle connection: the upstream is misbehaving or closing; drop it.
            close()
            return
        }
        touch()
        relay(bytes)
        if isBusy { delegate?.backendReadComplete() }
    }

    /// One read: body bytes go to the exchange straight from the read buffer instead of
    /// being copied into the parser first (one copy less per body byte, measured in
    /// bench/RESULTS.md). Heads and chunk framing are fed in pieces of `feedPiece`, so the body
    /// after a head in the same read is relayed directly too (a small read, head and body, is
    /// one piece: fed whole). Pointer arithmetic instead of buffer slices: the generic slice
    /// code measured ~900 instructions per response more.
    private func relay(_ bytes: UnsafeRawBufferPointer) {
        guard var at = bytes.baseAddress else { return }
        var left = bytes.count
        while left > 0, isBusy, let d = delegate {
            let limit = parser.directBodyLimit()
            if limit > 0 {
                let n = UInt64(left) < limit ? left : Int(limit)
                parser.consumeBody(n)
                d.backendBody(UnsafeRawBufferPointer(start: at, count: n))
                at += n
                left -= n
            } else {
                let n = min(left, Self.feedPiece)
                parser.feed(UnsafeRawBufferPointer(start: at, count: n))
                at += n
                left -= n
            }
            drive()
        }
        guard left > 0 else { return }
        let rest = UnsafeRawBufferPointer(start: at, count: left)
        if case .tunnelling = phase {
            // A 101 switched the connection inside this read: what follows is the tunnel's.
            delegate?.backendTunnelBytes(rest)
            return
        }
        parser.feed(rest)
        drive()
    }

    func channelEOF(_ channel: SocketChannel) {
        if isTunnelling {
            let d = delegate
            delegate = nil
            d?.backendTunnelEnded()
            return
        }
        guard isBusy else {
            close()
            return
        }
        parser.feedEOF()
        drive()
        if isBusy {
            fail(.protocolError("upstream closed the connection before the response was complete"))
        }
    }

    func channelError(_ channel: SocketChannel, _ error: ChannelError) {
        if case .connecting = phase {
            if case .connect = error, !remainingAddresses.isEmpty {
                self.channel = nil
                attempt(addresses: remainingAddresses)
                return
            }
            finishConnect(.failure(error))
            return
        }
        if isTunnelling {
            let d = delegate
            delegate = nil
            phase = .closed
            pool.forget(self)
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
        if case .connecting = phase {
            // Closed before it connected: the attempt fails (its completion runs once).
            finishConnect(.failure(.protocolError("upstream connection closed while connecting")))
            pool.forget(self)
            return
        }
        let was = phase
        phase = .closed
        deadline = 0
        pool.loop.unregister(self)
        pool.forget(self)
        if let d = delegate {
            delegate = nil
            switch was {
            case .busy(let responseSeen, _):
                d.backendFailed(.protocolError("upstream connection closed"), reused: reused, responseBytesSeen: responseSeen, unprocessed: false)
            case .tunnelling:
                d.backendTunnelEnded()
            case .connecting, .idle, .closed:
                break
            }
        }
    }

    func deadlineExpired(now: UInt64) {
        switch phase {
        case .connecting:
            let c = channel
            channel = nil
            c?.close()
            finishConnect(.failure(.timeout("connect")))
        case .busy:
            fail(.timeout("upstream response"))
        case .idle:
            if pool.idleExpired(self, now: now) { close() }
        case .tunnelling, .closed:
            break
        }
    }

    private func fail(_ error: ChannelError) {
        guard case .busy(let responseSeen, _) = phase else { close(); return }
        let d = delegate
        delegate = nil
        phase = .closed
        pool.forget(self)
        channel?.close()
        d?.backendFailed(error, reused: reused, responseBytesSeen: responseSeen, unprocessed: false)
    }

    /// Pulls parser events and hands them to the exchange, stopping if it is detached.
    private func drive() {
        while isBusy, let d = delegate {
            // Switched on where it is returned (see FrontendConnection.processInput); only
            // `parser.next()` throws in this `do`.
            do {
                switch try parser.next() {
                case nil:
                    return
                case .responseHead(let head, let framing)?:
                    if !head.isInformational {
                        let reusable = framing != .closeDelimited && HTTPHeaderRules.keepAlive(version: head.version, headers: head.headers)
                        phase = .busy(responseSeen: true, reusable: reusable)
                    }
                    d.backendResponseHead(head, framing: framing, endStream: false)
                    if head.status == 101 { return }  // the exchange switched (or refused) the connection
                case .body(let slice)?:
                    slice.withUnsafeBytes { d.backendBody($0) }
                case .end(let trailers)?:
                    // The exchange decides (via `pool.release`) whether the connection goes back.
                    d.backendEnd(trailers: trailers)
                case .requestHead?:
                    fail(.protocolError("unexpected request from upstream"))
                    return
                }
            } catch {
                fail(.protocolError("invalid upstream response: \(error.reason) (\(error.message))"))
                return
            }
        }
    }

    /// Called by the pool when the connection goes idle. Reads stay on, so a close or stray bytes
    /// while idle are noticed (and the connection dropped).
    func parkIdle(deadline: UInt64) {
        channel?.resumeReading(.peerBackpressure)
        delegate = nil
        phase = .idle
        self.deadline = deadline
    }
}

/// One request waiting for an upstream connection (`BackendPool.acquire`). Lives on the pool's
/// loop. Invariant: `completion` runs at most once, and never once `cancel()` was called (the
/// exchange went away: its client reset the stream or closed): the pool's machine forgets the
/// request, so no stream is opened for it and a connection still resolving is not opened.
final class AcquireTicket {
    let http1Only: Bool
    let id: BearerdProxyCore.BackendPool.RequestID
    private var completion: BackendPool.Completion?
    /// The slot the request waits in (cleared once resumed or cancelled).
    fileprivate var slot: BackendPool.Slot?
    private(set) var isCancelled = false

    fileprivate init(id: BearerdProxyCore.BackendPool.RequestID, http1Only: Bool, completion: @escaping BackendPool.Completion) {
        self.id = id
        self.http1Only = http1Only
        self.completion = completion
    }

    func cancel() {
        guard !isCancelled else { return }
        isCancelled = true
        completion = nil
        if let slot {
            self.slot = nil
            slot.tickets.removeValue(forKey: id.raw)
            slot.machine.cancel(id)
        }
    }

    fileprivate func resume(_ result: Result<UpstreamStream, ChannelError>) {
        slot = nil
        guard let c = completion else {
            if case .success(let s) = result { s.close() }
            return
        }
        completion = nil
        c(result)
    }
}

/// Keep-alive pools of upstream connections, one per loop, keyed by (scheme, host, port, TLS
/// settings, http2 mode). Lives on `loop`; no locking.
///
/// The shell of `BearerdProxyCore.BackendPool.StateMachine` (one per key), which decides which
/// connection a request gets, when one is opened, what a key is known to speak, who waits, and
/// which idle connections are kept; this class resolves, connects, checks an idle connection
/// for stray input before reuse, and resumes the waiting requests as the machine says.
/// Invariant: `Slot.members[id]` holds the object of every connection the machine knows as
/// connected, and nothing for one it forgot; an object reports its close only while it is the
/// member of its id (so a reused id never receives a stale report).
final class BackendPool {
    let loop: EventLoop
    /// The response field lines this loop's upstream connections parsed lately (their parsers
    /// share it).
    let responseLines = HTTP1Parser.FieldLineCache()
    typealias Completion = (Result<UpstreamStream, ChannelError>) -> Void
    typealias Machine = BearerdProxyCore.BackendPool.StateMachine
    typealias ConnectionID = BearerdProxyCore.BackendPool.ConnectionID

    /// A connection object of a key, by the machine's id.
    enum Member {
        case none
        case http1(BackendConnection)
        case http2(BackendH2Connection)
    }

    /// One key's machine and the objects its ids stand for. Mutated in place through its
    /// reference, so taking or returning a connection never copies a list (a copy per request
    /// retained every pooled connection: a third of the request path's user time at 64
    /// connections).
    final class Slot {
        @exclusivity(unchecked) var machine: Machine
        /// The target whose settings (`maxIdle`, idle timeout) the machine was configured with.
        @exclusivity(unchecked) var target: UpstreamTarget
        /// Indexed by `ConnectionID.raw`.
        @exclusivity(unchecked) var members: [Member] = []
        /// Waiting requests by `RequestID.raw`.
        @exclusivity(unchecked) var tickets: [Int: AcquireTicket] = [:]

        init(target: UpstreamTarget) {
            self.target = target
            machine = Machine(configuration: Slot.configuration(target))
        }

        static func configuration(_ target: UpstreamTarget) -> BearerdProxyCore.BackendPool.Configuration {
            .init(maxIdle: target.maxIdle, idleTimeout: target.idleTimeout, mayUseHTTP2: target.mayUseHTTP2,
                  remembersHTTP1: target.http2 == .auto,
                  http1Impossible: target.http2 == .priorKnowledge && !target.url.isTLS)
        }

        subscript(id: ConnectionID) -> Member {
            get { id.raw >= 0 && id.raw < members.count ? members[id.raw] : .none }
            set {
                guard id.raw >= 0 else { return }
                if id.raw >= members.count { members.append(contentsOf: repeatElement(.none, count: id.raw - members.count + 1)) }
                members[id.raw] = newValue
            }
        }
    }
    /// Indexed by `UpstreamTarget.poolID` (interned keys are small dense integers from 0): an
    /// array index per request instead of hashing (nil: no connection to that key yet).
    @exclusivity(unchecked) private var slots: [Slot?] = []
    @exclusivity(unchecked) private var nextRequest = 0

    init(loop: EventLoop) {
        self.loop = loop
    }

    private func slot(_ target: UpstreamTarget) -> Slot {
        let id = target.poolID
        if id < slots.count, let s = slots[id] {
            if s.target !== target {
                // A reload: equal key, possibly other limits.
                s.target = target
                s.machine.configuration = Slot.configuration(target)
            }
            return s
        }
        if id >= slots.count { slots.append(contentsOf: repeatElement(nil, count: id - slots.count + 1)) }
        let s = Slot(target: target)
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
        return wait(target, http1Only: http1Only, fresh: false, completion: completion)
    }

    /// The synchronous part of `acquire`: a stream on an open HTTP/2 connection with room, or an
    /// idle HTTP/1.1 connection; nil when the request must wait for a connection being opened
    /// or open one (then call `acquire`). Lets the common case skip the completion closure.
    func takeReady(_ target: UpstreamTarget, http1Only: Bool = false) -> UpstreamStream? {
        let slot = slot(target)
        while let ready = slot.machine.takeReady(http1Only: http1Only) {
            switch ready {
            case .stream(let id):
                if let stream = newStream(slot, id, reused: true) { return stream }
            case .idleConnection(let id, let idleSince):
                if let conn = reuse(slot, id, idleSince: idleSince) { return conn }
            }
        }
        return nil
    }

    /// A stream on the machine's HTTP/2 connection `id`; nil (and the machine told) when the
    /// connection takes no requests after all (closed, or GOAWAY, before it reported so). The
    /// machine counts the streams against the server's limit.
    private func newStream(_ slot: Slot, _ id: ConnectionID, reused: Bool) -> BackendH2Stream? {
        guard case .http2(let conn) = slot[id] else {
            slot.machine.connectionClosed(id)
            return nil
        }
        guard conn.acceptsRequests else {
            slot.machine.streamClosed(id)
            slot.machine.goingAway(id)
            return nil
        }
        return conn.newStream(reused: reused)
    }

    /// The idle connection `id`, leased by the machine, unless it must not be reused (then it is
    /// closed and the machine told).
    private func reuse(_ slot: Slot, _ id: ConnectionID, idleSince: UInt64) -> BackendConnection? {
        guard case .http1(let conn) = slot[id] else {
            slot.machine.connectionClosed(id)
            return nil
        }
        // Stray bytes or a close that the loop has not read yet: never reuse (docs/architecture.md §5).
        guard conn.isIdle, let ch = conn.channel, !ch.isClosed,
              !ch.hasUnreadInput(recentlyActive: loop.now &- idleSince < 1_000_000_000) else {
            drop(slot, id)
            conn.close()
            return nil
        }
        conn.reused = true
        return conn
    }

    /// A new connection for `target`, never a pooled one (an HTTP/1.1 connection opened for a
    /// request that went away meanwhile counts as new: it never carried a request).
    @discardableResult
    func connectNew(_ target: UpstreamTarget, http1Only: Bool = false, completion: @escaping Completion) -> AcquireTicket {
        wait(target, http1Only: http1Only, fresh: true, completion: completion)
    }

    private func wait(_ target: UpstreamTarget, http1Only: Bool, fresh: Bool, completion: @escaping Completion) -> AcquireTicket {
        let slot = slot(target)
        nextRequest &+= 1
        let ticket = AcquireTicket(id: .init(nextRequest), http1Only: http1Only, completion: completion)
        ticket.slot = slot
        slot.tickets[ticket.id.raw] = ticket
        execute(slot.machine.request(ticket.id, http1Only: http1Only, fresh: fresh), slot, target)
        return ticket
    }

    /// Carries out the machine's actions in order. `error`: why an attempt failed (`fail`).
    private func execute(_ actions: [BearerdProxyCore.BackendPool.Action], _ slot: Slot, _ target: UpstreamTarget, error: ChannelError? = nil) {
        for action in actions {
            switch action {
            case .connect(let id, let http1Only):
                open(target, http1Only: http1Only, stillWanted: { slot.machine.resolved(id) }, abandoned: {},
                     done: { [self] result in connected(slot, target, id, result) })
            case .lease(let id, let request, let reused, let idleSince):
                guard let ticket = slot.tickets.removeValue(forKey: request.raw) else { continue }
                if reused {
                    guard let conn = reuse(slot, id, idleSince: idleSince) else {
                        // Not reusable after all: the request tries again.
                        slot.tickets[request.raw] = ticket
                        execute(slot.machine.request(request, http1Only: ticket.http1Only), slot, target, error: error)
                        continue
                    }
                    ticket.resume(.success(conn))
                } else {
                    guard case .http1(let conn) = slot[id] else {
                        ticket.resume(.failure(.protocolError("upstream connection closed")))
                        continue
                    }
                    conn.reused = false
                    ticket.resume(.success(conn))
                }
            case .openStream(let id, let request, let reused):
                guard let ticket = slot.tickets.removeValue(forKey: request.raw) else { continue }
                guard let stream = newStream(slot, id, reused: reused) else {
                    slot.tickets[request.raw] = ticket
                    execute(slot.machine.request(request, http1Only: ticket.http1Only), slot, target, error: error)
                    continue
                }
                ticket.resume(.success(stream))
            case .fail(let request, let failure):
                guard let ticket = slot.tickets.removeValue(forKey: request.raw) else { continue }
                switch failure {
                case .connectFailed:
                    ticket.resume(.failure(error ?? .protocolError("the upstream connection could not be opened")))
                case .http1Impossible:
                    ticket.resume(.failure(.protocolError("a WebSocket upgrade needs HTTP/1.1 towards the upstream; this route has http2: prior_knowledge")))
                }
            case .park(let id):
                guard case .http1(let conn) = slot[id] else { continue }
                guard conn.isIdle, let ch = conn.channel, !ch.isClosed else {
                    drop(slot, id)
                    conn.close()
                    continue
                }
                conn.parkIdle(deadline: slot.machine.idleDeadline(id) ?? loop.now)
            case .close(let id):
                closeMember(slot, id)
            }
        }
    }

    /// The machine forgets `id` and the slot its object.
    private func drop(_ slot: Slot, _ id: ConnectionID) {
        slot[id] = .none
        slot.machine.connectionClosed(id)
    }

    /// Empties the slot of a connection the machine closed (it has already forgotten it) and closes it.
    private func closeMember(_ slot: Slot, _ id: ConnectionID) {
        let member = slot[id]
        slot[id] = .none
        switch member {
        case .http1(let c): c.close()
        case .http2(let c): c.close()
        case .none: break
        }
    }

    /// Resolves and connects. `stillWanted` is asked once the address is known (through an
    /// outbound proxy's CONNECT tunnel also before CONNECT and once the tunnel is up): when no request
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
            // A request that went away before the tunnel is up opens none (`stillWanted`).
            ProxyTunnel.open(through: proxy, to: target.url.host, port: target.url.port,
                             timeout: .nanoseconds(Int64(clamping: target.connectTimeout)), on: loop,
                             stillWanted: stillWanted) { [self] result in
                switch result {
                case .failure(let f) where f.kind == .abandoned:
                    abandoned()
                case .failure(let f):
                    // Classified: a proxy timeout, its refusal (with its status), or an unreachable proxy.
                    connected(.failure(f.channelError))
                case .success(let tunnel):
                    BackendConnection(target: target, pool: self).connectThroughTunnel(tunnel, http1Only: http1Only, completion: connected)
                }
            }
            return
        }
        // http through a proxy: connect to the proxy, requests in absolute form. A connect error
        // then names the proxy, not the origin that was never dialled.
        let (host, port) = target.proxy.map { ($0.host, $0.port) } ?? (target.url.host, target.url.port)
        let attempted: (Result<BackendConnection.ConnectOutcome, ChannelError>) -> Void = { r in
            if let proxy = target.proxy, case .failure(.connect(let e)) = r {
                connected(.failure(.connect(IOError(e.call, e.errno, hint: (e.hint.map { $0 + "; " } ?? "") + "the outbound proxy \(proxy)"))))
            } else {
                connected(r)
            }
        }
        Resolver.shared.resolve(host: host, port: port, on: loop) { [self] result in
            switch result {
            case .failure(let e):
                attempted(.failure(.connect(e)))
            case .success(let addrs):
                guard stillWanted() else {
                    abandoned()
                    return
                }
                BackendConnection(target: target, pool: self).connect(addresses: addrs, http1Only: http1Only, completion: attempted)
            }
        }
    }

    /// An attempt ended: the machine hands the connection (or streams on it) to the requests
    /// that wait, parks it, or fails them.
    private func connected(_ slot: Slot, _ target: UpstreamTarget, _ id: ConnectionID,
                           _ result: Result<BackendConnection.ConnectOutcome, ChannelError>) {
        switch result {
        case .failure(let e):
            execute(slot.machine.connectFailed(id), slot, target, error: e)
        case .success(.http1(let c)):
            c.poolID = id
            slot[id] = .http1(c)
            execute(slot.machine.connected(id, .http1, now: loop.now), slot, target)
        case .success(.http2(let h2)):
            h2.poolID = id
            slot[id] = .http2(h2)
            execute(slot.machine.connected(id, .http2(maxConcurrentStreams: h2.maxConcurrentStreams), now: loop.now), slot, target)
        }
    }

    /// Returns a connection after a complete exchange; closes it when not reusable or the pool is full.
    func release(_ conn: BackendConnection) {
        guard let slot = existingSlot(conn.target.poolID), case .http1(let member) = slot[conn.poolID], member === conn else {
            conn.close()
            return
        }
        // Bytes after a complete response (a second response, a body on 204/304/HEAD) mean the
        // connection's framing cannot be trusted: close it, never pool it (docs/architecture.md §5).
        let reusable = conn.isReusable && !conn.hasBufferedInput && !(conn.channel?.isClosed ?? true)
        switch slot.machine.released(conn.poolID, reusable: reusable, now: loop.now) {
        case .park(let deadline):
            conn.parkIdle(deadline: deadline)
        case .close:
            slot[conn.poolID] = .none
            conn.close()
        }
    }

    /// The idle connection's deadline passed: true when it is to close (the machine forgot it).
    func idleExpired(_ conn: BackendConnection, now: UInt64) -> Bool {
        guard let slot = existingSlot(conn.target.poolID), case .http1(let member) = slot[conn.poolID], member === conn else { return true }
        guard slot.machine.idleTimerFired(conn.poolID, now: now) else {
            if let d = slot.machine.idleDeadline(conn.poolID) { conn.deadline = d }
            return false
        }
        slot[conn.poolID] = .none
        return true
    }

    /// The connection closed (or became a tunnel that closed): the machine forgets it.
    func forget(_ conn: BackendConnection) {
        guard let slot = existingSlot(conn.target.poolID), case .http1(let member) = slot[conn.poolID], member === conn else { return }
        drop(slot, conn.poolID)
    }

    /// An HTTP/2 connection closed: it takes no more streams.
    func forget(_ conn: BackendH2Connection) {
        guard let slot = existingSlot(conn.target.poolID), case .http2(let member) = slot[conn.poolID], member === conn else { return }
        drop(slot, conn.poolID)
    }

    /// GOAWAY on an HTTP/2 connection: no new streams on it.
    func goingAway(_ conn: BackendH2Connection) {
        guard let slot = existingSlot(conn.target.poolID), case .http2(let member) = slot[conn.poolID], member === conn else { return }
        slot.machine.goingAway(conn.poolID)
    }

    /// A stream handed out on `conn` is done (closed on the wire, or given back unopened).
    func streamClosed(_ conn: BackendH2Connection) {
        guard let slot = existingSlot(conn.target.poolID), case .http2(let member) = slot[conn.poolID], member === conn else { return }
        slot.machine.streamClosed(conn.poolID)
    }

    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS changed (RFC 9113 §6.5.2).
    func settingsChanged(_ conn: BackendH2Connection) {
        guard let slot = existingSlot(conn.target.poolID), case .http2(let member) = slot[conn.poolID], member === conn else { return }
        slot.machine.settingsChanged(conn.poolID, maxConcurrentStreams: conn.maxConcurrentStreams)
    }

    func closeAll() {
        for case let slot? in slots {
            for id in slot.machine.closeAll() {
                closeMember(slot, id)
            }
        }
    }

    var idleCount: Int { slots.reduce(0) { $0 + ($1.map { $0.machine.idleCount + $0.machine.idleHTTP2Count } ?? 0) } }

    /// Open HTTP/2 connections (for tests and metrics).
    var http2ConnectionCount: Int { slots.reduce(0) { $0 + ($1?.machine.http2Count ?? 0) } }

    /// Connection attempts in flight and requests waiting for `target` (for tests).
    func pending(_ target: UpstreamTarget) -> (attempts: Int, waiting: Int) {
        guard let slot = existingSlot(target.poolID) else { return (0, 0) }
        return (slot.machine.attemptCount, slot.machine.waitingCount)
    }
}
