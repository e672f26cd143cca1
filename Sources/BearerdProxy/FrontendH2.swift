import BearerdHTTP
import BearerdHTTP2
import BearerdIO
import BearerdProxyCore
import BearerdConfig
import BearerdService
import BearerdOAuth

/// A client connection of the proxy listeners, whatever its protocol (for shutdown and metrics).
protocol ClientConnection: LoopTimeoutable {
    var channel: SocketChannel { get }
    /// Where the connection sits in its loop's `LoopContext.frontends` (-1: not there). Set only
    /// by `LoopContext.addFrontend`/`removeFrontend`.
    var frontendSlot: Int { get set }
    /// Counted in `bearerd_open_connections` (admin connections are not).
    var isProxyConnection: Bool { get }
    /// Shutdown: finish what runs, start nothing new, close.
    func drain()
}

/// The client connection preface of HTTP/2 (RFC 9113 §3.4): how a listener tells prior-knowledge
/// h2c from HTTP/1.1 on the same port.
enum HTTP2Preface {
    static let bytes: [UInt8] = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

    enum Match { case http2, notHTTP2, needMore }

    static func match(_ received: UnsafeRawBufferPointer) -> Match {
        let n = min(received.count, bytes.count)
        for i in 0..<n where received[i] != bytes[i] { return .notHTTP2 }
        return n == bytes.count ? .http2 : .needMore
    }
}

/// One HTTP/2 client connection (prior-knowledge h2c, or TLS with ALPN `h2`). Lives on its loop.
///
/// Owns the server-side `HTTP2Session` and the streams (`FrontendH2Stream`), each of which runs
/// one `ProxyExchangeDriver` exactly as an HTTP/1.1 request does. Bytes in go through
/// `session.receive`; the events it records start streams and feed their exchanges; bytes out
/// are produced once per loop event (`scheduleFlush`) and not while the socket's output is over
/// its high-water mark, so the per-stream buffers fill and their exchanges pause their upstreams
/// (backpressure per stream, never the whole connection). Received DATA opens the client's
/// window again only when the stream's exchange took it (`consumed`).
///
/// A stream's exchange is created with its HEADERS but started (token, upstream connection)
/// only after every event of the same read was dispatched (`pendingStarts`): a stream the client
/// resets in that read never reaches for an upstream (RFC 9113 §10.5, rapid reset). The engine
/// counts such resets against `StreamResetBudget` and ends an abusive connection itself.
///
/// Phases: `open` → (`drain`, a GOAWAY from the client, idle timeout) `draining`: no new streams,
/// close when the last one ends → `closed`.
final class FrontendH2Connection: ChannelDelegate, LoopTimeoutable, ClientConnection {
    let channel: SocketChannel
    let ctx: LoopContext
    let clientAddress: String
    let policy: ListenerPolicy?
    let session: HTTP2Session
    private let gate: RequestGate
    /// The SO_PEERCRED refusal decided at accept (unix listeners), answered on every stream.
    private let peerRefusal: String?
    @exclusivity(unchecked) private var streams: [Int32: FrontendH2Stream] = [:]
    /// Streams whose exchange waits for the end of the current dispatch to start.
    @exclusivity(unchecked) private var pendingStarts: [FrontendH2Stream] = []

    enum Phase { case open, draining, closed }
    // `@exclusivity(unchecked)`: trivially copyable scalars only (see `SocketChannel`).
    @exclusivity(unchecked) private var phase: Phase = .open
    @exclusivity(unchecked) var deadline: UInt64 = 0
    @exclusivity(unchecked) var frontendSlot = -1
    @exclusivity(unchecked) private var flushScheduled = false
    @exclusivity(unchecked) private var out: [UInt8] = []
    /// When the client last sent anything (its streams that owe body bytes are timed out from here).
    @exclusivity(unchecked) private var lastRead: UInt64 = 0

    var isProxyConnection: Bool { true }

