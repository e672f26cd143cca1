/// OpenTelemetry traces, the pure part (docs/architecture.md §2.9): W3C Trace Context
/// (`traceparent`, `tracestate`), the sampling decision, span identifiers and the finished span
/// as data. No I/O, no clock: times are given (the loop's monotonic nanoseconds); the exporter
/// (BearerdSessions/TraceExporter.swift) turns them into wall-clock time and encodes them
/// (`OTLPEncoding`).
///
/// Written here rather than taken from swift-w3c-trace-context: the pure cores import nothing
/// (docs/architecture.md §2), the format is two fixed-width lines of hex (W3C Trace Context
/// §3.2, §3.3), and bearerd needs the trace id as two integers for the ratio decision.

/// A W3C trace id (16 bytes, big-endian halves). Never all zero when valid.
public struct TraceID: Sendable, Equatable, Hashable {
    public var high: UInt64
    public var low: UInt64
    public init(high: UInt64, low: UInt64) {
        self.high = high
        self.low = low
    }
    public var isValid: Bool { high != 0 || low != 0 }
    /// 32 lowercase hex digits.
    public var hex: String { TraceHex.hex(high) + TraceHex.hex(low) }
    /// The 16 bytes, big-endian.
    public var bytes: [UInt8] { TraceHex.bytes(high) + TraceHex.bytes(low) }
}

/// A W3C span id (8 bytes). Never zero when valid.
public struct SpanID: Sendable, Equatable, Hashable {
    public var value: UInt64
    public init(_ value: UInt64) { self.value = value }
    public var isValid: Bool { value != 0 }
    /// 16 lowercase hex digits.
    public var hex: String { TraceHex.hex(value) }
    public var bytes: [UInt8] { TraceHex.bytes(value) }
}

/// A parsed `traceparent` (W3C Trace Context §3.2): the caller's trace, its span, and whether
/// it sampled the trace.
public struct TraceParent: Sendable, Equatable {
    public var traceID: TraceID
    public var parentID: SpanID
    /// The `trace-flags` byte; bit 0 is `sampled`.
    public var flags: UInt8

    public init(traceID: TraceID, parentID: SpanID, flags: UInt8) {
        self.traceID = traceID
        self.parentID = parentID
        self.flags = flags
    }

    public var sampled: Bool { flags & 1 == 1 }

    /// `00-<trace-id>-<parent-id>-<flags>` (version 00, what bearerd sends): 55 bytes written
    /// once (string concatenation cost ~9,000 instructions per sampled request, measured).
    public var header: String {
        var out: [UInt8] = []
        out.reserveCapacity(55)
        out.append(UInt8(ascii: "0"))
        out.append(UInt8(ascii: "0"))
        out.append(UInt8(ascii: "-"))
        TraceHex.append(traceID.high, to: &out)
        TraceHex.append(traceID.low, to: &out)
        out.append(UInt8(ascii: "-"))
        TraceHex.append(parentID.value, to: &out)
        out.append(UInt8(ascii: "-"))
        out.append(UInt8(ascii: "0"))
        out.append(sampled ? UInt8(ascii: "1") : UInt8(ascii: "0"))
        return String(decoding: out, as: UTF8.self)
    }

