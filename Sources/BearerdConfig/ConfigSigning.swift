import BearerdHTTP
import Yams

#if canImport(Glibc)
import Glibc
#endif

/// `grant: aws` / `grant: aliyun` sessions and a route's `sign:` (docs/architecture.md §6.15).
extension ConfigBuilder {
    /// Keys of a signing session, besides `credentials:`.
    static let signingSessionKeys: Set<String> = [
        "grant", "region", "sts_url", "credentials", "refresh_before", "default_lifetime", "wait_timeout",
        "request_timeout", "tls", "sinks",
    ]

    /// A signing session: `region`, optional `sts_url`, exactly one source under `credentials:`.
    /// The OAuth keys do not apply. `tokenURL` holds where keys are fetched from (for logs):
    /// the STS, the vending URL, or the `exec:` placeholder for `exec` and `static`.
    func signingSession(_ item: Entry, _ f: Fields, grant: GrantType) -> SessionConfig? {
        for e in f.entries where !Self.signingSessionKeys.contains(e.name) {
            fail(e.keyLine, f.key(e.name), "not used with grant \(grant.rawValue): its keys come from credentials:, not a token endpoint")
        }
        let region = parsed(f, "region", expected: "a region such as \(grant == .aws ? "us-east-1" : "cn-hangzhou")") {
            (raw: String) throws(ConfigValues.Problem) -> String in
            guard raw.utf8.count <= 64, raw.utf8.allSatisfy({ ($0 >= 0x61 && $0 <= 0x7A) || ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2D }),
                  raw.utf8.first != 0x2D, raw.utf8.last != 0x2D else {
                throw ConfigValues.Problem("expected a region name (lower-case letters, digits and '-', e.g. \(grant == .aws ? "us-east-1" : "cn-hangzhou")), got \(ConfigValues.quoted(raw))")
            }
            if grant == .aliyun, raw.hasPrefix("oss-") {
                throw ConfigValues.Problem("give the region without the oss- prefix (\(raw.dropFirst(4))), as OSS V4 signs it")
            }
            return raw
        }
        if f["region"] == nil { missing(f, "region", grant == .aws ? "the signing region, e.g. us-east-1" : "the OSS region, e.g. cn-hangzhou") }
        let stsURL = parsed(f, "sts_url", expected: "an http:// or https:// URL") { (raw: String) throws(ConfigValues.Problem) -> EndpointURL in
            try ConfigValues.endpointURL(raw, allowQuery: false)
        }
        let source = credentialSource(f, grant: grant)
        if let e = f["sts_url"], let source, !source.usesSTS {
            fail(e.keyLine, f.key("sts_url"), "only used by web_identity, assume_role and oidc_role (this session's keys come from \(source.name))")
        }
        let refreshBefore = duration(f, "refresh_before", maximum: ConfigValues.maximumLifetime)
        let defaultLifetime = duration(f, "default_lifetime", maximum: ConfigValues.maximumLifetime)
        let waitTimeout = duration(f, "wait_timeout")
        let requestTimeout = duration(f, "request_timeout")
        let tls = tlsSettings(f)
        guard let region, let source else { return nil }
        let sts: EndpointURL
        if let stsURL {
            sts = stsURL
        } else {
            let host: String
            switch grant {
            case .aliyun: host = "sts.\(region).aliyuncs.com"
            default: host = region.hasPrefix("cn-") ? "sts.\(region).amazonaws.com.cn" : "sts.\(region).amazonaws.com"
            }
            sts = EndpointURL(scheme: "https", host: host, port: 443, path: "/")
        }
        let fetchURL: EndpointURL
        switch source {
        case .webIdentity, .assumeRole, .oidcRole: fetchURL = sts
        case .url(let u): fetchURL = u.url
        case .exec, .staticKeys: fetchURL = .execPlaceholder
        }
        if tls != nil, !fetchURL.isTLS, let e = f["tls"] {
            fail(e.keyLine, f.key("tls"), "tls settings need an https:// \(source.usesSTS ? "sts_url" : "credentials url")")
        }
        var timeout = requestTimeout ?? .seconds(15)
        if case .exec = source, requestTimeout == nil { timeout = .seconds(10) }
        var s = SessionConfig(name: item.name, grant: grant, tokenURL: fetchURL, clientID: "", clientAuth: .none,
                              refreshBefore: refreshBefore, defaultLifetime: defaultLifetime ?? .seconds(300), tls: tls,
                              requestTimeout: timeout, waitTimeout: waitTimeout ?? .seconds(10), line: item.keyLine)
        s.signing = SigningCredentialsConfig(region: region, stsURL: sts, source: source)
        if case .exec(let argv) = source {
            s.command = argv
            s.commandTimeout = timeout
        }
        return s
    }

