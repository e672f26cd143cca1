import BearerdHTTP
import BearerdIO
import BearerdOAuth
import BearerdProxyCore
import Logging
import BearerdConfig
import BearerdSessions
import BearerdService

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

/// `HTTP/1.1 100 Continue`, sent on the upstream's behalf (RFC 9110 §10.1.1; HTTP/1.1 clients only).
let continueLine: [UInt8] = Array("HTTP/1.1 100 Continue\r\n\r\n".utf8)

/// The client side of one proxied exchange: an HTTP/1.1 connection (`FrontendConnection`) or one
/// HTTP/2 stream (`FrontendH2Stream`). The exchange says what to send; the client writes it in
/// its protocol (HTTP/1.1 framing and `Connection`, or HTTP/2 frames). Calls on the client's loop.
protocol ExchangeClient: AnyObject {
    /// `h1` or `h2`, for metrics and the access log.
    var protocolName: String { get }
    var isOverHighWater: Bool { get }
    /// `100 Continue` on the upstream's behalf (HTTP/1.1 clients: RFC 9110 §10.1.1).
    func sendContinue()
    func sendInformational(_ upstream: HTTPResponseHead)
    /// The final response head built from the upstream's. `keepAlive`: the client connection may
    /// carry another request; `endStream`: nothing follows (no body, no trailers). Returns whether
    /// the connection stays persistent (HTTP/1.0 clients without a length: false).
    func sendResponseHead(_ upstream: HTTPResponseHead, framing: HTTP1BodyFraming, request: HTTPRequestHead,
                          keepAlive: Bool, endStream: Bool) -> Bool
    func sendResponseBody(_ raw: UnsafeRawBufferPointer)
    /// The response is complete (trailers relayed where the protocol carries them).
    func finishResponse(trailers: HTTPHeaders?)
    /// A whole response of bearerd's own (a JSON error, a trailers-only gRPC error).
    func sendLocalResponse(_ head: HTTPResponseHead, body: [UInt8], keepAlive: Bool)
    /// The exchange can take request body again (after backpressure).
    func exchangeWantsBody()
    func exchangeFinished(_ ex: FrontendExchange, keepAlive: Bool, abort: Bool)
    /// After a 101 relayed: the client side becomes a byte pipe to `ex`. Returns the bytes the
    /// client already sent after its handshake, or nil when this client cannot tunnel.
    func startTunnel(_ ex: ProxyExchangeDriver) -> [UInt8]?
    func tunnelWrite(_ raw: UnsafeRawBufferPointer)
    func pauseTunnelReading()
    func resumeTunnelReading()
    /// The tunnel is over: close once the output drained.
    func endTunnel()
}

/// One request's upstream side: a request on an HTTP/1.1 connection (`BackendConnection`) or one
/// HTTP/2 stream (`BackendH2Stream`). The exchange sends the head and raw body bytes; framing is
/// the stream's (chunked encoding, DATA frames). Calls on the loop.
protocol UpstreamStream: AnyObject {
    /// `h1` or `h2`.
    var protocolName: String { get }
    /// Taken from the pool (not fresh): a failure before any response byte may be retried.
    var reused: Bool { get }
    func assign(to delegate: BackendConnectionDelegate)
    /// `body`: the request body's framing (`.none`: the head is the whole request); `upgrade`: a
    /// WebSocket handshake (a 101 is acceptable); `teTrailers`: the client sent `TE: trailers`
    /// (hop-by-hop in HTTP/1.1, so dropped there; HTTP/2 carries it on, gRPC servers require it).
    /// `credential`: the field carrying the token, set (never added: it replaces the client's
    /// copy) as the head is written, so the head itself is never copied to change one field;
    /// HTTP/2 sends it never-indexed.
    func sendHead(_ head: HTTPRequestHead, body: HTTP1BodyFraming, upgrade: Bool, teTrailers: Bool, credential: HTTPField?)
    func writeBody(_ raw: UnsafeRawBufferPointer)
    func endBody(trailers: HTTPHeaders?)
    var isOverHighWater: Bool { get }
    /// Restarts the response deadline.
    func touch()
    func pauseReading()
    func resumeReading()
    /// The exchange is done with it and the response was read whole: back to the pool.
    func release()
    /// Abandon it (closes an HTTP/1.1 connection, resets an HTTP/2 stream).
    func close()
    /// After a 101: the bytes that followed it; from now on reads arrive as `backendTunnelBytes`.
    func switchProtocols() -> [UInt8]
    /// Tunnel: write raw bytes / close once they are flushed.
    func tunnelWrite(_ raw: UnsafeRawBufferPointer)
    func endTunnel()
}

/// Carries out the decisions of one `ProxyExchange.StateMachine`: the thin I/O side of one proxied
/// request, from the client's head to the last byte of the upstream's response.
///
/// Lives on the client's loop. Every input (a frontend call, a backend callback, a token or
/// session answer) goes to the machine, and every action it returns is carried out by `run`,
/// with the bytes or objects that came with the input (`Carried`); nothing here looks at the
/// machine's phase or keeps a decision of its own (after async-http-client's
/// `HTTP1ClientChannelHandler.run`). It owns what the machine only counts: the body buffered
/// while connecting (`pending`), the kept copy for replays (`kept`), the held rejection and its
/// trailers, the response head not yet written, the text of the last upstream failure, and the
/// upstream stream of the current attempt. The client side (`ExchangeClient`: an HTTP/1.1
/// connection or an HTTP/2 stream) and the upstream side (`UpstreamStream`: HTTP/1.1 or HTTP/2)
/// each frame bytes in their own protocol. The route, its session, target and metrics slot are
/// captured at start, so a reload never changes a running exchange (docs/architecture.md §2.6). Besides bytes,
/// the only state here is socket backpressure (`bodyHold`) and the access log's timings.
final class ProxyExchangeDriver: FrontendExchange, BackendConnectionDelegate {
    /// Strong: an HTTP/2 stream lives as long as its exchange; a connection outlives it anyway.
    let client: ExchangeClient
    let ctx: LoopContext
    let runtime: ProxyRuntime
    /// The route (by reference: copying `RouteConfig` retained each of its fields per request).
    let routeRef: RouteRef
    var route: RouteConfig { routeRef.config }
    let head: HTTPRequestHead
    let framing: HTTP1BodyFraming
    /// This route's slot in `ctx.metrics.routes`, fixed at start (see `LoopContext.routeSlots`).
    let metricsSlot: Int
    let target: UpstreamTarget
    let upstreamHead: HTTPRequestHead
    let logPath: Substring
    /// The route's token session; nil on routes without credentials.
    private let session: TokenSessionDriver?
    /// The route's index in `runtime` (for the loop's token cache).
    private let routeIndex: Int
    /// How the route treats the caller's own token (docs/architecture.md §6.16).
    private let callers: RouteCallerPolicy
    /// The caller's token on a route that needs it, once taken from the request head.
    private var caller: CallerIdentity?

