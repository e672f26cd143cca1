import BearerdHTTP
import BearerdIO
import BearerdOAuth
import BearerdConfig
#if canImport(Glibc)
import Glibc
#endif

/// The network and storage side of `bearerd login` for one person's session (`grant:
/// authorization_code` or `device_code`): the authorization URL (RFC 6749 §4.1.1 with PKCE,
/// RFC 7636), the code exchange, the device authorization request and polling (RFC 8628), and
/// storing the refresh token in `state_dir` exactly as rotated ones are (flock, temp file, fsync,
/// rename, mode 0600), so `bearerd run` and `bearerd token` then keep the session alive.
///
/// Owns the session's resolved settings (secrets read, TLS context built). Blocking: for the
/// command's own thread.
public final class SignIn {
    public let session: SessionConfig
    let settings: SessionSettings
    let stateDir: String
    let proxyConfig: OutboundProxy

    public struct Failure: Error, CustomStringConvertible, Sendable {
        public var message: String
        /// The server's RFC 6749 / RFC 8628 `error`, when it sent one.
        public var oauthError: String?
        public var description: String { message }
        public init(message: String, oauthError: String? = nil) {
            self.message = message
            self.oauthError = oauthError
        }
    }

    public init(config: BearerdConfig, session: SessionConfig, environment: [String: String]) throws(ConfigErrors) {
        guard let stateDir = config.stateDir else {
            throw ConfigErrors([ConfigError(file: config.file, line: session.line, key: "state_dir",
                                            message: "missing: bearerd login stores the session's refresh token in state_dir")])
        }
        self.session = session
        self.stateDir = stateDir
        proxyConfig = config.outboundProxy
        settings = try SessionSettings.resolve(session, in: config, environment: environment)
    }

    // MARK: authorization code (RFC 6749 §4.1, RFC 7636, RFC 8252)

    /// The URL a browser opens: `response_type=code`, the loopback `redirect_uri`, `state`, the
    /// S256 challenge, and `nonce` when the scope asks for `openid` (OIDC Core §3.1.2.1).
    public func authorizationURL(redirectURI: String, state: String, pkce: PKCE, nonce: OpenIDNonce? = nil) -> String? {
        guard let endpoint = session.authorizationEndpoint else { return nil }
        var pairs: [(String, String)] = [("response_type", "code"), ("client_id", session.clientID), ("redirect_uri", redirectURI)]
        if let scope = session.scope, !scope.isEmpty { pairs.append(("scope", scope)) }
        pairs += [("state", state), ("code_challenge", pkce.challenge), ("code_challenge_method", PKCE.method)]
        if let nonce { pairs.append(("nonce", nonce.value)) }
        let query = pairs.map { FormURLEncoding.encode($0.0) + "=" + FormURLEncoding.encode($0.1) }.joined(separator: "&")
        // docs/architecture.md §5: the endpoint as published, a query of its own kept (ours follows with `&`).
        let separator = switch endpoint.query {
        case nil: "?"
        case ""?: ""
        default: "&"
        }
        return endpoint.text + separator + query
    }

    /// Exchanges a code (or a device code) at the token endpoint. `nonce`: the one the
    /// authorization request sent; an `id_token` in the answer must carry it (OIDC Core §3.1.3.7).
    public func exchange(_ grant: TokenRequest.Grant, nonce: OpenIDNonce? = nil) -> Result<TokenGrant, Failure> {
        var request = settings.tokenRequest(refreshToken: nil)
        request.grant = grant
        request.scope = nil  // RFC 6749 §4.1.3: the code carries the scope
        let encoded: EncodedTokenRequest
        do throws(TokenRequest.EncodingError) {
            encoded = try request.encode()
        } catch {
            return .failure(Failure(message: error.description))
        }
        return classify(postToTokenEndpoint(encoded), nonce: nonce)
    }

