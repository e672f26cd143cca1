#if canImport(Glibc)
import Glibc
#endif

/// A pthread mutex, for state shared across queues where contention is rare: the resolver cache,
/// the published configuration and tokens, session tables, a loop's source target. Owns only
/// the mutex; `withLock` is the one way in.
public final class Lock: @unchecked Sendable {  // @unchecked: the mutex itself provides the safety
    private let m: UnsafeMutablePointer<pthread_mutex_t>
    public init() {
        m = .allocate(capacity: 1)
        pthread_mutex_init(m, nil)
    }
    deinit {
        pthread_mutex_destroy(m)
        m.deallocate()
    }
    @inline(__always)
    public func withLock<T>(_ body: () throws -> T) rethrows -> T {
        pthread_mutex_lock(m)
        defer { pthread_mutex_unlock(m) }
        return try body()
    }
}