    /// Trivially copyable (no references, no heap storage; a test pins it), so unchecked like the
    /// scalars below: see `SocketChannel` on `@exclusivity(unchecked)`.
    @exclusivity(unchecked) private var machine: ProxyExchange.StateMachine
    @exclusivity(unchecked) private var backend: UpstreamStream?
    /// The pool's ticket while waiting for a connection; cancelled when the exchange goes away.
    @exclusivity(unchecked) private var pendingAcquire: AcquireTicket?
    /// The token the current attempt carries.
    @exclusivity(unchecked) private var token: PublishedToken?

    // Bytes the machine counts.
    private var pending: [UInt8] = []
    private var kept: [UInt8] = []
    private var requestTrailers: HTTPHeaders?
    /// The final head while the machine holds it back (`headPending`, `holding`).
    @exclusivity(unchecked) private var responseHead: (head: HTTPResponseHead, framing: HTTP1BodyFraming)?
    private var heldBody: [UInt8] = []
    /// The held rejection's trailers (a gRPC rejection carries its status there).
    private var heldTrailers: HTTPHeaders?
    /// The last upstream failure in words, for the error answer's `detail` and the log; which
    /// answer it gets is the machine's (`ErrorAnswer`).
    @exclusivity(unchecked) private var failureDetail: String?
    /// Signing routes (docs/architecture.md §6.15): the body's SHA-256 for `payload: signed`
    /// (computed once, when the whole body is kept), and the canonical request hash of the
    /// last signature, for a `SignatureDoesNotMatch` warning.
    private var payloadHash: String?
    private var canonicalRequestHash: Substring?

    /// Socket backpressure (orthogonal to the machine's phases).
    private struct BodyHold: OptionSet {
        let rawValue: UInt8
        /// The upstream connection's output is over its high-water mark: the client's body waits.
        static let upstreamFull = BodyHold(rawValue: 1)
        /// The same in a tunnel: the client's tunnel reading is paused.
        static let tunnelFull = BodyHold(rawValue: 2)
    }
    @exclusivity(unchecked) private var bodyHold: BodyHold = []

    // Timing (monotonic nanoseconds; differences are saturating). Read from the loop's per-event
    // clock: the time the event that carried the bytes began.
    private let started: UInt64
    @exclusivity(unchecked) private var attemptStarted: UInt64 = 0
    @exclusivity(unchecked) private var headSentAt: UInt64 = 0
    @exclusivity(unchecked) private var upstreamHeadAt: UInt64 = 0
    @exclusivity(unchecked) private var status = 0
    @exclusivity(unchecked) private var bodyBytes: UInt64 = 0
    /// gRPC calls: the `grpc-status` the client got (from the head or the trailers), for the log.
    @exclusivity(unchecked) private var grpcStatus: String?
    /// The upstream stream's protocol of the last attempt, for the log.
    @exclusivity(unchecked) private var upstreamProtocol: String?
    /// The client sent `TE: trailers` (RFC 9110 §10.1.4).
    private let clientAcceptsTrailers: Bool
    /// This exchange's span when its trace is sampled (docs/architecture.md §2.9; BearerdSessions/Tracer.swift).
    private let trace: ExchangeTrace?

    /// What came with the input whose action `run` carries out: the bytes and objects the machine
    /// only counts or waits for. Small (the per-request cases are a buffer, a reference or the
    /// trailers); the rare large ones are boxed.
    private enum Carried {
        case nothing
        /// Borrowed for the call: copied where it must outlive it.
        case clientBody(UnsafeRawBufferPointer)
        case responseBody(UnsafeRawBufferPointer)
        /// The upstream's response ended, with these (forwardable) trailers.
        case responseEnd(trailers: HTTPHeaders?)
        /// A 1xx or 101 head.
        indirect case head(HTTPResponseHead)
        case stream(UpstreamStream)
        indirect case tokenUnavailable(TokenUnavailable)
        indirect case callerRefusal(CallerRefusal)
        /// The session's answer to a rejection of the request that carried generation `rejected`.
        indirect case verdict(RejectionOutcome, rejected: UInt64)
        case tunnelBytes(UnsafeRawBufferPointer)
    }

    /// `keepAlive`: the client asked for a persistent connection and the server is not draining.
    init(client: ExchangeClient, ctx: LoopContext, head: HTTPRequestHead, framing: HTTP1BodyFraming,
         routeIndex: Int, upstreamHead: HTTPRequestHead, logPath: Substring, keepAlive: Bool,
         upgrade: ProxyExchange.Upgrade = .none) {
        self.client = client
        self.ctx = ctx
        let runtime = ctx.runtime
        self.runtime = runtime
        self.head = head
        self.framing = framing
        self.routeIndex = routeIndex
        self.metricsSlot = ctx.routeSlots[routeIndex]
        self.target = runtime.targets[routeIndex]
        self.upstreamHead = upstreamHead
        self.logPath = logPath
        clientAcceptsTrailers = head.headers.contains(.te)
            && HTTPHeaderRules.listValues(head.headers, "TE").contains { asciiCaseInsensitiveEquals($0, "trailers") }
        started = ctx.loop.now
        trace = runtime.tracer?.startExchange(head.headers, now: started)
        let routeRef = runtime.routeRefs[routeIndex]
        self.routeRef = routeRef
        let session = runtime.routeSessions[routeIndex]
        self.session = session
        callers = runtime.routeCallers[routeIndex]
        var setup = ProxyExchange.Setup(
            hasBody: framing != .none,
            clientSpeaksHTTP11: head.version == .http1_1,
            expectsContinue: HTTPHeaderRules.expectsContinue(head),
            hasSession: session != nil,
            replayBodyLimit: routeRef.config.replayBodyLimit,
            rejectSet: routeRef.rejectSet,
            methodReplayable: routeRef.config.replayMethods.allows(head.method),
            methodIdempotent: ProxyExchange.Setup.isIdempotent(head.method),
            upgrade: upgrade,
            grpc: ErrorResponse.isGRPC(head.headers))
        setup.dpop = session?.dpop != nil
        if session?.signing != nil, let signing = routeRef.signing { setup.signing = signing.payload }
        setup.clientKeepAlive = keepAlive
        machine = ProxyExchange.StateMachine(setup: setup)
    }

    var requestComplete: Bool { machine.clientBody.isComplete }
    var wantsBody: Bool {
        machine.wantsClientBody && (!bodyHold.contains(.upstreamFull) || !machine.clientBodyGoesUpstream)
    }
    var responseStarted: Bool { machine.responseStarted }

    func start() {
        run(machine.start())
    }

    // MARK: the one executor

