import Testing
@testable import BearerdProxyCore

/// RESP2 codec of the shared token cache (docs/architecture.md §6.13): encoding, incremental
/// parsing, and the bounds a hostile server meets.
struct RESPTests {
    @Test func testCommandEncoding() throws {
        #expect(String(decoding: RESP.command(["SET", "k", "v", "PX", "100"]), as: UTF8.self) ==
                       "*5\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nPX\r\n$3\r\n100\r\n")
        #expect(String(decoding: RESP.command([[UInt8]()]), as: UTF8.self) == "*1\r\n$0\r\n\r\n")
        // Binary-safe: CR, LF and NUL inside an argument are framed by the length.
        var p = RESPParser()
        p.feed(RESP.command([[0x0D, 0x0A, 0x00]]))
        #expect(try p.next() == .array([.bulk([0x0D, 0x0A, 0x00])]))
    }

    @Test func testEveryReplyType() throws {
        var p = RESPParser()
        p.feed(Array("+OK\r\n-ERR wrong\r\n:-42\r\n$3\r\nabc\r\n$-1\r\n*-1\r\n*2\r\n:1\r\n*1\r\n$0\r\n\r\n".utf8))
        #expect(try p.next() == .simple("OK"))
        #expect(try p.next() == .error("ERR wrong"))
        #expect(try p.next() == .integer(-42))
        #expect(try p.next() == .bulk(Array("abc".utf8)))
        #expect(try p.next() == .bulk(nil))
        #expect(try p.next() == .array(nil))
        #expect(try p.next() == .array([.integer(1), .array([.bulk([])])]))
        #expect(try p.next() == nil)
        #expect(p.pendingByteCount == 0)
    }

    @Test func testByteByByteGivesTheSameReplies() throws {
        let stream = Array("*3\r\n$5\r\nhello\r\n:7\r\n+x\r\n$2\r\nhi\r\n".utf8)
        var p = RESPParser()
        var got: [RESPValue] = []
        for b in stream {
            p.feed([b])
            while let v = try p.next() { got.append(v) }
        }
        #expect(got == [.array([.bulk(Array("hello".utf8)), .integer(7), .simple("x")]), .bulk(Array("hi".utf8))])
    }

    @Test func testBoundsAreErrorsNotTraps() throws {
        func error(_ text: String, _ limits: RESPLimits = RESPLimits()) -> String? {
            var p = RESPParser(limits: limits)
            p.feed(Array(text.utf8))
            do { _ = try p.next(); return nil } catch { return error.reason }
        }
        #expect(error("$1048577\r\n") == "resp.bulk_too_large")
        #expect(error("$-2\r\n") == "resp.bad_bulk_length")
        #expect(error("*1025\r\n") == "resp.array_too_long")
        #expect(error(":99999999999999999999\r\n") == "resp.bad_integer")
        #expect(error(":-9223372036854775809\r\n") == "resp.bad_integer")
        #expect(error(":\r\n") == "resp.bad_integer")
        #expect(error("?x\r\n") == "resp.unknown_type")
        #expect(error("+a\rb\r\n") == "resp.bare_cr")
        #expect(error("+a\nb\r\n") == "resp.bare_lf")
        #expect(error("$3\r\nabcd\r\n") == "resp.bad_bulk_terminator")
        #expect(error("+" + String(repeating: "a", count: 5000)) == "resp.line_too_long")
        #expect(error(String(repeating: "*1\r\n", count: 9) + ":1\r\n") == "resp.too_deep")
        var small = RESPLimits()
        small.maxReplyBytes = 20
        #expect(error("*3\r\n$10\r\n0123456789\r\n$10\r\n0123456789\r\n", small) == "resp.reply_too_large")
        // Extreme integers that fit are fine.
        var p = RESPParser()
        p.feed(Array(":-9223372036854775808\r\n:9223372036854775807\r\n".utf8))
        #expect(try p.next() == .integer(.min))
        #expect(try p.next() == .integer(.max))
    }

    @Test func testErrorIsSticky() throws {
        var p = RESPParser()
        p.feed(Array("?\r\n+OK\r\n".utf8))
        #expect(throws: RESPError.self) { try p.next() }
        #expect(throws: RESPError.self) { try p.next() }
    }
}
