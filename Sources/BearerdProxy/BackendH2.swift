import BearerdHTTP
import BearerdHTTP2
import BearerdIO
import BearerdProxyCore
import BearerdConfig

/// One HTTP/2 connection to an upstream (ALPN `h2`, or prior-knowledge h2c), shared by every
/// exchange that holds one of its streams. Lives on its loop; listed in the pool while it can
/// take streams.
///
/// Owns the client-side `HTTP2Session` and the open `BackendH2Stream`s. Events from a read are
/// handed to the streams' exchanges; output is produced once per loop event. Received DATA is
/// given back to the server's window only when the stream's client is not over its high-water
/// mark (`BackendH2Stream.pauseReading`), so a slow client stalls its own stream, not the
/// connection. Deadlines: each stream's response timeout; while idle, a PING every
/// `pingInterval` (no ACK within `pingTimeout` closes it) and `idleTimeout` closes it.
///
/// Phases: `open` → GOAWAY received or sent → `goingAway` (no new streams; streams above the
/// server's last-stream-id were refused by nghttp2 and are retried by their exchanges on a new
/// connection) → `closed` once no stream is left.
final class BackendH2Connection: ChannelDelegate, LoopTimeoutable {
    let target: UpstreamTarget
    /// Strong: the loop's pool outlives its connections (no `unowned` check per access).
    let pool: BackendPool
    /// Its id in the pool's machine (set when the connection is handed to the pool).
    @exclusivity(unchecked) var poolID = BearerdProxyCore.BackendPool.ConnectionID(-1)
    let channel: SocketChannel
    let session: HTTP2Session
    @exclusivity(unchecked) private(set) var streams: [Int32: BackendH2Stream] = [:]

    enum Phase { case open, goingAway, closed }
    @exclusivity(unchecked) private(set) var phase: Phase = .open
    @exclusivity(unchecked) var deadline: UInt64 = 0
    @exclusivity(unchecked) private var idleSince: UInt64
    /// A PING is out and unanswered since this time (0: none).
    @exclusivity(unchecked) private var pingSentAt: UInt64 = 0
    @exclusivity(unchecked) private var flushScheduled = false
    @exclusivity(unchecked) private var out: [UInt8] = []

    static let pingInterval: UInt64 = 30_000_000_000
    static let pingTimeout: UInt64 = 10_000_000_000

    init(channel: SocketChannel, target: UpstreamTarget, pool: BackendPool) throws(HTTP2Error) {
        self.channel = channel
        self.target = target
        self.pool = pool
        var settings = HTTP2Settings()
        settings.initialWindowSize = 256 * 1024
        settings.connectionWindowSize = 8 << 20
        session = try HTTP2Session(role: .client, settings: settings)
        idleSince = monotonicNanos()
        channel.delegate = self
        pool.loop.register(self)
        armDeadline()
        flush()
    }

    var isIdle: Bool { streams.isEmpty && phase == .open }

    /// The server's SETTINGS_MAX_CONCURRENT_STREAMS as known now (RFC 9113 §6.5.2).
    var maxConcurrentStreams: Int { Int(clamping: session.remoteMaxConcurrentStreams) }

    /// Takes new requests at all (open, no GOAWAY); the concurrency limit is the pool machine's.
    var acceptsRequests: Bool { phase == .open && !channel.isClosed && session.acceptsRequests }

    func newStream(reused: Bool) -> BackendH2Stream {
        BackendH2Stream(connection: self, reused: reused)
    }

    // MARK: streams

    /// Opens the stream on the wire; nil when the connection can take no more.
    func open(_ stream: BackendH2Stream, fields: [HTTPField], endStream: Bool, sensitive: String?) -> Int32? {
        guard phase == .open else { return nil }
        do {
            let id = try session.submitRequest(fields, endStream: endStream, sensitive: sensitive)
            streams[id] = stream
            armDeadline()
            scheduleFlush()
            return id
        } catch {
            return nil
        }
    }