    init(channel: SocketChannel, ctx: LoopContext, clientAddress: String, policy: ListenerPolicy?, peerRefusal: String?) throws(HTTP2Error) {
        self.channel = channel
        self.ctx = ctx
        self.clientAddress = clientAddress
        self.policy = policy
        self.peerRefusal = peerRefusal
        gate = RequestGate(policy: policy, clientAddress: clientAddress, scheme: policy?.scheme ?? "http")
        var settings = HTTP2Settings()
        let limits = ctx.runtime.config.limits
        settings.maxHeaderListSize = UInt32(clamping: limits.maxHeaderBytes)
        // The HTTP/1.1 listener's limits, answered the same way (431).
        settings.maxHeaderCount = limits.maxHeaderCount
        settings.streamResetBudget = StreamResetBudget()
        // Per stream: what an exchange may buffer before it is consumed (the client's upload
        // window); per connection: the sum over its streams.
        settings.initialWindowSize = 256 * 1024
        settings.connectionWindowSize = 4 << 20
        // RFC 8441: WebSockets over HTTP/2 as extended CONNECT, tunnelled to an HTTP/1.1 upgrade.
        settings.enableConnectProtocol = true
        session = try HTTP2Session(role: .server, settings: settings)
    }

    /// Takes over the channel from the HTTP/1.1 connection that detected HTTP/2; `initial`: the
    /// bytes already read (the preface and whatever followed).
    func start(initial: [UInt8]) {
        ctx.addFrontend(self)
        channel.delegate = self
        armIdle()
        if !initial.isEmpty {
            initial.withUnsafeBytes { receive($0) }
        }
        flush()
    }

    // MARK: input

    private func receive(_ bytes: UnsafeRawBufferPointer) {
        guard phase != .closed else { return }
        lastRead = monotonicNanos()
        defer { armIdle() }
        do {
            try session.receive(bytes, now: ctx.loop.now)
        } catch {
            ctx.runtime.logger.info("bad HTTP/2 client", metadata: ["client": "\(clientAddress)", "reason": "\(error)"])
            dispatchEvents()
            flush()
            closeAll()
            return
        }
        dispatchEvents()
        if let code = session.terminatedWith, phase == .open {
            phase = .draining
            ctx.runtime.logger.warning("HTTP/2 client connection ended", metadata: [
                "client": "\(clientAddress)", "reason": "\(code == .enhanceYourCalm ? "h2.too_many_resets" : "h2.unexpected_stream_id")",
                "http2.error": "\(code)"])
        }
    }

    private func dispatchEvents() {
        // The idle deadline is computed once for the batch, not per closed stream (it looks at
        // every stream).
        var closedAny = false
        while session.hasEvents {
            for event in session.takeEvents() {
                switch event {
                case .headers(let id, let fields, .request, let endStream):
                    startStream(id, fields: fields, endStream: endStream)
                case .requestHeadRefused(let id, let limit, _):
                    refuseHead(id, limit: limit)
                case .headers(let id, let fields, .trailers, _):
                    streams[id]?.requestTrailers(fields)
                case .headers:
                    break  // a server receives no responses
                case .data(let id, let bytes, let endStream):
                    if let s = streams[id] {
                        s.requestData(bytes, endStream: endStream)
                    } else {
                        session.consumed(stream: id, count: bytes.count)
                    }
                case .streamClosed(let id, let code):
                    streams.removeValue(forKey: id)?.closed(errorCode: code)
                    closedAny = true
                case .goAway:
                    if phase == .open { phase = .draining }
                case .streamWritable(let id):
                    streams[id]?.writable()
                case .remoteSettings, .pingAck:
                    break
                }
            }
        }
        if closedAny { armIdle() }
        startPending()
        scheduleFlush()
    }

    /// Starts the exchanges of the streams opened by the events just dispatched, unless the
    /// stream closed meanwhile (its exchange was aborted and dropped) or the engine ended the
    /// connection.
    private func startPending() {
        guard !pendingStarts.isEmpty else { return }
        let starting = pendingStarts
        pendingStarts.removeAll()
        for stream in starting {
            guard let ex = stream.exchange else { continue }
            guard session.terminatedWith == nil, phase != .closed else {
                stream.closed(errorCode: HTTP2ErrorCode.cancel.rawValue)
                continue
            }
            ex.start()
        }
    }

    // MARK: streams

    /// A request head over the listener's limits (`limits:`): 431 with the JSON error, as the
    /// HTTP/1.1 listener answers the same head.
    private func refuseHead(_ id: Int32, limit: HTTP2Event.RequestHeadLimit) {
        guard let stream = openStream(id) else { return }
        let limits = ctx.runtime.config.limits
        switch limit {
        case .fieldCount:
            stream.refuse(Refusal(status: 431, error: "h2.too_many_headers", detail: "more than \(limits.maxHeaderCount) fields", closes: true))
        case .size:
            stream.refuse(Refusal(status: 431, error: "h2.header_too_large", detail: "header fields larger than \(limits.maxHeaderBytes) bytes", closes: true))
        }
    }

