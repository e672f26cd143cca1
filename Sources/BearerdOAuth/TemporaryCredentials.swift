/// Signing keys for a signing session (`grant: aws`, `grant: aliyun`): an access key id, its
/// secret, an optional session token and the moment they stop working.
///
/// Owns plain values only. Invariants (every decoder below guarantees them): `accessKeyID`,
/// `secret` and `sessionToken` are non-empty visible ASCII (0x21–0x7E), because they go into
/// header fields and signatures; `accessKeyID` is at most 128 bytes (AWS's documented maximum).
/// `expiresAt` is Unix seconds; nil means long-term keys (a `credential_process` without
/// `Expiration`). `description` never shows the secret or the token, and the key id only as a
/// fingerprint.
public struct TemporaryCredentials: Sendable, Equatable, CustomStringConvertible, CustomDebugStringConvertible {
    public var accessKeyID: String
    public var secret: OAuthSecret
    public var sessionToken: OAuthSecret?
    /// Unix seconds; nil for keys that do not expire.
    public var expiresAt: Int64?

    public init(accessKeyID: String, secret: OAuthSecret, sessionToken: OAuthSecret?, expiresAt: Int64?) {
        self.accessKeyID = accessKeyID
        self.secret = secret
        self.sessionToken = sessionToken
        self.expiresAt = expiresAt
    }

    public var description: String {
        "TemporaryCredentials(key: \(BearerdOAuth.fingerprint(accessKeyID)), secret: <redacted>, sessionToken: "
            + (sessionToken == nil ? "none" : "<redacted>") + ", expiresAt: " + (expiresAt.map { String($0) } ?? "never") + ")"
    }
    public var debugDescription: String { description }

    /// Largest document any source may answer with; a larger one is refused before parsing.
    public static let maxDocumentBytes = 64 * 1024
    /// AWS documents access key ids of 16–128 characters; Alibaba's are shorter.
    public static let maxAccessKeyIDBytes = 128
}

/// Why a credentials answer was refused, or the STS error it carried.
///
/// `reason` is a stable dotted string: `credentials.*` for a document bearerd cannot use,
/// `sts.<Code>` for an error the STS answered with (`sts.InvalidIdentityToken`,
/// `sts.AuthenticationFail.OIDCToken.Expired`). `code` and `message` are the server's, made
/// log-safe: printable ASCII, bounded, with the secrets that were sent and token-like runs cut.
public struct CredentialsError: Error, Sendable, Equatable, CustomStringConvertible {
    public var reason: String
    /// The field concerned (`AccessKeyId`, `Expiration`, …), when there is one.
    public var field: String?
    /// The server's error code (sanitised), for `sts.*` reasons.
    public var code: String?
    /// A human explanation: the server's message (sanitised) or what was wrong locally.
    public var message: String?

    public init(reason: String, field: String? = nil, code: String? = nil, message: String? = nil) {
        self.reason = reason
        self.field = field
        self.code = code
        self.message = message
    }

    public var description: String {
        var text = reason
        if let field { text += " (" + field + ")" }
        if let message { text += ": " + message }
        return text
    }
}

// MARK: - Decoders

extension TemporaryCredentials {
    /// The container-credentials endpoint's JSON (ECS/EKS Pod Identity, `AWS_CONTAINER_CREDENTIALS_FULL_URI`):
    /// `AccessKeyId`, `SecretAccessKey`, `Token`, `Expiration`, all required as botocore's
    /// `ContainerProvider` requires them. Other members (`RoleArn`, `AccountId`, `Code`) are ignored.
    public static func fromContainerCredentialsJSON(_ bytes: [UInt8]) throws(CredentialsError) -> TemporaryCredentials {
        try fromContainerObject(try jsonObject(bytes))
    }

    /// A token vending server's JSON for Alibaba Cloud: the seed's `accessKeyId`, `accessKeySecret`,
    /// `securityToken`, `expiration`, or the same names capitalised (`AccessKeyId`, …) as Alibaba's
    /// credentials URI provider reads them. All four are required; mixing both spellings is refused.
    public static func fromAliyunVendingJSON(_ bytes: [UInt8]) throws(CredentialsError) -> TemporaryCredentials {
        try fromAliyunVendingObject(try jsonObject(bytes))
    }

    /// AWS `credential_process` output: `Version` must be the number 1; `AccessKeyId` and
    /// `SecretAccessKey` required; `SessionToken` optional; `Expiration` optional (absent or null:
    /// long-term keys that are never refreshed), as botocore's `ProcessProvider` reads it.
    public static func fromCredentialProcessJSON(_ bytes: [UInt8]) throws(CredentialsError) -> TemporaryCredentials {
        let object = try jsonObject(bytes)
        guard let version = object["Version"], version != .null else {
            throw CredentialsError(reason: "credentials.wrong_version", field: "Version", message: "Version missing; only 1 is supported")
        }
        guard version.int64Value == 1 else {
            throw CredentialsError(reason: "credentials.wrong_version", field: "Version", message: "only Version 1 is supported")
        }
        return try validated(keyID: try string(object, "AccessKeyId", required: true),
                             secret: try string(object, "SecretAccessKey", required: true),
                             token: try string(object, "SessionToken", required: false),
                             expiration: try string(object, "Expiration", required: false))
    }

