import Dispatch
import CBearerdShim
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// Monotonic nanoseconds (CLOCK_MONOTONIC), the clock of every deadline in the shell.
@inline(__always)
public func monotonicNanos() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return UInt64(ts.tv_sec) &* 1_000_000_000 &+ UInt64(ts.tv_nsec)
}

extension Duration {
    /// Whole nanoseconds, saturating at zero for negative durations and at `Int64.max` (292
    /// years) for huge ones, so `Int(d.nanoseconds)` and `monotonicNanos() + d.nanoseconds`
    /// never trap nor wrap, whatever duration got in (docs/architecture.md §2.7).
    public var nanoseconds: UInt64 {
        let (s, a) = components
        if s < 0 || a < 0 { return 0 }  // `components` truncates: -0.5 s is (0, -5e17).
        let (ns, overflow) = s.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return UInt64(Int64.max) }
        let (sum, o2) = ns.addingReportingOverflow(a / 1_000_000_000)
        return o2 ? UInt64(Int64.max) : UInt64(sum)
    }
}

/// Something with a deadline that the loop's tick checks (connections with header, idle,
/// connect and response timeouts). Touched only on its loop.
public protocol LoopTimeoutable: AnyObject {
    /// Monotonic deadline in nanoseconds; 0 means none.
    var deadline: UInt64 { get }
    /// Called on the loop once `deadline` has passed.
    func deadlineExpired(now: UInt64)
}

/// A socket served by the loop poller (`EventLoop.IOMode.loopPoller`).
public protocol LoopPollable: AnyObject {
    func pollerEvent(readable: Bool, writable: Bool, hangup: Bool)
}

/// Something whose buffered output is flushed once at the end of the current event.
public protocol LoopFlushable: AnyObject {
    func flushNow()
}

/// One event loop: a serial `DispatchQueue` that every connection assigned to it lives on for its
/// whole life (docs/architecture.md §2.2). Owns a coarse tick timer (100 ms) that checks registered deadlines,
/// the per-loop read buffer shared by all its sockets, and the list of channels to flush at the
/// end of the current event (write coalescing). All its mutable state is touched only on `queue`.
public final class EventLoop: @unchecked Sendable {  // @unchecked: state confined to `queue`
    /// How sockets get their readiness events.
    public enum IOMode: String, Sendable, CaseIterable {
        /// One `DispatchSourceRead` and one `DispatchSourceWrite` per socket (config `io: sources`).
        case socketSources = "sources"
        /// One edge-triggered epoll set per loop, watched by a single `DispatchSourceRead` on its
        /// fd: one Dispatch event drains every ready socket of the loop (docs/architecture.md §2.2; the default,
        /// config `io: poller`; about twice the requests/s at 64 connections, see bench/RESULTS.md).
        case loopPoller = "poller"

        /// The mode when neither the config nor the environment names one (docs/architecture.md §2.2).
        public static let defaultMode = IOMode.loopPoller

        /// From `$BEARERD_IO` (`sources` or `poller`); `defaultMode` when unset or unknown.
        public static var fromEnvironment: IOMode {
            guard let v = getenv("BEARERD_IO") else { return defaultMode }
            return IOMode(rawValue: String(cString: v)) ?? defaultMode
        }
    }

