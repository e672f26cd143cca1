import Dispatch
import BearerdTLS
#if canImport(Glibc)
import Glibc
#endif

/// A tunnel through a forward proxy (`outbound_proxy:`): `CONNECT host:port` (RFC 9110 §9.3.6)
/// on a fresh connection to the proxy, with `Proxy-Authorization: Basic` when the proxy URL
/// carried credentials (`OutboundProxy.Endpoint.proxyAuthorization`). The blocking exchange runs on a global queue (like DNS), never on a
/// loop; the connected descriptor then becomes a `SocketChannel` (`adoptConnected`), which
/// starts TLS to the target inside the tunnel.
public enum ProxyTunnel {
    public struct Failure: Error, Sendable, CustomStringConvertible {
        public var message: String
        public var description: String { message }
    }

    /// Opens the tunnel off-loop; `completion` runs on `loop` with the connected fd (blocking
    /// mode, the caller's to adopt) or why not.
    public static func open(proxyHost: String, proxyPort: UInt16, proxyAuthorization: String?, targetHost: String, targetPort: UInt16,
                            timeout: Duration, on loop: EventLoop, completion: @escaping (Result<Int32, Failure>) -> Void) {
        DispatchQueue.global().async {
            let result = openBlocking(proxyHost: proxyHost, proxyPort: proxyPort, proxyAuthorization: proxyAuthorization,
                                      targetHost: targetHost, targetPort: targetPort, timeout: timeout)
            loop.execute { completion(result) }
        }
    }

    /// The CONNECT request head; `proxyAuthorization` is the `Proxy-Authorization` value.
    public static func connectRequest(targetHost: String, targetPort: UInt16, proxyAuthorization: String?) -> [UInt8] {
        let authority = (targetHost.contains(":") ? "[\(targetHost)]" : targetHost) + ":\(targetPort)"
        var head = "CONNECT \(authority) HTTP/1.1\r\nHost: \(authority)\r\n"
        if let proxyAuthorization { head += "Proxy-Authorization: \(proxyAuthorization)\r\n" }
        head += "\r\n"
        return Array(head.utf8)
    }

    static func openBlocking(proxyHost: String, proxyPort: UInt16, proxyAuthorization: String?, targetHost: String, targetPort: UInt16,
                             timeout: Duration) -> Result<Int32, Failure> {
        let deadline = monotonicNanos() &+ UInt64(max(1, timeout.components.seconds)) &* 1_000_000_000
        let addresses = Resolver.resolveBlocking(host: proxyHost, port: proxyPort)
        guard !addresses.isEmpty else { return .failure(Failure(message: "cannot resolve the proxy \(proxyHost)")) }
        var lastError = "no address"
        for address in addresses {
            let fd = socket(address.family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
            guard fd >= 0 else { continue }
            let rc = address.withSockAddr { connect(fd, $0, $1) }
            if rc != 0 && errno != EINPROGRESS {
                lastError = String(cString: strerror(errno))
                close(fd)
                continue
            }
            guard wait(fd, for: Int16(POLLOUT), until: deadline) else {
                lastError = "timed out"
                close(fd)
                continue
            }
            var err: Int32 = 0
            var len = socklen_t(MemoryLayout<Int32>.size)
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len)
            if err != 0 {
                lastError = String(cString: strerror(err))
                close(fd)
                continue
            }
            switch handshake(fd, targetHost: targetHost, targetPort: targetPort, proxyAuthorization: proxyAuthorization, deadline: deadline) {
            case .success:
                return .success(fd)
            case .failure(let f):
                close(fd)
                return .failure(f)
            }
        }
        return .failure(Failure(message: "cannot connect to the proxy \(proxyHost):\(proxyPort): \(lastError)"))
    }

    private static func wait(_ fd: Int32, for events: Int16, until deadline: UInt64) -> Bool {
        while true {
            let now = monotonicNanos()
            guard now < deadline else { return false }
            var p = pollfd(fd: fd, events: events, revents: 0)
            let rc = poll(&p, 1, Int32(clamping: (deadline - now) / 1_000_000 + 1))
            if rc > 0 { return true }
            if rc < 0 && errno != EINTR { return false }
        }
    }

    /// Sends CONNECT and reads the proxy's answer head byte by byte (nothing of the tunnel is
    /// consumed); a 2xx opens the tunnel (RFC 9110 §15.3: any 2xx).
    private static func handshake(_ fd: Int32, targetHost: String, targetPort: UInt16, proxyAuthorization: String?,
                                  deadline: UInt64) -> Result<Void, Failure> {
        let request = connectRequest(targetHost: targetHost, targetPort: targetPort, proxyAuthorization: proxyAuthorization)
        var off = 0
        while off < request.count {
            guard wait(fd, for: Int16(POLLOUT), until: deadline) else { return .failure(Failure(message: "the proxy did not take the CONNECT in time")) }
            let n = request[off...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n < 0 {
                if errno == EAGAIN || errno == EINTR { continue }
                return .failure(Failure(message: "sending CONNECT to the proxy: \(String(cString: strerror(errno)))"))
            }
            off += n
        }
        var head: [UInt8] = []
        var byte: UInt8 = 0
        while !(head.count >= 4 && head.suffix(4) == [13, 10, 13, 10]) {
            guard head.count < 16 * 1024 else { return .failure(Failure(message: "the proxy's answer to CONNECT is too long")) }
            guard wait(fd, for: Int16(POLLIN), until: deadline) else { return .failure(Failure(message: "the proxy did not answer CONNECT in time")) }
            let n = recv(fd, &byte, 1, 0)
            if n == 0 { return .failure(Failure(message: "the proxy closed the connection instead of answering CONNECT")) }
            if n < 0 {
                if errno == EAGAIN || errno == EINTR { continue }
                return .failure(Failure(message: "reading the proxy's answer: \(String(cString: strerror(errno)))"))
            }
            head.append(byte)
        }
        let statusLine = String(decoding: head.prefix { $0 != 13 }, as: UTF8.self)
        let parts = statusLine.split(separator: " ", maxSplits: 2)
        guard parts.count >= 2, parts[0].hasPrefix("HTTP/1."), let status = Int(parts[1]) else {
            return .failure(Failure(message: "the proxy's answer to CONNECT is not HTTP: \(statusLine.prefix(80))"))
        }
        guard (200...299).contains(status) else {
            let hint = status == 407 ? " (the proxy wants credentials: http://user:password@host:port)" : ""
            return .failure(Failure(message: "the proxy refused the tunnel: \(statusLine.prefix(120))\(hint)"))
        }
        return .success(())
    }
}

extension SocketChannel {
    /// A channel on a descriptor that is already connected (a proxy tunnel): `channelActive`
    /// follows as for `connect`, after the TLS handshake when `tls` is given.
    public static func adoptConnected(fd: Int32, peer: SocketAddress?, loop: EventLoop, tls: TLSEngine?,
                                      delegate: ChannelDelegate) throws(IOError) -> SocketChannel {
        try Sys.setNonBlocking(fd)
        loop.syscalls.setSocketOption(fd, Int32(IPPROTO_TCP), TCP_NODELAY, 1)
        return SocketChannel.startConnected(fd: fd, peer: peer, loop: loop, tls: tls, delegate: delegate)
    }
}