    /// Alibaba Cloud STS `AssumeRoleWithOIDC` (Format=JSON): `{"Credentials": {"AccessKeyId",
    /// "AccessKeySecret", "SecurityToken", "Expiration"}, "RequestId", …}`; the error shape
    /// `{"Code", "Message", "RequestId", …}` becomes `sts.<Code>`. `redacting`: secrets the
    /// request carried (the OIDC token), cut from an echoed message.
    public static func fromAliyunSTSJSON(_ bytes: [UInt8], redacting: [OAuthSecret] = []) throws(CredentialsError) -> TemporaryCredentials {
        let object = try jsonObject(bytes)
        if let credentials = object["Credentials"] {
            guard let inner = credentials.objectValue else {
                throw CredentialsError(reason: "credentials.invalid_field", field: "Credentials", message: "not an object")
            }
            return try validated(keyID: try string(inner, "AccessKeyId", required: true),
                                 secret: try string(inner, "AccessKeySecret", required: true),
                                 token: try string(inner, "SecurityToken", required: true),
                                 expiration: try string(inner, "Expiration", required: true))
        }
        if let error = serviceError(object, redacting: redacting) { throw error }
        throw CredentialsError(reason: "credentials.missing_field", field: "Credentials")
    }

    /// The AWS STS action whose XML answer is expected.
    public enum STSAction: String, Sendable, Equatable {
        case assumeRoleWithWebIdentity = "AssumeRoleWithWebIdentity"
        case assumeRole = "AssumeRole"
    }

    /// AWS STS XML (query API, version 2011-06-15): `<ActionResponse><ActionResult><Credentials>`
    /// with `AccessKeyId`, `SecretAccessKey`, `SessionToken`, `Expiration` (each exactly once);
    /// or `<ErrorResponse><Error><Type/><Code/><Message/></Error>`, which becomes `sts.<Code>`.
    /// Namespaces are ignored; the root must name `action`.
    public static func fromSTSXML(_ bytes: [UInt8], action: STSAction, redacting: [OAuthSecret] = []) throws(CredentialsError) -> TemporaryCredentials {
        guard bytes.count <= maxDocumentBytes else { throw tooLarge() }
        let root: SimpleXML.Element
        do { root = try SimpleXML.Reader(maxBytes: maxDocumentBytes).parse(bytes) } catch {
            throw CredentialsError(reason: "credentials.malformed_xml", message: error.description)
        }
        if root.name == "ErrorResponse" {
            guard let error = try uniqueChild(root, "Error") else {
                throw CredentialsError(reason: "sts.error_without_code", message: "ErrorResponse without Error")
            }
            let code = try leafText(error, "Code")
            let message = try leafText(error, "Message")
            guard let code, !code.isEmpty else {
                throw CredentialsError(reason: "sts.error_without_code", message: message.map { safeMessage($0, redacting: redacting) })
            }
            let safe = safeCode(code)
            throw CredentialsError(reason: "sts." + safe, code: safe, message: message.map { safeMessage($0, redacting: redacting) })
        }
        guard root.name == action.rawValue + "Response" else {
            throw CredentialsError(reason: "credentials.unexpected_document",
                                   message: "expected \(action.rawValue)Response, got " + sanitise(root.name, limit: 64))
        }
        guard let result = try uniqueChild(root, action.rawValue + "Result") else {
            throw CredentialsError(reason: "credentials.missing_field", field: action.rawValue + "Result")
        }
        guard let credentials = try uniqueChild(result, "Credentials") else {
            throw CredentialsError(reason: "credentials.missing_field", field: "Credentials")
        }
        func required(_ name: String) throws(CredentialsError) -> String {
            guard let text = try leafText(credentials, name) else { throw CredentialsError(reason: "credentials.missing_field", field: name) }
            return text
        }
        return try validated(keyID: try required("AccessKeyId"), secret: try required("SecretAccessKey"),
                             token: try required("SessionToken"), expiration: try required("Expiration"))
    }

    /// The JSON shapes a `url` source may answer with.
    public enum VendingShape: String, Sendable, Equatable {
        /// `AccessKeyId`, `SecretAccessKey`, `Token`, `Expiration`.
        case containerCredentials = "container"
        /// `accessKeyId`/`AccessKeyId`, `accessKeySecret`/`AccessKeySecret`, `securityToken`/`SecurityToken`, `expiration`/`Expiration`.
        case aliyunVending = "aliyun"
        /// An Alibaba STS answer passed through: `{"Credentials": {…AccessKeySecret…}}`.
        case aliyunSTS = "aliyun_sts"
    }

    /// Which shape a parsed `url` answer has, by the name of its secret member; nil if none.
    public static func vendingShape(of object: [String: JSONValue]) -> VendingShape? {
        if object["SecretAccessKey"] != nil { return .containerCredentials }
        if object["accessKeySecret"] != nil || object["AccessKeySecret"] != nil { return .aliyunVending }
        if let inner = object["Credentials"]?.objectValue, inner["AccessKeySecret"] != nil { return .aliyunSTS }
        return nil
    }