    /// Carries out one action of the machine, with what came with the input that produced it.
    private func run(_ action: ProxyExchange.Action, _ carried: Carried = .nothing) {
        switch action {
        case .none:
            break
        case .acquireToken:
            acquireToken()
        case .acquireBackend(let fresh):
            if case .verdict(.replay(let t, let refreshed), let rejected) = carried {
                noteReplay(with: t, refreshed: refreshed, rejected: rejected)
                token = t
            }
            acquireBackend(fresh: fresh)
        case .closeUnusedBackend:
            if case .stream(let conn) = carried { conn.close() }
        case .sendRequest(let send):
            guard case .stream(let conn) = carried else { return }
            backend = conn
            upstreamProtocol = conn.protocolName
            conn.assign(to: self)
            sendRequest(send)
        case .forwardClientBody(let keep):
            guard case .clientBody(let bytes) = carried else { return }
            apply(keep, bytes)
            if let b = backend {
                b.writeBody(bytes)
                if b.isOverHighWater { bodyHold.insert(.upstreamFull) }
            }
        case .bufferClientBody(let keep):
            guard case .clientBody(let bytes) = carried else { return }
            apply(keep, bytes)
            pending.append(contentsOf: bytes.assumingMemoryBound(to: UInt8.self))
        case .keepClientBody(let keep):
            guard case .clientBody(let bytes) = carried else { return }
            apply(keep, bytes)
        case .discardClientBody:
            break
        case .endUpstreamBody:
            endUpstreamBody()
        case .relayInformational:
            guard case .head(let informational) = carried else { return }
            client.sendInformational(informational)
            // 1xx relays obey the same backpressure as bodies.
            if client.isOverHighWater { backend?.pauseReading() }
        case .rejectionNotReplayed(let reason, let refreshOnly):
            ctx.metrics.countReplay(slot: metricsSlot, ReplayOutcome(reason))
            if refreshOnly { reportRejectedWithoutReplay() }
        case .holdRejection:
            heldBody.removeAll()
            // The body now goes only into the kept copy: the rejecting upstream's backpressure no
            // longer applies (it may have stopped reading for good).
            resumeClientBodyIfHeld()
        case .holdRejectionBody:
            if case .responseBody(let bytes) = carried { heldBody.append(contentsOf: bytes.assumingMemoryBound(to: UInt8.self)) }
        case .releaseHeldRejection(let reason, let keepAlive):
            resumeClientBodyIfHeld()
            if let reason {
                ctx.metrics.countReplay(slot: metricsSlot, ReplayOutcome(reason))
                // A DPoP nonce demand too large to hold is not about the token: nothing to refresh.
                if reason != .notTokenError { reportRejectedWithoutReplay() }
            }
            writeHeldRejection(keepAlive: keepAlive, endStream: false)
            // The chunk that did not fit follows what was held (a client chunk goes nowhere).
            if case .responseBody(let bytes) = carried { writeResponseBody(bytes) }
        case .rejectionDrained(let disposal, let reportNow):
            if case .responseEnd(let trailers) = carried { heldTrailers = trailers }
            dispose(disposal)
            resumeClientBodyIfHeld()
            if reportNow { reportRejectedForReplay() }
        case .reportRejection:
            reportRejectedForReplay()
        case .resendWithoutRefresh(let disposal):
            // RFC 9449 §9: the nonce came with the demand (`backendResponseHead` kept it); the
            // retry carries a fresh proof with it, and the same token (no refresh). A signing
            // route's clock skew: the server's time was adopted as the answer was classified;
            // the resend is signed again with it, with the same keys.
            dispose(disposal)
            resumeClientBodyIfHeld()
            heldBody.removeAll()
            heldTrailers = nil
            responseHead = nil
            session?.dpop?.countNonceRetry(.upstream)
            trace?.event(session?.dpop != nil ? "dpop.nonce_retry" : "signing.resend_with_server_time")
            acquireBackend(fresh: false)
        case .relayHeldAnswer(let disposal, let keepAlive, let bodyless):
            var trailers: HTTPHeaders?
            if case .responseEnd(let t) = carried { trailers = t }
            dispose(disposal)
            resumeClientBodyIfHeld()
            let persistent = writeHeldRejection(keepAlive: keepAlive, endStream: bodyless)
            if !bodyless { client.finishResponse(trailers: trailers) }
            complete(keepAlive: persistent)
        case .awaitClientBody(let sendContinue):
            // `payload: signed`: the body is read whole before anything is signed or sent.
            if sendContinue { client.sendContinue() }
            client.exchangeWantsBody()
        case .respondClientError(let error, let keepAlive):
            closeBackend()
            respondClientError(error, keepAlive: keepAlive)
        case .sendHeldRejection(let reason, let refreshOnly, let keepAlive, let bodyless):
            noteVerdict(carried)
            if let reason { ctx.metrics.countReplay(slot: metricsSlot, ReplayOutcome(reason)) }
            if refreshOnly { reportRejectedWithoutReplay() }
            let persistent = writeHeldRejection(keepAlive: keepAlive, endStream: bodyless)
            if !bodyless { client.finishResponse(trailers: heldTrailers) }
            complete(keepAlive: persistent)
        case .writeResponseHead(let keepAlive):
            writeResponseHead(keepAlive: keepAlive, endStream: false)
        case .forwardResponseBody(let writeHeadFirst, let keepAlive):
            if writeHeadFirst { writeResponseHead(keepAlive: keepAlive, endStream: false) }
            if case .responseBody(let bytes) = carried { writeResponseBody(bytes) }
        case .finishResponse(let writeHeadFirst, let disposal, let keepAlive):
            var trailers: HTTPHeaders?
            if case .responseEnd(let t) = carried { trailers = t }
            var persistent = keepAlive
            if writeHeadFirst {
                // Nothing was relayed yet: a bodyless response without trailers is its head alone
                // (HTTP/2: one HEADERS frame with END_STREAM, as trailers-only gRPC answers need).
                let whole = trailers == nil
                persistent = writeResponseHead(keepAlive: keepAlive, endStream: whole)
                if !whole { client.finishResponse(trailers: trailers) }
            } else {
                client.finishResponse(trailers: trailers)
            }
            dispose(disposal)
            complete(keepAlive: persistent)
        case .respondTokenUnavailable(let answer):
            noteVerdict(carried)
            // Both inputs that lead here (`tokenUnavailable`, the session's `.unavailable`) carry its reason.
            var reason: TokenUnavailable?
            switch carried {
            case .tokenUnavailable(let u), .verdict(.unavailable(let u), _): reason = u
            default: break
            }
            respondTokenUnavailable(reason, answer)
        case .respondCallerRefused(let keepAlive, let grpc):
            guard case .callerRefusal(let refusal) = carried else { return }
            respondCallerRefused(refusal, keepAlive: keepAlive, grpc: grpc)
        case .respondUpstreamError(let failure, let answer):
            noteVerdict(carried)
            // An extended CONNECT the upstream answered 2xx without switching: not relayed, its
            // connection (body unread) closed. Every other failure's connection is gone already.
            responseHead = nil
            closeBackend()
            respondUpstreamError(failure, answer)
        case .abortClient:
            abortClient(outcome: "upstream_aborted")
        case .abortExchange:
            closeBackend()
            log(outcome: "client_aborted")
        case .startTunnel:
            guard case .head(let switched) = carried else { return }
            startTunnel(switched)
        case .relayTunnelBytes(let direction):
            guard case .tunnelBytes(let raw) = carried else { return }
            relayTunnelBytes(raw, direction)
        case .finishTunnel:
            finishTunnel()
        }
    }

