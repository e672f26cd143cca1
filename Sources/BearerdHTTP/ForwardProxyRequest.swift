/// What a request to a forward proxy (`outbound_proxy:`, docs/architecture.md §4) looks like, for both users
/// (the token endpoint client and upstream connections): the `CONNECT` that opens a tunnel for an
/// https (or h2c prior-knowledge) target (RFC 9110 §9.3.6, authority-form target RFC 9112
/// §3.2.3), and the absolute form of a plain http request sent to the proxy itself (RFC 9112
/// §3.2.2). `proxyAuthorization` is the `Proxy-Authorization` value (RFC 9110 §11.7.2), e.g.
/// `Basic …` from the proxy URL's credentials, added only when given. Pure and stateless.
public enum ForwardProxyRequest {
    /// `host:port`, an IPv6 literal in brackets (RFC 3986 §3.2.2).
    public static func authority(host: String, port: UInt16) -> String {
        (host.contains(":") ? "[\(host)]" : host) + ":\(port)"
    }

    /// The head of `CONNECT host:port HTTP/1.1` with `Host` set to the same authority (RFC 9112
    /// §3.2.3: the Host of a CONNECT is the target's authority).
    public static func connect(host: String, port: UInt16, proxyAuthorization: String?) -> HTTPRequestHead {
        let target = authority(host: host, port: port)
        var headers = HTTPHeaders()
        headers.add("Host", target)
        if let proxyAuthorization { headers.add("Proxy-Authorization", proxyAuthorization) }
        return HTTPRequestHead(method: "CONNECT", target: target, headers: headers)
    }

    /// The serialized `connect(host:port:proxyAuthorization:)` head.
    public static func connectBytes(host: String, port: UInt16, proxyAuthorization: String?) -> [UInt8] {
        var bytes: [UInt8] = []
        HTTP1Serializer.writeRequestHead(connect(host: host, port: port, proxyAuthorization: proxyAuthorization), into: &bytes)
        return bytes
    }

    /// `head` (origin-form, for an http origin at `authority`) as sent to the proxy: the target in
    /// absolute form `http://authority/path?query` and `Proxy-Authorization` appended when given.
    /// The other fields (Host included) are kept as they are.
    public static func absoluteForm(_ head: HTTPRequestHead, authority: String, proxyAuthorization: String?) -> HTTPRequestHead {
        var h = head
        h.target = "http://" + authority + head.target
        if let proxyAuthorization { h.headers.add("Proxy-Authorization", proxyAuthorization) }
        return h
    }
}
