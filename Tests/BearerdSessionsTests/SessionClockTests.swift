import BearerdIO
import BearerdOAuth
import Foundation
import BearerdTestSupport
import Testing
@testable import BearerdConfig
@testable import BearerdSessions

/// The session clocks (STYLE "Three rings": time is an argument): the real one's timers run on
/// their loop, not before their deadline, and never once cancelled; the test clock fires due
/// timers in deadline order with the clock at each deadline.
@Suite("session clocks")
struct SessionClockTests {
    @Test func systemTimerRunsOnItsLoopNotBeforeItsDeadline() throws {
        let clock = SystemSessionClock()
        let loop = testLoops[1]
        let start = clock.now()
        let ran = OneAnswer<(onLoop: Bool, at: MonotonicInstant)>()
        clock.schedule(after: .milliseconds(30), on: loop) { ran.put((loop.inEventLoop, clock.now())) }
        let r = try #require(ran.wait(seconds: 5))
        #expect(r.onLoop)
        #expect(r.at - start >= .milliseconds(30))
        #expect(abs(clock.wallClockSeconds() - Int64(time(nil))) <= 1)
    }

    @Test func cancelledSystemTimerNeverRuns() throws {
        let clock = SystemSessionClock()
        let loop = testLoops[1]
        let cancelledRan = Latch()
        let timer = clock.schedule(after: .milliseconds(20), on: loop) { cancelledRan.open() }
        timer.cancel()
        timer.cancel()  // idempotent
        // A later timer on the same queue: once it ran, the earlier one would have run too.
        let later = OneAnswer<Bool>()
        clock.schedule(after: .milliseconds(60), on: loop) { later.put(true) }
        #expect(later.wait(seconds: 5) == true)
        #expect(!cancelledRan.isOpen)
    }

    @Test func systemTimerInThePastRunsAtOnceButNotSynchronously() throws {
        let clock = SystemSessionClock()
        let loop = testLoops[1]
        let ran = OneAnswer<Bool>()
        // Armed from an event on the timer's own loop: it cannot run before that event ends.
        let ranDuringTheEvent: Bool = loop.queue.sync {
            var during = false
            loop.runEvent {
                clock.schedule(at: MonotonicInstant(nanoseconds: 0), on: loop) { ran.put(true) }
                during = ran.wait(seconds: 0.05) != nil
            }
            return during
        }
        #expect(!ranDuringTheEvent)
        #expect(ran.wait(seconds: 5) == true)
    }

    @Test func fakeClockFiresDueTimersInDeadlineOrderAtTheirDeadlines() async {
        let clock = FakeSessionClock()
        let t0 = clock.now()
        let fired = OneAnswerList()
        let loop = testLoops[2]
        clock.schedule(after: .seconds(2), on: loop) { fired.add("two", clock.now() - t0) }
        clock.schedule(after: .seconds(1), on: loop) { fired.add("one", clock.now() - t0) }
        clock.schedule(after: .seconds(3), on: loop) { fired.add("three", clock.now() - t0) }.cancel()
        clock.schedule(after: .seconds(9), on: loop) { fired.add("nine", clock.now() - t0) }
        await clock.advance(by: .milliseconds(999))
        #expect(fired.items.isEmpty)
        await clock.advance(by: .seconds(4))
        #expect(fired.items.map(\.0) == ["one", "two"])
        #expect(fired.items.map(\.1) == [.seconds(1), .seconds(2)])
        #expect(clock.now() - t0 == .milliseconds(4999))
        #expect(clock.pendingDeadlines == [t0 + .seconds(9)])
    }

    /// One session timer (docs/architecture.md §6): each new token re-arms the refresh and the previous timer
    /// is cancelled, not left to fire as a no-op; `stop()` cancels the armed one.
    @Test func aNewRefreshScheduleCancelsThePreviousTimer() async throws {
        let endpoint = try ScriptedTokenEndpoint { _, n in ScriptedTokenEndpoint.token("access-AAA-\(n)", expiresIn: 3600) }
        defer { endpoint.stop() }
        let clock = FakeSessionClock()
        let t0 = clock.now()
        let session = SessionConfig(name: "partner", grant: .clientCredentials, tokenURL: endpoint.url, clientID: "svc",
                                    clientSecret: .literal(Secret("not-a-real-secret")))
        let manager = try SessionManager(config: sessionConfig(session), logger: CapturedLogs().logger, environment: [:],
                                         tunePolicy: nil, clock: clock)
        defer { manager.stop() }
        let driver = try #require(manager.session(named: "partner"))
        /// Refresh timers: past every request and waiter timeout (at most 15 s out).
        func refreshTimers() -> Int { clock.pendingDeadlines.filter { $0 - t0 > .seconds(60) }.count }
        var generation = try await requestToken(driver).get().generation
        await FakeSessionClock.settle(driver.queue)
        #expect(refreshTimers() == 1)
        for _ in 0..<3 {
            await clock.advance(by: .seconds(2))  // forced refreshes are paced at one a second
            guard case .replay(let t, _) = await reportRejected(driver, generation: generation) else { Issue.record("expected replay"); return }
            generation = t.generation
            await FakeSessionClock.settle(driver.queue)
            #expect(refreshTimers() == 1, "the previous refresh timer was cancelled")
        }
        #expect(generation == 4)
        manager.stop()
        await FakeSessionClock.settle(driver.queue)
        #expect(refreshTimers() == 0, "stop cancels the armed timer")
    }
}

/// What fired, in order (any thread).
final class OneAnswerList: @unchecked Sendable {  // @unchecked: `list` guarded by `lock`
    private let lock = NSLock()
    private var list: [(String, Duration)] = []
    func add(_ name: String, _ at: Duration) { lock.withLock { list.append((name, at)) } }
    var items: [(String, Duration)] { lock.withLock { list } }
}
