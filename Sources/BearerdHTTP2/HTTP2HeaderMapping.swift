import BearerdHTTP

/// A malformed HTTP/2 field section (RFC 9113 §8.1.1: a stream error, answered 400 / reset).
public struct HTTP2MappingError: Error, Sendable, Equatable, CustomStringConvertible {
    /// Stable dotted reason, e.g. `h2.missing_pseudo_header`.
    public var reason: String
    public var message: String
    public init(_ reason: String, _ message: String) {
        self.reason = reason
        self.message = message
    }
    public var description: String { reason + ": " + message }
}

/// Translation between HTTP/2 field sections and the HTTP/1.1-shaped heads the proxy works with
/// (RFC 9113 §8.2–8.3). Pure functions.
///
/// Requests from HTTP/2 clients become heads with version 1.1 whose `Host` comes from
/// `:authority`; cookie crumbs are joined with "; " (§8.2.3). Heads going out as HTTP/2 lose the
/// connection-specific fields (§8.2.2) and keep `te` only as `trailers`.
public enum HTTP2HeaderMapping {
    /// Fields that HTTP/2 forbids (RFC 9113 §8.2.2). `te` is handled on its own.
    public static let connectionSpecific: Set<String> = ["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"]

    /// A request as received: the head (target from `:path`, or `:authority` for CONNECT),
    /// its `:scheme`, and `:protocol` of an extended CONNECT (RFC 8441).
    public struct Request: Sendable, Equatable {
        public var head: HTTPRequestHead
        public var scheme: String
        public var extendedProtocol: String?
    }

    public static func request(from fields: [HTTPField]) throws(HTTP2MappingError) -> Request {
        var method: String?, scheme: String?, path: String?, authority: String?, proto: String?
        var regular: [HTTPField] = []
        regular.reserveCapacity(fields.count)
        var cookies: [String] = []
        var host: String?
        for f in fields {
            if f.name.hasPrefix(":") {
                guard regular.isEmpty && cookies.isEmpty && host == nil else {
                    throw HTTP2MappingError("h2.pseudo_header_after_field", "\(f.name) follows a regular field (RFC 9113 §8.3)")
                }
                func set(_ slot: inout String?) throws(HTTP2MappingError) {
                    guard slot == nil else { throw HTTP2MappingError("h2.duplicate_pseudo_header", "\(f.name) appears twice") }
                    slot = f.value
                }
                switch f.name {
                case ":method": try set(&method)
                case ":scheme": try set(&scheme)
                case ":path": try set(&path)
                case ":authority": try set(&authority)
                case ":protocol": try set(&proto)
                default: throw HTTP2MappingError("h2.unknown_pseudo_header", "\(f.name) is not a request pseudo-header")
                }
                continue
            }
            try checkName(f.name)
            if connectionSpecific.contains(f.name) {
                throw HTTP2MappingError("h2.connection_specific_field", "\(f.name) is not allowed in HTTP/2 (RFC 9113 §8.2.2)")
            }
            if f.name == "te" && f.value.lowercased() != "trailers" {
                throw HTTP2MappingError("h2.te_not_trailers", "te may only be \"trailers\" in HTTP/2")
            }
            if f.name == "cookie" {
                cookies.append(f.value)
                continue
            }
            if f.name == "host" {
                guard host == nil else { throw HTTP2MappingError("h2.duplicate_host", "host appears twice") }
                host = f.value
                continue
            }
            regular.append(f)
        }
        guard let method else { throw HTTP2MappingError("h2.missing_pseudo_header", ":method is missing") }
        if method == "CONNECT" && proto == nil {
            // RFC 9113 §8.5: only :method and :authority.
            guard let authority, scheme == nil, path == nil else {
                throw HTTP2MappingError("h2.invalid_connect", "CONNECT carries :authority only")
            }
            var headers = HTTPHeaders()
            headers.add("Host", authority)
            headers.fields.append(contentsOf: regular)
            return Request(head: HTTPRequestHead(method: method, target: authority, version: .http1_1, headers: headers),
                           scheme: "", extendedProtocol: nil)
        }
        if proto != nil && method != "CONNECT" {
            throw HTTP2MappingError("h2.protocol_without_connect", ":protocol is only for CONNECT (RFC 8441 §4)")
        }
        guard let scheme else { throw HTTP2MappingError("h2.missing_pseudo_header", ":scheme is missing") }
        guard let path, !path.isEmpty else { throw HTTP2MappingError("h2.missing_pseudo_header", ":path is missing or empty") }
        if let authority, let host, authority != host {
            throw HTTP2MappingError("h2.authority_host_mismatch", ":authority and host differ")
        }
        guard let hostValue = authority ?? host else {
            throw HTTP2MappingError("h2.missing_authority", "neither :authority nor host names the target")
        }
        var headers = HTTPHeaders()
        headers.fields.reserveCapacity(regular.count + 2)
        headers.add("Host", hostValue)
        headers.fields.append(contentsOf: regular)
        // RFC 9113 §8.2.3: crumbs are joined with "; " before going to HTTP/1.1.
        if !cookies.isEmpty { headers.add("cookie", cookies.joined(separator: "; ")) }
        return Request(head: HTTPRequestHead(method: method, target: path, version: .http1_1, headers: headers),
                       scheme: scheme, extendedProtocol: proto)
    }

