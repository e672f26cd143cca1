import Foundation

/// A scripted OAuth 2.0 token endpoint (RFC 6749 §3.2) for hostile-peer tests, on a
/// `ScriptedOrigin`: every `POST` is one call; the script decides the answer from the call's
/// number and form (a token with a chosen lifetime, a JWT, any JSON with any status, or raw
/// origin steps such as a reset). Tokens it issues are `at-N` (N counts issued tokens from 1).
///
/// It also plays the authority for scripted APIs: `isValid(_:)` says whether a token was issued
/// here and not revoked since, so an origin can answer 401 to a stale token; `revokeAll()`
/// revokes everything issued so far (later tokens are valid).
///
/// Owns the origin and the call log; `calls`, `issued` and `revoked` are guarded by `lock`
/// (the origin calls the script on its connection threads).
public final class ScriptedTokenEndpoint: @unchecked Sendable {  // @unchecked: mutable state guarded by `lock`
    /// One token request as received.
    public struct Call: Sendable {
        /// 0-based.
        public var index: Int
        /// The request target (several sessions can share one endpoint under different paths).
        public var path: String
        /// The decoded form (RFC 6749 §4.4.2, §6: `grant_type`, `refresh_token`, `scope`, …).
        public var form: [String: String]
        /// The `Authorization` header (client_secret_basic), if any.
        public var authorization: String?
        /// The `traceparent` field (docs/architecture.md §2.9), if any.
        public var traceparent: String? = nil
        public var grantType: String? { form["grant_type"] }
    }

    /// The endpoint's answer to one call.
    public enum Answer: Sendable {
        /// A new `at-N` Bearer token; `lifetime` seconds as `expires_in` (nil: omitted).
        case token(lifetime: Int?)
        /// A new JWT access token whose payload has `exp`, with `expires_in` when `lifetime` is given.
        case jwt(exp: Int64, lifetime: Int?)
        /// Exactly this JSON body with this status.
        case json(status: Int, body: String)
        /// Raw origin steps (e.g. `.reset`, garbage bytes).
        case steps([ScriptedOrigin.Step])
    }

    public typealias Script = @Sendable (Call) -> Answer

    private var origin: ScriptedOrigin!  // Set at the end of init (the handler captures self weakly).
    private let lock = NSLock()
    private var script: Script
    private var _calls: [Call] = []
    private var _issued: [String] = []
    private var revoked: Set<String> = []

    /// `script` nil: every call gets `.token(lifetime: 3600)`.
    public init(script: Script? = nil) throws {
        self.script = script ?? { _ in .token(lifetime: 3600) }
        origin = try ScriptedOrigin(readsBodyFirst: true) { [weak self] request in
            guard let self else { return [.close] }
            return self.answer(request)
        }
    }

    deinit { origin?.stop() }

    public var port: UInt16 { origin.port }
    /// `http://127.0.0.1:PORT/token`
    public var tokenURL: String { "http://127.0.0.1:\(port)/token" }
    public var calls: [Call] { lock.withLock { _calls } }
    /// Every access token issued, in order.
    public var issued: [String] { lock.withLock { _issued } }
    /// The last access token issued.
    public var latest: String? { lock.withLock { _issued.last } }

    /// Replaces the script for later calls.
    public func setScript(_ script: @escaping Script) { lock.withLock { self.script = script } }

    /// Every token issued so far is rejected by `isValid` from now on.
    public func revokeAll() { lock.withLock { revoked.formUnion(_issued) } }

    /// True for a token this endpoint issued and did not revoke.
    public func isValid(_ token: String?) -> Bool {
        guard let token else { return false }
        return lock.withLock { _issued.contains(token) && !revoked.contains(token) }
    }

    /// Waits until at least `count` calls arrived, at most `seconds`.
    @discardableResult
    public func waitForCalls(_ count: Int, seconds: Double = 5) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if calls.count >= count { return true }
            usleep(5_000)
        }
        return calls.count >= count
    }

    public func stop() { origin.stop() }

    /// A JWS compact serialisation (RFC 7515 §7.1) with `payload` as claims and a meaningless
    /// signature: bearerd reads `exp` unverified, so nothing else matters.
    public static func jwt(payload: String) -> String {
        let header = #"{"alg":"RS256","typ":"JWT"}"#
        return base64url(Array(header.utf8)) + "." + base64url(Array(payload.utf8)) + "." + base64url(Array("not-a-signature".utf8))
    }

    public static func base64url(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// application/x-www-form-urlencoded decoding (`+` is a space, `%XX` a byte).
    public static func decodeForm(_ body: [UInt8]) -> [String: String] {
        func decode(_ part: Substring) -> String {
            var out: [UInt8] = []
            var bytes = Array(part.utf8)[...]
            while let b = bytes.popFirst() {
                if b == UInt8(ascii: "+") {
                    out.append(UInt8(ascii: " "))
                } else if b == UInt8(ascii: "%"), bytes.count >= 2,
                          let v = UInt8(String(decoding: bytes.prefix(2), as: UTF8.self), radix: 16) {
                    out.append(v)
                    bytes = bytes.dropFirst(2)
                } else {
                    out.append(b)
                }
            }
            return String(decoding: out, as: UTF8.self)
        }
        var form: [String: String] = [:]
        for pair in String(decoding: body, as: UTF8.self).split(separator: "&") {
            let kv = pair.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
            form[decode(kv[0])] = kv.count > 1 ? decode(kv[1]) : ""  // split of a non-empty pair has ≥ 1 part
        }
        return form
    }

    private func answer(_ request: ScriptedOrigin.Request) -> [ScriptedOrigin.Step] {
        let (call, script): (Call, Script) = lock.withLock {
            let call = Call(index: _calls.count, path: request.head.target, form: Self.decodeForm(request.body), authorization: request.head.headers["Authorization"],
                            traceparent: request.head.headers["traceparent"])
            _calls.append(call)
            return (call, self.script)
        }
        let json = [("Content-Type", "application/json"), ("Cache-Control", "no-store")]
        switch script(call) {
        case .token(let lifetime):
            let token = lock.withLock { () -> String in
                let t = "at-\(_issued.count + 1)"
                _issued.append(t)
                return t
            }
            var body = #"{"access_token":"\#(token)","token_type":"Bearer""#
            if let lifetime { body += #","expires_in":\#(lifetime)"# }
            return [.respond(status: 200, headers: json, body: body + "}")]
        case .jwt(let exp, let lifetime):
            let token = lock.withLock { () -> String in
                let t = Self.jwt(payload: #"{"sub":"svc","jti":"jwt-\#(_issued.count + 1)","exp":\#(exp)}"#)
                _issued.append(t)
                return t
            }
            var body = #"{"access_token":"\#(token)","token_type":"Bearer""#
            if let lifetime { body += #","expires_in":\#(lifetime)"# }
            return [.respond(status: 200, headers: json, body: body + "}")]
        case .json(let status, let body):
            return [.respond(status: status, headers: json, body: body)]
        case .steps(let steps):
            return steps
        }
    }
}
