import BearerdOAuth
import Foundation
import Logging
import Yams
import BearerdProxyCore

/// One entry of `listen:` with its access-control settings (docs/architecture.md §4).
///
/// A plain address (`127.0.0.1:8080`, `unix:/run/bearerd/api.sock`) gets the defaults; the
/// mapping form adds, for `unix:` sockets, the socket file's `mode`/`owner`/`group` and the peers
/// allowed in (`allow_uids`/`allow_gids`, checked with SO_PEERCRED), and for TCP `allow_remote`
/// (required for a non-loopback address) and `allowed_hosts` (the Host allowlist of loopback
/// listeners, against DNS rebinding). Every listener, TCP or unix, takes `allowed_origins` (the
/// web apps its browser guard admits, docs/architecture.md §5). `name` matches a socket-activated fd (`LISTEN_FDNAMES`).
/// Equality ignores `line`, so a reload sees an unchanged listener as unchanged.
/// `tls:` of a TCP listener: it serves HTTPS with ALPN `h2,http/1.1`.
public struct ListenerTLS: Sendable, Equatable {
    /// PEM certificate chain file.
    public var cert: String
    /// PEM private key file.
    public var key: String
    public init(cert: String, key: String) {
        self.cert = cert
        self.key = key
    }
}

public struct ListenerConfig: Sendable, Equatable, CustomStringConvertible {
    public var address: ListenAddress
    /// `tls: {cert, key}`: HTTPS with ALPN h2,http/1.1 (TCP listeners only).
    public var tls: ListenerTLS?
    /// Name given by `name:`; matched against `LISTEN_FDNAMES` under socket activation.
    public var name: String?
    /// Unix sockets: file mode of the socket (default 0660).
    public var mode: UInt32
    /// Unix sockets: owner and group of the socket file (numeric, resolved from names at load).
    public var owner: UInt32?
    public var group: UInt32?
    /// Unix sockets: peers let in, by uid or primary gid (SO_PEERCRED). Both nil: anyone who can
    /// open the socket file (its mode decides).
    public var allowUIDs: [UInt32]?
    public var allowGIDs: [UInt32]?
    /// TCP: a non-loopback address is refused at load unless this is true.
    public var allowRemote: Bool
    /// TCP: Host names (lower-case, no port) allowed besides the defaults; `*` allows any.
    public var allowedHosts: [String]
    /// Origins of web apps the browser guard admits (`BrowserGuard`), each RFC 6454 serialised
    /// (`https://app.example.com`, `http://localhost:3000`); never `*` or `null`.
    public var allowedOrigins: [String]
    /// Source line of the entry, for messages.
    public var line: Int

    public init(address: ListenAddress, name: String? = nil, mode: UInt32 = 0o660, owner: UInt32? = nil, group: UInt32? = nil,
                allowUIDs: [UInt32]? = nil, allowGIDs: [UInt32]? = nil, allowRemote: Bool = false,
                allowedHosts: [String] = [], allowedOrigins: [String] = [], line: Int = 0) {
        self.address = address
        self.name = name
        self.mode = mode
        self.owner = owner
        self.group = group
        self.allowUIDs = allowUIDs
        self.allowGIDs = allowGIDs
        self.allowRemote = allowRemote
        self.allowedHosts = allowedHosts
        self.allowedOrigins = allowedOrigins
        self.line = line
    }

    public var description: String { address.description }

    /// True for TCP listeners on a loopback address (127.0.0.0/8, ::1, localhost): the names the
    /// Host allowlist admits on its own (`HostAllowlist.isBuiltInLoopbackName`).
    public var isLoopback: Bool {
        guard case .tcp(let host, _) = address else { return false }
        return HostAllowlist.isBuiltInLoopbackName(Substring(host))
    }

    /// Whether the Host header of requests must be checked (loopback TCP listeners, unless `*`).
    public var checksHost: Bool { isLoopback && !allowedHosts.contains("*") }

    /// Whether a peer with these credentials may use this listener (unix sockets; TCP: always).
    public func admits(uid: UInt32, gid: UInt32) -> Bool {
        if allowUIDs == nil && allowGIDs == nil { return true }
        return (allowUIDs?.contains(uid) ?? false) || (allowGIDs?.contains(gid) ?? false)
    }

