import Dispatch
import CBearerdShim
#if canImport(Glibc)
import Glibc
#endif

/// A listening socket. Accepts on `acceptLoop` (draining the backlog on each event) and hands
/// each new non-blocking fd to the next loop of `group`, where `onAccept` runs.
/// Lives on `acceptLoop`; the fd is closed only in the accept source's cancel handler.
public final class Listener: LoopPollable, @unchecked Sendable {  // @unchecked: confined to `acceptLoop`
    public let fd: Int32
    public let localAddress: SocketAddress
    /// The accept source; nil when the loop poller serves the listening socket.
    private var source: DispatchSourceRead?
    private let onAccept: (Int32, SocketAddress, EventLoop) -> Void
    private let acceptLoop: EventLoop
    private let group: EventLoopGroup
    private var unixPath: String?
    private var stopped = false

    /// Binds and listens. `host` is numeric ("127.0.0.1", "::1", "0.0.0.0") or a name resolved
    /// synchronously at start-up. Port 0 picks a free port (see `localAddress`).
    public static func bind(host: String, port: UInt16, group: EventLoopGroup,
                            onAccept: @escaping (Int32, SocketAddress, EventLoop) -> Void) throws(IOError) -> Listener {
        guard let addr = SocketAddress.numeric(host, port: port) ?? Resolver.resolveBlocking(host: host, port: port).first else {
            throw IOError("resolve \(host)", EINVAL)
        }
        return try make(address: addr, unixPath: nil, group: group, onAccept: onAccept)
    }

    public static func bindUnix(path: String, group: EventLoopGroup,
                                onAccept: @escaping (Int32, SocketAddress, EventLoop) -> Void) throws(IOError) -> Listener {
        guard let addr = SocketAddress.unix(path) else { throw IOError("unix path too long", ENAMETOOLONG) }
        // Remove a stale socket file left by a previous run (only if it is a socket).
        var st = stat()
        if lstat(path, &st) == 0 && (st.st_mode & S_IFMT) == S_IFSOCK { unlink(path) }
        return try make(address: addr, unixPath: path, group: group, onAccept: onAccept)
    }

