import BearerdHTTP

/// Header rewriting for both directions (docs/architecture.md §5). Pure functions.
public enum ProxyHeaders {
    public static let viaToken = "1.1 bearerd"

    /// Builds the upstream request head from the client's head.
    /// - Hop-by-hop fields removed (RFC 9110 §7.6.1), `Expect` removed (bearerd answers 100-continue itself).
    /// - `Host` set to the upstream authority; `X-Forwarded-For/-Proto/-Host` and `Via` added.
    /// - Body framing re-declared from the parsed framing.
    public static func upstreamRequest(client head: HTTPRequestHead, framing: HTTP1BodyFraming, target: String,
                                       route: RouteRule, clientAddress: String, originalHost: Substring?,
                                       forwardedProto: String = "http") -> HTTPRequestHead {
        // One pass over the client's fields (this runs for every request).
        var fields: [HTTPField] = []
        fields.reserveCapacity(head.headers.count + 7)
        fields.append(HTTPField.host(route.upstreamAuthority))
        let seen = copyEndToEnd(head.headers, into: &fields, mergingForwardedFor: true) { kind in
            kind == .expect || kind == .contentLength || kind == .host || kind == .xForwardedProto
        }
        if let i = seen.xForwardedFor {
            fields[i].value = fields[i].value + ", " + clientAddress
        } else {
            fields.append(HTTPField.xForwardedFor(clientAddress))
        }
        fields.append(HTTPField.xForwardedProto(forwardedProto))
        if let originalHost, !seen.xForwardedHost { fields.append(HTTPField.xForwardedHost(String(originalHost))) }
        appendVia(&fields, at: seen.via, version: head.version)
        switch framing {
        case .none, .closeDelimited: break
        case .contentLength(let n): fields.append(HTTPField.contentLength(String(n)))
        case .chunked: fields.append(HTTPField.transferEncoding("chunked"))
        }
        let out = HTTPHeaders(fields)
        return HTTPRequestHead(method: head.method, target: target, version: .http1_1, headers: out)
    }

    /// How the response body is sent to the client.
    public enum ClientFraming: Equatable {
        case none
        case contentLength(UInt64)
        case chunked
        /// HTTP/1.0 client and no length known: the body ends with the connection.
        case untilClose
    }

    /// Builds the client response head from the upstream's.
    public static func clientResponse(upstream head: HTTPResponseHead, framing: HTTP1BodyFraming, requestMethod: String,
                                      clientVersion: HTTPVersion, keepAlive: Bool) -> (HTTPResponseHead, ClientFraming) {
        let bodyless = requestMethod == "HEAD" || head.status == 204 || head.status == 304 || head.isInformational
        var fields: [HTTPField] = []
        fields.reserveCapacity(head.headers.count + 3)
        // Content-Length of a HEAD/304 answer is kept as sent; otherwise it is re-declared.
        let seen = copyEndToEnd(head.headers, into: &fields) { kind in !bodyless && kind == .contentLength }
        var clientFraming: ClientFraming
        if bodyless {
            clientFraming = .none
        } else {
            switch framing {
            case .none: clientFraming = .contentLength(0)
            case .contentLength(let n): clientFraming = .contentLength(n)
            case .chunked, .closeDelimited: clientFraming = clientVersion == .http1_1 ? .chunked : .untilClose
            }
            switch clientFraming {
            case .contentLength(let n): fields.append(HTTPField.contentLength(String(n)))
            case .chunked: fields.append(HTTPField.transferEncoding("chunked"))
            default: break
            }
        }
        appendVia(&fields, at: seen.via, version: head.version)
        if !head.isInformational {
            let persistent = keepAlive && clientFraming != .untilClose
            if !persistent {
                fields.append(HTTPField.connection("close"))
            } else if clientVersion == .http1_0 {
                fields.append(HTTPField.connection("keep-alive"))
            }
        }
        let h = HTTPHeaders(fields)
        return (HTTPResponseHead(status: head.status, reason: head.reason, version: .http1_1, headers: h), clientFraming)
    }

