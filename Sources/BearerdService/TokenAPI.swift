import BearerdConfig
import BearerdHTTP
import BearerdIO
import BearerdOAuth
import BearerdProxyCore
import BearerdSessions
import Logging
#if canImport(Glibc)
import Glibc
#endif

/// Who is asking the token API: a unix peer's uid (SO_PEERCRED, read at accept), or a TCP
/// peer's address. For logs and the uid check.
public struct TokenAPICaller: Sendable, CustomStringConvertible {
    public enum Identity: Sendable, Equatable {
        /// A unix socket peer; nil when its credentials could not be read (never admitted).
        case unix(uid: UInt32?, pid: Int32?)
        /// A TCP peer (`host:port`).
        case tcp(address: String)
    }
    public var identity: Identity

    public init(_ identity: Identity) { self.identity = identity }

    public var description: String {
        switch identity {
        case .unix(let uid?, let pid?): "uid \(uid) pid \(pid)"
        case .unix: "uid unknown"
        case .tcp(let address): address
        }
    }
}

/// The current `token_api:` settings, swapped whole on reload and read by every request (any
/// loop). Owns one optional `TokenAPIConfig` guarded by `lock`.
public final class TokenAPISettings: @unchecked Sendable {  // @unchecked: `value` guarded by `lock`
    private let lock = Lock()
    private var value: TokenAPIConfig?
    public init(_ config: TokenAPIConfig?) { value = config }
    public var config: TokenAPIConfig? {
        get { lock.withLock { value } }
        set { lock.withLock { value = newValue } }
    }
}

/// At most `burst` log lines per `interval` for one kind of refusal: a local process that
/// hammers the token API with refused requests cannot flood the log. Lines not written are
/// counted and the next line written says how many were left out. A value with no clock of its
/// own (`now` is the caller's monotonic nanoseconds); `RefusalLog` keeps one under a lock.
public struct LogRateLimit: Sendable, Equatable {
    public let interval: UInt64
    public let burst: Int
    private var windowStart: UInt64?
    private var linesInWindow = 0
    /// Lines left out since the last one written.
    public private(set) var suppressed: UInt64 = 0

    public init(interval: UInt64 = 10_000_000_000, burst: Int = 5) {
        self.interval = max(1, interval)
        self.burst = max(1, burst)
    }

    /// Whether to write a line now; when written, how many were left out before it.
    public mutating func admit(now: UInt64) -> (write: Bool, leftOut: UInt64) {
        if let start = windowStart, now >= start, now - start < interval {
            guard linesInWindow < burst else {
                suppressed &+= 1
                return (false, 0)
            }
        } else {
            windowStart = now
            linesInWindow = 0
        }
        linesInWindow += 1
        defer { suppressed = 0 }
        return (true, suppressed)
    }
}

/// The token API's refusal log lines, rate-limited (`LogRateLimit`) across every connection of
/// one token API listener. Owns the limit under `lock`; any loop.
public final class RefusalLog: @unchecked Sendable {  // @unchecked: `limit` guarded by `lock`
    private let lock = Lock()
    private var limit: LogRateLimit
    private let logger: Logger

    public init(logger: Logger, limit: LogRateLimit = LogRateLimit()) {
        self.logger = logger
        self.limit = limit
    }

    /// Writes `message` with `metadata` (and `refusals.not_logged` when lines were left out) if
    /// the rate allows.
    public func warning(_ message: Logger.Message, _ metadata: Logger.Metadata) {
        let (write, leftOut) = lock.withLock { limit.admit(now: monotonicNanos()) }
        guard write else { return }
        var m = metadata
        if leftOut > 0 { m["refusals.not_logged"] = "\(leftOut)" }
        logger.warning(message, metadata: m)
    }
}