    /// `credentials:` with exactly one source; `url_headers` and `url_token_file` go with `url`.
    private func credentialSource(_ owner: Fields, grant: GrantType) -> CredentialSourceConfig? {
        guard let entry = owner["credentials"] else {
            missing(owner, "credentials", grant == .aws
                    ? "where the keys come from: web_identity, assume_role, url, exec or static"
                    : "where the keys come from: url (a token vending server), oidc_role, exec or static")
            return nil
        }
        let sources = grant == .aws ? ["web_identity", "assume_role", "url", "exec", "static"] : ["url", "oidc_role", "exec", "static"]
        let known = sources + ["url_headers", "url_token_file"]
        guard let f = fields(entry.value, path: owner.key("credentials"), line: entry.keyLine, known: nil,
                             expected: "a mapping with one source (\(sources.joined(separator: ", ")))") else { return nil }
        for e in f.entries where !known.contains(e.name) {
            let other = grant == .aws ? "oidc_role" : "web_identity, assume_role"
            let hint = (grant == .aws && e.name == "oidc_role") || (grant == .aliyun && (e.name == "web_identity" || e.name == "assume_role"))
                ? " (\(other) is for grant \(grant == .aws ? "aliyun" : "aws"))" : ""
            var message = "unknown credentials source\(hint); expected one of \(sources.joined(separator: ", "))"
            if hint.isEmpty, let guess = ConfigValues.suggestion(for: e.name, among: known) { message += " (did you mean \(guess)?)" }
            fail(e.keyLine, f.key(e.name), message)
        }
        let given = f.entries.filter { sources.contains($0.name) }
        guard let chosen = given.first else {
            if f.entries.allSatisfy({ known.contains($0.name) }) {
                fail(entry.keyLine, owner.key("credentials"), "expected exactly one source (\(sources.joined(separator: ", "))), got none")
            }
            return nil
        }
        if given.count > 1 {
            fail(given[1].keyLine, f.key(given[1].name), "give exactly one source under credentials (already \(chosen.name) at line \(chosen.keyLine))")
            return nil
        }
        for k in ["url_headers", "url_token_file"] where chosen.name != "url" {
            if let e = f[k] { fail(e.keyLine, f.key(k), "only used with url:") }
        }
        switch chosen.name {
        case "web_identity":
            guard let w = subFields(chosen, f, ConfigKeys.webIdentity, "web_identity: { role_arn, token_file }") else { return nil }
            let role = arn(w, "role_arn", prefix: "arn:")
            let token = requiredPath(w, "token_file", "the projected service account token, e.g. /var/run/secrets/eks.amazonaws.com/serviceaccount/token")
            let name = sessionName(w)
            let seconds = stsDuration(w)
            guard let role, let token, let name else { return nil }
            return .webIdentity(.init(roleARN: role, tokenFile: token, sessionName: name, durationSeconds: seconds))
        case "assume_role":
            guard let a = subFields(chosen, f, ConfigKeys.assumeRole, "assume_role: { role_arn, access_key_id_file, secret_access_key_file }") else { return nil }
            let role = arn(a, "role_arn", prefix: "arn:")
            let keys = keyFiles(a)
            let external = text(a, "external_id", expected: "the role's external id")
            // ExternalId: 2–1224 of [\w+=,.@:/-] (the STS API reference).
            if let external, !(2...1224).contains(external.utf8.count) || !external.utf8.allSatisfy({ c in
                (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || "_+=,.@:/-".utf8.contains(c) }) {
                fail(a["external_id"]?.valueLine ?? a.line, a.key("external_id"), "expected 2–1224 letters, digits or _+=,.@:/- (ExternalId), got \(ConfigValues.quoted(external))")
            }
            let name = sessionName(a)
            let seconds = stsDuration(a)
            guard let role, let keys, let name else { return nil }
            return .assumeRole(.init(roleARN: role, keys: keys, externalID: external, sessionName: name, durationSeconds: seconds))
        case "static":
            guard let s = subFields(chosen, f, ConfigKeys.staticKeys, "static: { access_key_id_file, secret_access_key_file }") else { return nil }
            return keyFiles(s).map { .staticKeys($0) }
        case "oidc_role":
            guard let o = subFields(chosen, f, ConfigKeys.oidcRole, "oidc_role: { role_arn, oidc_provider_arn, token_file }") else { return nil }
            let role = arn(o, "role_arn", prefix: "acs:ram::")
            let provider = arn(o, "oidc_provider_arn", prefix: "acs:ram::")
            let token = requiredPath(o, "token_file", "the projected service account token, e.g. /var/run/secrets/ack.alibabacloud.com/rrsa-tokens/token")
            let name = sessionName(o, aliyun: true)
            let seconds = stsDuration(o)
            guard let role, let provider, let token, let name else { return nil }
            return .oidcRole(.init(roleARN: role, oidcProviderARN: provider, tokenFile: token, sessionName: name, durationSeconds: seconds))
        case "url":
            let url = parsed(f, "url", expected: "the vending endpoint's http:// or https:// URL") { (raw: String) throws(ConfigValues.Problem) -> EndpointURL in
                try ConfigValues.endpointURL(raw, allowQuery: true)
            }
            let headers = urlHeaders(f)
            let tokenFile = path(f, "url_token_file", mustRead: true)
            if tokenFile != nil, headers.contains(where: { $0.name.lowercased() == "authorization" }), let e = f["url_token_file"] {
                fail(e.keyLine, f.key("url_token_file"), "url_headers already sets Authorization; give one of them")
            }
            guard let url else { return nil }
            return .url(.init(url: url, headers: headers, tokenFile: tokenFile))
        case "exec":
            return argv(chosen, in: f, hint: "a list: the program and its arguments, e.g. [/usr/local/bin/creds, --profile, app]").map { .exec($0) }
        default:
            return nil
        }
    }

    private func subFields(_ entry: Entry, _ parent: Fields, _ known: [String], _ shape: String) -> Fields? {
        fields(entry.value, path: parent.key(entry.name), line: entry.keyLine, known: known, expected: "a mapping \(shape)")
    }

    private func arn(_ f: Fields, _ name: String, prefix: String) -> String? {
        if f[name] == nil { missing(f, name, prefix == "arn:" ? "e.g. arn:aws:iam::123456789012:role/app" : "e.g. acs:ram::123456789012:role/app") }
        return parsed(f, name, expected: "an ARN") { (raw: String) throws(ConfigValues.Problem) -> String in
            // IAM and RAM: 20–2048 visible ASCII characters.
            guard raw.hasPrefix(prefix), (20...2048).contains(raw.utf8.count),
                  raw.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
                throw ConfigValues.Problem("expected an ARN starting with \(prefix) (20–2048 visible ASCII characters), got \(ConfigValues.quoted(raw))")
            }
            return raw
        }
    }