    /// One token request. For a `dpop: true` session it carries a fresh proof (RFC 9449 §5: the
    /// code or device code is exchanged for a token bound to the session's key, which `run` then
    /// refreshes with proofs of the same key); a `400 use_dpop_nonce` is retried once at once
    /// with the server's `DPoP-Nonce` and a new proof (§8).
    private func postToTokenEndpoint(_ encoded: EncodedTokenRequest) -> TokenEndpointOutcome {
        let url = session.tokenURL.description
        var nonceRetried = false
        while true {
            var request = encoded
            if let dpop = settings.dpop {
                guard let signed = dpop.signedTokenRequest(encoded, url: url) else {
                    return .transportFailure(detail: "cannot sign a DPoP proof with \(dpop.keyPath)", requestSent: false)
                }
                request = signed
            }
            let outcome = TokenEndpointClient.blocking(timeout: session.requestTimeout) { loop, done in
                TokenEndpointClient.post(request, to: session.tokenURL, tls: settings.tlsContext, proxy: settings.proxy, on: loop, completion: done)
            }
            guard let dpop = settings.dpop, case .response(let status, let headers, let body) = outcome,
                  dpop.tokenEndpointAsksForNonce(url: url, status: status, headers: headers, body: body), !nonceRetried else {
                return outcome
            }
            nonceRetried = true
        }
    }

    private func classify(_ outcome: TokenEndpointOutcome, nonce: OpenIDNonce?) -> Result<TokenGrant, Failure> {
        switch outcome {
        case .response(let status, let headers, let body):
            switch settings.responseParser.parse(status: status, headers: headers, body: body, wallClockNow: wallClockSeconds()) {
            case .success(let grant):
                if let nonce, let idToken = (try? JSONParser(maxBytes: TokenEndpointClient.maxBodyBytes).parse(body))?.objectValue?["id_token"]?.stringValue {
                    do throws(OpenIDNonce.Mismatch) {
                        try nonce.check(idToken: idToken)
                    } catch {
                        return .failure(Failure(message: "\(error.description); nothing was stored, run bearerd login again"))
                    }
                }
                return .success(grant)
            case .failure(let f):
                return .failure(Failure(message: f.detail, oauthError: f.oauthError))
            }
        case .tooLarge(let status):
            return .failure(Failure(message: "HTTP \(status) with a body over 1 MiB"))
        case .transportFailure(let detail, _):
            return .failure(Failure(message: "\(session.tokenURL.authority): \(detail)"))
        }
    }

    // MARK: device flow (RFC 8628)

    public struct DeviceAuthorization: Sendable {
        public var deviceCode: OAuthSecret
        public var userCode: String
        public var verificationURI: String
        public var verificationURIComplete: String?
        public var expiresIn: Int
        /// Seconds between polls (RFC 8628 §3.2: default 5).
        public var interval: Int
    }

    /// RFC 8628 §3.1: asks the device authorization endpoint for a user code.
    public func startDeviceAuthorization() -> Result<DeviceAuthorization, Failure> {
        guard let endpoint = session.deviceAuthorizationEndpoint else {
            return .failure(Failure(message: "no device authorization endpoint: set device_authorization_url (with token_url) or issuer"))
        }
        // The client authenticates as at the token endpoint; the grant parameters are ours.
        var request = settings.tokenRequest(refreshToken: nil)
        request.grant = .clientCredentials
        let encoded: EncodedTokenRequest
        do throws(TokenRequest.EncodingError) {
            encoded = try request.encode()
        } catch {
            return .failure(Failure(message: error.description))
        }
        // Drop `grant_type=client_credentials`: the device request has no grant type.
        let body = Array(String(decoding: encoded.body, as: UTF8.self).split(separator: "&")
            .filter { !$0.hasPrefix("grant_type=") }.joined(separator: "&").utf8)
        let deviceRequest = EncodedTokenRequest(body: body, headers: encoded.headers)
        let outcome = TokenEndpointClient.blocking(timeout: session.requestTimeout) { loop, done in
            TokenEndpointClient.post(deviceRequest, to: endpoint, tls: settings.tlsContext,
                                     proxy: proxyConfig.endpoint(scheme: endpoint.scheme, host: endpoint.host, port: endpoint.port),
                                     on: loop, completion: done)
        }
        guard case .response(let status, _, let bytes) = outcome else {
            if case .transportFailure(let detail, _) = outcome { return .failure(Failure(message: "\(endpoint.authority): \(detail)")) }
            return .failure(Failure(message: "the device authorization response was too large"))
        }
        guard let o = (try? JSONParser(maxBytes: 1 << 20).parse(bytes))?.objectValue else {
            return .failure(Failure(message: "HTTP \(status): the device authorization response is not JSON"))
        }
        if let error = o["error"]?.stringValue {
            let description = o["error_description"]?.stringValue.map { ": \($0)" } ?? ""
            return .failure(Failure(message: "\(error)\(description)", oauthError: error))
        }
        guard status == 200, let device = o["device_code"]?.stringValue, let user = o["user_code"]?.stringValue,
              let uri = o["verification_uri"]?.stringValue ?? o["verification_url"]?.stringValue else {
            return .failure(Failure(message: "HTTP \(status): the device authorization response lacks device_code, user_code or verification_uri"))
        }
        let expires = Int(clamping: o["expires_in"]?.int64Value ?? 600)
        let interval = Int(clamping: o["interval"]?.int64Value ?? 5)
        return .success(DeviceAuthorization(deviceCode: OAuthSecret(device), userCode: user, verificationURI: uri,
                                            verificationURIComplete: o["verification_uri_complete"]?.stringValue,
                                            expiresIn: min(max(expires, 1), 3600), interval: min(max(interval, 1), 60)))
    }

