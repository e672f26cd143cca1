import Testing
@testable import BearerdProxyCore

/// docs/architecture.md §2.9: W3C `traceparent` parsing, the ratio sampler and the OTLP protobuf
/// encoding (read back here with a minimal independent wire-format reader; the end-to-end tests
/// decode it with opentelemetry-proto).
struct TracingTests {
    static let valid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

    @Test func parsesTheSpecExample() throws {
        let p = try #require(TraceParent.parse(Self.valid[...]))
        #expect(p.traceID == TraceID(high: 0x4bf9_2f35_77b3_4da6, low: 0xa3ce_929d_0e0e_4736))
        #expect(p.parentID == SpanID(0x00f0_67aa_0ba9_02b7))
        #expect(p.sampled)
        #expect(p.header == Self.valid)
        #expect(TraceParent.parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00")?.sampled == false)
    }

    @Test func refusesWhatW3CRefuses() {
        let bad = [
            "",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",  // uppercase
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  // zero trace id
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",  // zero parent id
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // version ff
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",  // version 00 is exactly 55
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",  // misplaced dash
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",  // a later version's extra field needs a dash
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902g7-01",
        ]
        for b in bad { #expect(TraceParent.parse(b[...]) == nil, "\(b)") }
        // A later version is read by its version-00 prefix.
        #expect(TraceParent.parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds")?.sampled == true)
    }

    @Test func samplerHonoursASampledParentThenTheRatio() {
        let id = TraceID(high: 1, low: 0x4000_0000_0000_0000)  // low 63 bits: exactly one half
        let sampledParent = TraceParent(traceID: id, parentID: SpanID(9), flags: 1)
        let unsampledParent = TraceParent(traceID: id, parentID: SpanID(9), flags: 0)
        let never = TraceSampler(ratio: 0)
        #expect(never.sample(parent: sampledParent, traceID: id))
        #expect(!never.sample(parent: unsampledParent, traceID: id))
        #expect(!never.sample(parent: nil, traceID: TraceID(high: 1, low: 0)))
        let always = TraceSampler(ratio: 1)
        #expect(always.sample(parent: nil, traceID: TraceID(high: 0, low: .max)))
        let half = TraceSampler(ratio: 0.5)
        #expect(!half.sample(parent: unsampledParent, traceID: id))
        #expect(half.sample(parent: nil, traceID: TraceID(high: 1, low: 0x3FFF_FFFF_FFFF_FFFF)))
        // The top bit of the low half is not looked at (63 bits, as OpenTelemetry's rule).
        #expect(half.sample(parent: nil, traceID: TraceID(high: 1, low: 0xBFFF_FFFF_FFFF_FFFF)))
        // Out-of-range ratios are clamped, never a trap.
        #expect(TraceSampler(ratio: .nan).threshold == 0)
        #expect(TraceSampler(ratio: 7).threshold == 1 << 63)
        // About one in a hundred over well-spread ids.
        let hundredth = TraceSampler(ratio: 0.01)
        var kept = 0
        for i in 1...100_000 where hundredth.sample(parent: nil, traceID: TraceID(high: 0, low: TraceIDMix.mix(UInt64(i) &* TraceIDMix.increment))) {
            kept += 1
        }
        #expect((800...1200).contains(kept), "\(kept)")
    }

    @Test func idsAreHexOfFixedWidth() {
        #expect(SpanID(0xAB).hex == "00000000000000ab")
        #expect(TraceID(high: 1, low: 2).hex == "00000000000000010000000000000002")
        #expect(TraceID(high: 1, low: 2).bytes == [0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2])
        #expect(TraceContext(traceID: TraceID(high: 1, low: 2), spanID: SpanID(3)).traceparent
                == "00-00000000000000010000000000000002-0000000000000003-01")
    }

    @Test func protobufWireFormat() {
        var w = ProtoWriter()
        w.varint(1, 300)
        #expect(w.bytes == [0x08, 0xAC, 0x02])
        w = ProtoWriter()
        w.varint(3, UInt64(bitPattern: -1), always: true)
        #expect(w.bytes == [0x18] + [UInt8](repeating: 0xFF, count: 9) + [0x01])
        w = ProtoWriter()
        w.fixed64(7, 0x0102_0304_0506_0708)
        #expect(w.bytes == [0x39, 8, 7, 6, 5, 4, 3, 2, 1])
        w = ProtoWriter()
        w.string(5, "hé")
        #expect(w.bytes == [0x2A, 3, 0x68, 0xC3, 0xA9])
        w = ProtoWriter()
        w.varint(2, 0)
        w.string(1, "")
        #expect(w.bytes.isEmpty)  // proto3 defaults are left out
    }