    /// W3C Trace Context §3.2.2 and §4.3: version 00 is exactly 55 characters; a higher version
    /// (not `ff`) is read by its version-00 prefix when what follows starts with `-`. Hex is
    /// lowercase; an all-zero trace or parent id is invalid. nil: the header is ignored (the
    /// request starts a new trace).
    public static func parse(_ value: Substring) -> TraceParent? {
        let utf8 = value.utf8
        guard utf8.count >= 55 else { return nil }
        var bytes = utf8.makeIterator()
        // Fixed layout: 2 + 1 + 32 + 1 + 16 + 1 + 2.
        func hexField(_ count: Int) -> (UInt64, UInt64)? {
            var high: UInt64 = 0
            var low: UInt64 = 0
            for i in 0..<count {
                guard let b = bytes.next(), let d = TraceHex.digit(b) else { return nil }
                if count == 32 && i < 16 { high = high << 4 | UInt64(d) } else { low = low << 4 | UInt64(d) }
            }
            return (high, low)
        }
        func dash() -> Bool { bytes.next() == UInt8(ascii: "-") }
        guard let version = hexField(2)?.1, version != 0xFF, dash(),
              let trace = hexField(32), dash(),
              let parent = hexField(16)?.1, dash(),
              let flags = hexField(2)?.1 else { return nil }
        if version == 0 {
            guard utf8.count == 55 else { return nil }
        } else if utf8.count > 55 {
            // A future version may append fields, each after a dash.
            guard bytes.next() == UInt8(ascii: "-") else { return nil }
        }
        let id = TraceID(high: trace.0, low: trace.1)
        guard id.isValid, parent != 0 else { return nil }
        return TraceParent(traceID: id, parentID: SpanID(parent), flags: UInt8(truncatingIfNeeded: flags))
    }
}

/// Hex helpers for ids (lowercase, fixed width).
public enum TraceHex {
    public static func hex(_ v: UInt64) -> String {
        var out: [UInt8] = []
        out.reserveCapacity(16)
        append(v, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    /// The 16 lowercase hex digits of `v`, appended.
    @inline(__always)
    public static func append(_ v: UInt64, to out: inout [UInt8]) {
        var shift: UInt64 = 60
        while true {
            let d = UInt8(truncatingIfNeeded: (v >> shift) & 0xF)
            out.append(d < 10 ? d &+ 0x30 : d &+ 0x57)
            if shift == 0 { break }
            shift -= 4
        }
    }

    public static func bytes(_ v: UInt64) -> [UInt8] {
        (0..<8).map { UInt8(truncatingIfNeeded: v >> (56 - 8 * UInt64($0))) }
    }

    /// A lowercase hex digit's value (W3C Trace Context: uppercase is invalid).
    @inline(__always)
    static func digit(_ b: UInt8) -> UInt8? {
        switch b {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): return b &- UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): return b &- UInt8(ascii: "a") &+ 10
        default: return nil
        }
    }
}

/// The sampling rule of `tracing.sample_ratio` (docs/architecture.md §2.9): a caller's sampled
/// `traceparent` is honoured; otherwise the trace is kept when the low 63 bits of its trace id
/// fall under `ratio × 2^63` (OpenTelemetry's TraceIdRatioBased), so every service that uses
/// the same rule on the same trace decides alike. Immutable.
public struct TraceSampler: Sendable, Equatable {
    /// Kept when `traceID.low & (2^63 - 1) < threshold`; 0: never, 2^63: always.
    public let threshold: UInt64
    public let ratio: Double

    /// `ratio` in 0...1 (the config refuses anything else; clamped here all the same).
    public init(ratio: Double) {
        let r = ratio.isNaN ? 0 : min(max(ratio, 0), 1)
        self.ratio = r
        if r >= 1 {
            threshold = 1 << 63
        } else {
            // r < 1, so the product is below 2^63 and converts without trapping.
            threshold = UInt64(r * 9_223_372_036_854_775_808.0)
        }
    }

    /// Whether a trace is recorded: the parent's flag when it sampled, else the ratio on `traceID`.
    @inline(__always)
    public func sample(parent: TraceParent?, traceID: TraceID) -> Bool {
        if let parent, parent.sampled { return true }
        return traceID.low & 0x7FFF_FFFF_FFFF_FFFF < threshold
    }
}

/// A value of a span attribute (the OTLP `AnyValue` cases bearerd uses).
public enum TraceValue: Sendable, Equatable {
    case string(String)
    case int(Int64)
    case bool(Bool)
}

