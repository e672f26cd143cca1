import BearerdOAuth

/// Namespace of one proxied request's pipeline (docs/architecture.md §2.6). The driver is
/// `BearerdProxy.ProxyExchangeDriver`; everything it decides lives here, free of I/O.
public enum ProxyExchange {}

extension ProxyExchange {
    /// The decisions of one proxied request, from the client's head to the end of the response.
    ///
    /// Theory of operation. The machine holds one `State`; every input is a fact the driver
    /// observed (`tokenAcquired`, `upstreamFinalHead`, `clientBodyReceived(count:)`, …) and every
    /// call returns one `Action` for the driver to carry out. The driver owns the bytes (the pending
    /// body, the kept copy, the held rejection, the response head) and the sockets; the machine owns
    /// the phase, the counts and every rule: where a body chunk goes, when a rejection is held,
    /// when a request is retried or replayed, what the client is told when something fails.
    ///
    /// States and their exits:
    /// - `.initial` → `start()` → `.awaitingToken` or `.connecting`.
    /// - `.awaitingToken` → `tokenAcquired` → `.connecting`; `tokenUnavailable` → `.finished` (503).
    ///   With `payload: signed` and a body still arriving: → `.awaitingSignedBody` → `clientBodyEnded`
    ///   → `.connecting`; the kept copy overflowing replay_body_limit → `.finished` (413).
    /// - `.connecting(attempt)` → `backendAcquired` → `.forwarding`; `upstreamFailed` → `.connecting`
    ///   (one retry on a fresh connection) or `.finished` (502/504).
    /// - `.forwarding(attempt, upstreamBody, response)`: the request head went out. The response side
    ///   moves `awaitingHead` → `headPending` (a final head not yet written to the client, so a
    ///   failure in the same read is still a clean 502) → `streaming` → end (`.finished`); or
    ///   `awaitingHead` → `holding` (a rejection kept back while it drains and while the client's
    ///   body completes) → `.collectingReplayBody` / `.awaitingReplayToken`. What is held and why
    ///   is a `HoldReason`: a token rejection (replayed with a newer token), a DPoP nonce demand
    ///   or a signing route's clock skew (the one `Resend`, nothing refreshed), or a signing
    ///   route's 400/403, whose ended body the driver classifies (`SignedAnswer`): a credentials
    ///   rejection takes the rejection path, a skew the resend, anything else is relayed.
    /// - `.collectingReplayBody` → `clientBodyEnded` → `.awaitingReplayToken`; the kept copy
    ///   overflowing → `.finished` (the held rejection goes to the client; one whose connection
    ///   was cut is answered as that failure).
    /// - `.awaitingReplayToken` → `rejectionOutcome(.replay / .provisionalReplay)` → `.connecting(replay)`
    ///   (a rejection of a provisional replay is held and reported like the first one);
    ///   `.passThrough` → `.finished` (the held rejection goes to the client);
    ///   `.tokenUnavailable` → `.finished` (503, docs/architecture.md §6: never the upstream's rejection).
    /// - `.forwarding(_, .sent, .awaitingHead)` of an upgrade request → `upstreamSwitchedProtocols`
    ///   (a 101) → `.tunnelling` → `tunnelEnded` / `clientClosed` / `upstreamFailed` → `.finished`.
    ///   A final head instead is the upstream declining: relayed like any response to an HTTP/1.1
    ///   upgrade (RFC 9110 §7.8), except a 2xx to an extended CONNECT → `.finished` (502: to an
    ///   HTTP/2 client a 2xx would say the tunnel is open).
    /// - any state → `clientClosed` → `.finished`.
    ///
    /// Every answer bearerd gives in place of the upstream's (502/503/504, JSON or gRPC
    /// trailers-only) and whether the client connection stays open are decided here and carried
    /// in the action (`ErrorAnswer`, `keepAlive`); the driver only writes them.
    ///
    /// Invariants: the client gets at most one final response head; an error answer (JSON 5xx) is
    /// only chosen while no byte of a response head was written; a request is replayed at most
    /// once with a token requested after its rejection was known (a provisional replay before it
    /// is the only other one) and retried on a fresh connection at most once per attempt; a backend connection is
    /// handed back to the pool only when the request was fully sent and the response fully read.
    public struct StateMachine: Sendable {
        public let setup: Setup
        public private(set) var state: State
        /// What the client has sent of its body (independent of the phase above).
        public private(set) var clientBody: ClientBody
        /// Whether everything the client sent so far is in the kept copy.
        public private(set) var keep: Keep
        /// `Expect: 100-continue` handling (RFC 9110 §10.1.1): ours to answer, once.
        public private(set) var continueState: ContinueState
        /// Bytes buffered while no upstream connection is ready (bounded by pausing the client).
        public private(set) var pendingBytes: Int = 0
        /// Replays so far: at most two, and two only when the first was provisional.
        public private(set) var replays: Int = 0

        /// The one resend without a refresh: a DPoP route's nonce demand (RFC 9449 §9) or a
        /// signing route's clock-skew answer (docs/architecture.md §6.15). Neither is a rejection
        /// of the credentials, so neither uses the rejection replay.
        public private(set) var resend: Resend = .available

        /// Body bytes buffered before the upstream connection is ready; more pauses the client.
        public static let pendingLimit = 64 * 1024
        /// The largest rejection body held while deciding on a replay; larger ones are relayed.
        public static let heldRejectionLimit = 64 * 1024

        public init(setup: Setup) {
            self.setup = setup
            state = .initial
            clientBody = setup.hasBody ? .streaming(received: 0) : .complete
            // No body: trivially all kept. A body is kept (up to replay_body_limit) only on routes
            // with a session, where a rejection may have to be replayed; with `payload: signed`
            // always (it is hashed before sending: a limit of 0 admits only an empty body).
            let keeps = !setup.hasBody || (setup.hasSession && (setup.replayBodyLimit > 0 || setup.signing == .signedPayload))
            keep = keeps ? .keeping(bytes: 0) : .notKept
            continueState = setup.expectsContinue && setup.hasBody && setup.clientSpeaksHTTP11 ? .expected : .notExpected
        }

        public var isFinished: Bool {
            if case .finished = state { return true }
            return false
        }

        /// The client's body is read only while this holds (the driver adds its own socket
        /// backpressure on top).
        public var wantsClientBody: Bool {
            switch state {
            case .initial, .awaitingToken, .connecting:
                // `payload: signed`: read into the kept copy, bounded by replay_body_limit (413).
                return setup.signing == .signedPayload || pendingBytes < Self.pendingLimit
            default: return true
            }
        }

        /// Client body chunks are written to the upstream connection now (so its backpressure
        /// applies); in every other phase they are buffered, kept or dropped.
        public var clientBodyGoesUpstream: Bool {
            switch state {
            case .forwarding(_, .sending, .awaitingHead), .forwarding(_, .sending, .headPending),
                 .forwarding(_, .sending, .streaming):
                return true
            default:
                return false
            }
        }

