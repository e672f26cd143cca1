/// OTLP/HTTP protobuf encoding of finished spans (docs/architecture.md §2.9): the protobuf wire
/// format (varints, fixed64/fixed32, length-delimited fields) of the few messages an export
/// needs, written by hand instead of generated swift-protobuf types (no dependency, no code
/// generator in the build). Field numbers are opentelemetry-proto's (v1):
///
/// - `ExportTraceServiceRequest { repeated ResourceSpans resource_spans = 1; }`
/// - `ResourceSpans { Resource resource = 1; repeated ScopeSpans scope_spans = 2; }`
/// - `Resource { repeated KeyValue attributes = 1; }`
/// - `ScopeSpans { InstrumentationScope scope = 1; repeated Span spans = 2; }`
/// - `InstrumentationScope { string name = 1; string version = 2; }`
/// - `Span { bytes trace_id = 1; bytes span_id = 2; string trace_state = 3; bytes parent_span_id = 4;
///   string name = 5; SpanKind kind = 6; fixed64 start_time_unix_nano = 7; fixed64 end_time_unix_nano = 8;
///   repeated KeyValue attributes = 9; repeated Event events = 11; repeated Link links = 13;
///   Status status = 15; fixed32 flags = 16; }`
/// - `Span.Event { fixed64 time_unix_nano = 1; string name = 2; repeated KeyValue attributes = 3; }`
/// - `Span.Link { bytes trace_id = 1; bytes span_id = 2; repeated KeyValue attributes = 4; fixed32 flags = 6; }`
/// - `Status { string message = 2; StatusCode code = 3; }`
/// - `KeyValue { string key = 1; AnyValue value = 2; }`
/// - `AnyValue { string string_value = 1; bool bool_value = 2; int64 int_value = 3; }`
///
/// Tested against the real decoder (opentelemetry-proto from PyPI) by the end-to-end tests.
public enum OTLPEncoding {
    /// `ExportTraceServiceRequest` bytes for `spans`, all of one resource and scope.
    /// `wallOffset`: add to a span's monotonic nanoseconds to get Unix nanoseconds (saturating).
    public static func exportRequest(_ spans: [SpanRecord], resource: [TraceAttribute], scopeName: String, scopeVersion: String,
                                     wallOffset: Int64) -> [UInt8] {
        var scope = ProtoWriter()
        scope.string(1, scopeName)
        scope.string(2, scopeVersion)
        var scopeSpans = ProtoWriter()
        scopeSpans.message(1, scope)
        for span in spans { scopeSpans.message(2, encode(span, wallOffset: wallOffset)) }
        var res = ProtoWriter()
        for a in resource { res.keyValue(1, a) }
        var resourceSpans = ProtoWriter()
        resourceSpans.message(1, res)
        resourceSpans.message(2, scopeSpans)
        var request = ProtoWriter()
        request.message(1, resourceSpans)
        return request.bytes
    }

    /// Unix nanoseconds of a monotonic reading (0 for the impossible negative result).
    @inline(__always)
    public static func wallTime(_ monotonic: UInt64, offset: Int64) -> UInt64 {
        let m = Int64(clamping: monotonic)
        let (sum, overflow) = m.addingReportingOverflow(offset)
        if overflow { return offset > 0 ? UInt64(Int64.max) : 0 }
        return sum < 0 ? 0 : UInt64(sum)
    }

    static func encode(_ s: SpanRecord, wallOffset: Int64) -> ProtoWriter {
        var w = ProtoWriter()
        w.reserve(256 + 48 * s.attributes.count)
        w.id(1, s.traceID.high, s.traceID.low)
        w.id(2, s.spanID.value)
        if let state = s.traceState, !state.isEmpty { w.string(3, state) }
        if s.parentSpanID.isValid { w.id(4, s.parentSpanID.value) }
        w.string(5, s.name)
        w.varint(6, UInt64(s.kind.rawValue))
        w.fixed64(7, wallTime(s.start, offset: wallOffset))
        w.fixed64(8, wallTime(max(s.end, s.start), offset: wallOffset))
        for a in s.attributes { w.keyValue(9, a) }
        for e in s.events {
            var ev = ProtoWriter()
            ev.fixed64(1, wallTime(e.time, offset: wallOffset))
            ev.string(2, e.name)
            for a in e.attributes { ev.keyValue(3, a) }
            w.message(11, ev)
        }
        for l in s.links {
            var link = ProtoWriter()
            link.id(1, l.traceID.high, l.traceID.low)
            link.id(2, l.spanID.value)
            for a in l.attributes { link.keyValue(4, a) }
            link.fixed32(6, 0x100)  // SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, not remote
            w.message(13, link)
        }
        switch s.status {
        case .unset: break
        case .ok:
            var st = ProtoWriter()
            st.varint(3, 1)
            w.message(15, st)
        case .error(let message):
            var st = ProtoWriter()
            if !message.isEmpty { st.string(2, message) }
            st.varint(3, 2)
            w.message(15, st)
        }
        // W3C trace flags (sampled) and "has is_remote" with is_remote for a caller's parent is not
        // known here: only the sampled bit.
        w.fixed32(16, 1)
        return w
    }

}

