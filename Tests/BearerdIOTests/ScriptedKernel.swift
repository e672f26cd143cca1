// A kernel played by the test (swift-nio's Tests/NIOPosixTests/SyscallAbstractionLayer.swift is
// the model): an `EventLoop` built with `ScriptedKernel.syscalls` sends its sockets' reads,
// writes, accepts, closes and epoll calls here, and each answer comes from a script.

import Dispatch
@testable import BearerdIO
#if canImport(Glibc)
import Glibc
#endif

/// Scripted answers for the system calls of one loop's sockets, and a record of the calls made.
/// Shared by the test thread and the loop's queue: every field is guarded by `lock`.
final class ScriptedKernel: @unchecked Sendable {  // @unchecked: all state under `lock`
    enum ReadStep: Equatable {
        case data([UInt8])
        case again
        case eof
        case error(Int32)
    }

    enum SendStep: Equatable {
        /// Takes at most this many bytes (a partial write when fewer than offered).
        case upTo(Int)
        case all
        case again
        case error(Int32)
    }

    enum AcceptStep: Equatable {
        /// A new connection with this fd (127.0.0.1 peer).
        case connection(Int32)
        /// Let the real kernel accept (for a real listening socket).
        case real
        case again
        case error(Int32)
    }

    private let lock = Lock()
    private var _reads: [ReadStep] = []
    private var _sends: [SendStep] = []
    private var _accepts: [AcceptStep] = []
    /// What the scripted peeks answer, one per call (then EAGAIN: nothing waiting).
    private var _peeks: [Int] = []
    private var _written: [UInt8] = []
    private var _calls: [String] = []
    private var _closed: [Int32] = []
    /// Batches the scripted `epoll_wait` returns, one per call: (fd, flags: 1 in, 2 out, 4 hang-up).
    private var _epollBatches: [[(fd: Int32, flags: UInt32)]] = []
    /// fds the scripted close also closes for real (socketpairs watched by Dispatch sources).
    private var realFDs: Set<Int32> = []

    /// Unscripted reads, sends and accepts answer EAGAIN.
    func script(reads: [ReadStep] = [], sends: [SendStep] = [], accepts: [AcceptStep] = []) {
        lock.withLock {
            _reads += reads
            _sends += sends
            _accepts += accepts
        }
    }

    func script(peeks: [Int]) { lock.withLock { _peeks += peeks } }

    func scriptEpoll(_ batches: [[(fd: Int32, flags: UInt32)]]) {
        lock.withLock { _epollBatches += batches }
    }

    func ownsRealFD(_ fd: Int32) { lock.withLock { _ = realFDs.insert(fd) } }

    var written: [UInt8] { lock.withLock { _written } }
    var calls: [String] { lock.withLock { _calls } }
    var closed: [Int32] { lock.withLock { _closed } }
    func count(_ prefix: String) -> Int { calls.filter { $0.hasPrefix(prefix) }.count }
    var unusedSteps: Int { lock.withLock { _reads.count + _sends.count + _accepts.count } }

    private func record(_ call: String) { lock.withLock { _calls.append(call) } }

    private func nextRead() -> ReadStep { lock.withLock { _reads.isEmpty ? .again : _reads.removeFirst() } }
    private func nextSend() -> SendStep { lock.withLock { _sends.isEmpty ? .again : _sends.removeFirst() } }
    private func nextAccept() -> AcceptStep { lock.withLock { _accepts.isEmpty ? .again : _accepts.removeFirst() } }

