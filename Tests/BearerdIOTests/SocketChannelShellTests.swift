// SocketChannel against a scripted kernel: partial writes, EAGAIN both ways, ECONNRESET, EOF,
// backpressure crossings, pause reasons, and source suspension balanced through close.

import Testing
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

/// Linux's `SOCK_STREAM` and `SOCK_NONBLOCK` (<bits/socket_type.h>), spelled as numbers: a
/// clean parallel build of this test module sometimes failed to find the imported Glibc enum
/// ("cannot find 'SOCK_STREAM' in scope" in the module-emitting job), a second build passed.
let linuxSockStream: Int32 = 1
let linuxSockNonblock: Int32 = 0o4000

/// A connected unix socketpair: the channel's end is real so Dispatch sources can watch it,
/// while its reads and writes are answered by the script.
func realSocketPair() -> (Int32, Int32) {
    var fds: [Int32] = [-1, -1]
    let rc = socketpair(AF_UNIX, linuxSockStream | linuxSockNonblock, 0, &fds)
    precondition(rc == 0, "socketpair")  // the test cannot run without one
    return (fds[0], fds[1])
}

@Suite("SocketChannel on a scripted kernel")
struct SocketChannelShellTests {
    static let fakeFD: Int32 = 9_000  // poller mode: never reaches the real kernel

    /// A started channel on a poller loop over a fake fd.
    static func polled(readBufferSize: Int = 64) -> (ScriptedLoop, SocketChannel, RecordingDelegate) {
        let s = ScriptedLoop(.loopPoller, readBufferSize: readBufferSize)
        let d = RecordingDelegate()
        let ch = s.event { () -> SocketChannel in
            let ch = SocketChannel(fd: fakeFD, loop: s.loop)
            ch.delegate = d
            ch.start()
            return ch
        }
        return (s, ch, d)
    }

    // MARK: writes

