import BearerdIO
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A datagram socket standing in for systemd's notification socket: bound at a fresh path (or
/// an abstract name), it collects every message sent to it.
public final class NotifyReceiver {
    public let fd: Int32
    /// The value for $NOTIFY_SOCKET.
    public let address: String

    public init(abstract: Bool = false) throws {
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard fd >= 0 else { throw IOError("socket", errno) }
        let name = "bearerd-notify-\(UUID().uuidString.prefix(8))"
        address = abstract ? "@" + name : NSTemporaryDirectory() + name + ".sock"
        guard let sa = abstract ? SocketAddress.unixAbstract(name) : SocketAddress.unix(address) else {
            throw IOError("bind \(address)", ENAMETOOLONG)
        }
        let fd = self.fd
        guard sa.withSockAddr({ Glibc.bind(fd, $0, $1) }) == 0 else { throw IOError("bind \(address)", errno) }
    }

    deinit {
        close(fd)
        if !address.hasPrefix("@") { unlink(address) }
    }

    /// The next message, or nil after `timeout`.
    public func receive(timeout: Duration = .seconds(5)) -> String? {
        var pfd = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
        guard poll(&pfd, 1, Int32(timeout.nanoseconds / 1_000_000)) == 1 else { return nil }
        var buf = [UInt8](repeating: 0, count: 4096)
        let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        return n >= 0 ? String(decoding: buf[0..<n], as: UTF8.self) : nil
    }

    /// Messages until one satisfies `stop` (included) or `timeout` passes.
    public func receive(until stop: (String) -> Bool, timeout: Duration = .seconds(10)) -> [String] {
        var got: [String] = []
        let deadline = monotonicNanos() + timeout.nanoseconds
        while monotonicNanos() < deadline {
            guard let m = receive(timeout: .nanoseconds(Int64(deadline - monotonicNanos()))) else { break }
            got.append(m)
            if stop(m) { break }
        }
        return got
    }
}
