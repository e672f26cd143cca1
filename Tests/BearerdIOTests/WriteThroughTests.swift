// Large writes go to the socket at once behind the queued output (one copy of a relayed body
// byte fewer), in order, with what the kernel does not take queued.

import Testing
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

@Suite("SocketChannel write-through of large chunks")
struct WriteThroughTests {
    static let big = (0..<(SocketChannel.writeThroughMinimum + 1000)).map { UInt8(truncatingIfNeeded: $0 &* 7) }

    @Test func aLargeChunkIsWrittenDuringTheCallBehindTheQueuedHead() {
        let (s, ch, _) = SocketChannelShellTests.polled()
        let head = Array("HTTP/1.1 200 OK\r\n\r\n".utf8)
        s.kernel.script(sends: [.all, .all])
        let writtenInside: [UInt8] = s.event {
            ch.write(head)
            Self.big.withUnsafeBytes { ch.write($0) }
            return s.kernel.written  // before the end of the event
        }
        let inOrder = writtenInside == head + Self.big  // a Bool: a failure prints no 17 KB array
        #expect(inOrder)
        #expect(s.event { ch.pendingOutputBytes } == 0)
        // The scripted kernel has no gathered send: the head alone, then the chunk.
        #expect(s.kernel.calls.filter { $0.hasPrefix("send") } == [
            "send 9000 \(head.count)/\(head.count)", "send 9000 \(Self.big.count)/\(Self.big.count)",
        ])
    }

    @Test func smallChunksAreStillCoalescedUntilTheEndOfTheEvent() {
        let (s, ch, _) = SocketChannelShellTests.polled()
        s.kernel.script(sends: [.all])
        let inside: Int = s.event {
            ch.write(Array("abc".utf8))
            ch.write(Array("def".utf8))
            return s.kernel.count("send")
        }
        #expect(inside == 0)
        #expect(s.kernel.calls.filter { $0.hasPrefix("send") } == ["send 9000 6/6"])
    }

    @Test func whatTheKernelDoesNotTakeIsQueuedAndFollowsInOrder() {
        let (s, ch, d) = SocketChannelShellTests.polled()
        s.kernel.script(sends: [.upTo(100), .again])
        s.event { Self.big.withUnsafeBytes { ch.write($0) } }
        let firstPart = s.kernel.written == Array(Self.big[0..<100])
        #expect(firstPart)
        #expect(s.event { ch.writeInterest } == .awaitingWritable)
        #expect(s.event { ch.pendingOutputBytes } == Self.big.count - 100)
        // Waiting for writability: a further large chunk only queues, behind the rest.
        let tail = Array(repeating: UInt8(0x5a), count: SocketChannel.writeThroughMinimum)
        s.event { tail.withUnsafeBytes { ch.write($0) } }
        #expect(s.kernel.count("send") == 2)
        s.kernel.script(sends: [.all])
        s.event { ch.pollerEvent(readable: false, writable: true, hangup: false) }
        let all = s.kernel.written == Self.big + tail
        #expect(all)
        #expect(s.event { ch.pendingOutputBytes } == 0)
        #expect(d.errors.isEmpty)
    }

    @Test func aWriteErrorDuringTheCallFailsTheChannelOnceAtTheEndOfTheEvent() {
        let (s, ch, d) = SocketChannelShellTests.polled()
        s.kernel.script(sends: [.error(ECONNRESET), .error(EPIPE)])
        let errorsInside: Int = s.event {
            Self.big.withUnsafeBytes { ch.write($0) }
            return d.errors.count  // not re-entered from inside the owner's write
        }
        #expect(errorsInside == 0)
        #expect(s.event { d.errors.count } == 1)
        #expect(s.event { d.closedCalls } == 1)
        #expect(s.kernel.closed == [SocketChannelShellTests.fakeFD])
    }
}
