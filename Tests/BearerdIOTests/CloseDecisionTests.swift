// How a channel ends once its last output is written (RFC 9112 §9.6): at once when its owner
// expects nothing more and nothing unread waits in the socket, lingering otherwise.

import Testing
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

@Suite("SocketChannel close decision")
struct CloseDecisionTests {
    typealias Channel = SocketChannel

    @Test func finalStepClosesAtOnceOnlyWhenNothingCanBeUnread() {
        // After the peer's EOF nothing more arrives: no linger, whatever the mode.
        for tls in [false, true] {
            #expect(Channel.finalStep(mode: .linger, tls: tls, input: .ended) == .close)
            #expect(Channel.finalStep(mode: .lingerIfInputPending, tls: tls, input: .ended) == .close)
        }
        // The default lingers: the owner may expect more input (a body still on its way).
        #expect(Channel.finalStep(mode: .linger, tls: false, input: .drained) == .halfCloseAndLinger)
        #expect(Channel.finalStep(mode: .linger, tls: false, input: .unknown) == .halfCloseAndLinger)
        // The owner expects nothing more: close at once when the socket is drained.
        #expect(Channel.finalStep(mode: .lingerIfInputPending, tls: false, input: .drained) == .close)
        #expect(Channel.finalStep(mode: .lingerIfInputPending, tls: false, input: .unknown) == .halfCloseAndLinger)
        // TLS: the peer may answer our close_notify; a close would reset it.
        #expect(Channel.finalStep(mode: .lingerIfInputPending, tls: true, input: .drained) == .halfCloseAndLinger)
    }

    /// A started poller channel over a fake fd that has read `request` (a short read: drained).
    /// `onRead`: what the owner does on each read.
    static func servedRequest(_ request: String = "GET / HTTP/1.1\r\n\r\n",
                              onRead: ((SocketChannel) -> Void)? = nil) -> (ScriptedLoop, SocketChannel, RecordingDelegate) {
        let s = ScriptedLoop(.loopPoller, readBufferSize: 64)
        let d = RecordingDelegate()
        d.onRead = onRead
        let ch = s.event { () -> SocketChannel in
            let ch = SocketChannel(fd: 9_100, loop: s.loop)
            ch.delegate = d
            ch.start()
            return ch
        }
        s.kernel.script(reads: [.data(Array(request.utf8))])
        s.event { ch.pollerEvent(readable: true, writable: false, hangup: false) }
        return (s, ch, d)
    }

    @Test func aDrainedSocketClosesRightAfterItsLastWriteWithoutLingerOrEpollDel() {
        let (s, ch, d) = Self.servedRequest()
        s.kernel.script(sends: [.all])
        s.event {
            ch.write(Array("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n".utf8))
            ch.closeAfterFlush(.lingerIfInputPending)
        }
        #expect(s.event { ch.isClosed })
        #expect(s.event { d.closedCalls } == 1)
        // The shutdown sends the FIN with the last segment (FINWithLastSegmentTests); no linger.
        #expect(s.kernel.calls.suffix(3) == ["send-before-fin 9100 38/38", "shutdown 9100 WR", "close 9100"])
        #expect(s.kernel.count("epoll del") == 0)
        #expect(s.kernel.count("peek") == 0, "the poller knows from its reads")
    }

    @Test func theDefaultModeStillLingersOnADrainedSocket() {
        let (s, ch, _) = Self.servedRequest()
        s.kernel.script(sends: [.all])
        s.event {
            ch.write(Array("bye".utf8))
            ch.closeAfterFlush()
        }
        #expect(s.event { ch.phase } == .lingering)
        #expect(s.kernel.count("shutdown 9100 WR") == 1)
    }

    @Test func aFullReadLeavesInputUnknownSoTheChannelLingers() {
        // 64 bytes fill the read buffer: more may wait in the socket, and the owner stops
        // reading before a read says whether it does.
        let (s, ch, d) = Self.servedRequest(String(repeating: "x", count: 64), onRead: { $0.pauseReading(.owner) })
        #expect(s.event { d.received.count } == 64)
        #expect(s.kernel.count("read") == 1)
        s.kernel.script(sends: [.all])
        s.event {
            ch.write(Array("bye".utf8))
            ch.closeAfterFlush(.lingerIfInputPending)
        }
        #expect(s.event { ch.phase } == .lingering)
        #expect(s.kernel.count("shutdown 9100 WR") == 1)
    }

