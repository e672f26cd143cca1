// libFuzzer entry for the request-signing core (compiled by Tests/Fuzz/run.sh together with
// Sources/BearerdProxyCore/RequestSigning.swift): targets, header values and keys from a client
// bearerd does not trust. Oracle: no crash, no trap, no hang; a signed target holds only
// unreserved bytes and `/ % ? = &`; signing that target again gives the same target and the
// same canonical request (what bearerd sends is what it signed, replays included).

/// A stand-in for OpenSSL's digests: the fuzzer checks structure, not cryptography.
struct MixCrypto: RequestSigning.Crypto {
    func sha256(_ bytes: [UInt8]) -> [UInt8] {
        var h: UInt64 = 0xcbf2_9ce4_8422_2325
        for b in bytes { h = (h ^ UInt64(b)) &* 0x100_0000_01b3 }
        return (0..<32).map { UInt8(truncatingIfNeeded: h >> (UInt64($0 % 8) * 8)) }
    }
    func hmacSHA256(key: [UInt8], message: [UInt8]) -> [UInt8] { sha256(key + [0] + message) }
}

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzSigning(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size >= 2 else { return 0 }
    let control = data[0]
    let bytes = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    // Up to three parts: the target, a header value, the secret.
    let parts = bytes.split(separator: 0x0A, maxSplits: 2, omittingEmptySubsequences: false).map { String(decoding: $0, as: UTF8.self) }
    let target = parts[0]
    let value = parts.count > 1 ? parts[1] : ""
    let secret = parts.count > 2 ? parts[2] : "s"
    let scheme: RequestSigning.Scheme
    switch control % 4 {
    case 0: scheme = .awsV4(region: "us-east-1", service: "s3")
    case 1: scheme = .awsV4(region: "eu-west-1", service: "execute-api")
    case 2: scheme = .ossV4(region: "cn-hangzhou", bucket: "b")
    default: scheme = .ossV4(region: "cn-hangzhou", bucket: nil)
    }
    let payload: RequestSigning.Payload = control & 0x10 == 0 ? .unsigned : .hashed(RequestSigning.Payload.emptyHash)
    let creds = RequestSigning.Credentials(accessKeyID: "AKID", secretAccessKey: secret, sessionToken: control & 0x20 == 0 ? nil : value)
    let headers: [(name: String, value: String)] = [("Content-Type", value), ("X-Amz-Meta-A", value), ("x-oss-meta-a", value), ("Authorization", value)]
    let epoch = Int64(truncatingIfNeeded: bytes.prefix(8).reduce(UInt64(0)) { $0 << 8 | UInt64($1) })
    let crypto = MixCrypto()
    guard case .success(let first) = RequestSigning.sign(method: "PUT", target: target, host: "h", headers: headers, scheme: scheme,
                                                         credentials: creds, payload: payload, epochSeconds: epoch, crypto: crypto) else { return 0 }
    precondition(first.target.utf8.allSatisfy { RequestSigning.isUnreserved($0) || "/%?=&".utf8.contains($0) }, "unencoded byte in the signed target")
    precondition(first.add.last?.name == "Authorization", "Authorization is added last")
    guard case .success(let again) = RequestSigning.sign(method: "PUT", target: first.target, host: "h", headers: headers, scheme: scheme,
                                                         credentials: creds, payload: payload, epochSeconds: epoch, crypto: crypto) else {
        preconditionFailure("the signed target does not sign again")
    }
    precondition(again.target == first.target && again.canonicalRequest == first.canonicalRequest, "signing is not a fixed point")
    return 0
}