/// `GET /v1/token/NAME` for local programs (docs/architecture.md §4 `token_api:`): the JSON form of
/// `bearerd token --format json` (`access_token`, `token_type`, `expires_at` RFC 3339,
/// `session`), with the token obtained exactly as the proxy obtains it (the published token, else
/// coalesced through the session driver).
///
/// One per connection (it carries the caller); holds no mutable state. A unix peer whose uid
/// is not allowed is refused at accept, before anything is read (`TokenAPIHost`); a request
/// with a body is refused 413 at its head (`acceptsRequestBody`); every 403 closes the
/// connection. Checks, in order:
/// the unix peer's uid against `allowed_uids` (default: bearerd's own uid) → 403; any `Origin`
/// or `Sec-Fetch-*` field (a browser is asking: the SSRF and DNS-rebinding guard) → 403; on TCP
/// a missing `Bearerd-Token-Request: 1` → 403; a method other than GET/HEAD → 405; a path
/// other than `/v1/token/NAME` or a NAME not in `sessions` → 404; no token to be had → 503 with
/// Retry-After (docs/architecture.md §5). Every hand-out is counted per session and logged with the caller
/// and the token's fingerprint, never the token.
///
/// `GET /v1/credentials/NAME` (docs/architecture.md §6.15) serves a signing session's keys in the
/// container-credentials shape (`AccessKeyId`, `SecretAccessKey`, `Token`, `Expiration`), so an
/// AWS SDK pointed at it with `AWS_CONTAINER_CREDENTIALS_FULL_URI` uses bearerd as its
/// credentials source. Same checks; with `authorization_token_file:` every such request must
/// carry the file's content as `Authorization` (401 without, 403 with another value), and a TCP
/// request that does needs no `Bearerd-Token-Request: 1` (an SDK cannot send it). A token
/// session asked for credentials, or a signing session asked for a token, is a 400 naming the
/// right path.
public final class TokenAPIResponder: LocalResponder, @unchecked Sendable {  // @unchecked: immutable after init
    public static let requestHeader = "Bearerd-Token-Request"
    public static let pathPrefix = "/v1/token/"
    public static let credentialsPrefix = "/v1/credentials/"

    let caller: TokenAPICaller
    let settings: TokenAPISettings
    let sessions: SessionManager
    let logger: Logger
    let refusals: RefusalLog
    let ownUID: UInt32

    public init(caller: TokenAPICaller, settings: TokenAPISettings, sessions: SessionManager, logger: Logger, refusals: RefusalLog? = nil) {
        self.caller = caller
        self.settings = settings
        self.sessions = sessions
        self.logger = logger
        self.refusals = refusals ?? RefusalLog(logger: logger)
        ownUID = getuid()
    }

    /// The token API reads no request body: GET and HEAD carry none.
    public var acceptsRequestBody: Bool { false }

    /// Whether a unix peer with `uid` may ask: `allowed_uids`, by default bearerd's own uid.
    public static func admits(uid: UInt32?, _ api: TokenAPIConfig?, ownUID: UInt32 = getuid()) -> Bool {
        guard let uid, let api else { return false }
        return (api.allowedUIDs ?? [ownUID]).contains(uid)
    }

