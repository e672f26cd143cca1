import Dispatch
import CBearerdShim
#if canImport(Glibc)
import Glibc
import BearerdTLS
#endif

/// What a `SocketChannel` tells its owner. All calls arrive on the channel's loop.
public protocol ChannelDelegate: AnyObject {
    /// Plaintext bytes arrived (decrypted when the channel runs TLS). Valid only during the call.
    func channelRead(_ channel: SocketChannel, _ bytes: UnsafeRawBufferPointer)
    /// The peer closed its sending side (or sent TLS close_notify).
    func channelEOF(_ channel: SocketChannel)
    /// A connect, TLS or socket error; the channel is closed right after this call.
    func channelError(_ channel: SocketChannel, _ error: ChannelError)
    /// Outgoing bytes fell below the low-water mark after having been above the high-water mark.
    func channelWritable(_ channel: SocketChannel)
    /// Outbound connection established (and TLS handshake completed when TLS is on).
    func channelActive(_ channel: SocketChannel)
    /// The channel is closed; no further calls follow.
    func channelClosed(_ channel: SocketChannel)
}

extension ChannelDelegate {
    public func channelWritable(_ channel: SocketChannel) {}
    public func channelActive(_ channel: SocketChannel) {}
}

/// Why a channel failed, classified for the 502/504 bodies of docs/architecture.md §5.
public enum ChannelError: Error, CustomStringConvertible {
    case connect(IOError)
    case io(IOError)
    case tls(TLSError)
    case timeout(String)
    case protocolError(String)
    /// A forward proxy did not open a CONNECT tunnel (RFC 9110 §9.3.6): `status` is its final
    /// non-2xx answer, nil when it could not be reached or closed without answering. The text
    /// names the proxy (never its credentials) and what happened.
    case proxyTunnel(status: Int?, String)

    public var description: String {
        switch self {
        case .connect(let e): return "connect failed: \(e)"
        case .io(let e): return "\(e)"
        case .tls(let e): return "\(e)"
        case .timeout(let what): return "\(what) timed out"
        case .protocolError(let what): return what
        case .proxyTunnel(_, let what): return what
        }
    }
}

/// Reasons reads are paused; reads run only while the set is empty, so nested pauses from
/// different owners stay balanced (nghttpx `shrpx_io_control.h`).
public struct ReadPauseReasons: OptionSet, Sendable {
    public let rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }
    /// The other side's write buffer is over its bound.
    public static let peerBackpressure = ReadPauseReasons(rawValue: 1 << 0)
    /// Enough pipelined input is buffered; wait until the current exchange completes.
    public static let pipelineFull = ReadPauseReasons(rawValue: 1 << 1)
    /// The owner does not want input now (idle pooled connection handled separately).
    public static let owner = ReadPauseReasons(rawValue: 1 << 2)
}

/// A socket's read and write gates (`IOMode.socketSources`), owned by its channel, on its loop.
final class SourceGates {
    @exclusivity(unchecked) var read: SourceGate
    @exclusivity(unchecked) var write: SourceGate
    init(read: SourceGate, write: SourceGate) {
        self.read = read
        self.write = write
    }
}

/// A Dispatch source with its suspension tracked, so suspend and resume balance by construction
/// and cancelling always resumes first (libdispatch traps when a suspended or never-activated
/// source is released; swift-service-lifecycle's `UnixSignalsSequence` does the same).
/// Owned by one object and touched on its queue only.
struct SourceGate {
    /// Exits: `inactive` (as created) → `running`; `running` ⇄ `suspended`; any → `cancelled` (final).
    enum State: Equatable {
        case inactive
        case running
        case suspended
        case cancelled
    }

    let source: DispatchSourceProtocol
    private(set) var state = State.inactive

    init(_ source: DispatchSourceProtocol) { self.source = source }

    mutating func resume() {
        switch state {
        case .inactive, .suspended:
            state = .running
            source.resume()
        case .running, .cancelled:
            break
        }
    }

    mutating func suspend() {
        guard state == .running else { return }
        state = .suspended
        source.suspend()
    }

    /// Cancels, then resumes a source that is not running, so its cancel handler runs and the
    /// source can be released; its event handler never runs again.
    mutating func cancel() {
        let was = state
        guard was != .cancelled else { return }
        state = .cancelled
        source.cancel()
        if was != .running { source.resume() }
    }
}

