import BearerdHTTP
import BearerdOAuth
import BearerdProxyCore
import BearerdConfig
import BearerdTLS
import BearerdSessions


extension RouteSigning {
    /// The plan of `route` under the sessions of its configuration: nil unless the route has
    /// `sign:` and its session is a signing session (`grant: aws|aliyun` with `credentials:`).
    static func plan(route: RouteConfig, sessions: [SessionConfig]) -> RouteSigning? {
        guard let sign = route.sign, let name = route.session,
              let session = sessions.first(where: { $0.name == name }), session.grant.isSigning,
              let credentials = session.signing else { return nil }
        let provider: Provider = session.grant == .aliyun ? .aliyun : .aws
        // `UNSIGNED-PAYLOAD` exists only for S3 and OSS (the configuration refuses it elsewhere;
        // a plan never asks the signer for what it must refuse).
        let unsignedAllowed = provider == .aliyun || (sign.service ?? "s3") == "s3"
        return plan(provider: provider, region: credentials.region, service: sign.service, bucket: sign.bucket,
                    signedPayload: sign.payload == .signed || !unsignedAllowed, upstreamHost: route.upstream.host)
    }

    /// The statuses that are token rejections on `route` (docs/architecture.md §6.15): on a
    /// signing route 400 and 403 are read from their bodies instead, and 401 (`reject_statuses`'
    /// default, written or not) is no rejection: stores answer expired or unknown keys with 400
    /// or 403, and a 401 there says nothing about the keys. Statuses other than 401 listed in
    /// `reject_statuses` stay rejections.
    static func rejectSet(route: RouteConfig, signing: RouteSigning?) -> StatusCodeSet {
        guard signing != nil else { return StatusCodeSet(route.rejectStatuses) }
        return StatusCodeSet(route.rejectStatuses.filter { $0 != 401 && $0 != 400 && $0 != 403 })
    }
}

/// Signs one upstream request head of a signing route (docs/architecture.md §6.15), just before
/// it leaves: the original attempt, a fresh-connection retry, a replay and a clock-skew resend
/// each get their own signature (their own time, their own keys). Stateless; the driver holds
/// what one exchange needs (the plan, the body's hash).
enum RequestSigner {
    /// OpenSSL's digests with the signing keys kept (one HMAC per request), the process's.
    static var crypto: SigningCrypto { SigningCrypto.shared }

    /// The head to send: the client's `Authorization` and the schemes' date, token, hash and
    /// signature fields removed, the signer's added (all but `Authorization`), the target as
    /// signed (canonically re-encoded). `authorization` is set as the head is written (HTTP/2
    /// sends it never-indexed).
    struct Prepared {
        var head: HTTPRequestHead
        var authorization: HTTPField?
        /// The lower-case hex SHA-256 of the canonical request (the last line of the string to
        /// sign): what a `SignatureDoesNotMatch` warning names. Never the secret, never the text.
        var canonicalRequestHash: Substring
    }

    enum Outcome {
        case signed(Prepared)
        /// `detail`: what the client (or the log) is told.
        case failed(ProxyExchange.SigningFailure, detail: String)
    }

    /// Signs `head` (the upstream head as routed) with `keys` at `epochSeconds`. `authority`:
    /// the upstream authority, the signed `host` when the head names none (it always does: the
    /// `Host` it carries is what HTTP/1.1 sends and what HTTP/2 sends as `:authority`).
    /// `payloadHash`: the body's SHA-256 (hex) for `payload: signed`.
    static func sign(_ head: HTTPRequestHead, authority: String, plan: RouteSigning, keys: TemporaryCredentials?,
                     payloadHash: String?, epochSeconds: Int64) -> Outcome {
        guard let keys else { return .failed(.noKeys, detail: "the session's credentials carry no signing keys") }
        let host = head.headers.first(.host) ?? authority
        let fields = head.headers.fields.map { (name: $0.name, value: $0.value) }
        let payload: RequestSigning.Payload = plan.payload == .signedPayload ? .hashed(payloadHash ?? RequestSigning.Payload.emptyHash) : .unsigned
        let credentials = RequestSigning.Credentials(accessKeyID: keys.accessKeyID, secretAccessKey: keys.secret.exposedValue,
                                                     sessionToken: keys.sessionToken?.exposedValue)
        switch RequestSigning.sign(method: head.method, target: head.target, host: host, headers: fields, scheme: plan.scheme,
                                   credentials: credentials, payload: payload, epochSeconds: epochSeconds, crypto: crypto) {
        case .failure(let failure):
            switch failure {
            case .invalidPercentEncoding(let offset):
                return .failed(.invalidTarget, detail: "the request target cannot be signed: a '%' not followed by two hex digits at byte \(offset)")
            case .targetNotOriginForm:
                return .failed(.invalidTarget, detail: "the request target cannot be signed: not origin-form")
            case .dotSegment:
                return .failed(.invalidTarget, detail: "the request target cannot be signed: a '.' or '..' segment once decoded (an encoded dot or slash)")
            case .payloadMustBeSigned(let service):
                // `plan` never asks for it; answered like a target that cannot be signed.
                return .failed(.invalidTarget, detail: "service \(service) needs the body's SHA-256 (payload: signed)")
            }
        case .success(let signed):
            var out = head
            out.target = signed.target
            out.headers.fields.removeAll { f in signed.remove.contains { asciiCaseInsensitiveEquals($0, f.name) } }
            var authorization: HTTPField?
            for f in signed.add {
                if asciiCaseInsensitiveEquals(f.name, "Authorization") {
                    authorization = HTTPField(name: f.name, value: f.value)
                } else {
                    out.headers.add(f.name, f.value)
                }
            }
            // The string to sign ends with the hash: its last 64 bytes (ASCII hex).
            let hash = Substring(signed.stringToSign.utf8.suffix(64))
            return .signed(Prepared(head: out, authorization: authorization, canonicalRequestHash: hash))
        }
    }

    /// The lower-case hex SHA-256 of a whole body (`payload: signed`).
    static func payloadHash(_ body: [UInt8]) -> String {
        body.isEmpty ? RequestSigning.Payload.emptyHash : RequestSigning.hex(Digest.sha256(body))
    }
}