    // MARK: token

    private func acquireToken() {
        guard let session else { return }
        if callers.needsCallerToken {
            acquireCallerToken(session)
            return
        }
        acquireSessionToken(session)
    }

    /// docs/architecture.md §6.16: the caller's token is taken from the head, judged by the route's
    /// `caller_jwt` (if any), then exchanged by an on-behalf-of session or replaced by the
    /// session's own token.
    private func acquireCallerToken(_ session: TokenSessionDriver) {
        guard let token = CallerCredential.bearerToken(head.headers), let identity = CallerIdentity(token: token) else {
            callerRefused(.missingToken)
            return
        }
        caller = identity
        guard let guardian = callers.guardian else {
            acquireExchangedToken(identity, session: session)
            return
        }
        guardian.validate(token, key: identity.key, on: ctx.loop) { [weak self] verdict in
            guard let self else { return }
            switch verdict {
            case .valid(let v):
                var validated = identity
                validated.expiresAt = v.expiresAt
                caller = validated
                if callers.onBehalfOf != nil {
                    acquireExchangedToken(validated, session: session)
                } else {
                    acquireSessionToken(session)
                }
            case .invalid(let failure):
                runtime.logger.info("caller token refused", metadata: [
                    "route": "\(route.match)", "caller": "\(identity.key.fingerprint)", "reason": "\(failure.reason)"])
                callerRefused(.invalid(failure))
            case .keysUnavailable(let detail):
                run(machine.tokenUnavailable(), .tokenUnavailable(TokenUnavailable(session: session.name, retryAfterSeconds: 5,
                                                                                      detail: "caller_jwt: " + detail)))
            }
        }
    }

    private func acquireExchangedToken(_ identity: CallerIdentity, session: TokenSessionDriver) {
        guard let onBehalfOf = callers.onBehalfOf else {
            acquireSessionToken(session)
            return
        }
        onBehalfOf.token(for: identity, on: ctx.loop, trace: trace?.context) { [weak self] answer in
            guard let self else { return }
            switch answer {
            case .token(let t):
                token = t
                run(machine.tokenAcquired())
            case .refused(let refusal):
                callerRefused(refusal)
            case .unavailable(let u):
                run(machine.tokenUnavailable(), .tokenUnavailable(u))
            }
        }
    }

    /// The session's own token (every route without a caller's token, and a route with
    /// `caller_jwt:` but an ordinary session). The token is data the request carries, not a
    /// decision: kept as it arrives (an exchange that no longer waits for it never sends it).
    private func acquireSessionToken(_ session: TokenSessionDriver) {
        if let t = ctx.usableToken(route: routeIndex, of: runtime, session: session, now: ctx.loop.now) {
            token = t
            run(machine.tokenAcquired())
            return
        }
        session.requestToken(on: ctx.loop, trace: trace?.context) { [weak self] result in
            guard let self else { return }
            switch result {
            case .success(let t):
                token = t
                run(machine.tokenAcquired())
            case .failure(let unavailable):
                run(machine.tokenUnavailable(), .tokenUnavailable(unavailable))
            }
        }
    }

    private func callerRefused(_ refusal: CallerRefusal) {
        if let onBehalfOf = callers.onBehalfOf {
            onBehalfOf.countRefusal(refusal.reason)
        } else {
            callers.guardian?.countRefusal(refusal.reason)
        }
        run(machine.callerRefused(), .callerRefusal(refusal))
    }

    /// docs/architecture.md §6.16: 401 with `WWW-Authenticate: Bearer` (RFC 6750 §3) and a JSON body
    /// (gRPC clients: UNAUTHENTICATED); nothing was sent anywhere for this request.
    private func respondCallerRefused(_ refusal: CallerRefusal, keepAlive: Bool, grpc: Bool) {
        status = 401
        let keepAlive = keepAlive && !ctx.draining
        if grpc {
            respondGRPC(.unauthenticated, message: "\(refusal.error): \(refusal.detail)", keepAlive: keepAlive)
            return
        }
        var fields: [(String, String)] = [("reason", refusal.reason)]
        if let session { fields.append(("session", session.name)) }
        let (h, body) = ErrorResponse.parts(status: 401, error: refusal.error, detail: refusal.detail,
                                            extra: [("WWW-Authenticate", refusal.challenge)], fields: fields)
        client.sendLocalResponse(h, body: body, keepAlive: keepAlive)
        complete(keepAlive: keepAlive)
    }

    /// docs/architecture.md §5: 503 JSON with Retry-After (gRPC clients: UNAVAILABLE); the upstream is not called.
    private func respondTokenUnavailable(_ reason: TokenUnavailable?, _ answer: ProxyExchange.ErrorAnswer) {
        let u = reason ?? TokenUnavailable(session: session?.name ?? "", retryAfterSeconds: 1, detail: "no token")
        status = answer.status
        ctx.metrics.countUpstreamError(slot: metricsSlot, answer.kind)
        let keepAlive = answer.keepAlive && !ctx.draining
        if let code = answer.grpc {
            respondGRPC(code, message: "\(answer.kind.label): session \(u.session): \(u.detail)", keepAlive: keepAlive)
            return
        }
        let (h, body) = ErrorResponse.parts(status: answer.status, error: answer.kind.label, detail: u.detail,
                                            extra: [("Retry-After", String(u.retryAfterSeconds))], fields: [("session", u.session)])
        client.sendLocalResponse(h, body: body, keepAlive: keepAlive)
        complete(keepAlive: keepAlive)
    }

    /// A rejection that will not be replayed: the session refreshes for later requests
    /// (compare-and-swap on the generation happens there).
    private func reportRejectedWithoutReplay() {
        guard let session, let token else { return }
        if let onBehalfOf = callers.onBehalfOf, let caller {
            onBehalfOf.reportRejectedWithoutReplay(caller, rejected: token)
            return
        }
        session.reportRejectedWithoutReplay(generation: token.generation)
    }

    /// The held rejection drained and the body is complete: the session decides which token the
    /// replay carries (its current newer one at once, or the coalesced refresh's).
    private func reportRejectedForReplay() {
        guard let session, let rejected = token else { return }
        let report: (@escaping (RejectionOutcome) -> Void) -> Void
        if let onBehalfOf = callers.onBehalfOf, let caller {
            report = { [ctx, trace] done in onBehalfOf.reportRejected(caller, rejected: rejected, on: ctx.loop, trace: trace?.context, completion: done) }
        } else {
            report = { [ctx, route, trace] done in session.reportRejected(generation: rejected.generation, route: route.match, on: ctx.loop, trace: trace?.context, completion: done) }
        }
        report { [weak self] outcome in
            guard let self else { return }
            let verdict: ProxyExchange.RejectionVerdict
            switch outcome {
            // docs/architecture.md §6: a token requested before the session learned of this rejection may
            // have been killed by the same revocation; a rejection of it is replayed once more.
            case .replay(_, let refreshed): verdict = refreshed ? .replay : .provisionalReplay
            case .passThrough: verdict = .passThrough
            case .unavailable: verdict = .tokenUnavailable
            }
            self.run(self.machine.rejectionOutcome(verdict), .verdict(outcome, rejected: rejected.generation))
        }
    }

