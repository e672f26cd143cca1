import Foundation
import Testing
import BearerdHTTP
import BearerdProxyCore
import BearerdTLS
import BearerdTestSupport
#if canImport(Glibc)
import Glibc
#endif

/// The signing oracle (Tests/Fixtures/signing_origin.py): an object store that recomputes every
/// signature with the reference signers (botocore for SigV4, the OSS SDK's SignerV4 for OSS V4)
/// and enforces keys, session tokens, expiry, revocation and its own clock. Its self-test
/// (test_signing_origin.py) proves it refuses wrongly signed requests, so a pass here means the
/// SDKs' signers agree with what bearerd sent.
///
/// The first two tests check the pure cores against it directly (`RequestSigning` and
/// `SignedResponseVerdict` on the services' real error shapes); the others run the real bearerd
/// binary with `grant: aws` and `grant: aliyun` sessions whose keys come from the oracle's vending
/// endpoint (`credentials: { url: … }`), each test with its own oracle and bearerd so they run in
/// parallel (the 60-second expiry run is the longest).
@Suite("Signing against the reference signers' oracle",
       .enabled(if: Prerequisite.runs(PythonFixture.unavailable(modules: ["botocore", "alibabacloud_oss_v2"]) == nil),
                "\(PythonFixture.unavailable(modules: ["botocore", "alibabacloud_oss_v2"]) ?? "")"))
struct SigningOracleTests {
    // MARK: - The oracle

    struct OracleFailure: Error, CustomStringConvertible { var description: String }

