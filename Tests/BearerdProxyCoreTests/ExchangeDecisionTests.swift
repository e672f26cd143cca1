import Testing
import BearerdOAuth
@testable import BearerdProxyCore

/// The decisions the driver used to make beside the machine and that now travel in its actions
/// (docs/architecture.md §5): which answer an upstream failure gets, whether the client connection is kept,
/// and whether a held rejection goes out as a head alone.
@Suite("ProxyExchange.StateMachine: answers, keep-alive and held rejections")
struct ExchangeDecisionTests {
    typealias Answer = ProxyExchange.ErrorAnswer

    func failedWhileConnecting(_ failure: ProxyExchange.UpstreamFailure, grpc: Bool, keepAlive: Bool = true) -> ProxyExchange.Action {
        var s = setup(session: false)
        s.grpc = grpc
        s.clientKeepAlive = keepAlive
        var m = Machine(setup: s)
        _ = m.start()
        return m.upstreamFailed(failure, reusedConnection: false, responseBytesSeen: false)
    }

    @Test func theKindFixesTheStatus() {
        #expect(Answer(kind: .tokenUnavailable, grpc: nil, keepAlive: true).status == 503)
        #expect(Answer(kind: .upstreamTimeout, grpc: nil, keepAlive: true).status == 504)
        for kind in [UpstreamErrorKind.upstreamUnreachable, .upstreamTLS, .upstreamInvalidResponse, .outboundProxyAuthRequired] {
            #expect(Answer(kind: kind, grpc: nil, keepAlive: true).status == 502)
        }
        #expect(MemoryLayout<ProxyExchange.Action>.size <= 8, "an action fits in a register")
    }

