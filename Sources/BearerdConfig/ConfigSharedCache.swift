import BearerdOAuth

/// `shared_cache:` (docs/architecture.md §4, §6 "Shared cache"): replicas share one token per session through
/// Redis or Valkey. Never required: any failure falls back to the local session.
public struct SharedCacheConfig: Sendable, Equatable {
    /// Where the server listens.
    public enum Endpoint: Sendable, Equatable, CustomStringConvertible {
        /// `redis://host:port` (`tls`: `rediss://`, TLS with the `tls:` settings as for upstreams).
        case tcp(host: String, port: UInt16, tls: Bool)
        /// `unix:/path`
        case unix(path: String)

        /// Without credentials (safe to log).
        public var description: String {
            switch self {
            case .tcp(let host, let port, let tls):
                return (tls ? "rediss://" : "redis://") + (host.contains(":") ? "[\(host)]" : host) + ":\(port)"
            case .unix(let path): return "unix:" + path
            }
        }
    }

    public var endpoint: Endpoint
    /// `SELECT` this database after connecting (the URL's path, `?db=N` for unix sockets).
    public var database: Int
    /// ACL user for `AUTH user password` (Redis 6+); nil: `AUTH password`.
    public var username: String?
    /// The URL's password, or `password_file:` (read at start-up). Never logged.
    public var password: SecretSource?
    /// AES-256-GCM key file: the base64 of 32 random bytes on one line, or exactly 32 raw
    /// bytes that are not text (`SharedCacheKey`).
    public var keyFile: String
    /// Prefix of every Redis key bearerd writes.
    public var prefix: String
    /// `rediss://`: CA file and client certificate, as for upstreams.
    public var tls: TLSSettings?
    /// Line of `shared_cache:` (for errors at start-up).
    public var line: Int

    public init(endpoint: Endpoint, database: Int = 0, username: String? = nil, password: SecretSource? = nil,
                keyFile: String, prefix: String = "bearerd:", tls: TLSSettings? = nil, line: Int = 0) {
        self.endpoint = endpoint
        self.database = database
        self.username = username
        self.password = password
        self.keyFile = keyFile
        self.prefix = prefix
        self.tls = tls
        self.line = line
    }

    /// What `url:` says: endpoint, database, user and password (percent-decoded).
    public struct ParsedURL: Equatable {
        public var endpoint: Endpoint
        public var database: Int
        public var username: String?
        public var password: String?
    }

    /// `redis://[user[:password]@]host[:port][/db]`, `rediss://…` (port 6379 by default),
    /// `unix:/path[?db=N]` (also `unix:///path`). The error never repeats the password.
    public static func parseURL(_ text: String) -> Result<ParsedURL, ConfigValueError> {
        func failure(_ m: String) -> Result<ParsedURL, ConfigValueError> { .failure(ConfigValueError(m)) }
        if text.hasPrefix("unix:") {
            var rest = String(text.dropFirst(5))
            if rest.hasPrefix("//") { rest.removeFirst(2) }
            var database = 0
            if let q = rest.firstIndex(of: "?") {
                let query = rest[rest.index(after: q)...]
                rest = String(rest[..<q])
                guard query.hasPrefix("db="), let n = Int(query.dropFirst(3)), (0...1_000_000).contains(n) else {
                    return failure("a unix: URL takes only ?db=N (a database number)")
                }
                database = n
            }
            guard rest.hasPrefix("/"), rest.count > 1, !rest.contains("\0") else {
                return failure("expected unix:/absolute/path of the Redis socket")
            }
            return .success(ParsedURL(endpoint: .unix(path: rest), database: database))
        }
        let tls: Bool
        var rest: Substring
        if text.hasPrefix("redis://") {
            tls = false
            rest = text.dropFirst(8)
        } else if text.hasPrefix("rediss://") {
            tls = true
            rest = text.dropFirst(9)
        } else {
            return failure("expected redis://host:port/db, rediss://host:port/db or unix:/path")
        }
        var database = 0
        if let slash = rest.firstIndex(of: "/") {
            let path = rest[rest.index(after: slash)...]
            rest = rest[..<slash]
            if !path.isEmpty {
                guard let n = Int(path), (0...1_000_000).contains(n) else {
                    return failure("the path of a redis URL is the database number, e.g. redis://127.0.0.1:6379/0")
                }
                database = n
            }
        }
        var username: String?
        var password: String?
        if let at = rest.lastIndex(of: "@") {
            let userinfo = rest[..<at]
            rest = rest[rest.index(after: at)...]
            if let colon = userinfo.firstIndex(of: ":") {
                let user = OutboundProxy.percentDecode(String(userinfo[..<colon]))
                username = user.isEmpty ? nil : user
                password = OutboundProxy.percentDecode(String(userinfo[userinfo.index(after: colon)...]))
            } else {
                // `redis://secret@host`: a lone userinfo is the password (as redis-cli reads it).
                password = OutboundProxy.percentDecode(String(userinfo))
            }
            if password?.isEmpty == true { password = nil }
        }
        var host: Substring
        var port: UInt16 = 6379
        if rest.hasPrefix("[") {
            guard let close = rest.firstIndex(of: "]") else { return failure("unclosed [ in the host") }
            host = rest[rest.index(after: rest.startIndex)..<close]
            let after = rest[rest.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":"), let p = UInt16(after.dropFirst()), p > 0 else { return failure("invalid port") }
                port = p
            }
        } else if let colon = rest.lastIndex(of: ":") {
            host = rest[..<colon]
            guard let p = UInt16(rest[rest.index(after: colon)...]), p > 0 else { return failure("invalid port") }
            port = p
        } else {
            host = rest
        }
        guard !host.isEmpty, !host.contains(where: { $0 == " " || $0 == "/" || $0 == "?" || $0 == "#" }) else {
            return failure("expected a host, e.g. redis://127.0.0.1:6379/0")
        }
        return .success(ParsedURL(endpoint: .tcp(host: String(host), port: port, tls: tls), database: database,
                                  username: username, password: password))
    }
}

