import Foundation

/// A second real authorization server for end-to-end tests: django-oauth-toolkit
/// (`Tests/Fixtures/dot_server.py`, a single-file Django project) run as a `PythonFixture` on
/// 127.0.0.1 with an ephemeral port and a sqlite database in a temporary directory. DOT is
/// mounted under `/o/` and every endpoint ends in `/` (404 without it); OIDC is on (issuer
/// `http://127.0.0.1:<port>/o`); refresh tokens rotate. Applications: `native` (public,
/// authorization code with PKCE, redirect URI `http://127.0.0.1/callback`, any port) and `tv`
/// (public, device code). The user is alice unless a device approval names another.
///
/// Owns the child (through `PythonFixture`) and its temporary directory. Invariants: `port` is
/// where the server listened when `start` returned; after `stop()` (or deinit) the child has
/// exited and the directory is removed; `stop()` is idempotent. Thread-safe: the child's life
/// cycle is `PythonFixture`'s (guarded by its lock), `stopped` is guarded by `lock`, and the HTTP
/// helpers use one fresh connection per call.
public final class DjangoOAuthFixture: @unchecked Sendable {  // @unchecked: `stopped` guarded by `lock`
    public let port: UInt16
    private let child: PythonFixture
    private let directory: URL
    private let lock = NSLock()
    private var stopped = false

    /// `http://127.0.0.1:<port>/o`, as DOT's metadata names it (no final `/`).
    public var issuer: String { "http://127.0.0.1:\(port)/o" }
    public var authorizationURL: String { "http://127.0.0.1:\(port)/o/authorize/" }
    public var tokenURL: String { "http://127.0.0.1:\(port)/o/token/" }
    public var deviceAuthorizationURL: String { "http://127.0.0.1:\(port)/o/device-authorization/" }
    public var revocationURL: String { "http://127.0.0.1:\(port)/o/revoke_token/" }
    /// The API answering a bad token with 401 and `WWW-Authenticate: Bearer error="invalid_token"`.
    public var apiURL: String { "http://127.0.0.1:\(port)/api" }
    /// The API answering a bad token with a bare 403 (DOT's plain `ProtectedResourceView`).
    public var legacyAPIURL: String { "http://127.0.0.1:\(port)/legacy" }

    /// True when the script exists and the interpreter imports django and oauth2_provider.
    public static var isAvailable: Bool { availability == nil }
    /// Why `isAvailable` is false (a message for the skipped test), or nil.
    public static var unavailableReason: String? { availability }
    private static let availability: String? = {
        let script = PythonFixture.script("dot_server.py")
        guard FileManager.default.fileExists(atPath: script) else { return "django-oauth-toolkit fixture not found at \(script)" }
        return PythonFixture.unavailable(modules: ["django", "oauth2_provider"])
    }()

    private init(port: UInt16, child: PythonFixture, directory: URL) {
        self.port = port
        self.child = child
        self.directory = directory
    }

    deinit { stop() }

    /// Starts the server and waits (up to 60 s: Django's imports and the schema on a busy
    /// machine) until it listens.
    /// - Parameters:
    ///   - tokenLifetime: `expires_in` of access tokens, in seconds.
    ///   - rootMetadata: also serve RFC 8414 metadata at `/.well-known/oauth-authorization-server/o`
    ///     (DOT's advice for deployments under a prefix); without it only OIDC discovery at
    ///     `/o/.well-known/openid-configuration` answers.
    ///   - rfc9700: every `COMPLIANT_BCP_RFC9700_*` gate on (DOT 4.0's announced defaults): the
    ///     authorization response carries `iss` (RFC 9207), S256 only, tokens hashed at rest.
    public static func start(tokenLifetime: Int = 3600, rootMetadata: Bool = false, rfc9700: Bool = false) throws -> DjangoOAuthFixture {
        if let reason = availability { throw AuthServerFixture.Failure("django-oauth-toolkit fixture unavailable: \(reason)") }
        let fm = FileManager.default
        let dir = fm.temporaryDirectory.appendingPathComponent("bearerd-dot-\(UUID().uuidString)")
        try fm.createDirectory(at: dir, withIntermediateDirectories: true)
        var args = ["--state-dir", dir.path, "--token-lifetime", String(tokenLifetime)]
        if rootMetadata { args.append("--root-metadata") }
        if rfc9700 { args.append("--rfc9700") }
        do {
            let child = try PythonFixture(script: "dot_server.py", arguments: args, readyTimeout: 60)
            return DjangoOAuthFixture(port: child.port, child: child, directory: dir)
        } catch {
            try? fm.removeItem(at: dir)
            throw error
        }
    }