        /// Some of the response went to the client (a head, a tunnel) or the exchange is over: an
        /// error can no longer be answered in its place.
        public var responseStarted: Bool {
            switch state {
            case .forwarding(_, _, .streaming), .tunnelling, .finished: return true
            default: return false
            }
        }

        /// The client's connection may carry another request after a response the machine
        /// decided with `close` (RFC 9112 §9.3: not after an unread body or a close-delimited one).
        private func keepAlive(closing close: Bool) -> Bool { setup.clientKeepAlive && !close }

        /// The client's answer for an upstream failure (docs/architecture.md §5).
        private func upstreamErrorAnswer(_ failure: UpstreamFailure, closing close: Bool) -> Action {
            .respondUpstreamError(failure, ErrorAnswer(upstream: failure, grpc: setup.grpc, keepAlive: keepAlive(closing: close)))
        }

        /// A request is a replay once the first rejection was replayed.
        public var isReplay: Bool {
            switch state {
            case .connecting(let a), .forwarding(let a, _, _): return a.kind.isReplay
            default: return false
            }
        }

        // MARK: inputs from the driver

        /// The exchange starts: get a token first when the route has a session.
        public mutating func start() -> Action {
            guard case .initial = state else { return .none }
            if setup.hasSession {
                state = .awaitingToken
                return .acquireToken
            }
            return connect(Attempt(kind: .original, freshConnection: false))
        }

        /// The session handed out a token (at once or after waiting).
        public mutating func tokenAcquired() -> Action {
            guard case .awaitingToken = state else { return .none }
            if setup.signing == .signedPayload && !clientBody.isComplete {
                // The body's hash goes into the signature: all of it first.
                state = .awaitingSignedBody
                let sendContinue = continueState == .expected
                if sendContinue { continueState = .sent }
                return .awaitClientBody(sendContinue: sendContinue)
            }
            return connect(Attempt(kind: .original, freshConnection: false))
        }

        /// No token can be had (docs/architecture.md §5: 503, the upstream is not called).
        public mutating func tokenUnavailable() -> Action {
            guard case .awaitingToken = state else { return .none }
            state = .finished
            return .respondTokenUnavailable(ErrorAnswer(tokenUnavailableFor: setup.grpc, keepAlive: keepAlive(closing: !clientBody.isComplete)))
        }

        /// The caller's own token was missing, invalid or refused (docs/architecture.md §6.16):
        /// bearerd's 401, and the upstream is not called.
        public mutating func callerRefused() -> Action {
            guard case .awaitingToken = state else { return .none }
            state = .finished
            return .respondCallerRefused(keepAlive: keepAlive(closing: !clientBody.isComplete), grpc: setup.grpc)
        }

        /// An upstream connection is ready for the current attempt.
        public mutating func backendAcquired() -> Action {
            guard case .connecting(let attempt) = state else { return .closeUnusedBackend }
            let send: SendRequest
            switch attempt.kind {
            case .original where !attempt.freshConnection && setup.signing != .signedPayload:
                var sendContinue = false
                if continueState == .expected && !clientBody.isComplete {
                    continueState = .sent
                    sendContinue = true
                }
                send = SendRequest(body: .pending, endBody: clientBody.isComplete && setup.hasBody, sendContinue: sendContinue)
                pendingBytes = 0
            case .original, .replay, .provisionalReplay, .resend, .resendOfReplay, .resendOfProvisionalReplay:
                // A retry or a replay re-sends what was kept (all of it while keeping holds).
                send = SendRequest(body: .kept, endBody: clientBody.isComplete && setup.hasBody, sendContinue: false)
            }
            let upstreamBody: UpstreamBody = clientBody.isComplete ? .sent : .sending
            state = .forwarding(attempt, upstreamBody, .awaitingHead)
            return .sendRequest(send)
        }

        /// `count` body bytes arrived from the client.
        public mutating func clientBodyReceived(count: Int) -> Action {
            guard case .streaming(let received) = clientBody else { return .discardClientBody }
            clientBody = .streaming(received: received.addingSaturating(count))
            let keepAction = updateKeep(adding: count)
            switch state {
            case .initial, .awaitingToken, .connecting, .awaitingSignedBody:
                if setup.signing == .signedPayload {
                    // Hashed before sending: only the kept copy takes it, and past
                    // replay_body_limit the request cannot be signed.
                    guard keepAction != .release else {
                        state = .finished
                        return .respondClientError(.signedPayloadTooLarge, keepAlive: keepAlive(closing: true))
                    }
                    return .keepClientBody(keepAction)
                }
                pendingBytes = pendingBytes.addingSaturating(count)
                return .bufferClientBody(keep: keepAction)
            case .forwarding(let attempt, .sending, let response):
                if case .holding(_, let reason) = response {
                    // The upstream already rejected: the body goes only into the kept copy.
                    return afterHoldingKeep(keepAction, attempt: attempt, reason: reason)
                }
                return .forwardClientBody(keep: keepAction)
            case .forwarding(let attempt, .abandoned, let response):
                if case .holding(_, let reason) = response { return afterHoldingKeep(keepAction, attempt: attempt, reason: reason) }
                return .discardClientBody  // a relayed rejection: the rest of the body goes nowhere
            case .forwarding(_, .sent, _):
                return .keepClientBody(keepAction)  // cannot happen: `.sent` needs a complete body
            case .collectingReplayBody(let held):
                if keepAction == .release {
                    keep = .notKept
                    // Over replay_body_limit: the rejection goes to the client after all.
                    state = .finished
                    switch held {
                    case .cut(let failure):
                        return upstreamErrorAnswer(failure, closing: true)
                    case .whole(let bodyless):
                        // A nonce demand or a clock skew is not about the credentials: nothing to refresh.
                        let refresh: Bool
                        if case .pending = resend { refresh = false } else { refresh = true }
                        return .sendHeldRejection(reason: .notReplayable, refreshOnly: refresh, keepAlive: keepAlive(closing: true),
                                                  bodyless: bodyless)
                    }
                }
                return .keepClientBody(keepAction)
            case .awaitingReplayToken, .finished:
                return .keepClientBody(keepAction)
            case .tunnelling:
                return .discardClientBody  // cannot happen: an upgrade request has no body
            }
        }

        /// The client's body is complete (its trailers, if any, are the driver's to keep).
        public mutating func clientBodyEnded() -> Action {
            guard case .streaming = clientBody else { return .none }
            clientBody = .complete
            switch state {
            case .forwarding(let attempt, .sending, let response):
                if case .holding = response {
                    state = .forwarding(attempt, .abandoned, response)
                    return .none
                }
                state = .forwarding(attempt, .sent, response)
                return .endUpstreamBody
            case .collectingReplayBody(let held):
                if case .pending(let kind) = resend {
                    resend = .used
                    state = .connecting(Attempt(kind: kind.afterResend, freshConnection: false))
                    return .resendWithoutRefresh(backend: .alreadyClosed)
                }
                state = .awaitingReplayToken(held)
                return .reportRejection
            case .awaitingSignedBody:
                return connect(Attempt(kind: .original, freshConnection: false))
            default:
                return .none
            }
        }

