// TCP listeners defer accepts until the client's first bytes arrive (TCP_DEFER_ACCEPT), and an
// accepted channel reads them before it joins the epoll set: one poller report fewer per
// connection. A silent client is still accepted after the deferral.

import Testing
import Dispatch
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

@Suite("Deferred accept and the first read")
struct DeferredAcceptTests {
    /// The socket's TCP_DEFER_ACCEPT (seconds), or `-errno`.
    static func deferAccept(_ fd: Int32) -> Int { Syscalls.System.getOption(fd, Int32(IPPROTO_TCP), TCP_DEFER_ACCEPT) }

    @Test func tcpListenersDeferAcceptsAndUnixListenersDoNot() throws {
        let group = EventLoopGroup(count: 1, ioMode: .loopPoller)
        let tcp = try Listener.bind(host: "127.0.0.1", port: 0, group: group) { fd, _, _ in _ = Glibc.close(fd) }
        defer { tcp.stop() }
        #expect(Self.deferAccept(tcp.fd) > 0)
        let dir = "/tmp/bearerd-defer-\(getpid())"  // not /tmp itself: others can write there
        mkdir(dir, 0o700)
        let path = dir + "/api.sock"
        unlink(path)
        let unix = try Listener.bindUnix(path: path, group: group) { fd, _, _ in _ = Glibc.close(fd) }
        defer { unix.stop() }
        #expect(Self.deferAccept(unix.fd) < 0, "TCP_DEFER_ACCEPT is a TCP option: a unix socket has none")
    }

    /// A socket-activated listener whose unit set `DeferAcceptSec=` keeps that deferral.
    @Test func anAdoptedListenerKeepsItsOwnDeferral() throws {
        let fd = socket(AF_INET, linuxSockStream, 0)
        #expect(fd >= 0)
        var v: Int32 = 30
        #expect(setsockopt(fd, Int32(IPPROTO_TCP), TCP_DEFER_ACCEPT, &v, socklen_t(MemoryLayout<Int32>.size)) == 0)
        let any = SocketAddress.numeric("127.0.0.1", port: 0)!
        #expect(any.withSockAddr { bind(fd, $0, $1) } == 0)
        #expect(Glibc.listen(fd, 16) == 0)
        let before = Self.deferAccept(fd)
        let l = try Listener.adopt(fd: fd, group: EventLoopGroup(count: 1, ioMode: .loopPoller)) { cfd, _, _ in _ = Glibc.close(cfd) }
        defer { l.stop() }
        #expect(Self.deferAccept(fd) == before, "the unit's value stays")
    }

    /// A client that connects and sends nothing is still handed over once the deferral is over
    /// (bounded: it then meets the header read timeout, as any silent client).
    @Test func aSilentClientIsAcceptedAfterTheDeferral() throws {
        let group = EventLoopGroup(count: 1, ioMode: .loopPoller)
        let accepted = AcceptLog()
        let l = try Listener.bind(host: "127.0.0.1", port: 0, group: group) { fd, _, _ in
            accepted.add(fd)
            _ = Glibc.close(fd)
        }
        defer { l.stop() }
        let silent = socket(AF_INET, linuxSockStream, 0)
        defer { close(silent) }
        #expect(l.localAddress.withSockAddr { connect(silent, $0, $1) } == 0)
        let talker = socket(AF_INET, linuxSockStream, 0)
        defer { close(talker) }
        #expect(l.localAddress.withSockAddr { connect(talker, $0, $1) } == 0)
        #expect(send(talker, "GET / HTTP/1.1\r\n", 16, 0) == 16)
        var deadline = DispatchTime.now() + .seconds(2)
        while accepted.fds.isEmpty && DispatchTime.now() < deadline { usleep(1_000) }
        #expect(accepted.fds.count == 1, "the client that spoke first is accepted at once")
        // The kernel hands the silent one over at its first SYN-ACK retransmission after the
        // deferral (1 s, then the client's ACK): well within 10 s.
        deadline = DispatchTime.now() + .seconds(10)
        while accepted.fds.count < 2 && DispatchTime.now() < deadline { usleep(5_000) }
        #expect(accepted.fds.count == 2, "the silent client is accepted after the deferral")
    }

    /// Reading first: the waiting bytes are read before EPOLL_CTL_ADD, in the same event.
    @Test func anAcceptedChannelReadsItsFirstBytesBeforeJoiningTheEpollSet() {
        let s = ScriptedLoop(.loopPoller)
        let d = RecordingDelegate()
        s.kernel.script(reads: [.data(Array("GET / HTTP/1.1\r\n\r\n".utf8))])
        _ = s.event { () -> SocketChannel in
            let ch = SocketChannel(fd: SocketChannelShellTests.fakeFD, loop: s.loop)
            ch.delegate = d
            ch.start(readingFirst: true)
            return ch
        }
        #expect(s.event { d.received } == Array("GET / HTTP/1.1\r\n\r\n".utf8))
        let calls = s.kernel.calls
        let read = calls.firstIndex { $0.hasPrefix("read \(SocketChannelShellTests.fakeFD) 18") }
        let add = calls.firstIndex(of: "epoll add \(SocketChannelShellTests.fakeFD)")
        #expect(read != nil && add != nil && read! < add!, "\(calls)")
    }

    /// A connection the first read ends (the peer's EOF; the owner closes) never joins the set.
    @Test func aChannelClosedByItsFirstReadIsNeverRegistered() {
        let s = ScriptedLoop(.loopPoller)
        let d = RecordingDelegate()
        s.kernel.script(reads: [.eof])
        let ch = s.event { () -> SocketChannel in
            let ch = SocketChannel(fd: SocketChannelShellTests.fakeFD, loop: s.loop)
            ch.delegate = d
            d.onEOF = { $0.close() }
            ch.start(readingFirst: true)
            return ch
        }
        #expect(s.event { d.eofs } == 1)
        #expect(s.kernel.count("epoll add") == 0)
        #expect(s.kernel.closed == [SocketChannelShellTests.fakeFD])
        _ = ch
    }

    /// Without `readingFirst` (a unix listener, a TLS handshake) the channel waits for the report.
    @Test func withoutReadingFirstTheChannelWaitsForTheReport() {
        let s = ScriptedLoop(.loopPoller)
        let d = RecordingDelegate()
        _ = s.event { () -> SocketChannel in
            let ch = SocketChannel(fd: SocketChannelShellTests.fakeFD, loop: s.loop)
            ch.delegate = d
            ch.start()
            return ch
        }
        #expect(s.kernel.calls.first == "epoll add \(SocketChannelShellTests.fakeFD)")
        #expect(!s.kernel.calls.contains { $0.hasPrefix("read") })
    }
}
