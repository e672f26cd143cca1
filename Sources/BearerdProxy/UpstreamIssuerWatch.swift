import Synchronization
import Logging
import BearerdConfig
import BearerdOAuth

/// `issuer: from_upstream` at run time (docs/architecture.md §6.16): a rejection of the route's
/// upstream whose `WWW-Authenticate` names other protected resource metadata than the one the
/// session's authorization server was taken from is logged at warning level, once per URL named.
/// It is never followed: an upstream could otherwise steer the session's credentials to another
/// server. SIGHUP resolves again (within `allowed_issuers`).
///
/// Owns the last URL warned about (behind a `Mutex`; touched on rejections only). The resolved
/// facts are immutable.
final class UpstreamIssuerWatch: Sendable {
    let session: String
    let upstream: String
    let issuer: String
    let metadataURL: String
    private let lastWarned = Mutex<String?>(nil)

    /// nil unless the route's session is `issuer: from_upstream` and was resolved.
    init?(route: RouteConfig, sessions: [SessionConfig]) {
        guard let name = route.session, let session = sessions.first(where: { $0.name == name }),
              let found = session.issuerSource?.fromUpstream?.resolved else { return nil }
        self.session = name
        upstream = found.upstream
        issuer = found.issuer.description
        metadataURL = found.metadataURL
    }

    /// The `resource_metadata` a rejection names, if it is not the one in use (nil otherwise).
    func differingMetadata(_ wwwAuthenticate: [String]) -> String? {
        guard let challenges = try? WWWAuthenticate.parse(wwwAuthenticate),
              let named = challenges.first(where: { ($0.isBearer || $0.scheme.lowercased() == "dpop") && $0.parameter("resource_metadata") != nil })?
                  .parameter("resource_metadata"),
              named != metadataURL else { return nil }
        return named
    }

    /// At most 300 characters, no control characters (the value comes from the upstream).
    static func printable(_ text: String) -> String {
        var out = String.UnicodeScalarView()
        out.append(contentsOf: text.unicodeScalars.prefix(300).filter { $0.value >= 0x20 && $0.value != 0x7F })
        return String(out)
    }

    func note(wwwAuthenticate: [String], logger: Logger) {
        guard let named = differingMetadata(wwwAuthenticate) else { return }
        let first = lastWarned.withLock { last -> Bool in
            if last == named { return false }
            last = named
            return true
        }
        guard first else { return }
        logger.warning("from_upstream: the upstream's rejection names other protected resource metadata; not followed (SIGHUP resolves again within allowed_issuers)", metadata: [
            "session": "\(session)", "upstream": "\(upstream)", "issuer": "\(issuer)", "metadata_url": "\(metadataURL)",
            "named": "\(Self.printable(named))"])
    }
}
