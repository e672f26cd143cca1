import BearerdIO
import BearerdOAuth
import Dispatch
import Synchronization

/// The clocks and the timers of a token session (docs/architecture.md §6): the monotonic clock every
/// deadline of the session is measured on, the wall clock of what is persisted or signed
/// (state file expiry, `Date` skew, `exp` checks), and one-shot timers that run work on a loop
/// once the monotonic clock reaches an instant.
///
/// The driver reads time only through this, so a test can hand it a clock it advances itself
/// (`FakeSessionClock` in the tests) instead of sleeping through a refresh margin or a backoff.
/// `SystemSessionClock` is the real one.
public protocol SessionClock: Sendable {
    /// Now on the monotonic clock (the one `PublishedToken.usableUntil` is measured on).
    func now() -> MonotonicInstant
    /// Now on the wall clock, Unix seconds.
    func wallClockSeconds() -> Int64
    /// Runs `work` once on `loop` (as one loop event) when `now()` has reached `deadline`: at
    /// once (but never synchronously) when it already has. The returned timer cancels it.
    @discardableResult
    func schedule(at deadline: MonotonicInstant, on loop: EventLoop, _ work: @escaping () -> Void) -> SessionTimer
}

/// A timer armed by a `SessionClock`. `cancel()` is idempotent, callable from any thread; work
/// whose timer was cancelled on the loop before it ran does not run.
public protocol SessionTimer: AnyObject, Sendable {
    func cancel()
}

extension SessionClock {
    /// `schedule(at: now() + delay, …)`.
    @discardableResult
    public func schedule(after delay: Duration, on loop: EventLoop, _ work: @escaping () -> Void) -> SessionTimer {
        schedule(at: now() + delay, on: loop, work)
    }
}

extension SessionClock where Self == SystemSessionClock {
    /// CLOCK_MONOTONIC, `time(2)` and `DispatchSourceTimer`s on the loop's queue.
    public static var system: SystemSessionClock { SystemSessionClock() }
}

/// The real clocks: CLOCK_MONOTONIC (`monotonicNanos`, the loops' clock, so a published
/// token's `usableUntil` compares with what the loops read), `time(2)`, and one
/// `DispatchSourceTimer` per timer on the loop's queue. Stateless.
public struct SystemSessionClock: SessionClock {
    public init() {}

    public func now() -> MonotonicInstant { MonotonicInstant(nanoseconds: monotonicNanos()) }

    public func wallClockSeconds() -> Int64 { BearerdSessions.wallClockSeconds() }

    public func schedule(at deadline: MonotonicInstant, on loop: EventLoop, _ work: @escaping () -> Void) -> SessionTimer {
        let timer = DispatchTimer(loop: loop, work)
        timer.arm(in: deadline - now())
        return timer
    }
}

/// One `DispatchSourceTimer` on a loop's queue that fires once.
///
/// Owns the source and the work until it fires or is cancelled (then both are released; until
/// then the source's handler keeps the timer alive, so a caller may drop it). `phase` is behind
/// a mutex because `cancel()` may come from any thread. The source is always resumed (libdispatch
/// traps on releasing an inactive source) and cancelled exactly once.
final class DispatchTimer: SessionTimer {
    private enum Phase {
        case unarmed(() -> Void)
        case armed(DispatchSourceTimer, () -> Void)
        case done
    }
    private let phase: Mutex<Phase>
    private let loop: EventLoop

    init(loop: EventLoop, _ work: @escaping () -> Void) {
        self.loop = loop
        phase = Mutex(.unarmed(work))
    }

    /// Arms the source `delay` from now (at once when the delay is not positive).
    func arm(in delay: Duration) {
        let source = DispatchSource.makeTimerSource(queue: loop.queue)
        source.schedule(deadline: .now() + .nanoseconds(Int(clamping: delay.nanoseconds)), leeway: .milliseconds(1))
        source.setEventHandler { [self] in fire() }
        let armed = phase.withLock { p -> Bool in
            guard case .unarmed(let work) = p else { return false }
            p = .armed(source, work)
            return true
        }
        if !armed { source.cancel() }  // cancelled before it was armed
        source.resume()
    }

    private func fire() {
        let work: (() -> Void)? = phase.withLock { p in
            guard case .armed(let source, let work) = p else { return nil }
            source.cancel()
            p = .done
            return work
        }
        if let work { loop.runEvent(work) }
    }

    func cancel() {
        let source: DispatchSourceTimer? = phase.withLock { p in
            defer { p = .done }
            if case .armed(let source, _) = p { return source }
            return nil
        }
        source?.cancel()
    }
}
