import BearerdHTTP
import BearerdIO
import BearerdProxyCore
import BearerdConfig
import BearerdSessions
import BearerdService

/// One client connection (HTTP/1.1 server side). Lives on its loop for its whole life.
///
/// Parses requests with the strict parser, runs one exchange at a time and answers pipelined
/// requests in order: bytes of the next request stay in the parser until the current exchange
/// has finished (bounded by pausing reads). Deadlines: `header_read` from the first byte of a
/// head (408 on expiry), `idle` between requests (silent close), `idle` while the client owes
/// its body; none while the upstream answers (its response timeout governs).
///
/// Phases (`Phase`): `awaitingHead(deadline)` → a head → `exchanging` → finished with keep-alive
/// → `awaitingHead(.idle)`; `exchanging` → a 101 relayed → `tunnelling` (bytes pass unparsed);
/// any phase → `closing` (error answered, refusal, close, drain).
///
/// A client's EOF (FIN) ends its input, not the answers it is owed (RFC 9112 §9.6, docs/architecture.md §5): the
/// parser records it (`parser.receivedEOF`), reading stops, and whatever was received is still
/// parsed and answered in order (pipelined requests, a request still running, a 400 for a
/// malformed or unfinished one); the connection closes once the input is used up.
///
/// As the `ExchangeClient` of its exchanges it writes HTTP/1.1: it owns the framing of the
/// response in progress (`responseFraming`: Content-Length, chunked or until close).
///
/// Access control (docs/architecture.md §4 `listen:`) comes from the listener's `policy`: a unix peer refused by
/// SO_PEERCRED gets 403 for its first request, a Host outside the loopback allowlist gets 421;
/// either way nothing is forwarded and the connection closes.
final class FrontendConnection: ChannelDelegate, LoopTimeoutable, ClientConnection {
    let channel: SocketChannel
    let ctx: LoopContext
    let clientAddress: String
    let local: LocalResponder?
    /// What the listener enforces; nil for the admin listener.
    let policy: ListenerPolicy?
    /// Set at accept when the unix peer is not admitted: the detail of the 403 its request gets.
    private var peerRefusal: String?
    /// Admission and routing, shared with HTTP/2 streams.
    private let gate: RequestGate
    /// Unchecked exclusivity: the parser calls out to nothing, so no access to it can overlap
    /// another (saves a dynamic check per feed, event and query).
    @exclusivity(unchecked) private var parser: HTTP1Parser

    /// Which deadline runs while no exchange does.
    enum HeadDeadline: Equatable {
        /// `header_read`: the first request, or bytes of a head arrived.
        case headerRead
        /// `idle`: between requests, nothing received yet.
        case idle
    }
    /// The connection's phase; exactly one at a time.
    enum Phase {
        case awaitingHead(HeadDeadline)
        case exchanging(FrontendExchange)
        /// After a 101: client bytes go to the exchange unparsed, until either side ends.
        case tunnelling(ProxyExchangeDriver)
        /// Nothing more is read or started; the channel is closing or closed.
        case closing
    }
    @exclusivity(unchecked) private var phase: Phase = .awaitingHead(.headerRead)
    /// Requests started on this connection.
    @exclusivity(unchecked) private var requests = 0
    @exclusivity(unchecked) var deadline: UInt64 = 0
    @exclusivity(unchecked) var frontendSlot = -1

    /// The running exchange, if any.
    private var exchange: FrontendExchange? {
        if case .exchanging(let ex) = phase { return ex }
        return nil
    }
    private var isClosing: Bool {
        if case .closing = phase { return true }
        return false
    }
    /// Pipelined bytes held while an exchange runs; more pauses reading.
    static let pipelineLimit = 64 * 1024

    var isProxyConnection: Bool { !(local is AdminResponder) }

    /// Until the first bytes tell HTTP/1.1 from the HTTP/2 preface: what was read so far (only
    /// while those bytes are a prefix of the preface). nil once decided, and on the admin listener.
    private var prefaceProbe: [UInt8]?

