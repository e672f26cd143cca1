import Testing
import BearerdProxyCore
@testable import BearerdSessions

/// The shell's signer crypto keeps signing keys: signatures are the same as those derived from
/// scratch (the botocore-checked vector of `RequestSigningTests`), and a key is reused only for
/// its own secret, day and scope.
@Suite struct SigningCryptoTests {
    static let creds = RequestSigning.Credentials(accessKeyID: "AKIDEXAMPLE", secretAccessKey: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", sessionToken: nil)

    static func authorization(_ crypto: some RequestSigning.Crypto, at t: Int64, secret: String = creds.secretAccessKey,
                              _ scheme: RequestSigning.Scheme = .awsV4(region: "us-east-1", service: "service")) throws -> String? {
        var c = creds
        c.secretAccessKey = secret
        let s = try RequestSigning.sign(method: "GET", target: "/", host: "example.amazonaws.com", headers: [], scheme: scheme,
                                        credentials: c, payload: .hashed(RequestSigning.Payload.emptyHash), epochSeconds: t, crypto: crypto).get()
        return s.add.first { $0.name == "Authorization" }?.value
    }

    @Test func cachedKeysSignAsDerivedOnes() throws {
        let crypto = SigningCrypto()
        let t = RequestSigningTests.t2015
        let vector = "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20150830/us-east-1/service/aws4_request, SignedHeaders=host;x-amz-date, Signature=5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31"
        #expect(try Self.authorization(crypto, at: t) == vector)
        #expect(try Self.authorization(crypto, at: t + 60) == Self.authorization(OpenSSLCrypto(), at: t + 60), "same day: the kept key")
        #expect(crypto.cachedKeys == 1)
        // Another day, another secret, another scope: each its own key, each as derived afresh.
        for (at, secret, scheme) in [(t + 86_400, Self.creds.secretAccessKey, RequestSigning.Scheme.awsV4(region: "us-east-1", service: "service")),
                                     (t, "another-secret", .awsV4(region: "us-east-1", service: "service")),
                                     (t, Self.creds.secretAccessKey, .ossV4(region: "cn-hangzhou", bucket: "b"))] {
            #expect(try Self.authorization(crypto, at: at, secret: secret, scheme) == Self.authorization(OpenSSLCrypto(), at: at, secret: secret, scheme))
        }
        #expect(crypto.cachedKeys == 4)
        #expect(try Self.authorization(crypto, at: t) == vector, "the first key is still right after others were added")
    }

    @Test func theCacheIsBoundedAndMatchesExactly() {
        var cache = RequestSigning.SigningKeyCache(capacity: 2)
        cache.insert([1], secret: "s", prefix: "AWS4", date: "20250101", scope: ["r", "s3", "aws4_request"])
        cache.insert([2], secret: "s", prefix: "AWS4", date: "20250102", scope: ["r", "s3", "aws4_request"])
        #expect(cache.key(secret: "s", prefix: "AWS4", date: "20250101", scope: ["r", "s3", "aws4_request"]) == [1])
        #expect(cache.key(secret: "s2", prefix: "AWS4", date: "20250101", scope: ["r", "s3", "aws4_request"]) == nil)
        #expect(cache.key(secret: "s", prefix: "aliyun_v4", date: "20250101", scope: ["r", "s3", "aws4_request"]) == nil)
        #expect(cache.key(secret: "s", prefix: "AWS4", date: "20250101", scope: ["r", "sts", "aws4_request"]) == nil)
        cache.insert([3], secret: "s", prefix: "AWS4", date: "20250103", scope: ["r", "s3", "aws4_request"])
        #expect(cache.count == 2)
        #expect(cache.key(secret: "s", prefix: "AWS4", date: "20250101", scope: ["r", "s3", "aws4_request"]) == nil, "the oldest went first")
        #expect(cache.key(secret: "s", prefix: "AWS4", date: "20250103", scope: ["r", "s3", "aws4_request"]) == [3])
    }
}
