import Testing
import BearerdHTTP
@testable import BearerdHTTP2

/// Raw client frames (RFC 9113 §4.1) for what a well-behaved client engine never sends.
enum Frames {
    static let preface = Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8)

    static func frame(type: UInt8, flags: UInt8, stream: UInt32, _ payload: [UInt8]) -> [UInt8] {
        let n = payload.count
        return [UInt8(truncatingIfNeeded: n >> 16), UInt8(truncatingIfNeeded: n >> 8), UInt8(truncatingIfNeeded: n), type, flags,
                UInt8(truncatingIfNeeded: stream >> 24), UInt8(truncatingIfNeeded: stream >> 16),
                UInt8(truncatingIfNeeded: stream >> 8), UInt8(truncatingIfNeeded: stream)] + payload
    }

    static func settings(_ entries: [(UInt16, UInt32)] = []) -> [UInt8] {
        var p: [UInt8] = []
        for (id, v) in entries {
            p += [UInt8(id >> 8), UInt8(id & 0xFF), UInt8(v >> 24), UInt8((v >> 16) & 0xFF), UInt8((v >> 8) & 0xFF), UInt8(v & 0xFF)]
        }
        return frame(type: 0x4, flags: 0, stream: 0, p)
    }

    static let settingsAck = frame(type: 0x4, flags: 0x1, stream: 0, [])

    /// A GET for `path` from the HPACK static table plus literals never indexed (RFC 7541 §6.2.2),
    /// so any number of them can be sent without a dynamic table.
    static func headers(stream: UInt32, path: String = "/", endStream: Bool = true, extra: [(String, String)] = []) -> [UInt8] {
        var block: [UInt8] = [0x82, 0x86]  // :method GET, :scheme http
        func literal(_ v: String) -> [UInt8] { [UInt8(v.utf8.count)] + Array(v.utf8) }  // values < 127 bytes
        block += [0x04] + literal(path)  // :path, name index 4
        block += [0x01] + literal("localhost")  // :authority, name index 1
        for (n, v) in extra { block += [0x00] + literal(n) + literal(v) }
        return frame(type: 0x1, flags: 0x4 | (endStream ? 0x1 : 0), stream: stream, block)
    }

    /// Trailers (END_STREAM) with one field.
    static func trailers(stream: UInt32) -> [UInt8] {
        frame(type: 0x1, flags: 0x5, stream: stream, [0x00, 1, 0x74, 1, 0x31])  // "t: 1"
    }

    static func data(stream: UInt32, _ bytes: [UInt8], endStream: Bool) -> [UInt8] {
        frame(type: 0x0, flags: endStream ? 0x1 : 0, stream: stream, bytes)
    }

    static func rst(stream: UInt32, code: UInt32 = 8) -> [UInt8] {
        frame(type: 0x3, flags: 0, stream: stream, [UInt8(code >> 24), UInt8((code >> 16) & 0xFF), UInt8((code >> 8) & 0xFF), UInt8(code & 0xFF)])
    }

    struct Parsed: Equatable {
        var type: UInt8
        var flags: UInt8
        var stream: UInt32
        var payload: [UInt8]
        /// GOAWAY and RST_STREAM: the error code.
        var errorCode: UInt32? {
            let at = type == 0x7 ? 4 : type == 0x3 ? 0 : -1
            guard at >= 0, payload.count >= at + 4 else { return nil }
            return payload[at..<at + 4].reduce(0) { $0 << 8 | UInt32($1) }
        }
        /// SETTINGS: the value of `id`.
        func setting(_ id: UInt16) -> UInt32? {
            guard type == 0x4 else { return nil }
            var i = 0
            while i + 6 <= payload.count {
                if UInt16(payload[i]) << 8 | UInt16(payload[i + 1]) == id {
                    return payload[i + 2..<i + 6].reduce(0) { $0 << 8 | UInt32($1) }
                }
                i += 6
            }
            return nil
        }
    }

    /// Whole frames in `bytes` (a trailing partial frame is left out).
    static func parse(_ bytes: [UInt8]) -> [Parsed] {
        var out: [Parsed] = []
        var i = 0
        while i + 9 <= bytes.count {
            let len = Int(bytes[i]) << 16 | Int(bytes[i + 1]) << 8 | Int(bytes[i + 2])
            guard i + 9 + len <= bytes.count else { break }
            let stream = UInt32(bytes[i + 5] & 0x7F) << 24 | UInt32(bytes[i + 6]) << 16 | UInt32(bytes[i + 7]) << 8 | UInt32(bytes[i + 8])
            out.append(Parsed(type: bytes[i + 3], flags: bytes[i + 4], stream: stream, payload: Array(bytes[i + 9..<i + 9 + len])))
            i += 9 + len
        }
        return out
    }
}

