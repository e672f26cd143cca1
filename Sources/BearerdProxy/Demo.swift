import BearerdHTTP
import BearerdIO
import BearerdOAuth
import BearerdProxyCore
import BearerdService

/// The demo authorization server and upstream of `bearerd demo`, so a newcomer sees the whole
/// flow with no outside server: `POST /oauth/token` (client_credentials, client `demo`, secret
/// `demo-secret`, HTTP Basic) issues short-lived random tokens; every other path is a protected
/// echo API that answers 401 with `WWW-Authenticate: Bearer error="invalid_token"` unless the
/// request carries a token it issued, and otherwise describes what it received (the token shown
/// only as its fingerprint). `POST /demo/revoke` forgets all tokens, to show refresh and replay.
/// `issued` is shared by the loops and guarded by `lock`.
public final class DemoAuthority: LocalResponder, @unchecked Sendable {  // @unchecked: `issued` guarded by `lock`
    public static let clientID = "demo"
    public static let clientSecret = "demo-secret"
    private let lock = Lock()
    private var issued: Set<String> = []
    private var counter: UInt64 = 0
    private let lifetime: Int

    public init(tokenLifetime: Int = 120) {
        lifetime = tokenLifetime
    }

    public func respond(to head: HTTPRequestHead, body: [UInt8], loop: EventLoop, reply: @escaping (HTTPResponseHead, [UInt8]) -> Void) {
        let path = head.target.split(separator: "?", maxSplits: 1).first.map(String.init) ?? head.target
        func json(_ status: Int, _ s: String, _ extra: [(String, String)] = []) {
            var h = HTTPHeaders([("Content-Type", "application/json"), ("Cache-Control", "no-store")])
            for (k, v) in extra { h.add(k, v) }
            reply(HTTPResponseHead(status: status, reason: ErrorResponse.reasonPhrase(status), headers: h), Array((s + "\n").utf8))
        }
        if path == "/oauth/token" {
            let expected = "Basic " + Base64.encode(Array((FormURLEncoding.encode(Self.clientID) + ":" + FormURLEncoding.encode(Self.clientSecret)).utf8))
            guard head.method == "POST", head.headers["Authorization"] == expected else {
                json(401, "{\"error\":\"invalid_client\",\"error_description\":\"use client demo / demo-secret\"}", [("WWW-Authenticate", "Basic realm=\"demo\"")])
                return
            }
            guard String(decoding: body, as: UTF8.self).contains("grant_type=client_credentials") else {
                json(400, "{\"error\":\"unsupported_grant_type\"}")
                return
            }
            let token: String = lock.withLock {
                counter += 1
                let t = "demo-" + BearerdOAuth.fingerprint("\(counter)-\(monotonicNanos())") + BearerdOAuth.fingerprint("\(monotonicNanos())")
                issued.insert(t)
                return t
            }
            json(200, "{\"access_token\":\"\(token)\",\"token_type\":\"Bearer\",\"expires_in\":\(lifetime)}")
            return
        }
        if path == "/demo/revoke" {
            lock.withLock { issued.removeAll() }
            json(200, "{\"revoked\":true}")
            return
        }
        let auth = head.headers["Authorization"] ?? ""
        let token = auth.hasPrefix("Bearer ") ? String(auth.dropFirst(7)) : ""
        guard !token.isEmpty, lock.withLock({ issued.contains(token) }) else {
            json(401, "{\"error\":\"invalid_token\"}", [("WWW-Authenticate", "Bearer error=\"invalid_token\"")])
            return
        }
        var s = "{\"upstream\":\"bearerd demo API\",\"method\":" + ErrorResponse.jsonString(head.method)
        s += ",\"target\":" + ErrorResponse.jsonString(head.target)
        s += ",\"authorization\":" + ErrorResponse.jsonString("Bearer <token, fingerprint \(BearerdOAuth.fingerprint(token))>")
        s += ",\"headers\":{"
        s += head.headers.fields.filter { !asciiCaseInsensitiveEquals($0.name, "Authorization") }.map { f in
            ErrorResponse.jsonString(f.name) + ":" + ErrorResponse.jsonString(f.value)
        }.joined(separator: ",")
        s += "},\"body_bytes\":\(body.count)}"
        json(200, s)
    }
}
