import Testing
@testable import BearerdHTTP

/// Body bytes relayed by the caller straight from its read buffer (`directBodyLimit`,
/// `consumeBody`) instead of being fed: the events around them, the message's end and later
/// error offsets are those of feeding the same bytes.
@Suite struct DirectBodyTests {
    /// Feeds `stream` in `cuts`-sized reads the way the upstream connection does: direct body
    /// bytes where the parser allows, `feed` for the rest. Returns the events with body bytes
    /// joined into one `.body` per read, so a run compares with plain feeding.
    private static func relay(_ stream: [UInt8], cuts: [Int], method: String = "GET", direct: Bool) throws(HTTP1Error) -> (heads: [Int], body: [UInt8], ends: Int, trailers: [HTTPHeaders?]) {
        var parser = HTTP1Parser(role: .client)
        parser.expectResponse(to: method)
        var heads: [Int] = [], body: [UInt8] = [], ends = 0, trailers: [HTTPHeaders?] = []
        func drain(_ parser: inout HTTP1Parser) throws(HTTP1Error) {
            while let e = try parser.next() {
                switch e {
                case .responseHead(let h, _):
                    heads.append(h.status)
                case .body(let s): body += s
                case .end(let t):
                    ends += 1
                    trailers.append(t)
                case .requestHead: Issue.record("request head in a response stream")
                }
            }
        }
        var at = 0, i = 0
        while at < stream.count {
            let n = min(cuts[i % cuts.count], stream.count - at)
            i += 1
            var rest = stream[at..<(at + n)]
            at += n
            if direct {
                while !rest.isEmpty {
                    let limit = parser.directBodyLimit()
                    guard limit > 0 else { break }
                    let k = UInt64(rest.count) < limit ? rest.count : Int(limit)
                    parser.consumeBody(k)
                    body += rest.prefix(k)
                    rest = rest.dropFirst(k)
                    try drain(&parser)
                }
            }
            if !rest.isEmpty { parser.feed(Array(rest)) }
            try drain(&parser)
        }
        return (heads, body, ends, trailers)
    }

    private static let payload: [UInt8] = (0..<70_000).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }

    @Test func contentLengthBodyEndsWhenTheLastByteIsRelayed() throws {
        let stream = Array("HTTP/1.1 200 OK\r\nContent-Length: \(Self.payload.count)\r\n\r\n".utf8) + Self.payload
        for cuts in [[1], [7, 4096], [65_536], [stream.count], [100, 16_384, 3]] {
            let plain = try Self.relay(stream, cuts: cuts, direct: false)
            let direct = try Self.relay(stream, cuts: cuts, direct: true)
            #expect(direct.body == Self.payload, "cuts \(cuts)")
            #expect(direct.body == plain.body && direct.heads == [200] && direct.ends == 1 && plain.ends == 1, "cuts \(cuts)")
        }
    }

    @Test func chunkedBodyRelaysChunkDataAndParsesTheFraming() throws {
        var stream = Array("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".utf8)
        var offset = 0
        for size in [1, 5000, 60_000, 3] {
            stream += Array("\(String(size, radix: 16));ext=1\r\n".utf8) + Self.payload[offset..<(offset + size)] + Array("\r\n".utf8)
            offset += size
        }
        stream += Array("0\r\nGrpc-Status: 0\r\n\r\n".utf8)
        for cuts in [[1], [9, 4000], [16_384], [stream.count]] {
            let direct = try Self.relay(stream, cuts: cuts, direct: true)
            #expect(direct.body == Array(Self.payload[0..<offset]), "cuts \(cuts)")
            #expect(direct.ends == 1 && direct.trailers.first??["grpc-status"] == "0", "cuts \(cuts)")
        }
    }

    @Test func closeDelimitedBodyIsDirectUntilEOF() throws {
        var parser = HTTP1Parser(role: .client)
        parser.expectResponse(to: "GET")
        parser.feed(Array("HTTP/1.0 200 OK\r\n\r\n".utf8))
        guard case .responseHead(_, let framing)? = try parser.next() else {
            Issue.record("no head")
            return
        }
        #expect(framing == .closeDelimited)
        #expect(parser.directBodyLimit() == UInt64.max)
        parser.consumeBody(10_000)
        #expect(try parser.next() == nil)
        parser.feedEOF()
        #expect(parser.directBodyLimit() == 0)
        #expect(try parser.next() == .end(trailers: nil))
    }

    /// Nothing direct while bytes are buffered, in a head, or for more than is left; a
    /// rejected count changes nothing.
    @Test func limitIsZeroWhereFramingOrBufferedBytesComeFirst() throws {
        var parser = HTTP1Parser(role: .client)
        parser.expectResponse(to: "GET")
        #expect(parser.directBodyLimit() == 0)  // the head is next
        parser.feed(Array("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nab".utf8))
        #expect(parser.directBodyLimit() == 0)
        _ = try parser.next()  // the head
        #expect(parser.directBodyLimit() == 0)  // "ab" is buffered: it goes first
        #expect(try parser.next() == .body(Array("ab".utf8)[...]))
        #expect(parser.directBodyLimit() == 8)
        parser.consumeBody(9)  // more than is left: ignored
        #expect(parser.directBodyLimit() == 8)
        parser.consumeBody(0)
        #expect(parser.directBodyLimit() == 8)
        parser.consumeBody(8)
        #expect(parser.directBodyLimit() == 0)
        #expect(try parser.next() == .end(trailers: nil))
    }

    /// An error after direct bytes names the offset in the whole stream, as with feeding.
    @Test func errorOffsetsCountRelayedBytes() {
        let body = [UInt8](repeating: 0x61, count: 5000)
        let stream = Array("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1388\r\n".utf8) + body + Array("XY".utf8)
        func offset(direct: Bool) -> Int? {
            do {
                _ = try Self.relay(stream, cuts: [64, 3000], direct: direct)
                return nil
            } catch {
                return error.offset
            }
        }
        let plain = offset(direct: false)
        #expect(plain != nil)
        #expect(offset(direct: true) == plain)
    }
}