/// A server engine fed raw client bytes.
final class RawServer {
    let server: HTTP2Session
    var events: [HTTP2Event] = []
    var wire: [UInt8] = []

    init(_ settings: HTTP2Settings = HTTP2Settings()) throws {
        server = try HTTP2Session(role: .server, settings: settings)
        try drain()
    }

    /// Feeds `bytes` in pieces of `chunk` bytes (0: at once), collecting events and output.
    func feed(_ bytes: [UInt8], chunk: Int = 0, now: UInt64 = 0) throws {
        let step = chunk > 0 ? chunk : max(1, bytes.count)
        var i = 0
        while i < bytes.count {
            let piece = Array(bytes[i..<min(bytes.count, i + step)])
            try piece.withUnsafeBytes { try server.receive($0, now: now) }
            events += server.takeEvents()
            i += step
        }
        try drain()
    }

    func drain() throws {
        var out: [UInt8] = []
        try server.produce(into: &out)
        wire += out
        events += server.takeEvents()
    }

    var frames: [Frames.Parsed] { Frames.parse(wire) }
    var goAway: Frames.Parsed? { frames.first { $0.type == 0x7 } }

    func requests() -> [Int32] {
        events.compactMap { if case .headers(let id, _, .request, _) = $0 { return id }; return nil }
    }
}

@Suite("HTTP2Session: hostile clients (RFC 9113 §5.1, §10.5)")
struct HTTP2HardeningTests {
    // MARK: unexpected stream ids (RFC 9113 §5.1.1)

    /// h2spec http2/5.1.1/2: HEADERS on stream 3 after stream 5 is a connection error
    /// PROTOCOL_ERROR, in every split of the input (a frame header cut between reads included).
    @Test(arguments: [0, 1, 2, 5, 9, 10, 17])
    func headersOnALowerUnusedStreamIsAConnectionError(chunk: Int) throws {
        let s = try RawServer()
        try s.feed(Frames.preface + Frames.settings() + Frames.headers(stream: 5) + Frames.headers(stream: 3), chunk: chunk)
        #expect(s.requests() == [5])
        let goAway = try #require(s.goAway, "frames: \(s.frames.map(\.type))")
        #expect(goAway.errorCode == HTTP2ErrorCode.protocolError.rawValue)
        #expect(s.server.terminatedWith == .protocolError)
        #expect(!s.server.wantsRead)
    }

    /// Streams the client did open stay nghttp2's business: trailers on an open stream below
    /// the highest one are fine.
    @Test func trailersOnAnOpenLowerStreamAreFine() throws {
        let s = try RawServer()
        try s.feed(Frames.preface + Frames.settings() + Frames.headers(stream: 1, endStream: false)
                   + Frames.headers(stream: 7) + Frames.trailers(stream: 1) + Frames.headers(stream: 9))
        #expect(s.requests() == [1, 7, 9])
        #expect(s.events.contains { if case .headers(1, _, .trailers, true) = $0 { return true }; return false })
        #expect(s.goAway == nil)
        // 3 and 5 were skipped: a HEADERS frame there now is the violation.
        try s.feed(Frames.headers(stream: 5))
        #expect(s.goAway?.errorCode == HTTP2ErrorCode.protocolError.rawValue)
    }

