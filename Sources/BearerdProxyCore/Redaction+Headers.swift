import BearerdHTTP
import BearerdOAuth

/// `Redaction` of a whole header section (access log, debug logs of an exchange): needs
/// BearerdHTTP's `HTTPHeaders`, so it lives beside the proxy core rather than in BearerdOAuth.
extension Redaction {
    /// The fields as `name: value` pairs joined by `; `, credentials redacted.
    /// `alsoSensitive`: one more field name to redact (a route's `inject:` header).
    public static func describe(_ headers: HTTPHeaders, alsoSensitive: String? = nil) -> String {
        var out = ""
        for f in headers {
            if !out.isEmpty { out += "; " }
            if let extra = alsoSensitive, asciiCaseInsensitiveEquals(f.name, extra), !isSensitive(headerName: f.name) {
                out += f.name + ": <redacted fp \(BearerdOAuth.fingerprint(f.value))>"
            } else {
                out += f.name + ": " + redactedValue(name: f.name, value: f.value)
            }
        }
        return out
    }
}