    /// The `url` source: detects the shape (`vendingShape`) and decodes it. An answer with none
    /// of the shapes but an error `Code`/`code` (and `Message`/`message`) is `credentials.vendor_error`.
    public static func fromVendingURLJSON(_ bytes: [UInt8]) throws(CredentialsError) -> TemporaryCredentials {
        let object = try jsonObject(bytes)
        switch vendingShape(of: object) {
        case .containerCredentials?: return try fromContainerObject(object)
        case .aliyunVending?: return try fromAliyunVendingObject(object)
        case .aliyunSTS?: return try fromAliyunSTSJSON(bytes)
        case nil:
            let code = (object["Code"] ?? object["code"])?.stringValue
            let message = (object["Message"] ?? object["message"])?.stringValue
            if code != nil || message != nil {
                throw CredentialsError(reason: "credentials.vendor_error", code: code.map(safeCode),
                                       message: message.map { safeMessage($0, redacting: []) })
            }
            throw CredentialsError(reason: "credentials.unknown_shape",
                                   message: "no SecretAccessKey, accessKeySecret or AccessKeySecret member")
        }
    }

    // MARK: Shared pieces

    static func tooLarge() -> CredentialsError {
        CredentialsError(reason: "credentials.too_large", message: "larger than \(maxDocumentBytes) bytes")
    }

    static func jsonObject(_ bytes: [UInt8]) throws(CredentialsError) -> [String: JSONValue] {
        guard bytes.count <= maxDocumentBytes else { throw tooLarge() }
        let value: JSONValue
        do { value = try JSONParser(maxDepth: 16, maxBytes: maxDocumentBytes).parse(bytes) } catch {
            throw CredentialsError(reason: "credentials.malformed_json", message: error.description)
        }
        guard let object = value.objectValue else { throw CredentialsError(reason: "credentials.not_an_object") }
        return object
    }

    static func fromContainerObject(_ object: [String: JSONValue]) throws(CredentialsError) -> TemporaryCredentials {
        try validated(keyID: try string(object, "AccessKeyId", required: true),
                      secret: try string(object, "SecretAccessKey", required: true),
                      token: try string(object, "Token", required: true),
                      expiration: try string(object, "Expiration", required: true))
    }

    static func fromAliyunVendingObject(_ object: [String: JSONValue]) throws(CredentialsError) -> TemporaryCredentials {
        let lower = object["accessKeySecret"] != nil, upper = object["AccessKeySecret"] != nil
        if lower && upper {
            throw CredentialsError(reason: "credentials.ambiguous_shape", message: "both accessKeySecret and AccessKeySecret")
        }
        let names = upper ? ["AccessKeyId", "AccessKeySecret", "SecurityToken", "Expiration"]
                          : ["accessKeyId", "accessKeySecret", "securityToken", "expiration"]
        return try validated(keyID: try string(object, names[0], required: true),
                             secret: try string(object, names[1], required: true),
                             token: try string(object, names[2], required: true),
                             expiration: try string(object, names[3], required: true))
    }

    /// A member that must be a string when present; null counts as absent.
    static func string(_ object: [String: JSONValue], _ name: String, required: Bool) throws(CredentialsError) -> String? {
        switch object[name] {
        case nil, .null?:
            if required { throw CredentialsError(reason: "credentials.missing_field", field: name) }
            return nil
        case .string(let s)?:
            return s
        default:
            throw CredentialsError(reason: "credentials.invalid_field", field: name, message: "not a string")
        }
    }

    /// The Alibaba/vendor error shape `{"Code", "Message"}` as `sts.<Code>`, if the object has a `Code`.
    static func serviceError(_ object: [String: JSONValue], redacting: [OAuthSecret]) -> CredentialsError? {
        guard let code = object["Code"]?.stringValue, !code.isEmpty else { return nil }
        let safe = safeCode(code)
        return CredentialsError(reason: "sts." + safe, code: safe,
                                message: object["Message"]?.stringValue.map { safeMessage($0, redacting: redacting) })
    }

    /// Builds the value, checking every field: what goes into a header must be visible ASCII.
    static func validated(keyID: String?, secret: String?, token: String?, expiration: String?) throws(CredentialsError) -> TemporaryCredentials {
        // The callers pass nil only for optional fields (`required: false`).
        guard let keyID else { throw CredentialsError(reason: "credentials.missing_field", field: "AccessKeyId") }
        guard let secret else { throw CredentialsError(reason: "credentials.missing_field", field: "SecretAccessKey") }
        try checkField(keyID, "AccessKeyId")
        guard keyID.utf8.count <= maxAccessKeyIDBytes else {
            throw CredentialsError(reason: "credentials.field_too_long", field: "AccessKeyId", message: "longer than \(maxAccessKeyIDBytes) bytes")
        }
        try checkField(secret, "SecretAccessKey")
        if let token { try checkField(token, "SessionToken") }
        var expiresAt: Int64? = nil
        if let expiration { expiresAt = try ISO8601Timestamp.parse(expiration) }
        return TemporaryCredentials(accessKeyID: keyID, secret: OAuthSecret(secret),
                                    sessionToken: token.map(OAuthSecret.init), expiresAt: expiresAt)
    }

    /// Non-empty, visible ASCII only. The value is never quoted in the error.
    static func checkField(_ value: String, _ name: String) throws(CredentialsError) {
        guard !value.isEmpty else { throw CredentialsError(reason: "credentials.empty_field", field: name) }
        for b in value.utf8 where b < 0x21 || b > 0x7E {
            if b < 0x20 || b == 0x7F {
                throw CredentialsError(reason: "credentials.control_character", field: name, message: "control byte in a value sent in a header")
            }
            throw CredentialsError(reason: "credentials.invalid_field", field: name, message: "space or non-ASCII byte")
        }
    }

