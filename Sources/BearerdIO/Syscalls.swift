import CBearerdShim
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// An errno-carrying failure of a system call, with the call's name.
public struct IOError: Error, Sendable, CustomStringConvertible {
    public var call: String
    public var errno: Int32
    /// What the operator can do about it (e.g. "create the directory /run/bearerd first").
    public var hint: String?
    public init(_ call: String, _ errno: Int32, hint: String? = nil) {
        self.call = call
        self.errno = errno
        self.hint = hint
    }
    public var description: String {
        let base = "\(call): \(String(cString: strerror(errno)))"
        return hint.map { base + " (\($0))" } ?? base
    }
}

/// The credentials of the process at the other end of a unix socket, as the kernel recorded
/// them at connect (SO_PEERCRED, unix(7)).
public struct PeerCredentials: Sendable, Equatable {
    public var pid: Int32
    public var uid: UInt32
    public var gid: UInt32
    public init(pid: Int32, uid: UInt32, gid: UInt32) {
        self.pid = pid
        self.uid = uid
        self.gid = gid
    }
}

/// The raw system calls of the shell's sockets and loop poller, as function references, so a
/// test can play the kernel (swift-nio's `SyscallAbstractionLayer` model): partial writes,
/// EAGAIN, ECONNRESET, EOF, EMFILE, all scripted, for one loop and its sockets only.
///
/// Each call is C-shaped and returns its result, or `-errno` on failure (the kernel's own
/// convention), so a scripted one never touches the thread's `errno`. EINTR is retried by the
/// typed methods below and nowhere else.
///
/// Immutable and shared: every `EventLoop` holds one (`.system` unless a test passes its own)
/// and its channels and listeners keep a reference. Cost on the hot path: one load and one
/// indirect call per syscall instead of a direct call, nothing next to the syscall itself; no
/// global is mutated, so tests running in parallel in one process cannot see each other's.
public final class Syscalls: Sendable {
    public typealias Read = @Sendable (_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer) -> Int
    public typealias Send = @Sendable (_ fd: Int32, _ buffer: UnsafeRawBufferPointer) -> Int
    /// A gathered send of two buffers in order (`first`, then `second`): bytes taken, or `-errno`.
    public typealias SendPair = @Sendable (_ fd: Int32, _ first: UnsafeRawBufferPointer, _ second: UnsafeRawBufferPointer) -> Int
    /// The new fd (non-blocking, close-on-exec) with the peer written to `address`/`length`.
    public typealias Accept = @Sendable (_ fd: Int32, _ address: UnsafeMutablePointer<sockaddr>, _ length: UnsafeMutablePointer<socklen_t>) -> Int
    public typealias Socket = @Sendable (_ family: Int32) -> Int
    public typealias AddressCall = @Sendable (_ fd: Int32, _ address: UnsafePointer<sockaddr>, _ length: socklen_t) -> Int
    public typealias FDCall = @Sendable (_ fd: Int32) -> Int
    public typealias Listen = @Sendable (_ fd: Int32, _ backlog: Int32) -> Int
    public typealias Shutdown = @Sendable (_ fd: Int32, _ how: Int32) -> Int
    public typealias SetOption = @Sendable (_ fd: Int32, _ level: Int32, _ name: Int32, _ value: Int32) -> Int
    /// The option's value, or `-errno`.
    public typealias GetOption = @Sendable (_ fd: Int32, _ level: Int32, _ name: Int32) -> Int
    public typealias SockName = @Sendable (_ fd: Int32, _ address: UnsafeMutablePointer<sockaddr>, _ length: UnsafeMutablePointer<socklen_t>) -> Int
    public typealias EpollCreate = @Sendable () -> Int
    public typealias EpollControl = @Sendable (_ epfd: Int32, _ fd: Int32) -> Int
    /// Fills `fds`/`flags` (bearerd_epoll.h's flag bits) and returns how many are ready.
    public typealias EpollWait = @Sendable (_ epfd: Int32, _ fds: UnsafeMutableBufferPointer<Int32>, _ flags: UnsafeMutableBufferPointer<UInt32>, _ timeoutMs: Int32) -> Int

