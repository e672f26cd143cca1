import Foundation
import Testing
import BearerdTestSupport

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
        let h2 = try Curl.run(["--http2-prior-knowledge", "-X", "PUT", "--data-binary", "@-", "-H", "Expect: 100-continue",
                               "http://127.0.0.1:\(rig.port)/signed/\(Self.bucket)/signed-h2.txt"], stdin: Data(body))
        #expect(h2.status == 0 && h2.httpVersion == "2", "\(h2.stderr)")
        let back = try Curl.run(["--http2-prior-knowledge", "http://127.0.0.1:\(rig.port)/\(Self.bucket)/signed-h2.txt"])
        #expect(back.body == String(decoding: body, as: UTF8.self))
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
