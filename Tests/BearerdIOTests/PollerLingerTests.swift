import Testing
import Dispatch
import Synchronization
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

/// The loop poller keeps its queue while events keep coming (no Dispatch wake-up per handful of
/// events), yet gives it back at once to work queued with `execute` and within its budget to
/// everything else on the queue.
@Suite("loop poller linger", .serialized)
struct PollerLingerTests {
    /// Two non-blocking pipes served by one loop: each byte read from one is answered with a
    /// byte on the other, so events follow each other without the test thread.
    final class PingPong: @unchecked Sendable {  // @unchecked: touched on the loop; counters atomic
        let loop: EventLoop
        var a: [Int32] = [0, 0]
        var b: [Int32] = [0, 0]
        let events = Atomic<Int>(0)
        let running = Atomic<Bool>(true)

        final class End: LoopPollable, @unchecked Sendable {  // @unchecked: used on the loop only
            let readFD: Int32
            let replyFD: Int32
            unowned let owner: PingPong
            init(readFD: Int32, replyFD: Int32, owner: PingPong) {
                self.readFD = readFD
                self.replyFD = replyFD
                self.owner = owner
            }
            func pollerEvent(readable: Bool, writable: Bool, hangup: Bool) {
                var byte: UInt8 = 0
                var got = 0
                while read(readFD, &byte, 1) == 1 { got += 1 }  // edge-triggered: drain
                guard got > 0, owner.running.load(ordering: .relaxed) else { return }
                owner.events.add(1, ordering: .relaxed)
                _ = write(replyFD, &byte, 1)
            }
        }
        var ends: [End] = []

        init() {
            loop = EventLoop(index: 70, readBufferSize: 4096, ioMode: .loopPoller)
            #expect(pipe(&a) == 0 && pipe(&b) == 0)
            for fd in a + b { _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) }
            ends = [End(readFD: a[0], replyFD: b[1], owner: self), End(readFD: b[0], replyFD: a[1], owner: self)]
            let done = DispatchSemaphore(value: 0)
            loop.execute { [self] in
                loop.registerPollable(fd: a[0], ends[0])
                loop.registerPollable(fd: b[0], ends[1])
                var byte: UInt8 = 1
                _ = write(a[1], &byte, 1)  // the first serve
                done.signal()
            }
            done.wait()
        }

        func stop() {
            running.store(false, ordering: .relaxed)
            let done = DispatchSemaphore(value: 0)
            loop.execute { [self] in
                loop.unregisterPollable(fd: a[0])
                loop.unregisterPollable(fd: b[0])
                done.signal()
            }
            done.wait()
            for fd in a + b { close(fd) }
        }

        /// Waits until at least `count` events have been served, at most `within` nanoseconds
        /// from `since` (default: now); false when the deadline passed first.
        func waitForEvents(_ count: Int, within: UInt64 = 10_000_000_000, since: UInt64? = nil) -> Bool {
            let t0 = since ?? monotonicNanos()
            while events.load(ordering: .relaxed) < count {
                if monotonicNanos() &- t0 >= within { return false }
                usleep(1_000)
            }
            return true
        }

        var wakeups: Int {
            let done = DispatchSemaphore(value: 0)
            nonisolated(unsafe) var n = 0
            loop.execute { [self] in
                n = loop.pollerWakeups
                done.signal()
            }
            done.wait()
            return n
        }
    }

    /// Thousands of back-to-back events take few Dispatch wake-ups (with 16 rounds per wake-up,
    /// as before, the ratio was at most ~17 events per wake-up).
    @Test func eventsInARowShareOneWakeUp() {
        let p = PingPong()
        defer { p.stop() }
        let before = p.wakeups
        let t0 = monotonicNanos()
        _ = p.waitForEvents(20_000, within: 10_000_000_000, since: t0)
        let events = p.events.load(ordering: .relaxed)
        let wakeups = max(1, p.wakeups - before)
        #expect(events >= 20_000, "the ping-pong stalled at \(events) events")
        #expect(events / wakeups >= 100, "\(events) events took \(wakeups) Dispatch wake-ups")
    }

    /// Work queued with `execute` while events keep coming runs promptly: the linger gives the
    /// queue back as soon as a block waits.
    @Test func executedWorkIsNotHeldBackByALingeringPoller() {
        let p = PingPong()
        defer { p.stop() }
        // The loop is lingering once the ping-pong runs; a stalled ping-pong fails within 10 s.
        guard p.waitForEvents(1_000) else {
            Issue.record("the ping-pong stalled at \(p.events.load(ordering: .relaxed)) events")
            return
        }
        var worst: UInt64 = 0
        for _ in 0..<20 {
            let ran = DispatchSemaphore(value: 0)
            let queuedAt = monotonicNanos()
            nonisolated(unsafe) var startedAt: UInt64 = 0
            p.loop.execute {
                startedAt = monotonicNanos()
                ran.signal()
            }
            guard ran.wait(timeout: .now() + 5) == .success else {
                Issue.record("work queued with execute did not run within 5 s while events kept coming")
                return
            }
            worst = max(worst, startedAt &- queuedAt)
            usleep(2_000)
        }
        let eventsAfter = p.events.load(ordering: .relaxed)
        #expect(eventsAfter > 1_000)
        // Typically well under a millisecond; 50 ms leaves room for a loaded machine, and is
        // still far below what an unbounded linger would hold the queue for (until the events stop).
        #expect(worst < 50_000_000, "execute waited \(worst / 1_000) µs behind the poller")
    }

    /// A Dispatch timer on the loop's queue (the tick, a session timer) fires while events keep
    /// coming: the linger ends within its budget.
    @Test func timersOnTheQueueFireWhileEventsKeepComing() {
        let p = PingPong()
        defer { p.stop() }
        guard p.waitForEvents(1_000) else {
            Issue.record("the ping-pong stalled at \(p.events.load(ordering: .relaxed)) events")
            return
        }
        let fired = DispatchSemaphore(value: 0)
        let armedAt = monotonicNanos()
        nonisolated(unsafe) var firedAt: UInt64 = 0
        p.loop.schedule(after: .milliseconds(20)) {
            firedAt = monotonicNanos()
            fired.signal()
        }
        #expect(fired.wait(timeout: .now() + 5) == .success, "a timer on the queue never fired while events kept coming")
        let late = (firedAt &- armedAt) / 1_000_000
        #expect(late < 200, "the 20 ms timer fired after \(late) ms")
    }
}
