import Testing
@testable import BearerdHTTP

/// RFC 9110 §6.5.1–§6.5.2: fields a trailer section must not carry. Requests with framing or
/// routing fields in their trailers are refused; a response's are discarded (its body is already
/// delimited), and a proxy passes on only the fields `forwardableTrailers` admits.
@Suite("Forbidden trailer fields")
struct TrailerRuleTests {
    static let chunkedResponse = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n"

    @Test(arguments: ["Host: x", "Content-Length: 5", "Transfer-Encoding: chunked", "host: a, b"])
    func aResponseKeepsItsBodyAndLosesTheForbiddenTrailer(field: String) {
        let o = expectSuccess(Self.chunkedResponse + "\(field)\r\nX-Ok: 1\r\n\r\n", role: .client, methods: ["GET"])
        #expect(o.bodies.flatMap { $0 } == bytes("hello"))
        #expect(o.ends == [hdrs(("X-Ok", "1"))])
    }

    @Test func aResponseWhoseOnlyTrailerIsForbiddenEndsWithoutTrailers() {
        let o = expectSuccess(Self.chunkedResponse + "Host: x\r\n\r\n", role: .client, methods: ["GET"])
        #expect(o.ends == [nil])
    }

    /// The connection goes on: the next response on it is parsed as usual.
    @Test func theNextResponseFollows() {
        let o = expectSuccess(Self.chunkedResponse + "Content-Length: 3\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", role: .client, methods: ["GET", "GET"])
        #expect(o.responseHeads.map(\.status) == [200, 204])
    }

    /// Malformed trailer lines stay errors on both sides (they are framing, not fields).
    @Test func malformedTrailerLinesStayErrorsInResponses() {
        expectFailure(Self.chunkedResponse + "A : 1\r\n\r\n", "http1.invalid_trailer", role: .client, methods: ["GET"])
        expectFailure(Self.chunkedResponse + "A: 1\r\n folded\r\n\r\n", "http1.invalid_trailer", role: .client, methods: ["GET"])
    }

    @Test func requestsWithFramingOrRoutingTrailersAreStillRefused() {
        let head = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"
        expectFailure(head + "Host: b\r\n\r\n", "http1.invalid_trailer", status: 400)
        expectFailure(head + "Content-Length: 5\r\n\r\n", "http1.invalid_trailer", status: 400)
    }

    @Test func forwardableTrailersDropsForbiddenFields() {
        let t = hdrs(("grpc-status", "0"), ("Authorization", "Bearer client"), ("Host", "x"), ("content-length", "1"),
                     ("Set-Cookie", "a=b"), ("X-Checksum", "abc"), ("Connection", "close"), ("TE", "trailers"), (":status", "200"))
        #expect(HTTPHeaderRules.forwardableTrailers(t) == hdrs(("grpc-status", "0"), ("X-Checksum", "abc")))
        #expect(HTTPHeaderRules.forwardableTrailers(hdrs(("AUTHORIZATION", "x"))) == nil)
        #expect(HTTPHeaderRules.forwardableTrailers(nil) == nil)
        #expect(HTTPHeaderRules.forwardableTrailers(HTTPHeaders()) == nil)
        let fine = hdrs(("grpc-status", "16"), ("grpc-message", "no"))
        #expect(HTTPHeaderRules.forwardableTrailers(fine) == fine)
    }
}
