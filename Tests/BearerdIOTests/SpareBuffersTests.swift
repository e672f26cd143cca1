// A closed connection's output buffer goes to its loop's next connection, emptied; the kept
// buffers stay bounded in number and size.

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
        s.event { second.write(Array("two".utf8)) }
        #expect(s.event { s.loop.spareBuffers.count } == 0)
        #expect(Array(s.kernel.written[before...]) == Array("two".utf8))
    }
}
