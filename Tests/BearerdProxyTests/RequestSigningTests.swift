import Testing
import BearerdProxyCore
import BearerdTLS
@testable import BearerdProxyCore

/// OpenSSL's SHA-256 and HMAC behind the pure signer.
struct OpenSSLCrypto: RequestSigning.Crypto {
    func sha256(_ bytes: [UInt8]) -> [UInt8] { Digest.sha256(bytes) }
    func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] { Digest.hmacSHA256(key: key, message: message) }
}

/// The signatures are the reference signers' own: botocore's `SigV4Auth`/`S3SigV4Auth` and
/// alibabacloud-oss-v2's `SignerV4`, run on the same request at the same time (the values were
/// computed with botocore 1.43 and alibabacloud-oss-v2 1.4.1; the first is the AWS SigV4 test
/// suite's `get-vanilla`).
@Suite struct RequestSigningTests {
    static let crypto = OpenSSLCrypto()
    static let t2015: Int64 = 1_440_938_160  // 2015-08-30T12:36:00Z
    static let t2023: Int64 = 1_701_605_532  // 2023-12-03T12:12:12Z

    static func sign(_ method: String, _ target: String, host: String, headers: [(String, String)] = [], _ scheme: RequestSigning.Scheme,
                     _ creds: RequestSigning.Credentials, payload: RequestSigning.Payload, at t: Int64) throws -> RequestSigning.Signed {
        try RequestSigning.sign(method: method, target: target, host: host, headers: headers.map { (name: $0.0, value: $0.1) },
                                scheme: scheme, credentials: creds, payload: payload, epochSeconds: t, crypto: crypto).get()
    }

    static func field(_ s: RequestSigning.Signed, _ name: String) -> String? {
        s.add.first { $0.name.lowercased() == name.lowercased() }?.value
    }

    /// Dot segments that only decoding reveals are refused (sent decoded, `x/../y` would climb out
    /// of the route's base path at a normalising server): an encoded dot segment for any service,
    /// and `..` between encoded slashes of an S3 or OSS key. Dots inside names are fine.
    @Test func dotSegmentsRevealedByDecodingAreRefused() {
        let creds = RequestSigning.Credentials(accessKeyID: "AKID", secretAccessKey: "s", sessionToken: nil)
        let s3 = RequestSigning.Scheme.awsV4(region: "us-east-1", service: "s3")
        let api = RequestSigning.Scheme.awsV4(region: "us-east-1", service: "execute-api")
        let oss = RequestSigning.Scheme.ossV4(region: "cn-hangzhou", bucket: "b")
        func outcome(_ target: String, _ scheme: RequestSigning.Scheme) -> RequestSigning.Failure? {
            let payload: RequestSigning.Payload = scheme == api ? .hashed(RequestSigning.Payload.emptyHash) : .unsigned
            if case .failure(let f) = RequestSigning.sign(method: "GET", target: target, host: "h", headers: [], scheme: scheme, credentials: creds,
                                                          payload: payload, epochSeconds: Self.t2015, crypto: Self.crypto) { return f }
            return nil
        }
        for scheme in [s3, api, oss] {
            #expect(outcome("/a/%2E%2E/b", scheme) == .dotSegment)
            #expect(outcome("/a/%2e/b", scheme) == .dotSegment)
            #expect(outcome("/a/..b/c.d/...", scheme) == nil, "dots inside names")
        }
        for scheme in [s3, oss] {
            #expect(outcome("/x%2F..%2Fy", scheme) == .dotSegment)
            #expect(outcome("/x%2F.", scheme) == .dotSegment)
        }
        #expect(outcome("/x%2F..%2Fy", api) == nil, "one segment named x/../y, its slashes stay encoded")
    }

