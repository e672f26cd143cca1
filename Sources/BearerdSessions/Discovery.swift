import BearerdTLS
import BearerdOAuth
import Logging
import BearerdConfig

/// `issuer:` sessions (RFC 8414, then OIDC Discovery): reads each issuer's metadata and fills the
/// session's token, authorization and device endpoints before anything runs (start, SIGHUP,
/// `check`, `token`, `login`). `issuer: from_upstream` first asks the route's upstream which
/// authorization server it trusts (RFC 9728, docs/architecture.md §6.16; `resolveFromUpstream`).
///
/// The document is fetched with the session's TLS settings (system trust store or `ca_file`);
/// its `issuer` must equal the configured one (RFC 8414 §3.3). A good document is kept in
/// `<state_dir>/<session>.discovery.json`; when the issuer cannot be reached, the kept one is
/// used (logged), so a restart does not depend on the identity provider being up. Blocking:
/// call it on a command's or the controlling thread, never on a loop.
public enum Discovery {
    public static let fetchTimeout: Duration = .seconds(10)

    /// The configuration with every `issuer:` resolved, or the errors (`FILE:LINE: sessions.NAME.issuer: …`).
    public static func resolve(_ config: BearerdConfig, logger: Logger, useCache: Bool = true) -> Result<BearerdConfig, ConfigErrors> {
        var out = config
        var errors: [ConfigError] = []
        for (i, session) in config.sessions.enumerated() {
            let issuer: EndpointURL
            switch session.issuerSource {
            case nil:
                continue
            case .fixed(let url)?:
                issuer = url
            case .fromUpstream(var settings)?:
                switch resolveFromUpstream(session: session, settings: settings, config: config, logger: logger, useCache: useCache) {
                case .failure(let failure):
                    errors.append(ConfigError(file: config.file, line: session.line, key: "sessions.\(session.name).issuer", message: failure.message))
                    continue
                case .success(let resolved):
                    settings.resolved = resolved
                    out.sessions[i].issuerSource = .fromUpstream(settings)
                    // RFC 8707: the token is asked for this resource, unless `resource:` says otherwise.
                    if session.resources.isEmpty { out.sessions[i].resources = [resolved.resource] }
                    issuer = resolved.issuer
                }
            }
            switch metadata(issuer: issuer, for: session, stateDir: config.stateDir, proxy: config.outboundProxy, logger: logger, useCache: useCache) {
            case .failure(let failure):
                errors.append(ConfigError(file: config.file, line: session.line, key: "sessions.\(session.name).issuer", message: failure.message))
            case .success(let meta):
                do throws(ConfigURLError) {
                    // docs/architecture.md §5: each endpoint exactly as published (path, trailing slash, query).
                    out.sessions[i].tokenURL = try EndpointURL.parse(meta.tokenEndpoint).get()
                    out.sessions[i].authorizationEndpoint = try meta.authorizationEndpoint.map { u throws(ConfigURLError) in try EndpointURL.parse(u).get() }
                    out.sessions[i].deviceAuthorizationEndpoint = try meta.deviceAuthorizationEndpoint.map { u throws(ConfigURLError) in try EndpointURL.parse(u).get() }
                } catch {
                    errors.append(ConfigError(file: config.file, line: session.line, key: "sessions.\(session.name).issuer",
                                              message: "\(issuer): the metadata lists an endpoint bearerd cannot use: \(error.message)"))
                    continue
                }
                if session.grant == .authorizationCode && meta.authorizationEndpoint == nil {
                    errors.append(ConfigError(file: config.file, line: session.line, key: "sessions.\(session.name).issuer",
                                              message: "\(issuer) publishes no authorization_endpoint, which grant authorization_code needs"))
                }
                if session.grant == .deviceCode && meta.deviceAuthorizationEndpoint == nil {
                    errors.append(ConfigError(file: config.file, line: session.line, key: "sessions.\(session.name).issuer",
                                              message: "\(issuer) publishes no device_authorization_endpoint, which grant device_code needs"))
                }
                // `none` (a public client, RFC 7591 §2) is left out: servers that take public
                // clients often list only the methods that authenticate one (django-oauth-toolkit,
                // Keycloak), and the warning then came with every `bearerd token` of a signed-in person.
                if session.clientAuth != .none, let methods = meta.tokenEndpointAuthMethods, !methods.contains(session.clientAuth.rawValue) {
                    logger.warning("the issuer does not list this session's client_auth", metadata: [
                        "session": "\(session.name)", "client_auth": "\(session.clientAuth.rawValue)",
                        "supported": "\(methods.joined(separator: ","))"])
                }
            }
        }
        return errors.isEmpty ? .success(out) : .failure(ConfigErrors(errors))
    }

    /// The issuer's metadata: fetched (RFC 8414 URL first, then OIDC), else the kept copy.
    struct Failure: Error {
        var message: String
    }

    static func metadata(issuer issuerURL: EndpointURL, for session: SessionConfig, stateDir: String?, proxy: OutboundProxy, logger: Logger,
                         useCache: Bool) -> Result<AuthorizationServerMetadata, Failure> {
        let issuer = issuerURL.description
        let cachePath = stateDir.map { $0 + "/" + session.name + ".discovery.json" }
        var problems: [String] = []
        let tls: TLSContext?
        do {
            tls = issuerURL.isTLS
                ? try TLSContext.client(caFile: session.tls?.caFile, clientCert: session.tls?.clientCert, clientKey: session.tls?.clientKey, alpn: ["http/1.1"])
                : nil
        } catch {
            return .failure(Failure(message: "cannot set up TLS for \(issuer): \(error.message)"))
        }
        for candidate in AuthorizationServerMetadata.wellKnownURLs(issuer: issuer) {
            guard case .success(let url) = EndpointURL.parse(candidate, allowQuery: false) else { continue }
            let outcome = TokenEndpointClient.blocking(timeout: fetchTimeout) { loop, done in
                TokenEndpointClient.get(url, tls: tls, proxy: proxy.endpoint(scheme: url.scheme, host: url.host, port: url.port),
                                        on: loop, completion: done)
            }
            switch outcome {
            case .response(200, _, let body):
                do throws(AuthorizationServerMetadata.Problem) {
                    let meta = try AuthorizationServerMetadata.parse(body, expectedIssuer: issuer)
                    if let cachePath, let dir = stateDir, let store = try? StateStore(directory: dir, session: session.name) {
                        try? store.writeDurably(body, to: cachePath)
                    }
                    return .success(meta)
                } catch {
                    // A document that names another issuer is an error, not a reason to try the next URL.
                    if error.reason == "discovery.issuer_mismatch" { return .failure(Failure(message: "\(candidate): \(error.message)")) }
                    problems.append("\(candidate): \(error.message)")
                }
            case .response(let status, _, _):
                problems.append("\(candidate): HTTP \(status)")
            case .tooLarge(let status):
                problems.append("\(candidate): HTTP \(status) with a document over 1 MiB")
            case .transportFailure(let detail, _):
                problems.append("\(candidate): \(detail)")
            }
        }
        if useCache, let cachePath, let bytes = StateStore.readSmallFile(cachePath),
           let meta = try? AuthorizationServerMetadata.parse(bytes, expectedIssuer: issuer) {
            logger.warning("issuer unreachable; using its metadata kept from an earlier start", metadata: [
                "session": "\(session.name)", "issuer": "\(issuer)", "problems": "\(problems.joined(separator: "; "))"])
            return .success(meta)
        }
        return .failure(Failure(message: "cannot read the metadata of \(issuer) (RFC 8414, then OpenID Connect discovery): \(problems.joined(separator: "; "))"))
    }
}
