import BearerdOAuth

/// `outbound_proxy:` (docs/architecture.md §4): how token endpoints and upstreams are reached from behind a
/// forward proxy. `env` reads `HTTPS_PROXY`/`HTTP_PROXY`/`NO_PROXY` (and their lower-case forms)
/// as curl does; a URL sends everything through that proxy; `none` (default) connects directly.
/// Resolved once per configuration; pure (the environment is an argument).
public struct OutboundProxy: Sendable, Equatable {
    /// A forward proxy: `http://[user:password@]host:port` (credentials for Proxy-Authorization).
    public struct Endpoint: Sendable, Hashable, CustomStringConvertible {
        public var host: String
        public var port: UInt16
        /// `user:password` as given (percent-decoded); never logged.
        public var credentials: String?
        public init(host: String, port: UInt16, credentials: String? = nil) {
            self.host = host
            self.port = port
            self.credentials = credentials
        }
        /// `Basic base64(user:password)` (RFC 7617) for `Proxy-Authorization`, when credentials
        /// were given; never logged.
        public var proxyAuthorization: String? {
            credentials.map { "Basic " + Base64.encode(Array($0.utf8)) }
        }
        /// Without the credentials.
        public var description: String { "http://\(host.contains(":") ? "[\(host)]" : host):\(port)" }
    }

    public var https: Endpoint?
    public var http: Endpoint?
    /// `NO_PROXY` entries, lower-case: host names (a leading dot optional: suffix match), IP
    /// literals, `*` for everything; an entry may carry `:port`.
    public var noProxy: [String]

    public init(https: Endpoint? = nil, http: Endpoint? = nil, noProxy: [String] = []) {
        self.https = https
        self.http = http
        self.noProxy = noProxy
    }

    public static let direct = OutboundProxy()

    /// The proxy for a request to `host:port` over `scheme` (`https` uses CONNECT, `http` the
    /// absolute form), or nil to connect directly.
    public func endpoint(scheme: String, host: String, port: UInt16) -> Endpoint? {
        guard let proxy = scheme == "https" ? https : http else { return nil }
        let h = host.lowercased().trimmingBrackets
        for raw in noProxy {
            if raw == "*" { return nil }
            var entry = Substring(raw)
            var entryPort: UInt16?
            if let colon = entry.lastIndex(of: ":"), !entry.contains("]"), entry.filter({ $0 == ":" }).count == 1,
               let p = UInt16(entry[entry.index(after: colon)...]) {
                entryPort = p
                entry = entry[..<colon]
            }
            if let entryPort, entryPort != port { continue }
            var name = String(entry).trimmingBrackets
            if name.hasPrefix("*.") { name.removeFirst() }
            if name.hasPrefix(".") { name.removeFirst() }
            if name.isEmpty { continue }
            if h == name || h.hasSuffix("." + name) { return nil }
        }
        return proxy
    }

    /// Parses a proxy URL (`http://[user:password@]host[:port]`, default port 1080 as curl's
    /// default for HTTP proxies is 1080). Only `http://` proxies (the TLS goes inside the tunnel).
    public static func parseEndpoint(_ text: String) -> Result<Endpoint, ConfigURLError> {
        var rest = Substring(text.trimmingCharacters(inSet: " \t"))
        if rest.lowercased().hasPrefix("http://") {
            rest = rest.dropFirst(7)
        } else if rest.contains("://") {
            return .failure(ConfigURLError(message: "only http:// proxies are supported, got \(text.split(separator: ":").first ?? "")://"))
        }
        if let slash = rest.firstIndex(of: "/") { rest = rest[..<slash] }
        var credentials: String?
        if let at = rest.lastIndex(of: "@") {
            credentials = percentDecode(String(rest[..<at]))
            rest = rest[rest.index(after: at)...]
        }
        var host = String(rest)
        var port: UInt16 = 1080
        if host.hasPrefix("[") {
            guard let close = host.firstIndex(of: "]") else { return .failure(ConfigURLError(message: "unclosed [ in the proxy host")) }
            let after = host[host.index(after: close)...]
            if after.hasPrefix(":") {
                guard let p = UInt16(after.dropFirst()), p > 0 else { return .failure(ConfigURLError(message: "invalid proxy port")) }
                port = p
            }
            host = String(host[host.index(after: host.startIndex)..<close])
        } else if let colon = host.lastIndex(of: ":") {
            guard let p = UInt16(host[host.index(after: colon)...]), p > 0 else { return .failure(ConfigURLError(message: "invalid proxy port")) }
            port = p
            host = String(host[..<colon])
        }
        guard !host.isEmpty, !host.contains(where: { $0 == " " || $0 == "@" || $0 == "/" }) else {
            return .failure(ConfigURLError(message: "invalid proxy host"))
        }
        return .success(Endpoint(host: host, port: port, credentials: credentials))
    }

    /// curl's reading of the environment: lower-case names first (`https_proxy`, `http_proxy`,
    /// `no_proxy`), then upper-case (`HTTPS_PROXY`, `NO_PROXY`; `HTTP_PROXY` upper-case is not
    /// read, as curl ignores it for CGI reasons — `http_proxy` only).
    public static func fromEnvironment(_ env: [String: String]) -> Result<OutboundProxy, ConfigURLError> {
        func value(_ names: [String]) -> String? {
            for n in names { if let v = env[n], !v.isEmpty { return v } }
            return nil
        }
        var p = OutboundProxy()
        if let s = value(["https_proxy", "HTTPS_PROXY"]) {
            switch parseEndpoint(s) { case .success(let e): p.https = e; case .failure(let f): return .failure(f) }
        }
        if let s = value(["http_proxy"]) {
            switch parseEndpoint(s) { case .success(let e): p.http = e; case .failure(let f): return .failure(f) }
        }
        if let s = value(["no_proxy", "NO_PROXY"]) {
            p.noProxy = s.split(separator: ",").map { String($0).trimmingCharacters(inSet: " \t").lowercased() }.filter { !$0.isEmpty }
        }
        return .success(p)
    }

    static func percentDecode(_ s: String) -> String {
        var out: [UInt8] = []
        let b = Array(s.utf8)
        var i = 0
        while i < b.count {
            if b[i] == UInt8(ascii: "%"), i + 2 < b.count, let v = UInt8(String(decoding: b[(i + 1)...(i + 2)], as: UTF8.self), radix: 16) {
                out.append(v)
                i += 3
            } else {
                out.append(b[i])
                i += 1
            }
        }
        return String(decoding: out, as: UTF8.self)
    }
}

extension String {
    var trimmingBrackets: String {
        hasPrefix("[") && hasSuffix("]") ? String(dropFirst().dropLast()) : self
    }

    func trimmingCharacters(inSet set: String) -> String {
        let chars = Set(set)
        var s = Substring(self)
        while let f = s.first, chars.contains(f) { s = s.dropFirst() }
        while let l = s.last, chars.contains(l) { s = s.dropLast() }
        return String(s)
    }
}
