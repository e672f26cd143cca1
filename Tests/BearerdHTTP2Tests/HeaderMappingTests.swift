import Testing
import BearerdHTTP
import BearerdHTTP2

@Suite("HTTP2HeaderMapping (RFC 9113 §8.2-8.3)")
struct HeaderMappingTests {
    @Test func requestBecomesAnHTTP11Head() throws {
        let r = try HTTP2HeaderMapping.request(from: f([(":method", "POST"), (":scheme", "https"), (":authority", "api.example:8443"),
                                                        (":path", "/v1?q=1"), ("cookie", "a=1"), ("content-type", "x"), ("cookie", "b=2"), ("te", "trailers")]))
        #expect(r.head.method == "POST")
        #expect(r.head.target == "/v1?q=1")
        #expect(r.head.version == .http1_1)
        #expect(r.head.headers["Host"] == "api.example:8443")
        #expect(r.head.headers.values("cookie") == ["a=1; b=2"])
        #expect(r.scheme == "https")
        #expect(r.extendedProtocol == nil)
    }

    @Test func malformedRequestsAreRefused() {
        func reason(_ fields: [(String, String)]) -> String? {
            do { _ = try HTTP2HeaderMapping.request(from: f(fields)); return nil } catch { return error.reason }
        }
        let base = [(":method", "GET"), (":scheme", "http"), (":authority", "a"), (":path", "/")]
        #expect(reason(base) == nil)
        #expect(reason(Array(base.dropFirst())) == "h2.missing_pseudo_header")
        #expect(reason([(":method", "GET"), (":scheme", "http"), (":authority", "a")]) == "h2.missing_pseudo_header")
        #expect(reason(base + [("connection", "close")]) == "h2.connection_specific_field")
        #expect(reason(base + [("transfer-encoding", "chunked")]) == "h2.connection_specific_field")
        #expect(reason(base + [("te", "gzip")]) == "h2.te_not_trailers")
        #expect(reason(base + [("X-Upper", "1")]) == "h2.uppercase_field_name")
        #expect(reason([(":method", "GET"), ("accept", "*/*"), (":path", "/")]) == "h2.pseudo_header_after_field")
        #expect(reason(base + [("accept", "*/*"), (":method", "GET")]) == "h2.pseudo_header_after_field")
        #expect(reason(base + [(":method", "GET")]) == "h2.duplicate_pseudo_header")
        #expect(reason([(":method", "GET"), (":method", "POST")]) == "h2.duplicate_pseudo_header")
        #expect(reason(base + [("host", "b")]) == "h2.authority_host_mismatch")
        #expect(reason([(":method", "GET"), (":scheme", "http"), (":path", "/")]) == "h2.missing_authority")
        #expect(reason([(":method", "GET"), (":scheme", "http"), (":path", "/"), ("host", "h")]) == nil)
        #expect(reason([(":method", "GET"), (":protocol", "websocket"), (":scheme", "http"), (":authority", "a"), (":path", "/")]) == "h2.protocol_without_connect")
    }