    /// An error code as a reason suffix: `[A-Za-z0-9._-]`, at most 64 bytes, others as `_`.
    static func safeCode(_ code: String) -> String {
        var out = ""
        for scalar in code.unicodeScalars.prefix(64) {
            switch scalar {
            case "a"..."z", "A"..."Z", "0"..."9", ".", "_", "-": out.unicodeScalars.append(scalar)
            default: out += "_"
            }
        }
        return out.isEmpty ? "unknown" : out
    }

    /// A server message made log-safe: every secret of `redacting` replaced, runs of 40 or more
    /// token characters (base64, JWT) cut, printable ASCII, at most 256 characters, and passed
    /// through `Redaction.scrub`.
    static func safeMessage(_ message: String, redacting: [OAuthSecret]) -> String {
        var bytes = Array(message.utf8.prefix(4096))
        let marker = Array("<redacted>".utf8)
        for secret in redacting where secret.exposedValue.utf8.count >= 4 {
            let needle = Array(secret.exposedValue.utf8)
            var i = 0
            var out: [UInt8] = []
            while i < bytes.count {
                if i + needle.count <= bytes.count, bytes[i..<(i + needle.count)].elementsEqual(needle) {
                    out += marker; i += needle.count
                } else {
                    out.append(bytes[i]); i += 1
                }
            }
            bytes = out
        }
        func isTokenByte(_ b: UInt8) -> Bool {
            switch b {
            case UInt8(ascii: "a")...UInt8(ascii: "z"), UInt8(ascii: "A")...UInt8(ascii: "Z"), UInt8(ascii: "0")...UInt8(ascii: "9"),
                 UInt8(ascii: "+"), UInt8(ascii: "/"), UInt8(ascii: "="), UInt8(ascii: "_"), UInt8(ascii: "-"), UInt8(ascii: "."):
                return true
            default: return false
            }
        }
        var cut: [UInt8] = []
        var i = 0
        while i < bytes.count {
            var j = i
            while j < bytes.count, isTokenByte(bytes[j]) { j += 1 }
            if j - i >= 40 { cut += marker } else { cut += bytes[i..<j] }
            if j < bytes.count { cut.append(bytes[j]); j += 1 }
            i = j
        }
        return Redaction.scrub(sanitise(String(decoding: cut, as: UTF8.self), limit: 256))
    }

    static func uniqueChild(_ element: SimpleXML.Element, _ name: String) throws(CredentialsError) -> SimpleXML.Element? {
        var found: SimpleXML.Element? = nil
        for child in element.children where child.name == name {
            guard found == nil else { throw CredentialsError(reason: "credentials.duplicate_field", field: name) }
            found = child
        }
        return found
    }

    /// The text of a child that holds only text, surrounding XML white space removed.
    static func leafText(_ element: SimpleXML.Element, _ name: String) throws(CredentialsError) -> String? {
        guard let child = try uniqueChild(element, name) else { return nil }
        guard child.children.isEmpty else {
            throw CredentialsError(reason: "credentials.invalid_field", field: name, message: "has child elements")
        }
        var text = Substring(child.text)
        while let f = text.utf8.first, f == 0x20 || f == 0x09 || f == 0x0A || f == 0x0D { text = text.dropFirst() }
        while let l = text.utf8.last, l == 0x20 || l == 0x09 || l == 0x0A || l == 0x0D { text = text.dropLast() }
        return String(text)
    }
}

// MARK: - ISO 8601 timestamps