    public let read: Read
    public let send: Send
    /// A send whose last partial segment waits for the FIN that follows at once (`MSG_MORE`), so
    /// the answer and the FIN leave in one segment. nil: `send` (a test that plays `send` then
    /// sees these bytes too).
    public let sendBeforeFINCall: Send?
    /// nil: `write(_:_:then:)` sends `first` alone with `send` (a partial write, which the caller continues),
    /// so a test that plays `send` sees every byte; `.system` uses sendmsg(2) with two iovecs.
    public let sendPairCall: SendPair?
    public let accept: Accept
    public let socket: Socket
    public let connect: AddressCall
    public let bind: AddressCall
    public let listen: Listen
    public let close: FDCall
    public let shutdown: Shutdown
    public let setNonBlocking: FDCall
    public let setCloseOnExec: FDCall
    public let setOption: SetOption
    public let getOption: GetOption
    public let localName: SockName
    public let epollCreate: EpollCreate
    public let epollAdd: EpollControl
    /// Level-triggered, input only (`EventLoop.PollTrigger.level`).
    public let epollAddLevel: EpollControl
    public let epollDelete: EpollControl
    public let epollWait: EpollWait
    /// `recv(fd, 1 byte, MSG_PEEK | MSG_DONTWAIT)`: bytes waiting (> 0), the peer's EOF (0), or `-errno`
    /// (`-EAGAIN`: nothing). Used before reusing an idle pooled connection.
    public let peek: FDCall

    /// Every call the real one unless given.
    public init(read: @escaping Read = System.read, send: @escaping Send = System.send, accept: @escaping Accept = System.accept,
                socket: @escaping Socket = System.socket, connect: @escaping AddressCall = System.connect,
                bind: @escaping AddressCall = System.bind, listen: @escaping Listen = System.listen,
                close: @escaping FDCall = System.close, shutdown: @escaping Shutdown = System.shutdown,
                setNonBlocking: @escaping FDCall = System.setNonBlocking, setCloseOnExec: @escaping FDCall = System.setCloseOnExec,
                setOption: @escaping SetOption = System.setOption, getOption: @escaping GetOption = System.getOption,
                localName: @escaping SockName = System.localName, epollCreate: @escaping EpollCreate = System.epollCreate,
                epollAdd: @escaping EpollControl = System.epollAdd, epollAddLevel: @escaping EpollControl = System.epollAddLevel,
                epollDelete: @escaping EpollControl = System.epollDelete,
                epollWait: @escaping EpollWait = System.epollWait, peek: @escaping FDCall = System.peek,
                sendPair: SendPair? = nil, sendBeforeFIN: Send? = nil) {
        self.read = read
        self.send = send
        self.sendBeforeFINCall = sendBeforeFIN
        self.sendPairCall = sendPair
        self.accept = accept
        self.socket = socket
        self.connect = connect
        self.bind = bind
        self.listen = listen
        self.close = close
        self.shutdown = shutdown
        self.setNonBlocking = setNonBlocking
        self.setCloseOnExec = setCloseOnExec
        self.setOption = setOption
        self.getOption = getOption
        self.localName = localName
        self.epollCreate = epollCreate
        self.epollAdd = epollAdd
        self.epollAddLevel = epollAddLevel
        self.epollDelete = epollDelete
        self.epollWait = epollWait
        self.peek = peek
    }

    /// The kernel's.
    public static let system = Syscalls(sendPair: System.sendPair, sendBeforeFIN: System.sendBeforeFIN)

    /// The libc calls behind `Syscalls.system`: a result, or `-errno`.
    public enum System {
        @inline(__always) static func result(_ rc: Int) -> Int { rc >= 0 ? rc : -Int(errno) }
        @inline(__always) static func result(_ rc: Int32) -> Int { result(Int(rc)) }