    /// A replay goes ahead with `t`.
    private func noteReplay(with t: PublishedToken, refreshed: Bool, rejected: UInt64) {
        ctx.metrics.countReplay(slot: metricsSlot, refreshed ? .replayedAfterRefresh : .replayedCurrentToken)
        trace?.replayed(rejected: rejected, with: t.generation, refreshed: refreshed)
        runtime.logger.info("replaying rejected request", metadata: [
            "session": "\(session?.name ?? "")", "route": "\(route.match)",
            "token.generation": "\(rejected)", "replay.generation": "\(t.generation)",
            "token.fingerprint": "\(t.fingerprint)", "replay.provisional": "\(!refreshed)", "path": "\(Redaction.target(String(logPath)))",
        ])
    }

    /// The session's answer when it is not a replay: counted and logged as the answer goes out.
    private func noteVerdict(_ carried: Carried) {
        guard case .verdict(let outcome, _) = carried else { return }
        switch outcome {
        case .replay:
            break
        case .passThrough(let reason):
            // The session logs this once per route and breaker streak and counts the rest.
            ctx.metrics.countReplay(slot: metricsSlot, ReplayOutcome.abandoned(reason: reason))
            runtime.logger.debug("not replaying rejected request", metadata: [
                "session": "\(session?.name ?? "")", "route": "\(route.match)", "reason": "\(reason)"])
        case .unavailable(let unavailable):
            // docs/architecture.md §6: no newer token within the wait bound is a 503, never the upstream's 401.
            ctx.metrics.countReplay(slot: metricsSlot, .refreshFailed)
            runtime.logger.debug("not replaying rejected request", metadata: [
                "session": "\(session?.name ?? "")", "route": "\(route.match)", "reason": "\(unavailable.detail)"])
        }
    }

    // MARK: backend

    private func acquireBackend(fresh: Bool) {
        attemptStarted = ctx.loop.now
        upstreamHeadAt = 0
        headSentAt = 0
        // A pooled connection or a stream on an open HTTP/2 connection: no closure, no wait.
        if !fresh, let conn = ctx.pool.takeReady(target, http1Only: machine.setup.upgrade.isRequested) {
            run(machine.backendAcquired(), .stream(conn))
            return
        }
        // Weak: an exchange abandoned while its connection is being opened is not kept alive
        // for it; the connection is closed instead.
        let completion: (Result<UpstreamStream, ChannelError>) -> Void = { [weak self] result in
            guard let self else {
                if case .success(let c) = result { c.close() }
                return
            }
            pendingAcquire = nil
            switch result {
            case .success(let conn):
                run(machine.backendAcquired(), .stream(conn))
            case .failure(let error):
                upstreamFailed(error, reused: false, responseBytesSeen: false, unprocessed: false)
            }
        }
        if fresh {
            pendingAcquire = ctx.pool.connectNew(target, http1Only: machine.setup.upgrade.isRequested, completion: completion)
        } else {
            pendingAcquire = ctx.pool.acquire(target, http1Only: machine.setup.upgrade.isRequested, completion: completion)
        }
    }

    private func sendRequest(_ send: ProxyExchange.SendRequest) {
        guard let conn = backend else { return }
        // Set, never add: the client's own copy never reaches the upstream (docs/architecture.md §5, `inject:`).
        let inject = routeRef.config.inject
        if let dpop = session?.dpop {
            sendDPoPRequest(send, conn: conn, dpop: dpop)
            return
        }
        if machine.setup.signing.signs, let plan = routeRef.signing {
            sendSignedRequest(send, conn: conn, plan: plan)
            return
        }
        let credential = token.map { HTTPField(name: inject.header, value: ctx.credentialValue(route: routeIndex, of: runtime, token: $0, inject: inject)) }
        sendRequest(send, conn: conn, head: upstreamHead, credential: credential)
    }

    /// DPoP (RFC 9449 §7): `Authorization: DPoP <token>` and a fresh proof (new `jti`, `ath`,
    /// `htm` the method, `htu` the upstream URL without query, the origin's last nonce) for this
    /// attempt, on its own connection or stream. `inject:` does not apply: the scheme is DPoP's.
    /// Only DPoP routes pay for the copied head and the signature.
    private func sendDPoPRequest(_ send: ProxyExchange.SendRequest, conn: UpstreamStream, dpop: DPoPProofer) {
        var head = upstreamHead
        var credential: HTTPField?
        if let token {
            let url = target.url.scheme + "://" + target.url.authority + upstreamHead.target
            let nonce = dpop.nonce(for: DPoPProofer.originKey(scheme: target.url.scheme, authority: target.url.authority))
            guard let proof = dpop.proof(method: upstreamHead.method, url: url, accessToken: token.value, nonce: nonce) else {
                failureDetail = nil
                conn.close()
                backend = nil
                run(machine.upstreamFailed(.proofUnavailable, reusedConnection: false, responseBytesSeen: false))
                return
            }
            head.headers.set(DPoP.proofHeader, proof)
            credential = HTTPField(name: "Authorization", value: DPoP.scheme + " " + token.value)
        }
        sendRequest(send, conn: conn, head: head, credential: credential)
    }

    /// A signing route (docs/architecture.md §6.15): this attempt's signature with the keys of the
    /// token it carries, at the session's signing time (the host's clock plus an offset adopted
    /// from a clock-skew answer). No token is injected; the client's `Authorization` and the
    /// schemes' own fields never reach the upstream. A target the signer refuses is the client's
    /// 400 (nothing is sent).
    private func sendSignedRequest(_ send: ProxyExchange.SendRequest, conn: UpstreamStream, plan: RouteSigning) {
        if plan.payload == .signedPayload, payloadHash == nil {
            // The machine connects only once the whole body is in the kept copy.
            payloadHash = RequestSigner.payloadHash(kept)
        }
        // `payload: signed` holds the whole body: it goes with its length (object stores refuse a
        // chunked upload without it: S3's 411 MissingContentLength). Trailers are then dropped.
        var head = upstreamHead
        var bodyFraming = framing
        if plan.payload == .signedPayload, framing == .chunked {
            head.headers.remove("Transfer-Encoding")
            head.headers.set("Content-Length", String(kept.count))
            bodyFraming = .contentLength(UInt64(kept.count))
            requestTrailers = nil
        }
        let host = wallClockSeconds()
        let time = session?.signing?.signingTime(hostEpochSeconds: host) ?? host
        switch RequestSigner.sign(head, authority: target.url.authority, plan: plan, keys: token?.signingKeys,
                                  payloadHash: payloadHash, epochSeconds: time) {
        case .signed(let prepared):
            canonicalRequestHash = prepared.canonicalRequestHash
            session?.signing?.countSigned()
            sendRequest(send, conn: conn, head: prepared.head, credential: prepared.authorization, bodyFraming: bodyFraming)
        case .failed(let failure, let detail):
            failureDetail = detail
            conn.close()
            backend = nil
            run(machine.signingFailed(failure))
        }
    }