/// RFC 3339 timestamps (the ISO 8601 profile STS and vending endpoints use) to Unix seconds,
/// without Foundation: `2026-11-29T08:00:00Z`, with a fraction (`…:00.392232Z`, truncated:
/// keys are treated as expiring at the whole second), with an offset (`+08:00`, `-0530`).
/// A leap second (`:60`) counts as `:59`. A time without a zone is refused (it would be local
/// time, which a server cannot mean). Stateless; all arithmetic is on bounded values
/// (four-digit years), so nothing can overflow.
public enum ISO8601Timestamp {
    public static func parse(_ text: String) throws(CredentialsError) -> Int64 {
        func bad(_ why: String) -> CredentialsError {
            CredentialsError(reason: "credentials.invalid_expiration", field: "Expiration", message: why)
        }
        let b = Array(text.utf8)
        guard b.count <= 64 else { throw bad("longer than 64 bytes") }
        guard b.count >= 19 else { throw bad("not an RFC 3339 date-time (YYYY-MM-DDThh:mm:ssZ)") }
        func digits(_ at: Int, _ count: Int) -> Int64? {
            guard at + count <= b.count else { return nil }
            var v: Int64 = 0
            for i in at..<(at + count) {
                guard b[i] >= UInt8(ascii: "0"), b[i] <= UInt8(ascii: "9") else { return nil }
                v = v * 10 + Int64(b[i] - UInt8(ascii: "0"))
            }
            return v
        }
        guard let year = digits(0, 4), b[4] == UInt8(ascii: "-"), let month = digits(5, 2), b[7] == UInt8(ascii: "-"),
              let day = digits(8, 2), b[10] == UInt8(ascii: "T") || b[10] == UInt8(ascii: "t"),
              let hour = digits(11, 2), b[13] == UInt8(ascii: ":"), let minute = digits(14, 2), b[16] == UInt8(ascii: ":"),
              let second = digits(17, 2) else {
            throw bad("not an RFC 3339 date-time (YYYY-MM-DDThh:mm:ssZ)")
        }
        guard (1...12).contains(month) else { throw bad("month out of range") }
        let leap = (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
        let monthDays: [Int64] = [31, leap ? 29 : 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]
        guard day >= 1, day <= monthDays[Int(month - 1)] else { throw bad("day out of range") }
        guard hour < 24 else { throw bad("hour out of range") }
        guard minute < 60 else { throw bad("minute out of range") }
        guard second <= 60 else { throw bad("second out of range") }
        var i = 19
        if i < b.count, b[i] == UInt8(ascii: ".") || b[i] == UInt8(ascii: ",") {
            i += 1
            let start = i
            while i < b.count, b[i] >= UInt8(ascii: "0"), b[i] <= UInt8(ascii: "9") { i += 1 }
            guard i > start else { throw bad("empty fraction") }
        }
        guard i < b.count else { throw bad("no time zone (Z or ±hh:mm)") }
        var offset: Int64 = 0
        switch b[i] {
        case UInt8(ascii: "Z"), UInt8(ascii: "z"):
            i += 1
        case UInt8(ascii: "+"), UInt8(ascii: "-"):
            let sign: Int64 = b[i] == UInt8(ascii: "-") ? -1 : 1
            guard let oh = digits(i + 1, 2) else { throw bad("malformed offset") }
            var om: Int64
            if i + 3 < b.count, b[i + 3] == UInt8(ascii: ":") {
                guard let m = digits(i + 4, 2) else { throw bad("malformed offset") }
                om = m; i += 6
            } else {
                guard let m = digits(i + 3, 2) else { throw bad("malformed offset") }
                om = m; i += 5
            }
            guard oh < 24, om < 60 else { throw bad("offset out of range") }
            offset = sign * (oh * 3_600 + om * 60)
        default:
            throw bad("no time zone (Z or ±hh:mm)")
        }
        guard i == b.count else { throw bad("trailing characters") }
        let days = CivilTime.daysFromCivil(year: year, month: month, day: day)
        return days * 86_400 + hour * 3_600 + minute * 60 + min(second, 59) - offset
    }

    /// `YYYY-MM-DDThh:mm:ssZ` for Unix seconds (Alibaba's `Timestamp` parameter). Years outside
    /// 0000–9999 are clamped to that range's ends.
    public static func format(_ seconds: Int64) -> String {
        CivilTime(epochSeconds: seconds).rfc3339
    }
}

// MARK: - STS request forms

/// The form bodies of the STS calls that yield `TemporaryCredentials` (pure; the driver sends
/// them as a POST with the returned headers). Stateless.
public enum STSRequestForm {
    /// AWS STS API version of the query protocol.
    public static let awsVersion = "2011-06-15"
    /// Alibaba Cloud STS API version.
    public static let aliyunVersion = "2015-04-01"

    /// AWS `AssumeRoleWithWebIdentity` (unsigned: the web identity token is the proof).
    /// `durationSeconds`, when given, must lie in 900…43200 (STS's own bounds).
    public static func assumeRoleWithWebIdentity(roleARN: String, sessionName: String, webIdentityToken: OAuthSecret,
                                                 durationSeconds: Int? = nil) throws(CredentialsError) -> EncodedTokenRequest {
        try checkARN(roleARN)
        try checkAWSSessionName(sessionName)
        try checkToken(webIdentityToken, "WebIdentityToken", range: 4...20_000)
        var pairs = [("Action", "AssumeRoleWithWebIdentity"), ("Version", awsVersion), ("RoleArn", roleARN),
                     ("RoleSessionName", sessionName), ("WebIdentityToken", webIdentityToken.exposedValue)]
        if let durationSeconds {
            try checkDuration(durationSeconds, 900...43_200)
            pairs.append(("DurationSeconds", String(durationSeconds)))
        }
        return encoded(pairs, accept: "application/xml")
    }

    /// AWS `AssumeRole` (the driver signs the request with the base keys: SigV4, service `sts`).
    public static func assumeRole(roleARN: String, sessionName: String, externalID: String? = nil,
                                  durationSeconds: Int? = nil) throws(CredentialsError) -> EncodedTokenRequest {
        try checkARN(roleARN)
        try checkAWSSessionName(sessionName)
        var pairs = [("Action", "AssumeRole"), ("Version", awsVersion), ("RoleArn", roleARN), ("RoleSessionName", sessionName)]
        if let externalID {
            // STS: 2–1224 characters of [\w+=,.@:/-].
            guard (2...1_224).contains(externalID.utf8.count), externalID.utf8.allSatisfy(isSessionNameByte(allowingColonSlash: true)) else {
                throw CredentialsError(reason: "credentials.invalid_parameter", field: "ExternalId", message: "2-1224 characters of [A-Za-z0-9+=,.@:/_-]")
            }
            pairs.append(("ExternalId", externalID))
        }
        if let durationSeconds {
            try checkDuration(durationSeconds, 900...43_200)
            pairs.append(("DurationSeconds", String(durationSeconds)))
        }
        return encoded(pairs, accept: "application/xml")
    }