        @Sendable public static func read(_ fd: Int32, _ b: UnsafeMutableRawBufferPointer) -> Int { result(Glibc.read(fd, b.baseAddress, b.count)) }
        @Sendable public static func send(_ fd: Int32, _ b: UnsafeRawBufferPointer) -> Int {
            result(Glibc.send(fd, b.baseAddress, b.count, Int32(MSG_NOSIGNAL)))
        }
        @Sendable public static func sendBeforeFIN(_ fd: Int32, _ b: UnsafeRawBufferPointer) -> Int {
            result(Glibc.send(fd, b.baseAddress, b.count, Int32(MSG_NOSIGNAL) | Int32(MSG_MORE)))
        }
        @Sendable public static func sendPair(_ fd: Int32, _ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Int {
            result(bearerd_send2(fd, a.baseAddress, a.count, b.baseAddress, b.count))
        }
        @Sendable public static func accept(_ fd: Int32, _ a: UnsafeMutablePointer<sockaddr>, _ l: UnsafeMutablePointer<socklen_t>) -> Int {
            result(bearerd_accept4(fd, a, l, bearerd_accept_flags()))
        }
        @Sendable public static func socket(_ family: Int32) -> Int { result(bearerd_stream_socket(family)) }
        @Sendable public static func connect(_ fd: Int32, _ a: UnsafePointer<sockaddr>, _ l: socklen_t) -> Int { result(Glibc.connect(fd, a, l)) }
        @Sendable public static func bind(_ fd: Int32, _ a: UnsafePointer<sockaddr>, _ l: socklen_t) -> Int { result(Glibc.bind(fd, a, l)) }
        @Sendable public static func listen(_ fd: Int32, _ backlog: Int32) -> Int { result(Glibc.listen(fd, backlog)) }
        @Sendable public static func close(_ fd: Int32) -> Int { result(Glibc.close(fd)) }
        @Sendable public static func shutdown(_ fd: Int32, _ how: Int32) -> Int { result(Glibc.shutdown(fd, how)) }
        @Sendable public static func setNonBlocking(_ fd: Int32) -> Int {
            let flags = fcntl(fd, F_GETFL)
            if flags < 0 { return result(flags) }
            return result(fcntl(fd, F_SETFL, flags | O_NONBLOCK))
        }
        @Sendable public static func setCloseOnExec(_ fd: Int32) -> Int { result(fcntl(fd, F_SETFD, FD_CLOEXEC)) }
        @Sendable public static func setOption(_ fd: Int32, _ level: Int32, _ name: Int32, _ value: Int32) -> Int {
            var v = value
            return result(setsockopt(fd, level, name, &v, socklen_t(MemoryLayout<Int32>.size)))
        }
        @Sendable public static func getOption(_ fd: Int32, _ level: Int32, _ name: Int32) -> Int {
            var v: Int32 = 0
            var len = socklen_t(MemoryLayout<Int32>.size)
            let rc = getsockopt(fd, level, name, &v, &len)
            return rc < 0 ? result(rc) : Int(v)
        }
        @Sendable public static func localName(_ fd: Int32, _ a: UnsafeMutablePointer<sockaddr>, _ l: UnsafeMutablePointer<socklen_t>) -> Int {
            result(getsockname(fd, a, l))
        }
        @Sendable public static func peek(_ fd: Int32) -> Int {
            var byte: UInt8 = 0
            return result(recv(fd, &byte, 1, Int32(MSG_PEEK) | Int32(MSG_DONTWAIT)))
        }
        @Sendable public static func epollCreate() -> Int { result(bearerd_epoll_create()) }
        @Sendable public static func epollAdd(_ epfd: Int32, _ fd: Int32) -> Int { result(bearerd_epoll_add(epfd, fd)) }
        @Sendable public static func epollAddLevel(_ epfd: Int32, _ fd: Int32) -> Int { result(bearerd_epoll_add_level(epfd, fd)) }
        @Sendable public static func epollDelete(_ epfd: Int32, _ fd: Int32) -> Int { result(bearerd_epoll_del(epfd, fd)) }
        @Sendable public static func epollWait(_ epfd: Int32, _ fds: UnsafeMutableBufferPointer<Int32>, _ flags: UnsafeMutableBufferPointer<UInt32>,
                                               _ timeoutMs: Int32) -> Int {
            result(bearerd_epoll_poll(epfd, fds.baseAddress, flags.baseAddress, Int32(min(fds.count, flags.count)), timeoutMs))
        }
    }

    // MARK: typed calls (EINTR retried here)

    public enum IOResult: Equatable {
        case bytes(Int)
        case wouldBlock
        case eof
    }