    public func respond(to head: HTTPRequestHead, body: [UInt8], loop: EventLoop, reply: @escaping (HTTPResponseHead, [UInt8]) -> Void) {
        func refuse(_ status: Int, _ code: String, _ detail: String, extra: [(String, String)] = [], session: String? = nil) {
            // A 403 ends the connection: a refused caller gets no second try on it.
            let (h, b) = ErrorResponse.parts(status: status, error: code, detail: detail, extra: extra + (status == 403 ? [("Connection", "close")] : []),
                                            fields: session.map { [("session", $0)] } ?? [])
            if status == 403 || status == 404 {
                refusals.warning("token API request refused", [
                    "caller": "\(caller)", "status": "\(status)", "error": "\(code)", "session": "\(session ?? "-")",
                ])
            }
            reply(h, b)
        }
        guard let api = settings.config else {
            refuse(404, "not_found", "the token API is not configured")
            return
        }
        switch caller.identity {
        case .unix(let uid, _):
            // Checked at accept too; again here, as a reload may have changed allowed_uids since.
            guard Self.admits(uid: uid, api, ownUID: ownUID) else {
                refuse(403, "peer_not_allowed", uid.map { "uid \($0) is not in token_api.allowed_uids" } ?? "the peer's credentials could not be read")
                return
            }
        case .tcp:
            break
        }
        if let browser = head.headers.fields.first(where: { Self.isBrowserField($0.name) }) {
            refuse(403, "browser_request_refused", "the token API does not answer requests carrying \(browser.name) (browsers send it; local programs do not)")
            return
        }
        let path = head.target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false).first.map(String.init) ?? head.target
        let wantsCredentials = path.hasPrefix(Self.credentialsPrefix)
        // `authorization_token_file:` (credentials only): the caller's `Authorization` must be its content.
        var authorized = false
        if wantsCredentials, let file = api.authorizationTokenFile {
            let expected: String
            do throws(ConfigError) {
                expected = try ConfigLoader.resolveSecret(.file(file), environment: [:]).value
            } catch {
                logger.error("token API: cannot read authorization_token_file", metadata: ["error": "\(error.message)"])
                refuse(503, "authorization_token_unavailable", "token_api.authorization_token_file cannot be read", extra: [("Retry-After", "5")])
                return
            }
            let given = head.headers.values("Authorization")
            guard let presented = given.first, given.count == 1 else {
                refuse(401, "authorization_required", "GET \(Self.credentialsPrefix)NAME needs the Authorization field of token_api.authorization_token_file")
                return
            }
            guard Self.constantTimeEqual(presented, expected) else {
                refuse(403, "authorization_refused", "the Authorization field is not token_api.authorization_token_file's")
                return
            }
            authorized = true
        }
        if case .tcp = caller.identity, !authorized, head.headers.values(Self.requestHeader) != ["1"] {
            refuse(403, "token_request_header_required", "requests to the token API over TCP need the header \(Self.requestHeader): 1")
            return
        }
        guard head.method == "GET" || head.method == "HEAD" else {
            let (h, b) = ErrorResponse.parts(status: 405, error: "method_not_allowed", detail: "the token API answers GET only", extra: [("Allow", "GET, HEAD")])
            reply(h, b)
            return
        }
        guard path.hasPrefix(Self.pathPrefix) || wantsCredentials else {
            refuse(404, "not_found", "the token API serves GET \(Self.pathPrefix)NAME and GET \(Self.credentialsPrefix)NAME")
            return
        }
        let name = String(path.dropFirst(wantsCredentials ? Self.credentialsPrefix.count : Self.pathPrefix.count))
        // Only the sessions listed, by exact name; never one it is not configured for.
        guard api.sessions.contains(name), let driver = sessions.session(named: name) else {
            refuse(404, "unknown_session", "no session by that name is served by the token API")
            return
        }
        if driver.isSigning != wantsCredentials {
            let detail = driver.isSigning
                ? "session \(name) holds signing keys, not a token: GET \(Self.credentialsPrefix)\(name)"
                : "session \(name) holds a token, not signing keys: GET \(Self.pathPrefix)\(name)"
            refuse(400, driver.isSigning ? "signing_session" : "not_a_signing_session", detail, session: name)
            return
        }
        if let token = driver.usableToken(now: monotonicNanos()) {
            handOut(token, driver: driver, reply: reply)
            return
        }
        driver.requestToken(on: loop) { [self] result in
            switch result {
            case .success(let token):
                handOut(token, driver: driver, reply: reply)
            case .failure(let u):
                logger.warning("token API: no token to hand out", metadata: ["caller": "\(caller)", "session": "\(name)", "detail": "\(u.detail)"])
                refuse(503, "token_unavailable", u.detail, extra: [("Retry-After", String(u.retryAfterSeconds))], session: u.session)
            }
        }
    }

    private func handOut(_ token: PublishedToken, driver: TokenSessionDriver, reply: (HTTPResponseHead, [UInt8]) -> Void) {
        let snapshot = driver.snapshot
        let monotonicNow = monotonicNanos()
        // The token's own expiry when it is still the published one, else the end of its use.
        let expiry = snapshot.generation == token.generation ? (snapshot.expiresAt ?? token.usableUntil) : token.usableUntil
        let expiresAt = TokenCache.wallClock(ofMonotonic: expiry, monotonicNow: monotonicNow, wallClockNow: wallClockSeconds())
        let body: String
        if driver.isSigning {
            guard let keys = token.signingKeys else {
                let (h, b) = ErrorResponse.parts(status: 503, error: "token_unavailable", detail: "the session's keys cannot be read",
                                                 extra: [("Retry-After", "1")], fields: [("session", driver.name)])
                reply(h, b)
                return
            }
            body = CredentialFormat.containerCredentials(keys, expiresAt: expiresAt) + "\n"
        } else {
            body = TokenFormat.json(token: token.value, tokenType: driver.dpop == nil ? "Bearer" : "DPoP", expiresAt: expiresAt, session: driver.name) + "\n"
        }
        driver.outlets.noteHandout()
        logger.info(driver.isSigning ? "credentials handed out" : "token handed out", metadata: [
            "caller": "\(caller)", "session": "\(driver.name)", "token.fingerprint": "\(token.fingerprint)",
            "token.generation": "\(token.generation)",
        ])
        var headers = HTTPHeaders()
        headers.add("Content-Type", "application/json")
        headers.add("Cache-Control", "no-store")
        reply(HTTPResponseHead(status: 200, reason: "OK", headers: headers), Array(body.utf8))
    }

    /// Compares without stopping at the first difference (the time does not tell how much of a
    /// guessed authorization token was right).
    static func constantTimeEqual(_ a: String, _ b: String) -> Bool {
        let x = Array(a.utf8), y = Array(b.utf8)
        var diff: UInt8 = x.count == y.count ? 0 : 1
        for i in 0..<max(x.count, y.count) {
            diff |= (i < x.count ? x[i] : 0) ^ (i < y.count ? y[i] : 0)
        }
        return diff == 0
    }

    /// `Origin` or any `Sec-Fetch-*` field (Fetch Metadata): only browsers send them.
    static func isBrowserField(_ name: String) -> Bool {
        let n = name.lowercased()
        return n == "origin" || n.hasPrefix("sec-fetch-")
    }
}