    @Test func scannerIsTheSameInEveryTwoWaySplit() {
        let input = Frames.preface + Frames.settings([(4, 65535)]) + Frames.headers(stream: 3, endStream: false) + Frames.data(stream: 3, Array(repeating: 7, count: 40), endStream: true)
            + Frames.headers(stream: 9) + Frames.headers(stream: 7)
        let violationAt = input.count - Frames.headers(stream: 7).count
        for cut in 0...input.count {
            var scanner = HTTP2FrameScanner(expectPreface: true)
            var found: Int?
            input[..<cut].withUnsafeBytes { if let v = scanner.scan($0) { found = v.validPrefix } }
            if found == nil {
                input[cut...].withUnsafeBytes { if let v = scanner.scan($0) { found = cut + v.validPrefix } }
            } else {
                #expect(cut > violationAt)
            }
            // A header cut in two reports the start of the second piece (0): never past the frame.
            #expect(found.map { $0 == violationAt || ($0 == cut && cut > violationAt) } == true, "cut \(cut): \(String(describing: found))")
        }
    }

    @Test func scannerSurvivesHostileLengthsAndIds() {
        var scanner = HTTP2FrameScanner(expectPreface: false)
        // Maximal length, the reserved bit set, stream id 2^31-1.
        let bytes: [UInt8] = [0xFF, 0xFF, 0xFF, 0x01, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]
        #expect(bytes.withUnsafeBytes { scanner.scan($0) } == nil)
        #expect(scanner.highestOpened == 0x7FFF_FFFF)
    }

    // MARK: frames after the client finished a stream (RFC 9113 §5.1; h2spec http2/5.1)

    /// What h2spec sends after the client finished stream 1, in its http2/5.1 cases.
    enum Late: CaseIterable { case data, headers }

    static func late(_ kind: Late, stream: UInt32) -> [UInt8] {
        switch kind {
        case .data: return Frames.data(stream: stream, Array("test".utf8), endStream: true)
        case .headers: return Frames.headers(stream: stream)
        }
    }

    /// The connection ended with GOAWAY STREAM_CLOSED, and nothing after the offending frame was
    /// read.
    static func expectStreamClosed(_ s: RawServer, _ comment: Comment? = nil) {
        let goAway = s.goAway
        #expect(goAway?.errorCode == HTTP2ErrorCode.streamClosed.rawValue, "\(comment?.rawValue ?? ""): frames \(s.frames.map(\.type))")
        #expect(s.server.terminatedWith == .streamClosed)
        #expect(!s.server.wantsRead)
    }

    /// h2spec "half closed (remote)": HEADERS with END_STREAM, then DATA or HEADERS on it before
    /// the answer (nghttp2 still has the stream), in one read or byte by byte.
    @Test(arguments: Late.allCases, [0, 1, 7])
    func framesAfterTheClientsEndStreamBeforeTheAnswer(late: Late, chunk: Int) throws {
        let s = try RawServer()
        try s.feed(Frames.preface + Frames.settings() + Frames.headers(stream: 1) + Self.late(late, stream: 1), chunk: chunk)
        #expect(s.requests() == [1])
        Self.expectStreamClosed(s)
    }

    /// h2spec "closed: Sends a DATA/HEADERS frame": the same once the answer ended the stream
    /// both ways (nghttp2 freed it, so it no longer knew to answer).
    @Test(arguments: Late.allCases)
    func framesAfterTheStreamEndedBothWays(late: Late) throws {
        let s = try RawServer()
        try s.feed(Frames.preface + Frames.settings() + Frames.headers(stream: 1))
        try s.server.submitResponse(stream: 1, [HTTPField(name: ":status", value: "204")], endStream: true)
        try s.drain()
        #expect(s.events.contains(.streamClosed(stream: 1, errorCode: 0)))
        #expect(!s.server.retainedState.nghttp2Knows(1))
        try s.feed(Self.late(late, stream: 1))
        Self.expectStreamClosed(s)
        // GOAWAY's last stream id: stream 1 was processed.
        #expect(s.goAway.map { Array($0.payload.prefix(4)) } == [0, 0, 0, 1])
    }