        /// An interim (1xx) response head arrived. 100 is ours to send; others are relayed to
        /// HTTP/1.1 clients only (RFC 9110 §15.2: never to an HTTP/1.0 client).
        public mutating func upstreamInformationalHead(status: Int) -> Action {
            guard case .forwarding(_, _, .awaitingHead) = state else { return .none }
            if status == 100 || !setup.clientSpeaksHTTP11 { return .none }
            return .relayInformational
        }

        /// A final response head arrived. `wwwAuthenticate` is read only when the status is one of
        /// `reject_statuses` on a route with a session.
        ///
        /// A final head is an answer, never a protocol switch: a switch arrives as
        /// `upstreamSwitchedProtocols` (an HTTP/1.1 upstream's 101; an upstream reached by
        /// extended CONNECT over HTTP/2 would switch with its 2xx, which its connection must
        /// report as the switch). Upgrades go upstream over HTTP/1.1 only.
        ///
        /// `grpcUnauthenticated`: the head is a trailers-only gRPC answer with `grpc-status: 16`,
        /// a rejection like a listed status. A gRPC call is replayed only when its whole body is
        /// already kept (unary calls): a streaming client waits for responses before it ends its
        /// body, so waiting for the rest would stall it; such a rejection is passed through and
        /// the token refreshed for later calls.
        public mutating func upstreamFinalHead(status: Int, grpcUnauthenticated: Bool = false,
                                               wwwAuthenticate: () -> [String]) -> Action {
            guard case .forwarding(let attempt, let upstreamBody, .awaitingHead) = state else { return .none }
            if setup.upgrade == .extendedConnect && status >= 200 && status < 300 {
                // An extended CONNECT whose HTTP/1.1 handshake was answered 2xx instead of 101:
                // the upstream did not switch, and to the HTTP/2 client a 2xx means the tunnel is
                // open (RFC 8441 §5, RFC 9113 §8.5). Not relayed: the client gets a 502, the
                // connection with its unread body is closed (`respondUpstreamError` from this
                // input: the driver closes the backend). Other statuses (a refusal, a rejection)
                // are answers. An HTTP/1.1 upgrade answered 2xx is an answer too (RFC 9110 §7.8:
                // the server ignored `Upgrade`), relayed below like any response.
                state = .finished
                return upstreamErrorAnswer(.upgradeNotSwitched, closing: true)
            }
            if setup.dpop, status == 401, case .available = resend, keep.isKeeping, clientBody.isComplete || !setup.grpc,
               DPoP.asksForNonce((try? WWWAuthenticate.parse(wwwAuthenticate())) ?? []) {
                // RFC 9449 §9: the upstream wants its nonce in the proof. Held and drained like a
                // rejection, then sent once more with a fresh proof; the token is not blamed.
                state = .forwarding(attempt, upstreamBody, .holding(bytes: 0, .nonceDemand))
                return .holdRejection
            }
            if setup.signing.signs, status == 400 || status == 403 {
                // docs/architecture.md §6.15: a signing route's 400 or 403 may say the keys expired
                // (replay), the clock is off (resend) or the signature is wrong (relay); its body
                // says which. Held only when something could be sent again: the body kept, the
                // method allowed, not the answer to the final replay.
                guard keep.isKeeping, clientBody.isComplete || !setup.grpc, setup.methodReplayable,
                      !attempt.kind.isTokenReplay else {
                    state = .forwarding(attempt, upstreamBody, .headPending)
                    return .none
                }
                state = .forwarding(attempt, upstreamBody, .holding(bytes: 0, .signedAnswer))
                return .holdRejection
            }
            guard setup.hasSession, setup.rejectSet.contains(status) || grpcUnauthenticated else {
                state = .forwarding(attempt, upstreamBody, .headPending)
                return .none
            }
            var input = ReplayPolicy.Input(
                status: status, rejectStatuses: setup.rejectStatuses, wwwAuthenticate: wwwAuthenticate(),
                bodyReplayable: keep.isKeeping && (clientBody.isComplete || !setup.grpc), methodAllowed: setup.methodReplayable,
                alreadyReplayed: attempt.kind.isTokenReplay)
            input.grpcUnauthenticated = grpcUnauthenticated
            let verdict = ReplayPolicy.decide(input)
            switch verdict {
            case .notRejected:
                state = .forwarding(attempt, upstreamBody, .headPending)
                return .none
            case .replay:
                state = .forwarding(attempt, upstreamBody, .holding(bytes: 0, .rejection))
                return .holdRejection
            case .passThrough(let reason):
                state = .forwarding(attempt, upstreamBody, .headPending)
                return .rejectionNotReplayed(reason: reason, refreshOnly: false)
            case .refreshOnlyPassThrough(let reason):
                state = .forwarding(attempt, upstreamBody, .headPending)
                return .rejectionNotReplayed(reason: reason, refreshOnly: true)
            }
        }

        /// `count` response body bytes arrived from the upstream.
        public mutating func upstreamBodyReceived(count: Int) -> Action {
            guard case .forwarding(let attempt, let upstreamBody, let response) = state else { return .none }
            switch response {
            case .awaitingHead:
                return .none  // the parser delivers a head first
            case .headPending:
                state = .forwarding(attempt, upstreamBody, .streaming(closeClient: !clientBody.isComplete))
                return .forwardResponseBody(writeHeadFirst: true, keepAlive: keepAlive(closing: !clientBody.isComplete))
            case .streaming:
                return .forwardResponseBody(writeHeadFirst: false, keepAlive: true)
            case .holding(let bytes, let reason):
                let total = bytes.addingSaturating(count)
                if total <= Self.heldRejectionLimit {
                    state = .forwarding(attempt, upstreamBody, .holding(bytes: total, reason))
                    return .holdRejectionBody
                }
                // Too large to hold: relay the rejection, keep the token fresh for later requests.
                let close = !clientBody.isComplete || upstreamBody == .abandoned
                state = .forwarding(attempt, upstreamBody, .streaming(closeClient: close))
                keep = .notKept
                switch reason {
                case .rejection:
                    return .releaseHeldRejection(reason: .rejectionTooLarge, keepAlive: keepAlive(closing: close))
                case .nonceDemand:
                    // A nonce demand is not about the token: relayed, nothing refreshed.
                    resend = .used
                    return .releaseHeldRejection(reason: .notTokenError, keepAlive: keepAlive(closing: close))
                case .signedAnswer:
                    // Larger than any error document a store sends: not read, relayed as it is.
                    return .releaseHeldRejection(reason: nil, keepAlive: keepAlive(closing: close))
                }
            }
        }