    /// The stream for a new request, or nil (and the stream refused) while draining.
    private func openStream(_ id: Int32) -> FrontendH2Stream? {
        guard phase == .open else {
            session.resetStream(id, error: .refusedStream)
            return nil
        }
        let stream = FrontendH2Stream(id: id, connection: self)
        streams[id] = stream
        deadline = 0
        return stream
    }

    private func startStream(_ id: Int32, fields: [HTTPField], endStream: Bool) {
        guard let stream = openStream(id) else { return }
        if let refusal = peerRefusal {
            stream.refuse(Refusal(status: 403, error: "peer_not_allowed", detail: refusal, closes: true))
            return
        }
        let request: HTTP2HeaderMapping.Request
        do {
            request = try HTTP2HeaderMapping.request(from: fields)
        } catch {
            stream.refuse(Refusal(status: 400, error: error.reason, detail: error.message, closes: true))
            return
        }
        var head = request.head
        var websocket = false
        if let proto = request.extendedProtocol {
            guard asciiCaseInsensitiveEquals(proto, "websocket") else {
                stream.refuse(Refusal(status: 501, error: "proxy.unsupported_protocol",
                                      detail: "extended CONNECT is tunnelled for websocket only, not \(proto)", closes: true))
                return
            }
            // RFC 8441 §5: the upstream gets the HTTP/1.1 handshake of RFC 6455 §4.1.
            head = Self.websocketHandshake(from: head)
            websocket = true
        }
        if head.target.utf8.count > ctx.runtime.config.limits.maxRequestTarget {
            stream.refuse(Refusal(status: 414, error: "http1.target_too_long", detail: "request target longer than the limit", closes: true))
            return
        }
        let framing: HTTP1BodyFraming
        if endStream || websocket {
            framing = .none
        } else if let cl = head.headers.first(.contentLength) {
            guard let n = UInt64(cl), cl.utf8.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }) else {
                stream.refuse(Refusal(status: 400, error: "h2.invalid_content_length", detail: "content-length is not a number", closes: true))
                return
            }
            framing = n == 0 ? .none : .contentLength(n)
        } else {
            framing = .chunked  // length unknown: an HTTP/1.1 upstream gets it chunked
        }
        if let refusal = gate.admission(head, ctx: ctx) {
            stream.refuse(refusal)
            return
        }
        switch gate.route(head, framing: framing, ctx: ctx) {
        case .refuse(let r):
            stream.refuse(r)
        case .proxy(let routeIndex, let upstreamHead, let logPath, let isWebSocket):
            // WebSocket over HTTP/2 is extended CONNECT only; an Upgrade field sent in HTTP/2 is
            // connection-specific and was refused by the mapping.
            stream.websocket = websocket && isWebSocket
            let ex = ProxyExchangeDriver(client: stream, ctx: ctx, head: head, framing: framing, routeIndex: routeIndex,
                                         upstreamHead: upstreamHead, logPath: logPath, keepAlive: true,
                                         upgrade: stream.websocket ? .extendedConnect : .none)
            stream.exchange = ex
            pendingStarts.append(stream)
        }
    }

    /// The HTTP/1.1 WebSocket handshake for an extended CONNECT: GET with `Upgrade: websocket`,
    /// `Connection: Upgrade` and a fresh `Sec-WebSocket-Key` (HTTP/2 has none); the client's
    /// `sec-websocket-version`, `-protocol` and `-extensions` go along as sent.
    static func websocketHandshake(from connect: HTTPRequestHead) -> HTTPRequestHead {
        var h = connect.headers
        h.set("Connection", "Upgrade")
        h.set("Upgrade", "websocket")
        if !h.contains("sec-websocket-key") {
            var g = SystemRandomNumberGenerator()
            let nonce = (0..<16).map { _ in UInt8.random(in: 0...255, using: &g) }
            h.add("Sec-WebSocket-Key", Base64.encode(nonce))
        }
        if !h.contains("sec-websocket-version") { h.add("Sec-WebSocket-Version", "13") }
        return HTTPRequestHead(method: "GET", target: connect.target, version: .http1_1, headers: h)
    }

    /// A stream finished its response (or gave up).
    func streamFinished(_ stream: FrontendH2Stream, abort: Bool) {
        if abort {
            session.resetStream(stream.id, error: .internalError)
        }
        scheduleFlush()
    }

    // MARK: output

    func scheduleFlush() {
        guard !flushScheduled, phase != .closed else { return }
        flushScheduled = true
        ctx.loop.deferToEndOfEvent { [self] in flush() }
    }

    func flush() {
        flushScheduled = false
        guard phase != .closed else { return }
        // Over the mark: `channelWritable` flushes again; meanwhile stream buffers fill and their
        // exchanges pause their upstreams.
        if channel.isOverHighWater { return }
        do {
            try session.produce(into: &out)
        } catch {
            ctx.runtime.logger.info("HTTP/2 session failed", metadata: ["client": "\(clientAddress)", "reason": "\(error)"])
            closeAll()
            return
        }
        if !out.isEmpty { channel.write(taking: &out) }
        if session.hasEvents { dispatchEvents() }  // streamWritable from the data sources
        if session.isFinished || (phase == .draining && streams.isEmpty && !session.wantsWrite) {
            phase = .closed
            channel.closeAfterFlush()
        }
    }

    /// No stream: close after `idle` (GOAWAY). Streams whose client still owes body bytes: they
    /// must keep moving (`idle` since the last read, as for HTTP/1.1 bodies). Otherwise the
    /// upstreams' response timeouts govern.
    private func armIdle() {
        if streams.isEmpty {
            deadline = phase == .open ? monotonicNanos() &+ ctx.runtime.idleTimeout : 0
        } else if streams.values.contains(where: { $0.owesBody }) {
            deadline = lastRead &+ ctx.runtime.idleTimeout
        } else {
            deadline = 0
        }
    }

    // MARK: ChannelDelegate

    func channelRead(_ channel: SocketChannel, _ bytes: UnsafeRawBufferPointer) {
        receive(bytes)
    }

    func channelEOF(_ channel: SocketChannel) {
        closeAll()
    }

    func channelError(_ channel: SocketChannel, _ error: ChannelError) {
        closeAll()
    }

    func channelWritable(_ channel: SocketChannel) {
        flush()
        for (_, s) in streams where !s.isOverHighWater { s.exchange?.frontendWritable() }
    }

    func channelClosed(_ channel: SocketChannel) {
        abortStreams()
        phase = .closed
        deadline = 0
        ctx.removeFrontend(self)
    }

    func deadlineExpired(now: UInt64) {
        deadline = 0
        guard streams.isEmpty else {
            // Streams whose uploads stalled are reset; the others go on.
            for (_, s) in streams where s.owesBody { s.timedOut() }
            armIdle()
            return
        }
        drain()
    }

    func drain() {
        guard phase == .open else { return }
        phase = .draining
        session.goAway(error: .noError)
        flush()
    }

    private func abortStreams() {
        let all = streams
        streams.removeAll()
        for (_, s) in all { s.closed(errorCode: HTTP2ErrorCode.cancel.rawValue) }
    }

    private func closeAll() {
        abortStreams()
        phase = .closed
        channel.close()
    }
}

