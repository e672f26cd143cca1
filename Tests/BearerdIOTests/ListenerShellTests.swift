// Listener against a scripted kernel: accept hitting EMFILE pauses accepting, the retry
// recovers, and stopping a paused listener leaves no suspended source behind.

import Testing
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

/// Accepted fds, recorded on the accepting loop and read by the test after a hop there.
final class AcceptLog: @unchecked Sendable {  // @unchecked: guarded by `lock`
    private let lock = Lock()
    private var _fds: [Int32] = []
    func add(_ fd: Int32) { lock.withLock { _fds.append(fd) } }
    var fds: [Int32] { lock.withLock { _fds } }
}

@Suite("Listener on a scripted kernel")
struct ListenerShellTests {
    /// A listener on the scripted loop. Poller mode: a fake socket (the scripted kernel answers
    /// socket, bind, listen). Sources mode: a real listening socket on 127.0.0.1 (a Dispatch
    /// source needs one), whose accepts the script still answers.
    static func listener(_ s: ScriptedLoop, accepted: AcceptLog) throws -> Listener {
        // socket, bind, listen and getsockname stay the real kernel's (see `ScriptedKernel`).
        let l = try Listener.bind(host: "127.0.0.1", port: 0, group: EventLoopGroup(loops: [s.loop])) { fd, _, _ in accepted.add(fd) }
        s.kernel.ownsRealFD(l.fd)
        return l
    }

    @Test func outOfDescriptorsPausesAcceptingAndTheRetryRecovers() throws {
        let s = ScriptedLoop(.loopPoller)
        let accepted = AcceptLog()
        let l = try Self.listener(s, accepted: accepted)
        #expect(s.eventually { s.kernel.count("epoll add-level \(l.fd)") == 1 })
        s.kernel.script(accepts: [.connection(700), .error(EMFILE)])
        s.event { l.pollerEvent(readable: true, writable: false, hangup: false) }
        s.event { l.pollerEvent(readable: true, writable: false, hangup: false) }
        #expect(accepted.fds == [700])
        #expect(s.event { l.acceptState } == .pausedOutOfDescriptors)
        // Paused: the level-triggered socket leaves the epoll set (every wait would report it
        // again, a spin on a backlog that cannot be served), and readiness is ignored.
        #expect(s.kernel.calls.last == "epoll del \(l.fd)")
        s.event { l.pollerEvent(readable: true, writable: false, hangup: false) }
        #expect(s.kernel.count("accept") == 2)
        // The retry puts it back; the poller reports it again while connections wait.
        #expect(s.eventually { s.kernel.count("epoll add-level \(l.fd)") == 2 })
        #expect(s.event { l.acceptState } == .accepting)
        s.kernel.script(accepts: [.connection(701), .connection(702)])
        s.event { l.pollerEvent(readable: true, writable: false, hangup: false) }
        s.event { l.pollerEvent(readable: true, writable: false, hangup: false) }
        #expect(accepted.fds == [700, 701, 702])
        l.stop()
        #expect(s.eventually { l.acceptState == .stopped })
        #expect(s.kernel.calls.suffix(2).first == "epoll del \(l.fd)")
        #expect(s.kernel.closed.count == 1)
    }

    @Test func stoppingWhilePausedLeavesTheEpollSetOnce() throws {
        let s = ScriptedLoop(.loopPoller)
        let l = try Self.listener(s, accepted: AcceptLog())
        #expect(s.eventually { s.kernel.count("epoll add-level \(l.fd)") == 1 })
        s.kernel.script(accepts: [.error(EMFILE)])
        s.event { l.pollerEvent(readable: true, writable: false, hangup: false) }
        #expect(s.event { l.acceptState } == .pausedOutOfDescriptors)
        l.stop()
        #expect(s.eventually { l.acceptState == .stopped })
        #expect(s.kernel.count("epoll del \(l.fd)") == 1)
        #expect(s.eventually { l.pauseRetriesRun == 1 }, "the retry ran, found the listener stopped")
        #expect(s.kernel.count("epoll add-level \(l.fd)") == 1, "a stopped listener is never registered again")
    }

    /// A poller-served listener takes one connection per report and never asks the kernel for
    /// one more: a failed accept4 allocates and frees a socket inode, file and dentry (about a
    /// tenth of the kernel's work for a short connection).
    @Test func pollerListenerAcceptsOnePerReportWithoutAFailedAccept() throws {
        let s = ScriptedLoop(.loopPoller)
        let accepted = AcceptLog()
        let l = try Self.listener(s, accepted: accepted)
        #expect(s.eventually { s.kernel.count("epoll add-level \(l.fd)") == 1 })
        s.kernel.script(accepts: [.connection(700), .connection(701), .connection(702)])
        for _ in 0..<3 { s.event { l.pollerEvent(readable: true, writable: false, hangup: false) } }
        #expect(accepted.fds == [700, 701, 702])
        #expect(s.kernel.count("accept") == 3)
        #expect(!s.kernel.calls.contains { $0.hasSuffix("EAGAIN") })
        l.stop()
        #expect(s.eventually { l.acceptState == .stopped })
    }

    @Test func stoppingWhilePausedForDescriptorsResumesTheSuspendedSourceFirst() throws {
        let s = ScriptedLoop(.socketSources)
        let accepted = AcceptLog()
        let l = try Self.listener(s, accepted: accepted)
        let port = l.localAddress.port
        #expect(port != 0)
        s.kernel.script(accepts: [.error(EMFILE)])
        let client = socket(AF_INET, linuxSockStream, 0)
        defer { close(client) }
        let rc = SocketAddress.numeric("127.0.0.1", port: port)!.withSockAddr { connect(client, $0, $1) }
        #expect(rc == 0)
        #expect(s.eventually { l.acceptState == .pausedOutOfDescriptors }, "the source fired, accept hit EMFILE, the source is suspended")
        // A reload moving the listener: stop while suspended. libdispatch traps if a suspended
        // source is released; the listener resumes it before cancelling.
        l.stop()
        #expect(s.eventually { l.acceptState == .stopped })
        #expect(s.eventually { s.kernel.closed.count == 1 }, "the cancel handler ran and closed the socket")
        // The retry scheduled at the pause runs, finds the listener stopped and does nothing.
        #expect(s.eventually { l.pauseRetriesRun == 1 }, "the retry ran")
        #expect(s.kernel.count("accept") == 1)
        #expect(accepted.fds.isEmpty)
    }

    @Test func sourcesModeRecoversWhenDescriptorsComeBack() throws {
        let s = ScriptedLoop(.socketSources)
        let accepted = AcceptLog()
        let l = try Self.listener(s, accepted: accepted)
        s.kernel.script(accepts: [.error(EMFILE), .real, .again])
        let client = socket(AF_INET, linuxSockStream, 0)
        defer { close(client) }
        _ = SocketAddress.numeric("127.0.0.1", port: l.localAddress.port)!.withSockAddr { connect(client, $0, $1) }
        #expect(s.eventually { accepted.fds.count == 1 }, "after the pause the resumed source fired again and the connection was accepted")
        #expect(s.event { l.acceptState } == .accepting)
        l.stop()
        #expect(s.eventually { l.acceptState == .stopped })
        for fd in accepted.fds { close(fd) }
    }
}

