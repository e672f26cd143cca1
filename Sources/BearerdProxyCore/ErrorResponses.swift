import BearerdHTTP
import BearerdOAuth

/// The JSON error bodies bearerd itself answers with (docs/architecture.md §5), built in one place.
public enum ErrorResponse {
    /// `{"error":"<code>","route":"...","detail":"..."}` with the status and extra headers, as
    /// HTTP/1.1 bytes.
    public static func make(status: Int, error code: String, detail: String? = nil, extra: [(String, String)] = [],
                            fields: [(String, String)] = [], close: Bool) -> [UInt8] {
        var (head, body) = parts(status: status, error: code, detail: detail, extra: extra, fields: fields)
        if close { head.headers.add("Connection", "close") }
        var out: [UInt8] = []
        out.reserveCapacity(256 + body.count)
        HTTP1Serializer.writeResponseHead(head, into: &out)
        out.append(contentsOf: body)
        return out
    }

    /// The same response as a head and a body, for any protocol (HTTP/2 maps the head itself).
    public static func parts(status: Int, error code: String, detail: String? = nil, extra: [(String, String)] = [],
                             fields: [(String, String)] = []) -> (head: HTTPResponseHead, body: [UInt8]) {
        var body = "{\"error\":" + jsonString(code)
        for (k, v) in fields { body += "," + jsonString(k) + ":" + jsonString(v) }
        if let detail { body += ",\"detail\":" + jsonString(detail) }
        body += "}\n"
        var headers = HTTPHeaders()
        headers.add("Content-Type", "application/json")
        headers.add("Content-Length", String(body.utf8.count))
        headers.add("Cache-Control", "no-store")
        for (k, v) in extra { headers.add(k, v) }
        return (HTTPResponseHead(status: status, reason: reasonPhrase(status), headers: headers), Array(body.utf8))
    }

    /// gRPC status codes bearerd answers with (grpc/doc/statuscodes.md).
    public enum GRPCCode: Int, Sendable {
        case deadlineExceeded = 4, permissionDenied = 7, unimplemented = 12, `internal` = 13, unavailable = 14, unauthenticated = 16
    }

    /// A trailers-only gRPC error (gRPC over HTTP/2 spec: `:status 200`, `content-type:
    /// application/grpc`, `grpc-status`, `grpc-message` percent-encoded), for gRPC clients where
    /// others get the JSON answer (docs/architecture.md §5).
    public static func grpcTrailersOnly(_ code: GRPCCode, message: String) -> HTTPResponseHead {
        var headers = HTTPHeaders()
        headers.add("content-type", "application/grpc")
        headers.add("grpc-status", String(code.rawValue))
        headers.add("grpc-message", grpcPercentEncode(message))
        return HTTPResponseHead(status: 200, reason: "OK", headers: headers)
    }

    /// gRPC's percent-encoding of `grpc-message`: bytes outside 0x20...0x7E and '%' as %XX.
    public static func grpcPercentEncode(_ s: String) -> String {
        let hex: [UInt8] = Array("0123456789ABCDEF".utf8)
        var out: [UInt8] = []
        out.reserveCapacity(s.utf8.count)
        for b in s.utf8 {
            if b >= 0x20 && b <= 0x7E && b != 0x25 {
                out.append(b)
            } else {
                out.append(0x25)
                out.append(hex[Int(b >> 4)])
                out.append(hex[Int(b & 0x0F)])
            }
        }
        return String(decoding: out, as: UTF8.self)
    }

    /// Whether a request is a gRPC call (`content-type: application/grpc`, `+proto`, `;...`).
    public static func isGRPC(_ headers: HTTPHeaders) -> Bool {
        guard let ct = headers.first(.contentType) else { return false }
        // Bytes, no lowercased copy: this runs for every request and response.
        let prefix: StaticString = "application/grpc"
        let u = ct.utf8
        guard u.count >= prefix.utf8CodeUnitCount else { return false }
        var i = u.startIndex
        for k in 0..<prefix.utf8CodeUnitCount {
            let c = u[i]
            if ((c >= 65 && c <= 90) ? c | 0x20 : c) != prefix.utf8Start[k] { return false }
            i = u.index(after: i)
        }
        guard i < u.endIndex else { return true }
        return u[i] == UInt8(ascii: "+") || u[i] == UInt8(ascii: ";")
    }

    public static func jsonString(_ s: String) -> String {
        JSONWriter.quote(s)
    }

    public static func reasonPhrase(_ status: Int) -> String {
        switch status {
        case 100: return "Continue"
        case 200: return "OK"
        case 400: return "Bad Request"
        case 401: return "Unauthorized"
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
