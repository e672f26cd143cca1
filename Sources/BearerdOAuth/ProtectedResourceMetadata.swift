/// `issuer: from_upstream` (docs/architecture.md §6, "Authorization server from the upstream"):
/// the upstream names its authorization server in its OAuth 2.0 Protected Resource Metadata
/// (RFC 9728), and bearerd takes it only when it is one of `allowed_issuers`. Pure: the caller
/// fetches the documents.
///
/// Steps: `metadataURL(challenges:resource:)` (the first rejection's `WWW-Authenticate: Bearer
/// resource_metadata="…"`, RFC 9728 §5.1) or `wellKnownURL(resource:)` (§3.1); `parse` the
/// document (§2, §3.2); `check` it: `resource` matches (§3.3) and one of
/// `authorization_servers` is allowed. Then RFC 8414 discovery of that issuer as for `issuer:`,
/// and `resource` goes out as RFC 8707 `resource`.
public struct ProtectedResourceMetadata: Sendable, Equatable {
    /// `resource` (REQUIRED, RFC 9728 §2).
    public var resource: String
    /// `authorization_servers`: issuer identifiers (RFC 8414 §2), in the document's order.
    public var authorizationServers: [String]

    public init(resource: String, authorizationServers: [String]) {
        self.resource = resource
        self.authorizationServers = authorizationServers
    }

    public struct Problem: Error, Sendable, Equatable, CustomStringConvertible {
        /// `resource_metadata.malformed`, `.missing_resource`, `.resource_mismatch`,
        /// `.no_authorization_server`, `.issuer_not_allowed`, `.bad_url`.
        public var reason: String
        public var message: String
        public var description: String { message }
    }

    /// Documents larger than this are refused (RFC 9728 sets no bound; bearerd's is generous).
    public static let maxDocumentBytes = 64 * 1024
    static let parser = JSONParser(maxDepth: 16, maxBytes: maxDocumentBytes)

    /// RFC 9728 §3.1: the well-known suffix inserted between the host and the path (and query)
    /// of `resource`: `https://r.example/api` → `https://r.example/.well-known/oauth-protected-resource/api`;
    /// a resource without path (or `/`) → `https://r.example/.well-known/oauth-protected-resource`.
    /// A terminating `/` after the host is removed first. nil when `resource` is not an absolute
    /// http(s) URL (or carries a fragment or user information).
    public static func wellKnownURL(resource: String) -> String? {
        guard let url = AbsoluteURL(resource), url.fragment == nil else { return nil }
        var tail = url.path == "/" ? "" : url.path
        if let query = url.query { tail += "?" + query }
        return url.scheme + "://" + url.authority + "/.well-known/oauth-protected-resource" + tail
    }

    /// The `resource_metadata` URL of the first `Bearer` (or `DPoP`) challenge naming one
    /// (RFC 9728 §5.1), checked: an absolute URL without fragment or user information; `https`,
    /// or `http` only when `resource` (the upstream) is itself `http` with the same origin (a
    /// cleartext upstream, e.g. on the loopback). nil when no challenge names one.
    public static func metadataURL(challenges: [AuthenticationChallenge], resource: String) throws(Problem) -> String? {
        guard let named = challenges.first(where: {
            ($0.isBearer || $0.scheme.lowercased() == "dpop") && $0.parameter("resource_metadata") != nil
        })?.parameter("resource_metadata") else { return nil }
        guard let url = AbsoluteURL(named), url.fragment == nil else {
            throw Problem(reason: "resource_metadata.bad_url",
                          message: "the upstream's resource_metadata is not an absolute http(s) URL without fragment or user information")
        }
        if url.scheme == "http" {
            guard let upstream = AbsoluteURL(resource), upstream.scheme == "http", upstream.authority == url.authority else {
                throw Problem(reason: "resource_metadata.bad_url",
                              message: "the upstream's resource_metadata \(sanitise(named, limit: 200)) is not https")
            }
        }
        return named
    }

    /// Parses a metadata document (RFC 9728 §2, §3.2): a JSON object with a string `resource`;
    /// `authorization_servers`, when present, an array of strings. Other members are ignored.
    public static func parse(_ bytes: [UInt8]) throws(Problem) -> ProtectedResourceMetadata {
        guard bytes.count <= maxDocumentBytes else {
            throw Problem(reason: "resource_metadata.malformed", message: "the protected resource metadata is larger than 64 KiB")
        }
        guard case .object(let o)? = try? parser.parse(bytes) else {
            throw Problem(reason: "resource_metadata.malformed", message: "the protected resource metadata is not a JSON object")
        }
        guard case .string(let resource)? = o["resource"], !resource.isEmpty else {
            throw Problem(reason: "resource_metadata.missing_resource", message: "the protected resource metadata has no resource (RFC 9728 §2)")
        }
        var servers: [String] = []
        switch o["authorization_servers"] {
        case nil: break
        case .array(let items)?:
            for item in items {
                guard case .string(let s) = item else {
                    throw Problem(reason: "resource_metadata.malformed", message: "authorization_servers holds a value that is not a string")
                }
                servers.append(s)
            }
        default:
            throw Problem(reason: "resource_metadata.malformed", message: "authorization_servers is not an array (RFC 9728 §2)")
        }
        return ProtectedResourceMetadata(resource: resource, authorizationServers: servers)
    }

