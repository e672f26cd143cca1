// A closing channel's last output waits for its FIN (MSG_MORE), so the answer and the FIN leave
// in one segment: one segment fewer per connection that ends after its answer, and the peer's
// ACK and FIN come back in one too. The FIN is sent with shutdown(2) before close(2), so input
// that arrives unseen at the last moment cannot make the kernel drop the waiting answer.

import Testing
import Dispatch
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

@Suite("SocketChannel sends its FIN with the last segment")
struct FINWithLastSegmentTests {
    @Test func anOpenChannelsWritesLeaveAtOnce() {
        let (s, ch, _) = CloseDecisionTests.servedRequest()
        s.kernel.script(sends: [.all])
        s.event { ch.write(Array("HTTP/1.1 200 OK\r\n\r\n".utf8)) }
        #expect(s.kernel.calls.filter { $0.hasPrefix("send") } == ["send 9100 19/19"])
        #expect(!s.event { ch.isClosed })
    }

    @Test func aClosingChannelsLastWriteWaitsForTheFINThatShutdownSends() {
        let (s, ch, d) = CloseDecisionTests.servedRequest()
        s.kernel.script(sends: [.all])
        s.event {
            ch.write(Array("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".utf8))
            ch.closeAfterFlush(.lingerIfInputPending)
        }
        #expect(s.kernel.calls.suffix(3) == ["send-before-fin 9100 38/38", "shutdown 9100 WR", "close 9100"])
        #expect(s.event { d.closedCalls } == 1)
    }

    @Test func partialWritesWhileClosingAllWaitForTheFIN() {
        let (s, ch, _) = CloseDecisionTests.servedRequest()
        s.kernel.script(sends: [.upTo(5), .again])
        s.event {
            ch.write(Array("0123456789".utf8))
            ch.closeAfterFlush(.lingerIfInputPending)
        }
        #expect(s.event { ch.phase } == .flushingBeforeClose(.lingerIfInputPending))
        #expect(s.kernel.count("shutdown") == 0, "no FIN before the last byte is written")
        s.kernel.script(sends: [.all])
        s.event { ch.pollerEvent(readable: false, writable: true, hangup: false) }
        #expect(s.kernel.calls.filter { $0.hasPrefix("send") || $0.hasPrefix("shutdown") || $0.hasPrefix("close") } == [
            "send-before-fin 9100 5/10", "send-before-fin 9100 EAGAIN", "send-before-fin 9100 5/5",
            "shutdown 9100 WR", "close 9100",
        ])
        #expect(s.kernel.written == Array("0123456789".utf8))
    }

    @Test func aLingeringCloseShutsDownOnce() {
        let (s, ch, _) = CloseDecisionTests.servedRequest()
        s.kernel.script(sends: [.all])
        s.event {
            ch.write(Array("bye".utf8))
            ch.closeAfterFlush()
        }
        #expect(s.event { ch.phase } == .lingering)
        #expect(s.kernel.calls.suffix(2) == ["send-before-fin 9100 3/3", "shutdown 9100 WR"])
        s.event { ch.close() }
    }

    @Test func afterThePeersEOFCloseSendsTheFIN() {
        let (s, ch, _) = CloseDecisionTests.servedRequest()
        s.kernel.script(sends: [.upTo(1), .again])
        s.event {
            ch.write(Array("bye".utf8))
            ch.closeAfterFlush()
        }
        s.kernel.script(reads: [.eof])
        s.event { ch.pollerEvent(readable: true, writable: false, hangup: true) }
        #expect(s.event { ch.phase } == .flushingAfterPeerEOF)
        s.kernel.script(sends: [.all])
        s.event { ch.pollerEvent(readable: false, writable: true, hangup: false) }
        #expect(s.event { ch.isClosed })
        #expect(s.kernel.calls.suffix(2) == ["send-before-fin 9100 2/2", "close 9100"])
        #expect(s.kernel.count("shutdown") == 0, "nothing unread after the EOF: close(2) sends the FIN")
    }

    /// Over real loopback TCP: the client counts the segments that bring the answer and the EOF.
    @Test(arguments: [EventLoop.IOMode.loopPoller, .socketSources])
    func theAnswerAndTheFINArriveInOneSegment(mode: EventLoop.IOMode) throws {
        let group = EventLoopGroup(count: 1, ioMode: mode)
        let server = ServerEnd()
        let l = try Listener.bind(host: "127.0.0.1", port: 0, group: group) { fd, _, loop in
            let ch = SocketChannel(fd: fd, loop: loop)
            ch.delegate = server
            server.set(ch)
            ch.start()
        }
        defer { l.stop() }
        let client = socket(AF_INET, linuxSockStream, 0)
        defer { close(client) }
        #expect(l.localAddress.withSockAddr { connect(client, $0, $1) } == 0)
        let request = Array("GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".utf8)
        #expect(request.withUnsafeBytes { send(client, $0.baseAddress, $0.count, 0) } == request.count)
        #expect(server.waitForRequest(request.count))
        // The server's ACK of the request (immediate or delayed, at most 40 ms) is in by now.
        usleep(100_000)
        let before = try Self.segmentsIn(client)
        let answer = Array(repeating: UInt8(ascii: "a"), count: 300)
        let ch = try #require(server.channel)
        ch.loop.execute {
            ch.write(answer)
            ch.closeAfterFlush(.lingerIfInputPending)
        }
        var got: [UInt8] = []
        var buf = [UInt8](repeating: 0, count: 4096)
        while true {
            let n = buf.withUnsafeMutableBytes { recv(client, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            got += buf[0..<n]
        }
        let after = try Self.segmentsIn(client)
        #expect(got == answer)
        #expect(after &- before == 1, "the answer and the FIN in one segment")
    }

    /// tcp_info's `tcpi_segs_in` (offset 140 in <linux/tcp.h>; glibc's struct stops before it).
    static func segmentsIn(_ fd: Int32) throws -> UInt32 {
        var info = [UInt8](repeating: 0, count: 232)
        var len = socklen_t(info.count)
        let rc = info.withUnsafeMutableBytes { getsockopt(fd, Int32(IPPROTO_TCP), TCP_INFO, $0.baseAddress, &len) }
        try #require(rc == 0 && len >= 144)
        return info.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: 140, as: UInt32.self) }
    }
}

/// The accepted connection's channel and what it read; written on the loop, read by the test.
final class ServerEnd: ChannelDelegate, @unchecked Sendable {  // @unchecked: guarded by `lock`
    private let lock = Lock()
    private var _channel: SocketChannel?
    private var received = 0

    func set(_ ch: SocketChannel) { lock.withLock { _channel = ch } }
    var channel: SocketChannel? { lock.withLock { _channel } }

    /// Waits (at most 5 s) until `count` bytes were read.
    func waitForRequest(_ count: Int) -> Bool {
        for _ in 0..<1000 {
            if lock.withLock({ received >= count }) { return true }
            usleep(5_000)
        }
        return false
    }

    func channelRead(_ channel: SocketChannel, _ bytes: UnsafeRawBufferPointer) { lock.withLock { received += bytes.count } }
    func channelEOF(_ channel: SocketChannel) {}
    func channelError(_ channel: SocketChannel, _ error: ChannelError) {}
    func channelClosed(_ channel: SocketChannel) {}
}