/// One attribute.
public struct TraceAttribute: Sendable, Equatable {
    public var key: String
    public var value: TraceValue
    public init(_ key: String, _ value: TraceValue) {
        self.key = key
        self.value = value
    }
    public init(_ key: String, _ value: String) { self.init(key, .string(value)) }
    public init(_ key: String, _ value: Int) { self.init(key, .int(Int64(clamping: value))) }
    public init(_ key: String, _ value: UInt64) { self.init(key, .int(Int64(clamping: value))) }
    public init(_ key: String, _ value: Bool) { self.init(key, .bool(value)) }
}

/// A timed event inside a span (a replay, a DPoP nonce retry).
public struct TraceEvent: Sendable, Equatable {
    public var name: String
    /// Monotonic nanoseconds (the clock the span's times use).
    public var time: UInt64
    public var attributes: [TraceAttribute]
    public init(name: String, time: UInt64, attributes: [TraceAttribute] = []) {
        self.name = name
        self.time = time
        self.attributes = attributes
    }
}

/// A link to another span (an exchange that joined a token request another trace started).
public struct TraceLink: Sendable, Equatable {
    public var traceID: TraceID
    public var spanID: SpanID
    public var attributes: [TraceAttribute]
    public init(traceID: TraceID, spanID: SpanID, attributes: [TraceAttribute] = []) {
        self.traceID = traceID
        self.spanID = spanID
        self.attributes = attributes
    }
}

/// OTLP `Span.SpanKind`.
public enum TraceSpanKind: UInt8, Sendable {
    case `internal` = 1, server = 2, client = 3
}

/// OTLP `Status`.
public enum TraceStatus: Sendable, Equatable {
    case unset
    case ok
    case error(String)
}

/// The trace a span belongs to and where it hangs: what a child span or a propagated
/// `traceparent` needs. `state`: the caller's `tracestate`, passed on unchanged.
public struct TraceContext: Sendable, Equatable {
    public var traceID: TraceID
    public var spanID: SpanID
    public var state: String?
    public init(traceID: TraceID, spanID: SpanID, state: String? = nil) {
        self.traceID = traceID
        self.spanID = spanID
        self.state = state
    }
    /// The `traceparent` for a request sent inside this span (always sampled: unsampled
    /// traces have no context).
    public var traceparent: String { TraceParent(traceID: traceID, parentID: spanID, flags: 1).header }
}

/// A finished span as data, handed to the exporter. Times are monotonic nanoseconds.
public struct SpanRecord: Sendable, Equatable {
    public var traceID: TraceID
    public var spanID: SpanID
    /// Zero: a root span.
    public var parentSpanID: SpanID
    public var traceState: String?
    public var name: String
    public var kind: TraceSpanKind
    public var start: UInt64
    public var end: UInt64
    public var attributes: [TraceAttribute]
    public var events: [TraceEvent]
    public var links: [TraceLink]
    public var status: TraceStatus

    public init(context: TraceContext, parent: SpanID, name: String, kind: TraceSpanKind, start: UInt64, end: UInt64,
                attributes: [TraceAttribute] = [], events: [TraceEvent] = [], links: [TraceLink] = [], status: TraceStatus = .unset) {
        traceID = context.traceID
        spanID = context.spanID
        parentSpanID = parent
        traceState = context.state
        self.name = name
        self.kind = kind
        self.start = start
        self.end = end
        self.attributes = attributes
        self.events = events
        self.links = links
        self.status = status
    }
}

/// SplitMix64 (Steele, Lea, Flood 2014) over a counter: span and trace ids that are unique and
/// well spread without a system call per request. Not for secrets. The caller owns the state
/// (the tracer keeps it in an atomic and passes each step's counter here).
public enum TraceIDMix {
    public static let increment: UInt64 = 0x9E37_79B9_7F4A_7C15

    @inline(__always)
    public static func mix(_ counter: UInt64) -> UInt64 {
        var z = counter
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        let r = z ^ (z >> 31)
        return r == 0 ? 1 : r
    }
}
