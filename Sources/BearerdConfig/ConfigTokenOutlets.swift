import BearerdProxyCore
import Yams

/// What a sink file holds (docs/architecture.md §4 `sinks:`): the token alone, the header line the proxy
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

/// `token_api:` (docs/architecture.md §4): `GET /v1/token/NAME` for local programs, on a unix socket
/// (SO_PEERCRED against `allowed_uids`) or a loopback TCP port (requests carry
/// `Bearerd-Token-Request: 1`; browser requests are refused).
public struct TokenAPIConfig: Sendable, Equatable {
    public var listen: ListenAddress
    /// The only sessions served, in file order.
    public var sessions: [String]
    /// unix: the peer uids admitted; nil means only the uid bearerd runs as.
    public var allowedUIDs: [UInt32]?
    /// `authorization_token_file:` (docs/architecture.md §6.15): the file whose content every
    /// `GET /v1/credentials/NAME` must carry as its `Authorization` field (what an AWS SDK sends
    /// from `AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE)`); read per request. With it, a TCP
    /// request for credentials needs no `Bearerd-Token-Request: 1`.
    public var authorizationTokenFile: String?
    public var line: Int

    public init(listen: ListenAddress, sessions: [String], allowedUIDs: [UInt32]? = nil, authorizationTokenFile: String? = nil, line: Int = 0) {
        self.listen = listen
        self.sessions = sessions
        self.allowedUIDs = allowedUIDs
        self.authorizationTokenFile = authorizationTokenFile
        self.line = line
    }

    public static func == (a: TokenAPIConfig, b: TokenAPIConfig) -> Bool {
        a.listen == b.listen && a.sessions == b.sessions && a.allowedUIDs == b.allowedUIDs
            && a.authorizationTokenFile == b.authorizationTokenFile
    }

    public var isUnix: Bool {
        if case .unix = listen { return true }
        return false
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

    /// `token_api:` — `listen` (unix:/path or a loopback host:port), `sessions` (names defined
    /// under `sessions:`), `allowed_uids` (unix only).
    func tokenAPI(_ entry: Entry, sessionNames: [String], listeners: [ListenerConfig], admin: ListenAddress?) -> TokenAPIConfig? {
        guard let f = fields(entry.value, path: "token_api", line: entry.keyLine, known: ConfigKeys.tokenAPI,
                             expected: "a mapping (listen, sessions, allowed_uids, authorization_token_file)") else { return nil }
        var listen: ListenAddress?
        if let e = f["listen"] {
            listen = address(e.value, key: f.key("listen"))
            if let l = listen, case .tcp(let host, _) = l,
               !HostAllowlist.isBuiltInLoopbackName(Substring(host)) || host.lowercased().hasSuffix("localhost") {
                fail(e.valueLine, f.key("listen"), "\(l) is not a loopback address: the token API hands out tokens, so it listens only on "
                     + "127.0.0.1, [::1] (a numeric loopback address) or a unix: socket")
                listen = nil
            }
            if let l = listen, listeners.contains(where: { $0.address == l }) || l == admin {
                fail(e.valueLine, f.key("listen"), "\(l) is also a listen or admin address; the token API needs its own")
                listen = nil
            }
        } else {
            missing(f, "listen", "e.g. unix:/run/bearerd/token.sock or 127.0.0.1:9902")
        }
        var names: [String] = []
        if let e = f["sessions"] {
            if let items = listItems(e, key: f.key("sessions"), expected: "a list of session names") {
                for (i, item) in items.enumerated() {
                    let k = "\(f.key("sessions"))[\(i)]"
                    guard case .scalar(let s) = item, !Self.isNull(item), !s.string.isEmpty else {
                        fail(Self.line(item), k, "expected a session name, got \(Self.describe(item))")
                        continue
                    }
                    let n = s.string
                    guard sessionNames.contains(n) else {
                        var message = "no session named '\(n)'"
                        if let guess = ConfigValues.suggestion(for: n, among: sessionNames) {
                            message += " (did you mean \(guess)?)"
                        } else if !sessionNames.isEmpty {
                            message += " (defined: \(sessionNames.joined(separator: ", ")))"
                        }
                        fail(Self.line(item), k, message)
                        continue
                    }
                    if !names.contains(n) { names.append(n) }
                }
                if items.isEmpty { fail(e.valueLine, f.key("sessions"), "expected at least one session name") }
            }
        } else {
            missing(f, "sessions", "the sessions whose tokens it hands out, e.g. [partner]")
        }
        var uids: [UInt32]?
        if let e = f["allowed_uids"] {
            if case .tcp? = listen {
                fail(e.keyLine, f.key("allowed_uids"), "applies to a unix: listen only (a TCP peer's uid cannot be checked)")
            } else {
                uids = idList(e, in: f, kind: .user)
            }
        }
        // The AWS SDKs' container-credentials provider sends AWS_CONTAINER_AUTHORIZATION_TOKEN(_FILE)
        // as Authorization: the file's content must match (re-read per request).
        let tokenFile = path(f, "authorization_token_file", mustRead: true)
        guard let listen else { return nil }
        return TokenAPIConfig(listen: listen, sessions: names, allowedUIDs: uids, authorizationTokenFile: tokenFile, line: entry.keyLine)
    }
}