    private func requiredPath(_ f: Fields, _ name: String, _ hint: String) -> String? {
        if f[name] == nil { missing(f, name, hint) }
        // Projected tokens may appear after bearerd starts (the kubelet writes them): not checked here.
        return path(f, name, mustRead: false)
    }

    /// `session_name` (`RoleSessionName`), default `bearerd`: AWS 2–64 of `[\w+=,.@-]`,
    /// Alibaba Cloud 2–64 of `[A-Za-z0-9.@_-]`.
    private func sessionName(_ f: Fields, aliyun: Bool = false) -> String? {
        guard f["session_name"] != nil else { return "bearerd" }
        let punctuation = aliyun ? "_.@-" : "_+=,.@-"
        return parsed(f, "session_name", expected: "a role session name") { (raw: String) throws(ConfigValues.Problem) -> String in
            let allowed = raw.utf8.allSatisfy { c in
                (c >= 0x30 && c <= 0x39) || (c >= 0x41 && c <= 0x5A) || (c >= 0x61 && c <= 0x7A) || punctuation.utf8.contains(c)
            }
            guard allowed, (2...64).contains(raw.utf8.count) else {
                throw ConfigValues.Problem("expected 2–64 letters, digits or \(punctuation) (RoleSessionName), got \(ConfigValues.quoted(raw))")
            }
            return raw
        }
    }

