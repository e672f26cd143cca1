// Theory of operation
// ===================
// `HTTP1Parser` is a sans-IO, incremental, strict HTTP/1.1 message parser (RFC 9112) in the
// shape of python-hyper/h11: the driver `feed`s bytes as they arrive and pulls events with
// `next()` until it returns nil ("need more input"). One parser parses one direction of one
// connection: requests (role `.server`, the frontend side) or responses (role `.client`, the
// backend side).
//
// Events of one message: a head (`.requestHead` / `.responseHead` with its body framing), zero
// or more non-empty `.body` slices, then `.end(trailers:)`. Informational (1xx) response heads
// are not followed by `.end`; the final response head follows them. After `.end` the parser
// continues with the next pipelined message from the bytes it holds.
//
// Protocol switches (RFC 9110 §7.8) are the driver's decision: a request with `Upgrade` is parsed
// like any other; a driver that tunnels it calls `switchProtocols()` once the upstream agreed,
// which hands back the bytes after the head and stops parsing for good. On the client role a 101
// is accepted only for a request announced with `expectResponse(to:upgrade: true)`; it ends
// parsing the same way (`.responseHead` with status 101, then `switchProtocols()` for the rest).
// Any other 101 is an error (`http1.unexpected_switching_protocols`). A 2xx answer to a CONNECT
// (a tunnel through a forward proxy) switches the same way: RFC 9112 §6.3 rule 2, the connection
// is a tunnel right after the head, whatever Content-Length or Transfer-Encoding it carries.
//
// Rules (strictness beats leniency; every ambiguity that enables request smuggling is an error):
// - Lines end in CRLF only; bare LF / bare CR in a head, chunk line or trailer: 400.
// - Start line, field names and values, Host, Content-Length, Transfer-Encoding and chunk
//   syntax as in RFC 9112 §3, §4, §5, §6, §7 and RFC 9110 §5, §7.2, §8.6 (see the functions).
// - Head bytes are bounded by `limits.maxHeaderBytes` (431), checked as bytes arrive, so the
//   parser never holds more than the limit of an unfinished head; the request target by
//   `limits.maxRequestTarget` (414), also checked before the line ends.
// - Bodies are streamed: whatever part of the current body is buffered is returned at once, so
//   the buffer never holds more than one feed plus a head.
//
// Buffer discipline: `buffer[readIndex...]` holds the unconsumed bytes. Completed head lines are
// turned into Strings and consumed at once; `lineScanned` remembers how much of the current
// unfinished line was already searched for its LF, so no byte is scanned twice across feeds.
// `feed` resets the buffer when everything was consumed and compacts it (one memmove) when the
// read index passes half of it. Body slices share the buffer's storage (no copy).
//
// Errors carry the absolute offset in the connection stream (`bufferBase + index`). After an
// error the parser is dead: every later `next()` throws the same error.
//
// Split independence: the events and the error are the same however the stream is cut into
// feeds (the tests check whole, byte by byte and every two-way split). Where a check can fire
// before a line ends (431, 414, a bad method, an overlong chunk line) and another needs more
// bytes (bare CR/LF, whole-line syntax), the one a byte-at-a-time reader meets first wins.

/// Incremental, strict, sans-IO HTTP/1.1 parser for one direction of one connection.
///
/// Owns the bytes received and not yet returned as events, the partial head being parsed, and,
/// for the client role, the FIFO of request methods whose responses are still expected.
/// Invariants: `0 <= readIndex <= buffer.count`; in `.head`, `.chunkLine` and `.trailers`
/// `readIndex` is at the start of the current (unfinished) line and
/// `buffer[readIndex ..< readIndex + lineScanned]` contains no LF; once `failure` is set it never
/// changes. Not thread-safe (a value type living on its connection's loop).
public struct HTTP1Parser: Sendable {
    public enum Role: Sendable {
        /// Parses requests (the frontend side of a server).
        case server
        /// Parses responses (the backend side of a client).
        case client
    }

    public let role: Role
    public let limits: HTTP1Limits
    /// The loop's recently parsed header field lines (`FieldLineCache`), shared by the parsers
    /// of one loop's connections; nil: every line is parsed in full.
    public var lineCache: FieldLineCache?

    /// Longest chunk line (size, extensions, CRLF) accepted (RFC 9112 §7.1.1 leaves the bound to us).
    public static let maxChunkLineBytes = 4096
    /// Empty lines tolerated before a request line (RFC 9112 §2.2).
    public static let maxLeadingEmptyLines = 8

    // `buffer`, `readIndex` and `sawEOF` are readable by inlined getters: a parser kept in a
    // class (every connection's) is otherwise copied, all its fields retained, for each
    // `bufferedByteCount` or `receivedEOF` asked from another module (measured).
    @usableFromInline private(set) var buffer: [UInt8] = []
    @usableFromInline private(set) var readIndex = 0
    /// Absolute stream offset of `buffer[0]`.
    private var bufferBase = 0
    /// Bytes of the current unfinished line already searched for LF, counted from `readIndex`.
    private var lineScanned = 0
    private var state: State = .head
    private var head = HeadProgress()
    @usableFromInline private(set) var sawEOF = false
    private var failure: HTTP1Error?
    /// Client role: methods of requests sent whose final responses have not been parsed (FIFO,
    /// `pendingMethods[pendingStart...]` are live).
    private var pendingMethods: [String] = []
    private var pendingStart = 0
    /// The values of the previous header section's first `recentValueSlots` fields (those of at
    /// most `recentValueBytes` bytes; "" elsewhere), by position: a field whose value has the
    /// same bytes as the one at its position in the previous head gets that String (a
    /// reference count) instead of a new one (validation, and an allocation above 15 bytes).
    /// On a keep-alive connection most values repeat (Host, User-Agent, Accept, Cookie; a
    /// server's Server, Date within a second, Content-Type). Bounded: at most
    /// `recentValueSlots * recentValueBytes` bytes kept per connection.
    private var recentValues: [String] = []
    static let recentValueSlots = 16
    static let recentValueBytes = 128
    /// Client role: a 1xx head was returned and the final response to the same request is due.
    private var awaitingFinalResponse = false
    /// Client role: the request awaiting its response asked to upgrade (a 101 is acceptable).
    private var upgradeOffered = false

    private enum State: Sendable {
        /// Parsing a start line and header section.
        case head
        /// Content-Length body with this many bytes still to come.
        case fixedBody(remaining: UInt64)
        /// Expecting a chunk-size line.
        case chunkLine
        /// Inside chunk data.
        case chunkData(remaining: UInt64)
        /// After chunk data: exactly CRLF must follow (RFC 9112 §7.1).
        case chunkDataEnd
        /// Trailer section after the last chunk (RFC 9112 §7.1.2).
        case trailers
        /// Response body delimited by the connection close (RFC 9112 §6.3 rule 8).
        case closeDelimited
        /// The message had no body: `.end(trailers: nil)` is next.
        case endPending
        /// EOF seen between messages (or after a close-delimited body): nothing more, ever.
        case finished
        /// The connection switched protocols (101, or a 2xx to CONNECT): the bytes are no longer HTTP/1.1.
        case switched
    }

    /// What is known of the head (or trailer section) being parsed.
    private struct HeadProgress: Sendable {
        /// Bytes of completed lines of this section (start line + fields), CRLFs included.
        var sectionBytes = 0
        var emptyLinesSkipped = 0
        var startLineDone = false
        /// Request line in progress (offsets from the line start): how far its prefix was
        /// checked, where the target starts once the method's SP was seen, and whether the
        /// prefix checks are over (the target ended within the limit).
        var requestLinePrefix = 0
        var requestTargetStart: Int?
        var requestLineChecked = false
        var method = ""
        var target = ""
        var version = HTTPVersion.http1_1
        var status = 0
        var reason = ""
        var fields: [HTTPField] = []
        var contentLength: UInt64?
        var transferEncoding: String?
        var transferEncodingCount = 0
        /// Absolute stream offsets of the first Transfer-Encoding / Host field line.
        var transferEncodingOffset = 0
        var hostCount = 0
        var host: String?
        var hostOffset = 0
    }

