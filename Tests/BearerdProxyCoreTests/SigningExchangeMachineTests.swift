import Testing
import BearerdOAuth
import BearerdHTTP
@testable import BearerdProxyCore

/// Signing routes (`sign:`, docs/architecture.md §6.15) in the exchange machine: a 400 or 403 is
/// held and, once it ended, what the driver read from it decides: a credentials rejection takes
/// the rejection path (report, replay once with new keys), a clock skew the one resend without a
/// refresh, a signature mismatch or anything else is relayed as it is. `payload: signed` reads
/// the whole body before connecting (413 past replay_body_limit).
@Suite("ProxyExchange.StateMachine: signing routes")
struct SigningExchangeMachineTests {
    /// A signing route as `RouteRef` sets it up: 401 is no rejection there (`reject` empty).
    func signing(_ payload: ProxyExchange.Signing = .unsignedPayload, body: Bool = false, expect: Bool = false, limit: Int = 1 << 20,
                 methodReplayable: Bool = true, reject: [Int] = []) -> ProxyExchange.Setup {
        var s = setup(body: body, expect: expect, limit: limit, reject: reject, methodReplayable: methodReplayable)
        s.signing = payload
        return s
    }

    /// Holds a 403 with a body, lets it end, and answers the classification with `answer`;
    /// checks the driver is asked exactly once.
    func endHeld(_ m: inout Machine, _ answer: ProxyExchange.SignedAnswer, status: Int = 403) -> ProxyExchange.Action {
        #expect(m.upstreamFinalHead(status: status, wwwAuthenticate: { Issue.record("not a bearer challenge"); return [] }) == .holdRejection)
        #expect(m.upstreamBodyReceived(count: 300) == .holdRejectionBody)
        var asked = 0
        let a = m.upstreamEnded(signedAnswer: { asked += 1; return answer })
        #expect(asked == 1)
        return a
    }