/// A value that does not parse; `message` never holds a secret.
public struct ConfigValueError: Error, Equatable {
    public let message: String
    public init(_ message: String) { self.message = message }
}

extension ConfigBuilder {
    /// `shared_cache:` → `SharedCacheConfig`, every problem reported as FILE:LINE: key.
    func sharedCacheSection(_ entry: Entry) -> SharedCacheConfig? {
        guard let f = fields(entry.value, path: "shared_cache", line: entry.keyLine, known: ConfigKeys.sharedCache,
                             expected: "a mapping (url, key_file, prefix, password_file, tls)") else { return nil }
        var parsed: SharedCacheConfig.ParsedURL?
        if let e = f["url"] {
            if let raw = text(e, in: f, expected: "a redis URL", secret: true) {
                switch SharedCacheConfig.parseURL(raw) {
                case .success(let p): parsed = p
                case .failure(let err): fail(e.valueLine, f.key("url"), err.message)
                }
            }
        } else {
            missing(f, "url", "e.g. redis://127.0.0.1:6379/0, rediss://…, or unix:/run/redis/redis.sock")
        }
        let keyFile = path(f, "key_file", mustRead: true)
        if f["key_file"] == nil {
            missing(f, "key_file", "32 random bytes as base64 on one line: openssl rand -base64 32")
        }
        if checkFiles, let keyFile, let e = f["key_file"] {
            if let why = SharedCacheConfig.keyFileProblem(keyFile) { fail(e.valueLine, f.key("key_file"), why) }
        }
        var prefix = "bearerd:"
        if let e = f["prefix"], let p = text(e, in: f) {
            if p.count > 128 || p.contains(where: { $0.isWhitespace || $0.asciiValue.map { $0 < 0x20 || $0 == 0x7F } ?? false }) {
                fail(e.valueLine, f.key("prefix"), "expected at most 128 characters without spaces or control characters")
            } else {
                prefix = p
            }
        }
        let passwordFile = path(f, "password_file", mustRead: true)
        if passwordFile != nil, parsed?.password != nil, let e = f["password_file"] {
            fail(e.keyLine, f.key("password_file"), "the url already carries a password; keep one")
        }
        let tls = tlsSettings(f)
        if let tls, let parsed, case .tcp(_, _, false) = parsed.endpoint, tls != TLSSettings(), let e = f["tls"] {
            fail(e.keyLine, f.key("tls"), "tls: applies to rediss:// URLs; this one is plain redis://")
        }
        guard let parsed, let keyFile else { return nil }
        var config = SharedCacheConfig(endpoint: parsed.endpoint, database: parsed.database, username: parsed.username,
                                       keyFile: keyFile, prefix: prefix, tls: tls, line: entry.keyLine)
        if let password = parsed.password { config.password = .literal(Secret(password)) }
        if let passwordFile { config.password = .file(passwordFile) }
        return config
    }
}

extension SharedCacheConfig {
    /// The key file's bytes (at most 4 KiB), or why it cannot be read.
    public func readKeyFile() -> Result<[UInt8], ConfigValueError> {
        do throws(ConfigFiles.Failure) {
            return .success(try ConfigFiles.readAll(keyFile, limit: 4096))
        } catch {
            return .failure(ConfigValueError("cannot read \(keyFile): \(error.reason)"))
        }
    }

    /// The key in `key_file` and its form (`SharedCacheKey.parse`), or why there is none
    /// (`PATH: …`). Read at start-up, on SIGHUP and by `bearerd check`.
    public func readKey() -> Result<SharedCacheKey, ConfigValueError> {
        Self.readKey(keyFile)
    }

    static func readKey(_ path: String) -> Result<SharedCacheKey, ConfigValueError> {
        let bytes: [UInt8]
        do throws(ConfigFiles.Failure) {
            bytes = try ConfigFiles.readAll(path, limit: 4096)
        } catch {
            return .failure(ConfigValueError("cannot read \(path): \(error.reason)"))
        }
        return SharedCacheKey.parse(bytes).mapError { ConfigValueError("\(path): \($0.message)") }
    }

    /// Why the key file holds no usable key (checked again when the sessions start).
    static func keyFileProblem(_ path: String) -> String? {
        if case .failure(let e) = readKey(path) { return e.message }
        return nil
    }
}
