import BearerdOAuth
import Foundation
import Yams

/// The keys of keyless workload identity (docs/architecture.md §4 `jwt_bearer`, `token_exchange`,
/// `client_assertion`, `audience`, `resource`; docs/architecture.md §6.10): read
/// and checked here, so `ConfigSections.session` only calls in. Part of `ConfigBuilder`'s one
/// pass (same thread, same error list).
extension ConfigBuilder {
    /// The workload settings of one session, as read.
    struct WorkloadKeys {
        var assertionFile: String?
        var clientAssertionFile: String?
        var audiences: [String] = []
        var resources: [String] = []
        var exchange: TokenExchangeConfig?
    }

    static let grantOnlyKeys: [(key: String, grant: GrantType)] = [
        ("assertion_file", .jwtBearer), ("subject_token_file", .tokenExchange), ("subject_session", .tokenExchange),
        ("subject_token_type", .tokenExchange), ("actor_token_file", .tokenExchange), ("actor_token_type", .tokenExchange),
        ("requested_token_type", .tokenExchange),
    ]

    /// Reads `assertion_file`, the exchange keys, `client_assertion_file`, `audience` and
    /// `resource`, reporting misplaced, missing and conflicting ones. With `checkFiles`, every
    /// credential file must be readable and hold a JWT.
    func workloadKeys(_ f: Fields, grant: GrantType?, clientAuth: ClientAuthentication) -> WorkloadKeys {
        var w = WorkloadKeys()
        if let grant {
            for (key, needs) in Self.grantOnlyKeys where grant != needs {
                if let e = f[key] { fail(e.keyLine, f.key(key), "only used with grant \(needs.rawValue) (this session has grant \(grant.rawValue))") }
            }
        }
        w.audiences = stringList(f, "audience", expected: "an audience (a string or a list of them)")
        w.resources = stringList(f, "resource", expected: "a resource URI (a string or a list of them, RFC 8707)")
        for (i, r) in w.resources.enumerated() where !r.contains(":") || r.contains("#") {
            // RFC 8707 §2: an absolute URI without a fragment.
            fail(f["resource"]?.valueLine ?? f.line, f.key("resource") + (w.resources.count > 1 ? "[\(i)]" : ""),
                 "expected an absolute URI without a fragment (RFC 8707 §2), got \(ConfigValues.quoted(r))")
        }

        if grant == .jwtBearer {
            w.assertionFile = credentialFile(f, "assertion_file")
            if f["assertion_file"] == nil, f["assertion"] == nil {
                missing(f, "assertion_file", "grant jwt_bearer sends the JWT in this file, e.g. a projected service-account token; "
                        + "or assertion: caller sends each caller's own token (on behalf of callers)")
            }
        }
        if grant == .tokenExchange {
            let subjectType = tokenTypeURI(f, "subject_token_type")
            let actorType = tokenTypeURI(f, "actor_token_type")
            // Only JWT token types must hold a JWT (an opaque access token in a file is fine).
            func jwtType(_ t: String?) -> Bool { t == nil || t == TokenRequest.TokenExchange.jwtType || t == TokenRequest.TokenExchange.idTokenType }
            let file = credentialFile(f, "subject_token_file", mustBeJWT: jwtType(subjectType))
            let session = text(f, "subject_session", expected: "the name of another session")
            var subject: TokenExchangeConfig.Subject?
            switch (f["subject_token_file"], f["subject_session"]) {
            case (nil, nil) where f["subject"] != nil:
                // `subject: caller` (checked in `onBehalfOf`): each caller's own token.
                subject = .caller
            case (nil, nil):
                missing(f, "subject_token_file", "grant token_exchange needs subject_token_file: or subject_session: (the token to exchange), "
                        + "or subject: caller (each caller's own token)")
            case (_?, let s?):
                fail(s.keyLine, f.key("subject_session"), "give either subject_token_file or subject_session, not both")
            case (_?, nil):
                if let file { subject = .file(file) }
            case (nil, let s?):
                if let session {
                    subject = .session(session)
                    subjectSessionLines[f.path] = s.valueLine
                }
            }
            let actorFile = credentialFile(f, "actor_token_file", mustBeJWT: jwtType(actorType))
            if let e = f["actor_token_type"], f["actor_token_file"] == nil {
                fail(e.keyLine, f.key("actor_token_type"), "only used with actor_token_file")
            }
            let requested = tokenTypeURI(f, "requested_token_type")
            if let subject {
                // A file holds a JWT; a session's or a caller's token is an access token (RFC 8693 §3).
                let defaultType = subject.isFile ? TokenRequest.TokenExchange.jwtType : TokenRequest.TokenExchange.accessTokenType
                w.exchange = TokenExchangeConfig(subject: subject, subjectTokenType: subjectType ?? defaultType,
                                                 actorTokenFile: actorFile,
                                                 actorTokenType: actorFile == nil ? nil : (actorType ?? TokenRequest.TokenExchange.jwtType),
                                                 requestedTokenType: requested)
            }
        }

        if clientAuth == .clientAssertion {
            w.clientAssertionFile = credentialFile(f, "client_assertion_file")
            if f["client_assertion_file"] == nil {
                missing(f, "client_assertion_file", "client_auth client_assertion sends the JWT in this file (a federated credential)")
            }
        } else if let e = f["client_assertion_file"] {
            fail(e.keyLine, f.key("client_assertion_file"), "only used with client_auth client_assertion")
        }
        return w
    }

