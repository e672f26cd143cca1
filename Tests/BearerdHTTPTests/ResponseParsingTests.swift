import Testing
@testable import BearerdHTTP

@Suite struct ResponseParsingTests {
    @Test func contentLengthResponse() {
        let o = expectSuccess("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nServer: x\r\n\r\nhello", role: .client, methods: ["GET"])
        #expect(o.responseHeads == [HTTPResponseHead(status: 200, reason: "OK", headers: ["Content-Length": "5", "Server": "x"])])
        #expect(o.framings == [.contentLength(5)])
        #expect(o.bodies == [bytes("hello")])
        #expect(o.ends == [nil])
    }

    /// docs/architecture.md §5: chunk sizes and lengths above 2^63-1 are refused, never waited for.
    @Test func hugeChunkSizeAndContentLengthAreRefused() {
        _ = expectFailure("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nx",
                          "http1.chunk_size_too_large", role: .client, methods: ["GET"])
        _ = expectFailure("HTTP/1.1 200 OK\r\nContent-Length: 18446744073709551615\r\n\r\nx",
                          "http1.invalid_content_length", role: .client, methods: ["GET"])
        let ok = expectSuccess("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0000000000000001\r\nx\r\n0\r\n\r\n",
                               role: .client, methods: ["GET"])
        #expect(ok.bodies == [bytes("x")])
    }

    @Test func headResponseWithContentLengthHasNoBody() {
        let o = expectSuccess("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi",
                              role: .client, methods: ["HEAD", "GET"])
        #expect(o.framings == [.none, .contentLength(2)])
        #expect(o.bodies == [bytes("hi")])
        #expect(o.ends.count == 2)
    }

    @Test func headResponseWithChunkedHasNoBody() {
        let o = expectSuccess("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", role: .client, methods: ["HEAD"])
        #expect(o.framings == [.none])
        #expect(o.ends.count == 1)
    }

    @Test func noContentAndNotModified() {
        let o = expectSuccess("HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 304 Not Modified\r\nContent-Length: 100\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
                              role: .client, methods: ["DELETE", "GET", "GET"])
        #expect(o.responseHeads.map(\.status) == [204, 304, 200])
        #expect(o.framings == [.none, .none, .contentLength(1)])
        #expect(o.bodies == [bytes("x")])
        #expect(o.ends.count == 3)
    }