    init(channel: SocketChannel, ctx: LoopContext, peer: SocketAddress, local: LocalResponder?, policy: ListenerPolicy? = nil) {
        self.channel = channel
        self.ctx = ctx
        self.local = local
        self.policy = policy
        clientAddress = ctx.clientHost(peer)
        parser = HTTP1Parser(role: .server, limits: ctx.runtime.config.limits)
        parser.lineCache = ctx.requestLines
        gate = RequestGate(policy: policy, clientAddress: clientAddress, scheme: policy?.scheme ?? "http")
        prefaceProbe = local == nil ? [] : nil
        channel.delegate = self
    }

    /// `readingFirst`: the request should be waiting already (see `SocketChannel.start`).
    func start(readingFirst: Bool = false) {
        ctx.addFrontend(self)
        deadline = ctx.loop.now &+ ctx.runtime.headerReadTimeout
        phase = .awaitingHead(.headerRead)
        if let policy, policy.checksPeer { checkPeer(policy) }
        channel.start(readingFirst: readingFirst)
    }

    /// SO_PEERCRED against `allow_uids`/`allow_gids` (unix(7)). A refused peer's first request
    /// is answered 403 (reading it first, so the client sees an HTTP answer, not a reset).
    private func checkPeer(_ policy: ListenerPolicy) {
        let creds: PeerCredentials
        do {
            creds = try Sys.peerCredentials(channel.fd)
        } catch {
            peerRefusal = "the peer's credentials could not be read (\(error)); \(policy.label) admits only allow_uids/allow_gids"
            ctx.runtime.logger.warning("peer refused", metadata: ["listener": "\(policy.label)", "reason": "\(error)"])
            return
        }
        if policy.config.admits(uid: creds.uid, gid: creds.gid) { return }
        peerRefusal = "uid \(creds.uid) gid \(creds.gid) is not in allow_uids/allow_gids of \(policy.label)"
        ctx.runtime.logger.warning("peer refused", metadata: [
            "listener": "\(policy.label)", "peer.uid": "\(creds.uid)", "peer.gid": "\(creds.gid)", "peer.pid": "\(creds.pid)",
        ])
    }

    /// Writes a refusal (403, 421) and closes: counted like other local errors, nothing forwarded.
    private func refuse(status: Int, bytes: [UInt8]) {
        ctx.metrics.countRequest(slot: 0, status: status)  // route="none": refused before routing
        channel.write(bytes)
        phase = .closing
        channel.closeAfterFlush()
    }

    // MARK: output used by exchanges

    func writeRaw(_ bytes: [UInt8]) { channel.write(bytes) }
    func writeRaw(_ bytes: UnsafeRawBufferPointer) { channel.write(bytes) }
    func writeTaking(_ bytes: inout [UInt8]) { channel.write(taking: &bytes) }
    var isOverHighWater: Bool { channel.isOverHighWater }

    /// How the response in progress is framed for this client.
    @exclusivity(unchecked) private var responseFraming: ProxyHeaders.ClientFraming = .none
    /// Scratch for chunk framing and heads, reused across responses.
    @exclusivity(unchecked) private var scratch: [UInt8] = []

    // MARK: ChannelDelegate

    func channelRead(_ channel: SocketChannel, _ bytes: UnsafeRawBufferPointer) {
        if case .tunnelling(let ex) = phase {
            ex.clientTunnelBytes(bytes)
            return
        }
        if let probe = prefaceProbe {
            // Prior-knowledge HTTP/2 (RFC 9113 §3.3) on the same port as HTTP/1.1.
            if probe.isEmpty {
                switch HTTP2Preface.match(bytes) {
                case .http2:
                    switchToHTTP2(initial: Array(bytes))
                    return
                case .needMore:
                    prefaceProbe = Array(bytes)
                    return
                case .notHTTP2:
                    prefaceProbe = nil
                }
            } else {
                let all = probe + Array(bytes)
                let m = all.withUnsafeBytes { HTTP2Preface.match($0) }
                switch m {
                case .http2:
                    switchToHTTP2(initial: all)
                    return
                case .needMore:
                    prefaceProbe = all
                    return
                case .notHTTP2:
                    prefaceProbe = nil
                    all.withUnsafeBytes { parser.feed($0) }
                    processInput()
                    armBodyDeadline()
                    return
                }
            }
        }
        parser.feed(bytes)
        processInput()
        armBodyDeadline()
    }

