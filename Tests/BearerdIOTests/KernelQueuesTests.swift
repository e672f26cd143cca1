// The test helper that back-pressure tests use to subtract what the kernel holds in socket
// buffers from what an origin sent: its sum must be exact, or a proxy that buffers could pass.

import Testing
import Dispatch
import BearerdIO
import BearerdTestSupport
#if canImport(Glibc)
import Glibc
#endif

@Suite("Kernel socket queues (test support)")
struct KernelQueuesTests {
    @Test func sumsBothQueuesOfTheSocketsOnTheGivenPorts() {
        let table = """
          sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
           0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 100 0 0 10 0
           1: 0100007F:1F90 0100007F:C350 01 00000000:00010000 00:00000000 00000000     0        0 2 1 0 20 4 30 10 -1
           2: 0100007F:C350 0100007F:1F90 01 00000200:00000000 00:00000000 00000000     0        0 3 1 0 20 4 30 10 -1
           3: 0100007F:2710 0100007F:C351 01 00FF0000:00FF0000 00:00000000 00000000     0        0 4 1 0 20 4 30 10 -1
        """
        // Port 8080 (0x1F90): the listener (nothing queued), 64 KiB received unread, 512 bytes unsent.
        #expect(KernelQueues.queuedBytes(table: table, ports: [8080]) == 0x10000 + 0x200)
        // Port 10000 (0x2710): both queues of one socket.
        #expect(KernelQueues.queuedBytes(table: table, ports: [10000]) == 0xFF0000 * 2)
        #expect(KernelQueues.queuedBytes(table: table, ports: [8080, 10000]) == 0x10000 + 0x200 + 0xFF0000 * 2)
        #expect(KernelQueues.queuedBytes(table: table, ports: [9999]) == 0)
        #expect(KernelQueues.queuedBytes(table: "garbage\n1: x y z w\n", ports: [8080]) == 0)
    }

    /// Live: bytes written to a peer that does not read are counted once, not once per side,
    /// wherever the connection's rows are in the table (a /proc table is longer than a page).
    @Test func countsUnreadBytesOnALoopbackConnectionOnce() throws {
        // Listeners come first in the table: 40 of them (~150 bytes a row) push the connection's
        // rows past the first page.
        var padding: [Int32] = []
        defer { for fd in padding { close(fd) } }
        for _ in 0..<40 {
            let fd = socket(AF_INET, linuxSockStream, 0)
            _ = SocketAddress.numeric("127.0.0.1", port: 0)!.withSockAddr { bind(fd, $0, $1) }
            _ = Glibc.listen(fd, 1)
            padding.append(fd)
        }
        #expect((KernelQueues.readAll("/proc/net/tcp") ?? "").utf8.count > 6000)
        let listener = socket(AF_INET, linuxSockStream, 0)
        defer { close(listener) }
        let any = SocketAddress.numeric("127.0.0.1", port: 0)!
        #expect(any.withSockAddr { bind(listener, $0, $1) } == 0)
        #expect(Glibc.listen(listener, 4) == 0)
        var address = sockaddr_in()
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(listener, $0, &length) }
        }
        let port = UInt16(bigEndian: address.sin_port)
        let client = socket(AF_INET, linuxSockStream, 0)
        defer { close(client) }
        #expect(SocketAddress.numeric("127.0.0.1", port: port)!.withSockAddr { connect(client, $0, $1) } == 0)
        let server = accept(listener, nil, nil)
        defer { close(server) }
        let bytes = [UInt8](repeating: 7, count: 100_000)
        #expect(bytes.withUnsafeBytes { send(client, $0.baseAddress, $0.count, 0) } == bytes.count)
        var queued = 0
        let deadline = DispatchTime.now() + .seconds(2)
        repeat {
            usleep(10_000)
            queued = KernelQueues.queuedBytes(ports: [port])
        } while queued != bytes.count && DispatchTime.now() < deadline
        let rows = (KernelQueues.readAll("/proc/net/tcp") ?? "").split(separator: "\n")
            .filter { $0.contains(String(format: ":%04X ", port)) }
        #expect(queued == bytes.count, "port \(port): \(rows)")
    }
}