/// A non-blocking stream socket on one loop: readiness from the loop poller or from a read and
/// a write Dispatch source, an output buffer with high/low-water marks, optional TLS (an OpenSSL
/// memory-BIO engine between socket and owner). Every system call goes through `sys`.
///
/// Lives on `loop` only. Invariants: `phase` is the one record of where the socket is (see
/// `Phase`); with sources, each source's suspension is a `SourceGate`, so suspend/resume balance
/// and close resumes before cancelling; the fd is closed exactly once, in the second cancel
/// handler (sources) or right after leaving the poller's table (poller; the close itself takes
/// it out of the epoll set); output is written directly,
/// and writability is awaited (`writeInterest`) only after EAGAIN or during connect; reads run
/// only while `pauseReasons` is empty.
///
/// `@exclusivity(unchecked)` (here, on the loop, the pool's connections, the frontends and the
/// exchange driver): only on stored properties of trivially copyable types (integers, flags,
/// enums and structs without references or heap storage; tests pin the non-obvious ones with
/// `_isPOD`). An overlapping access to such a value can only read a stale value, never free or
/// move memory, and the runtime check of every access cost about a tenth of a proxied
/// request's instructions (measured, bench/RESULTS.md). Arrays, dictionaries, strings and references keep the
/// check: a nested mutation there could reallocate storage under a reader.
public final class SocketChannel: LoopFlushable, LoopPollable, @unchecked Sendable {  // @unchecked: confined to `loop`
    /// Where the connection is. Valid transitions:
    /// - `connecting` → `handshaking` (TLS) | `open` | `closed` (connect failed)
    /// - `handshaking` → `open` | `closed`
    /// - `open` → `flushingBeforeClose` | `lingering` (nothing left to flush) | `closed`
    ///   (nothing left to flush, and `finalStep` says nothing is left to linger for)
    /// - `flushingBeforeClose` → `lingering` | `flushingAfterPeerEOF` (the peer's EOF) | `closed`
    ///   (output written, and `finalStep` says close)
    /// - `flushingAfterPeerEOF` → `closed` (output written, or an error)
    /// - `lingering` → `closed` (the peer's EOF, an error, or 2 s)
    /// - `connecting`/`handshaking` → `flushingBeforeClose`/`lingering` when the owner gives up early
    enum Phase: Equatable {
        /// connect(2) in progress; writability (or an error reported as readable) completes it.
        case connecting
        /// TCP is up; the TLS client handshake runs (only with TLS).
        case handshaking
        /// Reading and writing.
        case open
        /// `closeAfterFlush(_:)`: the queued output is written, then `finalStep` decides
        /// between `lingering` and `closed`.
        case flushingBeforeClose(CloseMode)
        /// `closeAfterFlush`, and the peer's EOF arrived meanwhile: the queued output (the
        /// peer's answer, a 400 included) is still written, then the socket closes at once (the
        /// peer sends nothing more, so there is nothing to linger for). Reads are paused.
        case flushingAfterPeerEOF
        /// SHUT_WR sent: input is discarded until the peer's EOF, then `closed`.
        case lingering
        /// Sources cancelled (or the poller left); no delegate call follows `channelClosed`.
        case closed
    }

    /// How `closeAfterFlush` ends the connection once its output is written. A close while
    /// unread input sits in the socket makes the kernel answer with a reset, which can destroy
    /// the output still in the peer's receive buffer (RFC 9112 §9.6), so the default lingers.
    public enum CloseMode: Equatable, Sendable {
        /// Half-close, then read and discard until the peer's EOF (at most 2 s), unless the
        /// peer's EOF was read already.
        case linger
        /// The owner expects nothing more from the peer (its request was read whole, nothing
        /// follows it): close at once when the socket holds no unread input; linger when it
        /// does, or when the channel cannot tell (TLS: the peer may answer close_notify).
        /// nginx's lingering_close `on` decides the same way.
        case lingerIfInputPending
    }

    /// What the channel knows of the socket's unread input (poller mode keeps it from its
    /// reads; with sources it comes from a peek).
    enum InputKnowledge: Equatable {
        /// Input may be waiting: nothing read yet, a full read, reads stopped by a pause or
        /// the round bound, or readiness reported since the last read.
        case unknown
        /// The last read came back short or EAGAIN, and no readiness was reported since.
        case drained
        /// The peer's EOF was read: it sends nothing more.
        case ended
    }

    /// The last step of a close once the output is written.
    enum FinalStep: Equatable {
        /// close(2) now: nothing unread can make the kernel reset the connection.
        case close
        /// shutdown(SHUT_WR), then `lingering` until the peer's EOF.
        case halfCloseAndLinger
    }