/// One request stream of a `FrontendH2Connection`, the `ExchangeClient` of its exchange: writes
/// the response as HTTP/2 frames through the connection's session. Lives on the loop.
/// Invariant: `exchange` is set while the exchange runs and cleared when it finished or the
/// stream closed (which breaks the exchange ↔ stream reference cycle). Its `Phase` says which
/// side still carries bytes: the request's body (`receiving`), the response alone
/// (`responding`), a WebSocket tunnel (`tunnelling`, RFC 8441), or nothing (`closed`: the
/// response ended and later writes are dropped).
final class FrontendH2Stream: ExchangeClient {
    enum Phase {
        /// The request (its body) is still arriving; the response has not ended.
        case receiving
        /// The request is complete; the response has not ended.
        case responding
        /// An extended CONNECT's tunnel is open through `driver`; `paused`: the upstream side is
        /// over its high-water mark, so received DATA is not given back to the client's window.
        case tunnelling(ProxyExchangeDriver, paused: Bool)
        /// The response ended (END_STREAM queued) or the stream closed.
        case closed
    }

    let id: Int32
    /// Strong: the exchange holds its stream, and an upstream may keep the exchange until it
    /// answers or fails, so the stream can outlive the connection's table; calls then reach a
    /// closed connection (which ignores them), never a freed one. The cycle with
    /// `FrontendH2Connection.streams` is broken when the stream leaves that table.
    let connection: FrontendH2Connection
    @exclusivity(unchecked) var exchange: ProxyExchangeDriver?
    /// Received DATA bytes not yet given back to the client's window (the exchange is paused).
    @exclusivity(unchecked) private var unconsumed = 0
    @exclusivity(unchecked) private(set) var phase: Phase = .receiving
    /// An extended CONNECT for a WebSocket (RFC 8441): a 101 upstream becomes 200 here and the
    /// stream's DATA frames carry the tunnel.
    @exclusivity(unchecked) var websocket = false
    /// Tunnel bytes: DATA received before the tunnel opened is kept for it.
    @exclusivity(unchecked) private var earlyTunnelBytes: [UInt8] = []