    func streamDone(_ id: Int32) {
        if streams.removeValue(forKey: id) != nil { pool.streamClosed(self) }
        if streams.isEmpty {
            idleSince = monotonicNanos()
            if phase == .goingAway { close() }
        }
        armDeadline()
    }

    func scheduleFlush() {
        guard !flushScheduled, phase != .closed else { return }
        flushScheduled = true
        pool.loop.deferToEndOfEvent { [self] in flush() }
    }

    func flush() {
        flushScheduled = false
        guard phase != .closed, !channel.isOverHighWater else { return }
        do {
            try session.produce(into: &out)
        } catch {
            fail(.protocolError("HTTP/2 session: \(error)"))
            return
        }
        if !out.isEmpty { channel.write(taking: &out) }
        if session.hasEvents { dispatch() }
        if session.isFinished { fail(.protocolError("the upstream's HTTP/2 session ended")) }
    }

    private func armDeadline() {
        var d: UInt64 = 0
        for (_, s) in streams where s.deadline > 0 && (d == 0 || s.deadline < d) { d = s.deadline }
        if streams.isEmpty {
            let idleEnd = idleSince &+ target.idleTimeout
            let ping = pingSentAt > 0 ? pingSentAt &+ Self.pingTimeout : idleSince &+ min(Self.pingInterval, target.idleTimeout / 2)
            d = min(idleEnd, ping)
        }
        deadline = d
    }

    /// A stream handed out never opened on the wire and is given back.
    func unopenedStreamDone() {
        pool.streamClosed(self)
    }

    func streamTouched(_ s: BackendH2Stream) {
        if deadline == 0 || s.deadline < deadline { deadline = s.deadline }
    }

    // MARK: events

    private func dispatch() {
        var touched: [BackendH2Stream] = []
        while session.hasEvents {
            for event in session.takeEvents() {
                switch event {
                case .headers(let id, let fields, let kind, let endStream):
                    guard let s = streams[id] else { continue }
                    s.received(headers: fields, kind: kind, endStream: endStream)
                    touched.append(s)
                case .data(let id, let bytes, let endStream):
                    guard let s = streams[id] else {
                        session.consumed(stream: id, count: bytes.count)
                        continue
                    }
                    s.received(data: bytes, endStream: endStream)
                    touched.append(s)
                case .streamClosed(let id, let code):
                    streams[id]?.closed(errorCode: code)
                    streamDone(id)
                case .goAway(let last, let code):
                    goingAway(lastStreamID: last, code: code)
                case .remoteSettings:
                    pool.settingsChanged(self)
                case .requestHeadRefused:
                    break  // server role only
                case .pingAck:
                    pingSentAt = 0
                    idleSince = monotonicNanos()
                    armDeadline()
                case .streamWritable(let id):
                    streams[id]?.writable()
                }
            }
        }
        // One read's worth delivered: heads still held back go out now.
        var seen = Set<ObjectIdentifier>()
        for s in touched where seen.insert(ObjectIdentifier(s)).inserted { s.readComplete() }
        scheduleFlush()
    }

    private func goingAway(lastStreamID: Int32, code: UInt32) {
        guard phase == .open else { return }
        phase = .goingAway
        pool.goingAway(self)
        if streams.isEmpty { close() }
    }

    // MARK: ChannelDelegate

    func channelRead(_ channel: SocketChannel, _ bytes: UnsafeRawBufferPointer) {
        do {
            try session.receive(bytes)
        } catch {
            dispatch()
            fail(.protocolError("invalid HTTP/2 from the upstream: \(error)"))
            return
        }
        dispatch()
    }

    func channelEOF(_ channel: SocketChannel) {
        fail(.protocolError("upstream closed the HTTP/2 connection"))
    }

    func channelError(_ channel: SocketChannel, _ error: ChannelError) {
        fail(error)
    }

    func channelWritable(_ channel: SocketChannel) {
        flush()
        for (_, s) in streams { s.writable() }
    }

    func channelClosed(_ channel: SocketChannel) {
        fail(.protocolError("upstream connection closed"))
        pool.loop.unregister(self)
    }