        /// The backend finished delivering what one read produced: a head still pending goes out
        /// now (a response whose body comes later must not wait for it).
        public mutating func upstreamReadComplete() -> Action {
            guard case .forwarding(let attempt, let upstreamBody, .headPending) = state else { return .none }
            let close = !clientBody.isComplete
            state = .forwarding(attempt, upstreamBody, .streaming(closeClient: close))
            return .writeResponseHead(keepAlive: keepAlive(closing: close))
        }

        /// The head went out saying the client's connection closes after this response: the
        /// server is draining, or the client cannot delimit the response otherwise (an HTTP/1.0
        /// client and no length: RFC 9112 §6.3, the close ends the body). The response's end
        /// then keeps the connection no longer.
        public mutating func clientConnectionClosesAfterResponse() -> Action {
            if case .forwarding(let attempt, let upstreamBody, .streaming) = state {
                state = .forwarding(attempt, upstreamBody, .streaming(closeClient: true))
            }
            return .none
        }

        /// The upstream's response is complete. `hasTrailers`: it ended with a trailer section
        /// (a held rejection with neither body nor trailers is relayed as a head alone).
        /// `signedAnswer`: what a held signing-route answer says (the driver classifies its held
        /// bytes); asked only for such an answer, at most once.
        public mutating func upstreamEnded(hasTrailers: Bool = false, signedAnswer: () -> SignedAnswer = { .other }) -> Action {
            guard case .forwarding(let attempt, let upstreamBody, let response) = state else { return .none }
            let backend: BackendDisposal = upstreamBody == .sent ? .release : .close
            switch response {
            case .awaitingHead:
                return .none
            case .headPending:
                state = .finished
                return .finishResponse(writeHeadFirst: true, backend: backend, keepAlive: keepAlive(closing: !clientBody.isComplete))
            case .streaming(let close):
                state = .finished
                return .finishResponse(writeHeadFirst: false, backend: backend, keepAlive: keepAlive(closing: close || !clientBody.isComplete))
            case .holding(let bytes, let reason):
                let bodyless = bytes == 0 && !hasTrailers
                let held = HeldRejection.whole(bodyless: bodyless)
                switch reason {
                case .rejection:
                    return drainedRejection(held, backend: backend)
                case .nonceDemand:
                    return drainedResend(held, attempt: attempt, backend: backend)
                case .signedAnswer:
                    switch signedAnswer() {
                    case .credentialsRejected:
                        return drainedRejection(held, backend: backend)
                    case .clockSkew(serverTimeKnown: true) where resend == .available:
                        return drainedResend(held, attempt: attempt, backend: backend)
                    case .clockSkew, .signatureMismatch, .other:
                        // Relayed as it is: status, fields and body intact; nothing refreshed.
                        state = .finished
                        return .relayHeldAnswer(backend: backend, keepAlive: keepAlive(closing: !clientBody.isComplete), bodyless: bodyless)
                    }
                }
            }
        }

        /// The upstream connection failed (connect, TLS, reset, timeout, invalid response).
        /// `reusedConnection`: it came from the pool; `responseBytesSeen`: any byte of a response arrived;
        /// `unprocessed`: the upstream declared the request not acted on (HTTP/2 REFUSED_STREAM, a
        /// stream above a GOAWAY's last-stream-id, RFC 9113 §8.7), so even a non-idempotent
        /// request is retried once on a fresh connection.
        public mutating func upstreamFailed(_ failure: UpstreamFailure, reusedConnection: Bool, responseBytesSeen: Bool,
                                            unprocessed: Bool = false) -> Action {
            switch state {
            case .connecting(let attempt):
                return failBeforeResponse(failure, attempt: attempt, retryable: false)
            case .forwarding(let attempt, _, let response):
                switch response {
                case .awaitingHead:
                    // A pooled connection the upstream had closed: nothing of this request was
                    // processed. Retry once on a fresh connection when the body can be sent again.
                    let retryable = (reusedConnection || unprocessed) && !responseBytesSeen && !attempt.freshConnection
                        && keep.isKeeping && (setup.methodIdempotent || attempt.kind != .original || unprocessed)
                    return failBeforeResponse(failure, attempt: attempt, retryable: retryable)
                case .headPending:
                    // The head was never written: the client can still get a clean error.
                    state = .finished
                    return upstreamErrorAnswer(failure, closing: !clientBody.isComplete)
                case .streaming:
                    state = .finished
                    return .abortClient
                case .holding(_, let reason):
                    // The rejection is known; its body was cut. Go on as if it had drained
                    // (the connection is gone), and replay.
                    switch reason {
                    case .rejection:
                        return drainedRejection(.cut(failure), backend: .alreadyClosed)
                    case .nonceDemand:
                        return drainedResend(.cut(failure), attempt: attempt, backend: .alreadyClosed)
                    case .signedAnswer:
                        // What a cut answer said cannot be read: answered as the failure it is.
                        state = .finished
                        return upstreamErrorAnswer(failure, closing: !clientBody.isComplete)
                    }
                }
            case .tunnelling:
                state = .finished
                return .finishTunnel
            case .initial, .awaitingToken, .awaitingSignedBody, .collectingReplayBody, .awaitingReplayToken, .finished:
                return .none
            }
        }

        /// The session answered the rejection: replay with its newer token (provisionally when
        /// that token was requested before the session learned of the rejection), or pass the held
        /// rejection through (breaker open), or answer 503 (no newer token).
        public mutating func rejectionOutcome(_ outcome: RejectionVerdict) -> Action {
            guard case .awaitingReplayToken(let held) = state else { return .none }
            switch outcome {
            case .replay:
                replays += 1
                return connect(Attempt(kind: .replay, freshConnection: false))
            case .provisionalReplay:
                // Only the first replay may be provisional: the second is final whatever its token.
                replays += 1
                return connect(Attempt(kind: replays == 1 ? .provisionalReplay : .replay, freshConnection: false))
            case .passThrough:
                state = .finished
                switch held {
                case .whole(let bodyless):
                    return .sendHeldRejection(reason: nil, refreshOnly: false, keepAlive: keepAlive(closing: false), bodyless: bodyless)
                case .cut(let failure):
                    // A rejection whose body was cut cannot be relayed as it was: answer the failure.
                    return upstreamErrorAnswer(failure, closing: false)
                }
            case .tokenUnavailable:
                state = .finished
                return .respondTokenUnavailable(ErrorAnswer(tokenUnavailableFor: setup.grpc, keepAlive: keepAlive(closing: !clientBody.isComplete)))
            }
        }

        /// The upstream answered the upgrade request with 101 (RFC 9110 §15.2.2): both connections
        /// become one byte tunnel.
        public mutating func upstreamSwitchedProtocols() -> Action {
            guard case .forwarding(_, .sent, .awaitingHead) = state, setup.upgrade.isRequested else {
                if case .finished = state { return .none }
                state = .finished
                return upstreamErrorAnswer(.unexpectedSwitch, closing: true)
            }
            state = .tunnelling
            return .startTunnel
        }

