import Testing
import BearerdHTTP
import BearerdOAuth
import BearerdConfig
import BearerdTLS
@testable import BearerdProxyCore
@testable import BearerdProxy

/// The glue between a signing route and `RequestSigning` (docs/architecture.md §6.15): the plan
/// from the route and its session, and the head that goes upstream.
@Suite struct RequestSignerTests {
    static let sts = EndpointURL(scheme: "https", host: "sts.example", port: 443, path: "")
    static let keys = TemporaryCredentials(accessKeyID: "AKID", secret: OAuthSecret("secret"), sessionToken: OAuthSecret("tok"), expiresAt: nil)

    static func session(_ grant: GrantType, region: String) -> SessionConfig {
        var s = SessionConfig(name: "k", grant: grant, tokenURL: Self.sts, clientID: "")
        s.signing = SigningCredentialsConfig(region: region, stsURL: Self.sts,
                                             source: .staticKeys(.init(accessKeyIDFile: "/a", secretAccessKeyFile: "/b")))
        return s
    }

    static func route(_ host: String, sign: SignConfig?, reject: [Int] = [401]) -> RouteConfig {
        var r = RouteConfig(match: "/", upstream: UpstreamURL(scheme: "https", host: host, port: 443, basePath: ""), session: "k", rejectStatuses: reject)
        r.sign = sign
        return r
    }