    /// h2spec "closed: Sends a DATA/HEADERS frame after sending RST_STREAM frame": the client
    /// resets its open stream and then sends on it, in one read or split anywhere.
    @Test(arguments: Late.allCases, [0, 1, 5, 13])
    func framesAfterTheClientsResetAreStreamClosed(late: Late, chunk: Int) throws {
        let s = try RawServer()
        try s.feed(Frames.preface + Frames.settings() + Frames.headers(stream: 1, endStream: false) + Frames.rst(stream: 1)
                   + Self.late(late, stream: 1), chunk: chunk)
        #expect(s.requests() == [1])
        #expect(s.events.contains(.streamClosed(stream: 1, errorCode: HTTP2ErrorCode.cancel.rawValue)))
        Self.expectStreamClosed(s)
    }

    /// After the client's RST_STREAM and our answer both, in separate reads.
    @Test func dataAfterTheClientResetALaterRead() throws {
        let s = try RawServer()
        try s.feed(Frames.preface + Frames.settings() + Frames.headers(stream: 1, endStream: false))
        try s.server.submitResponse(stream: 1, [HTTPField(name: ":status", value: "200")], endStream: false)
        try s.drain()
        try s.feed(Frames.rst(stream: 1))
        try s.drain()
        #expect(s.goAway == nil)
        try s.feed(Frames.data(stream: 1, [1, 2, 3], endStream: false))
        Self.expectStreamClosed(s)
    }

    /// Frames the client sent before it saw OUR RST_STREAM are ignored (RFC 9113 §5.4.2), the
    /// connection goes on, and their bytes still count against the connection window and are
    /// given back: a client that keeps to the window (as it sees it from our WINDOW_UPDATEs) sends
    /// four windows' worth of DATA on the reset stream and never runs out.
    @Test func framesOnAStreamWeResetAreIgnoredAndTheirBytesGivenBack() throws {
        var settings = HTTP2Settings()
        settings.connectionWindowSize = 65_535  // RFC 9113 §6.9.2's initial window: no raise
        let s = try RawServer(settings)
        try s.feed(Frames.preface + Frames.settings() + Frames.settingsAck + Frames.headers(stream: 1, endStream: false))
        s.server.resetStream(1, error: .cancel)
        try s.drain()
        #expect(s.frames.contains { $0.type == 0x3 && $0.stream == 1 })
        #expect(s.events.contains(.streamClosed(stream: 1, errorCode: HTTP2ErrorCode.cancel.rawValue)))
        // 16 × 16 KiB = 256 KiB, four times the connection window, then trailers ending it.
        func windowGiven() -> Int {
            s.frames.filter { $0.type == 0x8 && $0.stream == 0 && $0.payload.count == 4 }
                .reduce(0) { $0 + Int($1.payload.reduce(UInt32(0)) { $0 << 8 | UInt32($1) } & 0x7FFF_FFFF) }
        }
        var sent = 0
        for _ in 0..<16 {
            #expect(65_535 + windowGiven() - sent >= 16_384, "the connection window ran out after \(sent) bytes")
            try s.feed(Frames.data(stream: 1, Array(repeating: 0x61, count: 16_384), endStream: false))
            sent += 16_384
        }
        try s.feed(Frames.trailers(stream: 1))
        #expect(s.goAway == nil, "frames: \(s.frames.map(\.type))")
        #expect(s.server.wantsRead)
        #expect(!s.events.contains { if case .data(1, _, _) = $0 { return true }; return false })
        #expect(s.frames.contains { $0.type == 0x8 && $0.stream == 0 }, "no connection WINDOW_UPDATE")
        // A new stream's body still flows.
        try s.feed(Frames.headers(stream: 3, endStream: false) + Frames.data(stream: 3, Array(repeating: 0x62, count: 16_000), endStream: true))
        let body = s.events.reduce(0) { n, e in if case .data(3, let b, _) = e { return n + b.count }; return n }
        #expect(body == 16_000)
        #expect(s.goAway == nil)
    }