    @Test func aSigned400Or403IsHeldForItsBody() {
        for status in [400, 403] {
            var m = forwarding(signing())
            #expect(m.upstreamFinalHead(status: status, wwwAuthenticate: { [] }) == .holdRejection)
            guard case .forwarding(_, _, .holding(bytes: 0, .signedAnswer)) = m.state else {
                Issue.record("\(status): \(m.state)")
                continue
            }
        }
        // Other statuses stream as on any route, and the classifier is never asked.
        var m = forwarding(signing())
        #expect(m.upstreamFinalHead(status: 200, wwwAuthenticate: { [] }) == .none)
        #expect(m.upstreamEnded(signedAnswer: { Issue.record("not held"); return .other })
            == .finishResponse(writeHeadFirst: true, backend: .release, keepAlive: true))
    }

    @Test func credentialsRejectedTakesTheRejectionPathAndTheReplayIsSentAgain() {
        var m = forwarding(signing())
        #expect(endHeld(&m, .credentialsRejected) == .rejectionDrained(backend: .release, reportNow: true))
        #expect(m.state == .awaitingReplayToken(.whole(bodyless: false)))
        #expect(m.rejectionOutcome(.replay) == .acquireBackend(fresh: false))
        // The replay is a new send (the driver signs every send anew, with the replay's keys).
        #expect(m.backendAcquired() == .sendRequest(.init(body: .kept, endBody: false, sendContinue: false)))
        #expect(m.isReplay && m.replays == 1)
        // Rejected again: relayed as it is, not held (nothing could be sent again).
        #expect(m.upstreamFinalHead(status: 403, wwwAuthenticate: { [] }) == .none)
        #expect(m.upstreamEnded(signedAnswer: { Issue.record("not held"); return .other })
            == .finishResponse(writeHeadFirst: true, backend: .release, keepAlive: true))
    }

    @Test func aProvisionalReplayRejectedIsReplayedOnceMore() {
        var m = forwarding(signing())
        _ = endHeld(&m, .credentialsRejected)
        #expect(m.rejectionOutcome(.provisionalReplay) == .acquireBackend(fresh: false))
        _ = m.backendAcquired()
        #expect(endHeld(&m, .credentialsRejected) == .rejectionDrained(backend: .release, reportNow: true))
        #expect(m.rejectionOutcome(.replay) == .acquireBackend(fresh: false))
        #expect(m.replays == 2)
    }

    @Test func theSessionGivingNoNewKeysIs503AndPassThroughRelays() {
        var m = forwarding(signing())
        _ = endHeld(&m, .credentialsRejected)
        #expect(m.rejectionOutcome(.tokenUnavailable) == .tokenError(closeClient: false))
        var n = forwarding(signing())
        _ = endHeld(&n, .credentialsRejected)
        #expect(n.rejectionOutcome(.passThrough) == .sendHeldRejection(reason: nil, refreshOnly: false, keepAlive: true, bodyless: false))
    }

    @Test func aClockSkewIsResentOnceWithoutARefresh() {
        var m = forwarding(signing())
        #expect(endHeld(&m, .clockSkew(serverTimeKnown: true)) == .resendWithoutRefresh(backend: .release))
        #expect(m.state == .connecting(.init(kind: .resend, freshConnection: false)))
        #expect(m.resend == .used && m.replays == 0 && !m.isReplay)
        #expect(m.backendAcquired() == .sendRequest(.init(body: .kept, endBody: false, sendContinue: false)))
        // The budget is spent: a second skew is relayed as it is.
        #expect(endHeld(&m, .clockSkew(serverTimeKnown: true)) == .relayHeldAnswer(backend: .release, keepAlive: true, bodyless: false))
        #expect(m.isFinished)
    }

    @Test func expiredKeysAfterASkewResendStillGetTheirReplay() {
        var m = forwarding(signing())
        _ = endHeld(&m, .clockSkew(serverTimeKnown: true))
        _ = m.backendAcquired()
        #expect(endHeld(&m, .credentialsRejected) == .rejectionDrained(backend: .release, reportNow: true))
        #expect(m.rejectionOutcome(.replay) == .acquireBackend(fresh: false))
        _ = m.backendAcquired()
        #expect(m.state == .forwarding(.init(kind: .replay, freshConnection: false), .sent, .awaitingHead))
    }

    @Test func aSkewWithoutTheServerTimeIsRelayed() {
        var m = forwarding(signing())
        #expect(endHeld(&m, .clockSkew(serverTimeKnown: false)) == .relayHeldAnswer(backend: .release, keepAlive: true, bodyless: false))
        #expect(m.resend == .available)
    }

    @Test func aSignatureMismatchAndOtherAnswersAreRelayedAsTheyAre() {
        for answer in [ProxyExchange.SignedAnswer.signatureMismatch, .other] {
            var m = forwarding(signing())
            #expect(endHeld(&m, answer) == .relayHeldAnswer(backend: .release, keepAlive: true, bodyless: false), "\(answer)")
            #expect(m.isFinished && m.replays == 0 && m.resend == .available)
        }
        // A bodyless answer (HEAD) goes out as a head alone; one with trailers does not.
        var m = forwarding(signing())
        _ = m.upstreamFinalHead(status: 403, wwwAuthenticate: { [] })
        #expect(m.upstreamEnded(signedAnswer: { .other }) == .relayHeldAnswer(backend: .release, keepAlive: true, bodyless: true))
        var n = forwarding(signing())
        _ = n.upstreamFinalHead(status: 403, wwwAuthenticate: { [] })
        #expect(n.upstreamEnded(hasTrailers: true, signedAnswer: { .other }) == .relayHeldAnswer(backend: .release, keepAlive: true, bodyless: false))
    }

    @Test func notHeldWhenNothingCouldBeSentAgain() {
        // Method not in replay_methods.
        var m = forwarding(signing(methodReplayable: false))
        #expect(m.upstreamFinalHead(status: 403, wwwAuthenticate: { [] }) == .none)
        // The body outgrew replay_body_limit.
        var n = forwarding(signing(body: true, limit: 10))
        #expect(n.clientBodyReceived(count: 20) == .forwardClientBody(keep: .release))
        #expect(n.upstreamFinalHead(status: 403, wwwAuthenticate: { [] }) == .none)
        #expect(n.upstreamReadComplete() == .writeResponseHead(keepAlive: false))
    }

    /// On a signing route 401 is no rejection (reject set empty, as `RouteRef` builds it), and a
    /// token route's 403 is no hold: the two paths do not mix.
    @Test func fourOhOneOnSigningRoutesAndFourOhThreeOnTokenRoutes() {
        var m = forwarding(signing())
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] }) == .none)
        var t = forwarding(setup())
        #expect(t.upstreamFinalHead(status: 403, wwwAuthenticate: { [] }) == .none)
        var r = forwarding(setup())
        #expect(r.upstreamFinalHead(status: 401, wwwAuthenticate: { [] }) == .holdRejection)
        #expect(r.state == .forwarding(.init(kind: .original, freshConnection: false), .sent, .holding(bytes: 0, .rejection)))
        #expect(r.upstreamEnded(signedAnswer: { Issue.record("a token rejection is not classified"); return .other })
            == .rejectionDrained(backend: .release, reportNow: true))
    }

    @Test func aHeldAnswerCutWhileDrainingIsAnsweredAsTheFailure() {
        var m = forwarding(signing())
        _ = m.upstreamFinalHead(status: 403, wwwAuthenticate: { [] })
        _ = m.upstreamBodyReceived(count: 10)
        #expect(m.upstreamFailed(.unreachable, reusedConnection: false, responseBytesSeen: true) == .upstreamError(.unreachable, closeClient: false))
        #expect(m.isFinished && m.replays == 0)
    }

    @Test func aHeldAnswerTooLargeToReadIsRelayedWithoutBlamingTheKeys() {
        var m = forwarding(signing())
        _ = m.upstreamFinalHead(status: 403, wwwAuthenticate: { [] })
        #expect(m.upstreamBodyReceived(count: Machine.heldRejectionLimit + 1) == .releaseHeldRejection(reason: nil, keepAlive: true))
        #expect(m.upstreamEnded(signedAnswer: { Issue.record("relayed already"); return .other })
            == .finishResponse(writeHeadFirst: false, backend: .release, keepAlive: true))
    }

    /// `payload: unsigned` with a body still streaming: the answer waits for the rest of the body
    /// (kept), then the report or the resend goes out.
    @Test func aStreamingBodyIsCollectedBeforeTheReplayOrTheResend() {
        var m = forwarding(signing(body: true))
        #expect(m.clientBodyReceived(count: 100) == .forwardClientBody(keep: .append))
        #expect(endHeld(&m, .credentialsRejected) == .rejectionDrained(backend: .close, reportNow: false))
        #expect(m.clientBodyReceived(count: 100) == .keepClientBody(.append))
        #expect(m.clientBodyEnded() == .reportRejection)

        var n = forwarding(signing(body: true))
        _ = n.clientBodyReceived(count: 100)
        #expect(endHeld(&n, .clockSkew(serverTimeKnown: true)) == .rejectionDrained(backend: .close, reportNow: false))
        #expect(n.resend == .pending(.original))
        #expect(n.clientBodyEnded() == .resendWithoutRefresh(backend: .alreadyClosed))
        #expect(n.backendAcquired() == .sendRequest(.init(body: .kept, endBody: true, sendContinue: false)))
        #expect(n.resend == .used)

        // Past replay_body_limit while collecting: the answer goes to the client; a skew refreshes nothing.
        var o = forwarding(signing(body: true, limit: 150))
        _ = o.clientBodyReceived(count: 100)
        _ = endHeld(&o, .clockSkew(serverTimeKnown: true))
        #expect(o.clientBodyReceived(count: 100) == .sendHeldRejection(reason: .notReplayable, refreshOnly: false, keepAlive: false, bodyless: false))
        var p = forwarding(signing(body: true, limit: 150))
        _ = p.clientBodyReceived(count: 100)
        _ = endHeld(&p, .credentialsRejected)
        #expect(p.clientBodyReceived(count: 100) == .sendHeldRejection(reason: .notReplayable, refreshOnly: true, keepAlive: false, bodyless: false))
    }

    // MARK: payload: signed

    @Test func signedPayloadWaitsForTheWholeBodyBeforeConnecting() {
        var m = Machine(setup: signing(.signedPayload, body: true))
        #expect(m.start() == .acquireToken)
        #expect(m.clientBodyReceived(count: 40_000) == .keepClientBody(.append))
        #expect(m.clientBodyReceived(count: 40_000) == .keepClientBody(.append))
        // More than the pending buffer, and still read: it goes into the kept copy only.
        #expect(m.wantsClientBody && m.pendingBytes == 0)
        #expect(m.tokenAcquired() == .awaitClientBody(sendContinue: false))
        #expect(m.state == .awaitingSignedBody)
        #expect(m.clientBodyReceived(count: 40_000) == .keepClientBody(.append))
        #expect(m.wantsClientBody)
        #expect(m.clientBodyEnded() == .acquireBackend(fresh: false))
        #expect(m.backendAcquired() == .sendRequest(.init(body: .kept, endBody: true, sendContinue: false)))
        #expect(m.keep == .keeping(bytes: 120_000))
        #expect(m.state == .forwarding(.init(kind: .original, freshConnection: false), .sent, .awaitingHead))
    }

    @Test func signedPayloadWhoseBodyArrivedBeforeTheTokenConnectsAtOnce() {
        var m = Machine(setup: signing(.signedPayload, body: true))
        _ = m.start()
        _ = m.clientBodyReceived(count: 10)
        #expect(m.clientBodyEnded() == .none)
        #expect(m.tokenAcquired() == .acquireBackend(fresh: false))
        // Without a body nothing waits either.
        var n = Machine(setup: signing(.signedPayload))
        _ = n.start()
        #expect(n.tokenAcquired() == .acquireBackend(fresh: false))
        #expect(n.backendAcquired() == .sendRequest(.init(body: .kept, endBody: false, sendContinue: false)))
    }

    @Test func signedPayloadAsksForTheBodyWith100Continue() {
        var m = Machine(setup: signing(.signedPayload, body: true, expect: true))
        _ = m.start()
        #expect(m.tokenAcquired() == .awaitClientBody(sendContinue: true))
        _ = m.clientBodyReceived(count: 5)
        #expect(m.clientBodyEnded() == .acquireBackend(fresh: false))
        #expect(m.backendAcquired() == .sendRequest(.init(body: .kept, endBody: true, sendContinue: false)))
    }

    @Test func signedPayloadOverTheLimitIs413() {
        // While the token is awaited…
        var m = Machine(setup: signing(.signedPayload, body: true, limit: 50))
        _ = m.start()
        #expect(m.clientBodyReceived(count: 30) == .keepClientBody(.append))
        #expect(m.clientBodyReceived(count: 30) == .respondClientError(.signedPayloadTooLarge, keepAlive: false))
        #expect(m.isFinished && m.keep == .notKept)
        #expect(m.tokenAcquired() == .none)
        // …and while the body is awaited.
        var n = Machine(setup: signing(.signedPayload, body: true, limit: 50))
        _ = n.start()
        _ = n.tokenAcquired()
        #expect(n.clientBodyReceived(count: 51) == .respondClientError(.signedPayloadTooLarge, keepAlive: false))
        #expect(n.isFinished)
        #expect(ProxyExchange.ClientError.signedPayloadTooLarge.status == 413)
        // replay_body_limit 0 still signs an empty body.
        var o = Machine(setup: signing(.signedPayload, body: true, limit: 0))
        _ = o.start()
        _ = o.tokenAcquired()
        #expect(o.clientBodyEnded() == .acquireBackend(fresh: false))
    }

    @Test func aSignedPayloadReplayResendsTheSameKeptBody() {
        var m = Machine(setup: signing(.signedPayload, body: true))
        _ = m.start()
        _ = m.clientBodyReceived(count: 10)
        _ = m.clientBodyEnded()
        _ = m.tokenAcquired()
        _ = m.backendAcquired()
        #expect(endHeld(&m, .credentialsRejected) == .rejectionDrained(backend: .release, reportNow: true))
        _ = m.rejectionOutcome(.replay)
        #expect(m.backendAcquired() == .sendRequest(.init(body: .kept, endBody: true, sendContinue: false)))
    }

    // MARK: signing failures

    @Test func aTargetTheSignerRefusesIs400AndNoKeysIs503() {
        var m = forwarding(signing())
        #expect(m.signingFailed(.invalidTarget) == .respondClientError(.unsignableTarget, keepAlive: true))
        #expect(m.isFinished)
        #expect(ProxyExchange.ClientError.unsignableTarget.status == 400)
        var n = forwarding(signing(body: true))
        #expect(n.signingFailed(.invalidTarget) == .respondClientError(.unsignableTarget, keepAlive: false))
        var o = forwarding(signing())
        #expect(o.signingFailed(.noKeys) == .tokenError(closeClient: false))
        // Only while the request is about to go out.
        var p = forwarding(signing())
        _ = p.upstreamFinalHead(status: 200, wwwAuthenticate: { [] })
        #expect(p.signingFailed(.invalidTarget) == .none)
    }

    @Test func theVerdictMapsOntoTheMachinesInput() {
        #expect(ProxyExchange.SignedAnswer(.credentialsRejected(code: "ExpiredToken")) == .credentialsRejected)
        #expect(ProxyExchange.SignedAnswer(.clockSkew(code: "RequestTimeTooSkewed", serverEpochSeconds: 1)) == .clockSkew(serverTimeKnown: true))
        #expect(ProxyExchange.SignedAnswer(.clockSkew(code: "RequestTimeTooSkewed", serverEpochSeconds: nil)) == .clockSkew(serverTimeKnown: false))
        #expect(ProxyExchange.SignedAnswer(.signatureMismatch(code: "SignatureDoesNotMatch", serverCanonicalRequestHash: nil)) == .signatureMismatch)
        #expect(ProxyExchange.SignedAnswer(.otherError(code: "AccessDenied")) == .other)
        #expect(ProxyExchange.SignedAnswer(.notAnError) == .other)
    }

    @Test func theMachineStaysPlainData() {
        #expect(_isPOD(ProxyExchange.StateMachine.self))
        #expect(MemoryLayout<ProxyExchange.Action>.size <= 8)
    }
}

