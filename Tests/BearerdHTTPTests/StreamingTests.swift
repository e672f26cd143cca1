import Testing
@testable import BearerdHTTP

/// SplitMix64: a small deterministic generator so failures reproduce.
struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

@Suite struct StreamingTests {
    @Test func largeContentLengthBodyStaysBounded() throws {
        let feedSize = 64 * 1024
        let total = 64 * 1024 * 1024
        let headBytes = bytes("PUT /big HTTP/1.1\r\nHost: a\r\nContent-Length: \(total)\r\n\r\n")
        var p = HTTP1Parser(role: .server)
        p.feed(headBytes)
        guard case .requestHead(_, .contentLength(UInt64(total)))? = try p.next() else { Issue.record("head"); return }
        let piece = [UInt8](repeating: 0x61, count: feedSize)
        var received = 0
        var maxBuffered = 0
        var ended = false
        for _ in 0..<(total / feedSize) {
            p.feed(piece)
            maxBuffered = max(maxBuffered, p.bufferedByteCount)
            while let e = try p.next() {
                switch e {
                case .body(let b): received += b.count
                case .end: ended = true
                default: Issue.record("unexpected \(e)")
                }
            }
            #expect(p.bufferedByteCount == 0)
        }
        #expect(received == total)
        #expect(ended)
        #expect(maxBuffered <= feedSize + headBytes.count)
    }

    @Test func largeChunkedBodyStaysBounded() throws {
        // 16 MiB as 64 KiB chunks, delivered in 65,000-byte reads (never aligned with chunks).
        var wire = bytes("POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n")
        let chunk = (0..<(64 * 1024)).map { UInt8(truncatingIfNeeded: $0) }
        for _ in 0..<256 { chunk.withUnsafeBytes { HTTP1Serializer.writeChunk($0, into: &wire) } }
        HTTP1Serializer.writeLastChunk(trailers: nil, into: &wire)
        var p = HTTP1Parser(role: .server)
        let readSize = 65_000
        var received = 0
        var checksum: UInt64 = 0
        var ends = 0
        var maxBuffered = 0
        var offset = 0
        while offset < wire.count {
            let n = min(readSize, wire.count - offset)
            wire.withUnsafeBytes { p.feed(UnsafeRawBufferPointer(rebasing: $0[offset..<(offset + n)])) }
            offset += n
            maxBuffered = max(maxBuffered, p.bufferedByteCount)
            while let e = try p.next() {
                switch e {
                case .body(let b):
                    received += b.count
                    for x in b { checksum = checksum &* 31 &+ UInt64(x) }
                case .end: ends += 1
                default: break
                }
            }
            #expect(p.bufferedByteCount < 4096)  // at most a partial chunk line
        }
        var expected: UInt64 = 0
        for _ in 0..<256 { for x in chunk { expected = expected &* 31 &+ UInt64(x) } }
        #expect(received == 256 * chunk.count)
        #expect(checksum == expected)
        #expect(ends == 1)
        #expect(maxBuffered <= readSize + 4096)
    }

    @Test func closeDelimitedLargeBodyStaysBounded() throws {
        var p = HTTP1Parser(role: .client)
        p.expectResponse(to: "GET")
        p.feed(bytes("HTTP/1.0 200 OK\r\n\r\n"))
        _ = try p.next()
        var received = 0
        let piece = [UInt8](repeating: 1, count: 32 * 1024)
        for _ in 0..<256 {
            p.feed(piece)
            #expect(p.bufferedByteCount <= piece.count)
            while case .body(let b)? = try p.next() { received += b.count }
        }
        p.feedEOF()
        #expect(try p.next() == .end(trailers: nil))
        #expect(received == 256 * piece.count)
    }

    @Test func bodySlicesShareTheFedArray() throws {
        var p = HTTP1Parser(role: .server)
        p.feed(bytes("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 8192\r\n\r\n"))
        _ = try p.next()
        #expect(try p.next() == nil)
        let piece = [UInt8](repeating: 7, count: 8192)
        let fedAddress = piece.withUnsafeBufferPointer { UInt(bitPattern: $0.baseAddress) }
        p.feed(piece)
        guard case .body(let slice)? = try p.next() else { Issue.record("no body"); return }
        let sliceAddress = slice.withUnsafeBufferPointer { UInt(bitPattern: $0.baseAddress) }
        #expect(sliceAddress == fedAddress, "the body slice is a view of the fed array, not a copy")
        #expect(slice.count == 8192)
        #expect(try p.next() == .end(trailers: nil))
    }

