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

/// The system calls the shell uses, behind one typed wrapper. EINTR is retried here and nowhere else.
public enum Sys {
    public enum IOResult: Equatable {
        case bytes(Int)
        case wouldBlock
        case eof
    }

    @inline(__always)
    public static func read(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer) throws(IOError) -> IOResult {
        while true {
            let n = Glibc.read(fd, buffer.baseAddress, buffer.count)
            if n > 0 { return .bytes(n) }
            if n == 0 { return .eof }
            let e = errno
            if e == EINTR { continue }
            if e == EAGAIN || e == EWOULDBLOCK { return .wouldBlock }
            throw IOError("read", e)
        }
    }

    @inline(__always)
    public static func write(_ fd: Int32, _ buffer: UnsafeRawBufferPointer) throws(IOError) -> IOResult {
        while true {
            let n = Glibc.send(fd, buffer.baseAddress, buffer.count, Int32(MSG_NOSIGNAL))
            if n >= 0 { return .bytes(n) }
            let e = errno
            if e == EINTR { continue }
            if e == EAGAIN || e == EWOULDBLOCK { return .wouldBlock }
            throw IOError("send", e)
        }
    }

    public static func setNonBlocking(_ fd: Int32) throws(IOError) {
        let flags = fcntl(fd, F_GETFL)
        if flags < 0 { throw IOError("fcntl", errno) }
        if fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0 { throw IOError("fcntl", errno) }
    }

    public static func setOption(_ fd: Int32, _ level: Int32, _ name: Int32, _ value: Int32) {
        var v = value
        _ = setsockopt(fd, level, name, &v, socklen_t(MemoryLayout<Int32>.size))
    }

    public static func socketError(_ fd: Int32) -> Int32 {
        var err: Int32 = 0
        var len = socklen_t(MemoryLayout<Int32>.size)
        if getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0 { return errno }
        return err
    }

    /// SO_PEERCRED of a connected unix socket.
    public static func peerCredentials(_ fd: Int32) throws(IOError) -> PeerCredentials {
        var pid: Int32 = 0
        var uid: UInt32 = 0
        var gid: UInt32 = 0
        if bearerd_peer_credentials(fd, &pid, &uid, &gid) != 0 { throw IOError("getsockopt(SO_PEERCRED)", errno) }
        return PeerCredentials(pid: pid, uid: uid, gid: gid)
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
            return withUnsafePointer(to: &s) { p in
                p.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { sin in
                    var addr = sin.pointee.sin_addr
                    var buf = [CChar](repeating: 0, count: Int(INET_ADDRSTRLEN))
                    inet_ntop(AF_INET, &addr, &buf, socklen_t(buf.count))
                    return String(cString: buf)
                }
            }
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
