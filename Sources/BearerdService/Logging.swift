import Dispatch
import Foundation
import Logging
import Synchronization
import BearerdIO
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

/// A buffered writer for log lines: lines are appended under a lock and written to the fd by a
/// 100 ms timer, when 64 KiB are pending, or at once for warnings and errors. One per process.
public final class LogSink: @unchecked Sendable {  // @unchecked: `buffer` guarded by `lock`
    public static let stderr = LogSink(fd: 2)
    private let fd: Int32
    private let lock = Lock()
    private var buffer: [UInt8] = []
    private var timer: DispatchSourceTimer?

    init(fd: Int32) {
        self.fd = fd
        buffer.reserveCapacity(64 * 1024)
        let t = DispatchSource.makeTimerSource(queue: DispatchQueue(label: "bearerd.log"))
        t.schedule(deadline: .now() + .milliseconds(100), repeating: .milliseconds(100), leeway: .milliseconds(50))
        t.setEventHandler { [weak self] in self?.flush() }
        t.resume()
        timer = t
    }

    public func write(_ line: String, urgent: Bool) {
        let full: Bool = lock.withLock {
            buffer.append(contentsOf: line.utf8)
            buffer.append(10)
            return buffer.count >= 64 * 1024
        }
        if urgent || full { flush() }
    }

    public func flush() {
        let data: [UInt8] = lock.withLock {
            let d = buffer
            buffer.removeAll(keepingCapacity: true)
            return d
        }
        var offset = 0
        while offset < data.count {
            let n = data.withUnsafeBytes { Foundation.write(fd, $0.baseAddress! + offset, data.count - offset) }
            if n <= 0 { break }
            offset += n
        }
    }
}

/// One access-log line (DESIGN: method, path without query, route, status, upstream time,
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
        var s = "method=" + method + " path=" + BearerdLogHandler.quoteIfNeeded(path) + " route=" + BearerdLogHandler.quoteIfNeeded(route)
        s += " status=" + String(status) + " upstream_ms=" + Self.millis(upstreamMicros) + " total_ms=" + Self.millis(totalMicros)
        s += " bytes=" + String(bytes)
        if let outcome { s += " outcome=" + outcome }
        if let session { s += " session=" + session }
        if let generation { s += " token.generation=" + String(generation) }
        if replayed { s += " replayed=1" }
        if let protocolName { s += " protocol=" + protocolName }
        if let upstreamProtocol { s += " upstream_protocol=" + upstreamProtocol }
        if let grpcStatus { s += " grpc_status=" + BearerdLogHandler.quoteIfNeeded(grpcStatus) }
        return s
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
/// Never give it a secret: callers log fingerprints (DESIGN §5).
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
            let head = format == .text ? "\(Self.timestamp()) \(level) \(message) " : "{\"ts\":\"\(Self.timestamp())\",\"level\":\"\(level)\",\"msg\":\"\(message)\","
            sink.write(Redaction.scrub(head + (format == .text ? record.logfmt : record.jsonFields + "}")), urgent: false)
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

    static func quoteIfNeeded(_ s: String) -> String {
        if s.isEmpty { return "\"\"" }
        if s.contains(where: { $0 == " " || $0 == "\"" || $0 == "=" }) {
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
