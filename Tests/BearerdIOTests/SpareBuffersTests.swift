// A channel's output buffer goes back to its loop once written or closed, emptied, and serves
// the next write; the kept buffers stay bounded in number and size.

import Testing
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

@Suite("Spare buffers of a loop")
struct SpareBuffersTests {
    @Test func aBufferGivenBackIsHandedOutEmptyWithItsStorage() {
        var spares = SpareBuffers()
        var used = Array(repeating: UInt8(0x41), count: 3000)
        let storage = used.withUnsafeBufferPointer { $0.baseAddress }
        spares.giveBack(&used)
        #expect(used.isEmpty && used.capacity == 0)  // the caller keeps nothing
        #expect(spares.count == 1)
        let next = spares.take()
        #expect(next.isEmpty)  // no byte of the old connection is readable
        #expect(next.capacity >= 3000)
        #expect(next.withUnsafeBufferPointer { $0.baseAddress } == storage)
        #expect(spares.count == 0)
    }

    @Test func withNothingKeptANewBufferHasRoomForAHead() {
        var spares = SpareBuffers()
        let fresh = spares.take()
        #expect(fresh.isEmpty)
        #expect(fresh.capacity >= SpareBuffers.initialCapacity)
    }

    @Test func tooSmallTooLargeAndTooManyAreFreed() {
        var spares = SpareBuffers()
        var small = [UInt8](repeating: 1, count: 10)
        spares.giveBack(&small)
        var large = [UInt8](repeating: 1, count: SpareBuffers.maximumCapacity + 1)
        spares.giveBack(&large)
        #expect(spares.count == 0)
        for _ in 0..<(SpareBuffers.maximumKept + 5) {
            var b = [UInt8](repeating: 2, count: 2048)
            spares.giveBack(&b)
        }
        #expect(spares.count == SpareBuffers.maximumKept)
    }

    @Test func aBufferStillSharedIsNeverHandedOutWithItsBytes() {
        var spares = SpareBuffers()
        var used = Array(repeating: UInt8(0x42), count: 2048)
        let copy = used  // someone else still holds the storage
        spares.giveBack(&used)
        var next = spares.take()
        #expect(next.isEmpty)
        next.append(0x43)
        #expect(copy == Array(repeating: UInt8(0x42), count: 2048))  // untouched
    }

    @Test func aClosedChannelsOutputBufferServesTheNextChannel() {
        let (s, ch, _) = SocketChannelShellTests.polled()
        s.kernel.script(sends: [.again])  // the socket takes nothing: the answer stays queued
        s.event { ch.write(Array("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst".utf8)) }
        #expect(s.event { ch.pendingOutputBytes } > 0)
        #expect(s.event { s.loop.spareBuffers.count } == 0)
        s.event { ch.close() }
        #expect(s.event { s.loop.spareBuffers.count } == 1)
        #expect(s.event { ch.pendingOutputBytes } == 0)
        // A write after the close is dropped, and the buffer stays with the loop.
        s.event { ch.write(Array("late".utf8)) }
        #expect(s.event { s.loop.spareBuffers.count } == 1)

        // The next connection's first write takes it and sends exactly its own bytes.
        let second: SocketChannel = s.event {
            let c = SocketChannel(fd: SocketChannelShellTests.fakeFD + 1, loop: s.loop)
            c.delegate = RecordingDelegate()
            c.start()
            return c
        }
        s.kernel.script(sends: [.all])
        let before = s.kernel.written.count
        let takenInside: Int = s.event {
            second.write(Array("two".utf8))
            return s.loop.spareBuffers.count  // taken for the queued bytes
        }
        #expect(takenInside == 0)
        #expect(Array(s.kernel.written[before...]) == Array("two".utf8))
        #expect(s.event { s.loop.spareBuffers.count } == 1)  // written: back with the loop
    }

    /// A keep-alive channel between responses holds no output buffer: it goes back to the loop
    /// once written (10,000 idle connections must not hold 10,000 buffers), and a writer that
    /// hands its buffer over (`write(taking:)`) gets one with room back, not an empty array.
    @Test func anIdleChannelHoldsNoOutputBuffer() {
        let (s, ch, _) = SocketChannelShellTests.polled()
        s.kernel.script(sends: [.all, .all, .all])
        for i in 0..<3 {
            let pending: Int = s.event {
                ch.write(Array("response \(i)".utf8))
                return ch.pendingOutputBytes
            }
            #expect(pending > 0)
            #expect(s.event { ch.pendingOutputBytes } == 0)
            #expect(s.event { s.loop.spareBuffers.count } == 1)  // the same one, each time
        }
        var mine = Array("handed over".utf8)
        s.kernel.script(sends: [.upTo(3), .again])
        let back: Int = s.event {
            ch.write(taking: &mine)
            return mine.capacity
        }
        #expect(back >= SpareBuffers.initialCapacity)
        #expect(mine.isEmpty)
        // Partly written: the rest keeps the buffer until the socket takes it.
        #expect(s.event { ch.pendingOutputBytes } == "handed over".utf8.count - 3)
        #expect(s.event { s.loop.spareBuffers.count } == 0)
        s.kernel.script(sends: [.all])
        s.event { ch.pollerEvent(readable: false, writable: true, hangup: false) }
        #expect(s.event { ch.pendingOutputBytes } == 0)
        // The caller's small array, written, is not worth keeping (the caller kept the spare).
        #expect(s.event { s.loop.spareBuffers.count } == 0)
        let all = String(decoding: s.kernel.written, as: UTF8.self)
        #expect(all == "response 0response 1response 2handed over")
    }
}