/// Protobuf wire-format writer (varint, 64-bit, length-delimited, 32-bit). Proto3 defaults
/// (0, empty) are omitted unless `always` (a oneof member must be present to be set).
public struct ProtoWriter: Sendable {
    public private(set) var bytes: [UInt8] = []
    public init() {}

    mutating func tag(_ field: UInt32, _ wireType: UInt8) {
        rawVarint(UInt64(field) << 3 | UInt64(wireType))
    }

    public mutating func rawVarint(_ v: UInt64) {
        var x = v
        while x >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: x) | 0x80)
            x >>= 7
        }
        bytes.append(UInt8(truncatingIfNeeded: x))
    }

    public mutating func varint(_ field: UInt32, _ v: UInt64, always: Bool = false) {
        guard v != 0 || always else { return }
        tag(field, 0)
        rawVarint(v)
    }

    public mutating func fixed64(_ field: UInt32, _ v: UInt64) {
        tag(field, 1)
        for i in 0..<8 { bytes.append(UInt8(truncatingIfNeeded: v >> (8 * UInt64(i)))) }
    }

    public mutating func fixed32(_ field: UInt32, _ v: UInt32) {
        tag(field, 5)
        for i in 0..<4 { bytes.append(UInt8(truncatingIfNeeded: v >> (8 * UInt32(i)))) }
    }

    public mutating func bytes(_ field: UInt32, _ b: [UInt8]) {
        tag(field, 2)
        rawVarint(UInt64(b.count))
        bytes.append(contentsOf: b)
    }

    public mutating func string(_ field: UInt32, _ s: String, always: Bool = false) {
        guard !s.isEmpty || always else { return }
        tag(field, 2)
        rawVarint(UInt64(s.utf8.count))
        bytes.append(contentsOf: s.utf8)
    }

    public mutating func message(_ field: UInt32, _ m: ProtoWriter) {
        bytes(field, m.bytes)
    }

    public mutating func reserve(_ n: Int) { bytes.reserveCapacity(bytes.count + n) }

    /// Bytes of `UInt64`s, big-endian (trace and span ids), without an intermediate array.
    mutating func id(_ field: UInt32, _ high: UInt64, _ low: UInt64) {
        tag(field, 2)
        rawVarint(16)
        bigEndian(high)
        bigEndian(low)
    }

    mutating func id(_ field: UInt32, _ value: UInt64) {
        tag(field, 2)
        rawVarint(8)
        bigEndian(value)
    }

    private mutating func bigEndian(_ w: UInt64) {
        for i in 0..<8 { bytes.append(UInt8(truncatingIfNeeded: w >> (56 - 8 * UInt64(i)))) }
    }

    static func varintSize(_ v: UInt64) -> Int {
        var n = 1
        var x = v
        while x >= 0x80 { x >>= 7; n += 1 }
        return n
    }

    /// `KeyValue { key = 1; AnyValue value = 2 }` written in place: the nested lengths are
    /// computed, so no intermediate buffers (those cost ~16,000 instructions per span, measured).
    mutating func keyValue(_ field: UInt32, _ a: TraceAttribute) {
        let keyCount = a.key.utf8.count
        let anyCount: Int
        var text = 0
        switch a.value {
        case .string(let s):
            text = s.utf8.count
            anyCount = 1 + Self.varintSize(UInt64(text)) + text
        case .bool: anyCount = 2
        case .int(let i): anyCount = 1 + Self.varintSize(UInt64(bitPattern: i))
        }
        let kvCount = 1 + Self.varintSize(UInt64(keyCount)) + keyCount + 1 + Self.varintSize(UInt64(anyCount)) + anyCount
        tag(field, 2)
        rawVarint(UInt64(kvCount))
        string(1, a.key, always: true)
        tag(2, 2)
        rawVarint(UInt64(anyCount))
        switch a.value {
        case .string(let s): string(1, s, always: true)
        case .bool(let b): varint(2, b ? 1 : 0, always: true)
        case .int(let i): varint(3, UInt64(bitPattern: i), always: true)
        }
    }
}
