import Testing
@testable import BearerdHTTP

@Suite struct RequestParsingTests {
    @Test func simpleGet() {
        let o = expectSuccess("GET /index.html?q=1 HTTP/1.1\r\nHost: example.com\r\nAccept: */*\r\n\r\n")
        #expect(o.events == [
            .requestHead(HTTPRequestHead(method: "GET", target: "/index.html?q=1", version: .http1_1,
                                         headers: ["Host": "example.com", "Accept": "*/*"]), framing: .none),
            .end(trailers: nil),
        ])
    }

    @Test func contentLengthBody() {
        let o = expectSuccess("POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\nhello world")
        #expect(o.framings == [.contentLength(11)])
        #expect(o.bodies == [bytes("hello world")])
        #expect(o.ends == [nil])
    }

    @Test func contentLengthZeroIsNone() {
        let o = expectSuccess("POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
        #expect(o.framings == [.none])
        #expect(o.events.count == 2)
    }

    @Test func chunkedBody() {
        let o = expectSuccess("POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
        #expect(o.framings == [.chunked])
        #expect(o.bodies == [bytes("hello world")])
        #expect(o.ends == [nil])
    }

    @Test func chunkedWithExtensionsAndTrailers() {
        let o = expectSuccess("POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
            + "5 ; name = value ;flag\r\nhello\r\nA;q=\"quo\\\"ted; x\"\r\n0123456789\r\n0;last\r\nX-Checksum: abc\r\nX-Other:  v  \r\n\r\n")
        #expect(o.bodies == [bytes("hello0123456789")])
        #expect(o.ends == [HTTPHeaders([("X-Checksum", "abc"), ("X-Other", "v")])])
    }

    @Test func hexChunkSizesUpperAndLower() {
        let data = String(repeating: "x", count: 0x1f)
        let o = expectSuccess("POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1F\r\n\(data)\r\n01f\r\n\(data)\r\n000\r\n\r\n")
        #expect(o.bodies == [bytes(data + data)])
    }

    @Test func sixteenHexDigitsAccepted() {
        // 16 digits is the maximum; the value fits in UInt64. Only the size line matters here.
        let o = runParser([bytes("POST /p HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0000000000000003\r\nabc\r\n0\r\n\r\n")])
        #expect(o.error == nil)
        #expect(o.bodies == [bytes("abc")])
    }

    @Test func http10WithoutHost() {
        let o = expectSuccess("GET / HTTP/1.0\r\n\r\n")
        #expect(o.requestHeads.first?.version == .http1_0)
    }

    @Test func leadingEmptyLinesSkipped() {
        let o = expectSuccess("\r\n\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n")
        #expect(o.requestHeads.count == 1)
        expectFailure(String(repeating: "\r\n", count: 9) + "GET / HTTP/1.1\r\nHost: a\r\n\r\n", "http1.invalid_request_line")
    }

    @Test func valueTrimmingAndUTF8() {
        let o = expectSuccess("GET / HTTP/1.1\r\nHost: a\r\nX-A: \t caf\u{e9} \t\r\nX-Empty:\r\nX-Tab:a\tb\r\n\r\n")
        let h = o.requestHeads.first?.headers
        #expect(h?["x-a"] == "caf\u{e9}")
        #expect(h?["X-Empty"] == "")
        #expect(h?["x-tab"] == "a\tb")
    }

    @Test func invalidUTF8Rejected() {
        var input = bytes("GET / HTTP/1.1\r\nHost: a\r\nX-A: ab")
        input += [0xFF, 0xFE]
        input += bytes("\r\n\r\n")
        let o = verify(input)
        #expect(o.error?.reason == "http1.invalid_field_value")
        #expect(o.error?.offset == 30)
    }

    @Test func fieldSyntaxErrors() {
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\n: x\r\n\r\n", "http1.invalid_field_name")
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nNoColon\r\n\r\n", "http1.missing_colon")
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nBad(Name): x\r\n\r\n", "http1.invalid_field_name")
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nX-A : x\r\n\r\n", "http1.space_before_colon")
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nX-A\t: x\r\n\r\n", "http1.space_before_colon")
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nX-A: a\r\n b\r\n\r\n", "http1.obs_fold")
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nX-A: a\r\n\tb\r\n\r\n", "http1.obs_fold")
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nX-A: a\u{0}b\r\n\r\n", "http1.invalid_field_value")
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nX-A: a\u{0B}b\r\n\r\n", "http1.invalid_field_value")
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nX-A: a\u{7F}b\r\n\r\n", "http1.invalid_field_value")
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nX-A: a\rb\r\n\r\n", "http1.bare_cr")
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nX-A: a\nb\r\n\r\n", "http1.bare_lf")
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n\n", "http1.bare_lf")
    }

    @Test func errorOffsetIsAbsolute() {
        // Offset of the NUL, in a second pipelined request.
        let first = "GET / HTTP/1.1\r\nHost: a\r\n\r\n"
        let second = "GET / HTTP/1.1\r\nHost: a\r\nX: ab\u{0}\r\n\r\n"
        let o = verify(first + second)
        #expect(o.requestHeads.count == 1)
        #expect(o.error?.reason == "http1.invalid_field_value")
        #expect(o.error?.offset == first.utf8.count + "GET / HTTP/1.1\r\nHost: a\r\nX: ab".utf8.count)
        #expect(o.error?.status == 400)
    }

    @Test func requestLineErrors() {
        expectFailure("GET / HTTP/2.0\r\nHost: a\r\n\r\n", "http1.version_not_supported", status: 505)
        expectFailure("GET / HTTP/1.2\r\nHost: a\r\n\r\n", "http1.version_not_supported", status: 505)
        expectFailure("GET / HTTP/1.1 \r\nHost: a\r\n\r\n", "http1.invalid_version")
        expectFailure("GET / http/1.1\r\nHost: a\r\n\r\n", "http1.invalid_version")
        expectFailure("GET / HTTP/11\r\nHost: a\r\n\r\n", "http1.invalid_version")
        expectFailure("GET /\r\nHost: a\r\n\r\n", "http1.invalid_request_line")
        expectFailure("GET  / HTTP/1.1\r\nHost: a\r\n\r\n", "http1.invalid_request_line")
        expectFailure(" GET / HTTP/1.1\r\nHost: a\r\n\r\n", "http1.invalid_method")
        expectFailure("G(T / HTTP/1.1\r\nHost: a\r\n\r\n", "http1.invalid_method")
        expectFailure("GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n", "http1.invalid_method")
        expectFailure("GET /a\u{7F}b HTTP/1.1\r\nHost: a\r\n\r\n", "http1.invalid_target")
        expectFailure("GET /caf\u{e9} HTTP/1.1\r\nHost: a\r\n\r\n", "http1.invalid_target")
        expectFailure("GET / HTTP/1.1\nHost: a\r\n\r\n", "http1.bare_lf")
        expectFailure("GET / HTTP/1.1\rHost: a\r\n\r\n", "http1.bare_cr")
    }

    @Test(arguments: [
        ("GET / HTTP/1.1", true),
        ("GET http://example.com/a HTTP/1.1", true),
        ("GET HTTPS://example.com HTTP/1.1", true),
        ("GET http:// HTTP/1.1", false),
        ("GET ftp://example.com/ HTTP/1.1", false),
        ("GET example.com:443 HTTP/1.1", false),
        ("GET * HTTP/1.1", false),
        ("OPTIONS * HTTP/1.1", true),
        ("OPTIONS / HTTP/1.1", true),
        ("CONNECT example.com:443 HTTP/1.1", true),
        ("CONNECT [::1]:443 HTTP/1.1", true),
        ("CONNECT example.com HTTP/1.1", false),
        ("CONNECT / HTTP/1.1", false),
        ("GET a/b HTTP/1.1", false),
        ("GET /a#frag HTTP/1.1", false),
        ("GET /a?b=c&d=%20 HTTP/1.1", true),
    ])
    func targetForms(line: String, valid: Bool) {
        let outcome = verify(line + "\r\nHost: example.com\r\n\r\n")
        if valid {
            #expect(outcome.error == nil, "\(outcome)")
        } else {
            #expect(outcome.error?.reason == "http1.invalid_target", "\(outcome)")
        }
    }

    @Test(arguments: [
        ("example.com", true), ("example.com:8080", true), ("127.0.0.1", true), ("[::1]", true),
        ("[2001:db8::1]:443", true), ("a%20b", true), ("xn--bcher-kva.example", true),
        ("", false), ("a b", false), ("a/b", false), ("a:", false), ("a:99999", false), ("a:80x", false),
        (":80", false), ("[::1", false), ("[zz::1]", false), ("a@b", false), ("a%2", false), ("[::1]x", false),
    ])
    func hostValidation(host: String, valid: Bool) {
        let outcome = verify("GET / HTTP/1.1\r\nHost: \(host)\r\n\r\n")
        if valid {
            #expect(outcome.error == nil, "\(outcome)")
        } else {
            #expect(outcome.error?.reason == "http1.invalid_host", "\(outcome)")
        }
    }

    @Test func hostPresence() {
        expectFailure("GET / HTTP/1.1\r\n\r\n", "http1.missing_host")
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nhost: a\r\n\r\n", "http1.duplicate_host")
        expectFailure("GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", "http1.duplicate_host")
        expectSuccess("GET / HTTP/1.0\r\nHost: a\r\n\r\n")
        expectSuccess("GET http://b/ HTTP/1.1\r\nHost: b\r\n\r\n")
    }

    @Test func contentLengthRules() {
        let ok = expectSuccess("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc")
        #expect(ok.bodies == [bytes("abc")])
        let list = expectSuccess("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3 , 3,3\r\n\r\nabc")
        #expect(list.framings == [.contentLength(3)])
        let zeros = expectSuccess("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 003\r\n\r\nabc")
        #expect(zeros.framings == [.contentLength(3)])
        for bad in ["+3", "-3", "0x3", "3 3", "", "3,", ",3", "3,,3", "3a", "18446744073709551616", "99999999999999999999999"] {
            expectFailure("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: \(bad)\r\n\r\nabc", "http1.invalid_content_length")
        }
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", "http1.conflicting_content_length")
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 4\r\n\r\nabcd", "http1.conflicting_content_length")
        // Lengths above 2^63-1 are refused (docs/architecture.md §5); 2^63-1 itself is the largest accepted.
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551615\r\n\r\n", "http1.invalid_content_length")
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9223372036854775808\r\n\r\n", "http1.invalid_content_length")
        let max = expectSuccess("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9223372036854775807\r\n\r\n")
        #expect(max.framings == [.contentLength(UInt64(Int64.max))])
    }

    @Test func transferEncodingRules() {
        for ok in ["chunked", "Chunked", "CHUNKED", " chunked ", "\tchunked"] {
            let o = expectSuccess("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\(ok)\r\n\r\n0\r\n\r\n")
            #expect(o.framings == [.chunked])
        }
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", "http1.unsupported_transfer_coding", status: 501)
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", "http1.invalid_transfer_encoding", status: 400)
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\n\r\n", "http1.invalid_transfer_encoding", status: 400)
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", "http1.invalid_transfer_encoding")
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "http1.invalid_transfer_encoding")
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n", "http1.invalid_transfer_encoding")
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked,\r\n\r\n", "http1.invalid_transfer_encoding")
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked;q=1\r\n\r\n", "http1.invalid_transfer_encoding")
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \"chunked\"\r\n\r\n", "http1.invalid_transfer_encoding")
        expectFailure("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "http1.te_in_http10")
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", "http1.cl_and_te")
    }

    @Test func chunkSyntaxErrors() {
        let head = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        expectFailure(head + "\r\nabc\r\n0\r\n\r\n", "http1.invalid_chunk_size")
        expectFailure(head + "g\r\n", "http1.invalid_chunk_size")
        expectFailure(head + "-1\r\n", "http1.invalid_chunk_size")
        expectFailure(head + "+1\r\n", "http1.invalid_chunk_size")
        expectFailure(head + "0x10\r\n", "http1.invalid_chunk_size")
        expectFailure(head + " 5\r\nhello\r\n0\r\n\r\n", "http1.invalid_chunk_size")
        expectFailure(head + "10000000000000000\r\n", "http1.invalid_chunk_size")
        expectFailure(head + "00000000000000001\r\n", "http1.invalid_chunk_size")
        expectFailure(head + "5 \r\nhello\r\n0\r\n\r\n", "http1.invalid_chunk_ext")
        expectFailure(head + "5;\r\nhello\r\n0\r\n\r\n", "http1.invalid_chunk_ext")
        expectFailure(head + "5;a=\r\nhello\r\n0\r\n\r\n", "http1.invalid_chunk_ext")
        expectFailure(head + "5;a=\"x\r\nhello\r\n0\r\n\r\n", "http1.invalid_chunk_ext")
        expectFailure(head + "5;a b\r\nhello\r\n0\r\n\r\n", "http1.invalid_chunk_ext")
        expectFailure(head + "5;a=b \r\nhello\r\n0\r\n\r\n", "http1.invalid_chunk_ext")
        expectFailure(head + "5;a=\"\u{1}\"\r\nhello\r\n0\r\n\r\n", "http1.invalid_chunk_ext")
        expectFailure(head + "5\r\nhelloX\r\n0\r\n\r\n", "http1.invalid_chunk_data")
        expectFailure(head + "5\r\nhello\rX0\r\n\r\n", "http1.invalid_chunk_data")
        expectFailure(head + "5\r\nhello\n0\r\n\r\n", "http1.invalid_chunk_data")
        expectFailure(head + "5\nhello\r\n0\r\n\r\n", "http1.bare_lf")
        expectFailure(head + "5\r\nhello\r\n0\r\n\n", "http1.invalid_trailer")
        let long = "1;" + String(repeating: "a", count: 5000) + "\r\nx\r\n0\r\n\r\n"
        expectFailure(head + long, "http1.chunk_line_too_long")
    }

    @Test func chunkExtensionsAccepted() {
        let head = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        for ext in [";a", ";a=b", " ;a", "\t; a = b", ";a=\"\"", ";a=\"x y\\\"z\"", ";a;b=c;d", ";a =\t\"q\""] {
            let o = expectSuccess(head + "3\(ext)\r\nabc\r\n0\(ext)\r\n\r\n")
            #expect(o.bodies == [bytes("abc")], "\(ext)")
        }
    }

    @Test func trailerRules() {
        let head = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        let o = expectSuccess(head + "0\r\nA: 1\r\nB: 2\r\n\r\n")
        #expect(o.ends == [HTTPHeaders([("A", "1"), ("B", "2")])])
        expectFailure(head + "0\r\nA: 1\r\n folded\r\n\r\n", "http1.invalid_trailer")
        expectFailure(head + "0\r\nA : 1\r\n\r\n", "http1.invalid_trailer")
        expectFailure(head + "0\r\nA: \u{0}\r\n\r\n", "http1.invalid_trailer")
        expectFailure(head + "0\r\nContent-Length: 5\r\n\r\n", "http1.invalid_trailer")
        expectFailure(head + "0\r\nTransfer-Encoding: chunked\r\n\r\n", "http1.invalid_trailer")
        expectFailure(head + "0\r\nHost: b\r\n\r\n", "http1.invalid_trailer")
        expectFailure(head + "0\r\nA: 1\rB: 2\r\n\r\n", "http1.invalid_trailer")
    }

    @Test func pipelinedMixedFraming() {
        let input = "GET /1 HTTP/1.1\r\nHost: a\r\n\r\n"
            + "POST /2 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello"
            + "POST /3 HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nT: v\r\n\r\n"
            + "GET /4 HTTP/1.0\r\n\r\n"
        let o = expectSuccess(input)
        #expect(o.requestHeads.map(\.target) == ["/1", "/2", "/3", "/4"])
        #expect(o.framings == [.none, .contentLength(5), .chunked, .none])
        #expect(o.bodies == [bytes("hello"), bytes("abc")])
        #expect(o.ends == [nil, nil, HTTPHeaders([("T", "v")]), nil])
        // Strict order: head, (body), end for each request.
        #expect(o.events.count == 4 + 2 + 4)
    }

    @Test func threeRequestsInOneFeed() {
        let one = "GET / HTTP/1.1\r\nHost: a\r\n\r\n"
        var parser = HTTP1Parser(role: .server)
        parser.feed(bytes(one + one + one))
        var kinds: [String] = []
        while let e = try? parser.next() {
            switch e {
            case .requestHead: kinds.append("head")
            case .end: kinds.append("end")
            default: kinds.append("other")
            }
        }
        #expect(kinds == ["head", "end", "head", "end", "head", "end"])
        #expect(parser.isBetweenMessages)
        #expect(parser.bufferedByteCount == 0)
    }

    @Test func eofHandling() throws {
        // EOF between messages: nil forever.
        var p = HTTP1Parser(role: .server)
        p.feed(bytes("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
        _ = try p.next()
        _ = try p.next()
        p.feedEOF()
        #expect(try p.next() == nil)
        #expect(try p.next() == nil)
        #expect(p.isBetweenMessages)
        // Truncated head / body.
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\n", "http1.truncated", status: 400, eof: true)
        expectFailure("GET / HT", "http1.truncated", eof: true)
        let cl = expectFailure("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc", "http1.truncated", eof: true)
        #expect(cl?.offset == "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc".utf8.count)
        let chunkHead = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        for tail in ["", "5", "5\r\nhel", "5\r\nhello", "5\r\nhello\r", "5\r\nhello\r\n0\r\n", "5\r\nhello\r\n0\r\nA: b\r\n"] {
            expectFailure(chunkHead + tail, "http1.truncated", eof: true)
        }
        // An extra CRLF after a message then EOF is fine.
        let extra = expectSuccess("GET / HTTP/1.1\r\nHost: a\r\n\r\n\r\n", eof: true)
        #expect(extra.requestHeads.count == 1)
    }

    @Test func bodyIsStreamedAsItArrives() throws {
        var p = HTTP1Parser(role: .server)
        p.feed(bytes("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\nabc"))
        guard case .requestHead = try p.next() else { Issue.record("no head"); return }
        #expect(!p.isBetweenMessages)
        #expect(try p.next() == .body(ArraySlice(bytes("abc"))))
        #expect(try p.next() == nil)
        p.feed(bytes("defghij"))
        #expect(try p.next() == .body(ArraySlice(bytes("defghij"))))
        #expect(try p.next() == .end(trailers: nil))
        #expect(p.isBetweenMessages)
        #expect(try p.next() == nil)
    }

    @Test func isBetweenMessagesTracksTheStartLine() throws {
        var p = HTTP1Parser(role: .server)
        #expect(p.isBetweenMessages)
        p.feed(bytes("GET / HT"))
        #expect(try p.next() == nil)
        #expect(p.isBetweenMessages)
        p.feed(bytes("TP/1.1\r\nHo"))
        #expect(try p.next() == nil)
        #expect(!p.isBetweenMessages)
        p.feed(bytes("st: a\r\n\r\n"))
        _ = try p.next()
        #expect(!p.isBetweenMessages)
        #expect(try p.next() == .end(trailers: nil))
        #expect(p.isBetweenMessages)
    }

    @Test func errorsAreSticky() {
        var p = HTTP1Parser(role: .server)
        p.feed(bytes("GET / HTTP/1.1\r\nHost : a\r\n\r\n"))
        var first: HTTP1Error?
        do { _ = try p.next() } catch { first = error }
        #expect(first?.reason == "http1.space_before_colon")
        p.feed(bytes("GET / HTTP/1.1\r\nHost: a\r\n\r\n"))
        do {
            _ = try p.next()
            Issue.record("expected the same error again")
        } catch {
            #expect(error == first)
        }
    }

    @Test func expectsContinueHeadIsDeliveredBeforeTheBody() throws {
        var p = HTTP1Parser(role: .server)
        p.feed(bytes("PUT /x HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n"))
        guard case .requestHead(let head, let framing)? = try p.next() else { Issue.record("no head"); return }
        #expect(framing == .contentLength(4))
        #expect(HTTPHeaderRules.expectsContinue(head))
        #expect(try p.next() == nil)
        p.feed(bytes("data"))
        #expect(try p.next() == .body(ArraySlice(bytes("data"))))
        #expect(try p.next() == .end(trailers: nil))
    }
}