    public init(role: Role, limits: HTTP1Limits = HTTP1Limits()) {
        self.role = role
        self.limits = limits
    }

    // MARK: - Input

    /// Appends received bytes. Ignored after EOF or an error.
    public mutating func feed(_ bytes: UnsafeRawBufferPointer) {
        guard !sawEOF, failure == nil, bytes.count > 0 else { return }
        compact()
        buffer.append(contentsOf: bytes)
    }

    /// Appends received bytes. When nothing is buffered the array is adopted without a copy.
    public mutating func feed(_ bytes: [UInt8]) {
        guard !sawEOF, failure == nil, !bytes.isEmpty else { return }
        if readIndex == buffer.count {
            // Everything was consumed: adopt the caller's array (body slices will share it).
            bufferBase += readIndex
            readIndex = 0
            buffer = bytes
            return
        }
        compact()
        buffer.append(contentsOf: bytes)
    }

    /// The peer closed its sending side.
    public mutating func feedEOF() {
        sawEOF = true
    }

    /// The peer's EOF was fed: the input ends with what is buffered (a client that half-closed).
    @inlinable public var receivedEOF: Bool { sawEOF }

    /// Client role: the next response (in order) answers a request with this method.
    /// Call once per request sent, in sending order (pipelining is FIFO).
    public mutating func expectResponse(to method: String, upgrade: Bool = false) {
        pendingMethods.append(method)
        upgradeOffered = upgrade
    }

    /// The connection leaves HTTP/1.1 (a 101 was sent or received): returns the bytes received
    /// after the last message's head and stops parsing; `next()` returns nil from now on.
    public mutating func switchProtocols() -> [UInt8] {
        let rest = Array(buffer[readIndex...])
        buffer = []
        readIndex = 0
        lineScanned = 0
        state = .switched
        return rest
    }

    /// Bytes received and not yet returned as events (parsed head lines are not counted).
    @inlinable public var bufferedByteCount: Int { buffer.count - readIndex }

    /// True when no message is in progress (bytes of the next one may be buffered but its
    /// start line is not complete yet).
    public var isBetweenMessages: Bool {
        switch state {
        case .head: return !head.startLineDone && !awaitingFinalResponse
        case .finished: return true
        default: return false
        }
    }

    /// Capacity kept across a reset of the buffer; a larger one (left by one huge read) is
    /// released so idle connections do not pin it.
    static let retainedCapacity = 256 * 1024

    /// Drops consumed bytes: a reset when all is consumed, one memmove when past half.
    private mutating func compact() {
        if readIndex == 0 { return }
        if readIndex == buffer.count {
            bufferBase += readIndex
            if buffer.capacity > Self.retainedCapacity {
                buffer = []
            } else {
                buffer.removeAll(keepingCapacity: true)
            }
            readIndex = 0
        } else if readIndex >= buffer.count / 2 {
            bufferBase += readIndex
            buffer.removeSubrange(0..<readIndex)
            readIndex = 0
        }
    }

    // MARK: - Events

    /// The next event, or nil when more input is needed (or, after EOF between messages, forever).
    public mutating func next() throws(HTTP1Error) -> HTTP1Event? {
        if let failure { throw failure }
        do {
            return try step()
        } catch {
            failure = error
            throw error
        }
    }

    private mutating func step() throws(HTTP1Error) -> HTTP1Event? {
        switch state {
        case .head:
            return try parseHead()
        case .endPending:
            state = .head
            return .end(trailers: nil)
        case .fixedBody(let remaining):
            guard let slice = takeBody(upTo: remaining) else {
                if sawEOF { throw truncated(at: buffer.count, "connection closed inside a Content-Length body") }
                return nil
            }
            let left = remaining - UInt64(slice.count)
            state = left == 0 ? .endPending : .fixedBody(remaining: left)
            return .body(slice)
        case .chunkData(let remaining):
            guard let slice = takeBody(upTo: remaining) else {
                if sawEOF { throw truncated(at: buffer.count, "connection closed inside chunk data") }
                return nil
            }
            let left = remaining - UInt64(slice.count)
            state = left == 0 ? .chunkDataEnd : .chunkData(remaining: left)
            return .body(slice)
        case .closeDelimited:
            if let slice = takeBody(upTo: UInt64.max) { return .body(slice) }
            if sawEOF {
                state = .finished
                return .end(trailers: nil)
            }
            return nil
        case .chunkLine, .chunkDataEnd, .trailers:
            return try parseChunkedFraming()
        case .finished, .switched:
            return nil
        }
    }

    /// How many of the next received bytes are body data the caller may relay straight from its
    /// own read buffer (`consumeBody`) instead of feeding them: nonzero only with nothing
    /// buffered, inside a Content-Length body, chunk data or a close-delimited body. Saves a
    /// copy of every body byte of a large response (measured, bench/RESULTS.md); framing
    /// (chunk lines, trailers, the next head) always goes through `feed`. `mutating` only so
    /// that asking does not copy a parser kept in a class.
    public mutating func directBodyLimit() -> UInt64 {
        guard readIndex == buffer.count, failure == nil, !sawEOF else { return 0 }
        switch state {
        case .fixedBody(let remaining): return remaining
        case .chunkData(let remaining): return remaining
        case .closeDelimited: return UInt64.max
        default: return 0
        }
    }

    /// Accounts for `count` body bytes the caller relayed itself: `0 < count <= directBodyLimit`
    /// (anything else is ignored). The message's end, if they complete it, is the next event.
    public mutating func consumeBody(_ count: Int) {
        guard count > 0, UInt64(count) <= directBodyLimit() else { return }
        let n = UInt64(count)
        // Offsets of later errors count these bytes as if they had been buffered and consumed.
        compact()
        bufferBase += count
        switch state {
        case .fixedBody(let remaining):
            state = remaining == n ? .endPending : .fixedBody(remaining: remaining - n)
        case .chunkData(let remaining):
            state = remaining == n ? .chunkDataEnd : .chunkData(remaining: remaining - n)
        default:
            break  // close-delimited: the body goes on until EOF
        }
    }

    /// Up to `limit` buffered body bytes, sharing the buffer's storage; nil when none are buffered.
    @inline(__always)
    private mutating func takeBody(upTo limit: UInt64) -> ArraySlice<UInt8>? {
        let available = buffer.count - readIndex
        guard available > 0 else { return nil }
        let n = UInt64(available) < limit ? available : Int(limit)
        let slice = buffer[readIndex..<(readIndex + n)]
        readIndex += n
        return slice
    }

    private func truncated(at index: Int, _ message: String) -> HTTP1Error {
        HTTP1Error(reason: "http1.truncated", status: 400, offset: bufferBase + index, message: message)
    }

    private func error(_ reason: String, _ status: Int = 400, at index: Int, _ message: String) -> HTTP1Error {
        HTTP1Error(reason: reason, status: status, offset: bufferBase + index, message: message)
    }

    // MARK: - Lines

    private enum LineScan {
        /// A complete line: its content is `readIndex ..< crIndex`, the LF is at `crIndex + 1`.
        case line(crIndex: Int)
        case incomplete
        case bareLF(Int)
        case bareCR(Int)
    }