    /// While an exchange waits for the client's body, the upload must keep moving (`idle`); once the
    /// body is complete (or we stopped reading it ourselves) the client owes nothing, and the
    /// upstream's response timeout governs (docs/architecture.md §5).
    private func armBodyDeadline() {
        guard let ex = exchange else { return }
        if !ex.requestComplete && ex.wantsBody {
            deadline = ctx.loop.now &+ ctx.runtime.idleTimeout
        } else {
            deadline = 0
        }
    }

    /// TLS listeners: the handshake completed; ALPN `h2` makes this an HTTP/2 connection.
    func channelActive(_ channel: SocketChannel) {
        switch channel.negotiatedALPN {
        case "h2": switchToHTTP2(initial: [])
        case "http/1.1": prefaceProbe = nil
        default: break
        }
    }

    /// Hands the channel to a `FrontendH2Connection` (this object is done with it).
    private func switchToHTTP2(initial: [UInt8]) {
        prefaceProbe = nil
        let h2: FrontendH2Connection
        do {
            h2 = try FrontendH2Connection(channel: channel, ctx: ctx, clientAddress: clientAddress, policy: policy, peerRefusal: peerRefusal)
        } catch {
            ctx.runtime.logger.error("cannot start an HTTP/2 session", metadata: ["reason": "\(error)"])
            phase = .closing
            channel.close()
            return
        }
        phase = .closing
        deadline = 0
        ctx.removeFrontend(self)
        h2.start(initial: initial)
    }

    func channelEOF(_ channel: SocketChannel) {
        if case .tunnelling(let ex) = phase {
            ex.clientTunnelEnded()
            return
        }
        parser.feedEOF()
        // The input is over, the answers are not (RFC 9112 §9.6, docs/architecture.md §5). Stop reading: EOF
        // stays readable and would fire again and again.
        channel.pauseReading(.owner)
        switch phase {
        case .closing:
            // An answer is being written; the channel closes after it.
            channel.closeAfterFlush()
        case .awaitingHead, .exchanging:
            // What is buffered is still parsed: a request started, a body finished, or the
            // error in it (a head or body cut short by the EOF is `http1.truncated`, 400). An
            // exchange that takes no body now continues once it does (`exchangeWantsBody`);
            // between requests with nothing left, the connection closes.
            processInput()
        case .tunnelling:
            break  // handled above
        }
    }

    func channelError(_ channel: SocketChannel, _ error: ChannelError) {
        if case .tunnelling(let ex) = phase {
            phase = .closing
            ex.abort()
            return
        }
        exchange?.abort()
        phase = .closing
    }

    func channelWritable(_ channel: SocketChannel) {
        if case .tunnelling(let ex) = phase {
            ex.frontendWritable()
            return
        }
        exchange?.frontendWritable()
    }

    func channelClosed(_ channel: SocketChannel) {
        if case .tunnelling(let ex) = phase { ex.abort() }
        exchange?.abort()
        phase = .closing
        deadline = 0
        ctx.removeFrontend(self)
    }

    func deadlineExpired(now: UInt64) {
        deadline = 0
        switch phase {
        case .exchanging(let ex):
            // Only a client that stopped sending its body is timed out here.
            guard !ex.requestComplete else { return }
            ex.abort()
            phase = .closing
            channel.close()
        case .awaitingHead(let which):
            if parser.bufferedByteCount > 0 || which == .headerRead && !parser.isBetweenMessages {
                respondError(status: 408, reason: "http1.header_timeout", message: "request header not received in time")
            } else {
                phase = .closing
                channel.close()
            }
        case .tunnelling:
            break  // WebSockets may idle for long; either side ending ends the tunnel
        case .closing:
            channel.close()
        }
    }

