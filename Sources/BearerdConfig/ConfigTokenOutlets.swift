import Yams

/// What a sink file holds (DESIGN §4 `sinks:`): the token alone, the header line the proxy
/// would send, or the JSON object of `bearerd token --format json`.
public enum SinkFormat: String, Sendable, Equatable, CaseIterable {
    case token, header, json
}

/// One `sinks:` entry of a session: a file other programs read, rewritten atomically on every
/// new token.
public struct SinkConfig: Sendable, Equatable {
    /// Absolute path of the file.
    public var path: String
    /// File mode, applied exactly (not subject to the umask). Default 0640.
    public var mode: UInt32
    public var format: SinkFormat
    /// Source line of the entry, for messages.
    public var line: Int

    public init(path: String, mode: UInt32 = 0o640, format: SinkFormat = .token, line: Int = 0) {
        self.path = path
        self.mode = mode
        self.format = format
        self.line = line
    }

    public static func == (a: SinkConfig, b: SinkConfig) -> Bool {
        a.path == b.path && a.mode == b.mode && a.format == b.format
    }
}

extension BearerdConfig {
    /// The header the proxy puts a session's token in, as `bearerd token --format header`
    /// and sink files write it: `Authorization: DPoP` for a DPoP session (RFC 9449 §7.1;
    /// `inject:` does not apply there), else the `inject:` of the first route using the session
    /// (routes may disagree; the first decides), else `Authorization: Bearer`.
    public func tokenHeader(for session: SessionConfig) -> InjectConfig {
        if session.dpop { return InjectConfig(header: "Authorization", prefix: "DPoP ", suffix: "") }
        return routes.first(where: { $0.session == session.name })?.inject ?? .bearer
    }

    /// The `token_type` of the JSON form: `DPoP` for a DPoP session, else `Bearer`.
    public static func tokenType(for session: SessionConfig) -> String {
        session.dpop ? "DPoP" : "Bearer"
    }
}

extension ConfigBuilder {
    /// `sinks:` of a session: a list of `{path, mode, format}`.
    func sinks(_ f: Fields) -> [SinkConfig] {
        guard let entry = f["sinks"] else { return [] }
        let key = f.key("sinks")
        guard case .sequence(let items) = entry.value else {
            fail(entry.valueLine, key, "expected a list of sinks, e.g. [{ path: /run/bearerd/partner.token, mode: 0640, format: token }], got \(Self.describe(entry.value))")
            return []
        }
        var out: [SinkConfig] = []
        for (i, item) in items.enumerated() {
            let itemKey = "\(key)[\(i)]"
            guard let s = fields(item, path: itemKey, line: Self.line(item) == 0 ? entry.valueLine : Self.line(item),
                                 known: ConfigKeys.sink, expected: "a sink mapping (path, mode, format)") else { continue }
            if s["path"] == nil { missing(s, "path", "the file other programs read, e.g. /run/bearerd/partner.token") }
            guard let p = path(s, "path", mustRead: false) else { continue }
            if p.hasSuffix("/") {
                fail(s["path"]?.valueLine ?? s.line, s.key("path"), "names a directory; give the file's path")
                continue
            }
            if let dup = out.first(where: { $0.path == p }) {
                fail(s["path"]?.valueLine ?? s.line, s.key("path"), "\(p) is already a sink of this session (line \(dup.line))")
                continue
            }
            var sink = SinkConfig(path: p, line: s["path"]?.valueLine ?? s.line)
            if let m = parsed(s, "mode", expected: "an octal file mode such as 0640", ConfigValues.fileMode) {
                if m & 0o002 != 0 {
                    fail(s["mode"]?.valueLine ?? s.line, s.key("mode"), "a token file must not be world-writable, got \(String(m, radix: 8))")
                    continue
                }
                sink.mode = m
            } else if s["mode"] != nil {
                continue
            }
            if let format = choice(s, "format", SinkFormat.self) {
                sink.format = format
            } else if s["format"] != nil {
                continue
            }
            out.append(sink)
        }
        return out
    }
}