    private var isClosed: Bool {
        if case .closed = phase { return true }
        return false
    }

    init(id: Int32, connection: FrontendH2Connection) {
        self.id = id
        self.connection = connection
    }

    private var session: HTTP2Session { connection.session }

    // MARK: request side

    func requestData(_ bytes: [UInt8], endStream: Bool) {
        guard let ex = exchange else {
            session.consumed(stream: id, count: bytes.count)
            return
        }
        if websocket {
            switch phase {
            case .tunnelling(let t, let paused):
                if !bytes.isEmpty {
                    bytes.withUnsafeBytes { t.clientTunnelBytes($0) }
                    if paused { unconsumed = unconsumed &+ bytes.count } else { session.consumed(stream: id, count: bytes.count) }
                }
                if endStream { t.clientTunnelEnded() }
            case .receiving, .responding, .closed:
                earlyTunnelBytes += bytes
                unconsumed = unconsumed &+ bytes.count
                if endStream { abortExchange() }
            }
            return
        }
        if !bytes.isEmpty {
            ex.requestBody(bytes[...])
            if ex.wantsBody {
                session.consumed(stream: id, count: bytes.count &+ unconsumed)
                unconsumed = 0
            } else {
                unconsumed = unconsumed &+ bytes.count
            }
        }
        if endStream { endRequest(trailers: nil) }
    }

    func requestTrailers(_ fields: [HTTPField]) {
        guard let trailers = try? HTTP2HeaderMapping.trailers(from: fields) else {
            abortExchange()
            return
        }
        endRequest(trailers: trailers.count > 0 ? trailers : nil)
    }

    /// The client ended the request (once: RFC 9113 §5.1 allows no frame after END_STREAM).
    private func endRequest(trailers: HTTPHeaders?) {
        switch phase {
        case .responding: return
        case .receiving: phase = .responding
        case .tunnelling, .closed: break
        }
        exchange?.requestEnd(trailers: trailers)
    }

    /// The stream closed (both ends done, or reset by the client).
    func closed(errorCode: UInt32) {
        if unconsumed > 0 {
            // The connection's window still counts these bytes.
            session.consumed(stream: id, count: unconsumed)
            unconsumed = 0
        }
        if case .tunnelling(let t, _) = phase {
            phase = .closed
            t.abort()
        }
        if let ex = exchange {
            exchange = nil
            ex.abort()
        }
    }

    func writable() {
        exchange?.frontendWritable()
    }

    /// The exchange waits for request body bytes the client has not sent.
    var owesBody: Bool {
        if case .responding = phase { return false }
        guard let ex = exchange else { return false }
        return !ex.requestComplete && ex.wantsBody
    }

    /// The client stopped sending its body in time: drop the exchange, reset the stream.
    func timedOut() {
        if let ex = exchange {
            exchange = nil
            ex.abort()
        }
        session.resetStream(id, error: .cancel)
        connection.scheduleFlush()
    }

    private func abortExchange() {
        if let ex = exchange {
            exchange = nil
            ex.abort()
        }
        session.resetStream(id, error: .protocolError)
        connection.scheduleFlush()
    }

    /// Answers the stream without an exchange (a refusal before routing).
    func refuse(_ r: Refusal) {
        ctx.metrics.countRequest(slot: 0, status: r.status)  // route="none": answered before routing
        let (head, body) = ErrorResponse.parts(status: r.status, error: r.error, detail: r.detail, extra: r.extra, fields: r.fields)
        sendLocalResponse(head, body: body, keepAlive: true)
    }

    private var ctx: LoopContext { connection.ctx }

    // MARK: ExchangeClient

    var protocolName: String { "h2" }

    var isOverHighWater: Bool {
        session.outboundBuffered(stream: id) >= HTTP2Session.highWater || connection.channel.isOverHighWater
    }

    func sendContinue() {
        try? session.submitResponse(stream: id, [HTTPField(name: ":status", value: "100")], endStream: false)
        connection.scheduleFlush()
    }

