import Testing
@testable import BearerdHTTP

@Suite struct LimitsTests {
    let small = HTTP1Limits(maxHeaderBytes: 128, maxRequestTarget: 32, maxHeaderCount: 4)

    @Test func headerBytesAtTheLimitPass() {
        // Exactly 128 bytes of head (start line + fields + final CRLF).
        let prefix = "GET / HTTP/1.1\r\nHost: a\r\nX: "
        let pad = String(repeating: "v", count: 128 - prefix.utf8.count - 4)
        let input = prefix + pad + "\r\n\r\n"
        #expect(input.utf8.count == 128)
        expectSuccess(input, limits: small)
        let over = prefix + pad + "v\r\n\r\n"
        let e = expectFailure(over, "http1.header_too_large", status: 431, limits: small)
        #expect(e?.offset == 128)
    }

    @Test func headerBytesDetectedBeforeTheLineEnds() throws {
        var p = HTTP1Parser(role: .server, limits: small)
        p.feed(bytes("GET / HTTP/1.1\r\nHost: a\r\nX: "))
        #expect(try p.next() == nil)
        p.feed(Array(repeating: UInt8(ascii: "v"), count: 200))  // no CRLF yet
        #expect(throws: HTTP1Error.self) { try p.next() }
        do { _ = try p.next() } catch { #expect(error.reason == "http1.header_too_large" && error.status == 431) }
    }

    @Test func headerBytesNeverBufferedBeyondTheLimitByteByByte() {
        var p = HTTP1Parser(role: .server, limits: small)
        var failed: HTTP1Error?
        for b in bytes("GET / HTTP/1.1\r\n") + Array(repeating: UInt8(ascii: "x"), count: 500) {
            p.feed([b])
            do { _ = try p.next() } catch { failed = error; break }
            #expect(p.bufferedByteCount <= small.maxHeaderBytes)
        }
        #expect(failed?.reason == "http1.header_too_large")
        #expect(failed?.offset == 128)
    }

    @Test func headerCount() {
        expectSuccess("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", limits: small)
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n", "http1.too_many_headers", status: 431, limits: small)
    }

    @Test func trailerLimits() {
        let head = "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n"
        expectSuccess(head + "A: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n", limits: small)
        expectFailure(head + "A: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\nE: 5\r\n\r\n", "http1.too_many_headers", status: 431, limits: small)
        expectFailure(head + "A: " + String(repeating: "t", count: 200) + "\r\n\r\n", "http1.header_too_large", status: 431, limits: small)
    }

    @Test func targetLengthLimit() {
        let ok = "/" + String(repeating: "a", count: 31)
        expectSuccess("GET \(ok) HTTP/1.1\r\nHost: a\r\n\r\n", limits: small)
        let e = expectFailure("GET \(ok)b HTTP/1.1\r\nHost: a\r\n\r\n", "http1.target_too_long", status: 414, limits: small)
        #expect(e?.offset == 4 + 32)
    }

    @Test func targetTooLongDetectedBeforeTheLineEnds() throws {
        var p = HTTP1Parser(role: .server, limits: small)
        p.feed(bytes("GET /" + String(repeating: "a", count: 40)))
        do {
            _ = try p.next()
            Issue.record("expected 414 before the request line ended")
        } catch {
            #expect(error.reason == "http1.target_too_long")
            #expect(error.status == 414)
            #expect(error.offset == 4 + 32)
        }
    }

    @Test func targetTooLongDetectedByteByByte() {
        var p = HTTP1Parser(role: .server, limits: small)
        var fedBytes = 0
        var failed: HTTP1Error?
        for b in bytes("GET /" + String(repeating: "a", count: 100)) {
            p.feed([b])
            fedBytes += 1
            do { _ = try p.next() } catch { failed = error; break }
        }
        #expect(failed?.reason == "http1.target_too_long")
        #expect(fedBytes == 4 + 33)  // the 33rd target byte trips it
    }

    @Test func defaultLimits() {
        let longTarget = "/" + String(repeating: "a", count: 8 * 1024)
        expectFailure("GET \(longTarget) HTTP/1.1\r\nHost: a\r\n\r\n", "http1.target_too_long", status: 414)
        let many = (0..<101).map { "F\($0): v\r\n" }.joined()
        let o = runParser([bytes("GET / HTTP/1.1\r\nHost: a\r\n" + many + "\r\n")])
        #expect(o.error?.reason == "http1.too_many_headers")
        let huge = "X: " + String(repeating: "v", count: 64 * 1024) + "\r\n"
        let h = runParser([bytes("GET / HTTP/1.1\r\nHost: a\r\n" + huge + "\r\n")])
        #expect(h.error?.reason == "http1.header_too_large")
    }

    @Test func chunkLineLimitDetectedBeforeTheLineEnds() throws {
        var p = HTTP1Parser(role: .server)
        p.feed(bytes("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;a="))
        _ = try p.next()
        p.feed(Array(repeating: UInt8(ascii: "b"), count: 5000))
        #expect(throws: HTTP1Error.self) { try p.next() }
    }
}

/// Inputs where an early check (431, 414, bad method) and a later one (bare CR/LF, whole-line
/// syntax) compete: every split must report the error a byte-at-a-time reader finds first.
@Suite struct EarlyErrorPrecedenceTests {
    let small = HTTP1Limits(maxHeaderBytes: 90, maxRequestTarget: 6, maxHeaderCount: 3)

    @Test func badMethodBeforeLongTarget() {
        // Found by mutation: the method is invalid before the target grows too long.
        expectFailure("POST=/a HTTP/1=.1\r\nHost: a\r\n\r\n", "http1.invalid_method", limits: small)
    }

    @Test func longTargetBeforeBareCR() {
        expectFailure("GET /abcdefghij\rX HTTP/1.1\r\nHost: a\r\n\r\n", "http1.target_too_long", status: 414, limits: small)
        expectFailure("GET /abcdefghij\nX HTTP/1.1\r\nHost: a\r\n\r\n", "http1.target_too_long", status: 414, limits: small)
    }

    @Test func targetAtTheLimitThenLineEnd() {
        expectFailure("GET /abcde\r\nHost: a\r\n\r\n", "http1.invalid_request_line", limits: small)
        expectFailure("GET /abcdef\r\nHost: a\r\n\r\n", "http1.target_too_long", limits: small)
        expectFailure("GET /abcde\rX", "http1.bare_cr", limits: small)
    }

    @Test func oversizedLineBeforeBareCR() {
        let value = String(repeating: "v", count: 100)
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nX: \(value)\rY\r\n\r\n", "http1.header_too_large", status: 431, limits: small)
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nX: \(value)\n\r\n", "http1.header_too_large", status: 431, limits: small)
        // A bare CR before the limit wins.
        expectFailure("GET / HTTP/1.1\r\nHost: a\r\nX: v\rY\(value)\r\n\r\n", "http1.bare_cr", limits: small)
    }

    @Test func oversizedTrailerBeforeBareLF() {
        let value = String(repeating: "t", count: 100)
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: \(value)\n\r\n",
                      "http1.header_too_large", status: 431, limits: small)
    }

    @Test func oversizedChunkLineBeforeBareLF() {
        let ext = ";" + String(repeating: "e", count: 4200)
        expectFailure("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1\(ext)\nx\r\n0\r\n\r\n", "http1.chunk_line_too_long")
    }
}