    /// `duration:` (`DurationSeconds`), 15 min to 12 h.
    private func stsDuration(_ f: Fields) -> Int? {
        guard let d = duration(f, "duration", maximum: .seconds(43_200)) else { return nil }
        let seconds = Int(d.components.seconds)
        if seconds < 900 {
            fail(f["duration"]?.valueLine ?? f.line, f.key("duration"), "must be at least 15m (the STS minimum), got \(seconds)s")
            return nil
        }
        return seconds
    }

    private func keyFiles(_ f: Fields) -> CredentialSourceConfig.StaticKeys? {
        if f["access_key_id_file"] == nil { missing(f, "access_key_id_file", "the file holding the access key id") }
        if f["secret_access_key_file"] == nil { missing(f, "secret_access_key_file", "the file holding the secret access key") }
        let id = path(f, "access_key_id_file", mustRead: true)
        let secret = path(f, "secret_access_key_file", mustRead: true)
        let token = path(f, "session_token_file", mustRead: true)
        guard let id, let secret else { return nil }
        return .init(accessKeyIDFile: id, secretAccessKeyFile: secret, sessionTokenFile: token)
    }

    /// `url_headers: { Name: value }`: RFC 9110 field names and values, none bearerd sets itself.
    private func urlHeaders(_ f: Fields) -> [CredentialSourceConfig.VendingURL.Header] {
        guard let entry = f["url_headers"],
              let h = fields(entry.value, path: f.key("url_headers"), line: entry.keyLine, known: nil,
                             expected: "a mapping of header names to values, e.g. { Authorization: \"...\" }") else { return [] }
        var out: [CredentialSourceConfig.VendingURL.Header] = []
        for e in h.entries {
            guard Self.isToken(e.name) else {
                fail(e.keyLine, h.key(e.name), "not a valid header name (RFC 9110 token)")
                continue
            }
            if ["host", "content-length", "transfer-encoding", "connection"].contains(e.name.lowercased()) {
                fail(e.keyLine, h.key(e.name), "bearerd sets this header itself")
                continue
            }
            guard let value = text(e, in: h, expected: "a header value", secret: true) else { continue }
            if value.unicodeScalars.contains(where: { ($0.value < 0x20 && $0.value != 0x09) || $0.value == 0x7F }) {
                fail(e.valueLine, h.key(e.name), "a header value must not contain control characters")
                continue
            }
            out.append(.init(name: e.name, value: value))
        }
        return out
    }