    // MARK: request processing

    func processInput() {
        while !isClosing {
            if let ex = exchange {
                if ex.requestComplete {
                    if parser.bufferedByteCount > Self.pipelineLimit { channel.pauseReading(.pipelineFull) }
                    return
                }
                if !ex.wantsBody {
                    channel.pauseReading(.peerBackpressure)
                    return
                }
            }
            // The parser's result is switched on where it is returned: bound to a variable
            // first, its payload was copied out (a retain per string and field list) and the
            // optional destroyed through the generic Optional witness (measured, bench/RESULTS.md).
            // Only `parser.next()` throws in this `do`.
            do {
                switch try parser.next() {
                case nil:
                    inputDrained()
                    return
                case .requestHead(let head, let framing)?:
                    startExchange(head, framing: framing)
                case .body(let slice)?:
                    exchange?.requestBody(slice)
                case .end(let trailers)?:
                    exchange?.requestEnd(trailers: trailers)
                case .responseHead?:
                    handleParseError(HTTP1Error(reason: "http1.unexpected_response", offset: 0, message: "response on a request stream"))
                    return
                }
            } catch {
                handleParseError(error)
                return
            }
        }
    }

    /// The parser needs more bytes: the client's input ended between requests (close), or a
    /// head has begun (its read deadline starts), or nothing is pending.
    private func inputDrained() {
        if case .awaitingHead = phase, parser.receivedEOF {
            // The client's input ended between requests: everything it sent was answered.
            phase = .closing
            channel.closeAfterFlush()
            return
        }
        if case .awaitingHead(.idle) = phase, parser.bufferedByteCount > 0 {
            phase = .awaitingHead(.headerRead)
            deadline = ctx.loop.now &+ ctx.runtime.headerReadTimeout
        }
    }

    /// How the connection closes after its last answer (RFC 9112 §9.6): the client that sent its
    /// request whole and nothing after it owes nothing more, so the socket may close at once
    /// when nothing unread waits in it (nginx closes the same way); a client still sending a
    /// body, or one that pipelined more, may have bytes in flight that a close would answer with
    /// a reset destroying the response, so those connections linger.
    static func closeMode(requestComplete: Bool, bufferedBytes: Int) -> SocketChannel.CloseMode {
        requestComplete && bufferedBytes == 0 ? .lingerIfInputPending : .linger
    }

    /// Called when an exchange can take body again after backpressure.
    func exchangeWantsBody() {
        channel.resumeReading(.peerBackpressure)
        // Strong captures in end-of-event work (here and in `exchangeFinished`): the closure runs within this
        // event and is dropped, so no cycle; a weak reference would move the object's reference
        // count to a side table for good, slowing every retain of it (measured, bench/RESULTS.md).
        ctx.loop.deferToEndOfEvent { [self] in
            processInput()
            armBodyDeadline()
        }
    }