    /// Searches the current line's end, resuming where the last search stopped.
    /// RFC 9112 §2.2: CRLF only; a bare CR or LF is an error (we do not use the MAY-leniency).
    private mutating func scanLine() -> LineScan {
        let start = readIndex
        let from = readIndex + lineScanned
        let count = buffer.count
        // (kind, index): kind 0 line end (index of CR), 1 incomplete (index to resume at), 2 bare LF, 3 bare CR.
        let (kind, index): (Int, Int) = buffer.withUnsafeBufferPointer { p in
            var i = from
            // Eight bytes at a time: skip words with no byte below 0x0E (so no CR or LF).
            // hasless(x, 14) = (x - 0x0E..0E) & ~x & 0x80..80 is non-zero iff some byte < 0x0E.
            if let base = UnsafeRawPointer(p.baseAddress) {
                while i + 8 <= count {
                    let x = base.loadUnaligned(fromByteOffset: i, as: UInt64.self)
                    if (x &- 0x0E0E_0E0E_0E0E_0E0E) & ~x & 0x8080_8080_8080_8080 != 0 { break }
                    i += 8
                }
            }
            while i < count {
                let c = p[i]
                if c <= asciiCR {
                    if c == asciiLF { return (2, i) }
                    if c == asciiCR {
                        if i + 1 == count { return (1, i) }
                        if p[i + 1] == asciiLF { return (0, i) }
                        return (3, i)
                    }
                }
                i += 1
            }
            return (1, count)
        }
        switch kind {
        case 0:
            lineScanned = 0
            return .line(crIndex: index)
        case 1:
            lineScanned = index - start
            return .incomplete
        case 2:
            return .bareLF(index)
        default:
            return .bareCR(index)
        }
    }

    // MARK: - Head

    /// Consumes complete head lines; returns the head event when the empty line arrives.
    ///
    /// Split independence: every error is reported as a reader fed one byte at a time would
    /// find it first. Checks that can fire before a line ends (431, and for the request line
    /// 414 and a bad method) are therefore also applied to the prefix of a line that ends in a
    /// bare CR/LF or is complete, before the checks that need the whole line.
    private mutating func parseHead() throws(HTTP1Error) -> HTTP1Event? {
        while true {
            if role == .client && !head.startLineDone && readIndex < buffer.count && pendingStart == pendingMethods.count {
                throw error("http1.unsolicited_response", 502, at: readIndex, "response bytes with no request outstanding")
            }
            switch scanLine() {
            case .incomplete:
                try checkHeadLinePrefix(dataEnd: buffer.count)
                if sawEOF {
                    // EOF between messages (at most a lone CR of an empty line buffered).
                    let partial = buffer.count - readIndex
                    if !head.startLineDone && (partial == 0 || (partial == 1 && buffer[readIndex] == asciiCR)) {
                        readIndex = buffer.count
                        state = .finished
                        return nil
                    }
                    throw truncated(at: buffer.count, "connection closed inside a message head")
                }
                return nil
            case .bareLF(let i):
                try checkHeadLinePrefix(dataEnd: i)
                throw error("http1.bare_lf", at: i, "line ends in LF without CR (RFC 9112 §2.2)")
            case .bareCR(let i):
                try checkHeadLinePrefix(dataEnd: i + 1)
                throw error("http1.bare_cr", at: i, "CR not followed by LF (RFC 9112 §2.2)")
            case .line(let cr):
                let lineStart = readIndex
                let lineBytes = cr + 2 - lineStart
                if !head.startLineDone && cr == lineStart {
                    // RFC 9112 §2.2: a server SHOULD ignore at least one empty line before the request line.
                    guard role == .server, head.emptyLinesSkipped < Self.maxLeadingEmptyLines else {
                        throw error(role == .server ? "http1.invalid_request_line" : "http1.invalid_status_line",
                                    at: lineStart, "empty line instead of a start line")
                    }
                    head.emptyLinesSkipped += 1
                    readIndex = cr + 2
                    continue
                }
                if head.sectionBytes + lineBytes > limits.maxHeaderBytes {
                    // An error certain from an earlier byte of the line wins over the 431 (a
                    // complete line within the limit gets the same errors from its full parse).
                    try checkHeadLinePrefix(dataEnd: cr + 1)
                    throw headerTooLarge(lineStart: lineStart)
                }
                head.sectionBytes += lineBytes
                readIndex = cr + 2
                if !head.startLineDone {
                    if role == .server {
                        try parseRequestLine(lineStart, cr)
                    } else {
                        try parseStatusLine(lineStart, cr)
                    }
                    head.startLineDone = true
                    continue
                }
                if cr == lineStart {
                    return try finishHead(endIndex: lineStart)
                }
                try parseFieldLine(lineStart, cr, trailer: false)
            }
        }
    }

    private func headerTooLarge(lineStart: Int) -> HTTP1Error {
        error("http1.header_too_large", 431, at: lineStart + max(0, limits.maxHeaderBytes - head.sectionBytes),
              "head or trailer section larger than \(limits.maxHeaderBytes) bytes")
    }

    /// The checks a byte-at-a-time reader makes while the current head or trailer line is
    /// unfinished, for line data ending at `dataEnd`: 431 once the section exceeds
    /// `maxHeaderBytes` (RFC 9112 §2.3 leaves the bound to us), and for the request line the
    /// errors certain from its prefix (bad method, 414), found at an earlier byte than the 431.
    private mutating func checkHeadLinePrefix(dataEnd: Int) throws(HTTP1Error) {
        let budget = limits.maxHeaderBytes - head.sectionBytes
        let firstOver = readIndex + budget + 1  // smallest data end at which the 431 fires
        if role == .server && !head.startLineDone {
            try checkRequestLinePrefix(limit: min(dataEnd, firstOver - 1))
        }
        if dataEnd >= firstOver {
            throw headerTooLarge(lineStart: readIndex)
        }
    }

    static let methodNotToken = "method is not a token"
    static let methodNoSP = "method is not a token followed by one SP"

    /// Request-line prefix `readIndex ..< limit`: reports an invalid method or a target longer
    /// than `maxRequestTarget` (414, RFC 9112 §3) as soon as they are certain, exactly as
    /// `parseRequestLine` would report them for the whole line. Resumes where it stopped.
    private mutating func checkRequestLinePrefix(limit: Int) throws(HTTP1Error) {
        if head.requestLineChecked { return }
        let start = readIndex
        var i = start + head.requestLinePrefix
        guard i < limit else { return }
        if head.requestTargetStart == nil {
            while i < limit && HTTP1Syntax.isTchar(buffer[i]) { i += 1 }
            if i == limit {
                head.requestLinePrefix = i - start
                return
            }
            let c = buffer[i]
            if c == asciiCR {
                // The line's end (or a bare CR): only the whole line decides.
                head.requestLinePrefix = i - start
                return
            }
            if i == start { throw error("http1.invalid_method", at: i, Self.methodNotToken) }
            if c != asciiSP { throw error("http1.invalid_method", at: i, Self.methodNoSP) }
            i += 1
            head.requestTargetStart = i - start
        }
        let targetStart = start + (head.requestTargetStart ?? 0)
        let maxTarget = limits.maxRequestTarget
        while i < limit {
            let c = buffer[i]
            guard c > asciiSP && c < 0x7F && c != UInt8(ascii: "#") else {
                // The target ended within the limit; the rest needs the whole line.
                head.requestLineChecked = true
                return
            }
            if i - targetStart == maxTarget {
                throw error("http1.target_too_long", 414, at: i, "request target longer than \(maxTarget) bytes")
            }
            i += 1
        }
        head.requestLinePrefix = i - start
    }

