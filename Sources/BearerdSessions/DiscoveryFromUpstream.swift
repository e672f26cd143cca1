import BearerdTLS
import BearerdOAuth
import Logging
import BearerdConfig

/// `issuer: from_upstream` (RFC 9728, docs/architecture.md §6.16): which authorization server the
/// route's upstream names, checked against `allowed_issuers` before anything is sent to it.
extension Discovery {
    /// Where the upstream's checked protected resource metadata is kept for restarts:
    /// `<state_dir>/<session>.resource-metadata.json` (a JSON header line, then the document).
    static func keptMetadataPath(stateDir: String?, session: String) -> String? {
        stateDir.map { $0 + "/" + session + ".resource-metadata.json" }
    }

    /// Steps: GET the upstream's base URL with no credentials; its 401's `WWW-Authenticate:
    /// Bearer resource_metadata="…"` names the metadata (RFC 9728 §5.1), else the well-known URL
    /// at the upstream (§3.1, path-inserted for a base path). The document's `resource` must be
    /// the upstream (§3.3) and the first of its `authorization_servers` that is in
    /// `allowed_issuers` is chosen; none allowed is a refusal, logged with the servers named,
    /// and nothing is sent to them. The route's `tls: ca_file` applies to the upstream's origin
    /// (its client certificate is a credential and is not presented). An unreachable upstream
    /// (or one without a readable document) falls back to the kept copy, checked again against
    /// today's `allowed_issuers`; a refusal never does.
    static func resolveFromUpstream(session: SessionConfig, settings: UpstreamIssuer, config: BearerdConfig,
                                    logger: Logger, useCache: Bool) -> Result<UpstreamIssuer.Resolved, Failure> {
        guard let route = config.routes.first(where: { $0.session == session.name }) else {
            return .failure(Failure(message: "from_upstream: no route uses this session, so no upstream names its authorization server"))
        }
        let upstream = route.upstream.description
        let allowed = settings.allowed.map(\.description)
        let keptPath = keptMetadataPath(stateDir: config.stateDir, session: session.name)

        func refuse(_ problem: ProtectedResourceMetadata.Problem, metadataURL: String) -> Result<UpstreamIssuer.Resolved, Failure> {
            logger.error("from_upstream: the upstream's protected resource metadata is refused", metadata: [
                "session": "\(session.name)", "upstream": "\(upstream)", "metadata_url": "\(metadataURL)",
                "reason": "\(problem.reason)", "detail": "\(problem.message)"])
            return .failure(Failure(message: "from_upstream: \(metadataURL): \(problem.message)"))
        }

        var problems: [String] = []
        var located: (url: String, by: UpstreamIssuer.Resolved.FoundBy)?
        switch probe(route: route, proxy: config.outboundProxy) {
        case .failure(let problem):
            return refuse(problem, metadataURL: upstream)
        case .success(.unreachable(let detail)):
            problems.append("\(upstream): \(detail)")
        case .success(.named(let url)):
            located = (url, .challenge)
        case .success(.notNamed):
            if let url = ProtectedResourceMetadata.wellKnownURL(resource: upstream) {
                located = (url, .wellKnown)
            } else {
                problems.append("\(upstream): no well-known URL for it")
            }
        }
        if let located {
            switch fetch(located.url, route: route, proxy: config.outboundProxy) {
            case .failure(let detail):
                problems.append("\(located.url): \(detail.message)")
            case .success(let body):
                do throws(ProtectedResourceMetadata.Problem) {
                    let document = try ProtectedResourceMetadata.parse(body)
                    let chosen = try document.check(expectedResource: upstream, allowedIssuers: allowed)
                    guard let issuer = settings.allowed.first(where: { $0.description == chosen }) else {
                        return .failure(Failure(message: "from_upstream: \(chosen) is not in allowed_issuers"))
                    }
                    if let keptPath, let dir = config.stateDir, let store = try? StateStore(directory: dir, session: session.name) {
                        let header = "{\"upstream\":\(JSONWriter.quote(upstream)),\"metadata_url\":\(JSONWriter.quote(located.url)),"
                            + "\"found_by\":\(JSONWriter.quote(located.by.rawValue))}\n"
                        try? store.writeDurably(Array(header.utf8) + body, to: keptPath)
                    }
                    logger.info("from_upstream: the upstream names its authorization server", metadata: [
                        "session": "\(session.name)", "upstream": "\(upstream)", "issuer": "\(issuer)",
                        "metadata_url": "\(located.url)", "resource": "\(document.resource)"])
                    return .success(UpstreamIssuer.Resolved(issuer: issuer, upstream: upstream, metadataURL: located.url,
                                                            foundBy: located.by, resource: document.resource))
                } catch {
                    // A document that cannot be read is like no document; one that names another
                    // resource or no allowed server is a refusal (never replaced by a kept copy).
                    if error.reason == "resource_metadata.malformed" || error.reason == "resource_metadata.missing_resource" {
                        problems.append("\(located.url): \(error.message)")
                    } else {
                        return refuse(error, metadataURL: located.url)
                    }
                }
            }
        }
        if useCache, let keptPath, let kept = readKept(keptPath), kept.upstream == upstream,
           let document = try? ProtectedResourceMetadata.parse(kept.document) {
            do throws(ProtectedResourceMetadata.Problem) {
                let chosen = try document.check(expectedResource: upstream, allowedIssuers: allowed)
                if let issuer = settings.allowed.first(where: { $0.description == chosen }) {
                    logger.warning("from_upstream: upstream unreachable; using its protected resource metadata kept from an earlier start", metadata: [
                        "session": "\(session.name)", "upstream": "\(upstream)", "issuer": "\(issuer)",
                        "problems": "\(problems.joined(separator: "; "))"])
                    return .success(UpstreamIssuer.Resolved(issuer: issuer, upstream: upstream, metadataURL: kept.metadataURL,
                                                            foundBy: kept.foundBy, resource: document.resource))
                }
            } catch {
                return refuse(error, metadataURL: kept.metadataURL + " (kept copy)")
            }
        }
        return .failure(Failure(message: "from_upstream: cannot read the protected resource metadata of the upstream \(upstream) "
                                + "(its 401's resource_metadata, then \(ProtectedResourceMetadata.wellKnownURL(resource: upstream) ?? "the well-known URL")): "
                                + problems.joined(separator: "; ")))
    }

