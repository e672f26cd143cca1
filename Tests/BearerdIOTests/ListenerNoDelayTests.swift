// TCP_NODELAY is set once on the listening socket (Linux copies it to each accepted
// connection) instead of with a setsockopt per accepted connection.

import Testing
import Dispatch
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

@Suite("Listener TCP_NODELAY")
struct ListenerNoDelayTests {
    @Test func acceptedConnectionsCostNoSetsockopt() throws {
        let s = ScriptedLoop(.loopPoller)
        let accepted = AcceptLog()
        let l = try ListenerShellTests.listener(s, accepted: accepted)
        #expect(s.eventually { s.kernel.count("epoll add-level \(l.fd)") == 1 })
        #expect(s.kernel.calls.contains("setsockopt \(l.fd) \(IPPROTO_TCP) \(TCP_NODELAY) 1"))
        s.kernel.script(accepts: [.connection(700), .connection(701)])
        s.event { l.pollerEvent(readable: true, writable: false, hangup: false) }
        s.event { l.pollerEvent(readable: true, writable: false, hangup: false) }
        #expect(accepted.fds == [700, 701])
        #expect(!s.kernel.calls.contains { $0.hasPrefix("setsockopt 700") || $0.hasPrefix("setsockopt 701") })
        l.stop()
        #expect(s.eventually { l.acceptState == .stopped })
    }

    @Test func aRealAcceptedConnectionHasNoDelay() throws {
        let group = EventLoopGroup(count: 1, ioMode: .loopPoller)
        let got = NoDelayProbe()
        let l = try Listener.bind(host: "127.0.0.1", port: 0, group: group) { fd, _, _ in
            got.set(Self.noDelay(fd))  // read before the fd is closed
            _ = Glibc.close(fd)
        }
        defer { l.stop() }
        let client = socket(AF_INET, linuxSockStream, 0)
        defer { close(client) }
        let rc = l.localAddress.withSockAddr { connect(client, $0, $1) }
        #expect(rc == 0)
        #expect(got.wait() == 1)
    }

    static func noDelay(_ fd: Int32) -> Int32 {
        var v: Int32 = 0
        var len = socklen_t(MemoryLayout<Int32>.size)
        guard getsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &v, &len) == 0 else { return -1 }
        return v
    }
}

/// The TCP_NODELAY value seen on the accepting loop, handed to the test thread.
final class NoDelayProbe: @unchecked Sendable {  // @unchecked: `value` is written before `sem` is signalled
    private let sem = DispatchSemaphore(value: 0)
    private var value: Int32 = -3
    func set(_ v: Int32) {
        value = v
        sem.signal()
    }
    func wait() -> Int32 { sem.wait(timeout: .now() + .seconds(5)) == .success ? value : -4 }
}

/// accept4 results on the real kernel, counted (any thread).
final class AcceptCounter: @unchecked Sendable {  // @unchecked: guarded by `lock`
    private let lock = Lock()
    private var _accepted = 0
    private var _failed = 0
    func record(_ rc: Int) { lock.withLock { if rc >= 0 { _accepted += 1 } else { _failed += 1 } } }
    var counts: (accepted: Int, failed: Int) { lock.withLock { (_accepted, _failed) } }
}

@Suite("Listener accepting on the real kernel")
struct ListenerRealAcceptTests {
    /// Connections queued before the loop looks are all accepted, one per report of the
    /// level-triggered socket, and no accept4 fails (draining to EAGAIN made one fail after
    /// nearly every batch, each allocating and freeing a socket inode, file and dentry).
    @Test func aQueuedBacklogIsAcceptedWithoutAFailedAccept() throws {
        let counter = AcceptCounter()
        let sys = Syscalls(accept: { fd, address, length in
            let rc = Syscalls.System.accept(fd, address, length)
            counter.record(rc)
            return rc
        })
        let loop = EventLoop(index: 0, ioMode: .loopPoller, syscalls: sys)
        let group = EventLoopGroup(loops: [loop])
        let accepted = AcceptLog()
        // Hold the loop while the clients connect, so their connections wait in the backlog.
        let gate = DispatchSemaphore(value: 0)
        loop.execute { _ = gate.wait(timeout: .now() + .seconds(10)) }
        let l = try Listener.bind(host: "127.0.0.1", port: 0, group: group) { fd, _, _ in
            accepted.add(fd)
            _ = Glibc.close(fd)
        }
        defer { l.stop() }
        var clients: [Int32] = []
        defer { for c in clients { close(c) } }
        for _ in 0..<20 {
            let c = socket(AF_INET, linuxSockStream, 0)
            #expect(l.localAddress.withSockAddr { connect(c, $0, $1) } == 0)  // the kernel completes the handshake
            clients.append(c)
        }
        gate.signal()
        let deadline = DispatchTime.now() + .seconds(5)
        while accepted.fds.count < 20 && DispatchTime.now() < deadline { usleep(1_000) }
        #expect(accepted.fds.count == 20)
        #expect(counter.counts.accepted == 20)
        #expect(counter.counts.failed == 0)
    }
}
