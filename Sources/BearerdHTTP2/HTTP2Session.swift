import BearerdHTTP
import CNghttp2

/// An nghttp2 failure: a library error code (negative) and its message.
public struct HTTP2Error: Error, Sendable, Equatable, CustomStringConvertible {
    public var code: Int32
    public var message: String
    public init(code: Int32, message: String) {
        self.code = code
        self.message = message
    }
    init(_ rc: Int, _ what: String) {
        code = Int32(truncatingIfNeeded: rc)
        message = what + ": " + String(cString: nghttp2_strerror(Int32(truncatingIfNeeded: rc)))
    }
    public var description: String { message }
}

/// RFC 9113 §7 error codes.
public enum HTTP2ErrorCode: UInt32, Sendable {
    case noError = 0, protocolError = 1, internalError = 2, flowControlError = 3, settingsTimeout = 4, streamClosed = 5,
         frameSizeError = 6, refusedStream = 7, cancel = 8, compressionError = 9, connectError = 10, enhanceYourCalm = 11,
         inadequateSecurity = 12, http11Required = 13
}

/// What we advertise in our SETTINGS.
public struct HTTP2Settings: Sendable, Equatable {
    public var maxConcurrentStreams: UInt32 = 128
    /// Per-stream receive window (SETTINGS_INITIAL_WINDOW_SIZE): how much one stream may have in
    /// flight towards us before the application consumed it.
    public var initialWindowSize: UInt32 = 1 << 20
    /// Connection receive window (raised by WINDOW_UPDATE on stream 0 at start).
    public var connectionWindowSize: UInt32 = 16 << 20
    /// Bytes of one header block (names + values + 32 per field, RFC 9113 §6.5.2); more resets
    /// the stream.
    public var maxHeaderListSize: UInt32 = 64 * 1024
    /// RFC 8441 SETTINGS_ENABLE_CONNECT_PROTOCOL (server role).
    public var enableConnectProtocol: Bool = false
    /// Server role: most header fields in a request head (pseudo-header fields not counted, the
    /// `cookie` crumbs of RFC 9113 §8.2.3 counted once, as the one line HTTP/1.1 carries). A
    /// request over this or over `maxHeaderListSize` is reported as `.requestHeadRefused` (the
    /// owner answers 431, as for HTTP/1.1) instead of being forwarded. Not advertised.
    public var maxHeaderCount: Int = .max
    /// Server role: when a client that resets streams is closed (nil: never).
    public var streamResetBudget: StreamResetBudget?
    public init() {}
}

/// How many streams a client may end without an answer, by RST_STREAM or by opening one over
/// SETTINGS_MAX_CONCURRENT_STREAMS, before its connection is closed with GOAWAY
/// ENHANCE_YOUR_CALM (RFC 9113 §10.5: the "rapid reset" attack, CVE-2023-44487, where every reset
/// stream costs the server work and frees the client's concurrency slot at once). The client is
/// closed once, within one window of `windowNanos`, it reset more than `limit` streams and more
/// streams than it completed; a busy client that cancels some requests is never closed.
public struct StreamResetBudget: Sendable, Equatable {
    public var limit: Int = 200
    public var windowNanos: UInt64 = 10_000_000_000
    public init() {}
    public init(limit: Int, windowNanos: UInt64) {
        self.limit = limit
        self.windowNanos = windowNanos
    }
}

/// What a received frame meant, in order. Pseudo-header fields are included in `fields`.
public enum HTTP2Event: Sendable, Equatable {
    case headers(stream: Int32, fields: [HTTPField], kind: HeadersKind, endStream: Bool)
    /// DATA payload (copied). A DATA frame with END_STREAM adds `.data(stream, [], endStream: true)`.
    case data(stream: Int32, bytes: [UInt8], endStream: Bool)
    /// The stream closed (both ends done, or RST_STREAM either way, or refused after GOAWAY).
    case streamClosed(stream: Int32, errorCode: UInt32)
    case goAway(lastStreamID: Int32, errorCode: UInt32)
    /// The peer's SETTINGS arrived.
    case remoteSettings(maxConcurrentStreams: UInt32, enableConnectProtocol: Bool)
    case pingAck
    /// The stream's outbound buffer drained below `lowWater` after reaching `highWater`.
    case streamWritable(stream: Int32)
    /// Server role: a request head over `maxHeaderCount` or `maxHeaderListSize`; its fields were
    /// decoded (the HPACK state stays in step) and dropped. The stream is open: answer it (431).
    case requestHeadRefused(stream: Int32, limit: RequestHeadLimit, endStream: Bool)

    public enum HeadersKind: Sendable, Equatable { case request, response, informational, trailers }
    public enum RequestHeadLimit: Sendable, Equatable { case fieldCount, size }
}