    /// What the credential-less GET of the upstream's base URL said.
    enum ProbeOutcome {
        case named(String)
        case notNamed
        case unreachable(String)
    }

    /// GET the upstream's base URL (no credentials of any kind) and read the `resource_metadata`
    /// of its 401 (RFC 9728 §5.1). A `resource_metadata` that is not an acceptable URL is a refusal.
    static func probe(route: RouteConfig, proxy: OutboundProxy) -> Result<ProbeOutcome, ProtectedResourceMetadata.Problem> {
        let upstream = route.upstream.description
        let target = upstream + (route.upstream.basePath.isEmpty ? "/" : "")
        switch get(target, route: route, proxy: proxy) {
        case .failure(let detail):
            return .success(.unreachable(detail.message))
        case .success(let answer):
            guard answer.status == 401 else { return .success(.notNamed) }
            let values = answer.headers.filter { $0.name.lowercased() == "www-authenticate" }.map(\.value)
            guard let challenges = try? WWWAuthenticate.parse(values) else { return .success(.notNamed) }
            do throws(ProtectedResourceMetadata.Problem) {
                guard let url = try ProtectedResourceMetadata.metadataURL(challenges: challenges, resource: upstream) else { return .success(.notNamed) }
                return .success(.named(url))
            } catch {
                return .failure(error)
            }
        }
    }

    /// The metadata document at `url` (200 only).
    static func fetch(_ url: String, route: RouteConfig, proxy: OutboundProxy) -> Result<[UInt8], Failure> {
        switch get(url, route: route, proxy: proxy) {
        case .failure(let detail): return .failure(detail)
        case .success(let answer):
            guard answer.status == 200 else { return .failure(Failure(message: "HTTP \(answer.status)")) }
            return .success(answer.body)
        }
    }

    struct Answer {
        var status: Int
        var headers: [(name: String, value: String)]
        var body: [UInt8]
    }

    /// One GET without credentials. TLS: the route's `ca_file` for the upstream's own origin,
    /// the system trust store elsewhere; no client certificate.
    static func get(_ text: String, route: RouteConfig, proxy: OutboundProxy) -> Result<Answer, Failure> {
        guard case .success(let url) = EndpointURL.parse(text, allowQuery: true) else { return .failure(Failure(message: "not a URL bearerd can fetch")) }
        let tls: TLSContext?
        do {
            let sameOrigin = url.scheme == route.upstream.scheme && url.host.lowercased() == route.upstream.host.lowercased() && url.port == route.upstream.port
            tls = url.isTLS ? try TLSContext.client(caFile: sameOrigin ? route.tls?.caFile : nil, clientCert: nil, clientKey: nil, alpn: ["http/1.1"]) : nil
        } catch {
            return .failure(Failure(message: "cannot set up TLS: \(error.message)"))
        }
        let outcome = TokenEndpointClient.blocking(timeout: fetchTimeout) { loop, done in
            TokenEndpointClient.get(url, tls: tls, proxy: proxy.endpoint(scheme: url.scheme, host: url.host, port: url.port), on: loop, completion: done)
        }
        switch outcome {
        case .response(let status, let headers, let body): return .success(Answer(status: status, headers: headers, body: body))
        case .tooLarge(let status): return .failure(Failure(message: "HTTP \(status) with a body over 1 MiB"))
        case .transportFailure(let detail, _): return .failure(Failure(message: detail))
        }
    }

    /// The kept copy: its header line and the document.
    struct Kept {
        var upstream: String
        var metadataURL: String
        var foundBy: UpstreamIssuer.Resolved.FoundBy
        var document: [UInt8]
    }

    static func readKept(_ path: String) -> Kept? {
        guard let bytes = StateStore.readSmallFile(path), let newline = bytes.firstIndex(of: 0x0A),
              case .object(let header)? = try? JSONParser(maxDepth: 2, maxBytes: 8192).parse(Array(bytes[..<newline])),
              let upstream = header["upstream"]?.stringValue, let url = header["metadata_url"]?.stringValue,
              let foundBy = header["found_by"]?.stringValue.flatMap(UpstreamIssuer.Resolved.FoundBy.init(rawValue:)) else { return nil }
        return Kept(upstream: upstream, metadataURL: url, foundBy: foundBy, document: Array(bytes[(newline + 1)...]))
    }
}
