import Testing
@testable import BearerdProxyCore

typealias PoolMachine = BackendPool.StateMachine
typealias CID = BackendPool.ConnectionID
typealias RID = BackendPool.RequestID

func poolConfig(maxIdle: Int = 4, idleTimeout: UInt64 = 1_000, mayUseHTTP2: Bool = false, remembersHTTP1: Bool = true,
                http1Impossible: Bool = false) -> BackendPool.Configuration {
    BackendPool.Configuration(maxIdle: maxIdle, idleTimeout: idleTimeout, mayUseHTTP2: mayUseHTTP2,
                              remembersHTTP1: remembersHTTP1, http1Impossible: http1Impossible)
}

@Suite("BackendPool.StateMachine: scripted")
struct BackendPoolScriptTests {
    let c0 = CID(0), c1 = CID(1), c2 = CID(2)
    let r1 = RID(1), r2 = RID(2), r3 = RID(3)

    @Test func http1ConnectionIsReusedAfterARelease() {
        var m = PoolMachine(configuration: poolConfig())
        do { let v = m.takeReady(http1Only: false); #expect(v == nil) }
        do { let v = m.request(r1, http1Only: false); #expect(v == [.connect(c0, http1Only: false)]) }
        do { let v = m.resolved(c0); #expect(v) }
        do { let v = m.connected(c0, .http1, now: 10); #expect(v == [.lease(c0, to: r1, reused: false)]) }
        do { let v = m.released(c0, reusable: true, now: 20); #expect(v == .park(deadline: 1_020)) }
        #expect(m.idleCount == 1)
        do { let v = m.takeReady(http1Only: false); #expect(v == .idleConnection(c0, idleSince: 20)) }
        do { let v = m.takeReady(http1Only: false); #expect(v == nil) }
        do { let v = m.released(c0, reusable: false, now: 30); #expect(v == .close) }
        #expect(m.connectionCount == 0)
    }

    @Test func aFreshRequestOpensItsOwnConnectionBesideAnIdleOne() {
        var m = PoolMachine(configuration: poolConfig())
        _ = m.request(r1, http1Only: false)
        _ = m.connected(c0, .http1, now: 0)
        _ = m.released(c0, reusable: true, now: 1)
        do { let v = m.request(r2, http1Only: false, fresh: true); #expect(v == [.connect(c1, http1Only: false)]) }
        #expect(m.idleCount == 1)
        do { let v = m.connected(c1, .http1, now: 2); #expect(v == [.lease(c1, to: r2, reused: false)]) }
    }

    @Test func idsOfClosedConnectionsAreReused() {
        var m = PoolMachine(configuration: poolConfig())
        _ = m.request(r1, http1Only: false)
        _ = m.connected(c0, .http1, now: 0)
        m.connectionClosed(c0)
        // A late report about the old c0 changes nothing.
        do { let v = m.released(c0, reusable: true, now: 1); #expect(v == .close) }
        do { let v = m.request(r2, http1Only: false); #expect(v == [.connect(c0, http1Only: false)]) }
        #expect(m.idleCount == 0 && m.waitingCount == 1)
    }

    @Test func idleConnectionsAreReusedWarmestFirst() {
        var m = PoolMachine(configuration: poolConfig())
        _ = m.request(r1, http1Only: false)
        _ = m.request(r2, http1Only: false)
        _ = m.connected(c0, .http1, now: 0)
        _ = m.connected(c1, .http1, now: 0)
        do { let v = m.released(c0, reusable: true, now: 1); #expect(v == .park(deadline: 1_001)) }
        do { let v = m.released(c1, reusable: true, now: 2); #expect(v == .park(deadline: 1_002)) }
        do { let v = m.takeReady(http1Only: true); #expect(v == .idleConnection(c1, idleSince: 2)) }
    }

    @Test func idleConnectionsBeyondTheLimitClose() {
        var m = PoolMachine(configuration: poolConfig(maxIdle: 1))
        do { let v = m.request(r1, http1Only: false); #expect(v == [.connect(c0, http1Only: false)]) }
        do { let v = m.request(r2, http1Only: false); #expect(v == [.connect(c1, http1Only: false)]) }
        _ = m.connected(c0, .http1, now: 0)
        _ = m.connected(c1, .http1, now: 0)
        do { let v = m.released(c0, reusable: true, now: 1); #expect(v == .park(deadline: 1_001)) }
        do { let v = m.released(c1, reusable: true, now: 1); #expect(v == .close) }
        #expect(m.idleCount == 1)
        #expect(m.connectionCount == 1)
    }

    @Test func idleConnectionClosesAtItsTimeout() {
        var m = PoolMachine(configuration: poolConfig(idleTimeout: 50))
        _ = m.request(r1, http1Only: false)
        _ = m.connected(c0, .http1, now: 0)
        _ = m.released(c0, reusable: true, now: 100)
        #expect(m.idleDeadline(c0) == 150)
        do { let v = m.idleTimerFired(c0, now: 149); #expect(!v) }
        do { let v = m.idleTimerFired(c0, now: 150); #expect(v) }
        do { let v = m.takeReady(http1Only: false); #expect(v == nil) }
        #expect(m.idleDeadline(c0) == nil)
    }

    @Test func requestsShareOneAttemptThatMaySpeakHTTP2() {
        var m = PoolMachine(configuration: poolConfig(mayUseHTTP2: true))
        do { let v = m.request(r1, http1Only: false); #expect(v == [.connect(c0, http1Only: false)]) }
        do { let v = m.request(r2, http1Only: false); #expect(v == []) }
        do { let v = m.request(r3, http1Only: false); #expect(v == []) }
        do { let v = m.takeReady(http1Only: false); #expect(v == nil) }
        // Limit 2: the third request opens another shared attempt.
        do { let v = m.connected(c0, .http2(maxConcurrentStreams: 2), now: 0); #expect(v == [.openStream(c0, for: r1, reused: false), .openStream(c0, for: r2, reused: false), .connect(c1, http1Only: false)]) }
        #expect(m.streams(c0)?.open == 2)
        m.streamClosed(c0)
        do { let v = m.takeReady(http1Only: false); #expect(v == .stream(c0)) }
        do { let v = m.takeReady(http1Only: false); #expect(v == nil) }
    }

    @Test func anHTTP1AnswerIsRememberedAndTheOthersOpenTheirOwn() {
        var m = PoolMachine(configuration: poolConfig(mayUseHTTP2: true))
        _ = m.request(r1, http1Only: false)
        _ = m.request(r2, http1Only: false)
        do { let v = m.connected(c0, .http1, now: 0); #expect(v == [.lease(c0, to: r1, reused: false), .connect(c1, http1Only: false)]) }
        #expect(m.knowledge == .http1)
        do { let v = m.request(r3, http1Only: false); #expect(v == [.connect(c2, http1Only: false)]) }
    }

    @Test func anUpgradeDoesNotWaitForTheSharedAttempt() {
        var m = PoolMachine(configuration: poolConfig(mayUseHTTP2: true))
        _ = m.request(r1, http1Only: false)
        do { let v = m.request(r2, http1Only: true); #expect(v == [.connect(c1, http1Only: true)]) }
        // An HTTP/2 connection never serves an upgrade.
        do { let v = m.connected(c1, .http2(maxConcurrentStreams: 10), now: 0); #expect(v == [.connect(c2, http1Only: true)]) }
    }

    @Test func anUpgradeFailsWhereOnlyHTTP2IsSpoken() {
        var m = PoolMachine(configuration: poolConfig(mayUseHTTP2: true, remembersHTTP1: false, http1Impossible: true))
        do { let v = m.request(r1, http1Only: true); #expect(v == [.fail(r1, .http1Impossible)]) }
        #expect(m.waitingCount == 0)
    }

    @Test func anAttemptWhoseRequestsWentAwayIsNotOpened() {
        var m = PoolMachine(configuration: poolConfig(mayUseHTTP2: true))
        _ = m.request(r1, http1Only: false)
        _ = m.request(r2, http1Only: false)
        m.cancel(r1)
        m.cancel(r2)
        do { let v = m.resolved(c0); #expect(!v) }
        #expect(m.connectionCount == 0)
        do { let v = m.request(r3, http1Only: false); #expect(v == [.connect(c0, http1Only: false)]) }
    }

    @Test func anOrphanedHTTP1AttemptServesTheNextRequest() {
        var m = PoolMachine(configuration: poolConfig())
        _ = m.request(r1, http1Only: false)
        m.cancel(r1)
        do { let v = m.request(r2, http1Only: false); #expect(v == []) }
        do { let v = m.resolved(c0); #expect(v) }
        do { let v = m.connected(c0, .http1, now: 0); #expect(v == [.lease(c0, to: r2, reused: false)]) }
    }

    @Test func anOrphanedConnectionIdlesOrClosesWhenThePoolIsFull() {
        var m = PoolMachine(configuration: poolConfig(maxIdle: 0))
        _ = m.request(r1, http1Only: false)
        m.cancel(r1)
        do { let v = m.connected(c0, .http1, now: 0); #expect(v == [.close(c0)]) }
        var n = PoolMachine(configuration: poolConfig(maxIdle: 1))
        _ = n.request(r1, http1Only: false)
        n.cancel(r1)
        do { let v = n.connected(c0, .http1, now: 0); #expect(v == [.park(c0)]) }
        do { let v = n.takeReady(http1Only: false); #expect(v == .idleConnection(c0, idleSince: 0)) }
    }

    @Test func aFailedAttemptFailsEveryRequestThatStillWaits() {
        var m = PoolMachine(configuration: poolConfig(mayUseHTTP2: true))
        _ = m.request(r1, http1Only: false)
        _ = m.request(r2, http1Only: false)
        _ = m.request(r3, http1Only: false)
        m.cancel(r2)
        do { let v = m.connectFailed(c0); #expect(v == [.fail(r1, .connectFailed), .fail(r3, .connectFailed)]) }
        #expect(m.waitingCount == 0)
        #expect(m.connectionCount == 0)
    }

    @Test func aConnectionGoingAwayTakesNoStreamsAndLowerLimitsAreObeyed() {
        var m = PoolMachine(configuration: poolConfig(mayUseHTTP2: true))
        _ = m.request(r1, http1Only: false)
        _ = m.connected(c0, .http2(maxConcurrentStreams: 100), now: 0)
        m.settingsChanged(c0, maxConcurrentStreams: 1)
        do { let v = m.takeReady(http1Only: false); #expect(v == nil) }
        m.streamClosed(c0)
        m.goingAway(c0)
        do { let v = m.takeReady(http1Only: false); #expect(v == nil) }
        do { let v = m.request(r2, http1Only: false); #expect(v == [.connect(c1, http1Only: false)]) }
        m.connectionClosed(c0)
        #expect(m.streams(c0) == nil)
    }

    @Test func closeAllReturnsIdleAndHTTP2Connections() {
        var m = PoolMachine(configuration: poolConfig(mayUseHTTP2: true))
        _ = m.request(r1, http1Only: false)
        _ = m.request(r2, http1Only: true)
        _ = m.connected(c0, .http2(maxConcurrentStreams: 5), now: 0)
        _ = m.connected(c1, .http1, now: 0)
        _ = m.released(c1, reusable: true, now: 0)
        #expect(Set(m.closeAll()) == [c0, c1])
        #expect(m.connectionCount == 0)
    }
}

/// Random event sequences against the pool machine's invariants (see `BackendPool.StateMachine`).
@Suite("BackendPool.StateMachine: invariants under random events")
struct BackendPoolInvariantTests {
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

    /// The test's own account of the shell's world.
    struct Model {
        var resumed: [RID: Int] = [:]
        var cancelled: Set<RID> = []
        var issued: [RID] = []
        var waiting: Set<RID> = []
        /// HTTP/1.1 connections leased, and to whom.
        var leasedTo: [CID: RID] = [:]
        /// Streams open per HTTP/2 connection, and the limit the server announced.
        var streams: [CID: Int] = [:]
        var limits: [CID: Int] = [:]
        var problems: [String] = []

        mutating func resume(_ r: RID) {
            resumed[r, default: 0] += 1
            if cancelled.contains(r) { problems.append("\(r) resumed after cancel") }
            if !waiting.contains(r) { problems.append("\(r) resumed while not waiting") }
            waiting.remove(r)
        }

        mutating func closed(_ c: CID) {
            leasedTo[c] = nil
            streams[c] = nil
            limits[c] = nil
        }

        mutating func apply(_ actions: [BackendPool.Action], _ m: PoolMachine) {
            for a in actions {
                switch a {
                case .connect(let c, _):
                    if !m.waiting.values.contains(where: { $0.attempt == c }) { problems.append("\(c) opened for nobody") }
                case .lease(let c, let r, _, _):
                    resume(r)
                    if let holder = leasedTo[c] { problems.append("\(c) leased to \(r) while held by \(holder)") }
                    leasedTo[c] = r
                case .openStream(let c, let r, _):
                    resume(r)
                    streams[c, default: 0] += 1
                    if let limit = limits[c], streams[c, default: 0] > limit { problems.append("\(c) over its stream limit \(limit)") }
                case .fail(let r, _):
                    resume(r)
                case .park:
                    break
                case .close(let c):
                    closed(c)
                }
            }
        }
    }

    @Test(arguments: 0..<300)
    func invariantsHold(seed: Int) {
        var rng = SplitMix64(state: UInt64(seed))
        let mayUseHTTP2 = Bool.random(using: &rng)
        let config = poolConfig(maxIdle: Int.random(in: 0...3, using: &rng), idleTimeout: 100, mayUseHTTP2: mayUseHTTP2,
                                remembersHTTP1: Bool.random(using: &rng), http1Impossible: mayUseHTTP2 && Int.random(in: 0..<4, using: &rng) == 0)
        var m = PoolMachine(configuration: config)
        var model = Model()
        var now: UInt64 = 0
        var nextRequest = 0
        var log: [String] = []

        func attempts() -> [CID] {
            m.connections.indices.compactMap { i in
                if case .connecting = m.connections[i] { return CID(i) }
                return nil
            }
        }
        func connect(_ c: CID, _ rng: inout SplitMix64) {
            let outcome: BackendPool.Negotiated = mayUseHTTP2 && Bool.random(using: &rng)
                ? .http2(maxConcurrentStreams: Int.random(in: 1...3, using: &rng)) : .http1
            if case .http2(let limit) = outcome { model.limits[c] = limit }
            log.append("connected \(c) \(outcome)")
            model.apply(m.connected(c, outcome, now: now), m)
        }

        for _ in 0..<120 {
            now += UInt64.random(in: 0...30, using: &rng)
            switch Int.random(in: 0..<11, using: &rng) {
            case 0, 1:
                nextRequest += 1
                let r = RID(nextRequest)
                let http1Only = Int.random(in: 0..<5, using: &rng) == 0
                let fresh = Int.random(in: 0..<10, using: &rng) == 0
                model.issued.append(r)
                model.waiting.insert(r)
                log.append("request \(r) h1only=\(http1Only) fresh=\(fresh)")
                if !fresh, let ready = m.takeReady(http1Only: http1Only) {
                    switch ready {
                    case .stream(let c): model.apply([.openStream(c, for: r, reused: true)], m)
                    case .idleConnection(let c, let since): model.apply([.lease(c, to: r, reused: true, idleSince: since)], m)
                    }
                } else {
                    model.apply(m.request(r, http1Only: http1Only, fresh: fresh), m)
                }
            case 2:
                guard let r = model.waiting.randomElement(using: &rng) else { continue }
                log.append("cancel \(r)")
                model.waiting.remove(r)
                model.cancelled.insert(r)
                m.cancel(r)
            case 3:
                guard let c = attempts().randomElement(using: &rng) else { continue }
                log.append("resolved \(c)")
                _ = m.resolved(c)
            case 4, 5:
                guard let c = attempts().randomElement(using: &rng) else { continue }
                connect(c, &rng)
            case 6:
                guard let c = attempts().randomElement(using: &rng) else { continue }
                log.append("connectFailed \(c)")
                model.apply(m.connectFailed(c), m)
            case 7:
                guard let (c, _) = model.leasedTo.randomElement(using: &rng) else { continue }
                let reusable = Bool.random(using: &rng)
                log.append("release \(c) reusable=\(reusable)")
                model.leasedTo[c] = nil
                if m.released(c, reusable: reusable, now: now) == .close { model.closed(c) }
            case 8:
                guard let (c, n) = model.streams.randomElement(using: &rng), n > 0 else { continue }
                log.append("streamClosed \(c)")
                model.streams[c] = n - 1
                m.streamClosed(c)
            case 9:
                let open = m.connections.indices.filter { m.connections[$0] != .unused }
                guard let i = open.randomElement(using: &rng) else { continue }
                let c = CID(i)
                switch Int.random(in: 0..<4, using: &rng) {
                case 0:
                    guard case .connecting = m.connections[i] else {
                        log.append("closed \(c)")
                        m.connectionClosed(c)
                        model.closed(c)
                        continue
                    }
                case 1:
                    log.append("goingAway \(c)")
                    m.goingAway(c)
                case 2:
                    let limit = Int.random(in: 0...3, using: &rng)
                    log.append("settings \(c) \(limit)")
                    if m.streams(c)?.limit != nil { model.limits[c] = limit }
                    m.settingsChanged(c, maxConcurrentStreams: limit)
                default:
                    if m.idleTimerFired(c, now: now) {
                        log.append("idle timeout \(c)")
                        model.closed(c)
                    }
                }
            default:
                if Int.random(in: 0..<30, using: &rng) == 0 {
                    log.append("closeAll")
                    for c in m.closeAll() { model.closed(c) }
                }
            }

            // Invariants after every event.
            #expect(m.idleCount <= config.maxIdle, "idle over the limit, seed \(seed): \(log)")
            #expect(Set(m.idle).count == m.idle.count, "a connection idle twice, seed \(seed): \(log)")
            for c in m.idle { #expect(model.leasedTo[c] == nil, "\(c) idle while leased, seed \(seed): \(log)") }
            for (c, n) in model.streams {
                if case .multiplexing(let open, let limit) = m.connections[c.raw] {
                    #expect(open == n && limit == model.limits[c], "streams of \(c) differ, seed \(seed): \(log)")
                }
            }
            #expect(Set(m.waiting.keys) == model.waiting, "waiting requests differ, seed \(seed): \(log)")
            #expect(model.problems.isEmpty, "seed \(seed): \(model.problems) \(log)")
            if !model.problems.isEmpty { return }
        }

        // Drain: every attempt completes; every request not cancelled is resumed exactly once.
        var rounds = 0
        while let c = attempts().first, rounds < 500 {
            rounds += 1
            if Bool.random(using: &rng) { connect(c, &rng) } else { model.apply(m.connectFailed(c), m) }
        }
        #expect(rounds < 500, "attempts never ended, seed \(seed)")
        #expect(m.waitingCount == 0, "requests still waiting, seed \(seed): \(log)")
        for r in model.issued where !model.cancelled.contains(r) {
            #expect(model.resumed[r] == 1, "\(r) resumed \(model.resumed[r] ?? 0) times, seed \(seed): \(log)")
        }
        for r in model.cancelled { #expect(model.resumed[r] == nil, "cancelled \(r) resumed, seed \(seed)") }
        #expect(model.problems.isEmpty, "seed \(seed): \(model.problems)")
    }
}