    /// RFC 9112 §3: request-line = method SP request-target SP HTTP-version
    private mutating func parseRequestLine(_ start: Int, _ end: Int) throws(HTTP1Error) {
        let base = bufferBase
        let maxTarget = limits.maxRequestTarget
        let result: Result<(String, String, HTTPVersion), HTTP1Error> = buffer.withUnsafeBufferPointer { p in
            func fail(_ reason: String, _ i: Int, _ m: String, status: Int = 400) -> Result<(String, String, HTTPVersion), HTTP1Error> {
                .failure(HTTP1Error(reason: reason, status: status, offset: base + i, message: m))
            }
            // method = token (RFC 9110 §9.1)
            var i = start
            while i < end && HTTP1Syntax.isTchar(p[i]) { i += 1 }
            if i == start { return fail("http1.invalid_method", i, HTTP1Parser.methodNotToken) }
            if i == end || p[i] != asciiSP { return fail("http1.invalid_method", i, HTTP1Parser.methodNoSP) }
            let methodBytes = UnsafeBufferPointer(rebasing: p[start..<i])
            let method = CommonStrings.method(methodBytes) ?? String(decoding: methodBytes, as: UTF8.self)
            // request-target: visible ASCII only (RFC 9112 §3.2, RFC 3986 characters), and no
            // fragment: "#" cannot occur in any request-target form (RFC 9112 §3.2).
            let targetStart = i + 1
            i = targetStart
            while i < end && p[i] > asciiSP && p[i] < 0x7F && p[i] != UInt8(ascii: "#") { i += 1 }
            if i - targetStart > maxTarget {
                return fail("http1.target_too_long", targetStart + maxTarget, "request target longer than \(maxTarget) bytes", status: 414)
            }
            if i == targetStart { return fail("http1.invalid_request_line", i, "empty request target or more than one SP") }
            if i == end { return fail("http1.invalid_request_line", i, "no HTTP version") }
            if p[i] != asciiSP { return fail("http1.invalid_target", i, "request target contains a fragment or a byte that is not visible ASCII") }
            let target = String(decoding: UnsafeBufferPointer(rebasing: p[targetStart..<i]), as: UTF8.self)
            // HTTP-version = "HTTP" "/" DIGIT "." DIGIT (RFC 9112 §2.3, case-sensitive)
            let v = i + 1
            switch parseVersion(p, v, end) {
            case .ok(let version):
                return .success((method, target, version))
            case .unsupported:
                return fail("http1.version_not_supported", v, "only HTTP/1.0 and HTTP/1.1 are supported", status: 505)
            case .invalid:
                return fail("http1.invalid_version", v, "malformed HTTP version")
            }
        }
        let (method, target, version) = try result.get()
        try checkTargetForm(method: method, target: target, at: start + method.utf8.count + 1)
        head.method = method
        head.target = target
        head.version = version
    }

    private enum VersionParse { case ok(HTTPVersion), unsupported, invalid }

    /// Exactly `HTTP/d.d` spanning `from ..< end`.
    private func parseVersion(_ p: UnsafeBufferPointer<UInt8>, _ from: Int, _ end: Int) -> VersionParse {
        guard end - from == 8,
              p[from] == UInt8(ascii: "H"), p[from + 1] == UInt8(ascii: "T"), p[from + 2] == UInt8(ascii: "T"),
              p[from + 3] == UInt8(ascii: "P"), p[from + 4] == UInt8(ascii: "/"),
              HTTP1Syntax.isDigit(p[from + 5]), p[from + 6] == UInt8(ascii: "."), HTTP1Syntax.isDigit(p[from + 7])
        else { return .invalid }
        let major = Int(p[from + 5] - 0x30), minor = Int(p[from + 7] - 0x30)
        if major == 1 && (minor == 0 || minor == 1) { return .ok(HTTPVersion(major: major, minor: minor)) }
        return .unsupported
    }

    /// RFC 9112 §3.2: origin-form, absolute-form (http/https), authority-form only with CONNECT,
    /// asterisk-form only with OPTIONS.
    private func checkTargetForm(method: String, target: String, at offset: Int) throws(HTTP1Error) {
        let first = target.utf8.first!  // non-empty: checked by the request-line scan
        if method == "CONNECT" {
            guard HTTP1Syntax.isValidAuthority(target, requirePort: true) else {
                throw error("http1.invalid_target", at: offset, "CONNECT needs an authority-form target host:port (RFC 9112 §3.2.3)")
            }
            return
        }
        if first == UInt8(ascii: "/") { return }
        if target == "*" {
            guard method == "OPTIONS" else {
                throw error("http1.invalid_target", at: offset, "asterisk-form is only for OPTIONS (RFC 9112 §3.2.4)")
            }
            return
        }
        let u = Array(target.utf8.prefix(8))
        let hasHTTP = u.count >= 7 && HTTP1Syntax.equalsLowercase(u[0..<7], "http://")
        let hasHTTPS = u.count >= 8 && HTTP1Syntax.equalsLowercase(u[0..<8], "https://")
        if (hasHTTP && target.utf8.count > 7) || (hasHTTPS && target.utf8.count > 8) { return }
        throw error("http1.invalid_target", at: offset, "request target is neither origin-form nor absolute-form")
    }

    /// RFC 9112 §4: status-line = HTTP-version SP status-code SP [ reason-phrase ]
    /// (the second SP is tolerated when absent, as many servers omit it with an empty reason).
    private mutating func parseStatusLine(_ start: Int, _ end: Int) throws(HTTP1Error) {
        let base = bufferBase
        let result: Result<(HTTPVersion, Int, String), HTTP1Error> = buffer.withUnsafeBufferPointer { p in
            func fail(_ reason: String, _ i: Int, _ m: String, status: Int = 400) -> Result<(HTTPVersion, Int, String), HTTP1Error> {
                .failure(HTTP1Error(reason: reason, status: status, offset: base + i, message: m))
            }
            guard end - start >= 12, p[start + 8] == asciiSP else {
                return fail("http1.invalid_status_line", start, "malformed status line")
            }
            let version: HTTPVersion
            switch parseVersion(p, start, start + 8) {
            case .ok(let v): version = v
            case .unsupported: return fail("http1.version_not_supported", start, "only HTTP/1.0 and HTTP/1.1 are supported", status: 505)
            case .invalid: return fail("http1.invalid_status_line", start, "malformed HTTP version")
            }
            let d0 = p[start + 9], d1 = p[start + 10], d2 = p[start + 11]
            guard HTTP1Syntax.isDigit(d0), HTTP1Syntax.isDigit(d1), HTTP1Syntax.isDigit(d2) else {
                return fail("http1.invalid_status_line", start + 9, "status code is not 3 digits")
            }
            let status = Int(d0 - 0x30) * 100 + Int(d1 - 0x30) * 10 + Int(d2 - 0x30)
            guard status >= 100 && status <= 599 else {
                return fail("http1.invalid_status_line", start + 9, "status code out of range 100-599")
            }
            var reason = ""
            var i = start + 12
            if i < end {
                guard p[i] == asciiSP else { return fail("http1.invalid_status_line", i, "status code is not followed by SP") }
                i += 1
                let reasonStart = i
                // reason-phrase = 1*( HTAB / SP / VCHAR / obs-text )
                while i < end {
                    let c = p[i]
                    if !(c == asciiHTAB || c >= asciiSP) || c == 0x7F {
                        return fail("http1.invalid_status_line", i, "control character in reason phrase")
                    }
                    i += 1
                }
                let reasonBytes = UnsafeBufferPointer(rebasing: p[reasonStart..<end])
                reason = CommonStrings.reason(reasonBytes) ?? String(decoding: reasonBytes, as: UTF8.self)
            }
            return .success((version, status, reason))
        }
        let (version, status, reason) = try result.get()
        head.version = version
        head.status = status
        head.reason = reason
    }

    // MARK: - Fields

    fileprivate enum FieldKind { case other, contentLength, transferEncoding, host }