    /// The close decision, pure: after the peer's EOF there is nothing to linger for; otherwise
    /// only a plaintext channel whose owner expects nothing more, with no input waiting, closes
    /// at once.
    static func finalStep(mode: CloseMode, tls: Bool, input: InputKnowledge) -> FinalStep {
        if input == .ended { return .close }
        switch mode {
        case .linger:
            return .halfCloseAndLinger
        case .lingerIfInputPending:
            return !tls && input == .drained ? .close : .halfCloseAndLinger
        }
    }

    /// Whether the channel waits for the socket to become writable (after EAGAIN, or connecting).
    enum WriteInterest: Equatable {
        case none
        case awaitingWritable
    }

    public let loop: EventLoop
    public let fd: Int32
    /// Strong, cleared by `close()`: the channel lives until it is closed anyway (the loop's
    /// poller table or its Dispatch sources hold it), and a weak reference would put the
    /// delegate's reference count in a side table, slowing every retain of it (measured, bench/RESULTS.md).
    @exclusivity(unchecked) public var delegate: ChannelDelegate?
    public var peerAddress: SocketAddress?
    let sys: Syscalls

    /// Per-socket sources (`IOMode.socketSources`); nil when the loop poller serves this socket.
    /// One object for both: two optional gates (each an existential) cost ~120 instructions to
    /// destroy per connection even when nil (measured).
    @exclusivity(unchecked) private var gates: SourceGates?
    /// Served by the loop poller (no gates). A stored flag: testing `gates` retains it at every
    /// use (measured, for the gates as they were: the optional gate copied with its source).
    private let polled: Bool
    /// Poller mode: the peer's FIN (or an error) arrived; a short read no longer means "nothing
    /// more", because edge-triggered polling will not report the EOF again.
    @exclusivity(unchecked) private var peerHungUp = false
    /// Poller mode: what the reads so far say of the socket's unread input (`finalStep`).
    @exclusivity(unchecked) private var input = InputKnowledge.unknown
    @exclusivity(unchecked) private(set) var phase: Phase = .open
    @exclusivity(unchecked) private(set) var writeInterest = WriteInterest.none
    @exclusivity(unchecked) private var pauseReasons: ReadPauseReasons = []

    /// Output not yet written, from `outOffset` on. Its storage comes from the loop's
    /// `spareBuffers` at a write and goes back there once everything is written (and at
    /// `close()`): a connection holds an output buffer only while it has output pending.
    @exclusivity(unchecked) private var out: [UInt8] = []
    @exclusivity(unchecked) private var outOffset = 0
    @exclusivity(unchecked) private var flushScheduled = false
    @exclusivity(unchecked) private var aboveHighWater = false
    @exclusivity(unchecked) public var highWaterMark = 256 * 1024
    @exclusivity(unchecked) public var lowWaterMark = 64 * 1024

    @exclusivity(unchecked) private var tls: TLSEngine?
    @exclusivity(unchecked) private var cancelsPending = 2
    /// While `lingering`: when to give up waiting for the peer's EOF (the loop's tick checks it).
    @exclusivity(unchecked) private var lingerDeadline: UInt64 = 0

    public var isClosed: Bool { phase == .closed }

    /// Runs once, right after the descriptor is closed (on the loop): an accepted connection
    /// gives its slot back to the process's `AcceptBudget`.
    @exclusivity(unchecked) public var onDescriptorClosed: (() -> Void)?

    /// Whether the socket holds unread bytes or the peer's EOF, without consuming anything. An
    /// idle pooled connection for which this holds must not carry a new request: those bytes
    /// would be read as its response (docs/architecture.md §5).
    ///
    /// With Dispatch sources, and in poller mode for a socket quiet for a while
    /// (`recentlyActive` false), it asks the kernel (`MSG_PEEK`). In poller mode a socket that
    /// carried traffic less than a second ago is judged by what the loop knows: every event epoll
    /// reported before has been read to a short read or EOF (a hang-up reads on to EOF), and the
    /// batch being served is checked for an event still to come; that saves a system call per
    /// reused connection (measured, bench/RESULTS.md). What could arrive unseen in that window is the same race
    /// a peek has a microsecond later.
    public func hasUnreadInput(recentlyActive: Bool = false) -> Bool {
        guard !isClosed else { return true }
        if polled {
            if peerHungUp || loop.hasUndeliveredInput(fd: fd) { return true }
            if recentlyActive { return false }
        }
        let rc = sys.peek(fd)
        return rc >= 0 || rc != -Int(EAGAIN) && rc != -Int(EWOULDBLOCK)
    }

    /// For tests: the sources' states (nil in poller mode).
    var readSourceState: SourceGate.State? { gates?.read.state }
    var writeSourceState: SourceGate.State? { gates?.write.state }