/// One HTTP/2 connection's protocol state (RFC 9113), driven only through memory: bytes in with
/// `receive`, bytes out with `produce` (nghttp2's `mem_recv`/`mem_send`; Debian's 1.52 has no
/// `*2` variants). No sockets, no clock.
///
/// Owns the `nghttp2_session` (deleted in `deinit`) and, per stream, the outbound body bytes the
/// session's data source reads from. Callbacks only record events (`takeEvents`) and hand out
/// buffered bytes; the owner acts after `receive` returns. Flow control is manual
/// (`no_auto_window_update`): received DATA opens the windows again only when the owner calls
/// `consumed`, so a slow reader stalls its own stream, never the connection.
///
/// Server role, rules of our own on top of nghttp2's (each a connection or stream outcome that
/// nghttp2 1.52 gets wrong or leaves to us):
/// - Input first goes through an `HTTP2FrameScanner`: a HEADERS frame on a lower stream id the
///   client never opened ends the connection with PROTOCOL_ERROR (RFC 9113 §5.1.1); nghttp2
///   would ignore it. A DATA or HEADERS frame on a stream the client already finished (its
///   END_STREAM or RST_STREAM) ends the connection with STREAM_CLOSED (RFC 9113 §5.1), as
///   nghttp2 did while it kept closed streams; the scanner remembers the last
///   `HTTP2FrameScanner.maxFinishedStreams` of them (a bounded record, see below).
/// - SETTINGS_MAX_CONCURRENT_STREAMS is enforced here, a stream over it refused alone with
///   RST_STREAM REFUSED_STREAM (RFC 9113 §5.1.2). nghttp2 makes that a connection error
///   (PROTOCOL_ERROR, aborting every stream in flight) once our SETTINGS are acknowledged and
///   has no option to refuse instead, so its own limit is kept unlimited and the value we
///   advertise is written into our first SETTINGS frame as it leaves (`produce`).
/// - Request heads over `maxHeaderCount`/`maxHeaderListSize` are decoded (HPACK stays in step)
///   and reported as `.requestHeadRefused`, for the owner to answer 431.
/// - Streams the client ends unanswered are counted against `streamResetBudget`; over it the
///   connection ends with GOAWAY ENHANCE_YOUR_CALM (RFC 9113 §10.5), decided inside the read
///   that went over, so nothing after it is processed.
/// - A stream's state is freed when it closes, in nghttp2 (`no_closed_streams`) and here (its
///   entries in `outbound`, `peerOpen`, `refusedStreams`, `opened`): what a connection holds is
///   bounded by its open streams, however many it carried (plus the scanner's fixed-size record
///   of recently finished streams).
/// Not thread-safe: one owner, the connection's event loop. Its stored state is exempt from
/// run-time exclusivity checks (~30 per proxied request, measured): no access to one of them
/// overlaps another, callbacks from nghttp2 included.
public final class HTTP2Session {
    public enum Role: Sendable { case client, server }

    /// Per-stream outbound buffer bounds for the owner's backpressure (`streamWritable`).
    public static let highWater = 256 * 1024
    public static let lowWater = 64 * 1024
    /// Fields a received header block has room for before its array grows.
    static let usualFieldCount = 12

    public let role: Role
    public let settings: HTTP2Settings
    @exclusivity(unchecked) private var session: OpaquePointer?
    @exclusivity(unchecked) private var events: [HTTP2Event] = []
    /// Read and written only through `outboundEntry` and `setOutbound`.
    @exclusivity(unchecked) private var outbound: [Int32: Outbound] = [:]
    /// The last stream whose entry `outboundEntry` found, and that entry (nil: none known): the
    /// calls for one stream come in runs (its head, its data, its end, nghttp2 reading it), so
    /// most of them skip the dictionary's hashing. Invariant: `memoOutbound` is nil or is
    /// `outbound[memoStream]` (every write goes through `setOutbound`).
    @exclusivity(unchecked) private var memoStream: Int32 = 0
    @exclusivity(unchecked) private var memoOutbound: Outbound?

    /// `outbound[stream]`, from the memo when it is the last stream found.
    @inline(__always)
    private func outboundEntry(_ stream: Int32) -> Outbound? {
        if stream == memoStream, let o = memoOutbound { return o }
        guard let o = outbound[stream] else { return nil }
        memoStream = stream
        memoOutbound = o
        return o
    }

    /// `outbound[stream] = entry`; the memo of that stream is dropped (found again on next use).
    private func setOutbound(_ stream: Int32, _ entry: Outbound?) {
        outbound[stream] = entry
        if stream == memoStream { memoOutbound = nil }
    }
    /// The header block being received and its stream (0: none). One at a time: a header block
    /// is a HEADERS frame and the CONTINUATION frames right after it, with no other frame between
    /// them (RFC 9113 §6.10), so blocks never interleave.
    @exclusivity(unchecked) private var inbound = HeaderBlock()
    @exclusivity(unchecked) private var inboundStream: Int32 = 0
    /// Set by a callback when a Swift-side rule failed fatally (never thrown across C).
    @exclusivity(unchecked) private var fatal: HTTP2Error?
    /// Client role: streams we opened that have not closed.
    @exclusivity(unchecked) private var opened: Set<Int32> = []
    /// Server role: checks frame headers before nghttp2 sees them.
    @exclusivity(unchecked) private var scanner: HTTP2FrameScanner?
    /// Server role: client streams open (a request head began, not closed yet). Never more than
    /// `settings.maxConcurrentStreams`: a stream beyond goes to `refusedStreams` instead.
    @exclusivity(unchecked) private var peerOpen: Set<Int32> = []
    /// Server role: streams refused with REFUSED_STREAM; their close is not reported.
    @exclusivity(unchecked) private var refusedStreams: Set<Int32> = []
    /// Server role: the limit still to be written into our first SETTINGS frame.
    @exclusivity(unchecked) private var advertisedLimitPatch: UInt32?
    /// Why this engine ended the connection itself (nil: it did not).
    @exclusivity(unchecked) public private(set) var terminatedWith: HTTP2ErrorCode?
    /// The owner's clock at the last `receive(_:now:)` (monotonic nanoseconds), for the budget.
    @exclusivity(unchecked) private var now: UInt64 = 0
    @exclusivity(unchecked) private var budgetWindowStart: UInt64 = 0
    @exclusivity(unchecked) private var unansweredInWindow = 0
    @exclusivity(unchecked) private var completedInWindow = 0

