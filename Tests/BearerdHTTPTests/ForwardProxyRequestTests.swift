import Testing
@testable import BearerdHTTP

/// The requests bearerd sends to a forward proxy (`ForwardProxyRequest`, docs/architecture.md §4), and the
/// client parser's reading of the answer to a CONNECT (RFC 9112 §6.3 rule 2).
@Suite struct ForwardProxyRequestTests {
    @Test func connectHeadWithAndWithoutCredentials() {
        let withAuth = ForwardProxyRequest.connectBytes(host: "api.example.com", port: 443, proxyAuthorization: "Basic cHg6cHc=")
        #expect(String(decoding: withAuth, as: UTF8.self)
            == "CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\nProxy-Authorization: Basic cHg6cHc=\r\n\r\n")
        let bare = ForwardProxyRequest.connectBytes(host: "::1", port: 8443, proxyAuthorization: nil)
        #expect(String(decoding: bare, as: UTF8.self) == "CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\n\r\n")
    }

    /// What bearerd writes, a strict server parser reads as a valid CONNECT (authority-form).
    @Test func connectHeadParsesAsAConnectRequest() throws {
        var server = HTTP1Parser(role: .server)
        server.feed(ForwardProxyRequest.connectBytes(host: "10.0.0.7", port: 8443, proxyAuthorization: "Basic eA=="))
        guard case .requestHead(let head, let framing)? = try server.next() else {
            Issue.record("no request head")
            return
        }
        #expect(head.method == "CONNECT")
        #expect(head.target == "10.0.0.7:8443")
        #expect(head.headers["Host"] == "10.0.0.7:8443")
        #expect(head.headers["Proxy-Authorization"] == "Basic eA==")
        #expect(framing == .none)
    }

    @Test func absoluteFormKeepsFieldsAndAddsCredentials() {
        var headers = HTTPHeaders()
        headers.add("Host", "origin.test:8080")
        headers.add("Accept", "*/*")
        let head = HTTPRequestHead(method: "POST", target: "/token?x=1", headers: headers)
        let proxied = ForwardProxyRequest.absoluteForm(head, authority: "origin.test:8080", proxyAuthorization: "Basic eA==")
        #expect(proxied.target == "http://origin.test:8080/token?x=1")
        #expect(proxied.method == "POST")
        #expect(proxied.headers.fields.map(\.name) == ["Host", "Accept", "Proxy-Authorization"])
        #expect(proxied.headers["Proxy-Authorization"] == "Basic eA==")
        let anonymous = ForwardProxyRequest.absoluteForm(head, authority: "origin.test:8080", proxyAuthorization: nil)
        #expect(anonymous.headers["Proxy-Authorization"] == nil)
    }

    /// RFC 9112 §6.3 rule 2: after a 2xx to CONNECT the bytes are the tunnel's, whatever
    /// Content-Length the proxy sent; they come back whole from `switchProtocols()`.
    @Test func twoHundredToConnectSwitchesToTheTunnel() throws {
        var p = HTTP1Parser(role: .client)
        p.expectResponse(to: "CONNECT")
        p.feed(Array("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 Connection established\r\nContent-Length: 3\r\n\r\n\u{16}\u{03}\u{01}tls".utf8))
        guard case .responseHead(let interim, _)? = try p.next(), interim.status == 100 else {
            Issue.record("no 100")
            return
        }
        guard case .responseHead(let head, let framing)? = try p.next() else {
            Issue.record("no final head")
            return
        }
        #expect(head.status == 200)
        #expect(framing == .none)
        #expect(try p.next() == nil)
        #expect(p.switchProtocols() == Array("\u{16}\u{03}\u{01}tls".utf8))
    }

    /// A refusal is an ordinary response: its body is framed as usual.
    @Test func refusalToConnectIsFramedAsUsual() throws {
        var p = HTTP1Parser(role: .client)
        p.expectResponse(to: "CONNECT")
        p.feed(Array("HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 2\r\n\r\nno".utf8))
        guard case .responseHead(let head, let framing)? = try p.next() else {
            Issue.record("no head")
            return
        }
        #expect(head.status == 407)
        #expect(framing == .contentLength(2))
        guard case .body(let body)? = try p.next() else {
            Issue.record("no body")
            return
        }
        #expect(Array(body) == Array("no".utf8))
    }
}