    /// A long-lived connection: 10,000 finished streams later, a frame on the latest finished one
    /// is still STREAM_CLOSED, one on a stream finished long ago is ignored (the record is
    /// bounded), and neither nghttp2 nor the session kept the streams.
    @Test func theRecordOfFinishedStreamsIsBounded() throws {
        let s = try RawServer()
        try s.feed(Frames.preface + Frames.settings() + Frames.settingsAck)
        var last: UInt32 = 0
        for i in 0..<UInt32(10_000) {
            last = 1 + 2 * i
            try s.feed(Frames.headers(stream: last))
            try s.server.submitResponse(stream: Int32(last), [HTTPField(name: ":status", value: "204")], endStream: true)
            try s.drain()
            if i % 1000 == 0 {
                s.events.removeAll()
                s.wire.removeAll()
            }
        }
        #expect(s.server.rememberedFinishedStreams == HTTP2FrameScanner.maxFinishedStreams)
        let state = s.server.retainedState
        #expect(state.swiftEntries == 0)
        #expect(!state.nghttp2Knows(1) && !state.nghttp2Knows(Int32(last)))
        try s.feed(Frames.data(stream: 1, [1], endStream: false))
        #expect(s.goAway == nil)
        try s.feed(Frames.data(stream: last - 2 * UInt32(HTTP2FrameScanner.maxFinishedStreams - 1), [1], endStream: false))
        Self.expectStreamClosed(s, "the oldest stream still remembered")
    }