    public let queue: DispatchQueue
    public let index: Int
    public let ioMode: IOMode
    /// The system calls of this loop's sockets and poller (`Syscalls.system` except in tests).
    public let syscalls: Syscalls
    @exclusivity(unchecked) private var epfd: Int32 = -1
    private var pollerSource: DispatchSourceRead?
    /// The poller's sockets by fd (nginx's connection table): `pollables[fd]` for
    /// `0 <= fd < pollableCapacity`, nil where none is registered. A table owned by the loop
    /// (grown by doubling, freed in `deinit`) instead of a dictionary: every readiness event
    /// looks its socket up, and every connection registers and leaves, with no hashing and no
    /// exclusivity check (fds are small integers the kernel hands out lowest first).
    @exclusivity(unchecked) private var pollables: UnsafeMutablePointer<LoopPollable?>
    @exclusivity(unchecked) private var pollableCapacity: Int
    /// Beside `pollables`: `batchStamp | i` when the batch being served holds fd's event at
    /// index `i` (epoll reports an fd at most once per batch), so `hasUndeliveredInput` is one
    /// lookup instead of a scan of the rest of the batch per reused upstream connection.
    @exclusivity(unchecked) private var batchMarks: UnsafeMutablePointer<UInt64>
    /// The current batch's stamp (high bits; never 0 while a batch is served).
    @exclusivity(unchecked) private var batchStamp: UInt64 = 0
    /// epoll_wait's output (fds and flags of one batch): fixed buffers owned by the loop (freed
    /// in `deinit`), not arrays, so reading an event costs no exclusivity check.
    private let pollFDs: UnsafeMutableBufferPointer<Int32> = {
        let b = UnsafeMutableBufferPointer<Int32>.allocate(capacity: 512)
        b.initialize(repeating: 0)
        return b
    }()
    private let pollFlags: UnsafeMutableBufferPointer<UInt32> = {
        let b = UnsafeMutableBufferPointer<UInt32>.allocate(capacity: 512)
        b.initialize(repeating: 0)
        return b
    }()
    private static let key = DispatchSpecificKey<ObjectIdentifier>()

    /// Shared scratch buffer for socket reads on this loop (read until EAGAIN, then hand slices on).
    let readBuffer: UnsafeMutableRawBufferPointer
    /// Output buffers of this loop's channels between writes (`SpareBuffers`).
    @exclusivity(unchecked) var spareBuffers = SpareBuffers()
    @exclusivity(unchecked) private var timeoutables: [ObjectIdentifier: LoopTimeoutable] = [:]
    @exclusivity(unchecked) private var dirty: [LoopFlushable] = []
    private var tick: DispatchSourceTimer?
    /// What the tick timer's and the poller source's handlers call (see `SourceTarget`).
    private var sourceTarget: SourceTarget?
    /// Work to run at the end of the current event, after flushes (e.g. continue pipelined parsing).
    @exclusivity(unchecked) private var deferred: [() -> Void] = []
    @exclusivity(unchecked) private var inEvent = false

    public init(index: Int, readBufferSize: Int = 256 * 1024, ioMode: IOMode = .fromEnvironment, syscalls: Syscalls = .system) {
        self.index = index
        self.ioMode = ioMode
        self.syscalls = syscalls
        self.queue = DispatchQueue(label: "bearerd.loop.\(index)", qos: .userInitiated)
        self.readBuffer = .allocate(byteCount: readBufferSize, alignment: 16)
        pollableCapacity = 1024
        pollables = .allocate(capacity: pollableCapacity)
        pollables.initialize(repeating: nil, count: pollableCapacity)
        batchMarks = .allocate(capacity: pollableCapacity)
        batchMarks.initialize(repeating: 0, count: pollableCapacity)
        queue.setSpecific(key: EventLoop.key, value: ObjectIdentifier(self))
        let timer = DispatchSource.makeTimerSource(queue: queue)
        timer.schedule(deadline: .now() + .milliseconds(100), repeating: .milliseconds(100), leeway: .milliseconds(20))
        let target = SourceTarget(self)
        sourceTarget = target
        timer.setEventHandler { target.withLoop { $0.onTick() } }
        tick = timer
        timer.resume()
        if ioMode == .loopPoller {
            let created = syscalls.epollCreate()
            precondition(created >= 0, "epoll_create1 failed")  // out of descriptors at start-up: nothing can run
            epfd = Int32(truncatingIfNeeded: created)
            let src = DispatchSource.makeReadSource(fileDescriptor: epfd, queue: queue)
            src.setEventHandler { target.withLoop { $0.pollerFired() } }
            src.setCancelHandler { [epfd, syscalls] in syscalls.closeFD(epfd) }
            src.resume()
            pollerSource = src
        }
    }

    /// `now` while an event runs: read when it started (and after each `epoll_wait`).
    @exclusivity(unchecked) private var eventTime: UInt64 = 0