    @Test func digestsAreOpenSSLs() {
        #expect(RequestSigning.hex(Digest.sha256([])) == RequestSigning.Payload.emptyHash)
        // RFC 4231 test case 2.
        #expect(RequestSigning.hex(Digest.hmacSHA256(key: Array("Jefe".utf8), message: Array("what do ya want for nothing?".utf8)))
                == "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843")
    }

    @Test func getVanillaFromTheAWSSuite() throws {
        let s = try Self.sign("GET", "/", host: "example.amazonaws.com", .awsV4(region: "us-east-1", service: "service"),
                              .init(accessKeyID: "AKIDEXAMPLE", secretAccessKey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", sessionToken: nil),
                              payload: .hashed(RequestSigning.Payload.emptyHash), at: Self.t2015)
        #expect(Self.field(s, "X-Amz-Date") == "20150830T123600Z")
        #expect(Self.field(s, "Authorization") == "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31")
        #expect(Self.field(s, "X-Amz-Content-SHA256") == nil, "only S3 carries the payload hash as a field")
    }

    /// A client's own spelling (`%7e`, lower-case hex, `+`, `=`, `%`, UTF-8, a key without `=`)
    /// is re-encoded to what is signed and sent; botocore signed the re-encoded URL.
    @Test func s3KeysWithReservedAndUnicodeCharacters() throws {
        let s = try Self.sign("PUT", "/dir/my%20key%7e+=%25%c3%bc.txt?prefix=a%20b&acl&list-type=2", host: "bucket.s3.us-east-1.amazonaws.com",
                              headers: [("Content-Type", "text/plain"), ("Authorization", "Bearer client"), ("X-Amz-Date", "19990101T000000Z")],
                              .awsV4(region: "us-east-1", service: "s3"),
                              .init(accessKeyID: "ASIAEXAMPLE", secretAccessKey: "secret/key+x", sessionToken: "FwoGZXIvYXdzEXAMPLE//token=="),
                              payload: .hashed("2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"), at: Self.t2015)
        #expect(s.target == "/dir/my%20key~%2B%3D%25%C3%BC.txt?acl=&list-type=2&prefix=a%20b")
        #expect(s.remove.contains("authorization") && s.remove.contains("x-amz-date"))
        #expect(Self.field(s, "X-Amz-Security-Token") == "FwoGZXIvYXdzEXAMPLE//token==")
        #expect(Self.field(s, "Authorization") == "AWS4-HMAC-SHA256 Credential=ASIAEXAMPLE/20150830/us-east-1/s3/aws4_request, SignedHeaders=content-type;host;x-amz-content-sha256;x-amz-date;x-amz-security-token, Signature=224d3633a5a2d1a72402b1ca8b3eff141db85dae2868a629fec9330aa615d5b6")
    }

    /// An encoded `/` inside a key: S3 and OSS name the object by its decoded key (a `/`), so it
    /// is sent and signed as `/`; services routed by path keep `%2F` inside one segment.
    @Test func anEncodedSlashIsAKeySlashForObjectStoresOnly() throws {
        let creds = RequestSigning.Credentials(accessKeyID: "A", secretAccessKey: "S", sessionToken: nil)
        let s3 = try Self.sign("GET", "/dir%2Fsub/x", host: "b.s3.amazonaws.com", .awsV4(region: "r", service: "s3"), creds, payload: .unsigned, at: 0)
        #expect(s3.target == "/dir/sub/x")
        let oss = try Self.sign("GET", "/dir%2fsub/x", host: "b.oss-r.aliyuncs.com", .ossV4(region: "r", bucket: "b"), creds, payload: .unsigned, at: 0)
        #expect(oss.target == "/dir/sub/x")
        let api = try Self.sign("GET", "/dir%2fsub/x", host: "api", .awsV4(region: "r", service: "execute-api"), creds,
                                payload: .hashed(RequestSigning.Payload.emptyHash), at: 0)
        #expect(api.target == "/dir%2Fsub/x")
    }

    @Test func s3UnsignedPayload() throws {
        let s = try Self.sign("PUT", "/k?uploads", host: "bucket.s3.us-east-1.amazonaws.com", .awsV4(region: "us-east-1", service: "s3"),
                              .init(accessKeyID: "AK", secretAccessKey: "SK", sessionToken: "TOK"), payload: .unsigned, at: Self.t2015)
        #expect(Self.field(s, "X-Amz-Content-SHA256") == "UNSIGNED-PAYLOAD")
        #expect(Self.field(s, "Authorization") == "AWS4-HMAC-SHA256 Credential=AK/20150830/us-east-1/s3/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token, Signature=e024cec8eef4ef275e29b502a0b136843479d6aaadae2a8b6da8ccdcb4c4d88b")
    }

    /// Services other than S3: dot segments removed and the path encoded twice; white space in
    /// a signed value trimmed and collapsed; repeated query keys sorted by value.
    @Test func otherServicesNormaliseAndDoubleEncodeThePath() throws {
        let s = try Self.sign("GET", "/prod/a%20b/./c/../d%2Fe?b=2&a=1&a=0", host: "execute-api.eu-west-1.amazonaws.com",
                              headers: [("X-Amz-Meta-Thing", "  two   spaces  "), ("Accept", "*/*")], .awsV4(region: "eu-west-1", service: "execute-api"),
                              .init(accessKeyID: "AKID", secretAccessKey: "SK", sessionToken: nil), payload: .hashed(RequestSigning.Payload.emptyHash), at: Self.t2015)
        #expect(s.canonicalRequest.split(separator: "\n", omittingEmptySubsequences: false)[1] == "/prod/a%2520b/d%252Fe")
        #expect(Self.field(s, "Authorization") == "AWS4-HMAC-SHA256 Credential=AKID/20150830/eu-west-1/execute-api/aws4_request, SignedHeaders=host;x-amz-date;x-amz-meta-thing, Signature=02d1283df79e2e401ea30fca5b2e5be0883df488c66492903f93d3cf1a415373")
    }

    @Test func ossV4VirtualHostedWithSessionToken() throws {
        let s = try Self.sign("PUT", "/dir/my%20key~%2B%3D%25%C3%BC.txt?acl&prefix=a%20b", host: "bucket.oss-cn-hangzhou.aliyuncs.com",
                              headers: [("Content-Type", "text/plain"), ("x-oss-meta-a", "v"), ("x-oss-security-token", "client's")],
                              .ossV4(region: "cn-hangzhou", bucket: "bucket"),
                              .init(accessKeyID: "STS.AKID", secretAccessKey: "sec/ret+", sessionToken: "CAIS-token=="), payload: .unsigned, at: Self.t2023)
        #expect(s.target == "/dir/my%20key~%2B%3D%25%C3%BC.txt?acl&prefix=a%20b")
        #expect(Self.field(s, "x-oss-security-token") == "CAIS-token==")
        #expect(Self.field(s, "Authorization") == "OSS4-HMAC-SHA256 Credential=STS.AKID/20231203/cn-hangzhou/oss/aliyun_v4_request,Signature=3df7f3b0ae2c9715ff4a5102ee5ad0615c3a619f90903b7eef6627fede7814da")
    }

    @Test func ossV4ServiceLevel() throws {
        let s = try Self.sign("GET", "/", host: "oss-cn-hangzhou.aliyuncs.com", .ossV4(region: "cn-hangzhou", bucket: nil),
                              .init(accessKeyID: "LTAI", secretAccessKey: "s", sessionToken: nil), payload: .unsigned, at: Self.t2023)
        #expect(Self.field(s, "Authorization") == "OSS4-HMAC-SHA256 Credential=LTAI/20231203/cn-hangzhou/oss/aliyun_v4_request,Signature=86d1359521a071d939c03b8399543c2d591b491b27925eec77f21a8bcd6c6163")
    }

    @Test func refusals() {
        let creds = RequestSigning.Credentials(accessKeyID: "A", secretAccessKey: "S", sessionToken: nil)
        func fail(_ target: String, _ scheme: RequestSigning.Scheme = .awsV4(region: "r", service: "s3"), _ payload: RequestSigning.Payload = .unsigned) -> RequestSigning.Failure? {
            if case .failure(let f) = RequestSigning.sign(method: "GET", target: target, host: "h", headers: [], scheme: scheme, credentials: creds,
                                                          payload: payload, epochSeconds: 0, crypto: Self.crypto) { return f }
            return nil
        }
        #expect(fail("/a%zz") == .invalidPercentEncoding(offset: 2))
        #expect(fail("/a%2") == .invalidPercentEncoding(offset: 2))
        #expect(fail("/ok?x=%") != nil)
        #expect(fail("http://h/x") == .targetNotOriginForm)
        #expect(fail("*") == .targetNotOriginForm)
        #expect(fail("/x", .awsV4(region: "r", service: "sts")) == .payloadMustBeSigned(service: "sts"))
        // A bare `?` (or one with only `&`) is no query: sent without it (found by the fuzzer).
        for target in ["/x?", "/x?&", "/x?&&"] {
            let s = try? RequestSigning.sign(method: "GET", target: target, host: "h", headers: [], scheme: .ossV4(region: "r", bucket: "b"),
                                             credentials: creds, payload: .unsigned, epochSeconds: 0, crypto: Self.crypto).get()
            #expect(s?.target == "/x", "\(target)")
        }
        #expect(fail("/x", .awsV4(region: "r", service: "sts"), .hashed(RequestSigning.Payload.emptyHash)) == nil)
        #expect("\(creds)".contains("<redacted>") && !"\(creds)".contains("\"S\""))
    }

    @Test func signingTimeCoversTheCalendar() {
        #expect(SigningTime.iso8601Basic(epochSeconds: 0) == "19700101T000000Z")
        #expect(SigningTime.iso8601Basic(epochSeconds: Self.t2015) == "20150830T123600Z")
        #expect(SigningTime.iso8601Basic(epochSeconds: 951_782_400) == "20000229T000000Z")
        #expect(SigningTime.iso8601Basic(epochSeconds: 4_102_444_799) == "20991231T235959Z")
        #expect(SigningTime.iso8601Basic(epochSeconds: 4_107_542_399) == "21000228T235959Z")
        #expect(SigningTime.iso8601Basic(epochSeconds: -1) == "19691231T235959Z")
        #expect(SigningTime.iso8601Basic(epochSeconds: .max) == "99991231T235959Z")
        #expect(SigningTime.iso8601Basic(epochSeconds: .min) == "00000101T000000Z")
    }

    /// Signing is a fixed point on its own output (what bearerd sends is already canonical, so a
    /// replay signs the same target), and any byte string in a path or query either signs or is
    /// refused as bad percent-encoding: never a trap. Deterministic pseudo-random inputs.
    @Test func reencodingIsAFixedPointAndNeverTraps() {
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        func next() -> UInt64 { state = state &* 6364136223846793005 &+ 1442695040888963407; return state >> 33 }
        let alphabet = Array("aZ09-._~!$&'()*+,;=:@/%?#[] \u{7f}é".unicodeScalars.map(String.init).joined().utf8) + [0x25, 0x32, 0x46, 0x25, 0x7E]
        let creds = RequestSigning.Credentials(accessKeyID: "A", secretAccessKey: "S", sessionToken: "T")
        var signed = 0
        for _ in 0..<3_000 {
            let n = Int(next() % 40)
            var bytes: [UInt8] = [UInt8(ascii: "/")]
            for _ in 0..<n { bytes.append(alphabet[Int(next() % UInt64(alphabet.count))]) }
            let target = String(decoding: bytes, as: UTF8.self)
            for scheme in [RequestSigning.Scheme.awsV4(region: "r", service: "s3"), .awsV4(region: "r", service: "execute-api"), .ossV4(region: "r", bucket: "b")] {
                let payload: RequestSigning.Payload = scheme == .awsV4(region: "r", service: "execute-api") ? .hashed(RequestSigning.Payload.emptyHash) : .unsigned
                guard case .success(let first) = RequestSigning.sign(method: "GET", target: target, host: "h", headers: [], scheme: scheme,
                                                                     credentials: creds, payload: payload, epochSeconds: 0, crypto: Self.crypto) else { continue }
                signed += 1
                let again = RequestSigning.sign(method: "GET", target: first.target, host: "h", headers: [], scheme: scheme,
                                                credentials: creds, payload: payload, epochSeconds: 0, crypto: Self.crypto)
                #expect((try? again.get())?.target == first.target, "\(target)")
                #expect((try? again.get())?.canonicalRequest == first.canonicalRequest, "\(target)")
                #expect(first.target.utf8.allSatisfy { RequestSigning.isUnreserved($0) || "/%?=&".utf8.contains($0) }, "\(first.target)")
            }
        }
        #expect(signed > 2_000, "most inputs sign (\(signed))")
    }
}
