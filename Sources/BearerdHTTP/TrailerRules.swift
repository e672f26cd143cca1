extension HTTPHeaderRules {
    /// Fields that must not travel in a trailer section, lowercased (RFC 9110 §6.5.1: fields
    /// needed before the content is processed — framing, routing, authentication, request
    /// modifiers, response controls, content format — and hop-by-hop fields). Go's net/http
    /// keeps a similar list (`badTrailer`); the proxy's own forwarding fields and `DPoP` are
    /// added here, since bearerd sets those in the header section itself.
    public static let fieldsForbiddenInTrailers: Set<String> = [
        // framing (RFC 9112 §6) and routing (RFC 9110 §7.2)
        "content-length", "transfer-encoding", "trailer", "host",
        // hop-by-hop (RFC 9110 §7.6.1)
        "connection", "keep-alive", "proxy-connection", "te", "upgrade",
        // authentication (RFC 9110 §11.6, §11.7; RFC 6265; RFC 9449)
        "authorization", "proxy-authorization", "www-authenticate", "proxy-authenticate",
        "authentication-info", "proxy-authentication-info", "cookie", "set-cookie", "dpop", "realm",
        // request modifiers (RFC 9110 §7.6.2, §10.1, §13, §14.2)
        "expect", "max-forwards", "range", "if-match", "if-none-match", "if-modified-since",
        "if-unmodified-since", "if-range", "cache-control", "pragma",
        // response control data (RFC 9110 §10.2, §12.5.5; RFC 9111 §5)
        "age", "expires", "location", "retry-after", "vary", "warning",
        // content format (RFC 9110 §8)
        "content-type", "content-encoding", "content-range",
        // forwarding metadata the proxy writes in the header section (RFC 7239; X-Forwarded-*; RFC 9110 §7.6.3)
        "forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto", "via",
    ]

    /// Whether `name` may travel in a trailer section (also false for HTTP/2 pseudo-fields).
    public static func isAllowedInTrailers(_ name: String) -> Bool {
        if name.utf8.first == UInt8(ascii: ":") { return false }
        return !fieldsForbiddenInTrailers.contains(lowercasedASCII(name))
    }

    /// The trailer fields a proxy passes on: those `isAllowedInTrailers` admits. RFC 9110 §6.5.1
    /// forbids merging them into the header section and §6.5.2 lets a recipient discard them,
    /// which is what happens to the others; nil when none is left. The same section comes back
    /// (no copy) when every field may pass.
    public static func forwardableTrailers(_ trailers: HTTPHeaders?) -> HTTPHeaders? {
        guard let trailers, trailers.count > 0 else { return nil }
        guard trailers.fields.contains(where: { !isAllowedInTrailers($0.name) }) else { return trailers }
        let kept = trailers.fields.filter { isAllowedInTrailers($0.name) }
        return kept.isEmpty ? nil : HTTPHeaders(kept)
    }

    private static func lowercasedASCII(_ s: String) -> String {
        guard s.utf8.contains(where: { $0 >= 0x41 && $0 <= 0x5A }) else { return s }
        return String(decoding: s.utf8.map { $0 >= 0x41 && $0 <= 0x5A ? $0 | 0x20 : $0 }, as: UTF8.self)
    }
}