    /// A held signing-route answer ended: what it says, from its status, fields and held body
    /// (docs/architecture.md §6.15). Counted and logged here, the server's time adopted; the
    /// machine decides what follows from the `SignedAnswer`.
    private func classifyHeldAnswer() -> ProxyExchange.SignedAnswer {
        guard let (head, _) = responseHead else { return .other }
        let fields = head.headers.fields.map { (name: $0.name, value: $0.value) }
        let verdict = SignedResponseVerdict.classify(status: head.status, headers: fields, body: heldBody)
        let signing = session?.signing
        switch verdict {
        case .notAnError, .otherError:
            break
        case .credentialsRejected(let code):
            signing?.countRejection()
            runtime.logger.info("upstream rejected the signing keys", metadata: [
                "session": "\(session?.name ?? "")", "route": "\(route.match)", "code": "\(code)",
                "key.fingerprint": "\(token?.fingerprint ?? "")", "token.generation": "\(token?.generation ?? 0)"])
        case .clockSkew(let code, let server):
            if let server, let signing {
                let offset = signing.adoptServerTime(server, hostEpochSeconds: wallClockSeconds())
                runtime.logger.info("upstream says the signing clock is off; signing with the server's time", metadata: [
                    "session": "\(session?.name ?? "")", "route": "\(route.match)", "code": "\(code)",
                    "clock.offset_seconds": "\(offset)"])
            } else {
                runtime.logger.warning("upstream says the signing clock is off but sent no time to adopt", metadata: [
                    "session": "\(session?.name ?? "")", "route": "\(route.match)", "code": "\(code)"])
            }
        case .signatureMismatch(let code, let serverHash):
            signing?.countSignatureMismatch()
            var metadata: Logger.Metadata = [
                "session": "\(session?.name ?? "")", "route": "\(route.match)", "code": "\(code)",
                "canonical_request.sha256": "\(canonicalRequestHash ?? "")", "path": "\(Redaction.target(String(logPath)))"]
            if let serverHash { metadata["server.canonical_request.sha256"] = "\(serverHash)" }
            runtime.logger.warning("upstream computed another signature; not replayed", metadata: metadata)
        }
        return ProxyExchange.SignedAnswer(verdict)
    }

    /// bearerd's own 4xx for a request it cannot sign (docs/architecture.md §6.15).
    private func respondClientError(_ error: ProxyExchange.ClientError, keepAlive requested: Bool) {
        let keepAlive = requested && !ctx.draining
        status = error.status
        let code: String
        let detail: String
        switch error {
        case .signedPayloadTooLarge:
            code = "sign.payload_too_large"
            detail = "payload: signed hashes the whole body before sending, and this body is larger than replay_body_limit "
                + "(\(route.replayBodyLimit) bytes); raise replay_body_limit or use payload: unsigned"
        case .unsignableTarget:
            code = "sign.invalid_target"
            detail = failureDetail ?? "the request target cannot be signed"
        }
        runtime.logger.info("request not signed", metadata: ["route": "\(route.match)", "error": "\(code)", "detail": "\(detail)"])
        let (h, body) = ErrorResponse.parts(status: error.status, error: code, detail: detail, fields: [("route", route.match)])
        client.sendLocalResponse(h, body: body, keepAlive: keepAlive)
        complete(keepAlive: keepAlive)
    }

    private func sendRequest(_ send: ProxyExchange.SendRequest, conn: UpstreamStream, head upstreamHead: HTTPRequestHead, credential: HTTPField?,
                             bodyFraming: HTTP1BodyFraming? = nil) {
        if runtime.tracesExchanges {
            var h = upstreamHead
            if let credential { h.headers.set(credential.name, credential.value) }
            runtime.logger.trace("upstream request", metadata: [
                "http.method": "\(h.method)", "http.target": "\(Redaction.target(h.target))",
                "http.headers": "\(Redaction.describe(h.headers, alsoSensitive: session?.dpop == nil ? route.inject.header : DPoP.proofHeader))",
                "token.generation": "\(token?.generation ?? 0)"])
        }
        headSentAt = ctx.loop.now
        if let trace {
            trace.sendHead(upstreamHead, on: conn, body: bodyFraming ?? framing, upgrade: machine.setup.upgrade.isRequested, teTrailers: clientAcceptsTrailers,
                           credential: credential)
        } else {
            conn.sendHead(upstreamHead, body: bodyFraming ?? framing, upgrade: machine.setup.upgrade.isRequested, teTrailers: clientAcceptsTrailers,
                          credential: credential)
        }
        // The stream may have failed while sending (an HTTP/2 connection that just went away).
        guard let conn = backend else { return }
        switch send.body {
        case .pending:
            if !pending.isEmpty { pending.withUnsafeBytes { conn.writeBody($0) } }
        case .kept:
            if !kept.isEmpty { kept.withUnsafeBytes { conn.writeBody($0) } }
        }
        // Whatever was pending is on its way (or is in the kept copy just sent).
        pending = []
        if send.endBody { endUpstreamBody() }
        if send.sendContinue { client.sendContinue() }
        if conn.isOverHighWater {
            bodyHold.insert(.upstreamFull)
        } else if !machine.clientBody.isComplete {
            // The client may have been paused while the pending buffer was full.
            bodyHold.remove(.upstreamFull)
            client.exchangeWantsBody()
        }
    }

    private func resumeClientBodyIfHeld() {
        guard bodyHold.contains(.upstreamFull) else { return }
        bodyHold.remove(.upstreamFull)
        client.exchangeWantsBody()
    }

    private func endUpstreamBody() {
        guard let b = backend else { return }
        if framing != .none { b.endBody(trailers: requestTrailers) }
        b.touch()
    }

    private func dispose(_ disposal: ProxyExchange.BackendDisposal) {
        guard let b = backend else { return }
        backend = nil
        switch disposal {
        case .release: b.release()
        case .close, .alreadyClosed: b.close()
        }
    }

    private func closeBackend() {
        let b = backend
        backend = nil
        b?.close()
    }

    // MARK: request body (from the client)

    func requestBody(_ bytes: ArraySlice<UInt8>) {
        bytes.withUnsafeBytes { run(machine.clientBodyReceived(count: $0.count), .clientBody($0)) }
    }

    private func apply(_ keep: ProxyExchange.KeepAction, _ bytes: UnsafeRawBufferPointer) {
        switch keep {
        case .append: kept.append(contentsOf: bytes.assumingMemoryBound(to: UInt8.self))
        case .skip: break
        case .release: kept = []
        }
    }

    func requestEnd(trailers: HTTPHeaders?) {
        // Fields not allowed in trailers (RFC 9110 §6.5.1; a client's Authorization among them) never reach the upstream.
        requestTrailers = HTTPHeaderRules.forwardableTrailers(trailers)
        run(machine.clientBodyEnded())
    }

