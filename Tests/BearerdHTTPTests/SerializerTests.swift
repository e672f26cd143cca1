import Testing
@testable import BearerdHTTP

@Suite struct SerializerTests {
    @Test func requestHeadBytes() {
        var out: [UInt8] = []
        HTTP1Serializer.writeRequestHead(HTTPRequestHead(method: "POST", target: "/a?b=c", headers: hdrs(("Host", "x"), ("Content-Length", "3"))), into: &out)
        #expect(out == bytes("POST /a?b=c HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n"))
    }

    @Test func responseHeadBytes() {
        var out: [UInt8] = []
        HTTP1Serializer.writeResponseHead(HTTPResponseHead(status: 404, reason: "Not Found", version: .http1_0, headers: ["A": "b"]), into: &out)
        #expect(out == bytes("HTTP/1.0 404 Not Found\r\nA: b\r\n\r\n"))
        out = []
        HTTP1Serializer.writeResponseHead(HTTPResponseHead(status: 204), into: &out)
        #expect(out == bytes("HTTP/1.1 204 \r\n\r\n"))
    }

    @Test func chunks() {
        var out: [UInt8] = []
        [UInt8]().withUnsafeBytes { HTTP1Serializer.writeChunk($0, into: &out) }
        #expect(out.isEmpty)
        bytes("hello").withUnsafeBytes { HTTP1Serializer.writeChunk($0, into: &out) }
        #expect(out == bytes("5\r\nhello\r\n"))
        out = []
        Array(repeating: UInt8(7), count: 255).withUnsafeBytes { HTTP1Serializer.writeChunk($0, into: &out) }
        #expect(Array(out.prefix(4)) == bytes("ff\r\n"))
        #expect(out.count == 4 + 255 + 2)
        out = []
        Array(repeating: UInt8(7), count: 0x10000).withUnsafeBytes { HTTP1Serializer.writeChunk($0, into: &out) }
        #expect(Array(out.prefix(7)) == bytes("10000\r\n"))
        out = []
        HTTP1Serializer.writeLastChunk(trailers: nil, into: &out)
        #expect(out == bytes("0\r\n\r\n"))
        out = []
        HTTP1Serializer.writeLastChunk(trailers: ["X-Sum": "1"], into: &out)
        #expect(out == bytes("0\r\nX-Sum: 1\r\n\r\n"))
    }

    @Test func hexDigits() {
        for (v, s) in [(UInt64(0), "0"), (1, "1"), (15, "f"), (16, "10"), (0xabcdef, "abcdef"), (UInt64.max, "ffffffffffffffff")] {
            var out: [UInt8] = []
            HTTP1Serializer.writeHex(v, into: &out)
            #expect(out == bytes(s))
        }
    }

    @Test func requestRoundTrip() {
        let head = HTTPRequestHead(method: "PUT", target: "/upload", headers: hdrs(("Host", "example.com:8443"), ("Transfer-Encoding", "chunked"), ("X-Name", "caf\u{e9}")))
        var wire: [UInt8] = []
        HTTP1Serializer.writeRequestHead(head, into: &wire)
        let pieces = [bytes("first piece "), Array(repeating: UInt8(ascii: "z"), count: 300), bytes("!")]
        for piece in pieces { piece.withUnsafeBytes { HTTP1Serializer.writeChunk($0, into: &wire) } }
        let trailers = hdrs(("X-Digest", "sha-256=abc"), ("X-Count", "3"))
        HTTP1Serializer.writeLastChunk(trailers: trailers, into: &wire)
        let o = verify(wire)
        #expect(o.error == nil)
        #expect(o.events == [
            .requestHead(head, framing: .chunked),
            .body(ArraySlice(pieces.flatMap { $0 })),
            .end(trailers: trailers),
        ])
    }

    @Test func responseRoundTrip() {
        let head = HTTPResponseHead(status: 200, reason: "OK", headers: hdrs(("Content-Length", "4"), ("Set-Cookie", "a=b; Path=/")))
        var wire: [UInt8] = []
        HTTP1Serializer.writeResponseHead(head, into: &wire)
        wire += bytes("body")
        let o = verify(wire, role: .client, methods: ["GET"])
        #expect(o.events == [.responseHead(head, framing: .contentLength(4)), .body(ArraySlice(bytes("body"))), .end(trailers: nil)])
        var empty: [UInt8] = []
        HTTP1Serializer.writeResponseHead(HTTPResponseHead(status: 304), into: &empty)
        let e = verify(empty, role: .client, methods: ["GET"])
        #expect(e.events == [.responseHead(HTTPResponseHead(status: 304), framing: .none), .end(trailers: nil)])
    }

    /// The cursor the head writers use: an estimate that is too small (or wildly so) starts over
    /// with more room and writes the same bytes; nothing is written past the block; existing
    /// bytes of the buffer stay in front.
    @Test(arguments: [0, 1, 63, 64, 65, 100, 5000])
    func cursorRetriesAShortEstimate(estimate: Int) {
        let long = String(repeating: "v", count: 3000)
        var out: [UInt8] = bytes("prefix|")
        out.appendingHead(estimate: estimate) { c in
            c.put("GET " as StaticString)
            c.put("/x")
            c.put(Substring("?q=1"))
            c.put(asciiSP)
            c.putDecimal(0)
            c.putDecimal(9)
            c.putDecimal(10)
            c.putDecimal(UInt64.max)
            c.put(UInt8(ascii: "|"))
            c.put(long)
            c.putCRLF()
        }
        #expect(out == bytes("prefix|GET /x?q=1 0910\(UInt64.max)|\(long)\r\n"))
    }

    @Test func headsLargerThanAnyFirstGuessAreWrittenWhole() {
        let big = String(repeating: "b", count: 70_000)
        let head = HTTPRequestHead(method: "GET", target: "/", headers: hdrs(("X-Big", big), ("Host", "h")))
        var out: [UInt8] = []
        HTTP1Serializer.writeRequestHead(head, setting: HTTPField(name: "Authorization", value: "Bearer t"), into: &out)
        #expect(out == bytes("GET / HTTP/1.1\r\nX-Big: \(big)\r\nHost: h\r\nAuthorization: Bearer t\r\n\r\n"))
    }
}

