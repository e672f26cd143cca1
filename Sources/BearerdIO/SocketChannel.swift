import Dispatch
import CBearerdShim
#if canImport(Glibc)
import Glibc
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

/// Why a channel failed, classified for the 502/504 bodies of DESIGN §5.
public enum ChannelError: Error, CustomStringConvertible {
    case connect(IOError)
    case io(IOError)
    case tls(TLSError)
    case timeout(String)
    case protocolError(String)

    public var description: String {
        switch self {
        case .connect(let e): return "connect failed: \(e)"
        case .io(let e): return "\(e)"
        case .tls(let e): return "\(e)"
        case .timeout(let what): return "\(what) timed out"
        case .protocolError(let what): return what
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

/// A non-blocking stream socket on one loop: read and write Dispatch sources, an output buffer
/// with high/low-water marks, optional TLS (an OpenSSL memory-BIO engine between socket and owner).
///
/// Lives on `loop` only. Invariants: the fd is closed only in the sources' cancel handler, after
/// both sources are cancelled; each source's suspend count is tracked so cancel can resume it;
/// output is written directly, and the write source is armed only after EAGAIN.
public final class SocketChannel: LoopFlushable, LoopPollable, @unchecked Sendable {  // @unchecked: confined to `loop`
    public let loop: EventLoop
    public let fd: Int32
    public weak var delegate: ChannelDelegate?
    public var peerAddress: SocketAddress?

    /// Per-socket sources (`IOMode.socketSources`); nil when the loop poller serves this socket.
    private let readSource: DispatchSourceRead?
    private let writeSource: DispatchSourceWrite?
    private var polled: Bool { readSource == nil }
    /// Poller mode: the peer's FIN (or an error) arrived; a short read no longer means "nothing
    /// more", because edge-triggered polling will not report the EOF again.
    private var peerHungUp = false
    private var readSuspended = false
    private var writeArmed = false
    private var pauseReasons: ReadPauseReasons = []

    private var out: [UInt8] = []
    private var outOffset = 0
    private var flushScheduled = false
    private var aboveHighWater = false
    public var highWaterMark = 256 * 1024
    public var lowWaterMark = 64 * 1024

    private var tls: TLSEngine?
    private var tlsHandshakeDone = true
    private var connecting = false
    public private(set) var isClosed = false
    private var cancelsPending = 2
    /// Half-closed after a final response: discard input until EOF, then close.
    private var lingering = false
    private var closeWhenFlushed = false

    public init(fd: Int32, loop: EventLoop) {
        self.fd = fd
        self.loop = loop
        guard loop.ioMode == .socketSources else {
            readSource = nil
            writeSource = nil
            return
        }
        let readSource = DispatchSource.makeReadSource(fileDescriptor: fd, queue: loop.queue)
        let writeSource = DispatchSource.makeWriteSource(fileDescriptor: fd, queue: loop.queue)
        self.readSource = readSource
        self.writeSource = writeSource
        // Strong capture on purpose: the channel stays alive until both cancel handlers ran
        // (libdispatch releases the handlers after cancellation, breaking the cycle).
        let closeFD: () -> Void = { [fd] in
            self.cancelsPending -= 1
            if self.cancelsPending == 0 { Glibc.close(fd) }
        }
        readSource.setCancelHandler(handler: closeFD)
        writeSource.setCancelHandler(handler: closeFD)
    }

    /// Starts reading. Call once, on the loop, after setting the delegate.
    public func start() {
        loop.assertInEventLoop()
        guard let readSource, let writeSource else {
            loop.registerPollable(fd: fd, self)
            return
        }
        readSource.setEventHandler { [unowned self] in
            self.loop.runEvent { self.handleReadable() }
        }
        writeSource.setEventHandler { [unowned self] in
            self.loop.runEvent { self.handleWritable() }
        }
        readSource.resume()
        // The write source starts suspended; it is armed only on EAGAIN or during connect.
    }

    /// Opens a non-blocking connection to `address`; `channelActive` follows on success (after the
    /// TLS handshake when `tls` is given), `channelError(.connect)` on failure.
    public static func connect(to address: SocketAddress, loop: EventLoop, tls: TLSEngine?, delegate: ChannelDelegate) throws(IOError) -> SocketChannel {
        let fd = bearerd_stream_socket(address.family)
        if fd < 0 { throw IOError("socket", errno) }
        if address.family != AF_UNIX {
            Sys.setOption(fd, Int32(IPPROTO_TCP), TCP_NODELAY, 1)
        }
        let rc = address.withSockAddr { Glibc.connect(fd, $0, $1) }
        if rc < 0 && errno != EINPROGRESS {
            let e = errno
            Glibc.close(fd)
            throw IOError("connect", e)
        }
        let ch = SocketChannel(fd: fd, loop: loop)
        ch.delegate = delegate
        ch.peerAddress = address
        ch.tls = tls
        ch.tlsHandshakeDone = tls == nil
        ch.connecting = true
        ch.start()
        ch.armWrite()
        return ch
    }

    // MARK: reading

    public func pauseReading(_ reason: ReadPauseReasons) {
        guard !isClosed else { return }
        pauseReasons.insert(reason)
        if !readSuspended {
            readSuspended = true
            readSource?.suspend()
        }
    }

    public func resumeReading(_ reason: ReadPauseReasons) {
        guard !isClosed else { return }
        pauseReasons.remove(reason)
        if pauseReasons.isEmpty && readSuspended {
            readSuspended = false
            if let readSource {
                readSource.resume()
            } else {
                // Edge-triggered: data that arrived while paused raised no new event.
                loop.deferToEndOfEvent { [weak self] in self?.handleReadable() }
            }
        }
    }

    public var isReadPaused: Bool { !pauseReasons.isEmpty }

    private func handleReadable() {
        guard !isClosed else { return }
        if connecting {
            // A refused connect may be reported as readable (EPOLLERR/EPOLLHUP) rather than writable.
            if Sys.socketError(fd) != 0 { completeConnect() }
            return
        }
        let buf = loop.readBuffer
        // Drain until EAGAIN (DESIGN §2.2), bounded so one busy peer cannot starve the loop.
        var rounds = 0
        while !isClosed && pauseReasons.isEmpty {
            if rounds == 16 {
                // Edge-triggered polling raises no new event for data left behind: come back.
                if polled { loop.execute { [weak self] in self?.handleReadable() } }
                return
            }
            rounds += 1
            let result: Sys.IOResult
            do {
                result = try Sys.read(fd, buf)
            } catch {
                fail(.io(error))
                return
            }
            switch result {
            case .wouldBlock:
                return
            case .eof:
                if let tls {
                    tls.feedEOF()
                    deliverTLSPlaintext(tls, eof: true)
                } else if lingering {
                    close()
                } else {
                    delegate?.channelEOF(self)
                }
                return
            case .bytes(let n):
                let chunk = UnsafeRawBufferPointer(rebasing: buf[0..<n])
                if lingering { continue }
                if let tls {
                    tls.feedCiphertext(chunk)
                    deliverTLSPlaintext(tls, eof: false)
                } else {
                    delegate?.channelRead(self, chunk)
                }
                if n < buf.count && !peerHungUp { return }  // a short read means the socket is drained
            }
        }
    }

    private func deliverTLSPlaintext(_ tls: TLSEngine, eof: Bool) {
        if !tlsHandshakeDone {
            do {
                if try tls.handshake() == .complete {
                    tlsHandshakeDone = true
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
        while !isClosed {
            let r: TLSEngine.ReadResult
            do {
                r = try scratch.withUnsafeMutableBytes { try tls.readPlaintext(into: $0) }
            } catch {
                fail(.tls(error as? TLSError ?? TLSError(reason: "tls.protocol", message: "\(error)")))
                return
            }
            switch r {
            case .bytes(let n):
                scratch.withUnsafeBytes { delegate?.channelRead(self, UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
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
    public func write(_ bytes: UnsafeRawBufferPointer) {
        guard !isClosed else { return }
        if let tls {
            do { try tls.writePlaintext(bytes) } catch { fail(.tls(error)); return }
            compactIfNeeded()
            tls.drainCiphertext(into: &out)
        } else {
            compactIfNeeded()
            out.append(contentsOf: bytes)
        }
        scheduleFlush()
    }

    public func write(_ bytes: [UInt8]) {
        bytes.withUnsafeBytes { write($0) }
    }

    /// Moves a whole prepared buffer in when nothing is pending (no copy).
    public func write(taking bytes: inout [UInt8]) {
        if tls == nil && out.count == outOffset && !isClosed {
            swap(&out, &bytes)
            outOffset = 0
            bytes.removeAll(keepingCapacity: true)
            scheduleFlush()
        } else {
            write(bytes)
            bytes.removeAll(keepingCapacity: true)
        }
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
        guard !isClosed, !connecting else { return }
        if writeArmed { return }  // the write source will continue when the socket drains
        writeOut()
    }

    private func writeOut() {
        while outOffset < out.count {
            let r: Sys.IOResult
            do {
                r = try out.withUnsafeBytes { try Sys.write(fd, UnsafeRawBufferPointer(rebasing: $0[outOffset...])) }
            } catch {
                fail(.io(error as? IOError ?? IOError("send", EIO)))
                return
            }
            switch r {
            case .bytes(let n): outOffset += n
            case .wouldBlock, .eof:
                armWrite()
                return
            }
        }
        out.removeAll(keepingCapacity: out.capacity <= 1 << 20)
        outOffset = 0
        disarmWrite()
        afterDrain()
    }

    private func afterDrain() {
        if aboveHighWater && pendingOutputBytes <= lowWaterMark {
            aboveHighWater = false
            delegate?.channelWritable(self)
        }
        if closeWhenFlushed && pendingOutputBytes == 0 {
            closeWhenFlushed = false
            finishClose()
        }
    }

    private func armWrite() {
        if !writeArmed {
            writeArmed = true
            writeSource?.resume()
        }
    }

    private func disarmWrite() {
        if writeArmed {
            writeArmed = false
            writeSource?.suspend()
        }
    }

    /// Loop poller readiness (edge-triggered).
    public func pollerEvent(readable: Bool, writable: Bool, hangup: Bool) {
        if hangup { peerHungUp = true }
        if writable && (connecting || writeArmed) { handleWritable() }
        if readable && !isClosed && pauseReasons.isEmpty { handleReadable() }
    }

    private func handleWritable() {
        guard !isClosed else { return }
        if connecting {
            completeConnect()
            return
        }
        writeOut()
    }

    private func completeConnect() {
        if connecting {
            connecting = false
            let err = Sys.socketError(fd)
            if err != 0 {
                fail(.connect(IOError("connect", err)))
                return
            }
            disarmWrite()
            if let tls {
                do {
                    _ = try tls.handshake()
                } catch {
                    fail(.tls(error))
                    return
                }
                flushTLSOutput()
                writeOut()
            } else {
                delegate?.channelActive(self)
            }
        }
    }

    // MARK: closing

    /// Flushes what is queued, sends TLS close_notify, half-closes, then closes once the peer's
    /// EOF arrives (lingering close, so the peer reads our final response instead of a reset).
    /// The owner's `deadline` handling should call `close()` if the peer lingers too long.
    public func closeAfterFlush() {
        guard !isClosed else { return }
        if let tls {
            tls.shutdown()
            flushTLSOutput()
        }
        closeWhenFlushed = true
        if pendingOutputBytes == 0 {
            closeWhenFlushed = false
            finishClose()
        } else {
            scheduleFlush()
        }
    }

    private func finishClose() {
        shutdown(fd, Int32(SHUT_WR))
        lingering = true
        pauseReasons = []
        if readSuspended {
            readSuspended = false
            if let readSource {
                readSource.resume()
            } else {
                loop.deferToEndOfEvent { [weak self] in self?.handleReadable() }
            }
        }
        // Bound the linger: at most 2 s more.
        loop.schedule(after: .seconds(2)) { [weak self] in self?.close() }
    }

    /// Closes now: cancels both sources; the fd is closed in their cancel handlers.
    public func close() {
        guard !isClosed else { return }
        isClosed = true
        if let readSource, let writeSource {
            readSource.cancel()
            writeSource.cancel()
            if readSuspended { readSuspended = false; readSource.resume() }
            if !writeArmed { writeArmed = true; writeSource.resume() }
        } else {
            // Poller mode has no cancel handler: leave the epoll set, then close.
            loop.unregisterPollable(fd: fd)
            Glibc.close(fd)
        }
        let d = delegate
        delegate = nil
        d?.channelClosed(self)
    }

    private func fail(_ error: ChannelError) {
        guard !isClosed else { return }
        let d = delegate
        d?.channelError(self, error)
        close()
    }

    /// The negotiated ALPN protocol, when TLS is on.
    public var negotiatedALPN: String? { tls?.negotiatedALPN }
}
