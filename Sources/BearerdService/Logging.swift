import Dispatch
import Foundation
import Logging
import Synchronization
import BearerdIO
import BearerdOAuth
import BearerdProxyCore
import BearerdConfig
import BearerdSessions

/// The process's log level and format, shared by every `BearerdLogHandler` made with it so a
/// SIGHUP can change them for loggers already handed out. Lock-free reads (one atomic load per
/// log call).
public final class LogSettings: Sendable {
    private let levelIndex: Atomic<Int>
    private let formatIndex: Atomic<Int>
    private static let levels = Logger.Level.allCases
    private static let formats = LogFormat.allCases

    public init(level: Logger.Level, format: LogFormat) {
        levelIndex = Atomic(Self.levels.firstIndex(of: level) ?? 2)
        formatIndex = Atomic(Self.formats.firstIndex(of: format) ?? 0)
    }

    public var level: Logger.Level {
        get { Self.levels[levelIndex.load(ordering: .relaxed)] }
        set { levelIndex.store(Self.levels.firstIndex(of: newValue) ?? 2, ordering: .relaxed) }
    }

    public var format: LogFormat {
        get { Self.formats[formatIndex.load(ordering: .relaxed)] }
        set { formatIndex.store(Self.formats.firstIndex(of: newValue) ?? 0, ordering: .relaxed) }
    }
}

/// A buffered writer for log lines, one per process. Lines are appended under `lock` (from any
/// thread: the event loops, the session drivers); the bytes reach the fd from the sink's own
/// queue, by a 100 ms timer or as soon as 64 KiB are pending, so an event loop never waits for
/// the disk or a full pipe while it serves requests. Warnings and errors are written at once by
/// the thread that logs them, and a writer that finds 8 MiB pending (the fd takes bytes slower
/// than they come) writes them itself: back-pressure instead of unbounded memory, no line lost.
/// Invariant: `writeLock` is held from taking the pending bytes to the end of their `write(2)`
/// calls, so chunks reach the fd whole and in the order their lines were appended, whichever
/// thread flushes.
public final class LogSink: @unchecked Sendable {  // @unchecked: `buffer` and `flushQueued` guarded by `lock`
    public static let stderr = LogSink(fd: 2)
    /// Pending bytes that make the sink's queue write them (before the timer would).
    static let flushThreshold = 64 * 1024
    /// Pending bytes at which the appending thread writes them itself.
    static let backPressureLimit = 8 * 1024 * 1024
    private let fd: Int32
    private let lock = Lock()
    private let writeLock = Lock()
    private var buffer: [UInt8] = []
    /// A flush was handed to `queue` and has not taken the buffer yet.
    private var flushQueued = false
    private let queue = DispatchQueue(label: "bearerd.log")
    private var timer: DispatchSourceTimer?

    init(fd: Int32) {
        self.fd = fd
        buffer.reserveCapacity(Self.flushThreshold)
        let t = DispatchSource.makeTimerSource(queue: queue)
        t.schedule(deadline: .now() + .milliseconds(100), repeating: .milliseconds(100), leeway: .milliseconds(50))
        t.setEventHandler { [weak self] in self?.flush() }
        t.resume()
        timer = t
    }

    public func write(_ line: String, urgent: Bool) {
        var line = line
        line.withUTF8 { write($0, urgent: urgent) }
    }

    /// What an appended line asks of the thread that appended it.
    private enum AfterAppend { case nothing, queueFlush, flushHere }

    /// A line in a buffer of the caller's (no trailing newline), copied in.
    public func write(_ line: UnsafeBufferPointer<UInt8>, urgent: Bool) {
        let after: AfterAppend = lock.withLock {
            buffer.append(contentsOf: line)
            buffer.append(10)
            if buffer.count >= Self.backPressureLimit { return .flushHere }
            if buffer.count >= Self.flushThreshold && !flushQueued {
                flushQueued = true
                return .queueFlush
            }
            return .nothing
        }
        if urgent || after == .flushHere {
            flush()
        } else if after == .queueFlush {
            queue.async { [self] in flush() }
        }
    }

