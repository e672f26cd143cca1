import BearerdHTTP
import BearerdIO
import BearerdOAuth
import Logging

/// What a frontend connection drives for each request: the proxy, or a local responder (admin,
/// demo upstream). All calls on the connection's loop.
protocol FrontendExchange: AnyObject {
    /// All of the request body has been received from the client.
    var requestComplete: Bool { get }
    /// False while the exchange cannot take more body (backpressure); the frontend stops parsing.
    var wantsBody: Bool { get }
    func requestBody(_ bytes: ArraySlice<UInt8>)
    func requestEnd(trailers: HTTPHeaders?)
    /// The client connection failed or closed; release everything.
    func abort()
    /// The client's output drained below the low-water mark.
    func frontendWritable()
    /// Some of the response has been written to the client: an error can no longer be answered.
    var responseStarted: Bool { get }
}

/// One proxied request: from the client's head to the last byte of the upstream's response.
///
/// Lives on the frontend connection's loop. Request body bytes that arrive before the upstream
/// connection is ready are held in `pending` (bounded by pausing the client); afterwards they are
/// streamed straight through, chunk-encoded when the body is chunked. The response is streamed
/// back the same way. Invariants: the client gets exactly one final response head; a failure
/// before it becomes a JSON 502/504, a failure after it closes the client connection.
final class ProxyExchange: FrontendExchange, BackendConnectionDelegate {
    unowned let frontend: FrontendConnection
    let ctx: LoopContext
    let runtime: ProxyRuntime
    let head: HTTPRequestHead
    let framing: HTTP1BodyFraming
    let routeIndex: Int
    /// This route's slot in `ctx.metrics.routes`, fixed at start (see `LoopContext.routeSlots`).
    let metricsSlot: Int
    let target: UpstreamTarget
    let upstreamHead: HTTPRequestHead
    let logPath: Substring

    private var backend: BackendConnection?
    private(set) var requestComplete = false
    private var requestSent = false
    private var pending: [UInt8] = []
    private var pendingTrailers: HTTPHeaders?
    private var continueSent = false
    private var responseHeadSent = false
    private var clientFraming: ProxyHeaders.ClientFraming = .none
    private var clientKeepAlive: Bool
    private var finished = false
    private var attempts = 0
    private var status = 0
    private var bodyBytes: UInt64 = 0
    private let started: UInt64
    private var upstreamStarted: UInt64 = 0
    private var upstreamHeadAt: UInt64 = 0
    /// When the current attempt's request head was handed to the upstream connection.
    private var headSentAt: UInt64 = 0
    private var bodyPaused = false

    // Token session (DESIGN §6). `session` is nil on routes without credentials.
    private let session: TokenSessionDriver?
    private let route: RouteConfig
    /// The token the current attempt carries.
    private var token: PublishedToken?
    /// The request body, kept while it fits `replay_body_limit` so a rejection can be replayed.
    private var kept: [UInt8] = []
    private var keeping: Bool
    private var requestTrailers: HTTPHeaders?
    private var replays = 0
    /// A rejected response held (head + up to `heldLimit` body bytes) while deciding on a replay.
    private var held: (head: HTTPResponseHead, framing: HTTP1BodyFraming, body: [UInt8])?
    private var heldDecision: ReplayPolicy.Decision = .passThrough
    private static let heldLimit = 64 * 1024

    init(frontend: FrontendConnection, ctx: LoopContext, head: HTTPRequestHead, framing: HTTP1BodyFraming,
         routeIndex: Int, upstreamHead: HTTPRequestHead, logPath: Substring, keepAlive: Bool) {
        self.frontend = frontend
        self.ctx = ctx
        self.runtime = ctx.runtime
        self.head = head
        self.framing = framing
        self.routeIndex = routeIndex
        self.metricsSlot = ctx.routeSlots[routeIndex]
        self.target = ctx.runtime.targets[routeIndex]
        self.upstreamHead = upstreamHead
        self.logPath = logPath
        self.clientKeepAlive = keepAlive
        started = monotonicNanos()
        route = ctx.runtime.config.routes[routeIndex]
        session = ctx.runtime.routeSessions[routeIndex]
        keeping = session != nil && route.replayBodyLimit > 0
        if framing == .none { requestComplete = true }
    }

