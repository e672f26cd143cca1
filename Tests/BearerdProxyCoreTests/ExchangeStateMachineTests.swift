import Testing
import BearerdOAuth
import BearerdHTTP
@testable import BearerdProxyCore

typealias Machine = ProxyExchange.StateMachine

extension ProxyExchange.Action {
    /// The answer for `failure` to a client that is not a gRPC one.
    static func upstreamError(_ failure: ProxyExchange.UpstreamFailure, closeClient: Bool) -> Self {
        .respondUpstreamError(failure, .init(upstream: failure, grpc: false, keepAlive: !closeClient))
    }
    static func tokenError(closeClient: Bool) -> Self {
        .respondTokenUnavailable(.init(tokenUnavailableFor: false, keepAlive: !closeClient))
    }
}

func setup(body: Bool = false, http11: Bool = true, expect: Bool = false, session: Bool = true, limit: Int = 1 << 20,
           reject: [Int] = [401], methodReplayable: Bool = true, idempotent: Bool = true) -> ProxyExchange.Setup {
    ProxyExchange.Setup(hasBody: body, clientSpeaksHTTP11: http11, expectsContinue: expect, hasSession: session,
                        replayBodyLimit: limit, rejectStatuses: reject, methodReplayable: methodReplayable,
                        methodIdempotent: idempotent)
}

/// Drives a machine to `.forwarding` with the original attempt's head sent.
func forwarding(_ s: ProxyExchange.Setup) -> Machine {
    var m = Machine(setup: s)
    if s.hasSession {
        #expect(m.start() == .acquireToken)
        #expect(m.tokenAcquired() == .acquireBackend(fresh: false))
    } else {
        #expect(m.start() == .acquireBackend(fresh: false))
    }
    _ = m.backendAcquired()
    return m
}

@Suite("ProxyExchange.StateMachine: scripted exchanges")
struct ExchangeScriptTests {
    @Test func plainGetWithoutSession() {
        var m = Machine(setup: setup(session: false))
        #expect(m.start() == .acquireBackend(fresh: false))
        #expect(m.backendAcquired() == .sendRequest(.init(body: .pending, endBody: false, sendContinue: false)))
        #expect(m.upstreamFinalHead(status: 200, wwwAuthenticate: { Issue.record("not a rejection"); return [] }) == .none)
        #expect(m.upstreamBodyReceived(count: 10) == .forwardResponseBody(writeHeadFirst: true, keepAlive: true))
        #expect(m.upstreamBodyReceived(count: 10) == .forwardResponseBody(writeHeadFirst: false, keepAlive: true))
        #expect(m.upstreamEnded() == .finishResponse(writeHeadFirst: false, backend: .release, keepAlive: true))
        #expect(m.isFinished)
    }

    @Test func headAloneIsWrittenAtTheEndOfTheRead() {
        var m = forwarding(setup())
        #expect(m.upstreamFinalHead(status: 200, wwwAuthenticate: { [] }) == .none)
        #expect(m.upstreamReadComplete() == .writeResponseHead(keepAlive: true))
        #expect(m.upstreamReadComplete() == .none)
        #expect(m.upstreamEnded() == .finishResponse(writeHeadFirst: false, backend: .release, keepAlive: true))
    }

    /// Item 12: a framing error in the same read as the head still gets a clean 502.
    @Test func failureAfterHeadInSameReadIsAnError() {
        var m = forwarding(setup())
        _ = m.upstreamFinalHead(status: 200, wwwAuthenticate: { [] })
        #expect(m.upstreamFailed(.invalidResponse, reusedConnection: false, responseBytesSeen: true) == .upstreamError(.invalidResponse, closeClient: false))
        #expect(m.isFinished)
    }

    @Test func failureAfterHeadWrittenAbortsTheClient() {
        var m = forwarding(setup())
        _ = m.upstreamFinalHead(status: 200, wwwAuthenticate: { [] })
        _ = m.upstreamReadComplete()
        #expect(m.upstreamFailed(.invalidResponse, reusedConnection: false, responseBytesSeen: true) == .abortClient)
    }

    @Test func tokenUnavailableIs503AndClosesWhenBodyIsUnread() {
        var m = Machine(setup: setup(body: true))
        #expect(m.start() == .acquireToken)
        #expect(m.tokenUnavailable() == .tokenError(closeClient: true))
        #expect(m.tokenAcquired() == .none)
        var n = Machine(setup: setup())
        _ = n.start()
        #expect(n.tokenUnavailable() == .tokenError(closeClient: false))
    }

    @Test func bodyBufferedWhileConnectingThenSent() {
        var m = Machine(setup: setup(body: true, session: false))
        _ = m.start()
        #expect(m.clientBodyReceived(count: 100) == .bufferClientBody(keep: .skip))
        #expect(m.pendingBytes == 100)
        #expect(m.wantsClientBody)
        #expect(m.clientBodyReceived(count: Machine.pendingLimit) == .bufferClientBody(keep: .skip))
        #expect(!m.wantsClientBody, "the client is paused while the pending buffer is full")
        #expect(m.backendAcquired() == .sendRequest(.init(body: .pending, endBody: false, sendContinue: false)))
        #expect(m.wantsClientBody)
        #expect(m.clientBodyReceived(count: 5) == .forwardClientBody(keep: .skip))
        #expect(m.clientBodyEnded() == .endUpstreamBody)
        _ = m.upstreamFinalHead(status: 201, wwwAuthenticate: { [] })
        #expect(m.upstreamEnded() == .finishResponse(writeHeadFirst: true, backend: .release, keepAlive: true))
    }