    /// What an `accept` on a non-blocking listening socket gave.
    public enum AcceptResult {
        case accepted(fd: Int32, peer: SocketAddress)
        /// The backlog is empty.
        case wouldBlock
        /// EMFILE or ENFILE: no descriptor for the connection, which stays in the backlog.
        case outOfDescriptors(Int32)
        case failed(Int32)
    }

    @inline(__always)
    public func read(_ fd: Int32, into buffer: UnsafeMutableRawBufferPointer) throws(IOError) -> IOResult {
        while true {
            let n = read(fd, buffer)
            if n > 0 { return .bytes(n) }
            if n == 0 { return .eof }
            let e = Int32(-n)
            if e == EINTR { continue }
            if e == EAGAIN || e == EWOULDBLOCK { return .wouldBlock }
            throw IOError("read", e)
        }
    }

    /// `buffer` to `fd`; EINTR retried. `beforeFIN`: its last partial segment waits for the FIN
    /// (`sendBeforeFINCall`), so the caller must end the connection (shutdown or close) right
    /// after its last such write, or that segment waits for more data.
    @inline(__always)
    public func write(_ fd: Int32, from buffer: UnsafeRawBufferPointer, beforeFIN: Bool = false) throws(IOError) -> IOResult {
        try retryingSend { (beforeFIN ? sendBeforeFINCall.map { $0(fd, buffer) } : nil) ?? send(fd, buffer) }
    }

    /// `first` then `second` in one gathered send (or `first` alone, see `sendPairCall`); EINTR retried.
    @inline(__always)
    public func write(_ fd: Int32, _ first: UnsafeRawBufferPointer, then second: UnsafeRawBufferPointer) throws(IOError) -> IOResult {
        try retryingSend { sendPairCall.map { $0(fd, first, second) } ?? send(fd, first) }
    }

    /// A send's result (bytes taken, or `-errno`) as an `IOResult`; EINTR retried.
    @inline(__always)
    private func retryingSend(_ call: () -> Int) throws(IOError) -> IOResult {
        while true {
            let n = call()
            if n >= 0 { return .bytes(n) }
            let e = Int32(-n)
            if e == EINTR { continue }
            if e == EAGAIN || e == EWOULDBLOCK { return .wouldBlock }
            throw IOError("send", e)
        }
    }

    /// One connection from the backlog; ECONNABORTED (a connection reset while queued) and
    /// EINTR are skipped.
    public func acceptOne(_ fd: Int32) -> AcceptResult {
        while true {
            var storage = sockaddr_storage()
            var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
            let n = withUnsafeMutablePointer(to: &storage) { p in
                p.withMemoryRebound(to: sockaddr.self, capacity: 1) { accept(fd, $0, &len) }
            }
            if n >= 0 { return .accepted(fd: Int32(truncatingIfNeeded: n), peer: SocketAddress(storage: storage, length: len)) }
            let e = Int32(-n)
            switch e {
            case EINTR, ECONNABORTED: continue
            case EAGAIN, EWOULDBLOCK: return .wouldBlock
            case EMFILE, ENFILE: return .outOfDescriptors(e)
            default: return .failed(e)
            }
        }
    }

    /// A non-blocking, close-on-exec stream socket.
    public func streamSocket(family: Int32) throws(IOError) -> Int32 {
        let n = socket(family)
        if n < 0 { throw IOError("socket", Int32(-n)) }
        return Int32(truncatingIfNeeded: n)
    }

    /// Starts a non-blocking connect: 0, or the errno (EINPROGRESS while it completes).
    public func startConnect(_ fd: Int32, to address: SocketAddress) -> Int32 {
        while true {
            let rc = address.withSockAddr { connect(fd, $0, $1) }
            if rc >= 0 { return 0 }
            let e = Int32(-rc)
            if e == EINTR { return EINPROGRESS }  // connect(2): an interrupted connect completes asynchronously
            return e
        }
    }

    /// Closes `fd` (EINTR is not retried: on Linux the descriptor is released anyway, close(2)).
    public func closeFD(_ fd: Int32) {
        _ = close(fd)
    }

    public func shutdownWrite(_ fd: Int32) {
        _ = shutdown(fd, Int32(SHUT_WR))
    }