    public init(fd: Int32, loop: EventLoop) {
        self.fd = fd
        self.loop = loop
        self.sys = loop.syscalls
        polled = loop.ioMode != .socketSources
        guard loop.ioMode == .socketSources else { return }
        let readSource = DispatchSource.makeReadSource(fileDescriptor: fd, queue: loop.queue)
        let writeSource = DispatchSource.makeWriteSource(fileDescriptor: fd, queue: loop.queue)
        // Strong capture on purpose: the channel stays alive until both cancel handlers ran
        // (libdispatch releases the handlers after cancellation, breaking the cycle).
        let closeFD: () -> Void = { [fd] in
            self.cancelsPending -= 1
            if self.cancelsPending == 0 {
                self.sys.closeFD(fd)
                self.descriptorClosed()
            }
        }
        readSource.setCancelHandler(handler: closeFD)
        writeSource.setCancelHandler(handler: closeFD)
        gates = SourceGates(read: SourceGate(readSource), write: SourceGate(writeSource))
    }

    /// Starts reading. Call once, on the loop, after setting the delegate. `readingFirst`: the
    /// peer's first bytes should be waiting already (an accepted TCP connection: `Listener`
    /// defers accepts until they arrive); with the loop poller they are read now. A miss costs
    /// one read that finds EAGAIN.
    public func start(readingFirst: Bool = false) {
        loop.assertInEventLoop()
        guard let readSource = gates?.read.source, let writeSource = gates?.write.source else {
            if readingFirst && phase == .open {
                // The first bytes are (almost always) here already: read them now, before the
                // socket joins the epoll set, instead of in the next wait's report. Registering
                // after the read loses nothing: EPOLL_CTL_ADD reports what is ready at once.
                handleReadable()
                if phase == .closed { return }
            }
            loop.registerPollable(fd: fd, self)
            return
        }
        readSource.setEventHandler { [unowned self] in
            self.loop.runEvent { self.handleReadable() }
        }
        writeSource.setEventHandler { [unowned self] in
            self.loop.runEvent { self.handleWritable() }
        }
        if pauseReasons.isEmpty { gates?.read.resume() }
        // The write source stays inactive; it is armed only on EAGAIN or during connect.
    }

    /// An accepted connection that speaks TLS (a listener with `tls:`): the server handshake runs
    /// as the client's bytes arrive; `channelActive` follows when it completes (then
    /// `negotiatedALPN` tells the protocol). Call before `start()`.
    public func serveTLS(_ engine: TLSEngine) {
        tls = engine
        phase = .handshaking
    }

    /// An open plaintext channel whose first phase is over (a tunnel through a forward proxy, set
    /// up by its first owner) passes to `delegate`: with `tls`, the client TLS handshake starts
    /// now and `channelActive` follows when it completes; without, `channelActive` follows at
    /// once. `pending` are bytes already read past the first phase (the tunnel's first bytes):
    /// fed to the TLS engine, or delivered after `channelActive`. Call on the loop.
    public func handOver(to delegate: ChannelDelegate, startingTLS tls: TLSEngine?, pending: [UInt8] = []) {
        loop.assertInEventLoop()
        guard phase == .open, self.tls == nil else {
            fail(.protocolError("a channel can be handed over only while open and without TLS"))
            return
        }
        self.delegate = delegate
        guard let tls else {
            delegate.channelActive(self)
            if !pending.isEmpty, phase != .closed { pending.withUnsafeBytes { self.delegate?.channelRead(self, $0) } }
            return
        }
        self.tls = tls
        if !pending.isEmpty { pending.withUnsafeBytes { tls.feedCiphertext($0) } }
        _ = beginHandshake(tls)
    }

    /// Enters `handshaking` and sends the TLS engine's first flight; false when the handshake
    /// failed at once (the channel is failed then).
    private func beginHandshake(_ tls: TLSEngine) -> Bool {
        phase = .handshaking
        do {
            _ = try tls.handshake()
        } catch {
            fail(.tls(error))
            return false
        }
        flushTLSOutput()
        return true
    }

    /// Opens a non-blocking connection to `address`; `channelActive` follows on success (after the
    /// TLS handshake when `tls` is given), `channelError(.connect)` on failure.
    public static func connect(to address: SocketAddress, loop: EventLoop, tls: TLSEngine?, delegate: ChannelDelegate) throws(IOError) -> SocketChannel {
        let sys = loop.syscalls
        let fd = try sys.streamSocket(family: address.family)
        if address.family != AF_UNIX {
            sys.setSocketOption(fd, Int32(IPPROTO_TCP), TCP_NODELAY, 1)
        }
        let e = sys.startConnect(fd, to: address)
        if e != 0 && e != EINPROGRESS {
            sys.closeFD(fd)
            throw IOError("connect", e)
        }
        return startConnected(fd: fd, peer: address, loop: loop, tls: tls, delegate: delegate)
    }

