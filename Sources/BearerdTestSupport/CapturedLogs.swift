import Foundation
import Logging

/// Collects log lines in memory so tests can assert on them and scan them for secrets.
/// Shared by all test targets; `lines` guarded by `lock`.
public final class CapturedLogs: @unchecked Sendable {  // @unchecked: `lines` guarded by `lock`
    private let lock = NSLock()
    private var _lines: [String] = []

    public init() {}

    public var lines: [String] { lock.withLock { _lines } }
    public var text: String { lines.joined(separator: "\n") }
    public func append(_ line: String) { lock.withLock { _lines.append(line) } }

    /// A logger at trace level writing into this collection.
    public var logger: Logger {
        Logger(label: "test") { _ in CapturingLogHandler(sink: self) }
    }

    /// The lines that contain any of `secrets` (empty strings ignored); a test expects none.
    public func lines(containingAnyOf secrets: [String]) -> [String] {
        lines.filter { line in secrets.contains { !$0.isEmpty && line.contains($0) } }
    }
}

/// A swift-log handler appending `[level] message key=value …` (keys sorted) to `CapturedLogs`.
public struct CapturingLogHandler: LogHandler {
    public let sink: CapturedLogs
    public var logLevel: Logger.Level = .trace
    public var metadata: Logger.Metadata = [:]

    public init(sink: CapturedLogs) {
        self.sink = sink
    }

    public subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { metadata[key] }
        set { metadata[key] = newValue }
    }

    public func log(level: Logger.Level, message: Logger.Message, metadata explicit: Logger.Metadata?,
                    source: String, file: String, function: String, line: UInt) {
        var all = metadata
        if let explicit { all.merge(explicit) { $1 } }
        let meta = all.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" }.joined(separator: " ")
        sink.append("[\(level)] \(message) \(meta)")
    }
}