    public func setSocketOption(_ fd: Int32, _ level: Int32, _ name: Int32, _ value: Int32) {
        _ = self.setOption(fd, level, name, value)
    }

    /// SO_ERROR: the pending error of a socket (0: none).
    public func socketError(_ fd: Int32) -> Int32 {
        let v = getOption(fd, SOL_SOCKET, SO_ERROR)
        return Int32(truncatingIfNeeded: v < 0 ? -v : v)
    }

    /// The address a socket is bound to, nil on error.
    public func boundAddress(_ fd: Int32) -> SocketAddress? {
        var storage = sockaddr_storage()
        var len = socklen_t(MemoryLayout<sockaddr_storage>.size)
        let rc = withUnsafeMutablePointer(to: &storage) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { localName(fd, $0, &len) }
        }
        return rc >= 0 ? SocketAddress(storage: storage, length: len) : nil
    }
}

/// The shell's system calls through `Syscalls.system`, for code that has no loop at hand (and the
/// process-wide ones). EINTR is retried in `Syscalls` and nowhere else.
public enum Sys {
    public typealias IOResult = Syscalls.IOResult

    @inline(__always)
    public static func read(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer) throws(IOError) -> IOResult {
        try Syscalls.system.read(fd, into: buffer)
    }

    @inline(__always)
    public static func write(_ fd: Int32, _ buffer: UnsafeRawBufferPointer) throws(IOError) -> IOResult {
        try Syscalls.system.write(fd, from: buffer)
    }

    public static func setNonBlocking(_ fd: Int32) throws(IOError) {
        let rc = Syscalls.system.setNonBlocking(fd)
        if rc < 0 { throw IOError("fcntl", Int32(-rc)) }
    }

    public static func setOption(_ fd: Int32, _ level: Int32, _ name: Int32, _ value: Int32) {
        Syscalls.system.setSocketOption(fd, level, name, value)
    }

    public static func socketError(_ fd: Int32) -> Int32 {
        Syscalls.system.socketError(fd)
    }

    /// SO_PEERCRED of a connected unix socket.
    public static func peerCredentials(_ fd: Int32) throws(IOError) -> PeerCredentials {
        var pid: Int32 = 0
        var uid: UInt32 = 0
        var gid: UInt32 = 0
        if bearerd_peer_credentials(fd, &pid, &uid, &gid) != 0 { throw IOError("getsockopt(SO_PEERCRED)", errno) }
        return PeerCredentials(pid: pid, uid: uid, gid: gid)
    }

    /// RLIMIT_NOFILE: the soft and hard limits (nil when getrlimit fails).
    public static func descriptorLimits() -> (soft: Int, hard: Int)? {
        var rl = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &rl) == 0 else { return nil }
        return (clampLimit(rl.rlim_cur), clampLimit(rl.rlim_max))
    }

    private static func clampLimit(_ v: rlim_t) -> Int {
        v > rlim_t(Int32.max) ? Int(Int32.max) : Int(v)  // RLIM_INFINITY is all ones: above too
    }

    /// Raises the soft RLIMIT_NOFILE to the hard limit (as Go's runtime does at start, and
    /// nginx with `worker_rlimit_nofile`): the soft limit's default, 1024, is there for
    /// programs that use select(2); bearerd uses epoll. Returns the limits before and after
    /// (equal when nothing changed or setrlimit failed).
    @discardableResult
    public static func raiseDescriptorLimit() -> (before: Int, after: Int) {
        var rl = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &rl) == 0 else { return (0, 0) }
        let before = clampLimit(rl.rlim_cur)
        guard rl.rlim_cur < rl.rlim_max else { return (before, before) }
        var raised = rl
        raised.rlim_cur = rl.rlim_max
        if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) != 0 {
            // A hard limit of "unlimited" above the kernel's nr_open: take the kernel's ceiling.
            raised.rlim_cur = 1 << 20
            guard raised.rlim_cur > rl.rlim_cur, setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 else { return (before, before) }
        }
        return (before, clampLimit(raised.rlim_cur))
    }

    /// How many descriptors the process has open now (the entries of /proc/self/fd, less the
    /// one reading them); nil without /proc.
    public static func openDescriptorCount() -> Int? {
        guard let dir = opendir("/proc/self/fd") else { return nil }
        defer { closedir(dir) }
        var n = 0
        while let entry = readdir(dir) {
            let name = entry.pointee.d_name.0
            if name != CChar(UInt8(ascii: ".")) { n += 1 }  // ".", ".."; descriptor names are digits
        }
        return max(0, n - 1)
    }

    /// Ignore SIGPIPE process-wide (writes use MSG_NOSIGNAL too; TLS and pipes may not).
    public static func ignoreSIGPIPE() {
        signal(SIGPIPE, SIG_IGN)
    }
}