    @Test func planFromTheRouteAndItsSession() {
        let aws = RouteSigning.plan(route: Self.route("s3.eu-west-1.amazonaws.com", sign: SignConfig(service: "s3", payload: .unsigned)),
                                    sessions: [Self.session(.aws, region: "eu-west-1")])
        #expect(aws == RouteSigning(scheme: .awsV4(region: "eu-west-1", service: "s3"), payload: .unsignedPayload))
        let bedrock = RouteSigning.plan(route: Self.route("bedrock-runtime.us-east-1.amazonaws.com", sign: SignConfig(service: "bedrock", payload: .unsigned)),
                                        sessions: [Self.session(.aws, region: "us-east-1")])
        #expect(bedrock?.payload == .signedPayload, "UNSIGNED-PAYLOAD exists only for S3 and OSS")
        // OSS: the bucket from a virtual-hosted host, unless configured; path-style without one.
        let hosted = RouteSigning.plan(route: Self.route("photos.oss-cn-hangzhou.aliyuncs.com", sign: SignConfig(service: nil, payload: .signed)),
                                       sessions: [Self.session(.aliyun, region: "cn-hangzhou")])
        #expect(hosted == RouteSigning(scheme: .ossV4(region: "cn-hangzhou", bucket: "photos"), payload: .signedPayload))
        let configured = RouteSigning.plan(route: Self.route("photos.oss-cn-hangzhou.aliyuncs.com", sign: SignConfig(service: nil, bucket: "other", payload: .unsigned)),
                                           sessions: [Self.session(.aliyun, region: "cn-hangzhou")])
        #expect(configured?.scheme == .ossV4(region: "cn-hangzhou", bucket: "other"))
        let pathStyle = RouteSigning.plan(route: Self.route("oss-cn-hangzhou.aliyuncs.com", sign: SignConfig(service: nil, payload: .unsigned)),
                                          sessions: [Self.session(.aliyun, region: "cn-hangzhou")])
        #expect(pathStyle?.scheme == .ossV4(region: "cn-hangzhou", bucket: nil))
        // No sign:, or a token session: no plan.
        #expect(RouteSigning.plan(route: Self.route("x", sign: nil), sessions: [Self.session(.aws, region: "r")]) == nil)
        #expect(RouteSigning.plan(route: Self.route("x", sign: SignConfig(service: "s3", payload: .unsigned)),
                                  sessions: [SessionConfig(name: "k", grant: .clientCredentials, tokenURL: Self.sts, clientID: "c")]) == nil)
    }

    @Test func ossBucketOnlyFromThatShape() {
        #expect(RouteSigning.ossBucket(fromHost: "my-bucket.oss-cn-hangzhou.aliyuncs.com") == "my-bucket")
        #expect(RouteSigning.ossBucket(fromHost: "My-Bucket.OSS-cn-hangzhou.Aliyuncs.com") == "my-bucket")
        #expect(RouteSigning.ossBucket(fromHost: "b12.oss-cn-hangzhou-internal.aliyuncs.com") == "b12")
        for host in ["oss-cn-hangzhou.aliyuncs.com", "a.b.oss-cn-hangzhou.aliyuncs.com", "bucket.s3.amazonaws.com", "bu_ck.oss-x.aliyuncs.com",
                     "ab.oss-x.aliyuncs.com", "bucket.oss-.aliyuncs.com", "bucket.oss-x.aliyuncs.com.evil", "127.0.0.1", ""] {
            #expect(RouteSigning.ossBucket(fromHost: host) == nil, "\(host)")
        }
    }

    @Test func onSigningRoutes401400And403AreNoTokenRejections() {
        let plan = RouteSigning(scheme: .awsV4(region: "r", service: "s3"), payload: .unsignedPayload)
        let r = Self.route("x", sign: SignConfig(service: "s3", payload: .unsigned), reject: [401, 403, 409])
        #expect(RouteSigning.rejectSet(route: r, signing: plan) == StatusCodeSet([409]))
        #expect(RouteSigning.rejectSet(route: r, signing: nil) == StatusCodeSet([401, 403, 409]))
    }

    @Test func theSignedHeadReplacesTheClientsCredentialsAndKeepsTheHost() throws {
        let head = HTTPRequestHead(method: "PUT", target: "/b/a%7eb%20c?z=1&a", headers: HTTPHeaders([
            ("Host", "bucket.s3.amazonaws.com"), ("Authorization", "Bearer client"), ("x-amz-date", "20000101T000000Z"),
            ("X-Amz-Security-Token", "client-token"), ("Content-Type", "text/plain"), ("X-Forwarded-For", "1.2.3.4")]))
        let plan = RouteSigning(scheme: .awsV4(region: "us-east-1", service: "s3"), payload: .unsignedPayload)
        guard case .signed(let p) = RequestSigner.sign(head, authority: "ignored", plan: plan, keys: Self.keys, payloadHash: nil,
                                                        epochSeconds: 1_440_938_160) else {
            Issue.record("not signed")
            return
        }
        #expect(p.head.target == "/b/a~b%20c?a=&z=1")
        #expect(p.head.headers["Host"] == "bucket.s3.amazonaws.com")
        #expect(p.head.headers.values("Authorization").isEmpty, "set as the head is written")
        #expect(p.authorization?.value.hasPrefix("AWS4-HMAC-SHA256 Credential=AKID/20150830/us-east-1/s3/aws4_request") == true)
        #expect(p.head.headers.values("X-Amz-Date") == ["20150830T123600Z"])
        #expect(p.head.headers.values("X-Amz-Security-Token") == ["tok"])
        #expect(p.head.headers["X-Amz-Content-SHA256"] == "UNSIGNED-PAYLOAD")
        #expect(p.head.headers["X-Forwarded-For"] == "1.2.3.4")
        // The same signature as the core's over the same request, and its canonical request's hash.
        let core = try RequestSigning.sign(method: "PUT", target: head.target, host: "bucket.s3.amazonaws.com",
                                           headers: head.headers.fields.map { (name: $0.name, value: $0.value) },
                                           scheme: plan.scheme, credentials: .init(accessKeyID: "AKID", secretAccessKey: "secret", sessionToken: "tok"),
                                           payload: .unsigned, epochSeconds: 1_440_938_160, crypto: OpenSSLSigningCrypto()).get()
        #expect(p.authorization?.value == core.add.last?.value)
        #expect(String(p.canonicalRequestHash) == RequestSigning.hex(Digest.sha256(Array(core.canonicalRequest.utf8))))
    }

    @Test func refusalsAreOutcomesNotTraps() {
        let plan = RouteSigning(scheme: .awsV4(region: "us-east-1", service: "s3"), payload: .signedPayload)
        let bad = HTTPRequestHead(method: "GET", target: "/b/bad%zz", headers: HTTPHeaders([("Host", "h")]))
        guard case .failed(.invalidTarget, let detail) = RequestSigner.sign(bad, authority: "h", plan: plan, keys: Self.keys, payloadHash: nil, epochSeconds: 0) else {
            Issue.record("a bad escape must be refused")
            return
        }
        #expect(detail.contains("%"))
        let ok = HTTPRequestHead(method: "GET", target: "/b/k", headers: HTTPHeaders([("Host", "h")]))
        guard case .failed(.noKeys, _) = RequestSigner.sign(ok, authority: "h", plan: plan, keys: nil, payloadHash: nil, epochSeconds: 0) else {
            Issue.record("no keys")
            return
        }
        // payload: signed without a body hashes the empty string.
        guard case .signed(let p) = RequestSigner.sign(ok, authority: "h", plan: plan, keys: Self.keys, payloadHash: nil, epochSeconds: 0) else {
            Issue.record("not signed")
            return
        }
        #expect(p.head.headers["X-Amz-Content-SHA256"] == RequestSigning.Payload.emptyHash)
        #expect(RequestSigner.payloadHash([]) == RequestSigning.Payload.emptyHash)
        #expect(RequestSigner.payloadHash(Array("abc".utf8)) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
    }
}
