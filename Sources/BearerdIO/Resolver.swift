import Dispatch
import CBearerdShim
#if canImport(Glibc)
import Glibc
#endif

/// Resolves host names off the loops (getaddrinfo blocks) with a short positive cache.
/// Shared by all loops; the cache is guarded by a lock. Results come back on the caller's loop.
public final class Resolver: @unchecked Sendable {  // @unchecked: `cache` guarded by `lock`
    public static let shared = Resolver()

    private struct Entry {
        var addresses: [SocketAddress]
        var expires: UInt64
    }

    private let lock = Lock()
    private var cache: [String: Entry] = [:]
    private let queue = DispatchQueue(label: "bearerd.resolver", attributes: .concurrent)
    /// Positive results are kept this long.
    public var ttl: Duration = .seconds(30)

    /// Calls `completion` on `loop` with the addresses (IPv4 first) or an error.
    public func resolve(host: String, port: UInt16, on loop: EventLoop,
                        completion: @escaping (Result<[SocketAddress], IOError>) -> Void) {
        if let addr = SocketAddress.numeric(host, port: port) {
            completion(.success([addr]))
            return
        }
        let key = "\(host):\(port)"
        let now = monotonicNanos()
        if let hit = lock.withLock({ cache[key] }), hit.expires > now {
            completion(.success(hit.addresses))
            return
        }
        let ttlNanos = ttl.nanoseconds
        queue.async { [self] in
            let addrs = Resolver.resolveBlocking(host: host, port: port)
            if addrs.isEmpty {
                loop.execute { completion(.failure(IOError("resolve \(host)", EHOSTUNREACH))) }
            } else {
                lock.withLock { cache[key] = Entry(addresses: addrs, expires: monotonicNanos() + ttlNanos) }
                loop.execute { completion(.success(addrs)) }
            }
        }
    }

    /// getaddrinfo, blocking. Only for start-up and the resolver queue.
    public static func resolveBlocking(host: String, port: UInt16) -> [SocketAddress] {
        var hints = addrinfo()
        hints.ai_socktype = bearerd_SOCK_STREAM()
        hints.ai_family = AF_UNSPEC
        var res: UnsafeMutablePointer<addrinfo>?
        guard getaddrinfo(host, String(port), &hints, &res) == 0, let first = res else { return [] }
        defer { freeaddrinfo(first) }
        var v4: [SocketAddress] = [], v6: [SocketAddress] = []
        var p: UnsafeMutablePointer<addrinfo>? = first
        while let ai = p {
            var storage = sockaddr_storage()
            withUnsafeMutableBytes(of: &storage) { dst in
                dst.copyMemory(from: UnsafeRawBufferPointer(start: ai.pointee.ai_addr, count: Int(ai.pointee.ai_addrlen)))
            }
            let a = SocketAddress(storage: storage, length: ai.pointee.ai_addrlen)
            if ai.pointee.ai_family == AF_INET { v4.append(a) } else if ai.pointee.ai_family == AF_INET6 { v6.append(a) }
            p = ai.pointee.ai_next
        }
        return v4 + v6
    }
}