/// A resolved socket address (IPv4, IPv6 or Unix).
public struct SocketAddress: Sendable, CustomStringConvertible {
    public var storage: sockaddr_storage
    public var length: socklen_t

    public init(storage: sockaddr_storage, length: socklen_t) {
        self.storage = storage
        self.length = length
    }

    public var family: Int32 { Int32(storage.ss_family) }

    /// Parses a numeric IPv4 or IPv6 address; nil for names.
    public static func numeric(_ host: String, port: UInt16) -> SocketAddress? {
        var storage = sockaddr_storage()
        var v4 = in_addr()
        if inet_pton(AF_INET, host, &v4) == 1 {
            var sin = sockaddr_in()
            sin.sin_family = sa_family_t(AF_INET)
            sin.sin_port = port.bigEndian
            sin.sin_addr = v4
            withUnsafeBytes(of: sin) { src in
                withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: src) }
            }
            return SocketAddress(storage: storage, length: socklen_t(MemoryLayout<sockaddr_in>.size))
        }
        var v6 = in6_addr()
        if inet_pton(AF_INET6, host, &v6) == 1 {
            var sin6 = sockaddr_in6()
            sin6.sin6_family = sa_family_t(AF_INET6)
            sin6.sin6_port = port.bigEndian
            sin6.sin6_addr = v6
            withUnsafeBytes(of: sin6) { src in
                withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: src) }
            }
            return SocketAddress(storage: storage, length: socklen_t(MemoryLayout<sockaddr_in6>.size))
        }
        return nil
    }

    public static func unix(_ path: String) -> SocketAddress? {
        let bytes = Array(path.utf8)
        return unix(sunPath: bytes + [0], length: socklen_t(MemoryLayout<sockaddr_un>.size))
    }

    /// A unix address in the abstract namespace (unix(7)): `name` without its leading `@`,
    /// sent with a leading NUL byte and an exact length.
    public static func unixAbstract(_ name: String) -> SocketAddress? {
        let bytes = [0] + Array(name.utf8)
        return unix(sunPath: bytes, length: socklen_t(MemoryLayout<sa_family_t>.size + bytes.count))
    }

    private static func unix(sunPath bytes: [UInt8], length: socklen_t) -> SocketAddress? {
        var sun = sockaddr_un()
        sun.sun_family = sa_family_t(AF_UNIX)
        guard bytes.count <= MemoryLayout.size(ofValue: sun.sun_path) else { return nil }
        withUnsafeMutableBytes(of: &sun.sun_path) { $0.copyBytes(from: bytes) }
        var storage = sockaddr_storage()
        withUnsafeBytes(of: sun) { src in
            withUnsafeMutableBytes(of: &storage) { $0.copyMemory(from: src) }
        }
        return SocketAddress(storage: storage, length: length)
    }

    /// A unix address's path, or `@name` in the abstract namespace; nil for other families or
    /// an unnamed socket.
    public var unixPath: String? {
        guard family == AF_UNIX else { return nil }
        let pathOffset = MemoryLayout<sa_family_t>.size
        let count = Int(length) - pathOffset
        guard count > 0 else { return nil }
        var s = storage
        let bytes: [UInt8] = withUnsafeBytes(of: &s) { Array($0[pathOffset..<(pathOffset + count)]) }
        if bytes.first == 0 { return "@" + String(decoding: bytes.dropFirst(), as: UTF8.self) }
        return String(decoding: bytes.prefix { $0 != 0 }, as: UTF8.self)
    }

    /// The numeric host part ("127.0.0.1", "::1") or the Unix path.
    public var host: String {
        var s = storage
        switch Int32(storage.ss_family) {
        case AF_INET:
            // Formatted here, not with inet_ntop (glibc's formats IPv4 with sprintf: about a
            // twentieth of a new connection's instructions); at most 15 bytes, a small String
            // with no allocation.
            let addr = withUnsafePointer(to: &s) { p in
                p.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { $0.pointee.sin_addr }
            }
            return withUnsafeBytes(of: addr) { octets in Self.dottedQuad(octets) }
        case AF_INET6:
            return withUnsafePointer(to: &s) { p in
                p.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { sin6 in
                    var addr = sin6.pointee.sin6_addr
                    var buf = [CChar](repeating: 0, count: Int(INET6_ADDRSTRLEN))
                    inet_ntop(AF_INET6, &addr, &buf, socklen_t(buf.count))
                    return String(cString: buf)
                }
            }
        case AF_UNIX:
            return "unix"
        default:
            return "?"
        }
    }

    /// The last IPv4 or IPv6 address `host(of:)` formatted, with its text: one loop's clients
    /// mostly come from one address (a sidecar's all from 127.0.0.1), and formatting one costs
    /// a few hundred instructions per connection. Owned by one loop; a value, no locking.
    public struct HostMemo {
        /// The address's family (0: nothing remembered yet) and its bytes: IPv4's in `high`,
        /// IPv6's 16 in `high` and `low`.
        private var family: Int32 = 0
        private var high: UInt64 = 0
        private var low: UInt64 = 0
        private var text = ""

        public init() {}

        /// `address.host`, remembered for the next address with the same bytes.
        public mutating func host(of address: SocketAddress) -> String {
            let family = address.family
            let high: UInt64
            let low: UInt64
            switch family {
            case AF_INET:
                // sockaddr_in: family (2), port (2), address (4).
                high = withUnsafeBytes(of: address.storage) { UInt64($0.loadUnaligned(fromByteOffset: 4, as: UInt32.self)) }
                low = 0
            case AF_INET6:
                // sockaddr_in6: family (2), port (2), flow info (4), address (16).
                (high, low) = withUnsafeBytes(of: address.storage) {
                    ($0.loadUnaligned(fromByteOffset: 8, as: UInt64.self), $0.loadUnaligned(fromByteOffset: 16, as: UInt64.self))
                }
            default:
                return address.host
            }
            if family == self.family && high == self.high && low == self.low { return text }
            text = address.host
            self.family = family
            self.high = high
            self.low = low
            return text
        }
    }

    /// "a.b.c.d" of four octets in network order (RFC 791), as inet_ntop writes it.
    static func dottedQuad(_ octets: UnsafeRawBufferPointer) -> String {
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 16) { buf in
            var n = 0
            for i in 0..<min(4, octets.count) {
                if i > 0 {
                    buf[n] = UInt8(ascii: ".")
                    n += 1
                }
                let v = octets[i]
                if v >= 100 {
                    buf[n] = UInt8(ascii: "0") &+ v / 100
                    n += 1
                }
                if v >= 10 {
                    buf[n] = UInt8(ascii: "0") &+ v / 10 % 10
                    n += 1
                }
                buf[n] = UInt8(ascii: "0") &+ v % 10
                n += 1
            }
            return String(decoding: UnsafeBufferPointer(rebasing: buf[0..<n]), as: UTF8.self)
        }
    }

    public var port: UInt16 {
        var s = storage
        switch Int32(storage.ss_family) {
        case AF_INET:
            return withUnsafePointer(to: &s) { $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin_port) } }
        case AF_INET6:
            return withUnsafePointer(to: &s) { $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin6_port) } }
        default:
            return 0
        }
    }

    public var description: String {
        family == AF_INET6 ? "[\(host)]:\(port)" : family == AF_UNIX ? "unix" : "\(host):\(port)"
    }

    /// Calls `body` with the address as a `sockaddr` pointer and its length (bind, connect).
    public func withSockAddr<R>(_ body: (UnsafePointer<sockaddr>, socklen_t) -> R) -> R {
        var s = storage
        return withUnsafePointer(to: &s) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, length) }
        }
    }
}