    private func startExchange(_ head: consuming HTTPRequestHead, framing: HTTP1BodyFraming) {
        requests += 1
        deadline = 0
        if let refusal = peerRefusal {
            refuse(status: 403, bytes: ErrorResponse.make(status: 403, error: "peer_not_allowed", detail: refusal, close: true))
            return
        }
        if let refusal = gate.admission(head, ctx: ctx) {
            refuse(status: refusal.status, bytes: ErrorResponse.make(status: refusal.status, error: refusal.error, detail: refusal.detail,
                                                                     fields: refusal.fields, close: true))
            return
        }
        let keepAlive = HTTPHeaderRules.keepAlive(version: head.version, headers: head.headers) && !ctx.draining
        if let local {
            let ex = LocalExchange(frontend: self, responder: local, head: head, framing: framing, keepAlive: keepAlive)
            phase = .exchanging(ex)
            ex.start()
            return
        }
        switch gate.route(head, framing: framing, ctx: ctx) {
        case .refuse(let r) where r.status == 404:
            let close = !keepAlive || r.closes
            ctx.metrics.countRequest(slot: 0, status: 404)  // route="none"
            channel.write(ErrorResponse.make(status: 404, error: r.error, detail: r.detail, close: close))
            if close {
                phase = .closing
                channel.closeAfterFlush(Self.closeMode(requestComplete: framing == .none, bufferedBytes: parser.bufferedByteCount))
            } else {
                phase = .awaitingHead(.idle)
                deadline = ctx.loop.now &+ ctx.runtime.idleTimeout
            }
        case .refuse(let r):
            respondError(status: r.status, reason: r.error, message: r.detail, allow: !r.extra.isEmpty)
        case .proxy(let routeIndex, let upstreamHead, let logPath, let websocket):
            let ex = ProxyExchangeDriver(client: self, ctx: ctx, head: consume head, framing: framing, routeIndex: routeIndex,
                                         upstreamHead: upstreamHead, logPath: logPath, keepAlive: keepAlive, upgrade: websocket ? .http1 : .none)
            phase = .exchanging(ex)
            ex.start()
        }
    }

    /// The exchange wrote its whole response (or gave up). Continue with the next request.
    func exchangeFinished(_ ex: FrontendExchange, keepAlive: Bool, abort: Bool) {
        guard case .exchanging(let current) = phase, current === ex else { return }
        if abort {
            phase = .closing
            switch responseFraming {
            case .chunked, .contentLength:
                // What was relayed still goes out, and the close shows the client a cut-short
                // response (no last chunk, a short body). Dropping it would leave an empty close
                // on a keep-alive connection, which clients take for an idle close and retry.
                responseFraming = .none
                channel.closeAfterFlush()
            case .untilClose, .none:
                // A close-delimited body would look complete after a clean close.
                channel.close()
            }
            return
        }
        if !keepAlive || ctx.draining || parser.receivedEOF && parser.bufferedByteCount == 0 {
            phase = .closing
            channel.closeAfterFlush(Self.closeMode(requestComplete: ex.requestComplete, bufferedBytes: parser.bufferedByteCount))
            return
        }
        phase = .awaitingHead(.idle)
        deadline = ctx.loop.now &+ ctx.runtime.idleTimeout
        channel.resumeReading(.pipelineFull)
        channel.resumeReading(.peerBackpressure)
        if parser.bufferedByteCount > 0 {
            // Pipelined requests (also those sent before the client's EOF: each is answered).
            // Not re-entrantly: the upstream connection that finished may still be unwinding.
            ctx.loop.deferToEndOfEvent { [self] in processInput() }
        }
    }

    private func handleParseError(_ error: HTTP1Error) {
        let aborted = exchange != nil
        if let ex = exchange {
            let started = ex.responseStarted
            ex.abort()
            phase = .closing
            if started {
                // A response is already on the wire: a 400 after it would corrupt the stream.
                channel.close()
                return
            }
        }
        // A request whose body was malformed was already counted on its route by its exchange.
        respondError(status: error.status, reason: error.reason, message: error.message, counted: aborted)
    }

    private func respondError(status: Int, reason: String, message: String, allow: Bool = false, counted: Bool = false) {
        if !counted { ctx.metrics.countRequest(slot: 0, status: status) }  // route="none": answered before routing
        ctx.runtime.logger.info("bad request", metadata: ["client": "\(clientAddress)", "status": "\(status)", "reason": "\(reason)"])
        channel.write(ErrorResponse.make(status: status, error: reason, detail: message,
                                         extra: allow ? [("Allow", "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS")] : [], close: true))
        phase = .closing
        channel.closeAfterFlush()
    }

    /// Shutdown: close now if idle; otherwise the running exchange finishes and the connection closes.
    func drain() {
        if exchange == nil { channel.close() }
    }
}

// MARK: - HTTP/1.1 output of exchanges