    /// One parsed field line (a struct, not a tuple: keeps `Result` destruction specialized).
    fileprivate struct Parsed {
        var field: HTTPField
        var kind: FieldKind
        /// The Content-Length value, for `kind == .contentLength`.
        var length: UInt64?
    }

    /// RFC 9112 §5: field-line = field-name ":" OWS field-value OWS
    /// Used for the header section and (with `trailer: true`) the trailer section.
    private mutating func parseFieldLine(_ start: Int, _ end: Int, trailer: Bool) throws(HTTP1Error) {
        if head.fields.count >= limits.maxHeaderCount {
            throw error("http1.too_many_headers", 431, at: start, "more than \(limits.maxHeaderCount) fields")
        }
        let base = bufferBase
        let ordinal = head.fields.count
        let cache = trailer ? nil : lineCache
        if let cache, buffer.withUnsafeBytes({ cache.matches(ordinal, UnsafeRawBufferPointer(rebasing: $0[start..<end])) }) {
            try addField(cache.parsed(ordinal), start: start, ordinal: ordinal, trailer: false, keepValue: false)
            return
        }
        let result: Result<Parsed, HTTP1Error> = buffer.withUnsafeBufferPointer { p in
            func fail(_ reason: String, _ i: Int, _ m: String) -> Result<Parsed, HTTP1Error> {
                .failure(HTTP1Error(reason: reason, status: 400, offset: base + i, message: m))
            }
            let first = p[start]
            if HTTP1Syntax.isOWS(first) {
                // RFC 9112 §5.2: obs-fold is rejected with 400 (we do not unfold).
                return fail("http1.obs_fold", start, "obsolete line folding")
            }
            var i = start
            while i < end && HTTP1Syntax.isTchar(p[i]) { i += 1 }
            let nameEnd = i
            if i == end { return fail("http1.missing_colon", i, "field line without a colon") }
            if p[i] != UInt8(ascii: ":") {
                if HTTP1Syntax.isOWS(p[i]) && i > start {
                    var j = i
                    while j < end && HTTP1Syntax.isOWS(p[j]) { j += 1 }
                    if j < end && p[j] == UInt8(ascii: ":") {
                        // RFC 9112 §5.1: no whitespace between field name and colon; 400.
                        return fail("http1.space_before_colon", i, "whitespace between field name and colon")
                    }
                }
                return fail("http1.invalid_field_name", i, "field name is not a token")
            }
            if nameEnd == start { return fail("http1.invalid_field_name", start, "empty field name") }
            // Value: trim OWS, then only HTAB, SP, VCHAR, obs-text (RFC 9110 §5.5).
            var vs = nameEnd + 1
            var ve = end
            while vs < ve && HTTP1Syntax.isOWS(p[vs]) { vs += 1 }
            while ve > vs && HTTP1Syntax.isOWS(p[ve - 1]) { ve -= 1 }
            var high = false
            var j = vs
            let raw = UnsafeRawPointer(p.baseAddress!)  // non-nil: the line is non-empty
            // Whole words first. When they all passed and a tail under 8 bytes is left, it is
            // read as the line's last word, overlapping: the bytes before the tail are checked
            // value bytes, OWS, ":" and the name's tchars, so if all 8 are SP or VCHAR so is the
            // tail (an HTAB there fails the test). Otherwise (a word failed, or no word fits in
            // the line) the remaining bytes are checked one by one below.
            while j + 8 <= ve && HTTP1Syntax.allVisibleOrSpace(raw.loadUnaligned(fromByteOffset: j, as: UInt64.self)) { j += 8 }
            if j < ve && ve - j < 8 && ve - 8 >= start
                && HTTP1Syntax.allVisibleOrSpace(raw.loadUnaligned(fromByteOffset: ve - 8, as: UInt64.self)) {
                j = ve
            }
            while j < ve {
                if j + 8 <= ve && HTTP1Syntax.allVisibleOrSpace(raw.loadUnaligned(fromByteOffset: j, as: UInt64.self)) {
                    j += 8
                    continue
                }
                let c = p[j]
                if c < asciiSP {
                    if c != asciiHTAB { return fail("http1.invalid_field_value", j, "control character in field value") }
                } else if c >= 0x7F {
                    if c == 0x7F { return fail("http1.invalid_field_value", j, "DEL in field value") }
                    high = true
                }
                j += 1
            }
            let nameBytes = UnsafeBufferPointer(rebasing: p[start..<nameEnd])
            let valueBytes = UnsafeBufferPointer(rebasing: p[vs..<ve])
            let value: String
            if !trailer && ordinal < recentValues.count && Self.sameBytes(recentValues[ordinal], valueBytes) {
                value = recentValues[ordinal]
            } else if high {
                guard let v = String(validating: valueBytes, as: UTF8.self) else {
                    return fail("http1.invalid_field_value", vs, "field value with bytes >= 0x80 is not valid UTF-8")
                }
                value = v
            } else {
                value = CommonStrings.fieldValue(valueBytes) ?? String(decoding: valueBytes, as: UTF8.self)
            }
            let name = CommonStrings.fieldName(nameBytes) ?? String(decoding: nameBytes, as: UTF8.self)
            let known = KnownField.classify(nameBytes)
            var kind = FieldKind.other
            var length: UInt64?
            switch known {
            case .host:
                kind = .host
            case .contentLength:
                kind = .contentLength
                // RFC 9110 §8.6: Content-Length = 1*DIGIT; a list of identical values may be
                // treated as one (RFC 9112 §6.3 rule 5); anything else is an error.
                var k = vs
                var n: UInt64?
                while true {
                    var a = k
                    while a < ve && p[a] != UInt8(ascii: ",") { a += 1 }
                    var es = k, ee = a
                    while es < ee && HTTP1Syntax.isOWS(p[es]) { es += 1 }
                    while ee > es && HTTP1Syntax.isOWS(p[ee - 1]) { ee -= 1 }
                    if es == ee { return fail("http1.invalid_content_length", es, "empty Content-Length") }
                    var v: UInt64 = 0
                    var d = es
                    while d < ee {
                        let c = p[d]
                        guard HTTP1Syntax.isDigit(c) else { return fail("http1.invalid_content_length", d, "Content-Length is not 1*DIGIT") }
                        let (m, o1) = v.multipliedReportingOverflow(by: 10)
                        let (s, o2) = m.addingReportingOverflow(UInt64(c - 0x30))
                        if o1 || o2 { return fail("http1.invalid_content_length", d, "Content-Length overflows") }
                        v = s
                        d += 1
                    }
                    if v > UInt64(Int64.max) {
                        return fail("http1.invalid_content_length", es, "Content-Length above 2^63-1")
                    }
                    if let prior = n, prior != v {
                        return fail("http1.conflicting_content_length", es, "Content-Length list with differing values")
                    }
                    n = v
                    if a == ve { break }
                    k = a + 1
                }
                length = n
            case .transferEncoding:
                kind = .transferEncoding
            default:
                break
            }
            return .success(Parsed(field: HTTPField(name: name, value: value, known: known), kind: kind, length: length))
        }
        let parsed: Parsed
        switch result {
        case .success(let p): parsed = p
        case .failure(var e):
            if trailer && e.reason != "http1.too_many_headers" {
                e.message = "\(e.reason): \(e.message)"
                e.reason = "http1.invalid_trailer"
            }
            throw e
        }
        if let cache {
            buffer.withUnsafeBytes { cache.store(ordinal, UnsafeRawBufferPointer(rebasing: $0[start..<end]), parsed) }
        }
        try addField(parsed, start: start, ordinal: ordinal, trailer: trailer, keepValue: !trailer)
    }