    /// Monotonic nanoseconds for deadlines and idle stamps on this loop: inside an event, the
    /// time it started (one clock read per event or poller batch instead of one per use; the
    /// deadlines have 100 ms resolution anyway); outside one, the clock. Latency measurements
    /// read the clock themselves.
    public var now: UInt64 {
        inEvent ? eventTime : monotonicNanos()
    }

    /// The events of the batch being served: entries `batchCursor + 1 ..< batchCount` of
    /// `pollFDs`/`pollFlags` are still to be delivered (0 outside a batch).
    @exclusivity(unchecked) private var batchCount = 0
    @exclusivity(unchecked) private var batchCursor = 0

    /// Poller mode: whether epoll reported input or a hang-up on `fd` in the batch being served
    /// that its channel has not been given yet. With every earlier event already read (edge
    /// triggered, read until a short read or EOF), this is what the loop knows of the socket
    /// without a system call.
    public func hasUndeliveredInput(fd: Int32) -> Bool {
        assertInEventLoop()
        let slot = Int(fd)
        guard batchCount > 0, slot >= 0, slot < pollableCapacity else { return false }
        let mark = batchMarks[slot]
        guard mark & ~Self.markIndexMask == batchStamp else { return false }
        let i = Int(mark & Self.markIndexMask)
        return i > batchCursor && i < batchCount && pollFlags[i] & 5 != 0
    }

    /// The low bits of a batch mark: the event's index in the batch (< 512 < 2^20).
    private static let markIndexMask: UInt64 = (1 << 20) - 1

    /// How the poller reports a socket.
    public enum PollTrigger: Sendable {
        /// Once per change of readiness, for input, output and the peer's half-close: the owner
        /// reads (or writes) until EAGAIN. Connections.
        case edge
        /// Input only, at every `epoll_wait` while it is readable: the owner may take one piece
        /// (a listening socket: one connection) and be asked again, instead of learning that
        /// nothing is left from a call that fails (a failed accept4 still allocates and frees a
        /// socket inode, a file and a dentry).
        case level
    }

    /// Registers a socket with the loop poller.
    public func registerPollable(fd: Int32, _ p: LoopPollable, trigger: PollTrigger = .edge) {
        assertInEventLoop()
        let slot = Int(fd)
        guard slot >= 0 else { return }  // never a valid descriptor
        if slot >= pollableCapacity { growPollables(toHold: slot) }
        pollables[slot] = p
        switch trigger {
        case .edge: _ = syscalls.epollAdd(epfd, fd)
        case .level: _ = syscalls.epollAddLevel(epfd, fd)
        }
    }

    /// Doubles the table until it has a slot for `fd`.
    private func growPollables(toHold fd: Int) {
        var capacity = pollableCapacity
        while capacity <= fd { capacity *= 2 }  // fd < 2^31: no overflow
        let table = UnsafeMutablePointer<LoopPollable?>.allocate(capacity: capacity)
        table.moveInitialize(from: pollables, count: pollableCapacity)
        (table + pollableCapacity).initialize(repeating: nil, count: capacity - pollableCapacity)
        pollables.deallocate()
        pollables = table
        let marks = UnsafeMutablePointer<UInt64>.allocate(capacity: capacity)
        marks.moveInitialize(from: batchMarks, count: pollableCapacity)
        (marks + pollableCapacity).initialize(repeating: 0, count: capacity - pollableCapacity)
        batchMarks.deallocate()
        batchMarks = marks
        pollableCapacity = capacity
    }

    /// The socket registered for `fd`, if any.
    @inline(__always)
    private func pollable(_ fd: Int32) -> LoopPollable? {
        let slot = Int(fd)
        return slot >= 0 && slot < pollableCapacity ? pollables[slot] : nil
    }

    /// Removes a socket from the poller (EPOLL_CTL_DEL); it may stay open.
    public func unregisterPollable(fd: Int32) {
        forgetPollable(fd: fd)
        _ = syscalls.epollDelete(epfd, fd)
    }