    /// A channel in `.connecting` whose write readiness completes the connect (then the TLS
    /// handshake).
    static func startConnected(fd: Int32, peer: SocketAddress?, loop: EventLoop, tls: TLSEngine?, delegate: ChannelDelegate) -> SocketChannel {
        let ch = SocketChannel(fd: fd, loop: loop)
        ch.delegate = delegate
        ch.peerAddress = peer
        ch.tls = tls
        ch.phase = .connecting
        ch.start()
        ch.armWrite()
        return ch
    }

    // MARK: reading

    public func pauseReading(_ reason: ReadPauseReasons) {
        guard phase != .closed, !reason.isEmpty else { return }
        pauseReasons.insert(reason)
        gates?.read.suspend()
    }

    public func resumeReading(_ reason: ReadPauseReasons) {
        guard phase != .closed else { return }
        let wasPaused = !pauseReasons.isEmpty
        pauseReasons.remove(reason)
        if wasPaused && pauseReasons.isEmpty { readsResumed() }
    }

    public var isReadPaused: Bool { !pauseReasons.isEmpty }

    /// The last pause reason went away.
    private func readsResumed() {
        if !polled {
            gates?.read.resume()
        } else {
            // Edge-triggered: data that arrived while paused raised no new event.
            // Strong: end-of-event work, no cycle; a weak reference would put the channel's
            // reference count in a side table for good (slower retains, measured, bench/RESULTS.md).
            loop.deferToEndOfEvent { [self] in handleReadable() }
        }
    }

    private func handleReadable() {
        guard phase != .closed else { return }
        if phase == .connecting {
            // A refused connect may be reported as readable (EPOLLERR/EPOLLHUP) rather than
            // writable. Reading SO_ERROR clears it, so the error read here is the one reported.
            let err = sys.socketError(fd)
            if err != 0 { completeConnect(error: err) }
            return
        }
        let buf = loop.readBuffer
        // Drain until EAGAIN (docs/architecture.md §2.2), bounded so one busy peer cannot starve the loop.
        var rounds = 0
        while phase != .closed && pauseReasons.isEmpty {
            if rounds == 16 {
                // Edge-triggered polling raises no new event for data left behind: come back.
                if polled { loop.execute { [self] in handleReadable() } }
                return
            }
            rounds += 1
            let result: Syscalls.IOResult
            do {
                result = try sys.read(fd, into: buf)
            } catch {
                fail(.io(error))
                return
            }
            switch result {
            case .wouldBlock:
                input = .drained
                return
            case .eof:
                input = .ended
                if phase == .lingering {
                    close()
                } else if case .flushingBeforeClose = phase {
                    // The owner is closing already: its last output still goes out, the EOF
                    // ends only the input (RFC 9112 §9.6; docs/architecture.md §5). It stays readable, so stop reading.
                    phase = .flushingAfterPeerEOF
                    pauseReasons.insert(.owner)
                    gates?.read.suspend()
                } else if let tls {
                    tls.feedEOF()
                    deliverTLSPlaintext(tls, eof: true)
                } else {
                    delegate?.channelEOF(self)
                }
                return
            case .bytes(let n):
                // A short read drained the socket (unless a hang-up is pending: read on to the EOF).
                let drained = n < buf.count && !peerHungUp
                input = drained ? .drained : .unknown
                if phase == .lingering { continue }
                let chunk = UnsafeRawBufferPointer(rebasing: buf[0..<min(n, buf.count)])
                if let tls {
                    tls.feedCiphertext(chunk)
                    deliverTLSPlaintext(tls, eof: false)
                } else {
                    delegate?.channelRead(self, chunk)
                }
                if drained { return }
            }
        }
    }