    struct Crypto: RequestSigning.Crypto {
        func sha256(_ bytes: [UInt8]) -> [UInt8] { Digest.sha256(bytes) }
        func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] { Digest.hmacSHA256(key: key, message: message) }
    }

    struct Stats: Decodable {
        struct Object: Decodable { var length: Int; var sha256: String; var kept: Bool }
        struct Request: Decodable {
            var method: String
            var path: String
            var outcome: String
            var status: Int
            var object: String?
            var query: [[String]]?
            var key_id: String?
            var content_sha256: String?
        }
        var outcomes: [String: Int]
        var attempts: [String: [String: Int]]
        var vend_calls: [String: Int]
        var objects: [String: Object]
        var requests: [Request]

        func attempts(_ path: String) -> [String: Int] { attempts[path] ?? [:] }
    }

    /// One signing_origin.py: the signed port and the admin port. Owns the child process.
    final class Oracle {
        let fixture: PythonFixture
        let adminPort: UInt16
        var port: UInt16 { fixture.port }

        init() throws {
            try Prerequisite.require(PythonFixture.unavailable(modules: ["botocore", "alibabacloud_oss_v2"]) == nil,
                                     "botocore and alibabacloud-oss-v2 in the tests' venv (Tests/Fixtures/requirements.txt)")
            fixture = try PythonFixture(script: "signing_origin.py", arguments: [], readyTimeout: 30)
            adminPort = try #require(fixture.extraPorts.first, "signing_origin.py announced no admin port")
        }

        func stop() { fixture.stop() }

        @discardableResult
        func admin(_ path: String, _ body: [String: Any] = [:]) throws -> String {
            let json = try JSONSerialization.data(withJSONObject: body)
            let c = try TestClient(port: adminPort)
            try c.send(Array("POST \(path) HTTP/1.1\r\nHost: admin\r\nContent-Type: application/json\r\nContent-Length: \(json.count)\r\nConnection: close\r\n\r\n".utf8) + Array(json))
            let r = try c.readResponse(method: "POST")
            guard r.status == 200 else { throw OracleFailure(description: "oracle \(path): \(r.status) \(r.bodyText)") }
            return r.bodyText
        }

        func stats() throws -> Stats {
            let c = try TestClient(port: adminPort)
            try c.send("GET /__admin/stats HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n")
            let r = try c.readResponse()
            return try JSONDecoder().decode(Stats.self, from: Data(r.body))
        }

        /// A vending endpoint at `GET /__vend/NAME` (container-credentials or seed 004's JSON).
        func vendor(_ name: String, shape: String, lifetime: Int = 3600, delayMS: Int = 0) throws {
            try admin("/__admin/vendor", ["name": name, "shape": shape, "lifetime_seconds": lifetime, "delay_ms": delayMS])
        }

        /// The origin's clock: real time plus `seconds`.
        func clock(offset seconds: Int) throws { try admin("/__admin/clock", ["offset_seconds": seconds]) }
    }

    // MARK: - bearerd

    static let bucket = "bkt"       // S3, path-style: /bkt/KEY
    static let ossBucket = "obkt"   // OSS, the origin is this bucket's virtual host: /KEY

    /// A config with an aws session (vendor `aws`, container-credentials JSON) on `/s3/` (and on
    /// `/s3signed/` with `payload: signed`) and an aliyun session (vendor `ali`, seed 004's JSON)
    /// on `/oss/`, all to the oracle.
    static func config(port: UInt16, oracle: Oracle, refreshBefore: String? = nil, replayLimit: String = "2MiB") -> String {
        let refresh = refreshBefore.map { "\n    refresh_before: \($0)" } ?? ""
        return """
            listen: [127.0.0.1:\(port)]
            loops: 1
            log: { level: info, access: false }
            sessions:
              store:
                grant: aws
                region: us-east-1
                credentials:
                  url: http://127.0.0.1:\(oracle.adminPort)/__vend/aws\(refresh)
              oss:
                grant: aliyun
                region: cn-hangzhou
                credentials:
                  url: http://127.0.0.1:\(oracle.adminPort)/__vend/ali\(refresh)
            routes:
              - match: /s3/
                strip_prefix: true
                upstream: http://127.0.0.1:\(oracle.port)
                session: store
                sign: { service: s3 }
                replay_body_limit: \(replayLimit)
              - match: /s3signed/
                strip_prefix: true
                upstream: http://127.0.0.1:\(oracle.port)
                session: store
                sign: { service: s3, payload: signed }
                replay_body_limit: \(replayLimit)
              - match: /oss/
                strip_prefix: true
                upstream: http://127.0.0.1:\(oracle.port)
                session: oss
                sign: { bucket: \(ossBucket) }
                replay_body_limit: \(replayLimit)
            """
    }

    /// The oracle with both vendors, and bearerd in front of it, listening (no request sent yet:
    /// a request would fetch keys). `body` gets bearerd's port.
    static func withBearerd(_ tag: String, lifetime: Int = 3600, delayMS: Int = 0, refreshBefore: String? = nil,
                            prepare: (Oracle) throws -> Void = { _ in },
                            _ body: (Oracle, RunningBearerd, UInt16) throws -> Void) throws {
        let oracle = try Oracle()
        defer { oracle.stop() }
        try oracle.vendor("aws", shape: "container", lifetime: lifetime, delayMS: delayMS)
        try oracle.vendor("ali", shape: "aliyun", lifetime: lifetime, delayMS: delayMS)
        try oracle.admin("/__admin/config", ["oss_vhost_bucket": ossBucket])
        try prepare(oracle)
        let dir = try RunningBearerd.tempDir("oracle-\(tag)")
        defer { try? FileManager.default.removeItem(atPath: dir) }
        let port = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: config(port: port, oracle: oracle, refreshBefore: refreshBefore), dir: dir)
        defer { _ = b.stop() }
        let deadline = Date().addingTimeInterval(15)
        var listening = false
        while Date() < deadline, b.process.isRunning {
            if (try? TestClient(port: port)) != nil { listening = true; break }
            Thread.sleep(forTimeInterval: 0.02)
        }
        try #require(listening, "bearerd did not listen: \(b.logs.suffix(3000))")
        try body(oracle, b, port)
        #expect(b.process.isRunning, "bearerd exited: \(b.logs.suffix(3000))")
    }

    /// One request through bearerd on a fresh connection.
    static func send(_ port: UInt16, _ method: String, _ target: String, body: [UInt8] = [],
                     headers: [(String, String)] = []) throws -> TestClient.Response {
        let c = try TestClient(port: port, timeout: 30)
        var head = "\(method) \(target) HTTP/1.1\r\nHost: localhost\r\nContent-Length: \(body.count)\r\nConnection: close\r\n"
        for (n, v) in headers { head += "\(n): \(v)\r\n" }
        try c.send(Array((head + "\r\n").utf8) + body)
        return try c.readResponse(method: method)
    }

    static func sha256Hex(_ bytes: [UInt8]) -> String { RequestSigning.hex(Digest.sha256(bytes)) }

    static func randomBytes(_ n: Int) -> [UInt8] {
        var g = SystemRandomNumberGenerator()
        return (0..<n).map { _ in UInt8.random(in: 0...255, using: &g) }
    }

    // MARK: - Keys named the hard way

    /// (decoded key, how a client spells it on the wire). Each key twice: percent-encoded the way
    /// botocore does (lower-case hex for some), and with the sub-delimiters RFC 3986 allows raw.
    /// (No `.` or `..` segment: bearerd refuses those before routing, 400 `proxy.dot_segment`,
    /// docs/architecture.md §5.)
    static let hardKeys: [(name: String, wire: String)] = [
        ("sp ace/and~tilde", "sp%20ace/and~tilde"),
        ("sp ace/and~tilde", "sp%20ace/and%7etilde"),
        ("plus+equals=percent%bang!", "plus%2Bequals%3Dpercent%25bang%21"),
        ("plus+equals=percent%bang!", "plus+equals=percent%25bang!"),
        ("quote'paren()star*semi;comma,at@dollar$amp&", "quote%27paren%28%29star%2Asemi%3Bcomma%2Cat%40dollar%24amp%26"),
        ("quote'paren()star*semi;comma,at@dollar$amp&", "quote'paren()star*semi;comma,at@dollar$amp&"),
        ("unicodé/日本語/emoji-😀", "unicod%C3%A9/%E6%97%A5%E6%9C%AC%E8%AA%9E/emoji-%F0%9F%98%80"),
        ("unicodé/日本語/emoji-😀", "unicod%c3%a9/%e6%97%a5%e6%9c%ac%e8%aa%9e/emoji-%f0%9f%98%80"),
        ("double//slash///end", "double//slash///end"),
        ("literal%7E-and-encoded-slash/x", "literal%257E-and-encoded-slash%2Fx"),
    ]
    /// A query with empty values, a key without `=`, repeated keys, an encoded space, a `+`, a raw `/`.
    static let hardQuery = "rep=2&empty=&flag&rep=1&rep=&sp=a%20b&plus=a+b&slash=a/b&uni=%C3%A9"
    static let hardQueryDecoded: [[String]] = [["rep", "2"], ["empty", ""], ["flag", ""], ["rep", "1"], ["rep", ""],
                                               ["sp", "a b"], ["plus", "a+b"], ["slash", "a/b"], ["uni", "é"]]

    enum Provider: String, CaseIterable, CustomTestStringConvertible {
        case aws, aliyun
        var testDescription: String { rawValue }
        /// The client's path prefix for `key` on the wire.
        func target(_ wireKey: String) -> String {
            self == .aws ? "/s3/\(SigningOracleTests.bucket)/\(wireKey)" : "/oss/\(wireKey)"
        }
        /// The name the oracle stores `key` under.
        func stored(_ key: String) -> String {
            self == .aws ? "s3:/\(SigningOracleTests.bucket)/\(key)" : "oss:/\(SigningOracleTests.ossBucket)/\(key)"
        }
        /// The target bearerd sends for a plain ASCII key.
        func upstreamPath(_ key: String) -> String { self == .aws ? "/\(SigningOracleTests.bucket)/\(key)" : "/\(key)" }
        var vendor: String { self == .aws ? "aws" : "ali" }
        var scheme: RequestSigning.Scheme {
            self == .aws ? .awsV4(region: "us-east-1", service: "s3") : .ossV4(region: "cn-hangzhou", bucket: SigningOracleTests.ossBucket)
        }
    }

    // MARK: - The cores against the reference signers (no bearerd)

    /// Signs `method target` with the core signer and sends it straight to the oracle.
    static func signedDirect(_ oracle: Oracle, _ provider: Provider, _ method: String, _ target: String, body: [UInt8] = [],
                             credentials: RequestSigning.Credentials, payload: RequestSigning.Payload = .unsigned,
                             epochSeconds: Int64? = nil) throws -> (TestClient.Response, RequestSigning.Signed) {
        let host = "127.0.0.1:\(oracle.port)"
        let signed = try RequestSigning.sign(method: method, target: target, host: host, headers: [("Content-Type", "application/octet-stream")],
                                             scheme: provider.scheme, credentials: credentials, payload: payload,
                                             epochSeconds: epochSeconds ?? Int64(Date().timeIntervalSince1970), crypto: Crypto()).get()
        var head = "\(method) \(signed.target) HTTP/1.1\r\nHost: \(host)\r\nContent-Length: \(body.count)\r\nConnection: close\r\nContent-Type: application/octet-stream\r\n"
        for f in signed.add { head += "\(f.name): \(f.value)\r\n" }
        let c = try TestClient(port: oracle.port)
        try c.send(Array((head + "\r\n").utf8) + body)
        return (try c.readResponse(method: method), signed)
    }

    @Test(arguments: Provider.allCases)
    func coreSignerAgreesWithTheReferenceSigners(_ provider: Provider) throws {
        let oracle = try Oracle()
        defer { oracle.stop() }
        try oracle.admin("/__admin/config", ["oss_vhost_bucket": Self.ossBucket])
        let creds = RequestSigning.Credentials(accessKeyID: "AKIDCORE", secretAccessKey: "core/se+cret=", sessionToken: "core/token+==")
        try oracle.admin("/__admin/keys", ["id": "AKIDCORE", "secret": "core/se+cret=", "token": "core/token+=="])
        for (i, k) in Self.hardKeys.enumerated() {
            let body = Array("core \(i) \(k.name)".utf8)
            let path = provider == .aws ? "/\(Self.bucket)/\(k.wire)" : "/\(k.wire)"
            let payload: RequestSigning.Payload = provider == .aws && i % 2 == 0 ? .hashed(Self.sha256Hex(body)) : .unsigned
            let (put, _) = try Self.signedDirect(oracle, provider, "PUT", path + "?" + Self.hardQuery, body: body, credentials: creds, payload: payload)
            #expect(put.status == 200, "PUT \(k.wire): \(put.bodyText.prefix(1500))")
            let (get, _) = try Self.signedDirect(oracle, provider, "GET", path, credentials: creds)
            #expect(get.status == 200 && get.body == body, "GET \(k.wire): \(get.status) \(get.bodyText.prefix(300))")
            #expect(try oracle.stats().objects[provider.stored(k.name)] != nil, "stored as \(provider.stored(k.name))")
        }
    }

    /// What S3 and OSS send when they refuse a signed request (the oracle answers with their
    /// shapes): the verdict reads each, including the server's canonical request hash (equal to
    /// the one the core signed) and its clock from `<ServerTime>` or, body-less, from `Date`.
    @Test(arguments: Provider.allCases)
    func verdictReadsTheServicesRefusals(_ provider: Provider) throws {
        let oracle = try Oracle()
        defer { oracle.stop() }
        try oracle.admin("/__admin/config", ["oss_vhost_bucket": Self.ossBucket])
        let good = RequestSigning.Credentials(accessKeyID: "AKIDVERDICT", secretAccessKey: "verdict-secret", sessionToken: "verdict-token")
        try oracle.admin("/__admin/keys", ["id": "AKIDVERDICT", "secret": "verdict-secret", "token": "verdict-token"])
        let path = provider == .aws ? "/\(Self.bucket)/v" : "/v"
        func verdict(_ r: TestClient.Response) -> SignedResponseVerdict {
            SignedResponseVerdict.classify(status: r.status, headers: r.head.headers.map { (name: $0.name, value: $0.value) }, body: r.body)
        }
        #expect(try Self.signedDirect(oracle, provider, "PUT", path, body: [1, 2, 3], credentials: good).0.status == 200)

        var wrong = good
        wrong.secretAccessKey += "x"
        let (mismatch, signed) = try Self.signedDirect(oracle, provider, "GET", path, credentials: wrong)
        #expect(mismatch.status == 403)
        #expect(verdict(mismatch) == .signatureMismatch(code: "SignatureDoesNotMatch",
                                                         serverCanonicalRequestHash: Self.sha256Hex(Array(signed.canonicalRequest.utf8))),
                "\(mismatch.bodyText.prefix(1500))")

        var unknown = good
        unknown.accessKeyID = "AKIDNOBODY"
        let (invalid, _) = try Self.signedDirect(oracle, provider, "GET", path, credentials: unknown)
        #expect(invalid.status == 403 && verdict(invalid) == .credentialsRejected(code: "InvalidAccessKeyId"), "\(invalid.bodyText)")

        // The origin's clock 30 minutes ahead: the verdict carries its time, and a request signed
        // at that time passes.
        try oracle.clock(offset: 1800)
        let (skew, _) = try Self.signedDirect(oracle, provider, "GET", path, credentials: good)
        let expectedServer = Int64(Date().timeIntervalSince1970) + 1800
        guard case .clockSkew("RequestTimeTooSkewed", let server?) = verdict(skew) else {
            Issue.record("skew: \(skew.status) \(verdict(skew)) \(skew.bodyText)")
            return
        }
        #expect(skew.status == 403 && abs(server - expectedServer) <= 5, "server time \(server) vs \(expectedServer)")
        #expect(try Self.signedDirect(oracle, provider, "GET", path, credentials: good, epochSeconds: server).0.status == 200)
        // Body-less (HEAD): OSS's x-oss-ec and the Date field in the server's clock still say it.
        let (headSkew, _) = try Self.signedDirect(oracle, provider, "HEAD", path, credentials: good)
        #expect(headSkew.body.isEmpty)
        if provider == .aliyun {
            guard case .clockSkew("RequestTimeTooSkewed", let t?) = verdict(headSkew) else {
                Issue.record("HEAD skew: \(headSkew.status) \(verdict(headSkew))")
                return
            }
            #expect(abs(t - expectedServer) <= 5)
        } else {
            #expect(verdict(headSkew) == .otherError(code: nil), "S3 names no code for a body-less answer")
        }
        try oracle.clock(offset: 0)

        var otherToken = good
        otherToken.sessionToken = "someone-else"
        let (badToken, _) = try Self.signedDirect(oracle, provider, "GET", path, credentials: otherToken)
        if provider == .aws {
            #expect(badToken.status == 400 && verdict(badToken) == .credentialsRejected(code: "InvalidToken"), "\(badToken.bodyText)")
        } else {
            #expect(badToken.status == 403 && verdict(badToken) == .credentialsRejected(code: "InvalidSecurityToken"), "\(badToken.bodyText)")
        }

        try oracle.admin("/__admin/expire", ["id": "AKIDVERDICT"])
        let (expired, _) = try Self.signedDirect(oracle, provider, "GET", path, credentials: good)
        let expiredCode = provider == .aws ? "ExpiredToken" : "SecurityTokenExpired"
        #expect(expired.status == (provider == .aws ? 400 : 403), "\(expired.bodyText)")
        #expect(verdict(expired) == .credentialsRejected(code: expiredCode), "\(expired.bodyText)")
        let (headExpired, _) = try Self.signedDirect(oracle, provider, "HEAD", path, credentials: good)
        #expect(headExpired.body.isEmpty)
        #expect(verdict(headExpired) == (provider == .aws ? .otherError(code: nil) : .credentialsRejected(code: expiredCode)))
    }

    // MARK: - Through bearerd

    /// Keys with every character class the signers treat specially, in two spellings each, with a
    /// query of empty values and repeated keys: PUT then GET through bearerd, byte-exact, stored
    /// under the decoded name, the query arriving as sent (as a multiset: bearerd sorts it). For
    /// S3 also with `payload: signed` (the origin checks the body against the signed hash).
    @Test(arguments: Provider.allCases)
    func hardKeysRoundTripThroughBearerd(_ provider: Provider) throws {
        try Self.withBearerd("keys-\(provider)") { oracle, b, port in
            for (i, k) in Self.hardKeys.enumerated() {
                let body = Array("object \(i): \(k.name)".utf8) + Self.randomBytes(64)
                let put = try Self.send(port, "PUT", provider.target(k.wire) + "?" + Self.hardQuery, body: body,
                                        headers: [("Content-Type", "application/octet-stream")])
                #expect(put.status == 200, "PUT \(k.wire): \(put.status) \(put.bodyText.prefix(1500))")
                let get = try Self.send(port, "GET", provider.target(k.wire))
                #expect(get.status == 200 && get.body == body, "GET \(k.wire): \(get.status) \(get.bodyText.prefix(500))")
                let stats = try oracle.stats()
                #expect(stats.objects[provider.stored(k.name)]?.sha256 == Self.sha256Hex(body),
                        "stored under \(provider.stored(k.name)): \(stats.objects.keys.sorted())")
                if provider == .aws {
                    // The same through the route that signs the payload's hash: the origin checks it.
                    let signedBody = body + Array(" (signed payload)".utf8)
                    let put = try Self.send(port, "PUT", "/s3signed/\(Self.bucket)/\(k.wire)?" + Self.hardQuery, body: signedBody)
                    #expect(put.status == 200, "PUT (payload signed) \(k.wire): \(put.status) \(put.bodyText.prefix(1500))")
                    let seen = try oracle.stats().requests.last { $0.method == "PUT" && $0.object == provider.stored(k.name) }
                    #expect(seen?.content_sha256 == Self.sha256Hex(signedBody), "the payload's hash signed: \(String(describing: seen))")
                    let get = try Self.send(port, "GET", provider.target(k.wire))
                    #expect(get.status == 200 && get.body == signedBody, "GET after the signed-payload PUT \(k.wire): \(get.status)")
                }
                if let seen = stats.requests.last(where: { $0.method == "PUT" && $0.object == provider.stored(k.name) }) {
                    let sortedPairs = { (q: [[String]]) in q.sorted { $0.joined(separator: "\u{0}") < $1.joined(separator: "\u{0}") } }
                    #expect(sortedPairs(seen.query ?? []) == sortedPairs(Self.hardQueryDecoded), "query as the origin decoded it: \(seen.query ?? [])")
                } else {
                    Issue.record("the oracle accepted no PUT of \(k.name): \(stats.requests.suffix(3))")
                }
            }
            #expect(try oracle.stats().vend_calls[provider.vendor] == 1)
        }
    }

    enum Cut: String, CaseIterable, CustomTestStringConvertible {
        case revoke, expire
        var testDescription: String { rawValue }
    }

    /// A 1 MiB PUT whose keys the origin revoked (or expired) just before: bearerd gets
    /// InvalidAccessKeyId / ExpiredToken / SecurityTokenExpired, fetches new keys, replays once with
    /// the body, and the origin stores it intact; the client sees 200.
    @Test(arguments: Provider.allCases, Cut.allCases)
    func rejectedKeysRefreshAndReplayTheBodyIntact(_ provider: Provider, _ cut: Cut) throws {
        try Self.withBearerd("replay-\(provider)-\(cut)") { oracle, b, port in
            let warm = try Self.send(port, "PUT", provider.target("warm"), body: Array("warm".utf8))
            #expect(warm.status == 200, "\(warm.bodyText)")
            try oracle.admin(cut == .revoke ? "/__admin/revoke" : "/__admin/expire", ["vendor": provider.vendor])
            let body = Self.randomBytes(1 << 20)
            let put = try Self.send(port, "PUT", provider.target("big-\(cut)"), body: body)
            #expect(put.status == 200, "\(put.status) \(put.bodyText.prefix(1000)) \(b.logs.suffix(2000))")
            let stats = try oracle.stats()
            let refused = cut == .revoke ? "InvalidAccessKeyId" : (provider == .aws ? "ExpiredToken" : "SecurityTokenExpired")
            #expect(stats.attempts(provider.upstreamPath("big-\(cut)")) == [refused: 1, "OK": 1],
                    "\(stats.attempts(provider.upstreamPath("big-\(cut)"))); the origin saw \(stats.requests.suffix(3))")
            #expect(stats.vend_calls[provider.vendor] == 2)
            let stored = stats.objects[provider.stored("big-\(cut)")]
            #expect(stored?.length == body.count && stored?.sha256 == Self.sha256Hex(body), "\(String(describing: stored))")
            let get = try Self.send(port, "GET", provider.target("big-\(cut)"))
            #expect(get.status == 200 && get.body == body)
        }
    }

    /// `VmRSS` of `pid` in KiB.
    static func rssKiB(_ pid: Int32) -> Int? {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
        for line in text.split(separator: "\n") where line.hasPrefix("VmRSS:") {
            return line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first.flatMap { Int($0) }
        }
        return nil
    }

    /// A 64 MiB upload with the payload unsigned streams through bearerd: its resident memory
    /// grows by less than 32 MiB while the body passes, and the origin gets every byte.
    @Test func a64MiBUploadStreamsInBoundedMemory() throws {
        try Self.withBearerd("stream") { oracle, b, port in
            let pid = b.process.processIdentifier
            #expect(try Self.send(port, "PUT", Provider.aws.target("warm"), body: Self.randomBytes(256 * 1024)).status == 200)
            let base = try #require(Self.rssKiB(pid))
            final class Peak: @unchecked Sendable {  // @unchecked: guarded by lock
                let lock = NSLock()
                var kib = 0
                var running = true
            }
            let peak = Peak()
            let sampler = Thread {
                while peak.lock.withLock({ peak.running }) {
                    if let r = SigningOracleTests.rssKiB(pid) { peak.lock.withLock { peak.kib = max(peak.kib, r) } }
                    usleep(10_000)
                }
            }
            sampler.start()
            let chunk = Self.randomBytes(1 << 20)
            let total = 64
            var payload = [UInt8]()
            payload.reserveCapacity(total << 20)
            for i in 0..<total { payload += chunk.map { $0 ^ UInt8(truncatingIfNeeded: i) } }
            let c = try TestClient(port: port, timeout: 60)
            try c.send("PUT \(Provider.aws.target("huge")) HTTP/1.1\r\nHost: localhost\r\nContent-Length: \(total << 20)\r\nConnection: close\r\n\r\n")
            for i in 0..<total { try c.send(Array(payload[(i << 20)..<((i + 1) << 20)])) }
            let r = try c.readResponse(method: "PUT")
            peak.lock.withLock { peak.running = false }
            let grown = peak.lock.withLock { peak.kib } - base
            #expect(r.status == 200, "\(r.bodyText.prefix(500))")
            print("64 MiB upload: bearerd VmRSS \(base) KiB → peak +\(grown) KiB (io: \(ProcessInfo.processInfo.environment["BEARERD_IO"] ?? "default"))")
            #expect(grown < 32 * 1024, "bearerd's resident memory grew by \(grown) KiB while a 64 MiB body streamed")
            let stored = try oracle.stats().objects[Provider.aws.stored("huge")]
            #expect(stored?.length == total << 20 && stored?.sha256 == Self.sha256Hex(payload), "\(String(describing: stored))")
            #expect(try oracle.stats().requests.last { $0.path == "/\(Self.bucket)/huge" }?.content_sha256 == "UNSIGNED-PAYLOAD")
        }
    }

    /// 100 requests at once, the first bearerd serves, while the vending endpoint takes 1.5 s:
    /// one vending call, every request 200.
    @Test func hundredConcurrentFirstRequestsFetchOnce() throws {
        try Self.withBearerd("coalesce", delayMS: 1500) { oracle, b, port in
            final class Results: @unchecked Sendable {  // @unchecked: guarded by lock
                let lock = NSLock()
                var statuses: [Int] = []
                var errors: [String] = []
            }
            let results = Results()
            let group = DispatchGroup()
            for i in 0..<100 {
                group.enter()
                Thread {
                    defer { group.leave() }
                    let provider: Provider = i % 2 == 0 ? .aws : .aliyun
                    do {
                        let r = try SigningOracleTests.send(port, "PUT", provider.target("first-\(i)"), body: Array("first \(i)".utf8))
                        results.lock.withLock { results.statuses.append(r.status) }
                        if r.status != 200 { results.lock.withLock { results.errors.append("\(i): \(r.status) \(r.bodyText.prefix(300))") } }
                    } catch {
                        results.lock.withLock { results.errors.append("\(i): \(error)") }
                    }
                }.start()
            }
            #expect(group.wait(timeout: .now() + 60) == .success)
            let (statuses, errors) = results.lock.withLock { (results.statuses, results.errors) }
            let allOK = statuses.count == 100 && statuses.allSatisfy { $0 == 200 }
            #expect(allOK, "\(statuses.count) answers, failures: \(errors.prefix(5))")
            let calls = try oracle.stats().vend_calls
            #expect(calls == ["aws": 1, "ali": 1])
        }
    }

    /// Keys that live 20 s, over 60 s of continuous requests (two clients per provider, a PUT and
    /// a GET every ~0.3 s each): no request fails, the origin refuses none (keys are replaced before
    /// they expire), and keys are fetched several times.
    @Test func keysExpiringEvery20sNeverFailARequest() throws {
        try Self.withBearerd("expiry", lifetime: 20, refreshBefore: "5s") { oracle, b, port in
            final class Results: @unchecked Sendable {  // @unchecked: guarded by lock
                let lock = NSLock()
                var ok = 0
                var failures: [String] = []
            }
            let results = Results()
            let end = Date().addingTimeInterval(60)
            let group = DispatchGroup()
            for client in 0..<4 {
                group.enter()
                Thread {
                    defer { group.leave() }
                    let provider: Provider = client % 2 == 0 ? .aws : .aliyun
                    var n = 0
                    while Date() < end {
                        n += 1
                        let key = "c\(client)-\(n % 5)"
                        let body = Array("client \(client) request \(n)".utf8)
                        do {
                            let put = try SigningOracleTests.send(port, "PUT", provider.target(key), body: body)
                            let get = try SigningOracleTests.send(port, "GET", provider.target(key))
                            results.lock.withLock {
                                if put.status == 200 && get.status == 200 && get.body == body { results.ok += 2 } else {
                                    results.failures.append("\(Date()) \(provider) \(key): PUT \(put.status) \(put.bodyText.prefix(200)) GET \(get.status)")
                                }
                            }
                        } catch {
                            results.lock.withLock { results.failures.append("\(Date()) \(provider) \(key): \(error)") }
                        }
                        usleep(300_000)
                    }
                }.start()
            }
            #expect(group.wait(timeout: .now() + 120) == .success)
            let stats = try oracle.stats()
            let (ok, failures) = results.lock.withLock { (results.ok, results.failures) }
            print("60 s with 20 s keys: \(ok) requests ok, \(failures.count) failed; vending \(stats.vend_calls); origin outcomes \(stats.outcomes)")
            #expect(failures.isEmpty, "\(failures.prefix(5))")
            #expect(ok >= 200)
            // Keys are refreshed before they expire (refresh_before), not after a refusal: the
            // origin refused nothing (a replay would have hidden a refusal from the clients).
            #expect(stats.outcomes.keys.sorted() == ["OK"], "the origin's outcomes: \(stats.outcomes)")
            for vendor in ["aws", "ali"] {
                let calls = stats.vend_calls[vendor] ?? 0
                #expect(calls >= 3 && calls <= 12, "\(vendor): \(calls) vending calls in 60 s with keys living 20 s")
            }
        }
    }

    /// The origin's clock 30 minutes ahead: the first request gets RequestTimeTooSkewed, bearerd
    /// adopts ServerTime and re-signs, the client sees 200; later requests pass at once.
    @Test func skewedOriginClockIsAdopted() throws {
        try Self.withBearerd("skew", prepare: { try $0.clock(offset: 1800) }) { oracle, b, port in
            for provider in Provider.allCases {
                let first = try Self.send(port, "PUT", provider.target("skew-0"), body: Array("first".utf8))
                #expect(first.status == 200, "\(provider): \(first.status) \(first.bodyText.prefix(500)) \(b.logs.suffix(1500))")
                let firstSeen = try oracle.stats()
                #expect(firstSeen.attempts(provider.upstreamPath("skew-0")) == ["RequestTimeTooSkewed": 1, "OK": 1],
                        "\(provider): the origin saw \(firstSeen.requests.suffix(3))")
                for i in 1...5 {
                    let r = try Self.send(port, "PUT", provider.target("skew-\(i)"), body: Array("later \(i)".utf8))
                    #expect(r.status == 200)
                    let seen = try oracle.stats()
                    #expect(seen.attempts(provider.upstreamPath("skew-\(i)")) == ["OK": 1],
                            "\(provider): later requests pass at once; the origin saw \(seen.requests.suffix(2))")
                }
            }
            #expect(try oracle.stats().outcomes["RequestTimeTooSkewed"] == 2, "once per session")
        }
    }

    /// The origin computes with another secret: SignatureDoesNotMatch reaches the client as the
    /// origin's 403, the origin sees exactly one attempt (never replayed), and bearerd's log names
    /// the canonical request's hash.
    @Test func signatureMismatchIsRelayedNotReplayed() throws {
        try Self.withBearerd("mismatch", prepare: { o in
            try o.admin("/__admin/wrong_secret", ["vendor": "aws"])
            try o.admin("/__admin/wrong_secret", ["vendor": "ali"])
        }) { oracle, b, port in
            for provider in Provider.allCases {
                let r = try Self.send(port, "PUT", provider.target("mismatch"), body: Array("never stored".utf8))
                #expect(r.status == 403, "\(provider): \(r.status) \(r.bodyText.prefix(500))")
                #expect(r.bodyText.contains("<Code>SignatureDoesNotMatch</Code>"))
                Thread.sleep(forTimeInterval: 0.5)
                let stats = try oracle.stats()
                #expect(stats.attempts(provider.upstreamPath("mismatch")) == ["SignatureDoesNotMatch": 1], "\(stats.attempts)")
                #expect(stats.objects[provider.stored("mismatch")] == nil)
                if case .signatureMismatch(_, let hash?) = SignedResponseVerdict.classify(status: r.status, headers: [], body: r.body) {
                    #expect(b.waitLog(hash, seconds: 3), "the log names the canonical request's hash \(hash): \(b.logs.suffix(2000))")
                } else {
                    Issue.record("no canonical request hash in \(r.bodyText.prefix(500))")
                }
            }
        }
    }
}