    /// A line already in bytes (no trailing newline).
    public func write(bytes line: [UInt8], urgent: Bool) {
        line.withUnsafeBufferPointer { write($0, urgent: urgent) }
    }

    /// Writes every pending byte before it returns (the caller's thread).
    public func flush() {
        writeLock.withLock {
            // The 100 ms timer finds nothing pending most of the time: no fresh room then.
            let pending: Bool = lock.withLock {
                flushQueued = false
                return !buffer.isEmpty
            }
            guard pending else { return }
            var data: [UInt8] = []
            data.reserveCapacity(Self.flushThreshold)  // outside `lock`: the loops append meanwhile
            lock.withLock {
                flushQueued = false
                swap(&data, &buffer)  // the next lines go to fresh room: a burst's capacity is not kept
            }
            var offset = 0
            while offset < data.count {
                let n = data.withUnsafeBytes { Foundation.write(fd, $0.baseAddress! + offset, data.count - offset) }
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                offset += n
            }
        }
    }
}

/// One access-log line (docs/architecture.md §5: method, path without query, route, status, upstream time,
/// bytes), logged as the single metadata value `access` so the handler can write it without
/// building a dictionary of strings. Other handlers print its `description` (logfmt).
public struct AccessRecord: CustomStringConvertible, Sendable {
    public var method: String
    public var path: String
    public var route: String
    public var status: Int
    /// Time to the upstream's response head; -1 when there was none.
    public var upstreamMicros: Int
    public var totalMicros: Int
    public var bytes: UInt64
    public var outcome: String?
    public var session: String?
    public var generation: UInt64?
    public var replayed: Bool
    /// The client's protocol (`h1`, `h2`) and the upstream's, when known.
    public var protocolName: String?
    public var upstreamProtocol: String?
    /// gRPC calls: the `grpc-status` the client got.
    public var grpcStatus: String?

    public init(method: String, path: String, route: String, status: Int, upstreamMicros: Int, totalMicros: Int, bytes: UInt64,
                outcome: String?, session: String?, generation: UInt64?, replayed: Bool) {
        self.method = method
        self.path = path
        self.route = route
        self.status = status
        self.upstreamMicros = upstreamMicros
        self.totalMicros = totalMicros
        self.bytes = bytes
        self.outcome = outcome
        self.session = session
        self.generation = generation
        self.replayed = replayed
    }

    public var description: String { logfmt }

    static func millis(_ micros: Int) -> String {
        if micros < 0 { return "-" }
        let frac = micros % 1000
        return "\(micros / 1000)." + (frac < 10 ? "00" : frac < 100 ? "0" : "") + String(frac)
    }

    public var logfmt: String {
        var s = "method=" + BearerdLogHandler.quoteIfNeeded(method) + " path=" + BearerdLogHandler.quoteIfNeeded(path) + " route=" + BearerdLogHandler.quoteIfNeeded(route)
        s += " status=" + String(status) + " upstream_ms=" + Self.millis(upstreamMicros) + " total_ms=" + Self.millis(totalMicros)
        s += " bytes=" + String(bytes)
        if let outcome { s += " outcome=" + BearerdLogHandler.quoteIfNeeded(outcome) }
        if let session { s += " session=" + BearerdLogHandler.quoteIfNeeded(session) }
        if let generation { s += " token.generation=" + String(generation) }
        if replayed { s += " replayed=1" }
        if let protocolName { s += " protocol=" + BearerdLogHandler.quoteIfNeeded(protocolName) }
        if let upstreamProtocol { s += " upstream_protocol=" + BearerdLogHandler.quoteIfNeeded(upstreamProtocol) }
        if let grpcStatus { s += " grpc_status=" + BearerdLogHandler.quoteIfNeeded(grpcStatus) }
        return s
    }