    /// Alibaba Cloud `AssumeRoleWithOIDC` (RRSA), an anonymous RPC call: no AccessKey, no
    /// `Signature`, `SignatureMethod` or `SignatureNonce`. Alibaba's own credentials SDK
    /// (credentials-go `OIDCCredentialsProvider`) sends `Version`, `Action`, `Format` and a
    /// `Timestamp` besides the operation's parameters and nothing else; `timestamp` (Unix
    /// seconds) adds that `Timestamp` when given. `durationSeconds` must be ≥ 900 (the upper
    /// bound is the role's `MaxSessionDuration`, at most 43200).
    public static func aliyunAssumeRoleWithOIDC(roleARN: String, oidcProviderARN: String, oidcToken: OAuthSecret,
                                                sessionName: String, durationSeconds: Int? = nil,
                                                timestamp: Int64? = nil) throws(CredentialsError) -> EncodedTokenRequest {
        try checkARN(roleARN)
        try checkARN(oidcProviderARN, field: "OIDCProviderArn")
        try checkToken(oidcToken, "OIDCToken", range: 4...20_000)
        // Alibaba: 2–64 characters of letters, digits, `.`, `@`, `-`, `_`.
        guard (2...64).contains(sessionName.utf8.count), sessionName.utf8.allSatisfy({ b in
            isAlphanumeric(b) || b == UInt8(ascii: ".") || b == UInt8(ascii: "@") || b == UInt8(ascii: "-") || b == UInt8(ascii: "_")
        }) else {
            throw CredentialsError(reason: "credentials.invalid_parameter", field: "RoleSessionName", message: "2-64 characters of [A-Za-z0-9.@_-]")
        }
        var pairs = [("Action", "AssumeRoleWithOIDC"), ("Version", aliyunVersion), ("Format", "JSON")]
        if let timestamp { pairs.append(("Timestamp", ISO8601Timestamp.format(timestamp))) }
        pairs += [("RoleArn", roleARN), ("OIDCProviderArn", oidcProviderARN), ("OIDCToken", oidcToken.exposedValue),
                  ("RoleSessionName", sessionName)]
        if let durationSeconds {
            try checkDuration(durationSeconds, 900...43_200)
            pairs.append(("DurationSeconds", String(durationSeconds)))
        }
        return encoded(pairs, accept: "application/json")
    }

    static func encoded(_ pairs: [(String, String)], accept: String) -> EncodedTokenRequest {
        EncodedTokenRequest(body: Array(FormURLEncoding.encode(pairs).utf8),
                            headers: [(name: "Content-Type", value: "application/x-www-form-urlencoded"), (name: "Accept", value: accept)])
    }

    static func isAlphanumeric(_ b: UInt8) -> Bool {
        (b >= UInt8(ascii: "a") && b <= UInt8(ascii: "z")) || (b >= UInt8(ascii: "A") && b <= UInt8(ascii: "Z"))
            || (b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9"))
    }

    static func isSessionNameByte(allowingColonSlash: Bool) -> (UInt8) -> Bool {
        { b in
            isAlphanumeric(b) || b == UInt8(ascii: "_") || b == UInt8(ascii: "+") || b == UInt8(ascii: "=") || b == UInt8(ascii: ",")
                || b == UInt8(ascii: ".") || b == UInt8(ascii: "@") || b == UInt8(ascii: "-")
                || (allowingColonSlash && (b == UInt8(ascii: ":") || b == UInt8(ascii: "/")))
        }
    }

    /// AWS `RoleSessionName`: 2–64 characters of `[\w+=,.@-]`.
    static func checkAWSSessionName(_ name: String) throws(CredentialsError) {
        guard (2...64).contains(name.utf8.count), name.utf8.allSatisfy(isSessionNameByte(allowingColonSlash: false)) else {
            throw CredentialsError(reason: "credentials.invalid_parameter", field: "RoleSessionName", message: "2-64 characters of [A-Za-z0-9+=,.@_-]")
        }
    }

    static func checkARN(_ arn: String, field: String = "RoleArn") throws(CredentialsError) {
        guard (20...2_048).contains(arn.utf8.count), arn.utf8.allSatisfy({ $0 >= 0x21 && $0 <= 0x7E }) else {
            throw CredentialsError(reason: "credentials.invalid_parameter", field: field, message: "20-2048 visible ASCII characters")
        }
    }

    static func checkToken(_ token: OAuthSecret, _ field: String, range: ClosedRange<Int>) throws(CredentialsError) {
        guard range.contains(token.exposedValue.utf8.count), token.exposedValue.utf8.allSatisfy({ $0 >= 0x21 && $0 <= 0x7E }) else {
            throw CredentialsError(reason: "credentials.invalid_parameter", field: field,
                                   message: "\(range.lowerBound)-\(range.upperBound) visible ASCII characters (a trailing newline in the token file?)")
        }
    }

    static func checkDuration(_ seconds: Int, _ range: ClosedRange<Int>) throws(CredentialsError) {
        guard range.contains(seconds) else {
            throw CredentialsError(reason: "credentials.invalid_parameter", field: "DurationSeconds",
                                   message: "must lie in \(range.lowerBound)-\(range.upperBound)")
        }
    }
}

// MARK: - A minimal XML reader

/// Just enough XML 1.0 for STS answers: elements, attributes (read and dropped), character data,
/// CDATA sections, comments and processing instructions (skipped), the five predefined entities
/// and numeric character references. A DOCTYPE (and so any DTD or other entity) is refused.
/// Namespaces are ignored: an element keeps its local name. Input must be UTF-8; size and depth
/// are bounded. Stateless apart from its limits.
public enum SimpleXML {
    /// One element: its local name, child elements in order, and its own character data
    /// (all text runs directly inside it, concatenated).
    public struct Element: Sendable, Equatable {
        public var name: String
        public var children: [Element]
        public var text: String

        public init(name: String, children: [Element] = [], text: String = "") {
            self.name = name
            self.children = children
            self.text = text
        }