    /// A parsed field line joins the head (or the trailers): framing and Host bookkeeping, the
    /// checks across lines, and (`keepValue`) its value in `recentValues`. A line from the loop's
    /// cache leaves that slot alone: the slot serves lines the cache misses (or never keeps,
    /// as credentials), and updating it on every hit cost more than it saved (measured).
    private mutating func addField(_ parsed: Parsed, start: Int, ordinal: Int, trailer: Bool, keepValue: Bool) throws(HTTP1Error) {
        if trailer {
            // RFC 9110 §6.5.1: framing and routing fields are not allowed in trailers. A request
            // carrying one is refused (400). A response's body is already delimited by then, so
            // the field is discarded (RFC 9110 §6.5.2 lets a recipient discard trailer fields)
            // and the response stays whole: failing it there could only cut off what was relayed.
            if parsed.kind != .other {
                if role == .client { return }
                throw error("http1.invalid_trailer", at: start, "\(parsed.field.name) is not allowed in a trailer section")
            }
        } else {
            switch parsed.kind {
            case .other:
                break
            case .contentLength:
                let n = parsed.length!  // set for every successfully parsed Content-Length
                if let prior = head.contentLength, prior != n {
                    throw error("http1.conflicting_content_length", at: start, "Content-Length fields with differing values")
                }
                head.contentLength = n
            case .transferEncoding:
                head.transferEncodingCount += 1
                if head.transferEncoding == nil {
                    head.transferEncoding = parsed.field.value
                    head.transferEncodingOffset = bufferBase + start
                }
            case .host:
                head.hostCount += 1
                if head.host == nil {
                    head.host = parsed.field.value
                    head.hostOffset = bufferBase + start
                } else {
                    // RFC 9112 §3.2: more than one Host field line: 400.
                    if role == .server {
                        throw error("http1.duplicate_host", at: start, "more than one Host field")
                    }
                }
            }
        }
        if head.fields.isEmpty { head.fields.reserveCapacity(16) }
        if keepValue && ordinal < Self.recentValueSlots {
            let v = parsed.field.value
            let keep = v.utf8.count <= Self.recentValueBytes ? v : ""
            if ordinal < recentValues.count {
                recentValues[ordinal] = keep
            } else if ordinal == recentValues.count {
                recentValues.append(keep)
            }
        }
        head.fields.append(parsed.field)
    }

    /// Header field lines recently parsed on one event loop, by their position in a header
    /// section, with what each parsed to: a line whose bytes are exactly those of the line kept
    /// at its position is that parse again (no scan, validation, classification or
    /// allocation; a reference count each for its name and value). A line that differs in any
    /// byte (case, a space before the colon, a fold, an invalid byte) is parsed in full, and
    /// only successful parses are kept. Requests from one client, and responses from one
    /// origin, repeat most lines from head to head and from connection to connection (Host,
    /// User-Agent, Accept; Server, Content-Type, Content-Length of one resource).
    ///
    /// Owned by one loop, touched only by the parsers of that loop's connections, on it.
    /// Bounded: `slots` lines of at most `slotBytes` bytes (2 KiB and their Strings). Lines
    /// that carry credentials (Authorization, Proxy-Authorization, Cookie, Set-Cookie) are
    /// never kept: one connection's secrets are neither held for nor compared with another's.
    public final class FieldLineCache: @unchecked Sendable {  // @unchecked: confined to one loop
        static let slots = 16
        static let slotBytes = 128
        /// Slot `i`'s line bytes at `i * slotBytes`.
        private let bytes: UnsafeMutableRawPointer
        /// Slot `i`'s line length (0: empty).
        private let lineLengths: UnsafeMutablePointer<Int>
        // Slot `i`'s parse, field by field (a whole `Parsed?` per slot cost outlined copies of
        // the optional on every hit, measured).
        private let names: UnsafeMutablePointer<String>
        private let values: UnsafeMutablePointer<String>
        private let knowns: UnsafeMutablePointer<KnownField>
        private let kinds: UnsafeMutablePointer<FieldKind>
        /// The Content-Length value where `kinds[i] == .contentLength`.
        private let contentLengths: UnsafeMutablePointer<UInt64>

        public init() {
            let n = Self.slots
            bytes = .allocate(byteCount: n * Self.slotBytes, alignment: 8)
            lineLengths = .allocate(capacity: n)
            lineLengths.initialize(repeating: 0, count: n)
            names = .allocate(capacity: n)
            names.initialize(repeating: "", count: n)
            values = .allocate(capacity: n)
            values.initialize(repeating: "", count: n)
            knowns = .allocate(capacity: n)
            knowns.initialize(repeating: .other, count: n)
            kinds = .allocate(capacity: n)
            kinds.initialize(repeating: .other, count: n)
            contentLengths = .allocate(capacity: n)
            contentLengths.initialize(repeating: 0, count: n)
        }

        deinit {
            names.deinitialize(count: Self.slots)
            values.deinitialize(count: Self.slots)
            for p in [UnsafeMutableRawPointer(names), UnsafeMutableRawPointer(values), UnsafeMutableRawPointer(knowns),
                      UnsafeMutableRawPointer(kinds), UnsafeMutableRawPointer(contentLengths), UnsafeMutableRawPointer(lineLengths), bytes] {
                p.deallocate()
            }
        }

        /// Whether the line kept at position `ordinal` has exactly `line`'s bytes.
        @inline(__always)
        fileprivate func matches(_ ordinal: Int, _ line: UnsafeRawBufferPointer) -> Bool {
            guard ordinal < Self.slots, line.count > 0, lineLengths[ordinal] == line.count,
                  let p = line.baseAddress else { return false }
            return HTTP1Parser.equalBytes(UnsafeRawPointer(bytes + ordinal * Self.slotBytes), p, count: line.count)
        }

        /// The parse kept at `ordinal` (after `matches`).
        @inline(__always)
        fileprivate func parsed(_ ordinal: Int) -> Parsed {
            let kind = kinds[ordinal]
            return Parsed(field: HTTPField(name: names[ordinal], value: values[ordinal], known: knowns[ordinal]),
                          kind: kind, length: kind == .contentLength ? contentLengths[ordinal] : nil)
        }

        /// Keeps `line`'s parse at position `ordinal` (unless out of bounds or a credential).
        fileprivate func store(_ ordinal: Int, _ line: UnsafeRawBufferPointer, _ parsed: Parsed) {
            guard ordinal < Self.slots, line.count > 0, line.count <= Self.slotBytes, let p = line.baseAddress,
                  !Self.carriesCredentials(parsed.field) else { return }
            (bytes + ordinal * Self.slotBytes).copyMemory(from: p, byteCount: line.count)
            lineLengths[ordinal] = line.count
            names[ordinal] = parsed.field.name
            values[ordinal] = parsed.field.value
            knowns[ordinal] = parsed.field.known
            kinds[ordinal] = parsed.kind
            contentLengths[ordinal] = parsed.length ?? 0
        }

        /// Authorization, Proxy-Authorization, Cookie, Set-Cookie.
        static func carriesCredentials(_ field: HTTPField) -> Bool {
            if field.known == .proxyAuthorization { return true }
            switch field.name.utf8.count {
            case 6: return asciiCaseInsensitiveEquals(field.name, "cookie")
            case 10: return asciiCaseInsensitiveEquals(field.name, "set-cookie")
            case 13: return asciiCaseInsensitiveEquals(field.name, "authorization")
            default: return false
            }
        }

        /// For tests: the line kept at `ordinal`, if any.
        func keptLine(_ ordinal: Int) -> [UInt8]? {
            guard ordinal < Self.slots, lineLengths[ordinal] > 0 else { return nil }
            return Array(UnsafeRawBufferPointer(start: bytes + ordinal * Self.slotBytes, count: lineLengths[ordinal]))
        }
    }