        /// Bytes arrived from the client after the switch.
        public func clientTunnelBytes() -> Action {
            guard case .tunnelling = state else { return .none }
            return .relayTunnelBytes(.toUpstream)
        }

        /// Bytes arrived from the upstream after the switch.
        public func upstreamTunnelBytes() -> Action {
            guard case .tunnelling = state else { return .none }
            return .relayTunnelBytes(.toClient)
        }

        /// One side of the tunnel ended (EOF or error); the other is closed after its output drains.
        public mutating func tunnelEnded() -> Action {
            guard case .tunnelling = state else { return .none }
            state = .finished
            return .finishTunnel
        }

        /// The request about to go out on a signing route could not be signed (nothing was sent;
        /// the driver closed the connection): 400 for a target the signer refuses, 503 without keys.
        public mutating func signingFailed(_ failure: SigningFailure) -> Action {
            guard case .forwarding(_, _, .awaitingHead) = state else { return .none }
            state = .finished
            switch failure {
            case .invalidTarget:
                return .respondClientError(.unsignableTarget, keepAlive: keepAlive(closing: !clientBody.isComplete))
            case .noKeys:
                return .respondTokenUnavailable(ErrorAnswer(tokenUnavailableFor: setup.grpc, keepAlive: keepAlive(closing: !clientBody.isComplete)))
            }
        }

        /// The client closed or reset its connection, or stopped sending in time.
        public mutating func clientClosed() -> Action {
            if case .finished = state { return .none }
            state = .finished
            return .abortExchange
        }

        // MARK: helpers

        private mutating func connect(_ attempt: Attempt) -> Action {
            state = .connecting(attempt)
            return .acquireBackend(fresh: attempt.freshConnection)
        }

        private mutating func failBeforeResponse(_ failure: UpstreamFailure, attempt: Attempt, retryable: Bool) -> Action {
            if retryable {
                return connect(Attempt(kind: attempt.kind, freshConnection: true))
            }
            state = .finished
            return upstreamErrorAnswer(failure, closing: !clientBody.isComplete)
        }

        private mutating func updateKeep(adding count: Int) -> KeepAction {
            guard case .keeping(let bytes) = keep else { return .skip }
            let total = bytes.addingSaturating(count)
            if total > setup.replayBodyLimit {
                keep = .notKept
                return .release
            }
            keep = .keeping(bytes: total)
            return .append
        }

        private mutating func afterHoldingKeep(_ keepAction: KeepAction, attempt: Attempt, reason: HoldReason) -> Action {
            guard keepAction == .release else { return .keepClientBody(keepAction) }
            // The body outgrew replay_body_limit while the rejection was held: relay it after all.
            state = .forwarding(attempt, .abandoned, .streaming(closeClient: true))
            switch reason {
            case .rejection:
                return .releaseHeldRejection(reason: .notReplayable, keepAlive: keepAlive(closing: true))
            case .nonceDemand:
                resend = .used
                return .releaseHeldRejection(reason: .notTokenError, keepAlive: keepAlive(closing: true))
            case .signedAnswer:
                // Not read yet: relayed as it is, nothing refreshed.
                return .releaseHeldRejection(reason: nil, keepAlive: keepAlive(closing: true))
            }
        }

        /// A held rejection (or a signing route's credentials rejection) drained or was cut: ask
        /// the session for the replay's credentials now, or once the client's body is complete.
        private mutating func drainedRejection(_ held: HeldRejection, backend: BackendDisposal) -> Action {
            if clientBody.isComplete {
                state = .awaitingReplayToken(held)
                return .rejectionDrained(backend: backend, reportNow: true)
            }
            state = .collectingReplayBody(held)
            return .rejectionDrained(backend: backend == .alreadyClosed ? .alreadyClosed : .close, reportNow: false)
        }

        /// An answer worth the exchange's one resend (a nonce demand, a clock skew) drained or was
        /// cut: resend now, or once the client's body is complete.
        private mutating func drainedResend(_ held: HeldRejection, attempt: Attempt, backend: BackendDisposal) -> Action {
            if clientBody.isComplete {
                resend = .used
                state = .connecting(Attempt(kind: attempt.kind.afterResend, freshConnection: false))
                return .resendWithoutRefresh(backend: backend)
            }
            resend = .pending(attempt.kind)
            state = .collectingReplayBody(held)
            return .rejectionDrained(backend: backend == .alreadyClosed ? .alreadyClosed : .close, reportNow: false)
        }
    }
}

// MARK: - Types

extension ProxyExchange {
    /// Facts fixed when the exchange starts (route and request captured then; a reload never
    /// changes a running exchange).
    public struct Setup: Sendable, Equatable {
        public var hasBody: Bool
        public var clientSpeaksHTTP11: Bool
        public var expectsContinue: Bool
        public var hasSession: Bool
        public var replayBodyLimit: Int
        /// `reject_statuses` as a bit set: a value type without heap storage, so the whole
        /// machine is one (the driver holds it without exclusivity checks).
        public var rejectSet: StatusCodeSet
        public var rejectStatuses: [Int] {
            get { rejectSet.codes }
            set { rejectSet = StatusCodeSet(newValue) }
        }
        /// The method is in `replay_methods`.
        public var methodReplayable: Bool
        /// RFC 9110 §9.2.2: may be retried on a fresh connection after a stale pooled one.
        public var methodIdempotent: Bool
        /// A WebSocket handshake (`.none`: none): a 101 turns the exchange into a tunnel.
        public var upgrade: Upgrade
        /// A gRPC call (`content-type: application/grpc`): UNAUTHENTICATED is a rejection, and
        /// failures are answered in gRPC's form.
        public var grpc: Bool
        /// The route's session uses DPoP (RFC 9449): a 401 asking for a nonce is replayed once.
        public var dpop = false
        /// The route signs requests with its session's keys (`sign:`) instead of carrying a
        /// token: 400 and 403 answers are held and classified, `payload: signed` reads the whole
        /// body first (docs/architecture.md §6.15).
        public var signing: Signing = .none
        /// The client's connection may carry another request after this one (it asked for a
        /// persistent connection and the server is not draining).
        public var clientKeepAlive = true

        public init(hasBody: Bool, clientSpeaksHTTP11: Bool, expectsContinue: Bool, hasSession: Bool, replayBodyLimit: Int,
                    rejectStatuses: [Int], methodReplayable: Bool, methodIdempotent: Bool, upgrade: Upgrade = .none, grpc: Bool = false) {
            self.init(hasBody: hasBody, clientSpeaksHTTP11: clientSpeaksHTTP11, expectsContinue: expectsContinue, hasSession: hasSession,
                      replayBodyLimit: replayBodyLimit, rejectSet: StatusCodeSet(rejectStatuses), methodReplayable: methodReplayable,
                      methodIdempotent: methodIdempotent, upgrade: upgrade, grpc: grpc)
        }