    // MARK: response (from the upstream)

    func backendWritable() {
        if bodyHold.contains(.tunnelFull) {
            bodyHold.remove(.tunnelFull)
            client.resumeTunnelReading()
        }
        if bodyHold.contains(.upstreamFull) {
            bodyHold.remove(.upstreamFull)
            client.exchangeWantsBody()
        }
    }

    func frontendWritable() {
        backend?.resumeReading()
    }

    /// `endStream`: an HTTP/2 HEADERS frame that ended the stream (a trailers-only gRPC answer).
    func backendResponseHead(_ upstream: HTTPResponseHead, framing respFraming: HTTP1BodyFraming, endStream: Bool) {
        if upstream.status == 101 {
            if let session, let token, callers.onBehalfOf == nil { session.noteAccepted(generation: token.generation) }
            run(machine.upstreamSwitchedProtocols(), .head(upstream))
            return
        }
        if upstream.isInformational {
            run(machine.upstreamInformationalHead(status: upstream.status), .head(upstream))
            return
        }
        upstreamHeadAt = ctx.loop.now
        if headSentAt > 0 {
            ctx.metrics.observeUpstreamLatency(slot: metricsSlot, nanoseconds: upstreamHeadAt.saturatingSubtract(headSentAt))
        }
        status = upstream.status
        if runtime.tracesExchanges {
            runtime.logger.trace("upstream response", metadata: [
                "http.status": "\(upstream.status)", "http.headers": "\(Redaction.describe(upstream.headers))",
                "path": "\(Redaction.target(String(logPath)))", "token.generation": "\(token?.generation ?? 0)"])
        }
        responseHead = (upstream, respFraming)
        if let dpop = session?.dpop, let nonce = upstream.headers[DPoP.nonceHeader] {
            // RFC 9449 §9: the origin's nonce, for every later proof to it (a demand's included).
            dpop.noteNonce(nonce, for: DPoPProofer.originKey(scheme: target.url.scheme, authority: target.url.authority))
        }
        var grpcUnauthenticated = false
        if machine.setup.grpc, let g = upstream.headers["grpc-status"] {
            grpcStatus = g
            // Trailers-only (gRPC over HTTP/2: the head carries the status and ends the stream).
            grpcUnauthenticated = endStream && g == "16"
        }
        // docs/architecture.md §6.9: a status that is not a rejection proves the token it carried
        // (on a signing route 400 and 403 may be rejections: §6.15).
        if let session, let token, callers.onBehalfOf == nil, !grpcUnauthenticated, !routeRef.rejectSet.contains(upstream.status),
           !(machine.setup.signing.signs && (upstream.status == 400 || upstream.status == 403)) {
            session.noteAccepted(generation: token.generation)
        }
        if let watch = routeRef.issuerWatch, routeRef.rejectSet.contains(upstream.status) {
            watch.note(wwwAuthenticate: upstream.headers.values("WWW-Authenticate"), logger: runtime.logger)
        }
        run(machine.upstreamFinalHead(status: upstream.status, grpcUnauthenticated: grpcUnauthenticated,
                                      wwwAuthenticate: { upstream.headers.values("WWW-Authenticate") }))
    }

    func backendBody(_ bytes: UnsafeRawBufferPointer) {
        run(machine.upstreamBodyReceived(count: bytes.count), .responseBody(bytes))
    }

    func backendReadComplete() {
        run(machine.upstreamReadComplete())
    }

    func backendEnd(trailers upstreamTrailers: HTTPHeaders?) {
        // Fields not allowed in trailers (RFC 9110 §6.5.1) are dropped, whichever protocol brought them.
        let trailers = HTTPHeaderRules.forwardableTrailers(upstreamTrailers)
        if let g = trailers?["grpc-status"] { grpcStatus = g }
        run(machine.upstreamEnded(hasTrailers: trailers != nil, signedAnswer: { classifyHeldAnswer() }), .responseEnd(trailers: trailers))
    }

    func backendFailed(_ error: ChannelError, reused: Bool, responseBytesSeen: Bool, unprocessed: Bool) {
        upstreamFailed(error, reused: reused, responseBytesSeen: responseBytesSeen, unprocessed: unprocessed)
    }

    /// Classifies an I/O failure for the machine and keeps its words for the answer.
    private func upstreamFailed(_ error: ChannelError, reused: Bool, responseBytesSeen: Bool, unprocessed: Bool) {
        let b = backend
        backend = nil
        b?.close()
        let failure: ProxyExchange.UpstreamFailure
        switch error {
        case .timeout: failure = .timeout
        case .tls(let e):
            failure = .tls
            failureDetail = e.message
        case .protocolError: failure = .invalidResponse
        case .connect, .io: failure = .unreachable
        // The outbound proxy refused the CONNECT tunnel: wanting credentials is its own answer
        // (the operator's proxy credentials); any other status, or no answer, is an unreachable
        // upstream whose detail names the proxy and its status.
        case .proxyTunnel(let status, _): failure = ProxyExchange.UpstreamFailure(outboundProxyRefusal: status)
        }
        if case .proxyTunnel = error {
            failureDetail = "\(error)"  // names the proxy and the target already
        } else if failure != .tls {
            failureDetail = "\(target.url.authority): \(error)"
        }
        run(machine.upstreamFailed(failure, reusedConnection: reused, responseBytesSeen: responseBytesSeen, unprocessed: unprocessed))
    }

    // MARK: tunnel (WebSocket after a 101)

    private func startTunnel(_ upstream: HTTPResponseHead) {
        guard let b = backend else {
            run(machine.tunnelEnded())
            return
        }
        responseHead = nil
        status = 101
        // From here on backpressure is the tunnel's.
        bodyHold = []
        guard let clientEarly = client.startTunnel(self) else {
            run(machine.tunnelEnded())
            return
        }
        let switched = ProxyHeaders.switchingProtocolsResponse(upstream: upstream)
        client.sendInformational(switched)
        let upstreamEarly = b.switchProtocols()
        if !upstreamEarly.isEmpty { upstreamEarly.withUnsafeBytes { client.tunnelWrite($0) } }
        if !clientEarly.isEmpty { clientEarly.withUnsafeBytes { b.tunnelWrite($0) } }
        runtime.logger.debug("tunnel started", metadata: ["route": "\(route.match)", "path": "\(Redaction.target(String(logPath)))"])
    }

    /// Bytes from the client after the switch.
    func clientTunnelBytes(_ raw: UnsafeRawBufferPointer) {
        run(machine.clientTunnelBytes(), .tunnelBytes(raw))
    }

    /// The client closed its side (or failed).
    func clientTunnelEnded() {
        run(machine.tunnelEnded())
    }

    func backendTunnelBytes(_ raw: UnsafeRawBufferPointer) {
        run(machine.upstreamTunnelBytes(), .tunnelBytes(raw))
    }

    func backendTunnelEnded() {
        run(machine.tunnelEnded())
    }

