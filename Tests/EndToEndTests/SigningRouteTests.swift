import Foundation
import Testing
import BearerdTestSupport
import BearerdProxyCore
import BearerdTLS

/// Signing routes (`sign:`, docs/architecture.md §6.15) with the real `bearerd run` against a
/// real S3 that verifies AWS Signature V4: moto's server (Tests/Fixtures/s3_server.py,
/// authentication enforced). The session is `grant: aws` with `credentials: { static: … }` (key
/// files written here); clients send plain requests without any credentials (or with their own
/// `Authorization` and `X-Amz-*` fields, which must not reach the store), over HTTP/1.1 and
/// HTTP/2, with `payload: unsigned` (the default: bodies stream) and `payload: signed`.
/// moto's verdict is the oracle; the negative control first proves it refuses a wrong signature.
@Suite("Signing routes against a real S3", .serialized,
       .enabled(if: Prerequisite.runs(PythonFixture.unavailable(modules: ["moto", "flask_cors"]) == nil && Curl.available),
                "\(PythonFixture.unavailable(modules: ["moto", "flask_cors"]) ?? "curl is not installed")"))
struct SigningRouteTests {
    static let bucket = "bearerd-test"

    /// moto with its keys, and bearerd with a signing session over key files. Routes:
    /// `/signed/` (stripped) signs the payload with a 64 KiB replay_body_limit; `/` streams it.
    final class Rig {
        let moto: PythonFixture
        let accessKeyID: String
        let secret: String
        let dir: String
        let port: UInt16
        let bearerd: RunningBearerd

        /// `secretOverride`: the secret written to the key file instead of moto's.
        init(secretOverride: String? = nil) throws {
            try Prerequisite.require(PythonFixture.unavailable(modules: ["moto", "flask_cors"]) == nil, "moto and flask-cors in the tests' venv")
            dir = try RunningBearerd.tempDir("signing")
            let keys = dir + "/moto-keys.json"
            moto = try PythonFixture(script: "s3_server.py", arguments: [keys], readyTimeout: 60)
            let o = try #require(try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: keys))) as? [String: String])
            accessKeyID = try #require(o["access_key_id"])
            secret = try #require(o["secret_access_key"])
            try accessKeyID.write(toFile: dir + "/access_key_id", atomically: true, encoding: .utf8)
            try (secretOverride ?? secret).write(toFile: dir + "/secret_access_key", atomically: true, encoding: .utf8)
            chmod(dir + "/access_key_id", 0o600)
            chmod(dir + "/secret_access_key", 0o600)
            port = try RunningBearerd.freePort()
            bearerd = try RunningBearerd(config: """
                listen: 127.0.0.1:\(port)
                sessions:
                  s3:
                    grant: aws
                    region: us-east-1
                    credentials:
                      static:
                        access_key_id_file: \(dir)/access_key_id
                        secret_access_key_file: \(dir)/secret_access_key
                routes:
                  - match: /signed/
                    strip_prefix: true
                    upstream: http://127.0.0.1:\(moto.port)
                    session: s3
                    replay_body_limit: 64KiB
                    sign: { service: s3, payload: signed }
                  - match: /
                    upstream: http://127.0.0.1:\(moto.port)
                    session: s3
                    sign: { service: s3 }
                """, dir: dir)
        }

        func stop() {
            _ = bearerd.stop()
            moto.stop()
            try? FileManager.default.removeItem(atPath: dir)
        }

        /// One HTTP/1.1 request through bearerd, written as bytes (no credentials unless in `headers`).
        func send(_ method: String, _ target: String, body: [UInt8] = [], headers: [(String, String)] = []) throws -> TestClient.Response {
            let c = try TestClient(port: port, timeout: 20)
            var head = "\(method) \(target) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n"
            if !body.isEmpty || method == "PUT" { head += "Content-Length: \(body.count)\r\n" }
            for (n, v) in headers { head += "\(n): \(v)\r\n" }
            try c.send(Array((head + "\r\n").utf8) + body)
            return try c.readResponse(method: method)
        }