    /// An early answer (not a rejection) while the body still streams: relayed, the client
    /// connection closes afterwards and the upstream connection is not pooled.
    @Test func earlyAnswerWhileUploading() {
        var m = forwarding(setup(body: true, session: false))
        #expect(m.clientBodyReceived(count: 10) == .forwardClientBody(keep: .skip))
        _ = m.upstreamFinalHead(status: 413, wwwAuthenticate: { [] })
        #expect(m.upstreamReadComplete() == .writeResponseHead(keepAlive: false))
        #expect(m.upstreamEnded() == .finishResponse(writeHeadFirst: false, backend: .close, keepAlive: false))
    }

    // MARK: Expect: 100-continue and 1xx

    @Test func continueOnlyForHTTP11Clients() {
        var m11 = forwarding(setup(body: true, http11: true, expect: true))
        #expect(m11.continueState == .sent)
        var m10 = Machine(setup: setup(body: true, http11: false, expect: true))
        _ = m10.start()
        _ = m10.tokenAcquired()
        #expect(m10.backendAcquired() == .sendRequest(.init(body: .pending, endBody: false, sendContinue: false)))
        #expect(m10.upstreamInformationalHead(status: 100) == .none)
        #expect(m10.upstreamInformationalHead(status: 103) == .none)
        #expect(m11.upstreamInformationalHead(status: 100) == .none, "100 is ours to send")
        #expect(m11.upstreamInformationalHead(status: 103) == .relayInformational)
    }

    @Test func continueIsNotSentWhenTheBodyAlreadyArrived() {
        var m = Machine(setup: setup(body: true, expect: true))
        _ = m.start()
        _ = m.clientBodyReceived(count: 3)
        _ = m.clientBodyEnded()
        _ = m.tokenAcquired()
        #expect(m.backendAcquired() == .sendRequest(.init(body: .pending, endBody: true, sendContinue: false)))
    }

    // MARK: 401 → replay (docs/architecture.md §6)

