import BearerdConfig
import BearerdProxyCore
import BearerdSessions
#if canImport(Glibc)
import Glibc
#endif

/// What `bearerd check` warns about without failing: secrets others on the machine can read,
/// and credentials that would cross the network in clear. Reads file metadata only (never a
/// file's content); a file that does not exist is the loader's business, not a warning here.
enum CheckWarnings {
    /// Every warning, as `FILE:LINE: key: …` (the location of the key that names the file or URL).
    static func all(_ config: BearerdConfig) -> [ConfigError] {
        var out: [ConfigError] = []
        for (line, key, path) in secretFiles(config) {
            if let mode = groupOrOtherReadable(path) {
                out.append(ConfigError(file: config.file, line: line, key: key,
                                       message: "\(path) is readable by group or others (mode \(mode)): it holds a secret; chmod go-rwx \(path)"))
            }
        }
        for s in config.sessions where s.tokenURL.scheme == "http" && !isLoopback(s.tokenURL.host) {
            out.append(ConfigError(file: config.file, line: s.line, key: "sessions.\(s.name).token_url",
                                   message: "\(s.tokenURL.scheme)://\(s.tokenURL.host) sends the client's credentials and the tokens in clear: use https://"))
        }
        if let shared = config.sharedCache, case .tcp(let host, _, false) = shared.endpoint, !isLoopback(host) {
            out.append(ConfigError(file: config.file, line: shared.line, key: "shared_cache.url",
                                   message: "redis:// to \(host) sends the Redis password and every command in clear (the token records are sealed): use rediss://"))
        }
        return out
    }

    /// The files that hold secrets: `*_file` secrets and keys of the sessions, the shared
    /// cache's key and password files, client and listener TLS keys, and the DPoP keys
    /// generated in `state_dir`. (line, key, path).
    static func secretFiles(_ config: BearerdConfig) -> [(Int, String, String)] {
        var out: [(Int, String, String)] = []
        for s in config.sessions {
            let p = "sessions.\(s.name)."
            if case .file(let path)? = s.clientSecret { out.append((s.line, p + "client_secret_file", path)) }
            if case .file(let path)? = s.password { out.append((s.line, p + "password_file", path)) }
            if let path = s.refreshTokenFile { out.append((s.line, p + "refresh_token_file", path)) }
            if let path = s.clientKeyFile { out.append((s.line, p + "client_key_file", path)) }
            if let path = s.dpopKeyFile { out.append((s.line, p + "dpop_key_file", path)) }
            if s.dpop, s.dpopKeyFile == nil, let dir = config.stateDir {
                out.append((s.line, "state_dir", DPoPProofer.generatedKeyPath(stateDir: dir, session: s.name)))
            }
            for (key, path) in s.credentialFiles { out.append((s.line, p + key, path)) }
            if let path = s.tls?.clientKey { out.append((s.line, p + "tls.client_key", path)) }
        }
        if let shared = config.sharedCache {
            out.append((shared.line, "shared_cache.key_file", shared.keyFile))
            if case .file(let path)? = shared.password { out.append((shared.line, "shared_cache.password_file", path)) }
            if let path = shared.tls?.clientKey { out.append((shared.line, "shared_cache.tls.client_key", path)) }
        }
        for (i, r) in config.routes.enumerated() {
            if let path = r.tls?.clientKey { out.append((r.line, "routes[\(i)].tls.client_key", path)) }
        }
        for (i, l) in config.listeners.enumerated() {
            if let path = l.tls?.key { out.append((0, "listen[\(i)].tls.key", path)) }
        }
        return out
    }

    /// The mode (`0644`) when the file `path` names (symlinks followed, as they are when it is
    /// read) can be read by its group or by others; nil otherwise or when it does not exist.
    static func groupOrOtherReadable(_ path: String) -> String? {
        var st = stat()
        guard stat(path, &st) == 0, st.st_mode & 0o044 != 0 else { return nil }
        return "0" + String(st.st_mode & 0o7777, radix: 8)
    }

    /// 127.0.0.0/8, ::1 and `localhost`: nothing crosses the network.
    static func isLoopback(_ host: String) -> Bool {
        let bare = host.hasPrefix("[") && host.hasSuffix("]") ? host.dropFirst().dropLast() : Substring(host)
        return HostAllowlist.isBuiltInLoopbackName(bare)
    }
}