    private func deliverTLSPlaintext(_ tls: TLSEngine, eof: Bool) {
        if !tls.isHandshakeComplete {
            do {
                if try tls.handshake() == .complete {
                    if phase == .handshaking { phase = .open }
                    flushTLSOutput()
                    delegate?.channelActive(self)
                } else {
                    flushTLSOutput()
                    if eof { fail(.tls(TLSError(reason: "tls.handshake_failed", message: "connection closed during the TLS handshake"))) }
                    return
                }
            } catch {
                fail(.tls(error))
                return
            }
        }
        // Decrypt into a scratch area separate from the raw read buffer.
        var scratch = [UInt8](repeating: 0, count: 32 * 1024)
        while phase != .closed {
            let r: TLSEngine.ReadResult
            do {
                r = try scratch.withUnsafeMutableBytes { try tls.readPlaintext(into: $0) }
            } catch {
                fail(.tls(error as? TLSError ?? TLSError(reason: "tls.protocol", message: "\(error)")))
                return
            }
            switch r {
            case .bytes(let n):
                scratch.withUnsafeBytes { delegate?.channelRead(self, UnsafeRawBufferPointer(rebasing: $0[0..<min(n, $0.count)])) }
            case .wantMore:
                flushTLSOutput()
                if eof { delegate?.channelEOF(self) }
                return
            case .closed:
                flushTLSOutput()
                delegate?.channelEOF(self)
                return
            }
        }
    }

    private func flushTLSOutput() {
        guard let tls, tls.hasPendingCiphertext else { return }
        compactIfNeeded()
        tls.drainCiphertext(into: &out)
        scheduleFlush()
    }

    // MARK: writing

    /// Bytes queued and not yet written to the socket.
    public var pendingOutputBytes: Int { out.count - outOffset }
    /// True when the owner should stop producing output (over the high-water mark).
    public var isOverHighWater: Bool { pendingOutputBytes >= highWaterMark }

    /// Queues `bytes`; they are written at the end of the current event (one syscall per event).
    /// A large plaintext chunk (`writeThroughMinimum`, a relayed body) is written at once
    /// instead, behind what is queued, in one gathered send: only what the kernel does not take
    /// is copied into the output buffer.
    public func write(_ bytes: UnsafeRawBufferPointer) {
        guard phase != .closed else { return }
        if let tls {
            do { try tls.writePlaintext(bytes) } catch { fail(.tls(error)); return }
            compactIfNeeded()
            tls.drainCiphertext(into: &out)
        } else if bytes.count >= Self.writeThroughMinimum && phase == .open && writeInterest == .none {
            writeThrough(bytes)
            return
        } else {
            prepareToAppend()
            out.append(contentsOf: bytes)
        }
        scheduleFlush()
    }

    /// Chunks at least this large skip the output buffer when the socket takes them (a copy of
    /// each body byte saved); smaller ones are coalesced into one send at the end of the event.
    static let writeThroughMinimum = 16 * 1024

    /// Writes the queued output and then `bytes` now (one gathered send per round), until all is
    /// written or the socket is full; the rest of `bytes` is queued. An error is not reported
    /// here, inside the owner's call: the rest is queued and the flush at the end of the event
    /// meets the error again and fails the channel as any write does.
    private func writeThrough(_ bytes: UnsafeRawBufferPointer) {
        var sent = 0
        var full = false
        while sent < bytes.count {
            let queued = out.count - outOffset
            let rest = UnsafeRawBufferPointer(rebasing: bytes[sent...])
            let r: Syscalls.IOResult
            do {
                if queued > 0 {
                    r = try out.withUnsafeBytes { o in
                        try sys.write(fd, UnsafeRawBufferPointer(rebasing: o[outOffset...]), then: rest)
                    }
                } else {
                    r = try sys.write(fd, from: rest)
                }
            } catch {
                break
            }
            guard case .bytes(let n) = r else {
                full = true
                break
            }
            let fromQueued = min(n, queued)
            outOffset += fromQueued
            sent += min(n - fromQueued, bytes.count - sent)  // a kernel never reports more than asked
        }
        if outOffset == out.count {
            giveBackOutput()
        }
        guard sent < bytes.count else { return }
        prepareToAppend()
        out.append(contentsOf: UnsafeRawBufferPointer(rebasing: bytes[sent...]))
        if full { armWrite() }  // the flush waits for writability instead of trying again now
        scheduleFlush()
    }

    public func write(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { write($0) }
    }

    /// Lets `body` append bytes straight to the pending output (no buffer of its own, no
    /// copy); they are written at the end of the current event like `write`. With TLS the
    /// bytes go through a scratch buffer and the engine.
    public func writeDirect(_ body: (inout [UInt8]) -> Void) {
        guard phase != .closed else { return }
        if tls != nil {
            var scratch: [UInt8] = []
            body(&scratch)
            write(scratch)
            return
        }
        prepareToAppend()
        body(&out)
        scheduleFlush()
    }