    @Test func rejectionOfABodilessRequestIsReplayed() {
        var m = forwarding(setup())
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { [#"Bearer error="invalid_token""#] }) == .holdRejection)
        #expect(m.upstreamBodyReceived(count: 20) == .holdRejectionBody)
        #expect(m.upstreamEnded() == .rejectionDrained(backend: .release, reportNow: true))
        #expect(m.rejectionOutcome(.replay) == .acquireBackend(fresh: false))
        #expect(m.isReplay)
        #expect(m.backendAcquired() == .sendRequest(.init(body: .kept, endBody: false, sendContinue: false)))
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] }) == .rejectionNotReplayed(reason: .rejectedAgain, refreshOnly: false))
        #expect(m.upstreamEnded() == .finishResponse(writeHeadFirst: true, backend: .release, keepAlive: true))
    }

    /// docs/architecture.md §6, the soak's lost request: the request carried generation 1, the session's current
    /// token (generation 2, requested before the rejection was known) was revoked by the same
    /// revoke-all. The provisional replay's rejection is the first news about generation 2: it is
    /// held and reported like a first rejection, and the second replay is final.
    @Test func aRejectedProvisionalReplayIsReplayedOnceMore() {
        var m = forwarding(setup())
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] }) == .holdRejection)
        #expect(m.upstreamEnded() == .rejectionDrained(backend: .release, reportNow: true))
        #expect(m.rejectionOutcome(.provisionalReplay) == .acquireBackend(fresh: false))
        #expect(m.isReplay && m.replays == 1)
        #expect(m.backendAcquired() == .sendRequest(.init(body: .kept, endBody: false, sendContinue: false)))
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { [#"Bearer error="invalid_token""#] }) == .holdRejection)
        #expect(m.upstreamEnded() == .rejectionDrained(backend: .release, reportNow: true))
        // The session hands out an earlier token again: the second replay is final all the same.
        #expect(m.rejectionOutcome(.provisionalReplay) == .acquireBackend(fresh: false))
        #expect(m.replays == 2)
        _ = m.backendAcquired()
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] }) == .rejectionNotReplayed(reason: .rejectedAgain, refreshOnly: false))
        #expect(m.upstreamEnded() == .finishResponse(writeHeadFirst: true, backend: .release, keepAlive: true))
    }

    /// A replay whose token was requested after the rejection was known is final at once.
    @Test func aRejectedFinalReplayGoesToTheClient() {
        var m = forwarding(setup())
        _ = m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] })
        _ = m.upstreamEnded()
        #expect(m.rejectionOutcome(.replay) == .acquireBackend(fresh: false))
        _ = m.backendAcquired()
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] }) == .rejectionNotReplayed(reason: .rejectedAgain, refreshOnly: false))
        #expect(m.replays == 1)
    }

    /// A provisional replay whose pooled connection turns out closed is retried on a fresh one,
    /// like any replay (its body is kept), even for a method that is not idempotent.
    @Test func aProvisionalReplayOnAClosedPooledConnectionIsRetried() {
        var m = forwarding(setup(body: true, limit: 1000, idempotent: false))
        _ = m.clientBodyReceived(count: 10)
        _ = m.clientBodyEnded()
        _ = m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] })
        _ = m.upstreamEnded()
        #expect(m.rejectionOutcome(.provisionalReplay) == .acquireBackend(fresh: false))
        _ = m.backendAcquired()
        #expect(m.upstreamFailed(.unreachable, reusedConnection: true, responseBytesSeen: false) == .acquireBackend(fresh: true))
    }

    /// docs/architecture.md §6: no newer token within the wait bound answers the held rejection with the 503,
    /// never the upstream's 401.
    @Test func tokenUnavailableAnswersTheHeldRejectionWith503() {
        var m = forwarding(setup())
        _ = m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] })
        _ = m.upstreamEnded()
        #expect(m.rejectionOutcome(.tokenUnavailable) == .tokenError(closeClient: false))
        #expect(m.rejectionOutcome(.replay) == .none)
    }

    @Test func passThroughSendsTheHeldRejection() {
        var m = forwarding(setup())
        _ = m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] })
        _ = m.upstreamEnded()
        #expect(m.rejectionOutcome(.passThrough) == .sendHeldRejection(reason: nil, refreshOnly: false, keepAlive: true, bodyless: true))
        #expect(m.isFinished)
    }

    /// Item 6: the upstream rejects before the body is fully sent. The rejection is held, the rest
    /// of the body goes only into the kept copy, and the replay sends all of it.
    @Test func rejectionWhileBodyStreamsIsHeldUntilTheBodyIsComplete() {
        var m = forwarding(setup(body: true, limit: 1000))
        #expect(m.clientBodyReceived(count: 100) == .forwardClientBody(keep: .append))
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] }) == .holdRejection)
        #expect(m.clientBodyReceived(count: 100) == .keepClientBody(.append), "nothing more goes to the rejecting upstream")
        #expect(m.upstreamEnded() == .rejectionDrained(backend: .close, reportNow: false))
        #expect(m.clientBodyReceived(count: 100) == .keepClientBody(.append))
        #expect(m.clientBodyEnded() == .reportRejection)
        #expect(m.rejectionOutcome(.replay) == .acquireBackend(fresh: false))
        #expect(m.backendAcquired() == .sendRequest(.init(body: .kept, endBody: true, sendContinue: false)))
        _ = m.upstreamFinalHead(status: 200, wwwAuthenticate: { [] })
        #expect(m.upstreamEnded() == .finishResponse(writeHeadFirst: true, backend: .release, keepAlive: true))
    }

    @Test func bodyEndsBeforeTheHeldRejectionDrains() {
        var m = forwarding(setup(body: true))
        _ = m.clientBodyReceived(count: 10)
        _ = m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] })
        #expect(m.clientBodyEnded() == .none, "no last chunk to a rejecting upstream")
        #expect(m.upstreamEnded() == .rejectionDrained(backend: .close, reportNow: true))
    }

    @Test func bodyOutgrowsTheLimitWhileHeld() {
        var m = forwarding(setup(body: true, limit: 150))
        _ = m.clientBodyReceived(count: 100)
        _ = m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] })
        #expect(m.clientBodyReceived(count: 100) == .releaseHeldRejection(reason: .notReplayable, keepAlive: false))
        #expect(m.clientBodyReceived(count: 100) == .discardClientBody)
        #expect(m.upstreamEnded() == .finishResponse(writeHeadFirst: false, backend: .close, keepAlive: false))
    }

    @Test func bodyOutgrowsTheLimitAfterTheRejectionDrained() {
        var m = forwarding(setup(body: true, limit: 150))
        _ = m.clientBodyReceived(count: 100)
        _ = m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] })
        _ = m.upstreamEnded()
        #expect(m.clientBodyReceived(count: 100) == .sendHeldRejection(reason: .notReplayable, refreshOnly: true, keepAlive: false, bodyless: true))
        #expect(m.isFinished)
    }

    @Test func bodyAlreadyOverTheLimitIsRefreshOnly() {
        var m = forwarding(setup(body: true, limit: 50))
        #expect(m.clientBodyReceived(count: 100) == .forwardClientBody(keep: .release))
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] }) == .rejectionNotReplayed(reason: .notReplayable, refreshOnly: true))
    }

    @Test func largeRejectionBodyIsRelayed() {
        var m = forwarding(setup())
        _ = m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] })
        #expect(m.upstreamBodyReceived(count: Machine.heldRejectionLimit) == .holdRejectionBody)
        #expect(m.upstreamBodyReceived(count: 1) == .releaseHeldRejection(reason: .rejectionTooLarge, keepAlive: true))
        #expect(m.upstreamBodyReceived(count: 1) == .forwardResponseBody(writeHeadFirst: false, keepAlive: true))
        #expect(m.upstreamEnded() == .finishResponse(writeHeadFirst: false, backend: .release, keepAlive: true))
    }

    @Test func insufficientScopeAndOtherStatusesAreRelayed() {
        var m = forwarding(setup())
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { [#"Bearer error="insufficient_scope""#] })
                == .rejectionNotReplayed(reason: .notTokenError, refreshOnly: false))
        var n = forwarding(setup(reject: [401, 403]))
        #expect(n.upstreamFinalHead(status: 403, wwwAuthenticate: { [] }) == .holdRejection)
        var o = forwarding(setup(session: false))
        #expect(o.upstreamFinalHead(status: 401, wwwAuthenticate: { [] }) == .none)
        var p = forwarding(setup(methodReplayable: false))
        #expect(p.upstreamFinalHead(status: 401, wwwAuthenticate: { [] }) == .rejectionNotReplayed(reason: .methodNotAllowed, refreshOnly: true))
    }

    @Test func connectionCutWhileDrainingTheRejectionStillReplays() {
        var m = forwarding(setup())
        _ = m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] })
        #expect(m.upstreamFailed(.unreachable, reusedConnection: false, responseBytesSeen: true)
                == .rejectionDrained(backend: .alreadyClosed, reportNow: true))
        // Its body was cut, so if the session gives no token the client gets an error, not half a 401.
        var n = m
        #expect(n.rejectionOutcome(.passThrough) == .upstreamError(.unreachable, closeClient: false))
        #expect(m.rejectionOutcome(.replay) == .acquireBackend(fresh: false))
    }

    // MARK: stale pooled connections

    @Test func stalePooledConnectionIsRetriedOnceOnAFreshOne() {
        var m = forwarding(setup())
        #expect(m.upstreamFailed(.unreachable, reusedConnection: true, responseBytesSeen: false) == .acquireBackend(fresh: true))
        #expect(m.backendAcquired() == .sendRequest(.init(body: .kept, endBody: false, sendContinue: false)))
        #expect(m.upstreamFailed(.unreachable, reusedConnection: false, responseBytesSeen: false) == .upstreamError(.unreachable, closeClient: false))
    }

    @Test func replayOnAStalePooledConnectionIsRetried() {
        var m = forwarding(setup(body: true, idempotent: false))
        _ = m.clientBodyReceived(count: 10)
        _ = m.clientBodyEnded()
        _ = m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] })
        _ = m.upstreamEnded()
        _ = m.rejectionOutcome(.replay)
        _ = m.backendAcquired()
        #expect(m.upstreamFailed(.unreachable, reusedConnection: true, responseBytesSeen: false) == .acquireBackend(fresh: true))
        #expect(m.backendAcquired() == .sendRequest(.init(body: .kept, endBody: true, sendContinue: false)))
        #expect(m.isReplay)
    }

    @Test func nonIdempotentFirstAttemptIsNotRetried() {
        var m = forwarding(setup(body: true, idempotent: false))
        #expect(m.upstreamFailed(.unreachable, reusedConnection: true, responseBytesSeen: false) == .upstreamError(.unreachable, closeClient: true))
    }

    @Test func bodyWithoutKeptCopyIsNotRetried() {
        var m = forwarding(setup(body: true, session: false))
        _ = m.clientBodyReceived(count: 10)
        #expect(m.upstreamFailed(.unreachable, reusedConnection: true, responseBytesSeen: false) == .upstreamError(.unreachable, closeClient: true))
    }

    @Test func clientGoneStopsEverything() {
        var m = Machine(setup: setup())
        _ = m.start()
        #expect(m.clientClosed() == .abortExchange)
        #expect(m.tokenAcquired() == .none)
        #expect(m.backendAcquired() == .closeUnusedBackend)
        #expect(m.clientClosed() == .none)
    }
}