@Suite struct HeaderRulesTests {
    /// `setting:` writes what `HTTPHeaders.set` would leave, without copying the head.
    private func parsedFields(_ buf: [UInt8]) -> [(String, String)] {
        String(decoding: buf.filter { $0 != 13 }, as: UTF8.self).split(separator: "\n").dropFirst().map {
            let p = $0.split(separator: ":", maxSplits: 1)
            return (String(p[0]), String(p[1].dropFirst()))
        }
    }

    @Test func requestHeadWithACredentialSetInPlace() {
        func written(_ fields: [(String, String)]) -> String {
            var buf: [UInt8] = []
            HTTP1Serializer.writeRequestHead(HTTPRequestHead(method: "GET", target: "/", headers: HTTPHeaders(fields)),
                                             setting: HTTPField(name: "Authorization", value: "Bearer t"), into: &buf)
            // What `set` leaves, but under the configured name's spelling.
            var viaSet = HTTPHeaders(fields)
            viaSet.set("Authorization", "Bearer t")
            #expect(viaSet.fields.map { $0.name.lowercased() + $0.value } == HTTPHeaders(parsedFields(buf)).fields.map { $0.name.lowercased() + $0.value })
            return String(decoding: buf, as: UTF8.self)
        }
        #expect(written([("Host", "h")]) == "GET / HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer t\r\n\r\n")
        #expect(written([("authorization", "Basic a"), ("Host", "h"), ("AUTHORIZATION", "x")])
                == "GET / HTTP/1.1\r\nAuthorization: Bearer t\r\nHost: h\r\n\r\n")
    }

    @Test func connectionTokens() {
        let h = hdrs(("Connection", "Keep-Alive, X-Foo ,, "), ("connection", "close"), ("X", "y"))
        #expect(HTTPHeaderRules.connectionTokens(h) == ["keep-alive", "x-foo", "close"])
        #expect(HTTPHeaderRules.connectionTokens(["A": "b"]) == [])
        let options = HTTPHeaderRules.connectionOptions(HTTPHeaders([("connection", " Keep-Alive ,, X-Foo"), ("Connection", "CLOSE,upgrade , x-bar")]))
        #expect(options.present && options.close && options.keepAlive && options.upgrade)
        #expect(options.others == ["x-foo", "x-bar"])
        #expect(options.names("X-FOO") && options.names("Close") && options.names("x-bar") && !options.names("x-baz"))
        #expect(HTTPHeaderRules.connectionOptions(["A": "b"]) == HTTPHeaderRules.ConnectionOptions())
        #expect(!HTTPHeaderRules.connectionOptions(["Connection": ""]).names(""))
    }

    /// `names` by name comparisons alone, as it was before the field's kind stood in for two
    /// of them (the reference for the test below).
    static func namesByComparison(_ o: HTTPHeaderRules.ConnectionOptions, _ name: String) -> Bool {
        guard o.present else { return false }
        if o.close && asciiCaseInsensitiveEquals(name, "close") { return true }
        if o.keepAlive && asciiCaseInsensitiveEquals(name, "keep-alive") { return true }
        if o.upgrade && asciiCaseInsensitiveEquals(name, "upgrade") { return true }
        return o.others.contains { asciiCaseInsensitiveEquals(name, $0) }
    }

    /// `names(field)` (the field's kind in place of two name comparisons) answers as the
    /// comparisons of the name do, for every mix of options and every kind of name.
    @Test func namesByFieldAnswersAsByName() {
        let values = ["keep-alive", "close", "Upgrade", "keep-alive, x-foo", "CLOSE, Keep-Alive, upgrade, X-Bar", "x-foo", ""]
        let names = ["Keep-Alive", "keep-alive", "KEEP-ALIVE", "Upgrade", "upgrade", "Close", "close", "X-Foo", "x-bar", "Host",
                     "Connection", "keep-alivex", "upgrad", "", "Content-Length", "Via"]
        for value in values {
            for withField in [true, false] {
                let options = HTTPHeaderRules.connectionOptions(withField ? HTTPHeaders([("Connection", value)]) : HTTPHeaders())
                for name in names {
                    let field = HTTPField(name: name, value: "v")
                    #expect(options.names(field) == Self.namesByComparison(options, name), "Connection: \(value), field \(name)")
                    #expect(options.names(name) == Self.namesByComparison(options, name), "Connection: \(value), name \(name)")
                }
            }
        }
    }

    /// The whole values `keep-alive` and `close` (the short path) read as the general parse does,
    /// alone, next to other fields and in any case.
    @Test func commonWholeConnectionValuesReadAsTheGeneralParse() {
        var keep = HTTPHeaderRules.ConnectionOptions()
        keep.present = true
        keep.keepAlive = true
        var close = HTTPHeaderRules.ConnectionOptions()
        close.present = true
        close.close = true
        #expect(HTTPHeaderRules.connectionOptions(["Connection": "keep-alive"]) == keep)
        #expect(HTTPHeaderRules.connectionOptions(["Connection": "Keep-Alive"]) == keep)
        #expect(HTTPHeaderRules.connectionOptions(["Connection": "close"]) == close)
        #expect(HTTPHeaderRules.connectionOptions(["connection": "CLOSE"]) == close)
        let both = HTTPHeaderRules.connectionOptions(HTTPHeaders([("Connection", "keep-alive"), ("Connection", "x-a, close")]))
        #expect(both.present && both.keepAlive && both.close && !both.upgrade && both.others == ["x-a"])
        #expect(HTTPHeaderRules.keepAlive(version: .http1_1, headers: ["Connection": "close"]) == false)
        #expect(HTTPHeaderRules.keepAlive(version: .http1_0, headers: ["Connection": "keep-alive"]))
        #expect(HTTPHeaderRules.keepAlive(version: .http1_0, headers: HTTPHeaders([("Connection", "keep-alive"), ("Connection", "close")])) == false)
    }

    @Test func removeHopByHop() {
        var h = hdrs(
            ("Host", "a"), ("Connection", "x-private, Keep-Alive"), ("Keep-Alive", "timeout=5"), ("X-Private", "secret"),
            ("x-private", "again"), ("TE", "trailers"), ("Transfer-Encoding", "chunked"), ("Upgrade", "h2c"),
            ("Proxy-Connection", "keep-alive"), ("Trailer", "X-Sum"), ("Proxy-Authenticate", "Basic"),
            ("Proxy-Authorization", "Basic Zm9v"), ("Accept", "*/*"), ("Authorization", "Bearer t")
        )
        HTTPHeaderRules.removeHopByHop(&h)
        #expect(h == hdrs(("Host", "a"), ("Accept", "*/*"), ("Authorization", "Bearer t")))
    }

    @Test(arguments: [
        (HTTPVersion.http1_1, [(String, String)](), true),
        (.http1_1, [("Connection", "close")], false),
        (.http1_1, [("Connection", "Keep-Alive, CLOSE")], false),
        (.http1_1, [("Connection", "keep-alive")], true),
        (.http1_1, [("Connection", "upgrade")], true),
        (.http1_0, [], false),
        (.http1_0, [("Connection", "keep-alive")], true),
        (.http1_0, [("Connection", "Keep-Alive")], true),
        (.http1_0, [("Connection", "keep-alive"), ("Connection", "close")], false),
        (.http1_0, [("Keep-Alive", "timeout=5")], false),
    ])
    func keepAlive(version: HTTPVersion, fields: [(String, String)], expected: Bool) {
        #expect(HTTPHeaderRules.keepAlive(version: version, headers: HTTPHeaders(fields)) == expected)
    }

    @Test func expectsContinue() {
        #expect(HTTPHeaderRules.expectsContinue(HTTPRequestHead(method: "PUT", target: "/", headers: ["Expect": "100-continue"])))
        #expect(HTTPHeaderRules.expectsContinue(HTTPRequestHead(method: "PUT", target: "/", headers: ["expect": "100-Continue"])))
        #expect(!HTTPHeaderRules.expectsContinue(HTTPRequestHead(method: "PUT", target: "/", headers: ["Expect": "200-ok"])))
        #expect(!HTTPHeaderRules.expectsContinue(HTTPRequestHead(method: "PUT", target: "/")))
    }
}
