import BearerdHTTP
import BearerdOAuth

/// The JSON error bodies bearerd itself answers with (DESIGN §5), built in one place.
public enum ErrorResponse {
    /// `{"error":"<code>","route":"...","detail":"..."}` with the status and extra headers.
    public static func make(status: Int, error code: String, detail: String? = nil, extra: [(String, String)] = [],
                            fields: [(String, String)] = [], close: Bool) -> [UInt8] {
        var body = "{\"error\":" + jsonString(code)
        for (k, v) in fields { body += "," + jsonString(k) + ":" + jsonString(v) }
        if let detail { body += ",\"detail\":" + jsonString(detail) }
        body += "}\n"
        var headers = HTTPHeaders()
        headers.add("Content-Type", "application/json")
        headers.add("Content-Length", String(body.utf8.count))
        headers.add("Cache-Control", "no-store")
        for (k, v) in extra { headers.add(k, v) }
        if close { headers.add("Connection", "close") }
        var out: [UInt8] = []
        HTTP1Serializer.writeResponseHead(HTTPResponseHead(status: status, reason: reasonPhrase(status), headers: headers), into: &out)
        out.append(contentsOf: body.utf8)
        return out
    }

    public static func jsonString(_ s: String) -> String {
        JSONWriter.quote(s)
    }

    public static func reasonPhrase(_ status: Int) -> String {
        switch status {
        case 100: return "Continue"
        case 200: return "OK"
        case 400: return "Bad Request"
        case 403: return "Forbidden"
        case 404: return "Not Found"
        case 405: return "Method Not Allowed"
        case 408: return "Request Timeout"
        case 413: return "Content Too Large"
        case 414: return "URI Too Long"
        case 417: return "Expectation Failed"
        case 421: return "Misdirected Request"
        case 431: return "Request Header Fields Too Large"
        case 500: return "Internal Server Error"
        case 501: return "Not Implemented"
        case 502: return "Bad Gateway"
        case 503: return "Service Unavailable"
        case 504: return "Gateway Timeout"
        case 505: return "HTTP Version Not Supported"
        default: return ""
        }
    }
}