/// Random event sequences against the invariants of the machine's theory of operation.
@Suite("ProxyExchange.StateMachine: invariants under random events")
struct ExchangeInvariantTests {
    struct SplitMix64: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state &+= 0x9E37_79B9_7F4A_7C15
            var z = state
            z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
            z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
            return z ^ (z >> 31)
        }
    }

    @Test(arguments: 0..<200)
    func invariantsHold(seed: Int) {
        var rng = SplitMix64(state: UInt64(seed))
        let s = setup(body: Bool.random(using: &rng), http11: Bool.random(using: &rng), expect: Bool.random(using: &rng),
                      session: Bool.random(using: &rng), limit: [0, 50, 1 << 20].randomElement(using: &rng)!,
                      methodReplayable: Bool.random(using: &rng), idempotent: Bool.random(using: &rng))
        var m = Machine(setup: s)
        var headsWritten = 0
        var errorAnswers = 0
        var sends = 0
        var replays = 0
        var verdicts: [ProxyExchange.RejectionVerdict] = []
        var freshRetries = 0
        var releasedWhileUnsent = false
        var bodyEnded = !s.hasBody
        var sentEnd = false
        // What the held rejection carries: body bytes (`holdRejectionBody`) and trailers.
        var heldBytes = 0
        var heldTrailers = false
        var heldCut: ProxyExchange.UpstreamFailure?
        let clientKeepAlive = Bool.random(using: &rng)
        m = Machine(setup: { var t = s; t.clientKeepAlive = clientKeepAlive; return t }())
        var actions: [ProxyExchange.Action] = [m.start()]
        for _ in 0..<60 where !m.isFinished {
            let before = m.state
            let a: ProxyExchange.Action
            switch Int.random(in: 0..<12, using: &rng) {
            case 0: a = m.tokenAcquired()
            case 1: a = m.backendAcquired()
            case 2: a = bodyEnded ? m.clientBodyReceived(count: 1) : m.clientBodyReceived(count: Int.random(in: 1...40, using: &rng))
            case 3: bodyEnded = true; a = m.clientBodyEnded()
            case 4: a = m.upstreamFinalHead(status: [200, 401, 401, 500].randomElement(using: &rng)!, wwwAuthenticate: { [] })
            case 5:
                let n = Int.random(in: 1...40_000, using: &rng)
                a = m.upstreamBodyReceived(count: n)
                if case .holdRejectionBody = a { heldBytes += n }
            case 6: a = m.upstreamReadComplete()
            case 7:
                let trailers = Bool.random(using: &rng)
                a = m.upstreamEnded(hasTrailers: trailers)
                if case .rejectionDrained = a { heldTrailers = trailers }
            case 8:
                let failure = [ProxyExchange.UpstreamFailure.unreachable, .timeout, .tls, .invalidResponse].randomElement(using: &rng)!
                a = m.upstreamFailed(failure, reusedConnection: Bool.random(using: &rng), responseBytesSeen: Bool.random(using: &rng))
                if case .rejectionDrained = a { heldCut = failure }
            case 9:
                let verdict = [ProxyExchange.RejectionVerdict.replay, .provisionalReplay, .passThrough].randomElement(using: &rng)!
                a = m.rejectionOutcome(verdict)
                if case .acquireBackend = a { verdicts.append(verdict) }
            case 10: a = m.upstreamInformationalHead(status: 103)
            default: a = Int.random(in: 0..<20, using: &rng) == 0 ? m.clientClosed() : m.upstreamReadComplete()
            }
            actions.append(a)
            switch a {
            case .writeResponseHead, .forwardResponseBody(writeHeadFirst: true, _), .finishResponse(writeHeadFirst: true, _, _),
                 .releaseHeldRejection, .sendHeldRejection:
                headsWritten += 1
            case .respondUpstreamError(let failure, let answer):
                errorAnswers += 1
                #expect(headsWritten == 0, "an error answer after a head, seed \(seed): \(actions)")
                #expect(answer == ProxyExchange.ErrorAnswer(upstream: failure, grpc: false, keepAlive: answer.keepAlive))
                #expect(answer.status == (failure == .timeout ? 504 : 502))
                // A rejection cut while it drained is answered as the failure that cut it.
                if case .awaitingReplayToken(.cut(let f)) = before { #expect(f == failure && f == heldCut) }
                if case .collectingReplayBody(.cut(let f)) = before { #expect(f == failure && f == heldCut) }
            case .respondTokenUnavailable(let answer):
                errorAnswers += 1
                #expect(headsWritten == 0, "an error answer after a head, seed \(seed): \(actions)")
                #expect(answer.status == 503 && answer.kind == .tokenUnavailable && answer.grpc == nil)
            case .holdRejection:
                heldBytes = 0
                heldTrailers = false
                heldCut = nil
            case .sendRequest(let r):
                sends += 1
                if r.endBody { sentEnd = true } else { sentEnd = !s.hasBody }
                if s.hasBody && r.endBody { #expect(bodyEnded) }
                if r.sendContinue { #expect(s.clientSpeaksHTTP11 && s.expectsContinue) }
            case .endUpstreamBody:
                sentEnd = true
            case .acquireBackend(let fresh):
                if fresh { freshRetries += 1 }
                if case .awaitingReplayToken = before { replays += 1 }
            case .relayInformational:
                #expect(s.clientSpeaksHTTP11, "no 1xx to an HTTP/1.0 client")
            case .finishResponse(_, .release, _), .rejectionDrained(.release, _):
                if !(sentEnd || !s.hasBody) { releasedWhileUnsent = true }
            default:
                break
            }
            // Keep-alive: never promised to a client that did not ask, nor while its body is unread.
            switch a {
            case .writeResponseHead(let keepAlive), .forwardResponseBody(true, let keepAlive), .finishResponse(_, _, let keepAlive),
                 .releaseHeldRejection(_, let keepAlive), .sendHeldRejection(_, _, let keepAlive, _):
                if keepAlive { #expect(clientKeepAlive && m.clientBody.isComplete, "keep-alive after an unread body, seed \(seed): \(actions)") }
            case .respondUpstreamError(_, let answer), .respondTokenUnavailable(let answer):
                if answer.keepAlive { #expect(clientKeepAlive && m.clientBody.isComplete, "keep-alive after an unread body, seed \(seed)") }
            default:
                break
            }
            // A held rejection goes out as a head alone exactly when it has no body and no trailers.
            if case .sendHeldRejection(_, _, _, let bodyless) = a {
                #expect(bodyless == (heldBytes == 0 && !heldTrailers), "bodyless held rejection, seed \(seed): \(actions)")
            }
            #expect(headsWritten <= 1, "two response heads, seed \(seed): \(actions)")
            #expect(errorAnswers <= 1)
            #expect(headsWritten + errorAnswers <= 1, "a head and an error, seed \(seed): \(actions)")
            // docs/architecture.md §6: one final replay; a second one only after a provisional first.
            #expect(replays <= 2, "replayed three times, seed \(seed)")
            #expect(replays < 2 || verdicts.first == .provisionalReplay, "a second replay after a final one, seed \(seed): \(verdicts)")
            #expect(freshRetries <= 1 + replays, "retried more than once per attempt, seed \(seed)")
            #expect(!releasedWhileUnsent, "pooled a connection whose request was not fully sent, seed \(seed): \(actions)")
            if !s.hasSession { #expect(replays == 0) }
            _ = sends
        }
    }
}

@Suite("ProxyExchange.StateMachine: tunnels and gRPC (docs/architecture.md §5)")
struct ExchangeTunnelAndGRPCTests {
    func grpcSetup() -> ProxyExchange.Setup {
        var s = setup(body: true)
        s.grpc = true
        return s
    }

    @Test func aSwitchOnAnUpgradeRequestStartsTheTunnel() {
        var s = setup()
        s.upgrade = .http1
        var m = forwarding(s)
        #expect(m.upstreamSwitchedProtocols() == .startTunnel)
        #expect(m.state == .tunnelling)
        #expect(m.upstreamFailed(.unreachable, reusedConnection: false, responseBytesSeen: true) == .finishTunnel)
        #expect(m.isFinished)
        #expect(m.tunnelEnded() == .none)

        var n = forwarding(s)
        _ = n.upstreamSwitchedProtocols()
        #expect(n.tunnelEnded() == .finishTunnel)
        #expect(n.clientClosed() == .none)
    }

    @Test func aSwitchWithoutAnUpgradeRequestIsAnUpstreamError() {
        var m = forwarding(setup())
        #expect(m.upstreamSwitchedProtocols() == .upstreamError(.unexpectedSwitch, closeClient: true))
        #expect(m.isFinished)
    }

    /// An extended CONNECT answered 2xx (not 101) is not relayed: to an HTTP/2 client a 2xx
    /// means the tunnel is open (RFC 8441 §5). Other answers (a refusal) are relayed.
    @Test func anExtendedConnectAnswered2xxIsAnUpstreamError() {
        var s = setup()
        s.upgrade = .extendedConnect
        for status in [200, 204, 299] {
            var m = forwarding(s)
            #expect(m.upstreamFinalHead(status: status, wwwAuthenticate: { [] }) == .upstreamError(.upgradeNotSwitched, closeClient: true))
            #expect(m.isFinished)
        }
        for status in [403, 404, 426] {
            var refused = forwarding(s)
            #expect(refused.upstreamFinalHead(status: status, wwwAuthenticate: { [] }) == .none)
            #expect(!refused.isFinished)
        }
        var plain = forwarding(setup())
        #expect(plain.upstreamFinalHead(status: 200, wwwAuthenticate: { [] }) == .none)
    }

    /// RFC 9110 §7.8: a server may ignore `Upgrade` and answer normally. An HTTP/1.1 upgrade
    /// answered 200, 404 or 426 is relayed as a response (head, body, end), the backend released
    /// and the client's connection kept for the next request.
    @Test func aDeclinedHTTP11UpgradeIsRelayedAndTheConnectionStays() {
        for session in [true, false] {
            var s = setup(session: session)
            s.upgrade = .http1
            for status in [200, 204, 404, 426] {
                var m = forwarding(s)
                #expect(m.upstreamFinalHead(status: status, wwwAuthenticate: { [] }) == .none, "\(status)")
                #expect(m.state == .forwarding(ProxyExchange.Attempt(kind: .original, freshConnection: false), .sent, .headPending))
                #expect(m.upstreamBodyReceived(count: 5) == .forwardResponseBody(writeHeadFirst: true, keepAlive: true))
                #expect(m.upstreamEnded() == .finishResponse(writeHeadFirst: false, backend: .release, keepAlive: true))
                #expect(m.isFinished)
                // Declined: no tunnel starts afterwards.
                #expect(m.upstreamSwitchedProtocols() == .none)
            }
        }
    }

    /// A rejected handshake is replayed like any GET, from an HTTP/1.1 client or an extended
    /// CONNECT alike.
    @Test func aRejectedHandshakeIsReplayed() {
        for upgrade in [ProxyExchange.Upgrade.http1, .extendedConnect] {
            var s = setup()
            s.upgrade = upgrade
            var m = forwarding(s)
            #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] }) == .holdRejection)
            #expect(m.upstreamEnded() == .rejectionDrained(backend: .release, reportNow: true))
            #expect(m.rejectionOutcome(.replay) == .acquireBackend(fresh: false))
            _ = m.backendAcquired()
            #expect(m.upstreamSwitchedProtocols() == .startTunnel)
        }
    }

    /// A handshake rejected again after its replay goes to the client (refreshed, not replayed
    /// twice) and, declined over HTTP/1.1, leaves the connection usable.
    @Test func aHandshakeRejectedAfterItsReplayIsRelayed() {
        var s = setup()
        s.upgrade = .http1
        var m = forwarding(s)
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] }) == .holdRejection)
        _ = m.upstreamEnded()
        _ = m.rejectionOutcome(.replay)
        _ = m.backendAcquired()
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] }) == .rejectionNotReplayed(reason: .rejectedAgain, refreshOnly: false))
        #expect(m.upstreamEnded() == .finishResponse(writeHeadFirst: true, backend: .release, keepAlive: true))
    }

    /// docs/architecture.md §5: a trailers-only UNAUTHENTICATED answers a unary call whose body is complete:
    /// held and replayed, whatever its HTTP status (200).
    @Test func grpcUnauthenticatedOnAUnaryCallIsReplayed() {
        var m = Machine(setup: grpcSetup())
        _ = m.start()
        _ = m.tokenAcquired()
        _ = m.clientBodyReceived(count: 12)
        _ = m.clientBodyEnded()
        _ = m.backendAcquired()
        #expect(m.upstreamFinalHead(status: 200, grpcUnauthenticated: true, wwwAuthenticate: { [] }) == .holdRejection)
        #expect(m.upstreamEnded() == .rejectionDrained(backend: .release, reportNow: true))
        #expect(m.rejectionOutcome(.replay) == .acquireBackend(fresh: false))
        _ = m.backendAcquired()
        // The replay answered UNAUTHENTICATED again: it goes to the client.
        #expect(m.upstreamFinalHead(status: 200, grpcUnauthenticated: true, wwwAuthenticate: { [] })
                == .rejectionNotReplayed(reason: .rejectedAgain, refreshOnly: false))
    }

    /// A streaming call still sending: waiting for the rest would stall a client that waits for
    /// responses, so the rejection goes through and the token is refreshed for later calls.
    @Test func grpcUnauthenticatedOnAStreamingCallIsPassedThrough() {
        var m = Machine(setup: grpcSetup())
        _ = m.start()
        _ = m.tokenAcquired()
        _ = m.backendAcquired()
        _ = m.clientBodyReceived(count: 12)
        #expect(m.upstreamFinalHead(status: 200, grpcUnauthenticated: true, wwwAuthenticate: { [] })
                == .rejectionNotReplayed(reason: .notReplayable, refreshOnly: true))
        // An OK status with the same HTTP status is no rejection.
        var n = Machine(setup: grpcSetup())
        _ = n.start()
        _ = n.tokenAcquired()
        _ = n.backendAcquired()
        #expect(n.upstreamFinalHead(status: 200, grpcUnauthenticated: false, wwwAuthenticate: { [] }) == .none)
    }
}