    /// Whether `s`'s UTF-8 is exactly `b`, compared 8 bytes at a time.
    @inline(__always)
    static func sameBytes(_ s: String, _ b: UnsafeBufferPointer<UInt8>) -> Bool {
        guard s.utf8.count == b.count, b.count > 0 else { return false }
        let same: Bool? = s.utf8.withContiguousStorageIfAvailable { a in
            guard let pa = a.baseAddress, let pb = b.baseAddress else { return a.count == b.count }
            return equalBytes(UnsafeRawPointer(pa), UnsafeRawPointer(pb), count: b.count)
        }
        return same ?? false
    }

    /// Whether `count` bytes at `a` and at `b` are equal, compared 8 bytes at a time.
    @inline(__always)
    static func equalBytes(_ a: UnsafeRawPointer, _ b: UnsafeRawPointer, count n: Int) -> Bool {
        var i = 0
        while i + 8 <= n {
            if a.loadUnaligned(fromByteOffset: i, as: UInt64.self) != b.loadUnaligned(fromByteOffset: i, as: UInt64.self) { return false }
            i += 8
        }
        while i < n {
            if a.load(fromByteOffset: i, as: UInt8.self) != b.load(fromByteOffset: i, as: UInt8.self) { return false }
            i += 1
        }
        return true
    }

    /// RFC 9112 §6.1: the only transfer coding we accept is a single `chunked`, in one field.
    /// Throws unless the body is framed by exactly one chunked coding.
    private func checkTransferEncoding(_ value: String, count: Int, at offset: Int) throws(HTTP1Error) {
        let isRequest = role == .server
        if count > 1 {
            throw error("http1.invalid_transfer_encoding", at: offset, "Transfer-Encoding in more than one field")
        }
        let elements = HTTP1Syntax.listElements(value.utf8)
        var chunkedCount = 0
        for e in elements {
            if e.isEmpty {
                throw error("http1.invalid_transfer_encoding", at: offset, "empty transfer coding")
            }
            if HTTP1Syntax.equalsLowercase(e, "chunked") {
                chunkedCount += 1
                continue
            }
            // transfer-coding = token *( OWS ";" OWS transfer-parameter ): check the name is a token.
            var i = e.startIndex
            while i < e.endIndex && HTTP1Syntax.isTchar(e[i]) { i += 1 }
            if i == e.startIndex || (i < e.endIndex && !HTTP1Syntax.isOWS(e[i]) && e[i] != UInt8(ascii: ";")) {
                throw error("http1.invalid_transfer_encoding", at: offset, "malformed transfer coding")
            }
        }
        guard let last = elements.last, HTTP1Syntax.equalsLowercase(last, "chunked") else {
            // RFC 9112 §6.3 rule 4: a request whose final coding is not chunked: 400.
            throw error("http1.invalid_transfer_encoding", at: offset, "final transfer coding is not chunked")
        }
        if chunkedCount > 1 {
            // RFC 9112 §7: chunked MUST NOT be applied more than once.
            throw error("http1.invalid_transfer_encoding", at: offset, "chunked applied more than once")
        }
        if elements.count > 1 {
            throw error("http1.unsupported_transfer_coding", isRequest ? 501 : 502, at: offset,
                        "transfer codings other than chunked are not supported")
        }
    }

    /// The empty line ended the header section: validate and pick the framing (RFC 9112 §6.3).
    private mutating func finishHead(endIndex: Int) throws(HTTP1Error) -> HTTP1Event {
        var chunked = false
        if let te = head.transferEncoding {
            // RFC 9112 §6.1: CL with TE is a smuggling vector; reject (requests and responses).
            if head.contentLength != nil {
                throw error("http1.cl_and_te", at: head.transferEncodingOffset - bufferBase, "both Content-Length and Transfer-Encoding")
            }
            // RFC 9112 §6.1: TE in HTTP/1.0 is a sign of a faulty intermediary; reject.
            if head.version == .http1_0 {
                throw error("http1.te_in_http10", at: head.transferEncodingOffset - bufferBase, "Transfer-Encoding in an HTTP/1.0 message")
            }
            try checkTransferEncoding(te, count: head.transferEncodingCount, at: head.transferEncodingOffset - bufferBase)
            chunked = true
        }
        // Moved out, not copied (a copy retained every field).
        var progress = HeadProgress()
        swap(&progress, &head)
        let headers = HTTPHeaders(progress.fields)
        progress.fields = []
        switch role {
        case .server:
            // RFC 9112 §3.2: HTTP/1.1 requires exactly one valid Host.
            if progress.hostCount == 0 && progress.version == .http1_1 {
                throw error("http1.missing_host", at: endIndex, "HTTP/1.1 request without Host")
            }
            if let host = progress.host, !HTTP1Syntax.isValidAuthority(host, requirePort: false) {
                throw error("http1.invalid_host", at: progress.hostOffset - bufferBase, "Host is not uri-host[:port]")
            }
            let framing: HTTP1BodyFraming
            if chunked {
                framing = .chunked
                state = .chunkLine
            } else if let n = progress.contentLength, n > 0 {
                framing = .contentLength(n)
                state = .fixedBody(remaining: n)
            } else {
                framing = .none
                state = .endPending
            }
            let request = HTTPRequestHead(method: progress.method, target: progress.target, version: progress.version, headers: headers)
            return .requestHead(request, framing: framing)
        case .client:
            let response = HTTPResponseHead(status: progress.status, reason: progress.reason, version: progress.version, headers: headers)
            if progress.status == 101 {
                guard upgradeOffered, pendingStart < pendingMethods.count else {
                    throw error("http1.unexpected_switching_protocols", 502, at: endIndex, "101 Switching Protocols without an upgrade request")
                }
                // RFC 9110 §15.2.2: the connection now speaks the upgraded protocol.
                upgradeOffered = false
                pendingMethods.removeAll(keepingCapacity: true)
                pendingStart = 0
                awaitingFinalResponse = false
                state = .switched
                return .responseHead(response, framing: .none)
            }
            if response.isInformational {
                // RFC 9110 §15.2: 1xx has no body; the final response to the same request follows.
                state = .head
                awaitingFinalResponse = true
                return .responseHead(response, framing: .none)
            }
            awaitingFinalResponse = false
            upgradeOffered = false
            let method = pendingMethods[pendingStart]
            pendingStart += 1
            if pendingStart == pendingMethods.count {
                pendingMethods.removeAll(keepingCapacity: true)
                pendingStart = 0
            } else if pendingStart >= 64 && pendingStart * 2 >= pendingMethods.count {
                pendingMethods.removeSubrange(0..<pendingStart)
                pendingStart = 0
            }
            if method == "CONNECT" && progress.status >= 200 && progress.status <= 299 {
                // RFC 9112 §6.3 rule 2: a 2xx to CONNECT makes the connection a tunnel after the head.
                pendingMethods.removeAll(keepingCapacity: true)
                pendingStart = 0
                state = .switched
                return .responseHead(response, framing: .none)
            }
            let framing: HTTP1BodyFraming
            // RFC 9112 §6.3 rule 1: HEAD responses, 204 and 304 have no body.
            if method == "HEAD" || progress.status == 204 || progress.status == 304 {
                framing = .none
                state = .endPending
            } else if chunked {
                framing = .chunked
                state = .chunkLine
            } else if let n = progress.contentLength {
                if n > 0 {
                    framing = .contentLength(n)
                    state = .fixedBody(remaining: n)
                } else {
                    framing = .none
                    state = .endPending
                }
            } else {
                // RFC 9112 §6.3 rule 8: read until the connection closes.
                framing = .closeDelimited
                state = .closeDelimited
            }
            return .responseHead(response, framing: framing)
        }
    }

    // MARK: - Chunked body (RFC 9112 §7.1)