    /// Removes a socket that is closed right after, without EPOLL_CTL_DEL: closing the last
    /// descriptor of an open file description removes it from every epoll set (epoll(7)), and a
    /// socket here is never shared (created close-on-exec, never duplicated), so the system call
    /// would only repeat what close(2) does (nginx skips it the same way, `NGX_CLOSE_EVENT`). In
    /// the instant a `posix_spawn` child (`grant: exec`) holds copies of the descriptors before
    /// its exec, the closed socket may still report an event: it finds an empty slot, or the
    /// new socket that reuses the number, as the stale events of a batch already fetched do
    /// (a read that finds EAGAIN; at worst a hang-up makes a pooled connection look unusable).
    public func forgetPollable(fd: Int32) {
        assertInEventLoop()
        let slot = Int(fd)
        if slot >= 0 && slot < pollableCapacity { pollables[slot] = nil }
    }

    /// The epoll fd is readable: serve every ready socket, flush, then linger in epoll_wait for
    /// up to 1 ms at a time while events keep coming, so a busy loop's next event (typically the
    /// upstream's answer to the request just sent) is served without another Dispatch wake-up
    /// (each costs a hand-off through Dispatch's manager thread: a write, an epoll_ctl, a futex
    /// wake and two context switches). The queue is given back as soon as a block this loop
    /// queued waits (`queuedBlocks`: `execute`, deferred work), and after `lingerBudget` in any
    /// case, so Dispatch timers on the queue (the tick, session timers) run at most that late.
    private func pollerFired() {
        pollerWakeups &+= 1
        runEvent { pollOnce(timeoutMs: 0) }
        let start = eventTime
        for _ in 0..<Self.lingerRounds {
            if queuedBlocks.load(ordering: .relaxed) > 0 { return }
            var served = false
            runEvent { served = pollOnce(timeoutMs: 1) }
            if !served { return }
            if eventTime >= start && eventTime - start >= Self.lingerBudget { return }
        }
    }

    /// How long the poller keeps the queue while events keep coming (nanoseconds).
    static let lingerBudget: UInt64 = 5_000_000
    /// At most this many `epoll_wait` rounds per Dispatch wake-up, whatever the clock says.
    static let lingerRounds = 4096
    /// Blocks this loop put on its own queue that have not started yet (see `enqueue`).
    private let queuedBlocks = Atomic<Int>(0)
    /// Times the poller source fired (a Dispatch wake-up), for tests.
    @exclusivity(unchecked) private(set) var pollerWakeups = 0

    /// `queue.async`, counted in `queuedBlocks` so the poller's linger makes way for it.
    private func enqueue(_ block: @escaping () -> Void) {
        queuedBlocks.add(1, ordering: .relaxed)
        queue.async { [self] in
            queuedBlocks.subtract(1, ordering: .relaxed)
            block()
        }
    }

    /// Serves ready sockets; true when there were any. Output is flushed by the enclosing `runEvent`.
    @discardableResult
    func pollOnce(timeoutMs: Int32) -> Bool {  // internal for tests (a scripted batch)
        var served = false
        var timeout = timeoutMs
        while true {
            let n = syscalls.epollWait(epfd, pollFDs, pollFlags, timeout)
            if n <= 0 { return served }
            eventTime = monotonicNanos()
            served = true
            timeout = 0
            batchCount = min(Int(n), pollFDs.count, pollFlags.count)
            defer { batchCount = 0 }
            batchStamp = batchStamp &+ (1 << 20)
            if batchStamp == 0 { batchStamp = 1 << 20 }  // after 2^44 batches: 0 would match fresh slots
            for i in 0..<batchCount {
                let slot = Int(pollFDs[i])
                if slot >= 0 && slot < pollableCapacity { batchMarks[slot] = batchStamp | UInt64(i) }
            }
            for i in 0..<batchCount {
                batchCursor = i
                let f = pollFlags[i]
                pollable(pollFDs[i])?.pollerEvent(readable: f & 1 != 0, writable: f & 2 != 0, hangup: f & 4 != 0)
            }
            if Int(n) < pollFDs.count { return served }
        }
    }