@Suite("Upgrade decisions and gRPC answers (docs/architecture.md §5)")
struct UpgradeAndGRPCHeaderTests {
    func head(_ method: String = "GET", _ fields: [(String, String)], version: HTTPVersion = .http1_1) -> HTTPRequestHead {
        HTTPRequestHead(method: method, target: "/", version: version, headers: HTTPHeaders(fields))
    }

    @Test func upgradeRequestKinds() {
        #expect(ProxyHeaders.upgradeRequest(head("GET", [("Host", "a")])) == .none)
        #expect(ProxyHeaders.upgradeRequest(head("GET", [("Connection", "keep-alive, Upgrade"), ("Upgrade", "WebSocket")])) == .websocket)
        #expect(ProxyHeaders.upgradeRequest(head("GET", [("Connection", "Upgrade, HTTP2-Settings"), ("Upgrade", "h2c")])) == .ignoredH2C)
        if case .unsupported = ProxyHeaders.upgradeRequest(head("GET", [("Connection", "Upgrade"), ("Upgrade", "TLS/1.2")])) {} else { Issue.record("TLS upgrade") }
        if case .unsupported = ProxyHeaders.upgradeRequest(head("POST", [("Connection", "Upgrade"), ("Upgrade", "websocket")])) {} else { Issue.record("POST") }
        // Not upgrade requests (RFC 9110 §7.8): Upgrade not named in Connection, or HTTP/1.0.
        #expect(ProxyHeaders.upgradeRequest(head("GET", [("Upgrade", "websocket")])) == .none)
        #expect(ProxyHeaders.upgradeRequest(head("GET", [("Connection", "Upgrade"), ("Upgrade", "websocket")], version: .http1_0)) == .none)
    }