        /// The first child named `name`.
        public func child(_ name: String) -> Element? { children.first { $0.name == name } }
    }

    /// Why a document was refused: a stable dotted reason (`xml.doctype_not_allowed`) and the
    /// byte offset.
    public struct Error: Swift.Error, Sendable, Equatable, CustomStringConvertible {
        public let reason: String
        public let offset: Int
        public var description: String { "\(reason) at byte \(offset)" }
    }

    public struct Reader: Sendable {
        public var maxDepth: Int
        public var maxBytes: Int

        /// Defaults: depth 16 (STS answers nest 4 deep), 64 KiB.
        public init(maxDepth: Int = 16, maxBytes: Int = 64 * 1024) {
            self.maxDepth = maxDepth
            self.maxBytes = maxBytes
        }

        public func parse(_ bytes: [UInt8]) throws(SimpleXML.Error) -> Element {
            guard bytes.count <= maxBytes else { throw SimpleXML.Error(reason: "xml.too_large", offset: maxBytes) }
            guard String(validating: bytes, as: UTF8.self) != nil else { throw SimpleXML.Error(reason: "xml.invalid_utf8", offset: 0) }
            var cursor = Cursor(b: bytes, maxDepth: maxDepth)
            return try cursor.document()
        }
    }

    struct Open {
        var qname: ArraySlice<UInt8>
        var element: Element
        var text: [UInt8]
    }

    struct Cursor {
        let b: [UInt8]
        let maxDepth: Int
        var i = 0

        func fail(_ reason: String) -> SimpleXML.Error { SimpleXML.Error(reason: reason, offset: i) }

        func at(_ literal: StaticString) -> Bool {
            let n = literal.utf8CodeUnitCount
            guard i + n <= b.count else { return false }
            return literal.withUTF8Buffer { lit in
                for k in 0..<n where b[i + k] != lit[k] { return false }
                return true
            }
        }

        mutating func skipSpace() {
            while i < b.count, b[i] == 0x20 || b[i] == 0x09 || b[i] == 0x0A || b[i] == 0x0D { i += 1 }
        }

        /// Advances past the next `terminator`; fails with `reason` if there is none.
        mutating func skip(past terminator: StaticString, _ reason: String) throws(SimpleXML.Error) {
            while i < b.count {
                if at(terminator) { i += terminator.utf8CodeUnitCount; return }
                i += 1
            }
            throw fail(reason)
        }

        /// Comments, processing instructions and white space between elements (outside the root).
        mutating func misc() throws(SimpleXML.Error) {
            while true {
                skipSpace()
                if at("<!--") { i += 4; try skip(past: "-->", "xml.unterminated_comment") }
                else if at("<?") { i += 2; try skip(past: "?>", "xml.unterminated_pi") }
                else if at("<!") { throw fail("xml.doctype_not_allowed") }
                else { return }
            }
        }

        mutating func document() throws(SimpleXML.Error) -> Element {
            if at("\u{FEFF}") { i += 3 }
            try misc()
            guard i < b.count, b[i] == UInt8(ascii: "<") else { throw fail("xml.expected_root") }
            var stack: [Open] = []
            while true {
                guard i < b.count else { throw fail("xml.unexpected_end") }
                if b[i] != UInt8(ascii: "<") {
                    guard !stack.isEmpty else { throw fail("xml.expected_root") }
                    try characterData(into: &stack[stack.count - 1].text)
                    continue
                }
                if at("</") {
                    i += 2
                    let qname = try name()
                    skipSpace()
                    guard i < b.count, b[i] == UInt8(ascii: ">") else { throw fail("xml.expected_gt") }
                    i += 1
                    guard var open = stack.popLast() else { throw fail("xml.unexpected_end_tag") }
                    guard open.qname.elementsEqual(qname) else { throw fail("xml.mismatched_end_tag") }
                    open.element.text = String(decoding: open.text, as: UTF8.self)
                    if stack.isEmpty { try misc(); guard i == b.count else { throw fail("xml.trailing_data") }; return open.element }
                    stack[stack.count - 1].element.children.append(open.element)
                } else if at("<!--") {
                    guard !stack.isEmpty else { throw fail("xml.expected_root") }
                    i += 4; try skip(past: "-->", "xml.unterminated_comment")
                } else if at("<![CDATA[") {
                    guard !stack.isEmpty else { throw fail("xml.expected_root") }
                    i += 9
                    let start = i
                    try skip(past: "]]>", "xml.unterminated_cdata")
                    let content = b[start..<(i - 3)]
                    for c in content where c < 0x20 && c != 0x09 && c != 0x0A && c != 0x0D { throw fail("xml.invalid_character") }
                    stack[stack.count - 1].text += content
                } else if at("<?") {
                    i += 2; try skip(past: "?>", "xml.unterminated_pi")
                } else if at("<!") {
                    throw fail("xml.doctype_not_allowed")
                } else {
                    guard stack.count < maxDepth else { throw fail("xml.too_deep") }
                    i += 1
                    let qname = try name()
                    let local = qname.lastIndex(of: UInt8(ascii: ":")).map { qname[($0 + 1)...] } ?? qname
                    guard let first = local.first, isNameStart(first) else { throw fail("xml.invalid_name") }
                    let element = Element(name: String(decoding: local, as: UTF8.self))
                    let empty = try attributes()
                    if empty {
                        if stack.isEmpty { try misc(); guard i == b.count else { throw fail("xml.trailing_data") }; return element }
                        stack[stack.count - 1].element.children.append(element)
                    } else {
                        stack.append(Open(qname: qname, element: element, text: []))
                    }
                }
            }
        }