        /// bearerd is up and its session has keys: a listing answered 200 (the session fetches
        /// its keys on the first request; a fetch failure is a 503).
        func ready() -> Bool {
            let deadline = Date().addingTimeInterval(20)
            while Date() < deadline {
                if let r = try? send("GET", "/\(SigningRouteTests.bucket)?list-type=2"), r.status == 200 { return true }
                Thread.sleep(forTimeInterval: 0.2)
            }
            return false
        }
    }

    /// The negative control: moto refuses a request whose signature is wrong (a client's own
    /// `Authorization` sent straight to it), and through bearerd with a wrong secret the
    /// store's 403 `SignatureDoesNotMatch` is relayed as it is, never replayed, its warning naming
    /// the canonical request's hash and never the secret.
    @Test func aWrongSignatureIsRefusedAndTheMismatchRelayed() throws {
        let rig = try Rig(secretOverride: "wrong-secret-not-the-real-one")
        defer { rig.stop() }
        let direct = try TestClient(port: rig.moto.port, timeout: 20)
        try direct.send("GET /\(Self.bucket)?list-type=2 HTTP/1.1\r\nHost: 127.0.0.1:\(rig.moto.port)\r\nConnection: close\r\n"
            + "X-Amz-Date: 20250101T000000Z\r\nX-Amz-Content-SHA256: UNSIGNED-PAYLOAD\r\n"
            + "Authorization: AWS4-HMAC-SHA256 Credential=\(rig.accessKeyID)/20250101/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature=\(String(repeating: "0", count: 64))\r\n\r\n")
        let refused = try direct.readResponse()
        #expect(refused.status == 403, "moto must check signatures: \(refused.bodyText)")

        #expect(rig.bearerd.waitServing(port: rig.port, path: "/\(Self.bucket)?list-type=2", seconds: 20) != nil, "\(rig.bearerd.logs)")
        let r = try rig.send("GET", "/\(Self.bucket)?list-type=2")
        #expect(r.status == 403, "\(r.bodyText) \(rig.bearerd.logs)")
        #expect(r.bodyText.contains("SignatureDoesNotMatch"), "the store's answer relayed as it is: \(r.bodyText)")
        #expect(rig.bearerd.waitLog("upstream computed another signature"), "\(rig.bearerd.logs)")
        let logs = rig.bearerd.logs
        #expect(logs.contains("canonical_request.sha256"), "\(logs)")
        #expect(!logs.contains("wrong-secret-not-the-real-one"), "the secret in the log")
        #expect(!logs.contains("replaying rejected request"), "a signature mismatch is never replayed: \(logs)")
    }

    /// PUT, GET, DELETE of objects through bearerd over HTTP/1.1, the client sending no
    /// credentials; then a client that sends its own `Authorization`, `X-Amz-Date` and
    /// `X-Amz-Security-Token`: removed before signing (moto would refuse them).
    @Test func objectsRoundTripOverHTTP1() throws {
        let rig = try Rig()
        defer { rig.stop() }
        #expect(rig.ready(), "\(rig.bearerd.logs)")
        let body = Array("hello through bearerd \(UUID().uuidString)".utf8)
        let put = try rig.send("PUT", "/\(Self.bucket)/dir/a%20b.txt", body: body, headers: [("Content-Type", "text/plain")])
        #expect(put.status == 200, "\(put.bodyText)")
        let get = try rig.send("GET", "/\(Self.bucket)/dir/a%20b.txt")
        #expect(get.status == 200, "\(get.bodyText)")
        #expect(get.body == body)
        // The client's own credentials never reach the store.
        let spoofed = try rig.send("GET", "/\(Self.bucket)/dir/a%20b.txt", headers: [
            ("Authorization", "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=deadbeef"),
            ("X-Amz-Date", "20150830T123600Z"), ("X-Amz-Security-Token", "client-token"), ("X-Amz-Content-SHA256", "UNSIGNED-PAYLOAD")])
        #expect(spoofed.status == 200, "\(spoofed.bodyText)")
        #expect(spoofed.body == body)
        let delete = try rig.send("DELETE", "/\(Self.bucket)/dir/a%20b.txt")
        #expect(delete.status == 204, "\(delete.bodyText)")
        let gone = try rig.send("GET", "/\(Self.bucket)/dir/a%20b.txt")
        #expect(gone.status == 404, "\(gone.bodyText)")
        #expect(gone.bodyText.contains("NoSuchKey"))
        // A target the signer cannot sign is the client's 400, nothing is sent.
        let bad = try rig.send("GET", "/\(Self.bucket)/bad%zzkey")
        #expect(bad.status == 400, "\(bad.bodyText)")
        #expect(bad.bodyText.contains("sign.invalid_target"), "\(bad.bodyText)")
        #expect(!rig.bearerd.logs.contains(rig.secret), "the secret in the log")
    }