    @Test func switchingResponseKeepsItsUpgradeFields() {
        let up = HTTPResponseHead(status: 101, reason: "Switching Protocols",
                                  headers: HTTPHeaders([("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Accept", "abc"), ("Keep-Alive", "5")]))
        let h = ProxyHeaders.switchingProtocolsResponse(upstream: up)
        #expect(h.headers["Upgrade"] == "websocket")
        #expect(h.headers["Connection"] == "Upgrade")
        #expect(h.headers["Sec-WebSocket-Accept"] == "abc")
        #expect(h.headers["Keep-Alive"] == nil)
    }

    @Test func grpcTrailersOnlyErrors() {
        let h = ErrorResponse.grpcTrailersOnly(.unavailable, message: "upstream_unreachable: 10.0.0.1:50051 café 100%")
        #expect(h.status == 200)
        #expect(h.headers["content-type"] == "application/grpc")
        #expect(h.headers["grpc-status"] == "14")
        #expect(h.headers["grpc-message"] == "upstream_unreachable: 10.0.0.1:50051 caf%C3%A9 100%25")
        #expect(ErrorResponse.isGRPC(HTTPHeaders([("Content-Type", "application/grpc+proto")])))
        #expect(ErrorResponse.isGRPC(HTTPHeaders([("content-type", "application/grpc")])))
        #expect(!ErrorResponse.isGRPC(HTTPHeaders([("content-type", "application/grpc-web")])))
        #expect(!ErrorResponse.isGRPC(HTTPHeaders([("content-type", "application/json")])))
        #expect(ErrorResponse.isGRPC(HTTPHeaders([("Content-Type", "Application/GRPC;charset=x")])))
        #expect(!ErrorResponse.isGRPC(HTTPHeaders([("content-type", "application/grp")])))
        #expect(!ErrorResponse.isGRPC(HTTPHeaders([("content-type", "")])))
        #expect(!ErrorResponse.isGRPC(HTTPHeaders([("content-type", "application/grpcx")])))
    }
}

