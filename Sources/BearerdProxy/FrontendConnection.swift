import BearerdHTTP
import BearerdIO

/// Serves requests for local endpoints (admin, demo upstream) instead of proxying them.
public protocol LocalResponder: AnyObject, Sendable {
    /// Answers a complete request (body collected up to 1 MiB). Runs on the connection's loop.
    func respond(to head: HTTPRequestHead, body: [UInt8], loop: EventLoop, reply: @escaping (HTTPResponseHead, [UInt8]) -> Void)
}

/// One client connection (HTTP/1.1 server side). Lives on its loop for its whole life.
///
/// Parses requests with the strict parser, runs one exchange at a time and answers pipelined
/// requests in order: bytes of the next request stay in the parser until the current exchange
/// has finished (bounded by pausing reads). Deadlines: `header_read` from the first byte of a
/// head (408 on expiry), `idle` between requests (silent close).
///
/// Access control (issue 4) comes from the listener's `policy`: a unix peer refused by
/// SO_PEERCRED gets 403 for its first request, a Host outside the loopback allowlist gets 421;
/// either way nothing is forwarded and the connection closes.
final class FrontendConnection: ChannelDelegate, LoopTimeoutable {
    let channel: SocketChannel
    let ctx: LoopContext
    let clientAddress: String
    let local: LocalResponder?
    /// What the listener enforces; nil for the admin listener.
    let policy: ListenerPolicy?
    /// Set at accept when the unix peer is not admitted: the detail of the 403 its request gets.
    private var peerRefusal: String?
    /// The Host allowlist of `policy` under `allowlistRuntime` (looked up again after a reload).
    private var allowlist: HostAllowlist?
    private var allowlistRuntime: ProxyRuntime?
    private var parser: HTTP1Parser
    private var exchange: FrontendExchange?
    private var closing = false
    private var headDeadlineArmed = false
    private var requests = 0
    /// The client half-closed: close once the running exchange has answered.
    private var closeAfterExchange = false
    var deadline: UInt64 = 0
    /// Pipelined bytes held while an exchange runs; more pauses reading.
    static let pipelineLimit = 64 * 1024

    init(channel: SocketChannel, ctx: LoopContext, peer: SocketAddress, local: LocalResponder?, policy: ListenerPolicy? = nil) {
        self.channel = channel
        self.ctx = ctx
        self.local = local
        self.policy = policy
        clientAddress = peer.family == 1 /* AF_UNIX */ ? "unix" : peer.host
        parser = HTTP1Parser(role: .server, limits: ctx.runtime.config.limits)
        channel.delegate = self
    }