/// Random event sequences on signing routes against the invariants: one head, at most one
/// resend, at most one final replay, nothing sent for `payload: signed` before the body ended,
/// no send after a 413.
@Suite("ProxyExchange.StateMachine: signing routes under random events")
struct SigningExchangeInvariantTests {
    @Test(arguments: 0..<300)
    func invariantsHold(seed: Int) {
        var rng = ExchangeInvariantTests.SplitMix64(state: UInt64(seed) &+ 7_777)
        var s = setup(body: Bool.random(using: &rng), expect: Bool.random(using: &rng), limit: [0, 50, 1 << 20].randomElement(using: &rng)!,
                      reject: [], methodReplayable: Bool.random(using: &rng))
        s.signing = Bool.random(using: &rng) ? .signedPayload : .unsignedPayload
        var m = Machine(setup: s)
        var bodyEnded = !s.hasBody
        var heads = 0, resends = 0, finalReplays = 0, clientErrors = 0
        var actions: [ProxyExchange.Action] = [m.start()]
        for _ in 0..<60 where !m.isFinished {
            let a: ProxyExchange.Action
            switch Int.random(in: 0..<11, using: &rng) {
            case 0: a = m.tokenAcquired()
            case 1: a = m.backendAcquired()
            case 2: a = bodyEnded ? m.clientBodyReceived(count: 0) : m.clientBodyReceived(count: Int.random(in: 1...40, using: &rng))
            case 3: bodyEnded = true; a = m.clientBodyEnded()
            case 4: a = m.upstreamFinalHead(status: [200, 400, 403, 403, 401, 500].randomElement(using: &rng)!, wwwAuthenticate: { [] })
            case 5: a = m.upstreamBodyReceived(count: Int.random(in: 1...40_000, using: &rng))
            case 6:
                let answer = [ProxyExchange.SignedAnswer.credentialsRejected, .clockSkew(serverTimeKnown: true), .clockSkew(serverTimeKnown: false),
                              .signatureMismatch, .other].randomElement(using: &rng)!
                a = m.upstreamEnded(hasTrailers: Bool.random(using: &rng), signedAnswer: { answer })
            case 7: a = m.upstreamFailed(.unreachable, reusedConnection: Bool.random(using: &rng), responseBytesSeen: Bool.random(using: &rng))
            case 8:
                let v = [ProxyExchange.RejectionVerdict.replay, .provisionalReplay, .passThrough, .tokenUnavailable].randomElement(using: &rng)!
                a = m.rejectionOutcome(v)
                if case .acquireBackend = a, v == .replay { finalReplays += 1 }
            case 9: a = m.signingFailed(.invalidTarget)
            default: a = m.upstreamReadComplete()
            }
            actions.append(a)
            switch a {
            case .writeResponseHead, .forwardResponseBody(writeHeadFirst: true, _), .finishResponse(writeHeadFirst: true, _, _),
                 .releaseHeldRejection, .sendHeldRejection, .relayHeldAnswer, .respondUpstreamError, .respondTokenUnavailable:
                heads += 1
            case .respondClientError(let e, _):
                heads += 1
                clientErrors += 1
                if e == .signedPayloadTooLarge { #expect(s.signing == .signedPayload, "seed \(seed)") }
            case .resendWithoutRefresh:
                resends += 1
            case .sendRequest(let r):
                if s.signing == .signedPayload && s.hasBody {
                    #expect(bodyEnded && r.endBody && r.body == .kept, "signed payload sent before its body ended, seed \(seed): \(actions)")
                }
            case .awaitClientBody:
                #expect(s.signing == .signedPayload && !bodyEnded, "seed \(seed)")
            default:
                break
            }
            #expect(heads <= 1, "two answers, seed \(seed): \(actions)")
            #expect(resends <= 1, "two resends, seed \(seed): \(actions)")
            #expect(finalReplays <= 1, "two final replays, seed \(seed): \(actions)")
            #expect(clientErrors <= 1)
        }
    }
}