    /// `logfmt` and `jsonFields` written as bytes into `out`: the access line's hot path builds
    /// no intermediate strings (measured: the log line cost ~16 % of throughput as strings).
    func appendLogfmt<Out: LineOutput>(to out: inout Out) {
        LineBytes.raw("method=", &out); LineBytes.quotedIfNeeded(method, &out)
        LineBytes.raw(" path=", &out); LineBytes.quotedIfNeeded(path, &out)
        LineBytes.raw(" route=", &out); LineBytes.quotedIfNeeded(route, &out)
        LineBytes.raw(" status=", &out); LineBytes.int(status, &out)
        LineBytes.raw(" upstream_ms=", &out)
        if upstreamMicros < 0 { out.put(UInt8(ascii: "-")) } else { LineBytes.millis(upstreamMicros, &out) }
        LineBytes.raw(" total_ms=", &out); LineBytes.millis(max(0, totalMicros), &out)
        LineBytes.raw(" bytes=", &out); LineBytes.uint(bytes, &out)
        if let outcome { LineBytes.raw(" outcome=", &out); LineBytes.quotedIfNeeded(outcome, &out) }
        if let session { LineBytes.raw(" session=", &out); LineBytes.quotedIfNeeded(session, &out) }
        if let generation { LineBytes.raw(" token.generation=", &out); LineBytes.uint(generation, &out) }
        if replayed { LineBytes.raw(" replayed=1", &out) }
        if let protocolName { LineBytes.raw(" protocol=", &out); LineBytes.quotedIfNeeded(protocolName, &out) }
        if let upstreamProtocol { LineBytes.raw(" upstream_protocol=", &out); LineBytes.quotedIfNeeded(upstreamProtocol, &out) }
        if let grpcStatus { LineBytes.raw(" grpc_status=", &out); LineBytes.quotedIfNeeded(grpcStatus, &out) }
    }

    func appendJSONFields<Out: LineOutput>(to out: inout Out) {
        LineBytes.raw("\"method\":", &out); LineBytes.json(method, &out)
        LineBytes.raw(",\"path\":", &out); LineBytes.json(path, &out)
        LineBytes.raw(",\"route\":", &out); LineBytes.json(route, &out)
        LineBytes.raw(",\"status\":", &out); LineBytes.int(status, &out)
        LineBytes.raw(",\"upstream_ms\":", &out)
        if upstreamMicros < 0 { LineBytes.raw("null", &out) } else { LineBytes.millis(upstreamMicros, &out) }
        LineBytes.raw(",\"total_ms\":", &out); LineBytes.millis(max(0, totalMicros), &out)
        LineBytes.raw(",\"bytes\":", &out); LineBytes.uint(bytes, &out)
        if let outcome { LineBytes.raw(",\"outcome\":", &out); LineBytes.json(outcome, &out) }
        if let session { LineBytes.raw(",\"session\":", &out); LineBytes.json(session, &out) }
        if let generation { LineBytes.raw(",\"token.generation\":", &out); LineBytes.uint(generation, &out) }
        if replayed { LineBytes.raw(",\"replayed\":true", &out) }
        if let protocolName { LineBytes.raw(",\"protocol\":", &out); LineBytes.json(protocolName, &out) }
        if let upstreamProtocol { LineBytes.raw(",\"upstream_protocol\":", &out); LineBytes.json(upstreamProtocol, &out) }
        if let grpcStatus { LineBytes.raw(",\"grpc_status\":", &out); LineBytes.json(grpcStatus, &out) }
    }

    public var jsonFields: String {
        var s = "\"method\":" + ErrorResponse.jsonString(method) + ",\"path\":" + ErrorResponse.jsonString(path)
        s += ",\"route\":" + ErrorResponse.jsonString(route) + ",\"status\":" + String(status)
        s += ",\"upstream_ms\":" + (upstreamMicros < 0 ? "null" : Self.millis(upstreamMicros))
        s += ",\"total_ms\":" + Self.millis(totalMicros) + ",\"bytes\":" + String(bytes)
        if let outcome { s += ",\"outcome\":" + ErrorResponse.jsonString(outcome) }
        if let session { s += ",\"session\":" + ErrorResponse.jsonString(session) }
        if let generation { s += ",\"token.generation\":" + String(generation) }
        if replayed { s += ",\"replayed\":true" }
        if let protocolName { s += ",\"protocol\":" + ErrorResponse.jsonString(protocolName) }
        if let upstreamProtocol { s += ",\"upstream_protocol\":" + ErrorResponse.jsonString(upstreamProtocol) }
        if let grpcStatus { s += ",\"grpc_status\":" + ErrorResponse.jsonString(grpcStatus) }
        return s
    }
}

