import Testing
@testable import BearerdHTTP

/// Classic request-smuggling inputs (CL.TE, TE.CL, TE.TE obfuscations, line-ending tricks).
/// `nil` reason means the input is valid and must parse with the stated framing.
struct SmugglingCase: Sendable, CustomTestStringConvertible {
    var name: String
    var input: String
    var reason: String?
    var status: Int = 400
    var testDescription: String { name }
}

let smugglingCases: [SmugglingCase] = [
    SmugglingCase(name: "CL.TE", input: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 13\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nSMUGGLED", reason: "http1.cl_and_te"),
    SmugglingCase(name: "TE.CL", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n", reason: "http1.cl_and_te"),
    SmugglingCase(name: "TE xchunked", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n", reason: "http1.invalid_transfer_encoding"),
    SmugglingCase(name: "TE chunkedx", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunkedx\r\n\r\n0\r\n\r\n", reason: "http1.invalid_transfer_encoding"),
    SmugglingCase(name: "TE space before colon", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n", reason: "http1.space_before_colon"),
    SmugglingCase(name: "TE tab value (valid)", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\tchunked\r\n\r\n0\r\n\r\n", reason: nil),
    SmugglingCase(name: "TE chunked in a second field", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", reason: "http1.invalid_transfer_encoding"),
    SmugglingCase(name: "TE duplicated chunked fields", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-encoding: chunked\r\n\r\n0\r\n\r\n", reason: "http1.invalid_transfer_encoding"),
    SmugglingCase(name: "TE chunked, chunked", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", reason: "http1.invalid_transfer_encoding"),
    SmugglingCase(name: "TE identity, chunked", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity, chunked\r\n\r\n0\r\n\r\n", reason: "http1.unsupported_transfer_coding", status: 501),
    SmugglingCase(name: "TE vertical tab", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\u{0B}chunked\r\n\r\n0\r\n\r\n", reason: "http1.invalid_field_value"),
    SmugglingCase(name: "TE form feed", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\u{0C}\r\n\r\n0\r\n\r\n", reason: "http1.invalid_field_value"),
    SmugglingCase(name: "TE obs-fold", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n", reason: "http1.obs_fold"),
    SmugglingCase(name: "TE obs-fold after other field", input: "POST / HTTP/1.1\r\nHost: a\r\nX: y\r\n Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", reason: "http1.obs_fold"),
    SmugglingCase(name: "TE name with underscore", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer_Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello", reason: nil),
    SmugglingCase(name: "TE quoted", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \"chunked\"\r\n\r\n0\r\n\r\n", reason: "http1.invalid_transfer_encoding"),
    SmugglingCase(name: "TE in HTTP/1.0", input: "POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", reason: "http1.te_in_http10"),
    SmugglingCase(name: "CL with plus", input: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhello", reason: "http1.invalid_content_length"),
    SmugglingCase(name: "CL with minus", input: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", reason: "http1.invalid_content_length"),
    SmugglingCase(name: "CL hex", input: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x5\r\n\r\nhello", reason: "http1.invalid_content_length"),
    SmugglingCase(name: "CL inner space", input: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1 0\r\n\r\nhello", reason: "http1.invalid_content_length"),
    SmugglingCase(name: "CL empty", input: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", reason: "http1.invalid_content_length"),
    SmugglingCase(name: "CL overflow", input: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551617\r\n\r\n", reason: "http1.invalid_content_length"),
    SmugglingCase(name: "CL duplicate differing", input: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!", reason: "http1.conflicting_content_length"),
    SmugglingCase(name: "CL list differing", input: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 6\r\n\r\nhello!", reason: "http1.conflicting_content_length"),
    SmugglingCase(name: "CL duplicate identical (valid)", input: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\ncontent-length: 5\r\n\r\nhello", reason: nil),
    SmugglingCase(name: "CL space before colon", input: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length : 5\r\n\r\nhello", reason: "http1.space_before_colon"),
    SmugglingCase(name: "LF-only line endings", input: "POST / HTTP/1.1\nHost: a\nContent-Length: 5\n\nhello", reason: "http1.bare_lf"),
    SmugglingCase(name: "LF-only request line", input: "GET / HTTP/1.1\nHost: a\r\n\r\n", reason: "http1.bare_lf"),
    SmugglingCase(name: "LF-only end of head", input: "GET / HTTP/1.1\r\nHost: a\r\n\n", reason: "http1.bare_lf"),
    SmugglingCase(name: "bare CR in field", input: "GET / HTTP/1.1\r\nHost: a\r\nX: a\rTransfer-Encoding: chunked\r\n\r\n", reason: "http1.bare_cr"),
    SmugglingCase(name: "NUL in value", input: "GET / HTTP/1.1\r\nHost: a\r\nX: a\u{0}b\r\n\r\n", reason: "http1.invalid_field_value"),
    SmugglingCase(name: "NUL in name", input: "GET / HTTP/1.1\r\nHost: a\r\nX\u{0}: ab\r\n\r\n", reason: "http1.invalid_field_name"),
    SmugglingCase(name: "chunk size 0x10", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0x10\r\n0123456789abcdef\r\n0\r\n\r\n", reason: "http1.invalid_chunk_size"),
    SmugglingCase(name: "chunk size leading space", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n 5\r\nhello\r\n0\r\n\r\n", reason: "http1.invalid_chunk_size"),
    SmugglingCase(name: "chunk size overflow", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFF\r\nhello\r\n0\r\n\r\n", reason: "http1.invalid_chunk_size"),
    SmugglingCase(name: "chunk size wraps to 5", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000005\r\nhello\r\n0\r\n\r\n", reason: "http1.invalid_chunk_size"),
    SmugglingCase(name: "chunk size 2^64-1", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nhello\r\n0\r\n\r\n", reason: "http1.chunk_size_too_large"),
    SmugglingCase(name: "chunk size 2^63", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n8000000000000000\r\nhello\r\n0\r\n\r\n", reason: "http1.chunk_size_too_large"),
    SmugglingCase(name: "Content-Length 2^63", input: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9223372036854775808\r\n\r\nhello", reason: "http1.invalid_content_length"),
    SmugglingCase(name: "chunk size negative", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nhello\r\n0\r\n\r\n", reason: "http1.invalid_chunk_size"),
    SmugglingCase(name: "chunk size LF only", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n", reason: "http1.bare_lf"),
    SmugglingCase(name: "chunk data without CRLF", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n", reason: "http1.invalid_chunk_data"),
    SmugglingCase(name: "chunk data with LF only", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n", reason: "http1.invalid_chunk_data"),
    SmugglingCase(name: "chunk ext with bare CR", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;a\rb\r\nhello\r\n0\r\n\r\n", reason: "http1.bare_cr"),
    SmugglingCase(name: "trailer obs-fold", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: a\r\n b\r\n\r\n", reason: "http1.invalid_trailer"),
    SmugglingCase(name: "trailer smuggles CL", input: "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nContent-Length: 10\r\n\r\n", reason: "http1.invalid_trailer"),
    SmugglingCase(name: "absolute-form (valid)", input: "GET http://a/x HTTP/1.1\r\nHost: a\r\n\r\n", reason: nil),
    SmugglingCase(name: "no Host", input: "GET / HTTP/1.1\r\n\r\n", reason: "http1.missing_host"),
    SmugglingCase(name: "two Hosts", input: "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", reason: "http1.duplicate_host"),
    SmugglingCase(name: "Host with path", input: "GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", reason: "http1.invalid_host"),
    SmugglingCase(name: "Host with userinfo", input: "GET / HTTP/1.1\r\nHost: evil@a\r\n\r\n", reason: "http1.invalid_host"),
    SmugglingCase(name: "HTTP/2.0 request line", input: "GET / HTTP/2.0\r\nHost: a\r\n\r\n", reason: "http1.version_not_supported", status: 505),
    SmugglingCase(name: "HTTP/0.9 style", input: "GET /\r\n\r\n", reason: "http1.invalid_request_line"),
    SmugglingCase(name: "lowercase version", input: "GET / http/1.1\r\nHost: a\r\n\r\n", reason: "http1.invalid_version"),
    SmugglingCase(name: "space in target", input: "GET /a b HTTP/1.1\r\nHost: a\r\n\r\n", reason: "http1.invalid_version"),
    SmugglingCase(name: "tab in request line", input: "GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n", reason: "http1.invalid_method"),
    SmugglingCase(name: "pipelined smuggle after valid CL body", input: "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /x HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", reason: "http1.cl_and_te"),
]

@Suite struct SmugglingTests {
    @Test(arguments: smugglingCases)
    func smuggling(_ c: SmugglingCase) {
        let outcome = verify(c.input)
        if let reason = c.reason {
            #expect(outcome.error?.reason == reason, "\(c.name): \(outcome)")
            #expect(outcome.error?.status == c.status, "\(c.name): \(outcome)")
        } else {
            #expect(outcome.error == nil, "\(c.name): \(outcome)")
            #expect(outcome.ends.count == 1, "\(c.name): \(outcome)")
        }
    }

    @Test func tabValueIsChunked() {
        let o = verify("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\tchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n")
        #expect(o.framings == [.chunked])
        #expect(o.bodies == [bytes("hello")])
    }

    @Test func underscoreNameIsNotFraming() {
        // "Transfer_Encoding" is a different field: the Content-Length frames the body.
        let o = verify("POST / HTTP/1.1\r\nHost: a\r\nTransfer_Encoding: chunked\r\nContent-Length: 5\r\n\r\nhello")
        #expect(o.framings == [.contentLength(5)])
    }
}