    @Test func outgoingRequestFields() {
        var h = HTTPHeaders()
        h.add("Host", "client.example")
        h.add("Content-Type", "application/json")
        h.add("TE", "gzip, trailers")
        h.add("Transfer-Encoding", "chunked")
        h.add("Authorization", "Bearer t")
        let fields = HTTP2HeaderMapping.requestFields(HTTPRequestHead(method: "POST", target: "/x", headers: h), scheme: "https", authority: "api:443")
        #expect(fields == f([(":method", "POST"), (":scheme", "https"), (":authority", "api:443"), (":path", "/x"),
                             ("content-type", "application/json"), ("te", "trailers"), ("authorization", "Bearer t")]))
    }

    @Test func responsesBothWays() throws {
        let head = try HTTP2HeaderMapping.responseHead(from: f([(":status", "404"), ("content-length", "3")]))
        #expect(head.status == 404)
        #expect(head.reason == "Not Found")
        #expect(head.headers["Content-Length"] == "3")
        #expect(throws: HTTP2MappingError.self) { try HTTP2HeaderMapping.responseHead(from: f([(":status", "20")])) }
        #expect(throws: HTTP2MappingError.self) { try HTTP2HeaderMapping.responseHead(from: f([(":status", "+20")])) }
        #expect(throws: HTTP2MappingError.self) { try HTTP2HeaderMapping.responseHead(from: f([("x", "1")])) }
        var h = HTTPHeaders()
        h.add("Content-Type", "text/plain")
        h.add("Connection", "keep-alive")
        h.add("Keep-Alive", "5")
        #expect(HTTP2HeaderMapping.responseFields(HTTPResponseHead(status: 200, headers: h)) == f([(":status", "200"), ("content-type", "text/plain")]))
        #expect(HTTP2HeaderMapping.trailerFields(HTTPHeaders([("Grpc-Status", "0"), ("Connection", "x")])) == f([("grpc-status", "0")]))
    }

    /// For the session (which lower-cases names as it encodes them) the names stay as they are;
    /// the rules are the same: connection-specific fields dropped, `te` only as `trailers`.
    @Test func responseFieldsForTheSessionKeepNamesAndDropTheSameFields() {
        var h = HTTPHeaders()
        h.add("Content-Type", "text/plain")
        h.add("Connection", "close")
        h.add("Transfer-Encoding", "chunked")
        h.add("Upgrade", "h2c")
        h.add("Proxy-Connection", "x")
        h.add("TE", "trailers, deflate")
        h.add("X-Custom", "1")
        #expect(HTTP2HeaderMapping.responseFields(HTTPResponseHead(status: 299, headers: h), lowercasingNames: false)
                == f([(":status", "299"), ("Content-Type", "text/plain"), ("te", "trailers"), ("X-Custom", "1")]))
        #expect(HTTP2HeaderMapping.responseFields(HTTPResponseHead(status: 404, headers: h))
                == f([(":status", "404"), ("content-type", "text/plain"), ("te", "trailers"), ("x-custom", "1")]))
        h.remove("TE")
        h.add("te", "gzip")
        #expect(HTTP2HeaderMapping.responseFields(HTTPResponseHead(status: 200, headers: h), lowercasingNames: false)
                == f([(":status", "200"), ("Content-Type", "text/plain"), ("X-Custom", "1")]))
    }

    @Test func teOtherThanTrailersAndStatusDigitsAreChecked() {
        let base: [(String, String)] = [(":method", "GET"), (":scheme", "http"), (":authority", "a"), (":path", "/")]
        #expect((try? HTTP2HeaderMapping.request(from: f(base + [("te", "TRAILERS")]))) != nil)
        #expect(throws: HTTP2MappingError.self) { try HTTP2HeaderMapping.request(from: f(base + [("te", "gzip")])) }
        #expect(throws: HTTP2MappingError.self) { try HTTP2HeaderMapping.request(from: f(base + [("keep-alive", "5")])) }
        for bad in ["2000", "099", "600", "2a0", "", "1"] {
            #expect(throws: HTTP2MappingError.self, "\(bad)") { try HTTP2HeaderMapping.responseHead(from: f([(":status", bad)])) }
        }
        #expect((try? HTTP2HeaderMapping.responseHead(from: f([(":status", "599")])))?.status == 599)
        #expect((try? HTTP2HeaderMapping.responseHead(from: f([(":status", "100")])))?.status == 100)
    }

    /// The head's fields in order: `Host` first, the regular fields as sent, the joined cookie
    /// last; a CONNECT's head is `Host` and its regular fields.
    @Test func requestHeadFieldsKeepTheirOrder() throws {
        let r = try HTTP2HeaderMapping.request(from: f([(":method", "GET"), (":scheme", "http"), (":path", "/"), ("host", "h.example"),
                                                        ("accept", "*/*"), ("cookie", "a=1"), ("user-agent", "t"), ("te", "trailers")]))
        #expect(r.head.headers.fields == f([("Host", "h.example"), ("accept", "*/*"), ("user-agent", "t"), ("te", "trailers"), ("cookie", "a=1")]))
        #expect(r.head.headers.fields.first?.known == .host)
        let c = try HTTP2HeaderMapping.request(from: f([(":method", "CONNECT"), (":authority", "db:5432"), ("x-a", "1")]))
        #expect(c.head.target == "db:5432")
        #expect(c.head.headers.fields == f([("Host", "db:5432"), ("x-a", "1")]))
    }
}