    /// Stops the server (closes its stdin, SIGKILL after 5 s) and removes the directory. Idempotent.
    public func stop() {
        let was = lock.withLock { () -> Bool in
            defer { stopped = true }
            return stopped
        }
        if was { return }
        child.stop()
        try? FileManager.default.removeItem(at: directory)
    }

    /// The server's request log and errors so far.
    public var log: String { child.log }

    // MARK: - Test hooks

    /// `GET /_test/stats/`: `token_requests` and `token_errors` (by grant type / error, `[String: Int]`),
    /// `not_found` (paths answered 404, `[String]`), `api` (by status), `refresh_tokens` (`live`, `revoked`).
    public func stats() throws -> [String: Any] {
        try Self.object(request("GET", "/_test/stats/"))
    }

    /// Token requests of `grantType` so far.
    public func tokenRequests(_ grantType: String) throws -> Int {
        ((try stats()["token_requests"] as? [String: Any])?[grantType] as? Int) ?? 0
    }

    /// `POST /_test/expire-all/`: every access token issued so far expires now (the APIs refuse it);
    /// refresh tokens stay valid.
    public func expireAll() throws {
        _ = try Self.object(request("POST", "/_test/expire-all/"))
    }

    /// `POST /_test/device/approve/`: what the verification page does once `user` entered the code.
    public func decideDevice(userCode: String, user: String = "alice", approve: Bool = true) throws {
        let body = try JSONSerialization.data(withJSONObject: ["user_code": userCode, "user": user, "approve": approve])
        _ = try Self.object(request("POST", "/_test/device/approve/", headers: [("Content-Type", "application/json")], body: Array(body)))
    }

    /// `POST /_test/app/`: another public authorization-code application with these redirect URIs
    /// (space separated), compared as DOT compares them.
    public func registerApplication(clientID: String, redirectURIs: String) throws {
        let body = try JSONSerialization.data(withJSONObject: ["client_id": clientID, "grant": "authorization-code", "redirect_uris": redirectURIs])
        _ = try Self.object(request("POST", "/_test/app/", headers: [("Content-Type", "application/json")], body: Array(body)))
    }

    /// `GET <path>` of the APIs with `Authorization: Bearer <token>`.
    public func api(_ path: String, token: String) throws -> TestClient.Response {
        try request("GET", path, headers: [("Authorization", "Bearer \(token)")])
    }

    /// RFC 7009 revocation of `token` by the public client `clientID` at `/o/revoke_token/`.
    public func revoke(_ token: String, hint: String = "access_token", clientID: String = "native") throws -> TestClient.Response {
        let form = "token=\(AuthServerFixture.formEncode(token))&token_type_hint=\(hint)&client_id=\(AuthServerFixture.formEncode(clientID))"
        return try request("POST", "/o/revoke_token/", headers: [("Content-Type", "application/x-www-form-urlencoded")], body: Array(form.utf8))
    }

    /// One request on a fresh connection (`Connection: close`); `Host` and `Content-Length` added.
    public func request(_ method: String, _ target: String, headers: [(String, String)] = [], body: [UInt8] = []) throws -> TestClient.Response {
        let client = try TestClient(port: port)
        var head = "\(method) \(target) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n"
        for (k, v) in headers { head += "\(k): \(v)\r\n" }
        if !body.isEmpty || method == "POST" { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        try client.send(Array(head.utf8) + body)
        return try client.readResponse(method: method)
    }

    private static func object(_ response: TestClient.Response) throws -> [String: Any] {
        guard response.status == 200,
              let obj = try? JSONSerialization.jsonObject(with: Data(response.body)) as? [String: Any] else {
            throw AuthServerFixture.Failure("django-oauth-toolkit fixture answered \(response.status): \(response.bodyText.prefix(500))")
        }
        return obj
    }
}
