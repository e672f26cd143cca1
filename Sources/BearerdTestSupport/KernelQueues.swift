import Foundation

/// Bytes the kernel holds in TCP sockets, from `/proc/net/tcp` and `/proc/net/tcp6`.
///
/// A back-pressure test needs to know what a proxy keeps in its own buffers. What an origin has
/// "sent" includes everything sitting in socket buffers along the way, and on Linux those
/// autotune up to `tcp_rmem`/`tcp_wmem` max (32 MiB here): a bound on the origin's count alone
/// depends on the machine. Subtracting what the kernel holds leaves what the process buffered.
public enum KernelQueues {
    /// The sum of `tx_queue` (written, not yet acknowledged) and `rx_queue` (received, not yet
    /// read) over every TCP socket whose local or remote port is in `ports`.
    public static func queuedBytes(ports: Set<UInt16>) -> Int {
        var total = 0
        for file in ["/proc/net/tcp", "/proc/net/tcp6"] {
            guard let text = readAll(file) else { continue }
            total += queuedBytes(table: text, ports: ports)
        }
        return total
    }

    /// A /proc file read to its end (its size says 0: `String(contentsOfFile:)` stops at the
    /// first page, and a table longer than that loses its rows).
    public static func readAll(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var bytes: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if n < 0 && errno == EINTR { continue }
            guard n > 0 else { break }
            bytes += chunk[0..<n]
        }
        return String(decoding: bytes, as: UTF8.self)
    }

    /// The same sum over the text of one table (pure, for tests).
    public static func queuedBytes(table: String, ports: Set<UInt16>) -> Int {
        var total = 0
        for line in table.split(separator: "\n").dropFirst() {
            let columns = line.split(separator: " ", omittingEmptySubsequences: true)
            // sl, local_address, rem_address, st, tx_queue:rx_queue, ...
            guard columns.count > 4,
                  let local = port(of: columns[1]), let remote = port(of: columns[2]),
                  ports.contains(local) || ports.contains(remote) else { continue }
            let queues = columns[4].split(separator: ":")
            guard queues.count == 2,
                  let tx = Int(queues[0], radix: 16), let rx = Int(queues[1], radix: 16) else { continue }
            total += tx + rx
        }
        return total
    }

    /// The port of an `ADDRESS:PORT` column (hexadecimal).
    private static func port(of column: Substring) -> UInt16? {
        guard let colon = column.lastIndex(of: ":") else { return nil }
        return UInt16(column[column.index(after: colon)...], radix: 16)
    }
}