    var wantsBody: Bool { !bodyPaused }
    var responseStarted: Bool { responseHeadSent || finished }

    func start() {
        guard let session else {
            connect()
            return
        }
        if let t = session.usableToken(now: monotonicNanos()) {
            token = t
            connect()
            return
        }
        session.requestToken(on: ctx.loop) { [weak self] result in
            guard let self, !self.finished else { return }
            switch result {
            case .success(let t):
                self.token = t
                self.connect()
            case .failure(let unavailable):
                self.tokenUnavailable(unavailable)
            }
        }
    }

    /// DESIGN §5: 503 JSON with Retry-After; the upstream is not called.
    private func tokenUnavailable(_ u: TokenUnavailable) {
        status = 503
        ctx.metrics.countUpstreamError(slot: metricsSlot, .tokenUnavailable)
        if !requestComplete || ctx.draining { clientKeepAlive = false }
        frontend.writeRaw(ErrorResponse.make(status: 503, error: "token_unavailable", detail: u.detail,
                                             extra: [("Retry-After", String(u.retryAfterSeconds))],
                                             fields: [("session", u.session)], close: !clientKeepAlive))
        complete()
    }

    private func connect() {
        attempts += 1
        upstreamStarted = monotonicNanos()
        ctx.pool.acquire(target) { [weak self] result in
            guard let self, !self.finished else {
                if case .success(let c) = result { c.close() }
                return
            }
            switch result {
            case .success(let conn): self.backendReady(conn)
            case .failure(let error): self.fail(error)
            }
        }
    }

    private func backendReady(_ conn: BackendConnection) {
        backend = conn
        conn.assign(to: self)
        var h = upstreamHead
        if let token {
            // Set, never add: the client's own Authorization never reaches the upstream (DESIGN §5).
            h.headers.set("Authorization", "Bearer " + token.value)
        }
        if runtime.logger.logLevel <= .trace {
            runtime.logger.trace("upstream request", metadata: [
                "http.method": "\(h.method)", "http.target": "\(Redaction.target(h.target))",
                "http.headers": "\(Redaction.describe(h.headers))", "token.generation": "\(token?.generation ?? 0)"])
        }
        headSentAt = monotonicNanos()
        conn.sendHead(h)
        if replays > 0 {
            // A replay: the whole body was kept; send it again byte for byte.
            kept.withUnsafeBytes { raw in
                if framing == .chunked {
                    var enc: [UInt8] = []
                    HTTP1Serializer.writeChunk(raw, into: &enc)
                    conn.write(enc)
                } else if !kept.isEmpty {
                    conn.write(raw)
                }
            }
            finishRequestBody(trailers: requestTrailers)
            return
        }
        if !requestComplete && !continueSent && HTTPHeaderRules.expectsContinue(head) {
            // RFC 9110 §10.1.1: we ask for the body on the upstream's behalf (Expect was removed).
            continueSent = true
            frontend.writeRaw(Self.continueLine)
        }
        if !pending.isEmpty {
            conn.write(pending)
            pending.removeAll()
        }
        if requestComplete { finishRequestBody(trailers: pendingTrailers) }
        if bodyPaused && !conn.isOverHighWater {
            bodyPaused = false
            frontend.exchangeWantsBody()
        }
    }