    func deadlineExpired(now: UInt64) {
        deadline = 0
        if streams.isEmpty {
            if pingSentAt > 0 && now >= pingSentAt &+ Self.pingTimeout {
                close()  // no PING ACK: the connection is dead
                return
            }
            if now >= idleSince &+ target.idleTimeout {
                close()
                return
            }
            if pingSentAt == 0 {
                pingSentAt = now
                session.ping()
                flush()
            }
            armDeadline()
            return
        }
        for (_, s) in streams where s.deadline > 0 && s.deadline <= now {
            s.timedOut()
        }
        armDeadline()
    }

    /// Leaves the pool and fails every stream with `error`; false when already closed.
    private func shutDown(failingStreamsWith error: ChannelError) -> Bool {
        guard phase != .closed else { return false }
        phase = .closed
        pool.forget(self)
        let all = streams
        streams.removeAll()
        for (_, s) in all { s.connectionFailed(error) }
        deadline = 0
        return true
    }

    /// Every stream fails with `error`; the connection closes.
    private func fail(_ error: ChannelError) {
        guard shutDown(failingStreamsWith: error) else { return }
        channel.close()
    }

    func close() {
        guard shutDown(failingStreamsWith: .protocolError("upstream connection closed")) else { return }
        session.goAway(error: .noError)
        var bye: [UInt8] = []
        try? session.produce(into: &bye)
        if !bye.isEmpty { channel.write(taking: &bye) }
        channel.closeAfterFlush()
    }
}

/// One request on a `BackendH2Connection`: the `UpstreamStream` of one exchange attempt.
/// Lives on the loop. Invariant: `delegate` is set while the exchange uses it; a stream never
/// carries a second request; a stream that never opened on the wire is given back to the pool
/// exactly once (`unopened` → `failed(nil)`), one that opened through the connection's
/// stream close (RFC 9113 §5.1).
final class BackendH2Stream: UpstreamStream {
    enum Phase {
        /// Handed out, its HEADERS not yet submitted.
        case unopened
        /// The request is on the wire as stream `id`; no response byte yet.
        case open(id: Int32)
        /// A response head or body arrived (a failure is no longer a clean retry).
        case responding(id: Int32)
        /// The response ended.
        case ended(id: Int32)
        /// Failed or reset before the response ended (nil: never opened).
        case failed(id: Int32?)
    }
    /// Strong: an exchange may hold its stream after the connection closed (and left the pool);
    /// calls then reach a closed connection, which ignores them, never a freed one. The cycle
    /// with `BackendH2Connection.streams` is broken when the stream leaves that table.
    let connection: BackendH2Connection
    let reused: Bool
    @exclusivity(unchecked) private(set) var phase: Phase = .unopened
    /// Strong, as `BackendConnection.delegate`: cleared when the exchange releases or closes the
    /// stream, or the stream fails or closes.
    @exclusivity(unchecked) var delegate: BackendConnectionDelegate?
    @exclusivity(unchecked) var deadline: UInt64 = 0
    /// Received DATA not yet returned to the server's window (the client is slow).
    @exclusivity(unchecked) private var unconsumed = 0
    @exclusivity(unchecked) private var paused = false

    init(connection: BackendH2Connection, reused: Bool) {
        self.connection = connection
        self.reused = reused
    }

    deinit {
        // Dropped without `release` or `close`: its slot on the connection is given back.
        if case .unopened = phase { connection.unopenedStreamDone() }
    }

    private var session: HTTP2Session { connection.session }

    /// The stream's id on the wire (nil: never opened).
    var streamID: Int32? {
        switch phase {
        case .unopened: return nil
        case .open(let id), .responding(let id), .ended(let id): return id
        case .failed(let id): return id
        }
    }

    /// The response ended, or the stream failed.
    private var isFinished: Bool {
        switch phase {
        case .ended, .failed: return true
        case .unopened, .open, .responding: return false
        }
    }

    private var responseSeen: Bool {
        if case .responding = phase { return true }
        return false
    }

