import Testing
@testable import BearerdHTTP

/// The parser hands out the previous head's String for a value whose bytes repeat at the same
/// position (`HTTP1Parser.recentValues`): every head must still carry exactly its own values.
@Suite struct RecentValuesTests {
    /// The header values of every request head parsed from `input`, in order.
    private func requestValues(_ input: String) -> [[String]] {
        let o = expectSuccess(input)
        return o.events.compactMap { e in
            if case .requestHead(let h, _) = e { return h.headers.fields.map(\.value) }
            return nil
        }
    }

    @Test func repeatedChangedAndMovedValuesAreEachHeadsOwn() {
        let heads = [
            ["a.example", "agent/1.0", "text/html", "c=1"],
            ["a.example", "agent/1.0", "text/html", "c=1"],  // all repeat
            ["b.example", "agent/1.1", "text/htmx", "c=1"],  // same lengths, other bytes
            ["a.example", "agent/1.0.0-long", "t", "c=1"],   // other lengths
            ["c=1", "a.example", "agent/1.0", "text/html"],  // the same values, moved
            ["a.example", "", "text/html", "c=1"],           // an empty value where one was
            ["a.example", "agent/1.0", "text/html", "c=1"],
        ]
        var input = ""
        for h in heads {
            input += "GET / HTTP/1.1\r\nHost: \(h[0])\r\nUser-Agent: \(h[1])\r\nAccept: \(h[2])\r\nCookie: \(h[3])\r\n\r\n"
        }
        #expect(requestValues(input) == heads)
    }

    @Test func valuesDifferingOnlyPastTheFirstWordOrInTheTail() {
        // Differences in each 8-byte word and in the tail (`sameBytes` compares words, then bytes).
        let base = String(repeating: "x", count: 21)
        var values = [base]
        for i in [0, 7, 8, 15, 16, 20] {
            var b = Array(base.utf8)
            b[i] = UInt8(ascii: "y")
            values.append(String(decoding: b, as: UTF8.self))
            values.append(base)
        }
        let input = values.map { "GET / HTTP/1.1\r\nHost: h\r\nX-V: \($0)\r\n\r\n" }.joined()
        #expect(requestValues(input).map { $0[1] } == values)
    }

    @Test func longValuesManyFieldsObsTextAndTrailers() {
        // Over `recentValueBytes`, past `recentValueSlots`, with obs-text (UTF-8), and trailers
        // (never taken from or put into the header values' slots).
        let long = String(repeating: "L", count: HTTP1Parser.recentValueBytes + 5)
        let fields = (0..<(HTTP1Parser.recentValueSlots + 3)).map { "X-F\($0): v\($0)" }.joined(separator: "\r\n")
        let head = "POST / HTTP/1.1\r\nHost: h\r\nX-Long: \(long)\r\nX-Text: caf\u{e9}\r\n\(fields)\r\nTransfer-Encoding: chunked\r\n\r\n"
        let input = head + "1\r\na\r\n0\r\nX-T: h\r\n\r\n" + head + "1\r\na\r\n0\r\nX-T: \(long)\r\n\r\n"
        let o = expectSuccess(input)
        let heads = o.events.compactMap { e -> HTTPHeaders? in
            if case .requestHead(let h, _) = e { return h.headers }
            return nil
        }
        #expect(heads.count == 2)
        for h in heads {
            #expect(h["X-Long"] == long)
            #expect(h["X-Text"] == "caf\u{e9}")
            #expect(h["X-F\(HTTP1Parser.recentValueSlots + 2)"] == "v\(HTTP1Parser.recentValueSlots + 2)")
            #expect(h.count == 3 + HTTP1Parser.recentValueSlots + 3 + 1)  // Host, X-Long, X-Text, the X-F fields, Transfer-Encoding
        }
        #expect(o.ends == [HTTPHeaders([("X-T", "h")]), HTTPHeaders([("X-T", long)])])
    }

    @Test func invalidUTF8IsRefusedEvenWhereAValidValueWasBefore() {
        let first = "GET / HTTP/1.1\r\nHost: h\r\nX-V: caf\u{e9}\r\n\r\n"
        var input = Array(first.utf8)
        input += Array("GET / HTTP/1.1\r\nHost: h\r\nX-V: caf".utf8) + [0xC3, 0x28] + Array("\r\n\r\n".utf8)
        let o = verify(input)
        #expect(o.error?.reason == "http1.invalid_field_value")
    }

    @Test func responsesOnAKeepAliveConnection() {
        let date1 = "Wed, 25 Nov 2026 21:22:19 GMT", date2 = "Wed, 25 Nov 2026 21:22:20 GMT"
        let r = { (d: String) in "HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: \(d)\r\nContent-Length: 0\r\n\r\n" }
        let o = expectSuccess(r(date1) + r(date1) + r(date2) + r(date1), role: .client, methods: ["GET", "GET", "GET", "GET"])
        let dates = o.events.compactMap { e -> String? in
            if case .responseHead(let h, _) = e { return h.headers["Date"] }
            return nil
        }
        #expect(dates == [date1, date1, date2, date1])
    }
}