    /// A stream's outbound body: a class, so the table's entry is changed in place (a struct
    /// copied out of the dictionary and written back copied its byte array on every append).
    final class Outbound {
        @exclusivity(unchecked) var bytes: [UInt8] = []
        @exclusivity(unchecked) var readIndex = 0
        @exclusivity(unchecked) var ended = false
        @exclusivity(unchecked) var trailers: [HTTPField]?
        /// RST_STREAM to send once the body ended (RFC 9113 §8.1: NO_ERROR asks a client to stop
        /// sending after a complete response).
        @exclusivity(unchecked) var resetAfter: HTTP2ErrorCode?
        /// nghttp2 was told `DEFERRED`: `resume_data` when more arrives.
        @exclusivity(unchecked) var deferred = false
        /// Went over `highWater`; a drain below `lowWater` reports `streamWritable`.
        @exclusivity(unchecked) var wasFull = false
        var count: Int { bytes.count - readIndex }
    }

    struct HeaderBlock {
        var fields: [HTTPField] = []
        var size = 0
        /// Server role, a request head: counted against `maxHeaderCount`, refused rather than
        /// reset when over a limit.
        var isRequest = false
        var count = 0
        var sawCookie = false
        /// Over a limit: the remaining fields are decoded and dropped.
        var overLimit: HTTP2Event.RequestHeadLimit?
        /// Refused for concurrency: fields dropped.
        var ignored = false
        /// The block's pseudo-header fields, seen as they arrived: what kind of head it is.
        var status: StatusClass = .none
        var sawMethod = false
        enum StatusClass { case none, informational, final }

        /// Adds one received field. False when the block is over `maxHeaderListSize` and is not
        /// a request head (the stream is then reset); a request head over a limit is marked
        /// `overLimit` instead and its remaining fields dropped.
        mutating func add(name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>, settings: HTTP2Settings) -> Bool {
            if ignored || overLimit != nil { return true }
            size = size.addingReportingOverflow(name.count &+ value.count &+ 32).partialValue
            if size > Int(settings.maxHeaderListSize) || size < 0 {
                guard isRequest else { return false }
                overLimit = .size
                fields = []
                return true
            }
            if name.first == 0x3A {  // a pseudo-header field
                if HTTP2FieldBytes.equals(name, ":status") && status == .none {
                    status = value.first == 0x31 ? .informational : .final  // "1xx"
                } else if HTTP2FieldBytes.equals(name, ":method") {
                    sawMethod = true
                }
            } else if isRequest {
                let isCookie = HTTP2FieldBytes.equals(name, "cookie")
                if !isCookie || !sawCookie { count += 1 }
                if isCookie { sawCookie = true }
                if count > settings.maxHeaderCount {
                    overLimit = .fieldCount
                    fields = []
                    return true
                }
            }
            fields.append(HTTPField(name: HTTP2FieldBytes.name(name), value: HTTP2FieldBytes.value(value)))
            return true
        }
    }