    public static func == (a: ListenerConfig, b: ListenerConfig) -> Bool {
        a.address == b.address && a.name == b.name && a.mode == b.mode && a.owner == b.owner && a.group == b.group
            && a.allowUIDs == b.allowUIDs && a.allowGIDs == b.allowGIDs && a.allowRemote == b.allowRemote
            && a.allowedHosts == b.allowedHosts && a.allowedOrigins == b.allowedOrigins
    }
}

/// `log:` — format and level of the log, and the per-request access line.
/// Output format of log lines.
public enum LogFormat: String, Sendable, CaseIterable {
    case text, json
}

public struct LogConfig: Sendable, Equatable {
    public var format: LogFormat = .text
    public var level: Logger.Level = .info
    /// One line per request (default true).
    public var access: Bool = true
    public init() {}
}

extension ConfigBuilder {
    /// `listen:` — one address or a list; each item a string or a mapping (ListenerConfig).
    /// The top-level `allow_remote`, `allowed_hosts` and `allowed_origins` are each listener's defaults.
    func listeners(_ entry: Entry, allowRemote: Bool, allowedHosts: [String], allowedOrigins: [String] = []) -> [ListenerConfig] {
        var result: [ListenerConfig] = []
        func add(_ node: Node, key: String) {
            guard let l = listener(node, key: key, allowRemote: allowRemote, allowedHosts: allowedHosts, allowedOrigins: allowedOrigins) else { return }
            if result.contains(where: { $0.address == l.address }) {
                fail(l.line, key, "\(l.address) is listed twice")
            } else if let name = l.name, result.contains(where: { $0.name == name }) {
                fail(l.line, key + ".name", "'\(name)' names another listener already")
            } else {
                result.append(l)
            }
        }
        switch entry.value {
        case .sequence(let items):
            if items.isEmpty { fail(entry.valueLine, "listen", "expected at least one address") }
            for (index, item) in items.enumerated() { add(item, key: "listen[\(index)]") }
        default:
            add(entry.value, key: "listen")
        }
        return result
    }