    lazy var syscalls: Syscalls = Syscalls(
        read: { fd, buffer in
            switch self.nextRead() {
            case .data(let bytes):
                let n = min(bytes.count, buffer.count)
                buffer.copyBytes(from: bytes.prefix(n))
                self.record("read \(fd) \(n)")
                return n
            case .again:
                self.record("read \(fd) EAGAIN")
                return -Int(EAGAIN)
            case .eof:
                self.record("read \(fd) EOF")
                return 0
            case .error(let e):
                self.record("read \(fd) errno \(e)")
                return -Int(e)
            }
        },
        send: { fd, buffer in self.send(fd, buffer, label: "send") },
        accept: { fd, address, length in
            switch self.nextAccept() {
            case .connection(let cfd):
                self.record("accept \(fd) -> \(cfd)")
                let peer = SocketAddress.numeric("127.0.0.1", port: 40000)!  // a literal address
                withUnsafeBytes(of: peer.storage) { src in
                    UnsafeMutableRawPointer(address).copyMemory(from: src.baseAddress!, byteCount: Int(peer.length))
                }
                length.pointee = peer.length
                return Int(cfd)
            case .real:
                let n = Syscalls.System.accept(fd, address, length)
                self.record("accept \(fd) real -> \(n)")
                if n >= 0 { self.ownsRealFD(Int32(n)) }
                return n
            case .again:
                self.record("accept \(fd) EAGAIN")
                return -Int(EAGAIN)
            case .error(let e):
                self.record("accept \(fd) errno \(e)")
                return -Int(e)
            }
        },
        close: { fd in
            let real = self.lock.withLock { () -> Bool in
                self._closed.append(fd)
                return self.realFDs.remove(fd) != nil
            }
            self.record("close \(fd)")
            if real { _ = Glibc.close(fd) }
            return 0
        },
        shutdown: { fd, how in
            self.record("shutdown \(fd) \(how == Int32(SHUT_WR) ? "WR" : "\(how)")")
            return 0
        },
        setOption: { fd, level, name, value in
            self.record("setsockopt \(fd) \(level) \(name) \(value)")
            return 0
        },
        getOption: { fd, level, name in
            self.record("getsockopt \(fd) \(level) \(name)")
            return 0  // SO_ERROR: none
        },
        epollCreate: { Syscalls.System.epollCreate() },  // real: a Dispatch source watches it (it never fires)
        epollAdd: { _, fd in
            self.record("epoll add \(fd)")
            return 0
        },
        epollAddLevel: { _, fd in
            self.record("epoll add-level \(fd)")
            return 0
        },
        epollDelete: { _, fd in
            self.record("epoll del \(fd)")
            return 0
        },
        epollWait: { _, fds, flags, _ in
            let batch = self.lock.withLock { () -> [(fd: Int32, flags: UInt32)] in
                self._epollBatches.isEmpty ? [] : self._epollBatches.removeFirst()
            }
            let n = min(batch.count, fds.count, flags.count)
            for i in 0..<n {
                fds[i] = batch[i].fd
                flags[i] = batch[i].flags
            }
            return n
        },
        peek: { fd in
            self.record("peek \(fd)")
            return self.lock.withLock { self._peeks.isEmpty ? -Int(EAGAIN) : self._peeks.removeFirst() }
        },
        sendBeforeFIN: { fd, buffer in self.send(fd, buffer, label: "send-before-fin") }
    )

    /// A scripted send, recorded as `label fd taken/offered`.
    private func send(_ fd: Int32, _ buffer: UnsafeRawBufferPointer, label: String) -> Int {
        let taken: Int
        switch nextSend() {
        case .upTo(let n): taken = min(n, buffer.count)
        case .all: taken = buffer.count
        case .again:
            record("\(label) \(fd) EAGAIN")
            return -Int(EAGAIN)
        case .error(let e):
            record("\(label) \(fd) errno \(e)")
            return -Int(e)
        }
        lock.withLock { _written += buffer.prefix(taken) }
        record("\(label) \(fd) \(taken)/\(buffer.count)")
        return taken
    }
}

/// Records what a channel told its owner. Touched on the channel's loop; read by the test after
/// a `sync` hop, so every access is ordered by the queue.
final class RecordingDelegate: ChannelDelegate, @unchecked Sendable {  // @unchecked: see above
    var received: [UInt8] = []
    var eofs = 0
    var errors: [String] = []
    var writableCalls = 0
    var closedCalls = 0
    var actives = 0

    /// Called on each read, after `received` grew (tests that look around mid-event).
    var onRead: ((SocketChannel) -> Void)?
    /// Called on the peer's EOF, after `eofs` grew.
    var onEOF: ((SocketChannel) -> Void)?

    func channelRead(_ channel: SocketChannel, _ bytes: UnsafeRawBufferPointer) {
        received += bytes
        onRead?(channel)
    }
    func channelEOF(_ channel: SocketChannel) {
        eofs += 1
        onEOF?(channel)
    }
    func channelError(_ channel: SocketChannel, _ error: ChannelError) { errors.append("\(error)") }
    func channelWritable(_ channel: SocketChannel) { writableCalls += 1 }
    func channelActive(_ channel: SocketChannel) { actives += 1 }
    func channelClosed(_ channel: SocketChannel) { closedCalls += 1 }
}

/// A loop on a scripted kernel, and a way to run a step on it as one event.
struct ScriptedLoop {
    let kernel = ScriptedKernel()
    let loop: EventLoop

    init(_ mode: EventLoop.IOMode, readBufferSize: Int = 64) {
        loop = EventLoop(index: 0, readBufferSize: readBufferSize, ioMode: mode, syscalls: kernel.syscalls)
    }

    /// Runs `body` on the loop as one event (output flushed and deferred work run at its end)
    /// and waits for it. (Tests may wait on a loop; production code never does.)
    func event<R>(_ body: () -> R) -> R {
        loop.queue.sync {
            var r: R?
            loop.runEvent { r = body() }
            return r!  // runEvent runs `body` exactly once before returning
        }
    }

    /// Waits (at most 2 s) until `condition`, checked on the loop, holds.
    func eventually(_ condition: () -> Bool) -> Bool {
        for _ in 0..<400 {
            if loop.queue.sync(execute: condition) { return true }
            usleep(5_000)
        }
        return false
    }
}