        public init(hasBody: Bool, clientSpeaksHTTP11: Bool, expectsContinue: Bool, hasSession: Bool, replayBodyLimit: Int,
                    rejectSet: StatusCodeSet, methodReplayable: Bool, methodIdempotent: Bool, upgrade: Upgrade = .none, grpc: Bool = false) {
            self.upgrade = upgrade
            self.grpc = grpc
            self.hasBody = hasBody
            self.clientSpeaksHTTP11 = clientSpeaksHTTP11
            self.expectsContinue = expectsContinue
            self.hasSession = hasSession
            self.replayBodyLimit = replayBodyLimit
            self.rejectSet = rejectSet
            self.methodReplayable = methodReplayable
            self.methodIdempotent = methodIdempotent
        }

        /// RFC 9110 §9.2.2.
        public static func isIdempotent(_ method: String) -> Bool {
            switch method {
            case "GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE": return true
            default: return false
            }
        }
    }

    /// Which protocol switch a request asks for; it decides what an upstream's 2xx means.
    public enum Upgrade: Sendable, Equatable {
        case none
        /// An HTTP/1.1 `Upgrade: websocket` handshake (RFC 6455 §4.1). The upstream may decline
        /// by answering normally (RFC 9110 §7.8: a server may ignore `Upgrade`): that answer
        /// (200, 404, 426 …) is relayed as a response and the client's connection stays HTTP/1.1.
        case http1
        /// An HTTP/2 extended CONNECT (RFC 8441) sent upstream as an HTTP/1.1 handshake: only a
        /// 101 opens the tunnel, and a 2xx that is not one is never relayed (to the client it
        /// would mean the tunnel is open).
        case extendedConnect

        /// A switch is asked for: the upstream connection must be HTTP/1.1.
        public var isRequested: Bool { self != .none }
    }

    /// The one resend of an exchange that is not about the credentials, so nothing is
    /// refreshed: a DPoP nonce demand (RFC 9449 §9) answered with a fresh proof, or a signing
    /// route's clock-skew answer (`RequestTimeTooSkewed`) answered with a request signed again
    /// at the server's time (docs/architecture.md §6.15).
    public enum Resend: Sendable, Equatable {
        case available
        /// Decided for an answer to an attempt of that kind: waits for the rest of the client's
        /// body (`.collectingReplayBody`), then goes out.
        case pending(Attempt.Kind)
        case used
    }

    /// Why a final response head is held back while its body drains (`Response.holding`).
    public enum HoldReason: Sendable, Equatable {
        /// One of `reject_statuses` on a token route: the token is reported and the request
        /// replayed with a newer one (docs/architecture.md §6).
        case rejection
        /// A DPoP route's 401 asking for a nonce (RFC 9449 §9): resent once with it.
        case nonceDemand
        /// A signing route's 400 or 403: what it means is read from its held body once it ended
        /// (`SignedAnswer`, docs/architecture.md §6.15).
        case signedAnswer
    }

    /// How a route's requests are signed (docs/architecture.md §6.15), as the exchange needs it.
    public enum Signing: Sendable, Equatable {
        /// Not a signing route: a token is injected (if the route has a session).
        case none
        /// `UNSIGNED-PAYLOAD`: the body streams as on any route.
        case unsignedPayload
        /// The body's SHA-256 is in the signature: the whole body is read (into the kept copy,
        /// up to replay_body_limit) before the request is signed and sent.
        case signedPayload

        public var signs: Bool { self != .none }
    }

    /// A held signing-route answer as the driver classified its bytes
    /// (`SignedResponseVerdict.classify`): the machine's input, without the codes and texts the
    /// driver logs.
    public enum SignedAnswer: Sendable, Equatable {
        /// `ExpiredToken`, `InvalidAccessKeyId`, …: the rejection path (refresh once, replay once).
        case credentialsRejected
        /// `RequestTimeTooSkewed` and kin; `serverTimeKnown`: the server's time was read and
        /// adopted, so one resend signed again can succeed.
        case clockSkew(serverTimeKnown: Bool)
        /// `SignatureDoesNotMatch`: never replayed.
        case signatureMismatch
        /// Not an error, or another error: relayed as it is.
        case other

        public init(_ verdict: SignedResponseVerdict) {
            switch verdict {
            case .credentialsRejected: self = .credentialsRejected
            case .clockSkew(_, let server): self = .clockSkew(serverTimeKnown: server != nil)
            case .signatureMismatch: self = .signatureMismatch
            case .notAnError, .otherError: self = .other
            }
        }
    }

    /// Why a request is answered by bearerd with a client error before it was sent.
    public enum ClientError: Sendable, Equatable {
        /// `payload: signed` and a body over replay_body_limit: 413.
        case signedPayloadTooLarge
        /// The target cannot be signed (a `%` not followed by two hex digits): 400.
        case unsignableTarget

        public var status: Int {
            switch self {
            case .signedPayloadTooLarge: 413
            case .unsignableTarget: 400
            }
        }
    }

    /// Why the driver could not sign the request it was about to send.
    public enum SigningFailure: Sendable, Equatable {
        /// `RequestSigning` refused the target (the client's fault).
        case invalidTarget
        /// The session's token carries no signing keys.
        case noKeys
    }

    public enum State: Sendable, Equatable {
        case initial
        case awaitingToken
        /// `payload: signed`: the token is here; the rest of the client's body is read into the
        /// kept copy before the request can be signed (its hash is in the signature).
        case awaitingSignedBody
        case connecting(Attempt)
        case forwarding(Attempt, UpstreamBody, Response)
        /// The rejection drained (or its connection failed first); the rest of the client's body
        /// is being read into the kept copy.
        case collectingReplayBody(HeldRejection)
        /// The rejection drained and the body is complete: the session decides on the replay.
        case awaitingReplayToken(HeldRejection)
        /// After a 101: bytes flow both ways unparsed until one side ends.
        case tunnelling
        case finished
    }

    /// A rejection kept back while the session decides on the replay.
    public enum HeldRejection: Sendable, Equatable {
        /// Its whole response is held; `bodyless`: neither body bytes nor trailers (relayed as a
        /// head alone: one HEADERS frame with END_STREAM on HTTP/2).
        case whole(bodyless: Bool)
        /// Its connection failed while it drained: it cannot be relayed as it was, so relaying
        /// it means answering this failure.
        case cut(UpstreamFailure)
    }