    /// RFC 9728 §3.3 as bearerd applies it: the document's `resource` must be the upstream's
    /// resource identifier (`expectedResource`: the route's upstream URL, the one the well-known
    /// URL was derived from or the request went to). Compared as URLs: scheme and host
    /// case-insensitively, the scheme's default port (443, 80) the same as no port, an empty
    /// path the same as `/` (RFC 3986 §6.2.3); path and query byte for byte (so a trailing `/`
    /// matters, and percent-encodings are not decoded); neither may carry a fragment or user
    /// information.
    public static func resourceMatches(_ resource: String, expected expectedResource: String) -> Bool {
        guard let a = AbsoluteURL(resource), let b = AbsoluteURL(expectedResource),
              a.fragment == nil, b.fragment == nil else { return false }
        return a.scheme == b.scheme && a.authority == b.authority && a.path == b.path && a.query == b.query
    }

    /// RFC 8414 issuer comparison as `AuthorizationServerMetadata.parse` does it: exact, except
    /// for one terminating `/`.
    public static func sameIssuer(_ a: String, _ b: String) -> Bool {
        func norm(_ s: String) -> Substring { s.hasSuffix("/") ? s.dropLast() : Substring(s) }
        return norm(a) == norm(b)
    }

    /// Checks the document against the upstream and `allowed_issuers`; returns the issuer to
    /// discover: the first of `authorization_servers` (in the document's order) that is in
    /// `allowedIssuers`, spelled as configured. The problem names the refused servers (the
    /// log line says which AS was refused; nothing is sent to it).
    public func check(expectedResource: String, allowedIssuers: [String]) throws(Problem) -> String {
        guard Self.resourceMatches(resource, expected: expectedResource) else {
            throw Problem(reason: "resource_metadata.resource_mismatch",
                          message: "the protected resource metadata is for \(sanitise(resource, limit: 200)), not the upstream \(expectedResource) (RFC 9728 §3.3)")
        }
        guard !authorizationServers.isEmpty else {
            throw Problem(reason: "resource_metadata.no_authorization_server",
                          message: "the protected resource metadata names no authorization server")
        }
        for server in authorizationServers {
            if let allowed = allowedIssuers.first(where: { Self.sameIssuer($0, server) }) { return allowed }
        }
        let named = authorizationServers.prefix(5).map { sanitise($0, limit: 200) }.joined(separator: ", ")
        throw Problem(reason: "resource_metadata.issuer_not_allowed",
                      message: "the upstream names authorization server \(named)\(authorizationServers.count > 5 ? ", ..." : ""), none of them in allowed_issuers: refused")
    }
}

/// An absolute `http`/`https` URL split for comparison (RFC 3986 §3): scheme and host lower-cased,
/// the default port dropped, an empty path as `/`. User information is refused. Value type.
struct AbsoluteURL: Equatable {
    var scheme: String
    /// host[:port], normalised.
    var authority: String
    var path: String
    var query: String?
    var fragment: String?

    init?(_ text: String) {
        guard let sep = text.firstRange(of: "://") else { return nil }
        let scheme = text[..<sep.lowerBound].lowercased()
        guard scheme == "https" || scheme == "http" else { return nil }
        var rest = text[sep.upperBound...]
        if let hash = rest.firstIndex(of: "#") {
            fragment = String(rest[rest.index(after: hash)...])
            rest = rest[..<hash]
        }
        let authorityEnd = rest.firstIndex(where: { $0 == "/" || $0 == "?" }) ?? rest.endIndex
        let rawAuthority = rest[..<authorityEnd]
        var afterAuthority = rest[authorityEnd...]
        guard !rawAuthority.isEmpty, !rawAuthority.contains("@"),
              !rawAuthority.contains(where: { $0.isWhitespace || $0.asciiValue == nil || $0 == "\\" }) else { return nil }
        // Host: a bracketed IP literal or a reg-name; the port: digits, at most 65535.
        var host: Substring
        var port: Substring?
        if rawAuthority.hasPrefix("[") {
            guard let close = rawAuthority.firstIndex(of: "]") else { return nil }
            host = rawAuthority[...close]
            let after = rawAuthority[rawAuthority.index(after: close)...]
            if !after.isEmpty {
                guard after.hasPrefix(":") else { return nil }
                port = after.dropFirst()
            }
        } else if let colon = rawAuthority.firstIndex(of: ":") {
            host = rawAuthority[..<colon]
            port = rawAuthority[rawAuthority.index(after: colon)...]
        } else {
            host = rawAuthority
        }
        guard !host.isEmpty else { return nil }
        var normalised = host.lowercased()
        if let port, !port.isEmpty {
            guard port.count <= 5, port.allSatisfy({ $0.isASCII && $0.isNumber }), let n = Int(port), n <= 65535 else { return nil }
            let isDefault = (scheme == "https" && n == 443) || (scheme == "http" && n == 80)
            if !isDefault { normalised += ":" + String(n) }
        }
        if let q = afterAuthority.firstIndex(of: "?") {
            query = String(afterAuthority[afterAuthority.index(after: q)...])
            afterAuthority = afterAuthority[..<q]
        }
        self.scheme = scheme
        self.authority = normalised
        self.path = afterAuthority.isEmpty ? "/" : String(afterAuthority)
    }
}