    // MARK: storing

    /// Persists the session's new refresh token (and its access token) under the session's lock;
    /// clears a "needs a new sign-in" mark.
    public func store(_ grant: TokenGrant) throws(Failure) {
        guard let refresh = grant.refreshToken else {
            throw Failure(message: "the server issued no refresh token, so bearerd could not keep the session alive; "
                          + "ask for it in the session's scope (often offline_access)")
        }
        let now = wallClockSeconds()
        let seconds = Int64(clamping: grant.lifetime.components.seconds)
        let state = PersistedSessionState(refreshToken: refresh,
                                          accessToken: .init(token: grant.accessToken, expiresAt: now.addingReportingOverflow(seconds).partialValue, generation: 1),
                                          updatedAt: now, sourceFingerprint: nil)
        do throws(StateStoreError) {
            let store = try StateStore(directory: stateDir, session: session.name)
            try store.lock()
            defer { store.unlock() }
            try store.write(state)
            store.clearNeedsReauthentication()
        } catch {
            throw Failure(message: "cannot store the session in \(stateDir): \(error)")
        }
    }

    public var statePath: String { stateDir + "/" + session.name + ".json" }
}

/// The loopback redirect listener of RFC 8252 §7.3: by default 127.0.0.1 with a port chosen by
/// the kernel and the path `/callback`; with `redirect_uri:` the configured loopback address
/// (127.0.0.1, [::1], or localhost: both), port and path, for servers that compare the redirect
/// URI exactly. Blocking sockets, answering the browser's callback with a small page.
///
/// Owns its listening sockets (closed in `deinit`). Invariants: `fds` is non-empty; every one
/// listens on `port`.
public final class LoopbackRedirect {
    public let port: UInt16
    /// The `redirect_uri` sent in the authorization and token requests, byte for byte.
    public let redirectURI: String
    /// The path the browser's callback arrives on.
    private let callbackPath: String
    private let fds: [Int32]

    public struct Callback: Sendable {
        public var query: [String: String]
    }

    /// `fixed`: the configured `redirect_uri` (checked by the loader: http, a loopback host);
    /// nil for 127.0.0.1 and a port chosen at run time.
    public init(fixed: EndpointURL? = nil) throws(SignIn.Failure) {
        guard let fixed else {
            let (fd, port) = try Self.listen(family: AF_INET, port: 0)
            fds = [fd]
            self.port = port
            callbackPath = "/callback"
            redirectURI = "http://127.0.0.1:\(port)/callback"
            return
        }
        var opened: [Int32] = []
        switch fixed.host {
        case "::1":
            opened.append(try Self.listen(family: AF_INET6, port: fixed.port).fd)
        case "localhost":
            // The browser resolves localhost to 127.0.0.1 or ::1: listen on both (::1 when the host has IPv6).
            opened.append(try Self.listen(family: AF_INET, port: fixed.port).fd)
            if let v6 = try? Self.listen(family: AF_INET6, port: fixed.port) { opened.append(v6.fd) }
        default:
            opened.append(try Self.listen(family: AF_INET, port: fixed.port).fd)
        }
        fds = opened
        port = fixed.port
        callbackPath = fixed.path.isEmpty ? "/" : fixed.path
        redirectURI = fixed.text
    }

