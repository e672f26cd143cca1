import Testing
import Dispatch
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

/// An `EventLoop` may be released on any thread (a blocking token request's private loop, a
/// group torn down by its owner) while its tick timer or poller source is firing on the loop's
/// queue. The handlers must then find no loop, never trap on one being destroyed.
@Suite("event loop lifetime")
struct LoopLifetimeTests {
    @Test func loopsReleasedOffTheirQueueWhileTheirSourcesFire() {
        for mode in [EventLoop.IOMode.loopPoller, .socketSources] {
            for _ in 0..<4 {
                var loops: [EventLoop] = (0..<300).map { EventLoop(index: $0, readBufferSize: 4096, ioMode: mode) }
                // Ticks come every 100 ms (20 ms leeway): release the loops across that moment,
                // one by one, from this thread.
                usleep(95_000)
                while !loops.isEmpty {
                    loops.removeLast()
                    usleep(50)
                }
            }
        }
        // Reaching here is the assertion: a handler that read a destroyed loop traps the process.
        #expect(Bool(true))
    }

    /// The other way round: the last reference is dropped inside the loop's own poller event (an
    /// object the loop serves held it). The loop is destroyed on its queue once the event is over,
    /// without waiting for itself: its stored tables are released (a `deinit` that waited for
    /// its own handler would never get there).
    @Test func aLoopReleasedInsideItsOwnPollerEventIsDestroyed() throws {
        /// Registered with the loop; released only when the loop's storage is.
        final class Sentinel: LoopTimeoutable, @unchecked Sendable {  // @unchecked: flag set once, read after
            let gone: DispatchSemaphore
            init(_ gone: DispatchSemaphore) { self.gone = gone }
            var deadline: UInt64 { 0 }
            func deadlineExpired(now: UInt64) {}
            deinit { gone.signal() }
        }
        final class LastOwner: LoopPollable, @unchecked Sendable {  // @unchecked: used on the loop only
            var loop: EventLoop?
            let fd: Int32
            init(loop: EventLoop, fd: Int32) { self.loop = loop; self.fd = fd }
            func pollerEvent(readable: Bool, writable: Bool, hangup: Bool) {
                loop?.unregisterPollable(fd: fd)
                loop = nil
            }
        }
        // A pipe's read end: no event until the write below (a socket would be writable at once).
        var fds: [Int32] = [0, 0]
        #expect(pipe(&fds) == 0)
        defer { close(fds[0]); close(fds[1]) }
        weak var released: EventLoop?
        let gone = DispatchSemaphore(value: 0)
        do {
            let loop = EventLoop(index: 0, readBufferSize: 4096, ioMode: .loopPoller)
            released = loop
            let owner = LastOwner(loop: loop, fd: fds[0])
            let registered = DispatchSemaphore(value: 0)
            let sentinel = Sentinel(gone)
            loop.execute {
                loop.registerPollable(fd: fds[0], owner)
                loop.register(sentinel)
                registered.signal()
            }
            registered.wait()
        }
        // Only the owner (kept by the loop's table) holds the loop now.
        #expect(write(fds[1], "x", 1) == 1)
        #expect(gone.wait(timeout: .now() + 5) == .success, "the loop's deinit finished and released its tables")
        #expect(released == nil)
    }
}

/// `SocketChannel` keeps some state with `@exclusivity(unchecked)`, sound only for trivially
/// copyable values: this pins the types that are not obviously plain.
@Suite("unchecked channel state is plain data")
struct ChannelStateLayoutTests {
    @Test func uncheckedStateTypesAreTriviallyCopyable() {
        #expect(_isPOD(SocketChannel.Phase.self))
        #expect(_isPOD(SocketChannel.WriteInterest.self))
        #expect(_isPOD(ReadPauseReasons.self))
    }
}