/// swift-log handler writing one line per message, `text` (logfmt-like) or `json`.
/// Never give it a secret: callers log fingerprints (docs/architecture.md §5).
public struct BearerdLogHandler: LogHandler {
    /// The level: the shared settings' (changed on SIGHUP) unless set on this handler.
    public var logLevel: Logger.Level {
        get { ownLevel ?? settings.level }
        set { ownLevel = newValue }
    }
    public var metadata: Logger.Metadata = [:]
    private let label: String
    private let settings: LogSettings
    private var ownLevel: Logger.Level?
    private var format: LogFormat { settings.format }
    private let sink: LogSink

    public init(label: String, level: Logger.Level, format: LogFormat, sink: LogSink = .stderr) {
        self.init(label: label, settings: LogSettings(level: level, format: format), sink: sink)
    }

    /// A handler following `settings` (level and format changeable at run time).
    public init(label: String, settings: LogSettings, sink: LogSink = .stderr) {
        self.label = label
        self.settings = settings
        self.sink = sink
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(level: Logger.Level, message: Logger.Message, metadata explicit: Logger.Metadata?,
                    source: String, file: String, function: String, line: UInt) {
        // Fast path for the per-request line: fields in a fixed order, no dictionary walk or sort.
        if metadata.isEmpty, let explicit, explicit.count == 1,
           case .stringConvertible(let value)? = explicit["access"], let record = value as? AccessRecord {
            writeAccess(record, level: level, message: message.description)
            return
        }
        let all: Logger.Metadata
        if metadata.isEmpty {
            all = explicit ?? [:]
        } else {
            var m = metadata
            if let explicit { m.merge(explicit) { $1 } }
            all = m
        }
        let ts = Self.timestamp()
        var out: String
        switch format {
        case .text:
            out = "\(ts) \(level) \(message)"
            for (k, v) in all.sorted(by: { $0.key < $1.key }) {
                out += " \(k)=\(Self.quoteIfNeeded("\(v)"))"
            }
        case .json:
            out = "{\"ts\":\"\(ts)\",\"level\":\"\(level)\",\"msg\":\(ErrorResponse.jsonString("\(message)"))"
            for (k, v) in all.sorted(by: { $0.key < $1.key }) {
                out += ",\(ErrorResponse.jsonString(k)):\(ErrorResponse.jsonString("\(v)"))"
            }
            out += "}"
        }
        sink.write(Redaction.scrub(out), urgent: level >= .warning)
    }

    /// The access line, written as bytes (the request path's hot path: no metadata dictionary,
    /// no existential box or cast when called directly, no intermediate strings).
    public func writeAccess(_ record: AccessRecord, level: Logger.Level = .info, message: String = "request") {
        // Most lines fit 1 KiB: written into a buffer on the stack and copied once into the
        // sink. A longer one is written again into an array.
        //
        // Credentials: the line is scanned whole only when one of its values, as written, holds
        // a credential marker (`LineCursor.valueHoldsCredential`). The line's fixed parts (keys,
        // numbers, timestamp, level) are bearerd's own and hold none, and a value is written
        // after `":"` or `=` and before `"` or a space, so a marker in the line starts at a word
        // start in a value exactly when it does in that value: in JSON, what the whole-line scan
        // redacts is exactly what it redacted when it ran on every line, at a tenth of the
        // bytes. One difference in the text format, on purpose: a value ending in a marker
        // (`…/bearer`, `…password:`) no longer makes the scan run on into the next field and
        // redact bearerd's own `key=value` there.
        let done: Bool = withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 1024) { buffer in
            var cursor = LineCursor(buffer)
            accessLine(record, level: level, message: message, into: &cursor)
            guard !cursor.overflowed else { return false }
            let line = cursor.written
            if cursor.valueHoldsCredential {
                var copy = Array(line)
                Redaction.scrub(bytes: &copy)
                sink.write(bytes: copy, urgent: false)
            } else {
                sink.write(line, urgent: false)
            }
            return true
        }
        if done { return }
        var line: [UInt8] = []
        line.reserveCapacity(2048)
        accessLine(record, level: level, message: message, into: &line)
        Redaction.scrub(bytes: &line)
        sink.write(bytes: line, urgent: false)
    }

