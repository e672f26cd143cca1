/// Where a session's authorization server comes from when it is discovered instead of named by
/// `token_url:` (docs/architecture.md §6.16). Value type; one of two exclusive forms.
public enum IssuerSource: Sendable, Equatable {
    /// `issuer: URL`: RFC 8414 / OIDC discovery of that issuer.
    case fixed(EndpointURL)
    /// `issuer: from_upstream`: the upstream names its authorization server in its protected
    /// resource metadata (RFC 9728), taken only when it is one of `allowed_issuers`.
    case fromUpstream(UpstreamIssuer)

    /// The `from_upstream` settings, if this is that form.
    public var fromUpstream: UpstreamIssuer? {
        if case .fromUpstream(let u) = self { return u }
        return nil
    }
}

/// `issuer: from_upstream` with its `allowed_issuers` and, once discovery ran
/// (Sources/BearerdSessions/Discovery.swift, before the session runs), what it found.
///
/// Value type. Invariants: `allowed` is non-empty, each an https URL (http only on a loopback
/// host); `resolved?.issuer` is one of `allowed`, spelled as configured.
public struct UpstreamIssuer: Sendable, Equatable {
    /// `allowed_issuers`, in file order.
    public var allowed: [EndpointURL]
    /// nil in a file as loaded; set by discovery.
    public var resolved: Resolved?

    public init(allowed: [EndpointURL], resolved: Resolved? = nil) {
        self.allowed = allowed
        self.resolved = resolved
    }

    /// What the upstream's metadata said, as checked.
    public struct Resolved: Sendable, Equatable {
        /// How the metadata URL was found.
        public enum FoundBy: String, Sendable, Equatable {
            /// `WWW-Authenticate: Bearer resource_metadata="…"` of the upstream's 401 (RFC 9728 §5.1).
            case challenge
            /// `/.well-known/oauth-protected-resource` at the upstream (RFC 9728 §3.1).
            case wellKnown = "well_known"
        }
        /// The chosen authorization server (one of `allowed_issuers`).
        public var issuer: EndpointURL
        /// The upstream probed, the resource the metadata had to name.
        public var upstream: String
        /// Where the protected resource metadata was read.
        public var metadataURL: String
        public var foundBy: FoundBy
        /// The metadata's `resource`, sent as RFC 8707 `resource` unless `resource:` is configured.
        public var resource: String

        public init(issuer: EndpointURL, upstream: String, metadataURL: String, foundBy: FoundBy, resource: String) {
            self.issuer = issuer
            self.upstream = upstream
            self.metadataURL = metadataURL
            self.foundBy = foundBy
            self.resource = resource
        }
    }
}

extension ConfigBuilder {
    /// The `issuer:` value that asks for the authorization server named by the upstream.
    static let fromUpstreamValue = "from_upstream"

    /// `issuer:` (a URL, or `from_upstream` with `allowed_issuers:`) and `allowed_issuers:`.
    /// RFC 8414 §2: an issuer is an https URL without query or fragment (http allowed for local
    /// tests); an allowed issuer is https, or http on a loopback host only: it is the one
    /// boundary that keeps credentials from an authorization server the upstream might name.
    func issuerSource(_ f: Fields) -> IssuerSource? {
        let allowedEntry = f["allowed_issuers"]
        guard let entry = f["issuer"] else {
            if let a = allowedEntry {
                fail(a.keyLine, f.key("allowed_issuers"), "only used with issuer: from_upstream (the upstream names its authorization server, taken only from this list)")
            }
            return nil
        }
        if case .scalar(let s) = entry.value, s.string == Self.fromUpstreamValue {
            guard let a = allowedEntry else {
                fail(entry.valueLine, f.key("allowed_issuers"),
                     "missing: issuer: from_upstream needs allowed_issuers, the authorization servers the upstream may name (nothing is sent to any other)")
                return nil
            }
            guard let items = listItems(a, key: f.key("allowed_issuers"), expected: "a list of issuer URLs, e.g. [https://auth.example.com]") else { return nil }
            if items.isEmpty {
                fail(a.valueLine, f.key("allowed_issuers"), "expected at least one issuer URL, got an empty list")
                return nil
            }
            var allowed: [EndpointURL] = []
            var ok = true
            for (i, node) in items.enumerated() {
                let key = "\(f.key("allowed_issuers"))[\(i)]"
                guard case .scalar(let s) = node, !Self.isNull(node), !s.string.isEmpty else {
                    fail(Self.line(node), key, "expected an issuer URL, got \(Self.describe(node))")
                    ok = false
                    continue
                }
                do throws(ConfigValues.Problem) {
                    let u = try ConfigValues.endpointURL(s.string, allowQuery: false)
                    guard u.isTLS || Self.isLoopbackHost(u.host) else {
                        throw ConfigValues.Problem("an allowed issuer must be https:// (http:// only on a loopback host), got \(u.scheme)://\(u.authority)")
                    }
                    allowed.append(u)
                } catch {
                    fail(Self.line(node), key, error.message)
                    ok = false
                }
            }
            return ok ? .fromUpstream(UpstreamIssuer(allowed: allowed)) : nil
        }
        if let a = allowedEntry {
            fail(a.keyLine, f.key("allowed_issuers"), "only used with issuer: from_upstream (this session names its issuer)")
        }
        return parsed(f, "issuer", expected: "the authorization server's issuer URL, or from_upstream") { (raw: String) throws(ConfigValues.Problem) -> IssuerSource in
            .fixed(try ConfigValues.endpointURL(raw, allowQuery: false))
        }
    }

    static func isLoopbackHost(_ host: String) -> Bool {
        let octets = host.split(separator: ".", omittingEmptySubsequences: false)
        return host == "localhost" || host == "::1"
            || (octets.count == 4 && octets[0] == "127" && octets.allSatisfy { UInt8($0) != nil })
    }

    /// `issuer: from_upstream`: the upstream of the routes that use the session is the protected
    /// resource, so there must be such routes and they must share one upstream (and one `tls:`,
    /// which the metadata fetch uses). Errors at the session's `issuer:` line, naming the routes.
    func checkFromUpstream(sessions: [SessionConfig], routes: [(index: Int, route: RouteConfig)]) {
        for session in sessions {
            guard session.issuerSource?.fromUpstream != nil else { continue }
            let key = "sessions.\(session.name).issuer"
            let using = routes.filter { $0.route.session == session.name }
            guard let first = using.first else {
                fail(session.line, key, "from_upstream takes the authorization server from the upstream of the routes that use this session, and no route names session '\(session.name)'")
                continue
            }
            let others = using.filter { $0.route.upstream != first.route.upstream || $0.route.tls != first.route.tls }
            if !others.isEmpty {
                let named = ([first] + others).map { "routes[\($0.index)] (\($0.route.upstream))" }.joined(separator: ", ")
                fail(session.line, key, "from_upstream needs one upstream (the protected resource) with one tls:, but \(named) use this session; give each upstream its own session")
            }
        }
    }
}