    public init(role: Role, settings: HTTP2Settings = HTTP2Settings()) throws(HTTP2Error) {
        self.role = role
        self.settings = settings
        var callbacks: OpaquePointer?
        guard nghttp2_session_callbacks_new(&callbacks) == 0, let callbacks else {
            throw HTTP2Error(code: -901, message: "out of memory")
        }
        defer { nghttp2_session_callbacks_del(callbacks) }
        nghttp2_session_callbacks_set_on_begin_headers_callback(callbacks, h2OnBeginHeaders)
        nghttp2_session_callbacks_set_on_header_callback(callbacks, h2OnHeader)
        nghttp2_session_callbacks_set_on_frame_recv_callback(callbacks, h2OnFrameRecv)
        nghttp2_session_callbacks_set_on_data_chunk_recv_callback(callbacks, h2OnDataChunk)
        nghttp2_session_callbacks_set_on_stream_close_callback(callbacks, h2OnStreamClose)

        var option: OpaquePointer?
        guard nghttp2_option_new(&option) == 0, let option else { throw HTTP2Error(code: -901, message: "out of memory") }
        defer { nghttp2_option_del(option) }
        nghttp2_option_set_no_auto_window_update(option, 1)
        // A server session keeps every closed client stream for RFC 7540's priority tree, up to
        // its local SETTINGS_MAX_CONCURRENT_STREAMS; ours is unlimited inside nghttp2 (see the
        // type's comment), so without this a long-lived connection (a gRPC channel) kept ~250
        // bytes per finished request until it closed. A frame on a stream that closed is then
        // ignored by nghttp2 (RFC 9113 §5.1 lets it arrive while our RST_STREAM is in flight);
        // DATA or HEADERS after the client's own END_STREAM/RST_STREAM, which no race makes legal,
        // is answered STREAM_CLOSED by the scanner (see the type's comment).
        nghttp2_option_set_no_closed_streams(option, 1)
        if role == .client {
            // Until the server's SETTINGS say otherwise (RFC 9113 §6.5.2: initially unlimited;
            // nghttp2's default is 100).
            nghttp2_option_set_peer_max_concurrent_streams(option, 100)
        }
        let me = Unmanaged.passUnretained(self).toOpaque()
        var s: OpaquePointer?
        let rc = role == .client
            ? nghttp2_session_client_new2(&s, callbacks, me, option)
            : nghttp2_session_server_new2(&s, callbacks, me, option)
        guard rc == 0, let s else { throw HTTP2Error(Int(rc), "nghttp2_session_new") }
        session = s

        // Server role: nghttp2's own limit stays unlimited (see the type's comment); the advertised
        // value replaces it on the wire.
        let engineLimit = role == .server ? UInt32.max : settings.maxConcurrentStreams
        if role == .server {
            scanner = HTTP2FrameScanner(expectPreface: true)
            if settings.maxConcurrentStreams != .max { advertisedLimitPatch = settings.maxConcurrentStreams }
        }
        var iv: [nghttp2_settings_entry] = [
            // First: `patchAdvertisedLimit` expects it there.
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS.rawValue), value: engineLimit),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_INITIAL_WINDOW_SIZE.rawValue), value: min(settings.initialWindowSize, 0x7FFF_FFFF)),
            nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_MAX_HEADER_LIST_SIZE.rawValue), value: settings.maxHeaderListSize),
        ]
        if role == .client {
            // A client never receives pushes (RFC 9113 §8.4).
            iv.append(nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_PUSH.rawValue), value: 0))
        }
        if role == .server && settings.enableConnectProtocol {
            iv.append(nghttp2_settings_entry(settings_id: Int32(NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL.rawValue), value: 1))
        }
        let src = iv.withUnsafeBufferPointer { nghttp2_submit_settings(s, UInt8(NGHTTP2_FLAG_NONE.rawValue), $0.baseAddress, $0.count) }
        guard src == 0 else { throw HTTP2Error(Int(src), "nghttp2_submit_settings") }
        let window = Int32(clamping: min(settings.connectionWindowSize, 0x7FFF_FFFF))
        let wrc = nghttp2_session_set_local_window_size(s, UInt8(NGHTTP2_FLAG_NONE.rawValue), 0, window)
        guard wrc == 0 else { throw HTTP2Error(Int(wrc), "nghttp2_session_set_local_window_size") }
    }

    deinit {
        if let session { nghttp2_session_del(session) }
    }

    // MARK: bytes in, bytes out

    /// Feeds bytes from the peer; events accumulate (`takeEvents`). Throws on a fatal error (bad
    /// client magic, flooding). Other connection errors (RFC 9113 §5.4.1) queue a GOAWAY and end
    /// `wantsRead`: the owner sends what `produce` yields and closes when `isFinished`.
    public func receive(_ bytes: UnsafeRawBufferPointer) throws(HTTP2Error) {
        guard let session, let base = bytes.baseAddress, bytes.count > 0, terminatedWith == nil else { return }
        // Only the bytes before a frame the scanner rejects reach nghttp2.
        let violation = scanner?.scan(bytes)
        let count = violation.map { min($0.validPrefix, bytes.count) } ?? bytes.count
        if count > 0 {
            let rc = nghttp2_session_mem_recv(session, base.assumingMemoryBound(to: UInt8.self), count)
            if let fatal { throw fatal }
            if rc < 0 { throw HTTP2Error(rc, "invalid HTTP/2 input") }
        }
        if let violation { terminate(violation.errorCode) }
    }

    /// `receive` with the owner's clock (monotonic nanoseconds), which the stream reset budget
    /// counts its window on.
    public func receive(_ bytes: UnsafeRawBufferPointer, now: UInt64) throws(HTTP2Error) {
        self.now = now
        try receive(bytes)
    }

    public func receive(_ bytes: [UInt8]) throws(HTTP2Error) {
        var failure: HTTP2Error?
        bytes.withUnsafeBytes { raw in
            do throws(HTTP2Error) { try receive(raw) } catch { failure = error }
        }
        if let failure { throw failure }
    }

    /// Returns and clears the events recorded so far, in order.
    public func takeEvents() -> [HTTP2Event] {
        defer { events.removeAll(keepingCapacity: true) }
        return events
    }

    /// Whether events are waiting.
    public var hasEvents: Bool { !events.isEmpty }

    /// Appends everything nghttp2 wants to send now to `out`.
    public func produce(into out: inout [UInt8]) throws(HTTP2Error) {
        guard let session else { return }
        let start = out.count
        defer {
            if let limit = advertisedLimitPatch, out.count > start {
                advertisedLimitPatch = nil
                Self.patchAdvertisedLimit(&out, from: start, limit: limit)
            }
        }
        while true {
            var data: UnsafePointer<UInt8>?
            let n = nghttp2_session_mem_send(session, &data)
            if let fatal { throw fatal }
            if n < 0 { throw HTTP2Error(n, "nghttp2_session_mem_send") }
            guard n > 0, let data else { return }
            out.append(contentsOf: UnsafeBufferPointer(start: data, count: n))
        }
    }

    public var wantsRead: Bool { session.map { nghttp2_session_want_read($0) != 0 } ?? false }
    public var wantsWrite: Bool { session.map { nghttp2_session_want_write($0) != 0 } ?? false }
    /// Neither side has anything left to do (GOAWAY exchanged and every stream closed).
    public var isFinished: Bool { !wantsRead && !wantsWrite }

    // MARK: submitting

    /// Client role: a request. Returns the new stream id. `endStream`: no body follows.
    /// `sensitive`: one more field name (besides authorization, cookie, …) sent never-indexed.
    public func submitRequest(_ fields: [HTTPField], endStream: Bool, sensitive: String? = nil) throws(HTTP2Error) -> Int32 {
        guard let session else { throw HTTP2Error(code: -902, message: "session closed") }
        // After GOAWAY (either way) no new stream may be opened (RFC 9113 §6.8).
        guard nghttp2_session_check_request_allowed(session) != 0 else {
            throw HTTP2Error(code: Int32(NGHTTP2_ERR_START_STREAM_NOT_ALLOWED.rawValue), message: "the connection is going away")
        }
        let id: Int32 = withHeaderArray(fields, sensitive: sensitive) { nva, count in
            if endStream {
                return nghttp2_submit_request(session, nil, nva, count, nil, nil)
            }
            var provider = Self.provider()
            return nghttp2_submit_request(session, nil, nva, count, &provider, nil)
        }
        guard id > 0 else { throw HTTP2Error(Int(id), "nghttp2_submit_request") }
        opened.insert(id)
        if !endStream { setOutbound(id, Outbound()) }
        return id
    }

    /// Server role: a response head (`:status` first). 1xx heads are informational (no END_STREAM).
    public func submitResponse(stream: Int32, _ fields: [HTTPField], endStream: Bool) throws(HTTP2Error) {
        guard let session else { throw HTTP2Error(code: -902, message: "session closed") }
        let informational = fields.first.map { $0.value.utf8.first == 0x31 && $0.name == ":status" } ?? false  // "1xx"
        let rc: Int32 = withHeaderArray(fields) { nva, count in
            if informational {
                return nghttp2_submit_headers(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), stream, nil, nva, count, nil)
            }
            if endStream {
                return nghttp2_submit_response(session, stream, nva, count, nil)
            }
            var provider = Self.provider()
            return nghttp2_submit_response(session, stream, nva, count, &provider)
        }
        guard rc >= 0 else { throw HTTP2Error(Int(rc), "nghttp2_submit_response") }
        if !informational && !endStream && outboundEntry(stream) == nil { setOutbound(stream, Outbound()) }
    }

    /// Queues body bytes on a stream whose head was submitted without END_STREAM.
    public func sendData(stream: Int32, _ bytes: UnsafeRawBufferPointer) {
        guard bytes.count > 0, let o = outboundEntry(stream), !o.ended else { return }
        o.bytes.append(contentsOf: bytes)
        if o.count >= Self.highWater { o.wasFull = true }
        let resume = o.deferred
        o.deferred = false
        if resume, let session { nghttp2_session_resume_data(session, stream) }
    }

    /// Ends the stream's body: END_STREAM on the last DATA frame, or a trailing HEADERS frame
    /// with END_STREAM when `trailers` is non-empty.
    /// `resetAfter`: an RST_STREAM with that code follows the last frame (the client's side of a
    /// stream answered before its request ended, e.g. a refused extended CONNECT).
    public func endStream(stream: Int32, trailers: [HTTPField]?, resetAfter: HTTP2ErrorCode? = nil) {
        guard let o = outboundEntry(stream), !o.ended else { return }
        o.ended = true
        o.resetAfter = resetAfter
        if let trailers, !trailers.isEmpty { o.trailers = trailers }
        let resume = o.deferred
        o.deferred = false
        if resume, let session { nghttp2_session_resume_data(session, stream) }
    }

    /// Bytes queued on the stream that nghttp2 has not taken yet.
    public func outboundBuffered(stream: Int32) -> Int { outboundEntry(stream)?.count ?? 0 }

    /// The application forwarded `count` received DATA bytes of `stream`: open the stream's and
    /// the connection's windows again.
    public func consumed(stream: Int32, count: Int) {
        guard let session, count > 0 else { return }
        _ = nghttp2_session_consume(session, stream, count)
    }

    public func resetStream(_ stream: Int32, error: HTTP2ErrorCode) {
        guard let session else { return }
        setOutbound(stream, nil)
        _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), stream, error.rawValue)
    }

    /// GOAWAY with the last stream the peer opened that we processed (or `lastStreamID`).
    public func goAway(error: HTTP2ErrorCode = .noError, lastStreamID: Int32? = nil) {
        guard let session else { return }
        let last = lastStreamID ?? nghttp2_session_get_last_proc_stream_id(session)
        _ = nghttp2_submit_goaway(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), last, error.rawValue, nil, 0)
    }

    /// Sends a PING (keep-alive); its ACK comes back as `.pingAck`.
    public func ping() {
        guard let session else { return }
        _ = nghttp2_submit_ping(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), nil)
    }

    public var remoteMaxConcurrentStreams: UInt32 {
        session.map { nghttp2_session_get_remote_settings($0, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS) } ?? 0
    }

    public var peerEnablesConnectProtocol: Bool {
        session.map { nghttp2_session_get_remote_settings($0, NGHTTP2_SETTINGS_ENABLE_CONNECT_PROTOCOL) == 1 } ?? false
    }

    /// Streams we opened (client role) that are not closed yet.
    public var openStreamCount: Int { opened.count }

    /// Whether nghttp2 still holds state for `stream` (open, or closed and kept), and how many
    /// entries the per-stream tables here hold: what a long-lived connection keeps.
    var retainedState: (nghttp2Knows: (Int32) -> Bool, swiftEntries: Int) {
        let s = session
        return ({ id in s.map { nghttp2_session_find_stream($0, id) != nil } ?? false },
                outbound.count + opened.count + peerOpen.count + refusedStreams.count)
    }

    /// Server role: how many streams the client finished the scanner remembers (at most
    /// `HTTP2FrameScanner.maxFinishedStreams`).
    var rememberedFinishedStreams: Int { scanner?.rememberedFinishedStreams ?? 0 }

    /// Whether the session accepts new requests at all (client role): no GOAWAY received or
    /// sent, not closing. The peer's concurrency limit is not counted here.
    public var acceptsRequests: Bool {
        guard let session else { return false }
        return nghttp2_session_check_request_allowed(session) != 0
    }

    /// Whether another request can be submitted now (client role): below the peer's limit and
    /// no GOAWAY received.
    public var canOpenStream: Bool {
        guard let session else { return false }
        return nghttp2_session_check_request_allowed(session) != 0
            && UInt32(clamping: opened.count) < nghttp2_session_get_remote_settings(session, NGHTTP2_SETTINGS_MAX_CONCURRENT_STREAMS)
    }

    // MARK: helpers

    /// Writes `limit` as the value of the SETTINGS_MAX_CONCURRENT_STREAMS entry of the SETTINGS
    /// frame at `start` (our first frame, RFC 9113 §6.5.1), where nghttp2 wrote `UInt32.max`. Checks
    /// every byte it relies on and leaves the output alone when the frame is not as expected (the
    /// limit is then still enforced, only not advertised).
    static func patchAdvertisedLimit(_ out: inout [UInt8], from start: Int, limit: UInt32) {
        guard start >= 0, out.count - start >= 15 else { return }
        let length = Int(out[start]) << 16 | Int(out[start + 1]) << 8 | Int(out[start + 2])
        guard out[start + 3] == 0x4, out[start + 4] == 0, out[start + 5 ..< start + 9].allSatisfy({ $0 == 0 }),
              length >= 6, length % 6 == 0, out.count - start - 9 >= length else { return }
        var entry = start + 9
        while entry + 6 <= start + 9 + length {
            if out[entry] == 0, out[entry + 1] == 0x3, out[entry + 2 ..< entry + 6].allSatisfy({ $0 == 0xFF }) {
                out[entry + 2] = UInt8(truncatingIfNeeded: limit >> 24)
                out[entry + 3] = UInt8(truncatingIfNeeded: limit >> 16)
                out[entry + 4] = UInt8(truncatingIfNeeded: limit >> 8)
                out[entry + 5] = UInt8(truncatingIfNeeded: limit)
                return
            }
            entry += 6
        }
    }

    /// Ends the connection from our side: GOAWAY with `code`, nothing more is read (nghttp2
    /// ignores further input, `wantsRead` turns false and `isFinished` once the GOAWAY is out).
    private func terminate(_ code: HTTP2ErrorCode) {
        guard terminatedWith == nil, let session else { return }
        terminatedWith = code
        _ = nghttp2_session_terminate_session(session, code.rawValue)
    }

    /// A client stream ended without an answer (reset by the client, or refused): counts
    /// against the budget, and ends the connection when over it.
    private func countUnanswered() {
        guard let budget = settings.streamResetBudget, terminatedWith == nil else { return }
        rollBudgetWindow(budget)
        unansweredInWindow = unansweredInWindow.addingReportingOverflow(1).overflow ? .max : unansweredInWindow + 1
        if unansweredInWindow > budget.limit && unansweredInWindow > completedInWindow {
            terminate(.enhanceYourCalm)
        }
    }

    private func countCompleted() {
        guard let budget = settings.streamResetBudget else { return }
        rollBudgetWindow(budget)
        completedInWindow = completedInWindow.addingReportingOverflow(1).overflow ? .max : completedInWindow + 1
    }

    private func rollBudgetWindow(_ budget: StreamResetBudget) {
        // A clock that went backwards (or the first call) starts a new window too.
        if now < budgetWindowStart || now - budgetWindowStart >= budget.windowNanos {
            budgetWindowStart = now
            unansweredInWindow = 0
            completedInWindow = 0
        }
    }

    private static func provider() -> nghttp2_data_provider {
        nghttp2_data_provider(source: nghttp2_data_source(fd: 0), read_callback: h2ReadData)
    }

    /// Calls `body` with an `nghttp2_nv` array for `fields` (names lower-cased; credentials sent
    /// never-indexed, STYLE 9). nghttp2 copies the fields during the call.
    private func withHeaderArray<R>(_ fields: [HTTPField], sensitive extra: String? = nil, _ body: (UnsafePointer<nghttp2_nv>, Int) -> R) -> R {
        // One pass to size the bytes, one to lay them out: no String, array or dictionary is made
        // per field (the names are lower-cased while copied, the credential names found by bytes).
        var total = 0
        for i in fields.indices { total = total &+ fields[i].name.utf8.count &+ fields[i].value.utf8.count }
        var extraName = extra ?? ""
        return extraName.withUTF8 { extraBytes in
            withUnsafeTemporaryAllocation(of: UInt8.self, capacity: max(total, 1)) { storage in
                withUnsafeTemporaryAllocation(of: nghttp2_nv.self, capacity: max(fields.count, 1)) { nva in
                    // Force unwraps: both allocations have a capacity of at least 1.
                    let base = storage.baseAddress!
                    let nv = nva.baseAddress!
                    var at = 0
                    var n = 0
                    for i in fields.indices {
                        let nameStart = at
                        at = HTTP2FieldBytes.copy(fields[i].name, lowercased: true, into: storage, at: at)
                        let valueStart = at
                        at = HTTP2FieldBytes.copy(fields[i].value, lowercased: false, into: storage, at: at)
                        let name = UnsafeBufferPointer(start: base + nameStart, count: valueStart - nameStart)
                        let sensitive = HTTP2FieldBytes.isCredential(name)
                            || (extra != nil && HTTP2FieldBytes.equalsIgnoringCase(name, extraBytes))
                        (nv + n).initialize(to: nghttp2_nv(
                            name: base + nameStart, value: base + valueStart,
                            namelen: valueStart - nameStart, valuelen: at - valueStart,
                            flags: UInt8(sensitive ? NGHTTP2_NV_FLAG_NO_INDEX.rawValue : NGHTTP2_NV_FLAG_NONE.rawValue)))
                        n += 1
                    }
                    if n == 0 { nv.initialize(to: nghttp2_nv(name: base, value: base, namelen: 0, valuelen: 0, flags: 0)) }
                    return body(nv, n)
                }
            }
        }
    }

    // MARK: callbacks (record only)

    fileprivate func beginHeaders(_ stream: Int32, category: nghttp2_headers_category) {
        var block = HeaderBlock()
        // Room for a usual head at once (growing 1, 2, 4, 8 cost an allocation each).
        block.fields.reserveCapacity(Self.usualFieldCount)
        if role == .server && category == NGHTTP2_HCAT_REQUEST {
            block.isRequest = true
            if peerOpen.count >= Int(settings.maxConcurrentStreams) {
                // RFC 9113 §5.1.2: over the advertised limit, this stream alone is refused (the
                // RST_STREAM goes out once its header block is decoded, in `frameReceived`).
                block.ignored = true
                refusedStreams.insert(stream)
            } else {
                peerOpen.insert(stream)
            }
        }
        inbound = block
        inboundStream = stream
    }

    /// Returns false when the block is over `maxHeaderListSize` (the stream is then reset).
    fileprivate func header(_ stream: Int32, name: UnsafeBufferPointer<UInt8>, value: UnsafeBufferPointer<UInt8>) -> Bool {
        if inboundStream != stream {
            // No begin-headers callback for this stream (never expected): a fresh block.
            inbound = HeaderBlock()
            inboundStream = stream
        }
        // One in-place access: the block's fields are appended to, never copied.
        guard inbound.add(name: name, value: value, settings: settings) else {
            inbound = HeaderBlock()
            inboundStream = 0
            return false
        }
        return true
    }

    fileprivate func frameReceived(_ frame: UnsafePointer<nghttp2_frame>) {
        let hd = frame.pointee.hd
        let endStream = hd.flags & UInt8(NGHTTP2_FLAG_END_STREAM.rawValue) != 0
        switch UInt32(hd.type) {
        case NGHTTP2_HEADERS.rawValue:
            var block: HeaderBlock?
            if inboundStream == hd.stream_id {
                block = inbound
                inbound = HeaderBlock()
                inboundStream = 0
            }
            if block?.ignored == true, let session {
                _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), hd.stream_id,
                                              HTTP2ErrorCode.refusedStream.rawValue)
                countUnanswered()
                return
            }
            if let limit = block?.overLimit {
                events.append(.requestHeadRefused(stream: hd.stream_id, limit: limit, endStream: endStream))
                return
            }
            let fields = block?.fields ?? []
            let kind: HTTP2Event.HeadersKind
            switch block?.status ?? .none {
            case .informational: kind = .informational
            case .final: kind = .response
            case .none: kind = block?.sawMethod == true ? .request : .trailers
            }
            events.append(.headers(stream: hd.stream_id, fields: fields, kind: kind, endStream: endStream))
        case NGHTTP2_DATA.rawValue:
            if endStream { events.append(.data(stream: hd.stream_id, bytes: [], endStream: true)) }
        case NGHTTP2_GOAWAY.rawValue:
            events.append(.goAway(lastStreamID: frame.pointee.goaway.last_stream_id, errorCode: frame.pointee.goaway.error_code))
        case NGHTTP2_SETTINGS.rawValue:
            if hd.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) == 0 {
                events.append(.remoteSettings(maxConcurrentStreams: remoteMaxConcurrentStreams, enableConnectProtocol: peerEnablesConnectProtocol))
            }
        case NGHTTP2_PING.rawValue:
            if hd.flags & UInt8(NGHTTP2_FLAG_ACK.rawValue) != 0 { events.append(.pingAck) }
        case NGHTTP2_RST_STREAM.rawValue:
            // A client stream reset before it completed (it leaves `peerOpen` here, so its close
            // does not count as completed).
            if peerOpen.remove(hd.stream_id) != nil { countUnanswered() }
        default:
            break
        }
    }

    fileprivate func dataChunk(_ stream: Int32, _ bytes: UnsafeBufferPointer<UInt8>) {
        events.append(.data(stream: stream, bytes: Array(bytes), endStream: false))
    }

    fileprivate func streamClosed(_ stream: Int32, _ code: UInt32) {
        setOutbound(stream, nil)
        if inboundStream == stream {
            inbound = HeaderBlock()
            inboundStream = 0
        }
        switch role {
        case .client:
            opened.remove(stream)
        case .server:
            // The owner never saw a refused stream.
            if !refusedStreams.isEmpty && refusedStreams.remove(stream) != nil { return }
            if peerOpen.remove(stream) != nil && code == HTTP2ErrorCode.noError.rawValue { countCompleted() }
        }
        events.append(.streamClosed(stream: stream, errorCode: code))
    }

    /// The data source of every stream: copies buffered body bytes into nghttp2's frame buffer.
    fileprivate func readData(_ stream: Int32, into buf: UnsafeMutablePointer<UInt8>, length: Int,
                              flags: UnsafeMutablePointer<UInt32>) -> Int {
        guard let o = outboundEntry(stream) else {
            // Nothing known of this stream (reset meanwhile): end it.
            flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
            return 0
        }
        let n = min(length, o.count)
        if n > 0 {
            o.bytes.withUnsafeBufferPointer { src in
                // Force unwrap: n > 0, so the array is non-empty.
                buf.update(from: src.baseAddress! + o.readIndex, count: n)
            }
            o.readIndex += n
            if o.readIndex == o.bytes.count {
                // An ended body, all taken, is dropped with its stream's entry below.
                if !o.ended {
                    o.bytes.removeAll(keepingCapacity: o.bytes.capacity <= Self.highWater * 2)
                    o.readIndex = 0
                }
            } else if o.readIndex >= 64 * 1024 && o.readIndex * 2 >= o.bytes.count {
                o.bytes.removeSubrange(0..<o.readIndex)
                o.readIndex = 0
            }
            if o.wasFull && o.count < Self.lowWater {
                o.wasFull = false
                events.append(.streamWritable(stream: stream))
            }
        }
        if o.count == 0 {
            if o.ended {
                flags.pointee |= NGHTTP2_DATA_FLAG_EOF.rawValue
                if let trailers = o.trailers, let session {
                    flags.pointee |= NGHTTP2_DATA_FLAG_NO_END_STREAM.rawValue
                    let rc: Int32 = withHeaderArray(trailers) { nva, count in nghttp2_submit_trailer(session, stream, nva, count) }
                    if rc != 0 { fatal = HTTP2Error(Int(rc), "nghttp2_submit_trailer") }
                }
                if let code = o.resetAfter, let session {
                    // Queued behind the frame being written now (and the trailers).
                    _ = nghttp2_submit_rst_stream(session, UInt8(NGHTTP2_FLAG_NONE.rawValue), stream, code.rawValue)
                }
                setOutbound(stream, nil)
                return n
            }
            if n == 0 {
                o.deferred = true
                return Int(NGHTTP2_ERR_DEFERRED.rawValue)
            }
        }
        return n
    }
}