    private func listener(_ node: Node, key: String, allowRemote: Bool, allowedHosts: [String], allowedOrigins: [String]) -> ListenerConfig? {
        let line = Self.line(node)
        var config: ListenerConfig
        if case .mapping = node {
            guard let f = fields(node, path: key, line: line, known: ConfigKeys.listener,
                                 expected: "an address or a mapping (address, mode, owner, group, allow_uids, allow_gids, allow_remote, allowed_hosts, allowed_origins, name, tls)")
            else { return nil }
            let address: ListenAddress?
            switch (f["address"], f["unix"]) {
            case (let a?, nil):
                address = self.address(a.value, key: f.key("address"))
            case (nil, let u?):
                guard let raw = text(u, in: f, expected: "an absolute socket path") else { return nil }
                do throws(ConfigValues.Problem) {
                    address = try ConfigValues.address(raw.hasPrefix("unix:") ? raw : "unix:" + raw)
                } catch {
                    fail(u.valueLine, f.key("unix"), error.message)
                    address = nil
                }
            case (_?, _?):
                fail(line, key, "give either address: or unix:, not both")
                return nil
            case (nil, nil):
                missing(f, "address", "e.g. address: unix:/run/bearerd/api.sock or address: 127.0.0.1:8080")
                return nil
            }
            guard let address else { return nil }
            config = ListenerConfig(address: address, allowRemote: allowRemote, allowedHosts: allowedHosts, allowedOrigins: allowedOrigins, line: line)
            if let e = f["allowed_origins"], let origins = originList(e, key: f.key("allowed_origins")) { config.allowedOrigins = origins }
            if let n = text(f, "name") {
                if n.contains(":") || n.utf8.count > 255 || n.contains(where: { $0.isWhitespace }) {
                    fail(f["name"]!.valueLine, f.key("name"), "a listener name may not hold ':' or spaces (systemd's FileDescriptorName= rules)")
                }
                config.name = n
            }
            let isUnix: Bool
            if case .unix = address { isUnix = true } else { isUnix = false }
            for k in ["mode", "owner", "group", "allow_uids", "allow_gids"] where !isUnix {
                if let e = f[k] { fail(e.keyLine, f.key(k), "applies to unix: listeners only") }
            }
            for k in ["allow_remote", "allowed_hosts", "tls"] where isUnix {
                if let e = f[k] { fail(e.keyLine, f.key(k), "applies to TCP listeners only") }
            }
            if isUnix {
                if let m = parsed(f, "mode", expected: "an octal file mode such as 0660", ConfigValues.fileMode) { config.mode = m }
                if let e = f["owner"], let raw = text(e, in: f, expected: "a user name or uid") {
                    config.owner = resolveID(raw, kind: .user, line: e.valueLine, key: f.key("owner"))
                }
                if let e = f["group"], let raw = text(e, in: f, expected: "a group name or gid") {
                    config.group = resolveID(raw, kind: .group, line: e.valueLine, key: f.key("group"))
                }
                config.allowUIDs = f["allow_uids"].flatMap { idList($0, in: f, kind: .user) }
                config.allowGIDs = f["allow_gids"].flatMap { idList($0, in: f, kind: .group) }
            } else {
                if let b = bool(f, "allow_remote") { config.allowRemote = b }
                if let e = f["allowed_hosts"], let hosts = hostList(e, key: f.key("allowed_hosts")) { config.allowedHosts = hosts }
                if let e = f["tls"],
                   let t = fields(e.value, path: f.key("tls"), line: e.keyLine, known: ConfigKeys.listenerTLS,
                                  expected: "a mapping (cert, key)") {
                    let cert = path(t, "cert", mustRead: true)
                    let key = path(t, "key", mustRead: true)
                    if t["cert"] == nil { missing(t, "cert", "the PEM certificate chain this listener presents") }
                    if t["key"] == nil { missing(t, "key", "the PEM private key of cert") }
                    if let cert, let key { config.tls = ListenerTLS(cert: cert, key: key) }
                }
            }
        } else {
            guard let address = address(node, key: key) else { return nil }
            config = ListenerConfig(address: address, allowRemote: allowRemote, allowedHosts: allowedHosts, allowedOrigins: allowedOrigins, line: line)
        }
        if case .tcp(let host, _) = config.address, !config.isLoopback, !config.allowRemote {
            let shown = host.contains(":") ? "\"\(config.address)\"" : config.address.description
            fail(line, key, "\(config.address) is not a loopback address, so anyone who reaches it could spend bearerd's tokens: "
                 + "listen on 127.0.0.1 or [::1], or, if the network in front is trusted, write {address: \(shown), allow_remote: true} (or allow_remote: true at the top level)")
        }
        return config
    }

    enum IDKind { case user, group }

    /// A uid or gid from a number or a name looked up in the system's user/group database.
    func resolveID(_ raw: String, kind: IDKind, line: Int, key: String) -> UInt32? {
        if let n = UInt32(raw) { return n }
        switch kind {
        case .user:
            if let pw = getpwnam(raw) { return pw.pointee.pw_uid }
            fail(line, key, "no user named '\(raw)' on this system")
        case .group:
            if let gr = getgrnam(raw) { return gr.pointee.gr_gid }
            fail(line, key, "no group named '\(raw)' on this system")
        }
        return nil
    }

    func idList(_ entry: Entry, in f: Fields, kind: IDKind) -> [UInt32]? {
        let key = f.key(entry.name)
        guard let items = listItems(entry, key: key, expected: "a list of \(kind == .user ? "user names or uids" : "group names or gids")") else { return nil }
        var ids: [UInt32] = []
        for (i, item) in items.enumerated() {
            guard case .scalar(let s) = item, !Self.isNull(item), !s.string.isEmpty else {
                fail(Self.line(item), "\(key)[\(i)]", "expected a \(kind == .user ? "user name or uid" : "group name or gid"), got \(Self.describe(item))")
                continue
            }
            if let id = resolveID(s.string, kind: kind, line: Self.line(item), key: "\(key)[\(i)]") { ids.append(id) }
        }
        return ids
    }

    /// `allowed_hosts:` — host names (no port; `*` for any), stored lower-case.
    func hostList(_ entry: Entry, key: String) -> [String]? {
        guard let items = listItems(entry, key: key, expected: "a list of host names") else { return nil }
        var hosts: [String] = []
        for (i, item) in items.enumerated() {
            guard case .scalar(let s) = item, !Self.isNull(item) else {
                fail(Self.line(item), "\(key)[\(i)]", "expected a host name, got \(Self.describe(item))")
                continue
            }
            var h = s.string.lowercased()
            if h.hasPrefix("[") && h.hasSuffix("]") { h = String(h.dropFirst().dropLast()) }
            guard h == "*" || ConfigValues.isHostName(h) || ConfigValues.isIPv6Literal(h) else {
                fail(Self.line(item), "\(key)[\(i)]", "expected a host name without port (or * for any), got \(ConfigValues.quoted(s.string))")
                continue
            }
            hosts.append(h)
        }
        return hosts
    }