    /// The same over HTTP/2 (curl, prior knowledge), a larger streamed upload included.
    @Test func objectsRoundTripOverHTTP2() throws {
        let rig = try Rig()
        defer { rig.stop() }
        #expect(rig.ready(), "\(rig.bearerd.logs)")
        let base = "http://127.0.0.1:\(rig.port)/\(Self.bucket)"
        let body = String(repeating: "0123456789abcdef", count: 20_000)  // 320 KB, streamed unsigned
        let put = try Curl.run(["--http2-prior-knowledge", "-X", "PUT", "--data-binary", "@-", "-H", "Content-Type: application/octet-stream",
                                "-H", "Authorization: Bearer not-for-the-store", "\(base)/h2/object"], stdin: Data(body.utf8))
        #expect(put.status == 0 && put.httpVersion == "2", "\(put.stderr)")
        let get = try Curl.run(["--http2-prior-knowledge", "\(base)/h2/object"])
        #expect(get.httpVersion == "2")
        #expect(get.body == body, "\(get.body.prefix(300))")
        let delete = try Curl.run(["--http2-prior-knowledge", "-X", "DELETE", "-o", "/dev/null", "-w", "%{http_code}", "\(base)/h2/object"])
        #expect(delete.stdout.hasPrefix("204"), "\(delete.stdout) \(delete.stderr)")
        let gone = try Curl.run(["--http2-prior-knowledge", "-o", "/dev/null", "-w", "%{http_code}", "\(base)/h2/object"])
        #expect(gone.stdout.hasPrefix("404"), "\(gone.stdout)")
    }

    /// `payload: signed`: the body's SHA-256 is in the signature (moto checks it against the
    /// body it received), over both protocols; a body over replay_body_limit is a 413 that says
    /// why, and nothing reaches the store.
    @Test func signedPayloadIsHashedAndTooLargeIs413() throws {
        let rig = try Rig()
        defer { rig.stop() }
        #expect(rig.ready(), "\(rig.bearerd.logs)")
        let body = Array(String(repeating: "signed payload ", count: 1_000).utf8)
        let put = try rig.send("PUT", "/signed/\(Self.bucket)/signed.txt", body: body)
        #expect(put.status == 200, "\(put.bodyText)")
        let get = try rig.send("GET", "/signed/\(Self.bucket)/signed.txt")
        #expect(get.status == 200 && get.body == body, "\(get.bodyText.prefix(200))")
        // HTTP/2, the body chunked in DATA frames, with Expect: 100-continue.
        // (A content type, or moto's Flask reads the body as a form and stores nothing.)
        let h2 = try Curl.run(["--http2-prior-knowledge", "-i", "-X", "PUT", "--data-binary", "@-", "-H", "Expect: 100-continue",
                               "-H", "Content-Type: application/octet-stream",
                               "http://127.0.0.1:\(rig.port)/signed/\(Self.bucket)/signed-h2.txt"], stdin: Data(body))
        #expect(h2.status == 0 && h2.httpVersion == "2", "\(h2.stderr)")
        #expect(h2.stdout.contains("HTTP/2 200"), "\(h2.stdout)")
        let back = try Curl.run(["--http2-prior-knowledge", "http://127.0.0.1:\(rig.port)/\(Self.bucket)/signed-h2.txt"])
        #expect(back.body.utf8.count == body.count && back.body == String(decoding: body, as: UTF8.self), "\(back.body.prefix(300))")
        // HTTP/1.1 with Expect: 100-continue: bearerd asks for the body itself.
        let c = try TestClient(port: rig.port, timeout: 20)
        try c.send("PUT /signed/\(Self.bucket)/continue.txt HTTP/1.1\r\nHost: 127.0.0.1:\(rig.port)\r\nContent-Length: 5\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n")
        #expect(try c.readRawHead().hasPrefix("HTTP/1.1 100"))
        try c.send("hello")
        let continued = try c.readResponse(method: "PUT")
        #expect(continued.status == 200, "\(continued.bodyText)")
        // Over replay_body_limit (64 KiB).
        let large = [UInt8](repeating: 0x61, count: 100_000)
        let refused = try rig.send("PUT", "/signed/\(Self.bucket)/large.txt", body: large)
        #expect(refused.status == 413, "\(refused.bodyText)")
        #expect(refused.bodyText.contains("payload: signed"), "\(refused.bodyText)")
        #expect(refused.bodyText.contains("replay_body_limit"), "\(refused.bodyText)")
        let absent = try rig.send("GET", "/\(Self.bucket)/large.txt")
        #expect(absent.status == 404, "nothing was sent: \(absent.status)")
        // The same body streams on the unsigned route.
        let streamed = try rig.send("PUT", "/\(Self.bucket)/large.txt", body: large)
        #expect(streamed.status == 200, "\(streamed.bodyText)")
    }
}