    /// The scanner alone, at its capacity: the ring forgets in the order streams finished, not by
    /// id (a long request finished late is remembered over newer short ones).
    @Test func scannerForgetsInTheOrderStreamsFinished() {
        var scanner = HTTP2FrameScanner(expectPreface: false)
        func scan(_ bytes: [UInt8]) -> HTTP2FrameScanner.Violation? { bytes.withUnsafeBytes { scanner.scan($0) } }
        #expect(scan(Frames.headers(stream: 1, endStream: false)) == nil)
        let n = UInt32(HTTP2FrameScanner.maxFinishedStreams)
        for i in 1...n { #expect(scan(Frames.headers(stream: 1 + 2 * i)) == nil) }
        // Stream 1 finishes last; stream 3 (first to finish) falls out.
        #expect(scan(Frames.data(stream: 1, [], endStream: true)) == nil)
        #expect(scanner.rememberedFinishedStreams == Int(n))
        #expect(scan(Frames.data(stream: 3, [0], endStream: false)) == nil)
        #expect(scan(Frames.data(stream: 5, [0], endStream: false))?.errorCode == .streamClosed)
        var again = HTTP2FrameScanner(expectPreface: false)
        for i in 1...n { _ = Frames.headers(stream: 1 + 2 * i).withUnsafeBytes { again.scan($0) } }
        _ = Frames.rst(stream: 1 + 2 * n).withUnsafeBytes { again.scan($0) }  // already finished: not twice
        _ = Frames.headers(stream: 1 + 2 * (n + 1)).withUnsafeBytes { again.scan($0) }
        #expect(Frames.data(stream: 3, [0], endStream: false).withUnsafeBytes { again.scan($0) } == nil, "stream 3 is forgotten")
        #expect(Frames.trailers(stream: 5).withUnsafeBytes { again.scan($0) }?.errorCode == .streamClosed)
    }

    // MARK: concurrency (RFC 9113 §5.1.2)

    /// One stream over SETTINGS_MAX_CONCURRENT_STREAMS, after our SETTINGS were acknowledged, is
    /// refused alone (REFUSED_STREAM); the open streams go on and a later stream is served.
    @Test func aStreamOverTheLimitIsRefusedAlone() throws {
        var settings = HTTP2Settings()
        settings.maxConcurrentStreams = 2
        let s = try RawServer(settings)
        // What the client is told: the real limit.
        #expect(s.frames.first?.setting(0x3) == 2)
        try s.feed(Frames.preface + Frames.settings() + Frames.settingsAck
                   + Frames.headers(stream: 1, endStream: false) + Frames.headers(stream: 3, endStream: false) + Frames.headers(stream: 5))
        #expect(s.requests() == [1, 3])
        #expect(s.goAway == nil)
        #expect(s.frames.contains { $0.type == 0x3 && $0.stream == 5 && $0.errorCode == HTTP2ErrorCode.refusedStream.rawValue })
        #expect(!s.events.contains { if case .streamClosed(5, _) = $0 { return true }; return false })
        // Stream 1 completes: room for stream 7.
        try s.server.submitResponse(stream: 1, [HTTPField(name: ":status", value: "204")], endStream: true)
        try s.feed(Frames.data(stream: 1, [], endStream: true))
        try s.feed(Frames.headers(stream: 7))
        #expect(s.requests() == [1, 3, 7])
        #expect(s.goAway == nil)
    }

    // MARK: header limits (the listener's `limits:`)

    @Test func tooManyFieldsAreReportedAndCookieCrumbsCountOnce() throws {
        var settings = HTTP2Settings()
        settings.maxHeaderCount = 3
        let p = try Pair(server: settings)
        let crumbs = getRequest + (0..<6).map { HTTPField(name: "cookie", value: "c\($0)=1") } + [HTTPField(name: "x-a", value: "1")]
        let ok = try p.client.submitRequest(crumbs, endStream: true)
        let many = try p.client.submitRequest(getRequest + (0..<4).map { HTTPField(name: "x-\($0)", value: "v") }, endStream: true)
        // The HPACK state stays in step: a request after the refused one decodes.
        let after = try p.client.submitRequest(getRequest, endStream: true)
        try p.pump()
        #expect(p.serverEvents.contains { if case .headers(ok, _, .request, _) = $0 { return true }; return false })
        #expect(p.serverEvents.contains(.requestHeadRefused(stream: many, limit: .fieldCount, endStream: true)))
        #expect(p.serverEvents.contains(.headers(stream: after, fields: getRequest, kind: .request, endStream: true)))
    }

    // MARK: rapid reset (RFC 9113 §10.5)

    static func pairs(_ n: Int, from first: UInt32 = 1) -> [UInt8] {
        var bytes: [UInt8] = []
        for i in 0..<UInt32(n) {
            bytes += Frames.headers(stream: first + 2 * i) + Frames.rst(stream: first + 2 * i)
        }
        return bytes
    }

    @Test func resetsOverTheBudgetEndTheConnectionWithEnhanceYourCalm() throws {
        var settings = HTTP2Settings()
        settings.streamResetBudget = StreamResetBudget(limit: 5, windowNanos: 10_000_000_000)
        let s = try RawServer(settings)
        try s.feed(Frames.preface + Frames.settings() + Self.pairs(50))
        #expect(s.goAway?.errorCode == HTTP2ErrorCode.enhanceYourCalm.rawValue)
        #expect(s.server.terminatedWith == .enhanceYourCalm)
        // Decided within the read: the pairs after the sixth reset were not processed.
        #expect(s.requests().count == 6)
        #expect(!s.server.wantsRead)
    }

    @Test func aClientThatCompletesMoreThanItResetsIsNotClosed() throws {
        var settings = HTTP2Settings()
        settings.streamResetBudget = StreamResetBudget(limit: 5, windowNanos: 10_000_000_000)
        let s = try RawServer(settings)
        try s.feed(Frames.preface + Frames.settings())
        for i in 0..<UInt32(10) {
            let id = 1 + 2 * i
            try s.feed(Frames.headers(stream: id))
            try s.server.submitResponse(stream: Int32(id), [HTTPField(name: ":status", value: "204")], endStream: true)
            try s.drain()
        }
        try s.feed(Self.pairs(8, from: 21))
        #expect(s.goAway == nil)
        // A new window forgets both counts: resets alone over the limit end it.
        try s.feed(Self.pairs(6, from: 37), now: 20_000_000_000)
        #expect(s.goAway?.errorCode == HTTP2ErrorCode.enhanceYourCalm.rawValue)
    }
}