    /// Takes over a listening stream socket inherited from the service manager (socket
    /// activation, sd_listen_fds(3)): checks it is a listening stream socket, sets it
    /// non-blocking and close-on-exec, and accepts on it like a bound one. The socket file of an
    /// inherited unix socket belongs to the manager: `stop()` closes the fd but never unlinks it.
    public static func adopt(fd: Int32, group: EventLoopGroup,
                             onAccept: @escaping (Int32, SocketAddress, EventLoop) -> Void) throws(IOError) -> Listener {
        var value: Int32 = 0
        var len = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_TYPE, &value, &len) == 0 else { throw IOError("getsockopt(SO_TYPE) on fd \(fd)", errno) }
        guard value == bearerd_SOCK_STREAM() else { throw IOError("fd \(fd) is not a stream socket", ENOTSUP) }
        len = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &value, &len) == 0 else { throw IOError("getsockopt(SO_ACCEPTCONN) on fd \(fd)", errno) }
        guard value != 0 else { throw IOError("fd \(fd) is not listening (Accept=yes is not supported)", EINVAL) }
        guard let local = boundAddress(fd: fd) else { throw IOError("getsockname on fd \(fd)", errno) }
        try Sys.setNonBlocking(fd)
        _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
        return Listener(fd: fd, local: local, unixPath: nil, group: group, onAccept: onAccept)
    }

    /// The address a socket is bound to (getsockname), nil on error.
    public static func boundAddress(fd: Int32) -> SocketAddress? {
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutablePointer(to: &storage) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
        }
        return rc == 0 ? SocketAddress(storage: storage, length: len) : nil
    }

    private static func make(address: SocketAddress, unixPath: String?, group: EventLoopGroup,
                             onAccept: @escaping (Int32, SocketAddress, EventLoop) -> Void) throws(IOError) -> Listener {
        let fd = bearerd_stream_socket(address.family)
        if fd < 0 { throw IOError("socket", errno) }
        if address.family != AF_UNIX {
            Sys.setOption(fd, SOL_SOCKET, SO_REUSEADDR, 1)
            if address.family == AF_INET6 { Sys.setOption(fd, Int32(IPPROTO_IPV6), IPV6_V6ONLY, 1) }
        }
        if address.withSockAddr({ Glibc.bind(fd, $0, $1) }) < 0 {
            let e = errno
            Glibc.close(fd)
            throw IOError("bind \(address)", e)
        }
        if let unixPath { chmod(unixPath, 0o660) }
        if Glibc.listen(fd, 1024) < 0 {
            let e = errno
            Glibc.close(fd)
            throw IOError("listen", e)
        }
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        _ = withUnsafeMutablePointer(to: &storage) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) }
        }
        let local = address.family == AF_UNIX ? address : SocketAddress(storage: storage, length: len)
        return Listener(fd: fd, local: local, unixPath: unixPath, group: group, onAccept: onAccept)
    }

    private init(fd: Int32, local: SocketAddress, unixPath: String?, group: EventLoopGroup,
                 onAccept: @escaping (Int32, SocketAddress, EventLoop) -> Void) {
        self.fd = fd
        self.localAddress = local
        self.unixPath = unixPath
        self.group = group
        self.acceptLoop = group.loops[0]
        self.onAccept = onAccept
        if acceptLoop.ioMode == .loopPoller {
            acceptLoop.execute { [self] in acceptLoop.registerPollable(fd: fd, self) }
            return
        }
        let source = DispatchSource.makeReadSource(fileDescriptor: fd, queue: acceptLoop.queue)
        source.setCancelHandler { [fd] in Glibc.close(fd) }
        source.setEventHandler { [unowned self] in
            self.acceptAll(onAccept)
        }
        source.resume()
        self.source = source
    }

    public func pollerEvent(readable: Bool, writable: Bool, hangup: Bool) {
        if readable && !stopped { acceptAll(onAccept) }
    }

    private func acceptAll(_ onAccept: @escaping (Int32, SocketAddress, EventLoop) -> Void) {
        // Drain the backlog (bounded per event; edge-triggered polling needs a second look then).
        for round in 0..<257 {
            if round == 256 {
                if source == nil { acceptLoop.execute { [weak self] in self.map { $0.acceptAll($0.onAccept) } } }
                return
            }
            var storage = sockaddr_storage()
            var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let cfd = withUnsafeMutablePointer(to: &storage) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    bearerd_accept4(fd, $0, &len, bearerd_accept_flags())
                }
            }
            if cfd < 0 {
                let e = errno
                if e == EINTR || e == ECONNABORTED { continue }
                if e == EMFILE || e == ENFILE {
                    // Out of descriptors: pause accepting briefly instead of spinning.
                    source?.suspend()
                    acceptLoop.schedule(after: .milliseconds(100)) { [weak self] in
                        guard let self, !self.stopped else { return }
                        if let source = self.source { source.resume() } else { self.acceptAll(self.onAccept) }
                    }
                }
                return
            }
            let peer = SocketAddress(storage: storage, length: len)
            if peer.family != AF_UNIX { Sys.setOption(cfd, Int32(IPPROTO_TCP), TCP_NODELAY, 1) }
            let loop = group.next()
            if loop === acceptLoop {
                onAccept(cfd, peer, loop)
            } else {
                loop.execute { onAccept(cfd, peer, loop) }
            }
        }
    }

    /// Stops accepting; the fd is closed in the cancel handler.
    public func stop() {
        acceptLoop.execute { [self] in
            guard !stopped else { return }
            stopped = true
            if let source {
                source.cancel()
            } else {
                acceptLoop.unregisterPollable(fd: fd)
                Glibc.close(fd)
            }
            if let unixPath { unlink(unixPath) }
        }
    }
}