    /// An HTTP/1.1 request head (hop-by-hop fields already removed) as HTTP/2 fields:
    /// `:method`, `:scheme`, `:authority` (from `authority`, `Host` dropped), `:path`, then the
    /// other fields lower-cased, minus the connection-specific ones; `te` only as `trailers`.
    public static func requestFields(_ head: HTTPRequestHead, scheme: String, authority: String) -> [HTTPField] {
        var out: [HTTPField] = []
        out.reserveCapacity(head.headers.count + 4)
        out.append(HTTPField(name: ":method", value: head.method))
        out.append(HTTPField(name: ":scheme", value: scheme))
        out.append(HTTPField(name: ":authority", value: authority))
        out.append(HTTPField(name: ":path", value: head.target))
        appendRegular(head.headers, to: &out, dropping: "host")
        return out
    }

    /// An HTTP/2 response section as a head (version 1.1, a standard reason phrase).
    public static func responseHead(from fields: [HTTPField]) throws(HTTP2MappingError) -> HTTPResponseHead {
        var status: Int?
        var headers = HTTPHeaders()
        headers.fields.reserveCapacity(fields.count)
        for f in fields {
            if f.name.hasPrefix(":") {
                guard headers.count == 0 else {
                    throw HTTP2MappingError("h2.pseudo_header_after_field", "\(f.name) follows a regular field")
                }
                guard f.name == ":status", status == nil else {
                    throw HTTP2MappingError("h2.invalid_pseudo_header", "\(f.name) in a response")
                }
                let u = Array(f.value.utf8)
                guard u.count == 3, u.allSatisfy({ $0 >= 0x30 && $0 <= 0x39 }), let v = Int(f.value), (100...599).contains(v) else {
                    throw HTTP2MappingError("h2.invalid_status", ":status must be three digits 100-599")
                }
                status = v
                continue
            }
            try checkName(f.name)
            if connectionSpecific.contains(f.name) {
                throw HTTP2MappingError("h2.connection_specific_field", "\(f.name) is not allowed in HTTP/2 (RFC 9113 §8.2.2)")
            }
            headers.fields.append(f)
        }
        guard let status else { throw HTTP2MappingError("h2.missing_pseudo_header", ":status is missing") }
        return HTTPResponseHead(status: status, reason: reasonPhrase(status), version: .http1_1, headers: headers)
    }

    /// A response head as HTTP/2 fields: `:status`, then the fields lower-cased minus the
    /// connection-specific ones.
    public static func responseFields(_ head: HTTPResponseHead) -> [HTTPField] {
        var out: [HTTPField] = []
        out.reserveCapacity(head.headers.count + 1)
        out.append(HTTPField(name: ":status", value: String(head.status)))
        appendRegular(head.headers, to: &out, dropping: nil)
        return out
    }

    /// Trailer fields as HTTP/2 fields (no pseudo-headers, no connection-specific fields).
    public static func trailerFields(_ headers: HTTPHeaders) -> [HTTPField] {
        var out: [HTTPField] = []
        out.reserveCapacity(headers.count)
        for f in headers.fields where !f.name.hasPrefix(":") {
            let name = lower(f.name)
            if connectionSpecific.contains(name) || name == "te" || name == "content-length" { continue }
            out.append(HTTPField(name: name, value: f.value))
        }
        return out
    }

    /// Trailers as received, checked (no pseudo-headers, RFC 9113 §8.1).
    public static func trailers(from fields: [HTTPField]) throws(HTTP2MappingError) -> HTTPHeaders {
        for f in fields where f.name.hasPrefix(":") {
            throw HTTP2MappingError("h2.pseudo_header_in_trailers", "\(f.name) in a trailer section")
        }
        return HTTPHeaders(fields)
    }

    // MARK: helpers

    private static func appendRegular(_ headers: HTTPHeaders, to out: inout [HTTPField], dropping: String?) {
        for f in headers.fields {
            let name = lower(f.name)
            if connectionSpecific.contains(name) || name == dropping { continue }
            if name == "te" {
                // RFC 9113 §8.2.2: only "trailers".
                if HTTPHeaderRules.listValues(HTTPHeaders([f]), "te").contains(where: { $0.lowercased() == "trailers" }) {
                    out.append(HTTPField(name: "te", value: "trailers"))
                }
                continue
            }
            out.append(HTTPField(name: name, value: f.value))
        }
    }

    @inline(__always)
    static func lower(_ name: String) -> String {
        var needs = false
        for b in name.utf8 where b >= 0x41 && b <= 0x5A { needs = true; break }
        return needs ? name.lowercased() : name
    }

    /// Field names in HTTP/2 are lower-case tokens (RFC 9113 §8.2.1; nghttp2 checks the rest).
    private static func checkName(_ name: String) throws(HTTP2MappingError) {
        for b in name.utf8 where b >= 0x41 && b <= 0x5A {
            throw HTTP2MappingError("h2.uppercase_field_name", "\(name) has upper-case letters (RFC 9113 §8.2.1)")
        }
    }

    public static func reasonPhrase(_ status: Int) -> String {
        switch status {
        case 100: "Continue"
        case 101: "Switching Protocols"
        case 103: "Early Hints"
        case 200: "OK"
        case 201: "Created"
        case 202: "Accepted"
        case 204: "No Content"
        case 206: "Partial Content"
        case 301: "Moved Permanently"
        case 302: "Found"
        case 303: "See Other"
        case 304: "Not Modified"
        case 307: "Temporary Redirect"
        case 308: "Permanent Redirect"
        case 400: "Bad Request"
        case 401: "Unauthorized"
        case 403: "Forbidden"
        case 404: "Not Found"
        case 405: "Method Not Allowed"
        case 409: "Conflict"
        case 413: "Content Too Large"
        case 415: "Unsupported Media Type"
        case 422: "Unprocessable Content"
        case 429: "Too Many Requests"
        case 500: "Internal Server Error"
        case 501: "Not Implemented"
        case 502: "Bad Gateway"
        case 503: "Service Unavailable"
        case 504: "Gateway Timeout"
        default: ""
        }
    }
}