    private mutating func parseChunkedFraming() throws(HTTP1Error) -> HTTP1Event? {
        while true {
            switch state {
            case .chunkDataEnd:
                let available = buffer.count - readIndex
                if available >= 1 && buffer[readIndex] != asciiCR {
                    throw error("http1.invalid_chunk_data", at: readIndex, "chunk data not followed by CRLF")
                }
                if available >= 2 && buffer[readIndex + 1] != asciiLF {
                    throw error("http1.invalid_chunk_data", at: readIndex + 1, "chunk data not followed by CRLF")
                }
                if available < 2 {
                    if sawEOF { throw truncated(at: buffer.count, "connection closed after chunk data") }
                    return nil
                }
                readIndex += 2
                state = .chunkLine
            case .chunkLine:
                switch scanLine() {
                case .incomplete:
                    try checkChunkLineLength(dataEnd: buffer.count)
                    if sawEOF { throw truncated(at: buffer.count, "connection closed inside a chunk line") }
                    return nil
                case .bareLF(let i):
                    try checkChunkLineLength(dataEnd: i)
                    throw error("http1.bare_lf", at: i, "chunk line ends in LF without CR")
                case .bareCR(let i):
                    try checkChunkLineLength(dataEnd: i + 1)
                    throw error("http1.bare_cr", at: i, "CR not followed by LF in a chunk line")
                case .line(let cr):
                    try checkChunkLineLength(dataEnd: cr + 2)
                    let size = try parseChunkLine(readIndex, cr)
                    readIndex = cr + 2
                    if size == 0 {
                        head = HeadProgress()
                        head.startLineDone = true
                        state = .trailers
                    } else {
                        state = .chunkData(remaining: size)
                        return try step()  // hand out data already buffered
                    }
                }
            case .trailers:
                switch scanLine() {
                case .incomplete:
                    try checkHeadLinePrefix(dataEnd: buffer.count)
                    if sawEOF { throw truncated(at: buffer.count, "connection closed inside the trailer section") }
                    return nil
                case .bareLF(let i):
                    try checkHeadLinePrefix(dataEnd: i)
                    throw error("http1.invalid_trailer", at: i, "http1.bare_lf: trailer line ends in LF without CR")
                case .bareCR(let i):
                    try checkHeadLinePrefix(dataEnd: i + 1)
                    throw error("http1.invalid_trailer", at: i, "http1.bare_cr: CR not followed by LF in a trailer line")
                case .line(let cr):
                    let lineStart = readIndex
                    let lineBytes = cr + 2 - lineStart
                    if head.sectionBytes + lineBytes > limits.maxHeaderBytes {
                        throw headerTooLarge(lineStart: lineStart)
                    }
                    head.sectionBytes += lineBytes
                    readIndex = cr + 2
                    if cr == lineStart {
                        let fields = head.fields
                        head = HeadProgress()
                        state = .head
                        return .end(trailers: fields.isEmpty ? nil : HTTPHeaders(fields))
                    }
                    try parseFieldLine(lineStart, cr, trailer: true)
                }
            default:
                return try step()
            }
        }
    }

    /// RFC 9112 §7.1.1 leaves the chunk line length to us: 400 beyond `maxChunkLineBytes`,
    /// checked as bytes arrive (for line data ending at `dataEnd`).
    private func checkChunkLineLength(dataEnd: Int) throws(HTTP1Error) {
        if dataEnd - readIndex > Self.maxChunkLineBytes {
            throw error("http1.chunk_line_too_long", at: readIndex + Self.maxChunkLineBytes,
                        "chunk line longer than \(Self.maxChunkLineBytes) bytes")
        }
    }

    /// chunk = chunk-size [ chunk-ext ] CRLF; chunk-size = 1*HEXDIG;
    /// chunk-ext = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )
    /// chunk-ext-val = token / quoted-string (RFC 9112 §7.1.1). Extensions are validated and dropped.
    private func parseChunkLine(_ start: Int, _ end: Int) throws(HTTP1Error) -> UInt64 {
        let base = bufferBase
        let result: Result<UInt64, HTTP1Error> = buffer.withUnsafeBufferPointer { p in
            func fail(_ reason: String, _ i: Int, _ m: String) -> Result<UInt64, HTTP1Error> {
                .failure(HTTP1Error(reason: reason, status: 400, offset: base + i, message: m))
            }
            var i = start
            var size: UInt64 = 0
            while i < end, let v = HTTP1Syntax.hexValue(p[i]) {
                if i - start == 16 { return fail("http1.invalid_chunk_size", i, "chunk size longer than 16 hex digits") }
                size = size << 4 | UInt64(v)
                i += 1
            }
            if i == start { return fail("http1.invalid_chunk_size", i, "chunk size is not 1*HEXDIG") }
            // A size no signed 64-bit counter can hold is refused, never waited for (docs/architecture.md §5).
            if size > UInt64(Int64.max) { return fail("http1.chunk_size_too_large", start, "chunk size above 2^63-1") }
            if i == end { return .success(size) }
            if !(HTTP1Syntax.isOWS(p[i]) || p[i] == UInt8(ascii: ";")) {
                return fail("http1.invalid_chunk_size", i, "chunk size is not 1*HEXDIG")
            }
            while i < end {
                while i < end && HTTP1Syntax.isOWS(p[i]) { i += 1 }
                guard i < end, p[i] == UInt8(ascii: ";") else { return fail("http1.invalid_chunk_ext", i, "expected ';' in chunk extension") }
                i += 1
                while i < end && HTTP1Syntax.isOWS(p[i]) { i += 1 }
                let nameStart = i
                while i < end && HTTP1Syntax.isTchar(p[i]) { i += 1 }
                if i == nameStart { return fail("http1.invalid_chunk_ext", i, "chunk extension name is not a token") }
                var j = i
                while j < end && HTTP1Syntax.isOWS(p[j]) { j += 1 }
                if j < end && p[j] == UInt8(ascii: "=") {
                    i = j + 1
                    while i < end && HTTP1Syntax.isOWS(p[i]) { i += 1 }
                    if i < end && p[i] == UInt8(ascii: "\"") {
                        // quoted-string (RFC 9110 §5.6.4)
                        i += 1
                        var closed = false
                        while i < end {
                            let c = p[i]
                            if c == UInt8(ascii: "\"") { closed = true; i += 1; break }
                            if c == UInt8(ascii: "\\") {
                                guard i + 1 < end else { break }
                                let q = p[i + 1]
                                guard q == asciiHTAB || (q >= asciiSP && q != 0x7F) else {
                                    return fail("http1.invalid_chunk_ext", i + 1, "invalid quoted-pair")
                                }
                                i += 2
                                continue
                            }
                            guard c == asciiHTAB || (c >= asciiSP && c != 0x7F) else {
                                return fail("http1.invalid_chunk_ext", i, "invalid byte in quoted-string")
                            }
                            i += 1
                        }
                        if !closed { return fail("http1.invalid_chunk_ext", i, "unterminated quoted-string") }
                    } else {
                        let valueStart = i
                        while i < end && HTTP1Syntax.isTchar(p[i]) { i += 1 }
                        if i == valueStart { return fail("http1.invalid_chunk_ext", i, "chunk extension value is not a token or quoted-string") }
                    }
                }
                // BWS only precedes ";" or "=": trailing whitespace at the line end is invalid.
                if i < end && !(HTTP1Syntax.isOWS(p[i]) || p[i] == UInt8(ascii: ";")) {
                    return fail("http1.invalid_chunk_ext", i, "unexpected byte in chunk extension")
                }
                if i < end {
                    var k = i
                    while k < end && HTTP1Syntax.isOWS(p[k]) { k += 1 }
                    if k == end { return fail("http1.invalid_chunk_ext", i, "trailing whitespace in chunk extension") }
                }
            }
            return .success(size)
        }
        return try result.get()
    }
}