    @Test func upstreamFailuresAreAnswered502Or504AsJSON() {
        #expect(failedWhileConnecting(.unreachable, grpc: false)
                == .respondUpstreamError(.unreachable, Answer(kind: .upstreamUnreachable, grpc: nil, keepAlive: true)))
        #expect(failedWhileConnecting(.timeout, grpc: false)
                == .respondUpstreamError(.timeout, Answer(kind: .upstreamTimeout, grpc: nil, keepAlive: true)))
        #expect(failedWhileConnecting(.tls, grpc: false)
                == .respondUpstreamError(.tls, Answer(kind: .upstreamTLS, grpc: nil, keepAlive: true)))
        #expect(failedWhileConnecting(.invalidResponse, grpc: false)
                == .respondUpstreamError(.invalidResponse, Answer(kind: .upstreamInvalidResponse, grpc: nil, keepAlive: true)))
        #expect(failedWhileConnecting(.proofUnavailable, grpc: false)
                == .respondUpstreamError(.proofUnavailable, Answer(kind: .upstreamInvalidResponse, grpc: nil, keepAlive: true)))
    }

    /// The outbound proxy's 407 to CONNECT is its own answer: 502 `outbound_proxy_auth_required`
    /// (gRPC UNAVAILABLE), counted under that label.
    @Test func outboundProxyCredentialsAreTheirOwnAnswer() {
        #expect(failedWhileConnecting(.outboundProxyAuthRequired, grpc: false)
                == .respondUpstreamError(.outboundProxyAuthRequired, Answer(kind: .outboundProxyAuthRequired, grpc: nil, keepAlive: true)))
        #expect(failedWhileConnecting(.outboundProxyAuthRequired, grpc: true)
                == .respondUpstreamError(.outboundProxyAuthRequired, Answer(kind: .outboundProxyAuthRequired, grpc: .unavailable, keepAlive: true)))
        #expect(UpstreamErrorKind.outboundProxyAuthRequired.label == "outbound_proxy_auth_required")
        // The proxy's answer to CONNECT, classified: wanting credentials (407, and 401 as
        // tinyproxy answers wrong ones) apart; any other refusal, or none, is unreachable.
        for status in [407, 401] {
            #expect(ProxyExchange.UpstreamFailure(outboundProxyRefusal: status) == .outboundProxyAuthRequired)
        }
        for status: Int? in [403, 502, 503, 500, 400, nil] {
            #expect(ProxyExchange.UpstreamFailure(outboundProxyRefusal: status) == .unreachable)
        }
        #expect(Answer(kind: .outboundProxyAuthRequired, grpc: nil, keepAlive: true).status == 502)
    }

    /// gRPC clients read the status from `grpc-status` (docs/architecture.md §5): DEADLINE_EXCEEDED for a
    /// timeout, UNAVAILABLE for everything else; the HTTP status stays the JSON answer's.
    @Test func grpcClientsGetTheirStatusCode() {
        #expect(failedWhileConnecting(.timeout, grpc: true)
                == .respondUpstreamError(.timeout, Answer(kind: .upstreamTimeout, grpc: .deadlineExceeded, keepAlive: true)))
        for failure in [ProxyExchange.UpstreamFailure.unreachable, .tls, .invalidResponse] {
            guard case .respondUpstreamError(_, let answer) = failedWhileConnecting(failure, grpc: true) else {
                Issue.record("no error answer for \(failure)")
                continue
            }
            #expect(answer.grpc == .unavailable)
            #expect(answer.status == 502)
        }
        var s = setup()
        s.grpc = true
        var m = Machine(setup: s)
        _ = m.start()
        #expect(m.tokenUnavailable() == .respondTokenUnavailable(Answer(kind: .tokenUnavailable, grpc: .unavailable, keepAlive: true)))
        var n = Machine(setup: setup())
        _ = n.start()
        #expect(n.tokenUnavailable() == .respondTokenUnavailable(Answer(kind: .tokenUnavailable, grpc: nil, keepAlive: true)))
    }

    /// docs/architecture.md §6.16: a caller's missing, invalid or refused token is bearerd's 401
    /// before anything is sent; only while the exchange waits for its token.
    @Test func aRefusedCallerIsAnsweredOnlyWhileWaitingForItsToken() {
        var m = Machine(setup: setup())
        #expect(m.start() == .acquireToken)
        #expect(m.callerRefused() == .respondCallerRefused(keepAlive: true, grpc: false))
        #expect(m.tokenAcquired() == ProxyExchange.Action.none)  // finished: nothing is sent
        var s = setup()
        s.grpc = true
        var g = Machine(setup: s)
        _ = g.start()
        #expect(g.callerRefused() == .respondCallerRefused(keepAlive: true, grpc: true))
        // Once the token is there the caller was admitted: a late refusal changes nothing.
        var f = Machine(setup: setup())
        _ = f.start()
        _ = f.tokenAcquired()
        #expect(f.callerRefused() == ProxyExchange.Action.none)
    }

    @Test func anExtendedConnectAnswered2xxNamesTheStatus() {
        var s = setup()
        s.upgrade = .extendedConnect
        var m = forwarding(s)
        #expect(m.upstreamFinalHead(status: 204, wwwAuthenticate: { [] })
                == .respondUpstreamError(.upgradeNotSwitched, Answer(kind: .upstreamInvalidResponse, grpc: nil, keepAlive: false)))
    }

    // MARK: keep-alive

    @Test func aClientThatDidNotAskForKeepAliveNeverGetsIt() {
        var s = setup(session: false)
        s.clientKeepAlive = false
        var m = forwarding(s)
        _ = m.upstreamFinalHead(status: 200, wwwAuthenticate: { [] })
        #expect(m.upstreamReadComplete() == .writeResponseHead(keepAlive: false))
        #expect(m.upstreamEnded() == .finishResponse(writeHeadFirst: false, backend: .release, keepAlive: false))
        #expect(failedWhileConnecting(.unreachable, grpc: false, keepAlive: false)
                == .respondUpstreamError(.unreachable, Answer(kind: .upstreamUnreachable, grpc: nil, keepAlive: false)))
        var t = setup()
        t.clientKeepAlive = false
        var n = Machine(setup: t)
        _ = n.start()
        #expect(n.tokenUnavailable() == .respondTokenUnavailable(Answer(kind: .tokenUnavailable, grpc: nil, keepAlive: false)))
    }

    /// The head went out saying the connection closes (an HTTP/1.0 client and no length, or a
    /// draining server): the response's end does not keep it.
    @Test func aHeadThatSaidCloseEndsTheConnection() {
        var m = forwarding(setup(session: false))
        _ = m.upstreamFinalHead(status: 200, wwwAuthenticate: { [] })
        #expect(m.upstreamBodyReceived(count: 5) == .forwardResponseBody(writeHeadFirst: true, keepAlive: true))
        #expect(m.clientConnectionClosesAfterResponse() == .none)
        #expect(m.upstreamEnded() == .finishResponse(writeHeadFirst: false, backend: .release, keepAlive: false))

        var n = forwarding(setup(session: false))
        _ = n.upstreamFinalHead(status: 200, wwwAuthenticate: { [] })
        _ = n.upstreamReadComplete()
        #expect(n.upstreamEnded() == .finishResponse(writeHeadFirst: false, backend: .release, keepAlive: true))
    }

    @Test func anUnreadBodyEndsTheConnection() {
        var m = forwarding(setup(body: true, session: false))
        _ = m.clientBodyReceived(count: 3)
        #expect(m.upstreamFailed(.timeout, reusedConnection: false, responseBytesSeen: false)
                == .respondUpstreamError(.timeout, Answer(kind: .upstreamTimeout, grpc: nil, keepAlive: false)))
    }

    // MARK: held rejections

    func heldAndPassedThrough(bodyBytes: Int, trailers: Bool) -> ProxyExchange.Action {
        var m = forwarding(setup())
        #expect(m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] }) == .holdRejection)
        if bodyBytes > 0 { #expect(m.upstreamBodyReceived(count: bodyBytes) == .holdRejectionBody) }
        #expect(m.upstreamEnded(hasTrailers: trailers) == .rejectionDrained(backend: .release, reportNow: true))
        return m.rejectionOutcome(.passThrough)
    }

    /// A gRPC rejection carries its status in trailers: those must go out after the head, so the
    /// head alone is the whole response only without body and trailers.
    @Test func aHeldRejectionIsAHeadAloneOnlyWithoutBodyAndTrailers() {
        #expect(heldAndPassedThrough(bodyBytes: 0, trailers: false) == .sendHeldRejection(reason: nil, refreshOnly: false, keepAlive: true, bodyless: true))
        #expect(heldAndPassedThrough(bodyBytes: 0, trailers: true) == .sendHeldRejection(reason: nil, refreshOnly: false, keepAlive: true, bodyless: false))
        #expect(heldAndPassedThrough(bodyBytes: 7, trailers: false) == .sendHeldRejection(reason: nil, refreshOnly: false, keepAlive: true, bodyless: false))
    }

    /// A rejection whose connection failed while it drained is answered as that failure.
    @Test func aCutRejectionIsAnsweredAsItsFailure() {
        var m = forwarding(setup())
        _ = m.upstreamFinalHead(status: 401, wwwAuthenticate: { [] })
        _ = m.upstreamBodyReceived(count: 3)
        #expect(m.upstreamFailed(.timeout, reusedConnection: false, responseBytesSeen: true)
                == .rejectionDrained(backend: .alreadyClosed, reportNow: true))
        #expect(m.state == .awaitingReplayToken(.cut(.timeout)))
        #expect(m.rejectionOutcome(.passThrough)
                == .respondUpstreamError(.timeout, Answer(kind: .upstreamTimeout, grpc: nil, keepAlive: true)))
    }

    // MARK: tunnel and the response's start

    @Test func tunnelBytesFlowOnlyWhileTunnelling() {
        var s = setup()
        s.upgrade = .http1
        var m = forwarding(s)
        #expect(m.clientTunnelBytes() == .none)
        #expect(m.upstreamTunnelBytes() == .none)
        #expect(!m.responseStarted)
        _ = m.upstreamSwitchedProtocols()
        #expect(m.responseStarted)
        #expect(m.clientTunnelBytes() == .relayTunnelBytes(.toUpstream))
        #expect(m.upstreamTunnelBytes() == .relayTunnelBytes(.toClient))
        _ = m.tunnelEnded()
        #expect(m.clientTunnelBytes() == .none)
        #expect(m.upstreamTunnelBytes() == .none)
    }

    @Test func theResponseStartsWithTheHeadOnTheWire() {
        var m = forwarding(setup(session: false))
        _ = m.upstreamFinalHead(status: 200, wwwAuthenticate: { [] })
        #expect(!m.responseStarted, "a pending head can still be replaced by an error")
        _ = m.upstreamReadComplete()
        #expect(m.responseStarted)
    }
}