    @Test func exportRequestReadsBack() throws {
        let ctx = TraceContext(traceID: TraceID(high: 0x11, low: 0x22), spanID: SpanID(0x33), state: "vendor=1")
        let span = SpanRecord(context: ctx, parent: SpanID(0x44), name: "GET /api", kind: .server, start: 1_000, end: 3_000,
                              attributes: [TraceAttribute("http.route", "/api"), TraceAttribute("n", 7), TraceAttribute("b", true)],
                              events: [TraceEvent(name: "replay", time: 2_000)],
                              links: [TraceLink(traceID: TraceID(high: 5, low: 6), spanID: SpanID(7))],
                              status: .error("boom"))
        let bytes = OTLPEncoding.exportRequest([span], resource: [TraceAttribute("service.name", "bearerd")], scopeName: "bearerd",
                                               scopeVersion: "1", wallOffset: 1_700_000_000_000_000_000)
        // ExportTraceServiceRequest.resource_spans(1) → ResourceSpans.scope_spans(2) → ScopeSpans.spans(2)
        let resourceSpans = try #require(Wire.fields(bytes)[1]?.first?.bytes)
        let resource = try #require(Wire.fields(resourceSpans)[1]?.first?.bytes)
        let kv = try #require(Wire.fields(resource)[1]?.first?.bytes)
        #expect(Wire.string(Wire.fields(kv)[1]?.first) == "service.name")
        let scopeSpans = try #require(Wire.fields(resourceSpans)[2]?.first?.bytes)
        let scope = try #require(Wire.fields(scopeSpans)[1]?.first?.bytes)
        #expect(Wire.string(Wire.fields(scope)[1]?.first) == "bearerd")
        let spanBytes = try #require(Wire.fields(scopeSpans)[2]?.first?.bytes)
        let s = Wire.fields(spanBytes)
        #expect(s[1]?.first?.bytes == ctx.traceID.bytes)
        #expect(s[2]?.first?.bytes == SpanID(0x33).bytes)
        #expect(Wire.string(s[3]?.first) == "vendor=1")
        #expect(s[4]?.first?.bytes == SpanID(0x44).bytes)
        #expect(Wire.string(s[5]?.first) == "GET /api")
        #expect(s[6]?.first?.int == 2)  // SPAN_KIND_SERVER
        #expect(s[7]?.first?.int == 1_700_000_000_000_001_000)
        #expect(s[8]?.first?.int == 1_700_000_000_000_003_000)
        #expect(s[9]?.count == 3)
        let secondAttribute = try #require(s[9]?[1].bytes)
        let anyValue = try #require(Wire.fields(secondAttribute)[2]?.first?.bytes)
        let intValue = Wire.fields(anyValue)
        #expect(intValue[3]?.first?.int == 7)
        let eventBytes = try #require(s[11]?.first?.bytes)
        let event = Wire.fields(eventBytes)
        #expect(event[1]?.first?.int == 1_700_000_000_000_002_000)
        #expect(Wire.string(event[2]?.first) == "replay")
        let linkBytes = try #require(s[13]?.first?.bytes)
        let link = Wire.fields(linkBytes)
        #expect(link[2]?.first?.bytes == SpanID(7).bytes)
        let statusBytes = try #require(s[15]?.first?.bytes)
        let status = Wire.fields(statusBytes)
        #expect(Wire.string(status[2]?.first) == "boom")
        #expect(status[3]?.first?.int == 2)  // STATUS_CODE_ERROR
        #expect(s[16]?.first?.int == 1)
    }

    @Test func wallTimeSaturates() {
        #expect(OTLPEncoding.wallTime(.max, offset: .max) == UInt64(Int64.max))
        #expect(OTLPEncoding.wallTime(5, offset: -10) == 0)
        #expect(OTLPEncoding.wallTime(5, offset: 10) == 15)
    }
}

/// A minimal protobuf reader for the test (varint, fixed64, length-delimited, fixed32).
enum Wire {
    enum Value {
        case int(UInt64)
        case bytes([UInt8])
        var int: UInt64? { if case .int(let v) = self { return v } else { return nil } }
        var bytes: [UInt8]? { if case .bytes(let b) = self { return b } else { return nil } }
    }

    static func string(_ v: Value?) -> String? { v?.bytes.map { String(decoding: $0, as: UTF8.self) } }

    static func fields(_ b: [UInt8]) -> [Int: [Value]] {
        var out: [Int: [Value]] = [:]
        var i = 0
        func varint() -> UInt64 {
            var r: UInt64 = 0
            var shift: UInt64 = 0
            while i < b.count {
                let byte = b[i]
                i += 1
                r |= UInt64(byte & 0x7F) << shift
                if byte < 0x80 { break }
                shift += 7
            }
            return r
        }
        while i < b.count {
            let key = varint()
            let field = Int(key >> 3)
            switch key & 7 {
            case 0: out[field, default: []].append(.int(varint()))
            case 1:
                var v: UInt64 = 0
                for k in 0..<8 { v |= UInt64(b[i + k]) << (8 * UInt64(k)) }
                i += 8
                out[field, default: []].append(.int(v))
            case 2:
                let n = Int(varint())
                out[field, default: []].append(.bytes(Array(b[i..<i + n])))
                i += n
            case 5:
                var v: UInt64 = 0
                for k in 0..<4 { v |= UInt64(b[i + k]) << (8 * UInt64(k)) }
                i += 4
                out[field, default: []].append(.int(v))
            default: return out
            }
        }
        return out
    }
}
