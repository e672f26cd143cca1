import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// A real OAuth 2.0 authorization server for end-to-end tests: `Tests/Fixtures/oauth_server.py`
/// (Authlib + Flask, see `Tests/Fixtures/README.md`) run as a child process on 127.0.0.1 with an
/// ephemeral port. Endpoints: `tokenURL` (client_credentials, password, refresh_token),
/// `revokeURL` (RFC 7009) and a Bearer-protected echo API under `/api/`.
///
/// Owns the child process and a temporary directory (port file, stderr log). Invariants: `port`
/// is the port the server was listening on when `start` returned; after `stop()` (or deinit) the
/// process has exited and the directory is removed; `stop()` is idempotent. Thread-safe:
/// `stopped` is guarded by `lock`, the HTTP helpers use one fresh connection per call.
///
/// Tests should check `isAvailable` first and skip with `unavailableReason` when it is false
/// (CI installs `Tests/Fixtures/requirements.txt`).
public final class AuthServerFixture: @unchecked Sendable {  // @unchecked: `stopped` guarded by `lock`
    public struct Failure: Error, CustomStringConvertible {
        public var description: String
        public init(_ description: String) { self.description = description }
    }

    public let port: UInt16
    /// Started with `trailingSlash`: the OAuth endpoints end in `/`, and 404 without it.
    public let trailingSlash: Bool
    private var slash: String { trailingSlash ? "/" : "" }
    /// `http://127.0.0.1:<port>/oauth/token` (`…/oauth/token/` with `trailingSlash`)
    public var tokenURL: String { "http://127.0.0.1:\(port)/oauth/token" + slash }
    /// `http://127.0.0.1:<port>/oauth/revoke` (`…/oauth/revoke/` with `trailingSlash`)
    public var revokeURL: String { "http://127.0.0.1:\(port)/oauth/revoke" + slash }
    /// The issuer its metadata names: `http://127.0.0.1:<port>` (with a final `/` under `trailingSlash`).
    public var issuer: String { "http://127.0.0.1:\(port)" + slash }
    /// `http://127.0.0.1:<port>/api` — the protected test API (an upstream for routes).
    public var apiURL: String { "http://127.0.0.1:\(port)/api" }

    private let process: Process
    private let directory: URL
    private let lock = NSLock()
    private var stopped = false

    private init(port: UInt16, trailingSlash: Bool, process: Process, directory: URL) {
        self.port = port
        self.trailingSlash = trailingSlash
        self.process = process
        self.directory = directory
    }

    deinit { stop() }

    // MARK: - Locating and checking the fixture