@Suite("ProxyExchange.StateMachine: unprocessed requests (docs/architecture.md §5)")
struct ExchangeUnprocessedTests {
    /// RFC 9113 §8.7: a refused stream was not processed; a POST is retried once on a fresh
    /// connection, unlike a POST on a pooled connection that merely closed.
    @Test func aRefusedPostIsRetriedOnceOnAFreshConnection() {
        var m = Machine(setup: setup(body: true, idempotent: false))
        _ = m.start()
        _ = m.tokenAcquired()
        _ = m.clientBodyReceived(count: 5)
        _ = m.clientBodyEnded()
        _ = m.backendAcquired()
        #expect(m.upstreamFailed(.invalidResponse, reusedConnection: true, responseBytesSeen: false, unprocessed: true) == .acquireBackend(fresh: true))
        _ = m.backendAcquired()
        #expect(m.upstreamFailed(.invalidResponse, reusedConnection: false, responseBytesSeen: false, unprocessed: true) == .upstreamError(.invalidResponse, closeClient: false))

        var n = Machine(setup: setup(body: true, idempotent: false))
        _ = n.start()
        _ = n.tokenAcquired()
        _ = n.clientBodyReceived(count: 5)
        _ = n.clientBodyEnded()
        _ = n.backendAcquired()
        #expect(n.upstreamFailed(.unreachable, reusedConnection: true, responseBytesSeen: false) == .upstreamError(.unreachable, closeClient: false))
    }
}

