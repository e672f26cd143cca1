import Testing
@testable import BearerdHTTP

/// One loop's parsers share a `FieldLineCache`: a line whose bytes are those kept at its
/// position is that parse again. Every head must still carry exactly its own fields, a line that
/// differs anywhere is validated in full, and credentials are never kept.
@Suite struct FieldLineCacheTests {
    /// A fresh server parser on `cache` (a new connection of the same loop).
    private func parse(_ input: String, _ cache: HTTP1Parser.FieldLineCache, role: HTTP1Parser.Role = .server,
                       methods: [String] = []) -> (heads: [HTTPHeaders], error: String?) {
        var parser = HTTP1Parser(role: role)
        parser.lineCache = cache
        for m in methods { parser.expectResponse(to: m) }
        parser.feed(Array(input.utf8))
        var heads: [HTTPHeaders] = []
        do {
            while let e = try parser.next() {
                switch e {
                case .requestHead(let h, _): heads.append(h.headers)
                case .responseHead(let h, _): heads.append(h.headers)
                default: break
                }
            }
        } catch {
            return (heads, error.reason)
        }
        return (heads, nil)
    }

    private func lines(_ h: HTTPHeaders) -> [String] { h.fields.map { "\($0.name): \($0.value)" } }

    @Test func connectionsOfOneLoopGetTheirOwnFields() {
        let cache = HTTP1Parser.FieldLineCache()
        let heads = [
            ["Host: a.example", "Accept: text/html", "X-A: v"],
            ["Host: a.example", "Accept: text/html", "X-A: v"],   // all kept lines
            ["host: a.example", "ACCEPT: text/html", "X-B: v"],   // other names (case), same values
            ["Host: a.example", "Accept: text/html", "X-AB: v"],  // a longer name
            ["Host: b.example", "Accept: text/htmx", "X-: v"],    // other values, a shorter name
            ["Host:a.example", "Accept:   text/html  ", "X-A:\tv"],  // other OWS, same values
            ["Accept: text/html", "Host: a.example", "X-A: v"],   // moved
            ["Host: a.example", "Accept: text/html", "X-A: v"],
        ]
        for h in heads {
            let r = parse("GET / HTTP/1.1\r\n" + h.joined(separator: "\r\n") + "\r\n\r\n", cache)
            #expect(r.error == nil)
            #expect(r.heads.map(lines) == [h.map { line in
                switch line {
                case "Host:a.example": "Host: a.example"
                case "Accept:   text/html  ": "Accept: text/html"
                case "X-A:\tv": "X-A: v"
                default: line
                }
            }])
        }
        #expect(cache.keptLine(0) == Array("Host: a.example".utf8))
        // Known kinds come from the kept parse too: Host counted, framing by Content-Length.
        let twice = parse("GET / HTTP/1.1\r\nHost: a.example\r\nHost: a.example\r\n\r\n", cache)
        #expect(twice.error == "http1.duplicate_host")
    }

    @Test func aKeptLineIsCheckedAgainWhereItsBytesDiffer() {
        let ok = "GET / HTTP/1.1\r\nHost: h\r\nX-A: v\r\nContent-Length: 1\r\n\r\nx"
        let cases: [(String, String)] = [
            ("X-A : v", "http1.space_before_colon"),
            ("X-A: v\u{7F}", "http1.invalid_field_value"),
            ("X-A: \u{01}", "http1.invalid_field_value"),
            ("X(A: v", "http1.invalid_field_name"),
            ("X-Av", "http1.missing_colon"),
            (": v", "http1.invalid_field_name"),
            (" X-A: v", "http1.obs_fold"),
            ("Host: h", "http1.duplicate_host"),
        ]
        for (line, reason) in cases {
            let cache = HTTP1Parser.FieldLineCache()
            #expect(parse(ok + ok, cache).heads.count == 2)
            let bad = "GET / HTTP/1.1\r\nHost: h\r\n\(line)\r\nContent-Length: 1\r\n\r\nx"
            #expect(parse(bad, cache).error == reason, "\(line)")
        }
        let cache = HTTP1Parser.FieldLineCache()
        #expect(parse(ok, cache).error == nil)
        let conflicting = "GET / HTTP/1.1\r\nHost: h\r\nX-A: v\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nx"
        #expect(parse(conflicting, cache).error == "http1.conflicting_content_length")
        // A kept Content-Length still frames the body: the next request starts after one byte.
        let two = parse(ok + ok, cache)
        #expect(two.error == nil && two.heads.count == 2)
    }

    @Test func credentialsLongLinesAndLatePositionsAreNotKept() {
        let cache = HTTP1Parser.FieldLineCache()
        let long = String(repeating: "L", count: HTTP1Parser.FieldLineCache.slotBytes)
        let late = (0..<HTTP1Parser.FieldLineCache.slots).map { "X-\($0): v" }
        let head = ["Authorization: Bearer secret-1", "cookie: s=secret-2", "Proxy-Authorization: Basic c2VjcmV0",
                    "X-Long: \(long)", "Host: h", "SET-COOKIE: s=3"] + late
        let r = parse("GET / HTTP/1.1\r\n" + head.joined(separator: "\r\n") + "\r\n\r\n", cache)
        #expect(r.error == nil)
        #expect(r.heads.map(lines) == [head])
        for i in [0, 1, 2, 3, 5] { #expect(cache.keptLine(i) == nil, "line \(i)") }
        #expect(cache.keptLine(4) == Array("Host: h".utf8))
        #expect(cache.keptLine(HTTP1Parser.FieldLineCache.slots - 1) == Array("X-\(HTTP1Parser.FieldLineCache.slots - 7): v".utf8))
        #expect(cache.keptLine(HTTP1Parser.FieldLineCache.slots) == nil)
    }

    @Test func linesTheCacheMissesOrRefusesKeepTheirOwnValuesOnOneConnection() {
        // Cookie lines are never kept by the loop's cache; the connection's own value slots
        // serve them, and hits leave those slots alone (stale slots are compared, never trusted).
        let cache = HTTP1Parser.FieldLineCache()
        var parser = HTTP1Parser(role: .server)
        parser.lineCache = cache
        let cookies = ["c=1", "c=1", "c=2", "c=1", "c=1; d=2"]
        let others = ["X-A: v", "X-A: v", "X-A: w", "X-A: v", "X-B: c=1"]
        var input = ""
        for (c, o) in zip(cookies, others) { input += "GET / HTTP/1.1\r\nHost: h\r\nCookie: \(c)\r\n\(o)\r\n\r\n" }
        parser.feed(Array(input.utf8))
        var got: [[String]] = []
        while let e = try? parser.next() {
            if case .requestHead(let h, _) = e { got.append(lines(h.headers)) }
        }
        #expect(got == zip(cookies, others).map { ["Host: h", "Cookie: \($0)", $1] })
        #expect(cache.keptLine(1) == nil)
        #expect(cache.keptLine(2) == Array("X-B: c=1".utf8))
    }

    @Test func trailersNeverUseTheKeptLines() {
        let cache = HTTP1Parser.FieldLineCache()
        let request = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n1\r\na\r\n0\r\nHost: h\r\n\r\n"
        #expect(parse("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n", cache).error == nil)
        #expect(parse(request, cache).error == "http1.invalid_trailer")
    }

    @Test func responsesShareTheirOwnCache() {
        let cache = HTTP1Parser.FieldLineCache()
        let r = { (d: String, n: Int) in "HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: \(d)\r\nContent-Length: \(n)\r\n\r\n" + String(repeating: "b", count: n) }
        let first = parse(r("Wed, 25 Nov 2026 21:22:19 GMT", 3), cache, role: .client, methods: ["GET"])
        let second = parse(r("Wed, 25 Nov 2026 21:22:19 GMT", 3) + r("Wed, 25 Nov 2026 21:22:20 GMT", 4), cache, role: .client, methods: ["GET", "GET"])
        #expect(first.error == nil && second.error == nil)
        #expect(second.heads.map { $0["Date"] } == ["Wed, 25 Nov 2026 21:22:19 GMT", "Wed, 25 Nov 2026 21:22:20 GMT"])
        #expect(second.heads.map { $0["Content-Length"] } == ["3", "4"])
    }
}