// MARK: - C callbacks (find the session through user_data; record and return)

@inline(__always)
private func owner(_ user: UnsafeMutableRawPointer?) -> HTTP2Session? {
    guard let user else { return nil }
    return Unmanaged<HTTP2Session>.fromOpaque(user).takeUnretainedValue()
}

private let h2OnBeginHeaders: nghttp2_on_begin_headers_callback = { _, frame, user in
    guard let frame, let s = owner(user) else { return 0 }
    s.beginHeaders(frame.pointee.hd.stream_id, category: frame.pointee.headers.cat)
    return 0
}

private let h2OnHeader: nghttp2_on_header_callback = { _, frame, name, namelen, value, valuelen, _, user in
    guard let frame, let s = owner(user) else { return 0 }
    let ok = s.header(frame.pointee.hd.stream_id, name: UnsafeBufferPointer(start: name, count: name == nil ? 0 : namelen),
                      value: UnsafeBufferPointer(start: value, count: value == nil ? 0 : valuelen))
    // Over the header list limit: nghttp2 resets the stream (RFC 9113 §8.2: a stream error).
    return ok ? 0 : NGHTTP2_ERR_TEMPORAL_CALLBACK_FAILURE.rawValue
}

private let h2OnFrameRecv: nghttp2_on_frame_recv_callback = { _, frame, user in
    guard let frame, let s = owner(user) else { return 0 }
    s.frameReceived(frame)
    return 0
}

private let h2OnDataChunk: nghttp2_on_data_chunk_recv_callback = { _, _, stream, data, len, user in
    guard let s = owner(user) else { return 0 }
    s.dataChunk(stream, UnsafeBufferPointer(start: data, count: data == nil ? 0 : len))
    return 0
}

private let h2OnStreamClose: nghttp2_on_stream_close_callback = { _, stream, code, user in
    guard let s = owner(user) else { return 0 }
    s.streamClosed(stream, code)
    return 0
}

private let h2ReadData: nghttp2_data_source_read_callback = { _, stream, buf, length, flags, _, user in
    guard let s = owner(user), let buf, let flags else { return Int(NGHTTP2_ERR_CALLBACK_FAILURE.rawValue) }
    return s.readData(stream, into: buf, length: length, flags: flags)
}
