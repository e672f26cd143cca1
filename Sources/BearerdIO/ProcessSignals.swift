#if canImport(Glibc)
import Glibc
#endif

/// The signals that stop or reload the process (SIGTERM, SIGINT, SIGHUP), taken synchronously
/// by one thread instead of through handlers.
///
/// Theory of operation: `block()` runs first thing on the main thread, before any other thread
/// exists, so every thread created afterwards inherits the blocked mask; a signal sent at any
/// moment of the start then waits in the process's pending set until the main thread, its start
/// done, takes it with `next()` (sigwaitinfo(2)). No disposition is changed, so none can be
/// lost in a window between `signal(SIG_IGN)` and a handler taking over.
///
/// Why not Dispatch signal sources: on Linux, libdispatch installs its own
/// handler only when the source is registered on its manager thread (asynchronously), and
/// `dispatchMain()` parks the main thread in `sigsuspend` with an empty mask. A SIGTERM between
/// `SIG_IGN` and that registration was discarded by the unblocked main thread (in about 2 of 3
/// starts, measured with `SignalRaceTests`), and the main queue that would have run the handler
/// only drains after `dispatchMain()`.
public enum ProcessSignals {
    public static let handled: [Int32] = [SIGTERM, SIGINT, SIGHUP]

    private static var set: sigset_t {
        var s = sigset_t()
        sigemptyset(&s)
        for sig in handled { sigaddset(&s, sig) }
        return s
    }

    /// Blocks `handled` in the calling thread (and in every thread it creates afterwards).
    /// Call on the main thread before anything starts a thread.
    public static func block() {
        var s = set
        _ = pthread_sigmask(SIG_BLOCK, &s, nil)
    }

    /// Waits for the next of `handled` (EINTR retried). Only for a thread that called `block()`.
    public static func next() -> Int32 {
        var s = set
        while true {
            let sig = sigwaitinfo(&s, nil)
            if sig > 0 { return sig }
            // EINTR (another signal's handler ran): wait again.
        }
    }
}
