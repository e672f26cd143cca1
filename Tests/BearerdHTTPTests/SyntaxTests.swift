import Testing
@testable import BearerdHTTP

@Suite struct HTTP1SyntaxTests {
    @Test func tcharBitmapMatchesTheRFC() {
        let set = Set(HTTP1Syntax.tcharList)
        #expect(set.count == 15 + 10 + 52)
        for c in 0...255 {
            #expect(HTTP1Syntax.isTchar(UInt8(c)) == set.contains(UInt8(c)), "byte \(c)")
        }
    }

    @Test func swarVisibleCheckMatchesBytewise() {
        // Every byte value in every lane of an otherwise visible word.
        let filler = Array("abcdefgh".utf8)
        for lane in 0..<8 {
            for c in 0...255 {
                var word = filler
                word[lane] = UInt8(c)
                let x = word.withUnsafeBytes { $0.loadUnaligned(as: UInt64.self) }
                let expected = c >= 0x20 && c < 0x7F
                #expect(HTTP1Syntax.allVisibleOrSpace(x) == expected, "lane \(lane) byte \(c)")
            }
        }
    }

    @Test func lineScanFindsCRLFInEveryLane() {
        // The word-at-a-time LF search must not skip a CR or LF in any position.
        for pad in 0..<20 {
            let line = "X-" + String(repeating: "v", count: pad)
            let o = verify("GET / HTTP/1.1\r\nHost: a\r\n\(line): 1\r\n\r\n", splits: false)
            #expect(o.error == nil)
            let bad = verify("GET / HTTP/1.1\r\nHost: a\r\n\(line): 1\n\r\n", splits: false)
            #expect(bad.error?.reason == "http1.bare_lf")
            #expect(bad.error?.offset == "GET / HTTP/1.1\r\nHost: a\r\n\(line): 1".utf8.count)
        }
    }

    @Test func listElements() {
        #expect(HTTP1Syntax.listElements(" a ,b,,\tc ".utf8).map { String(decoding: $0, as: UTF8.self) } == ["a", "b", "", "c"])
        #expect(HTTP1Syntax.listElements("".utf8).map { String(decoding: $0, as: UTF8.self) } == [""])
    }
}