extension FrontendConnection: ExchangeClient {
    var protocolName: String { "h1" }

    func sendContinue() { channel.write(continueLine) }

    func sendInformational(_ upstream: HTTPResponseHead) {
        let h: HTTPResponseHead
        if upstream.status == 101 {
            h = upstream  // built by ProxyHeaders.switchingProtocolsResponse: its upgrade fields stay
        } else {
            h = ProxyHeaders.clientResponse(upstream: upstream, framing: .none, requestMethod: "GET",
                                            clientVersion: .http1_1, keepAlive: true).0
        }
        scratch.removeAll(keepingCapacity: true)
        HTTP1Serializer.writeResponseHead(h, into: &scratch)
        channel.write(scratch)
    }

    func sendResponseHead(_ upstream: HTTPResponseHead, framing: HTTP1BodyFraming, request: HTTPRequestHead,
                          keepAlive: Bool, endStream: Bool) -> Bool {
        // Rewritten and serialised in one pass, straight into the connection's output.
        var cf = ProxyHeaders.ClientFraming.none
        channel.writeDirect { buf in
            cf = ProxyHeaders.writeClientResponse(upstream: upstream, framing: framing, requestMethod: request.method,
                                                  clientVersion: request.version, keepAlive: keepAlive, into: &buf)
            if endStream && cf == .chunked { HTTP1Serializer.writeLastChunk(trailers: nil, into: &buf) }
        }
        responseFraming = endStream && cf == .chunked ? .none : cf
        return cf != .untilClose
    }

    func sendResponseBody(_ raw: UnsafeRawBufferPointer) {
        if responseFraming == .chunked {
            scratch.removeAll(keepingCapacity: true)
            HTTP1Serializer.writeChunk(raw, into: &scratch)
            channel.write(taking: &scratch)
        } else {
            channel.write(raw)
        }
    }

    func finishResponse(trailers: HTTPHeaders?) {
        if responseFraming == .chunked {
            scratch.removeAll(keepingCapacity: true)
            HTTP1Serializer.writeLastChunk(trailers: trailers, into: &scratch)
            channel.write(taking: &scratch)
        }
        responseFraming = .none
    }

    func sendLocalResponse(_ head: HTTPResponseHead, body: [UInt8], keepAlive: Bool) {
        var h = head
        if !keepAlive { h.headers.add("Connection", "close") }
        var buf: [UInt8] = []
        buf.reserveCapacity(256 + body.count)
        HTTP1Serializer.writeResponseHead(h, into: &buf)
        buf.append(contentsOf: body)
        channel.write(taking: &buf)
    }

    func startTunnel(_ ex: ProxyExchangeDriver) -> [UInt8]? {
        guard case .exchanging(let current) = phase, current === ex else { return nil }
        phase = .tunnelling(ex)
        deadline = 0
        channel.resumeReading(.pipelineFull)
        channel.resumeReading(.peerBackpressure)
        return parser.switchProtocols()
    }

    func tunnelWrite(_ raw: UnsafeRawBufferPointer) { channel.write(raw) }
    func pauseTunnelReading() { channel.pauseReading(.peerBackpressure) }
    func resumeTunnelReading() { channel.resumeReading(.peerBackpressure) }

    func endTunnel() {
        phase = .closing
        channel.pauseReading(.owner)  // a seen EOF stays readable; nothing more is read anyway
        channel.closeAfterFlush()
    }
}

/// A request answered by a `LocalResponder`: collects the body (up to 1 MiB, else 413), then replies.
/// Lives on the frontend's loop, owned by its connection.
final class LocalExchange: FrontendExchange {
    /// Weak: the connection owns this exchange; a responder's late answer (an admin request
    /// collected across loops) or end-of-event work may outlive it, and then finds nil, never a
    /// freed object. Local requests are rare: the side table this costs the connection is not on
    /// the proxy path.
    private weak var frontend: FrontendConnection?
    /// The connection's loop (kept so late work needs no connection to find it).
    private let loop: EventLoop
    let responder: LocalResponder
    let head: HTTPRequestHead
    private let framing: HTTP1BodyFraming
    private let keepAlive: Bool