    /// A listening socket on the loopback address of `family` (IPv6 only for AF_INET6) and its port.
    private static func listen(family: Int32, port: UInt16) throws(SignIn.Failure) -> (fd: Int32, port: UInt16) {
        let name = family == AF_INET6 ? "[::1]" : "127.0.0.1"
        let s = socket(family, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard s >= 0 else { throw SignIn.Failure(message: "socket: \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        // A fixed port used again soon after an earlier sign-in (TIME_WAIT) must still bind.
        setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var storage = sockaddr_storage()
        var len: socklen_t
        if family == AF_INET6 {
            setsockopt(s, Int32(IPPROTO_IPV6), IPV6_V6ONLY, &one, socklen_t(MemoryLayout<Int32>.size))
            len = socklen_t(MemoryLayout<sockaddr_in6>.size)
            withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { a in
                    a.pointee.sin6_family = sa_family_t(AF_INET6)
                    a.pointee.sin6_port = port.bigEndian
                    a.pointee.sin6_addr = in6addr_loopback
                }
            }
        } else {
            len = socklen_t(MemoryLayout<sockaddr_in>.size)
            withUnsafeMutablePointer(to: &storage) {
                $0.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { a in
                    a.pointee.sin_family = sa_family_t(AF_INET)
                    a.pointee.sin_port = port.bigEndian
                    a.pointee.sin_addr.s_addr = inet_addr("127.0.0.1")
                }
            }
        }
        let bound = withUnsafePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(s, $0, len) } }
        guard bound == 0, Glibc.listen(s, 8) == 0 else {
            let reason = String(cString: strerror(errno))
            close(s)
            throw SignIn.Failure(message: "cannot listen on \(name):\(port) for the sign-in's redirect: \(reason)")
        }
        _ = withUnsafeMutablePointer(to: &storage) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(s, $0, &len) } }
        let actual = withUnsafePointer(to: &storage) { p -> UInt16 in
            family == AF_INET6
                ? p.withMemoryRebound(to: sockaddr_in6.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin6_port) }
                : p.withMemoryRebound(to: sockaddr_in.self, capacity: 1) { UInt16(bigEndian: $0.pointee.sin_port) }
        }
        return (s, actual)
    }

    deinit { for fd in fds { close(fd) } }

    /// Waits (up to `timeout`) for a GET of the callback path; other paths (a favicon) get 404.
    /// `page` builds the HTML answer from the callback's query (success or error page).
    public func waitForCallback(timeout: Duration, page: ([String: String]) -> (status: Int, html: String)) -> Callback? {
        let deadline = monotonicNanos() &+ UInt64(max(0, timeout.components.seconds)) &* 1_000_000_000
        while monotonicNanos() < deadline {
            var polled = fds.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
            let left = Int32(clamping: (deadline &- monotonicNanos()) / 1_000_000)
            guard poll(&polled, nfds_t(polled.count), max(1, min(left, 1000))) > 0,
                  let ready = polled.first(where: { $0.revents & Int16(POLLIN) != 0 }) else { continue }
            let c = accept(ready.fd, nil, nil)
            guard c >= 0 else { continue }
            defer { close(c) }
            var tv = timeval(tv_sec: 10, tv_usec: 0)
            setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
            var parser = HTTP1Parser(role: .server)
            var buf = [UInt8](repeating: 0, count: 8192)
            var head: HTTPRequestHead?
            while head == nil {
                let n = buf.withUnsafeMutableBytes { recv(c, $0.baseAddress, $0.count, 0) }
                if n <= 0 { break }
                parser.feed(Array(buf[0..<n]))
                if case .requestHead(let h, _)? = try? parser.next() { head = h }
            }
            guard let head else { continue }
            let path = head.target.split(separator: "?", maxSplits: 1, omittingEmptySubsequences: false)
            guard head.method == "GET", path.first.map(String.init) == callbackPath else {
                respond(c, status: 404, html: "<p>Not found.</p>")
                continue
            }
            var query: [String: String] = [:]
            if path.count > 1 {
                for pair in path[1].split(separator: "&") {
                    let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                    query[FormURLEncoding.decode(String(kv[0]))] = kv.count > 1 ? FormURLEncoding.decode(String(kv[1])) : ""
                }
            }
            let answer = page(query)
            respond(c, status: answer.status, html: answer.html)
            return Callback(query: query)
        }
        return nil
    }

    private func respond(_ c: Int32, status: Int, html: String) {
        let body = "<!doctype html><meta charset=utf-8><title>bearerd</title>" + html
        let head = "HTTP/1.1 \(status) \(status == 200 ? "OK" : status == 400 ? "Bad Request" : "Not Found")\r\n"
            + "Content-Type: text/html; charset=utf-8\r\nContent-Length: \(body.utf8.count)\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n"
        let bytes = Array((head + body).utf8)
        var off = 0
        while off < bytes.count {
            let n = bytes[off...].withUnsafeBytes { send(c, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
            if n <= 0 { return }
            off += n
        }
    }
}