    func sendInformational(_ upstream: HTTPResponseHead) {
        if upstream.status == 101 {
            // No protocol switch in HTTP/2 (RFC 9113 §8.6): an extended CONNECT is answered 200
            // (RFC 8441 §5), with what the upstream's handshake negotiated.
            guard websocket, case .tunnelling = phase else { return }
            var h = upstream.headers
            for name in ["Upgrade", "Connection", "Sec-WebSocket-Accept"] { h.remove(name) }
            let ok = ProxyHeaders.h2ClientResponse(upstream: HTTPResponseHead(status: 200, reason: "OK", headers: h))
            try? session.submitResponse(stream: id, HTTP2HeaderMapping.responseFields(ok, lowercasingNames: false), endStream: false)
            connection.scheduleFlush()
            return
        }
        let h = ProxyHeaders.h2ClientResponse(upstream: upstream)
        try? session.submitResponse(stream: id, HTTP2HeaderMapping.responseFields(h, lowercasingNames: false), endStream: false)
        connection.scheduleFlush()
    }

    func sendResponseHead(_ upstream: HTTPResponseHead, framing: HTTP1BodyFraming, request: HTTPRequestHead,
                          keepAlive: Bool, endStream: Bool) -> Bool {
        guard !isClosed else { return true }
        let h = ProxyHeaders.h2ClientResponse(upstream: upstream)
        let bodyless = request.method == "HEAD" || upstream.status == 204 || upstream.status == 304
        let end = endStream || bodyless
        do {
            try session.submitResponse(stream: id, HTTP2HeaderMapping.responseFields(h, lowercasingNames: false), endStream: end)
        } catch {
            abortExchange()
            return true
        }
        if end { phase = .closed }
        connection.scheduleFlush()
        return true
    }

    func sendResponseBody(_ raw: UnsafeRawBufferPointer) {
        guard !isClosed else { return }
        session.sendData(stream: id, raw)
        connection.scheduleFlush()
    }

    func finishResponse(trailers: HTTPHeaders?) {
        guard !isClosed else { return }
        phase = .closed
        session.endStream(stream: id, trailers: trailers.map(HTTP2HeaderMapping.trailerFields))
        connection.scheduleFlush()
    }

    func sendLocalResponse(_ head: HTTPResponseHead, body: [UInt8], keepAlive: Bool) {
        guard !isClosed else { return }
        phase = .closed
        let noBody = body.isEmpty || exchange?.head.method == "HEAD"
        do {
            try session.submitResponse(stream: id, HTTP2HeaderMapping.responseFields(head, lowercasingNames: false), endStream: noBody)
        } catch {
            session.resetStream(id, error: .internalError)
        }
        if !noBody {
            body.withUnsafeBytes { session.sendData(stream: id, $0) }
            // An extended CONNECT answered here opened no tunnel: the client's side, still open
            // for tunnel bytes, is closed after the answer (RFC 9113 §8.1, NO_ERROR).
            session.endStream(stream: id, trailers: nil, resetAfter: websocket ? .noError : nil)
        }
        connection.scheduleFlush()
    }

    func exchangeWantsBody() {
        guard unconsumed > 0 else { return }
        session.consumed(stream: id, count: unconsumed)
        unconsumed = 0
        connection.scheduleFlush()
    }

    func exchangeFinished(_ ex: FrontendExchange, keepAlive: Bool, abort: Bool) {
        guard exchange === ex else { return }
        exchange = nil
        if unconsumed > 0 {
            session.consumed(stream: id, count: unconsumed)
            unconsumed = 0
        }
        connection.streamFinished(self, abort: abort)
    }

    func startTunnel(_ ex: ProxyExchangeDriver) -> [UInt8]? {
        guard websocket, exchange === ex, !isClosed else { return nil }
        let early = earlyTunnelBytes
        earlyTunnelBytes = []
        phase = .tunnelling(ex, paused: false)
        if unconsumed > 0 {
            session.consumed(stream: id, count: unconsumed)
            unconsumed = 0
        }
        return early
    }

    func tunnelWrite(_ raw: UnsafeRawBufferPointer) {
        guard !isClosed else { return }
        session.sendData(stream: id, raw)
        connection.scheduleFlush()
    }

    func pauseTunnelReading() {
        if case .tunnelling(let t, _) = phase { phase = .tunnelling(t, paused: true) }
    }

    func resumeTunnelReading() {
        if case .tunnelling(let t, _) = phase { phase = .tunnelling(t, paused: false) }
        exchangeWantsBody()
    }

    func endTunnel() {
        finishResponse(trailers: nil)
    }
}