    /// Moves to `phase` as the stream finishes; an unopened stream is given back to the pool.
    private func finish(_ next: Phase) {
        if case .unopened = phase { connection.unopenedStreamDone() }
        phase = next
    }
    var protocolName: String { "h2" }

    func assign(to delegate: BackendConnectionDelegate) {
        self.delegate = delegate
    }

    func sendHead(_ head: HTTPRequestHead, body: HTTP1BodyFraming, upgrade: Bool, teTrailers: Bool, credential: HTTPField?) {
        let authority = head.headers.first(.host) ?? connection.target.url.authority
        // Names as they are: the session lower-cases them as it encodes them.
        var fields = HTTP2HeaderMapping.requestFields(head, scheme: connection.target.url.scheme, authority: authority,
                                                      lowercasingNames: false)
        if let credential { Self.set(credential, in: &fields) }
        if teTrailers { fields.append(HTTPField(name: "te", value: "trailers")) }
        guard case .unopened = phase else { return }
        guard let id = connection.open(self, fields: fields, endStream: body == .none, sensitive: credential?.name) else {
            // The connection went away between acquire and send: nothing was processed.
            finish(.failed(id: nil))
            failLater(.protocolError("the upstream's HTTP/2 connection is going away"))
            return
        }
        phase = .open(id: id)
        touch()
    }

    /// `HTTPHeaders.set` on the outgoing fields (the head is not copied to change one field):
    /// the first field of that name (ASCII case-insensitive) takes the value and later ones go;
    /// none: appended.
    static func set(_ field: HTTPField, in fields: inout [HTTPField]) {
        var first: Int?
        var i = 0
        while i < fields.count {
            if asciiCaseInsensitiveEquals(fields[i].name, field.name) {
                if first == nil {
                    first = i
                    fields[i].value = field.value
                } else {
                    fields.remove(at: i)
                    continue
                }
            }
            i += 1
        }
        if first == nil { fields.append(field) }
    }

    func writeBody(_ raw: UnsafeRawBufferPointer) {
        guard let id = streamID else { return }
        session.sendData(stream: id, raw)
        connection.scheduleFlush()
    }

    func endBody(trailers: HTTPHeaders?) {
        guard let id = streamID else { return }
        session.endStream(stream: id, trailers: trailers.map(HTTP2HeaderMapping.trailerFields))
        connection.scheduleFlush()
    }

    var isOverHighWater: Bool {
        guard let id = streamID else { return false }
        return session.outboundBuffered(stream: id) >= HTTP2Session.highWater || connection.channel.isOverHighWater
    }

    func touch() {
        deadline = connection.pool.loop.now &+ connection.target.responseTimeout
        connection.streamTouched(self)
    }

    func pauseReading() { paused = true }

    func resumeReading() {
        paused = false
        if unconsumed > 0, let id = streamID {
            session.consumed(stream: id, count: unconsumed)
            unconsumed = 0
            connection.scheduleFlush()
        }
    }

    /// Gives back the connection window held for a paused reader (the stream is done with it).
    private func returnWindow() {
        guard unconsumed > 0, let id = streamID else { return }
        session.consumed(stream: id, count: unconsumed)
        unconsumed = 0
        connection.scheduleFlush()
    }

    func release() {
        returnWindow()
        delegate = nil
        guard let id = streamID else {
            finish(.failed(id: nil))
            return
        }
        if !isFinished {
            session.resetStream(id, error: .cancel)
            connection.scheduleFlush()
        }
    }

    func close() {
        returnWindow()
        delegate = nil
        guard let id = streamID else {
            finish(.failed(id: nil))
            return
        }
        if !isFinished || session.outboundBuffered(stream: id) > 0 {
            session.resetStream(id, error: .cancel)
            connection.scheduleFlush()
        }
    }

    func switchProtocols() -> [UInt8] { [] }
    func tunnelWrite(_ raw: UnsafeRawBufferPointer) {}
    func endTunnel() { close() }

    // MARK: from the connection