    /// The access line in this handler's format, without its newline.
    private func accessLine<Out: LineOutput>(_ record: AccessRecord, level: Logger.Level, message: String, into line: inout Out) {
        if format == .text {
            LineBytes.timestamp(&line)
            line.put(UInt8(ascii: " "))
            LineBytes.raw(level.rawValue, &line)
            line.put(UInt8(ascii: " "))
            LineBytes.value(message, &line)
            line.put(UInt8(ascii: " "))
            record.appendLogfmt(to: &line)
        } else {
            LineBytes.raw("{\"ts\":\"", &line)
            LineBytes.timestamp(&line)
            LineBytes.raw("\",\"level\":\"", &line)
            LineBytes.raw(level.rawValue, &line)
            LineBytes.raw("\",\"msg\":", &line)
            LineBytes.json(message, &line)
            line.put(UInt8(ascii: ","))
            record.appendJSONFields(to: &line)
            line.put(UInt8(ascii: "}"))
        }
    }

    /// logfmt: as is, or JSON-quoted when empty or holding a space, `"`, `=` or a control
    /// byte (a value never breaks or forges a line).
    static func quoteIfNeeded(_ s: String) -> String {
        if s.isEmpty { return "\"\"" }
        if s.utf8.contains(where: LineBytes.needsQuotes) {
            return ErrorResponse.jsonString(s)
        }
        return s
    }

    static func timestamp() -> String {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        var t = time_t(ts.tv_sec)
        var tmv = tm()
        gmtime_r(&t, &tmv)
        let ms = Int(ts.tv_nsec) / 1_000_000
        func pad(_ v: Int32, _ w: Int) -> String {
            let s = String(v)
            return String(repeating: "0", count: max(0, w - s.count)) + s
        }
        return "\(tmv.tm_year + 1900)-\(pad(tmv.tm_mon + 1, 2))-\(pad(tmv.tm_mday, 2))T\(pad(tmv.tm_hour, 2)):\(pad(tmv.tm_min, 2)):\(pad(tmv.tm_sec, 2)).\(pad(Int32(ms), 3))Z"
    }
}

/// Where the log-line writers (`LineBytes`) put bytes: a growing array, or a `LineCursor`
/// into a buffer sized in advance (the access line's path: no per-piece array bookkeeping).
protocol LineOutput {
    mutating func put(_ byte: UInt8)
    mutating func put(_ bytes: UnsafeBufferPointer<UInt8>)
    /// Where the next byte goes.
    var position: Int { get }
    /// The bytes from `start` on are a value from outside (a path, a name): note whether they
    /// hold a credential marker.
    mutating func checkValue(from start: Int)
}

extension Array: LineOutput where Element == UInt8 {
    @inline(__always) mutating func put(_ byte: UInt8) { append(byte) }
    @inline(__always) mutating func put(_ bytes: UnsafeBufferPointer<UInt8>) { append(contentsOf: bytes) }
    var position: Int { count }
    /// Nothing: a line written into an array is scanned whole.
    func checkValue(from start: Int) {}
}

/// Writes into a fixed buffer it does not own. What does not fit is dropped and `overflowed`
/// is set: the caller then writes the line again into an array (never past the buffer).
struct LineCursor: LineOutput {
    let buffer: UnsafeMutableBufferPointer<UInt8>
    private(set) var count = 0
    private(set) var overflowed = false