    /// Collecting the body → (asked the responder | refused as too large) → answered. Lives on the
    /// frontend's loop.
    private enum Phase {
        case collecting
        /// Over `maxBody`: the rest is discarded, a 413 follows the end.
        case tooLarge
        /// The body is complete; the responder was asked.
        case responding
        case done
        /// The responder takes no body and the request has one: answered 413 at its head, the
        /// body never read (the connection closes).
        case bodyRefused
    }
    private var phase: Phase = .collecting
    private var body: [UInt8] = []
    static let maxBody = 1 << 20

    init(frontend: FrontendConnection, responder: LocalResponder, head: HTTPRequestHead, framing: HTTP1BodyFraming, keepAlive: Bool) {
        self.frontend = frontend
        self.loop = frontend.ctx.loop
        self.responder = responder
        self.head = head
        self.framing = framing
        self.keepAlive = keepAlive
    }

    func start() {
        if framing != .none && !responder.acceptsRequestBody {
            // Neither a 100 Continue nor a byte of the body: answered at the head, then closed.
            phase = .bodyRefused
            guard let frontend else { return }
            frontend.writeRaw(ErrorResponse.make(status: 413, error: "request_body_not_allowed",
                                                 detail: "this endpoint takes no request body", close: true))
            frontend.exchangeFinished(self, keepAlive: false, abort: false)
            return
        }
        if framing == .none {
            // Weak: the connection (which owns this exchange) may be gone by the end of the
            // event (a client that sent its request and closed at once).
            loop.deferToEndOfEvent { [weak self] in self?.run() }
        } else if HTTPHeaderRules.expectsContinue(head) && head.version == .http1_1 {
            // RFC 9110 §15.2: never a 1xx to an HTTP/1.0 client.
            frontend?.writeRaw(continueLine)
        }
    }

    var requestComplete: Bool {
        switch phase {
        case .collecting, .tooLarge, .bodyRefused: return framing == .none
        case .responding, .done: return true
        }
    }
    var wantsBody: Bool { true }
    var responseStarted: Bool {
        switch phase {
        case .done, .bodyRefused: return true
        case .collecting, .tooLarge, .responding: return false
        }
    }

    func requestBody(_ bytes: ArraySlice<UInt8>) {
        guard case .collecting = phase else { return }
        if body.count + bytes.count > Self.maxBody {
            phase = .tooLarge
            body = []
            return
        }
        body.append(contentsOf: bytes)
    }

    func requestEnd(trailers: HTTPHeaders?) {
        run()
    }

    private func run() {
        switch phase {
        case .collecting:
            phase = .responding
        case .tooLarge:
            phase = .done
            guard let frontend else { return }
            frontend.writeRaw(ErrorResponse.make(status: 413, error: "body_too_large", close: true))
            frontend.exchangeFinished(self, keepAlive: false, abort: false)
            return
        case .responding, .done, .bodyRefused:
            return
        }
        responder.respond(to: head, body: body, loop: loop) { [weak self] resp, respBody in
            guard let self, case .responding = self.phase, let frontend = self.frontend else { return }
            self.phase = .done
            var h = resp
            h.headers.set("Content-Length", String(respBody.count))
            // The responder may end the connection with its answer (`Connection: close`).
            let keepAlive = self.keepAlive && !h.headers.values("Connection").contains { $0.lowercased().contains("close") }
            if !keepAlive { h.headers.set("Connection", "close") }
            var buf: [UInt8] = []
            HTTP1Serializer.writeResponseHead(h, into: &buf)
            if self.head.method != "HEAD" { buf.append(contentsOf: respBody) }
            frontend.writeTaking(&buf)
            frontend.exchangeFinished(self, keepAlive: keepAlive, abort: false)
        }
    }

    func abort() { phase = .done }
    func frontendWritable() {}
}