    /// An argv list (no shell): non-empty strings; argv[0] an executable (absolute, or found in PATH).
    func argv(_ e: Entry, in f: Fields, hint expected: String) -> [String]? {
        guard case .sequence(let items) = e.value else {
            fail(e.valueLine, f.key(e.name), "expected \(expected) (no shell runs it), got \(Self.describe(e.value))")
            return nil
        }
        var out: [String] = []
        for (i, node) in items.enumerated() {
            guard case .scalar(let s) = node, !Self.isNull(node), !s.string.isEmpty, !s.string.contains("\0") else {
                fail(Self.line(node), "\(f.key(e.name))[\(i)]", "expected a non-empty string, got \(Self.describe(node))")
                continue
            }
            out.append(s.string)
        }
        if items.isEmpty { fail(e.valueLine, f.key(e.name), "expected \(expected), got an empty list") }
        guard out.count == items.count, let program = out.first else { return nil }
        if checkFiles {
            if program.contains("/") {
                if access(program, X_OK) != 0 { fail(e.valueLine, f.key(e.name), "\(program) is not an executable file") }
            } else {
                let path = (environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin").split(separator: ":")
                if !path.contains(where: { access("\($0)/\(program)", X_OK) == 0 }) {
                    fail(e.valueLine, f.key(e.name), "\(program) is not found in PATH; give its absolute path")
                }
            }
        }
        return out
    }

    // MARK: - routes[N].sign

    /// `sign: { service, bucket, payload }`. Checked against the session in `checkSigning`.
    func signSettings(_ owner: Fields) -> SignConfig? {
        guard let entry = owner["sign"],
              let f = fields(entry.value, path: owner.key("sign"), line: entry.keyLine, known: ConfigKeys.sign,
                             expected: "a mapping such as { service: s3 }") else { return nil }
        let service = parsed(f, "service", expected: "a service name such as s3") { (raw: String) throws(ConfigValues.Problem) -> String in
            guard raw.utf8.count <= 64, raw.utf8.allSatisfy({ ($0 >= 0x61 && $0 <= 0x7A) || ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2D || $0 == 0x2E }) else {
                throw ConfigValues.Problem("expected a service name as the signature's scope names it (lower case: s3, execute-api, bedrock), got \(ConfigValues.quoted(raw))")
            }
            return raw
        }
        let bucket = parsed(f, "bucket", expected: "a bucket name") { (raw: String) throws(ConfigValues.Problem) -> String in
            guard (3...63).contains(raw.utf8.count),
                  raw.utf8.allSatisfy({ ($0 >= 0x61 && $0 <= 0x7A) || ($0 >= 0x30 && $0 <= 0x39) || $0 == 0x2D }) else {
                throw ConfigValues.Problem("expected a bucket name (3–63 lower-case letters, digits and '-'), got \(ConfigValues.quoted(raw))")
            }
            return raw
        }
        let payload = choice(f, "payload", SignConfig.Payload.self)
        if f["service"] != nil && service == nil || f["bucket"] != nil && bucket == nil || f["payload"] != nil && payload == nil { return nil }
        // The default: bodies stream for the object stores; other services verify the hash.
        let defaultPayload: SignConfig.Payload = service == nil || service == "s3" ? .unsigned : .signed
        var sign = SignConfig(service: service, bucket: bucket, payload: payload ?? defaultPayload)
        sign.line = entry.keyLine
        return sign
    }

    /// Routes and signing sessions fit each other: `sign:` only with a signing session (and a
    /// signing session only with `sign:`), `service` for aws (and not for aliyun), `bucket` for
    /// aliyun only, `payload: unsigned` only for S3 and OSS, no `inject:` beside `sign:`; and a
    /// signing session's sinks write its keys (format token or json, not header).
    func checkSigning(sessions: [SessionConfig], routes: [(index: Int, route: RouteConfig)]) {
        let byName = Dictionary(sessions.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        for (index, route) in routes {
            let key = "routes[\(index)]"
            let session = route.session.flatMap { byName[$0] }
            guard let sign = route.sign else {
                if let session, session.grant.isSigning {
                    fail(route.line, "\(key).sign", "missing: session '\(session.name)' has grant \(session.grant.rawValue): its keys sign requests, "
                         + (session.grant == .aws ? "add sign: { service: s3 } (or the service the upstream is)" : "add sign: {} (OSS V4)"))
                }
                continue
            }
            guard let name = route.session else {
                fail(sign.line, "\(key).sign", "sign needs a session: on this route (a grant aws or aliyun session holding the keys)")
                continue
            }
            guard let session else { continue }  // an unknown session is reported already
            guard session.grant.isSigning else {
                fail(sign.line, "\(key).sign", "session '\(name)' has grant \(session.grant.rawValue), which gives a token; sign needs grant aws or aliyun")
                continue
            }
            if route.injectConfigured {
                fail(sign.line, "\(key).inject", "a signed route carries no token: remove inject (sign replaces it)")
            }
            if session.grant == .aws {
                if sign.service == nil { fail(sign.line, "\(key).sign.service", "missing: SigV4 signs for a service, e.g. s3, execute-api or bedrock") }
                if sign.bucket != nil { fail(sign.line, "\(key).sign.bucket", "only used for OSS (grant aliyun); S3 takes the bucket from the host or the path") }
                if sign.payload == .unsigned, let service = sign.service, service != "s3" {
                    fail(sign.line, "\(key).sign.payload", "payload unsigned is for S3 only; service \(service) verifies the body's hash (payload: signed)")
                }
            } else if let service = sign.service, service != "oss" {
                fail(sign.line, "\(key).sign.service", "OSS V4 always signs for oss; remove service (got \(service))")
            }
        }
        for session in sessions where session.grant.isSigning {
            for sink in session.sinks where sink.format == .header {
                fail(sink.line, "sessions.\(session.name).sinks", "format header is for tokens; a signing session's sink holds its keys: "
                     + "format token (credential_process JSON) or json ({access_key_id, secret_access_key, session_token, expiration})")
            }
        }
    }
}

extension CredentialSourceConfig {
    /// Sources that call the STS (`sts_url` applies).
    public var usesSTS: Bool {
        switch self {
        case .webIdentity, .assumeRole, .oidcRole: return true
        case .url, .exec, .staticKeys: return false
        }
    }
}
