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
        // The regular fields go straight into the head (`Host` is put first at the end): room
        // for all of them and the `Host` and joined `cookie` fields, so the array never grows.
        var headers = HTTPHeaders()
        headers.fields.reserveCapacity(fields.count + 2)
        var cookies: [String] = []
        var host: String?
        for f in fields {
            if f.name.utf8.first == 0x3A {  // ":"
                guard headers.fields.isEmpty && cookies.isEmpty && host == nil else {
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
            // The name is lower-case (checked), so its kind is that of the exact name.
            if isConnectionSpecific(f.known) {
                throw HTTP2MappingError("h2.connection_specific_field", "\(f.name) is not allowed in HTTP/2 (RFC 9113 §8.2.2)")
            }
            if f.known == .te && !asciiCaseInsensitiveEquals(f.value, "trailers") {
                throw HTTP2MappingError("h2.te_not_trailers", "te may only be \"trailers\" in HTTP/2")
            }
            if f.name.utf8.count == 6 && f.name == "cookie" {
                cookies.append(f.value)
                continue
            }
            if f.known == .host {
                guard host == nil else { throw HTTP2MappingError("h2.duplicate_host", "host appears twice") }
                host = f.value
                continue
            }
            headers.fields.append(f)
        }
        guard let method else { throw HTTP2MappingError("h2.missing_pseudo_header", ":method is missing") }
        if method == "CONNECT" && proto == nil {
            // RFC 9113 §8.5: only :method and :authority.
            guard let authority, scheme == nil, path == nil else {
                throw HTTP2MappingError("h2.invalid_connect", "CONNECT carries :authority only")
            }
            headers.fields.insert(.host(authority), at: 0)
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
        headers.fields.insert(.host(hostValue), at: 0)
        // RFC 9113 §8.2.3: crumbs are joined with "; " before going to HTTP/1.1.
        if !cookies.isEmpty { headers.add("cookie", cookies.count == 1 ? cookies[0] : cookies.joined(separator: "; ")) }
        return Request(head: HTTPRequestHead(method: method, target: path, version: .http1_1, headers: headers),
                       scheme: scheme, extendedProtocol: proto)
    }

    /// An HTTP/1.1 request head (hop-by-hop fields already removed) as HTTP/2 fields:
    /// `:method`, `:scheme`, `:authority` (from `authority`, `Host` dropped), `:path`, then the
    /// other fields lower-cased, minus the connection-specific ones; `te` only as `trailers`.
    /// `lowercasingNames: false` keeps the names as they are (for `HTTP2Session`, which lower-cases
    /// names as it encodes them).
    public static func requestFields(_ head: HTTPRequestHead, scheme: String, authority: String,
                                     lowercasingNames: Bool = true) -> [HTTPField] {
        var out: [HTTPField] = []
        out.reserveCapacity(head.headers.count + 4)
        out.append(HTTPField(name: ":method", value: head.method))
        out.append(HTTPField(name: ":scheme", value: scheme))
        out.append(HTTPField(name: ":authority", value: authority))
        out.append(HTTPField(name: ":path", value: head.target))
        appendRegular(head.headers, to: &out, droppingHost: true, lowercasingNames: lowercasingNames)
        return out
    }

    /// An HTTP/2 response section as a head (version 1.1, a standard reason phrase).
    public static func responseHead(from fields: [HTTPField]) throws(HTTP2MappingError) -> HTTPResponseHead {
        var status: Int?
        var headers = HTTPHeaders()
        headers.fields.reserveCapacity(fields.count)
        for f in fields {
            if f.name.utf8.first == 0x3A {  // ":"
                guard headers.count == 0 else {
                    throw HTTP2MappingError("h2.pseudo_header_after_field", "\(f.name) follows a regular field")
                }
                guard f.name == ":status", status == nil else {
                    throw HTTP2MappingError("h2.invalid_pseudo_header", "\(f.name) in a response")
                }
                var v = 0
                for b in f.value.utf8 where v >= 0 {
                    v = b >= 0x30 && b <= 0x39 && v < 100 ? v * 10 + Int(b - 0x30) : -1
                }
                guard f.value.utf8.count == 3, (100...599).contains(v) else {
                    throw HTTP2MappingError("h2.invalid_status", ":status must be three digits 100-599")
                }
                status = v
                continue
            }
            try checkName(f.name)
            if isConnectionSpecific(f.known) {
                throw HTTP2MappingError("h2.connection_specific_field", "\(f.name) is not allowed in HTTP/2 (RFC 9113 §8.2.2)")
            }
            headers.fields.append(f)
        }
        guard let status else { throw HTTP2MappingError("h2.missing_pseudo_header", ":status is missing") }
        return HTTPResponseHead(status: status, reason: reasonPhrase(status), version: .http1_1, headers: headers)
    }

    /// A response head as HTTP/2 fields: `:status`, then the fields lower-cased minus the
    /// connection-specific ones. `lowercasingNames: false` keeps the names as they are, for a
    /// caller that hands the fields straight to `HTTP2Session`, which lower-cases names as it
    /// encodes them (a `String` less per field with upper-case letters).
    public static func responseFields(_ head: HTTPResponseHead, lowercasingNames: Bool = true) -> [HTTPField] {
        var out: [HTTPField] = []
        out.reserveCapacity(head.headers.count + 1)
        out.append(HTTPField(name: ":status", value: statusValue(head.status)))
        appendRegular(head.headers, to: &out, droppingHost: false, lowercasingNames: lowercasingNames)
        return out
    }

    /// Trailer fields as HTTP/2 fields (no pseudo-headers, no connection-specific fields).
    public static func trailerFields(_ headers: HTTPHeaders) -> [HTTPField] {
        var out: [HTTPField] = []
        out.reserveCapacity(headers.count)
        for f in headers.fields where f.name.utf8.first != 0x3A {
            if isConnectionSpecific(f.known) || f.known == .te || f.known == .contentLength { continue }
            out.append(HTTPField(name: lower(f.name), value: f.value))
        }
        return out
    }

    /// Trailers as received, checked (no pseudo-headers, RFC 9113 §8.1).
    public static func trailers(from fields: [HTTPField]) throws(HTTP2MappingError) -> HTTPHeaders {
        for f in fields where f.name.utf8.first == 0x3A {
            throw HTTP2MappingError("h2.pseudo_header_in_trailers", "\(f.name) in a trailer section")
        }
        return HTTPHeaders(fields)
    }

    // MARK: helpers

    /// `known` is a field HTTP/2 forbids (RFC 9113 §8.2.2; `te` aside): `connectionSpecific` by kind.
    @inline(__always)
    static func isConnectionSpecific(_ known: KnownField) -> Bool {
        switch known {
        case .connection, .keepAlive, .proxyConnection, .transferEncoding, .upgrade: return true
        default: return false
        }
    }

    /// `:status`'s value: a literal for the common codes.
    static func statusValue(_ status: Int) -> String {
        switch status {
        case 200: "200"
        case 204: "204"
        case 206: "206"
        case 301: "301"
        case 302: "302"
        case 304: "304"
        case 400: "400"
        case 401: "401"
        case 403: "403"
        case 404: "404"
        case 500: "500"
        case 502: "502"
        case 503: "503"
        case 504: "504"
        default: String(status)
        }
    }

    /// The fields by kind (`HTTPField.known`), so no name is compared or hashed as a `String`.
    private static func appendRegular(_ headers: HTTPHeaders, to out: inout [HTTPField], droppingHost: Bool, lowercasingNames: Bool) {
        for i in headers.fields.indices {
            let known = headers.fields[i].known
            if isConnectionSpecific(known) || (droppingHost && known == .host) { continue }
            if known == .te {
                let f = headers.fields[i]
                // RFC 9113 §8.2.2: only "trailers".
                if HTTPHeaderRules.listValues(HTTPHeaders([f]), "te").contains(where: { $0.lowercased() == "trailers" }) {
                    out.append(HTTPField(name: "te", value: "trailers"))
                }
                continue
            }
            if lowercasingNames {
                out.append(HTTPField(name: lower(headers.fields[i].name), value: headers.fields[i].value))
            } else {
                out.append(headers.fields[i])
            }
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