    /// `allowed_origins:` — exact origins of web apps the browser guard admits (docs/architecture.md §5), stored
    /// RFC 6454 serialised (`BrowserGuard.normalizedOrigin`). A wildcard and `null` are refused:
    /// either would let any web page spend bearerd's tokens.
    func originList(_ entry: Entry, key: String) -> [String]? {
        guard let items = listItems(entry, key: key, expected: "a list of origins such as https://app.example.com") else { return nil }
        var origins: [String] = []
        for (i, item) in items.enumerated() {
            let itemKey = "\(key)[\(i)]"
            guard case .scalar(let s) = item, !Self.isNull(item) else {
                fail(Self.line(item), itemKey, "expected an origin such as https://app.example.com, got \(Self.describe(item))")
                continue
            }
            switch ConfigValues.origin(s.string) {
            case .success(let origin):
                if !origins.contains(origin) { origins.append(origin) }
            case .failure(let problem):
                fail(Self.line(item), itemKey, problem.message)
            }
        }
        return origins
    }

    /// `log:` — format, level, access.
    func logSection(_ entry: Entry) -> LogConfig? {
        guard let f = fields(entry.value, path: "log", line: entry.keyLine, known: ConfigKeys.log,
                             expected: "a mapping (format, level, access)") else { return nil }
        var log = LogConfig()
        if let v = choice(f, "format", LogFormat.self) { log.format = v }
        if let v = choice(f, "level", Logger.Level.self) { log.level = v }
        if let v = bool(f, "access") { log.access = v }
        return log
    }
}

extension ConfigValues {
    /// One `allowed_origins` entry: `scheme://host[:port]`, RFC 6454 serialised.
    static func origin(_ text: String) -> Result<String, Problem> {
        let example = "such as https://app.example.com or http://localhost:3000"
        if text.contains("*") {
            return .failure(Problem("a wildcard is not accepted: with it any web page could make bearerd act for it and spend its tokens; "
                                    + "list each web app's exact origin, \(example)"))
        }
        if text.lowercased() == "null" {
            return .failure(Problem("null is not accepted: it is the origin of sandboxed frames and data: or file: pages, which any web page can create; "
                                    + "list each web app's exact origin, \(example)"))
        }
        if let origin = BrowserGuard.normalizedOrigin(Substring(text)) { return .success(origin) }
        if let slashes = text.range(of: "://"),
           let path = text[slashes.upperBound...].firstIndex(where: { $0 == "/" || $0 == "?" || $0 == "#" }),
           let origin = BrowserGuard.normalizedOrigin(text[..<path]) {
            return .failure(Problem("an origin has no path, query or fragment: write \(origin), got \(quoted(text))"))
        }
        return .failure(Problem("expected an origin scheme://host[:port], \(example), got \(quoted(text))"))
    }

    /// An octal file mode: `0660`, `660`, `0o660`; at most 0777.
    static func fileMode(_ text: String) throws(Problem) -> UInt32 {
        var digits = Substring(text)
        if digits.hasPrefix("0o") || digits.hasPrefix("0O") { digits = digits.dropFirst(2) }
        guard !digits.isEmpty, digits.allSatisfy({ ("0"..."7").contains($0) }), let v = UInt32(digits, radix: 8), v <= 0o777 else {
            throw Problem("expected an octal file mode such as 0660 (at most 0777), got \(quoted(text))")
        }
        return v
    }
}

extension HostAllowlist {
    /// - Parameters:
    ///   - listener: supplies its own address host and `allowed_hosts`.
    ///   - routeHosts: the `host:` of every route of the configuration in force.
    public init(listener: ListenerConfig, routeHosts: [String]) {
        var extra = listener.allowedHosts + routeHosts
        if case .tcp(let host, _) = listener.address { extra.append(host) }
        self.init(names: extra)
    }
}