    func start() {
        ctx.frontends[ObjectIdentifier(self)] = self
        ctx.loop.register(self)
        deadline = monotonicNanos() &+ ctx.runtime.headerReadTimeout
        headDeadlineArmed = true
        if let policy, policy.checksPeer { checkPeer(policy) }
        channel.start()
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

    /// The Host check of loopback listeners (DNS rebinding). True when the request may go on;
    /// otherwise the 421 has been written and the connection is closing.
    private func hostAdmitted(_ head: HTTPRequestHead, _ policy: ListenerPolicy) -> Bool {
        let runtime = ctx.runtime
        if allowlistRuntime !== runtime {
            allowlist = runtime.hostAllowlist(for: policy.config)
            allowlistRuntime = runtime
        }
        let authority = HostAllowlist.requestAuthority(target: head.target, hostField: head.headers["Host"])
        // Force unwrap: set just above.
        if allowlist!.admits(authority) { return true }
        let shown = authority.map { HostAllowlist.hostPart($0).map(String.init) ?? String($0) } ?? ""
        runtime.logger.warning("host refused", metadata: ["client": "\(clientAddress)", "listener": "\(policy.label)", "host": "\(shown)"])
        let detail = authority == nil
            ? "the request names no host; \(policy.label) needs a Host header naming it"
            : "\(policy.label) answers only localhost, loopback addresses, its routes' hosts and allowed_hosts; add \(shown) to allowed_hosts if it is meant to reach bearerd"
        refuse(status: 421, bytes: ErrorResponse.make(status: 421, error: "host_not_allowed", detail: detail, fields: [("host", shown)], close: true))
        return false
    }

    /// The browser guard (DESIGN §5, `BrowserGuard`). True when the request may go on; otherwise
    /// the 403 has been written and the connection is closing.
    private func browserAdmitted(_ head: HTTPRequestHead, _ policy: ListenerPolicy) -> Bool {
        guard case .refuse(let r) = policy.browserGuard.check(head) else { return true }
        ctx.runtime.logger.warning("cross-site request refused", metadata: [
            "client": "\(clientAddress)", "listener": "\(policy.label)", "reason": "\(r.reason)", "origin": "\(r.origin ?? "")",
        ])
        refuse(status: 403, bytes: ErrorResponse.make(status: 403, error: "cross_site_request", detail: r.detail, close: true))
        return false
    }

    /// Writes a refusal (403, 421) and closes: counted like other local errors, nothing forwarded.
    private func refuse(status: Int, bytes: [UInt8]) {
        ctx.metrics.countRequest(slot: 0, status: status)  // route="none": refused before routing
        channel.write(bytes)
        exchange = nil
        closing = true
        channel.closeAfterFlush()
    }

    // MARK: output used by exchanges

    func writeRaw(_ bytes: [UInt8]) { channel.write(bytes) }
    func writeRaw(_ bytes: UnsafeRawBufferPointer) { channel.write(bytes) }
    func writeTaking(_ bytes: inout [UInt8]) { channel.write(taking: &bytes) }
    var isOverHighWater: Bool { channel.isOverHighWater }

    // MARK: ChannelDelegate

    func channelRead(_ channel: SocketChannel, _ bytes: UnsafeRawBufferPointer) {
        parser.feed(bytes)
        if exchange != nil && !(exchange!.requestComplete) {
            deadline = monotonicNanos() &+ ctx.runtime.idleTimeout  // body upload must keep moving
        }
        processInput()
    }

    func channelEOF(_ channel: SocketChannel) {
        parser.feedEOF()
        if let ex = exchange {
            if !ex.requestComplete {
                processInput()
                if let ex2 = exchange, !ex2.requestComplete {
                    ex2.abort()
                    exchange = nil
                    channel.close()
                }
            }
            // A client half-closing after a complete request still gets its response (RFC 9112 §9.6).
            // Stop the read source: EOF stays readable and would fire again and again.
            channel.pauseReading(.owner)
            closeAfterExchange = true
            return
        }
        channel.close()
    }

    func channelError(_ channel: SocketChannel, _ error: ChannelError) {
        exchange?.abort()
        exchange = nil
    }

    func channelWritable(_ channel: SocketChannel) {
        exchange?.frontendWritable()
    }

    func channelClosed(_ channel: SocketChannel) {
        exchange?.abort()
        exchange = nil
        closing = true
        deadline = 0
        ctx.loop.unregister(self)
        ctx.frontends.removeValue(forKey: ObjectIdentifier(self))
    }

    func deadlineExpired(now: UInt64) {
        deadline = 0
        if exchange != nil {
            // Client stopped sending its body.
            exchange?.abort()
            exchange = nil
            channel.close()
            return
        }
        if parser.bufferedByteCount > 0 || requests == 0 && headDeadlineArmed && !parser.isBetweenMessages {
            respondError(status: 408, reason: "http1.header_timeout", message: "request header not received in time")
        } else {
            channel.close()
        }
    }

    // MARK: request processing

    func processInput() {
        while !closing {
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
            let event: HTTP1Event?
            do {
                event = try parser.next()
            } catch {
                handleParseError(error)
                return
            }
            guard let event else {
                if exchange == nil && !headDeadlineArmed && parser.bufferedByteCount > 0 {
                    headDeadlineArmed = true
                    deadline = monotonicNanos() &+ ctx.runtime.headerReadTimeout
                }
                return
            }
            switch event {
            case .requestHead(let head, let framing):
                startExchange(head, framing: framing)
            case .body(let slice):
                exchange?.requestBody(slice)
            case .end(let trailers):
                exchange?.requestEnd(trailers: trailers)
            case .responseHead:
                handleParseError(HTTP1Error(reason: "http1.unexpected_response", offset: 0, message: "response on a request stream"))
                return
            }
        }
    }

    /// Called when an exchange can take body again after backpressure.
    func exchangeWantsBody() {
        channel.resumeReading(.peerBackpressure)
        ctx.loop.deferToEndOfEvent { [weak self] in self?.processInput() }
    }

    private func startExchange(_ head: HTTPRequestHead, framing: HTTP1BodyFraming) {
        requests += 1
        headDeadlineArmed = false
        deadline = 0
        if let refusal = peerRefusal {
            refuse(status: 403, bytes: ErrorResponse.make(status: 403, error: "peer_not_allowed", detail: refusal, close: true))
            return
        }
        if let policy, policy.checksHost, !hostAdmitted(head, policy) { return }
        if let policy, !browserAdmitted(head, policy) { return }
        let keepAlive = HTTPHeaderRules.keepAlive(version: head.version, headers: head.headers) && !ctx.draining
        if let local {
            let ex = LocalExchange(frontend: self, responder: local, head: head, framing: framing, keepAlive: keepAlive)
            exchange = ex
            return
        }
        guard let parts = RequestTarget.split(head.target) else {
            if head.method == "CONNECT" {
                respondError(status: 405, reason: "proxy.connect_not_supported", message: "bearerd is a reverse proxy; CONNECT is not supported", allow: true)
            } else {
                respondError(status: 400, reason: "http1.invalid_target", message: "request target must be origin-form or absolute-form")
            }
            return
        }
        if RequestTarget.hasDotSegment(parts.path) {
            respondError(status: 400, reason: "proxy.dot_segment", message: "request path contains a dot segment")
            return
        }
        let host = parts.authority ?? head.headers["Host"].map { Substring($0) }
        let runtime = ctx.runtime
        guard let routeIndex = runtime.router.match(path: parts.path, host: host) else {
            let bytes = ErrorResponse.make(status: 404, error: "no_route", detail: "no route matches \(parts.path)",
                                           close: !keepAlive || framing != .none)
            ctx.metrics.countRequest(slot: 0, status: 404)  // route="none"
            exchange = SentExchange(framing: framing)
            channel.write(bytes)
            finishWithoutExchange(keepAlive: keepAlive && framing == .none)
            return
        }
        let route = runtime.config.routes[routeIndex]
        let target = RequestTarget.upstreamTarget(path: parts.path, query: parts.query, route: route)
        let upstreamHead = ProxyHeaders.upstreamRequest(client: head, framing: framing, target: target, route: route,
                                                        clientAddress: clientAddress, originalHost: host)
        let ex = ProxyExchange(frontend: self, ctx: ctx, head: head, framing: framing, routeIndex: routeIndex,
                               upstreamHead: upstreamHead, logPath: parts.path, keepAlive: keepAlive)
        exchange = ex
        ex.start()
    }

    private func finishWithoutExchange(keepAlive: Bool) {
        exchange = nil
        if keepAlive {
            deadline = monotonicNanos() &+ ctx.runtime.idleTimeout
        } else {
            closing = true
            channel.closeAfterFlush()
        }
    }

    /// The exchange wrote its whole response (or gave up). Continue with the next request.
    func exchangeFinished(_ ex: FrontendExchange, keepAlive: Bool, abort: Bool) {
        guard exchange === ex else { return }
        exchange = nil
        if abort {
            closing = true
            channel.close()
            return
        }
        if !keepAlive || ctx.draining || closeAfterExchange {
            closing = true
            channel.closeAfterFlush()
            return
        }
        deadline = monotonicNanos() &+ ctx.runtime.idleTimeout
        channel.resumeReading(.pipelineFull)
        channel.resumeReading(.peerBackpressure)
        if parser.bufferedByteCount > 0 {
            // Not re-entrantly: the upstream connection that finished may still be unwinding.
            ctx.loop.deferToEndOfEvent { [weak self] in self?.processInput() }
        }
    }

    private func handleParseError(_ error: HTTP1Error) {
        let aborted = exchange != nil
        if let ex = exchange {
            let started = ex.responseStarted
            ex.abort()
            exchange = nil
            if started {
                // A response is already on the wire: a 400 after it would corrupt the stream.
                closing = true
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
        exchange = nil
        closing = true
        channel.closeAfterFlush()
    }

    /// Shutdown: close now if idle; otherwise the running exchange finishes and the connection closes.
    func drain() {
        if exchange == nil { channel.close() }
    }
}

/// A request answered by bearerd without an upstream (404): discards its body.
final class SentExchange: FrontendExchange {
    var requestComplete: Bool
    var wantsBody: Bool { true }
    init(framing: HTTP1BodyFraming) { requestComplete = framing == .none }
    func requestBody(_ bytes: ArraySlice<UInt8>) {}
    func requestEnd(trailers: HTTPHeaders?) { requestComplete = true }
    func abort() {}
    func frontendWritable() {}
    var responseStarted: Bool { true }
}

/// A request answered by a `LocalResponder`: collects the body (up to 1 MiB, else 413), then replies.
final class LocalExchange: FrontendExchange {
    unowned let frontend: FrontendConnection
    let responder: LocalResponder
    let head: HTTPRequestHead
    var requestComplete = false
    var wantsBody: Bool { true }
    private var body: [UInt8] = []
    private var tooLarge = false
    private var keepAlive: Bool
    private var done = false
    static let maxBody = 1 << 20

    init(frontend: FrontendConnection, responder: LocalResponder, head: HTTPRequestHead, framing: HTTP1BodyFraming, keepAlive: Bool) {
        self.frontend = frontend
        self.responder = responder
        self.head = head
        self.keepAlive = keepAlive
        if framing == .none {
            requestComplete = true
            frontend.ctx.loop.deferToEndOfEvent { [weak self] in self?.run() }
        } else if HTTPHeaderRules.expectsContinue(head) {
            frontend.writeRaw(ProxyExchange.continueLine)
        }
    }

    func requestBody(_ bytes: ArraySlice<UInt8>) {
        if body.count + bytes.count > Self.maxBody { tooLarge = true; return }
        body.append(contentsOf: bytes)
    }

    func requestEnd(trailers: HTTPHeaders?) {
        requestComplete = true
        run()
    }

    private func run() {
        guard !done else { return }
        if tooLarge {
            done = true
            frontend.writeRaw(ErrorResponse.make(status: 413, error: "body_too_large", close: true))
            frontend.exchangeFinished(self, keepAlive: false, abort: false)
            return
        }
        responder.respond(to: head, body: body, loop: frontend.ctx.loop) { [weak self] resp, respBody in
            guard let self, !self.done else { return }
            self.done = true
            var h = resp
            h.headers.set("Content-Length", String(respBody.count))
            if !self.keepAlive { h.headers.set("Connection", "close") }
            var buf: [UInt8] = []
            HTTP1Serializer.writeResponseHead(h, into: &buf)
            if self.head.method != "HEAD" { buf.append(contentsOf: respBody) }
            self.frontend.writeTaking(&buf)
            self.frontend.exchangeFinished(self, keepAlive: self.keepAlive, abort: false)
        }
    }

    func abort() { done = true }
    func frontendWritable() {}
    var responseStarted: Bool { done }
}