    deinit {
        sourceTarget?.detach(onLoopQueue: inEventLoop)
        pollerSource?.cancel()
        tick?.cancel()
        readBuffer.deallocate()
        pollables.deinitialize(count: pollableCapacity)
        pollables.deallocate()
        batchMarks.deallocate()
        pollFDs.deallocate()
        pollFlags.deallocate()
    }

    public var inEventLoop: Bool {
        DispatchQueue.getSpecific(key: EventLoop.key) == ObjectIdentifier(self)
    }

    @inline(__always)
    public func assertInEventLoop() {
        #if DEBUG
        dispatchPrecondition(condition: .onQueue(queue))
        #endif
    }

    /// Runs `work` on this loop, later (never synchronously).
    public func execute(_ work: @escaping () -> Void) {
        enqueue { [self] in self.runEvent(work) }
    }

    /// Runs `work` after `delay` on this loop.
    public func schedule(after delay: Duration, _ work: @escaping () -> Void) {
        queue.asyncAfter(deadline: .now() + .nanoseconds(Int(delay.nanoseconds))) { [self] in
            self.runEvent(work)
        }
    }

    /// Wraps every event handler: runs it, then flushes the channels it dirtied and runs deferred work.
    @inline(__always)
    public func runEvent(_ body: () -> Void) {
        if inEvent {
            body()
            return
        }
        inEvent = true
        eventTime = monotonicNanos()
        body()
        drain()
        inEvent = false
    }

    private func drain() {
        var rounds = 0
        while !dirty.isEmpty || !deferred.isEmpty {
            while !dirty.isEmpty {
                let batch = dirty
                dirty.removeAll(keepingCapacity: true)
                for f in batch { f.flushNow() }
            }
            if !deferred.isEmpty {
                let work = deferred
                deferred.removeAll(keepingCapacity: true)
                for w in work { w() }
            }
            rounds += 1
            if rounds > 64 { break }  // bound the work done in one event; the rest is picked up next time
        }
        if !dirty.isEmpty || !deferred.isEmpty {
            enqueue { [self] in self.runEvent {} }
        }
    }

    /// Queue `f` for a flush at the end of the current event (call once per dirtying).
    public func markDirty(_ f: LoopFlushable) {
        assertInEventLoop()
        dirty.append(f)
        if !inEvent { enqueue { [self] in self.runEvent {} } }
    }

    /// Run `work` at the end of the current event, after output is flushed.
    public func deferToEndOfEvent(_ work: @escaping () -> Void) {
        deferred.append(work)
        if !inEvent { enqueue { [self] in self.runEvent {} } }
    }

    public func register(_ t: LoopTimeoutable) {
        assertInEventLoop()
        timeoutables[ObjectIdentifier(t)] = t
    }

    public func unregister(_ t: LoopTimeoutable) {
        assertInEventLoop()
        timeoutables.removeValue(forKey: ObjectIdentifier(t))
    }

    private func onTick() {
        runEvent {
            let now = monotonicNanos()
            var expired: [LoopTimeoutable] = []
            for (_, t) in timeoutables {
                let d = t.deadline
                if d != 0 && d <= now { expired.append(t) }
            }
            for t in expired { t.deadlineExpired(now: now) }
        }
    }
}

/// The loop as its own Dispatch sources see it. A loop's last reference may be dropped on any
/// thread (a blocking token request's private loop, a group torn down by its owner) while a tick
/// or a poller event is starting on the loop's queue; `deinit` cancels the sources, but a handler
/// can begin in between. An `unowned` capture trapped there ("Attempted to read an unowned
/// reference but object … was already destroyed": seen in CI, reproduced by
/// `LoopLifetimeTests`), and a `weak` one would move the loop's reference count to a side table
/// for good, slowing every retain of the loop on the request path (measured, bench/RESULTS.md).
///
/// So the handlers hold this box. A handler takes a strong reference under the lock (unless the
/// loop was detached) and marks itself running; `deinit` detaches the loop under the lock and,
/// when a handler is running on another thread, waits for it to finish (retaining and releasing
/// a loop whose `deinit` waits is allowed; the count is back where it was when the handler ends).
/// When the handler's own release is the last one, `deinit` runs on the loop's queue at the end
/// of the handler, after it is marked done, and does not wait. Uncontended except at that moment.
final class SourceTarget: @unchecked Sendable {  // @unchecked: `loop` and `running` only under `lock`
    private let lock = Lock()
    private var loop: Unmanaged<EventLoop>?
    private var running = false