    @Test func informationalThenFinal() {
        let o = expectSuccess("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"
                              + "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n",
                              role: .client, methods: ["HEAD", "GET"])
        // The 1xx responses do not consume the queued HEAD: the final 200 is the HEAD response.
        #expect(o.responseHeads.map(\.status) == [100, 103, 200, 200])
        #expect(o.framings == [.none, .none, .none, .none])
        #expect(o.ends.count == 2)
        #expect(o.bodies.isEmpty)
        // The 1xx heads are not followed by .end.
        if case .responseHead(let h, _) = o.events[1] { #expect(h.status == 103) } else { Issue.record("\(o)") }
    }

    @Test func notBetweenMessagesAfterAnInformationalHead() throws {
        var p = HTTP1Parser(role: .client)
        p.expectResponse(to: "POST")
        #expect(p.isBetweenMessages)
        p.feed(bytes("HTTP/1.1 100 Continue\r\n\r\n"))
        guard case .responseHead(let h, .none)? = try p.next() else { Issue.record("no 100"); return }
        #expect(h.status == 100)
        #expect(try p.next() == nil)
        #expect(!p.isBetweenMessages)
        p.feed(bytes("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"))
        guard case .responseHead(_, .none)? = try p.next() else { Issue.record("no 200"); return }
        #expect(try p.next() == .end(trailers: nil))
        #expect(p.isBetweenMessages)
    }

    @Test func continueBeforeBody() {
        let o = expectSuccess("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 3\r\n\r\nabc", role: .client, methods: ["PUT"])
        #expect(o.events == [
            .responseHead(HTTPResponseHead(status: 100, reason: "Continue"), framing: .none),
            .responseHead(HTTPResponseHead(status: 201, reason: "Created", headers: ["Content-Length": "3"]), framing: .contentLength(3)),
            .body(ArraySlice(bytes("abc"))),
            .end(trailers: nil),
        ])
    }

    @Test func switchingProtocolsIsAnError() {
        expectFailure("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", "http1.unexpected_switching_protocols", role: .client, methods: ["GET"])
    }

    /// RFC 9110 §15.2.2: a 101 answers only a request that offered the upgrade; parsing then
    /// stops and the bytes after the head belong to the new protocol.
    @Test func switchingProtocolsAfterAnUpgradeOffer() throws {
        var p = HTTP1Parser(role: .client)
        p.expectResponse(to: "GET", upgrade: true)
        p.feed(Array("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\u{81}\u{02}hi".utf8))
        guard case .responseHead(let head, let framing)? = try p.next() else {
            Issue.record("expected a head")
            return
        }
        #expect(head.status == 101)
        #expect(framing == .none)
        #expect(try p.next() == nil)
        #expect(p.switchProtocols() == Array("\u{81}\u{02}hi".utf8))
        p.feed(Array("HTTP/1.1 200 OK\r\n\r\n".utf8))
        #expect(try p.next() == nil)  // no longer HTTP/1.1
        // An offer answered with a final status clears it: a later 101 is an error.
        var q = HTTP1Parser(role: .client)
        q.expectResponse(to: "GET", upgrade: true)
        q.feed(Array("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n".utf8))
        _ = try q.next()
        _ = try q.next()
        q.expectResponse(to: "GET")
        q.feed(Array("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n".utf8))
        #expect(throws: HTTP1Error.self) { try q.next() }
    }

    @Test func serverSideSwitchHandsBackTheRest() throws {
        var p = HTTP1Parser(role: .server)
        p.feed(Array("GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nframes".utf8))
        guard case .requestHead? = try p.next() else {
            Issue.record("expected a head")
            return
        }
        #expect(try p.next() == .end(trailers: nil))
        #expect(p.switchProtocols() == Array("frames".utf8))
        #expect(try p.next() == nil)
    }

    @Test func closeDelimited() {
        let o = expectSuccess("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nall of this until close", role: .client, methods: ["GET"], eof: true)
        #expect(o.framings == [.closeDelimited])
        #expect(o.bodies == [bytes("all of this until close")])
        #expect(o.ends == [nil])
        let http10 = expectSuccess("HTTP/1.0 200 OK\r\n\r\nx", role: .client, methods: ["GET"], eof: true)
        #expect(http10.framings == [.closeDelimited])
        #expect(http10.responseHeads.first?.version == .http1_0)
    }

    @Test func closeDelimitedWaitsForEOF() throws {
        var p = HTTP1Parser(role: .client)
        p.expectResponse(to: "GET")
        p.feed(bytes("HTTP/1.1 200 OK\r\n\r\nabc"))
        _ = try p.next()
        #expect(try p.next() == .body(ArraySlice(bytes("abc"))))
        #expect(try p.next() == nil)
        #expect(!p.isBetweenMessages)
        p.feedEOF()
        #expect(try p.next() == .end(trailers: nil))
        #expect(try p.next() == nil)
        #expect(p.isBetweenMessages)
    }

    @Test func chunkedWithExtensionsAndTrailers() {
        let o = expectSuccess("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n4;ext=1\r\nWiki\r\n5;a=\"b\"\r\npedia\r\n0;done\r\nX-Sum: 42\r\n\r\n",
                              role: .client, methods: ["GET"])
        #expect(o.framings == [.chunked])
        #expect(o.bodies == [bytes("Wikipedia")])
        #expect(o.ends == [HTTPHeaders([("X-Sum", "42")])])
    }

    @Test func framingErrors() {
        expectFailure("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", "http1.cl_and_te", role: .client, methods: ["GET"])
        // Even for HEAD, where the body framing is ignored, ambiguous fields are rejected.
        expectFailure("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", "http1.cl_and_te", role: .client, methods: ["HEAD"])
        expectFailure("HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", "http1.conflicting_content_length", role: .client, methods: ["GET"])
        expectFailure("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "http1.invalid_transfer_encoding", role: .client, methods: ["GET"])
        expectFailure("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", "http1.unsupported_transfer_coding", role: .client, methods: ["GET"])
        expectFailure("HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", "http1.te_in_http10", role: .client, methods: ["GET"])
        expectFailure("HTTP/1.1 200 OK\r\nX: a\r\n b\r\n\r\n", "http1.obs_fold", role: .client, methods: ["GET"])
        expectFailure("HTTP/1.1 200 OK\nContent-Length: 0\r\n\r\n", "http1.bare_lf", role: .client, methods: ["GET"])
    }

    @Test func statusLineSyntax() {
        let noReason = expectSuccess("HTTP/1.1 204\r\n\r\n", role: .client, methods: ["GET"])
        #expect(noReason.responseHeads.first?.reason == "")
        let emptyReason = expectSuccess("HTTP/1.1 204 \r\n\r\n", role: .client, methods: ["GET"])
        #expect(emptyReason.responseHeads.first?.reason == "")
        let spaced = expectSuccess("HTTP/1.1 404 Not  Found\there\r\nContent-Length: 0\r\n\r\n", role: .client, methods: ["GET"])
        #expect(spaced.responseHeads.first?.reason == "Not  Found\there")
        for bad in ["HTTP/1.1 20 OK", "HTTP/1.1 2000 OK", "HTTP/1.1 099 X", "HTTP/1.1 600 X", "HTTP/1.1  200 OK", "http/1.1 200 OK",
                    "HTTP/1.1 200\tOK", "HTTP/1.1 200 O\u{1}K", "HTTP/1.1 2x0 OK", "ICY 200 OK"] {
            expectFailure(bad + "\r\nContent-Length: 0\r\n\r\n", "http1.invalid_status_line", role: .client, methods: ["GET"])
        }
        expectFailure("HTTP/2.0 200 OK\r\n\r\n", "http1.version_not_supported", role: .client, methods: ["GET"])
        expectFailure("\r\nHTTP/1.1 200 OK\r\n\r\n", "http1.invalid_status_line", role: .client, methods: ["GET"])
    }

    @Test func unsolicitedResponse() {
        expectFailure("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", "http1.unsolicited_response", role: .client)
        let o = verify("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\nHTTP/1.1 408 Request Timeout\r\n\r\n", role: .client, methods: ["GET"])
        #expect(o.responseHeads.count == 1)
        #expect(o.error?.reason == "http1.unsolicited_response")
    }

    @Test func pipelinedResponsesFollowTheMethodQueue() throws {
        var p = HTTP1Parser(role: .client)
        p.expectResponse(to: "GET")
        p.expectResponse(to: "HEAD")
        p.feed(bytes("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"))
        #expect(try p.next() == .responseHead(HTTPResponseHead(status: 200, reason: "OK", headers: ["Content-Length": "2"]), framing: .contentLength(2)))
        #expect(try p.next() == .body(ArraySlice(bytes("hi"))))
        #expect(try p.next() == .end(trailers: nil))
        p.feed(bytes("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n"))
        #expect(try p.next() == .responseHead(HTTPResponseHead(status: 200, reason: "OK", headers: ["Content-Length": "2"]), framing: .none))
        #expect(try p.next() == .end(trailers: nil))
        #expect(try p.next() == nil)
        // A request queued later is answered later.
        p.expectResponse(to: "GET")
        p.feed(bytes("HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nz"))
        guard case .responseHead(_, .contentLength(1))? = try p.next() else { Issue.record("framing"); return }
    }

    @Test func truncatedResponses() {
        expectFailure("HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhel", "http1.truncated", role: .client, methods: ["GET"], eof: true)
        expectFailure("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", "http1.truncated", role: .client, methods: ["GET"], eof: true)
        expectFailure("HTTP/1.1 200 OK\r\nContent-", "http1.truncated", role: .client, methods: ["GET"], eof: true)
        // EOF before any response byte: nothing, forever (the driver decides what that means).
        let o = verify("", role: .client, methods: ["GET"], eof: true)
        #expect(o.events.isEmpty && o.error == nil)
    }

    @Test func responseHeaderLimits() {
        let limits = HTTP1Limits(maxHeaderBytes: 64, maxRequestTarget: 16, maxHeaderCount: 2)
        expectFailure("HTTP/1.1 200 OK\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", "http1.too_many_headers", role: .client, methods: ["GET"], limits: limits)
        expectFailure("HTTP/1.1 200 OK\r\nA: " + String(repeating: "x", count: 60) + "\r\n\r\n", "http1.header_too_large", role: .client, methods: ["GET"], limits: limits)
    }
}