    @Test func partialWritesContinueWhereTheKernelStopped() {
        let (s, ch, _) = Self.polled()
        s.kernel.script(sends: [.upTo(3), .upTo(4), .again])
        let text = Array("hello, world".utf8)
        s.event { ch.write(text) }
        #expect(s.kernel.written == Array("hello, ".utf8))
        #expect(s.event { ch.writeInterest } == .awaitingWritable)
        #expect(s.event { ch.pendingOutputBytes } == 5)
        // A write while waiting for writability only queues (no send until the kernel says so).
        s.event { ch.write(Array("!".utf8)) }
        #expect(s.kernel.count("send") == 3)
        s.kernel.script(sends: [.upTo(2), .all])
        s.event { ch.pollerEvent(readable: false, writable: true, hangup: false) }
        #expect(s.kernel.written == Array("hello, world!".utf8))
        #expect(s.event { ch.writeInterest } == WriteInterestNone)
        #expect(s.event { ch.pendingOutputBytes } == 0)
        #expect(s.kernel.calls.filter { $0.hasPrefix("send") } == [
            "send 9000 3/12", "send 9000 4/9", "send 9000 EAGAIN", "send 9000 2/6", "send 9000 4/4",
        ])
    }

    @Test func aWriteErrorFailsAndClosesOnce() {
        let (s, ch, d) = Self.polled()
        s.kernel.script(sends: [.error(EPIPE)])
        s.event { ch.write(Array("x".utf8)) }
        #expect(s.event { d.errors.count } == 1)
        #expect(s.event { d.closedCalls } == 1)
        #expect(s.kernel.closed == [Self.fakeFD])
        #expect(s.kernel.count("epoll del") == 0, "close(2) takes the socket out of the epoll set")
        // Anything after close is ignored: no second close, no send.
        s.event { ch.write(Array("y".utf8)); ch.close(); ch.closeAfterFlush() }
        #expect(s.kernel.closed == [Self.fakeFD])
        #expect(s.kernel.count("send") == 1)
    }

    // MARK: what the loop knows of a pooled socket

    /// In poller mode a socket active less than a second ago is judged without `MSG_PEEK`: an
    /// event for it still to come in the batch being served counts as unread input, and so does
    /// a hang-up; a socket quiet for longer is peeked.
    @Test func pendingEventsInTheBatchCountAsUnreadInputWithoutAPeek() {
        let s = ScriptedLoop(.loopPoller)
        let first = RecordingDelegate(), second = RecordingDelegate()
        let (a, b): (SocketChannel, SocketChannel) = s.event {
            let a = SocketChannel(fd: 9_001, loop: s.loop), b = SocketChannel(fd: 9_002, loop: s.loop)
            a.delegate = first
            b.delegate = second
            a.start()
            b.start()
            return (a, b)
        }
        // While the batch's first event (a readable) is served, b's event is still to come.
        var seen: [Bool] = []
        first.onRead = { _ in
            seen.append(b.hasUnreadInput(recentlyActive: true))
            seen.append(a.hasUnreadInput(recentlyActive: true))
        }
        s.kernel.script(reads: [.data(Array("x".utf8)), .data(Array("y".utf8))])  // short reads: one each
        s.kernel.scriptEpoll([[(fd: 9_001, flags: 1), (fd: 9_002, flags: 1)]])
        s.event { s.loop.pollOnce(timeoutMs: 0) }
        #expect(seen == [true, false])
        #expect(s.event { second.received } == Array("y".utf8))
        // After the batch: nothing known, no peek for a recently active socket; a peek otherwise.
        #expect(s.event { b.hasUnreadInput(recentlyActive: true) } == false)
        #expect(s.kernel.count("peek") == 0)
        #expect(s.event { b.hasUnreadInput(recentlyActive: false) } == false)
        #expect(s.kernel.count("peek") == 1)
        // A hang-up reported for the socket: unread input (its EOF), whatever its age.
        s.kernel.script(reads: [.data(Array("z".utf8)), .eof])
        s.event { b.pollerEvent(readable: false, writable: false, hangup: true) }
        #expect(s.event { b.hasUnreadInput(recentlyActive: true) })
    }

    /// Only an input event (readable or hang-up) still to come in the current batch counts; a
    /// writable-only one does not, nor an event of an earlier batch or one already delivered.
    @Test func onlyInputEventsStillToComeInThisBatchCount() {
        let s = ScriptedLoop(.loopPoller)
        let first = RecordingDelegate(), second = RecordingDelegate(), third = RecordingDelegate()
        let (a, b, c): (SocketChannel, SocketChannel, SocketChannel) = s.event {
            let a = SocketChannel(fd: 31, loop: s.loop), b = SocketChannel(fd: 32, loop: s.loop), c = SocketChannel(fd: 2_100, loop: s.loop)
            a.delegate = first
            b.delegate = second
            c.delegate = third
            a.start()
            b.start()
            c.start()
            return (a, b, c)
        }
        var seen: [Bool] = []
        first.onRead = { _ in
            seen = [a.hasUnreadInput(recentlyActive: true), b.hasUnreadInput(recentlyActive: true), c.hasUnreadInput(recentlyActive: true)]
        }
        s.kernel.script(reads: [.data(Array("x".utf8)), .data(Array("z".utf8))])
        // a readable, then b writable only, then c (beyond the table's first size) readable.
        s.kernel.scriptEpoll([[(fd: 31, flags: 1), (fd: 32, flags: 2), (fd: 2_100, flags: 1)]])
        s.event { s.loop.pollOnce(timeoutMs: 0) }
        #expect(seen == [false, false, true])
        // The next batch: the marks of the last one no longer count.
        var later: [Bool] = []
        second.onRead = { _ in later = [c.hasUnreadInput(recentlyActive: true), a.hasUnreadInput(recentlyActive: true)] }
        s.kernel.script(reads: [.data(Array("y".utf8))])
        s.kernel.scriptEpoll([[(fd: 32, flags: 1)]])
        s.event { s.loop.pollOnce(timeoutMs: 0) }
        #expect(later == [false, false])
        #expect(s.kernel.count("peek") == 0)
    }

    // MARK: reads

    @Test func readsDrainUntilEAGAINAndAShortReadEndsTheDrain() {
        let (s, ch, d) = Self.polled(readBufferSize: 4)
        // Full buffers keep the drain going; EAGAIN stops it.
        s.kernel.script(reads: [.data(Array("abcd".utf8)), .data(Array("efgh".utf8)), .again])
        s.event { ch.pollerEvent(readable: true, writable: false, hangup: false) }
        #expect(s.event { d.received } == Array("abcdefgh".utf8))
        #expect(s.kernel.count("read") == 3)
        // A short read means the socket is drained: no further read in this event.
        s.kernel.script(reads: [.data(Array("ij".utf8))])
        s.event { ch.pollerEvent(readable: true, writable: false, hangup: false) }
        #expect(s.event { d.received } == Array("abcdefghij".utf8))
        #expect(s.kernel.count("read") == 4)
        // After the peer hung up a short read no longer ends the drain: read on to the EOF.
        s.kernel.script(reads: [.data(Array("kl".utf8)), .eof])
        s.event { ch.pollerEvent(readable: true, writable: false, hangup: true) }
        #expect(s.event { d.received } == Array("abcdefghijkl".utf8))
        #expect(s.event { d.eofs } == 1)
        #expect(s.kernel.count("read") == 6)
    }

    @Test func eofIsReportedAndTheChannelStaysOpen() {
        let (s, ch, d) = Self.polled()
        s.kernel.script(reads: [.data(Array("last".utf8)), .eof])
        s.event { ch.pollerEvent(readable: true, writable: false, hangup: true) }
        #expect(s.event { d.received } == Array("last".utf8))
        #expect(s.event { d.eofs } == 1)
        #expect(s.event { d.closedCalls } == 0)
        #expect(!s.event { ch.isClosed })
    }

    @Test func connectionResetFailsClosesAndReleasesTheFDOnce() {
        let (s, ch, d) = Self.polled()
        s.kernel.script(reads: [.error(ECONNRESET)])
        s.event { ch.pollerEvent(readable: true, writable: false, hangup: true) }
        #expect(s.event { d.errors } == ["read: \(String(cString: strerror(ECONNRESET)))"])
        #expect(s.event { d.closedCalls } == 1)
        #expect(s.kernel.closed == [Self.fakeFD])
        #expect(s.kernel.calls.last == "close 9000")
        #expect(s.kernel.count("epoll del") == 0, "no EPOLL_CTL_DEL: close(2) takes an unshared socket out of the epoll set")
        #expect(s.event { ch.isClosed })
    }

    // MARK: backpressure

    @Test func channelWritableOncePerCrossingBackBelowTheLowWaterMark() {
        let (s, ch, d) = Self.polled()
        s.event { ch.highWaterMark = 10; ch.lowWaterMark = 4 }
        // Over the high-water mark: the owner is told to stop producing.
        s.kernel.script(sends: [.again])
        s.event { ch.write(Array(repeating: 1, count: 12)) }
        #expect(s.event { ch.isOverHighWater })
        // Draining to 7 (above the low-water mark): no call yet.
        s.kernel.script(sends: [.upTo(5), .again])
        s.event { ch.pollerEvent(readable: false, writable: true, hangup: false) }
        #expect(s.event { d.writableCalls } == 0)
        // Down to 4 (at the low-water mark): exactly one call.
        s.kernel.script(sends: [.upTo(3), .again])
        s.event { ch.pollerEvent(readable: false, writable: true, hangup: false) }
        #expect(s.event { d.writableCalls } == 1)
        s.kernel.script(sends: [.all])
        s.event { ch.pollerEvent(readable: false, writable: true, hangup: false) }
        #expect(s.event { d.writableCalls } == 1, "no second call without a second crossing")
        // Below the high-water mark all along: never called.
        s.kernel.script(sends: [.again, .all])
        s.event { ch.write(Array(repeating: 2, count: 6)) }
        s.event { ch.pollerEvent(readable: false, writable: true, hangup: false) }
        #expect(s.event { d.writableCalls } == 1)
        // A second crossing, drained in one write: one more call.
        s.kernel.script(sends: [.again, .all])
        s.event { ch.write(Array(repeating: 3, count: 30)) }
        s.event { ch.pollerEvent(readable: false, writable: true, hangup: false) }
        #expect(s.event { d.writableCalls } == 2)
        #expect(s.kernel.written.count == 12 + 6 + 30)
    }

    // MARK: pause reasons

    @Test(arguments: [EventLoop.IOMode.loopPoller, .socketSources])
    func readsRunOnlyWhenEveryPauseReasonIsGone(mode: EventLoop.IOMode) {
        let s = ScriptedLoop(mode)
        let (mine, peer) = realSocketPair()
        defer { close(peer) }
        s.kernel.ownsRealFD(mine)
        let d = RecordingDelegate()
        let ch = s.event { () -> SocketChannel in
            let ch = SocketChannel(fd: mine, loop: s.loop)
            ch.delegate = d
            ch.start()
            return ch
        }
        if mode == .socketSources { #expect(s.event { ch.readSourceState } == .running) }
        s.event {
            ch.pauseReading(.peerBackpressure)
            ch.pauseReading(.pipelineFull)
            ch.pauseReading(.peerBackpressure)  // twice for one reason: still one reason
        }
        if mode == .socketSources { #expect(s.event { ch.readSourceState } == .suspended) }
        s.kernel.script(reads: [.data(Array("held".utf8))])
        s.event { ch.pollerEvent(readable: true, writable: false, hangup: false) }  // ignored while paused
        s.event { ch.resumeReading(.peerBackpressure) }
        #expect(s.event { ch.isReadPaused })
        if mode == .socketSources { #expect(s.event { ch.readSourceState } == .suspended) }
        #expect(s.kernel.count("read") == 0)
        s.event { ch.resumeReading(.pipelineFull) }
        #expect(!s.event { ch.isReadPaused })
        if mode == .socketSources {
            #expect(s.event { ch.readSourceState } == .running)
            // The source fires once the real socket is readable; the script answers the read.
            _ = "x".withCString { write(peer, $0, 1) }
        }
        #expect(s.eventually { d.received == Array("held".utf8) })
        s.event { ch.close() }
        #expect(s.eventually { s.kernel.closed == [mine] })
    }

    // MARK: sources: suspend/cancel balance

    @Test func closeWhilePausedAndWaitingForWritabilityResumesBothSourcesBeforeCancelling() {
        let s = ScriptedLoop(.socketSources)
        let (mine, peer) = realSocketPair()
        defer { close(peer) }
        s.kernel.ownsRealFD(mine)
        let d = RecordingDelegate()
        let ch = s.event { () -> SocketChannel in
            let ch = SocketChannel(fd: mine, loop: s.loop)
            ch.delegate = d
            ch.start()
            return ch
        }
        #expect(s.event { ch.writeSourceState } == .inactive, "armed only after EAGAIN")
        s.event { ch.pauseReading(.owner) }
        // Write source armed, then (writable again) suspended, then armed again: one level each time.
        s.kernel.script(sends: [.again, .all])
        s.event { ch.write(Array("a".utf8)) }
        #expect(s.eventually { s.kernel.written == Array("a".utf8) }, "the write source fired and the kernel took the rest")
        #expect(s.event { ch.writeSourceState } == .suspended)
        #expect(s.event { ch.writeInterest } == WriteInterestNone)
        s.kernel.script(sends: [.again])
        s.event { ch.write(Array("b".utf8)) }
        #expect(s.event { ch.writeSourceState } == .running)
        // Paused reads and armed writes: close must leave libdispatch nothing suspended.
        s.event { ch.close() }
        #expect(s.event { ch.readSourceState } == .cancelled)
        #expect(s.event { ch.writeSourceState } == .cancelled)
        #expect(s.eventually { s.kernel.closed == [mine] }, "the fd is closed once, after both cancel handlers")
        #expect(s.event { d.closedCalls } == 1)
    }

    @Test func aChannelClosedBeforeItStartedReleasesItsInactiveSources() {
        let s = ScriptedLoop(.socketSources)
        let (mine, peer) = realSocketPair()
        defer { close(peer) }
        s.kernel.ownsRealFD(mine)
        s.event {
            let ch = SocketChannel(fd: mine, loop: s.loop)
            ch.close()
            #expect(ch.readSourceState == .cancelled)
        }
        #expect(s.eventually { s.kernel.closed == [mine] })
    }

    @Test(arguments: [EventLoop.IOMode.loopPoller, .socketSources])
    func closeAfterFlushWritesHalfClosesThenClosesAtTheEOF(mode: EventLoop.IOMode) {
        let s = ScriptedLoop(mode)
        let (mine, peer) = realSocketPair()
        defer { close(peer) }
        s.kernel.ownsRealFD(mine)
        let d = RecordingDelegate()
        let ch = s.event { () -> SocketChannel in
            let ch = SocketChannel(fd: mine, loop: s.loop)
            ch.delegate = d
            ch.start()
            ch.pauseReading(.pipelineFull)
            return ch
        }
        s.kernel.script(sends: [.upTo(2), .again])
        s.event {
            ch.write(Array("bye!".utf8))
            ch.closeAfterFlush()
        }
        #expect(s.event { ch.phase } == .flushingBeforeClose(.linger))
        if mode == .loopPoller {
            s.kernel.script(sends: [.all])
            s.event { ch.pollerEvent(readable: false, writable: true, hangup: false) }
        } else {
            s.kernel.script(sends: [.all])
        }
        #expect(s.eventually { ch.phase == .lingering })
        #expect(s.kernel.written == Array("bye!".utf8))
        #expect(s.kernel.count("shutdown \(mine) WR") == 1)
        #expect(!s.event { ch.isReadPaused }, "lingering reads (and discards) whatever the pause")
        // Input while lingering is discarded; the EOF closes.
        s.kernel.script(reads: [.data(Array("ignored".utf8)), .eof])
        if mode == .loopPoller {
            s.event { ch.pollerEvent(readable: true, writable: false, hangup: true) }
        } else {
            _ = "x".withCString { write(peer, $0, 1) }
        }
        #expect(s.eventually { ch.isClosed })
        #expect(s.event { d.received }.isEmpty)
        #expect(s.event { d.eofs } == 0)
        #expect(s.eventually { s.kernel.closed == [mine] })
    }
}

/// `SocketChannel.WriteInterest.none`, named apart from `Optional.none` in `#expect`.
let WriteInterestNone = SocketChannel.WriteInterest.none