/// What a signing route sends, seen by a test origin that re-computes each signature with
/// `RequestSigning` from the bytes that arrived (the core itself is checked against botocore and
/// moto elsewhere), and answers as a store would: expired keys (refresh, replay re-signed with
/// the new keys, body included), a skewed clock (resent once at the server's time, no refresh),
/// a signature mismatch (relayed, never replayed).
@Suite("Signing routes: what goes upstream", .serialized)
struct SigningRouteOriginTests {
    struct Crypto: RequestSigning.Crypto {
        func sha256(_ bytes: [UInt8]) -> [UInt8] { Digest.sha256(bytes) }
        func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] { Digest.hmacSHA256(key: key, message: message) }
    }

    /// bearerd with a static-keys aws session in `dir` (keys `AKID1`/`secret-1`) signing for `origin`.
    static func start(origin: UInt16, dir: String, payload: String = "unsigned") throws -> (RunningBearerd, UInt16) {
        try "AKID1".write(toFile: dir + "/ak", atomically: true, encoding: .utf8)
        try "secret-1".write(toFile: dir + "/sk", atomically: true, encoding: .utf8)
        let port = try RunningBearerd.freePort()
        let b = try RunningBearerd(config: """
            listen: 127.0.0.1:\(port)
            sessions:
              keys:
                grant: aws
                region: eu-west-1
                credentials:
                  static:
                    access_key_id_file: \(dir)/ak
                    secret_access_key_file: \(dir)/sk
            routes:
              - match: /
                upstream: http://127.0.0.1:\(origin)
                session: keys
                sign: { service: s3, payload: \(payload) }
            """, dir: dir)
        // Listening (without a request through, which the origin would see).
        let deadline = Date().addingTimeInterval(20)
        while Date() < deadline, (try? TestClient(port: port, timeout: 1)) == nil { Thread.sleep(forTimeInterval: 0.05) }
        return (b, port)
    }

    /// The signature `r` should carry with `key`/`secret` at the time its `X-Amz-Date` says.
    static func verify(_ r: TestOrigin.Request, key: String, secret: String) -> Bool {
        guard let auth = r.head.headers["Authorization"], let date = r.head.headers["X-Amz-Date"],
              let hash = r.head.headers["X-Amz-Content-SHA256"], let t = epoch(date) else { return false }
        let payload: RequestSigning.Payload = hash == "UNSIGNED-PAYLOAD" ? .unsigned : .hashed(hash)
        let fields = r.head.headers.fields.map { (name: $0.name, value: $0.value) }
        guard let host = r.head.headers["Host"],
              let signed = try? RequestSigning.sign(method: r.head.method, target: r.head.target, host: host, headers: fields,
                                                    scheme: .awsV4(region: "eu-west-1", service: "s3"),
                                                    credentials: .init(accessKeyID: key, secretAccessKey: secret, sessionToken: nil),
                                                    payload: payload, epochSeconds: t, crypto: Crypto()).get() else { return false }
        return signed.add.last?.value == auth && signed.target == r.head.target
    }

    /// `YYYYMMDDTHHMMSSZ` → epoch seconds.
    static func epoch(_ s: String) -> Int64? {
        let f = DateFormatter()
        f.locale = Locale(identifier: "en_US_POSIX")
        f.timeZone = TimeZone(identifier: "UTC")
        f.dateFormat = "yyyyMMdd'T'HHmmss'Z'"
        return f.date(from: s).map { Int64($0.timeIntervalSince1970) }
    }

    static func error(_ status: Int, _ code: String, extra: String = "") -> TestOrigin.Reply {
        .response(status: status, headers: [("Content-Type", "application/xml")],
                  body: Array("<?xml version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>\(code)</Code><Message>m</Message>\(extra)</Error>".utf8))
    }

    @Test func theRequestIsSignedAsItArrivesAndCarriesNoToken() throws {
        let dir = try RunningBearerd.tempDir("sign-origin")
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let (b, port) = try Self.start(origin: origin.port, dir: dir)
        defer { _ = b.stop() }
        #expect(b.waitServing(port: port, path: "/warm", seconds: 20) != nil, "\(b.logs)")
        let c = try TestClient(port: port, timeout: 20)
        try c.send("PUT /bucket/a%7eb%20c?z=1&a HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nContent-Length: 5\r\nConnection: close\r\n"
            + "Authorization: Bearer client-own\r\nX-Amz-Date: 20000101T000000Z\r\nx-amz-meta-tag:  two  words \r\n\r\nhello")
        #expect(try c.readResponse(method: "PUT").status == 200)
        let r = try #require(origin.requests.last)
        #expect(r.head.target == "/bucket/a~b%20c?a=&z=1", "the canonically re-encoded target goes upstream")
        #expect(r.head.headers.values("Authorization").count == 1)
        #expect(r.head.headers["Authorization"]?.hasPrefix("AWS4-HMAC-SHA256 Credential=AKID1/") == true, "\(r.head.headers)")
        #expect(r.head.headers["X-Amz-Date"] != "20000101T000000Z")
        #expect(Self.verify(r, key: "AKID1", secret: "secret-1"), "the signature over what arrived: \(r.head.headers)")
        #expect(r.body == Array("hello".utf8))
    }

    /// `payload: signed` from a client that sends its body chunked: hashed, and sent with its
    /// length (object stores refuse chunked uploads without one).
    @Test func aSignedPayloadGoesWithItsHashAndLength() throws {
        let dir = try RunningBearerd.tempDir("sign-origin")
        let origin = try TestOrigin(handler: echoHandler)
        defer { origin.stop() }
        let (b, port) = try Self.start(origin: origin.port, dir: dir, payload: "signed")
        defer { _ = b.stop() }
        #expect(b.waitServing(port: port, path: "/warm", seconds: 20) != nil, "\(b.logs)")
        let c = try TestClient(port: port, timeout: 20)
        try c.send("PUT /bucket/k HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
            + "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        #expect(try c.readResponse(method: "PUT").status == 200)
        let r = try #require(origin.requests.last)
        #expect(r.body == Array("hello world".utf8))
        #expect(r.head.headers["Content-Length"] == "11" && r.head.headers["Transfer-Encoding"] == nil, "\(r.head.headers)")
        #expect(r.head.headers["X-Amz-Content-SHA256"] == RequestSigning.hex(Digest.sha256(Array("hello world".utf8))))
        #expect(Self.verify(r, key: "AKID1", secret: "secret-1"))
    }

    /// Expired keys: the store's 403 ExpiredToken refreshes the session (the key files changed
    /// meanwhile) and the request is replayed once, body included, signed with the new keys.
    @Test func expiredKeysAreRefreshedAndTheReplayIsSignedWithTheNewOnes() throws {
        let dir = try RunningBearerd.tempDir("sign-origin")
        let origin = try TestOrigin { r in
            if r.head.headers["Authorization"]?.contains("Credential=AKID1/") == true {
                // The operator rotated the keys; the store no longer takes the old ones.
                try? "AKID2".write(toFile: dir + "/ak", atomically: true, encoding: .utf8)
                try? "secret-2".write(toFile: dir + "/sk", atomically: true, encoding: .utf8)
                return SigningRouteOriginTests.error(403, "ExpiredToken")
            }
            return .response(status: 200, headers: [], body: Array("stored".utf8))
        }
        defer { origin.stop() }
        let (b, port) = try Self.start(origin: origin.port, dir: dir)
        defer { _ = b.stop() }
        let c = try TestClient(port: port, timeout: 20)
        try c.send("PUT /bucket/k HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nContent-Length: 7\r\nConnection: close\r\n\r\npayload")
        let resp = try c.readResponse(method: "PUT")
        #expect(resp.status == 200, "\(resp.bodyText) \(b.logs)")
        let seen = origin.requests
        #expect(seen.count == 2)
        if seen.count == 2 {
            #expect(Self.verify(seen[0], key: "AKID1", secret: "secret-1"))
            #expect(Self.verify(seen[1], key: "AKID2", secret: "secret-2"), "the replay signed anew with the new keys")
            #expect(seen[1].body == Array("payload".utf8))
        }
        #expect(b.waitLog("replaying rejected request"), "\(b.logs)")
        #expect(!b.logs.contains("secret-1") && !b.logs.contains("secret-2"))
    }

    /// A skewed clock: the store's 403 RequestTimeTooSkewed with its ServerTime is resent once,
    /// signed at the server's time, with the same keys; a second skew answer is relayed.
    @Test func aClockSkewIsResentOnceAtTheServersTime() throws {
        let dir = try RunningBearerd.tempDir("sign-origin")
        let ahead = Date().addingTimeInterval(3 * 3600)
        let serverTime = ISO8601DateFormatter().string(from: ahead)
        let origin = try TestOrigin { r in
            let t = r.head.headers["X-Amz-Date"].flatMap(SigningRouteOriginTests.epoch) ?? 0
            if abs(t - Int64(ahead.timeIntervalSince1970)) > 900 {
                return SigningRouteOriginTests.error(403, "RequestTimeTooSkewed", extra: "<RequestTime>x</RequestTime><ServerTime>\(serverTime)</ServerTime>")
            }
            return .response(status: 200, headers: [], body: Array("in time".utf8))
        }
        defer { origin.stop() }
        let (b, port) = try Self.start(origin: origin.port, dir: dir)
        defer { _ = b.stop() }
        let first = try TestClient(port: port, timeout: 20)
        try first.send("GET /bucket/k HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\nConnection: close\r\n\r\n")
        let r = try first.readResponse()
        #expect(r.status == 200 && r.bodyText == "in time", "\(r.bodyText) \(b.logs)")
        #expect(origin.requests.count == 2)
        #expect(origin.requests.allSatisfy { Self.verify($0, key: "AKID1", secret: "secret-1") })
        #expect(b.waitLog("signing with the server's time"), "\(b.logs)")
        // Later requests are signed at the adopted time from the start.
        let later = try TestClient.get(port: port, path: "/bucket/k2")
        #expect(later.status == 200)
        #expect(origin.requests.count == 3)
    }

    /// A signature mismatch is relayed as it is (status, body) and never replayed.
    @Test func aSignatureMismatchIsRelayedNotReplayed() throws {
        let dir = try RunningBearerd.tempDir("sign-origin")
        let origin = try TestOrigin { _ in
            SigningRouteOriginTests.error(403, "SignatureDoesNotMatch",
                                          extra: "<StringToSign>AWS4-HMAC-SHA256\n20250101T000000Z\nscope\n\(String(repeating: "ab", count: 32))</StringToSign>")
        }
        defer { origin.stop() }
        let (b, port) = try Self.start(origin: origin.port, dir: dir)
        defer { _ = b.stop() }
        let r = try TestClient.get(port: port, path: "/bucket/k")
        #expect(r.status == 403)
        #expect(r.bodyText.contains("<Code>SignatureDoesNotMatch</Code>"))
        #expect(origin.requests.count == 1)
        #expect(b.waitLog("upstream computed another signature"))
        #expect(b.logs.contains("server.canonical_request.sha256=\(String(repeating: "ab", count: 32))") || b.logs.contains(String(repeating: "ab", count: 32)), "\(b.logs)")
    }
}