/// The driver holds the machine with `@exclusivity(unchecked)`, which is sound only for a
/// trivially copyable value (no references, no heap storage): this pins it.
@Suite("ProxyExchange.StateMachine: a plain value")
struct ExchangeMachineLayoutTests {
    @Test func theMachineAndTheResponseFramingAreTriviallyCopyable() {
        #expect(_isPOD(ProxyExchange.StateMachine.self))
        #expect(_isPOD(ProxyExchange.Setup.self))
        #expect(_isPOD(ProxyHeaders.ClientFraming.self))
    }

    @Test func rejectStatusesRoundTripThroughTheBitSet() {
        var s = setup(reject: [503, 401, 403, 401])
        #expect(s.rejectStatuses == [401, 403, 503])
        #expect(s.rejectSet.contains(401) && s.rejectSet.contains(503) && !s.rejectSet.contains(402))
        for outside in [-1, 1000, Int.max, Int.min] { #expect(!s.rejectSet.contains(outside)) }
        s.rejectStatuses = [0, 999, 1000, -5]
        #expect(s.rejectStatuses == [0, 999])
        #expect(StatusCodeSet([401]) == StatusCodeSet([401, 401]) && StatusCodeSet([401]) != StatusCodeSet([403]))
        // Every status a machine may see: members exactly as the list says.
        let listed = [400, 401, 403, 429, 511, 599]
        let set = StatusCodeSet(listed)
        for code in 0..<1000 { #expect(set.contains(code) == listed.contains(code), "\(code)") }
    }
}

/// RFC 9449 §9 on a DPoP route: an upstream's `401` asking for a nonce is replayed once with
/// the kept body and no token rejection (no `reportRejection`); a later token rejection still
/// gets its own replay; a second nonce demand goes to the client.
@Suite("ProxyExchange.StateMachine: DPoP nonce demands")
struct DPoPNonceMachineTests {
    static let nonceDemand = [#"DPoP error="use_dpop_nonce", error_description="Resource server requires nonce in DPoP proof""#]

    func dpopSetup(body: Bool = false) -> ProxyExchange.Setup {
        var s = setup(body: body)
        s.dpop = true
        return s
    }

    @Test func aNonceDemandIsReplayedOnceWithoutBlamingTheToken() {
        var m = forwarding(dpopSetup())
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { Self.nonceDemand }) == .holdRejection)
        #expect(m.upstreamBodyReceived(count: 20) == .holdRejectionBody)
        #expect(m.upstreamEnded() == .resendWithoutRefresh(backend: .release))
        #expect(m.state == .connecting(.init(kind: .resend, freshConnection: false)))
        #expect(!m.isReplay)
        #expect(m.backendAcquired() == .sendRequest(.init(body: .kept, endBody: false, sendContinue: false)))
        // The token is rejected after all: that is a rejection, replayed once as usual.
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { [#"DPoP error="invalid_token""#] }) == .holdRejection)
        #expect(m.upstreamEnded() == .rejectionDrained(backend: .release, reportNow: true))
        #expect(m.rejectionOutcome(.replay) == .acquireBackend(fresh: false))
        _ = m.backendAcquired()
        // A second nonce demand is not replayed again: it goes to the client as it is.
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { Self.nonceDemand }) == .rejectionNotReplayed(reason: .rejectedAgain, refreshOnly: false))
    }

    @Test func aBodyStillStreamingIsCollectedFirst() {
        var m = forwarding(dpopSetup(body: true))
        #expect(m.clientBodyReceived(count: 10) == .forwardClientBody(keep: .append))
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { Self.nonceDemand }) == .holdRejection)
        #expect(m.upstreamEnded() == .rejectionDrained(backend: .close, reportNow: false))
        #expect(m.clientBodyReceived(count: 5) == .keepClientBody(.append))
        #expect(m.clientBodyEnded() == .resendWithoutRefresh(backend: .alreadyClosed))
        #expect(m.backendAcquired() == .sendRequest(.init(body: .kept, endBody: true, sendContinue: false)))
    }

    /// Without `dpop:` the route cannot answer a nonce demand; it is no rejection of the token
    /// either (a DPoP challenge's error other than invalid_token, RFC 9449 §7.1): relayed.
    @Test func withoutDPoPTheSameAnswerIsNotAboutTheToken() {
        var m = forwarding(setup())
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { Self.nonceDemand }) == .rejectionNotReplayed(reason: .notTokenError, refreshOnly: false))
        #expect(m.resend == .available)
    }
}