    /// Moves a whole prepared buffer in when nothing is pending (no copy).
    public func write(taking bytes: inout [UInt8]) {
        if tls == nil && out.count == outOffset && phase != .closed {
            // The caller gets a buffer with room back (a loop's spare), not an empty array.
            if out.capacity == 0 { out = loop.spareBuffers.take() }
            swap(&out, &bytes)
            outOffset = 0
            bytes.removeAll(keepingCapacity: true)
            scheduleFlush()
        } else {
            write(bytes)
            bytes.removeAll(keepingCapacity: true)
        }
    }

    /// Makes room to append plaintext: drops a large written prefix, and takes a spare buffer
    /// from the loop when the channel holds none (`out`).
    private func prepareToAppend() {
        compactIfNeeded()
        if out.capacity == 0 { out = loop.spareBuffers.take() }
    }

    /// Everything queued is written, or nothing more will be: the output buffer goes back to
    /// the loop (`out`).
    private func giveBackOutput() {
        loop.spareBuffers.giveBack(&out)
        outOffset = 0
    }

    private func compactIfNeeded() {
        if outOffset > 0 && (outOffset == out.count || outOffset > out.count / 2) {
            out.removeSubrange(0..<outOffset)
            outOffset = 0
        }
    }

    private func scheduleFlush() {
        if !flushScheduled {
            flushScheduled = true
            loop.markDirty(self)
        }
        if !aboveHighWater && pendingOutputBytes >= highWaterMark { aboveHighWater = true }
    }

    public func flushNow() {
        flushScheduled = false
        guard phase != .closed, phase != .connecting else { return }
        if writeInterest == .awaitingWritable { return }  // writability will continue when the socket drains
        writeOut()
    }

    private func writeOut() {
        // Closing: the FIN follows the last write at once (`finishClose`), so the last segment
        // waits for it and both leave together (one segment fewer per closed connection, and
        // the peer's ACK and FIN come in one too).
        let beforeFIN: Bool
        switch phase {
        case .flushingBeforeClose, .flushingAfterPeerEOF: beforeFIN = true
        case .connecting, .handshaking, .open, .lingering, .closed: beforeFIN = false
        }
        while outOffset < out.count {
            let r: Syscalls.IOResult
            do {
                r = try out.withUnsafeBytes { try sys.write(fd, from: UnsafeRawBufferPointer(rebasing: $0[outOffset...]), beforeFIN: beforeFIN) }
            } catch {
                fail(.io(error as? IOError ?? IOError("send", EIO)))  // withUnsafeBytes rethrows untyped
                return
            }
            switch r {
            case .bytes(let n):
                outOffset += min(n, out.count - outOffset)  // a kernel never reports more than asked
            case .wouldBlock, .eof:
                armWrite()
                notifyIfBelowLowWater()
                return
            }
        }
        // All written: the buffer goes back to the loop until the next write, so an idle
        // keep-alive connection holds no output buffer (nginx frees its buffers the same way).
        giveBackOutput()
        disarmWrite()
        notifyIfBelowLowWater()
        if pendingOutputBytes == 0 {
            if case .flushingBeforeClose(let mode) = phase {
                finishClose(mode, afterWriteBeforeFIN: true)
            } else if phase == .flushingAfterPeerEOF {
                close()  // the peer's EOF was read: nothing unread, so close(2) sends the FIN
            }
        }
    }

    /// `channelWritable` once per crossing: above the high-water mark, then down to the
    /// low-water mark (also when the kernel took only part of the rest).
    private func notifyIfBelowLowWater() {
        if aboveHighWater && pendingOutputBytes <= lowWaterMark {
            aboveHighWater = false
            delegate?.channelWritable(self)
        }
    }

    private func armWrite() {
        guard writeInterest == .none else { return }
        writeInterest = .awaitingWritable
        gates?.write.resume()
    }

    private func disarmWrite() {
        guard writeInterest == .awaitingWritable else { return }
        writeInterest = .none
        gates?.write.suspend()
    }

    /// Loop poller readiness (edge-triggered).
    public func pollerEvent(readable: Bool, writable: Bool, hangup: Bool) {
        if hangup { peerHungUp = true }
        if (readable || hangup) && input != .ended { input = .unknown }
        if writable && (phase == .connecting || writeInterest == .awaitingWritable) { handleWritable() }
        if readable && phase != .closed && pauseReasons.isEmpty { handleReadable() }
    }

    private func handleWritable() {
        guard phase != .closed else { return }
        if phase == .connecting {
            completeConnect()
            return
        }
        writeOut()
    }

