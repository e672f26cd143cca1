/// A light scanner over the frames a client sends to a server (RFC 9113 §4.1), run before the
/// bytes reach nghttp2. It reads only frame headers (9 bytes: length, type, flags, stream id),
/// skips payloads, and keeps its state across reads, so a frame header split over two reads is
/// read whole. Pure: no I/O, no allocation after init.
///
/// What it checks (and nghttp2 1.52 does not): a HEADERS frame on a client stream id that is
/// lower than one the client already opened and that the client never opened itself is an
/// "unexpected stream identifier" (RFC 9113 §5.1.1, connection error PROTOCOL_ERROR; h2spec
/// http2/5.1.1/2). nghttp2 ignores such a frame because it cannot tell a skipped id from a stream
/// that closed (a trailer HEADERS racing our RST_STREAM is legal). The scanner can: it remembers
/// the ids the client skipped, as ranges (a client that opens 1, 3, 5, … skips nothing), the most
/// recent `maxSkippedRanges` of them. A HEADERS frame on a skipped id is the violation; any
/// other HEADERS frame is left to nghttp2 (which handles closed and half-closed streams).
///
/// Owns: the client preface still to skip, the frame header being assembled, the payload bytes
/// still to skip, the highest client stream id seen in a HEADERS frame and the skipped ranges.
/// Invariants: `payloadLeft` ≤ 2^24 - 1; ids are 31-bit; `skipped` holds disjoint ranges of odd
/// ids, ascending, each below `highestOpened`, at most `maxSkippedRanges` of them.
public struct HTTP2FrameScanner: Sendable {
    /// How many ranges of skipped ids are remembered (older ones are forgotten: a HEADERS frame on
    /// one of those is then left to nghttp2, which ignores it).
    public static let maxSkippedRanges = 64

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
    }

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
            guard header.3 == 0x1 else { continue }  // HEADERS (RFC 9113 §6.2)
            let stream = UInt32(header.5 & 0x7F) << 24 | UInt32(header.6) << 16 | UInt32(header.7) << 8 | UInt32(header.8)
            if !acceptHeaders(stream: stream) {
                return Violation(validPrefix: max(0, i - 9), stream: stream)
            }
        }
        return nil
    }

    /// Whether a HEADERS frame on `stream` may go to the engine; records a newly opened id.
    private mutating func acceptHeaders(stream: UInt32) -> Bool {
        // Stream 0 and even ids are nghttp2's to refuse (RFC 9113 §5.1.1: a client uses odd ids).
        guard stream & 1 == 1 else { return true }
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