        func isNameStart(_ c: UInt8) -> Bool {
            (c >= UInt8(ascii: "a") && c <= UInt8(ascii: "z")) || (c >= UInt8(ascii: "A") && c <= UInt8(ascii: "Z"))
                || c == UInt8(ascii: "_") || c == UInt8(ascii: ":") || c >= 0x80
        }

        func isNameByte(_ c: UInt8) -> Bool {
            isNameStart(c) || (c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9")) || c == UInt8(ascii: "-") || c == UInt8(ascii: ".")
        }

        mutating func name() throws(SimpleXML.Error) -> ArraySlice<UInt8> {
            let start = i
            guard i < b.count, isNameStart(b[i]) else { throw fail("xml.invalid_name") }
            while i < b.count, isNameByte(b[i]) { i += 1 }
            return b[start..<i]
        }

        /// Attributes up to `>` or `/>`; returns true for an empty-element tag. Values are
        /// checked (references, no `<`) and dropped.
        mutating func attributes() throws(SimpleXML.Error) -> Bool {
            while true {
                let before = i
                skipSpace()
                guard i < b.count else { throw fail("xml.unexpected_end") }
                if b[i] == UInt8(ascii: ">") { i += 1; return false }
                if at("/>") { i += 2; return true }
                guard i > before else { throw fail("xml.expected_space") }
                _ = try name()
                skipSpace()
                guard i < b.count, b[i] == UInt8(ascii: "=") else { throw fail("xml.expected_eq") }
                i += 1
                skipSpace()
                guard i < b.count, b[i] == UInt8(ascii: "\"") || b[i] == UInt8(ascii: "'") else { throw fail("xml.expected_quote") }
                let quote = b[i]
                i += 1
                var ignored: [UInt8] = []
                while true {
                    guard i < b.count else { throw fail("xml.unexpected_end") }
                    let c = b[i]
                    if c == quote { i += 1; break }
                    if c == UInt8(ascii: "<") { throw fail("xml.lt_in_attribute") }
                    if c == UInt8(ascii: "&") { try reference(into: &ignored); continue }
                    if c < 0x20 && c != 0x09 && c != 0x0A && c != 0x0D { throw fail("xml.invalid_character") }
                    i += 1
                }
            }
        }

        /// Character data up to the next `<`, references decoded.
        mutating func characterData(into out: inout [UInt8]) throws(SimpleXML.Error) {
            while i < b.count, b[i] != UInt8(ascii: "<") {
                let c = b[i]
                if c == UInt8(ascii: "&") { try reference(into: &out); continue }
                if c < 0x20 && c != 0x09 && c != 0x0A && c != 0x0D { throw fail("xml.invalid_character") }
                out.append(c)
                i += 1
            }
        }

        /// `&lt;` `&gt;` `&amp;` `&apos;` `&quot;` `&#N;` `&#xH;`; any other name is refused.
        mutating func reference(into out: inout [UInt8]) throws(SimpleXML.Error) {
            let start = i
            i += 1
            var end = i
            while end < b.count, end - i <= 10, b[end] != UInt8(ascii: ";") { end += 1 }
            guard end < b.count, b[end] == UInt8(ascii: ";") else { i = start; throw fail("xml.invalid_reference") }
            let body = b[i..<end]
            defer { i = end + 1 }
            switch String(decoding: body, as: UTF8.self) {
            case "lt": out.append(UInt8(ascii: "<")); return
            case "gt": out.append(UInt8(ascii: ">")); return
            case "amp": out.append(UInt8(ascii: "&")); return
            case "apos": out.append(UInt8(ascii: "'")); return
            case "quot": out.append(UInt8(ascii: "\"")); return
            default: break
            }
            guard body.first == UInt8(ascii: "#"), body.count >= 2 else { i = start; throw fail("xml.unknown_entity") }
            var digits = body.dropFirst()
            var radix: UInt32 = 10
            if digits.first == UInt8(ascii: "x") { radix = 16; digits = digits.dropFirst() }
            guard !digits.isEmpty, digits.count <= 8 else { i = start; throw fail("xml.invalid_reference") }
            var value: UInt32 = 0
            for d in digits {
                let v: UInt32
                switch d {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): v = UInt32(d - UInt8(ascii: "0"))
                case UInt8(ascii: "a")...UInt8(ascii: "f") where radix == 16: v = UInt32(d - UInt8(ascii: "a")) + 10
                case UInt8(ascii: "A")...UInt8(ascii: "F") where radix == 16: v = UInt32(d - UInt8(ascii: "A")) + 10
                default: i = start; throw fail("xml.invalid_reference")
                }
                value = value &* radix &+ v  // at most 8 digits: below 2^32 in hex, 10^8 in decimal
            }
            // XML 1.0 Char: #x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] | [#x10000-#x10FFFF].
            let isChar = value == 0x9 || value == 0xA || value == 0xD || (0x20...0xD7FF).contains(value)
                || (0xE000...0xFFFD).contains(value) || (0x10000...0x10FFFF).contains(value)
            guard isChar, let scalar = Unicode.Scalar(value) else { i = start; throw fail("xml.invalid_character_reference") }
            out += Array(String(Character(scalar)).utf8)
        }
    }
}
