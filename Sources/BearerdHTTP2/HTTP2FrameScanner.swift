/// A light scanner over the frames a client sends to a server (RFC 9113 §4.1), run before the
/// bytes reach nghttp2. It reads only frame headers (9 bytes: length, type, flags, stream id),
/// skips payloads, and keeps its state across reads, so a frame header split over two reads is
/// read whole. Pure: no I/O; its storage is bounded (allocated as it fills, never beyond).
///
/// What it checks (and nghttp2 1.52 does not):
/// - A HEADERS frame on a client stream id that is lower than one the client already opened and
///   that the client never opened itself is an "unexpected stream identifier" (RFC 9113 §5.1.1,
///   connection error PROTOCOL_ERROR; h2spec http2/5.1.1/2). nghttp2 ignores such a frame because
///   it cannot tell a skipped id from a stream that closed (a trailer HEADERS racing our
///   RST_STREAM is legal). The scanner can: it remembers the ids the client skipped, as ranges (a
///   client that opens 1, 3, 5, … skips nothing), the most recent `maxSkippedRanges` of them.
/// - A DATA or HEADERS frame on a stream the client itself already finished, by END_STREAM or
///   RST_STREAM, is STREAM_CLOSED (RFC 9113 §5.1, "half-closed (remote)" and "closed"; h2spec
///   http2/5.1/5, 6, 8, 9, 11, 12). The client knows its own side ended, so no race makes such a frame
///   legal, whatever we sent meanwhile; frames racing our own RST_STREAM on a stream the client
///   had not finished are left to nghttp2, which ignores them (RFC 9113 §5.4.2). nghttp2 answered
///   these with GOAWAY STREAM_CLOSED only while it kept the closed stream, which a server session
///   no longer does (`no_closed_streams`, so that a long-lived connection does not grow per
///   request). The scanner remembers the last `maxFinishedStreams` streams the client finished,
///   in the order they finished; a frame on one finished longer ago is left to nghttp2 (ignored,
///   as nghttp2 itself forgets closed streams beyond its limit).
/// Any other frame is left to nghttp2.
///
/// Owns: the client preface still to skip, the frame header being assembled, the payload bytes
/// still to skip, the highest client stream id seen in a HEADERS frame, the skipped ranges and the
/// finished streams. Invariants: `payloadLeft` ≤ 2^24 - 1; ids are 31-bit; `skipped` holds
/// disjoint ranges of odd ids, ascending, each below `highestOpened`, at most `maxSkippedRanges`
/// of them; `finished` holds distinct odd ids ≤ `highestOpened`, at most `maxFinishedStreams`,
/// the oldest at `finishedNext` once it is full.
public struct HTTP2FrameScanner: Sendable {
    /// How many ranges of skipped ids are remembered (older ones are forgotten: a HEADERS frame on
    /// one of those is then left to nghttp2, which ignores it).
    public static let maxSkippedRanges = 64
    /// How many streams the client finished are remembered (512 bytes at most).
    public static let maxFinishedStreams = 128

    /// Bytes of the client connection preface (RFC 9113 §3.4) not yet seen.
    private var prefaceLeft: Int
    /// Bytes of the current frame header read so far (0..<9).
    private var headerCount = 0
    private var header: (UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8, UInt8) = (0, 0, 0, 0, 0, 0, 0, 0, 0)
    /// Payload bytes of the current frame still to skip.
    private var payloadLeft = 0
    /// The highest odd stream id seen in a client HEADERS frame (0: none yet).
    public private(set) var highestOpened: UInt32 = 0
    /// Odd ids below `highestOpened` that the client never opened, as inclusive ranges.
    private var skipped: [(low: UInt32, high: UInt32)] = []
    /// Streams the client finished (END_STREAM or RST_STREAM seen), in the order they finished:
    /// a ring once full, `finishedNext` its oldest entry.
    private var finished: [UInt32] = []
    private var finishedNext = 0
    /// The last stream a DATA frame was found not finished on (0: none); dropped when that
    /// stream finishes. Spares the search for the frames of one body in a row.
    private var lastUnfinished: UInt32 = 0

    /// `expectPreface`: the input starts with the 24-byte client preface (server role).
    public init(expectPreface: Bool) {
        prefaceLeft = expectPreface ? 24 : 0
        skipped.reserveCapacity(Self.maxSkippedRanges)
    }

    /// The violation found in a scan.
    public struct Violation: Sendable, Equatable {
        /// Bytes of the scanned chunk before the offending frame (0 when its header began in an
        /// earlier chunk): only these may be handed to the engine.
        public var validPrefix: Int
        public var stream: UInt32
        /// The connection error it is (RFC 9113 §5.4.1).
        public var errorCode: HTTP2ErrorCode
    }