    static let continueLine: [UInt8] = Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)

    // MARK: request body (from the client)

    func requestBody(_ bytes: ArraySlice<UInt8>) {
        guard !finished else { return }
        if keeping {
            if kept.count + bytes.count <= route.replayBodyLimit {
                kept.append(contentsOf: bytes)
            } else {
                keeping = false
                kept = []
            }
        }
        if let b = backend {
            bytes.withUnsafeBytes { raw in
                if framing == .chunked {
                    var enc: [UInt8] = []
                    HTTP1Serializer.writeChunk(raw, into: &enc)
                    b.write(enc)
                } else {
                    b.write(raw)
                }
            }
            if b.isOverHighWater { bodyPaused = true }
        } else {
            bytes.withUnsafeBytes { raw in
                if framing == .chunked {
                    HTTP1Serializer.writeChunk(raw, into: &pending)
                } else {
                    pending.append(contentsOf: raw)
                }
            }
            if pending.count >= 64 * 1024 { bodyPaused = true }
        }
    }

    func requestEnd(trailers: HTTPHeaders?) {
        requestComplete = true
        requestTrailers = trailers
        guard !finished else { return }
        if backend != nil {
            finishRequestBody(trailers: trailers)
        } else {
            pendingTrailers = trailers
        }
    }

    private func finishRequestBody(trailers: HTTPHeaders?) {
        guard !requestSent, let b = backend else { return }
        if framing == .chunked {
            var enc: [UInt8] = []
            HTTP1Serializer.writeLastChunk(trailers: trailers, into: &enc)
            b.write(enc)
        }
        requestSent = true
        b.touch()
    }

    // MARK: response (from the upstream)

    func backendWritable() {
        if bodyPaused {
            bodyPaused = false
            frontend.exchangeWantsBody()
        }
    }

    func frontendWritable() {
        backend?.resumeReading()
    }

    func backendResponseHead(_ upstream: HTTPResponseHead, framing respFraming: HTTP1BodyFraming) {
        if upstream.isInformational {
            // 100 is ours to send (see backendReady); other 1xx go to HTTP/1.1 clients (RFC 9110 §15.2).
            if upstream.status != 100 && head.version == .http1_1 {
                let (h, _) = ProxyHeaders.clientResponse(upstream: upstream, framing: .none, requestMethod: head.method,
                                                         clientVersion: head.version, keepAlive: true)
                var buf: [UInt8] = []
                HTTP1Serializer.writeResponseHead(h, into: &buf)
                frontend.writeRaw(buf)
            }
            return
        }
        upstreamHeadAt = monotonicNanos()
        if headSentAt > 0 {
            ctx.metrics.observeUpstreamLatency(slot: metricsSlot, nanoseconds: upstreamHeadAt &- headSentAt)
        }
        status = upstream.status
        if runtime.logger.logLevel <= .trace {
            runtime.logger.trace("upstream response", metadata: [
                "http.status": "\(upstream.status)", "http.headers": "\(Redaction.describe(upstream.headers))"])
        }
        if let session, let token, route.rejectStatuses.contains(upstream.status) {
            let input = ReplayPolicy.Input(
                status: upstream.status, rejectStatuses: Set(route.rejectStatuses),
                wwwAuthenticate: upstream.headers.values("WWW-Authenticate"),
                requestGeneration: token.generation, currentGeneration: session.currentGeneration,
                bodyFullyKept: requestComplete && (framing == .none || keeping),
                methodAllowed: route.replayMethods.allows(head.method), alreadyReplayed: replays > 0)
            let decision = ReplayPolicy.decide(input)
            if let outcome = ReplayOutcome.atDecision(input, decision) {
                ctx.metrics.countReplay(slot: metricsSlot, outcome)
            }
            switch decision {
            case .passThrough:
                break
            case .refreshOnlyPassThrough:
                session.reportRejected(generation: token.generation, on: ctx.loop) { _ in }
            case .replayNow, .refreshThenReplay:
                // Drain the rejection first; it is sent to the client only if no replay happens.
                held = (upstream, respFraming, [])
                heldDecision = decision
                return
            }
        }
        sendResponseHead(upstream, framing: respFraming)
    }

    private func sendResponseHead(_ upstream: HTTPResponseHead, framing respFraming: HTTP1BodyFraming) {
        // A request whose body is not fully read cannot be followed by another on this connection.
        if !requestComplete || ctx.draining { clientKeepAlive = false }
        let (h, cf) = ProxyHeaders.clientResponse(upstream: upstream, framing: respFraming, requestMethod: head.method,
                                                  clientVersion: head.version, keepAlive: clientKeepAlive)
        if cf == .untilClose { clientKeepAlive = false }
        clientFraming = cf
        var buf: [UInt8] = []
        buf.reserveCapacity(512)
        HTTP1Serializer.writeResponseHead(h, into: &buf)
        responseHeadSent = true
        frontend.writeTaking(&buf)
    }

    func backendBody(_ bytes: ArraySlice<UInt8>) {
        if held != nil {
            if held!.body.count + bytes.count <= Self.heldLimit {
                held!.body.append(contentsOf: bytes)
                return
            }
            // Too large to hold: give up the replay, relay the rejection, keep the token fresh.
            ctx.metrics.countReplay(slot: metricsSlot, .rejectionTooLarge)
            releaseHeld(refresh: true)
        }
        bodyBytes &+= UInt64(bytes.count)
        bytes.withUnsafeBytes { raw in
            if clientFraming == .chunked {
                var enc: [UInt8] = []
                enc.reserveCapacity(raw.count + 16)
                HTTP1Serializer.writeChunk(raw, into: &enc)
                frontend.writeTaking(&enc)
            } else {
                frontend.writeRaw(raw)
            }
        }
        if frontend.isOverHighWater { backend?.pauseReading() }
    }

    func backendEnd(trailers: HTTPHeaders?) {
        if held != nil {
            if let b = backend {
                backend = nil
                if requestSent { ctx.pool.release(b) } else { b.close() }
            }
            replayAfterRejection()
            return
        }
        if clientFraming == .chunked {
            var enc: [UInt8] = []
            HTTP1Serializer.writeLastChunk(trailers: trailers, into: &enc)
            frontend.writeRaw(enc)
        }
        if let b = backend {
            backend = nil
            if requestSent { ctx.pool.release(b) } else { b.close() }
        }
        complete()
    }

    /// Sends the held rejection to the client as if no replay had been considered.
    private func releaseHeld(refresh: Bool) {
        guard let h = held else { return }
        held = nil
        if refresh, heldDecision == .refreshThenReplay, let session, let token {
            session.reportRejected(generation: token.generation, on: ctx.loop) { _ in }
        }
        sendResponseHead(h.head, framing: h.framing)
        if !h.body.isEmpty { backendBody(h.body[...]) }
    }

    /// The rejected response is fully drained: get the token to replay with, then replay once.
    private func replayAfterRejection() {
        guard let session, let rejected = token, let h = held else { return }
        let replayWith: (PublishedToken) -> Void = { [weak self] t in
            guard let self, !self.finished else { return }
            self.ctx.metrics.countReplay(slot: self.metricsSlot,
                                         self.heldDecision == .replayNow ? .replayedCurrentToken : .replayedAfterRefresh)
            self.held = nil
            self.replays += 1
            self.token = t
            self.requestSent = false
            self.runtime.logger.info("replaying rejected request", metadata: [
                "session": "\(session.name)", "status": "\(h.head.status)",
                "token.generation": "\(rejected.generation)", "replay.generation": "\(t.generation)",
                "token.fingerprint": "\(t.fingerprint)",
            ])
            self.connect()
        }
        let passThrough: (String) -> Void = { [weak self] reason in
            guard let self, !self.finished, let h = self.held else { return }
            self.ctx.metrics.countReplay(slot: self.metricsSlot, ReplayOutcome.abandoned(reason: reason))
            self.held = nil
            self.runtime.logger.warning("not replaying rejected request", metadata: ["session": "\(session.name)", "reason": "\(reason)"])
            self.sendResponseHead(h.head, framing: h.framing)
            if !h.body.isEmpty { self.backendBody(h.body[...]) }
            self.backendEnd(trailers: nil)
        }
        if heldDecision == .replayNow {
            if let t = session.usableToken(now: monotonicNanos()), t.generation > rejected.generation {
                replayWith(t)
            } else {
                session.requestToken(on: ctx.loop) { result in
                    switch result {
                    case .success(let t) where t.generation > rejected.generation: replayWith(t)
                    case .success: passThrough("no newer token")
                    case .failure(let u): passThrough(u.detail)
                    }
                }
            }
            return
        }
        session.reportRejected(generation: rejected.generation, on: ctx.loop) { outcome in
            switch outcome {
            case .replay(let t): replayWith(t)
            case .passThrough(let reason): passThrough(reason)
            }
        }
    }

    func backendFailed(_ error: ChannelError, responseStarted: Bool) {
        let b = backend
        backend = nil
        b?.close()
        if responseHeadSent {
            // Too late for a 502: the client sees a truncated response.
            log(outcome: "upstream_aborted")
            finished = true
            frontend.exchangeFinished(self, keepAlive: false, abort: true)
            return
        }
        // A pooled connection the upstream closed while idle: retry once on a fresh one when
        // nothing of the request body is lost (RFC 9110 §9.2.2 idempotent replays).
        if let b, b.reused, !b.receivedResponseBytes, attempts == 1, framing == .none {
            connect()
            return
        }
        fail(error)
    }

    private func fail(_ error: ChannelError) {
        guard !finished else { return }
        let (st, kind): (Int, UpstreamErrorKind)
        switch error {
        case .timeout: (st, kind) = (504, .upstreamTimeout)
        case .tls: (st, kind) = (502, .upstreamTLS)
        case .protocolError: (st, kind) = (502, .upstreamInvalidResponse)
        case .connect, .io: (st, kind) = (502, .upstreamUnreachable)
        }
        let code = kind.label
        ctx.metrics.countUpstreamError(slot: metricsSlot, kind)
        status = st
        if !requestComplete { clientKeepAlive = false }
        if ctx.draining { clientKeepAlive = false }
        let detail: String
        switch error {
        case .tls(let e): detail = e.message
        default: detail = "\(target.url.authority): \(error)"
        }
        frontend.writeRaw(ErrorResponse.make(status: st, error: code, detail: detail,
                                             fields: [("route", ctx.runtime.config.routes[routeIndex].match)],
                                             close: !clientKeepAlive))
        runtime.logger.warning("upstream failed", metadata: ["route": "\(ctx.runtime.config.routes[routeIndex].match)",
                                                             "upstream": "\(target.url.authority)", "error": "\(code)",
                                                             "detail": "\(detail)"])
        complete()
    }

    private func complete() {
        guard !finished else { return }
        finished = true
        log(outcome: nil)
        frontend.exchangeFinished(self, keepAlive: clientKeepAlive, abort: false)
    }

    func abort() {
        guard !finished else { return }
        finished = true
        let b = backend
        backend = nil
        b?.close()
        log(outcome: "client_aborted")
    }

    private func log(outcome: String?) {
        ctx.metrics.countRequest(slot: metricsSlot, status: status)
        ctx.metrics.responseBytes &+= bodyBytes
        guard runtime.accessLog else { return }
        let record = AccessRecord(
            method: head.method, path: String(logPath), route: runtime.config.routes[routeIndex].match, status: status,
            upstreamMicros: upstreamHeadAt > 0 ? Int((upstreamHeadAt - upstreamStarted) / 1000) : -1,
            totalMicros: Int((monotonicNanos() - started) / 1000), bytes: bodyBytes, outcome: outcome,
            session: session?.name, generation: session == nil ? nil : token?.generation, replayed: replays > 0)
        runtime.logger.info("request", metadata: ["access": .stringConvertible(record)])
    }
}