    init(_ buffer: UnsafeMutableBufferPointer<UInt8>) { self.buffer = buffer }

    @inline(__always) mutating func put(_ byte: UInt8) {
        guard count < buffer.count else { overflowed = true; return }
        buffer.initializeElement(at: count, to: byte)  // the buffer is temporary, uninitialized memory
        count &+= 1
    }

    @inline(__always) mutating func put(_ bytes: UnsafeBufferPointer<UInt8>) {
        guard bytes.count <= buffer.count - count else { overflowed = true; return }
        _ = UnsafeMutableBufferPointer(rebasing: buffer[count..<(count + bytes.count)]).initialize(fromContentsOf: bytes)
        count &+= bytes.count
    }

    /// The bytes written so far.
    var written: UnsafeBufferPointer<UInt8> { UnsafeBufferPointer(rebasing: buffer[..<count]) }

    /// Whether a value written holds a credential marker (then the line is scanned whole).
    private(set) var valueHoldsCredential = false

    @inline(__always) var position: Int { count }

    @inline(__always) mutating func checkValue(from start: Int) {
        // Most values (methods, short paths, names) are too short to hold a credential.
        guard !valueHoldsCredential, count - start >= Redaction.shortestCredential else { return }
        valueHoldsCredential = Redaction.containsCredential(UnsafeBufferPointer(rebasing: buffer[start..<count]))
    }
}

/// Byte-level pieces of a log line (the access line's path): no intermediate strings.
enum LineBytes {
    /// `s`'s bytes: one copy of its contiguous UTF-8 (string literals and native strings), not
    /// an iteration of its view.
    @inline(__always)
    static func raw<Out: LineOutput>(_ s: String, _ out: inout Out) {
        if s.utf8.withContiguousStorageIfAvailable({ out.put($0) }) == nil {
            for b in s.utf8 { out.put(b) }
        }
    }

    static func int<Out: LineOutput>(_ v: Int, _ out: inout Out) {
        if v < 0 {
            out.put(UInt8(ascii: "-"))
            uint(v.magnitude.toUInt64, &out)
        } else {
            uint(UInt64(v), &out)
        }
    }