    /// `clientResponse` written straight into `buffer` as bytes, identical to
    /// `HTTP1Serializer.writeResponseHead(clientResponse(...).0)` but without building the
    /// rewritten head (this runs for every HTTP/1.1 response).
    public static func writeClientResponse(upstream head: HTTPResponseHead, framing: HTTP1BodyFraming, requestMethod: String,
                                           clientVersion: HTTPVersion, keepAlive: Bool, into buffer: inout [UInt8]) -> ClientFraming {
        let bodyless = requestMethod == "HEAD" || head.status == 204 || head.status == 304 || head.isInformational
        var clientFraming: ClientFraming = .none
        if !bodyless {
            switch framing {
            case .none: clientFraming = .contentLength(0)
            case .contentLength(let n): clientFraming = .contentLength(n)
            case .chunked, .closeDelimited: clientFraming = clientVersion == .http1_1 ? .chunked : .untilClose
            }
        }
        let named = HTTPHeaderRules.connectionOptions(head.headers)
        let token: StaticString = head.version == .http1_0 ? "1.0 bearerd" : "1.1 bearerd"  // `viaToken` for 1.1
        // Status line, the fields, and at most: Content-Length (20 digits) or Transfer-Encoding,
        // Via (or ", " + token after the upstream's), Connection, the blank line.
        let estimate = 160 + head.reason.utf8.count + HTTP1Serializer.fieldsSize(head.headers)
        buffer.appendingHead(estimate: estimate) { c in
            HTTP1Serializer.putStatusLine(status: head.status, reason: head.reason, version: .http1_1, into: &c)
            var viaWritten = false
            for field in head.headers.fields {
                let kind = field.known
                if kind.isHopByHop || (!bodyless && kind == .contentLength) || named.names(field) { continue }
                if kind == .via {
                    if viaWritten { continue }
                    viaWritten = true
                    c.put(field.name)
                    c.put(": " as StaticString)
                    c.put(field.value)
                    c.put(", " as StaticString)
                    c.put(token)
                    c.put("\r\n" as StaticString)
                    continue
                }
                HTTP1Serializer.putField(field, into: &c)
            }
            switch clientFraming {
            case .contentLength(let n):
                c.put("Content-Length: " as StaticString)
                c.putDecimal(n)
                c.put("\r\n" as StaticString)
            case .chunked:
                c.put("Transfer-Encoding: chunked\r\n" as StaticString)
            default:
                break
            }
            if !viaWritten {
                c.put("Via: " as StaticString)
                c.put(token)
                c.put("\r\n" as StaticString)
            }
            if !head.isInformational {
                let persistent = keepAlive && clientFraming != .untilClose
                if !persistent {
                    c.put("Connection: close\r\n" as StaticString)
                } else if clientVersion == .http1_0 {
                    c.put("Connection: keep-alive\r\n" as StaticString)
                }
            }
            c.put("\r\n" as StaticString)
        }
        return clientFraming
    }

    /// What a request's `Upgrade` asks for (RFC 9110 §7.8; docs/architecture.md §5).
    public enum UpgradeRequest: Equatable, Sendable {
        /// No upgrade request: no `Upgrade` field, or one that does not make an upgrade request
        /// (not named in `Connection`, or on HTTP/1.0). The field is dropped as hop-by-hop.
        case none
        /// `Upgrade: websocket` on an HTTP/1.1 GET (RFC 6455 §4.1): tunnelled after the upstream's 101.
        case websocket
        /// `Upgrade: h2c` only: ignored, as RFC 9113 §3.1 deprecates it; the request goes on in HTTP/1.1
        /// (clients that want HTTP/2 without TLS use prior knowledge, which every listener accepts).
        case ignoredH2C
        /// Anything else: refused with 400, never silently downgraded.
        case unsupported(String)
    }

    public static func upgradeRequest(_ head: HTTPRequestHead) -> UpgradeRequest {
        guard head.headers.contains(.upgrade) else { return .none }
        // RFC 9110 §7.8: a sender of Upgrade must also send the "upgrade" connection option, and
        // a server must ignore Upgrade in an HTTP/1.0 request. Either way this is no upgrade
        // request: `Upgrade` is removed like any hop-by-hop field and the request is forwarded
        // (docs/architecture.md §5), whatever protocol it names.
        guard head.version == .http1_1, HTTPHeaderRules.connectionOptions(head.headers).upgrade else { return .none }
        let protocols = HTTPHeaderRules.listValues(head.headers, "Upgrade")
        if protocols.isEmpty { return .unsupported("an empty Upgrade field") }
        if protocols.contains(where: { asciiCaseInsensitiveEquals($0, "websocket") }) {
            guard head.method == "GET" else {
                return .unsupported("a WebSocket handshake is an HTTP/1.1 GET with Connection: Upgrade (RFC 6455 §4.1)")
            }
            return .websocket
        }
        if protocols.allSatisfy({ asciiCaseInsensitiveEquals($0, "h2c") }) { return .ignoredH2C }
        return .unsupported("bearerd tunnels Upgrade: websocket only, not \(protocols.joined(separator: ", "))")
    }