    /// `params:` may not carry what the session's own key also sets (params alone still may).
    static let paramsWithOwnKey: [String: String] = ["audience": "audience", "resource": "resource"]

    /// A file whose content is a JWT credential: with `checkFiles` it must be readable and hold
    /// a JWT (not checked for expiry: a projected token rotates before bearerd uses it).
    private func credentialFile(_ f: Fields, _ name: String, mustBeJWT: Bool = true) -> String? {
        guard let path = path(f, name, mustRead: false), let e = f[name] else { return nil }
        if checkFiles {
            do throws(ConfigFiles.Failure) {
                let bytes = try ConfigFiles.readAll(path, limit: 64 * 1024)
                let text = CredentialJWT.trimmed(String(decoding: bytes, as: UTF8.self))
                if text.isEmpty {
                    fail(e.valueLine, f.key(name), "\(path) is empty; it must hold a JWT")
                } else if mustBeJWT, case .notAJWT(let why) = CredentialJWT.inspect(text) {
                    fail(e.valueLine, f.key(name), "\(path) holds no JWT (\(why))")
                }
            } catch {
                fail(e.valueLine, f.key(name), "cannot read \(path): \(error.reason)")
            }
        }
        return path
    }

    /// An RFC 8693 §3 token type: a URI (`urn:…` or `https:…`).
    private func tokenTypeURI(_ f: Fields, _ name: String) -> String? {
        parsed(f, name, expected: "a token type URI such as urn:ietf:params:oauth:token-type:jwt") { (raw: String) throws(ConfigValues.Problem) -> String in
            guard raw.contains(":"), !raw.contains(" ") else {
                throw ConfigValues.Problem("expected a token type URI such as urn:ietf:params:oauth:token-type:jwt (RFC 8693 §3), got \(ConfigValues.quoted(raw))")
            }
            return raw
        }
    }

    /// One string or a list of non-empty strings (YAML scalar or sequence).
    private func stringList(_ f: Fields, _ name: String, expected: String) -> [String] {
        guard let e = f[name], let items = listItems(e, key: f.key(name), expected: expected) else { return [] }
        var out: [String] = []
        for (i, node) in items.enumerated() {
            guard case .scalar(let s) = node, !Self.isNull(node), !s.string.isEmpty else {
                fail(Self.line(node), items.count > 1 || isSequence(e.value) ? "\(f.key(name))[\(i)]" : f.key(name),
                     "expected a non-empty string, got \(Self.describe(node))")
                continue
            }
            out.append(s.string)
        }
        if items.isEmpty { fail(e.valueLine, f.key(name), "expected at least one value, got an empty list") }
        return out
    }

    private func isSequence(_ node: Node) -> Bool {
        if case .sequence = node { return true }
        return false
    }

    /// Sessions that chain (`subject_session:`): every name must exist, not be the session
    /// itself, and the chain must end (no cycle). Errors at the `subject_session:` line.
    func checkChains(_ sessions: [SessionConfig], allNames: [String]) {
        let subjectOf: [String: String] = Dictionary(sessions.compactMap { s in s.exchange?.subjectSession.map { (s.name, $0) } },
                                                     uniquingKeysWith: { a, _ in a })
        for s in sessions {
            guard let target = s.exchange?.subjectSession else { continue }
            let line = subjectSessionLines["sessions.\(s.name)"] ?? s.line
            let key = "sessions.\(s.name).subject_session"
            guard allNames.contains(target) else {
                var message = "no session named '\(target)'"
                if let guess = ConfigValues.suggestion(for: target, among: allNames) { message += " (did you mean \(guess)?)" }
                fail(line, key, message)
                continue
            }
            // Follow the chain; at most one step per session, so it ends or repeats.
            var seen: [String] = [s.name]
            var next: String? = target
            while let n = next, seen.count <= sessions.count {
                if let first = seen.firstIndex(of: n) {
                    if first == 0 {
                        fail(line, key, "sessions chain in a cycle: " + (seen + [n]).joined(separator: " → ")
                             + " (a token exchange needs a subject that does not depend on itself)")
                    }
                    break
                }
                seen.append(n)
                next = subjectOf[n]
            }
        }
    }
}

extension TokenExchangeConfig.Subject {
    var isFile: Bool {
        if case .file = self { return true }
        return false
    }
}