    static func uint<Out: LineOutput>(_ v: UInt64, _ out: inout Out) {
        if v < 10 {
            out.put(UInt8(truncatingIfNeeded: v) &+ 0x30)
            return
        }
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 20) { d in
            var n = 0
            var v = v
            repeat {
                d[19 - n] = UInt8(truncatingIfNeeded: v % 10) &+ 0x30
                v /= 10
                n += 1
            } while v > 0 && n < 20
            out.put(UnsafeBufferPointer(rebasing: d[(20 - n)...]))
        }
    }

    /// Microseconds as milliseconds with three decimals (`12.345`).
    static func millis<Out: LineOutput>(_ micros: Int, _ out: inout Out) {
        let m = max(0, micros)
        uint(UInt64(m / 1000), &out)
        out.put(UInt8(ascii: "."))
        let frac = m % 1000
        out.put(UInt8(frac / 100) + 0x30)
        out.put(UInt8(frac / 10 % 10) + 0x30)
        out.put(UInt8(frac % 10) + 0x30)
    }

    /// A JSON string literal (as `JSONWriter.quote`: `"`, `\\`, and control characters escaped).
    static func json<Out: LineOutput>(_ s: String, _ out: inout Out) {
        let hex: StaticString = "0123456789abcdef"
        out.put(UInt8(ascii: "\""))
        let start = out.position
        defer {
            out.checkValue(from: start)
            out.put(UInt8(ascii: "\""))
        }
        // Most values (methods, paths, names) need no escape: copied in one piece.
        let copied = s.utf8.withContiguousStorageIfAvailable { bytes -> Bool in
            for b in bytes where b < 0x20 || b == UInt8(ascii: "\"") || b == UInt8(ascii: "\\") { return false }
            out.put(bytes)
            return true
        }
        if copied == true { return }
        for b in s.utf8 {
            switch b {
            case UInt8(ascii: "\""): out.put(UInt8(ascii: "\\")); out.put(b)
            case UInt8(ascii: "\\"): out.put(UInt8(ascii: "\\")); out.put(b)
            case 0x0A: out.put(UInt8(ascii: "\\")); out.put(UInt8(ascii: "n"))
            case 0x0D: out.put(UInt8(ascii: "\\")); out.put(UInt8(ascii: "r"))
            case 0x09: out.put(UInt8(ascii: "\\")); out.put(UInt8(ascii: "t"))
            case 0..<0x20:
                raw("\\u00", &out)
                out.put(hex.utf8Start[Int(b >> 4)])
                out.put(hex.utf8Start[Int(b & 0xF)])
            default: out.put(b)
            }
        }
    }

    /// logfmt: as is, or JSON-quoted when empty or holding a space, `"`, `=` or a control byte.
    static func quotedIfNeeded<Out: LineOutput>(_ s: String, _ out: inout Out) {
        if s.isEmpty || s.utf8.contains(where: needsQuotes) {
            json(s, &out)
        } else {
            value(s, &out)
        }
    }

    /// `s` as it is, checked for credentials as a value from outside.
    @inline(__always)
    static func value<Out: LineOutput>(_ s: String, _ out: inout Out) {
        let start = out.position
        raw(s, &out)
        out.checkValue(from: start)
    }

    /// A byte a logfmt value cannot hold unquoted: a space, `"`, `=`, a control byte or DEL.
    @inline(__always)
    static func needsQuotes(_ b: UInt8) -> Bool { b <= 0x20 || b == 0x22 || b == 0x3D || b == 0x7F }

    /// `2026-11-25T01:41:31.954Z` (UTC, milliseconds), as `BearerdLogHandler.timestamp()`.
    static func timestamp<Out: LineOutput>(_ out: inout Out) {
        var ts = timespec()
        clock_gettime(CLOCK_REALTIME, &ts)
        timestamp(seconds: Int64(ts.tv_sec), millis: Int(ts.tv_nsec) / 1_000_000, &out)
    }

    /// The timestamp of `seconds` since the epoch and `millis`, written digit by digit into a
    /// fixed buffer and appended once; the civil date is computed (`CivilTime`), not asked of
    /// `gmtime_r`. Years outside
    /// 0...9999 are clamped to them, as no clock of a running system shows them.
    static func timestamp<Out: LineOutput>(seconds: Int64, millis: Int, _ out: inout Out) {
        let civil = CivilTime(epochSeconds: seconds)
        let (year, month, day, secondOfDay) = (civil.year, civil.month, civil.day, civil.secondOfDay)
        let ms = min(max(millis, 0), 999)
        withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 24) { b in
            func put2(_ v: Int, at i: Int) {
                b[i] = UInt8(truncatingIfNeeded: v / 10) &+ 0x30
                b[i + 1] = UInt8(truncatingIfNeeded: v % 10) &+ 0x30
            }
            put2(year / 100, at: 0)
            put2(year % 100, at: 2)
            b[4] = UInt8(ascii: "-")
            put2(month, at: 5)
            b[7] = UInt8(ascii: "-")
            put2(day, at: 8)
            b[10] = UInt8(ascii: "T")
            put2(secondOfDay / 3_600, at: 11)
            b[13] = UInt8(ascii: ":")
            put2(secondOfDay / 60 % 60, at: 14)
            b[16] = UInt8(ascii: ":")
            put2(secondOfDay % 60, at: 17)
            b[19] = UInt8(ascii: ".")
            b[20] = UInt8(truncatingIfNeeded: ms / 100) &+ 0x30
            put2(ms % 100, at: 21)
            b[23] = UInt8(ascii: "Z")
            out.put(UnsafeBufferPointer(b))
        }
    }
}

private extension UInt {
    var toUInt64: UInt64 { UInt64(self) }
}
