#if canImport(Glibc)
import Glibc
#endif

/// A pthread mutex; used only off the hot path (resolver cache, published configuration).
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