    /// `error`: SO_ERROR when the caller already read it (reading clears it).
    private func completeConnect(error: Int32? = nil) {
        guard phase == .connecting else { return }
        let err = error ?? sys.socketError(fd)
        if err != 0 {
            fail(.connect(IOError("connect", err)))
            return
        }
        disarmWrite()
        if let tls {
            guard beginHandshake(tls) else { return }
            writeOut()
        } else {
            phase = .open
            delegate?.channelActive(self)
        }
    }

    // MARK: closing

    /// Flushes what is queued, sends TLS close_notify, then ends the connection as `mode` and
    /// the socket allow (`finalStep`): closes at once, or half-closes and closes once the peer's
    /// EOF arrives (lingering close, so the peer reads our final response instead of a reset;
    /// bounded by 2 s).
    public func closeAfterFlush(_ mode: CloseMode = .linger) {
        switch phase {
        case .closed, .lingering, .flushingBeforeClose, .flushingAfterPeerEOF:
            return
        case .connecting, .handshaking, .open:
            break
        }
        if let tls {
            tls.shutdown()
            flushTLSOutput()
        }
        if pendingOutputBytes == 0 {
            finishClose(mode, afterWriteBeforeFIN: false)
        } else {
            phase = .flushingBeforeClose(mode)
            scheduleFlush()
        }
    }

    /// What is known of the socket's unread input now: in poller mode from the reads (and
    /// the batch being served: an event still to come there is input); with sources, where
    /// an event may wait on the queue unseen, from a peek (only when it can change the step).
    private func currentInput(for mode: CloseMode) -> InputKnowledge {
        if input == .ended { return .ended }
        if polled {
            return input == .drained && !loop.hasUndeliveredInput(fd: fd) ? .drained : .unknown
        }
        guard mode == .lingerIfInputPending, tls == nil else { return .unknown }
        let rc = sys.peek(fd)
        if rc == 0 { return .ended }
        return rc == -Int(EAGAIN) || rc == -Int(EWOULDBLOCK) ? .drained : .unknown
    }

    /// `afterWriteBeforeFIN`: the last output went out with `write(_:from:beforeFIN:)`, its last
    /// segment waiting for the FIN. A close(2) would send that FIN too, but if input arrived unseen in
    /// the meantime the kernel resets instead and drops the waiting segment: so the FIN goes
    /// out with shutdown(2) first, and such a late arrival meets the reset only after the answer
    /// left, as without the wait. After the peer's EOF nothing can arrive: close(2) alone.
    private func finishClose(_ mode: CloseMode, afterWriteBeforeFIN: Bool) {
        let known = currentInput(for: mode)
        if Self.finalStep(mode: mode, tls: tls != nil, input: known) == .close {
            if afterWriteBeforeFIN && known != .ended { sys.shutdownWrite(fd) }
            close()
            return
        }
        sys.shutdownWrite(fd)
        phase = .lingering
        let wasPaused = !pauseReasons.isEmpty
        pauseReasons = []
        if wasPaused { readsResumed() }
        // Bound the linger: at most 2 s more, on the loop's tick (a Dispatch timer per closing
        // connection cost a manager-thread wake-up each, docs/architecture.md §2.2).
        lingerDeadline = loop.now &+ 2_000_000_000
        loop.register(self)
    }

    /// Closes now: cancels both sources (resuming them first where suspended); the fd is closed
    /// in their cancel handlers (poller: at once; close(2) takes it out of the epoll set).
    public func close() {
        guard phase != .closed else { return }
        phase = .closed
        if lingerDeadline != 0 {
            lingerDeadline = 0
            loop.unregister(self)
        }
        if !polled {
            gates?.read.cancel()
            gates?.write.cancel()
        } else {
            loop.forgetPollable(fd: fd)  // close(2) leaves the epoll set: no EPOLL_CTL_DEL
            sys.closeFD(fd)
            descriptorClosed()
        }
        // Nothing is written once closed (every write checks the phase): the output buffer
        // goes to the loop's next connection, emptied.
        giveBackOutput()
        let d = delegate
        delegate = nil
        d?.channelClosed(self)
    }

    private func descriptorClosed() {
        guard let hook = onDescriptorClosed else { return }
        onDescriptorClosed = nil
        hook()
    }

    private func fail(_ error: ChannelError) {
        guard phase != .closed else { return }
        let d = delegate
        d?.channelError(self, error)
        close()
    }

    /// The negotiated ALPN protocol, when TLS is on.
    public var negotiatedALPN: String? { tls?.negotiatedALPN }
}

extension SocketChannel: LoopTimeoutable {
    /// The linger bound while `lingering`, else 0.
    public var deadline: UInt64 { lingerDeadline }
    public func deadlineExpired(now: UInt64) { close() }
}