    /// Repository root, derived from this source file's location
    /// (`<root>/Sources/BearerdTestSupport/AuthServerFixture.swift`).
    public static var repositoryRoot: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
    }

    /// `<root>/Tests/Fixtures/oauth_server.py`
    public static var scriptPath: String {
        repositoryRoot.appendingPathComponent("Tests/Fixtures/oauth_server.py").path
    }

    /// The interpreter: `$BEARERD_PYTHON` when set, else the repository's `.venv/bin/python3`
    /// (made by the README's set-up command and by `.ci/run`), else `python3` from `PATH`.
    public static var python: String {
        if let p = ProcessInfo.processInfo.environment["BEARERD_PYTHON"] { return p }
        let venv = repositoryRoot.appendingPathComponent(".venv/bin/python3").path
        if FileManager.default.isExecutableFile(atPath: venv) { return venv }
        return "python3"
    }

    /// True when the script exists and `python3 -c "import authlib, flask"` succeeds.
    /// Computed once per test process.
    public static var isAvailable: Bool { availability == nil }

    /// Why `isAvailable` is false (a message for the skipped test), or nil.
    public static var unavailableReason: String? { availability }

    private static let availability: String? = {
        guard FileManager.default.fileExists(atPath: scriptPath) else {
            return "OAuth fixture not found at \(scriptPath)"
        }
        return pythonMissing(modules: ["authlib", "flask"])
    }()

    /// Nil when the test interpreter (`python`) imports every module; else why not, with the fix.
    public static func pythonMissing(modules: [String]) -> String? {
        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = [python, "-c", "import " + modules.joined(separator: ", ")]
        p.standardInput = FileHandle.nullDevice
        p.standardOutput = FileHandle.nullDevice
        p.standardError = FileHandle.nullDevice
        do {
            try p.run()
            p.waitUntilExit()
        } catch {
            return "cannot run \(python): \(error)"
        }
        guard p.terminationStatus == 0 else {
            return "\(python) cannot import \(modules.joined(separator: ", ")); run `python3 -m venv .venv && .venv/bin/pip install -r Tests/Fixtures/requirements.txt`"
        }
        return nil
    }

    // MARK: - Life cycle

    /// Starts the server and waits (up to 10 s) until it listens.
    /// - Parameters:
    ///   - tokenLifetime: `expires_in` of every access token in seconds; 0 omits `expires_in`
    ///     (and the tokens never expire).
    ///   - rotateRefreshTokens: the refresh_token grant returns a new refresh token and revokes
    ///     the presented one.
    ///   - graceSeconds: with rotation, the same old refresh token presented again within this
    ///     many seconds gets the same new pair (0 disables the grace window).
    ///   - trailingSlash: the OAuth endpoints (token, authorization, device, revocation) end in
    ///     `/` and answer 404 without it (django-oauth-toolkit's shape); the issuer ends in `/`.
    ///   - verbose: the server's request log goes to its stderr log file (see `logText()`).
    public static func start(
        tokenLifetime: Int = 3600,
        rotateRefreshTokens: Bool = false,
        graceSeconds: Int = 10,
        trailingSlash: Bool = false,
        verbose: Bool = false
    ) throws -> AuthServerFixture {
        if let reason = availability { throw Failure("OAuth fixture unavailable: \(reason)") }
        let fm = FileManager.default
        let dir = fm.temporaryDirectory.appendingPathComponent("bearerd-authserver-\(UUID().uuidString)")
        try fm.createDirectory(at: dir, withIntermediateDirectories: true)
        let portFile = dir.appendingPathComponent("port").path
        let logFile = dir.appendingPathComponent("stderr.log")
        _ = fm.createFile(atPath: logFile.path, contents: nil)
        let log = try FileHandle(forWritingTo: logFile)
        defer { try? log.close() }

        var args = [
            python, scriptPath,
            "--port", "0", "--port-file", portFile,
            "--token-lifetime", String(tokenLifetime),
            "--grace-seconds", String(graceSeconds),
            "--parent-pid", String(getpid()),  // `env` execs python: we are its parent
        ]
        if rotateRefreshTokens { args.append("--rotate-refresh-tokens") }
        if trailingSlash { args.append("--trailing-slash") }
        if verbose { args.append("--verbose") }

        let p = Process()
        p.executableURL = URL(fileURLWithPath: "/usr/bin/env")
        p.arguments = args
        p.standardInput = FileHandle.nullDevice
        p.standardOutput = FileHandle.nullDevice
        p.standardError = log
        do {
            try p.run()
        } catch {
            try? fm.removeItem(at: dir)
            throw Failure("cannot launch \(python) \(scriptPath): \(error)")
        }

        let deadline = Date().addingTimeInterval(10)
        while true {
            if let text = try? String(contentsOfFile: portFile, encoding: .utf8),
               let port = UInt16(text.trimmingCharacters(in: .whitespacesAndNewlines)), port != 0 {
                return AuthServerFixture(port: port, trailingSlash: trailingSlash, process: p, directory: dir)
            }
            if !p.isRunning {
                let err = (try? String(contentsOf: logFile, encoding: .utf8)) ?? ""
                try? fm.removeItem(at: dir)
                throw Failure("OAuth fixture exited with status \(p.terminationStatus) before listening: \(err.suffix(2000))")
            }
            if Date() > deadline {
                let err = (try? String(contentsOf: logFile, encoding: .utf8)) ?? ""
                kill(p.processIdentifier, SIGKILL)
                p.waitUntilExit()
                try? fm.removeItem(at: dir)
                throw Failure("OAuth fixture did not listen within 10 s: \(err.suffix(2000))")
            }
            usleep(20_000)
        }
    }

    /// Terminates the server (SIGTERM, then SIGKILL after 2 s), waits for it and removes the
    /// temporary directory. Idempotent.
    public func stop() {
        lock.lock()
        if stopped {
            lock.unlock()
            return
        }
        stopped = true
        lock.unlock()
        if process.isRunning {
            process.terminate()
            let deadline = Date().addingTimeInterval(2)
            while process.isRunning && Date() < deadline { usleep(10_000) }
            if process.isRunning { kill(process.processIdentifier, SIGKILL) }
            process.waitUntilExit()
        }
        try? FileManager.default.removeItem(at: directory)
    }

    /// The server's stderr so far (startup line; the request log when started `verbose`).
    public func logText() -> String {
        (try? String(contentsOf: directory.appendingPathComponent("stderr.log"), encoding: .utf8)) ?? ""
    }

    // MARK: - Test hooks

    /// `GET /_test/stats`: `token_requests`, `by_grant` and `by_client` (dictionaries of counts),
    /// `token_errors` (by RFC 6749 error code), `tokens_issued`, `grace_replays`, `refresh_token_reuses`
    /// (a rotated refresh token presented again outside the grace window), `revocations`,
    /// `api_requests`, `api_rejected`, `injected_faults` (all `Int`).
    public func stats() throws -> [String: Any] {
        try json(request("GET", "/_test/stats"))
    }

    /// `POST /_test/reset-stats`.
    public func resetStats() throws {
        _ = try json(request("POST", "/_test/reset-stats"))
    }

    /// `POST /_test/revoke-all`: every access token issued so far is revoked (the API answers 401
    /// `invalid_token`); refresh tokens stay valid. Returns nothing; throws on failure.
    public func revokeAll() throws {
        _ = try json(request("POST", "/_test/revoke-all"))
    }

    /// `POST /_test/issue-refresh-token`: a fresh refresh token for `clientID` (`cli` or `app`)
    /// and `user` (`alice` or `bob`), e.g. to seed a `refresh_token_file`.
    public func issueRefreshToken(clientID: String = "cli", user: String = "alice") throws -> String {
        let query = "client_id=\(Self.formEncode(clientID))&user=\(Self.formEncode(user))"
        let obj = try json(request("POST", "/_test/issue-refresh-token?\(query)"))
        guard let token = obj["refresh_token"] as? String else {
            throw Failure("issue-refresh-token: no refresh_token in \(obj)")
        }
        return token
    }

    /// `POST /_test/fail-next`: the next `count` token requests (any grant, any client) are
    /// answered with `status` and `{"error": error}` (`error` nil: body `{}`), with `Retry-After`
    /// when `retryAfter` is given, after sleeping `delay` seconds. Counted in `injected_faults`.
    public func failNextTokenRequests(
        count: Int = 1,
        status: Int = 503,
        error: String? = "temporarily_unavailable",
        retryAfter: String? = nil,
        delay: Double = 0
    ) throws {
        var query = "count=\(count)&status=\(status)&error=\(Self.formEncode(error ?? ""))&delay=\(delay)"
        if let retryAfter { query += "&retry_after=\(Self.formEncode(retryAfter))" }
        _ = try json(request("POST", "/_test/fail-next?\(query)"))
    }

    /// `POST /_test/clear-faults`: drops queued `failNextTokenRequests` answers.
    public func clearFaults() throws {
        _ = try json(request("POST", "/_test/clear-faults"))
    }

    /// `POST /_test/configure`: changes the start-up settings for later token requests.
    public func configure(tokenLifetime: Int? = nil, rotateRefreshTokens: Bool? = nil, graceSeconds: Int? = nil) throws {
        var parts: [String] = []
        if let tokenLifetime { parts.append("token_lifetime=\(tokenLifetime)") }
        if let rotateRefreshTokens { parts.append("rotate_refresh_tokens=\(rotateRefreshTokens ? 1 : 0)") }
        if let graceSeconds { parts.append("grace_seconds=\(graceSeconds)") }
        _ = try json(request("POST", "/_test/configure?" + parts.joined(separator: "&")))
    }

    // MARK: - Plain HTTP helpers

    /// One request on a fresh connection (`Connection: close`), through `TestClient`.
    /// `Host` and `Content-Length` are added.
    public func request(_ method: String, _ target: String, headers: [(String, String)] = [], body: [UInt8] = []) throws -> TestClient.Response {
        let client = try TestClient(port: port)
        var head = "\(method) \(target) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n"
        for (k, v) in headers { head += "\(k): \(v)\r\n" }
        if !body.isEmpty || method == "POST" || method == "PUT" || method == "PATCH" {
            head += "Content-Length: \(body.count)\r\n"
        }
        head += "\r\n"
        try client.send(Array(head.utf8) + body)
        return try client.readResponse(method: method)
    }

    /// `POST /oauth/token` with a form body; `basic` adds RFC 6749 §2.3.1 Basic authentication.
    /// Returns the status and the parsed JSON object.
    public func tokenRequest(_ form: [(String, String)], basic: (id: String, secret: String)? = nil) throws -> (status: Int, json: [String: Any]) {
        var headers = [("Content-Type", "application/x-www-form-urlencoded")]
        if let basic {
            let raw = "\(Self.formEncode(basic.id)):\(Self.formEncode(basic.secret))"
            headers.append(("Authorization", "Basic " + Data(raw.utf8).base64EncodedString()))
        }
        let body = form.map { "\(Self.formEncode($0.0))=\(Self.formEncode($0.1))" }.joined(separator: "&")
        let response = try request("POST", "/oauth/token", headers: headers, body: Array(body.utf8))
        return (response.status, try Self.parseObject(response.body))
    }

    /// application/x-www-form-urlencoded encoding of one name or value (space as `+`).
    public static func formEncode(_ s: String) -> String {
        var out = ""
        for b in s.utf8 {
            switch b {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"),
                 UInt8(ascii: "0")...UInt8(ascii: "9"), UInt8(ascii: "-"), UInt8(ascii: "."),
                 UInt8(ascii: "_"), UInt8(ascii: "*"):
                out.unicodeScalars.append(Unicode.Scalar(b))
            case UInt8(ascii: " "):
                out += "+"
            default:
                out += String(format: "%%%02X", b)
            }
        }
        return out
    }

    private func json(_ response: TestClient.Response) throws -> [String: Any] {
        guard response.status == 200 else {
            throw Failure("OAuth fixture answered \(response.status): \(response.bodyText)")
        }
        return try Self.parseObject(response.body)
    }

    private static func parseObject(_ body: [UInt8]) throws -> [String: Any] {
        guard let obj = try? JSONSerialization.jsonObject(with: Data(body)) as? [String: Any] else {
            throw Failure("not a JSON object: \(String(decoding: body, as: UTF8.self).prefix(500))")
        }
        return obj
    }
}