    @Test func readinessReportedWhilePausedCountsAsUnreadInput() {
        let (s, ch, _) = Self.servedRequest()
        s.event { ch.pauseReading(.pipelineFull) }
        // The client sent more while reads were paused: epoll said so, nothing was read.
        s.event { ch.pollerEvent(readable: true, writable: false, hangup: false) }
        #expect(s.kernel.count("read") == 1)
        s.kernel.script(sends: [.all])
        s.event {
            ch.write(Array("bye".utf8))
            ch.closeAfterFlush(.lingerIfInputPending)
        }
        #expect(s.event { ch.phase } == .lingering)
    }

    @Test func anEventStillToComeInTheBatchCountsAsUnreadInput() {
        let (s, ch, _) = Self.servedRequest()
        let other = RecordingDelegate()
        let first = s.event { () -> SocketChannel in
            let a = SocketChannel(fd: 9_101, loop: s.loop)
            a.delegate = other
            a.start()
            return a
        }
        // While the batch's first socket is served, ch's readable event is still to come: its
        // owner closes it from there (its last answer was written already).
        other.onRead = { _ in ch.closeAfterFlush(.lingerIfInputPending) }
        s.kernel.script(reads: [.data(Array("x".utf8)), .data(Array("more".utf8))])
        s.kernel.scriptEpoll([[(fd: 9_101, flags: 1), (fd: 9_100, flags: 1)]])
        s.event { s.loop.pollOnce(timeoutMs: 0) }
        #expect(s.kernel.count("shutdown 9100 WR") == 1)
        #expect(s.event { ch.phase } == .lingering, "the bytes read after the shutdown are discarded")
        _ = first
    }

    @Test func aClosingChannelWhosePeerEndedClosesWithoutLingering() {
        let (s, ch, d) = Self.servedRequest()
        s.kernel.script(reads: [.eof])
        s.event { ch.pollerEvent(readable: true, writable: false, hangup: true) }
        #expect(s.event { d.eofs } == 1)
        s.kernel.script(sends: [.all])
        s.event {
            ch.write(Array("bye".utf8))
            ch.closeAfterFlush()  // even the default mode: the EOF was read
        }
        #expect(s.event { ch.isClosed })
        #expect(s.kernel.count("shutdown") == 0)
    }

    @Test func withSourcesAPeekDecides() {
        let s = ScriptedLoop(.socketSources)
        let (mine, peer) = realSocketPair()
        defer { close(peer) }
        s.kernel.ownsRealFD(mine)
        let (mine2, peer2) = realSocketPair()
        defer { close(peer2) }
        s.kernel.ownsRealFD(mine2)
        let (quiet, busy): (SocketChannel, SocketChannel) = s.event {
            let a = SocketChannel(fd: mine, loop: s.loop), b = SocketChannel(fd: mine2, loop: s.loop)
            a.start()
            b.start()
            return (a, b)
        }
        // Nothing waiting (EAGAIN): closed at once.
        s.kernel.script(sends: [.all])
        s.event {
            quiet.write(Array("bye".utf8))
            quiet.closeAfterFlush(.lingerIfInputPending)
        }
        #expect(s.eventually { quiet.isClosed })
        #expect(s.kernel.count("peek \(mine)") == 1)
        // Closed, not lingering: the shutdown only sends the FIN with the last segment.
        #expect(s.kernel.count("shutdown \(mine) WR") == 1)
        // A byte waiting (the peek sees 1): lingers.
        s.kernel.script(sends: [.all])
        s.kernel.script(peeks: [1])
        s.event {
            busy.write(Array("bye".utf8))
            busy.closeAfterFlush(.lingerIfInputPending)
        }
        #expect(s.event { busy.phase } == .lingering)
        #expect(s.kernel.count("shutdown \(mine2) WR") == 1)
        s.event { busy.close() }
    }
}
