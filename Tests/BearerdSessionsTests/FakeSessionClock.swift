import BearerdIO
import BearerdOAuth
import Foundation
@testable import BearerdSessions

/// A `SessionClock` the test moves forward itself (swift-nio's `NIOScheduledCallback` and
/// Hummingbird's test clocks): nothing happens because real time passed, only because the test
/// called `advance(by:)`, which fires every timer that came due, in deadline order, with the
/// clock set to that timer's deadline.
///
/// Starts at the real monotonic and wall clocks, so a token the session publishes compares
/// sensibly with the loops' `monotonicNanos()` until the test moves the clock on.
///
/// Owns the current instants and the pending timers, guarded by `lock` (any thread). Invariant:
/// a timer runs at most once, on its loop, and never after `cancel()` returned.
final class FakeSessionClock: SessionClock, @unchecked Sendable {  // @unchecked: state guarded by `lock`
    /// One pending timer; `cancelled` guarded by the clock's `lock`.
    final class Timer: SessionTimer, @unchecked Sendable {  // @unchecked: `cancelled` guarded by `clock.lock`
        let deadline: MonotonicInstant
        let serial: UInt64
        let loop: EventLoop
        let work: () -> Void
        fileprivate weak var clock: FakeSessionClock?
        fileprivate var cancelled = false

        fileprivate init(deadline: MonotonicInstant, serial: UInt64, loop: EventLoop, work: @escaping () -> Void) {
            self.deadline = deadline
            self.serial = serial
            self.loop = loop
            self.work = work
        }

        func cancel() {
            guard let clock else { return }
            clock.lock.withLock {
                cancelled = true
                clock.pending.removeAll { $0 === self }
            }
        }

        /// On `loop`: the work, unless cancelled meanwhile.
        fileprivate func run() {
            let live = clock?.lock.withLock { !cancelled } ?? true
            if live { work() }
        }
    }

    fileprivate let lock = NSLock()
    private var monotonic: UInt64
    /// The wall clock moves with the monotonic one from these starting readings.
    private let startMonotonic: UInt64
    private let startWall: Int64
    fileprivate var pending: [Timer] = []
    private var serial: UInt64 = 0
    private var fired = 0

    init() {
        monotonic = monotonicNanos()
        startMonotonic = monotonic
        startWall = Int64(time(nil))
    }

    func now() -> MonotonicInstant { lock.withLock { MonotonicInstant(nanoseconds: monotonic) } }

    func wallClockSeconds() -> Int64 { lock.withLock { startWall &+ Int64((monotonic &- startMonotonic) / 1_000_000_000) } }

    /// Timers not yet due (nor cancelled).
    var pendingDeadlines: [MonotonicInstant] { lock.withLock { pending.map(\.deadline).sorted() } }

    /// How many timers have run so far.
    var firedCount: Int { lock.withLock { fired } }

    func schedule(at deadline: MonotonicInstant, on loop: EventLoop, _ work: @escaping () -> Void) -> SessionTimer {
        let (timer, due): (Timer, Bool) = lock.withLock {
            serial &+= 1
            let t = Timer(deadline: deadline, serial: serial, loop: loop, work: work)
            t.clock = self
            let due = deadline.nanoseconds <= monotonic
            if due { fired += 1 } else { pending.append(t) }
            return (t, due)
        }
        if due { loop.execute { timer.run() } }
        return timer
    }

    /// Moves both clocks forward by `duration`, firing each timer that comes due (in deadline
    /// order, the clock at its deadline) and waiting until its loop has run it and what it
    /// queued there at once. Work that leaves the loop (a token request on the network) is not
    /// waited for: the test waits for its outcome with a bounded gate.
    func advance(by duration: Duration) async {
        let target = now() + duration
        for _ in 0..<10_000 {
            let next: Timer? = lock.withLock {
                guard let i = pending.indices.min(by: { (pending[$0].deadline, pending[$0].serial) < (pending[$1].deadline, pending[$1].serial) }),
                      pending[i].deadline <= target else { return nil }
                let t = pending.remove(at: i)
                moveTo(t.deadline)
                fired += 1
                return t
            }
            guard let next else { break }
            next.loop.execute { next.run() }
            await Self.settle(next.loop)
        }
        lock.withLock { moveTo(target) }
    }

    /// Moves the clocks to the earliest pending deadline and fires what is due then (as
    /// `advance(by:)`); returns that deadline, nil (and no move) when nothing is pending. For
    /// a timer whose instant is jittered, and so that a later timer (a request timeout) does not
    /// come due while the work this one started is still on the network in real time.
    @discardableResult
    func advanceToNextTimer() async -> MonotonicInstant? {
        guard let next = pendingDeadlines.first else { return nil }
        await advance(by: next - now())
        return next
    }

    /// Under `lock`: both clocks to `instant` (never backwards).
    private func moveTo(_ instant: MonotonicInstant) {
        monotonic = max(monotonic, instant.nanoseconds)
    }

    /// Returns once `loop` has run everything queued on it now, and what that queued in turn
    /// (a few rounds: the session driver hops onto its own queue once or twice per action).
    static func settle(_ loop: EventLoop, rounds: Int = 4) async {
        for _ in 0..<rounds {
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in loop.execute { c.resume() } }
        }
    }
}

/// A one-shot flag any thread may open and read.
final class Latch: @unchecked Sendable {  // @unchecked: `opened` guarded by `lock`
    private let lock = NSLock()
    private var opened = false
    func open() { lock.withLock { opened = true } }
    var isOpen: Bool { lock.withLock { opened } }
}

/// One value handed over from a completion (any thread) to the test, which waits for it with a
/// bound instead of awaiting a continuation that might never resume.
final class OneAnswer<Value>: @unchecked Sendable {  // @unchecked: `value` guarded by `condition`
    private let condition = NSCondition()
    private var value: Value?

    func put(_ v: Value) {
        condition.lock()
        if value == nil { value = v }
        condition.broadcast()
        condition.unlock()
    }

    /// The value once it is there, nil if it does not come within `seconds`.
    func wait(seconds: Double) -> Value? {
        let deadline = Date().addingTimeInterval(seconds)
        condition.lock()
        defer { condition.unlock() }
        while value == nil {
            if !condition.wait(until: deadline) { break }
        }
        return value
    }
}