    public struct Attempt: Sendable, Equatable {
        /// `provisionalReplay`: a replay whose token was requested before the session learned of
        /// the rejection (`RejectionVerdict.provisionalReplay`); its rejection is replayed once more.
        /// `resend…`: the attempt sent again without a refresh (the exchange's one `Resend`: a
        /// DPoP nonce, RFC 9449 §9, or a signing route's clock-skew answer) after such an answer
        /// to the original, a final or a provisional replay (which stays spent).
        public enum Kind: Sendable, Equatable {
            case original, replay, provisionalReplay, resend, resendOfReplay, resendOfProvisionalReplay
            /// The final rejection replay was used: a second rejection goes to the client.
            public var isTokenReplay: Bool { self == .replay || self == .resendOfReplay }
            /// A rejection was replayed (finally or provisionally).
            public var isReplay: Bool {
                switch self {
                case .replay, .provisionalReplay, .resendOfReplay, .resendOfProvisionalReplay: true
                case .original, .resend: false
                }
            }
            /// The attempt that follows a resend-worthy answer (nonce demand, clock skew) to this one.
            public var afterResend: Kind {
                switch self {
                case .original, .resend: .resend
                case .replay, .resendOfReplay: .resendOfReplay
                case .provisionalReplay, .resendOfProvisionalReplay: .resendOfProvisionalReplay
                }
            }
        }
        public var kind: Kind
        /// A retry after a pooled connection turned out closed: open a new one.
        public var freshConnection: Bool
    }

    /// The request body as sent on the current attempt's connection.
    public enum UpstreamBody: Sendable, Equatable {
        case sending
        case sent
        /// A rejection arrived before the body was fully sent: no more goes out on this connection.
        case abandoned
    }

    public enum Response: Sendable, Equatable {
        case awaitingHead
        /// A final head arrived and is not yet written to the client.
        case headPending
        /// The head went to the client; `closeClient`: it said `Connection: close`.
        case streaming(closeClient: Bool)
        /// An answer kept back while it drains, for `HoldReason`: `bytes` of its body held.
        case holding(bytes: Int, HoldReason)
    }

    public enum ClientBody: Sendable, Equatable {
        case streaming(received: Int)
        case complete

        public var isComplete: Bool {
            if case .complete = self { return true }
            return false
        }
    }

    public enum Keep: Sendable, Equatable {
        /// Every body byte so far is in the kept copy (`bytes` ≤ replay_body_limit).
        case keeping(bytes: Int)
        case notKept

        public var isKeeping: Bool {
            if case .keeping = self { return true }
            return false
        }
    }

    public enum ContinueState: Sendable, Equatable { case notExpected, expected, sent }

    public enum KeepAction: Sendable, Equatable {
        /// Append the chunk to the kept copy.
        case append
        /// Not keeping.
        case skip
        /// The body outgrew replay_body_limit: free the kept copy.
        case release
    }

    /// What the upstream failure was, for the client's answer (`ErrorAnswer`). The human
    /// detail (an OS error, a TLS alert) is the driver's text; the kind is all a decision needs.
    public enum UpstreamFailure: Sendable, Equatable {
        /// Connection refused, unreachable, reset, or closed before a response.
        case unreachable
        case timeout
        case tls
        /// A response that is not HTTP as the parser knows it.
        case invalidResponse
        /// An extended CONNECT answered 2xx instead of 101 (not relayed: RFC 8441 §5).
        case upgradeNotSwitched
        /// A 101 to a request that asked for no upgrade.
        case unexpectedSwitch
        /// No DPoP proof could be signed for the request (RFC 9449 §4): nothing was sent.
        case proofUnavailable
        /// The outbound proxy answered CONNECT with 407 (RFC 9110 §15.5.8): its credentials
        /// are missing or wrong, which only the operator can fix.
        case outboundProxyAuthRequired

        /// An outbound proxy that did not open the CONNECT tunnel: `status` its final answer, nil
        /// when it could not be reached or closed without one. 407 asks for proxy credentials;
        /// so does a 401 to CONNECT (tinyproxy answers wrong credentials so), since only the proxy
        /// has seen the request. Any other status, or none, is an unreachable upstream.
        public init(outboundProxyRefusal status: Int?) {
            self = status == 407 || status == 401 ? .outboundProxyAuthRequired : .unreachable
        }
    }

    /// bearerd's own answer in place of an upstream response (docs/architecture.md §5): 502/503/504 with a
    /// JSON body, or for a gRPC client a trailers-only response with `grpc-status` `grpc`.
    /// Three bytes, so every `Action` still fits in a register.
    public struct ErrorAnswer: Sendable, Equatable {
        /// The JSON body's `error` and the metric it counts in; it fixes the status.
        public var kind: UpstreamErrorKind
        /// Set for gRPC clients, which read the status from `grpc-status`, not from a JSON body.
        public var grpc: ErrorResponse.GRPCCode?
        /// The client connection may carry another request afterwards.
        public var keepAlive: Bool

        /// 503 without a token, 504 for an upstream timeout, 502 for every other failure.
        public var status: Int {
            switch kind {
            case .tokenUnavailable: 503
            case .upstreamTimeout: 504
            case .upstreamUnreachable, .upstreamTLS, .upstreamInvalidResponse, .outboundProxyAuthRequired: 502
            }
        }

        public init(kind: UpstreamErrorKind, grpc: ErrorResponse.GRPCCode?, keepAlive: Bool) {
            self.kind = kind
            self.grpc = grpc
            self.keepAlive = keepAlive
        }

        /// An upstream failure: 504 for a timeout (gRPC DEADLINE_EXCEEDED), 502 otherwise
        /// (gRPC UNAVAILABLE).
        public init(upstream failure: UpstreamFailure, grpc: Bool, keepAlive: Bool) {
            let kind: UpstreamErrorKind
            switch failure {
            case .timeout: kind = .upstreamTimeout
            case .tls: kind = .upstreamTLS
            case .unreachable: kind = .upstreamUnreachable
            case .outboundProxyAuthRequired: kind = .outboundProxyAuthRequired
            case .invalidResponse, .upgradeNotSwitched, .unexpectedSwitch, .proofUnavailable: kind = .upstreamInvalidResponse
            }
            self.init(kind: kind, grpc: grpc ? (kind == .upstreamTimeout ? .deadlineExceeded : .unavailable) : nil, keepAlive: keepAlive)
        }

        /// No token (docs/architecture.md §5 and §6): 503 with Retry-After (gRPC UNAVAILABLE); the upstream is not called.
        public init(tokenUnavailableFor grpc: Bool, keepAlive: Bool) {
            self.init(kind: .tokenUnavailable, grpc: grpc ? .unavailable : nil, keepAlive: keepAlive)
        }
    }

    /// Which way tunnel bytes go.
    public enum TunnelDirection: Sendable, Equatable { case toUpstream, toClient }

    public enum BackendDisposal: Sendable, Equatable {
        /// Back to the pool (request fully sent, response fully read).
        case release
        case close
        /// The connection failed and is gone already.
        case alreadyClosed
    }

    /// The session's answer to a held rejection: replay with a newer token, relay the
    /// rejection (breaker open), or answer 503 (no newer token within the wait bound).
    public enum RejectionVerdict: Sendable, Equatable {
        /// Replay with a token requested after the session learned of the rejection: a
        /// rejection of this replay goes to the client (docs/architecture.md §6 "A replayed request that is
        /// rejected again goes to the client").
        case replay
        /// Replay with a token the session requested *before* it learned of the rejection (its
        /// current token, for a request that carried an older generation; or a fetch already in
        /// flight). One revocation can kill both tokens, so a rejection of this replay is not yet
        /// "rejected again": it is the first news about the replay's token, and the request is
        /// replayed once more. At most once per request: a second replay is always final.
        case provisionalReplay
        case passThrough
        case tokenUnavailable
    }

