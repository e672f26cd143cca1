// libFuzzer entry for the signing-credentials codec (compiled by Tests/Fuzz/run.sh together with
// Sources/BearerdOAuth): the XML reader and the AWS STS answers, the JSON shapes of vending
// endpoints, credential_process and Alibaba STS, and RFC 3339 timestamps. Oracle: no crash, no
// trap, no hang; and every accepted set of credentials keeps the codec's invariants (non-empty
// visible ASCII fields, a description that shows neither the secret nor the token).

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzCredentials(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
    guard size >= 1 else { return 0 }
    let control = data[0]
    let bytes = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
    var decoded: TemporaryCredentials? = nil
    switch control % 8 {
    case 0:
        _ = try? SimpleXML.Reader().parse(bytes)
    case 1:
        decoded = try? TemporaryCredentials.fromSTSXML(bytes, action: control & 0x80 == 0 ? .assumeRoleWithWebIdentity : .assumeRole,
                                                       redacting: [OAuthSecret("eyJhbGciOiJSUzI1NiJ9")])
        if let error = TemporaryCredentials.stsError(bytes), let message = error.message {
            check(message.utf8.count <= 256 && message.utf8.allSatisfy { $0 >= 0x20 && $0 < 0x7F })
        }
    case 2: decoded = try? TemporaryCredentials.fromContainerCredentialsJSON(bytes)
    case 3: decoded = try? TemporaryCredentials.fromAliyunVendingJSON(bytes)
    case 4: decoded = try? TemporaryCredentials.fromCredentialProcessJSON(bytes)
    case 5: decoded = try? TemporaryCredentials.fromAliyunSTSJSON(bytes)
    case 6: decoded = try? TemporaryCredentials.fromVendingURLJSON(bytes)
    default:
        let text = String(decoding: bytes, as: UTF8.self)
        // Inside 0000-01-01…9999-12-31 (`format` clamps beyond, where an offset can carry an instant).
        if let seconds = try? ISO8601Timestamp.parse(text), seconds >= -62_167_219_200, seconds <= 253_402_300_799 {
            // A parsed instant formats and parses back to itself (fractions and offsets folded).
            check((try? ISO8601Timestamp.parse(ISO8601Timestamp.format(seconds))) == seconds)
        }
        _ = ISO8601Timestamp.format(Int64(truncatingIfNeeded: UInt64(bytes.prefix(8).reduce(0) { $0 << 8 | UInt64($1) })))
    }
    if let decoded {
        for field in [decoded.accessKeyID, decoded.secret.exposedValue, decoded.sessionToken?.exposedValue ?? "x"] {
            check(!field.isEmpty && field.utf8.allSatisfy { $0 >= 0x21 && $0 <= 0x7E })
        }
        // The description depends on neither the secret nor the token (a substring test would
        // misfire on a secret like `sec`, which the word `secret` contains).
        let other = TemporaryCredentials(accessKeyID: decoded.accessKeyID, secret: OAuthSecret("x"),
                                         sessionToken: decoded.sessionToken == nil ? nil : OAuthSecret("y"), expiresAt: decoded.expiresAt)
        check(other.description == decoded.description)
    }
    return 0
}

extension TemporaryCredentials {
    /// The STS error an XML answer carries, if it is one.
    static func stsError(_ bytes: [UInt8]) -> CredentialsError? {
        do { _ = try fromSTSXML(bytes, action: .assumeRole); return nil } catch { return error.reason.hasPrefix("sts.") ? error : nil }
    }
}

func check(_ condition: Bool) {
    if !condition { fatalError("credentials fuzz: invariant violated") }
}