    /// The client's copy of an upstream response head for an HTTP/2 client: hop-by-hop fields
    /// removed, `Via` added; lengths kept as the upstream sent them (DATA frames carry the body).
    public static func h2ClientResponse(upstream head: HTTPResponseHead) -> HTTPResponseHead {
        var h = head.headers
        HTTPHeaderRules.removeHopByHop(&h)
        if !head.isInformational { appendVia(&h, version: head.version) }
        return HTTPResponseHead(status: head.status, reason: head.reason, version: .http1_1, headers: h)
    }

    /// Re-adds the upgrade fields that the hop-by-hop rule removed from an upstream request.
    public static func addWebSocketUpgrade(_ head: inout HTTPRequestHead) {
        head.headers.set("Connection", "Upgrade")
        head.headers.set("Upgrade", "websocket")
    }

    /// The client's copy of the upstream's 101: the upgrade fields are kept (they are the point).
    public static func switchingProtocolsResponse(upstream head: HTTPResponseHead) -> HTTPResponseHead {
        var h = head.headers
        let upgrade = h.values("Upgrade")
        HTTPHeaderRules.removeHopByHop(&h)
        h.add("Connection", "Upgrade")
        for u in upgrade { h.add("Upgrade", u) }
        appendVia(&h, version: head.version)
        return HTTPResponseHead(status: 101, reason: head.reason.isEmpty ? "Switching Protocols" : head.reason, version: .http1_1, headers: h)
    }

    /// Where `copyEndToEnd` put the first `X-Forwarded-For` and `Via` (later ones are merged
    /// into them, so dropped), and whether an `X-Forwarded-Host` was there.
    struct CopiedFields {
        var xForwardedFor: Int?
        var via: Int?
        var xForwardedHost = false
    }

    /// Appends the end-to-end fields of `headers` to `out` in one pass: hop-by-hop fields, the
    /// fields its `Connection` names (RFC 9110 §7.6.1), those `drop` names, every `Via` after
    /// the first and (`mergingForwardedFor`, requests) every `X-Forwarded-For` after the first
    /// are left out.
    static func copyEndToEnd(_ headers: HTTPHeaders, into out: inout [HTTPField], mergingForwardedFor: Bool = false,
                             drop: (KnownField) -> Bool) -> CopiedFields {
        var seen = CopiedFields()
        // The options a Connection field names apply to every field, before or after it.
        let named = HTTPHeaderRules.connectionOptions(headers)
        for field in headers.fields {
            let kind = field.known
            if kind.isHopByHop || drop(kind) { continue }
            switch kind {
            case .xForwardedFor:
                if mergingForwardedFor && seen.xForwardedFor != nil { continue }
            case .via:
                if seen.via != nil { continue }
            default:
                break
            }
            if named.names(field) { continue }
            switch kind {
            case .xForwardedFor: if seen.xForwardedFor == nil { seen.xForwardedFor = out.count }
            case .via: seen.via = out.count
            case .xForwardedHost: seen.xForwardedHost = true
            default: break
            }
            out.append(field)
        }
        return seen
    }

    static func appendVia(_ fields: inout [HTTPField], at index: Int?, version: HTTPVersion) {
        let token = version == .http1_0 ? "1.0 bearerd" : viaToken
        if let index {
            fields[index].value = fields[index].value + ", " + token
        } else {
            fields.append(HTTPField.via(token))
        }
    }

    static func appendVia(_ h: inout HTTPHeaders, version: HTTPVersion) {
        let token = version == .http1_0 ? "1.0 bearerd" : viaToken
        if let prior = h["Via"] {
            h.set("Via", prior + ", " + token)
        } else {
            h.add("Via", token)
        }
    }
}