    public struct SendRequest: Sendable, Equatable {
        public enum Body: Sendable, Equatable {
            /// The body bytes buffered while connecting (first attempt).
            case pending
            /// The kept copy (a retry or a replay).
            case kept
        }
        public var body: Body
        /// The client's body is complete: end it after the bytes above.
        public var endBody: Bool
        /// Send `100 Continue` to the client (RFC 9110 §10.1.1: we asked for the body).
        public var sendContinue: Bool
    }

    /// What the driver does next. Each input returns exactly one.
    public enum Action: Sendable, Equatable {
        case none
        /// Ask the route's session for a token (at once if one is usable).
        case acquireToken
        /// Get an upstream connection (`fresh`: never a pooled one).
        case acquireBackend(fresh: Bool)
        /// The exchange no longer needs the connection that just became ready.
        case closeUnusedBackend
        /// Send the head (with the current token) and the body described.
        case sendRequest(SendRequest)
        /// A client body chunk: write it upstream now.
        case forwardClientBody(keep: KeepAction)
        /// A client body chunk: buffer it until the upstream connection is ready.
        case bufferClientBody(keep: KeepAction)
        /// A client body chunk: only the kept copy may take it (or nothing).
        case keepClientBody(KeepAction)
        case discardClientBody
        /// Write the last chunk (with trailers) of a chunked request body upstream.
        case endUpstreamBody
        /// Write this 1xx head to the client.
        case relayInformational
        /// A rejection that will not be replayed: count `reason`; `refreshOnly`: tell the session
        /// so later requests get a fresh token. The head is then relayed like any other.
        case rejectionNotReplayed(reason: ReplayPolicy.Reason, refreshOnly: Bool)
        /// Keep the rejection's head back; its body follows into the held buffer.
        case holdRejection
        case holdRejectionBody
        /// Write the held rejection (head and held body), then this chunk; relay the rest.
        /// `reason` (when set) is counted, and unless it is `.notTokenError` the session is told
        /// so later requests get fresh credentials.
        case releaseHeldRejection(reason: ReplayPolicy.Reason?, keepAlive: Bool)
        /// The held rejection ended. Dispose of the backend; `reportNow`: the client's body is
        /// complete, ask the session (`reportRejected`) for the token to replay with.
        case rejectionDrained(backend: BackendDisposal, reportNow: Bool)
        /// The client's body completed while the rejection was held: ask the session now.
        case reportRejection
        /// Write the whole held rejection to the client and finish. `reason` (when set) is counted;
        /// `refreshOnly`: tell the session about the rejection without waiting; `bodyless`: the
        /// head alone is the whole response (no body bytes, no trailers).
        case sendHeldRejection(reason: ReplayPolicy.Reason?, refreshOnly: Bool, keepAlive: Bool, bodyless: Bool)
        /// Write the pending response head now (`keepAlive` as the head says it).
        case writeResponseHead(keepAlive: Bool)
        /// Relay a response body chunk (after the pending head when `writeHeadFirst`).
        case forwardResponseBody(writeHeadFirst: Bool, keepAlive: Bool)
        /// The response is complete: end it for the client (its trailers), dispose of the backend,
        /// finish; the client connection may carry another request when `keepAlive`.
        case finishResponse(writeHeadFirst: Bool, backend: BackendDisposal, keepAlive: Bool)
        /// 503 `token_unavailable` (the answer says how) and finish.
        case respondTokenUnavailable(ErrorAnswer)
        /// bearerd's 401 for the caller (gRPC clients: UNAUTHENTICATED); the upstream is not called.
        case respondCallerRefused(keepAlive: Bool, grpc: Bool)
        /// An answer worth one resend without a refresh drained (dispose of its connection as
        /// said): acquire a connection for the resend, which is signed again (a DPoP proof with
        /// the nonce from `DPoP-Nonce`; a signature at the adopted server time).
        case resendWithoutRefresh(backend: BackendDisposal)
        /// A held signing-route answer ended and is not replayed: dispose of its connection,
        /// write its head, held body and these trailers to the client, finish.
        case relayHeldAnswer(backend: BackendDisposal, keepAlive: Bool, bodyless: Bool)
        /// `payload: signed`: read the rest of the client's body before connecting (after
        /// sending `100 Continue` when `sendContinue`; RFC 9110 §10.1.1).
        case awaitClientBody(sendContinue: Bool)
        /// Answer the client's error (JSON 4xx), close the backend if one is held, finish.
        case respondClientError(ClientError, keepAlive: Bool)
        /// Answer `failure` as the core decided (502/504, JSON or gRPC), close the backend if one
        /// is still held, and finish.
        case respondUpstreamError(UpstreamFailure, ErrorAnswer)
        /// The response was already under way: close the client connection (truncated response).
        case abortClient
        /// The client is gone: close the backend, finish.
        case abortExchange
        /// Relay the 101 and join the two connections into a byte tunnel.
        case startTunnel
        /// Tunnel bytes that just arrived: write them to the other side.
        case relayTunnelBytes(TunnelDirection)
        /// The tunnel is over: close both sides once their output drained, finish.
        case finishTunnel
    }
}

extension Int {
    @inline(__always)
    func addingSaturating(_ other: Int) -> Int {
        let (r, o) = addingReportingOverflow(other)
        return o ? (other > 0 ? .max : .min) : r
    }
}

/// A set of HTTP status codes (three digits, 0–999: what a status line can carry), as bits:
/// trivially copyable, no heap storage. Codes outside 0–999 are not representable and never
/// members (`reject_statuses` accepts 400–599 only).
public struct StatusCodeSet: Sendable, Equatable {
    private var words: (UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64,
                        UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64, UInt64) =
        (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)

    public init(_ codes: [Int]) {
        for c in codes where c >= 0 && c < 1000 {
            withUnsafeMutableBytes(of: &words) { raw in
                let w = raw.bindMemory(to: UInt64.self)
                w[c >> 6] |= 1 << UInt64(c & 63)
            }
        }
    }

    public func contains(_ code: Int) -> Bool {
        guard code >= 0 && code < 1000 else { return false }
        return withUnsafeBytes(of: words) { raw in
            raw.load(fromByteOffset: (code >> 6) * 8, as: UInt64.self) & (1 << UInt64(code & 63)) != 0
        }
    }

    /// The members in ascending order.
    public var codes: [Int] { (0..<1000).filter(contains) }

    public static func == (a: StatusCodeSet, b: StatusCodeSet) -> Bool {
        withUnsafeBytes(of: a.words) { x in withUnsafeBytes(of: b.words) { y in x.elementsEqual(y) } }
    }
}