    private func relayTunnelBytes(_ raw: UnsafeRawBufferPointer, _ direction: ProxyExchange.TunnelDirection) {
        switch direction {
        case .toUpstream:
            guard let b = backend else { return }
            b.tunnelWrite(raw)
            bodyBytes = bodyBytes.saturatingAdd(UInt64(raw.count))
            if b.isOverHighWater {
                bodyHold.insert(.tunnelFull)
                client.pauseTunnelReading()
            }
        case .toClient:
            client.tunnelWrite(raw)
            bodyBytes = bodyBytes.saturatingAdd(UInt64(raw.count))
            if client.isOverHighWater { backend?.pauseReading() }
        }
    }

    private func finishTunnel() {
        let b = backend
        backend = nil
        b?.endTunnel()
        client.endTunnel()
        log(outcome: "tunnel_closed")
        client.exchangeFinished(self, keepAlive: false, abort: false)
    }

    // MARK: writing to the client

    /// Writes the pending head, telling the client `keepAlive` unless the server is draining.
    /// Returns whether the client connection stays persistent after this response; when it does
    /// not, the machine learns it (a later `finishResponse` then says so).
    @discardableResult
    private func writeResponseHead(keepAlive: Bool, endStream: Bool) -> Bool {
        // Moved out (`take`): a copy and a nil assignment retained the head's fields and destroyed
        // the old value through the generic Optional witness.
        guard let (upstream, respFraming) = responseHead.take() else { return keepAlive }
        let requested = keepAlive && !ctx.draining
        let persistent = client.sendResponseHead(upstream, framing: respFraming, request: head,
                                                 keepAlive: requested, endStream: endStream) && requested
        if !persistent { run(machine.clientConnectionClosesAfterResponse()) }
        return persistent
    }

    /// The held rejection goes to the client after all: its head, then the body held so far. The
    /// kept copy of the request is no longer needed. Returns `writeResponseHead`'s persistence.
    @discardableResult
    private func writeHeldRejection(keepAlive: Bool, endStream: Bool) -> Bool {
        kept = []
        let persistent = writeResponseHead(keepAlive: keepAlive, endStream: endStream)
        let held = heldBody
        heldBody = []
        if !held.isEmpty { held.withUnsafeBytes { writeResponseBody($0) } }
        return persistent
    }

    private func writeResponseBody(_ raw: UnsafeRawBufferPointer) {
        guard raw.count > 0 else { return }
        bodyBytes = bodyBytes.saturatingAdd(UInt64(raw.count))
        client.sendResponseBody(raw)
        if client.isOverHighWater { backend?.pauseReading() }
    }

    /// The answer the machine chose for `failure` (docs/architecture.md §5), with the failure's words.
    private func respondUpstreamError(_ failure: ProxyExchange.UpstreamFailure, _ answer: ProxyExchange.ErrorAnswer) {
        let code = answer.kind.label
        let upstreamStatus = status
        ctx.metrics.countUpstreamError(slot: metricsSlot, answer.kind)
        status = answer.status
        let keepAlive = answer.keepAlive && !ctx.draining
        let detail: String
        switch failure {
        case .upgradeNotSwitched:
            detail = "\(target.url.authority): the upstream answered the WebSocket upgrade with \(upstreamStatus), not 101 Switching Protocols"
        case .unexpectedSwitch:
            detail = "\(target.url.authority): the upstream switched protocols (101) for a request that asked for no upgrade"
        case .proofUnavailable:
            detail = "\(target.url.authority): cannot sign a DPoP proof with the key of session \(session?.name ?? "?")"
        case .unreachable, .timeout, .tls, .invalidResponse, .outboundProxyAuthRequired:
            detail = failureDetail ?? "\(target.url.authority): upstream failed"
        }
        runtime.logger.warning("upstream failed", metadata: ["route": "\(route.match)", "upstream": "\(target.url.authority)",
                                                             "error": "\(code)", "detail": "\(detail)"])
        if let grpc = answer.grpc {
            // gRPC clients read the status from trailers, not from a JSON body (docs/architecture.md §5).
            respondGRPC(grpc, message: "\(code): \(detail)", keepAlive: keepAlive)
            return
        }
        let (h, body) = ErrorResponse.parts(status: answer.status, error: code, detail: detail, fields: [("route", route.match)])
        client.sendLocalResponse(h, body: body, keepAlive: keepAlive)
        complete(keepAlive: keepAlive)
    }

    /// A trailers-only gRPC error in place of a JSON one.
    private func respondGRPC(_ code: ErrorResponse.GRPCCode, message: String, keepAlive: Bool) {
        grpcStatus = String(code.rawValue)
        client.sendLocalResponse(ErrorResponse.grpcTrailersOnly(code, message: message), body: [], keepAlive: keepAlive)
        complete(keepAlive: keepAlive)
    }

    private func abortClient(outcome: String) {
        closeBackend()
        log(outcome: outcome)
        client.exchangeFinished(self, keepAlive: false, abort: true)
    }

    private func complete(keepAlive: Bool) {
        log(outcome: nil)
        client.exchangeFinished(self, keepAlive: keepAlive, abort: false)
    }

    func abort() {
        // A request that never got its connection opens none (RFC 9113 §10.5).
        pendingAcquire?.cancel()
        pendingAcquire = nil
        run(machine.clientClosed())
    }

    private func log(outcome: String?) {
        trace?.finish(method: head.method, route: route.match, session: session?.name, upstream: target.url.authority, status: status,
                      replays: machine.replays, generation: token?.generation, outcome: outcome, protocolName: client.protocolName, end: ctx.loop.now)
        ctx.metrics.countRequest(slot: metricsSlot, status: status, http2: client.protocolName == "h2", grpcStatus: grpcStatus)
        ctx.metrics.responseBytes &+= bodyBytes
        guard runtime.accessLog else { return }
        let now = ctx.loop.now
        var record = AccessRecord(
            method: head.method, path: String(logPath), route: routeRef.config.match, status: status,
            upstreamMicros: upstreamHeadAt > 0 ? Int(clamping: upstreamHeadAt.saturatingSubtract(attemptStarted) / 1000) : -1,
            totalMicros: Int(clamping: now.saturatingSubtract(started) / 1000), bytes: bodyBytes, outcome: outcome,
            session: session?.name, generation: session == nil ? nil : token?.generation, replayed: machine.replays > 0)
        record.protocolName = client.protocolName
        record.upstreamProtocol = upstreamProtocol
        record.grpcStatus = grpcStatus
        if let handler = runtime.accessHandler, handler.metadata.isEmpty {
            if handler.logLevel <= .info { handler.writeAccess(record) }
        } else {
            runtime.logger.info("request", metadata: ["access": .stringConvertible(record)])
        }
    }
}

extension UInt64 {
    /// `self - other`, or 0 when `other` is later (clock values from different attempts).
    @inline(__always)
    func saturatingSubtract(_ other: UInt64) -> UInt64 { self >= other ? self - other : 0 }
    @inline(__always)
    func saturatingAdd(_ other: UInt64) -> UInt64 {
        let (r, o) = addingReportingOverflow(other)
        return o ? .max : r
    }
}