    func received(headers fields: [HTTPField], kind: HTTP2Event.HeadersKind, endStream: Bool) {
        guard let d = delegate else { return }
        switch kind {
        case .response, .informational:
            let head: HTTPResponseHead
            do {
                head = try HTTP2HeaderMapping.responseHead(from: fields)
            } catch {
                failNow(.protocolError("invalid upstream response: \(error)"))
                return
            }
            if case .open(let id) = phase { phase = .responding(id: id) }
            touch()
            if head.isInformational {
                d.backendResponseHead(head, framing: .none, endStream: false)
                return
            }
            let framing: HTTP1BodyFraming
            if endStream {
                framing = .none
            } else if let cl = head.headers["content-length"], let n = UInt64(cl) {
                framing = n == 0 ? .none : .contentLength(n)
            } else {
                framing = .chunked
            }
            d.backendResponseHead(head, framing: framing, endStream: endStream)
            if endStream { end(trailers: nil) }
        case .trailers:
            let trailers = try? HTTP2HeaderMapping.trailers(from: fields)
            end(trailers: trailers.flatMap { $0.count > 0 ? $0 : nil })
        case .request:
            failNow(.protocolError("a request from the upstream"))
        }
    }

    func received(data: [UInt8], endStream: Bool) {
        guard let d = delegate, let id = streamID else {
            if let id = streamID { session.consumed(stream: id, count: data.count) }
            return
        }
        if !data.isEmpty {
            if case .open = phase { phase = .responding(id: id) }
            touch()
            data.withUnsafeBytes { d.backendBody($0) }
            if paused {
                unconsumed = unconsumed &+ data.count
            } else {
                session.consumed(stream: id, count: data.count)
            }
        }
        if endStream { end(trailers: nil) }
    }

    private func end(trailers: HTTPHeaders?) {
        guard !isFinished, let id = streamID else { return }
        phase = .ended(id: id)
        deadline = 0
        delegate?.backendEnd(trailers: trailers)
    }

    func readComplete() {
        delegate?.backendReadComplete()
    }

    func writable() {
        delegate?.backendWritable()
    }

    /// The stream closed on the wire; before the response ended that is a failure (REFUSED_STREAM:
    /// not processed, safe to retry on another connection).
    func closed(errorCode: UInt32) {
        deadline = 0
        guard !isFinished, let d = delegate else { return }
        delegate = nil
        let seen = responseSeen
        finish(.failed(id: streamID))
        let refused = errorCode == HTTP2ErrorCode.refusedStream.rawValue
        d.backendFailed(.protocolError("the upstream reset the HTTP/2 stream (error \(errorCode))"),
                        reused: reused || refused, responseBytesSeen: refused ? false : seen, unprocessed: refused)
    }

    func connectionFailed(_ error: ChannelError) {
        deadline = 0
        guard !isFinished, let d = delegate else { return }
        delegate = nil
        let seen = responseSeen
        finish(.failed(id: streamID))
        d.backendFailed(error, reused: reused, responseBytesSeen: seen, unprocessed: false)
    }

    func timedOut() {
        deadline = 0
        if let id = streamID {
            session.resetStream(id, error: .cancel)
            connection.scheduleFlush()
        }
        failNow(.timeout("upstream response"))
    }

    private func failNow(_ error: ChannelError) {
        guard let d = delegate else { return }
        delegate = nil
        let seen = responseSeen
        if let id = streamID, !isFinished {
            session.resetStream(id, error: .protocolError)
            connection.scheduleFlush()
        }
        finish(.failed(id: streamID))
        d.backendFailed(error, reused: reused, responseBytesSeen: seen, unprocessed: false)
    }

    /// Reported after the current call returns (the exchange is in the middle of sending).
    private func failLater(_ error: ChannelError) {
        connection.pool.loop.deferToEndOfEvent { [weak self] in
            guard let self, let d = self.delegate else { return }
            self.delegate = nil
            d.backendFailed(error, reused: true, responseBytesSeen: false, unprocessed: true)
        }
    }
}