    /// How many finished streams are remembered now (never more than `maxFinishedStreams`).
    public var rememberedFinishedStreams: Int { finished.count }

    /// Scans one chunk of input. Returns nil when every frame header in it is acceptable, or the
    /// first violation (the scanner then stops: the connection is over).
    public mutating func scan(_ bytes: UnsafeRawBufferPointer) -> Violation? {
        let n = bytes.count
        var i = 0
        while i < n {
            if prefaceLeft > 0 {
                let k = min(prefaceLeft, n - i)
                prefaceLeft -= k
                i += k
                continue
            }
            if payloadLeft > 0 {
                let k = min(payloadLeft, n - i)
                payloadLeft -= k
                i += k
                continue
            }
            let b = bytes[i]
            switch headerCount {
            case 0: header.0 = b
            case 1: header.1 = b
            case 2: header.2 = b
            case 3: header.3 = b
            case 4: header.4 = b
            case 5: header.5 = b
            case 6: header.6 = b
            case 7: header.7 = b
            default: header.8 = b
            }
            headerCount += 1
            i += 1
            guard headerCount == 9 else { continue }
            headerCount = 0
            // 24-bit length: at most 16,777,215, no overflow.
            payloadLeft = Int(header.0) << 16 | Int(header.1) << 8 | Int(header.2)
            // DATA, HEADERS, RST_STREAM (RFC 9113 §6.1, §6.2, §6.4); other types pass.
            guard header.3 <= 0x3 && header.3 != 0x2 else { continue }
            let stream = UInt32(header.5 & 0x7F) << 24 | UInt32(header.6) << 16 | UInt32(header.7) << 8 | UInt32(header.8)
            if let code = check(type: header.3, flags: header.4, stream: stream) {
                return Violation(validPrefix: max(0, i - 9), stream: stream, errorCode: code)
            }
        }
        return nil
    }

    /// The connection error a DATA (0x0), HEADERS (0x1) or RST_STREAM (0x3) frame on `stream` is,
    /// or nil when it may go to the engine; records an opened or finished stream.
    private mutating func check(type: UInt8, flags: UInt8, stream: UInt32) -> HTTP2ErrorCode? {
        // Stream 0 and even ids are nghttp2's to refuse (RFC 9113 §5.1.1: a client uses odd ids).
        guard stream & 1 == 1 else { return nil }
        let isNew = type == 0x1 && stream > highestOpened
        if type == 0x1 && !acceptHeaders(stream: stream) { return .protocolError }
        // An id above every stream opened is idle, nghttp2's to refuse (RFC 9113 §5.1).
        guard stream <= highestOpened else { return nil }
        if type == 0x3 {
            if !isFinished(stream) { recordFinished(stream) }
            return nil
        }
        if !isNew && isFinished(stream) { return .streamClosed }
        if flags & 0x1 != 0 { recordFinished(stream) }  // END_STREAM
        return nil
    }

    private mutating func isFinished(_ stream: UInt32) -> Bool {
        if stream == lastUnfinished { return false }
        if finished.contains(stream) { return true }
        lastUnfinished = stream
        return false
    }

    /// Remembers that the client finished `stream` (not remembered yet), forgetting the oldest
    /// when full.
    private mutating func recordFinished(_ stream: UInt32) {
        if stream == lastUnfinished { lastUnfinished = 0 }
        if finished.count < Self.maxFinishedStreams {
            finished.append(stream)
        } else {
            finished[finishedNext] = stream
            finishedNext = finishedNext + 1 == Self.maxFinishedStreams ? 0 : finishedNext + 1
        }
    }

    /// Whether a HEADERS frame on `stream` (odd) may go to the engine; records a newly opened id.
    private mutating func acceptHeaders(stream: UInt32) -> Bool {
        if stream > highestOpened {
            // Odd ids between the previous highest and this one were skipped (and are now closed,
            // RFC 9113 §5.1.1). `stream` is odd and > highestOpened ≥ 0, so stream ≥ 1.
            let low: UInt32 = highestOpened == 0 ? 1 : highestOpened + 2
            if stream >= 2, low <= stream - 2 {
                if skipped.count == Self.maxSkippedRanges { skipped.removeFirst() }
                skipped.append((low, stream - 2))
            }
            highestOpened = stream
            return true
        }
        for r in skipped where stream >= r.low && stream <= r.high { return false }
        return true
    }
}