    @Test func compactionKeepsOffsetsAbsolute() throws {
        // Many pipelined requests fed in odd-sized pieces; an error in the last one reports
        // its absolute offset although the buffer was compacted many times.
        let one = "POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc"
        var stream = bytes(String(repeating: one, count: 200))
        let badAt = stream.count + "GET / HTTP/1.1\r\nHost: a\r\nX: ".utf8.count
        stream += bytes("GET / HTTP/1.1\r\nHost: a\r\nX: \u{1}\r\n\r\n")
        var p = HTTP1Parser(role: .server)
        var heads = 0
        var caught: HTTP1Error?
        var i = 0
        outer: while i < stream.count {
            let n = min(37, stream.count - i)
            p.feed(Array(stream[i..<(i + n)]))
            i += n
            while true {
                do {
                    guard let e = try p.next() else { break }
                    if case .requestHead = e { heads += 1 }
                } catch {
                    caught = error
                    break outer
                }
            }
        }
        #expect(heads == 200)
        #expect(caught?.reason == "http1.invalid_field_value")
        #expect(caught?.offset == badAt)
    }

    /// Mutated inputs: whatever the parser decides, it decides the same for every split
    /// (requests and responses, default and tiny limits, with and without EOF).
    @Test func mutatedInputsAgreeAcrossSplits() {
        let requests = [
            "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /b HTTP/1.1\r\nHost: b\r\n\r\n",
            "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;x=\"y\"\r\nhello\r\n0\r\nT: v\r\n\r\n",
            "GET http://a/ HTTP/1.0\r\nConnection: keep-alive\r\n\r\n\r\nOPTIONS * HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
        ]
        let responses = [
            "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n"
                + "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
            "HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 304 NM\r\n\r\nHTTP/1.0 200 OK\r\n\r\nrest",
        ]
        let methods = ["GET", "HEAD", "POST", "GET", "HEAD", "GET"]
        let alphabet: [UInt8] = Array("\r\n \t:;,=\"0159aAfFxX-/\\#".utf8) + [0, 0x80, 0xC3, 0xA9, 0xFF, 0x7F]
        let tiny = HTTP1Limits(maxHeaderBytes: 90, maxRequestTarget: 6, maxHeaderCount: 3)
        var rng = SplitMix64(state: 0xB0A7_E7D0)
        var outcomes = [0, 0]
        for round in 0..<400 {
            let role: HTTP1Parser.Role = round % 2 == 0 ? .server : .client
            let seeds = role == .server ? requests : responses
            var input = bytes(seeds[Int.random(in: 0..<seeds.count, using: &rng)])
            for _ in 0..<Int.random(in: 1...3, using: &rng) {
                let at = Int.random(in: 0..<input.count, using: &rng)
                switch Int.random(in: 0..<4, using: &rng) {
                case 0: input[at] = alphabet.randomElement(using: &rng)!  // alphabet is non-empty
                case 1: input.insert(alphabet.randomElement(using: &rng)!, at: at)  // alphabet is non-empty
                case 2: input.remove(at: at)
                default: input.insert(contentsOf: input[at..<min(input.count, at + 12)], at: at)
                }
            }
            let eof = Bool.random(using: &rng)
            let limits = Bool.random(using: &rng) ? HTTP1Limits() : tiny
            let whole = runParser([input], role: role, methods: methods, eof: eof, limits: limits)
            let bytewise = runParser(input.map { [$0] }, role: role, methods: methods, eof: eof, limits: limits, rawFeed: true)
            #expect(whole == bytewise, "round \(round): \(String(decoding: input, as: UTF8.self).debugDescription)")
            for _ in 0..<4 {
                let cut = Int.random(in: 1..<input.count, using: &rng)
                let split = runParser([Array(input[..<cut]), Array(input[cut...])], role: role, methods: methods, eof: eof, limits: limits)
                #expect(whole == split, "round \(round) cut \(cut)")
            }
            outcomes[whole.error == nil ? 0 : 1] += 1
        }
        // The mutations exercise both sides.
        #expect(outcomes[0] > 10 && outcomes[1] > 10)
    }
}