    init(_ loop: EventLoop) { self.loop = .passUnretained(loop) }

    func withLoop(_ body: (EventLoop) -> Void) {
        let taken: EventLoop? = lock.withLock {
            guard let l = loop else { return nil }
            running = true
            return l.takeUnretainedValue()  // a strong reference, taken under the lock
        }
        guard let loop = taken else { return }
        withExtendedLifetime(loop) {
            body(loop)
            lock.withLock { running = false }
        }
        // `loop` may have been the last reference: then `deinit` ran just now, on the loop's
        // queue, with no handler marked running.
    }

    /// From the loop's `deinit`: no handler reaches the loop after this returns.
    func detach(onLoopQueue: Bool) {
        var busy = lock.withLock {
            loop = nil
            return running
        }
        // On the loop's queue a running handler is our caller (serial queue): nothing to wait for.
        while busy && !onLoopQueue {
            sched_yield()
            busy = lock.withLock { running }
        }
    }
}

/// N event loops (default one per core); new connections are spread round-robin.
public final class EventLoopGroup: @unchecked Sendable {  // @unchecked: `loops` is immutable, `nextIndex` only used by the acceptor's loop
    public let loops: [EventLoop]
    private var nextIndex = 0

    public init(count: Int, ioMode: EventLoop.IOMode = .fromEnvironment, syscalls: Syscalls = .system) {
        loops = (0..<max(1, count)).map { EventLoop(index: $0, ioMode: ioMode, syscalls: syscalls) }
    }

    /// A group of loops made elsewhere (tests: a loop on a scripted kernel).
    public init(loops: [EventLoop]) {
        precondition(!loops.isEmpty, "a group needs a loop")  // a caller's mistake, not input
        self.loops = loops
    }

    /// The default number of loops: the CPUs this process may use. The online CPUs, fewer when
    /// the affinity mask allows fewer (taskset, cpusets) or a cgroup v2 CPU quota (`cpu.max`,
    /// a container's CPU limit) allows less, rounded up; at least 1. A sidecar limited to half a
    /// core gets one loop, not one per host core.
    public static var coreCount: Int {
        var n = max(1, Int(sysconf(Int32(_SC_NPROCESSORS_ONLN))))
        let affinity = Int(bearerd_affinity_cpu_count())
        if affinity > 0 { n = min(n, affinity) }
        if let quota = cgroupCPUQuota(readSmallFile("/sys/fs/cgroup/cpu.max")) { n = min(n, quota) }
        return max(1, n)
    }

    /// The first 256 bytes of a file, or nil.
    private static func readSmallFile(_ path: String) -> String? {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { close(fd) }
        var buf = [UInt8](repeating: 0, count: 256)
        let n = buf.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        guard n > 0 else { return nil }
        return String(decoding: buf[0..<min(n, buf.count)], as: UTF8.self)
    }

    /// CPUs allowed by a cgroup v2 `cpu.max` (`"<quota> <period>"` or `"max <period>"`), rounded
    /// up; nil when unlimited or unreadable.
    static func cgroupCPUQuota(_ text: String?) -> Int? {
        guard let text else { return nil }
        let parts = text.split(whereSeparator: { $0 == " " || $0 == "\n" })
        guard parts.count >= 2, let quota = UInt64(parts[0]), let period = UInt64(parts[1]), period > 0, quota > 0 else { return nil }
        let cpus = quota / period + (quota % period == 0 ? 0 : 1)
        return Int(clamping: min(cpus, 4096))
    }

    public func next() -> EventLoop {
        let l = loops[nextIndex % loops.count]
        nextIndex &+= 1
        return l
    }
}
