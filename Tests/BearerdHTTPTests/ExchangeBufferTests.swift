import Testing
@testable import BearerdHTTP

/// `exchangeBuffer` lets a connection's parser take a kept buffer and give its own back: only
/// while nothing waits unparsed, and the parse and its error offsets go on as if nothing
/// happened.
@Suite struct ExchangeBufferTests {
    private func events(_ parser: inout HTTP1Parser) throws(HTTP1Error) -> [String] {
        var out: [String] = []
        while let e = try parser.next() {
            switch e {
            case .requestHead(let h, _): out.append("head \(h.method) \(h.target)")
            case .body(let b): out.append("body \(b.count)")
            case .end: out.append("end")
            default: out.append("other")
            }
        }
        return out
    }

    @Test func aKeptBufferTakesTheNextInputAndTheOldOneComesOut() throws {
        var parser = HTTP1Parser(role: .server)
        var spare = Array(repeating: UInt8(0x7a), count: 100)  // stale bytes of another connection
        spare.reserveCapacity(4096)
        let swappedSpare = parser.exchangeBuffer(&spare)
        #expect(swappedSpare)
        #expect(spare.isEmpty)  // the new parser's empty buffer
        #expect(parser.bufferedByteCount == 0)  // the stale bytes are not input
        // Bytes read into a loop's buffer are copied in (an array fed whole would be adopted).
        Array("GET /a HTTP/1.1\r\nHost: x\r\n\r\n".utf8).withUnsafeBytes { parser.feed($0) }
        #expect(try events(&parser) == ["head GET /a", "end"])
        var used: [UInt8] = []
        let swappedUsed = parser.exchangeBuffer(&used)
        #expect(swappedUsed)
        #expect(used.capacity >= 4096)  // the storage goes back to the caller
    }

    @Test func refusedWhileBytesWaitUnparsed() throws {
        var parser = HTTP1Parser(role: .server)
        parser.feed(Array("GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HT".utf8))
        #expect(try events(&parser) == ["head GET /a", "end"])
        var spare: [UInt8] = [1, 2, 3]
        let swappedSpare = parser.exchangeBuffer(&spare)
        #expect(!swappedSpare)
        #expect(spare == [1, 2, 3])  // nothing changed
        parser.feed(Array("TP/1.1\r\nHost: x\r\n\r\n".utf8))
        #expect(try events(&parser) == ["head GET /b", "end"])
    }

    @Test func offsetsCountTheWholeStreamAcrossAnExchange() throws {
        var parser = HTTP1Parser(role: .server)
        let first = Array("GET /a HTTP/1.1\r\nHost: x\r\n\r\n".utf8)
        parser.feed(first)
        #expect(try events(&parser) == ["head GET /a", "end"])
        var spare: [UInt8] = []
        spare.reserveCapacity(1024)
        let swappedSpare = parser.exchangeBuffer(&spare)
        #expect(swappedSpare)
        parser.feed(Array("GET /b HTTP/1.1\r\nHost: x\r\nBad Name: y\r\n\r\n".utf8))
        do {
            _ = try events(&parser)
            Issue.record("an invalid field name parsed")
        } catch {
            // "Bad Name" starts after the first request and the second's first two lines.
            #expect(error.offset == first.count + "GET /b HTTP/1.1\r\nHost: x\r\n".utf8.count + 3)
        }
    }
}
