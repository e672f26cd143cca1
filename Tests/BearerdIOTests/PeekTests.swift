import Testing
@testable import BearerdIO
import CBearerdShim
#if canImport(Glibc)
import Glibc
#endif

/// `Syscalls.peek`, which decides whether an idle pooled upstream connection may carry another
/// request (docs/architecture.md §5): stray bytes or the peer's EOF must be seen without consuming them.
@Suite struct PeekTests {
    @Test func peekSeesBytesAndEOFWithoutConsumingThem() throws {
        var fds: [Int32] = [0, 0]
        #expect(socketpair(AF_UNIX, linuxSockStream, 0, &fds) == 0)
        defer { close(fds[0]) }
        #expect(Syscalls.System.peek(fds[0]) == -Int(EAGAIN), "nothing waiting")
        var stray: [UInt8] = Array("HTTP/1.1 200 OK\r\n".utf8)
        #expect(send(fds[1], &stray, stray.count, 0) == stray.count)
        #expect(Syscalls.System.peek(fds[0]) == 1, "bytes waiting")
        #expect(Syscalls.System.peek(fds[0]) == 1, "still there: peeking consumes nothing")
        var buf = [UInt8](repeating: 0, count: 64)
        #expect(read(fds[0], &buf, buf.count) == stray.count)
        #expect(Syscalls.System.peek(fds[0]) == -Int(EAGAIN))
        close(fds[1])
        #expect(Syscalls.System.peek(fds[0]) == 0, "the peer's EOF")
    }
}

/// The default loop count follows the CPUs the process may use (docs/architecture.md §2.2; default settings
/// under taskset or a container CPU limit).
@Suite struct CoreCountTests {
    @Test func cgroupQuotaIsRoundedUp() {
        #expect(EventLoopGroup.cgroupCPUQuota("max 100000\n") == nil)
        #expect(EventLoopGroup.cgroupCPUQuota("50000 100000\n") == 1)
        #expect(EventLoopGroup.cgroupCPUQuota("200000 100000") == 2)
        #expect(EventLoopGroup.cgroupCPUQuota("250000 100000") == 3)
        #expect(EventLoopGroup.cgroupCPUQuota("garbage") == nil)
        #expect(EventLoopGroup.cgroupCPUQuota("1 0") == nil)
        #expect(EventLoopGroup.cgroupCPUQuota(nil) == nil)
    }

    @Test func coreCountIsWithinTheAffinityMask() {
        let n = EventLoopGroup.coreCount
        #expect(n >= 1)
        #expect(n <= max(1, Int(bearerd_affinity_cpu_count())))
    }
}
